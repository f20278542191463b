"""Every path the host-side code (``sshddp.remote``) opens, renames, links or runs comes
from the gate (``remote/hostpath.py``), or is on a short, reasoned list of uses that are
not a host's workdir, run directory, cache or target directory (issue 43: a planted file
or link must never be followed, written through or run).

A call passes when its path (or its argv) is recognisably not a host path (/proc, /sys,
/dev, a system program), names the node's run directory (``rundir``: made by the gate,
resolved once, 0700, this user's, never reused), or sits in a function that checked its
program with the gate first (``hostpath.run_checked``); else it must be in ``ALLOWED``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SHIPPED = Path(__file__).resolve().parents[2] / "src" / "sshddp"
REMOTE = SHIPPED / "remote"
#: every shipped module by its name (a name says its side, so names are unique)
#: jobs/rankcall.py too: it reads the call back and writes the ranks' records on the hosts
HOST_MODULES = {
    p.stem: p
    for p in [
        *REMOTE.rglob("*.py"),
        *(SHIPPED / "protocol").glob("*.py"),
        SHIPPED / "jobs" / "rankcall.py",
    ]
}
GATE = "hostpath.py"

#: (module, attribute) calls that open, create, rename, link or run a path
GUARDED = {
    ("os", "open"),
    ("os", "rename"),
    ("os", "replace"),
    ("os", "link"),
    ("os", "symlink"),
    ("tempfile", "mkstemp"),
    ("tempfile", "mkdtemp"),
    ("shutil", "copyfile"),
    ("subprocess", "run"),
    ("subprocess", "Popen"),
    ("subprocess", "call"),
    ("subprocess", "check_call"),
    ("subprocess", "check_output"),
}
NOT_A_HOST_PATH = re.compile(
    r"""^(f?["']/(proc|sys|dev)/|os\.devnull$|BOOT_ID$|os\.path\.join\(["']/proc["'])"""
)
SYSTEM_ARGV = re.compile(r"""^\[(sys\.executable\b|["'][\w-]+["'])""")
READS_BACK_THE_RUN = "reads back the node's run directory (made by the gate) by a computed path"
SYSTEM = "a system program or kernel file, found on PATH or under /sys, never under a workdir"
USERS = "the user's own file or command, named by the user, read or run as the user would"

#: (module, function) -> why its calls need no gate; keep it short
ALLOWED = {
    ("host_fetch", "_send_dir"): USERS + " (`sshddp fetch PATH`)",
    ("host_fetch", "_send_file"): USERS + " (`sshddp fetch PATH`)",
    ("host_share", "digest"): USERS + " (--share PATH; a FIFO is refused first)",
    ("host_share", "_send"): USERS + " (--share PATH, as digest found it)",
    ("execute", "main"): USERS + " (`sshddp exec CMD`)",
    ("supervisor", "start_torchrun"): USERS + " (the node's command, composed from spec.json)",
    ("standby", "start"): USERS + " (the node's command, composed from spec.json)",
    ("common", "try_lock"): "O_NOFOLLOW, in the run directory: a link is refused",
    ("host_stacks", "_request"): "O_NOFOLLOW, in the run directory, then fstat: a FIFO of ours",
    ("ranksite", "_answer_samplers"): "mkfifo, O_NOFOLLOW in the run directory, then fstat",
    ("common", "publish_json"): "link() never follows its target: it fails on what is there",
    ("workspace", "_place"): "link() never follows its target: it fails on what is there",
    ("network", "_ip_json"): SYSTEM,
    ("network", "_read_int"): SYSTEM,
    ("network", "_rows"): SYSTEM,
    ("node_sampler", "smi_read"): SYSTEM,
    ("probe", "_nvidia_smi"): SYSTEM,
    ("host_health", "_spawn"): USERS
    + " (the inventory's `health:`, by `/bin/sh -c`), or "
    + SYSTEM
    + " (nvidia-smi, dcgmi)",
    ("host_health", "_read"): SYSTEM + " (/sys/class/infiniband)",
    ("probe", "_cuda_from_version_py"): SYSTEM + " (torch's version.py, in site-packages)",
    ("pyspy", "dump"): SYSTEM + " (py-spy, beside the interpreter)",
    ("winsize", "_resize"): SYSTEM + " (a rank's pty under /dev/pts)",
    ("host_flight", "request"): READS_BACK_THE_RUN,
    ("host_flight", "read"): READS_BACK_THE_RUN,
    ("host_follow", "_open_log"): READS_BACK_THE_RUN,
    ("host_stacks", "_one_at_a_time"): READS_BACK_THE_RUN,
    ("host_stacks", "_read_dump"): READS_BACK_THE_RUN,
    ("host_stacks", "_ends_whole"): READS_BACK_THE_RUN,
    ("node_sampler", "read"): READS_BACK_THE_RUN,
    ("node_sampler", "write"): READS_BACK_THE_RUN,
    ("node_top", "history"): READS_BACK_THE_RUN,
    ("rankout", "rank_fifos"): READS_BACK_THE_RUN,
    ("rankout", "_rank_pty"): READS_BACK_THE_RUN,
    ("ranksite", "_open_dump"): READS_BACK_THE_RUN,
    ("ranksite", "_write_joined"): READS_BACK_THE_RUN,
    ("restarts", "_tail"): READS_BACK_THE_RUN,
}


def _callee(func: ast.expr) -> tuple[str, str] | None:
    if isinstance(func, ast.Name):
        return ("", func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return (func.value.id, func.attr)
    if isinstance(func, ast.Attribute):
        return ("?", func.attr)
    return None


def _guarded(callee: tuple[str, str]) -> bool:
    owner, name = callee
    return (
        callee == ("", "open")
        or callee in GUARDED
        or (owner == "os" and name.startswith("exec"))
        or name in ("write_text", "write_bytes")
    )


def _gated(call: ast.Call, function: ast.AST | None) -> bool:
    """Whether ``call``'s path is not a host path, names the run directory, or was
    checked by the gate in the same function."""
    path = ast.unparse(call.args[0]) if call.args else ""
    if NOT_A_HOST_PATH.search(path) or SYSTEM_ARGV.search(path) or "rundir" in path:
        return True
    if "hostpath." in path:
        return True
    if function is None:
        return False
    checked = ast.unparse(function)
    return "hostpath.run_checked(" in checked or "hostpath.executable(" in checked


def ungated(source: str, module: str) -> list[str]:
    """Calls in host module ``module`` (its ``source``) that open, rename or run a path
    neither from the gate nor allowed: "module.function:line call"."""
    tree = ast.parse(source)
    owners: dict[int, ast.AST] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                owners[id(sub)] = node
    found = []
    for node in ast.walk(tree):
        callee = _callee(node.func) if isinstance(node, ast.Call) else None
        if callee is None or not _guarded(callee):
            continue
        assert isinstance(node, ast.Call)
        function = owners.get(id(node))
        name = getattr(function, "name", "<module>")
        if (module, name) in ALLOWED or _gated(node, function):
            continue
        found.append(f"{module}.{name}:{node.lineno} {ast.unparse(node)[:80]}")
    return found


def test_host_code_opens_renames_and_runs_paths_only_through_the_gate() -> None:
    bad = []
    for path in sorted(HOST_MODULES.values()):
        if path.name != GATE:
            bad += ungated(path.read_text(), path.stem)
    assert not bad, "host paths not through remote/hostpath.py:\n" + "\n".join(bad)


def test_every_allowed_use_still_exists() -> None:
    """An entry whose call is gone is removed: the list stays as short as it can be."""
    for module, function in ALLOWED:
        tree = ast.parse(HOST_MODULES[module].read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert function in names, f"ALLOWED names {module}.{function}, which is gone"


def test_the_check_catches_a_plain_open_rename_or_run_of_a_host_path() -> None:
    source = (
        "import os, subprocess\n"
        "def write(workdir):\n"
        "    with open(os.path.join(workdir, 'tools', 'x'), 'wb') as fh:\n"
        "        fh.write(b'')\n"
        "    os.replace(workdir + '/a', workdir + '/b')\n"
        "    subprocess.run([os.path.join(workdir, 'tools', 'uv'), 'sync'])\n"
        "def fine(rundir, uv):\n"
        "    open('/proc/self/stat').read()\n"
        "    open(os.path.join(rundir, 'state.json')).read()\n"
        "    hostpath.run_checked(uv)\n"
        "    subprocess.run([uv, 'sync'])\n"
    )
    found = ungated(source, "newmodule")
    assert sorted(f.split(" ")[0] for f in found) == [
        "newmodule.write:3",
        "newmodule.write:5",
        "newmodule.write:6",
    ], found
