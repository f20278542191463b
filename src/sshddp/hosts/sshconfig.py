"""ssh_config's stanzas indexed once by the host names they name.

paramiko's ``SSHConfig.lookup`` tries every ``Host`` and ``Match`` stanza of the file, twice,
for every host it resolves: with a stanza per host, as a cluster's generated config has,
resolving N hosts costs N² pattern matches (and a ``getpass.getuser()`` per stanza). The
index answers a lookup with paramiko's own code over the stanzas that can match the name:
those whose ``Host`` line names it literally, and every stanza that is not literal (a
wildcard, a negation, a character class, any ``Match``), in the file's order.
"""

from __future__ import annotations

from typing import Any, Optional

import paramiko

_PATTERN_CHARS = frozenset("*?[!")  # fnmatch's, and OpenSSH's negation


class IndexedSshConfig(paramiko.SSHConfig):
    """A parsed ssh_config whose lookups consider only the stanzas that can apply."""

    def __init__(self, stanzas: list[dict[str, Any]]) -> None:
        super().__init__()
        self._config = stanzas
        self._literal: dict[str, list[int]] = {}  #: a name -> the stanzas naming it
        self._patterned: list[int] = []  #: stanzas tried for every name
        for position, stanza in enumerate(stanzas):
            names = _literal_names(stanza)
            if names is None:
                self._patterned.append(position)
            for name in names or ():
                self._literal.setdefault(name, []).append(position)

    @classmethod
    def of(cls, parsed: paramiko.SSHConfig) -> IndexedSshConfig:
        """The index of what ``parsed`` (a parsed ``SSHConfig``) holds."""
        return cls(list(parsed._config))  # type: ignore[attr-defined]

    def candidates(self, hostname: str) -> list[dict[str, Any]]:
        """The stanzas that can apply to ``hostname``, in the file's order."""
        positions = sorted({*self._patterned, *self._literal.get(hostname, ())})
        return [self._config[p] for p in positions]

    def _lookup(
        self,
        hostname: str,
        options: Optional[paramiko.SSHConfigDict] = None,
        canonical: bool = False,
        final: bool = False,
    ) -> paramiko.SSHConfigDict:
        # paramiko's own pass over a view holding only the candidates (a view per call:
        # connections resolve their hosts from several threads)
        view = paramiko.SSHConfig()
        view._config = self.candidates(hostname)  # type: ignore[attr-defined]
        return paramiko.SSHConfig._lookup(  # type: ignore[attr-defined]
            view, hostname, options, canonical, final
        )


def _literal_names(stanza: dict[str, Any]) -> Optional[list[str]]:
    """The names a ``Host`` stanza matches exactly, or None when it has patterns or is a
    ``Match`` (fnmatch on a name without pattern characters is equality on POSIX)."""
    if stanza.get("matches"):
        return None
    hosts = stanza.get("host", [])
    if isinstance(hosts, str):
        hosts = hosts.split(",")
    if any(_PATTERN_CHARS & set(name) for name in hosts):
        return None
    return list(hosts)
