"""A run's layout (``model.layout``): what attach, logs, stop, ps, stacks and fetch know of a
run, from its registry record or from a launch's plan, and the console it names ranks on."""

from __future__ import annotations

import io
from dataclasses import fields
from pathlib import Path
from typing import BinaryIO

from sshddp.model.inventory import Host, parse_inventory
from sshddp.model.layout import NodeLayout, RunLayout, first_ranks
from sshddp.model.plan import CodeSpec, LaunchOptions, LaunchPlan, make_plan
from sshddp.run.registry import NodeRecord, RunRecord, record_json, record_of
from sshddp.run.sinks import open_sinks

INVENTORY = """\
defaults: {workdir: /scratch/w, env: {HF_TOKEN: hf_secret}}
hosts:
  - {host: big, gpus: 4}
  - {host: small, nproc: 1}
  - {host: mid, nproc: 2}
"""
LAYOUT_FIELDS = [f.name for f in fields(NodeLayout)]


def planned(run_id: str = "r1") -> LaunchPlan:
    inventory = parse_inventory(INVENTORY, "inv.yaml")
    options = LaunchOptions(script="t.py", log_dir="logs", grace=7.5)
    return make_plan(inventory, options, run_id, CodeSpec("file", "t.py"), lambda h: "10.0.0.1")


def recorded(plan: LaunchPlan) -> RunRecord:
    """The record a launch writes, read back from its file."""
    return record_of(record_json(RunRecord.of(plan, "inv.yaml", None)))


def node_fields(node: NodeLayout) -> tuple[object, ...]:
    """A node's layout, the host by name and index (a record keeps no env values)."""
    host = (node.host.host, node.host.index, node.host.workdir)
    return (host, *(getattr(node, f) for f in LAYOUT_FIELDS if f != "host"))


def test_a_plan_exposes_its_layout_and_nothing_a_launch_alone_needs() -> None:
    plan = planned()
    layout = plan.layout
    assert (layout.run_id, layout.log_dir, layout.grace) == ("r1", "logs/r1", 7.5)
    assert layout.world_size == plan.world_size == 7
    assert [type(n) for n in layout.nodes] == [NodeLayout] * 3  # no env, no argv
    assert [(n.node_rank, n.nproc, n.first_rank) for n in layout.nodes] == [
        (0, 4, 0),
        (1, 1, 4),
        (2, 2, 5),
    ]
    assert [n.rundir for n in layout.nodes] == [n.rundir for n in plan.nodes]
    assert [n.cwd for n in layout.nodes] == [n.cwd for n in plan.nodes]
    assert [n.host for n in layout.nodes] == [n.host for n in plan.nodes]


def test_a_recorded_run_gives_back_the_layout_its_launch_had() -> None:
    plan = planned()
    layout = recorded(plan).layout()
    assert layout.run_id == "r1"
    assert layout.log_dir == str(Path("logs/r1").absolute())  # the record's: absolute
    assert layout.grace == 7.5
    assert layout.world_size == 7
    assert [node_fields(n) for n in layout.nodes] == [node_fields(n) for n in plan.layout.nodes]
    assert all(n.host.env == {} for n in layout.nodes)  # never an environment value


def test_first_ranks_go_node_after_node_in_node_rank_order() -> None:
    assert first_ranks([(0, 4), (1, 1), (2, 2)]) == {0: 0, 1: 4, 2: 5}
    assert first_ranks([(2, 2), (0, 4), (1, 1)]) == {0: 0, 1: 4, 2: 5}  # listed in any order
    assert first_ranks([]) == {}


def test_a_record_listing_its_nodes_out_of_order_names_the_same_ranks() -> None:
    record = recorded(planned())
    shuffled = RunRecord(**{**vars(record), "nodes": tuple(reversed(record.nodes))})
    layout = shuffled.layout()
    assert [n.node_rank for n in layout.nodes] == [2, 1, 0]  # in the record's order
    assert {n.node_rank: n.first_rank for n in layout.nodes} == {0: 0, 1: 4, 2: 5}
    assert [list(n.ranks) for n in layout.nodes] == [[5, 6], [4], [0, 1, 2, 3]]


def test_only_keeps_the_run_with_the_nodes_named() -> None:
    layout = planned().layout
    part = layout.only([2, 0])
    assert [n.node_rank for n in part.nodes] == [0, 2]  # the run's order
    assert (part.run_id, part.log_dir, part.grace) == (layout.run_id, layout.log_dir, 7.5)
    assert part.world_size == 6
    assert layout.only([]).nodes == ()


def test_a_layout_is_what_the_record_holds_of_each_node() -> None:
    host = Host("h9", 0)
    record = RunRecord(
        run_id="x",
        created=0.0,
        inventory="/i.yaml",
        ssh_config=None,
        log_dir="/logs/x",
        rdzv=("10.0.0.9", 29500),
        world_size=3,
        grace=2.0,
        heartbeat_timeout=10.0,
        code="t.py",
        args=(),
        nodes=(NodeRecord(0, 3, "/w/runs/x/n0", host, "/w/space"),),
    )
    assert record.layout() == RunLayout(
        "x", "/logs/x", (NodeLayout(host, 0, 3, 0, "/w/runs/x/n0", "/w/space"),), 2.0
    )


class _Screen:
    """A terminal for the console: bytes captured, no colour."""

    def __init__(self) -> None:
        self.stdout_bytes: BinaryIO = io.BytesIO()
        self.color = False
        self.verbose = False
        self.said: list[str] = []

    def out(self, text: str) -> None:
        self.said.append(text)

    def err(self, text: str) -> None:
        self.said.append(text)


def test_the_console_shows_the_ranks_it_is_given_on_a_layout(tmp_path: Path) -> None:
    layout = RunLayout(
        "r1",
        str(tmp_path / "r1"),
        (
            NodeLayout(Host("h1", 0), 0, 2, 0, "/w/n0", "/w"),
            NodeLayout(Host("h2", 1), 1, 2, 2, "/w/n1", "/w"),
        ),
        1.0,
    )
    screen = _Screen()
    logs, console = open_sinks(layout, tmp_path / "r1", screen, frozenset({3}))
    try:
        console.write(0, b"from rank 0\n", source=0)
        console.write(1, b"from rank 2\n", source=0)
        console.write(1, b"from rank 3\n", source=1)
    finally:
        logs.close()
    out = screen.stdout_bytes.getvalue()  # type: ignore[attr-defined]
    assert out == b"[3 h2]   from rank 3\n"  # padded to the widest prefix, [0-1 h1]
    files = sorted(p.name for p in (tmp_path / "r1").iterdir())
    assert files == ["node0-h1.log", "node1-h2.log"]  # every node's copy: --ranks is the console's
