"""A ProxyCommand that counts: ``python -m sshddp_lab.countproxy COUNTS HOST PORT``.

It sits between ssh (or sshddp's paramiko) and sshd, as a user's bastion would, passing the
bytes both ways unchanged, and keeps the bytes it carried towards sshd so far in a file of
its own in the directory ``COUNTS`` (made if missing), rewritten as they pass: a proxy
killed as its client closes the connection has counted every byte all the same. The sum
over a command's connections (``total_up``) is what left the client for the hosts, SSH's
framing included.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

CHUNK = 1 << 16


def _pump(read: int, write: socket.socket, fd: int) -> None:
    """stdin -> the socket, counting into ``fd``, until stdin's EOF."""
    up = 0
    while data := os.read(read, CHUNK):
        write.sendall(data)
        up += len(data)
        os.pwrite(fd, f"{up:20d}\n".encode(), 0)
    try:
        write.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    counts, host, port = argv[0], argv[1], int(argv[2])
    os.makedirs(counts, exist_ok=True)
    fd = os.open(os.path.join(counts, f"{host}-{port}-{os.getpid()}"), os.O_WRONLY | os.O_CREAT)
    os.pwrite(fd, f"{0:20d}\n".encode(), 0)
    sock = socket.create_connection((host, port))
    threading.Thread(target=_pump, args=(0, sock, fd), daemon=True).start()
    try:
        while data := sock.recv(CHUNK):
            os.write(1, data)
    except OSError:
        pass
    return 0


def total_up(counts: str) -> int:
    """Bytes that went towards sshd, over every connection counted in ``counts``."""
    total = 0
    for name in os.listdir(counts):
        with open(os.path.join(counts, name)) as fh:
            total += int(fh.read().strip() or 0)
    return total


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
