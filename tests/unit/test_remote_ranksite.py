"""The ranks' sitecustomize (remote/rankside/ranksite.py): the dump signal is the collector's."""

from __future__ import annotations

import re

from sshddp.hosts import shipped
from sshddp.protocol import contract


def test_the_dump_signal_is_the_one_the_collector_sends() -> None:
    text = shipped.source("sshddp.remote.rankside.ranksite")
    offset = re.search(r"^DUMP_SIGNAL_OFFSET = (\d+)", text, re.M)
    assert offset is not None and int(offset.group(1)) == contract.STACKS_SIGNAL_OFFSET


def test_the_stacks_fifo_is_the_one_the_samplers_write() -> None:
    text = shipped.source("sshddp.remote.rankside.ranksite")
    suffix = re.search(r'^ASK_SUFFIX = "(.+?)"', text, re.M)
    assert suffix is not None and suffix.group(1) == contract.STACKS_ASK_SUFFIX


def test_the_joined_records_schema_is_the_contracts() -> None:
    """It stands alone, so it repeats the schema; a bump of the contract's must reach it."""
    text = shipped.source("sshddp.remote.rankside.ranksite")
    schema = re.search(r"^JOINED_SCHEMA = (\d+)", text, re.M)
    assert schema is not None and int(schema.group(1)) == contract.SCHEMA
