"""The one gate for host paths (remote/hostpath.py), with real files: links, owners, modes,
O_EXCL; and the packed uv in the laptop's cache (issue 43: M1), and uv's native TLS."""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

import pytest

from sshddp.errors import UsageError
from sshddp.model import sync as model
from sshddp.remote import hostpath
from sshddp.remote.calls import envsync
from sshddp.run import sync, syncuv

NOBODY = 65534  # another user: files are given to them with chown (the tests run as root)


def test_create_never_follows_nor_truncates_what_is_there(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "new").symlink_to(victim)
    with pytest.raises(FileExistsError):
        hostpath.create(str(tmp_path / "new"))
    (tmp_path / "plain").write_bytes(b"kept")
    with pytest.raises(FileExistsError):
        hostpath.create(str(tmp_path / "plain"))
    assert victim.read_bytes() == b"precious" and (tmp_path / "plain").read_bytes() == b"kept"
    os.close(hostpath.create(str(tmp_path / "fresh")))
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o600


def test_open_read_refuses_links_fifos_and_files_others_own_or_may_write(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_bytes(b"ours")
    with hostpath.open_read(str(good)) as fh:
        assert fh.read() == b"ours"
    (tmp_path / "link").symlink_to(good)
    with pytest.raises(OSError):  # ELOOP: never through a link
        hostpath.open_read(str(tmp_path / "link"))
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(hostpath.Unsafe, match="is not a regular file"):
        hostpath.open_read(str(tmp_path / "fifo"))  # and it does not hang
    theirs = tmp_path / "theirs"
    theirs.write_bytes(b"x")
    os.chown(theirs, NOBODY, NOBODY)
    with pytest.raises(hostpath.Unsafe, match=re.escape(f"{theirs} belongs to uid {NOBODY}")):
        hostpath.open_read(str(theirs))
    shared = tmp_path / "shared"
    shared.write_bytes(b"x")
    shared.chmod(0o666)
    with pytest.raises(hostpath.Unsafe, match=r"writable by other users \(mode 0666\)"):
        hostpath.open_read(str(shared))


def test_a_program_runs_only_if_ours_and_no_one_else_may_write_it(tmp_path: Path) -> None:
    prog = tmp_path / "uv"
    assert hostpath.executable(str(prog)) is None  # none there
    prog.write_text("#!/bin/sh\n")
    assert hostpath.executable(str(prog)) is None  # not executable: written again
    prog.chmod(0o755)
    assert hostpath.executable(str(prog)) == str(prog)
    prog.chmod(0o775)
    with pytest.raises(hostpath.Unsafe, match="writable by other users"):
        hostpath.executable(str(prog))
    prog.chmod(0o755)
    os.chown(prog, NOBODY, NOBODY)
    with pytest.raises(hostpath.Unsafe, match=f"belongs to uid {NOBODY}"):
        hostpath.run_checked(str(prog), "uv")
    (tmp_path / "via").symlink_to(prog)
    with pytest.raises(hostpath.Unsafe, match="is a symlink"):
        hostpath.executable(str(tmp_path / "via"))


def test_private_dirs_are_made_0700_and_any_there_must_be_ours_alone(tmp_path: Path) -> None:
    made = hostpath.private_dirs(str(tmp_path), "tools/uv-1", "tools")
    assert made == str(tmp_path / "tools" / "uv-1")
    assert (tmp_path / "tools").stat().st_mode & 0o777 == 0o700
    os.chown(tmp_path / "tools", NOBODY, NOBODY)
    with pytest.raises(hostpath.Unsafe, match=f"tools {tmp_path / 'tools'} belongs to uid"):
        hostpath.private_dirs(str(tmp_path), "tools/uv-1", "tools")
    (tmp_path / "envs").symlink_to(tmp_path / "tools")
    with pytest.raises(hostpath.Unsafe, match="is a symlink"):
        hostpath.private_dir(str(tmp_path / "envs"), "envs")


def test_chase_follows_only_links_and_directories_no_one_else_controls(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "ours").symlink_to(real)
    assert hostpath.chase(str(tmp_path / "ours" / "x"), "workdir") == str(real / "x")
    theirs = tmp_path / "theirs"
    theirs.symlink_to(real)
    os.lchown(theirs, NOBODY, NOBODY)
    with pytest.raises(hostpath.Unsafe, match=f"symlink owned by uid {NOBODY}"):
        hostpath.chase(str(theirs), "workdir")
    open_dir = tmp_path / "open"
    (open_dir / "w").mkdir(parents=True)
    open_dir.chmod(0o777)
    with pytest.raises(hostpath.Unsafe, match=r"not sticky"):
        hostpath.chase(str(open_dir / "w"), "workdir")
    open_dir.chmod(0o1777)  # sticky, as /tmp
    assert hostpath.chase(str(open_dir / "w"), "workdir") == str(open_dir / "w")


def test_a_target_directory_others_may_write_is_refused_unless_sticky_and_ours(
    tmp_path: Path,
) -> None:
    target = tmp_path / "t"
    target.mkdir()
    target.chmod(0o777)
    with pytest.raises(hostpath.Unsafe, match=re.escape(f"target {target} belongs to uid 0")):
        hostpath.target_dir(str(target), "target")
    target.chmod(0o1777)
    assert hostpath.target_dir(str(target), "target") == str(target)
    os.chown(target, NOBODY, NOBODY)
    with pytest.raises(hostpath.Unsafe, match=f"belongs to uid {NOBODY}"):
        hostpath.target_dir(str(target), "target")


# ------------------------------------------------------------- the packed uv (M1)


def _local_uv() -> bytes:
    return Path(__import__("uv").find_uv_bin()).read_bytes()


def _plant(cache: Path, data: bytes) -> Path:
    """A packed uv in ``cache`` (XDG_CACHE_HOME) where sync looks for this platform's."""
    platform = sync.local_platform()
    key = __import__("hashlib").sha256(f"{sync.uv_version()}\0{platform}".encode())
    path = cache / "sshddp" / f"uv-{sync.uv_version()}-{key.hexdigest()[:16]}.zlib"
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_bytes(zlib.compress(data, 1))
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (lambda p: os.chown(p, NOBODY, NOBODY), f"is not this user's alone (owner uid {NOBODY}"),
        (lambda p: os.chown(p.parent, NOBODY, NOBODY), "the uv cache directory"),
        (lambda p: p.chmod(0o666), "-rw-rw-rw-"),
        (lambda p: None, "not the local uv wheel's"),  # ours, but not uv: changed
    ],
)
def test_a_planted_or_changed_packed_uv_in_the_cache_is_never_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spoil: object, said: str
) -> None:
    path = _plant(tmp_path, b"#!/bin/sh\ntouch /tmp/pwned\n")
    spoil(path)  # type: ignore[operator]
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(UsageError, match=re.escape(said)) as refused:
        sync._packed.__wrapped__(sync.local_platform())  # type: ignore[attr-defined]
    assert str(path.parent) in str(refused.value)  # names the file, or its directory


def test_the_packed_uv_in_the_cache_is_sent_when_it_is_the_local_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = _local_uv()
    path = _plant(tmp_path, binary)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    got = sync._packed.__wrapped__(sync.local_platform())  # type: ignore[attr-defined]
    assert got == path.read_bytes() and syncuv.cached(path) == got


# ------------------------------------------------------------------ native TLS (45.7)


def test_uv_uses_the_system_certificate_store_unless_the_env_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("UV_NATIVE_TLS", raising=False)
    monkeypatch.delenv("UV_SYSTEM_CERTS", raising=False)
    assert envsync._uv_env({})["UV_SYSTEM_CERTS"] == "1"  # a host's uv
    said = envsync._uv_env({"UV_SYSTEM_CERTS": "0"})  # the inventory's env:
    assert said["UV_SYSTEM_CERTS"] == "0"
    older = envsync._uv_env({"UV_NATIVE_TLS": "0"})  # the older name, said by the user
    assert older["UV_NATIVE_TLS"] == "0" and "UV_SYSTEM_CERTS" not in older
    assert model.uv_environ({"PATH": "/bin"}) == {"PATH": "/bin", "UV_SYSTEM_CERTS": "1"}
    assert model.uv_environ({"UV_SYSTEM_CERTS": "false"})["UV_SYSTEM_CERTS"] == "false"
    monkeypatch.setenv("UV_SYSTEM_CERTS", "0")  # the host's own environment
    assert envsync._uv_env({})["UV_SYSTEM_CERTS"] == "0"
