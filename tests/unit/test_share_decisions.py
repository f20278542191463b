"""``--share`` (pure): which paths may be shared, what node 0 sends to whom, and what a
launch without it warns about; the inventory's ``share:`` and the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sshddp.errors import InventoryError, UsageError
from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import LaunchOptions, describe, make_plan
from sshddp.model.share import decide, share_problem, unshared, unshared_warning
from sshddp.run.payload import code_spec

A = {"size": 3, "sha256": "a" * 64}
B = {"size": 4, "sha256": "b" * 64}


def look(files: dict[str, int] | None = None, more: bool = False, **share: Any) -> dict[str, Any]:
    return {"files": sorted([n, s] for n, s in (files or {}).items()), "more": more, "share": share}


@pytest.mark.parametrize(
    "path", ["../snapshot.pt", "a/../../x", "..", ".", "/etc/passwd", "~/x", "", "a/./../.."]
)
def test_a_path_outside_the_working_directory_cannot_be_shared(path: str) -> None:
    assert share_problem(path)


@pytest.mark.parametrize("path", ["snapshot.pt", "ckpt/last.pt", "./snapshot.pt", "a/../b.pt"])
def test_a_path_inside_it_can(path: str) -> None:
    assert share_problem(path) is None


def test_node_0_s_copy_goes_only_where_it_differs() -> None:
    looks = [look(**{"s.pt": A}), look(**{"s.pt": A}), look(**{"s.pt": B}), look()]
    decision = decide(["s.pt"], looks)
    (transfer,) = decision.transfers
    assert (transfer.path, transfer.size, transfer.sha256, transfer.to) == (
        "s.pt",
        3,
        A["sha256"],
        (2, 3),
    )
    assert decision.same == () and decision.notes == () and decision.problems == ()


def test_identical_everywhere_sends_nothing() -> None:
    decision = decide(["s.pt"], [look(**{"s.pt": A})] * 3)
    assert decision.transfers == () and decision.same == ("s.pt",)


def test_a_path_node_0_lacks_is_a_note_and_is_removed_nowhere() -> None:
    decision = decide(["s.pt"], [look(), look(**{"s.pt": B})])
    assert decision.transfers == () and decision.problems == ()
    assert decision.notes == ("--share s.pt: not on node 0, so not shared (a first run has none)",)


def test_a_directory_on_node_0_stops_the_launch() -> None:
    decision = decide(["ckpt"], [look(ckpt={"error": "it is a directory"}), look()])
    assert decision.problems and "ckpt" in decision.problems[0] and not decision.transfers


def test_rank_0_s_checkpoint_missing_elsewhere_is_found() -> None:
    looks = [look({"train.py": 10, "snapshot.pt": 2048}), look({"train.py": 10})]
    assert unshared(looks, ()) == [("snapshot.pt", 2048, [1])]
    text = unshared_warning(unshared(looks, ()), ["h1", "h2"])
    assert "snapshot.pt (2.0 kB)" in text and "--share snapshot.pt" in text
    assert "node 1 (h2)" in text


def test_per_rank_files_and_shared_paths_are_not() -> None:
    looks = [
        look({"rank0.log": 5, "snapshot.pt": 9}),
        look({"rank1.log": 6}),
        look({"rank2.log": 7}),
    ]
    assert unshared(looks, ("snapshot.pt",)) == []
    assert unshared([look({"a": 1}), look({"a": 2})], ()) == []  # present everywhere
    assert unshared([look({"a": 1})], ()) == []  # one node: nothing to compare


def test_a_capped_listing_lacks_only_names_before_its_last() -> None:
    looks = [look({"a.pt": 1, "z.pt": 1}), look({"m": 1}, more=True)]
    assert [name for name, _, _ in unshared(looks, ())] == ["a.pt"]


def test_share_under_defaults_joins_the_command_line_s(tmp_path: Path) -> None:
    inv = parse_inventory(
        "defaults: {share: [snapshot.pt, ./ckpt/last.pt]}\nhosts: [a, b]\n", source="inv.yaml"
    )
    assert inv.share == ("snapshot.pt", "./ckpt/last.pt")
    assert all(h.workdir for h in inv.hosts)  # not a host's key
    (tmp_path / "t.py").write_text("")
    opts = LaunchOptions(script=str(tmp_path / "t.py"), share=("snapshot.pt", "extra.pt"))
    plan = make_plan(inv, opts, "r1", code_spec(opts), lambda h: "10.0.0.1")
    assert plan.share == ("snapshot.pt", "ckpt/last.pt", "extra.pt")
    assert "share:       snapshot.pt ckpt/last.pt extra.pt" in describe(plan)


@pytest.mark.parametrize("value", ["[../x]", "[/abs]", "snapshot.pt", "[{a: 1}]"])
def test_a_bad_share_in_the_inventory_names_its_line(value: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_inventory(f"hosts: [a]\ndefaults:\n  share: {value}\n", source="inv.yaml")
    assert "inv.yaml:3" in err.value.message and "defaults.share" in err.value.message


def test_a_share_option_outside_the_working_directory_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    inv = parse_inventory("hosts: [a]\n", source="inv.yaml")
    opts = LaunchOptions(script=str(tmp_path / "t.py"), share=("../up.pt",))
    with pytest.raises(UsageError, match=r"--share \.\./up\.pt: leaves"):
        make_plan(inv, opts, "r1", code_spec(opts), lambda h: "10.0.0.1")


def test_a_node_launcher_command_with_workdir_runs_in_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    inv = parse_inventory("hosts: [a, b]\n", source="inv.yaml")
    command = ("accelerate", "launch", "t.py")
    node = LaunchOptions(launcher="node", command=command, workdir=str(tmp_path))
    plan = make_plan(inv, node, "r1", code_spec(node), lambda h: "10.0.0.1")
    script = LaunchOptions(script="t.py", workdir=str(tmp_path))
    same = make_plan(inv, script, "r2", code_spec(script), lambda h: "10.0.0.1")
    assert all(n.workspace and n.cwd == n.workspace and "/runs/" not in n.cwd for n in plan.nodes)
    assert [n.cwd for n in plan.nodes] == [n.cwd for n in same.nodes]  # the SCRIPT's
