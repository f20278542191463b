"""The supervisor's decisions (remote/node/node_events.py): pure functions of (state, event), and
the supervisors' messages (protocol/peer_messages.py). No process, no socket."""

from __future__ import annotations

import signal
from dataclasses import replace
from typing import Any, Optional

import pytest

from sshddp.protocol import contract
from sshddp.protocol import peer_messages as pm
from sshddp.remote.node.node_events import (
    EXITED,
    STOP,
    WATCH,
    Action,
    Begun,
    EndRun,
    Event,
    Exited,
    Fetch,
    Fetched,
    Finish,
    Hang,
    LoopState,
    Message,
    Node0Said,
    OutputFull,
    PeerAbort,
    RestartDecider,
    SessionGone,
    Signal,
    StacksTaken,
    StartNext,
    TakeStacks,
    TearDown,
    Tell,
    TornDown,
    decide,
    going,
    initial,
    outcome,
    stopping,
    word_to_node_0,
)

HOSTS = ("h1", "h2", "h3", "h4")


def node(rank: int = 0, attempts: int = 3, **changes: Any) -> LoopState:
    """A node of a 4-node run with ``attempts`` attempts, every node heard from."""
    state = LoopState(rank, 4, attempts, HOSTS, heard=frozenset(range(4)))
    return replace(state, **changes)


def run(state: LoopState, *events: Event) -> tuple[LoopState, list[Action]]:
    done: list[Action] = []
    for event in events:
        state, actions = decide(state, event)
        done += actions
    return state, done


#: the node's states the loop can be in: running, taking stacks, halted by node 0, waiting
#: for node 0's word after a failure, and stopping (asked to)
STATES = {
    "running": node(1),
    "stacks": node(1, stacks=True),
    "halting": node(1, halt=(1, "node 2 (h3) failed: x")),
    "waiting": node(1, exited=True),
    "stopping": node(1, stop_signal=signal.SIGTERM),
}

#: every event kind, and what the node's loop does next after it from each state
EXPECTED: list[tuple[Event, dict[str, str]]] = [
    (Exited(), dict.fromkeys(STATES, EXITED)),
    (Signal(signal.SIGTERM), {**dict.fromkeys(STATES, STOP), "waiting": EXITED}),
    (SessionGone(), {**dict.fromkeys(STATES, STOP), "waiting": EXITED}),
    (OutputFull("disk full"), {**dict.fromkeys(STATES, STOP), "waiting": EXITED}),
    (
        PeerAbort("node 2 (h3) failed"),
        {**dict.fromkeys(STATES, STOP), "stacks": WATCH, "waiting": EXITED},
    ),
    (Node0Said(pm.halt(1, "why")), {**dict.fromkeys(STATES, STOP), "waiting": EXITED}),
    (
        Node0Said(pm.halt(2, "why")),
        {"running": WATCH, "stacks": WATCH, "halting": WATCH, "waiting": EXITED},
    ),
    (
        Node0Said(pm.again(2, "why")),
        {"running": WATCH, "stacks": WATCH, "halting": STOP, "waiting": EXITED},
    ),
    (Hang("stall", "quiet", "stop"), {"running": WATCH, "stacks": WATCH, "halting": STOP}),
    (StacksTaken("stall", "quiet", "stop"), {**dict.fromkeys(STATES, STOP), "waiting": EXITED}),
    (StacksTaken("stall", "quiet", "report"), {"running": WATCH, "stacks": WATCH}),
    (Begun(2), {"running": WATCH, "waiting": WATCH, "halting": WATCH, "stopping": STOP}),
    (Message(2, pm.fail(1, "x")), {"running": WATCH, "stacks": WATCH, "waiting": EXITED}),
]


@pytest.mark.parametrize(("event", "after"), EXPECTED, ids=lambda v: type(v).__name__)
def test_every_event_in_every_state(event: Event, after: dict[str, str]) -> None:
    for name, state in STATES.items():
        new, actions = decide(state, event)
        if name in after:
            assert outcome(new) == after[name], (name, new)
        assert decide(state, event) == (new, actions)  # pure: the same answer every time
        if isinstance(event, Begun) and outcome(new) == STOP:
            assert actions == [TearDown(graceful=True)], name  # it must stop: it does at once
        elif not isinstance(event, Hang):
            assert actions == [], name  # a node other than 0 acts only on a hang


def test_an_immediate_stop_stays_immediate_and_the_first_abort_is_the_reason() -> None:
    state, _ = run(node(), Signal(signal.SIGUSR1), Signal(signal.SIGTERM), SessionGone())
    assert state.stop_signal == signal.SIGUSR1
    state, _ = run(node(), PeerAbort("first"), PeerAbort("second"), OutputFull("a"))
    assert (state.abort, state.full) == ("first", "a")
    assert run(node(), SessionGone())[0].stop_signal == signal.SIGTERM


def test_a_peer_aborts_mid_restart_while_the_watchdog_takes_stacks() -> None:
    """The issue's question: node 1 stopped attempt 1 for a restart and waits for node 0's
    word; node 0's hang message makes it take its stacks; then the run aborts. It waits for
    nothing more (no restart), and its ranks of the next attempt never start."""
    waiting, _ = run(node(1), Node0Said(pm.halt(1, "node 2 (h3) failed: x")))
    assert outcome(waiting) == STOP and word_to_node_0(waiting, contract.STOPPED) == "halted"
    state, actions = run(waiting, Hang("stall", "quiet", "stop"))
    assert actions == [TakeStacks("stall", "quiet", "stop")] and state.stacks
    state, actions = run(state, PeerAbort("node 3 (h4) lost"))
    assert actions == [] and stopping(state) and not going(state)
    assert word_to_node_0(state, contract.STOPPED) is None  # the node ends here
    state, _ = run(state, Node0Said(pm.again(2, "late")), StacksTaken("stall", "quiet", "stop"))
    assert state.verdict == ("stall", "quiet") and not state.stacks and stopping(state)


def test_an_abort_waits_for_the_stacks_but_a_halt_does_not() -> None:
    taking, actions = run(node(1), Hang("stall", "quiet", "report"))
    assert actions == [TakeStacks("stall", "quiet", "report")]
    assert outcome(run(taking, PeerAbort("x"))[0]) == WATCH  # the ranks stay for their stacks
    assert outcome(run(taking, PeerAbort("x"), StacksTaken("stall", "q", "report"))[0]) == STOP
    assert outcome(run(taking, Node0Said(pm.halt(1, "why")))[0]) == STOP


def test_node_0_tells_the_others_of_a_hang_and_takes_its_own_stacks() -> None:
    _, actions = decide(node(0), Hang("init", "no world", "stop"))
    assert actions == [
        Tell(pm.hang("init", "no world", "stop")),
        TakeStacks("init", "no world", "stop"),
    ]


def test_node_0_restarts_the_run_once_every_node_halted() -> None:
    state, actions = run(node(0), Message(2, pm.fail(1, "rank 5 exited with code 1")))
    why = "node 2 (h3) failed: rank 5 exited with code 1"
    assert actions == [Tell(pm.halt(1, why))]
    assert state.halt == (1, why) and outcome(state) == STOP  # node 0 stops its own too
    state, actions = run(state, Message(2, pm.fail(1, "again")), Message(1, pm.halted(1)))
    assert actions == [] and state.decider.halted == {1, 2}
    state, actions = run(state, Message(0, pm.halted(1)), Message(3, pm.halted(1)))
    assert actions == [Tell(pm.again(2, why))] and state.go == (2, why) and going(state)
    assert state.decider == RestartDecider(current=2, halting=None, why=why, halted={0, 1, 2, 3})
    state, _ = run(state, Begun(2))
    assert (state.attempt, outcome(state), going(state)) == (2, WATCH, False)


def test_a_fail_while_a_node_is_unreachable_ends_the_run() -> None:
    """Node 0 hears a fail from node 2 in attempt 1, attempts left, node 3 unreachable."""
    state = node(0, heard=frozenset({0, 1, 2}))
    new, actions = decide(state, Message(2, pm.fail(1, "rank 5 exited with code 1")))
    why = "node(s) 3 cannot be reached and no spare can take its place"
    assert actions == [
        EndRun(f"node 2 (h3) failed: rank 5 exited with code 1; not restarted: {why}")
    ]
    assert new == state  # no halt: the abort that follows stops the nodes
    out_of_attempts = node(0, attempts=1)
    assert decide(out_of_attempts, Message(2, pm.fail(1, "x")))[1] == []  # no restarts
    last = node(0, attempts=2, attempt=2, decider=RestartDecider(current=2))
    assert decide(last, Message(1, pm.fail(2, "x")))[1] == [
        EndRun("node 1 (h2) failed: x; not restarted: no attempts left (2 made)")
    ]
    aborted = node(0, abort="interrupted", ended=frozenset({3}))
    assert decide(aborted, Message(1, pm.fail(1, "x")))[1] == [
        EndRun("node 1 (h2) failed: x; not restarted: the run is stopping: interrupted")
    ]


def test_a_node_that_ends_while_the_run_restarts_ends_the_run() -> None:
    halting, _ = run(node(0), Message(2, pm.fail(1, "x")))
    _, actions = decide(halting, Message(3, pm.done(3, contract.SUCCEEDED, "")))
    assert actions == [EndRun("node 3 (h4) ended while the run was restarting")]
    _, actions = decide(node(0, attempts=1), Message(3, pm.done(3, "failed", "code 1")))
    assert actions == [EndRun("node 3 (h4) failed: code 1")]
    assert decide(node(0), Message(3, pm.done(3, contract.SUCCEEDED, "")))[1] == []


def test_stale_and_foreign_restart_words_change_nothing() -> None:
    plain = node(1, attempts=1)
    assert (
        run(plain, Node0Said(pm.halt(1, "x")), Node0Said(pm.again(2, "x")))[0] == plain
    )  # no restarts: ignored
    ahead = node(0, decider=RestartDecider(current=2))
    assert decide(ahead, Message(1, pm.fail(1, "old")))[1] == []  # an earlier attempt's
    assert decide(node(0), Message(1, pm.halted(1))) == (node(0), [])  # nothing halting
    assert decide(node(1), Message(2, pm.fail(1, "x"))) == (node(1), [])  # not node 0


@pytest.mark.parametrize(
    ("state", "ended", "word"),
    [
        (node(1), contract.FAILED, "fail"),
        (node(1), contract.SUCCEEDED, None),
        (node(1, attempt=3), contract.FAILED, None),  # none left
        (node(1, attempts=1), contract.FAILED, None),  # no restarts
        (node(1, halt=(1, "x")), contract.STOPPED, "halted"),
        (node(1, halt=(1, "x"), abort="y"), contract.STOPPED, None),
        (node(1, stop_signal=signal.SIGTERM), contract.FAILED, None),
        (node(1, verdict=("stall", "q")), contract.FAILED, None),
    ],
)
def test_what_a_node_tells_node_0_when_its_attempt_ends(
    state: LoopState, ended: str, word: str | None
) -> None:
    assert word_to_node_0(state, ended) == word


def test_a_nodes_state_from_its_spec() -> None:
    spec: Any = {"node_rank": 2, "restarts": 2, "peers": {"nnodes": 3, "hosts": ["a", "b", "c"]}}
    state = initial(spec)
    assert (state.rank, state.nnodes, state.max_attempts, state.name(2)) == (2, 3, 3, "node 2 (c)")
    assert initial({"node_rank": 0}).name(5) == "spare ?"  # type: ignore[typeddict-item]


MESSAGES: list[pm.PeerMessage] = [
    pm.beat(1),
    pm.beat(1, {"entered": [1], "joined": [], "quiet": 2.0}),  # type: ignore[typeddict-item]
    pm.done(1, "failed", "torchrun exited with code 1"),
    pm.abort("node 1 (h2) failed"),
    pm.hang("stall", "quiet", "stop"),
    pm.fail(1, "rank 5 exited with code 1"),
    pm.halt(1, "why"),
    pm.halted(1),
    pm.again(2, "why"),
    pm.bye(),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: m["t"])
def test_every_message_reads_back_as_sent(msg: pm.PeerMessage) -> None:
    assert pm.decode(pm.encode(msg)) == msg


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"t": "nope"},
        {"t": 3},
        {"hb": 1},  # untagged
        {"t": "hb", "rank": "1"},
        {"t": "done", "rank": 1, "state": None, "reason": ""},
        {"t": "fail", "attempt": True, "reason": "x"},
        {"t": "again", "attempt": 2, "reason": 5},
        {"t": "hang", "kind": "stall", "reason": "q"},
    ],
)
def test_junk_decodes_as_nothing(raw: dict[str, Any]) -> None:
    assert pm.decode(raw) is None


def test_reasons_are_cut_short() -> None:
    assert len(pm.fail(1, "x" * 9000)["reason"]) == pm.MAX_WHY
    long = pm.decode({"t": "halt", "attempt": 1, "reason": "y" * 9000})
    assert long is not None and long["t"] == "halt" and len(long["reason"]) == pm.MAX_WHY
    assert len(pm.abort("z" * 9000)["reason"]) == pm.MAX_TEXT


SHARE: pm.ShareOffer = {"port": 4000, "files": [{"path": "c.pt", "size": 9, "sha256": "ab" * 32}]}


def awaiting(rank: int, share: Optional[pm.ShareOffer] = SHARE) -> tuple[LoopState, list[Action]]:
    """Node ``rank`` whose attempt 1 failed, told by node 0 to start attempt 2 (its ``again``
    offering ``share``)."""
    again = pm.again(2, "node 2 (h3) failed")
    word = pm.with_share(again, share) if share else again
    return run(node(rank, phase="watching"), Exited(), TornDown(1), Node0Said(word))


def test_node_0s_files_are_fetched_first_and_a_stop_is_heard_meanwhile() -> None:
    """A node other than 0 gets node 0's --share files in a thread (``Fetch``): the attempt's
    torchrun starts once they are here (``Fetched``); a stop meanwhile ends the node at once,
    without waiting for a transfer of many GB; a fetch that failed fails the attempt."""
    state, actions = awaiting(1)
    assert state.fetching and state.phase == "starting" and actions[-1] == Fetch(2)
    new, actions = decide(state, Fetched(2))
    assert actions == [StartNext()] and not new.fetching
    stopped, actions = decide(state, Signal(signal.SIGTERM))
    assert [type(a) for a in actions] == [Finish] and not stopped.fetching
    assert stopped.phase == "lingering"
    assert decide(stopped, Fetched(2)) == (stopped, [])  # late: nothing
    failed, actions = decide(state, Fetched(2, "could not get node 0's --share files: x"))
    (finish,) = actions
    assert isinstance(finish, Finish) and "could not get node 0's --share files" in str(finish.end)
    assert failed.attempt == 2


def test_node_0_and_an_offer_of_nothing_start_at_once() -> None:
    for state, actions in (awaiting(0), awaiting(1, share=None)):
        assert actions[-1] == StartNext() and not state.fetching
