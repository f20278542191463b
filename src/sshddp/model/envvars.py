"""Environment variables the ranks get: ``--env`` pairs, names, and which values are secret.

Secret values never appear in argv, in the registry or in sshddp's own messages; ``--dry-run``
shows them as ``***``. Whatever a variable's name, the credentials inside a URL in its value
(``http://alice:pw@host/``) are shown as ``***`` too (``hide_url_credentials``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Callable, Optional

from sshddp.errors import UsageError

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SECRET_NAME_RE = re.compile(r"(TOKEN|SECRET|PASSW|PASSWD|API_?KEY|CREDENTIAL|AUTH|PRIVATE)", re.I)
MASK = "***"
# scheme://USERINFO@: the authority's userinfo runs to its last "@" (a password may hold an
# unescaped one); the authority ends at "/", "?", "#" or a space, so an "@" in a path, a
# query or the next word is never taken for it. ``user@host`` (no scheme) is not a URL.
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")

EnvPairs = tuple[tuple[str, str], ...]


def parse_env_pairs(
    items: tuple[str, ...], lookup: Callable[[str], Optional[str]]
) -> tuple[EnvPairs, frozenset[str]]:
    """``KEY=VALUE`` or ``KEY`` (value taken from the local environment, never from argv).

    Returns the pairs and the names whose values must never be shown: every ``--env``
    value is treated as a secret.
    """
    pairs: list[tuple[str, str]] = []
    for item in items:
        name, sep, value = item.partition("=")
        if not ENV_NAME_RE.match(name):
            raise UsageError(
                f"--env {item.split('=')[0][:40]!r}: expected KEY=VALUE or KEY with KEY made "
                "of letters, digits and underscores, not starting with a digit"
            )
        if not sep:
            found = lookup(name)
            if found is None:
                raise UsageError(f"--env {name}: no value given and {name} is not set locally")
            value = found
        if not can_hold(value):
            raise UsageError(
                f"--env {name}: the value holds a NUL character, which no environment "
                "variable can hold"
            )
        pairs.append((name, value))
    return tuple(pairs), frozenset(name for name, _ in pairs)


def can_hold(value: str) -> bool:
    """Whether an environment variable can hold ``value``: a POSIX environment is
    NUL-terminated strings, so a NUL would cut the value short, or fail the exec."""
    return "\0" not in value


def secret_names(names: frozenset[str], envs: list[Mapping[str, str]]) -> frozenset[str]:
    """``names`` plus every name in ``envs`` that looks like a secret (``*TOKEN*``...)."""
    return names | {k for env in envs for k in env if SECRET_NAME_RE.search(k)}


def hide_url_credentials(text: str) -> str:
    """``text`` with the userinfo of every URL in it shown as ``***``
    (``http://alice:pw@[::1]:8080/x`` -> ``http://***@[::1]:8080/x``)."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)


def masked(env: Mapping[str, str], secrets: frozenset[str]) -> dict[str, str]:
    """``env`` as it may be shown: secret values replaced by ``***``, and the credentials of
    every URL in the others."""
    return {k: (MASK if k in secrets else hide_url_credentials(v)) for k, v in env.items()}
