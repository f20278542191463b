"""Every default value in one place: the CLI's option defaults, the planner's and the hosts'.

Changing one here changes it everywhere it is used, the help text included.
"""

from __future__ import annotations

# Inventory
PYTHON = "python3"  #: the interpreter with torch on a host
WORKDIR = "~/.sshddp"  #: where a host keeps sshddp's files (runs/ below it)
RDZV_PORT = 29500  #: torchrun's rendezvous port; sshddp's supervisors use the next one
AUTO_PORT = -1  #: `--port auto` / `rendezvous: {port: auto}`: node 0 picks a free pair
#: where `--port auto` starts: above the default pair, which a default launch will take
AUTO_PORT_FROM = RDZV_PORT + 2

# Launch
LOG_DIR = "sshddp-logs"  #: local log root; a run's logs go to LOG_DIR/<run id>/
GRACE = 10.0  #: seconds from SIGTERM to SIGKILL at teardown
HEARTBEAT_TIMEOUT = 30.0  #: seconds of silence after which a node counts as lost
INIT_TIMEOUT = 300.0  #: seconds for the world to form (every rank through init_process_group)
ON_STALL = "stop"  #: what a stall (--stall-timeout) does: stop the run, or only report it
KEEP_RUNS = 50  #: run directories a host keeps, counting the one being launched
KEEP_ENVS = 3  #: synced environments a host keeps (the newest used), besides any in use
MAX_CODE_BYTES = 512 * 1024 * 1024  #: the most a --workdir may ship

# The most a number given by the user may be (command line, inventory): past these a value
# is a typo, and some (an overflowing timeout) would break the run rather than the launch.
MAX_SECONDS = 7 * 24 * 3600.0  #: any option in seconds (timeouts, --grace)
MAX_PROCS_PER_NODE = 1024  #: --nproc-per-node, an inventory's gpus / nproc / slots, -H HOST:N
MAX_RESTARTS = 1000  #: --max-restarts
MAX_FANOUT = 1024  #: --fanout

# Local state
RUN_RECORD_MAX = 8 * 1024 * 1024  #: the most of a run record (runs/ID.json) read; past it: bad
QUARANTINE_FOR = 24 * 3600.0  #: seconds a host stays quarantined (--quarantine-for)
QUARANTINE_MAX = 365 * 24 * 3600.0  #: the longest --quarantine-for

# Reaching hosts
FANOUT = 32  #: hosts contacted at once
CONNECT_TIMEOUT = 10.0  #: seconds to connect, get the SSH banner and authenticate
RECONNECT_WINDOW = 30.0  #: seconds a follower keeps trying to reach a host that dropped
RDZV_CONNECT_WINDOW = 3.0  #: seconds each host keeps retrying the rendezvous connect (probe)
# The most a log stream hands on at once: a long span is written and shown in pieces of this
# size, so a flood costs each follower no more memory (docs/performance.md).
STREAM_READ = 256 * 1024

# Checks
CLOCK_WARN = 1.0  #: seconds a host's clock may be off from the coordinator's before a warning
CLOCK_FAIL = 60.0  #: seconds off that fail the check: no time sync at all
CLOCK_SAMPLES = 3  #: doctor's clock round trips per host; the shortest one is used
#: a launch's, when the session's first line (its clock) does not prove the host within
#: CLOCK_WARN: each is a round trip before anything starts
LAUNCH_CLOCK_SAMPLES = 1
SESSION_END_WAIT = 5.0  #: seconds a launch session that never started gets to clean up
# Slurm
SLURM_TIMEOUT = 30.0  #: seconds a Slurm client command (scontrol, squeue) may take
SLURM_POLL = 2.0  #: seconds between looks at the job's state while a run over Slurm is followed

# exec
#: bytes of one host's output `exec` keeps in memory; past them, the rest goes to a file of a
#: private temporary directory (0700, the file 0600), so a flood costs no more memory
EXEC_IN_MEMORY = 4 * 1024 * 1024
EXEC_KEPT = 4 * 1024 * 1024 * 1024  #: the most of one host's output `exec` keeps; past it, cut

# Reports
TAIL_LINES = 20  #: lines of the failing node's output in a run report
STACKS_TIMEOUT = 2.0  #: seconds each process of a run has to write its stacks (``stacks``)

# The console
BAR_EVERY = 5.0  #: seconds between a progress bar's states on a console that is not a terminal
TTY_SIZE = (80, 24)  #: columns and rows of the ranks' pty (--tty) when sshddp has no terminal

# --share
SHARE_LIST_CAP = 200  #: top-level files of the ranks' cwd a node lists, for the unshared warning
SHARE_TIMEOUT = 60.0  #: seconds a --share transfer may wait on node 0 (to connect, per read)

# doctor --health
HEALTH_TIMEOUT = 8.0  #: seconds the user's `health:` command and nvidia-smi may take on a host
HEALTH_DEEP_TIMEOUT = 60.0  #: seconds `dcgmi diag -r 1` may take (--health=deep)
HEALTH_OUTPUT = 4096  #: bytes of a health command's output kept (its last ones)
HANDOFF_FANOUT = 4  #: hosts one host hands a payload on to (docs/design.md says why)
HANDOFF_MIN_BYTES = 1 << 20  #: code of this size or more goes host to host; less, to each
HANDOFF_TIMEOUT = 120.0  #: seconds a hand-off may wait on a host's server (to connect, per read)
