"""A fan-out's outcomes, read back host by host in the inventory's order."""

from __future__ import annotations

from sshddp.errors import HostUnreachable
from sshddp.hosts.pool import HostResults, Outcome
from sshddp.model.inventory import Host


def test_each_host_gets_its_value_or_what_failed_it_in_the_order_given() -> None:
    hosts = [Host("a", 0), Host("b", 1), Host("c", 2)]
    outcomes: HostResults[str] = HostResults()
    outcomes[2] = Outcome(value="c ok")
    outcomes[0] = Outcome(value="a ok")
    outcomes[1] = Outcome(error=HostUnreachable("b", "b refused the connection"))
    outcomes[3] = Outcome(error=OSError("not asked"))
    got = outcomes.in_order(hosts, lambda host, why: f"{host.host}: {why}")
    assert got == ["a ok", "b: b refused the connection", "c ok"]
