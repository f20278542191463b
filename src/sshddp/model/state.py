"""Node and run outcomes as data: every node's state, and the run's verdict and exit code.

Per-node outcomes are values, aggregated into a ``RunResult``, never an exception thrown at
the first failure (torch elastic's ``WorkerState`` / ``RunResult`` do the same).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from sshddp.errors import ExitCode
from sshddp.model.leftout import LeftOut
from sshddp.model.straggler import Waits
from sshddp.protocol import contract


class NodeState(str, Enum):
    """What one node of a run is doing, or how it ended.

    A node's life, as the coordinator sees it::

        PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | STOPPED
                                       \\-> LOST

    PENDING: planned, nothing sent yet. STARTING: staged on its host; its supervisor is
    starting torchrun. RUNNING: torchrun runs under the node's supervisor. SUCCEEDED:
    torchrun exited 0. FAILED: torchrun exited non-zero, or the node could not be staged
    or started. STOPPED: stopped on request (Ctrl-C, ``sshddp stop``) or because another
    node ended the run. LOST: the node's supervisor vanished (host down, processes
    killed); the others stop. STALLED: stopped by a watchdog (``--init-timeout``,
    ``--stall-timeout``): the run hung. The last five are final: the host keeps them in exit.json.

    More say what the coordinator does not know: UNREACHABLE, its host could not be
    reached (the node may still be running there); NOT_ANSWERING, its host answered but
    the node's supervisor is frozen (SIGSTOP); and UNKNOWN, a state this version cannot
    read. GONE: its host answered and holds no run directory for it (retention removed it
    once the run had ended, or it was never made): nothing of the node runs there, so it
    is final too.
    """

    PENDING = "pending"
    STARTING = contract.STARTING
    RUNNING = contract.RUNNING
    SUCCEEDED = contract.SUCCEEDED
    FAILED = contract.FAILED
    STOPPED = contract.STOPPED
    LOST = contract.LOST
    STALLED = contract.STALLED
    UNREACHABLE = "unreachable"
    NOT_ANSWERING = contract.NOT_ANSWERING
    UNKNOWN = contract.UNKNOWN
    GONE = "gone"
    #: its host was lost mid-run and a spare took its node rank (the spare's record says so)
    REPLACED = "replaced"

    @property
    def final(self) -> bool:
        """The node has ended for good (its host says so, or holds nothing of it)."""
        done = self.value in contract.FINAL_STATES
        return done or self in (NodeState.GONE, NodeState.REPLACED)

    @property
    def bad(self) -> bool:
        """An end that stops the rest of the run."""
        return self in (NodeState.FAILED, NodeState.LOST, NodeState.STALLED)

    @property
    def unanswered(self) -> bool:
        """The node may still be running: its host or its supervisor does not answer."""
        return self in (NodeState.UNREACHABLE, NodeState.NOT_ANSWERING)

    @classmethod
    def of(cls, value: object) -> NodeState:
        """The state a host reported; UNKNOWN for anything this version cannot read."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


def replaced_in(result: RunResult) -> RunResult:
    """``result``, each node whose rank a spare took mid-run (the spare's record says so)
    REPLACED, unless it ended well itself."""
    seats = {n.seat: n.host for n in result.nodes if n.seat is not None}
    nodes = [
        replace(n, state=NodeState.REPLACED, reason=_replaced_words(n.reason, seats[n.node_rank]))
        if n.node_rank in seats and n.state is not NodeState.SUCCEEDED
        else n
        for n in result.nodes
    ]
    return replace(result, nodes=nodes)


def _replaced_words(reason: str, spare: str) -> str:
    """Why a node's rank is a spare's: its own words where its host was alive to say them
    (a rank died of a hardware error), else it was lost."""
    if reason.startswith(contract.REPLACED_PREFIX):
        return reason
    return f"lost mid-run; {spare} took its place"


def with_replaced(ranks: Sequence[int], hosts: Sequence[str], states: list[Any]) -> list[Any]:
    """``states`` (the exit or status records of the nodes planned with ``ranks``, on
    ``hosts``), where a spare's record says it ran as another planned node's rank: that
    node's host was lost mid-run and is REPLACED (its own record, if any, was cut short)."""
    out = list(states)
    for i, state in enumerate(states):
        seat = state.get("node_rank") if isinstance(state, Mapping) else None
        if not isinstance(seat, int) or seat == ranks[i] or seat not in ranks:
            continue
        lost = ranks.index(seat)
        said = str(out[lost].get("reason") or "")
        gone = not NodeState.of(out[lost].get("state")).final or out[lost].get("state") == "lost"
        if gone or said.startswith(contract.REPLACED_PREFIX):
            why = _replaced_words(said, hosts[i])
            out[lost] = {"state": NodeState.REPLACED.value, "reason": why, "returncode": None}
    return out


@dataclass(frozen=True)
class NodeWorld:
    """What a node's processes did with ``init_process_group`` (exit.json's ``world``)."""

    planned: int  #: the run's planned world size
    ranks: int  #: the node's planned ranks
    joined: int  #: its processes that returned from init_process_group
    sizes: tuple[int, ...]  #: the world size each of them saw
    #: the collectives each of them ran, of those that said (all of them, or unknown)
    collectives: tuple[int, ...] = ()

    @classmethod
    def of(cls, value: object) -> Optional[NodeWorld]:
        """From a host's record; None when absent (an older host) or malformed."""
        if not isinstance(value, Mapping):
            return None
        numbers = [value.get(k) for k in ("planned", "ranks", "joined")]
        sizes = value.get("sizes")
        if not isinstance(sizes, list) or not all(map(_is_int, [*numbers, *sizes])):
            return None
        planned, ranks, joined = (int(n) for n in numbers)  # type: ignore[arg-type]
        ran = value.get("collectives")
        ran = tuple(ran) if isinstance(ran, list) and all(map(_is_int, ran)) else ()
        return cls(planned, ranks, joined, tuple(sizes), ran)


@dataclass(frozen=True)
class NodeUsage:
    """What a node's GPUs did over its kept samples (exit.json's ``usage``)."""

    gpus: int  #: the node's GPUs
    util: float  #: mean utilisation, %
    mem_peak: Optional[int]  #: the most memory one GPU held, bytes
    mem_total: Optional[int]  #: that GPU's memory, bytes

    @classmethod
    def of(cls, value: object) -> Optional[NodeUsage]:
        """From a host's record; None when absent, malformed, or the node has no GPU."""
        if not isinstance(value, Mapping):
            return None
        gpus, util = value.get("gpus"), value.get("gpu_util")
        if not _is_int(gpus) or not gpus or not isinstance(util, (int, float)):
            return None
        return cls(
            int(gpus),
            float(util),
            _count_or_none(value, "gpu_mem_peak"),
            _count_or_none(value, "gpu_mem_total"),
        )


def waits_of_usage(usage: object) -> dict[int, Waits]:
    """exit.json's ``usage.waits``, each rank's [samples, waiting, where]; {} when absent."""
    waits = usage.get("waits") if isinstance(usage, Mapping) else None
    if not isinstance(waits, Mapping):
        return {}
    out = {}
    for rank, value in waits.items():
        if not (isinstance(rank, str) and rank.isdigit() and isinstance(value, list)):
            continue
        if len(value) == 3 and _is_int(value[0]) and _is_int(value[1]):
            out[int(rank)] = Waits(int(value[0]), min(int(value[1]), int(value[0])), str(value[2]))
    return out


def _count_or_none(record: Mapping[str, Any], key: str) -> Optional[int]:
    value = record.get(key)
    return value if isinstance(value, int) and _is_int(value) else None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def not_distributed(nodes: Sequence[NodeResult]) -> bool:
    """The run's processes never formed one process group of the planned world size: none
    joined one, or they formed groups of another size. False when some node cannot say
    (a host of an older sshddp) or nothing was planned."""
    worlds = [n.world for n in nodes]
    if not worlds or any(w is None or w.planned < 2 for w in worlds):
        return False  # one process has no world to form: nothing to say of it
    return not any(w.planned in w.sizes for w in worlds if w is not None) or never_talked(nodes)


def never_talked(nodes: Sequence[NodeResult]) -> bool:
    """Every process of the run joined a group, and every one of them said, as it left, that
    no collective ran on any of its groups: they formed a world and then each worked alone
    (accelerate and a transformers Trainer on CPU hosts). False when any process did not say
    (killed, ``os._exit``, a multiprocessing worker): say less rather than something wrong."""
    worlds = [n.world for n in nodes]
    if not worlds or any(w is None or w.planned < 2 for w in worlds):
        return False
    known = [w for w in worlds if w is not None and w.joined and len(w.collectives) == w.joined]
    return len(known) == len(worlds) and not any(sum(w.collectives) for w in known)


@dataclass
class NodeResult:
    """What became of one node."""

    node_rank: int
    host: str  #: the inventory host name
    state: NodeState = NodeState.PENDING
    returncode: Optional[int] = None  #: torchrun's exit code
    signal: Optional[str] = None  #: the signal that killed torchrun, by name
    reason: str = ""  #: why it ended, in words (empty for a success)
    ended: Optional[float] = None  #: when (epoch seconds, the host's clock)
    log_path: Optional[Path] = None  #: the node's local log
    attempt: int = 1  #: the attempt of the run it ended in, or runs (``--max-restarts``)
    attempts: int = 1  #: how many attempts the run may make: 1 + its restarts
    earlier: tuple[str, ...] = ()  #: why each earlier attempt ended, oldest first
    world: Optional[NodeWorld] = None  #: the worlds its processes joined, once it ended
    #: the node rank its record says it ran as, where that is another's: a spare seated
    #: mid-run in a lost node's place
    seat: Optional[int] = None
    usage: Optional[NodeUsage] = None  #: what its GPUs did, once it ended (None: no GPU)
    #: global rank -> where its time went over the node's kept samples, once it ended
    waits: dict[int, Waits] = field(default_factory=dict)

    def apply(self, record: Mapping[str, Any]) -> None:
        """Take a node's exit record (exit.json, or follow's status) as its state."""
        self.state = NodeState.of(record.get("state", NodeState.LOST.value))
        self.returncode = record.get("returncode")
        self.signal = record.get("signal")
        self.reason = record.get("reason") or ""
        self.ended = record.get("ended")
        self.attempt = _count(record.get("attempt"))
        self.attempts = max(self.attempt, _count(record.get("attempts")))
        earlier = record.get("earlier")
        self.earlier = tuple(str(e) for e in earlier) if isinstance(earlier, list) else ()
        self.world = NodeWorld.of(record.get("world"))
        seat = record.get("node_rank")
        self.seat = seat if _is_int(seat) and seat != self.node_rank else None
        self.usage = NodeUsage.of(record.get("usage"))
        self.waits = waits_of_usage(record.get("usage"))


@dataclass
class RunResult:
    """The outcome of a run as one coordinator saw it: every node, and which failed first."""

    run_id: str
    nodes: list[NodeResult]
    root_cause: Optional[int] = None  #: node rank of the first failure
    interrupted: bool = False  #: Ctrl-C stopped it
    detached: bool = False  #: we stopped following; the run goes on
    log_dir: Optional[Path] = None
    log_error: Optional[str] = None  #: why we detached: a local log stopped taking bytes
    cause: Optional[str] = None  #: what ended the run from outside its nodes (its Slurm job)
    hang_cause: Optional[str] = None  #: a hung run's culprits, as its stacks single them out
    left_out: tuple[LeftOut, ...] = ()  #: files the launch did not put on some host
    quarantined: tuple[str, ...] = ()  #: the report's lines naming the hosts its end quarantined

    @property
    def ok(self) -> bool:
        fine = (NodeState.SUCCEEDED, NodeState.REPLACED)
        return all(n.state in fine for n in self.nodes)

    @property
    def undistributed(self) -> bool:
        """It succeeded without ever forming its planned world (exit code 0 all the same:
        its processes did succeed; the report warns)."""
        return self.ok and not_distributed(self.nodes)

    @property
    def hung(self) -> bool:
        """A watchdog stopped the run (some node ended STALLED)."""
        return any(n.state is NodeState.STALLED for n in self.nodes)

    @property
    def root(self) -> Optional[NodeResult]:
        """The node that failed first, if the coordinator saw one fail."""
        return next((n for n in self.nodes if n.node_rank == self.root_cause), None)

    @property
    def exit_code(self) -> ExitCode:
        """The process exit status this outcome maps to (README.md, "Exit codes")."""
        if self.ok:
            return ExitCode.OK
        if self.interrupted:
            return ExitCode.INTERRUPTED
        if self.log_error:
            return ExitCode.LOG_WRITE_FAILED
        if self.detached:
            return ExitCode.OK
        if self.cause:
            return ExitCode.RUN_FAILED
        if self.hung:
            return ExitCode.HUNG
        unreachable = any(n.state.unanswered for n in self.nodes)
        if self.root_cause is None and unreachable and not peer_cause(self):
            return ExitCode.UNREACHABLE
        return ExitCode.RUN_FAILED


def _count(value: object) -> int:
    """An attempt number from a host's record: 1 when absent or not a positive int."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    return value if ok else 1  # type: ignore[return-value]


PEER_PREFIX = "stopped: "  #: a supervisor's reason when a peer's end stopped its node


def stop_reason(result: RunResult) -> str:
    """Why a run that no node failed was stopped (Ctrl-C, ``sshddp stop``), once every node
    has ended; "" otherwise. The node asked first keeps the asker's reason; the others
    stopped after it (their reasons start with ``stopped: ``)."""
    nodes = result.nodes
    if result.ok or any(n.state.bad or not n.state.final for n in nodes):
        return ""
    stopped = [n.reason for n in nodes if n.state is NodeState.STOPPED]
    asked = [r for r in stopped if r and not r.startswith(PEER_PREFIX)]
    return asked[0] if asked else ("stopped" if stopped else "")


def peer_cause(result: RunResult) -> str:
    """Why the supervisors stopped the run, when no node the coordinator reached failed
    itself: a node they lost (partitioned, powered off) shows only in the others' records."""
    if result.interrupted or result.ok or stop_reason(result):
        return ""
    prefix = PEER_PREFIX
    for n in sorted(result.nodes, key=lambda n: n.node_rank):
        if n.state is NodeState.STOPPED and n.reason.startswith(prefix):
            return n.reason[len(prefix) :]
    return ""
