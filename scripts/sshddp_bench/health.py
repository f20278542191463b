"""Case ``health``: ``sshddp doctor --health`` against ``sshddp doctor`` on the same hosts.

The hosts are CPU hosts (loopback sshd servers): what ``--health`` adds there is its looks
for GPUs, the kernel log and InfiniBand ports, each finding nothing, so the case measures
what the option costs a fleet without that hardware. The target is 1.2x at 16 hosts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, Finished, Stat, expect_rc, progress, stat, verdict

HOSTS = 16
LIMIT = 1.2  #: doctor --health's wall time over doctor's, at most


@dataclass(frozen=True)
class HealthRow:
    hosts: int
    doctor: Stat  #: wall seconds of `sshddp doctor`
    health: Stat  #: wall seconds of `sshddp doctor --health`


def _doctor(b: Bench, n: int, health: bool) -> Finished:
    port = b.port()
    inv = b.inventory(b.name("health" if health else "doctor"), n, 1, port)
    extra = ["--health"] if health else []
    argv = [*b.sshddp, "doctor", "--ssh-config", b.ssh_config, "--port", str(port), *extra]
    what = f"sshddp doctor{' --health' if health else ''} ({n} hosts)"
    return expect_rc(b.start([*argv, str(inv)]).finish(), 0, what)


def bench_health(b: Bench, reps: int) -> list[HealthRow]:
    """``reps`` runs of each at ``HOSTS`` hosts, which one goes first alternating."""
    runs: dict[bool, list[Finished]] = {False: [], True: []}
    for rep in range(reps):
        for health in (False, True) if rep % 2 == 0 else (True, False):
            runs[health].append(_doctor(b, HOSTS, health))
    row = HealthRow(HOSTS, stat([r.wall for r in runs[False]]), stat([r.wall for r in runs[True]]))
    progress(f"health {HOSTS} hosts: doctor {row.doctor.fmt()} s, --health {row.health.fmt()} s")
    return [row]


def health_table(rows: Sequence[HealthRow]) -> list[str]:
    out = [
        "| hosts | doctor (s) | doctor --health (s) | ratio | target: ≤ 1.2x |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r.health.median / r.doctor.median
        miss = f"{ratio:.2f}x, {(ratio - LIMIT) / LIMIT:.0%} over {LIMIT}x"
        out.append(
            f"| {r.hosts} | {r.doctor.fmt()} | {r.health.fmt()} | {ratio:.2f}x "
            f"| {verdict(ratio <= LIMIT, miss)} |"
        )
    return out


METHOD = """\
* **health**: `sshddp doctor --ssh-config cfg --port P [--health] inv.yaml` on 16 CPU hosts,
  the two alternating which goes first; the inventory has no `health:` command, so
  `--health`'s cost is its looks for GPUs (nvidia-smi on PATH, /proc/driver/nvidia), the
  kernel log (read only where there are NVIDIA GPUs) and InfiniBand ports, all finding none.
"""

CASE: Case[list[HealthRow]] = Case(
    name="health",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_health(b, reps),
    title=lambda rows: "doctor --health against doctor",
    table=health_table,
    noisy=lambda rows: [f"health/{r.hosts}" for r in rows if r.doctor.noisy or r.health.noisy],
    method=lambda sizes: METHOD,
)
