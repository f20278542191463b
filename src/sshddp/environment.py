"""The terminal, injected: streams, colour and the process environment.

Commands write only through an ``Environment`` so tests can run the CLI in-process with
captured streams (httpie's ``Environment`` does the same).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, TextIO

if TYPE_CHECKING:  # rich is imported when a table is printed: a launch never needs it
    from rich.console import Console


def _wants_color(stream: TextIO, environ: Mapping[str, str]) -> bool:
    if "NO_COLOR" in environ or environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


@dataclass
class Environment:
    stdout: TextIO
    stderr: TextIO
    stdout_bytes: BinaryIO
    color: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_process(cls) -> Environment:
        environ = dict(os.environ)
        return cls(
            stdout=sys.stdout,
            stderr=sys.stderr,
            stdout_bytes=sys.stdout.buffer,
            color=_wants_color(sys.stdout, environ),
            environ=environ,
        )

    def out(self, text: str) -> None:
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(text if text.endswith("\n") else text + "\n")
        self.stderr.flush()

    def rich_out(self) -> Console:
        from sshddp.report import console

        return console(self.stdout, self.color)

    def rich_err(self) -> Console:
        from sshddp.report import console

        return console(self.stderr, self.color and _wants_color(self.stderr, self.environ))
