"""Frames of a stack, as ``sshddp stacks`` records them (``contract.FrameRecord``), whoever
read them: faulthandler's dump (``stacks``) or py-spy (``pyspy``)."""

from __future__ import annotations

import linecache
import os

from sshddp.protocol.contract import FrameRecord


def python_frame(file: str, line: int, func: str, cwd: str) -> FrameRecord:
    """A Python frame, with its source line read here: a relative file name (a script run
    by a relative path) is read from ``cwd``, the process's working directory."""
    path = file if os.path.isabs(file) or not cwd else os.path.join(cwd, file)
    code = linecache.getline(path, line).strip() if line > 0 else ""
    return {"file": file, "line": line, "func": func, "code": code, "native": False}


def native_frame(file: str, line: int, func: str) -> FrameRecord:
    """A C / C++ frame: ``file`` is its library, or its source file when py-spy knows it."""
    return {"file": file, "line": line, "func": func, "code": "", "native": True}


def note(text: str) -> FrameRecord:
    """A line of a dump that is not a frame ("..." where a deep stack was cut)."""
    return {"file": "", "line": 0, "func": text, "code": "", "native": False}


def cwd_of(pid: int) -> str:
    """The process's working directory, "" when it cannot be read."""
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""
