"""Hostile argv and env values reach every rank unchanged, through real launches.

The paths: an attached launch over sshd on two hosts, a ``--detach`` launch read back with
``sshddp attach`` and ``sshddp logs``, and the ``localhost`` (local transport) host. Each
example is one launch that carries many values at once: the script's arguments, env values
from the inventory, from ``--env KEY=VALUE`` and from ``--env KEY`` (the local
environment). Every rank prints them as ASCII-only JSON (payload mode ``echo``) and the test
compares exactly. ``hostile_values`` says what a value may be; the unit twin,
``tests/unit/test_hostile_values.py``, covers many more examples in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from launch_helpers import JOB, SSHDDP, cli_env, launch, run_id_of

from hostile_values import NASTY, argv_values, env_names, has_surrogate, yaml_values
from sshddp_lab.sshd import SshdCluster

PREFIX = "HOSTILE_"  # the payload reports every variable with this prefix
FEW = settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
args_lists = st.lists(argv_values, min_size=1, max_size=40)
inv_envs = st.dictionaries(env_names.map(lambda n: f"{PREFIX}I_{n}"), yaml_values, max_size=6)
opt_envs = st.dictionaries(env_names.map(lambda n: f"{PREFIX}O_{n}"), argv_values, max_size=6)
NASTY_INV = {f"{PREFIX}I{i}": v for i, v in enumerate(NASTY) if not has_surrogate(v)}
NASTY_OPT = {f"{PREFIX}O{i}": v for i, v in enumerate(NASTY)}


def env_options(opt_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """``--env`` options for ``opt_env``: every other one copied from the local environment."""
    opts: list[str] = []
    local: dict[str, str] = {}
    for i, (name, value) in enumerate(sorted(opt_env.items())):
        if i % 2:
            opts += ["--env", name]
            local[name] = value
        else:
            opts += ["--env", f"{name}={value}"]
    return opts, local


def echoed(log_text: str) -> list[dict[str, Any]]:
    """The ``echo`` records in a node's output (one per rank)."""
    return [json.loads(ln) for ln in log_text.splitlines() if ln.startswith('{"rank"')]


def with_traps(args: list[str], tmp: Path) -> list[str]:
    """``args`` plus commands that would create files if any shell ever evaluated them."""
    return [*args, f"$(touch {tmp}/pwned1)", f"`touch {tmp}/pwned2`", f"; touch {tmp}/pwned3"]


def assert_untouched(tmp: Path) -> None:
    assert not list(tmp.glob("pwned*")), "a shell evaluated an argument"


@FEW
@given(args=args_lists, inv_env=inv_envs, opt_env=opt_envs)
@example(args=list(NASTY), inv_env=NASTY_INV, opt_env=NASTY_OPT)
def test_attached_launch_over_ssh(
    ssh_env: SshdCluster,
    tmp_path_factory: pytest.TempPathFactory,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
    args: list[str],
    inv_env: dict[str, str],
    opt_env: dict[str, str],
) -> None:
    tmp = tmp_path_factory.mktemp("attached")
    args = with_traps(args, tmp)
    opts, local = env_options(opt_env)
    with mock.patch.dict(os.environ, local):
        run = launch(
            ssh_env,
            tmp,
            free_port(),
            ["echo", *args],
            opts=opts,
            hosts=[1, 2],
            nproc=1,
            env=inv_env,
        )
    assert run.rc == 0, run.stderr
    want = {"argv": args, "env": {**inv_env, **opt_env}}
    for node in range(2):
        (got,) = echoed(run.local_log(node).read_text(encoding="utf-8"))
        assert {"argv": got["argv"], "env": got["env"]} == want
    assert_untouched(tmp)
    run_no_leak(run.run_id)


def sshddp_cli(cluster: SshdCluster, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SSHDDP, *args], cwd=tmp, env=cli_env(cluster), capture_output=True, text=True, timeout=120
    )


@FEW
@given(args=args_lists, opt_env=opt_envs)
@example(args=list(NASTY), opt_env=NASTY_OPT)
def test_detached_launch_then_attach_and_logs(
    ssh_env: SshdCluster,
    tmp_path_factory: pytest.TempPathFactory,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
    args: list[str],
    opt_env: dict[str, str],
) -> None:
    tmp = tmp_path_factory.mktemp("detached")
    args = with_traps(args, tmp)
    opts, local = env_options(opt_env)
    with mock.patch.dict(os.environ, local):
        run = launch(
            ssh_env,
            tmp,
            free_port(),
            ["echo", *args],
            opts=["--detach", *opts],
            hosts=[1, 2],
            nproc=1,
        )
    assert run.rc == 0, run.stderr
    want = {"argv": args, "env": opt_env}
    attached = sshddp_cli(ssh_env, tmp, "attach", run.run_id)
    assert attached.returncode == 0, attached.stderr
    for node in range(2):
        # attach prints each line after a `[rank host] ` prefix
        lines = [
            ln.split("] ", 1)[1]
            for ln in attached.stdout.splitlines()
            if ln.startswith(f"[{node} h{node + 1}]")
        ]
        (got,) = echoed("\n".join(lines))
        assert {"argv": got["argv"], "env": got["env"]} == want
    # Drop the local copy: `logs` fetches the whole log from the hosts again.
    for node in range(2):
        run.local_log(node).unlink()
    for node in range(2):
        fetched = sshddp_cli(ssh_env, tmp, "logs", run.run_id, "--node", str(node))
        assert fetched.returncode == 0, fetched.stderr
        (got,) = echoed(fetched.stdout)
        assert {"argv": got["argv"], "env": got["env"]} == want
    assert_untouched(tmp)
    run_no_leak(run.run_id)


def localhost_inventory(tmp: Path, port: int, env: dict[str, str]) -> Path:
    doc = {
        "defaults": {
            "python": sys.executable,
            "workdir": str(tmp / "remote"),
            "env": {"GLOO_SOCKET_IFNAME": "lo", **env},
        },
        "rendezvous": {"port": port},
        "hosts": [{"host": "localhost", "nproc": 2}],
    }
    inv = tmp / "localhost.yaml"
    inv.write_text(yaml.safe_dump(doc))
    return inv


@FEW
@given(args=args_lists, inv_env=inv_envs, opt_env=opt_envs)
@example(args=list(NASTY), inv_env=NASTY_INV, opt_env=NASTY_OPT)
def test_localhost_transport(
    tmp_path_factory: pytest.TempPathFactory,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
    args: list[str],
    inv_env: dict[str, str],
    opt_env: dict[str, str],
) -> None:
    tmp = tmp_path_factory.mktemp("localhost")
    args = with_traps(args, tmp)
    opts, local = env_options(opt_env)
    inv = localhost_inventory(tmp, free_port(), inv_env)
    proc = subprocess.run(
        [*SSHDDP, "launch", *opts, str(inv), str(JOB), "echo", *args],
        cwd=tmp,
        env={**os.environ, **local},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    run_id = run_id_of(proc.stderr)
    log = tmp / "sshddp-logs" / run_id / "node0-localhost.log"
    got = echoed(log.read_text(encoding="utf-8"))
    assert sorted(g["rank"] for g in got) == [0, 1]
    want = {"argv": args, "env": {**inv_env, **opt_env}}
    assert all({"argv": g["argv"], "env": g["env"]} == want for g in got)
    assert_untouched(tmp)
    run_no_leak(run_id)
