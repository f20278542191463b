"""One SSH channel and one remote interpreter per host for a whole launch (or doctor run).

The host's session (``remote/node/host_session.py``) tells its clock as soon as it runs (a clock
sample without a round trip of its own), answers the preflight probe, waits for the go,
stages the node's code, waits for the start (given once every node staged), forks the
node's supervisor and then streams the node's log. A doctor run ends it after the probe.
Without it a launch cost every host three channels and four interpreters (probe, boot,
follow and the supervisor), and on busy hosts those starts were most of sshddp's launch
latency.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from typing import Any, Optional

from sshddp import defaults, trace
from sshddp.errors import RemoteError
from sshddp.hosts import shipped
from sshddp.hosts.transport import RemoteProcess, Transport
from sshddp.model.commands import python_command
from sshddp.protocol import contract, session_messages

#: the reply each step waits for (``answer``'s ``what``), and what of it the caller gets
REPLY_KIND = {"probe": "facts", "release": "released", "stage": "staged", "start": "started"}


class HostSession:
    """The coordinator's end of one host's session."""

    def __init__(
        self,
        transport: Transport,
        run_id: str,
        rundir: str,
        probe: Optional[dict[str, Any]],
        entry: str = "host_session",
    ) -> None:
        """``run_id`` and ``rundir`` are empty for a doctor run, which starts nothing.
        ``entry``: the host's side; ``host_handoff`` for a command that only hands payloads
        on (it answers ``ask`` alone)."""
        self.transport = transport
        # The session forks the node's supervisor, so both show what the host's process list
        # should tell of them: the run id in their environment, the node's run dir in argv.
        env = {contract.RUN_ID_VAR: run_id} if run_id else None
        command = python_command(transport.host.python, env, rundir or None)
        self.proc: RemoteProcess = transport.start(command)
        trace.log.info("session %s: opened", transport.host.host)
        # The first clock sample runs from here to the session's first line: the host reads
        # this header before it looks at its clock, so the interval holds that moment.
        self._sent = time.time()
        self.proc.write(shipped.header(entry, {"probe": probe}))
        #: the host's clock from that sample ({"offset", "rtt"}, as ``clock``); None until the
        #: first answer was read, or if the session never ran (its first line was not one)
        self.first_clock: Optional[dict[str, float]] = None
        self._first_read = False
        self._buffer = b""
        self.closed = False
        self.started = False  #: told to start its node: the run is the follower's from here

    def answer(self, what: str, kind: str = "") -> dict[str, Any]:
        """What the session's next line, a reply of ``kind`` (by default step ``what``'s,
        ``REPLY_KIND``), says of ``what``, or a ``RemoteError`` / ``InterpreterMissing``
        saying why not. The first line, the session's clock, is taken as ``first_clock``."""
        if not self._first_read:
            self._first_read = True
            first = self._line(what)
            back = time.time()
            clock = session_messages.reply_of(first)
            if clock is None or clock["kind"] != "clock":  # no session ran: the bootstrap's
                return first  # "too_old", say
            self.first_clock = {
                "offset": float(clock["clock"]) - (self._sent + back) / 2,
                "rtt": back - self._sent,
            }
        return _carried(self.transport, what, kind or REPLY_KIND[what], self._line(what))

    def _line(self, what: str) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = self.proc.read(65536)
            if not chunk:
                line, self._buffer = self._buffer, b""
                return shipped.decode(
                    self.transport, what, line, self.proc.read_stderr(), self.proc.wait()
                )
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        trace.log.info("session %s: %s answered", self.transport.host.host, what)
        return shipped.decode(self.transport, what, line, b"", None)

    def ask(self, question: dict[str, Any], chunks: Iterable[bytes] = ()) -> dict[str, Any]:
        """Ask the host a question (``{"ask": name, ...its args}``; ``chunks``: bytes that
        follow its line): its answer."""
        args = dict(question)
        name = str(args.pop("ask"))
        self.proc.write(session_messages.encode(session_messages.ask(name, args)))
        self.send_code(chunks)
        return self.answer(name, "answer")

    def clock(self, samples: int) -> dict[str, float]:
        """The host's clock against ours, NTP-style: ``offset`` (seconds it is ahead) from
        the round trip with the shortest ``rtt``, of ``samples`` more and the first
        (``first_clock``); the offset is right within rtt / 2."""
        best: dict[str, float] = dict(self.first_clock or {})
        for _ in range(samples):
            sent = time.time()
            theirs = float(self.ask({"ask": "clock"})["clock"])
            back = time.time()
            if not best or back - sent < best["rtt"]:
                best = {"offset": theirs - (sent + back) / 2, "rtt": back - sent}
        return best

    def go(self, boot_args: dict[str, Any], packed: bytes = b"") -> None:
        """Tell the host to boot: its probe lets go of the rendezvous port first, then it
        stages the code that ``send_code`` streams. ``packed``: the bytes that follow the go
        line (boot args ``"packed"``: their size)."""
        self.proc.write(session_messages.encode(session_messages.go(boot_args)) + packed)

    def send_code(self, chunks: Iterable[bytes]) -> None:
        """Stream the code after the go, one bounded chunk at a time: one write of the whole
        bundle made paramiko copy the rest of it for every packet (quadratic)."""
        for chunk in chunks:
            self.proc.write(chunk)

    def start(self, start: bool) -> None:
        """Every node staged its code: start the node (True), or remove what it staged."""
        self.started = start
        trace.log.info("session %s: %s", self.transport.host.host, "start" if start else "discard")
        self.proc.write(session_messages.encode(session_messages.start(start)))

    def discard(self) -> None:
        """Have the host remove what it staged, and wait until it has."""
        if self.closed:
            return
        try:
            self.start(False)
            _drain(self.proc)
        finally:
            self.close()

    def end(self, wait: float = defaults.SESSION_END_WAIT) -> None:
        """End the session, and unless its node started, wait (up to ``wait`` s) until the
        host has: what it staged is removed then."""
        if self.closed:
            return
        if self.started:
            self.close()
            return
        thread = threading.Thread(target=_drain, args=(self.proc,), daemon=True)
        thread.start()
        thread.join(wait)  # a host that went silent gets no longer than that
        self.close()

    def take_stream(self) -> tuple[RemoteProcess, bytes]:
        """The process, now streaming the node's log, and log bytes already read. The
        caller owns the process from here: closing the session leaves it alone."""
        data, self._buffer = self._buffer, b""
        self.closed = True
        return self.proc, data

    def close(self) -> None:
        """End the session: before the go the host does nothing more; after it, the run
        goes on and only the log stream stops."""
        if self.closed:
            return
        self.closed = True
        trace.log.info("session %s: closed", self.transport.host.host)
        try:
            self.proc.close_stdin()
        except Exception:  # the channel may be gone already
            pass
        try:
            self.proc.close()
        except Exception:
            pass


def _carried(transport: Transport, what: str, kind: str, line: dict[str, Any]) -> dict[str, Any]:
    """What the session's reply ``line`` tells ``what``; a ``RemoteError`` when it is not
    a reply of ``kind`` (an answer: to ``what``)."""
    reply = session_messages.reply_of(line)
    if reply is None or not session_messages.replies_to(reply, kind, what):
        said = json.dumps(line)[:200]
        raise RemoteError(f"{transport.label}: the session answered {what} with {said}")
    return session_messages.carried(reply)


def _drain(proc: RemoteProcess) -> None:
    """Close the host's stdin and read until it has exited."""
    try:
        proc.close_stdin()
        while proc.read(65536):
            pass
        proc.wait()
    except Exception:  # the channel is gone: nothing more to wait for
        pass
