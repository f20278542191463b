"""The watchdogs (--init-timeout, --stall-timeout) against real runs: real sshd hosts, real
torchrun, gloo on CPU, attached and detached (no coordinator: the supervisors decide).

The runs hang on purpose (``payloads/hang.py``): a rank that sleeps before the all-reduce
the others wait in, a node whose ranks block before init_process_group.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import launch_on, sshddp, wait_until, write_inventory
from test_stacks import HANG, line_of, wait_ready

from sshddp_lab.sshd import SshdCluster

HUNG = 6
SPAWN_STUCK = Path(__file__).parent / "payloads" / "spawn_stuck.py"
STALL = "20"  # seconds: longer than torch takes to import on a loaded machine (no output)
# Six ranks importing torch at once beside three other CI workers took over 20 s (a CI run:
# "ranks 0 wait in init_process_group, ranks 1 never called"): where the test reads which
# ranks wait, every rank that does not block must have reached init_process_group first.
INIT_WAIT = "40"


def ps_run(cluster: SshdCluster, cwd: Path, run: str) -> dict[str, Any]:
    done = sshddp(cluster, cwd, "ps", "--all", "--json", run)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert len(runs) == 1, runs
    return dict(runs[0])


def wait_finished(cluster: SshdCluster, cwd: Path, run: str, timeout: float) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def finished() -> bool:
        found.update(ps_run(cluster, cwd, run))
        return bool(found["finished"])

    wait_until(finished, timeout, f"run {run} to end")
    return found


def assert_sleeper_named(text: str) -> None:
    """The report names rank 3 on h2 as the odd one out, at its line, before the rest."""
    odd = text.index("=== odd one out: rank 3 on h2 (1 rank) ===")
    rest = text.index("=== ranks 0-2,4-5 on h1,h2,h3 (5 ranks) ===")
    assert odd < rest, text
    where = f'hang.py", line {line_of("SLEEPS HERE")}, in sleep_before_allreduce'
    assert where in text[odd:rest], text


def test_stall_timeout_stops_the_run_and_names_the_sleeping_rank(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Attached, 3 hosts x 2 ranks: rank 3 sleeps before the all-reduce the other five wait
    in, and nothing prints. --stall-timeout ends the run (every node stalled, exit code 6)
    and the report names rank 3, its host and its line; nothing of the run is left."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    done = sshddp(
        ssh_env,
        tmp_path,
        "launch",
        "--name",
        "stl",
        "--stall-timeout",
        STALL,
        str(inv),
        str(HANG),
        "sleeper",
        "3",
        timeout=240,
    )
    assert done.returncode == HUNG, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "run stl hung: a watchdog stopped it" in done.stderr, done.stderr
    assert "the stall watchdog fired" in done.stderr, done.stderr
    assert "no rank wrote output for" in done.stderr, done.stderr
    assert_sleeper_named(done.stderr)
    cause = (
        f"root cause: rank 3 on h2 (node 1) stands apart in forever (hang.py, line "
        f"{line_of('FOREVER')}), called from sleep_before_allreduce (hang.py, line "
        f"{line_of('SLEEPS HERE')}), while the other 5 ranks wait elsewhere"
    )
    assert cause in done.stderr, done.stderr  # not the last node to stall (node 2 on h3)
    assert "lines of node 1's output ---" in done.stderr, done.stderr  # its node's tail
    for n in range(3):
        exit_record = json.loads((workdir / "runs" / "stl" / f"n{n}" / "exit.json").read_text())
        assert exit_record["state"] == "stalled", exit_record
    run_no_leak("stl")


def test_detached_stall_stops_the_run_with_no_coordinator(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached: the supervisors notice the stall and stop the run on their own; `ps` says
    stalled, and `stacks` of the ended run shows the stacks the watchdog took."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "dst", "--stall-timeout", STALL, str(inv), str(HANG)]
    started = sshddp(ssh_env, tmp_path, "launch", *args, "sleeper", "3")
    assert started.returncode == 0, started.stderr
    row = wait_finished(ssh_env, tmp_path, "dst", 180)
    assert [n["state"] for n in row["nodes"]] == ["stalled"] * 3, row
    shown = sshddp(ssh_env, tmp_path, "stacks", "dst")
    assert shown.returncode == 0, shown.stderr
    assert "the stall watchdog fired" in shown.stdout, shown.stdout
    assert_sleeper_named(shown.stdout)
    run_no_leak("dst")


def test_init_timeout_names_the_node_that_never_joined(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached, 3 hosts x 2 ranks: node 1's ranks block before init_process_group, the
    others wait in it. --init-timeout stops the run on its own and says which ranks never
    called it, which wait; `stacks` of the ended run shows where node 1's ranks stand."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "ini", "--init-timeout", INIT_WAIT, str(inv), str(HANG)]
    started = sshddp(ssh_env, tmp_path, "launch", *args, "initblock", "1")
    assert started.returncode == 0, started.stderr
    row = wait_finished(ssh_env, tmp_path, "ini", 200)
    assert [n["state"] for n in row["nodes"]] == ["stalled"] * 3, row
    reason = row["nodes"][0]["reason"]
    assert f"did not form within {INIT_WAIT} s (--init-timeout)" in reason, reason
    assert "node 1 (h2): 0/2 joined, ranks 2-3 never called init_process_group" in reason, reason
    assert "node 0 (h1): 0/2 joined, ranks 0-1 wait in init_process_group" in reason, reason
    shown = sshddp(ssh_env, tmp_path, "stacks", "ini")
    assert shown.returncode == 0, shown.stderr
    assert "the init watchdog fired" in shown.stdout, shown.stdout
    assert f"line {line_of('BLOCKS BEFORE INIT')}, in block_before_init" in shown.stdout
    assert "=== odd one out: ranks 2-3 on h2 (2 ranks) ===" in shown.stdout, shown.stdout
    run_no_leak("ini")


def test_on_stall_report_keeps_the_run_and_ps_shows_joined_and_quiet(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """--on-stall report: the stacks are recorded on every node, the run goes on. `ps`
    shows every node's ranks joined and how long it has been quiet."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port())
    args = ["--detach", "--name", "rep", "--stall-timeout", "4", "--on-stall", "report"]
    started = sshddp(ssh_env, tmp_path, "launch", *args, str(inv), str(HANG), "sleeper", "3")
    assert started.returncode == 0, started.stderr
    try:
        wait_ready(workdir, "rep", 3, 6)
        hangs = [workdir / "runs" / "rep" / f"n{n}" / "hang.json" for n in range(3)]
        wait_until(lambda: all(h.exists() for h in hangs), 90, "every node's hang.json")
        record = json.loads(hangs[1].read_text())
        assert record["kind"] == "stall" and record["action"] == "report", record
        ranks = {p["rank"] for p in record["stacks"]["processes"] if p["role"] == "rank"}
        assert ranks == {2, 3}, record
        rows: list[dict[str, Any]] = []

        def quiet() -> bool:  # the ranks printed READY last: every node falls silent
            rows.append(ps_run(ssh_env, tmp_path, "rep"))
            return all((n["quiet"] or 0) >= 2 for n in rows[-1]["nodes"])

        wait_until(quiet, 60, "every node quiet for 2 s")
        row = rows[-1]
        assert not row["finished"], row
        assert [n["state"] for n in row["nodes"]] == ["running"] * 3, row
        assert [n["joined"] for n in row["nodes"]] == [2, 2, 2], row
        table = sshddp(ssh_env, tmp_path, "ps", "rep")
        assert "(2/2 joined, quiet" in table.stdout, table.stdout
    finally:
        stopped = sshddp(ssh_env, tmp_path, "stop", "rep")
    assert stopped.returncode == 0, stopped.stderr
    run_no_leak("rep")


def test_attached_init_timeout_exits_6_with_the_finding_and_the_stacks(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Attached, 2 hosts x 2 ranks: node 1's ranks block before init_process_group. The
    launch exits 6; its report gives the init watchdog's finding and where node 1's ranks
    stand; nothing of the run is left."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    args = ["--name", "ina", "--init-timeout", STALL, str(inv), str(HANG), "initblock", "1"]
    done = sshddp(ssh_env, tmp_path, "launch", *args, timeout=240)
    assert done.returncode == HUNG, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "the init watchdog fired" in done.stderr, done.stderr
    assert "node 1 (h2): 0/2 joined, ranks 2-3 never called init_process_group" in done.stderr
    assert "=== ranks 2-3 on h2 (2 ranks) ===" in done.stderr, done.stderr  # 2 groups of 2
    assert f"line {line_of('BLOCKS BEFORE INIT')}, in block_before_init" in done.stderr
    assert "run ina hung: a watchdog stopped it" in done.stderr, done.stderr
    run_no_leak("ina")


def test_a_slow_start_longer_than_the_stall_timeout_is_no_stall(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """2 hosts x 2 ranks sleep 20 s in silence before init_process_group (as a slow torch
    import does), with --stall-timeout 6: the stall clock starts only once the world has
    formed, so the run ends well, with no watchdog firing."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    args = ["--name", "slw", "--stall-timeout", "6", str(inv), str(HANG), "slowinit", "20"]
    done = sshddp(ssh_env, tmp_path, "launch", *args, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "watchdog" not in done.stderr and "stalled" not in done.stderr, done.stderr
    assert "run slw succeeded" in done.stderr and "not distributed" not in done.stderr
    log = (tmp_path / "sshddp-logs" / "slw" / "node1-h2.log").read_text()
    assert "DONE 2" in log and "DONE 3" in log, log
    run_no_leak("slw")


def spawn_line(marker: str) -> int:
    """The line of spawn_stuck.py that carries ``# MARKER``."""
    lines = SPAWN_STUCK.read_text().splitlines()
    return next(n for n, text in enumerate(lines, 1) if text.rstrip().endswith(f"# {marker}"))


@pytest.mark.parametrize(
    ("stuck", "rank", "host", "node"), [("2:1", 5, "h3", 2), ("0:0", 0, "h1", 0)]
)
def test_a_stuck_mp_spawn_worker_is_blamed_on_its_own_host_and_node(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
    stuck: str,
    rank: int,
    host: str,
    node: int,
) -> None:
    """--launcher node, 3 hosts: mp.spawn's workers all-reduce every step; one worker
    sleeps in stuck_worker while the other five wait in their all-reduce. The stall's root
    cause is that worker, its host and its node (not the last node to stop); the node's
    own processes are titled node launchers, not torchrun agents; nothing is left."""
    opts = ["--launcher", "node", "--name", f"sp{rank}", "--stall-timeout", "8"]
    run = launch_on(
        ssh_env, tmp_path, free_port(), [str(SPAWN_STUCK), stuck], opts, [1, 2, 3], timeout=240
    )
    assert run.rc == HUNG, run.stderr
    cause = (
        f"root cause: rank {rank} on {host} (node {node}) stands apart in stuck_worker"
        f" (spawn_stuck.py, line {spawn_line('STUCK HERE')})"
    )
    assert cause in run.stderr, run.stderr
    assert f"=== odd one out: rank {rank} on {host} (1 rank) ===" in run.stderr, run.stderr
    titles = "=== node launcher processes of nodes 0-2 on h1,h2,h3 (3 processes) ==="
    assert titles in run.stderr, run.stderr
    assert "torchrun agent" not in run.stderr, run.stderr
    run_no_leak(run.run_id)


def test_a_silent_working_run_outlives_a_shorter_stall_timeout(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """2 hosts x 2 ranks train a DDP model (gloo all-reduces every step) for 25 s in
    silence, with --stall-timeout 8: no output is not a stall while the ranks' stacks and
    CPU time move, so the run is left alone and succeeds."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    args = ["--name", "sil", "--stall-timeout", "8", str(inv), str(HANG), "silent", "25"]
    done = sshddp(ssh_env, tmp_path, "launch", *args, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "watchdog" not in done.stderr and "stalled" not in done.stderr, done.stderr
    assert "run sil succeeded" in done.stderr, done.stderr
    log = (tmp_path / "sshddp-logs" / "sil" / "node1-h2.log").read_text()
    assert "DONE 2 " in log and "DONE 3 " in log, log
    run_no_leak("sil")
