"""The coordinator's trace: what it did and why, for bug reports (``-v``, ``SSHDDP_LOG``).

Every layer logs through the standard library's logger ``sshddp`` (``log``), at INFO, with
%-style arguments: while the trace is off (the default) the logger is disabled for INFO, so
a call formats nothing. ``-v`` sends the trace to stderr; ``SSHDDP_LOG=PATH`` appends it to
that file whatever the flag (created 0600; an existing one only if it is ours and private;
never through a symbolic link), and ``SSHDDP_LOG=-`` means stderr. Each line reads
``sshddp[+0.412s] what happened``, the time counted from the command's start on the
monotonic clock.

What is traced names hosts, addresses, phases, decisions and timings; never an environment
value, the peers' key, or a command line (which may carry them).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Callable, TextIO

from sshddp.errors import UsageError

log = logging.getLogger("sshddp")
log.propagate = False  # the trace goes where -v / SSHDDP_LOG say, never to the root logger
log.addHandler(logging.NullHandler())  # off: not Python's last-resort handler either
log.setLevel(logging.WARNING)

ENV = "SSHDDP_LOG"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


Redact = Callable[[str], str]  #: what of a message may be shown (the caller's masking)


class Formatter(logging.Formatter):
    """``sshddp[+SECONDS] message``: seconds since ``start`` on ``clock``; a message passes
    ``redact`` (the credentials of a URL a host's text quotes), and its control characters
    (a host's text may carry some) are shown escaped, one record one line."""

    def __init__(
        self,
        start: float,
        clock: Callable[[], float] = time.monotonic,
        redact: Redact = lambda text: text,
    ) -> None:
        super().__init__()
        self.start = start
        self.clock = clock
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", self.redact(record.getMessage()))
        return f"sshddp[+{self.clock() - self.start:.3f}s] {text}"


def on() -> bool:
    """Whether the trace is being written (to skip work done only for it)."""
    return log.isEnabledFor(logging.INFO)


def from_env(environ: Mapping[str, str], stderr: TextIO, command: str, redact: Redact) -> None:
    """``SSHDDP_LOG``: the trace to that file (``-``: stderr), whatever ``-v`` says; every
    line passes ``redact``."""
    where = environ.get(ENV, "")
    if where == "-":
        _install(logging.StreamHandler(stderr), command, redact)
    elif where:
        _install(_FileHandler(_open_log(where)), command, redact)


def to_stderr(stderr: TextIO, command: str, redact: Redact) -> None:
    """``-v``: the trace to stderr, unless ``SSHDDP_LOG`` already sends it somewhere."""
    if not _handlers():
        _install(logging.StreamHandler(stderr), command, redact)


def close() -> None:
    """Stop tracing (the command ended); a file opened for it is closed."""
    for handler in _handlers():
        log.removeHandler(handler)
        handler.close()
    log.setLevel(logging.WARNING)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Trace a phase's start, and its end with its duration (or what ended it)."""
    if not on():
        yield
        return
    started = time.monotonic()
    log.info("%s: begin", name)
    try:
        yield
    except BaseException as exc:
        log.info("%s: ended by %s after %.3f s", name, type(exc).__name__, since(started))
        raise
    log.info("%s: done in %.3f s", name, since(started))


def since(started: float) -> float:
    """Seconds from ``started`` (``time.monotonic()``) to now."""
    return time.monotonic() - started


class _FileHandler(logging.StreamHandler):
    """The trace into the file ``SSHDDP_LOG`` names: closing the handler closes it."""

    def close(self) -> None:
        super().close()
        self.stream.close()


def _handlers() -> list[logging.StreamHandler[TextIO]]:
    return [h for h in log.handlers if isinstance(h, logging.StreamHandler)]


def _install(handler: logging.StreamHandler[TextIO], command: str, redact: Redact) -> None:
    from sshddp import __version__

    handler.setFormatter(Formatter(time.monotonic(), redact=redact))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("sshddp %s %s (pid %d)", __version__, command or "(no command)", os.getpid())


def _open_log(path: str) -> TextIO:
    """``path`` for appending: made new and 0600, or one that is already a regular file of
    ours that nobody else can read or write; never through a symbolic link (another user's
    file or link in a shared directory would have them read the trace, or choose where we
    write it)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = _open_existing(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refused(path, "is a symbolic link") from None
        raise UsageError(f"{ENV}={path}: cannot open it for the trace: {exc.strerror}") from None
    return open(fd, "a", encoding="utf-8", errors="backslashreplace", buffering=1)


def _open_existing(path: str, flags: int) -> int:
    """An existing trace file, opened only if it is a regular file, ours and private."""
    fd = os.open(path, flags)
    info = os.fstat(fd)
    why = ""
    if not stat.S_ISREG(info.st_mode):
        why = "is not a regular file"
    elif info.st_uid != os.geteuid():
        why = f"is owned by another user (uid {info.st_uid})"
    elif info.st_mode & 0o077:
        why = f"can be read or written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    if why:
        os.close(fd)
        raise _refused(path, why)
    return fd


def _refused(path: str, why: str) -> UsageError:
    return UsageError(
        f"{ENV}={path}: {why}; sshddp writes its trace (hosts, addresses, what it did) only "
        "to a file of your own that no one else can read: name a new file, or `chmod 600` "
        "one of yours"
    )
