"""Pure: what ``sshddp sync`` sends for a project, each host's outcome, and how it prints.

A project is a uv project: ``pyproject.toml`` and ``uv.lock``, with ``.python-version``
when it has one; or a PEP 751 lock (``pylock.toml``, its ``requires-python`` the Python
asked for); or a requirements file, resolved once on the laptop into exact pins for
every platform (``PINNED``), so that every host installs the same versions. Its files
travel to every host as text; their ``digest`` (with the uv version, which decides how a
lock installs) names the environment together with the host's platform and interpreter
(``remote/calls/envsync.py``). The Python version asked for is ``.python-version``'s first line,
else ``requires-python``; with neither, a host builds on its own ``python:``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from sshddp.errors import ExitCode, UsageError
from sshddp.model.escape import visible

#: The files of a uv project that decide its environment, in the order they are hashed.
PROJECT_FILES = ("pyproject.toml", "uv.lock", ".python-version")
#: A requirements file, once resolved on the laptop into exact pins (``uv pip compile``)
PINNED = "requirements.txt"
#: A PEP 751 lock (``pylock.toml`` or ``pylock.NAME.toml``), installed as it is
PYLOCK = "pylock.toml"
REQUIRED = ("pyproject.toml", "uv.lock")


class SyncStatus(str, Enum):
    """How one host's environment ended up."""

    READY = "ready"  #: it was there, complete: nothing to do
    BUILT = "built"  #: built now
    NO_PYTHON = "no_python"  #: the host has no interpreter of the version the project asks for
    FAILED = "failed"  #: uv could not install the lock there
    MISSING = "missing"  #: doctor --sync: the host has no environment for this lock yet
    NO_WHEELS = "need_wheels"  #: --offline: the host has not the lock's wheels yet (for now)
    UNSAFE = "unsafe"  #: the workdir, or what sync would use in it, is not this user's alone
    UNREACHABLE = "unreachable"  #: the host could not be reached

    @property
    def ok(self) -> bool:
        return self in (SyncStatus.READY, SyncStatus.BUILT)


@dataclass(frozen=True)
class Project:
    """A uv project as sync sends it."""

    root: str  #: the directory, as given
    files: Mapping[str, str] = field(hash=False)  #: name -> text, of PROJECT_FILES present
    digest: str  #: hash of the files and the uv version
    python: str  #: the Python version asked for ("" = the host's own ``python:``)


@dataclass(frozen=True)
class HostSync:
    """One host's outcome of a sync."""

    node: int  #: the host's index in the inventory
    host: str
    status: SyncStatus
    key: str = ""  #: the environment's hash (its directory's name on the host)
    python: str = ""  #: the environment's interpreter on the host
    error: str = ""  #: what went wrong, in the host's (or uv's) words
    found: tuple[str, ...] = ()  #: the Python versions the host has (NO_PYTHON)
    seconds: float = 0.0


def project(root: str, files: Mapping[str, str], uv_version: str) -> Project:
    """The project of the ``files`` read from ``root``, or ``UsageError`` naming what lacks."""
    pins = PINNED in files or PYLOCK in files
    missing = [] if pins else [name for name in REQUIRED if name not in files]
    if missing:
        raise UsageError(
            f"{root}: not a uv project: no {' or '.join(missing)} there "
            "(sync installs a project's lock: run `uv lock` in it first)"
        )
    local = local_sources(files)
    if local:
        raise UsageError(_local_refusal(root, local))
    digest = hashlib.sha256(f"uv {uv_version}\0".encode())
    for name in (*PROJECT_FILES, PINNED, PYLOCK):
        if name in files:
            digest.update(f"{name}\0{files[name]}\0".encode())
    return Project(root, dict(files), digest.hexdigest()[:16], python_request(files))


#: a lock's package built from a local path: uv.lock's ``source = { directory = ".." }``
#: (or editable, path), pylock.toml's ``directory`` / ``archive`` path, a pin's file or path
_LOCAL_LOCK = re.compile(
    r'^name = "([^"]+)"\n(?:[^\[\n][^\n]*\n)*?source = \{ (directory|editable|path) = "([^"]+)"',
    re.M,
)
_LOCAL_PYLOCK = re.compile(r'^\s*(?:directory|archive) = \{[^}\n]*\bpath = "([^"]+)"', re.M)
_LOCAL_PIN = re.compile(r"^\s*(?:-e\s+|--editable\s+)?(?:\S+\s*@\s*)?((?:file:|\.{0,2}/)\S*)", re.M)


def local_sources(files: Mapping[str, str]) -> list[str]:
    """The packages of a project's lock that a host would build from a local path (its own
    copy of it), each as ``name (directory /abs/mylib)``; the project itself is not one."""
    found = [
        f"{name} ({kind} {path})"
        for name, kind, path in _LOCAL_LOCK.findall(files.get("uv.lock", ""))
        if path != "."
    ]
    found += [f"a package (path {path})" for path in _LOCAL_PYLOCK.findall(files.get(PYLOCK, ""))]
    found += [f"a package ({path})" for path in _LOCAL_PIN.findall(files.get(PINNED, ""))]
    return found


def _local_refusal(root: str, local: Sequence[str]) -> str:
    return (
        f"{root}: the lock installs {', '.join(local)} from a local path. Each host would build "
        "it from its own copy of that path, which sync neither sends nor hashes, so a changed "
        'library would leave an old environment "ready". Install it from an index or a git '
        'URL instead (`mylib = { git = "https://..." }` under [tool.uv.sources], then '
        "`uv lock`), or ship its code with the run: put it in the --workdir, where the "
        "ranks import it from"
    )


_REQUIRES = re.compile(r"""^\s*requires-python\s*=\s*["']([^"']+)["']""", re.M)


def python_request(files: Mapping[str, str]) -> str:
    """The Python version ``files`` ask for: ``.python-version``, else ``requires-python``."""
    pinned = files.get(".python-version", "")
    for line in pinned.splitlines():
        if line.strip() and not line.strip().startswith("#"):
            return line.strip()
    if PYLOCK in files:  # PEP 751: a top-level key, before the first table
        found = _REQUIRES.search(re.split(r"^\[", files[PYLOCK], maxsplit=1, flags=re.M)[0])
    else:
        found = _REQUIRES.search(_project_table(files.get("pyproject.toml", "")))
    return found.group(1).strip() if found else ""


def _project_table(text: str) -> str:
    """The ``[project]`` table of a pyproject.toml's text (up to the next table)."""
    start = re.search(r"^\[project\]\s*$", text, re.M)
    if not start:
        return ""
    after = text[start.end() :]
    end = re.search(r"^\[", after, re.M)
    return after[: end.start()] if end else after


@dataclass(frozen=True)
class Progress:
    """How far a host's build got, as ``remote/calls/envsync.py`` says it while it builds."""

    phase: str  #: resolving, downloading, installing, done
    detail: str = ""  #: the packages uv prepared, the environment's size once done


def progress_of(line: bytes) -> Optional[Progress]:
    """The progress a host's line says, or None for any other line (its answer)."""
    try:
        record = json.loads(line.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(record, dict) or "progress" not in record:
        return None
    return Progress(str(record["progress"]), str(record.get("detail") or ""))


def progress_line(host: str, progress: Progress) -> str:
    """A host's progress line: ``gpu-a: installing 41 packages``."""
    detail = f" {progress.detail}" if progress.detail else ""
    return visible(f"{host}: {progress.phase}{detail}")


def outcome(node: int, host: str, answer: Mapping[str, object], seconds: float) -> HostSync:
    """A host's outcome from ``remote/calls/envsync.py``'s answer."""
    try:
        status = SyncStatus(str(answer.get("status")))
    except ValueError:
        status = SyncStatus.FAILED
    found = answer.get("found")
    return HostSync(
        node,
        host,
        status,
        key=str(answer.get("key") or ""),
        python=str(answer.get("python") or ""),
        error=str(answer.get("error") or ""),
        found=tuple(str(v) for v in found) if isinstance(found, list) else (),
        seconds=seconds,
    )


def line(result: HostSync, wanted: str) -> str:
    """One host's line of the report."""
    took = f"{result.seconds:.1f} s"
    if result.status is SyncStatus.READY:
        return f"{result.host}: ready  env {result.key} ({took})"
    if result.status is SyncStatus.BUILT:
        return f"{result.host}: built  env {result.key} ({took})"
    if result.status is SyncStatus.MISSING:
        return f"{result.host}: no env {result.key or 'for this lock'} yet; fix: `sshddp sync`"
    if result.status is SyncStatus.NO_PYTHON:
        found = ", ".join(result.found) or "none"
        return (
            f"{result.host}: no Python {wanted} on this host (found: {found}); fix: install "
            f"Python {wanted} there (`uv python install {wanted}`), or change the project's "
            "requires-python / .python-version"
        )
    # uv's and the host's words: their control characters are shown, not obeyed
    said = visible(result.error, multiline=True) or "no reason given"
    return f"{result.host}: {result.status.value}: {said}"


def summary(results: Sequence[HostSync]) -> str:
    bad = [r for r in sorted(results, key=lambda r: r.node) if not r.status.ok]
    if not bad:
        keys = sorted({r.key for r in results})
        same = f"env {keys[0]} on all" if len(keys) == 1 else f"{len(keys)} envs over all"
        return f"sshddp: sync: {same} {len(results)} host(s)"
    named = "; ".join(f"{r.host} ({r.status.value})" for r in bad)
    return f"sshddp: sync: failed on {len(bad)} of {len(results)} host(s): {named}"


def exit_code(results: Sequence[HostSync]) -> ExitCode:
    """4 when a host was unreachable, 7 when an environment could not be built, else 0."""
    if any(r.status is SyncStatus.UNREACHABLE for r in results):
        return ExitCode.UNREACHABLE
    if any(not r.status.ok for r in results):
        return ExitCode.SYNC_FAILED
    return ExitCode.OK


def pythons(results: Sequence[HostSync]) -> Optional[dict[int, str]]:
    """Each host's environment interpreter by host index, or None unless every host has one."""
    if not results or any(not r.status.ok for r in results):
        return None
    return {r.node: r.python for r in results}


def uv_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment sshddp runs uv in on this machine: ``environ`` with uv's native TLS
    (the system's certificate store, which holds a TLS-inspecting proxy's CA as pip's does)
    unless ``environ`` says how itself (``UV_SYSTEM_CERTS``, or the older ``UV_NATIVE_TLS``,
    which uv 0.13 warns is deprecated). The hosts do the same (envsync)."""
    if any(name in environ for name in ("UV_SYSTEM_CERTS", "UV_NATIVE_TLS")):
        return dict(environ)
    return {**environ, "UV_SYSTEM_CERTS": "1"}


def is_pylock(name: str) -> bool:
    """Whether a file's ``name`` is a PEP 751 lock's: ``pylock.toml`` or ``pylock.NAME.toml``."""
    return re.fullmatch(r"pylock(\.[^.\s/]+)?\.toml", name) is not None


def without_options(pins: str) -> str:
    """Exact pins with their option lines (``--index-url``, ``--find-links``) dropped: an
    offline host installs from the wheels it was given, with no index."""
    return "".join(
        line for line in pins.splitlines(keepends=True) if not line.lstrip().startswith("-")
    )


def sent_line(sent: int, wheels: int, count: int) -> str:
    """--offline: what this machine sent to the hosts, against the wheels' size."""
    return (
        f"sshddp: sync: {sent} bytes sent to the hosts over SSH; the {count} wheel(s) are "
        f"{wheels} bytes ({sent / max(wheels, 1):.3f}x)"
    )


def handed_line(what: str, record: Mapping[str, Any]) -> str:
    """How ``what`` (uv) reached the hosts that lacked it (a ``Delivery`` record): the
    bytes that left this machine, and who got it from whom."""
    got = record.get("got") or {}
    kept = record.get("kept") or []
    size, sent = int(record.get("size") or 0), int(record.get("from_laptop") or 0)
    sources = ", ".join(f"{host} from {source}" for host, source in got.items())
    also = f"; {len(kept)} kept it already" if kept else ""
    return (
        f"sshddp: sync: {what} ({size} bytes) to {len(got) + len(kept)} host(s): {sent} bytes "
        f"left this machine ({sent / max(size, 1):.2f}x): {sources or 'none sent'}{also}"
    )


#: The machines the ``uv`` wheel is built for (``sysconfig.get_platform()``'s last part,
#: as a host says it) under the tag pip asks for; glibc 2.17 and musl 1.1 are its floors.
UV_MACHINES = {
    "x86_64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "armv7l": "armv7l",
    "i686": "i686",
    "ppc64le": "ppc64le",
    "s390x": "s390x",
}
UV_MACOS = {"arm64": "macosx_11_0_arm64", "x86_64": "macosx_10_12_x86_64"}


def uv_wheel_tag(host_platform: str) -> Optional[str]:
    """The platform tag of the ``uv`` wheel that runs on a host whose platform is
    ``host_platform`` (``remote/calls/envsync.host_platform``: ``linux-aarch64-glibc2.31``), for
    ``pip download --platform``; None where uv publishes no wheel for it. A Linux host
    whose C library Python cannot name is taken for musl (Alpine): ``platform.libc_ver``
    recognises glibc only."""
    parts = host_platform.split("-")
    if len(parts) < 3:
        return None
    system, machine, libc = parts[0], parts[-2], parts[-1]
    if system == "macosx":
        return UV_MACOS.get(machine)
    if system != "linux" or machine not in UV_MACHINES:
        return None
    arch = UV_MACHINES[machine]
    glibc = re.fullmatch(r"glibc(\d+)\.(\d+)", libc)
    if glibc is not None:
        too_old = (int(glibc[1]), int(glibc[2])) < (2, 17)
        return None if too_old else f"manylinux_2_17_{arch}"
    if libc.startswith("musl") or libc == "nolibc":
        return f"musllinux_1_1_{arch}"
    return None
