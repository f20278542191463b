"""A spare takes a lost node's place mid-run: node 0's choice (remote/node/seats.py), its
decisions (remote/node/node_events.py), the spec the attempt runs (restarts.seated_spec) and
node 0's word (peer_messages ``again``). No process, no socket."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_plan import THREE_HOSTS, plan_of

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode, InventoryError
from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import LaunchOptions
from sshddp.model.state import NodeResult, NodeState, RunResult, replaced_in, with_replaced
from sshddp.protocol import contract
from sshddp.protocol import peer_messages as pm
from sshddp.remote.node.node_events import (
    LINGERING,
    SPARE,
    STARTING,
    EndRun,
    Event,
    Finish,
    LoopState,
    Message,
    Node0Said,
    PeerAbort,
    PeerView,
    RunOver,
    StartNext,
    Tell,
    decide,
    initial,
)
from sshddp.remote.node.restarts import seated_spec
from sshddp.remote.node.seats import Seating, reseat

#: three nodes (slots 0-2), then two spares (slots 3, 4)
NAMES = ("h1", "h2", "h3", "h4", "h5")
LOST = contract.LOST


def node0(**changes: Any) -> LoopState:
    """Node 0 of a 3-node run with two spares and 3 attempts, every supervisor heard from."""
    state = LoopState(0, 3, 3, NAMES, spares=2, heard=frozenset(range(5)))
    return replace(state, **changes)


def run(state: LoopState, *events: Event) -> tuple[LoopState, list[Any]]:
    done: list[Any] = []
    for event in events:
        state, actions = decide(state, event)
        done += actions
    return state, done


def healthy(attempt: int, *slots: int) -> list[Event]:
    """The spares in ``slots`` answer node 0's ``check``: healthy."""
    return [Message(slot, pm.health(attempt, "")) for slot in slots]


def test_the_first_spare_heard_takes_the_lost_nodes_rank() -> None:
    seating = reseat((0, 1, 2), {2}, {0, 1, 3, 4}, (3, 4), 0, NAMES)
    assert seating == Seating((0, 1, 3), (2,), ("h4 took its place",))


def test_a_spare_not_heard_is_skipped_and_named() -> None:
    seating = reseat((0, 1, 2), {2}, {0, 1, 4}, (3, 4), 0, NAMES)
    assert seating.members == (0, 1, 4) and seating.replaced == (2,)
    assert seating.taken == (
        "h5 took its place (spare h4 skipped: unreachable (not connected to node 0's supervisor))",
    )
    none = reseat((0, 1, 2), {2}, {0, 1}, (3, 4), 0, NAMES)
    assert none.refusal == (
        "node(s) 2 cannot be reached and no spare can take its place (spare h4 unreachable "
        "(not connected to node 0's supervisor); spare h5 unreachable (not connected to "
        "node 0's supervisor))"
    )
    assert reseat((0, 1, 2), {2}, {0, 1}, (), 0, NAMES).refusal == (
        "node(s) 2 cannot be reached and no spare can take its place"
    )


def test_a_spare_serves_one_node_and_two_lost_nodes_take_two() -> None:
    both = reseat((0, 1, 2), {1, 2}, {0, 3, 4}, (3, 4), 0, NAMES)
    assert (both.members, both.replaced) == ((0, 3, 4), (1, 2))
    again = reseat((0, 1, 3), {3}, {0, 1, 4}, (3, 4), 0, NAMES)  # h4, seated, lost in turn
    assert again.members == (0, 1, 4)


def test_node_0_is_never_replaced() -> None:
    assert (
        "node 0 (h1) is lost: node 0 is not replaced"
        in reseat((0, 1, 2), {0}, {1, 3}, (3,), 0, NAMES).refusal
    )


@pytest.mark.parametrize(
    ("min_nodes", "members", "refusal"),
    [
        (2, (0, 1), ""),
        (3, (), "and 2 node(s) are fewer than min_nodes 3"),
        (0, (), "no spare can take its place"),
    ],
)
def test_with_no_spare_min_nodes_lets_the_run_go_on_with_fewer(
    min_nodes: int, members: tuple[int, ...], refusal: str
) -> None:
    seating = reseat((0, 1, 2), {2}, {0, 1}, (), min_nodes, NAMES)
    assert seating.members == members and refusal in seating.refusal
    if members:
        assert seating.taken == (
            "the run goes on with 2 node(s) (min_nodes 2): node(s) 2 cannot be reached and no "
            "spare can take its place",
        )


def test_node_0_halts_a_lost_node_and_seats_a_spare_once_the_others_halted() -> None:
    state, actions = run(
        node0(),
        PeerView(frozenset({0, 1, 3, 4}), frozenset({2})),
        Message(2, pm.done(2, LOST, "no heartbeat for 5 s")),
    )
    why = "node 2 (h3) lost (no heartbeat for 5 s)"
    assert actions == [Tell(pm.halt(1, why)), Tell(pm.check(1))] and state.halt == (1, why)
    state, actions = run(state, Message(1, pm.fail(1, "rank 2 exited with code 1")))
    assert actions == []  # a node that failed for the lost one counts as halted
    state, actions = run(state, Message(0, pm.halted(1)))
    assert actions == []  # the spares' answers to node 0's check are awaited
    state, actions = run(state, *healthy(1, 3, 4))
    told = f"{why}; h4 took its place"
    assert actions == [Tell(pm.again(2, told, [0, 1, 3], [2]))]
    assert (state.go, state.members, state.replaced) == ((2, told), (0, 1, 3), (2,))
    assert state.name(3) == "node 2 (h4)" and state.name(2) == "spare h3"


def test_a_fail_first_then_the_loss_still_seats_a_spare() -> None:
    """The ranks of node 1 fail (their peer vanished) before node 0's mesh notices."""
    state, actions = run(node0(), Message(1, pm.fail(1, "rank 2 exited with code 1")))
    assert actions == [Tell(pm.halt(1, "node 1 (h2) failed: rank 2 exited with code 1"))]
    state, actions = run(state, Message(0, pm.halted(1)))
    assert actions == []  # node 2 has not halted: it is still heard from
    state, actions = run(
        state,
        PeerView(frozenset({0, 1, 3, 4}), frozenset({2})),
        Message(2, pm.done(2, LOST, "its connection to node 0's supervisor dropped")),
    )
    assert actions == [Tell(pm.check(1))]
    state, actions = run(state, *healthy(1, 3, 4))
    assert len(actions) == 1 and actions[0].msg["nodes"] == [0, 1, 3]
    assert actions[0].msg["reason"].endswith("h4 took its place")


def test_a_fail_while_a_node_is_unreachable_seats_a_spare() -> None:
    state = node0(heard=frozenset({0, 1, 3, 4}))
    state, actions = run(state, Message(1, pm.fail(1, "x")))
    why = "node 1 (h2) failed: x; node 2 (h3) lost (not connected to node 0's supervisor)"
    assert actions == [Tell(pm.halt(1, why)), Tell(pm.check(1))]
    state, actions = run(state, Message(0, pm.halted(1)), *healthy(1, 3, 4))
    assert actions == [Tell(pm.again(2, f"{why}; h4 took its place", [0, 1, 3], [2]))]


def test_a_lost_node_with_no_spare_or_attempt_left_ends_the_run() -> None:
    view = PeerView(frozenset({0, 1}), frozenset({2}))
    lost = Message(2, pm.done(2, LOST, "no heartbeat for 5 s"))
    _, actions = run(node0(spares=0, names=NAMES[:3]), view, lost)
    assert actions == [
        EndRun(
            "node 2 (h3) lost (no heartbeat for 5 s); not restarted: node(s) 2 cannot be "
            "reached and no spare can take its place"
        )
    ]
    _, actions = run(node0(max_attempts=1), view, lost)  # no restarts: the run ends
    assert actions == [EndRun("node 2 (h3) lost: no heartbeat for 5 s")]
    last = node0(attempt=3, decider=replace(node0().decider, current=3))
    _, actions = run(last, PeerView(frozenset({0, 1, 3, 4}), frozenset({2})), lost)
    assert actions == [
        EndRun("node 2 (h3) lost (no heartbeat for 5 s); not restarted: no attempts left (3 made)")
    ]


def test_a_spare_that_leaves_or_ends_changes_nothing() -> None:
    state, actions = run(node0(), Message(4, pm.done(4, LOST, "dropped")))
    assert actions == [] and state == node0()
    assert run(node0(), Message(3, pm.done(3, contract.STOPPED, "x")))[1] == []


def test_a_waiting_spare_starts_only_once_seated() -> None:
    spec: Any = {
        "node_rank": 3,
        "spare": True,
        "restarts": 2,
        "peers": {"nnodes": 3, "hosts": ["h1", "h2", "h3"], "spares": ["h4", "h5"]},
    }
    spare = initial(spec)
    assert (spare.phase, spare.rank, spare.spares, spare.name(3)) == (SPARE, 3, 2, "spare h4")
    state, actions = run(spare, Node0Said(pm.halt(1, "node 2 (h3) lost")))
    assert actions == [] and state.phase == SPARE
    other, actions = run(state, Node0Said(pm.again(2, "x", [0, 1, 4], [2])))
    assert actions == [] and other.phase == SPARE  # h5 was seated, not this one
    state, actions = run(state, Node0Said(pm.again(2, "x; h4 took its place", [0, 1, 3], [2])))
    assert actions == [StartNext()] and state.phase == STARTING and state.attempt == 1
    assert state.replaced == (2,) and state.name(3) == "node 2 (h4)"


def test_a_waiting_spare_ends_with_the_run() -> None:
    spare = initial({"node_rank": 3, "spare": True, "restarts": 1})  # type: ignore[typeddict-item]
    state, actions = run(spare, PeerAbort("node 1 (h2) failed"))
    assert state.phase == LINGERING and isinstance(actions[0], Finish)
    assert actions[0].end.state == contract.STOPPED
    state, actions = run(spare, RunOver())
    assert isinstance(actions[0], Finish) and actions[0].end.state == contract.SUCCEEDED


def test_the_spec_a_seated_node_runs() -> None:
    spec: Any = {
        "node_rank": 3,
        "torchrun": {"node_rank": 3, "nnodes": 3, "nproc": 2},
        "watch": {"nprocs": [2, 2, 2]},
    }
    seated = seated_spec(spec, (0, 1, 3), 3)
    assert seated["node_rank"] == 2 and seated["torchrun"]["node_rank"] == 2
    assert seated["torchrun"]["nnodes"] == 3 and seated["watch"]["nprocs"] == [2, 2, 2]
    fewer = seated_spec({**spec, "node_rank": 1}, (0, 1), 1)
    assert fewer["torchrun"]["nnodes"] == 2 and fewer["watch"]["nprocs"] == [2, 2]
    assert spec["torchrun"]["node_rank"] == 3  # the spec itself is left as it was


def test_again_carries_the_nodes_and_reads_back() -> None:
    msg = pm.again(2, "why", [0, 1, 3], [2])
    assert pm.decode(pm.encode(msg)) == msg
    assert pm.decode({"t": "again", "attempt": 2, "reason": "w"}) == pm.again(2, "w")
    assert pm.decode({"t": "again", "attempt": 2, "reason": "w", "nodes": [0, "x"]}) is None
    assert pm.decode({"t": "again", "attempt": 2, "reason": "w", "nodes": [0, -1]}) is None


def test_a_spares_record_marks_the_node_it_replaced() -> None:
    states: list[Any] = [
        {"state": "succeeded", "node_rank": 0},
        {"state": "succeeded", "node_rank": 1},
        {"state": "unreachable", "reason": "connection refused"},
        {"state": "succeeded", "node_rank": 2},  # the spare, planned as slot 3
    ]
    out = with_replaced([0, 1, 2, 3], ["h1", "h2", "h3", "h4"], states)
    assert out[2]["state"] == "replaced" and out[2]["reason"].endswith("h4 took its place")
    assert NodeState.of(out[2]["state"]).final and not NodeState.REPLACED.bad
    assert out[:2] == states[:2] and out[3] == states[3]
    assert with_replaced([0, 1], ["h1", "h2"], states[:2]) == states[:2]


@pytest.mark.parametrize("value", ["0", "4", "two", "true", "[2]", "-1"])
def test_min_nodes_is_a_count_of_the_hosts_named_by_key_and_line(value: str) -> None:
    text = f"hosts: [a, b, c]\nmin_nodes: {value}\n"
    with pytest.raises(InventoryError, match=r"^<string>:2: min_nodes: expected a whole") as e:
        parse_inventory(text)
    paragraph = str(e.value).split("\n\n")[0]  # then the line, with a caret under the value
    assert "from 1 to 3 (the hosts listed)" in paragraph, paragraph
    assert parse_inventory("hosts: [a, b, c]\nmin_nodes: 2\n").min_nodes == 2
    assert parse_inventory("hosts: [a, b, c]\n").min_nodes == 0


def test_min_nodes_reaches_the_spec_and_a_bad_one_exits_2(tmp_path: Any) -> None:
    plan = plan_of(LaunchOptions(script="t.py", max_restarts=1, min_nodes=2))
    assert all(plan.spec(n)["min_nodes"] == 2 for n in plan.nodes)
    assert "min_nodes" not in plan_of(LaunchOptions(script="t.py")).spec(plan.nodes[0])
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts: [a, b]\nmin_nodes: 3\n")
    result = sshddp(["launch", "--dry-run", str(inv), "train.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{inv}:2: min_nodes: expected a whole number of nodes from 1 to 2" in result.err


def test_with_restarts_the_spares_are_planned_as_waiting_supervisors() -> None:
    text = THREE_HOSTS + "spares:\n  - {host: gpu-d, nproc: 2}\n"
    plain = plan_of(LaunchOptions(script="t.py"), text)
    assert [n.host.host for n in plain.nodes] == ["gpu-a", "gpu-b", "gpu-c"]  # no restarts
    plan = plan_of(LaunchOptions(script="t.py", max_restarts=1), text)
    spare = plan.nodes[3]
    assert (spare.host.host, spare.spare, spare.node_rank, spare.host.index) == (
        "gpu-d",
        True,
        3,
        3,
    )
    assert [n.host.host for n in plan.running] == ["gpu-a", "gpu-b", "gpu-c"]
    assert plan.world_size == 6 and spare.rundir.endswith("/n3")
    spec = plan.spec(spare)
    assert spec["spare"] is True and spec["node_rank"] == 3
    assert spec["peers"]["nnodes"] == 3 and spec["peers"]["spares"] == ["gpu-d"]
    assert spec["peers"]["hosts"] == ["gpu-a", "gpu-b", "gpu-c"]
    assert spec["watch"]["nprocs"] == [2, 2, 2] and spec["torchrun"]["nnodes"] == 3
    assert "spare" not in plan.spec(plan.nodes[0])


def test_the_launch_marks_the_node_a_spare_took_replaced_and_the_run_succeeded() -> None:
    nodes = [NodeResult(n, f"h{n + 1}") for n in range(4)]
    for n in (0, 1):
        nodes[n].apply({"state": "succeeded", "node_rank": n})
    nodes[2].state = NodeState.UNREACHABLE  # its host is gone: the follower gave up
    nodes[3].apply({"state": "succeeded", "node_rank": 2})  # the spare, seated as node 2
    assert nodes[3].seat == 2 and nodes[0].seat is None
    result = replaced_in(RunResult("r", nodes))
    assert result.nodes[2].state is NodeState.REPLACED and result.ok
    assert result.nodes[2].reason == "lost mid-run; h4 took its place"
    assert not replaced_in(RunResult("r", nodes[:3])).ok  # no spare's word: not replaced
