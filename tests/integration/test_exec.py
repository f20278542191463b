"""``sshddp exec`` against real sshd hosts: grouping, exit codes, argv verbatim, a host down."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from cli_helpers import Result, assert_clean_failure, sshddp
from hostile_values import NASTY, has_surrogate
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

#: Prints its argv as JSON: what arrived on the host, word for word.
ECHO_ARGV = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]


def exec_(cluster: SshdCluster, *args: str) -> Result:
    return sshddp(["exec", "--ssh-config", str(cluster.ssh_config), *args])


def test_identical_outputs_are_grouped_and_a_failing_host_is_named(ssh_env: SshdCluster) -> None:
    # Every host has its own $HOME (sshd's SetEnv), so h3 can answer differently.
    script = "case $HOME in */h3/*) echo other; exit 3;; *) echo same;; esac"
    result = exec_(ssh_env, "-H", "h1,h2,h3", "--", "sh", "-c", script)
    assert result.code == ExitCode.RUN_FAILED, result.explain()
    assert result.raw.decode() == (
        "----------------\nh1,h2 (exit 0)\n----------------\nsame\n"
        "----------------\nh3 (exit 3)\n----------------\nother\n"
    )
    assert "failed on 1 of 3 host(s): h3 (exit 3)" in result.err


def test_every_host_ok_exits_0_and_json_has_each_host(ssh_env: SshdCluster) -> None:
    result = exec_(ssh_env, "--json", "-H", "h1,h2", "--", "sh", "-c", "echo out; echo err >&2")
    assert result.code == 0, result.explain()
    hosts = json.loads(result.out)["hosts"]
    assert [(h["host"], h["status"], h["exit"]) for h in hosts] == [
        ("h1", "ok", 0),
        ("h2", "ok", 0),
    ]
    assert all(h["output"] == "out\nerr\n" for h in hosts)  # stderr joins stdout, in order


def test_hostile_argv_arrives_verbatim(ssh_env: SshdCluster, tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    args = [v for v in NASTY if not has_surrogate(v)] + [f"$(touch {canary})", f"; touch {canary}"]
    result = exec_(ssh_env, "--json", "-H", "h1,h2", "--", *ECHO_ARGV, *args)
    assert result.code == 0, result.explain()
    for host in json.loads(result.out)["hosts"]:
        assert json.loads(host["output"]) == args
    assert not canary.exists()


def test_stream_prefixes_lines_as_they_come(ssh_env: SshdCluster) -> None:
    result = exec_(ssh_env, "--stream", "-H", "h1,h2", "--", "sh", "-c", "echo a; echo b")
    assert result.code == 0, result.explain()
    assert sorted(result.raw.decode().splitlines()) == ["h1: a", "h1: b", "h2: a", "h2: b"]


def test_timeout_names_the_host(ssh_env: SshdCluster) -> None:
    script = "case $HOME in */h2/*) sleep 30;; esac; echo done"
    result = exec_(ssh_env, "--timeout", "3", "-H", "h1,h2", "--", "sh", "-c", script)
    assert result.code == ExitCode.RUN_FAILED, result.explain()
    assert "h2 (timed out)" in result.err and "h1 (exit 0)" in result.raw.decode()


def test_a_host_down_is_named_with_exit_4(make_cluster: Callable[..., SshdCluster]) -> None:
    private = make_cluster(2)
    private.stop_host(2)
    result = sshddp(
        ["exec", "--ssh-config", str(private.ssh_config), "--connect-timeout", "3"]
        + ["-H", "h1,h2", "--", "echo", "up"]
    )
    assert_clean_failure(result, ExitCode.UNREACHABLE)
    assert "h1 (exit 0)\n----------------\nup\n" in result.raw.decode()
    assert "h2 (unreachable)" in result.raw.decode() and "h2 (unreachable)" in result.err


def test_bad_command_line_is_refused_before_connecting(ssh_env: SshdCluster) -> None:
    assert_clean_failure(exec_(ssh_env, "-H", "h1", "--"), ExitCode.BAD_INPUT)
    assert_clean_failure(exec_(ssh_env, "-H", "h1:x", "--", "true"), ExitCode.BAD_INPUT)
    assert_clean_failure(exec_(ssh_env, "-H", "h1", "--", "-rf"), ExitCode.BAD_INPUT)
