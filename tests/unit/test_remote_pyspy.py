"""remote/calls/pyspy: where py-spy is found."""

from __future__ import annotations

import sys
from pathlib import Path

from sshddp.remote.calls import pyspy


def test_py_spy_is_found_beside_the_interpreter() -> None:
    assert pyspy.find() == str(Path(sys.executable).parent / "py-spy")
