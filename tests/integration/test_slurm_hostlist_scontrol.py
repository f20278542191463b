"""Slurm hostlists expanded as Slurm itself expands them.

The oracle is the real ``scontrol show hostnames LIST`` (slurm-client), which expands
locally from a two-line slurm.conf: no controller is contacted. Every corpus entry and
every generated list must give the same names in the same order as scontrol, and what
Slurm refuses is refused here.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Callable, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sshddp.errors import InventoryError
from sshddp.model.slurm import MAX_NAMES, expand_hostlist

Scontrol = Callable[[str], Optional[list[str]]]


CORPUS = [
    "node1",
    "007",
    "login-01.cluster.example",
    "node_a[1-2]",
    "gpu[01-04,07]",
    "a1,b[2-3],c",
    "cn[001-003],gpu[1-2]b[3-4],login",
    "a[1-2]b[3-4]",
    "a[1-2]b[1-2]c[1-2]",
    "r[1-2]c[1-3]n[1-2]s[0-1]",
    "n[1-3]b[01-02]",
    "a[1-2][3-4]",
    "a[1-2]-b[3-4]",
    "x.y-z[1-2]",
    "a-[1-2]",
    "[1-2]",
    "n1[0-2]",
    "n[8-010]",
    "n[08-10]",
    "n[008-10]",
    "n[099-101]",
    "n[9-11]",
    "n[0-2]",
    "n[00-2]",
    "a[01-1]",
    "a[5]",
    "a[1,1]",
    "a1,a1",
    "n[3,1-2]",
    "n[1-2],n[3-4]",
    "a[1-2,3-4]",
]


# Slurm refuses these too (scontrol prints "Invalid hostlist").
REJECTED_BY_SLURM = ["a[3-1]", "a[10-1]", "a[]", "a[-1]", "a[1--2]", "a[b]", "n[0-70000]",
                     "n[1-65537]", "a[1-2]x", "n[1-3]7", "x.y[1-2].z", "n[1-2]]",
                     "a[[1-2]]", "a[1-2]b,c"]  # fmt: skip


@pytest.fixture(scope="session")
def scontrol(tmp_path_factory: pytest.TempPathFactory) -> Scontrol:
    """``scontrol show hostnames`` as a function: the names, or None if Slurm rejects."""
    if shutil.which("scontrol") is None:
        pytest.fail("scontrol is not installed: `apt-get install slurm-client` (.ci/run does)")
    conf = tmp_path_factory.mktemp("slurm-conf") / "slurm.conf"
    # scontrol reads a config before any subcommand; this one names no reachable host.
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\n")

    def show(text: str) -> list[str] | None:
        proc = subprocess.run(
            ["scontrol", "show", "hostnames", "--", text],
            env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=10,
        )
        if "Invalid hostlist" in proc.stdout + proc.stderr:
            return None
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    return show


@pytest.mark.parametrize("text", CORPUS)
def test_corpus_matches_scontrol(text: str, scontrol: Scontrol) -> None:
    assert expand_hostlist(text) == scontrol(text)


def test_largest_range_matches_scontrol(scontrol: Scontrol) -> None:
    text = f"n[1-{MAX_NAMES}]"
    names = expand_hostlist(text)
    assert len(names) == MAX_NAMES
    assert names == scontrol(text)


@pytest.mark.parametrize("text", REJECTED_BY_SLURM)
def test_invalid_for_slurm_is_invalid_here(text: str, scontrol: Scontrol) -> None:
    assert scontrol(text) is None
    with pytest.raises(InventoryError):
        expand_hostlist(text)


_NAME = st.text("abcxyz.-_", min_size=1, max_size=4)


_GLUE = st.text("abz.-_0123", max_size=3)


@st.composite
def _range(draw: st.DrawFn) -> str:
    low = draw(st.integers(0, 120))
    high = low + draw(st.integers(0, 12))
    pad_low = draw(st.integers(0, 3))
    text = str(low).zfill(len(str(low)) + pad_low)
    if draw(st.booleans()) and high == low:
        return text
    return f"{text}-{str(high).zfill(len(str(high)) + draw(st.integers(0, 1)))}"


@st.composite
def _group(draw: st.DrawFn) -> str:
    brackets = draw(st.integers(0, 3))
    if not brackets:
        return draw(_NAME) + draw(_GLUE)
    parts = [draw(st.one_of(_NAME, st.just("")))]
    for i in range(brackets):
        ranges = draw(st.lists(_range(), min_size=1, max_size=3))
        parts.append(f"[{','.join(ranges)}]")
        if i < brackets - 1:
            parts.append(draw(_GLUE))
    return "".join(parts)


_HOSTLISTS = st.lists(_group(), min_size=1, max_size=4).map(",".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_HOSTLISTS)
def test_generated_lists_match_scontrol(text: str, scontrol: Scontrol) -> None:
    assert expand_hostlist(text) == scontrol(text)
