"""Spares at launch: the inventory's ``spares:`` and ``--spares`` (and their bad input, exit 2
with the key and the line), which spare takes which bad node (every branch of ``choose``),
and the launch's swap before the plan (the banner's lines, the quarantine kept where no
spare fits)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode, InventoryError
from sshddp.hosts.transport import SshOptions
from sshddp.model import quarantine as qmodel
from sshddp.model.inventory import Host, parse_host_list, parse_inventory, with_spare_list
from sshddp.model.quarantine.spares import choose
from sshddp.run.quarantine import spares as run_spares
from sshddp.run.quarantine import store

INV = """\
defaults:
  nproc: 2
hosts:
  - h1
  - h2
  - h3
spares:
  - h4
  - host: h5
    port: 2222
"""


def host(name: str, index: int, procs: int = 2) -> Host:
    return Host(name, index, nproc=procs)


HOSTS = (host("h1", 0), host("h2", 1), host("h3", 2))


# --- the inventory -------------------------------------------------------------------------


def test_spares_take_the_defaults_and_keep_their_own_order() -> None:
    inv = parse_inventory(INV)
    assert [(s.host, s.index, s.procs, s.port) for s in inv.spares] == [
        ("h4", 0, 2, None),
        ("h5", 1, 2, 2222),
    ]
    assert [h.host for h in inv.hosts] == ["h1", "h2", "h3"]
    assert parse_inventory("hosts: [a]\nspares:\n").spares == ()
    assert parse_inventory("hosts: [a]\n").spares == ()


@pytest.mark.parametrize(
    ("extra", "line", "said"),
    [
        ("  - h2\n", 11, "spare 'h2' is also listed in hosts (line 5)"),
        ("  - h4\n", 11, "spare 'h4' is also listed twice (line 8)"),
        ("  - host: h6\n    nproc: 3\n", 11, "spare 'h6' runs 3 process(es), and no node"),
    ],
)
def test_a_bad_spare_names_its_key_and_line(extra: str, line: int, said: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(INV + extra, "inv.yaml")
    message = str(caught.value)
    assert message.startswith(f"inv.yaml:{line}: spares[2]"), message
    assert said in message, message
    assert len(message.splitlines()[0]) > 60  # one paragraph, then the line and its caret


def test_spares_must_be_a_list() -> None:
    with pytest.raises(InventoryError, match=r"<string>:2: spares: expected a list"):
        parse_inventory("hosts: [a]\nspares: {host: b}\n")


def test_a_slurm_inventory_takes_no_spares() -> None:
    with pytest.raises(InventoryError, match=r"<string>:2: spares: spares are host names"):
        parse_inventory("hosts: {slurm: current}\nspares: [b]\n")


def test_spares_on_the_command_line() -> None:
    inv = with_spare_list(parse_host_list("a:2,b:1", python="/py"), "c:2,d")
    assert [(s.host, s.procs, s.python) for s in inv.spares] == [("c", 2, "/py"), ("d", 1, "/py")]
    for text, said in [
        ("a:2", "spare 'a' is also listed in -H (entry 1)"),
        ("c:2,c:2", "spare 'c' is also listed twice (entry 1)"),
        ("c:3", "spare 'c' runs 3 process(es)"),
        ("", "no hosts"),
    ]:
        with pytest.raises(InventoryError, match=r"^--spares: ") as caught:
            with_spare_list(parse_host_list("a:2,b:2"), text)
        assert said in str(caught.value)


def test_bad_spares_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "inv.yaml"
    bad.write_text(INV + "  - h1\n")
    result = sshddp(["launch", "--dry-run", str(bad), "train.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{bad}:11: spares[2]" in result.err and "also listed in hosts" in result.err
    result = sshddp(["launch", "--dry-run", "-H", "a:2", "--spares", "b:4", "train.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "--spares: spares[0]" in result.err and "runs 4 process(es)" in result.err
    good = tmp_path / "good.yaml"
    good.write_text(INV)
    result = sshddp(["launch", "--dry-run", "--spares", "h9:2", str(good), "train.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "exclude each other" in result.err


def test_a_dry_run_plans_the_inventorys_hosts() -> None:
    result = sshddp(["launch", "--dry-run", "-H", "a:1,b:1", "--spares", "c", "train.py"])
    assert result.code == 0, result.explain()
    assert "node 0: a " in result.out and "node 1: b " in result.out, result.out


# --- choose --------------------------------------------------------------------------------


def test_no_bad_host_changes_nothing() -> None:
    choice = choose(HOSTS, {}, [host("h4", 0)], {})
    assert choice.hosts == HOSTS and not choice.swaps and not choice.unfilled


def test_a_bad_node_takes_the_first_usable_spare_at_its_rank() -> None:
    spares = [host("h4", 0), host("h5", 1)]
    choice = choose(HOSTS, {1: "unreachable (refused)"}, spares, {"h4": "unreachable (x)"})
    assert [h.host for h in choice.hosts] == ["h1", "h5", "h3"]
    assert [h.index for h in choice.hosts] == [0, 1, 2]
    (swap,) = choice.swaps
    assert (swap.node_rank, swap.old.host, swap.new.host) == (1, "h2", "h5")
    assert swap.line() == "sshddp: node 1: h2 unreachable (refused); spare h5 takes its place"
    assert not choice.unfilled


def test_a_spare_fills_one_node_and_only_of_its_count() -> None:
    hosts = (host("h1", 0), host("h2", 1, procs=4), host("h3", 2))
    spares = [host("h4", 0), host("h5", 1, procs=4)]
    bad = {0: "quarantined", 1: "quarantined", 2: "quarantined"}
    choice = choose(hosts, bad, spares, {})
    assert [h.host for h in choice.hosts] == ["h4", "h5", "h3"]  # h5 skips node 0: 4 procs
    (unfilled,) = choice.unfilled
    assert unfilled.node_rank == 2 and unfilled.host.host == "h3"
    assert unfilled.tried == (("h4", "already takes node 0"), ("h5", "already takes node 1"))
    assert unfilled.line() == (
        "sshddp: node 2: h3 quarantined; no spare can take its place (spare h4 already takes "
        "node 0; spare h5 already takes node 1)"
    )


def test_a_spare_of_another_count_is_not_used() -> None:
    (unfilled,) = choose(HOSTS, {0: "unreachable (x)"}, [host("h4", 0, procs=4)], {}).unfilled
    assert unfilled.tried == (("h4", "runs 4 process(es), node 0 2"),)


def test_no_spares_at_all() -> None:
    (unfilled,) = choose(HOSTS, {2: "unreachable (x)"}, [], {}).unfilled
    assert unfilled.line().endswith("no spare can take its place (no spares)")


# --- the launch's swap ---------------------------------------------------------------------


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSHDDP_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def _swap(
    monkeypatch: pytest.MonkeyPatch,
    down: dict[str, str],
    sick: Optional[dict[str, str]] = None,
    **kw: bool,
) -> tuple[list, list]:
    """The swap, with the connections' and the health commands' findings as given."""
    found = (dict(down), dict(sick or {}))
    monkeypatch.setattr(run_spares, "_look", lambda inv, ssh, fanout, env: found)
    said: list[str] = []
    inv = run_spares.swap_bad_hosts(parse_inventory(INV), SshOptions(), 4, said.append, **kw)
    return [h.host for h in inv.hosts], said


def _quarantine(name: str) -> None:
    now = time.time()
    verdict = qmodel.Verdict(name, "lost", "no heartbeat")
    store.change(lambda q: q.adding(qmodel.entries([verdict], now, 3600.0, "r0"), now))


def test_an_unreachable_host_is_swapped(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts, said = _swap(monkeypatch, {"h2": "connection refused"})
    assert hosts == ["h1", "h4", "h3"]
    swap = "sshddp: node 1: h2 unreachable (connection refused); spare h4 takes its place"
    assert said[0] == swap
    # and quarantined, as the preflight quarantines a host it cannot reach
    assert said[1].startswith("sshddp: quarantined h2 until ") and len(said) == 2, said
    assert said[1].endswith(": unreachable at launch (h2: connection refused)"), said


def test_a_host_swapped_for_a_refused_login_is_not_quarantined(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hosts, said = _swap(monkeypatch, {"h2": "authentication failed (Permission denied)"})
    assert hosts == ["h1", "h4", "h3"] and len(said) == 1, said  # the swap; yours to fix


def test_an_unhealthy_host_is_swapped_and_quarantined(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sick = {"h2": "`check` exited 4: /scratch is full", "h4": "`check` exited 1: no"}
    hosts, said = _swap(monkeypatch, {}, sick)
    assert hosts == ["h1", "h5", "h3"]  # h4 is unhealthy too: the next spare
    assert said[0] == (
        "sshddp: node 1: h2 unhealthy (`check` exited 4: /scratch is full); "
        "spare h5 takes its place"
    )
    assert said[1].startswith("sshddp: quarantined h2 until ") and len(said) == 2, said
    assert said[1].endswith(": failed its health check (`check` exited 4: /scratch is full)")


def test_a_quarantined_host_is_swapped_unless_ignored(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _quarantine("h3")
    _quarantine("h4")
    hosts, said = _swap(monkeypatch, {})
    assert hosts == ["h1", "h2", "h5"]
    assert said[0].startswith("sshddp: node 2: h3 quarantined until ") and "(lost)" in said[0]
    assert said[0].endswith("spare h5 takes its place")
    assert _swap(monkeypatch, {}, ignore_quarantine=True) == (["h1", "h2", "h3"], [])


def test_no_usable_spare_keeps_the_hosts(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _quarantine("h3")
    hosts, said = _swap(monkeypatch, {"h1": "timed out", "h4": "refused", "h5": "refused"})
    assert hosts == ["h1", "h2", "h3"]  # the launch fails through them, as without spares
    assert said[0] == (
        "sshddp: node 0: h1 unreachable (timed out); no spare can take its place (spare h4 "
        "unreachable (refused); spare h5 unreachable (refused))"
    )
    assert said[1].startswith("sshddp: node 2: h3 quarantined until ") and len(said) == 2


def test_without_spares_nothing_is_reached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_spares, "_look", pytest.fail)
    inv = parse_inventory("hosts: [a]\n")
    assert run_spares.swap_bad_hosts(inv, SshOptions(), 4, pytest.fail) is inv
