"""What ``sshddp stop`` says of each node is what the node's exit record says: a run that
ended by itself while the stop was on its way is not reported as stopped."""

from __future__ import annotations

import pytest

from sshddp.model.inventory import Host
from sshddp.model.layout import NodeLayout
from sshddp.protocol.contract import StopAnswer
from sshddp.run.runs import NodeStop

NODE = NodeLayout(Host(host="h1", index=0), 0, 1, 0, "/w/runs/r/n0", "")


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ({"state": "stopped", "already": False}, "stopped"),
        # the race: no exit.json when stop looked, then the supervisor wrote its own end
        ({"state": "succeeded", "already": False}, "succeeded (it ended by itself before"),
        ({"state": "failed", "already": False}, "failed (it ended by itself before"),
        ({"state": "succeeded", "already": True}, "was already succeeded"),
        ({"state": "stopped", "already": True}, "was already stopped"),
    ],
)
def test_stop_says_what_the_record_says(answer: StopAnswer, said: str) -> None:
    assert NodeStop(NODE, answer=answer).outcome().startswith(said)
