"""Each pytest-xdist worker's share of the test lab (scripts/sshddp_lab/workers.py): no two
workers share a loopback address or a rendezvous port."""

from __future__ import annotations

import pytest

from sshddp_lab import workers
from sshddp_lab.sshd import host_addresses


def _share(monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[set[int], set[int], set[int]]:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", name)
    session = workers.session_first_octet()
    private = workers.private_first_octet()
    ports = {p for first in workers.port_range() for p in (first, first + 1)}
    return (
        set(range(session + 1, session + workers.SESSION_OCTETS + 1)),
        set(range(private + 1, private + workers.PRIVATE_OCTETS + 1)),
        ports,
    )


def test_without_xdist_the_lab_is_where_it_always_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert (workers.session_first_octet(), workers.private_first_octet()) == (40, 100)


def test_workers_share_no_address_and_no_port(monkeypatch: pytest.MonkeyPatch) -> None:
    shares = [_share(monkeypatch, f"gw{w}") for w in range(workers.MAX_WORKERS)]
    addresses = [a for session, private, _ in shares for a in session | private]
    ports = [p for _, _, share in shares for p in share]
    assert len(addresses) == len(set(addresses)) and max(addresses) <= 254
    assert len(ports) == len(set(ports))
    assert all(workers.PORTS.start <= p < workers.PORTS.stop for p in ports)


def test_more_workers_than_the_lab_has_addresses_for_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{workers.MAX_WORKERS}")
    with pytest.raises(workers.WorkerError, match=f"-n {workers.MAX_WORKERS} or fewer"):
        workers.session_first_octet()


def test_a_cluster_past_one_slice_listens_in_its_own_subnet() -> None:
    addrs = host_addresses(256, subnet="127.1")
    assert addrs[:2] == ["127.1.0.1", "127.1.0.2"] and addrs[249:251] == [
        "127.1.0.250",
        "127.1.1.1",
    ]
    assert addrs[-1] == "127.1.1.6" and len(set(addrs)) == 256
    assert host_addresses(3, first_octet=220) == ["127.0.0.221", "127.0.0.222", "127.0.0.223"]
    with pytest.raises(ValueError):
        host_addresses(65)  # 127.0.0.x holds 64 at most
    with pytest.raises(ValueError):
        host_addresses(257, subnet="127.1")
