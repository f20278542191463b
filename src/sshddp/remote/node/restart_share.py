"""``--share`` at a restart: node 0's latest copy of each shared file reaches every node
before the next attempt starts, a spare that takes a lost node's place included.

A launch hands node 0's shared files to the nodes whose copy differs (``host_share.py``),
once, before the start. A run lasts: by its restart, node 0's ranks have written newer
checkpoints, which nodes without a shared disk lack (and a spare has none at all). So when
node 0 tells the nodes to start the next attempt (``again``), it also serves its shared
files and says which (``peer_messages.ShareOffer``: their sizes and SHA-256, and the port);
every other node compares its own copies and pulls those that differ, over the run's key
as the launch does, before its torchrun goes. The world cannot form before every node's
torchrun runs, so node 0's ranks cannot write a newer checkpoint meanwhile.

Node 0 listens on a port the system picks (the rendezvous port is its next store's, the
one after it the supervisors'), on the rendezvous address. A node that cannot get a file
fails its attempt saying why: a rank resuming from an older checkpoint than the others
would train a different model, silently.
"""

from __future__ import annotations

import os
import sys
from typing import Optional

from sshddp.protocol import peer_messages as pm
from sshddp.protocol.contract import SpecRecord
from sshddp.remote.node import host_share, wire
from sshddp.remote.node.node_events import LoopState

TIMEOUT = 600.0  #: seconds a transfer may be silent (a checkpoint of many GB, a slow link)
CONNECT_WAIT = 30.0  #: seconds a node retries reaching node 0's server


class Handover:
    """A node's part, for its supervisor: node 0 serves (``offered``), the others pull
    (``refresh``); ``close`` once the node ends."""

    def __init__(self, spec: SpecRecord, key: bytes) -> None:
        self.spec, self.key = spec, key or None
        self.server: Optional[host_share.Server] = None  #: node 0's, for the latest attempt

    def offered(self, msg: pm.PeerMessage) -> pm.PeerMessage:
        """Node 0's ``msg`` to the others: an ``again`` says where its files are served."""
        if msg["t"] != "again":
            return msg
        self.server, share = offer(self.spec, self.key, self.server)
        return msg if share is None else pm.with_share(msg, share)

    def refresh(self, state: LoopState) -> str:
        """A node other than 0, before an attempt whose ``again`` offered node 0's files:
        its copies made node 0's; "" when they are (or nothing was offered), else why not."""
        if state.rank == 0 or state.share is None:
            return ""
        return refresh(self.spec, state.share, self.key, state.rank)

    def close(self) -> None:
        close(self.server)
        self.server = None


def offer(
    spec: SpecRecord, key: Optional[bytes], previous: Optional[host_share.Server]
) -> tuple[Optional[host_share.Server], Optional[pm.ShareOffer]]:
    """Node 0: serve its shared files for the next attempt (``previous``, the last
    attempt's server, stopped first); the server and what ``again`` says of it, or
    (None, None) when there is nothing to share."""
    close(previous)
    paths, cwd = list(spec.get("share") or ()), spec.get("cwd")
    peers = spec.get("peers")
    if not paths or not cwd or key is None or peers is None:
        return None, None  # (a node with no peers has no one to hand them to)
    if peers["nnodes"] < 2 and not peers.get("spares"):
        return None, None
    files: list[pm.SharedFile] = []
    for path in paths:
        digest = host_share.digest(os.path.join(os.path.expanduser(cwd), path))
        if digest is not None and "error" not in digest:
            files.append({"path": path, "size": digest["size"], "sha256": digest["sha256"]})
    if not files:
        return None, None
    sock, why = wire.listen(peers["addr"], 0)
    if sock is None:
        print(f"sshddp supervisor: --share: cannot serve the files: {why}", file=sys.stderr)
        return None, None
    order = {"cwd": cwd, "paths": [f["path"] for f in files], "key": key.hex()}
    server = host_share.Server({**order, "run": spec["run_id"], "timeout": TIMEOUT}, sock)
    return server, {"port": int(sock.getsockname()[1]), "files": files}


def refresh(spec: SpecRecord, share: pm.ShareOffer, key: Optional[bytes], slot: int) -> str:
    """A node other than 0: pull each of node 0's files ``share`` names whose copy here
    differs (or is missing); "" once every copy is node 0's, else why not."""
    cwd = spec.get("cwd")
    if not cwd or key is None:
        return "--share: this node has no working directory or no run key to fetch node 0's files"
    here = os.path.expanduser(cwd)
    stale = [
        f
        for f in share["files"]
        if (host_share.digest(os.path.join(here, f["path"])) or {}).get("sha256") != f["sha256"]
    ]
    if not stale:
        return ""
    order = {
        "cwd": cwd,
        "files": [dict(f) for f in stale],
        "addr": spec["peers"]["addr"],
        "port": share["port"],
        "run": spec["run_id"],
        "rank": slot,
        "key": key.hex(),
        "timeout": TIMEOUT,
        "connect_timeout": CONNECT_WAIT,
    }
    try:
        got = host_share.pull(order)
    except (OSError, wire.Refused, ValueError) as exc:
        return f"could not get node 0's --share files before the attempt: {exc}"
    names = ", ".join(f["path"] for f in stale)
    print(
        f"sshddp supervisor: --share: {names} from node 0 ({got['received']} bytes)",
        file=sys.stderr,
    )
    return ""


def close(server: Optional[host_share.Server]) -> None:
    """Stop serving (the node ended, or the next attempt's server replaces it)."""
    if server is not None:
        server.stop()
