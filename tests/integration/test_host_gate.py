"""What another local user plants where ``sync`` and ``--share`` write is never run nor
written through (issue 43: H1, H2, L1), on the sshd lab hosts (this machine, as root, on
loopback) with a real second user. Every path goes through ``remote/hostpath.py``."""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import subprocess
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from launch_helpers import SSHDDP, cli_env

from cli_helpers import Result, sshddp
from sshddp.remote.node import host_share
from sshddp_lab.sshd import SshdCluster

UV_VERSION = metadata.version("uv")


def project(folder: Path) -> Path:
    """A uv project with no dependencies, locked here (no index needed)."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1.0"\nrequires-python = ">=3.8"\n'
        "dependencies = []\n[tool.uv]\npackage = false\n"
    )
    uv = __import__("uv").find_uv_bin()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(folder), "UV_CACHE_DIR": str(folder / ".c")}
    subprocess.run([uv, "lock", "--quiet", "--offline"], cwd=folder, env=env, check=True)
    return folder


def inventory(cluster: SshdCluster, tmp: Path, workdir: Path) -> Path:
    doc = yaml.safe_load(cluster.inventory_yaml([1], workdir=str(workdir), nproc=1))
    doc["defaults"]["env"] = {"UV_CACHE_DIR": str(tmp / "uv-cache")}
    path = tmp / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def plant_uv(workdir: Path, user: pwd.struct_passwd, marker: Path) -> Path:
    """``user``'s uv at the place sync runs ours from: a program that leaves ``marker``."""
    folder = workdir / "tools" / f"uv-{UV_VERSION}"
    folder.mkdir(parents=True)
    uv = folder / "uv"
    uv.write_text(f"#!/bin/sh\ntouch {marker}\nexit 0\n")
    uv.chmod(0o755)
    for path in (uv, folder):
        os.chown(path, user.pw_uid, user.pw_gid)
    return uv


def sync(cluster: SshdCluster, inv: Path, proj: Path) -> Result:
    return sshddp(["sync", "--ssh-config", str(cluster.ssh_config), str(inv), str(proj)])


@pytest.mark.parametrize(
    ("mode", "refusal"),
    [
        (0o1777, "is writable by other users (mode 1777)"),  # /scratch-like
        (0o777, "is writable by other users (mode 0777)"),
    ],
)
def test_sync_never_runs_a_uv_another_user_planted_in_a_shared_workdir(
    ssh_env: SshdCluster,
    tmp_path: Path,
    stranger: pwd.struct_passwd,
    mode: int,
    refusal: str,
) -> None:
    workdir = tmp_path / "scratch"
    workdir.mkdir()
    workdir.chmod(mode)
    marker = tmp_path / "their-uv-ran"
    plant_uv(workdir, stranger, marker)
    done = sync(ssh_env, inventory(ssh_env, tmp_path, workdir), project(tmp_path / "proj"))
    assert done.code == 7, done.explain()
    assert f"workdir {workdir} {refusal}" in done.out, done.explain()
    assert not marker.exists(), "another user's uv ran"
    assert "Traceback" not in done.out + done.err


def test_launch_sync_refuses_tools_of_another_user_in_its_preflight(
    ssh_env: SshdCluster, tmp_path: Path, stranger: pwd.struct_passwd
) -> None:
    workdir = tmp_path / "w"
    workdir.mkdir(mode=0o700)
    marker = tmp_path / "their-uv-ran"
    plant_uv(workdir, stranger, marker)
    os.chown(workdir / "tools", stranger.pw_uid, stranger.pw_gid)
    inv = inventory(ssh_env, tmp_path, workdir)
    script = tmp_path / "job.py"
    script.write_text("print('ran')\n")
    args = ["launch", "--sync", tmp_path / "proj", "--ssh-config", ssh_env.ssh_config, inv, script]
    project(tmp_path / "proj")
    proc = subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    named = f"the tools directory {workdir / 'tools'} belongs to uid {stranger.pw_uid}, "
    assert named in proc.stderr and f"its owner {stranger.pw_name} " in proc.stderr, proc.stderr
    assert not marker.exists(), "another user's uv ran"
    assert "Traceback" not in proc.stderr and "ran" not in proc.stdout


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A workdir on a file system of 4 MiB (a tmpfs): uv (tens of MB) does not fit."""
    disk = tmp_path / "tiny"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "sshddp-tiny", str(disk)]
    made = subprocess.run(mount, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {disk} (needs root; CI runs as root): {made.stderr}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_sync_onto_a_full_disk_names_it_and_leaves_nothing_half_written(
    ssh_env: SshdCluster, tmp_path: Path, tiny_disk: Path
) -> None:
    done = sync(ssh_env, inventory(ssh_env, tmp_path, tiny_disk), project(tmp_path / "proj"))
    assert done.code == 7, done.explain()
    assert f"no space left on the disk at {tiny_disk} (" in done.out, done.explain()
    assert "Traceback" not in done.out + done.err and "Errno" not in done.out
    left = sorted(str(p.relative_to(tiny_disk)) for p in (tiny_disk / "tools").rglob("*"))
    assert left == [], left  # no uv-*/ nor uv-*/.uv-XXXX


# ------------------------------------------------------- --share's receiving side (H2)


def _serve_and_pull(tmp: Path, target_dir: Path, data: bytes) -> dict[str, object]:
    """Node 0's server (a real one, on loopback) hands ``data`` as ``ckpt.pt`` to a pull
    into ``target_dir``: the pull's answer."""
    source = tmp / "node0"
    source.mkdir()
    (source / "ckpt.pt").write_bytes(data)
    key, run = secrets.token_hex(32), "share-test"
    order = {"cwd": str(source), "paths": ["ckpt.pt"], "key": key, "run": run}
    server = host_share.Server(dict(order, port=0, addr="127.0.0.1", timeout=10))
    try:
        item = {"path": "ckpt.pt", "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        pull = {"cwd": str(target_dir), "files": [item], "addr": "127.0.0.1", "key": key}
        pull.update(port=server.sock.getsockname()[1], run=run, rank=1, timeout=10)
        return host_share.Shares().answer(dict(pull, ask="pull"))
    finally:
        server.stop()


def _plant_links(target_dir: Path, user: pwd.struct_passwd, victim: Path) -> None:
    """``user``'s links at every name the receiver's temporary file could take, over the
    pids this machine can give (around this process's)."""
    for pid in range(max(2, os.getpid() - 300), os.getpid() + 300):
        link = target_dir / f"ckpt.pt.sshddp-share-{pid}"
        link.symlink_to(victim)
        os.lchown(link, user.pw_uid, user.pw_gid)


@pytest.mark.parametrize("mode", [0o1777, 0o777])
def test_share_never_writes_through_a_link_another_user_planted(
    tmp_path: Path, stranger: pwd.struct_passwd, mode: int
) -> None:
    victim = tmp_path / "root-owned"
    victim.write_bytes(b"precious")
    target = tmp_path / "shared"
    target.mkdir()
    target.chmod(mode)
    _plant_links(target, stranger, victim)
    answer = _serve_and_pull(tmp_path, target, b"node 0's checkpoint")
    assert victim.read_bytes() == b"precious"
    if mode & 0o1000:  # sticky and ours: safe to write in, through a fresh name
        assert answer.get("ok"), answer
        assert (target / "ckpt.pt").read_bytes() == b"node 0's checkpoint"
    else:  # others may rename what is there: refused, by name
        error = str(answer.get("error"))
        assert f"--share target directory {target} " in error and "(mode 0777)" in error, answer
        assert not (target / "ckpt.pt").exists()
    assert not [p for p in target.iterdir() if not p.is_symlink() and p.name != "ckpt.pt"]
