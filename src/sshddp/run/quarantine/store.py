"""The quarantine file: the hosts kept out of launches, next to the run registry.

One JSON file, ``quarantine.json`` in the registry's state directory: owner-only (0600),
read never through a link nor from another user's file, written whole aside and moved into
place (a crash mid-write leaves the old file or the new one), changed under the registry's
lock. A file that cannot be read or is malformed is a ``StateError`` that names it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional

from sshddp.errors import Quarantined, StateError, UsageError
from sshddp.model import quarantine as model
from sshddp.model.inventory import Host
from sshddp.run import registry

FILE = "quarantine.json"
WHAT = "the quarantine file"


def path() -> Path:
    return registry.state_dir() / FILE


def load() -> model.Quarantine:
    """The store (empty when there is no file yet, nor can be: a state directory that is
    a file holds none, and the registry names that problem where it writes)."""
    where = path()
    try:
        data = registry.read_state_file(where, WHAT)
    except (FileNotFoundError, NotADirectoryError):
        return model.Quarantine()
    except registry.NotAStateFile as exc:
        raise StateError(f"{WHAT} {where} {exc}; move it away or delete it") from None
    except OSError as exc:
        raise registry.state_error(exc, where, "read", WHAT) from exc
    try:
        return model.of_json(json.loads(data))
    except (ValueError, RecursionError) as exc:
        raise StateError(
            f"{WHAT} {where} is malformed ({exc}); move it away or delete it (it only keeps "
            "hosts out of launches)"
        ) from None


def change(edit: Callable[[model.Quarantine], model.Quarantine]) -> model.Quarantine:
    """Replace the store by ``edit(store)``, with no other change in between."""
    with registry.locked():
        new = edit(load())
        _write(new)
    return new


def _write(store: model.Quarantine) -> None:
    """Owner-only, written aside and moved into place (the caller holds the lock)."""
    where = registry.made_state_dir() / FILE
    registry.replace_file(registry.write_aside(where, model.to_json(store), WHAT), where, WHAT)


def active(now: Optional[float] = None) -> tuple[model.Entry, ...]:
    return load().active(time.time() if now is None else now)


def clear(hosts: Optional[Sequence[str]]) -> list[model.Entry]:
    """Clear ``hosts`` (None: every one); the entries cleared. A host not in quarantine is
    a ``UsageError`` naming it, and nothing is cleared."""
    now = time.time()
    with registry.locked():
        store = load()
        cleared = [e for e in store.active(now) if hosts is None or e.host in hosts]
        unknown = sorted(set(hosts or ()) - {e.host for e in cleared})
        if unknown:
            listed = ", ".join(e.host for e in store.active(now)) or "none"
            raise UsageError(
                f"quarantine --clear {' '.join(unknown)}: not quarantined (quarantined now: "
                f"{listed}); `sshddp quarantine` lists them"
            )
        if store.entries:
            _write(store.clearing(hosts, now))
    return cleared


def refuse(hosts: Sequence[Host]) -> None:
    """A launch on a quarantined host: ``Quarantined`` naming each, and the ways out."""
    now = time.time()
    store = load()
    found = [e for e in (store.of(h.host, now) for h in hosts) if e is not None]
    if found:
        raise Quarantined(model.refusal(found))
