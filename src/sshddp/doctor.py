"""Probe every host in parallel and check the facts: ``sshddp doctor`` and the preflight.

The first host's probe also listens on the rendezvous port (proving it free) while every
host, itself included, opens a real TCP connection to the rendezvous address and port.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Optional

from sshddp import ops
from sshddp.checks import Context, HostFacts, HostReport, evaluate
from sshddp.cluster import Cluster, Outcome
from sshddp.errors import HostUnreachable, InterpreterMissing, SshddpError
from sshddp.inventory import Host
from sshddp.sessions import HostSession

CONNECT_WINDOW = 3.0  # seconds each host keeps retrying the rendezvous connect


def probe_args(host: Host, ctx: Context, deep: bool, listen: bool, rdzv_ok: bool) -> dict[str, Any]:
    return {
        "workdir": host.workdir,
        "deep": deep,
        "listen_port": ctx.rdzv_port if listen else None,
        "connect": [ctx.rdzv_addr, ctx.rdzv_port] if rdzv_ok else None,
        "connect_timeout": CONNECT_WINDOW,
        "script": None if ctx.script_is_local else ctx.script,
    }


class _Listener:
    """The rendezvous host's probe, held open until the other probes are done."""

    def __init__(self, cluster: Cluster, host: Host, args: dict[str, Any]) -> None:
        self.facts: Optional[HostFacts] = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster, host, args), daemon=True)
        self._thread.start()

    def _run(self, cluster: Cluster, host: Host, args: dict[str, Any]) -> None:
        transport = cluster.transports[host.index]
        proc = None
        try:
            proc = ops.start_script(transport, "probe", args)
            line = ops.read_line(proc)
            self._ready.set()
            self._release.wait()
            proc.close_stdin()
            rc = proc.wait()
            facts = ops.decode(transport, "probe", line, proc.read_stderr(), rc)
            self.facts = HostFacts(host, facts)
        except SshddpError as exc:
            self.facts = _error_facts(host, exc)
        finally:
            self._ready.set()
            if proc is not None:
                proc.close()

    def result(self) -> HostFacts:
        self._release.set()
        self._thread.join()
        assert self.facts is not None
        return self.facts


def gather(cluster: Cluster, ctx: Context, deep: bool) -> list[HostFacts]:
    """Connect to every host and probe the reachable ones; one ``HostFacts`` per host."""
    errors = cluster.connect_all()
    hosts = cluster.hosts
    first = hosts[0]
    rdzv_ok = errors[first.index] is None
    listener = None
    if rdzv_ok:
        listener = _Listener(cluster, first, probe_args(first, ctx, deep, True, True))
    others = [h for h in hosts[1:] if errors[h.index] is None]

    def probe(host: Host) -> Any:
        return ops.call(
            cluster.transports[host.index], "probe", probe_args(host, ctx, deep, False, rdzv_ok)
        )

    outcomes = dict(zip((h.index for h in others), cluster.map(probe, others)))
    first_facts = listener.result() if listener else None
    facts = {h.index: _to_facts(h, outcomes[h.index]) for h in others}
    if first_facts is not None:
        facts[first.index] = first_facts
    return _assemble(hosts, errors, facts)


def gather_sessions(
    cluster: Cluster, ctx: Context, open_session: Callable[[Host, dict[str, Any]], HostSession]
) -> tuple[list[HostFacts], dict[int, HostSession]]:
    """The launch preflight: ``gather`` through each host's launch session, which stays
    open (host 0 holding the rendezvous port) to boot the node once the checks pass."""
    errors = cluster.connect_all()
    hosts = cluster.hosts
    first = hosts[0]
    rdzv_ok = errors[first.index] is None
    reachable = [h for h in hosts if errors[h.index] is None]

    def open_one(host: Host) -> tuple[HostSession, Any]:
        args = probe_args(host, ctx, False, host is first, rdzv_ok)
        session = open_session(host, args)
        try:
            return session, session.answer("probe")
        except BaseException:
            session.close()
            raise

    sessions: dict[int, HostSession] = {}
    facts: dict[int, HostFacts] = {}
    for host, outcome in zip(reachable, cluster.map(open_one, reachable)):
        if outcome.ok:
            assert outcome.value is not None
            sessions[host.index], answer = outcome.value
            facts[host.index] = HostFacts(host, answer)
        else:
            facts[host.index] = _to_facts(host, outcome)
    return _assemble(hosts, errors, facts), sessions


def _assemble(
    hosts: Sequence[Host], errors: dict[int, Optional[HostUnreachable]],
    facts: dict[int, HostFacts],
) -> list[HostFacts]:  # fmt: skip
    """One ``HostFacts`` per host, in inventory order: facts, or why it was not reached."""
    results: list[HostFacts] = []
    for host in hosts:
        err = errors[host.index]
        if err is not None:
            results.append(HostFacts(host, error=err.message, hint=err.hint))
        else:
            results.append(facts[host.index])
    return _drop_unproven_rdzv(results)


def _drop_unproven_rdzv(results: list[HostFacts]) -> list[HostFacts]:
    """Connects prove the rendezvous reachable only if the first host's probe listened.

    Otherwise (no usable Python there, or the port held by someone else) they reached
    nothing or a stranger, and would blame the network for the first host's problem.
    """
    first = results[0].facts or {}
    if (first.get("port") or {}).get("free"):
        return results
    return [
        replace(hf, facts={k: v for k, v in hf.facts.items() if k != "rendezvous"})
        if hf.facts is not None
        else hf
        for hf in results
    ]


def _to_facts(host: Host, outcome: Outcome[Any]) -> HostFacts:
    if outcome.error is None:
        return HostFacts(host, outcome.value)
    return _error_facts(host, outcome.error)


def _error_facts(host: Host, exc: BaseException) -> HostFacts:
    if isinstance(exc, InterpreterMissing):
        return HostFacts(host, {"python_missing": host.python, "reached": True})
    message = exc.message if isinstance(exc, SshddpError) else f"{type(exc).__name__}: {exc}"
    return HostFacts(host, error=message, hint=getattr(exc, "hint", ""))


def run_checks(
    cluster: Cluster, ctx: Context, deep: bool
) -> tuple[list[HostFacts], list[HostReport]]:
    facts = gather(cluster, ctx, deep)
    return facts, evaluate(facts, ctx)


def reports_ok(reports: Sequence[HostReport]) -> bool:
    return not any(r.failed for r in reports)
