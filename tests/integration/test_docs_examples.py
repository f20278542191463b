"""Every shell example of README.md and docs/*.md that can run on the test hosts runs, one
command at a time, against the session cluster, and exits 0 (tests/doc_examples.py says
which blocks are examples and how one is marked as not runnable here).

The doc's names are made real in a fresh directory: ``inv.yaml`` is the inventory of hosts
h1 and h2 (3 processes each, so ranks 0-5 exist), ``train.py`` and its siblings are
payloads/doc_train.py, run ``k3f9xq`` is a detached run started first (alive through the
example when it takes stacks), ``gpu-a``/``gpu-b`` are h1/h2, ``/opt/venv/bin/python`` is
this interpreter and ``ubuntu`` this user.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
from launch_helpers import cli_env, wait_until, write_inventory

from doc_examples import Example, all_examples
from sshddp_lab.sshd import SshdCluster

PAYLOAD = Path(__file__).parent / "payloads" / "doc_train.py"
SCRIPTS = ["train.py", "old_train.py", "train_spawn.py", "train_lightning.py"]
RUN = "k3f9xq"  # the run id the docs use
NPROC = 3
TIMEOUT_S = 180
EXAMPLES = all_examples()
RUNNABLE = [e for e in EXAMPLES if e.not_run is None and e.language == "shell"]
PYTHON = [e for e in EXAMPLES if e.not_run is None and e.language == "python"]
# With -H there is no inventory, so the run is on the default rendezvous port, 29500: on
# the one xdist worker of the tests that use it (docs/development.md, "CI's time").
DEFAULT_PORT = pytest.mark.xdist_group("rdzv-29500")


def substitute(command: str) -> str:
    """The doc's command with its placeholder hosts, interpreter and user made real."""
    command = re.sub(r"\bgpu-a(:\d+)?", lambda m: f"h1:{NPROC}" if m.group(1) else "h1", command)
    command = re.sub(r"\bgpu-b(:\d+)?", lambda m: f"h2:{NPROC}" if m.group(1) else "h2", command)
    command = command.replace("/opt/venv/bin/python", sys.executable)
    return re.sub(r"--user ubuntu\b", f"--user {getpass.getuser()}", command)


def _shell(env: dict[str, str], cwd: Path) -> Callable[[str], subprocess.CompletedProcess[str]]:
    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )

    return run


def _environment(cluster: SshdCluster, tmp: Path) -> dict[str, str]:
    """The cluster's environment, with ``sshddp`` on PATH as this checkout's."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "sshddp"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -m sshddp "$@"\n')
    wrapper.chmod(0o755)
    env = cli_env(cluster)
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


def _explain(command: str, proc: subprocess.CompletedProcess[str]) -> str:
    out = f"--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}"
    return f"`{command}` exited {proc.returncode}\n{out}"


def _params() -> list[object]:
    return [
        pytest.param(e, id=e.name, marks=[DEFAULT_PORT] if "-H " in e.text else [])
        for e in RUNNABLE
    ]


def _start_the_run(
    shell: Callable[[str], subprocess.CompletedProcess[str]],
    cluster: SshdCluster,
    tmp: Path,
    port: int,
    long: bool,
) -> None:
    """Run ``k3f9xq``, detached, on its own rendezvous port (the example may launch on
    inv.yaml's meanwhile); back once every rank has written its files. It lives through the
    example when the example takes its stacks, else 3 s."""
    (tmp / RUN).mkdir()
    inv, _ = write_inventory(cluster, tmp / RUN, port, hosts=[1, 2], nproc=NPROC)
    start = f"sshddp launch --detach --name {RUN} {inv} train.py --live {600 if long else 3}"
    started = shell(start)
    assert started.returncode == 0, _explain(start, started)
    wait_until(
        lambda: shell(f"sshddp logs {RUN}").stdout.count(": ready") >= 2 * NPROC,
        TIMEOUT_S,
        f"every rank of {RUN} to write its files",
    )


@pytest.mark.parametrize("example", _params())
def test_the_example_runs_on_the_test_hosts(
    example: Example,
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[[str], None],
) -> None:
    write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=NPROC)
    for name in SCRIPTS:
        shutil.copy(PAYLOAD, tmp_path / name)
    shell = _shell(_environment(ssh_env, tmp_path), tmp_path)
    uses_run = re.search(rf"\b{RUN}\b", example.text) is not None
    if uses_run:
        _start_the_run(shell, ssh_env, tmp_path, free_port(), "stacks" in example.text)
    try:
        for command in map(substitute, example.commands()):
            proc = shell(command)
            assert proc.returncode == 0, f"{example.name}: " + _explain(command, proc)
    finally:
        if uses_run:
            shell(f"sshddp stop {RUN}")
        listed = shell("sshddp ps --all --json")
        assert listed.returncode == 0, _explain("sshddp ps --all --json", listed)
        for run in json.loads(listed.stdout)["runs"]:
            run_no_leak(run["run_id"])


@pytest.mark.parametrize(
    "example",
    [
        pytest.param(e, id=e.name, marks=[DEFAULT_PORT] if "gpu-a:" in e.text else [])
        for e in PYTHON
    ],
)
def test_the_python_example_runs_on_the_test_hosts(
    example: Example,
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[[str], None],
) -> None:
    """A Python example of the docs (the API's), run whole as a script on inv.yaml's hosts
    (gpu-a and gpu-b: h1 and h2)."""
    write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=NPROC)
    script = tmp_path / "example.py"
    script.write_text(substitute(example.text))
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, f"{example.name}: " + _explain(str(script), proc)
    assert "Traceback" not in proc.stderr, proc.stderr
    for run_id in re.findall(r"sshddp: run (\S+):", proc.stderr):
        run_no_leak(run_id)


def test_the_examples_not_run_here_say_why() -> None:
    """The examples left out are few and each says why (listed with -rP or on failure)."""
    left_out = [e for e in EXAMPLES if e.not_run is not None]
    print(f"{len(RUNNABLE)} examples run, {len(left_out)} not run here:")
    for example in left_out:
        print(f"  {example.name}: {example.not_run}")
    assert RUNNABLE and PYTHON, "no example of the docs runs"
    assert all(e.not_run for e in left_out), [e.name for e in left_out if not e.not_run]
    assert len(left_out) < len(RUNNABLE), "most examples must run on the test hosts"
