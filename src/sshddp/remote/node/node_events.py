"""What a node's supervisor reacts to, and what it decides: pure functions of (state, events).

The supervisor's one loop (``supervisor``) takes the events posted to its inbox
(``node_inbox``: by the peers' threads, the watchdog's, the signal handlers and the loop's own
looks at torchrun, the output and the peers) and hands each batch to ``decide``, which
returns the node's next ``LoopState`` and the actions the loop carries out (start an attempt,
stop the node's processes, tell node 0 or the other nodes, take the stacks, end the node).
The state's ``phase`` says where the node is in its life (``PHASES``); ``decide`` alone
moves it, and names how the node ended (``node_ends``). Nothing here does I/O: every
decision is unit-tested without a process.

Node 0 also decides the run's restarts (``RestartDecider``): a node whose attempt failed
says so, and node 0's mesh says when a node is lost; with attempts left, node 0 halts the
attempt everywhere, and once every node still there has halted, starts the next one
everywhere, a waiting spare in each lost node's place (``seats``). A node whose rank died of
a hardware error (its ``fail`` or ``halted`` says so) is replaced like a lost one: node 0's
``again`` leaves it out and it ends. Before seating a spare, node 0 asks the waiting spares
to check their health (``check``) and waits for their answers (``health``): an unhealthy
one is skipped and named. A spare's supervisor waits in its own phase (SPARE) until node
0's ``again`` gives it a node rank.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace
from typing import Any, List, Optional, Tuple, Union

from sshddp.protocol import contract
from sshddp.protocol import peer_messages as pm
from sshddp.remote.node import node_ends
from sshddp.remote.node.node_ends import Ending
from sshddp.remote.node.restarts import refusal
from sshddp.remote.node.seats import Seating, reseat

# ------------------------------------------------------------------- phases

#: torchrun of the node's next attempt is being started (the loop waits for ``Begun``)
STARTING = "starting"
#: torchrun runs; the loop copies its output and looks for its exit
WATCHING = "watching"
#: the node's processes are being stopped (torchrun exited, or the node must stop): the
#: loop advances the teardown a step at a time until ``TornDown``
STOPPING = "stopping"
#: the attempt's processes are gone: the node tells node 0 how it ended, or ends (a
#: phase ``decide`` passes through; the loop never waits in it)
ENDED = "ended"
#: the node told node 0 its attempt ended and waits for its word (the next attempt, or stop)
AWAITING = "awaiting"
#: the node's end is recorded and told: it stays while node 0's server needs it
LINGERING = "lingering"
#: the loop ends
DONE = "done"
#: a spare: no node rank, nothing started; it waits for node 0's word (a lost node's rank)
SPARE = "spare"
PHASES = (SPARE, STARTING, WATCHING, STOPPING, ENDED, AWAITING, LINGERING, DONE)

# ------------------------------------------------------------------- events


@dataclass(frozen=True)
class Exited:
    """torchrun exited (noticed, not reaped)."""


@dataclass(frozen=True)
class Signal:
    """The supervisor got ``signum``: SIGTERM/SIGINT stop gracefully, SIGUSR1 at once."""

    signum: int


@dataclass(frozen=True)
class SessionGone:
    """The launch session a bound node lives in ended (over srun)."""


@dataclass(frozen=True)
class OutputFull:
    """node.log cannot grow (its disk is full)."""

    why: str


@dataclass(frozen=True)
class PeerAbort:
    """The run stops everywhere (a node failed or was lost, node 0 is gone...)."""

    reason: str


@dataclass(frozen=True)
class Node0Said:
    """Node 0's word of the restarts, as it came: ``halt`` (stop attempt N, the run
    restarts) or ``again`` (start attempt N)."""

    msg: Union[pm.Halt, pm.Again]


@dataclass(frozen=True)
class Hang:
    """The run hung (node 0's watchdog, or its word): take the stacks, then ``action``."""

    kind: str
    reason: str
    action: str


@dataclass(frozen=True)
class StacksTaken:
    """This node's stacks of a hang are recorded (hang.json)."""

    kind: str
    reason: str
    action: str


@dataclass(frozen=True)
class Message:
    """A node's word to node 0 (``fail``, ``halted``, ``done``); rank 0: node 0's own."""

    rank: int
    msg: pm.PeerMessage


@dataclass(frozen=True)
class Begun:
    """The supervisor started attempt ``attempt``'s torchrun, or (``failed``: why) could not."""

    attempt: int
    failed: str = ""


@dataclass(frozen=True)
class TornDown:
    """The node's processes are gone; torchrun exited with ``rc``."""

    rc: int


@dataclass(frozen=True)
class PeerView:
    """Node 0's view of the others changed: the nodes it hears from, those that ended."""

    heard: frozenset[int]
    ended: frozenset[int]


@dataclass(frozen=True)
class LetGo:
    """The other nodes no longer need this one (node 0's server relayed every end)."""


@dataclass(frozen=True)
class HealthAsked:
    """Node 0 needs a spare for attempt ``attempt``: a waiting spare checks its health."""

    attempt: int


@dataclass(frozen=True)
class HealthChecked:
    """This spare's look at its health ended: ``problem`` ("" when healthy)."""

    attempt: int
    problem: str


@dataclass(frozen=True)
class Fetched:
    """Node 0's ``--share`` files for attempt ``attempt`` are here (``failed``: why not)."""

    attempt: int
    failed: str = ""


@dataclass(frozen=True)
class RunOver:
    """Node 0 said goodbye: the run ended (a spare that waits goes, not needed)."""


Event = Union[
    Exited,
    Signal,
    SessionGone,
    OutputFull,
    PeerAbort,
    Node0Said,
    Hang,
    StacksTaken,
    Message,
    Begun,
    TornDown,
    PeerView,
    LetGo,
    RunOver,
    HealthAsked,
    HealthChecked,
    Fetched,
]

# ------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Tell:
    """Node 0 sends ``msg`` to every other node."""

    msg: pm.PeerMessage


@dataclass(frozen=True)
class EndRun:
    """Node 0 stops every node of the run, for ``reason``."""

    reason: str


@dataclass(frozen=True)
class TakeStacks:
    """Record this node's stacks (a thread of its own), then post ``StacksTaken``."""

    kind: str
    reason: str
    action: str


@dataclass(frozen=True)
class StartNext:
    """Start the next attempt's torchrun (node 0 said go), then post ``Begun``."""


@dataclass(frozen=True)
class Fetch:
    """Get node 0's ``--share`` files (its ``again`` offered them) before the attempt starts:
    a thread of its own, so that a stop is heard meanwhile (a checkpoint of many GB takes
    minutes); then post ``Fetched``."""

    attempt: int


@dataclass(frozen=True)
class TearDown:
    """Stop the node's processes, a step at a time, then post ``TornDown``; ``graceful``:
    SIGTERM and the spec's grace first (else SIGKILL at once)."""

    graceful: bool


@dataclass(frozen=True)
class Hurry:
    """The teardown under way skips the rest of its grace (a SIGUSR1 came)."""


@dataclass(frozen=True)
class Say:
    """Tell node 0 (a post to this inbox, on node 0) that attempt ``attempt`` ended:
    ``word`` is "halted" or "fail" (``reason``: what failed, which the loop reads the
    attempt's output for)."""

    word: str
    attempt: int
    reason: str


@dataclass(frozen=True)
class Finish:
    """Record the node's end (exit.json) and tell the other nodes."""

    end: Ending


@dataclass(frozen=True)
class CheckHealth:
    """A spare looks at its health (a thread of its own), then posts ``HealthChecked``."""

    attempt: int


@dataclass(frozen=True)
class Reply:
    """Send node 0 ``msg`` (a spare's word on its health)."""

    msg: pm.PeerMessage


@dataclass(frozen=True)
class Farewell:
    """Say goodbye to the other nodes; the loop ends."""


Action = Union[
    Tell,
    EndRun,
    TakeStacks,
    StartNext,
    TearDown,
    Hurry,
    Say,
    Finish,
    Farewell,
    CheckHealth,
    Reply,
    Fetch,
]

# ------------------------------------------------------------------- state


@dataclass(frozen=True)
class RestartDecider:
    """Node 0's part of the restarts: the attempt every node runs, and the one it halts."""

    current: int = 1  #: the attempt every node runs (or is about to start)
    halting: Optional[int] = None  #: the attempt being stopped everywhere
    why: str = ""  #: why it is: the failure that restarts the run
    halted: frozenset[int] = frozenset()  #: the nodes that stopped it (by mesh slot)
    lost: frozenset[int] = frozenset()  #: the nodes lost meanwhile (by mesh slot)
    #: the nodes whose rank died of a hardware error (by mesh slot): replaced like the lost
    blamed: frozenset[int] = frozenset()
    hardware: tuple[str, ...] = ()  #: what the blamed said, where another failure came first
    asked: bool = False  #: the waiting spares were asked to check their health
    health: tuple[tuple[int, str], ...] = ()  #: their answers: (slot, "" or the problem)


@dataclass(frozen=True)
class LoopState:
    """What a node's supervisor knows, as its loop sees it."""

    rank: int  #: the node's slot in the mesh: its first node rank, or nnodes + i for spare i
    nnodes: int = 1  #: the run's nodes at launch (the spares' slots follow theirs)
    max_attempts: int = 1  #: 1 + the run's restarts
    names: tuple[str, ...] = ()  #: the hosts, by mesh slot: the nodes', then the spares'
    spares: int = 0  #: how many spares wait in the mesh (slots nnodes...)
    min_nodes: int = 0  #: the fewest nodes the run goes on with, no spare left (0: none fewer)
    members: tuple[int, ...] = ()  #: the mesh slots by node rank, once they changed
    replaced: tuple[int, ...] = ()  #: the node ranks a spare took in the next attempt
    #: node 0's ``--share`` files for the next attempt (its ``again``), to pull first
    share: Optional[pm.ShareOffer] = None
    launcher: str = "torchrun"  #: what the node runs, as its reasons name it
    phase: str = STARTING  #: where the node is in its life (``PHASES``)
    attempt: int = 1  #: the attempt this node runs
    teardown: Optional[str] = None  #: why the processes are stopped: EXITED or STOP
    rc: Optional[int] = None  #: the last attempt's torchrun exit code
    end: Optional[Ending] = None  #: how the last attempt ended; then how the node did
    exited: bool = False  #: this attempt's torchrun exited
    stop_signal: Optional[int] = None  #: the node was asked to stop (a signal)
    abort: Optional[str] = None  #: why the run stops everywhere (the first reason)
    full: Optional[str] = None  #: why node.log cannot grow
    verdict: Optional[tuple[str, str]] = None  #: (kind, reason): the node stops as hung
    stacks: bool = False  #: the stacks are being taken: the ranks stay until they are
    halt: Optional[tuple[int, str]] = None  #: (attempt, why): node 0 said stop it
    go: Optional[tuple[int, str]] = None  #: (attempt, why): node 0 said start it
    decider: RestartDecider = field(default_factory=RestartDecider)  #: node 0's
    heard: frozenset[int] = frozenset()  #: node 0's: the nodes it hears from (``PeerView``)
    ended: frozenset[int] = frozenset()  #: node 0's: the nodes that reported their end
    sick: str = ""  #: a spare's: what its last look at its health found ("" healthy)
    fetching: bool = False  #: node 0's ``--share`` files are being fetched (``Fetch``)

    @property
    def restarts(self) -> bool:
        return self.max_attempts > 1

    def seated(self) -> tuple[int, ...]:
        """The mesh slots by node rank."""
        return self.members or tuple(range(self.nnodes))

    def spare_slots(self) -> tuple[int, ...]:
        return tuple(range(self.nnodes, self.nnodes + self.spares))

    def name(self, slot: int) -> str:
        """The node in mesh slot ``slot``, by its node rank and host (a spare's host alone)."""
        host = self.names[slot] if slot < len(self.names) else "?"
        members = self.seated()
        return f"node {members.index(slot)} ({host})" if slot in members else f"spare {host}"


Decision = Tuple[LoopState, List[Action]]


def initial(spec: contract.SpecRecord) -> LoopState:
    """A node's state before its first attempt."""
    peers: dict[str, Any] = dict(spec.get("peers") or {})
    runs_torchrun = spec.get("launcher", contract.LAUNCH_TORCHRUN) == contract.LAUNCH_TORCHRUN
    spares = [str(h) for h in peers.get("spares") or ()]
    return LoopState(
        rank=int(spec["node_rank"]),
        nnodes=int(peers.get("nnodes", 1)),
        max_attempts=1 + max(0, int(spec.get("restarts") or 0)),
        names=(*(str(h) for h in peers.get("hosts") or ()), *spares),
        spares=len(spares),
        min_nodes=max(0, int(spec.get("min_nodes") or 0)),
        launcher="torchrun" if runs_torchrun else "the launcher",
        phase=SPARE if spec.get("spare") else STARTING,
        attempt=0 if spec.get("spare") else 1,
    )


# ------------------------------------------------------------------- decisions


def decide(state: LoopState, *events: Event) -> Decision:
    """The node's next state, and what to do, after ``events`` (one batch, as the loop took
    them): each is applied in turn, then the phase moves on from what the node now knows."""
    actions: list[Action] = []
    for event in events:
        state, done = _apply(state, event)
        actions += done
    state, done = _advance(state)
    return state, actions + done


def _apply(state: LoopState, event: Event) -> Decision:
    """One event: what the node now knows, and what it does at once."""
    if isinstance(event, Message):
        return _message(state, event.rank, event.msg)
    if isinstance(event, Fetched):
        return _fetched(state, event)
    if state.phase == SPARE:
        return _spare(state, event)
    if isinstance(event, Hang):
        told = [Tell(pm.hang(event.kind, event.reason, event.action))] if state.rank == 0 else []
        return replace(state, stacks=True), [
            *told,
            TakeStacks(event.kind, event.reason, event.action),
        ]
    if isinstance(event, Begun) and event.failed:
        state = replace(state, attempt=event.attempt)
        return _finish(state, node_ends.not_started(event.failed, state.rc, event.attempt))
    if isinstance(event, TornDown) and state.phase == STOPPING:
        return replace(state, phase=ENDED, rc=event.rc, end=_attempt_end(state, event.rc)), []
    if isinstance(event, LetGo) and state.phase == LINGERING:
        return replace(state, phase=DONE), [Farewell()]
    hurry = isinstance(event, Signal) and event.signum == signal.SIGUSR1
    return _note(state, event), [Hurry()] if hurry and state.phase == STOPPING else []


def _spare(state: LoopState, event: Event) -> Decision:
    """A waiting spare hears only of the run's end and of node 0's word (no stacks: it
    runs nothing)."""
    if isinstance(event, RunOver):
        return _finish(state, Ending(contract.SUCCEEDED, spare_words(state, SPARE_UNUSED)))
    if isinstance(event, HealthAsked):
        return state, [CheckHealth(event.attempt)]
    if isinstance(event, HealthChecked):
        return replace(state, sick=event.problem), [Reply(pm.health(event.attempt, event.problem))]
    if isinstance(event, (Hang, StacksTaken, Exited, TornDown, Begun, LetGo)):
        return state, []
    return _note(state, event), []


SPARE_UNUSED = "a spare: the run ended without needing it"


def spare_words(state: LoopState, words: str) -> str:
    """A spare's end in ``words``; first, where its last look found it unhealthy, that (the
    coordinator quarantines it: ``contract.SPARE_UNHEALTHY``)."""
    return f"{contract.SPARE_UNHEALTHY}{state.sick}; {words}" if state.sick else words


def _advance(state: LoopState) -> Decision:
    """The phase that follows from what the node knows after a batch of events."""
    if state.phase == SPARE and stopping(state):
        words = spare_words(state, node_ends.stop_words(state.abort))
        return _finish(state, Ending(contract.STOPPED, words))
    if state.phase == SPARE and state.go is not None and state.rank in state.seated():
        return _start_next(replace(state, attempt=state.go[0] - 1))
    if state.phase == STARTING and state.fetching and stopping(state):
        end = state.end  # the last attempt's (a seated spare has none)
        if end is None:
            end = Ending(contract.STOPPED, node_ends.stop_words(state.abort))
        return _finish(replace(state, fetching=False), _final(state, end))
    if state.phase == WATCHING and outcome(state) != WATCH:
        why = outcome(state)
        graceful = why == STOP and state.stop_signal != signal.SIGUSR1
        return replace(state, phase=STOPPING, teardown=why), [TearDown(graceful)]
    if state.phase == ENDED and state.end is not None:
        word = word_to_node_0(state, state.end.state)
        if word is None:
            return _finish(state, _final(state, state.end))
        return replace(state, phase=AWAITING), [Say(word, state.attempt, state.end.reason)]
    if state.phase == AWAITING and state.end is not None:
        if stopping(state):
            return _finish(state, _final(state, state.end))
        if going(state) and state.rank not in state.seated():
            assert state.go is not None
            return _finish(state, Ending(contract.STOPPED, contract.REPLACED_PREFIX + state.go[1]))
        if going(state):
            return _start_next(state)
    return state, []


def _start_next(state: LoopState) -> Decision:
    """Start the attempt node 0 said go to: first, where its ``again`` offered node 0's
    ``--share`` files to a node other than 0, get them."""
    if state.rank != 0 and state.share is not None:
        assert state.go is not None
        return replace(state, phase=STARTING, fetching=True), [Fetch(state.go[0])]
    return replace(state, phase=STARTING), [StartNext()]


def _fetched(state: LoopState, event: Fetched) -> Decision:
    """The files are here: the attempt starts; not got: it fails, saying why (a rank must
    not resume from an older checkpoint than the others'). Late (the node stopped
    meanwhile): nothing."""
    if not state.fetching:
        return state, []
    state = replace(state, fetching=False)
    if event.failed:
        state = replace(state, attempt=event.attempt)
        return _finish(state, node_ends.not_started(event.failed, state.rc, event.attempt))
    return state, [StartNext()]


def _attempt_end(state: LoopState, rc: int) -> Ending:
    """How the attempt whose processes are gone ended: by itself, or stopped."""
    if state.teardown == EXITED:
        return node_ends.exited(rc, state.full, state.launcher)
    signalled = state.stop_signal is not None
    return node_ends.stopped(rc, state.abort, state.verdict, state.full, signalled)


def _final(state: LoopState, end: Ending) -> Ending:
    return node_ends.final(end, halting(state), state.abort, state.full)


def _finish(state: LoopState, end: Ending) -> Decision:
    """The node ends (``end``): recorded and told, it lingers while the others need it."""
    return replace(state, phase=LINGERING, end=end), [Finish(end)]


def _note(state: LoopState, event: Event) -> LoopState:
    """The events that only change what the node knows."""
    if isinstance(event, Exited):
        return replace(state, exited=True)
    if isinstance(event, Signal):
        hurried = state.stop_signal == signal.SIGUSR1  # an immediate stop stays immediate
        return state if hurried else replace(state, stop_signal=event.signum)
    if isinstance(event, SessionGone):  # stopped as if signalled
        asked = state.stop_signal is not None
        return state if asked else replace(state, stop_signal=signal.SIGTERM)
    if isinstance(event, OutputFull):
        return state if state.full is not None else replace(state, full=event.why)
    if isinstance(event, PeerAbort):
        return state if state.abort is not None else replace(state, abort=event.reason)
    if isinstance(event, StacksTaken):
        hung = event.action == contract.ON_STALL_STOP
        verdict = (event.kind, event.reason) if hung else state.verdict
        return replace(state, stacks=False, verdict=verdict)
    if isinstance(event, Begun):
        return replace(state, phase=WATCHING, attempt=event.attempt, exited=False, teardown=None)
    if isinstance(event, PeerView):
        return replace(state, heard=event.heard, ended=event.ended)
    if not state.restarts:  # without restarts, node 0's word of them means nothing
        return state
    if isinstance(event, Node0Said):
        word = (event.msg["attempt"], event.msg["reason"])
        if event.msg["t"] == "halt":
            return replace(state, halt=word)
        return _seated(replace(state, go=word), event.msg)
    return state


def _seated(state: LoopState, msg: pm.Again) -> LoopState:
    """The nodes of the attempt node 0 starts, where its word changed them."""
    state = replace(state, share=msg.get("share"))
    if "nodes" not in msg:
        return replace(state, replaced=())
    return replace(state, members=tuple(msg["nodes"]), replaced=tuple(msg.get("replaced", ())))


def _message(state: LoopState, rank: int, msg: pm.PeerMessage) -> Decision:
    """Node 0 hears from the node in mesh slot ``rank`` (itself for rank 0)."""
    if msg["t"] == "done" and rank not in state.seated():
        return _recheck(state)  # a spare's end, or a lost node's word that came late
    if msg["t"] == "done" and msg["state"] == contract.LOST and state.restarts:
        return lost(state, rank, msg["reason"]) if state.rank == 0 else (state, [])
    if msg["t"] == "done":
        return state, [_ended(state, rank, msg)] if _ends_run(state, msg) else []
    if not state.restarts or state.rank != 0:
        return state, []
    if msg["t"] == "fail":
        return failed(state, rank, msg["attempt"], msg["reason"], msg.get("hardware", ""))
    if msg["t"] == "halted":
        state, told = blame(state, rank, msg["attempt"], msg.get("hardware", ""))
        state, more = stopped(state, rank, msg["attempt"])
        return state, [*told, *more]
    if msg["t"] == "health":
        return checked(state, rank, msg["attempt"], msg["problem"])
    return state, []


def _ends_run(state: LoopState, msg: pm.Done) -> bool:
    halting = state.restarts and state.decider.halting is not None
    return halting or msg["state"] != contract.SUCCEEDED


def _ended(state: LoopState, rank: int, msg: pm.Done) -> EndRun:
    """A node ended: while the run restarts, or not succeeding, the run stops."""
    if state.restarts and state.decider.halting is not None:
        return EndRun(f"{state.name(rank)} ended while the run was restarting")
    why = f"{state.name(rank)} {msg['state']}"
    return EndRun(why + (": " + msg["reason"] if msg["reason"] else ""))


def failed(state: LoopState, rank: int, attempt: int, reason: str, hardware: str = "") -> Decision:
    """Node ``rank``'s attempt failed (and it stopped): restart everyone, or end the run.
    A node node 0 no longer hears from is lost, and one whose rank died of a hardware error
    (``hardware``: in words) is blamed: a spare takes its place, or the run ends."""
    d = state.decider
    if d.halting is not None or attempt != d.current:
        if d.halting != attempt:
            return state, []
        state, told = blame(state, rank, attempt, hardware)
        state, more = stopped(state, rank, attempt)
        return state, [*told, *more]
    heard = state.heard | {state.rank}
    gone = frozenset(s for s in state.seated() if s not in heard)
    why = f"{state.name(rank)}: {hardware}" if hardware else f"{state.name(rank)} failed: {reason}"
    lost = [f"{state.name(s)} lost (not connected to node 0's supervisor)" for s in sorted(gone)]
    blamed = frozenset({rank}) if hardware else frozenset()
    state, actions = _halt(state, attempt, why, gone, "; ".join((why, *lost)), blamed)
    if state.decider.halting != attempt:
        return state, actions
    state, more = stopped(state, rank, attempt)
    return state, [*actions, *more]


def lost(state: LoopState, slot: int, reason: str) -> Decision:
    """Node 0's mesh lost the node in ``slot`` (``reason``: how): the attempt stops
    everywhere and a spare takes its place, else the run ends."""
    d = state.decider
    if slot in d.lost:
        return state, []
    what = f"{state.name(slot)} lost ({reason})"
    if d.halting is None:
        return _halt(state, d.current, what, frozenset({slot}))
    d = replace(d, lost=d.lost | {slot})
    seating = _seating(replace(state, decider=d))
    if seating.refusal:
        return state, [EndRun(f"{_why(d)}; then {what}; not restarted: {seating.refusal}")]
    state, ask = _ask(replace(state, decider=d))
    state, more = _complete(state)
    return state, [*ask, *more]


def blame(state: LoopState, slot: int, attempt: int, hardware: str) -> Decision:
    """While attempt ``attempt`` halts, the node in ``slot`` says one of its ranks died of a
    hardware error (``hardware``, in words; "": it did not): a spare takes its place, or
    the run ends."""
    d = state.decider
    if not hardware or d.halting != attempt or slot in d.blamed or slot not in state.seated():
        return state, []
    what = f"{state.name(slot)}: {hardware}"
    d = replace(d, blamed=d.blamed | {slot}, hardware=(*d.hardware, what))
    seating = _seating(replace(state, decider=d))
    if seating.refusal:
        return state, [EndRun(f"{_why(d)}; not restarted: {seating.refusal}")]
    return _ask(replace(state, decider=d))


def checked(state: LoopState, slot: int, attempt: int, problem: str) -> Decision:
    """The spare in ``slot`` answered node 0's ``check`` for ``attempt``: ``problem`` ("" when
    healthy). Once every waiting spare has, the next attempt may start."""
    d = state.decider
    if d.halting != attempt or slot not in state.spare_slots() or not d.asked:
        return state, []
    d = replace(d, health=(*d.health, (slot, problem)))
    return _complete(replace(state, decider=d))


def _ask(state: LoopState) -> Decision:
    """Ask the waiting spares to check their health, once per halt, where one is needed."""
    d = state.decider
    if d.asked or not (d.lost or d.blamed) or not state.spares:
        return state, []
    assert d.halting is not None
    return replace(state, decider=replace(d, asked=True)), [Tell(pm.check(d.halting))]


def _unchecked(state: LoopState) -> bool:
    """A spare that could take a node's place has yet to answer node 0's ``check``."""
    d = state.decider
    heard = (state.heard | {state.rank}) - state.ended
    answered = {slot for slot, _ in d.health}
    free = [s for s in state.spare_slots() if s in heard and s not in state.seated()]
    return any(s not in answered and s not in d.lost for s in free)


def _recheck(state: LoopState) -> Decision:
    """A spare that ended (or went) while node 0 waited for the spares' answers: perhaps the
    next attempt may start now."""
    if state.rank != 0 or not state.restarts or state.decider.halting is None:
        return state, []
    return _complete(state)


def _why(d: RestartDecider) -> str:
    """Why the attempt halts: the hardware errors first (they name the root cause)."""
    return "; ".join((*d.hardware, d.why))


def _halt(
    state: LoopState,
    attempt: int,
    why: str,
    gone: frozenset[int],
    told: str = "",
    blamed: frozenset[int] = frozenset(),
) -> Decision:
    """Stop ``attempt`` everywhere for ``why`` (``told``: in full, the lost nodes named;
    ``gone``: the nodes lost; ``blamed``: those whose rank died of a hardware error), or
    end the run when no next attempt can follow."""
    members = state.seated()
    ended = [members.index(s) for s in members if s in state.ended and s not in gone]
    no = refusal(attempt, state.max_attempts, ended, state.abort)
    d = RestartDecider(state.decider.current, attempt, told or why, lost=gone, blamed=blamed)
    if not no and (gone or blamed):
        no = _seating(replace(state, decider=d)).refusal
    if no:
        return state, [EndRun(f"{why}; not restarted: {no}")]
    state = replace(state, decider=d, halt=(attempt, d.why))
    state, ask = _ask(state)
    return state, [Tell(pm.halt(attempt, d.why)), *ask]


def _seating(state: LoopState) -> Seating:
    """The next attempt's nodes, the decider's lost and blamed nodes out, a spare that
    answered unhealthy skipped."""
    d = state.decider
    heard = state.heard | {state.rank}
    members, spares = state.seated(), state.spare_slots()
    sick = {slot: problem for slot, problem in d.health if problem}
    return reseat(
        members,
        d.lost | d.blamed,
        heard - state.ended,
        spares,
        state.min_nodes,
        state.names,
        blamed=d.blamed,
        unhealthy=sick,
    )


def stopped(state: LoopState, rank: int, attempt: int) -> Decision:
    """Node ``rank`` stopped attempt ``attempt``; once every node still there has: go again."""
    d = state.decider
    if d.halting != attempt:
        return state, []
    return _complete(replace(state, decider=replace(d, halted=d.halted | {rank})))


def _complete(state: LoopState) -> Decision:
    """Once every node not lost halted: the next attempt, a spare in each lost node's place."""
    d = state.decider
    assert d.halting is not None
    if any(s not in d.halted and s not in d.lost for s in state.seated()):
        return state, []
    out = d.lost | d.blamed
    if out and _unchecked(state):
        return state, []  # the spares' answers are awaited (each look is bounded)
    seating = _seating(state) if out else Seating(state.seated())
    if seating.refusal:
        return state, [EndRun(f"{_why(d)}; not restarted: {seating.refusal}")]
    why = "; ".join((_why(d), *seating.taken))
    go = d.halting + 1
    d = replace(d, halting=None, current=go, lost=frozenset(), blamed=frozenset(), hardware=())
    d = replace(d, asked=False, health=())
    state = replace(state, decider=d, go=(go, why))
    if seating.members == state.seated() and not seating.replaced:
        return replace(state, replaced=()), [Tell(pm.again(go, why))]
    nodes, new = seating.members, seating.replaced
    state = replace(state, members=nodes, replaced=new)
    return state, [Tell(pm.again(go, why, list(nodes), list(new)))]


# ------------------------------------------------------------------- what the node does next

WATCH, EXITED, STOP = "watch", "exited", "stop"


def outcome(state: LoopState) -> str:
    """What becomes of the running attempt: keep watching it, clean up after torchrun's
    exit, or stop the node's processes."""
    if state.exited:
        return EXITED
    if state.stop_signal is not None or state.full is not None or state.verdict is not None:
        return STOP
    if halting(state):
        return STOP  # node 0 restarts the run: every node stops this attempt
    if state.abort is not None and not state.stacks:
        return STOP  # (while this node's stacks are taken, its ranks stay)
    return WATCH


def halting(state: LoopState) -> bool:
    """Node 0 asked this node to stop its current attempt."""
    return state.halt is not None and state.halt[0] == state.attempt


def stopping(state: LoopState) -> bool:
    """The node ends whatever its attempt did: asked to, aborted, hung or out of disk."""
    stops = (state.stop_signal, state.full, state.verdict, state.abort)
    return any(v is not None for v in stops)


def word_to_node_0(state: LoopState, ended: str) -> Optional[str]:
    """What the node tells node 0 once its attempt ended in state ``ended``: "halted" (it
    stopped as told), "fail" (a restart may follow), or None: the node ends here."""
    if not state.restarts or stopping(state):
        return None
    if halting(state):
        return "halted"
    if ended == contract.FAILED and state.attempt < state.max_attempts:
        return "fail"
    return None


def going(state: LoopState) -> bool:
    """Node 0 said start the attempt after this node's."""
    return state.go is not None and state.go[0] == state.attempt + 1
