"""Case ``sync``: a warm ``sshddp sync`` of 16 hosts against ``sshddp exec -- true``.

Every host already has the project's environment (one sync before the timing), so each
sync is one call per host that finds it complete: the issue's target is that this costs
about what reaching every host and running ``true`` does. The project is a uv project of
one small pinned package, locked from this machine's local index.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from sshddp_bench.case import Case
from sshddp_bench.harness import Bench, Finished, Stat, expect_rc, progress, stat, verdict

TARGET = 1.5  #: warm sync's wall time over exec's
HOSTS = 16
PYPROJECT = """\
[project]
name = "bench"
version = "0.1.0"
requires-python = ">=3.9"
dependencies = ["six==1.17.0"]

[tool.uv]
package = false
index-strategy = "unsafe-best-match"

[[tool.uv.index]]
url = "file:///opt/pypi/simple"
default = true
"""


@dataclass(frozen=True)
class SyncRow:
    hosts: int
    sync: Stat
    exec: Stat


def _project(b: Bench) -> tuple[Path, Path]:
    """The project, locked, and an inventory giving each host its own workdir (in its HOME)
    and one shared uv cache."""
    import uv

    folder = b.tmp / "sync-project"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "pyproject.toml").write_text(PYPROJECT)
    env = {"UV_CACHE_DIR": str(b.tmp / "uv-cache"), "PATH": "/usr/bin:/bin", "HOME": str(folder)}
    subprocess.run([uv.find_uv_bin(), "lock", "--quiet"], cwd=folder, env=env, check=True)
    doc = yaml.safe_load(b.cluster.inventory_yaml(list(range(1, HOSTS + 1)), workdir="~/sw"))
    doc["defaults"]["env"] = {"UV_CACHE_DIR": env["UV_CACHE_DIR"]}
    inv = b.tmp / "inv" / "sync.yaml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder, inv


def bench_sync(b: Bench, reps: int) -> SyncRow:
    project, inv = _project(b)
    sync = [*b.sshddp, "sync", "--ssh-config", b.ssh_config, str(inv), str(project)]
    expect_rc(b.start(sync).finish(), 0, "sshddp sync (cold)")
    hosts = ",".join(b.aliases(HOSTS))
    exec_ = [*b.sshddp, "exec", "--ssh-config", b.ssh_config, "-H", hosts, "--", "true"]
    runs: dict[str, list[Finished]] = {"sync": [], "exec": []}
    for rep in range(reps):
        for method in ("sync", "exec") if rep % 2 == 0 else ("exec", "sync"):
            argv = sync if method == "sync" else exec_
            runs[method].append(expect_rc(b.start(argv).finish(), 0, f"sshddp {method}"))
    row = SyncRow(HOSTS, stat([r.wall for r in runs["sync"]]), stat([r.wall for r in runs["exec"]]))
    progress(f"sync {HOSTS} hosts warm: {row.sync.fmt()} s, exec true {row.exec.fmt()} s")
    return row


def sync_table(r: SyncRow) -> list[str]:
    ratio = r.sync.median / r.exec.median
    miss = f"{ratio:.2f}x, {(ratio - TARGET) / TARGET:.0%} over {TARGET}x"
    return [
        "| hosts | sshddp sync, warm (s) | sshddp exec -- true (s) | ratio | target ≤ 1.5x |",
        "|---:|---|---|---:|---|",
        f"| {r.hosts} | {r.sync.fmt()} | {r.exec.fmt()} | {ratio:.2f}x "
        f"| {verdict(ratio <= TARGET, miss)} |",
    ]


METHOD = """\
* **sync**: `sshddp sync INV PROJECT` on 16 hosts whose environment for PROJECT's lock is
  already built (each host its own workdir), against `sshddp exec -H h1,..,h16 -- true`,
  alternating which goes first; both must exit 0.
"""

CASE: Case[SyncRow] = Case(
    name="sync",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_sync(b, reps),
    title=lambda row: f"warm sync of {row.hosts} hosts",
    table=sync_table,
    noisy=lambda row: [f"sync/{row.hosts}"] if row.sync.noisy or row.exec.noisy else [],
    method=lambda sizes: METHOD,
)
