"""Shared fixtures: isolation from the developer's machine and a real sshd cluster.

Every "host" of the cluster is this machine on its own loopback address, so local
``/proc`` sees the processes of every host.
"""

from __future__ import annotations

import os
import random
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, settings

from sshddp_lab import workers
from sshddp_lab.sshd import SshdCluster, processes_with_env

# No deadline per example: on CI's 2 busy cores an example that takes 6 ms alone took 356 ms
# (test_hostile_values: DeadlineExceeded), and slow data generation is no defect of ours.
# A timing target belongs in a benchmark.
settings.register_profile("sshddp", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sshddp")

SESSION_HOSTS = 4
OTHER_PYTHON_HOST = 4  # host whose python3 is another minor version than ours
# Slurm's tests share one session cluster of root-only daemons; under xdist they all run
# on one worker, so only that worker starts it. (Tests that use rendezvous port 29500 or
# --port auto's range above it are marked xdist_group("rdzv-29500") where they are.)
SLURM_GROUP = "slurm"

INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs real sshd on loopback")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    # pytest-xdist's own, registered here too for a run without it (`-p no:xdist`).
    config.addinivalue_line("markers", "xdist_group(name): run on the same xdist worker")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in item.path.parents:
            item.add_marker(pytest.mark.integration)
        if item.path.name.startswith("test_slurm_") or "slurm_cluster" in getattr(
            item, "fixturenames", ()
        ):
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))
    # Files with a slow test (and the Slurm group) first, whole, in their order: xdist's
    # workers then end together instead of one waiting out a soak started last.
    heavy = {i.path for i in items if i.get_closest_marker("slow") or _in_slurm_group(i)}
    items.sort(key=lambda item: item.path not in heavy)


def _in_slurm_group(item: pytest.Item) -> bool:
    group = item.get_closest_marker("xdist_group")
    return group is not None and group.args == (SLURM_GROUP,)


@pytest.fixture(scope="session", autouse=True)
def worker_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This test process's own ``TMPDIR``, given to every host of its clusters too: a
    machine's port claims live there (remote/calls/probe.py), and an xdist worker's run must
    not hold the other worker's."""
    path = tmp_path_factory.mktemp("tmp")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = before


@pytest.fixture(autouse=True)
def _isolate_from_developer(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Keep ~/.ssh, the ssh agent and the developer's sshddp settings out of tests."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    for name in [n for n in os.environ if n.startswith("SSHDDP_")]:
        monkeypatch.delenv(name)


def _python_minor(path: Path) -> int | None:
    match = re.fullmatch(r"python3\.(\d+)", path.name)
    return int(match.group(1)) if match else None


def _python_candidates() -> list[Path]:
    """Interpreters to try, pyenv's 3.10 / 3.12 first, then pyenv's others, then any
    python3.N on PATH."""
    roots = {os.environ.get("PYENV_ROOT", ""), "/root/.pyenv", os.path.expanduser("~/.pyenv")}
    pyenv = [p for r in sorted(roots) if r for p in Path(r).glob("versions/*/bin/python3.*")]
    preferred = [p for minor in (10, 12) for p in pyenv if _python_minor(p) == minor]
    preferred += [p for p in pyenv if p not in preferred]
    on_path = [
        p
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d
        for p in Path(d).glob("python3.*")
    ]
    return preferred + on_path


def find_other_minor_python() -> Path | None:
    """A working python3 whose minor version differs from the running one."""
    ours = sys.version_info[1]
    for path in _python_candidates():
        minor = _python_minor(path)
        if minor is None or minor == ours or not os.access(path, os.X_OK):
            continue
        probe = subprocess.run(
            [str(path), "-c", "import sys; print(sys.version_info[1])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode == 0 and probe.stdout.strip() == str(minor):
            return path
    return None


@pytest.fixture(scope="session")
def other_python() -> Path:
    """Interpreter of another minor version, reached as ``python3`` on host 4."""
    path = find_other_minor_python()
    if path is None:
        pytest.fail(
            f"no python3.N other than {sys.version_info[0]}.{sys.version_info[1]} found "
            "(looked in $PYENV_ROOT and /root/.pyenv versions, then on PATH); "
            "the cluster's host 4 needs one to test interpreter mismatches"
        )
    return path


@pytest.fixture(scope="session")
def oldest_python() -> Path:
    """Python 3.8, the oldest interpreter sshddp's remote scripts support on a host."""
    for path in _python_candidates() + sorted(Path("/usr/bin").glob("python3.8")):
        if _python_minor(path) == 8 and os.access(path, os.X_OK):
            return path
    pytest.fail(
        "no python3.8 found (looked in $PYENV_ROOT and /root/.pyenv versions, then on PATH); "
        "the remote scripts' support of Python 3.8 is tested with it"
    )


@pytest.fixture(scope="session")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, other_python: Path, worker_tmp: Path
) -> Iterator[SshdCluster]:
    """Four real sshd hosts h1..h4 (127.0.0.41.. on xdist's first worker, see
    sshddp_lab/workers.py); h4's ``python3`` is ``other_python``."""
    bin_dir = tmp_path_factory.mktemp("other-python-bin")
    (bin_dir / "python3").symlink_to(other_python)
    path = f"{bin_dir}:/usr/local/bin:/usr/bin:/bin"
    sshd = SshdCluster(
        tmp_path_factory.mktemp("sshd"),
        SESSION_HOSTS,
        first_octet=workers.session_first_octet(),
        extra_config={OTHER_PYTHON_HOST: [f"SetEnv PATH={path}"]},
        env={"TMPDIR": str(worker_tmp)},
    )
    try:
        sshd.start()
        yield sshd
    finally:
        sshd.close()


@pytest.fixture
def ssh_env(cluster: SshdCluster, monkeypatch: pytest.MonkeyPatch) -> SshdCluster:
    """The session cluster, with ``SSHDDP_SSH_CONFIG`` pointing at its ssh_config."""
    monkeypatch.setenv("SSHDDP_SSH_CONFIG", str(cluster.ssh_config))
    return cluster


@pytest.fixture
def make_cluster(
    tmp_path_factory: pytest.TempPathFactory, worker_tmp: Path
) -> Iterator[Callable[..., SshdCluster]]:
    """Start a private cluster (closed after the test) that a test may break freely.

    Its hosts use 127.0.0.101 upwards (on xdist's first worker), clear of the session
    cluster's and of the other workers'.
    """
    made: list[SshdCluster] = []

    def make(n: int, **kwargs: Any) -> SshdCluster:
        first = workers.private_first_octet() + sum(len(c.hosts) for c in made)
        if first + n > workers.private_first_octet() + workers.PRIVATE_OCTETS:
            raise ValueError(f"a test may use {workers.PRIVATE_OCTETS} private hosts at most")
        base = tmp_path_factory.mktemp("sshd-private")
        kwargs["env"] = {"TMPDIR": str(worker_tmp), **kwargs.get("env", {})}
        sshd = SshdCluster(base, n, first_octet=first, **kwargs)
        made.append(sshd)
        sshd.start()
        return sshd

    try:
        yield make
    finally:
        for sshd in made:
            sshd.close()


@pytest.fixture
def free_port() -> Callable[[], int]:
    """Return a function giving a rendezvous port P, new on each call, with P and P + 1
    free on every interface (a run uses both). Ports come from below Linux's ephemeral
    range (32768+), where outgoing connections of a busy machine would otherwise take
    P + 1 between the pick and the run; sshd test clusters use 22000-28000. Each xdist
    worker picks in its own slice, so two workers never pick the same pair."""
    given: set[int] = set()

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
        return True

    def pick() -> int:
        ports = workers.port_range()
        for _ in range(2000):
            port = random.choice(ports)
            if port not in given and free(port) and free(port + 1):
                given.update((port, port + 1))
                return port
        raise RuntimeError(f"no free pair of TCP ports in {ports.start}-{ports.stop}")

    return pick


def assert_no_run_processes(run_id: str, timeout: float = 5.0) -> None:
    """Wait until no process of this worker's lab carries ``SSHDDP_RUN_ID=<run_id>``, else
    fail naming them (another xdist worker's run of the same name is not this one's: its
    hosts give their sessions another ``TMPDIR``, ``worker_tmp``)."""
    deadline = time.monotonic() + timeout
    mine = os.environ.get("TMPDIR")
    scope = ("TMPDIR", mine) if mine else None
    while True:
        survivors = processes_with_env("SSHDDP_RUN_ID", run_id, scope)
        if not survivors:
            return
        if time.monotonic() >= deadline:
            listing = "\n".join(f"  pid {pid}: {cmd}" for pid, cmd in survivors)
            raise AssertionError(
                f"{len(survivors)} process(es) of run {run_id} still alive after "
                f"{timeout:.1f}s:\n{listing}"
            )
        time.sleep(0.05)


@pytest.fixture
def run_no_leak() -> Iterator[Callable[..., None]]:
    """``assert_no_run_processes(run_id, timeout=5.0)``: no process of the run is left."""
    yield assert_no_run_processes
