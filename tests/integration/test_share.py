"""``--share``: on hosts that share no disk, a checkpoint rank 0 saved reaches every node
before the ranks start, straight from node 0; without it, the launch warns."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import yaml

from cli_helpers import Result, assert_clean_failure, sshddp
from sshddp_lab.sshd import SshdCluster

SNAPSHOT = Path(__file__).parent / "payloads" / "snapshot.py"


def two_hosts_apart(cluster: SshdCluster, tmp: Path, port: int) -> Path:
    """An inventory of two hosts, each with a workdir of its own: no shared disk."""
    doc: dict[str, Any] = {
        "defaults": {"python": sys.executable},
        "rendezvous": {"port": port},
        "hosts": [
            {"host": cluster.host(i).alias, "nproc": 1, "workdir": str(tmp / f"host{i}")}
            for i in (1, 2)
        ],
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def launch(
    inv: Path, log_dir: Path, *opts: str, save: bool = False
) -> tuple[Result, str, list[dict[str, Any]]]:
    """One node-launcher run of snapshot.py: the result, the run id and each node's line."""
    args = ["launch", "--launcher", "node", "--log-dir", str(log_dir), *opts, str(inv)]
    result = sshddp([*args, str(SNAPSHOT), *(["save"] if save else [])])
    assert result.code == 0, result.explain()
    run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
    lines = []
    for node in (0, 1):
        (log,) = (log_dir / run_id).glob(f"node{node}-*.log")
        lines += [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    return result, run_id, sorted(lines, key=lambda line: line["node"])


def test_a_snapshot_rank_0_saved_reaches_every_node_only_with_share(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    inv = two_hosts_apart(ssh_env, tmp_path, free_port())
    logs = tmp_path / "logs"

    # First run: no snapshot anywhere yet (a note, nothing removed); node 0 saves epoch 1.
    first, run_id, lines = launch(inv, logs, "--share", "snapshot.pt", save=True)
    assert [line["start_epoch"] for line in lines] == [0, 0]
    assert "--share snapshot.pt: not on node 0" in first.err, first.err
    run_no_leak(run_id)
    spaces = [Path(line["cwd"]) for line in lines]
    assert spaces[0] != spaces[1] and (spaces[0] / "snapshot.pt").exists()
    assert not (spaces[1] / "snapshot.pt").exists()

    # Without --share: node 1 would start over, so the launch warns, naming the file.
    unshared, run_id, lines = launch(inv, logs)
    assert [line["start_epoch"] for line in lines] == [1, 0]
    warning = unshared.err.split("sshddp: warning: ", 1)[1]
    assert "snapshot.pt" in warning and "--share snapshot.pt" in warning, unshared.err
    run_no_leak(run_id)

    # With it: node 0's copy reaches node 1 before the ranks start; every node resumes. Under
    # torchrun, whose store then listens on the port node 0 sent the file from.
    shared, run_id, lines = launch(inv, logs, "--share", "snapshot.pt", "--launcher", "torchrun")
    assert [line["start_epoch"] for line in lines] == [1, 1], shared.err
    assert "node 0 sent 1 file(s)" in shared.err and "warning" not in shared.err
    assert (spaces[1] / "snapshot.pt").read_bytes() == (spaces[0] / "snapshot.pt").read_bytes()
    run_no_leak(run_id)

    # Identical everywhere now: node 0 is not even asked to listen, the file stays as it is.
    before = (spaces[1] / "snapshot.pt").stat()
    same, run_id, lines = launch(inv, logs, "--share", "./snapshot.pt")
    assert [line["start_epoch"] for line in lines] == [1, 1]
    assert "node 0's copy is on every node; nothing sent" in same.err, same.err
    assert "node 0 sent" not in same.err
    after = (spaces[1] / "snapshot.pt").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    run_no_leak(run_id)

    # A node that cannot take node 0's copy (a directory holds its place there) fails to
    # stage, and nothing starts anywhere: no rank ran, no process is left.
    (spaces[0] / "snapshot.pt").write_bytes(b"epoch 2 on node 0")
    (spaces[1] / "snapshot.pt").unlink()
    (spaces[1] / "snapshot.pt").mkdir()
    failed = sshddp(
        ["launch", "--launcher", "node", "--log-dir", str(logs), "--share", "snapshot.pt"]
        + [str(inv), str(SNAPSHOT)]
    )
    assert failed.code == 1, failed.explain()
    assert "root cause: node 1 on h2: --share: [Errno 21] Is a directory" in failed.err
    assert "not started: node 1 (h2) could not be staged" in failed.err, failed.err
    assert (spaces[1] / "snapshot.pt").is_dir()  # left as it was, and no temporary beside it
    assert sorted(p.name for p in spaces[1].glob("snapshot.pt*")) == ["snapshot.pt"]
    run_id = failed.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
    for log in (logs / run_id).glob("node*.log"):
        assert "start_epoch" not in log.read_text(), log.read_text()
    run_no_leak(run_id)


def test_a_share_path_outside_the_working_directory_is_bad_input(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    inv = two_hosts_apart(ssh_env, tmp_path, free_port())
    for path in ("../snapshot.pt", "ckpt/../../x", "/etc/passwd"):
        result = sshddp(["launch", "--share", path, str(inv), str(SNAPSHOT)])
        assert_clean_failure(result, 2)
        assert f"--share {path}:" in result.err, result.err
    assert not (tmp_path / "host1").exists()  # refused before anything was reached
