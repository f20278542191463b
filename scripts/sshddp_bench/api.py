"""Case ``api``: ``sshddp.launch(fn)`` of a trivial function against ``sshddp launch`` of
the equivalent script, on the same hosts.

Both are a new process, as a user runs them: a script that calls ``sshddp.launch`` (its
function defined in ``__main__``, so it travels by value), and the command. What the API
adds is pickling the call, shipping cloudpickle beside it (one staging: the call is the
launch's code) and fetching every rank's value back once the run ended. Target: 1.1x.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, Finished, Stat, expect_rc, progress, stat, verdict

HOSTS = 4
NPROC = 2
LIMIT = 1.1  #: launch(fn)'s wall time over the command's, at most

SCRIPT = """import os
print("rank", os.environ["RANK"], flush=True)
"""

DRIVER = """import os, sys
import sshddp

def rank():
    print("rank", os.environ["RANK"], flush=True)
    return int(os.environ["RANK"])

cfg, inv, name, port, logs = sys.argv[1:]
result = sshddp.launch(rank, inv, ssh_config=cfg, name=name, port=int(port), log_dir=logs)
assert result.values == list(range(len(result.values))), result.values
"""


@dataclass(frozen=True)
class ApiRow:
    hosts: int
    nproc: int
    cli: Stat  #: wall seconds of `sshddp launch inv script.py`
    api: Stat  #: wall seconds of a script calling `sshddp.launch(fn, inv)`


def _one(b: Bench, api: bool) -> Finished:
    port = b.port()
    name = b.name("api" if api else "api-cli")
    inv = b.inventory(name, HOSTS, NPROC, port)
    if api:
        driver = b.tmp / "api_driver.py"
        driver.write_text(DRIVER)
        logs = str(b.tmp / "logs")
        argv = [sys.executable, str(driver), b.ssh_config, str(inv), name, str(port), logs]
    else:
        script = b.tmp / "api_script.py"
        script.write_text(SCRIPT)
        argv = b.launch_argv(name, port, inv)[:-1] + [str(script)]
    what = f"{'launch(fn)' if api else 'sshddp launch'} ({HOSTS} hosts x {NPROC})"
    return expect_rc(b.start(argv).finish(), 0, what)


def bench_api(b: Bench, reps: int) -> list[ApiRow]:
    """``reps`` runs of each, which one goes first alternating."""
    runs: dict[bool, list[Finished]] = {False: [], True: []}
    for rep in range(reps):
        for api in (False, True) if rep % 2 == 0 else (True, False):
            runs[api].append(_one(b, api))
    row = ApiRow(
        HOSTS, NPROC, stat([r.wall for r in runs[False]]), stat([r.wall for r in runs[True]])
    )
    progress(f"api {HOSTS} hosts: sshddp launch {row.cli.fmt()} s, launch(fn) {row.api.fmt()} s")
    return [row]


def api_table(rows: Sequence[ApiRow]) -> list[str]:
    out = [
        "| hosts × ranks | sshddp launch script.py (s) | sshddp.launch(fn) (s) | ratio "
        "| target: ≤ 1.1x |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r.api.median / r.cli.median
        miss = f"{ratio:.2f}x, {(ratio - LIMIT) / LIMIT:.0%} over {LIMIT}x"
        out.append(
            f"| {r.hosts} × {r.nproc} | {r.cli.fmt()} | {r.api.fmt()} | {ratio:.2f}x "
            f"| {verdict(ratio <= LIMIT, miss)} |"
        )
    return out


METHOD = """\
* **api**: a script that calls `sshddp.launch(fn, inv.yaml, ssh_config=..., name=..., port=P,
  log_dir=...)` with a function of its `__main__` that prints and returns its rank, against
  `sshddp launch --ssh-config cfg --log-dir ... --name N --port P inv.yaml script.py` of a script
  that prints its rank, on 4 CPU hosts × 2 ranks, the two alternating which goes first; each is
  a new process, timed from its start to its exit (the API's includes fetching the values).
"""

CASE: Case[list[ApiRow]] = Case(
    name="api",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_api(b, reps),
    title=lambda rows: "sshddp.launch(fn) against sshddp launch",
    table=api_table,
    noisy=lambda rows: [f"api/{r.hosts}" for r in rows if r.cli.noisy or r.api.noisy],
    method=lambda sizes: METHOD,
)
