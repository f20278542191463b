"""The rank shim (remote/rankside/rank.py): an exception that ends the script shows the script's own
frames, as under ``python SCRIPT``; none of the shim's (``UserFrames``). In process: the
shim's module-level ``with`` is played by code compiled under the shim's file name."""

from __future__ import annotations

import sys
import traceback
from types import TracebackType
from typing import Any, Optional

import pytest

from sshddp.remote.rankside import rank
from sshddp.remote.rankside.rank import UserFrames

SCRIPT = "/work/train.py"
USER = compile("def step():\n    1 / 0\n\nstep()\n", SCRIPT, "exec")
# the shim's own last lines, as `python rank.py` runs them, with the script's code
SHIM = compile("with UserFrames(reraise):\n    exec(code, {})\n", rank.__file__, "exec")


def run_shim(reraise: bool, code: Any = USER) -> None:
    exec(SHIM, {"UserFrames": UserFrames, "reraise": reraise, "code": code})


def frames(tb: Optional[TracebackType]) -> list[tuple[str, str]]:
    return [(f.filename, f.name) for f in traceback.extract_tb(tb)]


def test_the_exception_goes_on_with_the_scripts_frames_only() -> None:
    with pytest.raises(ZeroDivisionError) as info:
        run_shim(reraise=True)
    shown = frames(info.value.__traceback__)
    assert (rank.__file__, "<module>") not in shown, shown
    assert shown[-2:] == [(SCRIPT, "<module>"), (SCRIPT, "step")]  # under this test's frames


def test_a_syntax_error_shows_no_frame_as_under_python() -> None:
    bad = compile("exec(compile('x = (', 'bad.py', 'exec'))", rank.__file__, "exec")
    with pytest.raises(SyntaxError) as info:
        run_shim(reraise=True, code=bad)
    assert all(f[0] != rank.__file__ for f in frames(info.value.__traceback__))


def test_before_311_it_is_reported_here_and_the_rank_exits_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[tuple[str, str]]] = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, exc, tb: seen.append(frames(tb)))
    with pytest.raises(SystemExit) as info:
        run_shim(reraise=False)
    assert info.value.code == 1
    assert seen == [[(SCRIPT, "<module>"), (SCRIPT, "step")]]


def test_system_exit_and_keyboard_interrupt_go_on_untouched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "excepthook", lambda *a: pytest.fail("reported"))
    with pytest.raises(SystemExit) as info:
        run_shim(False, compile("raise SystemExit(3)", SCRIPT, "exec"))
    assert info.value.code == 3
    with pytest.raises(KeyboardInterrupt):
        run_shim(False, compile("raise KeyboardInterrupt", SCRIPT, "exec"))
