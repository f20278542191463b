"""The host contract: the files of a node's run directory and the records they hold.

Both sides use this module. The launch session writes ``spec.json`` when it stages a node
(the node's environment and the peers' key, secrets, reach the supervisor in memory only:
``Secrets``); the supervisor writes ``state.json`` once torchrun runs,
``node.log`` as the ranks write, and ``exit.json`` as its last act; the coordinator reads
them back through the ``follow`` and ``stop`` calls. ``SCHEMA`` goes into every record: bump
it whenever a record changes shape (as SkyPilot bumps ``SKYLET_VERSION``), so a coordinator
can tell a record it does not know from a broken one. A record without ``schema`` was written
before there was one and reads as schema 1.

A run directory: ``<workdir>/runs/<run id>/n<node rank>/``, made new (0700) for every run;
every file in it is made new too (``O_EXCL | O_NOFOLLOW``), owner-only.
"""

from __future__ import annotations

from typing import Any, Optional, TypedDict

SCHEMA = 11  #: 11: attempts.json's AttemptRecord `node_rank`, so a seated spare's status
# and exit.json say which node rank it holds
# 10: spec.json `spare` and `min_nodes`, PeersSpec `spares` (a spare's
# supervisor waits in the mesh until node 0 gives it a node rank); SSHDDP_REPLACED
# 9: progress.json (ProgressRecord); NodeWatch and exit.json `still`; the
# stacks role LAUNCHER, and a node launcher's workers ranked by joined/p<pid>; RankSample
# `stack` and `waits`, exit.json `usage.waits` (the straggler's evidence)
# 8: exit.json `usage` (UsageRecord: the node's GPUs over its kept samples);
# RankSample `last_span`; TopRecord `history` (the last minute's progress bars)
# 7: samples.jsonl (SampleRecord, node_sampler) and the `top` call's TopRecord
# 6: spec.json `torchrun` and `program` (protocol/compose.py) in place of `argv`;
# state.json and attempts.json `standby` (was `warm`); agent's standby_messages.py
# 5: joined/p<pid>, JoinedRecord `world` and `collectives`; exit.json `world`;
# no env.json or peers.key (Secrets, in memory); spec.json's paths resolved
# 4: spec.json `restarts`; attempts.json; exit.json `attempt`, `attempts`, ...
# `earlier`, `offsets`; node.idx and out/ (each line's rank) (remote/rankside/ranksite.py, which
# stands alone, repeats the number)
# 3: spec.json `tty_size` and `watch`; joined/, hang.json, nccl/; the state STALLED
# 2: spec.json `launcher`; state.json `pid_start`, `boot_id`; exit.json `escaped`

# The files of a run directory.
SPEC = "spec.json"  #: the node's part of the plan (SpecRecord), written at staging
STATE = "state.json"  #: the live supervisor (StateRecord), written once torchrun started
#: empty; the launch session that staged the node holds a flock on it for its life, so
#: retention tells a node still being staged from one whose session died before its start
STAGING = "staging.lock"
EXIT = "exit.json"  #: how the node ended (ExitRecord), the supervisor's last act
LOG = "node.log"  #: every byte the node's ranks wrote, in order
#: node.log's spans and who wrote each (INDEX_RECORD); absent where ranks are not told apart
INDEX = "node.idx"
OUTPUTS = "out"  #: <local rank>: a FIFO (--tty: a link to a pty), the rank's stdout and stderr
STOP_REASON = "stop-reason"  #: why the node was asked to stop (text), first asker wins
RESERVE = "reserve"  #: room kept for exit.json should the disk fill up
SUPERVISOR = "supervisor.py"  #: ``python -S supervisor.py RUNDIR`` runs the supervisor
SUPERVISOR_LOG = "supervisor.log"  #: the supervisor's own stdout and stderr
RANK_SHIM = "rank.py"  #: every rank's interpreter starts through it
AGENT_SHIM = "agent.py"  #: torchrun starts through it (``agent``): no slow interpreter exit
#: the standby wire's module (``standby_messages``), beside the agent shim, which reads its go
STANDBY_WIRE = "standby_messages.py"
SITE = "site"  #: first on the ranks' PYTHONPATH: its sitecustomize.py sets up every process
CODE = "code"  #: the shipped code, unpacked; the ranks' cwd with --fresh-cwd
CODE_SHA256 = "code.sha256"  #: the SHA-256 of the shipped bytes, checked as they arrived
WORKSPACES = "work"  #: ``<workdir>/work/<name>``: shipped code's cwd, kept across runs
STACKS = "stacks"  #: <pid>-<start time>: each Python process's stack dumps, appended
#: <global rank> (a rank torchrun started) or p<pid> (any other process of the node): a
#: JoinedRecord per process that called init_process_group
JOINED = "joined"
HANG = "hang.json"  #: what the node's watchdog saw when the run hung (HangRecord)
PROGRESS = "progress.json"  #: whether a quiet node's ranks still work (ProgressRecord)
FLIGHT_WAIT = 12.0  #: seconds the ranks have to dump their flight recorder once asked (flight)
NCCL = "nccl"  #: the NCCL flight recorder's dumps (``trace_<rank>``), on CUDA hosts
SAMPLES = "samples.jsonl"  #: one SampleRecord a second (node_sampler), the latest last
SAMPLES_OLD = "samples.1.jsonl"  #: the samples before those, once samples.jsonl was full
ATTEMPTS = "attempts.json"  #: where each attempt of the node starts in node.log (AttemptsRecord)

# Environment variables every process of a node carries.
OWN_VAR_PREFIX = "SSHDDP_"  #: sshddp's own variables: torch and the user's code never read them
RUN_ID_VAR = "SSHDDP_RUN_ID"
NODE_RANK_VAR = "SSHDDP_NODE_RANK"
MARK_VAR = "SSHDDP_NODE_MARK"  #: teardown finds the node's processes by it
ATTEMPT_VAR = "SSHDDP_ATTEMPT"  #: the run's attempt the process belongs to: 1, 2, ...
#: the node ranks a spare took in this attempt ("2" or "1,3"; "" when none did)
REPLACED_VAR = "SSHDDP_REPLACED"
#: ``DEV:INO`` of the node's pipe: a rank whose stdout is that pipe moves it to OUTPUTS/<local
#: rank> (``remote/rankside/ranksite.py``, which stands alone, repeats the name)
OUTPUT_VAR = "SSHDDP_OUTPUT"

# node.idx: one record per span of node.log, appended right after the span's bytes: the
# span's offset in node.log, its length, and its source: the local rank that wrote it, or
# SOURCE_NODE (torchrun itself, and whatever shares its pipe). The spans follow each other
# with no gap and cover node.log; a span holds whole lines but where a line stayed
# unfinished for PARTIAL_WAIT seconds (a progress bar): then its part so far.
INDEX_RECORD = "<QIi"  #: struct format: offset (u64), length (u32), source (i32), little-endian
INDEX_BYTES = 16
SOURCE_NODE = -1

# What runs a node (SpecRecord.launcher); a spec without it is torchrun's.
LAUNCH_TORCHRUN = "torchrun"  #: torchrun (SpecRecord.torchrun), its ranks through rank.py
LAUNCH_NODE = "node"  #: the node's one process: python, rank.py, then the script or -m MODULE
LAUNCH_COMMAND = "command"  #: a user's command, run as it is (``--launcher node -- CMD``)
# What the program is (ProgramSpec.kind).
PROGRAM_SCRIPT = "script"  #: ``python SCRIPT ARGS...``
PROGRAM_MODULE = "module"  #: ``python -m MODULE ARGS...``
PROGRAM_COMMAND = "command"  #: an executable and its arguments (LAUNCH_COMMAND)
#: Every Python process of a node dumps its threads' stacks into STACKS on SIGRTMIN + this
#: (``remote/rankside/ranksite.py``, which stands alone, repeats it as DUMP_SIGNAL_OFFSET).
STACKS_SIGNAL_OFFSET = 6
#: A process that called init_process_group also answers the node's samplers from a thread:
#: a byte written to STACKS/<pid>-<start time> + this FIFO asks it (``ranksite`` repeats it
#: as ASK_SUFFIX)
STACKS_ASK_SUFFIX = ".ask"

# The states a host reports for a node (see sshddp.model.state.NodeState).
STARTING = "starting"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
LOST = "lost"
UNKNOWN = "unknown"
STALLED = "stalled"  #: stopped by a watchdog: the world never formed, or no output came
#: a status only, never in exit.json: the node's supervisor is frozen (SIGSTOP); the node
#: may go on once it is resumed
NOT_ANSWERING = "not-answering"
FINAL_STATES = (SUCCEEDED, FAILED, STOPPED, LOST, STALLED)
#: how the reason of a node that a spare replaced mid-run, its host alive (a rank died of a
#: hardware error), begins: node 0's reason for the restart follows
REPLACED_PREFIX = "replaced mid-run: "
#: how the reason of a spare whose look at its health failed when node 0 needed it begins
#: (the coordinator quarantines its host): what the look found follows
SPARE_UNHEALTHY = "a spare that failed its health check when needed: "

# What the watchdogs decided (HangRecord.kind).
HANG_INIT = "init"  #: the world did not form within the init timeout
HANG_STALL = "stall"  #: no rank of the run wrote output within the stall timeout
ON_STALL_STOP = "stop"  #: a stall stops the run
ON_STALL_REPORT = "report"  #: a stall is reported (hang.json, supervisor.log); the run goes on


class _PeersSpec(TypedDict):
    nnodes: int
    addr: str  #: the hub's address (the rendezvous address)
    port: int  #: the hub's port (the rendezvous port + 1)
    timeout: float  #: seconds of silence after which a peer counts as lost
    hosts: list[str]  #: host names by node rank, for messages


class PeersSpec(_PeersSpec, total=False):
    """How a node's supervisor reaches the others (node 0's is the hub)."""

    #: the spares' hosts (schema 10): spare i joins the mesh as slot ``nnodes + i`` and waits
    #: there, with no node rank, until node 0 gives it a lost node's (``again``'s ``nodes``)
    spares: list[str]


class WatchSpec(TypedDict):
    """The node's watchdogs (run by node 0's supervisor, fed by every node's heartbeat)."""

    init_timeout: float  #: seconds for every rank to return from init_process_group; 0: off
    stall_timeout: float  #: seconds with no output from any rank of the run; 0: off
    on_stall: str  #: ON_STALL_STOP or ON_STALL_REPORT
    nprocs: list[int]  #: every node's count of ranks, by node rank (the world's shape)


class TorchrunSpec(TypedDict):
    """torchrun's options for one node (spec.json's ``torchrun``, with LAUNCH_TORCHRUN)."""

    nnodes: int
    node_rank: int
    nproc: int  #: --nproc-per-node
    rdzv_backend: str  #: "static": host i is node rank i
    rdzv_endpoint: str  #: node 0's ``host:port`` (``[addr]:port`` for IPv6)
    rdzv_id: str  #: the run id
    max_restarts: int  #: torchrun's own; the supervisors restart the whole run instead
    options: list[str]  #: the user's own torchrun options (``--torchrun-arg``), as given
    local_rank_arg: bool  #: the script also gets ``--local_rank=N`` (torch.distributed.launch)


class ProgramSpec(TypedDict):
    """What the node runs (spec.json's ``program``)."""

    kind: str  #: PROGRAM_SCRIPT, PROGRAM_MODULE or PROGRAM_COMMAND
    target: str  #: the script's path, the module's name, or the command's executable
    args: list[str]  #: its arguments, exactly as it must receive them


class SpecRecord(TypedDict, total=False):
    """spec.json: what the supervisor runs (its command line: ``compose.node_argv``)."""

    schema: int
    run_id: str
    node_rank: int
    torchrun: TorchrunSpec  #: with LAUNCH_TORCHRUN (schema 6)
    program: ProgramSpec  #: (schema 6)
    cwd: Optional[str]
    grace: float  #: seconds from SIGTERM to SIGKILL at teardown
    mark: str  #: the value of SSHDDP_NODE_MARK in every process of the node
    peers: PeersSpec
    tty: bool  #: ranks write to a pty instead of a pipe
    launcher: str  #: LAUNCH_TORCHRUN, LAUNCH_NODE or LAUNCH_COMMAND (schema 2)
    tty_size: list[int]  #: the pty's [columns, rows] with tty (schema 3)
    watch: WatchSpec  #: the watchdogs (schema 3); absent: none
    restarts: int  #: times the whole run may start again after a failure (schema 4); absent: 0
    #: this supervisor is a spare (schema 10): ``node_rank`` is its mesh slot, and it starts
    #: nothing until node 0 gives it a lost node's rank
    spare: bool
    #: the fewest nodes the run goes on with once no spare is left (schema 10); absent: 0,
    #: a node lost without a spare ends the run
    min_nodes: int
    #: ``--share`` paths (with restarts, schema 10): node 0 hands its latest copies to every
    #: node whose copy differs before each attempt after the first (``restart_share``)
    share: list[str]
    #: a spare's look at its health when node 0 needs it (``remote/node/spare_health``):
    #: {"command": the inventory's ``health:`` or None, "timeout": s, "keep": bytes of
    #: output kept, "gpus": the inventory's ``gpus`` or None}
    health: dict[str, Any]


class Secrets(TypedDict):
    """What a launch session hands its node's supervisor in memory, never through a file:
    a node's environment may hold secrets (``--env``), and the key proves a peer is the
    run's."""

    env: dict[str, str]  #: the node's planned variables (env: and --env among them)
    peer_key: Optional[str]  #: the supervisors' shared secret (hex), or None


class JoinedRecord(TypedDict):
    """joined/<rank> or joined/p<pid>: a process's call of
    ``torch.distributed.init_process_group``, written by the node's sitecustomize
    (``ranksite``) when the call starts and again when it returns: the process is then part
    of a world."""

    schema: int
    rank: Optional[int]  #: RANK (torchrun's ranks), else the group's rank once joined
    pid: int
    entered: float  #: when the call started (epoch seconds)
    joined: Optional[float]  #: when it returned; None while it waits
    world: Optional[int]  #: the world size of the group it joined (schema 5); None: waits


class JoinedEnd(JoinedRecord, total=False):
    """The record again as the process leaves its world (schema 5)."""

    #: the most collectives any of its groups ran (c10d's sequence number); None: unknown
    collectives: Optional[int]


class WorldRecord(TypedDict):
    """exit.json's ``world``: whether the node's processes formed the planned world."""

    planned: int  #: the run's planned world size (every node's ranks)
    ranks: int  #: this node's planned ranks
    joined: int  #: this node's processes that returned from init_process_group
    sizes: list[int]  #: the world size each of them saw, smallest first
    #: the collectives each of them ran (``JoinedEnd``), of those that said, fewest first
    collectives: list[int]


class NodeWatch(TypedDict):
    """What a node's heartbeat tells node 0's watchdog."""

    entered: list[int]  #: global ranks inside init_process_group, or through it
    joined: list[int]  #: global ranks that returned from it
    quiet: float  #: seconds since the node last wrote output (or since it started)
    #: seconds since it last wrote output or its ranks were seen working (``node_progress``)
    still: float


class ProgressRecord(TypedDict):
    """progress.json: what a quiet node's samples of its ranks showed (``node_progress``)."""

    schema: int
    at: float  #: the last sample (epoch seconds)
    moved_at: Optional[float]  #: when its ranks were last seen working; None: never
    still: float  #: seconds since it last wrote output or was seen working, at ``at``


class FlightEntry(TypedDict):
    """One collective in a rank's NCCL flight recorder dump (``flight``)."""

    pg: str  #: the process group's id ("0": the default group)
    seq: int  #: its sequence number in that group (collectives and p2p counted apart)
    op: str  #: e.g. "nccl:all_reduce"
    state: str  #: "scheduled", "started" or "completed"
    sizes: str  #: the input tensors' sizes, as torch records them
    where: str  #: the innermost frame outside torch: "file:line in function"


class FlightGroup(TypedDict):
    """A process group's progress on one rank: the last collective's sequence number it
    enqueued, saw start and saw complete (-1: none)."""

    desc: str
    enqueued: int
    started: int
    completed: int


class FlightRecord(TypedDict):
    """A rank's NCCL flight recorder dump, summed up on its host."""

    rank: int
    path: str  #: the dump itself, on the host
    version: str  #: the dump format's
    groups: dict[str, FlightGroup]
    last: list[FlightEntry]  #: its last collectives, oldest first


class HangRecord(TypedDict):
    """hang.json: what a node saw when the watchdog of its run fired."""

    schema: int
    kind: str  #: HANG_INIT or HANG_STALL
    reason: str  #: the watchdog's finding, as the report says it
    at: float  #: when (epoch seconds)
    node_rank: int
    action: str  #: ON_STALL_STOP (the run was stopped) or ON_STALL_REPORT
    watch: NodeWatch  #: this node's facts at that time
    stacks: NodeStacks  #: every process of the node and its stacks
    flight: list[FlightRecord]  #: the ranks' flight recorder dumps, asked for then (GPU hosts)
    flight_late: list[int]  #: ranks asked for a dump that wrote none in time (flight.WAIT)
    nccl: list[str]  #: the NCCL flight recorder's dump files in the run directory


class AttemptRecord(TypedDict):
    """One attempt of the run on this node: every node starts attempt k+1 together once
    every node's attempt k has stopped."""

    attempt: int  #: 1, 2, ...
    offset: int  #: node.log's size when the attempt started: its first byte
    started: float  #: epoch seconds
    reason: str  #: why the attempt before it ended ("" for the first)
    standby: bool  #: its torchrun was a standby (``standby_messages``), not a fresh one
    node_rank: int  #: the node rank it runs as (a spare's: the lost node's it took)


class AttemptsRecord(TypedDict):
    """attempts.json: the node's attempts so far (written as each one starts)."""

    schema: int
    max_attempts: int  #: 1 + the run's restarts
    attempts: list[AttemptRecord]


class StateRecord(TypedDict):
    """state.json: the supervisor and torchrun while the node runs."""

    schema: int
    state: str
    supervisor_pid: int
    supervisor_start: Optional[int]  #: clock ticks since boot: the pid names one process
    pid: int  #: torchrun's pid
    pgid: int  #: torchrun's process group (torchrun leads it)
    pid_start: Optional[int]  #: torchrun's start time: what stop checks before the group
    boot_id: Optional[str]  #: the host's boot: start times name a process only on it
    started: float
    standby: bool  #: torchrun was a standby: torch imported before the attempt began


class Escaped(TypedDict):
    """A process that kept the node's output open after the node's processes were gone:
    it left the run's session and environment, so teardown could not prove it the run's."""

    pid: int
    command: str  #: its command line, printable characters only


class UsageRecord(TypedDict):
    """exit.json's ``usage``: what the node's GPUs did over its kept samples (SAMPLES and
    SAMPLES_OLD); the GPU fields are None on a host without GPUs (or none readable)."""

    samples: int  #: the samples it is computed from
    gpus: int  #: the most GPUs one sample saw
    gpu_util: Optional[float]  #: mean utilisation (%) over every GPU of every sample
    gpu_mem_peak: Optional[int]  #: the most memory (bytes) one GPU held in one sample
    gpu_mem_total: Optional[int]  #: that GPU's memory (bytes)
    #: global rank -> [stack samples, of them waiting in a collective, where it worked
    #: most]: where each rank's time went over the kept samples (absent on older nodes)
    waits: dict[str, list[Any]]


class ExitRecord(TypedDict, total=False):
    """exit.json, and the status ``follow`` reports for a node still running."""

    schema: int
    state: str
    returncode: Optional[int]
    signal: str
    reason: str
    started: Optional[float]
    ended: float
    node_rank: int
    escaped: list[Escaped]  #: processes that left the run and kept its output open
    joined: int  #: a running node's ranks through init_process_group (schema 3)
    quiet: float  #: seconds since a running node last wrote output (schema 3)
    still: float  #: seconds since it wrote output or its ranks were seen working (schema 9)
    attempt: int  #: the attempt the node ended in, or runs (schema 4; absent: 1)
    attempts: int  #: how many attempts the run may make: 1 + its restarts (schema 4)
    earlier: list[str]  #: why each earlier attempt ended, oldest first (schema 4)
    offsets: list[int]  #: where each attempt starts in node.log, by attempt (schema 4)
    world: WorldRecord  #: the worlds the node's processes joined (schema 5)
    usage: UsageRecord  #: its GPUs over its kept samples (schema 8)


class StopAnswer(ExitRecord, total=False):
    """What ``stop`` answers: the node's exit record, and whether it had ended already."""

    already: bool
    note: str  #: what stop wants the user to know (what it left alone, and why)


class FetchHeader(TypedDict, total=False):
    """What ``fetch`` (remote/calls/host_fetch.py) sends first: what follows, or why nothing
    does."""

    ok: bool
    error: str  #: nothing follows, and why
    missing: bool  #: nothing follows because nothing is at the path
    kind: str  #: "file" (its bytes follow) or "dir" (an uncompressed tar stream follows)
    path: str  #: the absolute path on the host
    name: str  #: its last component: the name it gets locally
    size: int  #: bytes to expect (a directory's is an estimate, for a progress bar)
    skipped: list[str]  #: names in a directory that are not sent (links, devices, unreadable)
    skipped_count: int


class FetchTrailer(TypedDict, total=False):
    """What ``fetch`` sends last, on stderr: what it sent, to check what arrived."""

    bytes: int
    sha256: str
    error: str  #: the stream was cut short on the host (a file shrank while it was read)


# What a process of a node is, in ``sshddp stacks``.
RANK = "rank"  #: a rank torchrun started (it has RANK in its environment)
WORKER = "worker"  #: a process a rank started (a DataLoader worker, mp.spawn): same RANK
AGENT = "agent"  #: the node's torchrun
LAUNCHER = "launcher"  #: the node's one process under a node launcher (``--launcher node``)
OTHER = "other"  #: any other process of the node's run


class FrameRecord(TypedDict):
    """One frame of a thread's stack."""

    file: str  #: the code's file name as Python (or py-spy) names it; "" for a note
    line: int  #: 0 when unknown
    func: str  #: the function, or the note ("..." where a deep stack was cut)
    code: str  #: the source line, read on the host ("" when unknown)
    native: bool  #: a C / C++ frame (py-spy --native)


class ThreadRecord(TypedDict):
    """One thread of a process and its stack, outermost frame first."""

    id: str  #: the thread's id as the dump gives it
    name: str  #: its name, when py-spy gave one
    status: str  #: "active", "idle", "active, holds the GIL", or "" when unknown
    current: bool  #: the thread that ran the dump handler
    frames: list[FrameRecord]


class ProcessStacks(TypedDict):
    """One process of a node and every thread's stack (or why there is none)."""

    pid: int
    ppid: int
    role: str  #: RANK, WORKER, AGENT, LAUNCHER or OTHER
    #: the global rank it is or belongs to (RANK in its environment, or the rank it joined
    #: the planned world as: joined/p<pid>)
    rank: Optional[int]
    local_rank: Optional[int]
    cmdline: str
    source: str  #: "faulthandler", "py-spy", or "" when it has no stack
    threads: list[ThreadRecord]  #: the oldest (usually the main) thread first
    raw: str  #: the dump as the process (faulthandler) or py-spy wrote it
    error: str  #: why it has no stack ("" when it has one)


class NodeStacks(TypedDict):
    """What ``stacks`` answers for one node: every process of its run, or its end."""

    schema: int
    node_rank: int
    state: str  #: the node's state (RUNNING, or how it ended: then no processes)
    processes: list[ProcessStacks]
    py_spy: Optional[str]  #: with native: the py-spy used, "" when missing; None otherwise
    note: str  #: what the user should know (py-spy missing, and where it was looked for)
    elapsed: float  #: seconds the host took


class RankSample(TypedDict):
    """One rank of a node at one sample: its process and the workers it started."""

    rank: int  #: the global rank
    local_rank: Optional[int]
    pid: int  #: the rank's own process
    cpu: Optional[float]  #: % of one core since the last sample, workers included; None at first
    rss: int  #: resident bytes, workers included
    out_bytes: int  #: bytes of output the rank wrote so far (node.idx)
    last_output: Optional[float]  #: when the sampler first saw its latest output (epoch s)
    #: node.log's offset and length of the rank's latest span of output (schema 8)
    last_span: Optional[list[int]]
    #: where its stacks were at this sample (``remote/calls/waits.py``); None when they were not
    #: read (absent on older nodes: read with ``get``)
    stack: Optional[StackSample]


class StackSample(TypedDict):
    """Where one rank was at one sample of its stacks."""

    wait: bool  #: inside a collective (waiting for the other ranks), else working
    where: str  #: the program's innermost line then, ``train.py:13 (time.sleep(0.2))``


class GpuSample(TypedDict):
    """One GPU of the node at one sample; None where the driver did not say."""

    index: int
    name: str
    util: Optional[float]  #: % of the last sample period a kernel ran
    mem_used: Optional[int]  #: bytes
    mem_total: Optional[int]  #: bytes
    power: Optional[float]  #: watts
    temp: Optional[float]  #: degrees Celsius


class SampleRecord(TypedDict):
    """One line of samples.jsonl: what the node's processes and GPUs did at ``at``."""

    schema: int
    at: float  #: epoch seconds
    node_rank: int
    cpu: Optional[float]  #: every process of the node's run together, % of one core
    rss: int  #: every process of the node's run together, bytes
    ranks: list[RankSample]
    gpus: list[GpuSample]  #: [] on a host without GPUs (or none readable)
    gpu_source: str  #: "nvml", "nvidia-smi", or "" when none


class TopRecord(TypedDict):
    """What the ``top`` call answers for one node."""

    schema: int
    node_rank: int  #: the node rank it runs as (a seated spare's: the one it took; schema 11)
    state: str  #: the node's state (RUNNING, or how it ended)
    attempt: Optional[int]  #: the attempt it runs (with restarts; schema 11)
    sample: Optional[SampleRecord]  #: the latest sample, None before the first
    tails: dict[str, str]  #: local rank -> the last bytes of its output (bars included)
    #: local rank -> [[when, its latest span's last bytes then], ...] over the last minute,
    #: oldest first: the step rates its sparkline draws (schema 8)
    history: dict[str, list[list[Any]]]
    now: float  #: the host's clock when it answered (ages are counted from it)
    #: local rank -> [[when, waiting (bool), where], ...]: its stack samples of the last
    #: WINDOW seconds, oldest first (absent on older nodes: read with ``get``)
    waits: dict[str, list[list[Any]]]
