"""spec.json's command structure for tests whose node's torchrun is a stand-in.

The composer (``protocol/compose.py``) starts a torchrun node as ``python RUNDIR/agent.py``
and torchrun's arguments: a test that writes its own ``agent.py`` into the run directory
runs that code in torchrun's place, as the node's torchrun, and the code ignores the
arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sshddp.model.commands import Program, TorchrunOptions
from sshddp.protocol import contract


def torchrun_node(script: str = "train.py") -> dict[str, Any]:
    """spec.json's ``launcher``, ``torchrun`` and ``program`` of a one-node torchrun run."""
    return {
        "launcher": contract.LAUNCH_TORCHRUN,
        "torchrun": TorchrunOptions(1, 0, 1, "127.0.0.1:29500", "r1").record(),
        "program": Program("script", script).record(),
    }


def stand_in(rundir: Path, code: str) -> dict[str, Any]:
    """``torchrun_node()``, with ``code`` written as RUNDIR's agent shim: what runs."""
    (rundir / contract.AGENT_SHIM).write_text(code)
    return torchrun_node()
