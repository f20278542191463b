"""Case ``workdir``: shipping a ``--workdir`` of ``--workdir-mb`` MB (200 by default) to
``--workdir-hosts`` hosts (4), against the same files sent by one ``tar c | ssh HOST tar x``
per host, all at once.

sshddp runs ``launch --no-check --workdir``; it is timed from its start to the moment the
last host has stored the code and checked its SHA-256 (``code.sha256`` appears in the node's
run directory). Its peak RSS is compared with the same launch shipping 1 MB: flat means the
bundle never sits whole in the coordinator's memory. Every sshddp connection goes through a
counting ProxyCommand (``sshddp_lab/countproxy.py``): the bytes that left this machine per
byte of the workdir (the hand-off's figure: issue 47's target is at most 1.05x).
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sshddp_bench.case import Case, Sizes
from sshddp_bench.harness import (
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
from sshddp_lab.countproxy import total_up

FILE_MB = 8  # the workdir's data comes in files of this size
SMALL_MB = 1  # the size whose peak RSS the full size's is compared with


@dataclass(frozen=True)
class WorkdirRow:
    mb: int
    hosts: int
    sshddp: Stat  #: seconds from the start to the last host's code stored and checked
    tar: Stat  #: seconds of the parallel ``tar c | ssh tar x``
    rss: Stat  #: sshddp's peak RSS (MB) shipping ``mb``
    rss_small: Stat  #: ... shipping SMALL_MB
    laptop: Stat = Stat(())  #: bytes that left this machine per byte of the workdir


def make_workdir(b: Bench, mb: int) -> Path:
    """A project of ``mb`` MiB: the rank script, 100 small source files, and data in
    FILE_MB files of random bytes (incompressible, as datasets and weights are)."""
    root = b.tmp / "workdirs" / f"w{mb}"
    if root.exists():
        return root
    (root / "src").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "rank.py").write_text(b.rank_script.read_text())
    for i in range(100):
        (root / "src" / f"m{i}.py").write_text(f"VALUE = {i}\n" * 40)
    left, i = mb << 20, 0
    while left > 0:
        n = min(FILE_MB << 20, left)
        (root / "data" / f"part{i:04d}.bin").write_bytes(os.urandom(n))
        left, i = left - n, i + 1
    return root


def staged_at(paths: list[Path], proc: Watched) -> float:
    """perf_counter when the last of ``paths`` appeared (polled every 10 ms)."""
    left = list(paths)
    while left:
        left = [p for p in left if not p.exists()]
        if left and proc.done.is_set():
            raise BenchError(f"sshddp exited before {left[0]} appeared")
        if left:
            time.sleep(0.01)
    return time.perf_counter()


def counted_config(b: Bench) -> tuple[Path, Path]:
    """The cluster's ssh_config with every host behind the counting ProxyCommand, and the
    directory of its counts."""
    counts, config = b.tmp / "counts", b.tmp / "ssh_config.counted"
    proxy = f"    ProxyCommand {sys.executable} -m sshddp_lab.countproxy {counts} %h %p\n"
    blocks = Path(b.ssh_config).read_text().split("\n\n")
    config.write_text("\n".join(k.rstrip("\n") + "\n" + proxy for k in blocks if k.strip()))
    return config, counts


def ship_sshddp(b: Bench, root: Path, n: int) -> tuple[float, float, float]:
    """(seconds to every host staged, peak RSS in MB, bytes that left this machine per byte
    of the workdir) of one ``launch --workdir`` (of a workdir no host keeps yet)."""
    port, name = b.port(), b.name("wd")
    inv = b.inventory(name, n, 1, port)
    config, counts = counted_config(b)
    before = total_up(str(counts)) if counts.exists() else 0
    options = ["--no-check", "--workdir", str(root), "--ssh-config", str(config)]
    logs = ["--log-dir", str(b.tmp / "logs"), "--name", name, "--port", str(port)]
    argv = [*b.sshddp, "launch", *options, *logs, str(inv), str(root / "rank.py"), "latency"]
    proc = b.start(argv, stdout_null=True)
    marks = [run_dir(b, name, i) / "code.sha256" for i in range(n)]
    at = staged_at(marks, proc)
    try:
        done = expect_rc(proc.finish(), 0, f"launch --workdir ({n} hosts)")
    except BenchError as exc:
        sup = [run_dir(b, name, i) / "supervisor.log" for i in range(n)]
        tails = "\n".join(f"{p}:\n{p.read_text()[-800:]}" for p in sup if p.exists())
        raise BenchError(f"{exc}\n{tails}") from None
    shutil.rmtree(b.tmp / "work" / name, ignore_errors=True)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    return at - proc.t0, done.maxrss_mb, (total_up(str(counts)) - before) / size


def ship_tar(b: Bench, root: Path, n: int) -> float:
    """Seconds of one ``tar c | ssh HOST tar x`` per host, all at once."""
    dest = b.tmp / "tarx" / b.name("tar")
    cfg, src = shlex.quote(b.ssh_config), shlex.quote(str(root))
    loop = " ".join(
        f"tar -C {src} -cf - . | ssh -F {cfg} {h} "
        f"{shlex.quote(f'mkdir -p {dest / h} && tar -xf - -C {dest / h}')} &"
        for h in b.aliases(n)
    )
    done = expect_rc(b.start(["bash", "-c", f"{loop} wait"]).finish(), 0, "tar | ssh tar x")
    if len(list(dest.iterdir())) != n:
        raise BenchError(f"tar | ssh tar x filled {len(list(dest.iterdir()))} of {n} hosts")
    shutil.rmtree(dest, ignore_errors=True)
    return done.wall


def bench_workdir(b: Bench, mb: int, n: int, reps: int) -> WorkdirRow:
    big, small = make_workdir(b, mb), make_workdir(b, SMALL_MB)
    took: dict[str, list[float]] = {"sshddp": [], "tar": [], "rss": [], "rss_small": []}
    took["laptop"] = []
    for rep in range(reps):
        for how in ("sshddp", "tar") if rep % 2 == 0 else ("tar", "sshddp"):
            if how == "tar":
                took["tar"].append(ship_tar(b, big, n))
                continue
            seconds, rss, laptop = ship_sshddp(b, big, n)
            took["sshddp"].append(seconds)
            took["rss"].append(rss)
            took["laptop"].append(laptop)
        took["rss_small"].append(ship_sshddp(b, small, n)[1])
    kinds = ("sshddp", "tar", "rss", "rss_small", "laptop")
    row = WorkdirRow(mb, n, *(stat(took[k]) for k in kinds))
    progress(f"workdir {mb} MB to {n} hosts: sshddp {row.sshddp.fmt()}, tar {row.tar.fmt()}")
    return row


def workdir_table(r: WorkdirRow) -> list[str]:
    ratio = r.sshddp.median / r.tar.median
    growth = r.rss.median - r.rss_small.median
    return [
        "| MB | hosts | sshddp to every host staged (s) | `tar \\| ssh tar x` (s) | ratio "
        "| target ≤ 1.2x | sshddp peak RSS (MB) | at 1 MB (MB) |",
        "|---:|---:|---|---|---:|---|---|---|",
        f"| {r.mb} | {r.hosts} | {r.sshddp.fmt()} | {r.tar.fmt()} | {ratio:.2f}x "
        f"| {verdict(ratio <= 1.2, f'{ratio:.2f}x')} | {r.rss.fmt(1, 0)} "
        f"| {r.rss_small.fmt(1, 0)} |",
        "",
        f"The coordinator's peak RSS grows by {growth:.0f} MB from 1 MB to {r.mb} MB of code "
        f"(flat: {verdict(growth < 50, f'{growth:.0f} MB')}).",
        "",
        f"Bytes that left this machine per byte of the workdir (a counting ProxyCommand): "
        f"{r.laptop.fmt(1, 3)}x; target ≤ 1.05x: "
        f"{verdict(r.laptop.median <= 1.05, f'{r.laptop.median:.3f}x')}.",
    ]


METHOD = """\
* **workdir**: a directory of {mb} MiB (data in {file_mb} MiB files of random bytes, plus
  100 small source files and the rank script) shipped to {hosts} hosts. sshddp runs
  `launch --no-check --workdir DIR` and is timed from its start to the last host's
  `code.sha256` (the code stored, unpacked and its SHA-256 checked); the baseline runs
  `tar -C DIR -cf - . | ssh -F cfg HOST 'mkdir -p D && tar -xf - -C D' &` for every host,
  then `wait`. sshddp's peak RSS at that size is compared with the same launch of a 1 MiB
  workdir. sshddp's connections go through a ProxyCommand that counts the bytes towards
  each sshd (`sshddp_lab/countproxy.py`): their sum over a launch, per byte of the workdir,
  is what left this machine (each launch is a new run name and workdir, so no host keeps
  the code already; the lab's hosts share that workdir, one disk, so the hosts after the
  first find its copy there: `scripts/handoff_bytes.py` measures hosts of a disk each).
"""


def method(sizes: Sizes) -> str:
    return METHOD.format(mb=sizes.workdir_mb, hosts=sizes.workdir_hosts, file_mb=FILE_MB)


CASE: Case[WorkdirRow] = Case(
    name="workdir",
    hosts=lambda sizes: sizes.workdir_hosts,
    run=lambda b, sizes, reps: bench_workdir(b, sizes.workdir_mb, sizes.workdir_hosts, reps),
    title=lambda r: f"Shipping a {r.mb} MB --workdir to {r.hosts} hosts",
    table=workdir_table,
    noisy=lambda r: ["workdir"] if r.sshddp.noisy or r.tar.noisy else [],
    method=method,
)
