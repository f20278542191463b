"""Fixtures shared by the integration tests that need a real Slurm cluster.

``slurm_cluster`` is one cluster for the whole session (see ``sshddp_lab.slurm``): a test
may run jobs on it but must leave it as it found it (no job left, every node idle).
"""

from __future__ import annotations

import pwd
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from sshddp_lab.netns import Netns, NetnsCluster, NetnsError
from sshddp_lab.slurm import SlurmCluster, SlurmClusterError

SLURM_NODES = 3
SLURM_GPUS = 4  # per node, as GRES backed by /dev/null-like device files (no CUDA here)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """Three idle Slurm nodes ``node1..node3`` (4 CPUs and 4 GRES GPUs each, partition
    ``debug``), each in its own network namespace with slurmd and sshd;
    ``cluster.ssh_config`` names them.

    Needs root, like the other namespace tests: without it the test fails, never skips.
    Client commands need ``cluster.client_env()`` (or ``cluster.run``).
    """
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), SLURM_NODES, ssh=True, gpus=SLURM_GPUS)
    try:
        cluster.start()
    except SlurmClusterError as exc:
        pytest.fail(f"cannot start the Slurm test cluster: {exc}")
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    """Three sshd hosts, each in its own network namespace on one bridge (see netns.py)."""
    try:
        net = Netns(3)
        net.setup()
    except NetnsError as exc:
        pytest.fail(f"cannot build the test network: {exc}")
    cluster = NetnsCluster(tmp_path_factory.mktemp("sshd-netns"), net)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
        net.close()


@pytest.fixture
def stranger() -> Iterator[pwd.struct_passwd]:
    """A real second local user (made here as root, removed after): the one who plants
    files and links where another user's sshddp might write or run them."""
    name = f"sshddp-x{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "-M", "-s", "/bin/false", name], capture_output=True)
    if made.returncode != 0:
        pytest.fail(f"cannot add user {name} (needs root; CI runs as root): {made.stderr!r}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
