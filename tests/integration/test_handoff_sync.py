"""A first ``sync``'s uv binary leaves the laptop once: one host gets it from sshddp, the
others from each other, the way a launch's code goes (issue 47). Counted by a ProxyCommand
between sshddp and every sshd; each host has a workdir of its own (no shared disk)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from test_handoff import counted_config

from cli_helpers import Result, sshddp
from sshddp.run.sync import _uv_packed, local_platform
from sshddp_lab.countproxy import total_up
from sshddp_lab.sshd import SshdCluster

HOSTS = (1, 2, 3, 4)
UV = Path(__import__("uv").find_uv_bin())
UV_VERSION = metadata.version("uv")


def project(folder: Path) -> Path:
    """A uv project with no dependencies, locked here (no index needed)."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1.0"\nrequires-python = ">=3.8"\n'
        "dependencies = []\n[tool.uv]\npackage = false\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "UV_CACHE_DIR": str(folder / ".c")}
    subprocess.run([UV, "lock", "--quiet", "--offline"], cwd=folder, env=env, check=True)
    return folder


class Lab:
    """Syncs of one project to the four hosts, every byte towards them counted."""

    def __init__(self, cluster: SshdCluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.proj = project(tmp / "proj")
        hosts = [{"host": cluster.host(i).alias, "workdir": str(tmp / f"host{i}")} for i in HOSTS]
        doc = {"defaults": {"python": sys.executable, "env": {"UV_CACHE_DIR": str(tmp / "c")}}}
        doc["hosts"] = hosts
        self.inv = tmp / "inv.yaml"
        self.inv.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.counts = tmp / "counts"
        self.config = counted_config(cluster, self.counts)
        self.syncs = 0

    def sync(self) -> tuple[Result, int]:
        """One sync: its result (stderr, then its trace) and the bytes towards the hosts."""
        before = total_up(str(self.counts)) if self.counts.exists() else 0
        self.syncs += 1
        log = self.tmp / f"trace-{self.syncs}.log"
        argv = ["sync", "--ssh-config", str(self.config), str(self.inv), str(self.proj)]
        result = sshddp(argv, {**os.environ, "SSHDDP_LOG": str(log)})
        result = replace(result, err=result.err + log.read_text())
        return result, total_up(str(self.counts)) - before

    def uv(self, i: int) -> Path:
        return self.tmp / f"host{i}" / "tools" / f"uv-{UV_VERSION}" / "uv"

    def kept(self, i: int) -> Path:
        (copy,) = (self.tmp / f"host{i}" / "payloads").iterdir()
        return copy

    def assert_no_process_left(self) -> None:
        """Nothing of the sync (its sessions, their servers) is left under any host's sshd."""
        deadline = time.monotonic() + 10
        while True:
            left = [p for i in HOSTS for p in _descendants(self.cluster.sshd_pid(i) or 0)]
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not left, [_cmdline(p) for p in left]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(name))
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(300)
def test_a_first_sync_sends_uv_once_and_a_tampered_kept_copy_is_refused_and_replaced(
    ssh_env: SshdCluster, tmp_path: Path
) -> None:
    lab = Lab(ssh_env, tmp_path)
    packed = len(_uv_packed(local_platform()))
    first, sent = lab.sync()
    assert first.code == 0, first.explain()
    assert sent <= 1.15 * packed, (sent / packed, first.err[-3000:])
    assert "handoff: h1 got it from this machine" in first.err, first.err[-3000:]
    assert "handoff: h4 got it from h1" in first.err, first.err[-3000:]
    assert f"sshddp: sync: uv {UV_VERSION} ({packed} bytes) to 4 host(s): {packed} bytes" in (
        first.err
    )
    for i in HOSTS:  # every host's uv is this machine's, byte for byte, and runs
        assert _sha(lab.uv(i)) == _sha(UV), i
        ran = subprocess.run([lab.uv(i), "--version"], capture_output=True, text=True)
        assert ran.returncode == 0 and UV_VERSION in ran.stdout, ran
    lab.assert_no_process_left()

    # A warm sync sends no uv at all.
    warm, sent = lab.sync()
    assert warm.code == 0 and "handoff:" not in warm.err, warm.explain()
    assert sent < packed / 20, sent

    # h3 lost its uv and its kept copy was changed (same size, one byte): the copy is
    # refused and named, h3 gets a new one from a host that keeps it, not from here, and
    # the uv it runs is this machine's again.
    for i in (2, 3):
        lab.uv(i).unlink()
    kept = lab.kept(3)
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    third, sent = lab.sync()
    assert third.code == 0, third.explain()
    assert "warning: h3: its kept copy" in third.err and "failed its SHA-256" in third.err
    assert "handoff: h3 got it from h2" in third.err, third.err[-3000:]
    assert "handoff: h2 kept it from an earlier sync" in third.err, third.err[-3000:]
    assert sent < packed / 20, sent  # from h2, not from the laptop
    assert _sha(lab.uv(3)) == _sha(UV) and _sha(lab.kept(3)) == _sha(lab.kept(1))
    lab.assert_no_process_left()


def _kill_first_server(root: int, done: threading.Event) -> list[int]:
    """SIGKILL the first hand-off server under sshd ``root``: a fork of a session (the same
    command line as its parent's), as soon as it appears; the pids killed."""
    while not done.is_set():
        for pid in _descendants(root):
            line = _cmdline(pid)
            if "python" in line and line == _cmdline(_ppid(pid)):
                os.kill(pid, signal.SIGKILL)
                return [pid]
        time.sleep(0.005)
    return []


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@pytest.mark.timeout(300)
def test_hosts_whose_source_dies_get_uv_from_the_laptop_and_say_so(
    ssh_env: SshdCluster, tmp_path: Path
) -> None:
    lab = Lab(ssh_env, tmp_path)
    packed = len(_uv_packed(local_platform()))
    done, killed = threading.Event(), []
    root = ssh_env.sshd_pid(1) or 0
    killer = threading.Thread(target=lambda: killed.extend(_kill_first_server(root, done)))
    killer.start()
    try:
        result, sent = lab.sync()
    finally:
        done.set()
        killer.join()
    assert result.code == 0, result.explain()
    assert killed, "h1's server was never seen"
    said = result.err.splitlines()
    notes = [ln for ln in said if ln.startswith("sshddp: note:") and "could not get the uv" in ln]
    assert len(notes) == 3 and all("from h1" in n for n in notes), result.err[-3000:]
    assert all(n.endswith("sent from this machine instead") for n in notes), notes
    assert sent >= 4 * packed  # each its own copy from here
    for i in HOSTS:
        assert _sha(lab.uv(i)) == _sha(UV), i
    lab.assert_no_process_left()
