"""``sshddp fetch``: a 50 MB file from each of 3 nodes arrives byte-identical, a directory
from one node (``--node``) arrives whole, a missing path is reported per host, and a large
transfer shows a progress bar on a terminal (and none when piped)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
import yaml
from launch_helpers import SSHDDP, cli_env

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

OUTPUTS = Path(__file__).parent / "payloads" / "outputs.py"
HOSTS = 3
MB = 50


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def launch_outputs(
    cluster: SshdCluster, tmp: Path, port: int, mb: int = MB
) -> tuple[str, list[Path]]:
    """outputs.py on h1..h3, each host with its own workdir (as on separate machines); the
    run id and each node's working directory."""
    workdirs = [tmp / "remote" / f"h{i + 1}" for i in range(HOSTS)]
    doc = {
        "defaults": {"python": sys.executable, "nproc": 1},
        "rendezvous": {"port": port},
        "hosts": [{"host": f"h{i + 1}", "workdir": str(w)} for i, w in enumerate(workdirs)],
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    result = sshddp(["launch", "--ssh-config", cluster.ssh_config, inv, OUTPUTS, str(mb)])
    assert result.code == 0, result.explain()
    run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
    record = json.loads(
        (Path(os.environ["XDG_STATE_HOME"]) / "sshddp/runs" / f"{run_id}.json").read_text()
    )
    return run_id, [Path(n["cwd"]) for n in record["nodes"]]


def test_fetch_a_file_from_every_node_and_a_directory_from_one(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run_id, cwds = launch_outputs(ssh_env, tmp_path, free_port())
    run_no_leak(run_id)
    assert len({*cwds}) == HOSTS

    dest = tmp_path / "fetched"
    result = sshddp(["fetch", run_id[:4], "out/big.bin", dest])
    assert result.code == ExitCode.OK, result.explain()
    for node, cwd in enumerate(cwds):
        local = dest / f"node{node}-h{node + 1}" / "big.bin"
        remote = cwd / "out" / "big.bin"
        assert local.stat().st_size == remote.stat().st_size == MB << 20
        assert sha(local) == sha(remote), f"node {node}"
        assert f"node {node} (h{node + 1}): file {local} (52.4 MB, sha256 " in result.out
    assert sorted(os.listdir(dest)) == [f"node{k}-h{k + 1}" for k in range(HOSTS)]
    assert "\r" not in result.text and "━" not in result.text  # no bar when not a terminal

    one = sshddp(["fetch", "--node", "1", run_id, "out", dest / "one"])
    assert one.code == ExitCode.OK, one.explain()
    assert os.listdir(dest / "one") == ["node1-h2"]
    local = dest / "one" / "node1-h2" / "out"
    assert tree(local) == tree(cwds[1] / "out")
    assert (local / "sub" / "node.txt").read_text() == "node 1"
    assert (
        not (local / "link").exists()
        and "skipped (links, devices, unreadable): out/link" in one.out
    )


def test_fetch_errors_name_the_host_and_the_path(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run_id, cwds = launch_outputs(ssh_env, tmp_path, free_port())
    missing = sshddp(["fetch", run_id, "out/nope.bin", tmp_path / "d"])
    assert_clean_failure(missing, ExitCode.BAD_INPUT)
    for node, cwd in enumerate(cwds):
        host = f"h{node + 1}"
        line = f"sshddp: node {node} ({host}): NOT fetched: {host}: {cwd}/out/nope.bin: not found"
        assert line in missing.err, missing.explain()
    assert not any((tmp_path / "d").rglob(".sshddp-fetch-*"))
    (tmp_path / "file").write_text("")
    bad_dest = sshddp(["fetch", run_id, "out/big.bin", tmp_path / "file"])
    assert_clean_failure(bad_dest, ExitCode.BAD_INPUT)
    assert "exists and is not a directory" in bad_dest.err
    bad_node = sshddp(["fetch", "--node", "3", run_id, "out"])
    assert_clean_failure(bad_node, ExitCode.BAD_INPUT)
    assert f"run {run_id} has nodes 0-2" in bad_node.err
    unknown = sshddp(["fetch", "zzzzzz", "out"])
    assert_clean_failure(unknown, ExitCode.BAD_INPUT)


def test_a_large_transfer_shows_a_progress_bar_on_a_terminal(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run_id, cwds = launch_outputs(ssh_env, tmp_path, free_port())
    command = " ".join(
        [*SSHDDP, "fetch", "--node", "2", run_id, "out/big.bin", str(tmp_path / "d")]
    )
    env = {**cli_env(ssh_env), "COLUMNS": "120", "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    screen = subprocess.run(
        ["script", "-qec", command, "/dev/null"],  # a real terminal for sshddp
        env=env,
        capture_output=True,
        timeout=180,
    )
    out = screen.stdout.decode("utf-8", "replace")
    assert screen.returncode == 0, out
    assert "node2-h3/big.bin" in out and "━" in out and "52.4/52.4 MB" in out, out
    assert sha(tmp_path / "d" / "node2-h3" / "big.bin") == sha(cwds[2] / "out" / "big.bin")


def test_an_unreachable_host_fails_only_its_own_copy(
    make_cluster: Callable[..., SshdCluster], tmp_path: Path, free_port: Callable[[], int]
) -> None:
    cluster = make_cluster(2)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "defaults": {"python": sys.executable, "nproc": 1},
                "rendezvous": {"port": free_port()},
                "hosts": [
                    {"host": h.alias, "workdir": str(tmp_path / h.alias)} for h in cluster.hosts
                ],
            }
        )
    )
    opts = ["--ssh-config", cluster.ssh_config]
    launched = sshddp(["launch", *opts, inv, OUTPUTS, "1"])
    assert launched.code == 0, launched.explain()
    run_id = launched.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
    cluster.stop_host(2)
    result = sshddp(
        ["fetch", *opts, "--connect-timeout", "3", run_id, "out/big.bin", tmp_path / "d"]
    )
    assert_clean_failure(result, ExitCode.UNREACHABLE)
    first, second = (h.alias for h in cluster.hosts)
    assert (tmp_path / "d" / f"node0-{first}" / "big.bin").stat().st_size == 1 << 20
    assert f"node 0 ({first}): file" in result.out
    assert f"sshddp: node 1 ({second}): NOT fetched: " in result.err
    assert not (tmp_path / "d" / f"node1-{second}").exists()


# ----------------------------------------------------------------- a DEST others can write in


@pytest.fixture
def mallory() -> Iterator[tuple[int, int]]:
    """A real second local user (uid, gid), removed afterwards."""
    name = f"sshddp-m{os.getpid()}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/false", name], check=True)
    try:
        ids = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True)
        gid = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True)
        yield int(ids.stdout), int(gid.stdout)
    finally:
        subprocess.run(["userdel", name], check=True)


def as_user(user: tuple[int, int], *argv: str) -> None:
    subprocess.run(argv, user=user[0], group=user[1], extra_groups=[], check=True)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="sshddp-shared-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_fetch_into_a_shared_dest_never_writes_where_another_user_points_it(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    mallory: tuple[int, int],
    shared: Path,
) -> None:
    run_id, _ = launch_outputs(ssh_env, tmp_path, free_port(), mb=1)
    secret = tmp_path / "secret"  # root's own file, 0600
    secret.write_bytes(b"root only")
    secret.chmod(0o600)
    private = tmp_path / "private"  # root's own directory
    private.mkdir(mode=0o700)

    # Sticky and ours: others may add names, so every name they can plant is refused.
    sticky = shared / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    node0 = sticky / "node0-h1"
    as_user(mallory, "mkdir", "-m", "777", str(node0))
    tmp_name = f".sshddp-fetch-{os.getpid()}-big.bin"  # the name fetch used to open
    for name in (tmp_name, "big.bin"):
        as_user(mallory, "ln", "-s", str(secret), str(node0 / name))
    as_user(mallory, "ln", "-s", str(private), str(sticky / "node1-h2"))
    result = sshddp(["fetch", run_id, "out/big.bin", sticky])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{node0}: belongs to uid {mallory[0]}, not to you" in result.err, result.explain()
    assert f"{sticky / 'node1-h2'}: is a link; fetch writes through no link" in result.err
    assert "node 2 (h3): file" in result.out  # its own directory was made, and is ours
    assert secret.read_bytes() == b"root only" and list(private.iterdir()) == []

    # A directory others can write in that is not sticky, or is not ours: refused whole.
    (shared / "open").mkdir()
    (shared / "open").chmod(0o777)
    as_user(mallory, "mkdir", "-m", "1777", str(sticky / "hers"))
    for dest in (shared / "open", sticky / "hers"):
        refused = sshddp(["fetch", run_id, "out/big.bin", dest])
        assert_clean_failure(refused, ExitCode.BAD_INPUT)
        assert f"DEST {dest}: other users can write in it" in refused.err, refused.explain()
        assert list(dest.iterdir()) == []


def test_fetch_never_replaces_a_file_through_a_link(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run_id, cwds = launch_outputs(ssh_env, tmp_path, free_port(), mb=1)
    elsewhere, dest = tmp_path / "elsewhere", tmp_path / "dest"
    elsewhere.mkdir()
    (elsewhere / "big.bin").write_bytes(b"mine")
    (dest / "node0-h1").mkdir(parents=True)
    (dest / "node0-h1" / "big.bin").symlink_to(elsewhere / "big.bin")
    file = sshddp(["fetch", "--node", "0", run_id, "out/big.bin", dest])
    assert file.code == ExitCode.OK, file.explain()
    assert not (dest / "node0-h1" / "big.bin").is_symlink()  # the link itself was replaced
    assert (elsewhere / "big.bin").read_bytes() == b"mine"
    (dest / "node0-h1" / "out").mkdir()
    (dest / "node0-h1" / "out" / "sub").symlink_to(elsewhere)
    tree_ = sshddp(["fetch", "--node", "0", run_id, "out", dest])
    assert_clean_failure(tree_, ExitCode.BAD_INPUT)
    assert f"{dest / 'node0-h1' / 'out' / 'sub'}: is a link or a file" in tree_.err
    assert sorted(os.listdir(elsewhere)) == ["big.bin"]
    assert not any(p.name.startswith(".sshddp-fetch-") for p in dest.rglob("*"))


def test_a_path_only_some_nodes_have_is_fetched_from_those_and_the_rest_named(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    run_id, cwds = launch_outputs(ssh_env, tmp_path, free_port(), mb=1)
    (cwds[0] / "snapshot.pt").write_bytes(b"weights")
    result = sshddp(["fetch", run_id, "snapshot.pt", tmp_path / "d"])
    assert result.code == ExitCode.OK, result.explain()
    assert (tmp_path / "d" / "node0-h1" / "snapshot.pt").read_bytes() == b"weights"
    for node in (1, 2):
        host = f"h{node + 1}"
        line = f"node {node} ({host}): nothing to copy: {host}: {cwds[node]}/snapshot.pt: not found"
        assert line in result.out, result.explain()
        assert not (tmp_path / "d" / f"node{node}-{host}").exists()
    alone = sshddp(["fetch", "--node", "1", run_id, "snapshot.pt", tmp_path / "d"])
    assert_clean_failure(alone, ExitCode.BAD_INPUT)
    assert f"node 1 (h2): NOT fetched: h2: {cwds[1]}/snapshot.pt: not found" in alone.err
