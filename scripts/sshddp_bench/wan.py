"""Launch from far away: the same launch as the ``launch`` case, with every SSH connection
(sshddp's and pdsh's alike) carried through a relay that holds each chunk for half a round
trip in each direction, as a laptop on a distant network would see the cluster.

``python -m sshddp_bench.wan [--rtt-ms 0,20,50] [--hosts 4] [--reps 5] [--before SRC]
[--started] [--uplink-mbit R]``.
This machine's kernel has no ``netem``, so the relay runs in this script's process (asyncio,
one thread): each host gets one on ``127.0.2.N`` at the sshd port, and an ssh_config and
known_hosts that name it. The ranks' own traffic (the rendezvous, gloo) stays on loopback,
undelayed: a cluster's fast network, a slow link to it. ``--uplink-mbit`` also limits what
this machine sends to all hosts together, a laptop's upload (chunks take turns on it).
``--before SRC`` adds a third method, sshddp run from another checkout's ``src/``
(``PYTHONPATH``), to compare two versions in the same run. Start -> every rank's READY
line, medians (min-max), and the paired sshddp - pdsh median; with ``--started``, sshddp's
alone, start -> ``launch --detach`` returning (every node started: connect, preflight,
code, start, without the ranks' torch import), each run waited out before the next. One
launch of each method comes first, not counted (it warms the hosts' file caches). Not a
case of the suite: a diagnosis of round trips and bytes sent.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import threading
import time
from pathlib import Path

from sshddp_bench.baselines import baseline_argv, dry_run, node_scripts
from sshddp_bench.harness import (
    Bench,
    BenchError,
    ReadyWatch,
    Watched,
    expect_rc,
    order,
    run_pids,
    running_bench,
)

CHUNK = 65536


class Relay:
    """Forwards ``listen`` -> ``target`` (host, port) pairs, each byte delivered
    ``delay`` seconds after it arrived, in order, in both directions."""

    def __init__(self, pairs: list[tuple[tuple[str, int], tuple[str, int]]]) -> None:
        self.delay = 0.0
        #: bytes per second of the uplink (this machine to the hosts, every connection's
        #: bytes in turn, as a laptop's upload), or None: no limit
        self.uplink: float | None = None
        self._uplink_free = 0.0  # when the uplink has sent what it was given
        self._pairs = pairs
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        if not self._ready.wait(10):
            raise BenchError("the relay did not start")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        for listen, target in self._pairs:
            serve = asyncio.start_server(functools.partial(self._pipe, target=target), *listen)
            self._loop.run_until_complete(serve)
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: tuple[str, int]
    ) -> None:
        up_r, up_w = await asyncio.open_connection(*target)
        await asyncio.gather(self._one_way(reader, up_w, True), self._one_way(up_r, writer))

    def _due(self, size: int, up: bool) -> float:
        """When a chunk of ``size`` bytes that came in now reaches the other side."""
        now = time.monotonic()
        if up and self.uplink:
            self._uplink_free = max(now, self._uplink_free) + size / self.uplink
            now = self._uplink_free
        return now + self.delay

    async def _one_way(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, up: bool = False
    ) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
            writer.close()

        sender = asyncio.ensure_future(deliver())
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((self._due(len(data), up), data))
        except OSError:
            pass
        queue.put_nowait((0.0, b""))
        await asyncio.gather(sender, return_exceptions=True)


def relayed_config(b: Bench, relay_addrs: list[str]) -> Path:
    """The cluster's ssh_config and known_hosts with each host's address its relay's."""
    config, known = b.cluster.ssh_config.read_text(), b.cluster.known_hosts.read_text()
    for host, addr in zip(b.cluster.hosts, relay_addrs):
        config = config.replace(f"HostName {host.addr}\n", f"HostName {addr}\n")
        known = known.replace(f"[{host.addr}]:", f"[{addr}]:")
    new_known = b.tmp / "known_hosts.relayed"
    new_known.write_text(known)
    config = config.replace(str(b.cluster.known_hosts), str(new_known))
    path = b.tmp / "ssh_config.relayed"
    path.write_text(config)
    return path


def once(b: Bench, how: str, n: int, before: str | None, started: bool = False) -> float:
    port, name = b.port(), b.name(f"wan-{how}")
    inv = b.inventory(name, n, 1, port)
    if how == "pdsh":
        nodes = dry_run(b, name, port, inv, "latency")
        argv = baseline_argv(b, how, n, node_scripts(b, nodes, name, ""))
    else:
        options = ["--detach"] if started else []
        argv = b.launch_argv(name, port, inv, "latency", options=options)
    env = dict(b.env, PYTHONPATH=before) if how == "before" and before else b.env
    watch = ReadyWatch(n)
    proc = Watched(argv, env, b.tmp, on_line=watch)  # Bench.start, in this method's env
    done = expect_rc(proc.finish(), 0, f"{how} at {n} hosts")
    if started:
        deadline = time.monotonic() + 60
        while run_pids("SSHDDP_RUN_ID", name) and time.monotonic() < deadline:
            time.sleep(0.05)
        return done.wall
    if watch.all_at is None:
        raise BenchError(f"{how}: only ranks {sorted(watch.ranks)} of {n} printed READY")
    return watch.all_at - proc.t0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sshddp_bench.wan", description=__doc__)
    p.add_argument("--rtt-ms", default="0,20,50", help="round trips to emulate, ms")
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--before", help="another checkout's src/ to run as method 'before'")
    p.add_argument("--started", action="store_true", help="sshddp until every node started")
    p.add_argument("--uplink-mbit", type=float, help="this machine's upload to the hosts")
    args = p.parse_args()
    methods = ["sshddp"] + ([] if args.started else ["pdsh"]) + (["before"] if args.before else [])
    other = "before" if args.started else "pdsh"
    print(f"| RTT (ms) | {' | '.join(methods)} | sshddp − {other}, paired |")
    print("|---:|" + "---|" * len(methods) + "---:|")
    with running_bench(args.hosts) as b:
        addrs = [f"127.0.2.{h.addr.rsplit('.', 1)[1]}" for h in b.cluster.hosts]
        relay = Relay([((a, h.port), (h.addr, h.port)) for a, h in zip(addrs, b.cluster.hosts)])
        b.cluster.ssh_config = relayed_config(b, addrs)
        relay.uplink = args.uplink_mbit * 125_000 if args.uplink_mbit else None
        for how in methods:  # not counted: the first launch warms the hosts' file caches
            once(b, how, args.hosts, args.before, args.started)
        for rtt in (float(x) for x in args.rtt_ms.split(",")):
            relay.delay = rtt / 2000
            got: dict[str, list[float]] = {m: [] for m in methods}
            for rep in range(args.reps):
                for how in order(methods, rep):
                    got[how].append(once(b, how, args.hosts, args.before, args.started))
            cells = [_cell(got[m]) for m in methods]
            pairs = zip(got["sshddp"], got.get(other, []))
            diff = f"{statistics.median(s - q for s, q in pairs):+.2f}" if other in got else ""
            print(f"| {rtt:.0f} | {' | '.join(cells)} | {diff} |", flush=True)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


if __name__ == "__main__":
    main()
