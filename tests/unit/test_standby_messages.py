"""The standby's wire (protocol/standby_messages.py): the go survives its round trip, and
anything else decodes to None. The agent shim reads its go
with this module loaded from beside it (agent.standby_wire), as in a run directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sshddp.protocol import contract
from sshddp.protocol import standby_messages as msgs
from sshddp.remote.rankside import agent

GO = msgs.go({"PATH": "/bin", "SECRET": "s"}, ["python", "agent.py", "--nnodes", "2"], "/w")


def test_a_go_survives_its_round_trip() -> None:
    line = msgs.encode(GO)
    assert msgs.decode_go(line) == GO
    assert msgs.decode_go(msgs.encode(msgs.go({}, [], None))) == msgs.go({}, [], None)


@pytest.mark.parametrize("data", [b"", b"junk", b"\xff", b"[]", b"null", b"{}"])
def test_junk_decodes_to_nothing(data: bytes) -> None:
    assert msgs.decode_go(data) is None


@pytest.mark.parametrize(
    "value",
    [
        {"env": {}, "argv": [], "cwd": None},  # untagged, as the go was before the tag
        {"kind": "supervise", "env": {}, "argv": [], "cwd": None},
        {"kind": "go", "argv": [], "cwd": None},  # no env
        {"kind": "go", "env": {}, "cwd": None},  # no argv
        {"kind": "go", "env": {"A": 1}, "argv": [], "cwd": None},
        {"kind": "go", "env": {}, "argv": ["python", 2], "cwd": None},
        {"kind": "go", "env": {}, "argv": "python agent.py", "cwd": None},
        {"kind": "go", "env": {}, "argv": [], "cwd": 7},
    ],
)
def test_a_go_of_another_kind_or_with_a_bad_field_decodes_to_nothing(value: Any) -> None:
    assert msgs.decode_go(json.dumps(value).encode()) is None


def test_the_agent_shim_reads_the_go_with_the_module_beside_it(tmp_path: Path) -> None:
    """As in a run directory: agent.py and standby_messages.py side by side, nothing of
    sshddp importable from there."""
    source = Path(agent.__file__).parent
    shutil.copy(source / "agent.py", tmp_path / contract.AGENT_SHIM)
    shutil.copy(msgs.__file__, tmp_path / contract.STANDBY_WIRE)
    assert agent.STANDBY_WIRE == contract.STANDBY_WIRE
    namespace: dict[str, Any] = {"__file__": str(tmp_path / contract.AGENT_SHIM)}
    exec(compile((tmp_path / contract.AGENT_SHIM).read_text(), "agent.py", "exec"), namespace)
    module = namespace["standby_wire"]()
    assert module.__file__ == str(tmp_path / contract.STANDBY_WIRE)
    assert module.decode_go(msgs.encode(GO)) == GO
