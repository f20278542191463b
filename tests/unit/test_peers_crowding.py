"""The supervisors' port (P + 1) under a crowd: a handshake has one deadline in all, and
strangers holding connections open never keep a node of the run out. Real sockets on
loopback, in this process (threads): no process is started."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from sshddp.protocol.contract import SpecRecord
from sshddp.remote.node import peers, supervisor, wire

KEY = bytes(range(32))


def test_time_left_counts_down_to_the_deadline_then_times_out() -> None:
    assert wire.time_left(10.0, 4.0) == 6.0
    with pytest.raises(socket.timeout):
        wire.time_left(10.0, 10.0)
    with pytest.raises(socket.timeout):
        wire.time_left(10.0, 11.5)


class Trickle:
    """A stranger that sends one byte (never a newline) every ``every`` s on each of its
    sockets until ``stop``, or until ``limit`` s have passed."""

    def __init__(self, socks: list[socket.socket], every: float, limit: float = 20.0) -> None:
        self.socks = socks
        self.every = every
        self.limit = limit
        self.stop = threading.Event()
        self.finished = threading.Event()  #: it stopped by itself (its limit passed)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        end = time.monotonic() + self.limit
        while not self.stop.is_set():
            if time.monotonic() > end:
                self.finished.set()
                return
            for sock in self.socks:
                try:
                    sock.send(b"x")
                except OSError:
                    pass
            self.stop.wait(self.every)


def test_a_handshake_that_trickles_is_cut_off_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One byte every 0.05 s kept a handshake open for as long as it went on: the timeout
    applied to each read. Now the whole handshake has HANDSHAKE_TIMEOUT."""
    monkeypatch.setattr(wire, "HANDSHAKE_TIMEOUT", 0.5)
    hub_sock, stranger = socket.socketpair()
    trickle = Trickle([stranger], 0.05, limit=10.0)
    trickle.thread.start()
    try:
        with pytest.raises(wire.Refused, match="no hello"):
            wire.offer(hub_sock, KEY, "r1", "test")
        assert not trickle.finished.is_set(), "the hub waited for the stranger to stop"
    finally:
        trickle.stop.set()
        trickle.thread.join(30)
        hub_sock.close()
        stranger.close()


def spec(rank: int, port: int, timeout: float) -> SpecRecord:
    return {
        "schema": 4,
        "run_id": "r1",
        "node_rank": rank,
        "cwd": None,
        "grace": 1,
        "mark": f"r1/n{rank}",
        "peers": {"nnodes": 2, "addr": "127.0.0.1", "port": port, "timeout": timeout, "hosts": []},
        "tty": False,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hub() -> Iterator[peers.PeerServer]:
    port = free_port()
    hub = peers.peers_for(spec(0, port, 10.0), KEY)
    assert isinstance(hub, peers.PeerServer)
    hub.start()
    deadline = time.monotonic() + 30
    while True:  # until it listens
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the hub never listened"
            time.sleep(0.05)
    yield hub


def test_strangers_holding_every_slot_never_keep_a_node_out(hub: peers.PeerServer) -> None:
    """Twice MAX_PENDING strangers connect and trickle a byte every 0.2 s, so every slot is
    taken well within the hub's handshake deadline. Node 1's supervisor still gets in, long
    before its own deadline (2 x the heartbeat timeout): the newest connection evicts the
    oldest, and a node of the run answers its challenge at once."""
    crowd = [
        socket.create_connection(("127.0.0.1", hub.port), timeout=5)
        for _ in range(2 * peers.MAX_PENDING)
    ]
    trickle = Trickle(crowd, 0.2)
    trickle.thread.start()
    try:
        spoke = peers.peers_for(spec(1, hub.port, 10.0), KEY)
        assert isinstance(spoke, peers.PeerClient)
        spoke.start()
        assert spoke.connected.wait(30)
        assert spoke.conn is not None, spoke.abort
        assert spoke.settle() == ""
        deadline = time.monotonic() + 30  # the hub marks node 1 heard on its own thread
        while hub.heard() != {0, 1}:
            assert time.monotonic() < deadline, hub.heard()
            time.sleep(0.01)
    finally:
        trickle.stop.set()
        trickle.thread.join(30)
        for sock in crowd:
            sock.close()


def test_a_spoke_that_never_reached_the_hub_says_so() -> None:
    """Nothing listens on the hub's port: the spoke gives up after 2 x its timeout, and
    what its node's exit record must say names the port."""
    port = free_port()
    spoke = peers.peers_for(spec(1, port, 0.2), KEY)
    spoke.start()
    said = spoke.settle()
    assert said.startswith(f"never reached node 0's supervisor at 127.0.0.1:{port}"), said
    assert spoke.abort is not None


def test_a_node_that_succeeded_unwatched_says_so_in_its_record() -> None:
    """A run shorter than the spoke's deadline once "succeeded" silently with a node that
    never joined the supervisors; a node that failed or was stopped is not held up."""
    port = free_port()
    spoke = peers.peers_for(spec(1, port, 0.2), KEY)
    assert supervisor.unwatched(spoke, "failed") == ""
    spoke.start()
    said = supervisor.noted("", supervisor.unwatched(spoke, "succeeded"))
    assert said.startswith("never reached node 0's supervisor"), said
    assert supervisor.noted("torchrun exited with code 1", "x") == "torchrun exited with code 1; x"


def test_a_node_that_ended_waits_for_node_0_only_a_grace(monkeypatch) -> None:
    """Both nodes failed at once: node 0's supervisor left before node 1's reached it. Node
    1's gives up REPORT_GRACE after its own end, not at its connect deadline (2 x a 30 s
    timeout here), so no supervisor outlives its run by a minute."""
    monkeypatch.setattr(peers, "REPORT_GRACE", 0.5)
    spoke = peers.peers_for(spec(1, free_port(), 30.0), KEY)
    assert isinstance(spoke, peers.PeerClient)
    spoke.start()
    t0 = time.monotonic()
    spoke.report("failed", "exit 1")
    assert time.monotonic() - t0 < 10
    assert spoke.conn is None and spoke.abort is not None
    assert spoke.settle().startswith("never reached node 0's supervisor")
