"""Pure parts of issue 12: node launchers (placeholders, environment, plan, spec), -H, the
exec command line and its grouping, the smoke verdict, and the launcher-aware report."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp.cli.smoke import parse_sizes
from sshddp.errors import ExitCode, InventoryError, UsageError
from sshddp.model import exec as execs
from sshddp.model.inventory import parse_host_list, parse_inventory
from sshddp.model.launchers import NodeFigures, expand, launcher_env
from sshddp.model.plan import CodeSpec, LaunchOptions, LaunchPlan, make_plan
from sshddp.model.report import launcher_failure, run_report
from sshddp.model.smoke import SmokeReport, find_record, render, verdict
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.protocol import contract
from sshddp.remote.node.supervisor import node_env, torchrun_argv

INV = parse_inventory(
    "defaults: {python: /opt/py}\nhosts:\n  - {host: a, nproc: 2}\n  - {host: b, nproc: 3}\n",
    source="inv.yaml",
)
FIGURES = NodeFigures(1, 2, 3, 5, "10.0.0.1", 29500)


SCRIPT = CodeSpec("file", "t.py", "/l/t.py")


def plan(options: LaunchOptions, code: CodeSpec = SCRIPT) -> LaunchPlan:
    return make_plan(INV, options, "r1", code, lambda h: f"{h.host}.addr")


# ------------------------------------------------------------------------- placeholders


def test_placeholders_take_every_figure_and_braces_escape() -> None:
    args = ["{node_rank}/{nnodes}", "{master_addr}:{master_port}", "{nproc}", "{world_size}"]
    assert expand(args, FIGURES.placeholders()) == ("1/2", "10.0.0.1:29500", "3", "5")
    assert expand(["{{node_rank}}", "a}}b", "x"], FIGURES.placeholders()) == (
        "{node_rank}",
        "a}b",
        "x",
    )


@pytest.mark.parametrize("bad", ["{rank}", "{node_rank", "a{", "}", "{ nnodes}", '{"a": 1}'])
def test_an_unknown_placeholder_or_lone_brace_is_refused_naming_the_argument(bad: str) -> None:
    with pytest.raises(UsageError) as err:
        expand(["ok", bad], FIGURES.placeholders())
    assert f"command argument 2 ({bad!r})" in err.value.message
    assert "{{" in err.value.message  # says how to write a literal brace


# ------------------------------------------------------------------------ environment


def test_torchrun_nodes_get_node_rank_and_node_launchers_everything() -> None:
    assert launcher_env("torchrun", FIGURES) == {"NODE_RANK": "1"}
    assert launcher_env("node", FIGURES) == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "NNODES": "2",
        "WORLD_SIZE": "5",
        "LOCAL_WORLD_SIZE": "3",
        "NPROC_PER_NODE": "3",
        "SSHDDP_RDZV_ENDPOINT": "10.0.0.1:29500",
    }


def test_sshddps_node_rank_wins_over_a_stray_one() -> None:
    p = plan(LaunchOptions(script="t.py", env=(("NODE_RANK", "7"),)))
    assert [n.env["NODE_RANK"] for n in p.nodes] == ["0", "1"]


# ------------------------------------------------------------------------------- plan


def test_node_launcher_runs_the_script_once_per_node_through_the_rank_shim() -> None:
    p = plan(LaunchOptions(script="t.py", script_args=("--x", "$1"), launcher="node"))
    for node in p.nodes:
        assert p.argv(node) == ("/opt/py", f"{node.rundir}/rank.py", "t.py", "--x", "$1")
        assert node.env["WORLD_SIZE"] == "5" and node.env["MASTER_ADDR"] == "a.addr"
        assert p.spec(node)["launcher"] == contract.LAUNCH_NODE
    assert [n.env["LOCAL_WORLD_SIZE"] for n in p.nodes] == ["2", "3"]


def test_node_launcher_command_is_expanded_per_node() -> None:
    command = ("accelerate", "launch", "--machine_rank", "{node_rank}", "--n", "{world_size}")
    p = plan(LaunchOptions(launcher="node", command=command), CodeSpec("none", "accelerate"))
    assert [p.argv(n) for n in p.nodes] == [
        ("accelerate", "launch", "--machine_rank", "0", "--n", "5"),
        ("accelerate", "launch", "--machine_rank", "1", "--n", "5"),
    ]
    assert p.spec(p.nodes[0])["launcher"] == contract.LAUNCH_COMMAND
    assert all(n.cwd == "~" for n in p.nodes)


def test_torchrun_spec_says_torchrun_and_max_restarts_is_torchruns_only() -> None:
    p = plan(LaunchOptions(script="t.py"))
    assert p.spec(p.nodes[0])["launcher"] == contract.LAUNCH_TORCHRUN
    assert contract.SCHEMA == 11
    with pytest.raises(UsageError, match="--max-restarts is torchrun's"):
        plan(LaunchOptions(script="t.py", launcher="node", max_restarts=2))


# ------------------------------------------------------------------- supervisor side


def test_supervisor_starts_each_launcher_as_planned(tmp_path: Path) -> None:
    p = plan(LaunchOptions(script="t.py", launcher="node"))
    spec = p.spec(p.nodes[1])
    assert torchrun_argv(str(tmp_path), spec) == [sys.executable, f"{tmp_path}/rank.py", "t.py"]
    cmd = plan(LaunchOptions(launcher="node", command=("accelerate", "{nproc}")))
    spec = cmd.spec(cmd.nodes[1])
    assert torchrun_argv(str(tmp_path), spec) == ["accelerate", "3"]
    env = node_env(str(tmp_path), spec, {})  # a command finds the host python's venv first
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env[contract.MARK_VAR] == spec["mark"]


# ---------------------------------------------------------------------------- -H list


def test_host_list_gives_hosts_with_counts_and_defaults() -> None:
    inv = parse_host_list("gpu-a:8,gpu-b:8,[::1]:2,cpu", python="/v/py", user="me")
    assert [(h.host, h.nproc, h.index) for h in inv.hosts] == [
        ("gpu-a", 8, 0),
        ("gpu-b", 8, 1),
        ("[::1]", 2, 2),
        ("cpu", None, 3),
    ]
    assert {(h.python, h.user) for h in inv.hosts} == {("/v/py", "me")}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a:2,b:x", "hosts[1] (entry 2, 'b:x'): expected a positive integer up to 1024, got 'x'"),
        ("a:2,a:3", "host 'a' is listed twice, as entries 1 and 2"),
        ("a,,b", "hosts[1] (entry 2, ''): an empty entry"),
        ("a;id:2", "hosts[0] (entry 1, 'a;id:2'): expected a host name"),
        ("a:0", "expected a positive integer up to 1024, got 0"),
        ("", "no hosts"),
    ],
)
def test_host_list_errors_name_the_entry(text: str, says: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_host_list(text)
    assert err.value.message.startswith("-H: ") and says in err.value.message


def test_host_list_checks_python_and_user_like_an_inventory() -> None:
    with pytest.raises(InventoryError, match=r"^-H: --python: expected an interpreter path"):
        parse_host_list("a", python="py; rm")
    with pytest.raises(InventoryError, match=r"^-H: --user: expected a user name"):
        parse_host_list("a", user="-oProxyCommand")


# ------------------------------------------------------------------------------- CLI


def test_launch_cli_with_h_and_a_command_after_dashdash() -> None:
    result = sshddp(
        ["launch", "--dry-run", "--launcher", "node", "-H", "a:2,b:1", "--", "echo", "{node_rank}"]
    )
    assert result.code == 0, result.explain()
    assert "command: echo 0" in result.out and "command: echo 1" in result.out
    assert "world size:  3 processes on 2 nodes" in result.out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["launch", "-H", "a", "--", "echo"], "needs --launcher node"),
        (["launch", "--launcher", "node", "-H", "a", "--"], "missing COMMAND"),
        (["launch", "--launcher", "node", "-m", "x", "-H", "a", "--", "e"], "exclude each other"),
        (["launch", "--python", "/p", "inv.yaml", "t.py"], "--python and --user go with -H"),
        (["launch", "-H", "a:2,a", "t.py"], "listed twice"),
        (["doctor", "-H", "a", "inv.yaml"], "not both"),
        (["exec", "-H", "a", "--", "-x"], "cannot be empty or start with '-'"),
        (["exec", "-H", "a", "--", "echo", "\udcff"], "argument 2 ('\\udcff') is not UTF-8"),
        (["smoke", "-H", "a", "--sizes", "1K,2Q"], "'2Q' is not a size"),
    ],
)
def test_bad_command_lines_exit_2_with_one_message(args: list[str], says: str) -> None:
    result = sshddp(args)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert says in result.err


def test_smoke_sizes() -> None:
    assert parse_sizes("4096,64K,1M,2g") == (4096, 65536, 1 << 20, 2 << 30)
    assert parse_sizes("") == ()


# ------------------------------------------------------------------------------ exec


def results() -> list[execs.HostExec]:
    ok, failed = execs.ExecStatus.OK, execs.ExecStatus.FAILED
    return [
        execs.HostExec(2, "c", failed, b"boom\n", exit=3),
        execs.HostExec(0, "a", ok, b"same\n", exit=0),
        execs.HostExec(1, "b", ok, b"same\n", exit=0),
        execs.HostExec(3, "d", execs.ExecStatus.UNREACHABLE, error="d: connection refused"),
    ]


def test_exec_groups_identical_output_in_host_order() -> None:
    assert execs.render(results()) == (
        b"----------------\na,b (exit 0)\n----------------\nsame\n"
        b"----------------\nc (exit 3)\n----------------\nboom\n"
        b"----------------\nd (unreachable)\n----------------\nd: connection refused\n"
    )
    assert execs.summary(results()) == (
        "sshddp: exec: failed on 2 of 4 host(s): c (exit 3); d (unreachable)"
    )


def test_exec_exit_codes() -> None:
    assert execs.exit_code(results()) == ExitCode.UNREACHABLE
    assert execs.exit_code(results()[:3]) == ExitCode.RUN_FAILED
    assert execs.exit_code(results()[1:3]) == ExitCode.OK
    doc = json.loads(execs.to_json(results()))
    assert [h["host"] for h in doc["hosts"]] == ["a", "b", "c", "d"] and not doc["ok"]


# ----------------------------------------------------------------------------- smoke


def record(links: dict[int, float], joined_nodes: list[int], total: int = 10) -> dict[str, Any]:
    return {
        "sshddp_smoke": 1,
        "backend": "gloo",
        "device": "cpu",
        "world_size": len(joined_nodes),
        "joined": [
            {"rank": r, "node": n, "local_rank": 0, "host": "x"} for r, n in enumerate(joined_nodes)
        ],
        "sum": total,
        "expected_sum": len(joined_nodes) * (len(joined_nodes) + 1) // 2,
        "allreduce": [{"bytes": 1024, "time_us": 10.0, "algbw_gbps": 0.1, "busbw_gbps": 0.15}],
        "p2p_bytes": 1 << 20,
        "p2p": [{"node": k, "rank": k, "gbps": g} for k, g in links.items()],
    }


def test_smoke_names_a_link_far_below_the_others() -> None:
    hosts = ("h0", "h1", "h2", "h3")
    report = SmokeReport(record({1: 1.0, 2: 0.2, 3: 1.1}, [0, 1, 2, 3]), hosts, (1, 1, 1, 1))
    assert report.ok and report.slow_nodes() == [2]
    assert verdict(report) == "warn: node 2 (h2) has a link to node 0 far below the others'"
    assert "h2                       0.200 GB/s  <- far below the others" in render(report)
    even = SmokeReport(record({1: 1.0, 2: 0.7, 3: 1.1}, [0, 1, 2, 3]), hosts, (1, 1, 1, 1))
    assert even.slow_nodes() == [] and verdict(even).startswith("ok: every rank joined")


def test_smoke_fails_when_a_node_is_missing_or_the_sum_is_wrong() -> None:
    hosts = ("h0", "h1", "h2")
    missing = SmokeReport(record({1: 1.0}, [0, 1], total=3), hosts, (1, 1, 1))
    assert not missing.ok and missing.missing == [2]
    assert verdict(missing) == "FAIL: node 2 (h2) did not join"
    wrong = SmokeReport(record({1: 1.0, 2: 1.0}, [0, 1, 2], total=5), hosts, (1, 1, 1))
    assert not wrong.ok and "the all-reduce's sum is wrong" in verdict(wrong)


def test_smoke_record_is_found_among_node_0s_lines() -> None:
    rec = record({}, [0])
    lines = ["noise", "{not json", json.dumps({"other": 1}), json.dumps(rec), "tail"]
    assert find_record(lines) == rec
    assert find_record(["nothing"]) is None


# ---------------------------------------------------------------------------- report


SPAWN_TAIL = """\
Traceback (most recent call last):
  File "spawn_job.py", line 80, in <module>
torch.multiprocessing.spawn.ProcessRaisedException:

-- Process 1 terminated with the following error:
Traceback (most recent call last):
RuntimeError: worker 1 of node 2 failed on purpose""".splitlines()


def test_report_names_the_worker_a_node_launcher_says_failed() -> None:
    assert launcher_failure(SPAWN_TAIL) == {"local_rank": 1, "by": "mp.spawn"}
    light = ["[rank: 1] Child process with PID 42 terminated with code 1. Forcefully terminating"]
    assert launcher_failure(light) == {"local_rank": 1, "by": "Lightning"}
    assert launcher_failure(["process 0 terminated with signal SIGKILL"])["local_rank"] == 0
    nodes = [NodeResult(k, f"h{k + 1}", NodeState.STOPPED) for k in range(3)]
    why = "the node's launcher exited with code 1"
    nodes[2] = NodeResult(2, "h3", NodeState.FAILED, 1, reason=why)
    text = run_report(RunResult("r1", nodes, root_cause=2), SPAWN_TAIL)
    assert f"root cause: node 2 on h3, local rank 1 (as mp.spawn says): {why}" in text
    assert text.rstrip().endswith(
        "RuntimeError: worker 1 of node 2 failed on purpose\n---".rstrip()
    )


def test_report_takes_the_rank_whose_own_error_it_is_not_a_peers_follow_on() -> None:
    lines = [
        "[rank3]: Traceback (most recent call last):",
        "[rank3]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:9114.",
        "[rank5]: Traceback (most recent call last):",
        '[rank5]:   File "train.py", line 26, in training_step',
        "[rank5]: ValueError: bad batch",
        "[rank4]: torch.distributed.DistBackendError: Connection reset by peer",
    ]
    assert launcher_failure(lines) == {"rank": 5}
    nodes = [NodeResult(0, "h1", NodeState.STOPPED), NodeResult(1, "h2", NodeState.FAILED, 1)]
    text = run_report(RunResult("r1", nodes, root_cause=1), lines)
    assert "root cause: node 1 on h2, global rank 5 (as its traceback says)" in text
    assert "[rank3]" not in text and text.count("[rank5]") == 3  # that rank's own lines


def test_exec_output_past_the_memory_bound_is_spilled_and_past_the_cap_cut_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run.exec.Spool: EXEC_IN_MEMORY bytes in memory, then an unlinked 0600 file in the
    private directory, up to EXEC_KEPT; the rest is counted and the report says so."""
    from sshddp import defaults
    from sshddp.run.exec import Spool

    monkeypatch.setattr(defaults, "EXEC_IN_MEMORY", 10)
    monkeypatch.setattr(defaults, "EXEC_KEPT", 25)
    spool = Spool(str(tmp_path))
    for chunk in (b"0123456", b"789abcdefghij\n", b"klmnopqrstuvwxyz"):
        spool.add(chunk)
    assert spool.file is not None and os.fstat(spool.file.fileno()).st_mode & 0o777 == 0o600
    assert list(tmp_path.iterdir()) == []  # unlinked: it goes with the command
    out = spool.done()
    assert b"".join(out.pieces()) == b"0123456789abcdefghij\nklmn" and out.size == 25
    assert out.cut == (
        "12 more bytes were not kept: the output is longer than sshddp keeps (25 bytes)"
    )
    ok = execs.ExecStatus.OK
    same = execs.HostExec(1, "b", ok, b"0123456789abcdefghij\nklmn", exit=0)
    text = execs.render([execs.HostExec(0, "a", ok, out, exit=0), same])
    assert text == (
        b"----------------\na (exit 0)\n----------------\n0123456789abcdefghij\nklmn\n"
        b"[sshddp: 12 more bytes were not kept: the output is longer than sshddp keeps "
        b"(25 bytes)]\n"
        b"----------------\nb (exit 0)\n----------------\n0123456789abcdefghij\nklmn\n"
    )
    gone = tmp_path / "gone"  # a spill that fails (a full disk, say): the rest is counted
    broken = Spool(str(gone))
    for chunk in (b"0123456789", b"abc", b"def"):
        broken.add(chunk)
    cut = broken.done()
    assert b"".join(cut.pieces()) == b"0123456789" and cut.cut == (
        f"6 more bytes were not kept: the temporary directory {gone} could not take more: "
        "No such file or directory"
    )
    quiet = Spool(str(tmp_path), keep=False)  # --stream: the lines went out, nothing is kept
    quiet.add(b"x" * 100)
    assert quiet.done().size == 0 and quiet.file is None


def test_exec_json_is_written_piece_by_piece_as_json_dumps_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--json decodes and escapes each host's output a piece at a time (a large output is
    never held whole): the document is json.dumps's, a UTF-8 character or a bad byte split
    between two pieces included."""
    monkeypatch.setattr(execs, "PIECE", 3)
    data = 'añ€😀"\\\n\x1b[31m'.encode() + b"\xff\xe2\x82 end"
    result = execs.HostExec(0, "a", execs.ExecStatus.OK, data, exit=0, seconds=0.5)
    pieces = list(execs.json_pieces([result, *results()[:1]]))
    assert len(pieces) > 10
    doc = json.loads("".join(pieces))
    assert doc["hosts"][0]["output"] == data.decode("utf-8", "replace")
    assert "".join(pieces) == json.dumps(
        {
            "ok": False,
            "hosts": [
                {
                    "node": 0,
                    "host": "a",
                    "status": "ok",
                    "exit": 0,
                    "output": data.decode("utf-8", "replace"),
                    "cut": None,
                    "error": None,
                    "seconds": 0.5,
                },
                {
                    "node": 2,
                    "host": "c",
                    "status": "failed",
                    "exit": 3,
                    "output": "boom\n",
                    "cut": None,
                    "error": None,
                    "seconds": 0.0,
                },
            ],
        },
        indent=2,
    )
