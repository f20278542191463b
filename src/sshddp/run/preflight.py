"""The preflight, for ``sshddp doctor`` and for a launch alike: every host's session opened
in parallel, each answering the probe; then the checks.

The first host's probe also listens on the rendezvous port (proving it free) while every
host, itself included, opens a real TCP connection to the rendezvous address and port; the
sessions stay open until every host has answered, so the first host holds the port that
long. Doctor then ends every session. A launch keeps them: the same session boots its node
once the checks pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from sshddp import defaults
from sshddp.errors import CheckFailed, HostUnreachable, InterpreterMissing, SshddpError
from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.model.checks import Context, HostFacts, HostReport, evaluate, reports_ok
from sshddp.model.inventory import Host
from sshddp.model.report import launch_warnings

#: Opens a host's session given the probe's arguments (None: no probe, for --no-check).
SessionOpener = Callable[[Host, Optional[dict[str, Any]]], HostSession]


class PreflightFailed(CheckFailed):
    """A check failed on some host; nothing was started and no session is left open."""

    def __init__(self, reports: list[HostReport]) -> None:
        super().__init__(
            "the preflight checks failed (above); nothing was started. Fix them, or pass "
            "--no-check to launch anyway"
        )
        self.reports = reports


@dataclass
class Gathered:
    """Every host's facts, in inventory order, and the sessions that answered."""

    facts: list[HostFacts]
    sessions: dict[int, HostSession]

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()


def probe_args(host: Host, ctx: Context, deep: bool, listen: bool, rdzv_ok: bool) -> dict[str, Any]:
    return {
        "workdir": host.workdir,
        "deep": deep,
        "listen_port": ctx.rdzv_port if listen else None,
        "connect": [ctx.rdzv_addr, ctx.rdzv_port] if rdzv_ok else None,
        "connect_timeout": defaults.RDZV_CONNECT_WINDOW,
        "script": None if ctx.script_is_local else ctx.script,
    }


def gather(pool: HostPool, ctx: Context, deep: bool, open_session: SessionOpener) -> Gathered:
    """Connect to every host and open a session on the reachable ones, each answering the
    probe. One ``HostFacts`` per host: its facts, or why there are none."""
    errors = pool.connect_all()
    first = pool.hosts[0]
    rdzv_ok = errors[first.index] is None
    reachable = [h for h in pool.hosts if errors[h.index] is None]

    def open_one(host: Host) -> tuple[HostSession, Any]:
        session = open_session(host, probe_args(host, ctx, deep, host is first, rdzv_ok))
        try:
            return session, session.answer("probe")
        except BaseException:
            session.close()
            raise

    sessions: dict[int, HostSession] = {}
    facts: dict[int, HostFacts] = {}
    for index, outcome in pool.map(open_one, reachable).items():
        host = pool.hosts[index]
        if outcome.value is not None:
            sessions[index], answer = outcome.value
            facts[index] = HostFacts(host, answer)
        else:
            facts[index] = _error_facts(host, outcome.error)
    return Gathered(_assemble(pool.hosts, errors, facts), sessions)


def doctor(pool: HostPool, ctx: Context) -> tuple[list[HostFacts], list[HostReport]]:
    """``sshddp doctor``: every host's deep facts and findings; nothing is left running."""

    def open_session(host: Host, args: Optional[dict[str, Any]]) -> HostSession:
        return HostSession(pool.transport(host), "", "", args)

    gathered = gather(pool, ctx, True, open_session)
    gathered.close()
    return gathered.facts, evaluate(gathered.facts, ctx)


def for_launch(
    pool: HostPool,
    ctx: Context,
    open_session: SessionOpener,
    warn: Callable[[str], None] = lambda text: None,
) -> dict[int, HostSession]:
    """Every host's launch session, opened by the checks that matter for a launch;
    ``PreflightFailed`` (nothing started, no session left) when one fails. Warnings (the
    checks that passed with one) go to ``warn``."""
    gathered = gather(pool, ctx, False, open_session)
    reports = evaluate(gathered.facts, ctx)
    if not reports_ok(reports):
        gathered.close()
        raise PreflightFailed(reports)
    for line in launch_warnings(reports):
        warn(line)
    return gathered.sessions


def _assemble(
    hosts: Sequence[Host],
    errors: dict[int, Optional[HostUnreachable]],
    facts: dict[int, HostFacts],
) -> list[HostFacts]:
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
    return [_without_rdzv(hf) for hf in results]


def _without_rdzv(hf: HostFacts) -> HostFacts:
    if hf.facts is None:
        return hf
    facts = hf.facts.copy()
    facts.pop("rendezvous", None)
    return replace(hf, facts=facts)


def _error_facts(host: Host, exc: Optional[BaseException]) -> HostFacts:
    if isinstance(exc, InterpreterMissing):
        return HostFacts(host, {"python_missing": host.python, "reached": True})
    if isinstance(exc, SshddpError):
        return HostFacts(host, error=exc.message, hint=getattr(exc, "hint", ""))
    return HostFacts(host, error=f"{type(exc).__name__}: {exc}")
