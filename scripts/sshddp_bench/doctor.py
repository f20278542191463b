"""Case ``doctor``: ``sshddp doctor``'s deep probe against pdsh sending the same probe.

The baseline sends every host exactly the stdin header doctor sends it (from
``internals.probe_headers``), read from a file on the host, so both methods run the same
probe: pdsh measures what the same work costs without sshddp's coordinator.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench import internals
from sshddp_bench.case import Case
from sshddp_bench.harness import (
    Bench,
    BenchError,
    Finished,
    Stat,
    expect_rc,
    progress,
    stat,
    verdict,
)


@dataclass(frozen=True)
class DoctorRow:
    hosts: int
    sshddp: Stat
    pdsh: Stat
    cpu: Stat  #: sshddp process user+sys seconds
    pdsh_cpu: Stat  #: pdsh + its ssh clients
    rss: Stat


def probe_headers(b: Bench, inv: Path, port: int) -> tuple[Path, str]:
    """One stdin header file per host, exactly what doctor sends it, and the first host's
    name (it also listens)."""
    out = b.tmp / "probe" / inv.stem
    out.mkdir(parents=True, exist_ok=True)
    headers = internals.probe_headers(inv, b.ssh_config, port)
    for host, header in headers.items():
        (out / f"probe-{host}.hdr").write_bytes(header)
    return out, next(iter(headers))


def doctor_sshddp(b: Bench, n: int) -> Finished:
    port = b.port()
    inv = b.inventory(b.name("doctor"), n, 1, port)
    argv = [*b.sshddp, "doctor", "--ssh-config", b.ssh_config, "--port", str(port), str(inv)]
    return expect_rc(b.start(argv).finish(), 0, f"sshddp doctor ({n} hosts)")


def doctor_pdsh(b: Bench, n: int) -> Finished:
    """pdsh running the probe on every host; every host must answer, torch imported and
    the rendezvous port reached, or the comparison would flatter pdsh. A run where host 1
    began listening after another host's probe had stopped trying to connect (3 s; seen
    at 64 hosts, where 64 sessions start on 2 cores) is the baseline's own failure: it
    runs once more."""
    try:
        return _doctor_pdsh(b, n)
    except LateListener:
        return _doctor_pdsh(b, n)


class LateListener(BenchError):
    """pdsh's probe: the only bad answers are rendezvous connects that host 1 refused."""


def _doctor_pdsh(b: Bench, n: int) -> Finished:
    port = b.port()
    inv = b.inventory(b.name("doctor-pdsh"), n, 1, port)
    headers, first = probe_headers(b, inv, port)
    python = internals.python_command(sys.executable).removeprefix("exec ")  # a marker follows
    marks = b.tmp / "probe" / f"{inv.stem}-answered"
    shutil.rmtree(marks, ignore_errors=True)
    marks.mkdir(parents=True)
    hdr = f"{shlex.quote(str(headers))}/probe-%h.hdr"
    # Host 1's probe holds the rendezvous port only while its session reads stdin (doctor
    # holds it until every host answered): its stdin stays open until every other host's
    # probe ended (a marker each; the hosts share this machine's disk), at most 120 s.
    wait = (
        f"i=0; while [ $(ls {shlex.quote(str(marks))} | wc -l) -lt {n - 1} ]"
        " && [ $i -lt 6000 ]; do sleep 0.02; i=$((i+1)); done"
    )
    remote = (
        f"if [ %h = {first} ]; then (cat {hdr}; {wait}) | {python};"
        f" else {python} < {hdr}; touch {shlex.quote(str(marks))}/%h; fi"
    )
    argv = b.pdsh(n, remote)
    # every host at once, as doctor does (pdsh's fan-out is 32)
    argv[argv.index("-f") + 1] = str(max(n, int(argv[argv.index("-f") + 1])))
    done = expect_rc(b.start(argv).finish(), 0, f"pdsh probe ({n} hosts)")
    said = [t.split(": ", 1) for _, t in done.lines if re.match(r"h\d+: \{", t)]
    # each session's first line is its clock; then its probe's answer
    answers = {host: a for host, a in ((h, json.loads(t)) for h, t in said) if set(a) != {"clock"}}
    bad = {
        host: f"rendezvous {a['rendezvous']}, torch {a['torch'].get('error')}"
        for host, a in answers.items()
        if not a["rendezvous"]["ok"] or "error" in a["torch"]
    }
    if len(answers) - len(bad) != n:
        other = [t for _, t in done.lines if not re.match(r"h\d+: \{", t)]
        late = len(answers) == n and all("Connection refused" in why for why in bad.values())
        raise (LateListener if late else BenchError)(
            f"pdsh probe: {len(answers) - len(bad)} of {n} hosts answered well, "
            f"{len(answers)} answered; bad answers: {list(bad.items())[:5]}; "
            f"other lines: {other[:10]}"
        )
    return done


BIG = 64  #: from this many hosts on, at most BIG_REPS runs of each method (each ~1 min here)
BIG_REPS = 3


def doctor_row(b: Bench, n: int, reps: int) -> DoctorRow:
    """``reps`` runs of each method at ``n`` hosts (at most ``BIG_REPS`` from ``BIG``
    hosts on), which one goes first alternating."""
    runs: dict[str, list[Finished]] = {"sshddp": [], "pdsh": []}
    for rep in range(min(reps, BIG_REPS) if n >= BIG else reps):
        for method in ("sshddp", "pdsh") if rep % 2 == 0 else ("pdsh", "sshddp"):
            fn = doctor_sshddp if method == "sshddp" else doctor_pdsh
            runs[method].append(fn(b, n))
    s, p = runs["sshddp"], runs["pdsh"]
    return DoctorRow(
        n,
        stat([r.wall for r in s]),
        stat([r.wall for r in p]),
        stat([r.cpu for r in s]),
        stat([r.cpu for r in p]),
        stat([r.maxrss_mb for r in s]),
    )


def bench_doctor(b: Bench, sizes: Sequence[int], reps: int) -> list[DoctorRow]:
    rows = []
    for n in sizes:
        rows.append(doctor_row(b, n, reps))
        progress(
            f"doctor {n} hosts: sshddp {rows[-1].sshddp.fmt()} s, pdsh {rows[-1].pdsh.fmt()} s"
        )
    return rows


def doctor_line(r: DoctorRow) -> str:
    """One host count's row; the targets apply from 16 hosts on."""
    ratio = r.sshddp.median / r.pdsh.median
    per_host = r.cpu.median / r.hosts * 1000
    gate = r.hosts >= 16
    limit = 1.0 if r.hosts >= 32 else 1.2
    miss = f"{ratio:.2f}x, {(ratio - limit) / limit:.0%} over {limit}x"
    t1 = verdict(ratio <= limit, miss) if gate else "-"
    t2 = verdict(per_host < 50, f"{per_host - 50:.0f} ms over") if gate else "-"
    return (
        f"| {r.hosts} | {r.sshddp.fmt()} | {r.pdsh.fmt()} | {ratio:.2f}x | {t1} "
        f"| {r.cpu.fmt(1000, 0)} | {per_host:.0f} | {t2} | {r.pdsh_cpu.fmt(1000, 0)} "
        f"| {r.rss.median:.0f} |"
    )


def doctor_table(rows: Sequence[DoctorRow]) -> list[str]:
    out = [
        "| hosts | sshddp doctor (s) | pdsh, same probe (s) | ratio "
        "| target ≤ 1.2x at 16, ≤ 1.0x from 32 "
        "| sshddp CPU (ms) | CPU/host (ms) | target < 50 ms/host | pdsh+ssh CPU (ms) "
        "| sshddp peak RSS (MB) |",
        "|---:|---|---|---:|---|---|---:|---|---|---:|",
    ]
    out += [doctor_line(r) for r in rows]
    if len(rows) >= 2:
        a, z = rows[0], rows[-1]
        marginal = (z.cpu.median - a.cpu.median) / (z.hosts - a.hosts) * 1000
        out.append("")
        out.append(
            f"Marginal coordinator CPU per extra host ({a.hosts}→{z.hosts} hosts): "
            f"{marginal:.0f} ms; fixed cost (1 host, mostly interpreter start and "
            f"imports): {a.cpu.median * 1000:.0f} ms."
        )
    return out


def doctor_noisy(rows: Sequence[DoctorRow]) -> list[str]:
    return [f"doctor/{d.hosts}" for d in rows if d.sshddp.noisy or d.pdsh.noisy]


METHOD = """\
* **doctor**: `sshddp doctor --ssh-config cfg --port P inv.yaml` (deep probe: every host imports
  torch). Baseline: `pdsh -R exec -f N -w h1,..,hN ssh -F cfg %h 'PY -c BOOTSTRAP <
  DIR/probe-%h.hdr; touch MARKS/%h'`, where each header file holds exactly the bytes doctor
  sends that host (`shipped.header("host_session", {"probe": preflight.probe_args(...)})`, so
  host 1 also listens on the rendezvous port and every host connects to it) and BOOTSTRAP
  is `commands.python_command`. The header is read from a file on the host instead of over
  the SSH channel. Host 1's probe holds the port only while its stdin is open, so its
  stdin is the header followed by a wait until every other host's marker exists, as doctor
  holds it until every host answered. CPU is user+sys of the command and the children it
  reaped (`os.wait4`): sshddp has none, pdsh's include its `ssh` clients. pdsh's fan-out
  is the host count, as doctor's. From 64 hosts on, at most 3 runs of each method (a run
  of either takes about a minute there: 64 torch imports on 2 cores). A pdsh run whose only
  fault is that host 1 listened too late for other hosts' probes (they try to connect for
  3 s) runs once more, and the second run is the one timed.
"""

CASE: Case[list[DoctorRow]] = Case(
    name="doctor",
    hosts=lambda sizes: max(sizes.doctor),
    run=lambda b, sizes, reps: bench_doctor(b, sizes.doctor, reps),
    title=lambda rows: "doctor (deep probe)",
    table=doctor_table,
    noisy=doctor_noisy,
    method=lambda sizes: METHOD,
)
