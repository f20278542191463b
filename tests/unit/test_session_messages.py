"""The launch session's wire (protocol/session_messages.py): every message survives its
round trip, and a line that is not one (junk, an unknown or missing kind, a missing field,
a field of the wrong type) decodes to None, so neither end acts on a guess."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sshddp.protocol import session_messages as msgs

ORDERS: list[Any] = [
    msgs.ask("clock"),
    msgs.ask("connect", {"connect": ["10.0.0.1", 29500], "timeout": 3}),
    msgs.go({"rundir": "~/r/n0", "packed": 12}),
    msgs.start(True),
    msgs.start(False),
]
REPLIES: list[Any] = [
    msgs.clock(1700000000.25),
    msgs.clock(1700000000),
    msgs.facts({"python": {"version": "3.8.10"}}),
    msgs.answer("connect", {"rendezvous": {"ok": True}}),
    msgs.released(),
    msgs.staged({"ok": False, "rundir": "/r", "error": "no room"}),
    msgs.started({"ok": True, "rundir": "/r", "state": {"state": "running"}}),
]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: str(o["kind"]))
def test_an_order_survives_its_round_trip(order: Any) -> None:
    line = msgs.encode(order)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert msgs.decode_order(line) == order
    assert msgs.decode_reply(line) is None  # an order is no reply


@pytest.mark.parametrize("reply", REPLIES, ids=lambda r: str(r["kind"]))
def test_a_reply_survives_its_round_trip(reply: Any) -> None:
    line = msgs.encode(reply)
    assert msgs.decode_reply(line) == reply
    assert msgs.reply_of(json.loads(line)) == reply
    assert msgs.decode_order(line) is None


@pytest.mark.parametrize(
    "line",
    [b"", b"\n", b"not json\n", b"\xff\xfe\n", b"[1, 2]\n", b'"go"\n', b"null\n", b"{}\n"],
)
def test_junk_decodes_to_nothing(line: bytes) -> None:
    assert msgs.decode_order(line) is None and msgs.decode_reply(line) is None


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "launch", "boot": {}},  # no such kind
        {"kind": 3},
        {"go": True, "boot": {}},  # untagged, as the lines were before the tag
        {"ask": "clock"},
    ],
)
def test_a_wrong_or_missing_kind_decodes_to_nothing(value: Any) -> None:
    line = json.dumps(value).encode()
    assert msgs.decode_order(line) is None and msgs.decode_reply(line) is None


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "ask", "args": {}},  # no question
        {"kind": "ask", "ask": "clock"},  # no args
        {"kind": "ask", "ask": 1, "args": {}},
        {"kind": "go"},
        {"kind": "go", "boot": ["rundir"]},
        {"kind": "start"},
        {"kind": "start", "start": 1},  # a number is no bool
        {"kind": "start", "start": "true"},
    ],
)
def test_an_order_with_a_field_missing_or_of_another_type_decodes_to_nothing(value: Any) -> None:
    assert msgs.decode_order(json.dumps(value).encode()) is None


@pytest.mark.parametrize(
    "value",
    [
        {"kind": "clock"},
        {"kind": "clock", "clock": "now"},
        {"kind": "clock", "clock": True},  # a bool is no time
        {"kind": "facts", "facts": None},
        {"kind": "answer", "answer": {}},
        {"kind": "answer", "ask": "clock", "answer": 3},
        {"kind": "staged"},
        {"kind": "started", "answer": "ok"},
    ],
)
def test_a_reply_with_a_field_missing_or_of_another_type_decodes_to_nothing(value: Any) -> None:
    assert msgs.decode_reply(json.dumps(value).encode()) is None


def test_decoding_keeps_only_the_kinds_fields() -> None:
    line = json.dumps({"kind": "start", "start": True, "extra": "x"}).encode()
    assert msgs.decode_order(line) == {"kind": "start", "start": True}


def test_what_a_reply_carries_to_the_step_that_waits_for_it() -> None:
    assert msgs.carried(msgs.facts({"a": 1})) == {"a": 1}
    assert msgs.carried(msgs.staged({"ok": True})) == {"ok": True}
    assert msgs.carried(msgs.released()) == {}
    assert msgs.replies_to(msgs.answer("clock", {}), "answer", "clock")
    assert not msgs.replies_to(msgs.answer("clock", {}), "answer", "connect")
    assert not msgs.replies_to(msgs.released(), "staged")
