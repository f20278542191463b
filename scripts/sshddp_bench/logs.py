"""Cases ``logs`` and ``logs8``: how fast a flood of rank output reaches the local log files.

``logs``: one rank writes ``--logs-mb`` MB (200 by default). ``logs8``: one rank on each of
``--logs-hosts`` hosts (8) writes 20 MB at once. sshddp runs with its stdout on /dev/null and
is timed from the rank's START line to the local copy's final size; the baselines are
OpenSSH alone: ``ssh cat`` of the same files, and ssh running the same writer.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    RUN_TIMEOUT_S,
    Bench,
    BenchError,
    Finished,
    Stat,
    Watched,
    expect_rc,
    progress,
    read_tail,
    run_dir,
    sizes_until_exit,
    stamp,
    stat,
    verdict,
)

L8_MB = 20  # MB each host's rank prints in the many-hosts log case
CAT_RATIO = 1.2  #: target: one rank's log here within this of `ssh cat` (issue 16; 2x before)
RSS8_MB = 100  #: target: coordinator peak RSS in the many-hosts case (issue 16)


class _Stages:
    """Medians of a log case's samples, stage by stage."""

    samples: Sequence[Any]

    def stage(self, name: str) -> Stat:
        return stat([getattr(x, name) for x in self.samples])

    @property
    def lag(self) -> Stat:
        """END written at the host(s) to the local copies complete."""
        return stat([x.total - x.writer for x in self.samples])


def head_stamp(path: Path, word: str) -> float:
    """The time on a log's ``WORD <time>`` line among its first 4 KiB (its START line)."""
    with open(path, "rb") as fh:
        return stamp(fh.read(4096).decode("utf-8", "replace"), word)


def writer_command(b: Bench, mb: int) -> str:
    """The remote command that runs the rank's flood without sshddp."""
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(b.rank_script))} flood {mb}"


# --------------------------------------------------------------------------- one rank


@dataclass(frozen=True)
class LogSample:
    total: float  #: rank's START to the local log file complete
    writer: float  #: rank's START to END: its writes through the node's pipe into node.log
    cat: float  #: ssh cat of the remote node.log to /dev/null
    direct: float  #: ssh running the same writer, its stdout to a local file
    rss_mb: float  #: sshddp's peak RSS
    cpu: float  #: sshddp's user+sys seconds
    shown: float  #: as ``total``, sshddp's stdout to a file: every line prefixed on it


@dataclass(frozen=True)
class LogRow(_Stages):
    mb: int
    samples: tuple[LogSample, ...]


def size_when_complete(path: Path, proc: Watched) -> list[tuple[float, int]]:
    """(time.time(), size) of the local log every 10 ms until the command exits."""
    return [(t, sizes[0]) for t, sizes in sizes_until_exit([path], proc)]


def flood_once(b: Bench, mb: int, shown: bool) -> tuple[float, float, Finished, Path]:
    """One sshddp launch of a ``mb`` MB flood, its stdout to /dev/null or (``shown``) to a
    file: START to the local log complete, START to END, how it ended, the host's node.log."""
    port, name = b.port(), b.name("log")
    inv = b.inventory(name, 1, 1, port)
    local = b.tmp / "logs" / name / "node0-h1.log"
    argv = b.launch_argv(name, port, inv, "flood", str(mb))
    with open(b.tmp / "console.out", "wb") as console:
        proc = b.start(argv, stdout_null=not shown, stdout_to=console if shown else None)
        samples = size_when_complete(local, proc)
        done = expect_rc(proc.finish(), 0, "sshddp launch (flood)")
    final = samples[-1][1]
    complete_at = next(t for t, size in samples if size == final)
    start = head_stamp(local, "START")
    end = stamp(read_tail(local), "END")
    remote = run_dir(b, name, 0) / "node.log"
    if remote.stat().st_size != final:
        raise BenchError(f"local log {final} bytes, remote node.log {remote.stat().st_size}")
    local.unlink()
    (b.tmp / "console.out").unlink()
    return complete_at - start, end - start, done, remote


def log_once(b: Bench, mb: int) -> LogSample:
    total, writer, done, remote = flood_once(b, mb, False)
    cat, direct = ssh_cat(b, remote), ssh_direct(b, mb)
    shutil.rmtree(remote.parents[3])  # work/NAME: 2 copies of the log per repetition otherwise
    shown, _, _, remote = flood_once(b, mb, True)
    shutil.rmtree(remote.parents[3])
    return LogSample(total, writer, cat, direct, done.maxrss_mb, done.cpu, shown)


def ssh_cat(b: Bench, remote: Path) -> float:
    argv = ["ssh", "-F", b.ssh_config, "h1", f"cat {shlex.quote(str(remote))}"]
    return expect_rc(b.start(argv, stdout_null=True).finish(), 0, "ssh cat").wall


def ssh_direct(b: Bench, mb: int) -> float:
    """OpenSSH alone streaming the same writer into a local file: START to ssh's exit."""
    out = b.tmp / "direct.log"
    with open(out, "wb") as fh:
        subprocess.run(
            ["ssh", "-F", b.ssh_config, "h1", writer_command(b, mb)],
            stdout=fh,
            check=True,
            stdin=subprocess.DEVNULL,
            env=b.env,
            timeout=RUN_TIMEOUT_S,
        )
        ended = time.time()
    start = head_stamp(out, "START")
    out.unlink()
    return ended - start


def bench_logs(b: Bench, mb: int, reps: int) -> LogRow:
    row = LogRow(mb, tuple(log_once(b, mb) for _ in range(reps)))
    progress(f"logs {mb} MB: sshddp {row.stage('total').fmt()} s, cat {row.stage('cat').fmt()} s")
    return row


def log_table(r: LogRow) -> list[str]:
    total, cat, rss, shown = (r.stage(x) for x in ("total", "cat", "rss_mb", "shown"))
    ratio = total.median / cat.median
    rows = [
        ("sshddp: rank's first byte → local log complete", total),
        ("… the rank's writes into node.log (START → END)", r.stage("writer")),
        ("… END at the host → local copy complete (follower, SSH, coordinator)", r.lag),
        ("sshddp, its stdout to a file (every line prefixed): → local log complete", shown),
        ("OpenSSH: `ssh h1 cat node.log > /dev/null` (after the run)", cat),
        (
            "OpenSSH: `ssh h1 python rank.py flood > file` (same writer, no sshddp)",
            r.stage("direct"),
        ),
    ]
    out = [f"| {r.mb} MB from one rank | seconds | MB/s |", "|---|---|---:|"]
    out += [f"| {text} | {s.fmt()} | {r.mb / s.median:.0f} |" for text, s in rows]
    over = f"{ratio:.2f}x, {(ratio - CAT_RATIO) / CAT_RATIO:.0%} over"
    return out + [
        "",
        f"sshddp / ssh cat: {ratio:.2f}x — target ≤ {CAT_RATIO}x: "
        f"{verdict(ratio <= CAT_RATIO, over)}. With its stdout to a file, where "
        f"the console prefixes every line: {shown.median / cat.median:.2f}x (no target).",
        f"Coordinator peak RSS {rss.fmt(1, 0)} MB — target < 200 MB: "
        f"{verdict(rss.median < 200, f'{rss.median - 200:.0f} MB over')}. "
        f"Coordinator CPU {r.stage('cpu').fmt()} s.",
    ]


def log_noisy(r: LogRow) -> list[str]:
    return ["logs"] if r.stage("total").noisy or r.stage("cat").noisy else []


LOGS_METHOD = """\
* **logs**: one rank writes {mb} MB (1 MiB `write`s of 64-byte printable lines) to stdout; sshddp
  runs with its stdout redirected to `/dev/null` (printing 200 MB to a terminal would
  dominate) and is timed from the rank's `START` timestamp until the local
  `sshddp-logs/<run>/node0-h1.log` reached its final size (polled every 10 ms; the byte count
  is checked against the host's `node.log`). A console that goes to `/dev/null` is not
  formatted, so the same launch runs again with its stdout to a file, every line prefixed
  there (no target). Baselines: `ssh -F cfg h1 cat <node.log>` to
  `/dev/null` after the run, and ssh running the same writer with stdout to a local file.
  Peak RSS is the sshddp process's `VmHWM` (/proc/<pid>/status, polled every 10 ms).
"""

LOGS: Case[LogRow] = Case(
    name="logs",
    hosts=lambda sizes: 1,
    run=lambda b, sizes, reps: bench_logs(b, sizes.mb, reps),
    title=lambda row: "Log throughput, one rank",
    table=log_table,
    noisy=log_noisy,
    method=lambda sizes: LOGS_METHOD.format(mb=sizes.mb),
)


# --------------------------------------------------------------------------- many hosts


@dataclass(frozen=True)
class Log8Sample:
    total: float  #: first rank's START to every local log complete
    writer: float  #: first START to the last END: the ranks' writes into node.log
    cat: float  #: parallel ssh cat of every host's node.log to /dev/null
    #: parallel ssh running the writer, each to a local file: first START to last exit
    direct: float
    rss_mb: float  #: sshddp's peak RSS
    cpu: float  #: sshddp's user+sys seconds


@dataclass(frozen=True)
class Log8Row(_Stages):
    hosts: int
    mb: int  #: per host
    samples: tuple[Log8Sample, ...]


def parallel_ssh(b: Bench, commands: Sequence[tuple[str, str]], outs: Sequence[Path]) -> float:
    """``ssh host cmd > out`` for every (host, cmd) at once; time.time() once all exited."""
    procs = []
    for (host, cmd), out in zip(commands, outs):
        with open(out, "wb") as fh:
            procs.append(
                subprocess.Popen(
                    ["ssh", "-F", b.ssh_config, host, cmd],
                    stdin=subprocess.DEVNULL,
                    stdout=fh,
                    env=b.env,
                    start_new_session=True,
                )
            )
    for (host, cmd), proc in zip(commands, procs):
        if proc.wait(timeout=RUN_TIMEOUT_S) != 0:
            raise BenchError(f"ssh {host} {cmd}: exit status {proc.returncode}")
    return time.time()


def parallel_cat(b: Bench, hosts: Sequence[str], remote: Sequence[Path]) -> float:
    """Seconds for ``ssh hK cat node.log > /dev/null`` on every host at once."""
    sink = [Path(os.devnull)] * len(hosts)
    t0 = time.time()
    commands = [(h, f"cat {shlex.quote(str(p))}") for h, p in zip(hosts, remote)]
    return parallel_ssh(b, commands, sink) - t0


def parallel_writers(b: Bench, hosts: Sequence[str], mb: int) -> float:
    """ssh running the writer on every host at once, each to a local file: seconds from
    the first START to the last ssh's exit."""
    outs = [b.tmp / f"direct-{k}.log" for k in range(len(hosts))]
    ended = parallel_ssh(b, [(h, writer_command(b, mb)) for h in hosts], outs)
    first = min(head_stamp(p, "START") for p in outs)
    for path in outs:
        path.unlink()
    return ended - first


def check_copies(remote: Sequence[Path], final: Sequence[int]) -> None:
    """Every local log ended as long as its host's node.log."""
    for k, path in enumerate(remote):
        if path.stat().st_size != final[k]:
            raise BenchError(
                f"node {k}: local log {final[k]} bytes, node.log {path.stat().st_size}"
            )


def logs8_once(b: Bench, n: int, mb: int) -> Log8Sample:
    port, name = b.port(), b.name("log8")
    inv = b.inventory(name, n, 1, port)
    hosts = b.aliases(n)
    local = [b.tmp / "logs" / name / f"node{k}-{h}.log" for k, h in enumerate(hosts)]
    argv = b.launch_argv(name, port, inv, "flood", str(mb), "all")
    proc = b.start(argv, stdout_null=True)
    samples = sizes_until_exit(local, proc)
    done = expect_rc(proc.finish(), 0, f"sshddp launch (flood, {n} hosts)")
    final = samples[-1][1]
    complete = [next(t for t, sizes in samples if sizes[k] == final[k]) for k in range(n)]
    starts = [head_stamp(path, "START") for path in local]
    ends = [stamp(read_tail(path), "END") for path in local]
    remote = [run_dir(b, name, k) / "node.log" for k in range(n)]
    check_copies(remote, final)
    # Baselines: OpenSSH alone, every host at once.
    cat = parallel_cat(b, hosts, remote)
    shutil.rmtree(b.tmp / "work" / name)
    shutil.rmtree(b.tmp / "logs" / name)
    return Log8Sample(
        total=max(complete) - min(starts),
        writer=max(ends) - min(starts),
        cat=cat,
        direct=parallel_writers(b, hosts, mb),
        rss_mb=done.maxrss_mb,
        cpu=done.cpu,
    )


def bench_logs8(b: Bench, n: int, mb: int, reps: int) -> Log8Row:
    row = Log8Row(n, mb, tuple(logs8_once(b, n, mb) for _ in range(reps)))
    progress(
        f"logs {n} hosts × {mb} MB: sshddp {row.stage('total').fmt()} s, "
        f"ssh writers {row.stage('direct').fmt()} s, RSS {row.stage('rss_mb').fmt(1, 0)} MB"
    )
    return row


def logs8_table(r: Log8Row) -> list[str]:
    total = r.hosts * r.mb
    rows = [
        ("sshddp: first rank's START → every local log complete", r.stage("total")),
        (
            "… the ranks' writes through the nodes' pipes into node.log (first START → last END)",
            r.stage("writer"),
        ),
        ("… last END → every local copy complete (followers, SSH, coordinator)", r.lag),
        (
            f"OpenSSH: {r.hosts} × `ssh hK cat node.log > /dev/null` at once (after the run)",
            r.stage("cat"),
        ),
        (
            f"OpenSSH: {r.hosts} × `ssh hK python rank.py flood > file` at once (same writers)",
            r.stage("direct"),
        ),
    ]
    out = [
        f"| {r.hosts} hosts × {r.mb} MB, one rank each | seconds | MB/s in all |",
        "|---|---|---:|",
    ]
    out += [f"| {text} | {s.fmt()} | {total / s.median:.0f} |" for text, s in rows]
    ratio = r.stage("total").median / r.stage("direct").median
    rss = r.stage("rss_mb")
    return out + [
        "",
        f"sshddp / ssh running the writers: {ratio:.2f}x (no target). Coordinator peak RSS "
        f"{rss.fmt(1, 0)} MB — target ≤ {RSS8_MB} MB: "
        f"{verdict(rss.median <= RSS8_MB, f'{rss.median - RSS8_MB:.0f} MB over')}; "
        f"CPU (user+sys) {r.stage('cpu').fmt()} s.",
    ]


def logs8_noisy(r: Log8Row) -> list[str]:
    return ["logs8"] if r.stage("total").noisy or r.stage("direct").noisy else []


LOGS8_METHOD = """\
* **logs, {l8_hosts} hosts**: one rank on each of {l8_hosts} hosts writes {l8_mb} MB as above, all
  at once; sshddp's stdout goes to `/dev/null`. Timed from the earliest `START` timestamp
  until every local `node<K>-<host>.log` reached its final size (all polled every 10 ms;
  each checked against its host's `node.log`). Coordinator CPU (user+sys, `os.wait4`) and
  peak RSS (`VmHWM`) as above. Baselines, OpenSSH alone, {l8_hosts} connections at once: `ssh
  hK cat <node.log>` of the same files to `/dev/null` (after the run), and ssh running the
  same writer on every host with stdout to local files, from the earliest `START` to the
  last ssh's exit.
"""

LOGS8: Case[Log8Row] = Case(
    name="logs8",
    hosts=lambda sizes: sizes.logs8_hosts,
    run=lambda b, sizes, reps: bench_logs8(b, sizes.logs8_hosts, sizes.logs8_mb, reps),
    title=lambda row: f"Log throughput, {row.hosts} hosts at once",
    table=logs8_table,
    noisy=logs8_noisy,
    method=lambda sizes: LOGS8_METHOD.format(l8_hosts=sizes.logs8_hosts, l8_mb=sizes.logs8_mb),
)
