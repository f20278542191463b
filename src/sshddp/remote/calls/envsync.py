"""``sshddp sync`` on a host: the project's lock made real as a virtual environment.

args: {"workdir": the host's sshddp workdir, "digest": the laptop's hash of the project's
files, "files": {name: text} (pyproject.toml, uv.lock, .python-version; or a
requirements.txt of exact pins, or a PEP 751 pylock.toml: both installed with ``uv pip
sync``), "python": the version the project asks for ("" for the host's own interpreter),
"uv": the uv version, "env": the inventory's variables for this host, "check": answer
without building, "keep": how many environments to keep}.

The environment is ``<workdir>/envs/<key>``, ``key`` a hash of the digest, this host's
platform and the real path of the interpreter it is built on: a changed lock, another
machine type or another Python is another environment, and a run already going keeps its
own. One that holds ``sshddp-env.json`` is complete and is answered at once (one round
trip); the marker's time is when a sync last asked for it. Otherwise it is built by uv in
``envs/.build-<key>-<pid>-<machine>-*`` and renamed into place (a relocatable venv, so its
scripts still work there): an interrupted build leaves only a ``.build-`` directory no run
ever uses, removed by the next sync on that machine once its process is gone. A build
holds ``envs/.lock-<key>``, so hosts whose workdir is one shared directory (a cluster's
shared home, reached over srun) build it once and the others use it. Past ``keep``
environments the least recently asked for go, but never one a process here runs from (its
path in the process's command line), and never by halves: the marker goes first.

uv is ``<workdir>/tools/uv-<version>/uv``. A host without it answers ``need_uv``; the
coordinator then hands it the binary, zlib-compressed, as it hands a launch its code
(``remote/node/host_handoff.py``: kept under ``<workdir>/payloads/<sha256>``, checked), and
calls again with {"uv_payload": {"sha256", "size"}}: uv is unpacked from that kept copy, hashed
again as it is read, and made executable only once the whole copy passed.

While it builds it says how far it got, one JSON line each: {"progress": "resolving" |
"downloading" | "installing" | "done", "detail": the packages uv fetched, the
environment's size once done}.

With ``offline`` ({"wheels": [{"name", "size", "sha256"}], "seed": the key and run id the
seed serves with, or "pull": where and how to get them from the seed}) uv installs with no
index, from the lock's wheels under the workdir (``wheelpass.py``): a host without them
answers ``need_wheels``; the seed says ``serving PORT`` (a progress line) and answers once
stdin closes.

Answers one JSON line last: {"status": "ready" | "built" | "need_uv" | "need_wheels" |
"no_python" | "failed",
"key", "python" (the environment's interpreter), "error", "found" (the Pythons this host
has, when none matches), "platform"}.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import zlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

from sshddp.remote import hostpath
from sshddp.remote.common import emit, os_error_said, pid_alive, size_said
from sshddp.remote.workdir import Unsafe, make_workdir

if TYPE_CHECKING:  # --offline's code is imported (compiled, on the host) only when asked for
    from sshddp.remote.calls import wheelpass

MARKER = "sshddp-env.json"  #: written last into a complete environment
TAIL = 20  #: lines of uv's output kept for an error


def main(args: dict[str, Any]) -> None:
    try:
        emit(_sync(args))
    except Unsafe as exc:
        emit({"status": "unsafe", "error": str(exc)})
    except OSError as exc:
        emit({"status": "failed", "error": os_error_said(exc, str(args["workdir"]))})


def _sync(args: dict[str, Any]) -> dict[str, Any]:
    workdir = make_workdir(str(args["workdir"]))
    uv = _uv(workdir, str(args["uv"]), args.get("uv_payload"))
    if uv is None:
        return {"status": "need_uv", "platform": host_platform()}
    env = _uv_env(args.get("env") or {})
    envs = hostpath.private_dir(os.path.join(workdir, "envs"), "the environments' directory")
    found = _found_before(workdir, args)
    if found is not None:
        ready = _answer(envs, str(args["digest"]), found)
        if _touch(os.path.join(envs, ready["key"], MARKER)):
            return dict(ready, status="ready")
    python = _find_python(uv, str(args.get("python") or ""), env)
    if "error" in python:
        return python
    _remember(workdir, args, python["path"])
    answer = _answer(envs, str(args["digest"]), python["path"])
    key, final = answer["key"], os.path.join(envs, answer["key"])
    if _touch(os.path.join(final, MARKER)):
        return dict(answer, status="ready")
    if args.get("check"):
        return dict(answer, status="missing")
    if not args.get("offline"):
        return dict(answer, **_built(uv, envs, key, python["path"], args, env))
    try:
        wheels, server = _wheels(workdir, args)
    except OSError as exc:
        return dict(answer, status="failed", error=f"the wheels did not arrive: {exc}")
    if server is None and not wheels:
        return dict(answer, status="need_wheels")
    env = dict(env, UV_OFFLINE="1", UV_NO_INDEX="1", UV_FIND_LINKS=wheels)
    try:
        return dict(answer, **_built(uv, envs, key, python["path"], args, env))
    finally:
        if server is not None:
            from sshddp.remote.calls import wheelpass

            wheelpass.wait_for_eof()
            server.stop()


def _answer(envs: str, digest: str, python: str) -> dict[str, Any]:
    key = env_key(digest, python)
    return {"key": key, "python": os.path.join(envs, key, "bin", "python")}


def _found_file(workdir: str, args: dict[str, Any]) -> str:
    """Where the interpreter found for this request (the project's Python, with the
    inventory's env, which may change what uv finds) is remembered, beside our uv."""
    asked = json.dumps([args.get("python") or "", args.get("env") or {}], sort_keys=True)
    name = "python-" + hashlib.sha256(asked.encode()).hexdigest()[:16]
    return os.path.join(workdir, "tools", name)


def _found_before(workdir: str, args: dict[str, Any]) -> Optional[str]:
    """The interpreter an earlier sync found for this request, if it is still there: a
    warm sync then answers without running ``uv python find`` (0.13 s of CPU a host). A
    Python installed since that would match better is used once this one is gone, or its
    environment is."""
    try:
        with hostpath.open_read(_found_file(workdir, args), "sync's record", binary=False) as fh:
            path = fh.read().strip()
    except FileNotFoundError:
        return None
    return path if path and os.access(path, os.X_OK) else None


def _remember(workdir: str, args: dict[str, Any], python: str) -> None:
    path = _found_file(workdir, args)
    try:
        fd, temp = hostpath.temp_file(os.path.dirname(path), ".python-")
    except OSError:
        return  # the next sync finds it again
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(python)
        hostpath.rename(temp, path)
    except OSError:
        os.unlink(temp)


def _built(
    uv: str, envs: str, key: str, python: str, args: dict[str, Any], env: dict[str, str]
) -> dict[str, Any]:
    final = os.path.join(envs, key)
    with _building(envs, key):
        if _touch(os.path.join(final, MARKER)):  # a host sharing this workdir built it
            return {"status": "ready"}
        _prune_builds(envs)
        error = _build(uv, envs, final, key, python, args, env)
    if error:
        return {"status": "failed", "error": error}
    _prune_envs(envs, int(args.get("keep") or 0), key)
    return {"status": "built"}


@contextlib.contextmanager
def _building(envs: str, key: str) -> Iterator[None]:
    """Hold ``envs/.lock-<key>`` while building: hosts that share a workdir (a cluster's
    shared home) build an environment once, the others wait for it and use it. A file
    system without locks builds on every host at once, each aside, as before."""
    path = os.path.join(envs, ".lock-" + key)
    fd = hostpath.lock_file(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _progress("waiting", "another host sharing this workdir builds it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # no locks on this file system
        yield
    finally:
        # gone while still held: a host waiting on it finds the env; one that comes later
        # makes a new lock and finds it too (or, after a failed build, builds it again)
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


def _wheels(
    workdir: str, args: dict[str, Any]
) -> tuple[str, Optional[wheelpass.host_share.Server]]:
    """--offline: the lock's wheels here (received now if they were not), and the server
    handing them on when this host is the seed; ("", None) when they are not here yet."""
    from sshddp.remote.calls import wheelpass

    offline = args["offline"]
    path = wheelpass.folder(workdir, str(args["digest"]))
    if not wheelpass.complete(path):
        if not offline.get("pull") and not offline.get("seed"):
            return "", None
        _progress("receiving", f"{len(offline['wheels'])} wheels")
        wheelpass.receive(path, offline["wheels"], offline.get("pull"))
    if not offline.get("seed"):
        return path, None
    server = wheelpass.serve(path, offline["wheels"], offline["seed"])
    _progress("serving", str(wheelpass.port_of(server)))
    return path, server


def host_platform() -> str:
    """The platform wheels are chosen for here: OS, machine and C library."""
    libc, version = platform.libc_ver()
    return f"{sysconfig.get_platform()}-{libc or 'nolibc'}{version}"


def env_key(digest: str, python: str) -> str:
    text = "\0".join([digest, host_platform(), os.path.realpath(python)])
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _uv(workdir: str, version: str, kept: Optional[dict[str, Any]]) -> Optional[str]:
    """Our uv of ``version``: already here (this user's, and no one else may change it:
    ``Unsafe`` otherwise), or installed from the kept copy ``kept`` names (its SHA-256 and
    size: the compressed binary the coordinator handed here, ``host_handoff.py``)."""
    tools = hostpath.private_dir(os.path.join(workdir, "tools"), "the tools directory")
    folder = os.path.join(tools, "uv-" + version)
    path = os.path.join(folder, "uv")
    if os.path.lexists(folder):
        hostpath.check_dir(folder, "uv's directory")
        if hostpath.executable(path, "uv"):
            return path
    if not kept:
        return None
    made = not os.path.lexists(folder)
    hostpath.private_dir(folder, "uv's directory")
    fd, temp = hostpath.temp_file(folder, ".uv-")
    try:
        with os.fdopen(fd, "wb") as fh:
            _unpack_kept(workdir, str(kept["sha256"]), fh)
        os.chmod(temp, 0o755)  # only once every byte came from a copy that passed its check
        hostpath.rename(temp, path)
    except BaseException as exc:  # a full disk, a changed copy: nothing half-written stays
        os.unlink(temp)
        if made:
            os.rmdir(folder)
        if isinstance(exc, OSError) and not exc.filename:
            exc.filename = path
        raise
    return path


def _unpack_kept(workdir: str, sha256: str, out: Any) -> None:
    """The kept copy of uv, decompressed into ``out`` as it is hashed: ``OSError`` (and the
    copy removed) when it is not the one whose SHA-256 the coordinator computed."""
    from sshddp.remote.node import host_handoff

    kept = host_handoff.kept(workdir, sha256)
    sha, unpack = hashlib.sha256(), zlib.decompressobj()
    try:
        with hostpath.open_read(kept, "the kept copy of uv") as fh:
            for data in iter(lambda: fh.read(host_handoff.CHUNK), b""):
                sha.update(data)
                out.write(unpack.decompress(data))
        out.write(unpack.flush())
    except zlib.error:
        pass  # a changed copy: its digest says so below
    if sha.hexdigest() != sha256:
        os.unlink(kept)
        raise OSError(f"the kept copy of uv {kept} failed its SHA-256 check: removed; sync again")


def _uv_env(extra: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in extra.items()})
    # the system's certificate store, as pip uses: a proxy's own CA (a company's, an HPC
    # centre's) is there; the host's environment or the inventory's `env:` may say otherwise
    if "UV_SYSTEM_CERTS" not in env and "UV_NATIVE_TLS" not in env:
        env["UV_SYSTEM_CERTS"] = "1"  # UV_NATIVE_TLS before uv 0.13 (deprecated since)
    env["UV_PYTHON_DOWNLOADS"] = "never"  # the interpreter is the host's: no silent download
    env["UV_NO_PROGRESS"] = "1"
    env.pop("VIRTUAL_ENV", None)
    return env


def _find_python(uv: str, request: str, env: dict[str, str]) -> dict[str, Any]:
    """{"path": the interpreter for ``request``}, or an answer saying none here matches."""
    if not request:
        return {"path": sys.executable}
    proc = _uv_run([uv, "python", "find", "--system", request], env, "/")
    path = proc.stdout.strip()
    if proc.returncode == 0 and path:
        return {"path": path}
    if "No interpreter found" not in proc.stderr:  # uv itself failed: its words say why
        return {"status": "failed", "error": _tail(proc.stderr) or f"uv exited {proc.returncode}"}
    said = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    return {"status": "no_python", "error": said[-1], "found": _pythons(uv, env)}


def _pythons(uv: str, env: dict[str, str]) -> list[str]:
    argv = [uv, "python", "list", "--only-installed", "--output-format", "json"]
    proc = _uv_run(argv, env, "/")
    try:
        found = json.loads(proc.stdout)
    except ValueError:
        return []
    versions = [str(p.get("version", "")) for p in found if isinstance(p, dict)]
    return sorted(set(v for v in versions if v), key=_version_order)


def _version_order(version: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", version)[:3]]


def _uv_run(argv: list[str], env: dict[str, str], cwd: str) -> subprocess.CompletedProcess[str]:
    hostpath.run_checked(argv[0], "uv")
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
    )


def _build(
    uv: str,
    envs: str,
    final: str,
    key: str,
    python: str,
    args: dict[str, Any],
    env: dict[str, str],
) -> str:
    """Build the environment aside and rename it into place; "" or uv's error."""
    build = hostpath.temp_dir(envs, f".build-{key}-{os.getpid()}-{_machine()}-")
    try:
        project = os.path.join(build, "project")
        os.mkdir(project)
        for name, text in args["files"].items():
            path = os.path.join(project, os.path.basename(name))
            with os.fdopen(hostpath.create(path), "w") as fh:
                fh.write(text)
        venv = os.path.join(build, "venv")
        env = dict(env, UV_PROJECT_ENVIRONMENT=venv)
        pinned = _pinned(args["files"])
        if pinned:  # pins resolved on the laptop, or a pylock.toml
            install = [uv, "pip", "sync", "--python", os.path.join(venv, "bin", "python")]
            install.append(pinned)
        else:
            install = [uv, "sync", "--frozen", "--no-install-project", "--python", python]
        venv_argv = [uv, "venv", "--relocatable", "--quiet", "--python", python, venv]
        for phase, argv in (("resolving", venv_argv), ("downloading", install)):
            code, said = _uv_stream(phase, argv, env, project)
            if code != 0:
                return _tail(said) or f"uv exited {code}"
        marker = {"key": key, "digest": args["digest"], "python": python, "uv": args["uv"]}
        with os.fdopen(hostpath.create(os.path.join(venv, MARKER)), "w") as fh:
            json.dump(marker, fh)
        _progress("done", size_said(_tree_bytes(venv)))
        _place(venv, final)
        return ""
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _pinned(files: dict[str, Any]) -> str:
    """The file ``uv pip sync`` installs, when the project is pins rather than a uv lock."""
    for name in ("requirements.txt", "pylock.toml"):
        if name in files:
            return name
    return ""


#: uv's line once every package is downloaded (or found in its cache) and unpacked
_PREPARED = re.compile(r"^Prepared (\d+ packages?)")


def _uv_stream(phase: str, argv: list[str], env: dict[str, str], cwd: str) -> tuple[int, str]:
    """Run uv in ``phase``, saying how far it got as its summary lines come; (exit code,
    its output)."""
    _progress(phase)
    hostpath.run_checked(argv[0], "uv")
    proc = subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        universal_newlines=True,
        errors="replace",
    )
    said = []
    for line in proc.stdout or ():
        said.append(line)
        found = _PREPARED.match(line)
        if found:
            _progress("installing", found.group(1))
    return proc.wait(), "".join(said)


def _progress(phase: str, detail: str = "") -> None:
    emit({"progress": phase, "detail": detail})


def _tree_bytes(top: str) -> int:
    total = 0
    for folder, _, names in os.walk(top):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def _place(venv: str, final: str) -> None:
    """Rename the built environment into place; one another sync placed first is kept."""
    try:
        hostpath.rename(venv, final)
    except OSError:
        if not os.path.exists(os.path.join(final, MARKER)):
            shutil.rmtree(final, ignore_errors=True)  # an old incomplete one: never used
            hostpath.rename(venv, final)


def _machine() -> str:
    """This machine, in a build directory's name: on a workdir that several machines share,
    a process id says something only on the machine it ran on."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _prune_builds(envs: str) -> None:
    """Remove the build directories of this machine's syncs whose process is gone (an
    interrupted one); another machine's are its own to judge."""
    for name in os.listdir(envs):
        parts = name.split("-")  # .build, key, pid, machine, mkdtemp's suffix (no "-")
        if not name.startswith(".build-") or len(parts) < 4 or not parts[2].isdigit():
            continue
        machine = parts[3] if len(parts) > 4 else _machine()  # one named before machines
        if machine == _machine() and not pid_alive(int(parts[2])):
            shutil.rmtree(os.path.join(envs, name), ignore_errors=True)


def _touch(marker: str) -> bool:
    """Mark the environment as just asked for; False when it is not complete. ``Unsafe``
    when the environment, or its marker, is not this user's alone."""
    try:
        hostpath.check_dir(os.path.dirname(marker), "environment")
        hostpath.check_file(marker, "environment's marker")
        os.utime(marker, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _prune_envs(envs: str, keep: int, current: str) -> None:
    """Remove the least recently asked-for environments past ``keep``, but none in use."""
    if keep <= 0:
        return
    ages = []
    for name in os.listdir(envs):
        try:
            ages.append((os.stat(os.path.join(envs, name, MARKER)).st_mtime, name))
        except OSError:
            continue
    old = [name for _, name in sorted(ages, reverse=True) if name != current][keep - 1 :]
    if not old:
        return
    busy = _command_lines()
    for name in old:
        path = os.path.join(envs, name)
        if (path + os.sep).encode() not in busy:
            os.unlink(os.path.join(path, MARKER))  # no longer complete: never picked up again
            shutil.rmtree(path, ignore_errors=True)


def _command_lines() -> bytes:
    """Every process's command line here, joined (what environments are in use)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(os.path.join("/proc", pid, "cmdline"), "rb") as fh:
                    found.append(fh.read().replace(b"\0", b" "))
            except OSError:
                continue
    return b"\n".join(found)


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-TAIL:])
