"""Case ``scale32``: the coordinator's peak memory and threads while attached to many hosts
(``--scale-hosts``, 32 by default). No baseline: it measures sshddp's own footprint."""

from __future__ import annotations

from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    Bench,
    BenchError,
    ReadyWatch,
    Stat,
    expect_rc,
    progress,
    stat,
    verdict,
)


@dataclass(frozen=True)
class ScaleSample:
    rss_mb: float  #: coordinator peak RSS (VmHWM)
    threads: int  #: the coordinator's most threads at once
    ready: float  #: start to every rank's READY
    wall: float  #: start to exit
    cpu: float  #: coordinator user+sys seconds


@dataclass(frozen=True)
class ScaleRow:
    hosts: int
    samples: tuple[ScaleSample, ...]

    def stage(self, name: str) -> Stat:
        return stat([float(getattr(x, name)) for x in self.samples])


def scale_once(b: Bench, n: int) -> ScaleSample:
    port, name = b.port(), b.name("scale")
    inv = b.inventory(name, n, 1, port)
    watch = ReadyWatch(n)
    proc = b.start(b.launch_argv(name, port, inv, "latency"), on_line=watch)
    done = expect_rc(proc.finish(), 0, f"sshddp launch ({n} hosts)")
    if watch.all_at is None:
        raise BenchError(f"scale: only ranks {sorted(watch.ranks)} of {n} printed READY")
    return ScaleSample(done.maxrss_mb, done.threads, watch.all_at - proc.t0, done.wall, done.cpu)


def bench_scale(b: Bench, n: int, reps: int) -> ScaleRow:
    row = ScaleRow(n, tuple(scale_once(b, n) for _ in range(reps)))
    progress(
        f"scale {n} hosts: RSS {row.stage('rss_mb').fmt(1, 0)} MB, "
        f"threads {row.stage('threads').fmt(1, 0)}"
    )
    return row


def scale_table(r: ScaleRow) -> list[str]:
    rss = r.stage("rss_mb")
    # The 150 MB target is for 32 hosts; a smaller run says so instead of passing it.
    target = (
        verdict(rss.median < 150, f"{rss.median:.0f} MB, {rss.median - 150:.0f} MB over")
        if r.hosts >= 32
        else f"not measured ({r.hosts} hosts only)"
    )
    return [
        f"`sshddp launch` attached to {r.hosts} hosts × 1 process; each rank prints READY, "
        "sleeps 1 s and exits 0. Sampled from the coordinator's /proc/<pid>/status every "
        "10 ms for the whole run:",
        "",
        "| | median (min–max) |",
        "|---|---|",
        f"| coordinator peak RSS (VmHWM, MB) | {rss.fmt(1, 0)} |",
        f"| coordinator threads, most at once | {r.stage('threads').fmt(1, 0)} |",
        f"| coordinator CPU, user+sys (s) | {r.stage('cpu').fmt()} |",
        f"| start → every rank's READY (s) | {r.stage('ready').fmt()} |",
        f"| start → sshddp exited (s) | {r.stage('wall').fmt()} |",
        "",
        f"Target: coordinator under 150 MB at 32 hosts: {target}.",
    ]


def scale_noisy(r: ScaleRow) -> list[str]:
    return ["scale"] if r.stage("rss_mb").noisy else []


METHOD = """\
* **scale**: `sshddp launch` attached to {scale} hosts × 1 process of the launch job (READY,
  sleep 1 s, exit 0). The coordinator's `VmHWM` and `Threads` are read from
  /proc/<pid>/status every 10 ms from start to exit; the table gives the peak and the most
  threads. No baseline.
"""

CASE: Case[ScaleRow] = Case(
    name="scale32",
    hosts=lambda sizes: sizes.scale,
    run=lambda b, sizes, reps: bench_scale(b, sizes.scale, reps),
    title=lambda row: f"Coordinator memory and threads at {row.hosts} hosts",
    table=scale_table,
    noisy=scale_noisy,
    method=lambda sizes: METHOD.format(scale=sizes.scale),
)
