"""Cases ``sync``, ``sync_cold`` and ``sync_offline``.

``sync``: a warm ``sshddp sync`` of 16 hosts against ``sshddp exec -- true``. Every host
already has the project's environment (one sync before the timing), so each sync is
one call per host that finds it complete: the issue's target is that this costs about what
reaching every host and running ``true`` does. The project is a uv project of one small
pinned package, locked from this machine's local index.

``sync_cold``: a sync of 8 hosts that have nothing (each its own uv cache) against one
host's own ``uv sync`` of the same lock alone. ``sync_offline``: the bytes ``--offline``
sends from this machine to 8 hosts against the wheels' size.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from sshddp_bench.case import Case
from sshddp_bench.harness import (
    Bench,
    BenchError,
    Finished,
    Stat,
    expect_rc,
    order,
    progress,
    stat,
    verdict,
)

TARGET = 1.5  #: warm sync's wall time over exec's
HOSTS = 16
COLD_HOSTS = 8  #: sync_cold and sync_offline: hosts
BYTES_TARGET = 1.05  #: sync_offline: bytes leaving this machine over the wheels' size
COLD_DEPS = '["numpy==2.2.6", "six==1.17.0"]'  #: a real wheel (16 MB) to fetch and install
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


def _locked(b: Bench, name: str, deps: str) -> Path:
    """A uv project of ``deps`` from the local index, locked."""
    import uv

    folder = b.tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    text = PYPROJECT.replace('["six==1.17.0"]', deps)
    if deps != '["six==1.17.0"]':  # numpy 2.2.6's wheels are this machine's Python's only
        text = text.replace(">=3.9", ">=3.11")
    (folder / "pyproject.toml").write_text(text)
    env = {"UV_CACHE_DIR": str(b.tmp / "uv-cache"), "PATH": "/usr/bin:/bin", "HOME": str(folder)}
    subprocess.run([uv.find_uv_bin(), "lock", "--quiet"], cwd=folder, env=env, check=True)
    return folder


def _project(b: Bench, hosts: int = HOSTS) -> tuple[Path, Path]:
    """The project, locked, and an inventory of ``hosts`` giving each host its own workdir
    (in its HOME) and one shared uv cache."""
    folder = _locked(b, "sync-project", '["six==1.17.0"]')
    doc = yaml.safe_load(b.cluster.inventory_yaml(list(range(1, hosts + 1)), workdir="~/sw"))
    doc["defaults"]["env"] = {"UV_CACHE_DIR": str(b.tmp / "uv-cache")}
    inv = b.tmp / "inv" / f"sync{hosts}.yaml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return folder, inv


def bench_sync(b: Bench, reps: int, hosts: int = HOSTS) -> SyncRow:
    project, inv = _project(b, hosts)
    sync = [*b.sshddp, "sync", "--ssh-config", b.ssh_config, str(inv), str(project)]
    expect_rc(b.start(sync).finish(), 0, "sshddp sync (cold)")
    names = ",".join(b.aliases(hosts))
    exec_ = [*b.sshddp, "exec", "--ssh-config", b.ssh_config, "-H", names, "--", "true"]
    runs: dict[str, list[Finished]] = {"sync": [], "exec": []}
    for rep in range(reps):
        for method in ("sync", "exec") if rep % 2 == 0 else ("exec", "sync"):
            argv = sync if method == "sync" else exec_
            runs[method].append(expect_rc(b.start(argv).finish(), 0, f"sshddp {method}"))
    row = SyncRow(hosts, stat([r.wall for r in runs["sync"]]), stat([r.wall for r in runs["exec"]]))
    progress(f"sync {hosts} hosts warm: {row.sync.fmt()} s, exec true {row.exec.fmt()} s")
    return row


def sync_table(r: SyncRow) -> list[str]:
    return sync_rows((r,))


def sync_rows(rows: tuple[SyncRow, ...]) -> list[str]:
    return [
        "| hosts | sshddp sync, warm (s) | sshddp exec -- true (s) | ratio | target ≤ 1.5x |",
        "|---:|---|---|---:|---|",
        *(_sync_line(r) for r in rows),
    ]


def _sync_line(r: SyncRow) -> str:
    ratio = r.sync.median / r.exec.median
    miss = f"{ratio:.2f}x, {(ratio - TARGET) / TARGET:.0%} over {TARGET}x"
    return (
        f"| {r.hosts} | {r.sync.fmt()} | {r.exec.fmt()} | {ratio:.2f}x "
        f"| {verdict(ratio <= TARGET, miss)} |"
    )


METHOD = """\
* **sync**: `sshddp sync INV PROJECT` on 16 hosts whose environment for PROJECT's lock is
  already built (each host its own workdir), against `sshddp exec -H h1,..,h16 -- true`,
  alternating which goes first; both must exit 0.
"""


@dataclass(frozen=True)
class ColdRow:
    hosts: int
    sync: Stat  #: sshddp sync of every host, each with an empty uv cache and no uv
    alone: Stat  #: one ``uv sync --frozen`` of the same lock, empty cache, nothing else running
    together: Stat  #: 8 such ``uv sync`` at once: what the lab's shared cores allow 8 hosts
    #: sshddp sync as ``sync``, each host with sshddp's uv already (as any earlier sync leaves)
    with_uv: Stat = Stat(())


def _cold_inventory(b: Bench, tag: str, with_uv: bool = False) -> Path:
    """Every host its own new workdir and its own new uv cache: separate machines, cold;
    ``with_uv``: sshddp's uv already there (what a host keeps from any earlier sync)."""
    import shutil

    import uv

    from sshddp.run.sync import uv_version

    doc = yaml.safe_load(b.cluster.inventory_yaml(list(range(1, COLD_HOSTS + 1))))
    doc["defaults"]["workdir"] = f"~/{tag}"
    for i, entry in enumerate(doc["hosts"], start=1):
        entry["env"] = {"UV_CACHE_DIR": str(b.cluster.home(i) / f"{tag}-uv-cache")}
        entry["addr"] = b.cluster.host(i).addr  # --offline: the others reach the seed there
        if with_uv:
            tools = b.cluster.home(i) / tag / "tools" / f"uv-{uv_version()}"
            tools.mkdir(parents=True)
            shutil.copy(uv.find_uv_bin(), tools / "uv")
    inv = b.tmp / "inv" / f"{tag}.yaml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _uv_alone(b: Bench, project: Path, tag: str, count: int = 1) -> float:
    """``count`` hosts' own ``uv sync`` of the lock at once, each into a new venv with a
    new cache: the seconds until the last is done."""
    import sys

    import uv

    argv = [uv.find_uv_bin(), "sync", "--frozen", "--quiet", "--python", sys.executable]
    start = time.perf_counter()
    procs = []
    for i in range(count):
        env = dict(b.env, UV_CACHE_DIR=str(b.tmp / f"{tag}-{i}-cache"))
        env["UV_PROJECT_ENVIRONMENT"] = str(b.tmp / f"{tag}-{i}-venv")
        procs.append(subprocess.Popen(argv, cwd=project, env=env))
    if any(p.wait() != 0 for p in procs):
        raise BenchError(f"uv sync of {project} failed")
    return time.perf_counter() - start


def bench_cold(b: Bench, reps: int) -> ColdRow:
    project = _locked(b, "sync-cold", COLD_DEPS)
    synced: list[float] = []
    alone: list[float] = []
    together: list[float] = []
    with_uv: list[float] = []
    for rep in range(reps):
        for method in order(("sync", "alone", "together", "with_uv"), rep):
            tag = f"cold{rep}-{method}"
            if method == "alone":
                alone.append(_uv_alone(b, project, tag))
                continue
            if method == "together":
                together.append(_uv_alone(b, project, tag, COLD_HOSTS))
                continue
            inv = _cold_inventory(b, tag, with_uv=method == "with_uv")
            argv = [*b.sshddp, "sync", "--ssh-config", b.ssh_config, str(inv), str(project)]
            took = expect_rc(b.start(argv).finish(), 0, "sshddp sync (cold)").wall
            (with_uv if method == "with_uv" else synced).append(took)
    row = ColdRow(COLD_HOSTS, stat(synced), stat(alone), stat(together), stat(with_uv))
    progress(
        f"sync {COLD_HOSTS} hosts cold: {row.sync.fmt()} s, uv sync alone {row.alone.fmt()} s, "
        f"{COLD_HOSTS} at once {row.together.fmt()} s, sync with uv there {row.with_uv.fmt()} s"
    )
    return row


def cold_table(r: ColdRow) -> list[str]:
    lines = [
        f"| hosts | sshddp sync, cold | one host's uv sync alone (s) | ratio | target ≤ 1.5x "
        f"| {r.hosts} uv sync at once (s) | ratio to it |",
        "|---:|---|---|---:|---|---|---:|",
    ]
    kinds = [("no uv on the hosts (the first sync ever)", r.sync)]
    kinds += [("sshddp's uv there (a new lock)", r.with_uv)] if r.with_uv.values else []
    for kind, took in kinds:
        ratio = took.median / r.alone.median
        miss = f"{ratio:.2f}x, {(ratio - TARGET) / TARGET:.0%} over {TARGET}x"
        shared = took.median / r.together.median
        lines.append(
            f"| {r.hosts} | {kind}: {took.fmt()} s | {r.alone.fmt()} | {ratio:.2f}x "
            f"| {verdict(ratio <= TARGET, miss)} | {r.together.fmt()} | {shared:.2f}x |"
        )
    return lines + [
        "",
        f"The lab's {r.hosts} hosts share this machine's 2 cores: *{r.hosts} uv sync at once* "
        "is what those cores allow any tool (the target, one host's alone, assumes 8 "
        "machines), and the last column is sshddp's own cost over it. The first sync to a "
        "host also sends it uv (18 MB compressed), over this machine's link to each host.",
    ]


@dataclass(frozen=True)
class OfflineRow:
    hosts: int
    sent: int  #: bytes sshddp wrote to the hosts' SSH channels
    wheels: int  #: the wheels' total size
    wall: Stat


SENT = re.compile(r"(\d+) bytes sent to the hosts over SSH; the \d+ wheel\(s\) are (\d+) bytes")


def bench_offline(b: Bench, reps: int) -> OfflineRow:
    project = _locked(b, "sync-offline", COLD_DEPS)
    counts: list[tuple[int, int]] = []
    walls: list[float] = []
    for rep in range(reps):
        inv = _cold_inventory(b, f"offline{rep}", with_uv=True)
        argv = [*b.sshddp, "sync", "--offline", "--ssh-config", b.ssh_config, str(inv)]
        done = expect_rc(b.start([*argv, str(project)]).finish(), 0, "sshddp sync --offline")
        found = SENT.search(done.stderr)
        if found is None:
            raise BenchError(f"sshddp sync --offline said no byte count:\n{done.stderr}")
        counts.append((int(found[1]), int(found[2])))
        walls.append(done.wall)
    sent, wheels = max(counts)  # the worst repetition: the bytes hardly vary
    row = OfflineRow(COLD_HOSTS, sent, wheels, stat(walls))
    progress(f"sync --offline {COLD_HOSTS} hosts: {sent} bytes sent, wheels {wheels} bytes")
    return row


def offline_table(r: OfflineRow) -> list[str]:
    ratio = r.sent / max(r.wheels, 1)
    miss = f"{ratio:.3f}x, over {BYTES_TARGET}x"
    return [
        "| hosts | bytes sent over SSH | wheels (bytes) | ratio | wall (s) | target ≤ 1.05x |",
        "|---:|---:|---:|---:|---|---|",
        f"| {r.hosts} | {r.sent} | {r.wheels} | {ratio:.3f}x | {r.wall.fmt()} "
        f"| {verdict(ratio <= BYTES_TARGET, miss)} |",
    ]


COLD_METHOD = """\
* **sync_cold**: `sshddp sync INV PROJECT` of a lock of numpy 2.2.6 and six (local index) on
  8 hosts that have nothing yet: each host a new workdir, no uv (sshddp sends its own), its
  own new uv cache (`UV_CACHE_DIR` per host, as separate machines have), against one
  `uv sync --frozen` of the same lock into a new venv with a new cache, run alone on this
  machine; alternating which goes first, each repetition with new directories. A second
  baseline runs 8 such `uv sync` at once (each its own cache and venv), to the last one's
  end: on this lab, where the 8 hosts share the machine's cores, the work 8 hosts must do.
  A third kind of repetition gives every host sshddp's uv before the sync (a new lock on
  hosts an earlier sync reached).
"""

OFFLINE_METHOD = """\
* **sync_offline**: `sshddp sync --offline INV PROJECT` of the same lock on 8 hosts (new
  workdirs and caches, sshddp's uv already on each, as any earlier sync leaves it): the
  bytes sshddp wrote to the hosts' SSH channels (its own count, every call's header
  included) against the wheels' total size.
"""

COLD_CASE: Case[ColdRow] = Case(
    name="sync_cold",
    hosts=lambda sizes: COLD_HOSTS,
    run=lambda b, sizes, reps: bench_cold(b, reps),
    title=lambda row: f"cold sync of {row.hosts} hosts",
    table=cold_table,
    noisy=lambda row: [f"sync_cold/{row.hosts}"] if row.sync.noisy or row.alone.noisy else [],
    method=lambda sizes: COLD_METHOD,
)

OFFLINE_CASE: Case[OfflineRow] = Case(
    name="sync_offline",
    hosts=lambda sizes: COLD_HOSTS,
    run=lambda b, sizes, reps: bench_offline(b, reps),
    title=lambda row: f"sync --offline to {row.hosts} hosts: bytes sent",
    table=offline_table,
    noisy=lambda row: [],
    method=lambda sizes: OFFLINE_METHOD,
)

CASE: Case[SyncRow] = Case(
    name="sync",
    hosts=lambda sizes: HOSTS,
    run=lambda b, sizes, reps: bench_sync(b, reps),
    title=lambda row: f"warm sync of {row.hosts} hosts",
    table=sync_table,
    noisy=lambda row: [f"sync/{row.hosts}"] if row.sync.noisy or row.exec.noisy else [],
    method=lambda sizes: METHOD,
)

MANY_METHOD = """\
* **sync256**: as **sync**, at each of `--many-sizes` (16,64,256) hosts of one cluster
  (past 64 hosts on 127.1.x.y), each count's hosts synced once (cold) before its timing.
"""

MANY_CASE: Case[tuple[SyncRow, ...]] = Case(
    name="sync256",
    hosts=lambda sizes: max(sizes.many),
    run=lambda b, sizes, reps: tuple(bench_sync(b, reps, n) for n in sizes.many),
    title=lambda rows: "warm sync of " + ", ".join(str(r.hosts) for r in rows) + " hosts",
    table=sync_rows,
    noisy=lambda rows: [f"sync256/{r.hosts}" for r in rows if r.sync.noisy or r.exec.noisy],
    method=lambda sizes: MANY_METHOD,
)
