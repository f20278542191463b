"""The probe's looks, run here for real: the network path (iproute2 and the kernel's files
agree), module lookups in the ranks' environment, and the session's questions, on this
Python and on Python 3.8 through the bootstrap."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from port_binds import bound
from sshddp.hosts import shipped
from sshddp.model.commands import BOOTSTRAP
from sshddp.protocol import session_messages as msgs
from sshddp.remote.calls import host_imports, network


def own_ipv4() -> list[str]:
    """This machine's IPv4 addresses (other than loopback), as the kernel lists them."""
    found = network.by_socket("127.0.0.1")["interfaces"]
    return [
        a.split("/")[0]
        for i in found.values()
        for a in i["addrs"]
        if "." in a and not a.startswith("127.")
    ]


@pytest.mark.parametrize("target", ["127.0.0.1", "127.0.0.41", "own", "192.0.2.77", "::1"])
def test_iproute2_and_the_kernel_files_agree_on_the_route(target: str) -> None:
    if target == "own":
        addrs = own_ipv4()
        assert addrs, "this machine has no IPv4 address besides loopback"
        target = addrs[0]
    by_ip = network.facts(target)
    by_kernel = network.by_socket(target)
    assert by_ip["method"] == "ip", "iproute2 is installed here (.ci/run installs it)"
    assert by_kernel["method"] == "socket"
    kernel_route = by_kernel["route"]
    if kernel_route and kernel_route["local"]:
        kernel_route["dev"] = network.owner(target, by_kernel["interfaces"]) or kernel_route["dev"]
    assert by_ip["route"] == kernel_route
    for name, info in by_ip["interfaces"].items():
        assert by_kernel["interfaces"][name]["mtu"] == info["mtu"], name


def test_loopback_targets_leave_by_lo_and_own_addresses_by_their_interface() -> None:
    assert network.facts("127.0.0.41")["route"] == {"dev": "lo", "src": "127.0.0.1", "local": True}
    addr = own_ipv4()[0]
    route = network.facts(addr)["route"]
    assert route["local"] and route["dev"] != "lo"


def test_routes_of_the_kernel_files_are_the_main_table(tmp_path: Path) -> None:
    ip_routes = network.facts("127.0.0.1")["routes"]
    kernel_routes = network.by_socket("127.0.0.1")["routes"]
    assert {(r["dst"], r["dev"]) for r in ip_routes} == {
        (r["dst"], r["dev"]) for r in kernel_routes
    }


def test_module_lookup_in_the_ranks_environment(tmp_path: Path) -> None:
    (tmp_path / "only_on_pythonpath.py").write_text("")
    (tmp_path / "beside").mkdir()
    (tmp_path / "beside" / "next_to_script.py").write_text("")
    names = ["json", "torch", "only_on_pythonpath", "next_to_script", "no_such_module_xyz"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    looked = host_imports.find(names, str(tmp_path / "beside"), env)
    assert looked["method"] == "in-process"
    assert looked["found"] == {
        "json": True,
        "torch": True,
        "only_on_pythonpath": True,
        "next_to_script": True,
        "no_such_module_xyz": False,
    }
    without = host_imports.find(names, None, dict(os.environ))["found"]
    assert not without["only_on_pythonpath"] and not without["next_to_script"]
    # A variable that changes Python's start-up: a fresh interpreter answers, the same way.
    fresh = host_imports.find(names, str(tmp_path / "beside"), {**env, "PYTHONNOUSERSITE": "1"})
    assert fresh["method"] == "subprocess" and fresh["found"] == looked["found"]


def session(python: str, probe_args: dict[str, Any]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [python, "-c", BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(shipped.header("host_session", {"probe": probe_args}))
    proc.stdin.flush()
    return proc


def ask(proc: subprocess.Popen[bytes], question: str, **args: Any) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(msgs.encode(msgs.ask(question, args)))
    proc.stdin.flush()
    return reply(proc, "answer")


def reply(proc: subprocess.Popen[bytes], kind: str) -> dict[str, Any]:
    """The session's next line, a reply of ``kind``: what it carries."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    message = msgs.decode_reply(line)
    assert message is not None and message["kind"] == kind, line
    return msgs.carried(message)


@pytest.mark.parametrize("which", ["this", "3.8"])
def test_the_session_answers_the_new_questions(
    tmp_path: Path, oldest_python: Path, which: str, free_port: Any
) -> None:
    python = sys.executable if which == "this" else str(oldest_python)
    port = free_port()
    args = {
        "workdir": str(tmp_path),
        "listen_port": "auto",
        "auto_from": port,
        "env": {"NODE_RANK": "7", "PYTHONPATH": str(tmp_path)},
        "watch": {"names": ["NODE_RANK", "RANK"], "prefixes": ["TORCHELASTIC_"]},
        "route_to": "127.0.0.41",
        "imports": {"names": ["json", "shipped_here", "nope_xyz"], "path0": None},
    }
    (tmp_path / "shipped_here.py").write_text("")
    sent = time.time()
    proc = session(python, args)
    try:
        assert proc.stdout is not None
        first = msgs.decode_reply(proc.stdout.readline())  # its clock, before the probe
        assert first is not None and first["kind"] == "clock", first
        assert sent <= first["clock"] <= time.time(), first
        facts = reply(proc, "facts")
        assert facts["port"]["port"] == port and facts["port"]["free"], facts["port"]
        assert facts["net"]["route"]["dev"] == "lo"
        assert facts["imports"]["found"] == {"json": True, "shipped_here": True, "nope_xyz": False}
        assert "NODE_RANK" not in facts["login_env"]  # env values are never echoed back
        before = time.time()
        clock = ask(proc, "clock")["clock"]
        assert before - 1 < clock < time.time() + 1
        rdzv = ask(proc, "connect", connect=["127.0.0.1", port], timeout=5)
        assert rdzv == {"rendezvous": {"ok": True, "addr": "127.0.0.1", "port": port}}
        assert not bound(port + 1, reuse=True)  # still reserved for the supervisors
        proc.stdin.close()  # type: ignore[union-attr]
        assert proc.wait(30) == 0
    finally:
        proc.kill()
        proc.wait()
    assert bound(port, reuse=True) and bound(port + 1, reuse=False)
