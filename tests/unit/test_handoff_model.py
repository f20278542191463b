"""The hand-off tree: who gets a payload from whom (``model/share.py``)."""

from __future__ import annotations

import pytest

from sshddp.model.share import LAPTOP, Delivery, Route, fallback_note, node_labels, tree


def test_with_no_kept_copy_one_host_gets_it_from_this_machine_and_hands_it_on() -> None:
    t = tree([False] * 4, 4)
    assert t.routes == (Route(0, LAPTOP), Route(1, 0), Route(2, 0), Route(3, 0))
    assert t.kept == () and t.children(0) == (1, 2, 3) and t.depth() == 2


@pytest.mark.parametrize("hosts", [1, 2, 5, 16, 17, 64, 256])
@pytest.mark.parametrize("fanout", [1, 2, 4, 8])
def test_every_host_gets_it_once_no_host_sends_more_than_the_fanout(
    hosts: int, fanout: int
) -> None:
    t = tree([False] * hosts, fanout)
    assert sorted(r.node for r in t.routes) == list(range(hosts))
    assert [r.source for r in t.routes].count(LAPTOP) == 1  # one copy leaves this machine
    assert all(len(t.children(n)) <= fanout for n in range(hosts))
    seen = {LAPTOP}
    for route in t.routes:  # every source comes before those it serves
        assert route.source in seen
        seen.add(route.node)


def test_256_hosts_are_five_hand_offs_deep_at_a_fanout_of_4() -> None:
    # the laptop's copy to host 0, then 4 levels below it: 1 + 4 + 16 + 64 + 171
    assert tree([False] * 256, 4).depth() == 5
    assert tree([False] * 256, 1).depth() == 256  # a chain


def test_hosts_that_keep_it_receive_nothing_and_serve_the_others() -> None:
    t = tree([False, True, False, False, True], 2)
    assert t.kept == (1, 4)
    assert LAPTOP not in [r.source for r in t.routes]  # nothing leaves this machine
    assert {r.node: r.source for r in t.routes} == {0: 1, 2: 1, 3: 4}


def test_every_host_keeping_it_means_no_route_at_all() -> None:
    t = tree([True, True], 4)
    assert t.routes == () and t.depth() == 0


def test_the_delivery_says_bytes_and_who_got_it_from_whom() -> None:
    hosts = ["h1", "h2", "h3"]
    d = Delivery(100, 200, {0: LAPTOP, 2: LAPTOP}, (1,), {2: "connection refused"})
    assert d.ratio() == 2.0
    assert d.record(hosts) == {
        "size": 100,
        "from_laptop": 200,
        "kept": ["h2"],
        "got": {"h1": "this machine", "h3": "this machine"},
        "fallbacks": {"h3": "connection refused"},
    }
    lines = d.lines(node_labels(hosts))
    assert "node 0 (h1) got it from this machine" in lines
    assert "node 1 (h2) kept it from an earlier launch" in lines
    assert lines[-1] == "200 bytes left this machine for 100 bytes of code (2.00x)"
    note = fallback_note(2, 0, node_labels(hosts), "connection refused")
    assert note.startswith("node 2 (h3) could not get the code from node 0 (h1)")
    assert note.endswith("sent from this machine instead")


def test_a_sync_names_its_hosts_and_its_payload() -> None:
    d = Delivery(10, 10, {0: LAPTOP, 1: 0}, (), {}, what="uv 0.9.5", earlier="sync")
    lines = d.lines(["h1", "h2"])
    assert lines[:2] == ["h1 got it from this machine", "h2 got it from h1"]
    assert lines[-1] == "10 bytes left this machine for 10 bytes of uv 0.9.5 (1.00x)"
    assert d.record(["h1", "h2"], ["h1", "h2"])["got"] == {"h1": "this machine", "h2": "h1"}
    note = fallback_note(1, 0, ["h1", "h2"], "refused", "uv 0.9.5")
    assert note == "h2 could not get the uv 0.9.5 from h1: refused; sent from this machine instead"
