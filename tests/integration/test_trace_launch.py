"""The coordinator's trace of a real launch on the sshd lab: ``-v`` on stderr, ``SSHDDP_LOG``
in a file, with every host's connection, the phases in order, and no secret."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Callable

from launch_helpers import launch

from sshddp_lab.sshd import SshdCluster

TRACE = re.compile(r"^sshddp\[\+\d+\.\d{3}s\] (.*)$", re.M)
PHASES = ["plan", "preflight", "stage", "start", "follow"]


def traced(text: str) -> list[str]:
    return TRACE.findall(text)


def assert_launch_traced(lines: list[str], secret: str) -> None:
    text = "\n".join(lines)
    for host in ("h1", "h2"):
        assert re.search(
            rf"^connect {host} \(\S+@127\.\S+:\d+\): ok in \d+\.\d+ s, host key \S+ SHA256:\S+ "
            r"\(known\)$",
            text,
            re.M,
        ), text
        assert re.search(rf"^preflight {host}: ok ", text, re.M), text
        assert re.search(rf"^follow node \d \({host}\): ended succeeded$", text, re.M), text
    begins = [lines.index(f"{p}: begin") for p in PHASES]
    assert begins == sorted(begins), text
    for phase in PHASES:
        assert re.search(rf"^{phase}: done in \d+\.\d{{3}} s$", text, re.M), text
    report = next(i for i, line in enumerate(lines) if line.startswith("report: "))
    assert begins[-1] < report, text
    assert secret not in text


def test_verbose_launch_traces_connections_phases_and_no_secret(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    opts = ["-v", "--env", f"API_TOKEN={secret}"]
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], opts=opts, hosts=[1, 2], nproc=1)
    assert run.rc == 0, run.stderr
    assert_launch_traced(traced(run.stderr), secret)
    assert secret not in run.stdout + run.stderr
    run_no_leak(run.run_id)


def test_sshddp_log_writes_the_trace_to_a_file_only(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
    monkeypatch,
) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    log = tmp_path / "trace.log"
    monkeypatch.setenv("SSHDDP_LOG", str(log))  # the CLI subprocess inherits it
    opts = ["-v", "--env", f"API_TOKEN={secret}"]
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], opts=opts, hosts=[1, 2], nproc=1)
    assert run.rc == 0, run.stderr
    assert traced(run.stderr) == []
    assert_launch_traced(traced(log.read_text()), secret)
    run_no_leak(run.run_id)
