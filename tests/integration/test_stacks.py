"""``sshddp stacks`` against real runs: real sshd hosts, real torchrun, gloo on CPU.

Each test starts a run that hangs on purpose (``payloads/hang.py``), reads its stacks from
another process, as from another terminal, and checks what the stacks say against where
the ranks really stand: the payload marks those lines with comments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import SSHDDP, cli_env, sshddp, wait_until, write_inventory

from sshddp_lab.sshd import SshdCluster

HANG = Path(__file__).parent / "payloads" / "hang.py"
NOT_RUNNING = 5


def line_of(marker: str) -> int:
    """The line of hang.py that carries ``# MARKER``."""
    for number, text in enumerate(HANG.read_text().splitlines(), 1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(f"no line marked {marker} in {HANG}")


def stacks_json(cluster: SshdCluster, cwd: Path, *args: str) -> dict[str, Any]:
    done = sshddp(cluster, cwd, "stacks", "--json", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return dict(json.loads(done.stdout))


def wait_ready(workdir: Path, run: str, nodes: int, ranks: int, timeout: float = 150) -> None:
    """Every rank printed READY (it stands where it will hang)."""

    def ready() -> bool:
        text = ""
        for n in range(nodes):
            log = workdir / "runs" / run / f"n{n}" / "node.log"
            text += log.read_text(errors="replace") if log.exists() else ""
        return all(f"READY {r}\n" in text for r in range(ranks))

    wait_until(ready, timeout, f"every rank of {run} to be ready")


def processes(doc: dict[str, Any], role: str = "rank") -> dict[int, dict[str, Any]]:
    """The processes of ``role`` by rank (ranks) or pid (others), with their node's host."""
    found = {}
    for node in doc["nodes"]:
        for proc in node["processes"]:
            if proc["role"] == role:
                found[proc["rank"] if role == "rank" else proc["pid"]] = {
                    **proc,
                    "host": node["host"],
                }
    return found


def functions(proc: dict[str, Any]) -> list[set[str]]:
    """The Python functions on each of the process's threads' stacks."""
    return [{f["func"] for f in t["frames"] if not f["native"]} for t in proc["threads"]]


def stands_in(proc: dict[str, Any], *funcs: str) -> bool:
    """Thread k of the process has ``funcs[k]`` on its stack, and it has no more threads."""
    found = functions(proc)
    return len(found) == len(funcs) and all(f in t for f, t in zip(funcs, found))


def test_stacks_names_the_sleeping_rank_its_host_and_its_line(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Attached run, 3 hosts x 2 ranks: rank 3 sleeps before the all-reduce the other five
    wait in. `stacks` from another terminal groups the five and names rank 3, h2, its line;
    --node 1 shows only that node; saved dumps; then the run is stopped and `stacks` says
    it has ended."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    launch = subprocess.Popen(
        [*SSHDDP, "launch", "--name", "slp", str(inv), str(HANG), "sleeper", "3"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_ready(workdir, "slp", 3, 6)
        # READY is printed just before the all-reduce: wait until five ranks stand in it.
        wait_until(lambda: _five_in_allreduce(ssh_env, tmp_path), 60, "ranks in all_reduce")
        done = sshddp(ssh_env, tmp_path, "stacks", "slp")
        assert done.returncode == 0, done.stderr
        text = done.stdout
        odd, rest = (
            text.index("=== odd one out: rank 3 on h2 (1 rank) ==="),
            text.index("=== ranks 0-2,4-5 on h1,h2,h3 (5 ranks) ==="),
        )
        assert odd < rest, text  # the odd one out comes first
        culprit = text[odd:rest]
        where = f'hang.py", line {line_of("SLEEPS HERE")}, in sleep_before_allreduce'
        assert where in culprit and "forever()  # SLEEPS HERE" in culprit, text
        waiting = text[rest:]
        assert f'hang.py", line {line_of("WAITS HERE")}, in sleeper' in waiting, text
        assert "in all_reduce" in waiting, text
        assert "6 ranks on 3 hosts in 2 groups, 1 odd one out" in done.stderr, done.stderr
        saved = Path(done.stderr.split("full dumps (one file per process): ")[1].split()[0])
        assert saved.parent == tmp_path / "sshddp-logs" / "slp" / "stacks"
        dumps = sorted(p.name for p in saved.iterdir())
        assert len([d for d in dumps if d.startswith("rank")]) == 6, dumps
        assert len([d for d in dumps if d.startswith("agent-node")]) == 3, dumps
        rank3 = next(saved.glob("rank3-node1-h2-pid*.txt")).read_text()
        assert "sleep_before_allreduce" in rank3 and "as faulthandler wrote it" in rank3

        node1 = sshddp(ssh_env, tmp_path, "stacks", "slp", "--node", "1")
        assert node1.returncode == 0, node1.stderr
        assert "=== rank 2 on h2 (1 rank) ===" in node1.stdout, node1.stdout
        assert "=== rank 3 on h2 (1 rank) ===" in node1.stdout, node1.stdout
        assert "h1" not in node1.stdout and "h3" not in node1.stdout and "odd" not in node1.stdout
        bad = sshddp(ssh_env, tmp_path, "stacks", "slp", "--node", "3")
        assert bad.returncode == 2 and "run slp has nodes 0-2" in bad.stderr, bad.stderr
    finally:
        stop = sshddp(ssh_env, tmp_path, "stop", "slp")
        launch.wait(timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert launch.returncode == 1
    run_no_leak("slp")
    ended = sshddp(ssh_env, tmp_path, "stacks", "slp")
    assert ended.returncode == NOT_RUNNING, ended.stderr
    assert "run slp is not running (node 0 (h1) stopped, node 1 (h2) stopped" in ended.stderr
    assert "Traceback" not in ended.stderr


def _five_in_allreduce(cluster: SshdCluster, cwd: Path) -> bool:
    doc = stacks_json(cluster, cwd, "slp")
    ranks = processes(doc)
    waiting = [r for r, p in ranks.items() if any("all_reduce" in t for t in functions(p))]
    return sorted(waiting) == [0, 1, 2, 4, 5]


def test_stacks_of_ranks_blocked_in_c_with_threads_signal_handlers_and_workers(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached run, 2 hosts x 2 ranks that installed their own SIGUSR1/SIGUSR2 handlers:
    rank 0 blocked in libc recv, rank 1 on a lock with two more threads, rank 2 with a forked
    and a spawned worker. Every stack is read; none of it disturbs the ranks: the recv
    still returns its bytes, and the script's own handlers still run. With h2 unreachable,
    h1's stacks still come, and the exit status says a host was missed."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    started = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--detach",
        "--fresh-cwd",
        "--name",
        "blk",
        str(inv),
        str(HANG),
        "blocked",
    )
    assert started.returncode == 0, started.stderr
    try:
        wait_ready(workdir, "blk", 2, 4)
        for _ in range(2):  # twice: a second dump is read from where the first ended
            doc = stacks_json(ssh_env, tmp_path, "blk")
            ranks = processes(doc)
            assert sorted(ranks) == [0, 1, 2, 3]
            assert [p["source"] for p in ranks.values()] == ["faulthandler"] * 4
            assert stands_in(ranks[0], "recv_in_c", "release"), ranks[0]
            recv = ranks[0]["threads"][0]["frames"][-1]
            assert recv["line"] == line_of("RECV HERE") and recv["code"].startswith("got = libc")
            assert stands_in(ranks[1], "wait_on_lock", "heartbeat", "waiter"), ranks[1]
            assert stands_in(ranks[2], "with_workers") and ranks[3]["host"] == "h2"
            workers = processes(doc, "worker").values()
            assert all(w["rank"] == 2 and w["host"] == "h2" for w in workers)
            found = {f for w in workers for t in functions(w) for f in t}
            assert {"forked_worker", "spawned_worker"} <= found, workers
            assert len(processes(doc, "agent")) == 2
        (workdir / "runs/blk/n0/code/release").write_text("")
        log0 = workdir / "runs/blk/n0/node.log"
        wait_until(lambda: "recv returned" in log0.read_text(), 30, "rank 0's recv to return")
        assert "rank 0 recv returned 5 errno 0" in log0.read_text()  # no EINTR
        _script_handlers_still_run(workdir, ranks)
        text = sshddp(ssh_env, tmp_path, "stacks", "blk")
        assert text.returncode == 0, text.stderr
        assert "=== rank 0 on h1 (1 rank) ===" in text.stdout and "in after_recv" in text.stdout
        assert "=== worker of rank 2 on h2 (1 process: pid " in text.stdout, text.stdout
        assert "=== torchrun agents of nodes 0-1 on h1,h2 (2 processes) ===" in text.stdout
        _one_host_unreachable(ssh_env, tmp_path)
    finally:
        assert sshddp(ssh_env, tmp_path, "stop", "blk").returncode == 0
    run_no_leak("blk")


def _one_host_unreachable(cluster: SshdCluster, cwd: Path) -> None:
    """h2's sshd is down: h1's stacks are printed, h2 is named, and the exit status is 4."""
    cluster.stop_host(2)
    try:
        part = sshddp(cluster, cwd, "stacks", "blk", "--connect-timeout", "3")
    finally:
        cluster.start_host(2)
    assert part.returncode == 4, part.stderr
    assert "=== rank 0 on h1 (1 rank) ===" in part.stdout and "h2" not in part.stdout
    assert "sshddp: node 1 (h2): NO stacks: " in part.stderr, part.stderr
    assert "2 ranks on 1 host in 2 groups" in part.stderr and "Traceback" not in part.stderr


def _script_handlers_still_run(workdir: Path, ranks: dict[int, dict[str, Any]]) -> None:
    for rank, proc in ranks.items():
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            os.kill(proc["pid"], sig)  # every host is this machine
            log = workdir / f"runs/blk/n{rank // 2}/node.log"
            said = f"rank {rank} got {sig.name}\n"
            wait_until(lambda log=log, said=said: said in log.read_text(), 30, said.strip())


def venv_without_py_spy(tmp: Path) -> Path:
    """An interpreter that sees this environment's packages (torch, sshddp) but has no
    py-spy beside it: a host where py-spy is not installed."""
    base = Path(sys.prefix)
    view = tmp / "no-py-spy"
    (view / "bin").mkdir(parents=True)
    (view / "pyvenv.cfg").write_text((base / "pyvenv.cfg").read_text())
    (view / "bin" / "python").symlink_to(Path(sys.executable).resolve())
    (view / "lib").symlink_to(base / "lib")
    return view / "bin" / "python"


def test_native_stacks_with_py_spy_on_one_host_and_missing_on_the_other(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """--native: h1 has py-spy beside its interpreter, h2 has none. h1's ranks show C frames
    (libc's recv under rank 0), h2's show Python frames and the report says py-spy is
    missing there, and where it looked."""
    assert (Path(sys.executable).parent / "py-spy").exists(), "pip install -e '.[test]'"
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][1]["python"] = str(venv_without_py_spy(tmp_path))
    inv.write_text(yaml.safe_dump(doc))
    started = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--detach",
        "--fresh-cwd",
        "--name",
        "nat",
        str(inv),
        str(HANG),
        "blocked",
    )
    assert started.returncode == 0, started.stderr
    try:
        wait_ready(workdir, "nat", 2, 2)
        got = stacks_json(ssh_env, tmp_path, "nat", "--native")
        node0, node1 = got["nodes"]
        assert node0["py_spy"] == str(Path(sys.executable).parent / "py-spy")
        assert node1["py_spy"] == "" and "py-spy is not installed" in node1["note"]
        ranks = processes(got)
        assert ranks[0]["source"] == "py-spy" and ranks[1]["source"] == "faulthandler"
        main = ranks[0]["threads"][0]["frames"]
        assert [f["func"] for f in main if f["native"]][-1] == "recv", main
        assert main[-1]["native"] and not any(
            f["native"] for t in ranks[1]["threads"] for f in t["frames"]
        )
        assert stands_in(ranks[1], "wait_on_lock", "heartbeat", "waiter"), ranks[1]
        text = sshddp(ssh_env, tmp_path, "stacks", "nat", "--native")
        assert text.returncode == 0, text.stderr
        assert "[native] recv (libc.so.6)" in text.stdout, text.stdout
        assert "node 1 (h2): py-spy is not installed (looked for " in text.stderr, text.stderr
        (workdir / "runs/nat/n0/code/release").write_text("")
        log0 = workdir / "runs/nat/n0/node.log"
        wait_until(lambda: "recv returned" in log0.read_text(), 30, "rank 0's recv to return")
        assert "rank 0 recv returned 5 errno 0" in log0.read_text()  # py-spy did not break it
    finally:
        assert sshddp(ssh_env, tmp_path, "stop", "nat").returncode == 0
    run_no_leak("nat")
