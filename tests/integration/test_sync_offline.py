"""``sshddp sync --offline`` to hosts in network namespaces that reach no index: the
wheels are fetched once here, cross this machine's link once, and the hosts pass them on.

The project's index is served over HTTP on this machine's loopback, which a host in its own
namespace cannot reach (its loopback is its own): a sync without --offline fails there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from test_sync import UV, keys, make_project

from cli_helpers import Result, assert_clean_failure, sshddp
from sshddp.errors import ExitCode
from sshddp.run.sync import uv_version
from sshddp_lab.netns import NetnsCluster

DEPS = ["numpy==2.2.6", "six==1.17.0"]


@pytest.fixture
def http_index(free_port: object) -> Iterator[str]:
    """/opt/pypi over HTTP on this machine's loopback: no namespaced host reaches it."""
    port = free_port()  # type: ignore[operator]
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = subprocess.Popen(argv, cwd="/opt/pypi", stderr=subprocess.DEVNULL)
    try:
        yield f"http://127.0.0.1:{port}/simple"
    finally:
        server.terminate()
        server.wait(timeout=30)


def project(tmp: Path, index: str, deps: list[str] = DEPS) -> Path:
    folder = tmp / "proj"
    make_project(folder, deps, tmp / "uv-cache")
    text = (folder / "pyproject.toml").read_text().replace("file:///opt/pypi/simple", index)
    (folder / "pyproject.toml").write_text(text)
    env = {"UV_CACHE_DIR": str(tmp / "uv-cache"), "PATH": "/usr/bin:/bin", "HOME": str(folder)}
    subprocess.run([UV, "lock", "--quiet"], cwd=folder, env=env, check=True, timeout=120)
    return folder


def pylock(folder: Path, cache: Path) -> Path:
    """The project's lock as PEP 751's ``pylock.toml``, exported by uv as a user would."""
    env = {"UV_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(folder)}
    export = [UV, "export", "--quiet", "--format", "pylock.toml", "-o", "pylock.toml"]
    subprocess.run(export, cwd=folder, env=env, check=True, timeout=120)
    return folder / "pylock.toml"


def inventory(cluster: NetnsCluster, tmp: Path) -> Path:
    """Every host with its own workdir and uv cache, and sshddp's uv already there (what a
    host keeps from any earlier sync), so what crosses the link is the wheels."""
    doc = yaml.safe_load(cluster.inventory_yaml([1, 2, 3], workdir="~/w"))
    for i, entry in enumerate(doc["hosts"], start=1):
        entry["addr"] = cluster.net.addr(i)
        entry["env"] = {"UV_CACHE_DIR": str(cluster.home(i) / "uv-cache")}
        tools = cluster.home(i) / "w" / "tools" / f"uv-{uv_version()}"
        tools.mkdir(parents=True)
        shutil.copy(UV, tools / "uv")
    path = tmp / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def sync(cluster: NetnsCluster, inv: Path, folder: Path, *more: str) -> Result:
    return sshddp(["sync", "--ssh-config", str(cluster.ssh_config), *more, str(inv), str(folder)])


def traced_sync(cluster: NetnsCluster, inv: Path, folder: Path, *more: str) -> Result:
    """A sync whose stderr is followed by its trace (``SSHDDP_LOG``, a file of its own)."""
    log = inv.parent / "trace.log"
    argv = ["sync", "--ssh-config", str(cluster.ssh_config), *more, str(inv), str(folder)]
    result = sshddp(argv, {**os.environ, "SSHDDP_LOG": str(log)})
    return replace(result, err=result.err + log.read_text())


def tx_bytes(interface: str) -> int:
    return int(Path(f"/sys/class/net/{interface}/statistics/tx_bytes").read_text())


@pytest.mark.slow
def test_offline_hosts_get_the_wheels_once_from_here_and_pass_them_on(
    netns_cluster: NetnsCluster, tmp_path: Path, http_index: str
) -> None:
    folder = project(tmp_path, http_index)
    inv = inventory(netns_cluster, tmp_path)
    online = sync(netns_cluster, inv, folder)
    assert_clean_failure(online, ExitCode.SYNC_FAILED)  # no host reaches the index

    before = tx_bytes(netns_cluster.net.bridge)
    result = traced_sync(netns_cluster, inv, folder, "--offline")
    sent_on_the_wire = tx_bytes(netns_cluster.net.bridge) - before
    assert result.code == 0, result.explain()
    key = keys(result)["h1"]
    assert keys(result) == {"h1": key, "h2": key, "h3": key}
    for i in (1, 2, 3):
        python = netns_cluster.home(i) / "w" / "envs" / key / "bin" / "python"
        code = "import numpy, six; print(numpy.__version__, six.__version__)"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["2.2.6", "1.17.0"]
    wheels = sorted(p for p in (netns_cluster.home(1) / "w" / "wheels").glob("*/*.whl"))
    size = sum(p.stat().st_size for p in wheels)
    assert [p.name.split("-")[0] for p in wheels] == ["numpy", "six"]
    (line,) = [x for x in result.err.splitlines() if " bytes sent to the hosts " in x]
    sent = int(line.split("sync: ")[1].split()[0])
    assert f"are {size} bytes" in line, result.explain()
    # once, whatever the host count: what sshddp wrote to the SSH channels, and what left
    # this machine on the wire (with SSH's, TCP's and Ethernet's framing)
    assert size <= sent <= 1.05 * size, result.explain()
    assert sent_on_the_wire <= 1.2 * size, (sent_on_the_wire, size)
    # the seed (h1) hands them to the first host, which hands them on (the hand-off's tree)
    assert "sync: h2 got the wheels from h1" in result.err, result.err[-3000:]
    assert "sync: h3 got the wheels from h2" in result.err
    assert "could not get the wheels" not in result.err

    again = sync(netns_cluster, inv, folder, "--offline")
    assert again.code == 0, again.explain()
    assert [x.split()[1] for x in again.out.splitlines()] == ["ready"] * 3


@pytest.mark.slow
def test_a_host_that_cannot_reach_its_parent_in_the_tree_gets_the_wheels_from_the_seed(
    netns_cluster: NetnsCluster, tmp_path: Path, http_index: str
) -> None:
    """h2 hands the wheels on to h3 in the tree, but its address leads nowhere (TEST-NET-1):
    h3 gets them from the seed, h1, and the note says so."""
    folder = project(tmp_path, http_index)
    inv = inventory(netns_cluster, tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][1]["addr"] = "192.0.2.1"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = traced_sync(netns_cluster, inv, folder, "--offline")
    assert result.code == 0, result.explain()
    note = "note: h3 could not get the wheels from h2: the wheels did not arrive: cannot reach h2"
    assert note in result.err and "sent from h1 instead" in result.err, result.err[-3000:]
    assert "sync: h3 got the wheels from h1" in result.err
    key = keys(result)["h1"]
    assert keys(result) == {"h1": key, "h2": key, "h3": key}
    python = netns_cluster.home(3) / "w" / "envs" / key / "bin" / "python"
    code = "import numpy, six; print(numpy.__version__, six.__version__)"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2.2.6", "1.17.0"]


@pytest.mark.slow
def test_offline_hosts_get_a_pylocks_wheels_for_this_machine_once_from_here(
    netns_cluster: NetnsCluster, tmp_path: Path, http_index: str
) -> None:
    # colorama's marker (Windows) does not hold here: it is neither fetched nor installed
    deps = [*DEPS, "colorama==0.4.6; sys_platform == 'win32'"]
    lock = pylock(project(tmp_path, http_index, deps), tmp_path / "uv-cache")
    assert http_index.removesuffix("/simple") + "/files/numpy-" in lock.read_text()
    inv = inventory(netns_cluster, tmp_path)

    result = sync(netns_cluster, inv, lock, "--offline")
    assert result.code == 0, result.explain()
    key = keys(result)["h1"]
    assert keys(result) == {"h1": key, "h2": key, "h3": key}
    code = "import numpy, six, importlib.util as u; print(numpy.__version__, six.__version__, "
    code += "u.find_spec('colorama') is None)"
    for i in (1, 2, 3):
        python = netns_cluster.home(i) / "w" / "envs" / key / "bin" / "python"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["2.2.6", "1.17.0", "True"]
    wheels = sorted(p for p in (netns_cluster.home(1) / "w" / "wheels").glob("*/*.whl"))
    size = sum(p.stat().st_size for p in wheels)
    assert [p.name.split("-")[0] for p in wheels] == ["numpy", "six"]
    (line,) = [x for x in result.err.splitlines() if " bytes sent to the hosts " in x]
    sent = int(line.split("sync: ")[1].split()[0])
    assert f"the 2 wheel(s) are {size} bytes" in line, result.explain()
    assert size <= sent <= 1.05 * size, result.explain()  # once, not once a host

    again = sync(netns_cluster, inv, lock.parent / "pylock.toml", "--offline")
    assert again.code == 0, again.explain()
    assert [x.split()[1] for x in again.out.splitlines()] == ["ready"] * 3


def test_a_pylock_without_this_machines_wheel_or_with_another_hash_is_a_clear_error(
    tmp_path: Path,
) -> None:
    folder = make_project(tmp_path / "proj", DEPS, tmp_path / "uv-cache")
    text = pylock(folder, tmp_path / "uv-cache").read_text()
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - host: never-reached\n")  # it fails before any host is asked
    numpy = "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    assert numpy in text
    elsewhere = tmp_path / "mac" / "pylock.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(text.replace(numpy, "numpy-2.2.6-cp311-cp311-macosx_14_0_arm64.whl"))
    result = sshddp(["sync", "--offline", str(inv), str(elsewhere)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{elsewhere}: package numpy==2.2.6 has no wheel for this machine" in result.err

    sha = hashlib.sha256(Path("/opt/pypi/files", numpy).read_bytes()).hexdigest()
    tampered = tmp_path / "tampered" / "pylock.toml"
    tampered.parent.mkdir()
    tampered.write_text(text.replace(sha, "0" * 64))
    result = sshddp(["sync", "--offline", str(inv), str(tampered)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{tampered}: {numpy} has SHA-256 {sha}, but the lock says {'0' * 64}" in result.err
