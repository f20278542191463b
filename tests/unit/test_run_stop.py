"""The stop of a node's run a step at a time (remote/common.py's ``RunStop``), on a fake clock and
a fake process table: SIGTERM, the grace, torchrun's short grace once its ranks are gone,
a hurry, SIGKILL until nothing is left. No process is signalled."""

from __future__ import annotations

import signal
from typing import Optional

from sshddp.remote import common
from sshddp.remote.common import AGENT_GRACE, KILL_TRIES, TERM_TICK, RunStop

TORCHRUN = 100  # torchrun's pid, and its process group's number
RANKS = (201, 202)  # in sessions of their own


class Table:
    """A fake process table: which processes live, in which group, and what each signal
    does to them (``on_term``: those SIGTERM ends; SIGKILL ends all, unless ``unkillable``)."""

    def __init__(self, on_term: tuple[int, ...] = (), unkillable: bool = False) -> None:
        self.live = {TORCHRUN: 1, **{r: 1 for r in RANKS}}
        self.on_term = on_term
        self.unkillable = unkillable
        self.sent: list[tuple[int, tuple[int, ...]]] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def find(self, known: common.Procs) -> common.Procs:
        return dict(self.live)

    def send(self, procs: common.Procs, sig: int) -> None:
        self.sent.append((sig, tuple(sorted(procs))))
        gone = self.on_term if sig == signal.SIGTERM else () if self.unkillable else tuple(procs)
        for pid in gone:
            self.live.pop(pid, None)

    def group_of(self, pid: int) -> Optional[int]:
        return TORCHRUN if pid == TORCHRUN else pid

    def stop(self, grace: float, agent: bool = True) -> RunStop:
        return RunStop(
            (TORCHRUN, 1), "m", grace, agent, self.clock, self.find, self.send, self.group_of
        )

    def drive(self, stop: RunStop, hurry_at: Optional[float] = None) -> float:
        """Step ``stop`` to its end as a loop would; the fake time it took."""
        for _ in range(10_000):
            if hurry_at is not None and self.now >= hurry_at:
                stop.hurry()
            if stop.step():
                return stop.elapsed()
            self.now += max(stop.wait(), 0.001)
        raise AssertionError("the stop never ended")

    def signals(self) -> list[int]:
        return [sig for sig, _ in self.sent]


def test_without_grace_everything_is_killed_at_once() -> None:
    table = Table()
    stop = table.stop(0)
    assert stop.wait() == 0.0
    assert table.drive(stop) < 0.05
    assert table.sent == [(signal.SIGKILL, (TORCHRUN, *RANKS))] and not table.live


def test_processes_that_leave_on_sigterm_are_never_killed() -> None:
    table = Table(on_term=(TORCHRUN, *RANKS))
    took = table.drive(table.stop(10))
    assert table.signals() == [signal.SIGTERM] and took == TERM_TICK


def test_what_outlives_the_grace_is_killed() -> None:
    table = Table(on_term=(RANKS[0],))
    took = table.drive(table.stop(1.0, agent=False))
    assert table.signals() == [signal.SIGTERM, signal.SIGKILL]
    assert table.sent[1] == (signal.SIGKILL, (TORCHRUN, RANKS[1]))
    assert 1.0 <= took < 1.0 + 2 * TERM_TICK and not table.live


def test_torchrun_gets_a_short_grace_once_its_ranks_are_gone() -> None:
    table = Table(on_term=RANKS)  # torchrun itself lingers over its own cleanup
    took = table.drive(table.stop(30))
    assert table.signals() == [signal.SIGTERM, signal.SIGKILL]
    assert table.sent[1] == (signal.SIGKILL, (TORCHRUN,))
    assert AGENT_GRACE < took < AGENT_GRACE + 3 * TERM_TICK


def test_a_node_launcher_gets_the_whole_grace() -> None:
    table = Table(on_term=RANKS)
    assert table.drive(table.stop(2.0, agent=False)) >= 2.0


def test_a_hurry_skips_the_rest_of_the_grace() -> None:
    table = Table()
    took = table.drive(table.stop(30), hurry_at=0.5)
    assert table.signals() == [signal.SIGTERM, signal.SIGKILL] and 0.5 <= took < 0.5 + TERM_TICK


def test_the_kills_end_after_their_tries() -> None:
    table = Table(unkillable=True)
    stop = table.stop(0)
    table.drive(stop)
    assert table.signals() == [signal.SIGKILL] * KILL_TRIES and table.live
    assert stop.step() and stop.wait() == 0.0  # done stays done


def test_nothing_to_stop_is_done_at_once() -> None:
    table = Table()
    table.live.clear()
    stop = table.stop(10)
    assert stop.step() and table.sent == []
