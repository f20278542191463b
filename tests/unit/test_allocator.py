"""The coordinator's allocator settings (``run.allocator``): what is set, that glibc takes
it, and that a MALLOC_* variable the user set wins."""

from __future__ import annotations

from sshddp.run import allocator


def test_the_settings_leave_out_what_the_user_set() -> None:
    every = [(param, value) for param, value, _var in allocator.SETTINGS]
    assert allocator.wanted({}) == every
    assert allocator.wanted({"MALLOC_ARENA_MAX": "8"}) == every[1:]
    assert allocator.wanted({var: "1" for _p, _v, var in allocator.SETTINGS}) == []
