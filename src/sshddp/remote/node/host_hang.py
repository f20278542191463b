"""What a node's watchdog recorded when its run hung: RUNDIR/hang.json.

args: {"rundir"}
Prints one JSON line: the node's ``HangRecord`` (``contract``), or {} when it has none.
"""

from __future__ import annotations

import os
from typing import Any

from sshddp.protocol import contract
from sshddp.remote.common import emit, read_json


def main(args: dict[str, Any]) -> None:
    rundir = os.path.expanduser(args["rundir"])
    emit(read_json(os.path.join(rundir, contract.HANG)) or {})
