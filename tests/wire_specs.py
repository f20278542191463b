"""A node's spec and a free port for the supervisors' wire tests, unit and integration."""

from __future__ import annotations

import os
import socket

from sshddp.protocol.contract import SpecRecord

KEY = bytes(range(32))


def spec(rank: int, port: int) -> SpecRecord:
    return {
        "schema": 2,
        "run_id": "r1",
        "node_rank": rank,
        "cwd": None,
        "grace": 1,
        "mark": f"r1/n0-{os.getpid()}",
        "peers": {"nnodes": 3, "addr": "127.0.0.1", "port": port, "timeout": 30, "hosts": []},
        "tty": False,
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
