"""``fetch``'s stream, in-process: what a host named is shown escaped."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sshddp.model.commands import Program
from sshddp.model.inventory import Host
from sshddp.model.plan import NodePlan
from sshddp.run.fetch import NodeCopy, summary


def node_on(python: str) -> NodePlan:
    host = Host("localhost", 0, nproc=1, python=python)
    return NodePlan(host, 0, 1, 0, rundir="", env={}, program=Program("script", ""), cwd="")


@pytest.fixture(params=["this", "3.8"])
def python(request: pytest.FixtureRequest, oldest_python: Path) -> str:
    return sys.executable if request.param == "this" else str(oldest_python)


def test_what_a_host_named_is_shown_escaped(tmp_path: Path) -> None:
    node = node_on(sys.executable)
    copy = NodeCopy(
        node,
        tmp_path / "out\x1b]0;x\x07",
        "dir",
        5,
        "0" * 64,
        skipped=("out/\x1b]52;c;cm0K\x07", "out/\x9b2J"),
        skipped_count=3,
    )
    shown = "\n".join(summary([copy]))
    assert "\x1b" not in shown and "\x07" not in shown and "\x9b" not in shown, shown
    assert "skipped (links, devices, unreadable): out/\\x1b]52;c;cm0K\\x07, out/\\x9b2J" in shown
    assert "and 1 more" in shown
