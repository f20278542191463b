"""Case ``exec``: ``sshddp exec -- true`` on every host against ``pdsh -w ... true``.

Both open one SSH connection per host (sshddp through paramiko in one process, pdsh through
one OpenSSH client per host), run ``true`` and collect every exit status; the hosts are the
scale case's count (``--scale-hosts``, 32 by default).
"""

from __future__ import annotations

from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, Finished, Stat, expect_rc, progress, stat, verdict

TARGET = 1.0  #: sshddp exec's wall time over pdsh's


@dataclass(frozen=True)
class ExecRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    cpu: Stat  #: sshddp's user+sys seconds
    pdsh_cpu: Stat  #: pdsh and its ssh clients


def exec_sshddp(b: Bench, n: int) -> Finished:
    hosts = ",".join(b.aliases(n))
    argv = [*b.sshddp, "exec", "--ssh-config", b.ssh_config, "-H", hosts, "--", "true"]
    return expect_rc(b.start(argv).finish(), 0, f"sshddp exec ({n} hosts)")


def exec_pdsh(b: Bench, n: int) -> Finished:
    return expect_rc(b.start(b.pdsh(n, "true")).finish(), 0, f"pdsh true ({n} hosts)")


def bench_exec(b: Bench, n: int, reps: int) -> ExecRow:
    """``reps`` runs of each, which one goes first alternating."""
    runs: dict[str, list[Finished]] = {"sshddp": [], "pdsh": []}
    for rep in range(reps):
        for method in ("sshddp", "pdsh") if rep % 2 == 0 else ("pdsh", "sshddp"):
            runs[method].append((exec_sshddp if method == "sshddp" else exec_pdsh)(b, n))
    s, p = runs["sshddp"], runs["pdsh"]
    row = ExecRow(
        n,
        stat([r.wall for r in s]),
        stat([r.wall for r in p]),
        stat([r.cpu for r in s]),
        stat([r.cpu for r in p]),
    )
    progress(f"exec {n} hosts: sshddp {row.sshddp.fmt()} s, pdsh {row.pdsh.fmt()} s")
    return row


def exec_table(r: ExecRow) -> list[str]:
    ratio = r.sshddp.median / r.pdsh.median
    miss = f"{ratio:.2f}x, {(ratio - TARGET) / TARGET:.0%} over {TARGET}x"
    return [
        "| hosts | sshddp exec -- true (s) | pdsh -w ... true (s) | ratio | target ≤ 1.0x "
        "| sshddp CPU (ms) | pdsh+ssh CPU (ms) |",
        "|---:|---|---|---:|---|---|---|",
        f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {ratio:.2f}x "
        f"| {verdict(ratio <= TARGET, miss)} | {r.cpu.fmt(1000, 0)} | {r.pdsh_cpu.fmt(1000, 0)} |",
    ]


METHOD = """\
* **exec**: `sshddp exec --ssh-config cfg -H h1,..,hN -- true` against `pdsh -R exec -f 32
  -w h1,..,hN ssh -F cfg %h true`, N = `--scale-hosts`; both must exit 0. sshddp connects
  through paramiko in one process (fan-out 32); pdsh starts one OpenSSH client per host.
"""

CASE: Case[ExecRow] = Case(
    name="exec",
    hosts=lambda sizes: sizes.scale,
    run=lambda b, sizes, reps: bench_exec(b, sizes.scale, reps),
    title=lambda row: f"exec `true` on {row.hosts} hosts",
    table=exec_table,
    noisy=lambda row: [f"exec/{row.hosts}"] if row.sshddp.noisy or row.pdsh.noisy else [],
    method=lambda sizes: METHOD,
)
