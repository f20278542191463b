"""What a run starts from on this machine: the inventory file and the local paths of the code.

The model parses and decides (``model.inventory``, ``model.plan.decide_code``); this module
reads the file and looks at the local filesystem for it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from sshddp.errors import InventoryError
from sshddp.model.inventory import Inventory, format_of, parse_host_list, parse_inventory
from sshddp.model.plan import PathKind

MAX_INVENTORY_BYTES = 1 << 20  # an inventory is a few hundred lines; refuse to slurp a wrong path


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read and validate an inventory file; the format follows the name (``format_of``)."""
    name = os.fspath(path)
    return parse_inventory(_read_text(name), source=name, fmt=format_of(name))


def load_host_list(
    hosts: str, python: Optional[str] = None, user: Optional[str] = None
) -> Inventory:
    """``-H HOST:N,...`` as an inventory; ``--python`` and ``--user`` act as its defaults."""
    return parse_host_list(hosts, python=python, user=user)


def _read_text(name: str) -> str:
    try:
        with open(name, "rb") as stream:
            data = stream.read(MAX_INVENTORY_BYTES + 1)
    except FileNotFoundError:
        raise InventoryError(f"{name}: inventory file not found.") from None
    except IsADirectoryError:
        raise InventoryError(f"{name}: is a directory, not an inventory file.") from None
    except PermissionError:
        raise InventoryError(f"{name}: cannot read the inventory: permission denied.") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or exc
        raise InventoryError(f"{name}: cannot read the inventory: {reason}.") from None
    if len(data) > MAX_INVENTORY_BYTES:
        raise InventoryError(
            f"{name}: larger than {MAX_INVENTORY_BYTES} bytes; not an inventory file."
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InventoryError(
            f"{name}:{line}: not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); save the inventory as UTF-8."
        ) from None


class LocalFiles:
    """``model.plan.LocalPaths`` for this machine's filesystem."""

    def kind(self, path: str) -> PathKind:
        p = Path(path)
        if p.is_dir():
            return "dir"
        return "file" if p.is_file() else "missing"

    def resolve(self, path: str) -> str:
        return str(Path(path).resolve())
