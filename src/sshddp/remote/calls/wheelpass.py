"""``sshddp sync --offline`` on a host: the wheels a lock needs, kept under the workdir,
as they came from this machine once (to one host, the seed) or from another host.

The wheels of a lock are ``<workdir>/wheels/<digest>``, complete once it holds
``WHEELS_MARKER``; they arrive in a temporary directory beside it that is renamed into
place, so an interrupted transfer leaves nothing a later sync uses. The seed reads them
from stdin (a JSON line [{"name", "size", "sha256"}, ...], then each file's bytes in that
order) and hands them on (as does every host with children in the hand-off's tree,
``run/sync.py``'s ``_WheelTree``) with ``--share``'s server (``host_share.py``: the
supervisors' handshake with a key made for this sync, each file checked against the
SHA-256 this machine computed), so each byte crosses this machine's link once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from typing import Any, Optional

from sshddp.remote import hostpath
from sshddp.remote.node import host_share

WHEELS_MARKER = ".sshddp-wheels"  #: written last into a complete wheel directory
PULL_TIMEOUT = 600.0  #: seconds a host waits on the seed for its wheels


def folder(workdir: str, digest: str) -> str:
    """Where the wheels of lock ``digest`` go under checked ``workdir`` (``wheels/`` made,
    or checked: this user's alone)."""
    return os.path.join(hostpath.private_dirs(workdir, "wheels", "the wheels directory"), digest)


def complete(path: str) -> bool:
    """Whether the wheels at ``path`` are all there; ``Unsafe`` when that directory, or its
    marker, is not this user's alone."""
    try:
        hostpath.check_dir(path, "the wheels directory")
        hostpath.check_file(os.path.join(path, WHEELS_MARKER), "the wheels' marker")
    except FileNotFoundError:
        return False
    return True


def receive(path: str, wanted: list[dict[str, Any]], pull: Optional[dict[str, Any]]) -> None:
    """The wheels into ``path``: from the seed (``pull``), else from stdin; OSError when
    they do not arrive whole."""
    aside = hostpath.temp_dir(os.path.dirname(path), ".get-")
    try:
        if pull is not None:
            files = [{"path": w["name"], "size": w["size"], "sha256": w["sha256"]} for w in wanted]
            got = host_share.pull(dict(pull, cwd=aside, files=files, timeout=PULL_TIMEOUT))
            if "error" in got:
                raise OSError(got["error"])
        else:
            _read_stdin(aside, wanted)
        with os.fdopen(hostpath.create(os.path.join(aside, WHEELS_MARKER)), "w") as fh:
            fh.write("complete\n")
        if not complete(path):
            shutil.rmtree(path, ignore_errors=True)  # an incomplete one: never used
            hostpath.rename(aside, path)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _read_stdin(aside: str, wanted: list[dict[str, Any]]) -> None:
    stdin = sys.stdin.buffer
    listed = json.loads(stdin.readline().decode("utf-8"))
    for item in listed:
        name = os.path.basename(str(item["name"]))
        sha, left = hashlib.sha256(), int(item["size"])
        with os.fdopen(hostpath.create(os.path.join(aside, name)), "wb") as fh:
            while left > 0:
                data = stdin.read(min(host_share.CHUNK, left))
                if not data:
                    raise OSError(f"{name} arrived {left} bytes short")
                sha.update(data)
                fh.write(data)
                left -= len(data)
        if sha.hexdigest() != item["sha256"]:
            raise OSError(f"{name} arrived with SHA-256 {sha.hexdigest()}, not {item['sha256']}")
    if sorted(w["name"] for w in wanted) != sorted(str(i["name"]) for i in listed):
        raise OSError("the wheels that came are not the ones the lock needs")


def serve(path: str, wanted: list[dict[str, Any]], order: dict[str, Any]) -> host_share.Server:
    """The seed: hand the wheels in ``path`` to every host that proves it holds the key."""
    names = [str(w["name"]) for w in wanted]
    return host_share.Server(dict(order, cwd=path, paths=names, port=0, addr=""))


def port_of(server: host_share.Server) -> int:
    return int(server.sock.getsockname()[1])


def wait_for_eof() -> None:
    """Until this machine closes stdin: every other host has its wheels by then."""
    while sys.stdin.buffer.read(65536):
        pass
