"""The test network's names (``scripts/sshddp_lab/netns.py``): namespaces alive together in
one process (the Slurm cluster's for the whole session, a test's beside them) never share
a bridge, a namespace or a veth name, and a bridge left over by an earlier process with
the same pid is passed over, not fatal. Real ``ip``, as root (CI runs as root)."""

from __future__ import annotations

import itertools
import subprocess

import pytest

from sshddp_lab import netns
from sshddp_lab.netns import Netns, NetnsError


def names(net: Netns) -> set[str]:
    return {net.bridge, *net.names, *net.outer}


def links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def test_sets_of_namespaces_made_in_one_process_never_share_a_name() -> None:
    # 40 at once: with a random two-digit suffix, two shared one in 1 of 100 pairs
    nets = [Netns(3) for _ in range(40)]
    for a, b in itertools.combinations(nets, 2):
        assert names(a).isdisjoint(names(b)), (names(a), names(b))
    interfaces = [name for net in nets for name in (net.bridge, *net.outer)]
    assert all(len(name) <= 15 for name in interfaces)  # IFNAMSIZ - 1


def test_a_bridge_left_over_with_this_name_is_passed_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tags = iter(["9999901", "9999902"])
    monkeypatch.setattr(netns, "_tag", lambda: next(tags))
    subprocess.run(["ip", "link", "add", "sdbr9999901", "type", "bridge"], check=True)
    try:
        net = Netns(1)
        try:
            net.setup()
        except NetnsError as exc:
            pytest.fail(f"cannot build the test network: {exc}")
        try:
            assert net.bridge == "sdbr9999902"
            assert net.names == ["sshddp-test-9999902-1"]
            assert "sdbr9999902" in links()
        finally:
            net.close()
        assert "sdbr9999902" not in links()
        assert "sdbr9999901" in links()  # not ours: left alone
    finally:
        subprocess.run(["ip", "link", "del", "sdbr9999901"], check=False)
