"""How every rank's Python starts: the rank shim, written into the run directory.

torchrun runs ``python rank.py SCRIPT ARGS...`` or ``python rank.py -m MODULE ARGS...``
(through ``--no-python``), and this runs SCRIPT or MODULE as ``python SCRIPT`` / ``python -m
MODULE`` would: same sys.argv, sys.path[0] and __main__. What it adds: stdout and stderr
line-buffered, as on a terminal, whatever they are, and each line written in one piece up to
LINE_BYTES. The ranks of a node share one pipe (or pty) to the supervisor; with one write
per line, lines of different ranks never mix (a pipe keeps writes of up to 4 KB whole, a
pty writes of any length) and output is live. torchrun's own ``python -u`` would write a
line's text and its newline separately, and so would a line-buffered stream for a line over
its 8 KB chunk. And an exception that ends the script shows the frames ``python SCRIPT``
would show: none of this shim's, nor runpy's (``UserFrames``). Standalone: it imports nothing
of sshddp.
"""

from __future__ import annotations

import io
import os
import runpy
import sys

TYPE_CHECKING = False  # every rank starts here: it never pays for importing typing
if TYPE_CHECKING:
    from types import CodeType
    from typing import Any


LINE_BYTES = 1 << 20  # a line up to this long leaves the rank in one write


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
            # print() writes the text, then the newline; past the chunk size the text alone
            # would be flushed, and another rank's line could land before its newline.
            stream._CHUNK_SIZE = LINE_BYTES  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # replaced or closed stream: leave it
            pass


_RUNPY = compile("runpy.run_path(path, run_name='__main__')", "<sshddp rank>", "exec")
_RUNPY_MODULE = compile(
    "runpy.run_module(name, run_name='__main__', alter_sys=True)", "<sshddp rank>", "exec"
)


def prepare(args: list[str]) -> tuple[CodeType, dict[str, Any]]:
    """Set up sys.argv and sys.path as `python SCRIPT` / `python -m MODULE` would; return
    (code, namespace) to exec.

    A script's code runs in this shim's own ``__main__`` namespace, emptied first (as pdb and
    cProfile do it), so pickling, ``multiprocessing`` and tracebacks see a plain script.
    """
    _line_buffered()
    if not args or (args[0] == "-m" and len(args) < 2):
        sys.exit("usage: rank.py SCRIPT [ARGS...] | rank.py -m MODULE [ARGS...]")
    if args[0] == "-m":
        sys.argv = args[1:]
        sys.path[0] = os.getcwd()
        return _RUNPY_MODULE, {"runpy": runpy, "name": args[1]}
    path = args[0]
    sys.argv = list(args)
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    if os.path.isdir(path) or not path.endswith(".py"):  # a directory or zip: __main__.py
        return _RUNPY, {"runpy": runpy, "path": path}
    if sys.version_info >= (3, 9):  # where python names its script by its absolute path
        path = os.path.abspath(path)
    with io.open_code(path) as fh:
        code = compile(fh.read(), path, "exec", dont_inherit=True)
    namespace = sys.modules["__main__"].__dict__
    builtins = namespace["__builtins__"]
    namespace.clear()
    namespace.update(
        __name__="__main__",
        __file__=path,
        __builtins__=builtins,
        __doc__=None,
        __package__=None,
        __spec__=None,
        __cached__=None,
    )
    return code, namespace


class UserFrames:
    """Around the script's run: the traceback of an exception that ends it starts at the
    script's own frames, as under ``python SCRIPT`` (a SyntaxError shows none): this shim's
    frames and runpy's are cut from its head.

    A context manager, because the script empties this module's namespace (``prepare``):
    what runs after it is reached through the object alone. From 3.11 the exception, its
    traceback cut, goes on to the interpreter: a re-raise adds no frame and uses the
    exception's own traceback. Before, a re-raise keeps the traceback it had, so the
    exception is reported here (``sys.excepthook``: torch's, if it set one) and the rank
    exits 1, as the interpreter does; a KeyboardInterrupt goes on as it is (its exit is by
    SIGINT), as does a SystemExit (no traceback shows).
    """

    def __init__(self, reraise: bool = sys.version_info >= (3, 11)) -> None:
        self.reraise = reraise
        self.files = (__file__, "<sshddp rank>", runpy.run_path.__code__.co_filename)
        self.sys = sys

    def __enter__(self) -> UserFrames:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is None or isinstance(exc, SystemExit):
            return
        while tb is not None and tb.tb_frame.f_code.co_filename in self.files:
            tb = tb.tb_next
        exc.__traceback__ = tb
        if self.reraise or isinstance(exc, KeyboardInterrupt):
            return
        self.sys.excepthook(kind, exc, tb)
        raise SystemExit(1)


if __name__ == "__main__":
    with UserFrames():
        exec(*prepare(sys.argv[1:]))  # what `python SCRIPT` does
