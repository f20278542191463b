"""The host-side importer (remote/importer.py): the shipped modules follow the header line,
packed, and a stream cut short is refused."""

from __future__ import annotations

import io
import json

import pytest

from sshddp.hosts import shipped
from sshddp.remote import importer


def test_the_modules_follow_the_header_line_packed() -> None:
    """The header line names the size of what follows it: every module of the call's
    closure, as zlib-compressed JSON, a third of the sources' size or less."""
    sent = shipped.header("host_session", {"probe": None})
    line, _, rest = sent.partition(b"\n")
    head = json.loads(line)
    assert "modules" not in head and head["packed"] == len(rest)
    modules = importer.unpack(io.BytesIO(rest), head["packed"])
    closure = shipped.closure("sshddp.remote.node.host_session")
    assert modules == {m: shipped.source(m) for m in closure}
    assert len(rest) * 3 < sum(len(s) for s in modules.values())


def test_packed_modules_cut_short_are_refused() -> None:
    rest = shipped.header("host_follow", {}).partition(b"\n")[2]
    with pytest.raises(RuntimeError, match=f"cut short: {len(rest) - 1} of {len(rest)} bytes"):
        importer.unpack(io.BytesIO(rest[:-1]), len(rest))
