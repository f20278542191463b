"""Case ``ps``: ``sshddp ps --all`` over many runs that ended while no coordinator watched.

``PS_RUNS`` detached runs on ``PS_HOSTS`` hosts end on their own, so the registry holds no
end for any of them. Then, from that same registry each time: ``ps`` with one host hung
(its sshd SIGSTOPped: TCP is accepted, SSH never answers), ``ps`` asking every host (it
records every end), and ``ps`` again (the ends recorded: no host is asked). The baseline
reads every run directory's ``exit.json`` with one pdsh over OpenSSH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from dataclasses import dataclass

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
    RUN_TIMEOUT_S,
    Bench,
    BenchError,
    Stat,
    Watched,
    expect_rc,
    progress,
    run_dir,
    stat,
    verdict,
)

PS_RUNS, PS_HOSTS = 30, 2
PS_BATCH = 6  # detached launches started at once
PS_CONNECT_TIMEOUT = 2.0  # --connect-timeout of the hung-host ps
PS_HUNG_TARGET = PS_CONNECT_TIMEOUT + 10 + 5  # the deadline (timeout + 10 s) and start-up


@dataclass(frozen=True)
class PsRow:
    hung: tuple[float, ...]  #: ps --all with one host hung (seconds)
    cold: tuple[float, ...]  #: ps --all asking every host, recording every end
    warm: tuple[float, ...]  #: ps --all again, every end recorded
    pdsh: tuple[float, ...]  #: one pdsh cat of every exit.json

    def stage(self, name: str) -> Stat:
        return stat(list(getattr(self, name)))


def make_runs(b: Bench, env: dict[str, str]) -> list[str]:
    """PS_RUNS detached runs that end after about a second, PS_BATCH launched at once."""
    names = [b.name("ps") for _ in range(PS_RUNS)]
    for first in range(0, PS_RUNS, PS_BATCH):
        started = []
        for name in names[first : first + PS_BATCH]:
            port = b.port()
            argv = b.launch_argv(name, port, b.inventory(name, PS_HOSTS, 1, port), "latency")
            started.append(Watched([*argv[:2], "--detach", *argv[2:]], env, b.tmp))
        for proc in started:
            expect_rc(proc.finish(), 0, "sshddp launch --detach (ps)")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    for name in names:  # every run has ended on every host
        for node in range(PS_HOSTS):
            while not (run_dir(b, name, node) / "exit.json").exists():
                if time.monotonic() > deadline:
                    raise BenchError(f"{name}: node {node} did not end")
                time.sleep(0.1)
    return names


def timed_ps(b: Bench, env: dict[str, str], *options: str) -> float:
    done = expect_rc(
        Watched([*b.sshddp, "ps", "--all", *options], env, b.tmp, stdout_null=True).finish(),
        0,
        "sshddp ps --all",
    )
    return done.wall


def bench_ps(b: Bench, reps: int) -> PsRow:
    state = b.tmp / "ps-state"
    env = {**b.env, "SSHDDP_STATE_DIR": str(state), "SSHDDP_SSH_CONFIG": b.ssh_config}
    names = make_runs(b, env)
    unrecorded = b.tmp / "ps-registry"
    shutil.copytree(state / "runs", unrecorded)
    pdsh_cmd = "cat " + " ".join(f"{b.tmp}/work/{n}/runs/{n}/n*/exit.json" for n in names)
    times: dict[str, list[float]] = {"hung": [], "cold": [], "warm": [], "pdsh": []}
    sshd = b.cluster.sshd_pid(PS_HOSTS)
    assert sshd is not None
    for _ in range(reps):
        for stage in ("hung", "cold"):
            shutil.rmtree(state / "runs")
            shutil.copytree(unrecorded, state / "runs")
            if stage == "hung":
                os.kill(sshd, signal.SIGSTOP)
            try:
                times[stage].append(
                    timed_ps(b, env, "--connect-timeout", f"{PS_CONNECT_TIMEOUT:g}")
                )
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(sshd, signal.SIGCONT)
        times["warm"].append(timed_ps(b, env))
        pdsh = Watched(b.pdsh(PS_HOSTS, pdsh_cmd), env, b.tmp, stdout_null=True).finish()
        times["pdsh"].append(expect_rc(pdsh, 0, "pdsh cat exit.json").wall)
    row = PsRow(*(tuple(times[k]) for k in ("hung", "cold", "warm", "pdsh")))
    progress(
        f"ps over {PS_RUNS} runs: cold {row.stage('cold').fmt()} s, warm "
        f"{row.stage('warm').fmt()} s, one host hung {row.stage('hung').fmt()} s"
    )
    return row


def ps_table(r: PsRow) -> list[str]:
    hung = r.stage("hung")
    return [
        f"{PS_RUNS} detached runs on {PS_HOSTS} hosts, ended while no coordinator watched "
        "(the registry holds no end for any). Seconds, start to exit:",
        "",
        "| `sshddp ps --all` | seconds |",
        "|---|---|",
        f"| one host hung (`--connect-timeout {PS_CONNECT_TIMEOUT:g}`) | {hung.fmt()} |",
        f"| asking every host, recording every end | {r.stage('cold').fmt()} |",
        f"| again: every end recorded, no host asked | {r.stage('warm').fmt()} |",
        f"| baseline: one pdsh `cat` of every `exit.json` | {r.stage('pdsh').fmt()} |",
        "",
        f"Target: with a host hung, ps answers within its one deadline (the connect timeout "
        f"plus 10 s, {PS_HUNG_TARGET:g} s with start-up), whatever the number of runs: "
        + verdict(hung.median <= PS_HUNG_TARGET, f"{hung.median:.2f} s"),
    ]


def ps_noisy(r: PsRow) -> list[str]:
    return [f"ps/{k}" for k in ("hung", "cold", "warm") if r.stage(k).noisy]


METHOD = """\
* **ps**: {runs} runs launched with `--detach` ({batch} at a time) on {hosts} hosts, each
  rank sleeping 1 s, so that every run ends while no coordinator follows it: the registry
  holds no end. A copy of that registry is put back before each cold measurement. *One
  host hung*: the last host's sshd gets SIGSTOP (connections are accepted by the kernel,
  no SSH banner ever comes), `ps --all --connect-timeout {timeout:g}`, then SIGCONT.
  *Asking every host*: `ps --all`, which records every end. *Again*: `ps --all` once
  more. The baseline is one `pdsh` (fan-out 32, OpenSSH) that `cat`s every run's
  `exit.json` on both hosts.
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(runs=PS_RUNS, batch=PS_BATCH, hosts=PS_HOSTS, timeout=PS_CONNECT_TIMEOUT)


CASE: Case[PsRow] = Case(
    name="ps",
    hosts=lambda sizes: PS_HOSTS,
    run=lambda b, sizes, reps: bench_ps(b, reps),
    title=lambda row: "ps over many finished runs",
    table=ps_table,
    noisy=ps_noisy,
    method=method,
)
