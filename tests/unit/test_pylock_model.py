"""Pure: a pylock.toml as ``sync --offline`` pins it for this machine (``model/pylock``),
its markers judged by ``packaging`` (``run/syncwheels.marker_holds``)."""

from __future__ import annotations

import pytest

from sshddp.errors import UsageError
from sshddp.model import pylock
from sshddp.run.syncwheels import marker_holds

LINUX = {
    "implementation_name": "cpython",
    "implementation_version": "3.11.7",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_release": "6.1.0-18-amd64",
    "platform_system": "Linux",
    "platform_version": "#1 SMP",
    "python_full_version": "3.11.7",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "sys_platform": "linux",
}
MAC = {**LINUX, "sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}

# as `uv export --format pylock.toml` writes it (abridged hashes), and a wheel by path
LOCK = """\
lock-version = "1.0"
created-by = "uv"
requires-python = ">=3.11"

[[packages]]
name = "colorama"
version = "0.4.6"
marker = "sys_platform == 'win32'"
sdist = { url = "https://x/colorama-0.4.6.tar.gz", hashes = { sha256 = "08" } }

[[packages]]
name = "numpy"
version = "2.2.6"
index = "file:///opt/pypi/simple"

[[packages.wheels]]
url = "file:///opt/pypi/files/numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl"
hashes = { sha256 = "BA10" }

[[packages.wheels]]
url = "https://x/numpy-2.2.6-cp311-cp311-macosx_14_0_arm64.whl"
hashes = { sha256 = "c0de" }

[[packages]]
name = "nvidia-nccl-cu12"
version = "2.21.5"
marker = "platform_machine == 'x86_64' and sys_platform == 'linux'"

[[packages.wheels]]
name = "nvidia_nccl_cu12-2.21.5-py3-none-manylinux2014_x86_64.whl"
path = "wheels/nccl.whl"
hashes = { sha256 = "aa" }

[[packages]]
name = "Typing_Extensions"
version = "4.12.2"
marker = "python_full_version < '3.12'"
wheels = [{ url = "https://x/typing_extensions-4.12.2-py3-none-any.whl" }]
"""


def names(packages: tuple[pylock.Locked, ...]) -> list[str]:
    return [f"{p.name}=={p.version}" for p in packages]


def test_the_packages_whose_markers_hold_here_become_exact_pins() -> None:
    linux = pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", LINUX))
    wanted = ["numpy==2.2.6", "nvidia-nccl-cu12==2.21.5", "Typing_Extensions==4.12.2"]
    assert names(linux) == wanted
    assert pylock.pins(linux) == "".join(f"{pin}\n" for pin in wanted)
    assert names(pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", MAC))) == [
        wanted[0],
        wanted[2],
    ]
    newer = {**LINUX, "python_full_version": "3.12.1", "python_version": "3.12"}
    assert (
        names(pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", newer)))
        == wanted[:2]
    )


def test_every_wheel_of_a_package_is_offered_with_its_address_and_hash() -> None:
    numpy, nccl, typing = pylock.applying(
        LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", LINUX)
    )
    assert [w.file for w in numpy.wheels] == [
        "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl",
        "numpy-2.2.6-cp311-cp311-macosx_14_0_arm64.whl",
    ]
    assert numpy.wheels[0].sha256 == "ba10"  # hex digits compare in one case
    # a path is the lock's folder's; the wheel's name, when given, is its file's
    (wheel,) = nccl.wheels
    assert wheel.url == "file:///p/wheels/nccl.whl"
    assert wheel.file == "nvidia_nccl_cu12-2.21.5-py3-none-manylinux2014_x86_64.whl"
    assert typing.wheels[0].sha256 == ""
    pages = pylock.index_pages([numpy, nccl, typing])
    assert sorted(pages) == ["numpy", "nvidia-nccl-cu12", "typing-extensions"]
    assert 'href="https://x/numpy-2.2.6-cp311-cp311-macosx_14_0_arm64.whl"' in pages["numpy"]


def test_a_package_with_only_an_sdist_here_is_named_with_the_lock() -> None:
    windows = {**LINUX, "sys_platform": "win32", "os_name": "nt"}
    with pytest.raises(UsageError, match=r"/p/pylock.toml: package colorama 0.4.6 has no wheel"):
        pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", windows))
    with pytest.raises(UsageError, match="only its sdist"):
        pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", windows))


def test_a_wheel_whose_hash_is_not_the_locked_one_is_an_error() -> None:
    packages = pylock.applying(LOCK, "/p/pylock.toml", marker_holds("/p/pylock.toml", LINUX))
    numpy = "numpy-2.2.6-cp311-cp311-manylinux_2_17_x86_64.whl"
    pylock.checked({numpy: "ba10"}, packages, "/p/pylock.toml")
    unhashed = "typing_extensions-4.12.2-py3-none-any.whl"
    pylock.checked({unhashed: "ff"}, packages, "/p/pylock.toml")  # the lock gives none
    with pytest.raises(UsageError, match=f"/p/pylock.toml: {numpy} has SHA-256 ff.*says ba10"):
        pylock.checked({numpy: "ff"}, packages, "/p/pylock.toml")
    with pytest.raises(UsageError, match="names no such wheel"):
        pylock.checked({"other-1.0-py3-none-any.whl": "ff"}, packages, "/p/pylock.toml")


@pytest.mark.parametrize(
    ("marker", "holds"),
    [
        ("sys_platform == 'linux'", True),
        ("sys_platform == 'win32' or (python_version >= '3.10' and os_name == 'posix')", True),
        ("python_version < '3.11'", False),
        ("python_full_version >= '3.11.0rc1'", True),
        ("python_full_version < '3.12.0a1'", True),
        ("python_version == '3.*'", True),
        ("python_version != '3.11.*'", False),
        ("python_version ~= '3.10'", True),
        ("python_version ~= '3.12'", False),
        ("'3.11' <= python_version", True),
        ("'linux' in sys_platform and 'win' not in sys_platform", True),
        ("platform_release >= '5'", False),  # no version: in no version's range
        ("'gpu' in extras", False),
        ("'dev' in dependency_groups", True),
    ],
)
def test_markers_hold_as_pep_508_says(marker: str, holds: bool) -> None:
    assert marker_holds("/p/pylock.toml", LINUX)(marker, frozenset(["dev"])) is holds


@pytest.mark.parametrize(
    "marker", ["python_version >=", "nope == '1'", "(os_name == 'posix'", "os_name ~= 'x'"]
)
def test_a_marker_that_cannot_be_read_is_named_with_the_lock(marker: str) -> None:
    with pytest.raises(UsageError, match="/p/pylock.toml: cannot read the marker"):
        marker_holds("/p/pylock.toml", LINUX)(marker, frozenset())


def test_a_lock_that_is_not_toml_is_named() -> None:
    with pytest.raises(UsageError, match="/p/pylock.toml: not a valid TOML file"):
        pylock.applying("[[packages]\n", "/p/pylock.toml", marker_holds("/p/pylock.toml", LINUX))
