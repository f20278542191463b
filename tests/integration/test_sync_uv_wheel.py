"""uv for a host of another platform comes from the real ``uv`` wheel for it, fetched
here with pip: an aarch64 host from this x86_64 machine gets an aarch64 uv binary."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from sshddp.run import sync
from sshddp.run.syncuv import fetch_wheel, uv_binary

EM_AARCH64 = 0xB7  #: ELF e_machine of aarch64


def _machine(binary: bytes) -> int:
    assert binary[:4] == b"\x7fELF"
    return int(struct.unpack_from("<H", binary, 18)[0])


def test_the_aarch64_uv_wheel_gives_an_aarch64_uv_binary(tmp_path: Path) -> None:
    version = sync.uv_version()
    wheel = fetch_wheel(version, "manylinux_2_17_aarch64", tmp_path)
    assert wheel.name.startswith(f"uv-{version}-") and "aarch64" in wheel.name
    assert _machine(uv_binary(wheel)) == EM_AARCH64


def test_a_host_of_another_platform_is_sent_its_own_uv() -> None:
    packed = sync._uv_packed("linux-aarch64-glibc2.31")
    assert _machine(zlib.decompress(packed)) == EM_AARCH64
    local = zlib.decompress(sync._uv_packed(sync.local_platform()))
    assert _machine(local) != EM_AARCH64
