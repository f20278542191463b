"""Quarantine: which run ends put a host in it (and which never do), its entries' expiry, the
file (owner-only, atomic, never through a link, a corrupt one named) and the command."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from cli_helpers import assert_clean_failure, sshddp
from registry_records import record
from sshddp.errors import ExitCode, Quarantined, StateError, UsageError
from sshddp.model import quarantine as model
from sshddp.model.checks import Finding, HostReport, Status
from sshddp.model.inventory import Host
from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.run import registry
from sshddp.run.quarantine import ends, store

NOW = 1_800_000_000.0
DAY = 86400.0


@pytest.fixture(autouse=True)
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSHDDP_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def node(rank: int, state: NodeState, reason: str = "", code: int | None = None) -> NodeResult:
    return NodeResult(rank, f"h{rank + 1}", state, code, reason=reason)


def run(*nodes: NodeResult, **kw: object) -> RunResult:
    return RunResult("r1", list(nodes), **kw)  # type: ignore[arg-type]


def hosts(found: list[model.Verdict]) -> dict[str, str]:
    return {v.host: v.reason for v in found}


# --- which ends quarantine -------------------------------------------------------------------


def test_a_lost_node_quarantines_its_host_and_only_it() -> None:
    died = "the node's supervisor died (its host rebooted or its processes were killed)"
    peer = "stopped: node 0 (h1) lost: the node's supervisor died"
    result = run(node(0, NodeState.LOST, died), node(1, NodeState.STOPPED, peer), root_cause=0)
    found = model.verdicts(result, {})
    assert hosts(found) == {"h1": "lost"} and found[0].evidence == died


def test_a_node_the_supervisors_lost_and_we_cannot_reach_is_quarantined() -> None:
    """Host down or cut off mid-run: the coordinator cannot reach it, its peers say it went
    silent; the peers' words are the evidence."""
    said = "node 2 (h3) lost: node 2 (h3) went silent or lost its supervisor"
    result = run(
        node(0, NodeState.STOPPED, "stopped: " + said),
        node(1, NodeState.STOPPED, "stopped: " + said),
        node(2, NodeState.UNREACHABLE, "h3: the SSH connection was lost"),
    )
    found = model.verdicts(result, {})
    assert hosts(found) == {"h3": "lost"} and found[0].evidence == said


def test_a_host_lost_mid_run_whose_node_a_spare_took_is_quarantined() -> None:
    """The run succeeded on a spare: node 0's reason for the restart names the lost host."""
    why = "node 2 (h3) lost (no heartbeat for 5 s); h4 took its place"
    done = [replace(node(n, NodeState.SUCCEEDED), earlier=(why,)) for n in range(3)]
    found = model.verdicts(run(*done), {})
    assert hosts(found) == {"h3": "lost"} and found[0].evidence == why
    failed = "node 1 (h2) failed: x; node 2 (h3) lost (not connected to node 0's supervisor)"
    done = [replace(node(n, NodeState.SUCCEEDED), earlier=(failed,)) for n in range(3)]
    assert hosts(model.verdicts(run(*done), {})) == {"h3": "lost"}
    plain = [
        replace(node(n, NodeState.SUCCEEDED), earlier=("node 1 (h2) failed: x",)) for n in range(3)
    ]
    assert model.verdicts(run(*plain), {}) == []


def test_unreachable_alone_quarantines_nobody() -> None:
    """Only we lost contact (our network, our laptop's sleep): the run may still be going."""
    result = run(node(0, NodeState.RUNNING), node(1, NodeState.UNREACHABLE, "lost contact"))
    assert model.verdicts(result, {}) == []


def test_a_rank_s_own_exception_quarantines_nobody() -> None:
    tail = ["Traceback (most recent call last):", '  File "t.py", line 3', "ValueError: boom"]
    result = run(
        node(0, NodeState.FAILED, "rank 0 exited with code 1", 1),
        node(1, NodeState.STOPPED, "stopped: node 0 (h1) failed: rank 0 exited with code 1"),
        root_cause=0,
    )
    assert model.verdicts(result, {0: tail}) == []


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "uncorrectable ECC"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "Xid"),
        (
            "torch.distributed.DistBackendError: NCCL error: unhandled system error, "
            "NCCL version 2.21.5; ibv_modify_qp failed on device mlx5_0",
            "NCCL",
        ),
    ],
)
def test_a_hardware_error_in_a_failed_node_s_log_quarantines_its_host(
    line: str, reason: str
) -> None:
    result = run(node(0, NodeState.SUCCEEDED), node(1, NodeState.FAILED, "exit 1", 1))
    found = model.verdicts(result, {1: ["step 10", line, "more"]})
    assert list(hosts(found)) == ["h2"] and reason in found[0].reason
    assert found[0].evidence == line


def test_an_nccl_system_error_that_names_no_device_is_not_hardware() -> None:
    assert (
        model.hardware_error(["NCCL error: unhandled system error (run with NCCL_DEBUG)"]) is None
    )


@pytest.mark.parametrize(
    "reason",
    ["interrupted by the user (Ctrl-C)", "stopped on request (sshddp stop)"],
)
def test_the_user_ending_a_run_quarantines_nobody(reason: str) -> None:
    result = run(
        node(0, NodeState.STOPPED, reason),
        node(1, NodeState.LOST, "the node's supervisor died"),
        interrupted=True,
    )
    assert model.verdicts(result, {}) == []


def test_the_only_node_that_never_joined_is_quarantined_a_stall_is_not() -> None:
    never = (
        "the world did not form within 60 s (--init-timeout): node 0 (h1): 0/1 joined, ranks "
        "0 wait in init_process_group; node 1 (h2): never reported (ranks 1)"
    )
    result = run(node(0, NodeState.STALLED, never), node(1, NodeState.STOPPED, "stopped: x"))
    assert hosts(model.verdicts(result, {})) == {"h2": "never joined"}
    two = never + "; node 2 (h3): never reported (ranks 2)"
    result = run(
        node(0, NodeState.STALLED, two), node(1, NodeState.STOPPED), node(2, NodeState.STOPPED)
    )
    assert model.verdicts(result, {}) == []  # not one node's fault
    stall = "no rank wrote output for 300 s, nor were the ranks seen working (--stall-timeout 300)"
    assert (
        model.verdicts(run(node(0, NodeState.STALLED, stall), node(1, NodeState.STOPPED)), {}) == []
    )


def test_unreachable_at_launch_is_a_connection_that_failed_not_a_login_refused() -> None:
    def report(i: int, message: str) -> HostReport:
        return HostReport(Host(f"h{i + 1}", i), (Finding("ssh", Status.FAIL, message),))

    reports = [
        report(0, "h1: connection refused"),
        report(1, "h2: timed out connecting"),
        report(2, "h3: authentication failed (Authentication failed.)"),
        report(3, "h4: the host key CHANGED: ..."),
    ]
    assert hosts(model.bad_at_launch(reports)) == {
        "h1": "unreachable at launch",
        "h2": "unreachable at launch",
    }


def test_a_host_that_fails_a_health_check_at_launch_is_quarantined_a_warning_is_not() -> None:
    def report(i: int, *found: Finding) -> HostReport:
        return HostReport(Host(f"h{i + 1}", i), (Finding("ssh", Status.OK, "ok"), *found))

    reports = [
        report(0, Finding("health", Status.FAIL, "`check-gpu.sh` exited with code 4: ECC")),
        report(1, Finding("xid", Status.FAIL, "Xid 79: GPU has fallen off the bus")),
        report(2, Finding("ib", Status.WARN, "mlx5_0 port 1: link_downed 3")),
        report(3, Finding("python", Status.FAIL, "python3 not found")),  # set-up, not health
        report(4, Finding("health", Status.FAIL, "`chek-gpu` exited 127: chek-gpu: not found")),
    ]
    found = model.bad_at_launch(reports)
    assert hosts(found) == {"h1": "failed its health check", "h2": "failed its health check"}
    assert [v.evidence for v in found][0] == "`check-gpu.sh` exited with code 4: ECC"


# --- entries ---------------------------------------------------------------------------------


def entry(host: str, until: float = NOW + DAY, reason: str = "lost") -> model.Entry:
    return model.Entry(host, reason, "no heartbeat for 10 s", NOW, until, "r1")


def test_entries_expire_and_a_new_one_replaces_its_host_s() -> None:
    q = model.Quarantine((entry("h1"), entry("h2", until=NOW + 10)))
    assert [e.host for e in q.active(NOW + 5)] == ["h1", "h2"]
    assert [e.host for e in q.active(NOW + 10)] == ["h1"]  # until is the first moment out
    assert q.of("h2", NOW + 11) is None
    later = q.adding([entry("h1", until=NOW + 2 * DAY, reason="uncorrectable ECC error")], NOW + 11)
    assert [(e.host, e.reason) for e in later.entries] == [("h1", "uncorrectable ECC error")]
    assert later.clearing(["h1"], NOW).entries == () and q.clearing(None, NOW).entries == ()


def test_a_cooldown_of_zero_quarantines_nobody() -> None:
    found = [model.Verdict("h1", "lost", "x")]
    assert model.entries(found, NOW, 0, "r1") == []
    assert model.entries(found, NOW, 60, "r1")[0].until == NOW + 60


def test_the_report_line_names_host_until_reason_and_evidence() -> None:
    line = model.line(entry("h3"))
    assert line == f"quarantined h3 until {model.when(NOW + DAY)}: lost (no heartbeat for 10 s)"
    result = run(node(0, NodeState.LOST, "gone"), root_cause=0, quarantined=("sshddp: " + line,))
    assert run_report(result, []).endswith("sshddp: " + line)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("24h", DAY),
        ("30m", 1800.0),
        ("90s", 90.0),
        ("2d", 2 * DAY),
        ("1h30m", 5400.0),
        ("0", 0.0),
        ("45", 45.0),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert model.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "3x", "-1h", "1h 2", "nan", "1e3", "400d"])
def test_what_is_not_a_duration_is_said(text: str) -> None:
    with pytest.raises(ValueError, match="duration|longer than"):
        model.parse_duration(text)


def test_a_malformed_document_names_the_entry() -> None:
    with pytest.raises(ValueError, match=r"hosts\[1\]"):
        model.of_json(
            {"hosts": [model.to_json(model.Quarantine((entry("h1"),)))["hosts"][0], {"host": 3}]}
        )
    with pytest.raises(ValueError, match="list 'hosts'"):
        model.of_json([])


# --- the file ----------------------------------------------------------------------------------


def test_the_file_is_owner_only_and_round_trips(state: Path) -> None:
    store.change(lambda q: q.adding([entry("h1")], NOW))
    path = state / "quarantine.json"
    assert path.stat().st_mode & 0o777 == 0o600
    assert store.load().entries == (entry("h1"),)
    assert sorted(p.name for p in state.iterdir()) == ["quarantine.json", "runs"]  # no .tmp


def test_a_failed_write_leaves_the_old_file_whole(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a crash mid-write: the new content goes aside first, and only a whole file moves."""
    store.change(lambda q: q.adding([entry("h1")], NOW))
    before = (state / "quarantine.json").read_bytes()

    def full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(StateError) as caught:
        store.change(lambda q: q.adding([entry("h2")], NOW))
    assert (
        "quarantine file" in caught.value.message
        and caught.value.exit_code == ExitCode.LOG_WRITE_FAILED
    )
    assert (state / "quarantine.json").read_bytes() == before
    assert sorted(p.name for p in state.iterdir()) == ["quarantine.json", "runs"]


def test_a_corrupt_file_or_a_link_is_named(state: Path, tmp_path: Path) -> None:
    state.mkdir(parents=True)
    path = state / "quarantine.json"
    path.write_text('{"hosts": [')
    with pytest.raises(StateError, match=f"{path} is malformed"):
        store.load()
    path.unlink()
    (tmp_path / "elsewhere.json").write_text(json.dumps({"hosts": []}))
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(StateError, match="symbolic link"):
        store.load()
    result = sshddp(["quarantine"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert str(path) in result.err


def test_clearing_a_host_never_quarantined_is_bad_input_and_clears_nothing(state: Path) -> None:
    store.change(lambda q: q.adding([entry("h1", until=time.time() + DAY)], NOW))
    with pytest.raises(UsageError, match="h9: not quarantined"):
        store.clear(["h1", "h9"])
    assert [e.host for e in store.active()] == ["h1"]
    result = sshddp(["quarantine", "--clear", "h9"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "h9" in result.err and "quarantined now: h1" in result.err


def test_the_command_lists_and_clears(state: Path) -> None:
    assert sshddp(["quarantine"]).err.startswith("sshddp: no host is quarantined")
    now = time.time()
    store.change(
        lambda q: q.adding([entry("h1", until=now + DAY), entry("h2", until=now + DAY)], now)
    )
    listed = sshddp(["quarantine"])
    assert listed.code == 0 and "h1" in listed.out and "lost" in listed.out, listed.explain()
    doc = json.loads(sshddp(["quarantine", "--json"]).out)
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2"]
    assert sshddp(["quarantine", "--clear", "h1"]).code == 0
    assert [e.host for e in store.active()] == ["h2"]
    assert sshddp(["quarantine", "--all"]).code == 0 and store.active() == ()
    assert_clean_failure(sshddp(["quarantine", "--all", "--clear", "h1"]), ExitCode.BAD_INPUT)


def test_a_launch_on_a_quarantined_host_is_refused_in_one_line(state: Path) -> None:
    now = time.time()
    store.change(lambda q: q.adding([entry("h2", until=now + DAY)], now))
    store.refuse([Host("h1", 0)])  # not quarantined: nothing said
    with pytest.raises(Quarantined) as caught:
        store.refuse([Host("h1", 0), Host("h2", 1)])
    said = caught.value.message
    assert caught.value.exit_code == ExitCode.CHECK_FAILED and "\n" not in said
    assert "h2 is quarantined until" in said and ": lost" in said
    assert "sshddp quarantine --clear h2" in said and "--ignore-quarantine" in said


def test_a_bad_quarantine_for_is_bad_input(tmp_path: Path) -> None:
    result = sshddp(["launch", "--quarantine-for", "soon", "--dry-run", "-H", "h1", "t.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "'soon' is not a duration" in result.err


# --- once per run ----------------------------------------------------------------------------


def test_a_run_s_end_quarantines_once_even_after_a_clear(state: Path) -> None:
    """Whoever learns of the end first decides; a `ps` after `--clear` does not put the host
    back."""
    registry.create(record())
    lost = run(node(0, NodeState.LOST, "the node's supervisor died"), node(1, NodeState.STOPPED))
    lines = ends.after_run(lost)
    assert len(lines) == 1 and lines[0].startswith("sshddp: quarantined h1 until"), lines
    assert registry.load("r1").judged
    store.clear(["h1"])
    assert ends.after_run(lost) == [] and store.active() == ()


def test_the_run_s_quarantine_for_is_used_and_zero_quarantines_nobody(state: Path) -> None:

    registry.create(replace(record(), quarantine_for=0.0))
    states = [{"state": "lost", "reason": "the node's supervisor died"}, {"state": "stopped"}]
    ended = registry.record_end("r1", lambda r: r.ended_from(states))  # type: ignore[arg-type]
    assert ended is not None and ends.after_record(ended) == [] and store.active() == ()
    registry.create(replace(record("r2"), quarantine_for=60.0))
    ended = registry.record_end("r2", lambda r: r.ended_from(states))  # type: ignore[arg-type]
    assert ends.after_record(ended)  # ps learned of the end: h0 quarantined for a minute
    (only,) = store.active()
    assert only.host == "h0" and 59 < only.until - only.since <= 60
    assert registry.record_end("r2", lambda r: r.ended_from(states)) is None  # once


def test_doctor_marks_a_quarantined_host_with_a_warning_and_its_fix() -> None:
    ok = Finding("ssh", Status.OK, "ok")
    reports = [HostReport(Host("h1", 0), (ok,)), HostReport(Host("h2", 1), (ok,))]
    marked = model.marked(reports, model.Quarantine((entry("h2"),)), NOW)
    assert marked[0] == reports[0]
    (mark,) = [f for f in marked[1].findings if f.check == model.CHECK]
    assert mark.status is Status.WARN and mark.fix == "sshddp quarantine --clear h2"
    assert mark.message == model.line(entry("h2"))
    assert model.marked(reports, model.Quarantine((entry("h2"),)), NOW + DAY) == reports
