"""Case ``slurm``: launch into a Slurm allocation over srun, against a hand-written
``srun ... torchrun`` of the same job; and what one coordinator holds per node over srun.

The cluster is the test lab's (``sshddp_lab.slurm``: a real slurmctld, one slurmd per
network namespace). One allocation per size (``salloc --no-shell -N N``) serves every
repetition of both methods, which run as from a shell inside it (``SLURM_JOB_ID`` set):

* sshddp: ``sshddp launch --transport srun slurm RANK latency``, with its preflight, code
  copy, supervisors and peer mesh;
* srun: ``srun --jobid J --overlap -N N --ntasks-per-node=1 bash -c 'exec python -m
  torch.distributed.run --node-rank $SLURM_NODEID ... RANK latency'``, the static
  rendezvous on the first node's address, as a user's batch script would start it.

Latency is from starting the command to the last rank's READY line, and to a torchrun
running on every node (what the launcher controls; the READY line adds a torch import). While
sshddp runs, its srun processes (``--job-name=sshddp``) are sampled: their number and summed
RSS are what a node costs the coordinator's machine, beside the coordinator's own RSS and
threads.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    PAIRED,
    Bench,
    BenchError,
    Finished,
    ReadyWatch,
    Stat,
    Watched,
    expect_rc,
    interval_cell,
    paired,
    progress,
    stat,
    verdict,
)
from sshddp_lab.slurm import SlurmCluster

METHODS = ("sshddp", "srun")
SAMPLE_S = 0.05
TORCHRUN_POLL_S = 0.005


@dataclass(frozen=True)
class SlurmRow:
    nodes: int
    sshddp: Stat  #: start -> every READY (s)
    srun: Stat
    sshddp_torchrun: Stat  #: start -> a torchrun running on every node (s)
    srun_torchrun: Stat
    rss_mb: Stat  #: coordinator peak RSS
    threads: Stat  #: coordinator's most threads
    sruns: Stat  #: sshddp's srun processes, most at once
    srun_mb: Stat  #: their summed RSS at that moment (MB)
    diff: Stat  #: each repetition's sshddp - srun, run back to back (s)


@dataclass
class Allocation:
    """A running job of the lab's cluster and the environment of a shell inside it."""

    cluster: SlurmCluster
    job: str
    env: dict[str, str]


@contextlib.contextmanager
def allocation(b: Bench, nodes: int) -> Iterator[Allocation]:
    """A lab cluster of ``nodes`` nodes with a ``nodes``-node job on it."""
    with SlurmCluster(b.tmp / f"slurm{nodes}", nodes) as cluster:
        got = cluster.run(["salloc", "--no-shell", "-N", str(nodes)], timeout=60)
        found = re.search(r"Granted job allocation (\d+)", got.stderr)
        if got.returncode != 0 or found is None:
            raise BenchError(f"salloc -N {nodes} failed: {got.stderr}")
        env = cluster.client_env(b.env)
        venv = str(Path(sys.executable).parent)  # the nodes' python3: this venv's (PATH)
        env.update(
            SLURM_JOB_ID=found.group(1),
            PATH=f"{venv}:{env.get('PATH', '')}",
            HOME=str(b.tmp / "home"),  # the nodes' ~/.sshddp: in the suite's directory
            GLOO_SOCKET_IFNAME="eth0",
        )
        yield Allocation(cluster, found.group(1), env)


class SrunSampler:
    """The most of sshddp's srun processes alive at once, and their summed RSS then; and
    when a torchrun of run ``name`` (its ``--rdzv-id``) first ran on every node."""

    def __init__(self, name: str, nodes: int) -> None:
        self.count = 0
        self.rss_mb = 0.0
        self.torchruns_at: float | None = None
        self._needle = b"\0--rdzv-id\0" + name.encode() + b"\0"
        self._nodes = nodes
        self._seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TORCHRUN_POLL_S if self.torchruns_at is None else SAMPLE_S):
            entries = [e for e in Path("/proc").iterdir() if e.name.isdigit()]
            if self.torchruns_at is None:
                self._look_for_torchruns(entries)
            rss = [kb for kb in map(_srun_rss_kb, entries) if kb is not None]
            if len(rss) >= self.count:
                self.count, self.rss_mb = len(rss), sum(rss) / 1024

    def _look_for_torchruns(self, entries: list[Path]) -> None:
        for entry in entries:
            if entry.name in self._seen:
                continue
            with contextlib.suppress(OSError):
                cmdline = (entry / "cmdline").read_bytes()
                if _is_torchrun(cmdline) and self._needle in cmdline:
                    self._seen.add(entry.name)
        if len(self._seen) >= self._nodes:
            self.torchruns_at = time.perf_counter()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _is_torchrun(cmdline: bytes) -> bool:
    """torchrun started as ``-m torch.distributed.run`` or through sshddp's agent shim."""
    return b"torch.distributed.run" in cmdline or b"/agent.py\0" in cmdline


def _srun_rss_kb(entry: Path) -> int | None:
    """VmRSS of process ``entry`` if it is one of sshddp's sruns."""
    if not entry.name.isdigit():
        return None
    with contextlib.suppress(OSError, ValueError):
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        if argv[0] == b"srun" and b"--job-name=sshddp" in argv:
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    return None


def srun_argv(alloc: Allocation, b: Bench, port: int, name: str) -> list[str]:
    """The hand-written launch: one torchrun per node, its rank from SLURM_NODEID."""
    n = alloc.cluster.n
    torchrun = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n),
        "--nproc-per-node", "1", "--rdzv-backend", "static",
        "--rdzv-endpoint", f"{alloc.cluster.node(1).addr}:{port}", "--rdzv-id", name,
        "--max-restarts", "0", str(b.rank_script), "latency",
    ]  # fmt: skip
    line = f"exec {shlex.join(torchrun[:3])} --node-rank $SLURM_NODEID {shlex.join(torchrun[3:])}"
    return [
        "srun", f"--jobid={alloc.job}", "--overlap", "-N", str(n), "--ntasks-per-node=1",
        "bash", "-c", line,
    ]  # fmt: skip


def sshddp_argv(b: Bench, port: int, name: str) -> list[str]:
    return [
        *b.sshddp, "launch", "--transport", "srun", "--log-dir", str(b.tmp / "logs"),
        "--name", name, "--port", str(port), "--env", "GLOO_SOCKET_IFNAME=eth0",
        "slurm", str(b.rank_script), "latency",
    ]  # fmt: skip


@dataclass(frozen=True)
class Sample:
    """One launch: start to every READY and to a torchrun on every node; what ran."""

    ready: float
    torchruns: float
    done: Finished
    sruns: int  #: sshddp's srun processes, most at once
    srun_mb: float  #: their summed RSS then


def launch_once(b: Bench, alloc: Allocation, how: str) -> Sample:
    port, name = b.port(), b.name(f"sl-{how}")
    argv = sshddp_argv(b, port, name) if how == "sshddp" else srun_argv(alloc, b, port, name)
    watch = ReadyWatch(alloc.cluster.n)
    sampler = SrunSampler(name, alloc.cluster.n)
    proc = Watched(argv, alloc.env, b.tmp, on_line=watch)
    try:
        done = expect_rc(proc.finish(), 0, f"{how} into a {alloc.cluster.n}-node allocation")
    finally:
        sampler.stop()
    if watch.all_at is None or sampler.torchruns_at is None:
        raise BenchError(f"{how}: only ranks {sorted(watch.ranks)} printed READY")
    return Sample(
        watch.all_at - proc.t0,
        sampler.torchruns_at - proc.t0,
        done,
        sampler.count,
        sampler.rss_mb,
    )


def slurm_row(b: Bench, nodes: int, reps: int) -> SlurmRow:
    """``reps`` runs of each method into one allocation, the first method alternating."""
    runs: dict[str, list[Sample]] = {m: [] for m in METHODS}
    with allocation(b, nodes) as alloc:
        for rep in range(reps):
            for how in METHODS[rep % 2 :] + METHODS[: rep % 2]:
                runs[how].append(launch_once(b, alloc, how))
    ours, theirs = runs["sshddp"], runs["srun"]
    return SlurmRow(
        nodes,
        stat([x.ready for x in ours]),
        stat([x.ready for x in theirs]),
        stat([x.torchruns for x in ours]),
        stat([x.torchruns for x in theirs]),
        stat([x.done.maxrss_mb for x in ours]),
        stat([x.done.threads for x in ours]),
        stat([x.sruns for x in ours]),
        stat([x.srun_mb for x in ours]),
        paired([x.ready for x in ours], [x.ready for x in theirs]),
    )


def bench_slurm(b: Bench, sizes: Sequence[int], reps: int) -> list[SlurmRow]:
    rows = []
    for n in sizes:
        rows.append(slurm_row(b, n, reps))
        r = rows[-1]
        progress(f"slurm {n} nodes: sshddp {r.sshddp.fmt()}, srun {r.srun.fmt()}")
    return rows


def slurm_table(rows: Sequence[SlurmRow]) -> list[str]:
    out = [
        "Start → every rank's READY line (the target), and start → a torchrun process on "
        "every node. sshddp's starts with its node's supervisor, after the preflight "
        "and the code copy (docs/design.md, *How a launch works*, step 4):",
        "",
        "| nodes | sshddp launch slurm, srun (s) | srun torchrun (s) | sshddp − srun (s) "
        "| target ≤ +0.5 s | paired: median [interval, ≥ 95%] | torchruns started: sshddp / "
        "srun (s) | difference (s) |",
        "|---:|---|---|---:|---|---|---|---:|",
    ]
    for r in rows:
        over = round(r.sshddp.median - r.srun.median, 2)
        started = r.sshddp_torchrun.median - r.srun_torchrun.median
        out.append(
            f"| {r.nodes} | {r.sshddp.fmt()} | {r.srun.fmt()} | {over:+.2f} "
            f"| {verdict(over <= 0.5, f'{over - 0.5:.2f} s over')} "
            f"| {interval_cell(r.diff, 0.5)} "
            f"| {r.sshddp_torchrun.fmt()} / {r.srun_torchrun.fmt()} | {started:+.2f} |"
        )
    out += [
        "",
        PAIRED,
        "",
        "What one coordinator holds per node over srun, sampled while sshddp ran:",
        "",
        "| nodes | coordinator peak RSS (MB) | coordinator threads | sshddp's srun "
        "processes, most at once | their RSS (MB) |",
        "|---:|---|---|---|---|",
    ]
    out += [
        f"| {r.nodes} | {r.rss_mb.fmt(1, 0)} | {r.threads.fmt(1, 0)} | {r.sruns.fmt(1, 0)} "
        f"| {r.srun_mb.fmt(1, 0)} |"
        for r in rows
    ]
    return out


METHOD = """\
* **slurm**: a real Slurm 22.05 cluster of {slurm} nodes (the test lab: slurmctld, one
  slurmd per network namespace) and one `salloc --no-shell` allocation per size; both
  methods run as from a shell inside it, 1 process per node, the launch case's rank
  (READY, sleep 1 s, exit 0). sshddp: `sshddp launch --transport srun slurm rank.py
  latency` (preflight, code copy, supervisors, one srun step per node for its launch
  session). srun: `srun --jobid J --overlap -N N --ntasks-per-node=1 bash -c 'exec python
  -m torch.distributed.run --node-rank $SLURM_NODEID --rdzv-backend static ...'`, the
  hand-written equivalent. Latency is start to the last rank's READY line, and start to
  a `torch.distributed.run` of the run (its `--rdzv-id`) running on every node (/proc
  polled every 5 ms). sshddp's srun processes (`--job-name=sshddp`) are sampled every
  50 ms: the most at once and their summed RSS then.
"""

CASE: Case[list[SlurmRow]] = Case(
    name="slurm",
    hosts=lambda sizes: 1,  # its own Slurm cluster; the sshd cluster is not used
    run=lambda b, sizes, reps: bench_slurm(b, sizes.slurm, reps),
    title=lambda rows: "Launch into a Slurm allocation over srun (start → every rank's first line)",
    table=slurm_table,
    noisy=lambda rows: [f"slurm/{r.nodes}" for r in rows if r.sshddp.noisy or r.srun.noisy],
    method=lambda sizes: METHOD.format(slurm=", ".join(map(str, sizes.slurm))),
)
