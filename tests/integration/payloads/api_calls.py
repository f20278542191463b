"""A script that drives sshddp.launch: its functions live in ``__main__`` (they travel by
value). ``api_calls.py INVENTORY MODE`` prints one line ``RESULT {json}``: the values, or
the error the call raised."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from typing import Callable

import sshddp


def whoami(scale: int, offset: int = 0) -> dict[str, object]:
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    total = torch.tensor([rank])
    dist.all_reduce(total)  # the world formed (init=True)
    return {"rank": rank * scale + offset, "world": dist.get_world_size(), "total": int(total)}


def fails_on_rank_3() -> int:
    rank = int(os.environ["RANK"])
    if rank == 3:
        inner_helper(rank)
    time.sleep(0.5)
    return rank


def inner_helper(rank: int) -> None:
    raise ValueError(f"rank {rank} says no")


def sleeps_before_allreduce() -> int:
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    dist.all_reduce(torch.tensor([1]))
    return 0


def too_big() -> bytes:
    return b"x" * (65 << 20)


def second_attempt() -> tuple[int, int]:
    attempt = int(os.environ["SSHDDP_ATTEMPT"])
    if attempt == 1 and os.environ["RANK"] == "1":
        raise RuntimeError("first attempt fails")
    time.sleep(0.3)
    return int(os.environ["RANK"]), attempt


def sleeps() -> None:
    print(f"sleeping rank {os.environ['RANK']}", flush=True)
    time.sleep(600)


def sleeps_named() -> None:
    print(f"sleeping rank {os.environ['RANK']} of run {os.environ['SSHDDP_RUN_ID']}", flush=True)
    time.sleep(600)


def nested() -> int:
    sshddp.launch(lambda: 1, "h1:1")
    return 0


class Counter:
    def __init__(self, start: int) -> None:
        self.start = start


def main() -> None:
    inv, mode = sys.argv[1], sys.argv[2]
    try:
        result = run(inv, mode)
        out = {"values": result.values, "by_host": result.by_host(), "run_id": result.run_id}
    except sshddp.RankFailed as exc:
        out = {
            "error": "RankFailed",
            "rank": exc.rank,
            "host": exc.host,
            "node": exc.node,
            "traceback": exc.traceback,
            "message": exc.message,
            "values": {str(k): v for k, v in exc.values.items()},
            "run_id": exc.run_id,
        }
    except sshddp.RunHung as exc:
        out = {"error": "RunHung", "stacks": exc.stacks, "report": exc.report, "run_id": exc.run_id}
    except sshddp.RunFailed as exc:
        out = {"error": "RunFailed", "message": exc.message, "run_id": exc.run_id}
    except sshddp.UsageError as exc:
        out = {"error": "UsageError", "message": exc.message}
    except sshddp.ResultError as exc:
        out = {"error": "ResultError", "message": exc.message, "rank": exc.rank}
    except KeyboardInterrupt:
        out = {"error": "KeyboardInterrupt"}
    print("RESULT " + json.dumps(out, default=repr), flush=True)


def closure(inv: str) -> sshddp.LaunchResult:
    counter = Counter(100)
    return sshddp.launch(lambda: counter.start + int(os.environ["RANK"]), inv)


def unpicklable(inv: str) -> sshddp.LaunchResult:
    sock = socket.socket()
    return sshddp.launch(lambda: sock.fileno(), inv)


def holds_lock(inv: str) -> sshddp.LaunchResult:
    lock = threading.Lock()
    return sshddp.launch(lambda: lock.locked(), inv)


def inventory_object(inv: str) -> sshddp.LaunchResult:
    from pathlib import Path

    from sshddp.model.inventory import parse_inventory

    inventory = parse_inventory(Path(inv).read_text(), inv)
    return sshddp.launch(lambda: int(os.environ["RANK"]), inventory, env={"X": "1"})


def rank_later() -> tuple[int, int]:
    time.sleep(2)
    return int(os.environ["RANK"]), int(os.environ["SSHDDP_ATTEMPT"])


def start_wait(inv: str) -> sshddp.LaunchResult:
    run = sshddp.start(rank_later, inv)
    print(f"STARTED {run.id}", flush=True)
    return run.wait()


def start_stop(inv: str) -> sshddp.LaunchResult:
    run = sshddp.start(sleeps, inv)
    time.sleep(3)
    run.stop()
    print(f"STOPPED {run.id} {run.logs()}", flush=True)
    return run.wait()


def start_peek(inv: str) -> sshddp.LaunchResult:
    """A started run's stacks and top, once every rank sleeps; then stopped."""
    run = sshddp.start(sleeps, inv)
    deadline = time.monotonic() + 120

    def asleep(stacks: sshddp.Stacks) -> bool:
        ranks = [g for g in stacks.groups if g.role == "rank"]
        return len(ranks) == 1 and len(ranks[0].members) == 4 and "sleeps" in str(stacks)

    stacks = run.stacks()
    while not asleep(stacks):
        assert time.monotonic() < deadline, str(stacks)
        time.sleep(0.5)
        stacks = run.stacks()
    top = run.top()
    while len(top.ranks) < 4:  # the hosts sample once a second
        assert time.monotonic() < deadline, top
        time.sleep(0.5)
        top = run.top()
    peek = {
        "stacks": str(stacks),
        "groups": [[g.role, [m.process["rank"] for m in g.members]] for g in stacks.groups],
        "saved": str(stacks.saved),
        "top_ranks": [r.rank for r in top.ranks],
        "top_nodes": [(n.node_rank, n.state) for n in top.nodes],
    }
    print("PEEK " + json.dumps(peek), flush=True)
    run.stop()
    return run.wait()


def start_then_exit(inv: str, detach: bool) -> sshddp.LaunchResult:
    """start() and leave: without detach the run ends with this process."""
    run = sshddp.start(sleeps_named, inv, detach=detach)
    print(f"STARTED {run.id}", flush=True)
    if not detach:
        sys.stdin.readline()  # until told: the ranks have started sleeping
    sys.exit(0)


MODES: dict[str, Callable[[str], sshddp.LaunchResult]] = {
    "values": lambda inv: sshddp.launch(whoami, inv, args=(10,), kwargs={"offset": 1}, init=True),
    "raises": lambda inv: sshddp.launch(fails_on_rank_3, inv),
    "closure": closure,
    "big": lambda inv: sshddp.launch(too_big, inv),
    "restarts": lambda inv: sshddp.launch(second_attempt, inv, max_restarts=1),
    "sleeps": lambda inv: sshddp.launch(sleeps, inv),
    "unpicklable": unpicklable,
    "lock": holds_lock,
    "nested": lambda inv: sshddp.launch(nested, inv),
    "bad_option": lambda inv: sshddp.launch(whoami, inv, max_restarts=-1),
    "unknown_option": lambda inv: sshddp.launch(whoami, inv, max_restart=1),
    "inventory_object": inventory_object,
    "hangs": lambda inv: sshddp.launch(sleeps_before_allreduce, inv, init=True, stall_timeout=20),
    "start_wait": start_wait,
    "start_stop": start_stop,
    "start_peek": start_peek,
    "start_exits": lambda inv: start_then_exit(inv, False),
    "start_detached": lambda inv: start_then_exit(inv, True),
    "sleeps_named": lambda inv: sshddp.launch(sleeps_named, inv),
    "start_wait_sleeps": lambda inv: sshddp.start(sleeps, inv).wait(),
}


def run(inv: str, mode: str) -> sshddp.LaunchResult:
    return MODES[mode](inv)


if __name__ == "__main__":
    main()
