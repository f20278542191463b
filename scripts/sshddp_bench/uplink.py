"""A ``--workdir`` over a laptop's uplink: ``launch --workdir`` of MB to N hosts with this
machine's upload to all hosts together limited to R Mbit/s, against one ``tar c | ssh HOST
tar x`` per host, all at once, through the same limit, and against one such copy alone.

``python -m sshddp_bench.uplink [--mb 50] [--hosts 4,8,16] [--mbit 40] [--reps 3]
[--tar-reps 2]``.
Every SSH connection from this machine (sshddp's and ssh's alike) goes through the relay of
``wan.py`` (``--uplink-mbit``): one queue for what every connection sends towards the
hosts, so the limit is the laptop's uplink as a whole, shared by all connections (a limit
per connection would flatter ``tar | ssh``); what comes back is not limited, and neither is
what the hosts send each other (the cluster's own network: the hand-off). Each host has a
workdir of its own, so every host needs its copy. sshddp is timed from its start to the last
host's kept copy (``<workdir>/payloads/<sha256>``: whole, its SHA-256 checked, before it is
unpacked); ``tar | ssh`` to its exit (unpacked).
Not a case of the suite: its ``tar | ssh`` at 16 hosts alone takes 16 copies' time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

import yaml

from sshddp_bench.harness import Bench, BenchError, Watched, expect_rc, order, running_bench
from sshddp_bench.machine import load_average
from sshddp_bench.wan import Relay, relayed_config
from sshddp_bench.workdir import make_workdir, ship_tar


def inventory(b: Bench, name: str, n: int, port: int) -> tuple[Path, list[Path]]:
    """The bench's inventory of h1..hN with a workdir per host; and those workdirs."""
    inv = b.inventory(name, n, 1, port)
    data = yaml.safe_load(inv.read_text())
    homes = [b.tmp / "work" / name / f"h{i}" for i in range(1, n + 1)]
    for host, home in zip(data["hosts"], homes):
        host["workdir"] = str(home)
    inv.write_text(yaml.safe_dump(data))
    return inv, homes


def kept_at(homes: list[Path], proc: Watched) -> float:
    """perf_counter when the last host's kept copy (``payloads/<sha256>``, renamed into place
    once whole and checked) appeared (polled every 10 ms)."""
    left = list(homes)
    while left:
        left = [h for h in left if not any(len(p.name) == 64 for p in _listed(h / "payloads"))]
        if left and proc.done.is_set():
            raise BenchError(f"sshddp exited before {left[0]} kept its copy")
        if left:
            time.sleep(0.01)
    return time.perf_counter()


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def ship_sshddp(b: Bench, root: Path, n: int) -> float:
    """Seconds from the start of ``launch --workdir`` to the last host's code checked."""
    port, name = b.port(), b.name("up")
    inv, homes = inventory(b, name, n, port)
    argv = b.launch_argv(name, port, inv, "latency", options=["--no-check", "--workdir", str(root)])
    argv[argv.index(str(b.rank_script))] = str(root / "rank.py")  # the copy inside the workdir
    proc = b.start(argv, stdout_null=True)
    at = kept_at(homes, proc)
    expect_rc(proc.finish(), 0, f"launch --workdir ({n} hosts)")
    shutil.rmtree(b.tmp / "work" / name, ignore_errors=True)
    return at - proc.t0


def cell(values: list[float]) -> str:
    if not values:
        return "not run"
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sshddp_bench.uplink", description=__doc__)
    p.add_argument("--mb", type=int, default=50)
    p.add_argument("--hosts", default="4,8,16")
    p.add_argument("--mbit", type=float, default=40.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tar-reps", type=int, default=2)
    args = p.parse_args()
    counts = [int(x) for x in args.hosts.split(",")]
    print(
        "| hosts | one copy, tar \\| ssh (s) | sshddp --workdir (s) | sshddp / one copy "
        "| tar \\| ssh to every host (s) | tar / one copy | load average after |"
    )
    print("|---:|---|---|---:|---|---:|---|")
    with running_bench(max(counts)) as b:
        addrs = [f"127.0.2.{h.addr.rsplit('.', 1)[1]}" for h in b.cluster.hosts]
        relay = Relay([((a, h.port), (h.addr, h.port)) for a, h in zip(addrs, b.cluster.hosts)])
        b.cluster.ssh_config = relayed_config(b, addrs)
        relay.uplink = args.mbit * 125_000
        root = make_workdir(b, args.mb)
        ship_sshddp(b, make_workdir(b, 1), 2)  # not counted: warms the hosts' file caches
        for n in counts:
            got: dict[str, list[float]] = {"one": [], "sshddp": [], "tar": []}
            for rep in range(args.reps):
                methods = ("one", "sshddp", "tar") if rep < args.tar_reps else ("one", "sshddp")
                for how in order(methods, rep):
                    if how == "sshddp":
                        got[how].append(ship_sshddp(b, root, n))
                    else:
                        got[how].append(ship_tar(b, root, 1 if how == "one" else n))
            one = statistics.median(got["one"])
            ratio = statistics.median(got["sshddp"]) / one
            tar = f"{statistics.median(got['tar']) / one:.1f}x" if got["tar"] else "n/a"
            print(
                f"| {n} | {cell(got['one'])} | {cell(got['sshddp'])} | {ratio:.2f}x "
                f"| {cell(got['tar'])} | {tar} | {load_average()} |",
                flush=True,
            )
            time.sleep(1)


if __name__ == "__main__":
    main()
