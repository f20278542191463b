"""A host that cannot resolve the name of the host handing on files (``--share``, sync
``--offline``) says so at once, naming that host and the fix, instead of retrying the name
until the pull's timeout (600 s for wheels)."""

from __future__ import annotations

import pytest

from sshddp.remote.node import host_share


def test_an_unresolvable_source_fails_at_once_and_names_the_fix() -> None:
    with pytest.raises(OSError) as caught:
        host_share._connect("no-such-host.invalid", 1, 600.0, "h1")
    said = str(caught.value)
    assert said.startswith("cannot resolve no-such-host.invalid, the name of h1, on this host")
    assert "give h1 an `addr:` in the inventory" in said
