"""``sshddp sync``: every host gets the virtual environment a uv project's lock describes.

Each host answers in one call (``remote/calls/envsync.py``): its environment for this lock is
there, or it builds it and says so, or says what failed. Hosts without our uv answer
``need_uv``; the uv binary for their platform (this machine's own, from the ``uv`` package
sshddp depends on, for a host of its platform, else the one from the ``uv`` wheel for the
host's: ``syncuv``), compressed, then reaches them the way a launch's code does
(``run/share.py``): it leaves this machine once, the hosts hand it on to each other, each
copy is checked against its SHA-256 and kept under the workdir (``payloads/``), and a second
call has each host install uv from its kept copy. Hosts run in the pool's threads (at most
``fanout`` at once); one failing never stops the others.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import threading
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from sshddp import defaults, trace
from sshddp.errors import ExitCode, SshddpError, SyncFailed, UsageError
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import SshOptions, Transport
from sshddp.model import sync as model
from sshddp.model.commands import python_command
from sshddp.model.inventory import Host, Inventory
from sshddp.model.sync import HostSync, Progress, Project, SyncStatus
from sshddp.run import syncuv
from sshddp.run.share import Audience, Bytes, Handoff
from sshddp.run.syncwheels import Wheels

#: what a sync says of a host while it builds: (the host's index, its name, how far)
OnProgress = Callable[[int, str, Progress], None]

UV_LEVEL = 1  #: zlib level of the uv binary sent: 38 MB -> 17 MB in a fraction of a second


def uv_version() -> str:
    from importlib import metadata  # here: a launch without --sync does without it

    return metadata.version("uv")


def load_project(path: str) -> Project:
    """The uv project in directory ``path`` (or its pylock.toml when it has no uv.lock), the
    PEP 751 lock ``path``, or the requirements file ``path`` resolved here; or
    ``UsageError``."""
    root = Path(path).expanduser()
    if root.is_file() and root.suffix == ".txt":
        return model.project(str(root), {model.PINNED: _compile(root)}, uv_version())
    if root.is_file() and model.is_pylock(root.name):
        return model.project(str(root), {model.PYLOCK: _read(root)}, uv_version())
    if not root.is_dir():
        raise UsageError(
            f"PROJECT {path}: neither a uv project's directory (pyproject.toml, uv.lock), a "
            "pylock.toml, nor a requirements file (.txt)"
        )
    if not (root / "uv.lock").exists() and (root / model.PYLOCK).is_file():
        return model.project(str(root), {model.PYLOCK: _read(root / model.PYLOCK)}, uv_version())
    files = {}
    for name in model.PROJECT_FILES:
        if (root / name).exists():
            files[name] = _read(root / name)
    return model.project(str(root), files, uv_version())


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot be read: {exc}") from None


def _compile(requirements: Path) -> str:
    """``requirements`` resolved once, here, into exact pins for every platform."""
    import subprocess

    import uv

    argv = [uv.find_uv_bin(), "pip", "compile", "--universal", "--no-header"]
    argv += ["--emit-index-url", "--emit-find-links", requirements.name]
    env = model.uv_environ(os.environ)
    done = subprocess.run(argv, cwd=requirements.parent, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        said = done.stderr.strip() or f"uv exited {done.returncode}"
        raise UsageError(f"{requirements}: uv could not resolve it:\n{said}")
    return done.stdout


def sync_hosts(
    inventory: Inventory,
    project: Project,
    ssh: SshOptions,
    fanout: int,
    check: bool = False,
    on_progress: Optional[OnProgress] = None,
    wheels: Optional[Wheels] = None,
    meter: Optional[Meter] = None,
) -> list[HostSync]:
    """Sync (or with ``check`` only look at) every host's environment, in host order;
    ``on_progress`` hears how far each host got while it builds (from the pool's threads).
    With ``wheels`` (--offline) the hosts install from them alone: the first host that
    lacks them gets them from here and hands them on to the others. ``meter`` counts the
    bytes written to the hosts."""
    with HostPool(inventory.hosts, ssh, fanout) as pool:
        sync = _Sync(pool, project, check, on_progress, wheels, meter or Meter())
        outcomes = pool.map(sync.one, inventory.hosts)
        results = outcomes.in_order(inventory.hosts, _unreachable)
        for result in sync.with_uv([h for h in inventory.hosts if h.index in sync.need_uv]):
            results[result.node] = result
        needing = [h for h in inventory.hosts if results[h.index].status is SyncStatus.NO_WHEELS]
        if needing:
            for result in _seeded(sync, needing):
                results[result.node] = result
    return results


def _unreachable(host: Host, why: str) -> HostSync:
    return HostSync(host.index, host.host, SyncStatus.UNREACHABLE, error=why)


class Meter:
    """The bytes written to the hosts' SSH channels (by the pool's threads), and how uv
    reached the hosts that lacked it (``Handoff.record``, one per platform)."""

    def __init__(self) -> None:
        self.sent = 0
        self.uv: list[tuple[str, dict[str, object]]] = []  #: (what, ``Handoff.record``)
        self.notes: list[str] = []  #: warnings and notes, said once the board is gone
        self._lock = threading.Lock()

    def say(self, text: str) -> None:
        trace.log.info("sync: %s", text)  # launch --sync prints no notes: -v shows them
        with self._lock:
            self.notes.append(text)

    def add(self, n: int) -> None:
        with self._lock:
            self.sent += n


class _Sync:
    """One sync's calls to its hosts."""

    def __init__(
        self,
        pool: HostPool,
        project: Project,
        check: bool,
        on_progress: Optional[OnProgress],
        wheels: Optional[Wheels],
        meter: Meter,
    ) -> None:
        self.pool, self.project, self.check = pool, project, check
        self.on_progress, self.wheels, self.meter = on_progress, wheels, meter
        #: hosts that lack our uv: their platform, and when their first call began
        self.need_uv: dict[int, tuple[str, float]] = {}

    def said(self, host: Host) -> Callable[[Progress], None]:
        def said(progress: Progress) -> None:
            if self.on_progress is not None:
                self.on_progress(host.index, host.host, progress)

        return said

    def args(
        self,
        host: Host,
        offline: Optional[dict[str, Any]] = None,
        uv: Optional[Bytes] = None,
    ) -> dict[str, Any]:
        args = {
            "workdir": host.workdir,
            "digest": self.project.digest,
            "files": dict(self.project.files),
            "python": self.project.python,
            "uv": uv_version(),
            "env": dict(host.env),
            "check": self.check,
            "keep": defaults.KEEP_ENVS,
        }
        if self.wheels is not None:
            args["offline"] = dict(offline or {}, wheels=list(self.wheels.listed))
        if uv is not None:  # its kept copy: uv is installed from it
            args["uv_payload"] = {"sha256": uv.sha256, "size": uv.size}
        return args

    def one(
        self,
        host: Host,
        offline: Optional[dict[str, Any]] = None,
        uv: Optional[Bytes] = None,
        start: Optional[float] = None,
    ) -> HostSync:
        """The host's outcome; a host that lacks uv (and is to get it) is noted in
        ``need_uv`` and answered by ``with_uv`` instead."""
        start = time.monotonic() if start is None else start
        try:
            answer = self.call(host, self.args(host, offline, uv))
        except SshddpError as exc:
            return HostSync(host.index, host.host, SyncStatus.UNREACHABLE, error=_said(exc))
        if answer.get("status") == "need_uv" and uv is None and not self.check:
            self.need_uv[host.index] = (str(answer.get("platform")), start)
        return model.outcome(host.index, host.host, answer, time.monotonic() - start)

    def call(self, host: Host, args: dict[str, Any]) -> dict[str, Any]:
        transport = self.pool.transport(host)
        transport.connect()
        start = time.monotonic()
        answer = _Channel(transport, args, [], self.meter).answer(self.said(host))
        took = time.monotonic() - start
        trace.log.info("sync: %s answered %s in %.3f s", host.host, answer.get("status"), took)
        if answer.get("status") == "need_uv" and self.check:  # doctor changes nothing there
            return {"status": "missing"}
        return answer

    def with_uv(self, hosts: list[Host]) -> list[HostSync]:
        """The hosts that lack uv: uv handed to them, platform by platform, then each one's
        sync again, from its kept copy."""
        results: list[HostSync] = []
        platforms = {self.need_uv[h.index][0] for h in hosts}
        for platform in sorted(platforms):
            group = [h for h in hosts if self.need_uv[h.index][0] == platform]
            results += self._uv_to(group, platform)
        return results

    def _uv_to(self, hosts: list[Host], platform: str) -> list[HostSync]:
        try:
            uv = Bytes(_uv_packed(platform))
        except UsageError as exc:
            error = f"no uv there, and none for it here: {exc}"
            return [HostSync(h.index, h.host, SyncStatus.FAILED, error=error) for h in hosts]
        problems = self._hand(hosts, uv)
        handed = [h for h in hosts if h.index not in problems]
        synced = self.pool.map(lambda h: self.one(h, uv=uv, start=self.need_uv[h.index][1]), handed)
        results = synced.in_order(handed, _unreachable)
        for h in hosts:
            if h.index in problems:
                error = f"uv did not reach it: {problems[h.index]}"
                results.append(HostSync(h.index, h.host, SyncStatus.FAILED, error=error))
        return results

    def _hand(self, hosts: list[Host], uv: Bytes) -> dict[int, str]:
        """uv kept on every host of ``hosts`` (``run/share.py``): why not, by host index."""
        labels = tuple(h.host for h in hosts)
        what = f"uv {uv_version()}"
        audience = Audience(tuple(hosts), labels, f"sync-{uv.sha256[:12]}", what, "sync")
        handoff = Handoff(audience, uv, self.pool, secrets.token_hex(32), self.meter.say)
        sessions = {h.index: _payload_session(self.pool.transport(h)) for h in hosts}
        try:
            handed = handoff.run(lambda h: sessions[h.index])
        finally:
            for session in sessions.values():
                session.close()
        self.meter.add(handoff.delivery.from_laptop if handoff.delivery else 0)
        record = handoff.record()
        if record is not None:
            self.meter.uv.append((what, record))
        problems = {}
        for index, outcome in handed.items():
            if outcome.error is not None:
                problems[index] = _said_any(outcome.error)
            elif outcome.value is not None:
                problems[index] = outcome.value
        return problems


def _payload_session(transport: Transport) -> HostSession:
    """A session that only answers the hand-off's questions (``host_handoff.main``)."""
    return HostSession(transport, "", "", None, entry="host_handoff")


def _seeded(sync: _Sync, needing: list[Host]) -> list[HostSync]:
    """--offline: the wheels from here to the first host of ``needing`` (the seed), which
    hands them on to the others over TCP while it builds; every one's outcome."""
    assert sync.wheels is not None
    seed, rest = needing[0], needing[1:]
    start = time.monotonic()
    order = {"key": secrets.token_hex(32), "run": f"sync-{sync.project.digest}", "timeout": 600}
    transport = sync.pool.transport(seed)
    args = sync.args(seed, {"seed": order})
    channel = _Channel(transport, args, sync.wheels.stream(), sync.meter)
    said = sync.said(seed)
    port = None
    for progress in channel.progress:
        if progress.phase == "serving":  # its port, for the others: not the user's business
            port = int(progress.detail)
            said(Progress("handing on", f"{len(sync.wheels.listed)} wheels to {len(rest)} host(s)"))
            break
        said(progress)
    results = []
    if port is not None:
        pull = dict(order, addr=seed.addr or seed.host, port=port, source=seed.host)
        pulled = sync.pool.map(lambda h: sync.one(h, {"pull": dict(pull, rank=h.index)}), rest)
        results = pulled.in_order(rest, _unreachable)
    answer = channel.answer(said)
    results.append(model.outcome(seed.index, seed.host, answer, time.monotonic() - start))
    if port is None:
        error = f"{seed.host} could not hand on the wheels"
        results += [HostSync(h.index, h.host, SyncStatus.FAILED, error=error) for h in rest]
    return results


class _Channel:
    """One call of ``remote/calls/envsync.py``: its progress lines as they come, then its answer
    (its last line)."""

    def __init__(
        self, transport: Transport, args: dict[str, Any], payload: Iterable[bytes], meter: Meter
    ) -> None:
        self.transport = transport
        self.proc = transport.start(python_command(transport.host.python))
        self.last = b""
        try:
            for data in (shipped.header("envsync", args), *payload):
                self.proc.write(data)
                meter.add(len(data))
            if "seed" not in (args.get("offline") or {}):  # the seed serves until EOF
                self.proc.close_stdin()
        except BaseException:
            self.proc.close()
            raise
        self.progress = self._progress()

    def _progress(self) -> Iterator[Progress]:
        pending = b""
        while chunk := self.proc.read():
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                progress = model.progress_of(line)
                if progress is None:
                    self.last = line
                else:
                    yield progress
        self.last = pending or self.last

    def answer(self, said: Callable[[Progress], None]) -> dict[str, Any]:
        try:
            self.proc.close_stdin()
            for progress in self.progress:
                said(progress)
            stderr, rc = self.proc.read_stderr(), self.proc.wait()
            answer: dict[str, Any] = shipped.decode(
                self.transport, "envsync", self.last, stderr, rc
            )
            return answer
        finally:
            self.proc.close()


def local_platform() -> str:
    """This machine's platform as ``remote/calls/envsync.host_platform`` says a host's."""
    import platform
    import sysconfig

    libc, version = platform.libc_ver()
    return f"{sysconfig.get_platform()}-{libc or 'nolibc'}{version}"


_PACKING = threading.Lock()


def _uv_packed(host_platform: str) -> bytes:
    """uv for a host of ``host_platform``, compressed once for every host that lacks it.
    The pool's threads ask at once: one packs while the others wait (else each would
    compress the same 38 MB), and ``sysconfig``'s first use, in ``local_platform`` and
    ``uv.find_uv_bin``, is not thread-safe before Python 3.12 (a second thread read its
    half-made variables: "can only concatenate str (not NoneType) to str")."""
    with _PACKING:
        return _packed(host_platform)


@functools.cache
def _packed(host_platform: str) -> bytes:
    """This machine's own uv binary where the platforms match, else the one in the ``uv``
    wheel for the host's (``syncuv``), compressed; kept in this user's cache, one file per
    uv version and host platform: packing it took 0.7 s of every cold sync, and another
    platform's costs a pip download."""
    digest = hashlib.sha256(f"{uv_version()}\0{host_platform}".encode()).hexdigest()[:16]
    cached = cache_dir() / f"uv-{uv_version()}-{digest}.zlib"
    packed = syncuv.cached(cached)  # this user's alone, or refused
    if host_platform == local_platform():
        import uv

        binary = Path(uv.find_uv_bin()).read_bytes()
        if packed is not None:
            return syncuv.same_binary(packed, binary, cached)
        packed = zlib.compress(binary, UV_LEVEL)
    elif packed is not None:
        return packed
    else:
        packed = zlib.compress(syncuv.uv_for(host_platform, uv_version()), UV_LEVEL)
    syncuv.keep(cached, packed)
    return packed


def cache_dir() -> Path:
    """This user's cache of sshddp: ``$XDG_CACHE_HOME/sshddp``, else ``~/.cache/sshddp``."""
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(xdg) / "sshddp"


def _said_any(exc: BaseException) -> str:
    return _said(exc) if isinstance(exc, SshddpError) else str(exc)


def _said(exc: SshddpError) -> str:
    hint = getattr(exc, "hint", "")
    return exc.message + (f" (fix: {hint})" if hint else "")


def project_path(option: Optional[str], inventory: Inventory) -> Optional[str]:
    """The project a launch syncs: ``--sync``'s (from the working directory), else the
    inventory's ``sync:`` (from the inventory file's directory)."""
    if option:
        return option
    if not inventory.sync:
        return None
    path = Path(inventory.sync).expanduser()
    if path.is_absolute() or not Path(inventory.source).is_file():
        return str(path)
    return str(Path(inventory.source).parent / path)


def _launch_exit_code(results: list[HostSync]) -> ExitCode:
    """A launch's exit code for a failed sync: a workdir that failed the checks fails the
    launch's preflight (3), as it would without --sync."""
    code = model.exit_code(results)
    if code is ExitCode.SYNC_FAILED and any(r.status is SyncStatus.UNSAFE for r in results):
        return ExitCode.CHECK_FAILED
    return code


def synced(
    inventory: Inventory, path: str, ssh: SshOptions, fanout: int, spares: bool = False
) -> tuple[Inventory, list[HostSync], list[str]]:
    """``inventory`` with every host's ``python`` its synced environment's, once synced;
    ``SyncFailed`` naming every host that has none. With ``spares`` (the launch stages
    them, to take a lost node's place mid-run) its spares are synced too, in the same
    fan-out: a spare that gets no environment is left out, and the last list says so."""
    if not inventory.hosts:
        raise UsageError("--sync / sync: needs the inventory's hosts known before the launch")
    project = load_project(path)
    count = len(inventory.hosts)
    staged = [replace(s, index=count + i) for i, s in enumerate(inventory.spares if spares else ())]
    results = sync_hosts(
        replace(inventory, hosts=inventory.hosts + tuple(staged)), project, ssh, fanout
    )
    results, spare_results = results[:count], results[count:]
    pythons = model.pythons(results)
    if pythons is None:
        bad = [model.line(r, project.python) for r in results if not r.status.ok]
        message = f"sync of {path} failed:\n" + "\n".join(bad)
        raise SyncFailed(message, _launch_exit_code(results))
    hosts = tuple(replace(h, python=pythons[h.index]) for h in inventory.hosts)
    kept, left = _synced_spares(inventory.spares, spare_results, project.python)
    return replace(inventory, hosts=hosts, spares=kept), results + spare_results, left


def _synced_spares(
    spares: tuple[Host, ...], results: list[HostSync], wanted: str
) -> tuple[tuple[Host, ...], list[str]]:
    """The spares that got the environment (each with its interpreter), and a line for each
    that did not (left out: a spare seated mid-run must run the run's environment)."""
    if not results:
        return spares, []
    kept = tuple(replace(s, python=r.python) for s, r in zip(spares, results) if r.status.ok)
    left = [
        f"sshddp: sync: spare {model.line(r, wanted)}; it is left out of this run"
        for r in results
        if not r.status.ok
    ]
    return kept, left
