"""Whether a port binds, for the probe tests, unit and integration."""

from __future__ import annotations

import socket


def bound(port: int, reuse: bool) -> bool:
    with socket.socket() as sock:
        if reuse:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
