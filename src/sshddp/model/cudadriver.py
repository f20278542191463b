"""Pure: whether a host's NVIDIA driver can run a torch CUDA build.

A torch wheel built for CUDA X.Y (``+cuXY0``, ``+cu124``) carries its CUDA runtime; the
host's driver must be at least the one NVIDIA ships with that CUDA toolkit (the release
notes' table "CUDA Toolkit and Corresponding Driver Versions", Linux x86_64), which is
also the CUDA version ``nvidia-smi`` reports as the driver's most. CUDA's minor version
compatibility lets some builds start on an older driver of the same major version, but
without PTX JIT and not for every kernel, so anything older is flagged.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Optional

#: CUDA version -> the oldest Linux driver of its toolkit (release notes, Table 3)
DRIVER_FOR_CUDA: dict[tuple[int, int], str] = {
    (10, 2): "440.33",
    (11, 0): "450.36.06",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}

_TORCH = re.compile(r'name\s*=\s*"torch"\s*\n\s*version\s*=\s*"([^"]+)"', re.MULTILINE)
_PIN = re.compile(r"^torch==(\S+)", re.MULTILINE)


def cuda_of(version: str) -> Optional[str]:
    """The CUDA of a torch version's local tag (``2.5.1+cu124`` -> ``12.4``; ``+cu118``
    -> ``11.8``); None for a CPU, ROCm or untagged build."""
    found = re.fullmatch(r"[^+]+\+cu(\d+)(\d)", version.strip())
    return f"{int(found[1])}.{found[2]}" if found else None


def locked_cuda(files: Mapping[str, str]) -> Optional[str]:
    """The CUDA of the torch build a project's lock pins (uv.lock, pylock.toml or exact
    pins): the oldest where it pins several (one per platform), since any host may get
    it; None when it pins no ``+cuXYZ`` build."""
    versions: list[str] = []
    for text in files.values():
        versions += _TORCH.findall(text) + _PIN.findall(text)
    cudas = [c for c in map(cuda_of, versions) if c is not None]
    return min(cudas, key=_numbers) if cudas else None


def driver_needed(cuda: str) -> Optional[str]:
    """The oldest driver that runs CUDA ``cuda`` (``12.4``): its toolkit's, or the next
    listed toolkit's for a version between two; None for one newer than the table."""
    want = _numbers(cuda)[:2]
    known = sorted(k for k in DRIVER_FOR_CUDA if k >= want)
    return DRIVER_FOR_CUDA[known[0]] if known else None


def too_old(drivers: Iterable[str], cuda: str) -> Optional[str]:
    """The oldest of a host's ``drivers`` when it cannot run CUDA ``cuda``, else None
    (no driver to judge, or a CUDA newer than the table)."""
    needed = driver_needed(cuda)
    found = sorted((d for d in drivers if re.fullmatch(r"\d+(\.\d+)*", d)), key=_numbers)
    if needed is None or not found:
        return None
    return found[0] if _numbers(found[0]) < _numbers(needed) else None


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())
