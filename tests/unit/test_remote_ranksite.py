"""The ranks' sitecustomize (remote/rankside/ranksite.py): the dump signal is the collector's."""

from __future__ import annotations

import re

from sshddp.hosts import shipped
from sshddp.protocol import contract


def test_the_dump_signal_is_the_one_the_collector_sends() -> None:
    text = shipped.source("sshddp.remote.rankside.ranksite")
    offset = re.search(r"^DUMP_SIGNAL_OFFSET = (\d+)", text, re.M)
    assert offset is not None and int(offset.group(1)) == contract.STACKS_SIGNAL_OFFSET
