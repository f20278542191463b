"""One node's log as its follower sends it, into the local copy (and its index) and onto the
console, each span under the rank that wrote it (``model.spans``)."""

from __future__ import annotations

from typing import Callable, Optional

from sshddp.model.spans import StreamReader
from sshddp.protocol.contract import SOURCE_NODE
from sshddp.run.sinks import Console, NodeLogs


class NodeFeed:
    """Decodes a follower's stream for one node: ``framed`` when it was asked for the index
    (every follower but an old caller's)."""

    def __init__(
        self,
        logs: NodeLogs,
        console: Optional[Console],
        node_rank: int,
        framed: bool = True,
        first: Optional[Callable[[], None]] = None,
    ) -> None:
        """``first``: called once, before the first bytes go anywhere (a spare's follower
        learns there which node rank it took: its log is empty until then)."""
        self.logs = logs
        self.console = console
        self.node_rank = node_rank
        self.reader = StreamReader(framed)
        self.first = first

    def feed(self, chunk: bytes) -> None:
        rank = self.node_rank
        for piece in self.reader.feed(chunk):
            first = self.first
            if first is not None and piece.data:
                self.first = None
                first()
            if piece.offset >= 0:
                self.logs.write_span(rank, piece)
            else:
                self.logs.write(rank, piece.data)
            if self.console is not None:
                # a node that keeps node.idx tells its ranks apart: the rest is torchrun's
                agent = piece.source == SOURCE_NODE and piece.offset >= 0
                self.console.write(rank, piece.data, piece.source, agent)
