"""The clock sample a launch session's first line gives, and when a launch takes another.

The session (``remote/node/host_session.py``) writes its clock as soon as it runs, so the
coordinator gets a sample from writing the header to reading that line, with no round trip of its
own. A launch takes one more only when that sample does not prove the host within
``CLOCK_WARN``; doctor always takes ``CLOCK_SAMPLES`` more and keeps the best.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fake_process import ScriptedOutput

from sshddp import defaults
from sshddp.errors import RemoteError
from sshddp.hosts.session import HostSession
from sshddp.model.inventory import Host
from sshddp.protocol import session_messages as msgs
from sshddp.run import preflight

FACTS = msgs.facts({"hostname": "h1"})


class _Host(ScriptedOutput):
    """A host's session as its bytes: what it answers, and the clock it answers from."""

    def __init__(self, ahead: float, lines: list[dict[str, Any]], early: bool = True) -> None:
        self.host = Host("h1", 0)
        self.label = "h1"
        self.ahead = ahead
        self.lines = list(lines)
        self.early = early
        self.asked: list[dict[str, Any]] = []

    def start(self, command: str) -> _Host:
        return self

    def write(self, data: bytes) -> None:
        if data.startswith(b'{"importer"'):  # the header: the session starts
            if self.early:
                self._say(msgs.clock(time.time() + self.ahead))
            for line in self.lines:
                self._say(line)
            return
        question = msgs.decode_order(data)
        assert question == msgs.ask("clock"), data
        self.asked.append(question)
        self._say(msgs.answer("clock", {"clock": time.time() + self.ahead}))

    def _say(self, obj: Any) -> None:
        self.out += json.dumps(obj).encode() + b"\n"


def _session(host: _Host) -> HostSession:
    return HostSession(host, "", "", {"workdir": "~"})  # type: ignore[arg-type]


def test_the_first_line_is_a_clock_sample_around_the_header() -> None:
    host = _Host(ahead=0.0, lines=[FACTS])
    before = time.time()
    session = _session(host)
    assert session.answer("probe") == {"hostname": "h1"}
    clock = session.first_clock
    assert clock is not None and 0 <= clock["rtt"] <= time.time() - before
    assert abs(clock["offset"]) <= clock["rtt"] / 2 + 0.01


@pytest.mark.parametrize("ahead", [5.0, -90.0])
def test_the_offset_is_the_hosts(ahead: float) -> None:
    session = _session(_Host(ahead=ahead, lines=[FACTS]))
    session.answer("probe")
    assert session.first_clock is not None
    assert session.first_clock["offset"] == pytest.approx(ahead, abs=0.5)


def test_a_host_without_a_session_answers_first() -> None:
    """Python too old: the bootstrap's own line comes first, and is the probe's answer."""
    old = {"too_old": "3.6.15", "executable": "/usr/bin/python3"}
    session = _session(_Host(ahead=0.0, lines=[old], early=False))
    assert session.answer("probe") == old
    assert session.first_clock is None


def test_a_line_that_is_not_the_reply_a_step_waits_for_is_an_error() -> None:
    """An untagged line, or a reply of another kind, is never taken for the probe's facts:
    a RemoteError names the host, the step and what came."""
    for line in ({"hostname": "h1"}, msgs.released()):
        session = _session(_Host(ahead=0.0, lines=[line]))
        with pytest.raises(RemoteError, match=r"h1: the session answered probe with .*"):
            session.answer("probe")


def test_a_launch_takes_no_more_samples_of_a_clock_in_sync() -> None:
    host = _Host(ahead=0.0, lines=[FACTS])
    session = _session(host)
    session.answer("probe")
    assert preflight._clock(session, deep=False) == session.first_clock
    assert host.asked == []


@pytest.mark.parametrize("ahead", [2 * defaults.CLOCK_WARN, -90.0])
def test_a_launch_takes_one_more_sample_of_a_clock_off(ahead: float) -> None:
    host = _Host(ahead=ahead, lines=[FACTS])
    session = _session(host)
    session.answer("probe")
    clock = preflight._clock(session, deep=False)
    assert len(host.asked) == defaults.LAUNCH_CLOCK_SAMPLES == 1
    assert clock["offset"] == pytest.approx(ahead, abs=0.5)
    assert clock["rtt"] <= session.first_clock["rtt"]  # type: ignore[index]


def test_doctor_takes_its_samples_and_keeps_the_best() -> None:
    host = _Host(ahead=0.0, lines=[FACTS])
    session = _session(host)
    session.answer("probe")
    clock = preflight._clock(session, deep=True)
    assert len(host.asked) == defaults.CLOCK_SAMPLES
    assert clock["rtt"] <= session.first_clock["rtt"]  # type: ignore[index]
