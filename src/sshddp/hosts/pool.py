"""One connection per host, used in parallel with a bounded fan-out.

``HostPool.map`` runs a function per host (or per node: anything with the host's ``index``)
in a thread pool and returns every one's outcome, value or exception, keyed by host index:
one slow or failing host never hides the others (fabric's ``GroupResult`` does the same).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Generic, Optional, Protocol, TypeVar

from sshddp import defaults, trace
from sshddp.errors import HostUnreachable
from sshddp.hosts.transport import SshOptions, Transport
from sshddp.model.inventory import Host

R = TypeVar("R")


class OnHost(Protocol):
    """A host, or a node of a run: anything that says which inventory host it is on."""

    @property
    def index(self) -> int: ...


K = TypeVar("K", bound=OnHost)


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """What one host's task returned or raised."""

    value: Optional[R] = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.error is None


class HostResults(dict[int, Outcome[R]]):
    """Every host's outcome of one fan-out, keyed by host index, in the order given."""

    @property
    def succeeded(self) -> dict[int, Optional[R]]:
        return {i: o.value for i, o in self.items() if o.ok}

    @property
    def failed(self) -> dict[int, BaseException]:
        return {i: o.error for i, o in self.items() if o.error is not None}

    def in_order(self, hosts: Iterable[Host], failed: Callable[[Host, str], R]) -> list[R]:
        """Each host's value, in the order given; ``failed(host, why)`` for a host whose
        task raised (or returned nothing)."""
        results = []
        for host in hosts:
            outcome = self[host.index]
            if outcome.value is not None:
                results.append(outcome.value)
            else:
                why = getattr(outcome.error, "message", None) or f"{outcome.error}"
                results.append(failed(host, why))
        return results


def open_transport(host: Host, options: SshOptions) -> Transport:
    """The transport for one inventory host (local for ``localhost``, job steps for
    ``transport: srun``); paramiko is imported only for a host reached over SSH."""
    if host.transport == "srun":
        from sshddp.hosts.srun import SrunTransport

        return SrunTransport(host)
    if host.is_local:
        from sshddp.hosts.local import LocalTransport

        return LocalTransport(host)
    from sshddp.hosts.ssh import SshTransport

    return SshTransport(host, options)


def node_addr(host: Host, options: SshOptions) -> str:
    """The address other nodes reach ``host`` at: its ``addr``, else the HostName its SSH
    connection resolves the alias to (``127.0.0.1`` for ``localhost``)."""
    if host.addr:
        return host.addr
    if host.is_local:
        return "127.0.0.1"
    from sshddp.hosts.ssh import resolve_hostname

    return resolve_hostname(host.host, options)


class HostPool:
    """The transports of a set of hosts, keyed by inventory index."""

    def __init__(
        self, hosts: Sequence[Host], options: SshOptions, fanout: int = defaults.FANOUT
    ) -> None:
        self.hosts = list(hosts)
        self.options = options
        self.fanout = max(1, fanout)
        self.transports: dict[int, Transport] = {
            h.index: open_transport(h, options) for h in self.hosts
        }

    def transport(self, on: OnHost) -> Transport:
        return self.transports[on.index]

    def map(self, fn: Callable[[K], R], items: Iterable[K]) -> HostResults[R]:
        """``fn`` over ``items`` in parallel (at most ``fanout`` at once)."""
        todo = list(items)
        results: HostResults[R] = HostResults()
        if not todo:
            return results

        def call(item: K) -> Outcome[R]:
            try:
                return Outcome(value=fn(item))
            except Exception as exc:  # collected per host, reported by the caller
                return Outcome(error=exc)

        with ThreadPoolExecutor(max_workers=min(self.fanout, len(todo))) as pool:
            for item, outcome in zip(todo, pool.map(call, todo)):
                results[item.index] = outcome
        return results

    def connect_all(self) -> dict[int, Optional[HostUnreachable]]:
        """Connect every host; the failure of each one that could not be reached."""
        started = time.monotonic()
        outcomes = self.map(lambda host: self.transport(host).connect(), self.hosts)
        errors: dict[int, Optional[HostUnreachable]] = {}
        for host in self.hosts:
            err = outcomes[host.index].error
            if err is not None and not isinstance(err, HostUnreachable):
                err = HostUnreachable(host.host, f"{host.host}: {err}")
            errors[host.index] = err
        trace.log.info(
            "connected %d of %d host(s) in %.3f s (fan-out %d)",
            sum(e is None for e in errors.values()),
            len(errors),
            trace.since(started),
            self.fanout,
        )
        return errors

    def close(self) -> None:
        self.map(lambda host: self.transport(host).close(), self.hosts)

    def __enter__(self) -> HostPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
