"""The ranks' sitecustomize (remote/rankside/ranksite.py): the dump signal is the collector's and
the standby variable the agent's."""

from __future__ import annotations

import re

from sshddp.hosts import shipped
from sshddp.protocol import contract
from sshddp.remote.rankside import agent


def test_the_dump_signal_is_the_one_the_collector_sends() -> None:
    text = shipped.source("sshddp.remote.rankside.ranksite")
    offset = re.search(r"^DUMP_SIGNAL_OFFSET = (\d+)", text, re.M)
    assert offset is not None and int(offset.group(1)) == contract.STACKS_SIGNAL_OFFSET


def test_the_standby_variable_is_the_agents() -> None:
    """A launch's first torchrun standby registers its dumps before the stage wrote
    spec.json: ranksite knows it by the agent's variable."""
    text = shipped.source("sshddp.remote.rankside.ranksite")
    name = re.search(r'^STANDBY_VAR = "(\w+)"', text, re.M)
    assert name is not None and name.group(1) == agent.STANDBY_VAR
