"""``sshddp top`` against a real run: real sshd hosts, real torchrun, gloo on CPU.

The run (``payloads/paced.py``) draws a tqdm bar on every rank, rank 4 five times slower
than the others; ``top`` is asked from another process, as from another terminal, while
the run runs detached, then after it was stopped.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

from launch_helpers import (
    SSHDDP,
    cli_env,
    exit_record,
    launch,
    sshddp,
    wait_until,
    write_inventory,
)
from test_bars import Tmux

from sshddp_lab.sshd import SshdCluster

PACED = Path(__file__).parent / "payloads" / "paced.py"
NOT_RUNNING = 5


def top_json(cluster: SshdCluster, cwd: Path, *args: str) -> dict[str, Any]:
    done = sshddp(cluster, cwd, "top", "--json", *args)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    return dict(json.loads(done.stdout))


def _settled(doc: dict[str, Any]) -> bool:
    """Every rank has its CPU and a step rate that tqdm smoothed over a few seconds."""
    ranks = doc["ranks"]
    return len(ranks) == 6 and all(
        r["cpu"] is not None and r["steps_per_s"] is not None for r in ranks
    )


def test_top_names_the_slow_rank_of_a_detached_run(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Detached run, 3 hosts x 2 ranks, rank 4 five times slower: `top --json` and
    `top --once` name rank 4 on h3 as slow and no other rank, every rank with CPU and RSS;
    --node and --ranks narrow the view; once stopped, `top` says what `stacks` says."""
    inv, _ = write_inventory(ssh_env, tmp_path, free_port())
    started = sshddp(ssh_env, tmp_path, "launch", "--detach", "--name", "pac", inv, PACED)
    assert started.returncode == 0, started.stderr
    try:
        docs: list[dict[str, Any]] = []

        def settled() -> bool:
            docs.append(top_json(ssh_env, tmp_path, "pac"))
            return _settled(docs[-1]) and [r["rank"] for r in docs[-1]["ranks"] if r["slow"]] == [4]

        wait_until(settled, 150, "top to name rank 4 alone as slow")
        doc = docs[-1]
        assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2, 3, 4, 5]
        assert {r["rank"]: r["host"] for r in doc["ranks"]}[4] == "h3"
        assert all(r["rss"] > 0 and r["cpu"] >= 0 for r in doc["ranks"]), doc["ranks"]
        assert all(r["gpu_util"] is None and r["gpu_mem"] is None for r in doc["ranks"])
        assert doc["summary"].startswith("slow: rank 4 on h3, "), doc["summary"]
        assert [n["host"] for n in doc["nodes"]] == ["h1", "h2", "h3"]
        assert all(n["state"] == "running" and n["rss"] > 0 for n in doc["nodes"])

        once = sshddp(ssh_env, tmp_path, "top", "--once", "pac")
        assert once.returncode == 0, once.stderr
        slow_rows = [line for line in once.stdout.splitlines() if line.endswith("SLOW")]
        assert len(slow_rows) == 1 and slow_rows[0].split()[:2] == ["4", "h3"], once.stdout
        assert "sshddp: run pac: slow: rank 4 on h3, " in once.stderr, once.stderr

        narrow = top_json(ssh_env, tmp_path, "pac", "--node", "2", "--ranks", "5")
        assert [r["rank"] for r in narrow["ranks"]] == [5]
        assert [n["host"] for n in narrow["nodes"]] == ["h3"]
        _live_view_redraws(ssh_env, tmp_path)
        _live_view_in_a_terminal(ssh_env, tmp_path)
    finally:
        stop = sshddp(ssh_env, tmp_path, "stop", "pac")
    assert stop.returncode == 0, stop.stderr
    run_no_leak("pac")
    for command in ("top", "stacks"):
        ended = sshddp(
            ssh_env, tmp_path, command, "pac", "--once" if command == "top" else "--json"
        )
        assert ended.returncode == NOT_RUNNING, ended.stderr
        assert "run pac is not running (node 0 (h1) stopped, node 1 (h2) stopped" in ended.stderr
        assert "`sshddp logs pac` shows its output" in ended.stderr
        assert "Traceback" not in ended.stderr


def _live_view_redraws(cluster: SshdCluster, cwd: Path) -> None:
    """`top` without --once redraws the whole table in place (cursor home, clear) until
    Ctrl-C, which ends it with the interrupted exit status and no traceback."""
    live = subprocess.Popen(
        [*SSHDDP, "top", "pac"],
        cwd=cwd,
        env=cli_env(cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = ""
    watchers: list[set[int]] = []
    try:
        deadline = time.monotonic() + 60
        while out.count("\x1b[H\x1b[J") < 5 and time.monotonic() < deadline:
            assert live.stdout is not None
            out += live.stdout.read(1)  # five redraws seen, then stop reading
            if out.endswith("\x1b[H\x1b[J") and out.count("\x1b[H\x1b[J") >= 2:
                watchers.append(_node_top_processes())
    finally:
        live.send_signal(signal.SIGINT)
        rest, err = live.communicate(timeout=60)
    assert out.count("\x1b[H\x1b[J") >= 5, out
    # one host-side process per node streams the records, the same at every redraw, not a
    # new one per refresh; and none is left once the view has ended
    assert len(watchers[0]) == 3 and all(w == watchers[0] for w in watchers), watchers
    wait_until(lambda: not _node_top_processes(), 30, "the hosts' node_top streams to end")
    frames = (out + rest).split("\x1b[H\x1b[J")[1:]
    assert all(f.startswith("sshddp top pac ") for f in frames if f), frames
    assert any("SLOW" in f for f in frames), frames
    assert live.returncode == 130, err
    assert "Traceback" not in err, err


def _node_top_processes() -> set[int]:
    """The pids of the hosts' live ``node_top`` streams of run pac (argv ends RUNDIR/top;
    every lab host is this machine)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if re.search(rb"/runs/pac/n\d+/top$", argv[-1]):
            found.add(int(entry.name))
    return found


def test_a_cpu_runs_report_says_nothing_of_gpus(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """2 CPU hosts x 2 ranks to the end: each node's exit record carries its usage, over
    the samples it kept, with null GPU fields, and the run's report says nothing of GPUs."""
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], hosts=[1, 2])
    assert run.rc == 0, run.stderr
    assert "GPU" not in run.stderr and "GPU" not in run.stdout, run.stderr
    for node in range(2):
        record = exit_record(run.workdir, run.run_id, node)
        assert record is not None and record["schema"] >= 8, record
        usage = record["usage"]
        assert usage["samples"] >= 1, record  # torch's import alone outlasts the first one
        assert usage["gpus"] == 0, record
        assert usage["gpu_util"] is None and usage["gpu_mem_peak"] is None, record
        assert usage["gpu_mem_total"] is None, record
    run_no_leak(run.run_id)


def _live_view_in_a_terminal(cluster: SshdCluster, cwd: Path) -> None:
    """Live `top` in a real terminal (a tmux pane): the table is redrawn in place, so at
    every look over several refreshes (the header's clock moved on) the pane shows one
    header, on its first line, and one table, never a refresh below the last; Ctrl-C ends
    it with status 130."""
    term = Tmux(cli_env(cluster))
    try:
        term.start(cwd, " ".join([*SSHDDP, "top", "pac"]))
        clocks: set[str] = set()
        screens: list[list[str]] = []

        def refreshed() -> bool:
            lines = term.screen().splitlines()
            heads = [x for x in lines if x.startswith("sshddp top pac ")]
            if heads:
                screens.append(lines)
                clocks.update(h.split()[3] for h in heads)
            return len(clocks) >= 3

        wait_until(refreshed, 90, "live top to refresh three times in the pane")
        for lines in screens:
            assert lines[0].startswith("sshddp top pac "), lines
            assert sum(x.startswith("sshddp top pac ") for x in lines) == 1, lines
            assert sum(x.startswith("RANK HOST") for x in lines) <= 1, lines
        assert any("SLOW" in x for x in screens[-1]), screens[-1]
        term.tmux("send-keys", "C-c")
        wait_until(lambda: "EXIT=" in term.screen(), 60, "top to end on Ctrl-C")
        assert "EXIT=130" in term.screen() and "Traceback" not in term.history()
    finally:
        term.stop()
