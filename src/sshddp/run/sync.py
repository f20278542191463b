"""``sshddp sync``: every host gets the virtual environment a uv project's lock describes.

Each host answers in one call (``remote/envsync.py``): its environment for this lock is
there, or it builds it and says so, or says what failed. A host without our uv answers
``need_uv`` and gets a second call carrying the laptop's uv binary (the ``uv`` package
sshddp depends on), when the host's platform is the laptop's. Hosts run in the pool's
threads (at most ``fanout`` at once); one failing never stops the others.
"""

from __future__ import annotations

import functools
import time
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from sshddp import defaults
from sshddp.errors import ExitCode, SshddpError, SyncFailed, UsageError
from sshddp.hosts import shipped
from sshddp.hosts.pool import HostPool
from sshddp.hosts.transport import SshOptions, Transport
from sshddp.model import sync as model
from sshddp.model.commands import python_command
from sshddp.model.inventory import Host, Inventory
from sshddp.model.sync import HostSync, Progress, Project, SyncStatus

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
    done = subprocess.run(argv, cwd=requirements.parent, capture_output=True, text=True)
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
) -> list[HostSync]:
    """Sync (or with ``check`` only look at) every host's environment, in host order;
    ``on_progress`` hears how far each host got while it builds (from the pool's threads)."""
    with HostPool(inventory.hosts, ssh, fanout) as pool:

        def one(host: Host) -> HostSync:
            start = time.monotonic()

            def said(progress: Progress) -> None:
                if on_progress is not None:
                    on_progress(host.index, host.host, progress)

            try:
                answer = _call(pool, host, project, check, said)
            except SshddpError as exc:
                status = SyncStatus.UNREACHABLE
                return HostSync(host.index, host.host, status, error=_said(exc))
            return model.outcome(host.index, host.host, answer, time.monotonic() - start)

        outcomes = pool.map(one, inventory.hosts)
    results = []
    for host in inventory.hosts:
        outcome = outcomes[host.index]
        if outcome.value is not None:
            results.append(outcome.value)
        else:
            error = getattr(outcome.error, "message", None) or f"{outcome.error}"
            results.append(HostSync(host.index, host.host, SyncStatus.UNREACHABLE, error=error))
    return results


def _call(
    pool: HostPool,
    host: Host,
    project: Project,
    check: bool,
    said: Callable[[Progress], None],
) -> dict[str, Any]:
    transport = pool.transport(host)
    transport.connect()
    args = {
        "workdir": host.workdir,
        "digest": project.digest,
        "files": dict(project.files),
        "python": project.python,
        "uv": uv_version(),
        "env": dict(host.env),
        "check": check,
        "keep": defaults.KEEP_ENVS,
    }
    answer = _envsync(transport, args, b"", said)
    if answer.get("status") != "need_uv":
        return answer
    if check:  # doctor changes nothing on a host
        return {"status": "missing"}
    if answer.get("platform") != local_platform():
        return {
            "status": "failed",
            "error": f"no uv there, and this machine's uv is for {local_platform()}, not "
            f"{answer.get('platform')}: install uv {uv_version()} on the host "
            "(`pip install uv`) and put it at <workdir>/tools/uv-VERSION/uv",
        }
    return _envsync(transport, args, _uv_packed(), said)


def _envsync(
    transport: Transport,
    args: dict[str, Any],
    payload: bytes,
    said: Callable[[Progress], None],
) -> dict[str, Any]:
    """``remote/envsync.py``'s answer (its last line), its progress lines heard as they come."""
    proc = transport.start(python_command(transport.host.python))
    try:
        proc.write(shipped.header("envsync", args) + payload)
        proc.close_stdin()
        pending, last = b"", b""
        while chunk := proc.read():
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                progress = model.progress_of(line)
                if progress is None:
                    last = line
                else:
                    said(progress)
        answer: dict[str, Any] = shipped.decode(
            transport, "envsync", last + pending, proc.read_stderr(), proc.wait()
        )
        return answer
    finally:
        proc.close()


def local_platform() -> str:
    """This machine's platform as ``remote/envsync.host_platform`` says a host's."""
    import platform
    import sysconfig

    libc, version = platform.libc_ver()
    return f"{sysconfig.get_platform()}-{libc or 'nolibc'}{version}"


@functools.cache
def _uv_packed() -> bytes:
    import uv

    return zlib.compress(Path(uv.find_uv_bin()).read_bytes(), UV_LEVEL)


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


def synced(
    inventory: Inventory, path: str, ssh: SshOptions, fanout: int
) -> tuple[Inventory, list[HostSync]]:
    """``inventory`` with every host's ``python`` its synced environment's, once synced;
    ``SyncFailed`` naming every host that has none."""
    if not inventory.hosts:
        raise UsageError("--sync / sync: needs the inventory's hosts known before the launch")
    project = load_project(path)
    results = sync_hosts(inventory, project, ssh, fanout)
    pythons = model.pythons(results)
    if pythons is None:
        bad = [model.line(r, project.python) for r in results if not r.status.ok]
        message = f"sync of {path} failed:\n" + "\n".join(bad)
        raise SyncFailed(message, model.exit_code(results) is ExitCode.UNREACHABLE)
    hosts = tuple(replace(h, python=pythons[h.index]) for h in inventory.hosts)
    return replace(inventory, hosts=hosts), results
