"""``sshddp exec`` against real sshd hosts: grouping, exit codes, argv verbatim, a host down."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import yaml
from launch_helpers import SSHDDP, cli_env

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


def test_three_of_twelve_hosts_down_are_named_within_the_connect_timeout(
    make_cluster: Callable[..., SshdCluster],
) -> None:
    lab = make_cluster(12)
    aliases = [h.alias for h in lab.hosts]
    for refusing in (4, 9):
        lab.stop_host(refusing)
    silent = lab.sshd_pid(7)  # accepts TCP (the kernel's backlog), never says a word
    assert silent is not None
    os.kill(silent, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = sshddp(
            ["exec", "--ssh-config", str(lab.ssh_config), "--connect-timeout", "3"]
            + ["-H", ",".join(aliases), "--", "echo", "up"]
        )
        took = time.monotonic() - started
    finally:
        os.kill(silent, signal.SIGCONT)
    assert_clean_failure(result, ExitCode.UNREACHABLE)
    shown = result.raw.decode()
    up = [a for a in aliases if a not in ("h4", "h7", "h9")]
    assert f"{','.join(up)} (exit 0)\n----------------\nup\n" in shown, shown
    for refused in ("h4", "h9"):  # each under its own header: the message names its address
        assert f"{refused} (unreachable)" in shown, shown
    assert shown.count("connection refused") == 2, shown
    assert "h7 (unreachable)" in shown and "no SSH server answered" in shown, shown
    for down in ("h4", "h7", "h9"):
        assert down in result.err, result.explain()
    assert took < 3 + 10, f"{took:.1f} s"  # the timeout, and the command's own start


def test_bad_command_line_is_refused_before_connecting(ssh_env: SshdCluster) -> None:
    assert_clean_failure(exec_(ssh_env, "-H", "h1", "--"), ExitCode.BAD_INPUT)
    assert_clean_failure(exec_(ssh_env, "-H", "h1:x", "--", "true"), ExitCode.BAD_INPUT)
    assert_clean_failure(exec_(ssh_env, "-H", "h1", "--", "-rf"), ExitCode.BAD_INPUT)


#: What a hostile host writes: a colour (kept), then a clipboard write (OSC 52), a retitle,
#: a screen clear, 8-bit C1 controls raw and as UTF-8, and a \r to overprint the prefix.
HOSTILE = (
    b"ok \x1b[31mred\x1b[0m \x1b]52;c;cm0gLXJmIH4K\x07 \x1b]0;title\x07 \x1b[2J \x9b2J "
    b"\xc2\x9d0;t\x07\nbar 10%\rh9: forged\n"
)
WRITE_HOSTILE = [sys.executable, "-c", f"import sys; sys.stdout.buffer.write({HOSTILE!r})"]
ATTACKS = (b"\x1b]52", b"\x1b]0;", b"\x1b[2J", b"\x9b", b"\xc2\x9d", b"\x07")


def on_a_terminal(cluster: SshdCluster, *args: str) -> bytes:
    """``sshddp exec ARGS`` with a real pseudo-terminal as its stdout: what it shows."""
    command = shlex.join([*SSHDDP, "exec", *args])
    shown = subprocess.run(
        ["script", "-qec", command, "/dev/null"],
        env={**cli_env(cluster), "TERM": "xterm"},
        capture_output=True,
        timeout=180,
    )
    assert shown.returncode == 0, shown.stdout.decode("utf-8", "replace")
    return shown.stdout


def test_a_terminal_gets_the_hosts_colours_but_no_other_escape(ssh_env: SshdCluster) -> None:
    grouped = on_a_terminal(ssh_env, "-H", "h1,h2", "--", *WRITE_HOSTILE)
    streamed = on_a_terminal(ssh_env, "--stream", "-H", "h1,h2", "--", *WRITE_HOSTILE)
    for shown in (grouped, streamed):
        assert b"ok \x1b[31mred\x1b[0m" in shown, shown
        assert not [a for a in ATTACKS if a in shown], shown
    # a streamed line shows where its \r leaves it, after its own host's prefix
    assert b"h1: h9: forged" in streamed and b"\rh9" not in streamed, streamed
    # --json stays exact on a terminal, and so does every byte when piped
    as_json = on_a_terminal(ssh_env, "--json", "-H", "h1", "--", *WRITE_HOSTILE)
    doc, _ = json.JSONDecoder().raw_decode(as_json.decode())  # then stderr's summary line
    host = doc["hosts"][0]
    assert host["output"] == HOSTILE.decode("utf-8", "replace"), as_json
    piped = exec_(ssh_env, "-H", "h1,h2", "--", *WRITE_HOSTILE)
    assert piped.code == 0 and HOSTILE in piped.raw, piped.explain()
    streamed_piped = exec_(ssh_env, "--stream", "-H", "h1", "--", *WRITE_HOSTILE)
    lines = HOSTILE.split(b"\n")[:-1]
    assert streamed_piped.raw == b"".join(b"h1: " + line + b"\n" for line in lines)


def test_a_command_runs_as_under_a_node_launcher_venv_first_with_the_inventory_env(
    ssh_env: SshdCluster, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    tool = venv / "bin" / "venv-tool"  # like accelerate: a console script of the venv
    tool.write_text("#!/bin/sh\necho tool of the venv\n")
    tool.chmod(0o755)
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        yaml.safe_dump(
            {
                "defaults": {"python": str(venv / "bin" / "python"), "env": {"FROM_INV": "x 1"}},
                "hosts": [{"host": "h1"}, {"host": "h2", "env": {"FROM_INV": "h2's"}}],
            }
        )
    )
    script = "import os, sys; print(sys.prefix, os.environ.get('FROM_INV'))"
    result = exec_(ssh_env, "--json", str(inv), "--", "python3", "-c", script)
    assert result.code == 0, result.explain()
    outputs = [host["output"] for host in json.loads(result.out)["hosts"]]
    assert outputs == [f"{venv} x 1\n", f"{venv} h2's\n"], outputs
    tool_run = exec_(ssh_env, str(inv), "--", "venv-tool")
    assert tool_run.code == 0 and "tool of the venv" in tool_run.raw.decode(), tool_run.explain()
    missing = exec_(ssh_env, str(inv), "--", "no-such-command-here")
    assert missing.code == ExitCode.RUN_FAILED
    assert "sshddp exec: no-such-command-here: No such file or directory" in missing.raw.decode()
    assert "h1,h2 (exit 127)" in missing.raw.decode()
