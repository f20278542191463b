"""Case ``smoke``: ``sshddp smoke``'s all-reduce bus bandwidth against a plain torchrun
script doing the same all-reduces on the same hosts (gloo on CPU).

The baseline starts torchrun on every host through pdsh (static rendezvous on host 1, the
same node ranks, processes and sizes), running ``scripts/payloads/plain_allreduce.py``.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, BenchError, Stat, expect_rc, progress, stat, verdict

HOSTS, NPROC = 3, 2
SIZES = (1 << 16, 1 << 20, 1 << 22, 1 << 24)  # 64 KiB .. 16 MiB
ITERS, WARMUP = 20, 5
TARGET = 0.1  #: smoke's bus bandwidth within 10% of the plain script's, either way
PLAIN = Path(__file__).resolve().parent.parent / "payloads" / "plain_allreduce.py"


@dataclass(frozen=True)
class SmokeRow:
    size: int
    smoke: Stat  #: GB/s
    plain: Stat  #: GB/s


def smoke_once(b: Bench) -> dict[int, float]:
    port = b.port()
    inv = b.inventory(b.name("smoke"), HOSTS, NPROC, port)
    argv = [*b.sshddp, "smoke", "--json", "--ssh-config", b.ssh_config]
    argv += ["--log-dir", str(b.tmp / "logs"), "--iters", str(ITERS), "--p2p-size", "64K"]
    argv += ["--sizes", ",".join(map(str, SIZES)), str(inv)]
    done = expect_rc(b.start(argv).finish(), 0, "sshddp smoke")
    found = json.loads("\n".join(t for _, t in done.lines))
    return {r["bytes"]: r["busbw_gbps"] for r in found["allreduce"]}


def plain_once(b: Bench) -> dict[int, float]:
    port = b.port()
    addr = b.cluster.hosts[0].addr
    scripts = b.tmp / "plain" / str(port)
    scripts.mkdir(parents=True)
    for rank, alias in enumerate(b.aliases(HOSTS)):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS)]
        torchrun += ["--node-rank", str(rank), "--nproc-per-node", str(NPROC)]
        torchrun += ["--rdzv-backend", "static", "--rdzv-endpoint", f"{addr}:{port}"]
        torchrun += [str(PLAIN), ",".join(map(str, SIZES)), str(ITERS), str(WARMUP)]
        line = f"exec env GLOO_SOCKET_IFNAME=lo {shlex.join(torchrun)}\n"
        (scripts / f"node-{alias}.sh").write_text(line)
    done = expect_rc(b.start(b.pdsh(HOSTS, f"sh {scripts}/node-%h.sh")).finish(), 0, "plain")
    rows = [json.loads(t.split(": ", 1)[1]) for _, t in done.lines if '"plain"' in t]
    if len(rows) != len(SIZES):
        raise BenchError(f"plain all-reduce: {len(rows)} of {len(SIZES)} sizes: {done.lines}")
    return {r["bytes"]: r["busbw_gbps"] for r in rows}


def bench_smoke(b: Bench, reps: int) -> list[SmokeRow]:
    runs: dict[str, list[dict[int, float]]] = {"smoke": [], "plain": []}
    for rep in range(reps):
        for method in ("smoke", "plain") if rep % 2 == 0 else ("plain", "smoke"):
            runs[method].append((smoke_once if method == "smoke" else plain_once)(b))
    rows = [
        SmokeRow(
            size, stat([r[size] for r in runs["smoke"]]), stat([r[size] for r in runs["plain"]])
        )
        for size in SIZES
    ]
    top = rows[-1]
    progress(f"smoke busbw at 16 MiB: {top.smoke.fmt(1, 3)} GB/s, plain {top.plain.fmt(1, 3)}")
    return rows


def smoke_table(rows: list[SmokeRow]) -> list[str]:
    out = [
        "| size | sshddp smoke busbw (GB/s) | plain torchrun busbw (GB/s) | ratio "
        "| target 0.9x–1.1x at 16 MiB |",
        "|---:|---|---|---:|---|",
    ]
    for r in rows:
        ratio = r.smoke.median / r.plain.median
        gate = r.size == SIZES[-1]
        miss = f"{ratio:.2f}x, {abs(ratio - 1):.0%} off"
        out.append(
            f"| {r.size >> 10} KiB | {r.smoke.fmt(1, 3)} | {r.plain.fmt(1, 3)} | {ratio:.2f}x "
            f"| {verdict(abs(ratio - 1) <= TARGET, miss) if gate else '-'} |"
        )
    return out


METHOD = f"""\
* **smoke**: `sshddp smoke --json --iters {ITERS} --sizes 64K,1M,4M,16M` on {HOSTS} hosts x
  {NPROC} processes (gloo on loopback) against `scripts/payloads/plain_allreduce.py` under
  torchrun on the same hosts, started by pdsh (static rendezvous, the same sizes, {WARMUP}
  warm-up and {ITERS} timed all-reduces each, the slowest rank's mean). Bus bandwidth as
  nccl-tests define it: bytes / time x 2 (n - 1) / n. The target applies at 16 MiB, where
  bandwidth, not latency, sets the time.
"""

CASE: Case[list[SmokeRow]] = Case(
    name="smoke",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_smoke(b, reps),
    title=lambda rows: f"smoke: all-reduce bus bandwidth on CPU, {HOSTS} hosts x {NPROC}",
    table=smoke_table,
    noisy=lambda rows: [f"smoke/{r.size >> 10}K" for r in rows if r.smoke.noisy or r.plain.noisy],
    method=lambda sizes: METHOD,
)
