"""The unit tier: pure code, no process (the guard is in tests/no_process.py)."""

from __future__ import annotations

from no_process import _no_process, pytest_runtest_makereport

__all__ = ["_no_process", "pytest_runtest_makereport"]
