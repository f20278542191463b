"""sshddp launch across real sshd hosts with real torchrun (gloo on CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import JOB, SSHDDP, cli_env, launch, run_id_of, write_inventory

from sshddp_lab.sshd import SshdCluster


def test_allreduce_ranks_and_logs(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["ok"])
    assert run.rc == 0, run.stderr
    for node in range(3):
        summaries = [j for j in run.json_lines(node) if "sum" in j]
        assert sorted(j["rank"] for j in summaries) == [2 * node, 2 * node + 1]
        assert all(j["sum"] == 15.0 and j["world"] == 6 for j in summaries)
        assert all(j["node_rank"] == node and j["run_id"] == run.run_id for j in summaries)
        lines = run.local_log(node).read_text().splitlines()
        for rank in (2 * node, 2 * node + 1):
            mine = [ln for ln in lines if ln.startswith(f"rank {rank} line ")]
            assert mine == [f"rank {rank} line {i}" for i in range(50)]
        assert run.local_log(node).read_bytes() == run.remote_log(node).read_bytes()
    assert "succeeded" in run.stderr
    run_no_leak(run.run_id)


def test_argv_arrives_verbatim(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    nasty = [
        "a b",
        "it's",
        '"dq"',
        "$(touch /tmp/pwned)",
        "`id`",
        "x; rm -rf ~",
        "l1\nl2",
        "ünïcødé ✓",
        "--lr",
        "0.1",
        "",
        "*",
        "~",
        "$HOME",
    ]
    run = launch(ssh_env, tmp_path, free_port(), ["argv", *nasty], hosts=[1, 2], nproc=1)
    assert run.rc == 0, run.stderr
    for node in range(2):
        (summary,) = [j for j in run.json_lines(node) if "argv" in j]
        assert summary["argv"] == nasty
    assert not Path("/tmp/pwned").exists()
    run_no_leak(run.run_id)


def test_env_arrives_and_secret_stays_out_of_argv_and_logs(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "s3cr3t-" + os.urandom(6).hex()
    monkeypatch.setenv("API_TOKEN", secret)  # `--env API_TOKEN` copies it: in no argv at all
    opts = ["--env", "API_TOKEN", "--env", "PLAIN=value with spaces"]
    inv_env = {"FROM_INV": "inv"}
    run = launch(
        ssh_env,
        tmp_path,
        free_port(),
        ["secret", "API_TOKEN"],
        opts=opts,
        hosts=[1, 2],
        nproc=1,
        env=inv_env,
    )
    assert run.rc == 0, run.stderr
    for node in range(2):
        (found,) = [j for j in run.json_lines(node) if "secret_in_cmdline" in j]
        assert found["secret_in_cmdline"] == []
    names = ["API_TOKEN", "PLAIN", "FROM_INV", "GLOO_SOCKET_IFNAME"]
    other = tmp_path / "second"
    other.mkdir()
    run2 = launch(
        ssh_env, other, free_port(), ["env", *names], opts=opts, hosts=[1, 2], nproc=1, env=inv_env
    )
    assert run2.rc == 0, run2.stderr
    for node in range(2):
        (got,) = [j for j in run2.json_lines(node) if "env" in j]
        assert got["env"] == {
            "API_TOKEN": secret,
            "PLAIN": "value with spaces",
            "FROM_INV": "inv",
            "GLOO_SOCKET_IFNAME": "lo",
        }
    assert secret not in run.stdout + run.stderr
    assert all(secret not in run.local_log(n).read_text() for n in range(2))
    state = Path(os.environ["XDG_STATE_HOME"]) / "sshddp" / "runs"
    assert list(state.glob("*.json"))
    assert all(secret not in entry.read_text() for entry in state.glob("*.json"))
    assert not list(tmp_path.rglob("env.json")), "the secret file outlived the supervisor start"
    inv, _ = write_inventory(ssh_env, tmp_path, free_port())
    dry = subprocess.run(
        [*SSHDDP, "launch", "--dry-run", *opts, str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env={**cli_env(ssh_env), "API_TOKEN": secret},
        capture_output=True,
        text=True,
    )
    assert dry.returncode == 0 and "API_TOKEN=***" in dry.stdout
    assert secret not in dry.stdout + dry.stderr
    run_no_leak(run.run_id)
    run_no_leak(run2.run_id)


def _report_ok(stderr: str, node: int, host: str) -> None:
    assert f"root cause: node {node} on {host}" in stderr, stderr


def test_rank_raises_on_third_host_tears_down_all(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["raise", "4"])
    assert run.rc == 1, run.stderr
    _report_ok(run.stderr, 2, "h3")
    assert "global rank 4" in run.stderr
    assert "RuntimeError: boom on rank 4" in run.stderr
    assert str(run.local_log(2)) in run.stderr
    for node in (0, 1):
        assert f"node {node}   h{node + 1}" in run.stderr and "stopped" in run.stderr
    run_no_leak(run.run_id, timeout=2.0)
    for node in range(3):
        assert run.local_log(node).read_bytes() == run.remote_log(node).read_bytes()


def test_rank_sigkilled(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["sigkill", "3"])
    assert run.rc == 1, run.stderr
    _report_ok(run.stderr, 1, "h2")
    assert "SIGKILL" in run.stderr
    run_no_leak(run.run_id, timeout=2.0)


def test_hanging_rank_is_killed_when_another_fails(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["hang", "0", "5"], opts=["--grace", "1"])
    assert run.rc == 1, run.stderr
    _report_ok(run.stderr, 2, "h3")
    assert "HANGING" in run.local_log(0).read_text()
    run_no_leak(run.run_id, timeout=2.0)


def _wait_for(proc: subprocess.Popen[str], needles: list[str], timeout: float = 120) -> str:
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
        if all(n in seen for n in needles):
            return seen
    raise AssertionError(f"never saw {needles}:\n{seen}")


def test_ctrl_c_stops_every_host(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port())
    proc = subprocess.Popen(
        [*SSHDDP, "launch", str(inv), str(JOB), "wait"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(proc, [f"READY {r}" for r in range(6)])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "Ctrl-C" in err and "stopped" in err
    run_no_leak(run_id_of(err), timeout=2.0)


def test_setsid_grandchildren_are_stopped(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--grace", "1", str(inv), str(JOB), "setsid"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(proc, ["READY 0", "READY 1"])
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    run_no_leak(run_id_of(err), timeout=3.0)


def test_localhost_default_from_readme(tmp_path: Path, run_no_leak) -> None:
    root = Path(__file__).resolve().parents[2]
    venv_bin = str(Path(os.sys.executable).parent)
    env = {**os.environ, "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    inv = tmp_path / "localhost.yaml"
    text = (root / "inventories" / "localhost.yaml").read_text()
    inv.write_text(text.replace("port: 29531", "port: 29577"))
    example = str(root / "examples" / "allreduce.py")
    proc = subprocess.run(
        [*SSHDDP, "launch", str(inv), example],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(ln.split("] ", 1)[1]) for ln in proc.stdout.splitlines() if '"sum"' in ln]
    assert sorted(r["rank"] for r in results) == [0, 1] and all(r["ok"] for r in results)
    # installed as the README says (numpy too), the example prints its results and nothing else
    assert [ln for ln in proc.stdout.splitlines() if '"sum"' not in ln] == [], proc.stdout
    assert "warning" not in proc.stderr.lower(), proc.stderr
    run_no_leak(run_id_of(proc.stderr))
