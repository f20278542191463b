"""A node whose rank died of a hardware error goes to a spare mid-run, and a spare checks its
health when node 0 needs it: node 0's choice (remote/node/seats.py), the supervisors'
decisions (remote/node/node_events.py), the words the attempt's output gives
(restarts.hardware_text), the messages (peer_messages) and what the run's end makes of them
(quarantine verdicts, replaced_in). No process, no socket."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from test_spare_seats import NAMES, healthy, node0, run

from sshddp.model.quarantine import verdicts
from sshddp.model.state import NodeResult, NodeState, RunResult, replaced_in, with_replaced
from sshddp.protocol import contract
from sshddp.protocol import peer_messages as pm
from sshddp.remote.node.node_ends import Ending
from sshddp.remote.node.node_events import (
    AWAITING,
    LINGERING,
    SPARE,
    CheckHealth,
    EndRun,
    Finish,
    HealthAsked,
    HealthChecked,
    Message,
    Node0Said,
    Reply,
    RunOver,
    Tell,
    decide,
    initial,
)
from sshddp.remote.node.restarts import hardware_text
from sshddp.remote.node.seats import reseat

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
HW = f"rank 2 died of a hardware error (uncorrectable ECC error): `{ECC}`"


def test_a_blamed_node_is_replaced_as_a_lost_one_and_node_0_never_is() -> None:
    seating = reseat((0, 1, 2), {2}, {0, 1, 2, 3}, (3,), 0, NAMES, blamed={2})
    assert (seating.members, seating.replaced) == ((0, 1, 3), (2,))
    none = reseat((0, 1, 2), {2}, {0, 1, 2}, (), 0, NAMES, blamed={2})
    assert none.refusal == ("node(s) 2 died of a hardware error and no spare can take its place")
    zero = reseat((0, 1, 2), {0}, {0, 1, 2, 3}, (3,), 0, NAMES, blamed={0})
    assert zero.refusal == (
        "node 0 (h1) died of a hardware error: node 0 is not replaced (it holds the "
        "rendezvous and decides restarts)"
    )


def test_an_unhealthy_spare_is_skipped_and_named() -> None:
    sick = {3: "`test ! -e /flag` exited 1: no output"}
    seating = reseat((0, 1, 2), {2}, set(range(5)), (3, 4), 0, NAMES, unhealthy=sick)
    assert seating.members == (0, 1, 4)
    assert seating.taken == (
        "h5 took its place (spare h4 skipped: failed its health check: `test ! -e /flag` "
        "exited 1: no output)",
    )
    alone = reseat((0, 1, 2), {2}, {0, 1, 3}, (3,), 0, NAMES, unhealthy=sick)
    assert alone.refusal == (
        "node(s) 2 cannot be reached and no spare can take its place (spare h4 failed its "
        "health check: `test ! -e /flag` exited 1: no output)"
    )


def test_node_0_replaces_a_node_whose_rank_died_of_a_hardware_error() -> None:
    state, actions = run(node0(), Message(2, pm.fail(1, "rank 2 exited with code 1", HW)))
    why = f"node 2 (h3): {HW}"
    assert actions == [Tell(pm.halt(1, why)), Tell(pm.check(1))]
    state, actions = run(state, Message(0, pm.halted(1)), Message(1, pm.halted(1)))
    assert actions == []  # the spares' answers are awaited
    state, actions = run(state, *healthy(1, 3, 4))
    assert actions == [Tell(pm.again(2, f"{why}; h4 took its place", [0, 1, 3], [2]))]
    assert state.name(2) == "spare h3" and state.decider.blamed == frozenset()


def test_a_hardware_error_said_after_another_failure_is_named_first() -> None:
    """Node 1's ranks fail first (their peer on node 2 vanished); node 2's halted says its
    rank died of an ECC error."""
    state, actions = run(node0(), Message(1, pm.fail(1, "rank 1 exited with code 1")))
    assert actions == [Tell(pm.halt(1, "node 1 (h2) failed: rank 1 exited with code 1"))]
    state, actions = run(state, Message(2, pm.halted(1, HW)), Message(0, pm.halted(1)))
    assert actions == [Tell(pm.check(1))]
    state, actions = run(state, *healthy(1, 3, 4))
    (tell,) = actions
    assert tell.msg["reason"] == (
        f"node 2 (h3): {HW}; node 1 (h2) failed: rank 1 exited with code 1; h4 took its place"
    )
    assert tell.msg["nodes"] == [0, 1, 3]


def test_a_hardware_error_on_node_0_ends_the_run_saying_why() -> None:
    _, actions = run(node0(), Message(0, pm.fail(1, "rank 0 exited with code 1", HW)))
    assert actions == [
        EndRun(
            f"node 0 (h1): {HW}; not restarted: node 0 (h1) died of a hardware error: node 0 "
            "is not replaced (it holds the rendezvous and decides restarts)"
        )
    ]


def test_a_plain_failure_restarts_on_the_same_hosts_with_no_check() -> None:
    state, actions = run(node0(), Message(2, pm.fail(1, "rank 2 exited with code 1")))
    why = "node 2 (h3) failed: rank 2 exited with code 1"
    assert actions == [Tell(pm.halt(1, why))]
    state, actions = run(state, Message(0, pm.halted(1)), Message(1, pm.halted(1)))
    assert actions == [Tell(pm.again(2, why))] and state.seated() == (0, 1, 2)


def test_an_unhealthy_spare_is_skipped_and_the_next_takes_the_place() -> None:
    state, _ = run(node0(), Message(2, pm.fail(1, "x", HW)))
    state, actions = run(state, Message(0, pm.halted(1)), Message(1, pm.halted(1)))
    state, actions = run(state, Message(3, pm.health(1, "`test ! -e /f` exited 1: no output")))
    assert actions == []  # h5 has yet to answer
    state, actions = run(state, *healthy(1, 4))
    (tell,) = actions
    assert tell.msg["nodes"] == [0, 1, 4]
    assert tell.msg["reason"].endswith(
        "h5 took its place (spare h4 skipped: failed its health check: `test ! -e /f` "
        "exited 1: no output)"
    )


def test_a_single_unhealthy_spare_ends_the_run_saying_why() -> None:
    state = node0(spares=1, names=NAMES[:4], heard=frozenset(range(4)))
    state, _ = run(state, Message(2, pm.fail(1, "x", HW)))
    state, _ = run(state, Message(0, pm.halted(1)), Message(1, pm.halted(1)))
    _, actions = run(state, Message(3, pm.health(1, "`test ! -e /f` exited 1: no output")))
    assert actions == [
        EndRun(
            f"node 2 (h3): {HW}; not restarted: node(s) 2 died of a hardware error and no "
            "spare can take its place (spare h4 failed its health check: `test ! -e /f` "
            "exited 1: no output)"
        )
    ]


def test_a_spare_that_goes_while_node_0_waits_for_its_answer_is_not_waited_for() -> None:
    from sshddp.remote.node.node_events import PeerView

    state, _ = run(node0(), Message(2, pm.fail(1, "x", HW)))
    state, _ = run(state, Message(0, pm.halted(1)), Message(1, pm.halted(1)), *healthy(1, 3))
    state, actions = run(
        state,
        PeerView(frozenset({0, 1, 2, 3}), frozenset({4})),
        Message(4, pm.done(4, contract.LOST, "dropped")),
    )
    assert len(actions) == 1 and actions[0].msg["nodes"] == [0, 1, 3]


def test_the_blamed_node_ends_once_node_0_seats_a_spare_in_its_place() -> None:
    state = replace(
        initial({"node_rank": 2, "restarts": 2, "peers": {"nnodes": 3}}),  # type: ignore[typeddict-item]
        phase=AWAITING,
        end=Ending(contract.FAILED, "torchrun exited with code 1", 1),
    )
    why = f"node 2 (h3): {HW}; h4 took its place"
    state, actions = decide(state, Node0Said(pm.again(2, why, [0, 1, 3], [2])))
    assert state.phase == LINGERING
    assert actions == [Finish(Ending(contract.STOPPED, contract.REPLACED_PREFIX + why))]


def test_a_waiting_spare_checks_its_health_when_asked_and_says_so_at_its_end() -> None:
    spare = initial({"node_rank": 3, "spare": True, "restarts": 1})  # type: ignore[typeddict-item]
    state, actions = decide(spare, HealthAsked(1))
    assert actions == [CheckHealth(1)] and state.phase == SPARE
    sick, actions = decide(state, HealthChecked(1, "`x` exited 1: no output"))
    assert actions == [Reply(pm.health(1, "`x` exited 1: no output"))]
    _, actions = decide(sick, RunOver())
    (finish,) = actions
    assert isinstance(finish, Finish) and finish.end.state == contract.SUCCEEDED
    assert finish.end.reason.startswith(contract.SPARE_UNHEALTHY + "`x` exited 1: no output; ")
    well, _ = decide(sick, HealthChecked(2, ""))
    assert decide(well, RunOver())[1][0].end.reason.startswith("a spare: ")  # type: ignore[union-attr]


def test_the_messages_read_back() -> None:
    for msg in (
        pm.fail(1, "r", HW),
        pm.fail(1, "r"),
        pm.halted(1, HW),
        pm.check(2),
        pm.health(2, ""),
        pm.health(2, "bad"),
    ):
        assert pm.decode(pm.encode(msg)) == msg
    assert pm.decode({"t": "health", "attempt": 1}) is None
    assert pm.decode({"t": "check"}) is None


def test_the_attempts_output_names_the_rank_and_the_hardware_error(tmp_path: Path) -> None:
    log = tmp_path / "node.log"
    log.write_text(
        "old attempt: uncorrectable ECC error\n"
        f"[rank2]: {ECC}\n"
        "Root Cause (first observed failure):\n[0]:\n  rank      : 2 (local_rank: 0)\n"
        "  exitcode  : 1 (pid: 7)\n"
    )
    offset = len("old attempt: uncorrectable ECC error\n")
    assert hardware_text(str(log), offset) == (
        f"rank 2 died of a hardware error (uncorrectable ECC error): `[rank2]: {ECC}`"
    )
    log.write_text("Traceback...\nValueError: boom\n")
    assert hardware_text(str(log), 0) == ""


def _node(rank: int, host: str, state: NodeState, **more: Any) -> NodeResult:
    return NodeResult(node_rank=rank, host=host, state=state, **more)


def test_the_run_quarantines_the_blamed_host_and_the_unhealthy_spare() -> None:
    why = f"node 2 (h3): {HW}; h5 took its place (spare h4 skipped: ...)"
    nodes = [
        _node(0, "h1", NodeState.SUCCEEDED, earlier=(why,)),
        _node(1, "h2", NodeState.SUCCEEDED, earlier=(why,)),
        _node(2, "h3", NodeState.STOPPED, reason=contract.REPLACED_PREFIX + why),
        _node(3, "h4", NodeState.SUCCEEDED, reason=contract.SPARE_UNHEALTHY + "`t` exited 1; a"),
        _node(4, "h5", NodeState.SUCCEEDED, seat=2, earlier=(why,)),
    ]
    result = replaced_in(RunResult(run_id="r", nodes=nodes))
    assert result.ok and result.nodes[2].state is NodeState.REPLACED
    assert result.nodes[2].reason == contract.REPLACED_PREFIX + why
    found = {v.host: v for v in verdicts(result, {})}
    assert set(found) == {"h3", "h4"}
    assert found["h3"].reason == "uncorrectable ECC error" and ECC in found["h3"].evidence
    assert (found["h4"].reason, found["h4"].evidence) == ("failed its health check", "`t` exited 1")


def test_ps_marks_the_blamed_node_replaced_in_its_own_words() -> None:
    said = contract.REPLACED_PREFIX + "node 2 (h3): x; h4 took its place"
    states = [
        {"state": "succeeded", "node_rank": 0},
        {"state": "stopped", "node_rank": 2, "reason": said},
        {"state": "succeeded", "node_rank": 2},
    ]
    out = with_replaced([0, 2, 3], ["h1", "h3", "h4"], states)
    assert out[1] == {"state": "replaced", "reason": said, "returncode": None}


DATA = Path(__file__).parent / "data" / "health"


def _smi(name: str) -> dict[str, Any]:
    return {"exit": 0, "timed_out": False, "output": (DATA / name).read_text()}


def test_a_spare_judges_its_look_as_the_launch_does() -> None:
    """The facts a spare's look gathers (``host_health``, the launch's subset), judged by
    the preflight's own judges: a failing ``health:`` command, a broken GPU in recorded
    ``nvidia-smi -q`` answers; a healthy pair, or a CPU host with no command, passes."""
    from sshddp.remote.node.spare_health import judged

    failed = {"exit": 1, "timed_out": False, "output": ""}
    assert judged({"command": failed}, "test -f /ok", 8.0) == "`test -f /ok` exited 1: no output"
    assert judged({"command": None}, "", 8.0) == ""
    healthy_gpus = {"command": None, "smi": _smi("smi-q-h100-healthy.txt"), "gpu_dev_count": 2}
    assert judged(healthy_gpus, "", 8.0, 2) == ""
    broken = judged({"smi": _smi("smi-q-a100-broken.txt"), "gpu_dev_count": 1}, "", 8.0)
    assert broken, "a broken A100 answers unhealthy"
    missing = judged(healthy_gpus, "", 8.0, 4)
    assert missing == "2 GPU(s) answer, the inventory expects 4", missing
    hung = {"smi": {"exit": None, "timed_out": True, "output": ""}, "gpu_dev_count": 8}
    assert "did not answer in time" in judged(hung, "", 8.0)
