"""Case ``fetch``: ``sshddp fetch`` of a 50 MB file from each of 3 nodes, against OpenSSH
alone (``ssh hK cat FILE > local`` on every host at once).

A 1-second run leaves the file in its working directory (every lab host's workdir is on
this disk, so the three nodes share one file: three streams of the same 50 MB). sshddp is
timed from its start to its exit, verification included; each copy is checked against the
host's file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, BenchError, Stat, expect_rc, progress, stat
from sshddp_bench.logs import parallel_ssh

HOSTS = 3
MB = 50
NAME = "fetch.bin"


@dataclass(frozen=True)
class FetchSample:
    sshddp: float  #: seconds from `sshddp fetch` to its exit, every copy verified
    ssh: float  #: seconds for `ssh hK cat FILE > local` on every host at once
    rss_mb: float  #: sshddp's peak RSS
    cpu: float  #: sshddp's user+sys seconds


@dataclass(frozen=True)
class FetchRow:
    samples: tuple[FetchSample, ...]

    def stage(self, name: str) -> Stat:
        return stat([getattr(x, name) for x in self.samples])


def prepare(b: Bench) -> tuple[str, Path]:
    """A finished run of HOSTS nodes with NAME in its working directory: (run, the file)."""
    port, name = b.port(), b.name("fetch")
    inv = b.inventory(name, HOSTS, 1, port)
    expect_rc(b.start(b.launch_argv(name, port, inv, "latency")).finish(), 0, "sshddp launch")
    record = json.loads((b.tmp / "state" / "runs" / f"{name}.json").read_text())
    path = Path(record["nodes"][0]["cwd"]) / NAME
    with open(path, "wb") as fh:
        for _ in range(MB):
            fh.write(os.urandom(1 << 20))
    return name, path


def fetch_once(b: Bench, name: str, path: Path, digest: str) -> FetchSample:
    dest = b.tmp / "fetched"
    argv = [*b.sshddp, "fetch", "--ssh-config", b.ssh_config, name, NAME, str(dest)]
    done = expect_rc(b.start(argv, stdout_null=True).finish(), 0, "sshddp fetch")
    for k, host in enumerate(b.aliases(HOSTS)):
        got = dest / f"node{k}-{host}" / NAME
        if hashlib.sha256(got.read_bytes()).hexdigest() != digest:
            raise BenchError(f"{got}: not the host's {path}")
    shutil.rmtree(dest)
    outs = [b.tmp / f"ssh-{k}.bin" for k in range(HOSTS)]
    t0 = time.time()
    commands = [(h, f"cat {shlex.quote(str(path))}") for h in b.aliases(HOSTS)]
    ssh = parallel_ssh(b, commands, outs) - t0
    for out in outs:
        out.unlink()
    return FetchSample(done.wall, ssh, done.maxrss_mb, done.cpu)


def bench_fetch(b: Bench, reps: int) -> FetchRow:
    name, path = prepare(b)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    row = FetchRow(tuple(fetch_once(b, name, path, digest) for _ in range(reps)))
    progress(
        f"fetch {HOSTS} × {MB} MB: sshddp {row.stage('sshddp').fmt()} s, ssh cat "
        f"{row.stage('ssh').fmt()} s"
    )
    shutil.rmtree(b.tmp / "work" / name)
    return row


def fetch_table(r: FetchRow) -> list[str]:
    total = HOSTS * MB * 1.048576  # MB (10^6 bytes) in all
    rows = [
        (f"sshddp: `sshddp fetch RUN {NAME} DEST` (verified)", r.stage("sshddp")),
        (f"OpenSSH: {HOSTS} × `ssh hK cat {NAME} > file` at once", r.stage("ssh")),
    ]
    out = [f"| {HOSTS} nodes × {MB} MiB | seconds | MB/s in all |", "|---|---|---:|"]
    out += [f"| {text} | {s.fmt()} | {total / s.median:.0f} |" for text, s in rows]
    ratio = r.stage("sshddp").median / r.stage("ssh").median
    return out + [
        "",
        f"sshddp / ssh cat: {ratio:.2f}x (no target). Coordinator peak RSS "
        f"{r.stage('rss_mb').fmt(1, 0)} MB, CPU (user+sys) {r.stage('cpu').fmt()} s.",
    ]


def fetch_noisy(r: FetchRow) -> list[str]:
    return ["fetch"] if r.stage("sshddp").noisy or r.stage("ssh").noisy else []


METHOD = f"""\
* **fetch**: a 1-second run on {HOSTS} hosts, then a {MB} MiB file of random bytes in its
  working directory (the lab's hosts share one disk, so {HOSTS} streams of the same file).
  `sshddp fetch RUN {NAME} DEST` is timed from its start to its exit, with its stdout on
  `/dev/null`; every copy is then compared with the file. Baseline, OpenSSH alone: `ssh -F
  cfg hK cat <file>` to a local file on every host at once, from the first start to the
  last exit.
"""

CASE: Case[FetchRow] = Case(
    name="fetch",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_fetch(b, reps),
    title=lambda row: f"fetch, {HOSTS} nodes × {MB} MiB",
    table=fetch_table,
    noisy=fetch_noisy,
    method=lambda sizes: METHOD,
)
