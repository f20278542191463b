"""uv for a host of another platform: which ``uv`` wheel runs there, and its binary."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from sshddp.errors import UsageError
from sshddp.model.sync import uv_wheel_tag
from sshddp.run.syncuv import uv_binary


@pytest.mark.parametrize(
    ("host", "tag"),
    [
        ("linux-x86_64-glibc2.36", "manylinux_2_17_x86_64"),
        ("linux-aarch64-glibc2.31", "manylinux_2_17_aarch64"),
        ("linux-x86_64-glibc2.17", "manylinux_2_17_x86_64"),
        ("linux-x86_64-nolibc", "musllinux_1_1_x86_64"),  # Alpine: libc_ver knows no musl
        ("linux-aarch64-musl1.2", "musllinux_1_1_aarch64"),
        ("macosx-11.0-arm64-nolibc", "macosx_11_0_arm64"),
        ("macosx-10.9-x86_64-nolibc", "macosx_10_12_x86_64"),
    ],
)
def test_a_hosts_platform_maps_to_the_uv_wheel_that_runs_there(host: str, tag: str) -> None:
    assert uv_wheel_tag(host) == tag


@pytest.mark.parametrize(
    "host", ["linux-x86_64-glibc2.12", "linux-mips-glibc2.31", "win-amd64-nolibc", "junk"]
)
def test_a_platform_uv_has_no_wheel_for_is_none(host: str) -> None:
    assert uv_wheel_tag(host) is None


def test_the_uv_binary_comes_out_of_the_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "uv-0.1.0-py3-none-manylinux_2_17_aarch64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("uv/__init__.py", "")
        archive.writestr("uv-0.1.0.data/scripts/uvx", b"not this one")
        archive.writestr("uv-0.1.0.data/scripts/uv", b"\x7fELF the binary")
    assert uv_binary(wheel) == b"\x7fELF the binary"


def test_a_wheel_without_uv_in_it_is_a_clear_error(tmp_path: Path) -> None:
    wheel = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("other/__init__.py", "")
    with pytest.raises(UsageError, match="not a uv wheel"):
        uv_binary(wheel)
