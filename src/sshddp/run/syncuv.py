"""uv for a host of another platform than this machine: the binary out of the ``uv``
wheel for the host's platform, fetched here with pip (so a host needs only Python and
SSH). ``run/sync.py`` keeps each platform's binary for the process."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from sshddp.errors import UsageError
from sshddp.model import sync as model

PIP_TIMEOUT = 300  #: seconds for pip to fetch the uv wheel (17 MB)


def uv_binary(wheel: Path) -> bytes:
    """The ``uv`` executable inside the ``uv`` wheel at ``wheel``."""
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.endswith(".data/scripts/uv")]
        if len(names) != 1:
            raise UsageError(f"{wheel}: not a uv wheel (no *.data/scripts/uv in it)")
        return archive.read(names[0])


def fetch_wheel(version: str, tag: str, folder: Path) -> Path:
    """``pip download`` of the ``uv`` wheel ``version`` for platform ``tag`` into
    ``folder``; ``UsageError`` with pip's own message when it cannot."""
    argv = [sys.executable, "-m", "pip", "download", f"uv=={version}", "--no-deps"]
    argv += ["--only-binary", ":all:", "--platform", tag, "--quiet", "-d", str(folder)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"pip could not fetch uv {version} for {tag}: {exc}") from exc
    wheels = sorted(folder.glob(f"uv-{version}-*.whl"))
    if done.returncode != 0 or not wheels:
        said = done.stderr.strip() or f"pip exited {done.returncode}"
        raise UsageError(f"pip could not fetch uv {version} for {tag}:\n{said}")
    return wheels[0]


def uv_for(host_platform: str, version: str) -> bytes:
    """The uv ``version`` binary that runs on a host of ``host_platform``."""
    tag = model.uv_wheel_tag(host_platform)
    if tag is None:
        raise UsageError(
            f"uv publishes no wheel for {host_platform}: install uv {version} on the host "
            "and put it at <workdir>/tools/uv-VERSION/uv"
        )
    with tempfile.TemporaryDirectory(prefix="sshddp-uv-") as tmp:
        return uv_binary(fetch_wheel(version, tag, Path(tmp)))
