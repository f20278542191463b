"""A spare takes a lost node's place mid-run, for real: 3 hosts and a spare (h4) on real sshd
servers (the supervisors decide: the min_nodes case runs detached, with no coordinator),
gloo all-reduces every step and rank 0 checkpoints every 3 steps, on node 0 alone: each
host has its own workdir (no shared disk) and the checkpoint is ``--share``d. h3's host dies
(its sshd and sessions gone, every process of its node SIGKILLed): node 0 halts the attempt,
seats h4's waiting supervisor as node 2, hands its latest checkpoint to h2 and h4, and the
run finishes on h1, h2, h4 from it, not from step 0. No process of the run survives on any
host; h3 is quarantined, and the next launch of the inventory, h3's sshd back, leaves it
out and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import SSHDDP, cli_env, finish, sshddp, start, wait_until
from test_faults_infra import _kill_sshd_and_sessions, contains, remote_log
from test_quarantine import _kill_node

from sshddp_lab.sshd import SshdCluster

TRAIN = Path(__file__).parent / "payloads" / "ckpt_train.py"
STEPS = 40


class Workdirs:
    """Each host its own workdir (no shared disk): mesh slot ``n``'s is host h(n+1)'s."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    def __getitem__(self, slot: int) -> Path:
        return self.tmp / f"remote-h{slot + 1}"


def _inventory(tmp: Path, port: int, **top: Any) -> tuple[Path, Workdirs]:
    workdirs = Workdirs(tmp)
    doc: dict[str, Any] = {
        "defaults": {
            "python": sys.executable,
            "nproc": 1,
            "env": {"GLOO_SOCKET_IFNAME": "lo"},
            "share": ["ckpt.json"],  # rank 0 writes it on node 0 alone
        },
        "rendezvous": {"port": port},
        "hosts": [{"host": f"h{i}", "workdir": str(workdirs[i - 1])} for i in (1, 2, 3)],
        "spares": [{"host": "h4", "workdir": str(workdirs[3])}],
        **top,
    }
    doc = {k: v for k, v in doc.items() if v is not None}
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv, workdirs


def _kill_h3_mid_run(cluster: SshdCluster, workdirs: Workdirs, run: str) -> None:
    """Once every rank is past its first checkpoints: h3's sshd, sessions and node gone."""
    wait_until(
        lambda: all(
            contains(remote_log(workdirs[n], run, n), f"rank {n} step 7\n") for n in range(3)
        ),
        180,
        "every rank past its first checkpoints",
    )
    _kill_sshd_and_sessions(cluster, 3)
    _kill_node(run, workdirs[2], 2)


def supervisor_log(workdirs: Workdirs, run: str, slot: int) -> str:
    return (workdirs[slot] / "runs" / run / f"n{slot}" / "supervisor.log").read_text()


def _exit(workdirs: Workdirs, run: str, slot: int) -> dict[str, Any]:
    path = workdirs[slot] / "runs" / run / f"n{slot}" / "exit.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def test_a_spare_takes_a_lost_nodes_place_and_the_run_resumes_from_its_checkpoint(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Attached: the launch's report says attempt 2 of 2, that h3 was lost and h4 took its
    place, names node 2 replaced and quarantines h3; exit 0."""
    cluster = make_cluster(4)
    inv, workdirs = _inventory(tmp_path, free_port())
    run = "spm"
    opts = ["--name", run, "--max-restarts", "1", "--heartbeat-timeout", "5", "--grace", "2"]
    proc = subprocess.Popen(  # time enough after the restart for ``top`` to look
        [*SSHDDP, "launch", *opts, str(inv), str(TRAIN), str(STEPS + 40)],
        cwd=tmp_path,
        env=cli_env(cluster),
        text=True,
        stdout=subprocess.PIPE,  # the console: h4's lines under the rank it took
        stderr=subprocess.PIPE,
    )
    try:
        _kill_h3_mid_run(cluster, workdirs, run)
        _top_names_the_replacement(cluster, tmp_path, workdirs, run)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err
    report = err[err.index(f"sshddp: run {run} succeeded") :]
    assert "\nattempt 2 of 2\n  attempt 1 ended: node 2 (h3) lost (" in report, report
    assert "; h4 took its place; every node restarted" in report, report
    assert "lost mid-run; h4 took its place" in report, report  # node 2's row: replaced
    said = [line for line in err.splitlines() if line.startswith("sshddp: quarantined")]
    assert len(said) == 1 and said[0].startswith("sshddp: quarantined h3 until "), err
    ends = {slot: _exit(workdirs, run, slot) for slot in (0, 1, 3)}
    assert all(e["state"] == "succeeded" for e in ends.values()), ends
    assert ends[3]["node_rank"] == 2 and ends[3]["attempt"] == 2, ends[3]
    spare_log = remote_log(workdirs[3], run, 3).read_text()
    (begin,) = [line for line in spare_log.splitlines() if " starts at step " in line]
    assert begin.startswith("attempt 2 rank 2 node 2 replaced [2] starts at step "), spare_log
    resumed = int(begin.rsplit(" ", 1)[1])
    assert resumed >= 6, begin  # node 0's checkpoint, not step 0: h4 had none of its own
    assert "sshddp supervisor: --share: ckpt.json from node 0 (" in supervisor_log(workdirs, run, 3)
    node1 = remote_log(workdirs[1], run, 1).read_text()  # h2's own copy was the launch's
    assert f"attempt 2 rank 1 node 1 replaced [2] starts at step {resumed}" in node1, node1
    node0 = remote_log(workdirs[0], run, 0).read_text()
    assert f"attempt 2 rank 0 node 0 replaced [2] starts at step {resumed}" in node0, node0
    assert '"world": 3, "attempt": 2' in node0 and f'"first": {resumed}' in node0, node0
    _named_as_the_node_it_took(cluster, tmp_path, run, workdirs, out)
    run_no_leak(run)

    # h3's sshd back up: the next launch of the inventory leaves it out and says so
    cluster.start_host(3)
    again = sshddp(cluster, tmp_path, "launch", "--name", "spm2", inv, TRAIN, str(STEPS))
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr
    (swap,) = [line for line in again.stderr.splitlines() if "takes its place" in line]
    assert swap.startswith("sshddp: node 2: h3 quarantined until "), swap
    assert swap.endswith("; spare h4 takes its place"), swap
    run_no_leak("spm2")


def _top_names_the_replacement(
    cluster: SshdCluster, tmp: Path, workdirs: Workdirs, run: str
) -> None:
    """Once h4 runs node 2's rank, ``top`` shows it as node 2 (its rank 2 on h4), with the
    line naming the replacement, and h3's row gone."""
    spare_log = remote_log(workdirs[3], run, 3)
    wait_until(lambda: contains(spare_log, "rank 2 step "), 120, "h4 running rank 2")
    seen: dict[str, Any] = {}

    def looked() -> bool:
        got = sshddp(cluster, tmp, "top", "--json", run, timeout=60)
        seen.update(json.loads(got.stdout) if got.returncode == 0 else {"failed": got.stderr})
        return any(r["rank"] == 2 and r["host"] == "h4" for r in seen.get("ranks", []))

    wait_until(looked, 30, "top's row of rank 2 on h4")
    nodes = {n["node_rank"]: n for n in seen["nodes"]}
    assert sorted(nodes) == [0, 1, 2] and nodes[2]["host"] == "h4", seen["nodes"]
    assert nodes[2]["replaced"] == "node 2: h4 since attempt 2 (h3 lost)", nodes[2]
    (rank2,) = [r for r in seen["ranks"] if r["rank"] == 2]
    assert rank2["node_rank"] == 2, rank2
    shown = sshddp(cluster, tmp, "top", run, timeout=60)
    assert "node 2: h4 since attempt 2 (h3 lost)\n" in shown.stdout, shown.stdout + shown.stderr


def _named_as_the_node_it_took(
    cluster: SshdCluster, tmp: Path, run: str, workdirs: Workdirs, console: str
) -> None:
    """h4, seated as node 2 (rank 2), is shown as node 2 on h4: the console's prefix, its
    local log (``node2-h4.log``, beside h3's ``node2-h3.log``), ``logs --node 2`` (h3's
    bytes, then h4's, each as its ranks wrote them) and ``ps --json``."""
    lines = console.splitlines()
    assert "[2 h4] attempt 2 rank 2 node 2 replaced [2] starts at step " in console, console
    assert not [line for line in lines if line.startswith("[3 ")], console  # no spare slot
    assert "[2 h3] rank 2 step 7" in console, console  # h3's lines, before it died
    local = tmp / "sshddp-logs" / run
    assert sorted(p.name for p in local.glob("*.log")) == [
        "node0-h1.log",
        "node1-h2.log",
        "node2-h3.log",
        "node2-h4.log",
    ]
    h4 = (local / "node2-h4.log").read_bytes()
    assert h4 == remote_log(workdirs[3], run, 3).read_bytes()  # byte for byte
    h3 = (local / "node2-h3.log").read_bytes()
    assert b"rank 2 step 7\n" in h3 and remote_log(workdirs[2], run, 2).read_bytes().startswith(h3)
    shown = subprocess.run(
        [*SSHDDP, "logs", "--node", "2", run],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == h3 + h4  # raw: node 2's bytes, h3's then h4's
    assert b"sshddp: node 2: h4 since attempt 2 (h3 lost)" in shown.stderr, shown.stderr
    ps = sshddp(cluster, tmp, "ps", "--json", run)
    assert ps.returncode == 0, ps.stderr
    (row,) = json.loads(ps.stdout)["runs"]
    nodes = row["nodes"]
    assert nodes[2]["state"] == "replaced" and nodes[2]["host"] == "h3", nodes
    assert "h4 took its place" in nodes[2]["reason"] and nodes[2]["replaced_by"] == "h4", nodes
    assert nodes[3]["host"] == "h4" and nodes[3]["took"] == 2, nodes  # who replaced whom


def test_attach_after_the_replacement_shows_the_spare_as_the_node_it_took(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Detached: h3 dies, h4 is seated as node 2; ``attach`` then follows h4 as node 2
    (``[2 h4]``, ``node2-h4.log`` byte for byte its host's log) to the run's end."""
    cluster = make_cluster(4)
    inv, workdirs = _inventory(tmp_path, free_port())
    run = "spatt"
    opts = ["--detach", "--name", run, "--max-restarts", "1", "--heartbeat-timeout", "5"]
    started = sshddp(cluster, tmp_path, "launch", *opts, "--grace", "2", inv, TRAIN, "60")
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stderr
    _kill_h3_mid_run(cluster, workdirs, run)
    spare_log = remote_log(workdirs[3], run, 3)
    wait_until(lambda: contains(spare_log, "rank 2 step "), 120, "h4 running rank 2")
    attached = subprocess.run(
        [*SSHDDP, "attach", run],
        cwd=tmp_path,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert attached.returncode == 0 and "Traceback" not in attached.stderr, attached.stderr
    lines = attached.stdout.splitlines()
    assert "[2 h4] attempt 2 rank 2 node 2 replaced [2] starts at step " in attached.stdout
    assert not [line for line in lines if line.startswith("[3 ")], attached.stdout
    local = tmp_path / "sshddp-logs" / run
    assert (local / "node2-h4.log").read_bytes() == spare_log.read_bytes()
    assert not (local / "node3-h4.log").exists()
    run_no_leak(run)


def test_with_no_spare_min_nodes_lets_the_run_go_on_with_fewer_nodes(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """3 nodes, no spare, ``min_nodes: 2``: node 2's host dies; the run goes on with nodes 0
    and 1 (world size 2) from the last checkpoint."""
    cluster = make_cluster(3)
    inv, workdirs = _inventory(tmp_path, free_port(), spares=None, min_nodes=2)
    run = "spmin"
    opts = ["--detach", "--name", run, "--max-restarts", "1", "--heartbeat-timeout", "5"]
    started = sshddp(cluster, tmp_path, "launch", *opts, "--grace", "2", inv, TRAIN, str(STEPS))
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stderr
    _kill_h3_mid_run(cluster, workdirs, run)
    wait_until(lambda: _exit(workdirs, run, 0) and _exit(workdirs, run, 1), 300, "nodes 0, 1")
    ends = [_exit(workdirs, run, node) for node in (0, 1)]
    assert all(e["state"] == "succeeded" and e["attempt"] == 2 for e in ends), ends
    (why,) = ends[0]["earlier"]
    assert why.startswith("node 2 (h3) lost ("), why
    assert "; the run goes on with 2 node(s) (min_nodes 2): " in why, why
    log = remote_log(workdirs[1], run, 1).read_text()
    (begin,) = [
        line for line in log.splitlines() if line.startswith("attempt 2 ") and " starts " in line
    ]
    assert begin.startswith("attempt 2 rank 1 node 1 replaced [] starts at step "), log
    assert int(begin.rsplit(" ", 1)[1]) >= 6, begin  # the checkpoint, not step 0
    assert '"world": 2, "attempt": 2' in log, log
    run_no_leak(run)


def test_with_sync_a_spare_seated_mid_run_runs_its_ranks_in_the_synced_env(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """``--sync`` gives the staged spare the environment too (before it is staged): once
    seated as node 2, its rank runs the synced environment's Python, as the others do."""
    from test_sync import make_project

    cluster = make_cluster(4)
    cache = tmp_path / "uv-cache"
    inv, workdirs = _inventory(tmp_path, free_port())
    doc = yaml.safe_load(inv.read_text())
    doc["defaults"]["env"]["UV_CACHE_DIR"] = str(cache)  # one cache: torch unpacked once
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    project = make_project(tmp_path / "proj", ["torch==2.13.0"], cache)
    run = "spsync"
    opts = ["--name", run, "--sync", str(project), "--max-restarts", "1"]
    opts += ["--heartbeat-timeout", "5", "--grace", "2"]
    proc = start(cluster, tmp_path, "launch", *opts, str(inv), str(TRAIN), str(STEPS))
    try:
        _kill_h3_mid_run(cluster, workdirs, run)
        rc, err = finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0 and "Traceback" not in err, err
    assert "sshddp: sync: env " in err and " on all 4 host(s)" in err, err  # the spare's too
    assert "; h4 took its place; every node restarted" in err, err
    for slot, rank in ((0, 0), (1, 1), (3, 2)):
        log = remote_log(workdirs[slot], run, slot).read_text()
        (said,) = [
            line for line in log.splitlines() if line.startswith(f"attempt 2 rank {rank} py")
        ]
        python = Path(said.split(" python ", 1)[1])
        assert python.is_relative_to(workdirs[slot] / "envs"), said  # the synced env's
        assert python != Path(sys.executable), said
    run_no_leak(run)
