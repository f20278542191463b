"""The user's terminal, injected: streams, colour and the process environment.

Commands write only through a ``Terminal`` so tests can run the CLI in-process with captured
streams (httpie's ``Environment`` does the same). ``Terminal.environ`` is this process's
environment, where ``--env KEY`` finds its value.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, TextIO

if TYPE_CHECKING:  # rich is imported when a table is printed: a launch never needs it
    from rich.console import Console, RenderableType


def _wants_color(stream: TextIO, environ: Mapping[str, str]) -> bool:
    if "NO_COLOR" in environ or environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


@dataclass
class Terminal:
    stdout: TextIO
    stderr: TextIO
    stdout_bytes: BinaryIO
    color: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)
    verbose: bool = False  #: -v: torchrun's agent's lines shown too

    @classmethod
    def from_process(cls) -> Terminal:
        environ = dict(os.environ)
        return cls(
            stdout=sys.stdout,
            stderr=sys.stderr,
            stdout_bytes=sys.stdout.buffer,
            color=_wants_color(sys.stdout, environ),
            environ=environ,
        )

    def size(self) -> tuple[int, int]:
        """The user's terminal's columns and rows (stdout's, else stderr's), else 80x24."""
        from sshddp.run.sinks import terminal_size  # a launch imports it anyway

        return terminal_size(self.stdout, self.stderr)

    def live(self) -> bool:
        """Whether the ranks' output reaches a terminal here (stdout is one), where their
        live displays are redrawn in place."""
        try:
            return bool(self.stdout_bytes.isatty())
        except (AttributeError, ValueError):  # no descriptor, or closed
            return False

    def out(self, text: str) -> None:
        self.stdout.write(text if text.endswith("\n") else text + "\n")
        self.stdout.flush()

    def err(self, text: str) -> None:
        self.stderr.write(text if text.endswith("\n") else text + "\n")
        self.stderr.flush()

    def show(self, renderables: Iterable[RenderableType], to_stderr: bool = False) -> None:
        """Print rich renderables (tables, marked-up lines), in colour where wanted."""
        console = self._rich_err() if to_stderr else self._rich_out()
        for renderable in renderables:
            console.print(renderable)

    def _rich_out(self) -> Console:
        return _console(self.stdout, self.color)

    def _rich_err(self) -> Console:
        return _console(self.stderr, self.color and _wants_color(self.stderr, self.environ))


def _console(stream: TextIO, color: bool) -> Console:
    from rich.console import Console

    return Console(
        file=stream,
        no_color=not color,
        highlight=False,
        width=200,
        soft_wrap=True,
        force_terminal=color,
    )
