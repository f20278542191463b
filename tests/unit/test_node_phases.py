"""A node's life as its supervisor's loop lives it (remote/node/node_events.py), phase by phase,
and how the node ends (remote/node/node_ends.py): pure functions of (state, events). No process."""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any, Optional

import pytest

from sshddp.protocol import contract
from sshddp.protocol import peer_messages as pm
from sshddp.remote.node import node_ends
from sshddp.remote.node.node_ends import NOT_STARTED, Ending
from sshddp.remote.node.node_events import (
    AWAITING,
    DONE,
    ENDED,
    LINGERING,
    PHASES,
    STARTING,
    STOPPING,
    WATCHING,
    Action,
    Begun,
    EndRun,
    Event,
    Exited,
    Farewell,
    Finish,
    Hang,
    Hurry,
    LetGo,
    LoopState,
    Message,
    Node0Said,
    OutputFull,
    PeerAbort,
    PeerView,
    Say,
    SessionGone,
    Signal,
    StacksTaken,
    StartNext,
    TakeStacks,
    TearDown,
    Tell,
    TornDown,
    decide,
    initial,
)

HOSTS = ("h1", "h2", "h3", "h4")


def node(rank: int = 1, attempts: int = 1, nnodes: int = 4, **changes: Any) -> LoopState:
    state = LoopState(rank, nnodes, attempts, HOSTS[:nnodes], heard=frozenset(range(nnodes)))
    return replace(state, **changes)


def watching(rank: int = 1, attempts: int = 1, **changes: Any) -> LoopState:
    state = node(rank, attempts, **changes)
    return decide(state, Begun(state.attempt))[0]


def steps(state: LoopState, *batches: Event | tuple[Event, ...]) -> tuple[LoopState, list[Action]]:
    """``state`` after each batch (one event, or a tuple: what one turn of the loop took)."""
    done: list[Action] = []
    for batch in batches:
        state, actions = decide(state, *(batch if isinstance(batch, tuple) else (batch,)))
        done += actions
    return state, done


def test_every_phase_is_named_once_and_a_node_starts_starting() -> None:
    assert len(set(PHASES)) == len(PHASES) == 8
    spec: Any = {"node_rank": 0}
    assert initial(spec).phase == STARTING and node().phase == STARTING
    assert initial({**spec, "node_rank": 4, "spare": True}).phase == "spare"
    assert initial({**spec, "launcher": contract.LAUNCH_COMMAND}).launcher == "the launcher"


def test_a_node_whose_torchrun_succeeds_lives_every_phase_once() -> None:
    state, actions = decide(node(), Begun(1))
    assert (state.phase, actions) == (WATCHING, [])
    assert decide(state)[0] == state  # nothing new: it goes on watching
    state, actions = decide(state, Exited())
    assert (state.phase, actions) == (STOPPING, [TearDown(graceful=False)])
    state, actions = decide(state, TornDown(0))
    end = Ending(contract.SUCCEEDED, "", 0)
    assert (state.phase, state.end, actions) == (LINGERING, end, [Finish(end)])
    assert decide(state, PeerAbort("node 2 (h3) failed"))[0].phase == LINGERING
    state, actions = decide(state, LetGo())
    assert (state.phase, actions) == (DONE, [Farewell()])


@pytest.mark.parametrize(
    ("rc", "full", "launcher", "end"),
    [
        (0, None, "torchrun", Ending(contract.SUCCEEDED, "", 0)),
        (1, None, "torchrun", Ending(contract.FAILED, "torchrun exited with code 1", 1)),
        (-9, None, "torchrun", Ending(contract.FAILED, "torchrun was killed by SIGKILL", -9)),
        (2, None, "the launcher", Ending(contract.FAILED, "the launcher exited with code 2", 2)),
        (0, "disk full", "torchrun", Ending(contract.FAILED, "disk full", 0)),  # never complete
    ],
)
def test_a_torchrun_that_exited_ends_the_node_by_its_code(
    rc: int, full: Optional[str], launcher: str, end: Ending
) -> None:
    state = watching(launcher=launcher)
    state, _ = steps(state, (Exited(), *([OutputFull(full)] if full else [])), TornDown(rc))
    assert state.end == end and state.phase == LINGERING


def test_a_stop_signal_tears_down_gracefully_and_sigusr1_hurries_it() -> None:
    state, actions = decide(watching(), Signal(signal.SIGTERM))
    assert (state.phase, actions) == (STOPPING, [TearDown(graceful=True)])
    assert decide(state, Exited())[0].phase == STOPPING  # (the exit is teardown's to see)
    state, actions = decide(state, Signal(signal.SIGUSR1))
    assert actions == [Hurry()] and state.stop_signal == signal.SIGUSR1
    state, actions = decide(state, TornDown(-15))
    end = Ending(contract.STOPPED, "stopped on request", -15, asked=True)
    assert (state.phase, actions) == (LINGERING, [Finish(end)])
    assert decide(watching(), Signal(signal.SIGUSR1))[1] == [TearDown(graceful=False)]
    assert decide(watching(), SessionGone())[1] == [TearDown(graceful=True)]


@pytest.mark.parametrize(
    ("events", "end"),
    [
        ((Signal(signal.SIGTERM),), Ending(contract.STOPPED, "stopped on request", 0, asked=True)),
        (
            (PeerAbort("node 2 (h3) lost"),),
            Ending(contract.STOPPED, "stopped: node 2 (h3) lost", 0, asked=True),
        ),
        ((StacksTaken("stall", "quiet 60 s", "stop"),), Ending(contract.STALLED, "quiet 60 s", 0)),
        ((OutputFull("disk full"),), Ending(contract.FAILED, "disk full", 0)),
        (
            (OutputFull("disk full"), Signal(signal.SIGTERM)),
            Ending(contract.STOPPED, "stopped on request", 0, asked=True),
        ),
        (
            (OutputFull("disk full"), PeerAbort("x")),
            Ending(contract.STOPPED, "stopped: x", 0, asked=True),
        ),
        (
            (StacksTaken("stall", "q", "stop"), OutputFull("disk full")),
            Ending(contract.FAILED, "disk full", 0),
        ),
    ],
)
def test_a_stopped_node_ends_as_what_stopped_it(events: tuple[Event, ...], end: Ending) -> None:
    state, actions = decide(watching(), *events)
    assert state.phase == STOPPING and isinstance(actions[-1], TearDown)
    state, actions = decide(state, TornDown(0))
    assert (state.end, actions) == (end, [Finish(end)])


def test_a_torchrun_that_never_starts_fails_the_node() -> None:
    state, actions = decide(node(), Begun(1, "cannot start torchrun: no such file"))
    first = Ending(contract.FAILED, "cannot start torchrun: no such file", None, told=NOT_STARTED)
    assert (state.phase, actions) == (LINGERING, [Finish(first)])
    later = node(attempts=3, rc=1, attempt=1, go=(2, "why"), phase=STARTING)
    state, actions = decide(later, Begun(2, "cannot start torchrun: gone"))
    assert actions == [Finish(Ending(contract.FAILED, "cannot start torchrun: gone", 1))]
    assert state.attempt == 2


def test_a_failed_attempt_is_told_to_node_0_and_the_next_one_starts_on_its_word() -> None:
    state, actions = steps(watching(1, attempts=3), Exited(), TornDown(1))
    assert actions[-1] == Say("fail", 1, "torchrun exited with code 1")
    assert state.phase == AWAITING
    assert decide(state, Node0Said(pm.halt(1, "again?")))[0].phase == AWAITING
    state, actions = decide(state, Node0Said(pm.again(2, "node 1 (h2) failed: x")))
    assert (state.phase, actions) == (STARTING, [StartNext()])
    state, actions = decide(state, Begun(2))
    assert (state.phase, state.attempt, actions) == (WATCHING, 2, [])


def test_the_last_attempt_ends_the_node_without_a_word() -> None:
    last = watching(1, attempts=2, attempt=2)
    state, actions = steps(last, Exited(), TornDown(1))
    end = Ending(contract.FAILED, "torchrun exited with code 1", 1)
    assert (state.phase, actions[-1]) == (LINGERING, Finish(end))


def test_node_0_hears_its_own_word_through_its_inbox() -> None:
    """A single node with restarts: its failure is its own word to itself, and it goes on."""
    alone = watching(0, attempts=2, nnodes=1)
    state, actions = steps(alone, Exited(), TornDown(1))
    assert actions[-1] == Say("fail", 1, "torchrun exited with code 1")
    said = pm.fail(1, "rank 0 exited with code 1")
    state, actions = decide(state, Message(0, said))  # as the loop posts it
    why = "node 0 (h1) failed: rank 0 exited with code 1"
    assert actions == [Tell(pm.halt(1, why)), Tell(pm.again(2, why)), StartNext()]
    assert state.phase == STARTING


def test_a_halted_node_says_so_and_ends_stopped_when_no_restart_comes() -> None:
    state, actions = decide(watching(1, attempts=3), Node0Said(pm.halt(1, "node 2 failed")))
    assert (state.phase, actions) == (STOPPING, [TearDown(graceful=True)])
    state, actions = decide(state, TornDown(-15))
    assert (state.phase, actions) == (AWAITING, [Say("halted", 1, "stopped on request")])
    state, actions = decide(state, PeerAbort("node 2 (h3) ended while the run was restarting"))
    why = "stopped: node 2 (h3) ended while the run was restarting"
    assert actions == [Finish(Ending(contract.STOPPED, why, -15, asked=True))]


def test_a_halted_node_whose_output_filled_ends_as_its_attempt_did() -> None:
    halted = decide(watching(1, attempts=3), Node0Said(pm.halt(1, "node 2 failed")))[0]
    state, actions = steps(halted, OutputFull("disk full"), TornDown(-15))
    assert actions[-1] == Finish(Ending(contract.FAILED, "disk full", -15))


def test_what_follows_a_teardown_is_decided_after_the_whole_batch() -> None:
    """node 0's halt that came with the teardown's end turns the node's failure into a halt."""
    stopping = decide(watching(1, attempts=3), Exited())[0]
    state, actions = decide(stopping, TornDown(1), Node0Said(pm.halt(1, "node 2 (h3) failed")))
    assert actions == [Say("halted", 1, "torchrun exited with code 1")]
    assert state.phase == AWAITING


def test_an_abort_in_one_batch_with_a_hang_waits_for_the_stacks() -> None:
    state, actions = decide(watching(), PeerAbort("x"), Hang("stall", "q", "report"))
    assert state.phase == WATCHING and actions == [TakeStacks("stall", "q", "report")]
    state, actions = decide(state, StacksTaken("stall", "q", "report"))
    assert state.phase == STOPPING and actions == [TearDown(graceful=True)]


def test_events_out_of_their_phase_change_nothing() -> None:
    state = watching()
    assert decide(state, TornDown(0))[0] == state  # no teardown under way
    assert decide(state, LetGo())[0] == state  # not lingering
    assert decide(state, Signal(signal.SIGUSR1))[1] == [TearDown(graceful=False)]  # not Hurry
    assert ENDED not in {decide(s, TornDown(0))[0].phase for s in (state, node())}


def test_node_0_decides_restarts_on_the_peers_it_was_told_of() -> None:
    state = node(0, attempts=3, heard=frozenset())
    state, _ = decide(state, PeerView(frozenset({0, 1, 2}), frozenset()))
    _, actions = decide(state, Message(2, pm.fail(1, "x")))
    assert actions == [
        EndRun(
            "node 2 (h3) failed: x; not restarted: node(s) 3 cannot be reached and no spare "
            "can take its place"
        )
    ]
    state, _ = decide(state, PeerView(frozenset({0, 1, 2, 3}), frozenset({3})))
    _, actions = decide(state, Message(2, pm.fail(1, "x")))
    assert actions == [EndRun("node 2 (h3) failed: x; not restarted: node(s) 3 ended already")]
    state, _ = decide(state, PeerView(frozenset({0, 1, 2, 3}), frozenset()))
    assert decide(state, Message(2, pm.fail(1, "x")))[1] == [
        Tell(pm.halt(1, "node 2 (h3) failed: x"))
    ]


@pytest.mark.parametrize(
    ("end", "halting", "abort", "full", "final"),
    [
        (
            Ending(contract.FAILED, "code 1", 1),
            False,
            None,
            None,
            Ending(contract.FAILED, "code 1", 1),
        ),
        (
            Ending(contract.FAILED, "code 1", 1),
            True,
            None,
            None,
            Ending(contract.STOPPED, "stopped on request", 1, asked=True),
        ),
        (
            Ending(contract.STOPPED, "x", -15),
            True,
            "lost",
            None,
            Ending(contract.STOPPED, "stopped: lost", -15, asked=True),
        ),
        (
            Ending(contract.FAILED, "disk full", 1),
            True,
            None,
            "disk full",
            Ending(contract.FAILED, "disk full", 1),
        ),
        (Ending(contract.STALLED, "q", -9), True, None, None, Ending(contract.STALLED, "q", -9)),
        (Ending(contract.SUCCEEDED, "", 0), True, None, None, Ending(contract.SUCCEEDED, "", 0)),
    ],
)
def test_the_nodes_end_after_its_last_attempt(
    end: Ending, halting: bool, abort: Optional[str], full: Optional[str], final: Ending
) -> None:
    assert node_ends.final(end, halting, abort, full) == final


def test_signal_names() -> None:
    assert node_ends.signame(15) == "SIGTERM" and node_ends.signame(99) == "signal 99"
    assert node_ends.describe(-99, "the launcher") == "the launcher was killed by signal 99"
