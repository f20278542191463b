"""One connection per host, opened in parallel with a bounded fan-out.

``Cluster.map`` runs a function per host in a thread pool and returns every host's outcome
(value or exception): one slow or failing host never hides the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

from sshddp.errors import HostUnreachable
from sshddp.inventory import Host
from sshddp.transport import SshOptions, Transport, open_transport

T = TypeVar("T")
R = TypeVar("R")
DEFAULT_FANOUT = 32


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """What one host's task returned or raised."""

    value: Optional[R] = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Cluster:
    """The transports of a set of hosts, keyed by inventory index."""

    def __init__(
        self, hosts: Sequence[Host], options: SshOptions, fanout: int = DEFAULT_FANOUT
    ) -> None:
        self.hosts = list(hosts)
        self.options = options
        self.fanout = max(1, fanout)
        self.transports: dict[int, Transport] = {
            h.index: open_transport(h, options) for h in self.hosts
        }

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[Outcome[R]]:
        """``fn`` over ``items`` in parallel (at most ``fanout`` at once), in order."""
        items = list(items)
        if not items:
            return []

        def call(item: T) -> Outcome[R]:
            try:
                return Outcome(value=fn(item))
            except Exception as exc:  # collected per host, reported by the caller
                return Outcome(error=exc)

        with ThreadPoolExecutor(max_workers=min(self.fanout, len(items))) as pool:
            return list(pool.map(call, items))

    def connect_all(self) -> dict[int, Optional[HostUnreachable]]:
        """Connect every host; the failure of each one that could not be reached."""

        def connect(host: Host) -> None:
            transport = self.transports[host.index]
            connect_fn = getattr(transport, "connect", None)
            if connect_fn is not None:
                connect_fn()

        outcomes = self.map(connect, self.hosts)
        errors: dict[int, Optional[HostUnreachable]] = {}
        for host, outcome in zip(self.hosts, outcomes):
            err = outcome.error
            if err is not None and not isinstance(err, HostUnreachable):
                err = HostUnreachable(host.host, f"{host.host}: {err}")
            errors[host.index] = err
        return errors

    def close(self) -> None:
        self.map(lambda t: t.close(), list(self.transports.values()))

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
