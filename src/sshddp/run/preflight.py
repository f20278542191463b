"""The preflight, for ``sshddp doctor`` and for a launch alike: every host's session opened
in parallel, each answering the probe; then the checks.

The first host's probe also listens on the rendezvous port (proving it free) while every
host, itself included, opens a real TCP connection to the rendezvous address and port; the
sessions stay open until every host has answered, so the first host holds the port that
long. With ``--port auto`` the first host picks the port (a free pair P, P+1, both held), so
the others connect once its answer is in: a second round of questions on the same sessions.
Each session also answers a few clock questions, timed here, for the clock check, and the
coordinator adds what the connection says of the machine (host key, address and port).
Doctor then ends every session. A launch keeps them: the same session boots its node
once the checks pass.

Before any of that, a launch compiles the code it ships (``compile_code``): a script that
is not Python fails here, before a run id exists, rather than on every rank.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from sshddp import defaults, trace
from sshddp.errors import CheckFailed, HostUnreachable, InterpreterMissing, SshddpError
from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import identity
from sshddp.model import rankenv
from sshddp.model.checks import Context, HostFacts, HostReport, Status, evaluate, reports_ok
from sshddp.model.imports import ImportRef, compile_problem, imports_run, modules_wanted
from sshddp.model.inventory import Host
from sshddp.model.plan import CodeSpec
from sshddp.model.report import launch_warnings
from sshddp.run.workfiles import shipped_files

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
        self.quarantined: list[str] = []  #: the lines naming the hosts it quarantined


class CodeDoesNotCompile(CheckFailed):
    """The script, or a module it always imports from the shipped --workdir, is not Python
    that this machine compiles; nothing was started."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem}\nNothing was started. Fix the code; if the hosts' Python is newer and "
            "accepts it, pass --no-check to launch anyway"
        )


def compile_code(code: CodeSpec, module: bool) -> None:
    """Compile the code a launch ships, as every rank would start it: the script, and from
    a --workdir tree the modules that it (or ``-m``'s module) imports for sure, and theirs.
    ``CodeDoesNotCompile`` names the first file that does not compile."""
    if code.local_path is None or code.kind not in ("file", "tar"):
        return
    if code.kind == "file":
        _compile(Path(code.local_path), code.local_path)
        return
    tree = _Tree(code, "" if module else posixpath.dirname(code.target))
    if module:
        for name in modules_wanted(ImportRef(code.target), "", False):
            tree.walk(name)
        tree.walk(code.target + ".__main__")  # what `-m PACKAGE` runs
    else:
        tree.compile(code.target, "", False)


class _Tree:
    """A shipped --workdir tree, its modules found as the ranks' ``sys.path[0]`` (``base``,
    relative to the root) finds them; each compiled at most once."""

    def __init__(self, code: CodeSpec, base: str) -> None:
        assert code.local_path is not None
        self.root, self.base = code.local_path, base
        self.files = set(shipped_files(Path(code.local_path), code.include))
        self.done: set[str] = set()

    def walk(self, dotted: str) -> None:
        """Compile module ``dotted`` if the tree holds it, and what it imports from there."""
        stem = posixpath.join(self.base, *dotted.split("."))
        for rel, is_package in ((stem + ".py", False), (stem + "/__init__.py", True)):
            if rel in self.files:
                self.compile(rel, dotted, is_package)
                return

    def compile(self, rel: str, dotted: str, is_package: bool) -> None:
        if rel in self.done:
            return
        self.done.add(rel)
        source = _compile(Path(self.root, rel), os.path.join(self.root, rel))
        try:
            refs = imports_run(source)
        except (SyntaxError, ValueError):
            return  # compiled, yet not parsed: nothing more to follow
        for ref in refs:
            for name in modules_wanted(ref, dotted, is_package):
                self.walk(name)


def _compile(path: Path, label: str) -> bytes:
    """The file's bytes, once they compile; unreadable here: the imports check says so."""
    try:
        source = path.read_bytes()
    except OSError:
        return b""
    problem = compile_problem(source, label)
    if problem is not None:
        raise CodeDoesNotCompile(problem)
    return source


@dataclass
class Gathered:
    """Every host's facts, in inventory order, and the sessions that answered."""

    facts: list[HostFacts]
    sessions: dict[int, HostSession]

    @property
    def rdzv_port(self) -> Optional[int]:
        """The rendezvous port the first host listened on (the one it picked, with auto)."""
        first = self.facts[0].facts if self.facts else None
        port = (first or {}).get("port") or {}
        return port.get("port") if port.get("free") else None

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()

    def end(self, pool: HostPool) -> None:
        """End every session, all at once, each once its host has cleaned up."""
        pool.map(lambda h: self.sessions[h.index].end(), self.live(pool))

    def live(self, pool: HostPool) -> list[Host]:
        """The hosts whose session answered."""
        return [h for h in pool.hosts if h.index in self.sessions]


def probe_args(host: Host, ctx: Context, deep: bool, listen: bool, rdzv_ok: bool) -> dict[str, Any]:
    """What a host's probe is asked (``remote/calls/probe.py``): the ranks' environment travels
    with it, on stdin."""
    imports = ctx.imports
    return {
        "workdir": host.workdir,
        "deep": deep,
        "listen_port": ("auto" if ctx.auto_port else ctx.rdzv_port) if listen else None,
        "auto_from": defaults.AUTO_PORT_FROM,
        "connect": [ctx.rdzv_addr, ctx.rdzv_port] if rdzv_ok and not ctx.auto_port else None,
        "connect_timeout": defaults.RDZV_CONNECT_WINDOW,
        "script": None if ctx.script_is_local else ctx.script,
        "env": {**host.env, **dict(ctx.cli_env)},
        "watch": {"names": list(rankenv.WATCH_NAMES), "prefixes": list(rankenv.WATCH_PREFIXES)},
        "route_to": ctx.rdzv_addr,
        "imports": {"names": list(imports.names), "path0": imports.path0}
        if imports and imports.names and not imports.error
        else None,
        "gpu_uuids": bool(host.gpus),
        "health": _health_args(host, ctx),
    }


def _health_args(host: Host, ctx: Context) -> Optional[dict[str, Any]]:
    """What ``remote/calls/host_health.py`` looks at, or None: with doctor --health
    everything; doctor without it the inventory's ``health:`` command alone, where it is set
    (a host without one pays nothing); a launch's preflight the command and the GPUs'
    ``nvidia-smi -q`` where the host has NVIDIA's driver (one failed listdir elsewhere)."""
    alone = ctx.health == "command"
    if ctx.health is None or (alone and not host.health):
        return None
    return {
        "hardware": "gpus" if ctx.health == "launch" else not alone,
        "command": host.health,
        "timeout": defaults.HEALTH_TIMEOUT,
        "deep": ctx.health == "deep",
        "deep_timeout": defaults.HEALTH_DEEP_TIMEOUT,
        "keep": defaults.HEALTH_OUTPUT,
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
            answer = session.answer("probe")
            answer["ssh"] = identity(pool.transport(host))
            if not answer.get("too_old"):
                answer["clock"] = _clock(session, deep)
            return session, answer
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
    gathered = Gathered(_assemble(pool.hosts, errors, facts), sessions)
    if ctx.auto_port:
        _connect_round(pool, ctx, gathered)
    return gathered


def _clock(session: HostSession, deep: bool) -> dict[str, float]:
    """The host's clock. doctor: the best of the session's first sample and
    ``CLOCK_SAMPLES`` more. A launch: the first sample alone when it proves the clock
    within ``CLOCK_WARN`` (the check passes, whatever a closer look finds); else the best
    of it and ``LAUNCH_CLOCK_SAMPLES`` more, each a round trip before anything starts."""
    first = session.first_clock
    if not deep and first and abs(first["offset"]) + first["rtt"] / 2 <= defaults.CLOCK_WARN:
        return dict(first)
    return session.clock(defaults.CLOCK_SAMPLES if deep else defaults.LAUNCH_CLOCK_SAMPLES)


def _connect_round(pool: HostPool, ctx: Context, gathered: Gathered) -> None:
    """``--port auto``: every host connects to the port the first host picked and holds."""
    port = gathered.rdzv_port
    if port is None:
        return
    question = {
        "ask": "connect",
        "connect": [ctx.rdzv_addr, port],
        "timeout": defaults.RDZV_CONNECT_WINDOW,
    }
    live = gathered.live(pool)
    answers = pool.map(lambda h: gathered.sessions[h.index].ask(question), live)
    for index, answer in answers.succeeded.items():
        facts = gathered.facts[index].facts
        if facts is not None and answer is not None:
            facts["rendezvous"] = answer["rendezvous"]


def doctor(pool: HostPool, ctx: Context) -> tuple[list[HostFacts], list[HostReport]]:
    """``sshddp doctor``: every host's deep facts and findings; nothing is left running."""

    def open_session(host: Host, args: Optional[dict[str, Any]]) -> HostSession:
        return HostSession(pool.transport(host), "", "", args)

    gathered = gather(pool, ctx, True, open_session)
    gathered.close()
    reports = evaluate(gathered.facts, ctx)
    trace_verdicts(reports)
    return gathered.facts, reports


def trace_verdicts(reports: Sequence[HostReport]) -> None:
    """Each host's verdict, and the checks that did not pass (their names: a finding's text
    is the report's to show)."""
    if not trace.on():
        return
    for report in reports:
        counts = {s: [f.check for f in report.findings if f.status is s] for s in Status}
        trace.log.info(
            "preflight %s: %s (%d checks; failed: %s; warned: %s)",
            report.host.host,
            "FAIL" if report.failed else "ok",
            len(report.findings),
            ", ".join(counts[Status.FAIL]) or "none",
            ", ".join(counts[Status.WARN]) or "none",
        )


def for_launch(
    pool: HostPool,
    ctx: Context,
    open_session: SessionOpener,
    warn: Callable[[str], None] = lambda text: None,
) -> Gathered:
    """Every host's launch session, opened by the checks that matter for a launch, and the
    rendezvous port (the first host's pick with ``--port auto``); ``PreflightFailed``
    (nothing started, no session left) when a check fails. Warnings (the checks that passed
    with one) go to ``warn``."""
    gathered = gather(pool, ctx, False, open_session)
    reports = evaluate(gathered.facts, ctx)
    trace_verdicts(reports)
    if not reports_ok(reports):
        trace.log.info("preflight: a check failed: ending every session, nothing started")
        gathered.end(pool)  # nothing of the run is left on any host once this returns
        raise PreflightFailed(reports)
    for line in launch_warnings(reports):
        warn(line)
    return gathered


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
