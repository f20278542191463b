"""A host's workdir and a run's secrets, attacked for real on the sshd lab hosts (this
machine, as root, on loopback addresses): another local user's symlink as the workdir, a
workdir link swapped under a running run, and a coordinator SIGKILLed while it stages.

Each test fails on the code before its fix and ends by scanning /proc for the run.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest
import yaml
from launch_helpers import JOB, SSHDDP, cli_env, sshddp, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

PAYLOAD = Path(__file__).parent / "payloads" / "hardening.py"
BOUND = 120.0  # generous upper bound for what should take seconds on a loaded machine
BIG = 160 << 20  # a --workdir this large keeps staging going for seconds


def with_workdir(inv: Path, node: int, workdir: Path | str) -> None:
    """Give inventory host ``node`` its own workdir."""
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][node]["workdir"] = str(workdir)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))


# ---------------------------------------------- 1. a coordinator killed while it stages


@pytest.fixture(scope="module")
def big_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A --workdir of ``BIG`` bytes of incompressible data, and the job."""
    proj = tmp_path_factory.mktemp("big") / "proj"
    (proj / "data").mkdir(parents=True)
    (proj / "job.py").write_bytes(PAYLOAD.read_bytes())
    for i in range(BIG >> 24):
        (proj / "data" / f"part{i}.bin").write_bytes(os.urandom(1 << 24))
    return proj


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def _node_dirs(workdir: Path, run: str) -> list[Path]:
    runs = workdir / "runs" / run
    return sorted(runs.glob("n*")) if runs.is_dir() else []


def _code_arrived(nodes: list[Path]) -> bool:
    return len(nodes) == 2 and all(_size(n / "code") > (8 << 20) for n in nodes)


def _staging_ends(workdir: Path, run: str) -> bool:
    """A node holds all its code and is putting it into the workspace: its last step
    before it writes the rest and says it staged."""
    return any((n / "code.sha256").exists() for n in _node_dirs(workdir, run))


@contextlib.contextmanager
def _slow_workspace(workdir: Path) -> Iterator[None]:
    """The workspaces on a file system of their own (a tmpfs), so the shipped files are
    copied there, not hard-linked: seconds between a node's last byte of code and its
    answer, for the kill to land in."""
    work = workdir / "work"
    work.mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1g,mode=0700", "sshddp-test", str(work)]
    r = subprocess.run(mount, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {work} (needs root; CI runs as root): {r.stderr}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(work)], capture_output=True)


INSTANTS = {
    "run directory made": lambda workdir, run: bool(_node_dirs(workdir, run)),
    "code arriving": lambda workdir, run: _code_arrived(_node_dirs(workdir, run)),
    "a node staging its last step": _staging_ends,
}


def _secret_files(root: Path, secret: bytes) -> list[str]:
    """Files under ``root`` holding ``secret``, or named as sshddp's secret files were."""
    found = []
    for where, _, files in os.walk(root):
        for name in files:
            path = os.path.join(where, name)
            if name in ("peers.key", "env.json") or name.startswith("env.json.tmp"):
                found.append(path)
                continue
            try:
                with open(path, "rb") as fh:
                    if secret in fh.read():
                        found.append(path)
            except OSError:
                pass
    return found


@pytest.mark.parametrize("instant", list(INSTANTS))
def test_a_coordinator_killed_while_staging_leaves_no_secret_on_any_host(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    big_project: Path,
    instant: str,
    run_no_leak,
) -> None:
    """The coordinator is SIGKILLed during staging: each host's launch session sees its
    channel close (EOF, or a broken pipe as it answers) and removes what it staged. No
    --env secret and no peers.key may stay on any host: they once stayed in runs/<id>/n*/
    for good, with no supervisor to remove them and no record left for `stop` or retention
    to find them by."""
    secret = f"staging-secret-{uuid.uuid4().hex}"
    inv, workdir = write_inventory(
        ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1, env={"API_TOKEN": secret}
    )
    run = "killed-" + instant.replace(" ", "-")
    with _slow_workspace(workdir):
        proc = subprocess.Popen(
            [*SSHDDP, "launch", "--workdir", str(big_project), "--name", run, str(inv)]
            + [str(big_project / "job.py"), "wait"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: INSTANTS[instant](workdir, run), BOUND, instant)
            assert not any((n / "state.json").exists() for n in _node_dirs(workdir, run)), (
                "a node started before the kill: the test's workdir is too small"
            )
        finally:
            proc.kill()
            _, err = proc.communicate()
        assert proc.returncode == -signal.SIGKILL, err
        wait_until(lambda: not _node_dirs(workdir, run), BOUND, "every host to remove its node")
        assert _secret_files(workdir, secret.encode()) == []
    run_no_leak(run)


# ------------------------------------------------ 2. another user's symlink as workdir


def test_another_users_symlink_as_the_workdir_is_refused_naming_it_and_its_owner(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    stranger: pwd.struct_passwd,
    run_no_leak,
) -> None:
    """h2's `workdir:` lies in a world-writable sticky directory (as /tmp), where another
    user made it a symlink to a directory of ours. Its owner can point it at their own
    files at any moment (the check once followed it and the run went on using the link, so
    a swap before a restart ran their rank.py as us). The preflight (exit 3) and, with
    --no-check, staging (exit 1) refuse it, naming the link and its owner."""
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    link = shared / "work"
    link.symlink_to(mine)
    os.lchown(link, stranger.pw_uid, stranger.pw_gid)
    with_workdir(inv, 1, link)
    expected = (
        f"workdir {link} is a symlink owned by uid {stranger.pw_uid} ({stranger.pw_name}), "
        f"not by this user (uid {os.geteuid()}) or root"
    )
    checked = sshddp(ssh_env, tmp_path, "launch", "--name", "link1", str(inv), str(JOB), "ok")
    out = checked.stdout + checked.stderr
    assert checked.returncode == 3, out
    assert f"FAIL h2 workdir: {expected}" in out, out
    assert "point `workdir:` to a real directory of your own" in out, out
    unchecked = sshddp(
        ssh_env, tmp_path, "launch", "--no-check", "--name", "link2", str(inv), str(JOB), "ok"
    )
    assert unchecked.returncode == 1, unchecked.stderr
    assert "Traceback" not in unchecked.stderr
    assert f"root cause: node 1 on h2: {expected}" in unchecked.stderr, unchecked.stderr
    assert list(mine.iterdir()) == [], "staging went through the link"
    run_no_leak("link1")
    run_no_leak("link2")
