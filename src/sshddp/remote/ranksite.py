"""Every Python process of a rank, set up like the rank: the sitecustomize of a node's tree.

The supervisor puts RUNDIR/site first on the ranks' PYTHONPATH, and boot leaves this file
there as ``sitecustomize.py``. So every Python process of the node imports it at start-up,
before any user code: torchrun's workers, and whatever they start in turn (``mp.spawn`` and
Lightning's workers, DataLoader workers, a ``python`` subprocess). It makes stdout and
stderr line-buffered, as the rank shim does for the ranks themselves: a spawned worker's
print is then live and one write per line, so its lines stay whole in the node's pipe,
without PYTHONUNBUFFERED (which writes a line's text and its newline separately). Then it
runs the sitecustomize it shadows, if the interpreter has one (a site's or a venv's).
Standalone: it imports nothing of sshddp. Python 3.8+.
"""

from __future__ import annotations

import os
import sys


def _line_buffered() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):  # replaced or closed stream: leave it
            pass


def _chain() -> None:
    """Run the ``sitecustomize`` this one hides, as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_line_buffered()
_chain()
