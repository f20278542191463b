"""``sshddp doctor`` against real sshd hosts: each way a cluster breaks, named with a fix.

Every call probes the hosts for real (torch is imported on each, about 2 s), so tests use
two or three hosts and a fresh rendezvous port each.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from doctor_helpers import (
    Port,
    doctor,
    failing,
    fix_command,
    healthy,
    inventory,
    problem,
    run_fix,
    table,
    write,
)

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

# ----------------------------------------------------------------- healthy


def test_healthy_hosts_pass(ssh_env: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    port = free_port()
    result = doctor(ssh_env, healthy(ssh_env, tmp_path, port, [1, 2, 3]))
    assert result.code == ExitCode.OK, result.explain()
    rows = table(result.out)
    assert list(rows) == ["h1", "h2", "h3"]
    assert [rows[h]["node"] for h in rows] == ["0", "1", "2"]
    for host, row in rows.items():
        for check in ("ssh", "python", "torch", "gpus", "rdzv"):
            assert row[check] == "ok", (host, check, result.out)
        assert row["port"] == ("ok" if host == "h1" else ""), result.out
    assert "All checks passed on 3 host(s)." in result.out
    assert "Traceback" not in result.text


def test_healthy_hosts_json(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    port = free_port()
    result = doctor(cluster, healthy(cluster, tmp_path, port, [1, 2]), "--json")
    assert result.code == ExitCode.OK, result.explain()
    doc = json.loads(result.out)
    assert doc["ok"] is True
    assert [h["host"] for h in doc["hosts"]] == ["h1", "h2"]
    here = ".".join(map(str, sys.version_info[:3]))
    for node, h in enumerate(doc["hosts"]):
        assert h["node"] == node and h["error"] is None
        facts: dict[str, Any] = h["facts"]
        assert facts["python"]["version"] == here
        assert facts["python"]["executable"] == sys.executable
        assert facts["torch"]["version"] == metadata.version("torch")
        assert facts["rendezvous"] == {"ok": True, "addr": cluster.host(1).addr, "port": port}
        statuses = {f["check"]: f["status"] for f in h["findings"]}
        assert statuses["python"] == statuses["torch"] == statuses["rdzv"] == "ok", h
        assert all(f["status"] != "fail" for f in h["findings"]), h
    assert doc["hosts"][0]["facts"]["port"]["free"] is True


# ----------------------------------------------------------------- interpreters


def test_other_python_minor_version(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    """h4's python3 is another minor version than the venv's Python on h1."""
    inv = inventory(tmp_path, [("h1", None), ("h4", "python3")], free_port())
    result = doctor(cluster, inv)
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    rows = table(result.out)
    assert rows["h1"]["python"] == "ok" and rows["h4"]["python"] == "FAIL", result.out
    message, fix = problem(result.out, "h4", "python")
    ours = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert f"the other hosts have {ours}" in message
    assert "h4" in fix and f"python{ours}" in fix
    assert not any(host == "h1" for host, _ in failing(result.out)), result.out
    # the fix applied: h4's `python:` is a Python of our minor version
    fixed = doctor(
        cluster, inventory(tmp_path, [("h1", None), ("h4", sys.executable)], free_port())
    )
    assert fixed.code == ExitCode.OK, fixed.explain()


def pip_as_this_machine_has_it() -> dict[str, str]:
    """The environment for a pip command here: no network (no retries of PyTorch's index),
    and the user's own pip configuration (its local package index), which the tests'
    isolated HOME hides. No byte-compiling: torch's 1 GB installs in 10 s instead of 44 s
    here (under CI's load, most of the test's 235 s); the installed files are the same.
    pip reads a negative option's variable inverted: PIP_NO_COMPILE=0 is --no-compile."""
    env = {**os.environ, "PIP_RETRIES": "0", "PIP_NO_COMPILE": "0"}
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    for config in (real_home / ".config" / "pip" / "pip.conf", real_home / ".pip" / "pip.conf"):
        if config.is_file():
            env["PIP_CONFIG_FILE"] = str(config)
    return env


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_host_without_torch(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    """Same Python minor version, but a bare venv (no pip either): torch fails, and the
    script's import of a module the other host has. Both fixes, run as written (pip
    first, then torch from PyTorch's index for this CPU build), make doctor pass."""
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    python = bare / "bin" / "python"
    script = write(tmp_path, "import click\nimport torch\n", "train.py")
    inv = inventory(tmp_path, [("h1", None), ("h2", str(python))], free_port())
    try:
        result = doctor(cluster, inv, "--script", str(script))
        assert_clean_failure(result, ExitCode.CHECK_FAILED)
        assert failing(result.out) == {("h2", "torch"), ("h2", "imports")}, result.out
        message, fix = problem(result.out, "h2", "torch")
        assert f"torch is not installed for {python}" in message
        assert f"{python} -m pip install torch==" in fix and "on h2" in fix
        install_torch = fix_command(fix, f"{python} -m ensurepip --upgrade && ")
        assert install_torch.endswith("--index-url https://download.pytorch.org/whl/cpu")
        message, fix = problem(result.out, "h2", "imports")
        assert "imports click, torch, which" in message
        assert "install torch as the torch check says" in fix
        install_click = fix_command(fix, f"{python} -m ensurepip --upgrade && ")
        offline = pip_as_this_machine_has_it()
        run_fix(install_torch, offline, timeout=800)
        run_fix(install_click, offline)
        fixed = doctor(cluster, inv, "--script", str(script))
        assert fixed.code == ExitCode.OK, fixed.explain()
    finally:
        shutil.rmtree(bare, ignore_errors=True)  # torch takes about 1 GB


def test_missing_interpreter(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    inv = inventory(tmp_path, [("h1", None), ("h2", "/nonexistent/python3")], free_port())
    result = doctor(cluster, inv)
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h2", "python")}, result.out
    message, fix = problem(result.out, "h2", "python")
    assert "the interpreter /nonexistent/python3 does not exist" in message
    assert "`python:`" in fix and "h2" in fix
    assert table(result.out)["h2"]["ssh"] == "ok"
    fixed = doctor(
        cluster, inventory(tmp_path, [("h1", None), ("h2", sys.executable)], free_port())
    )
    assert fixed.code == ExitCode.OK, fixed.explain()


def test_missing_interpreter_on_the_rendezvous_host(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    inv = inventory(tmp_path, [("h1", "/nonexistent/python3"), ("h2", None)], free_port())
    result = doctor(cluster, inv)
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    # Nothing listened on h1, so h2's failed connect is no network problem: not blamed.
    assert failing(result.out) == {("h1", "python")}, result.out
    message, _ = problem(result.out, "h1", "python")
    assert "the interpreter /nonexistent/python3 does not exist" in message
    rows = table(result.out)
    assert rows["h2"]["python"] == rows["h2"]["torch"] == "ok"
    assert rows["h2"]["rdzv"] == "-"


# ----------------------------------------------------------------- reachability


@pytest.fixture
def host2_down(cluster: SshdCluster) -> Iterator[SshdCluster]:
    cluster.stop_host(2)
    try:
        yield cluster
    finally:
        cluster.start_host(2)


def test_sshd_down_on_one_host(host2_down: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    cluster = host2_down
    result = doctor(cluster, healthy(cluster, tmp_path, free_port(), [1, 2, 3]))
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h2", "ssh")}, result.out
    message, fix = problem(result.out, "h2", "ssh")
    assert "connection refused" in message
    assert "sshd" in fix
    rows = table(result.out)
    assert rows["h2"]["ssh"] == "FAIL"
    for host in ("h1", "h3"):  # still checked, in full
        assert rows[host]["ssh"] == rows[host]["python"] == rows[host]["torch"] == "ok"
        assert rows[host]["rdzv"] == "ok"
    # `systemctl` does not run here; what it would do, starting sshd, fixes it
    assert fix_command(fix, "systemctl") == "systemctl status ssh"
    cluster.start_host(2)
    fixed = doctor(cluster, healthy(cluster, tmp_path, free_port(), [1, 2, 3]))
    assert fixed.code == ExitCode.OK, fixed.explain()


def test_wrong_client_key(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    inv = healthy(cluster, tmp_path, free_port(), [1, 2])
    result = doctor(cluster, inv, config=cluster.wrong_key_config())
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h1", "ssh"), ("h2", "ssh")}, result.out
    message, fix = problem(result.out, "h1", "ssh")
    assert "authentication failed" in message
    assert "authorized_keys" in fix

    as_json = doctor(cluster, inv, "--json", config=cluster.wrong_key_config())
    assert as_json.code == ExitCode.CHECK_FAILED, as_json.explain()
    doc = json.loads(as_json.out)
    assert doc["ok"] is False
    for h in doc["hosts"]:
        assert h["facts"] is None and "authentication failed" in h["error"]
        assert h["findings"] == [
            {"check": "ssh", "status": "fail", "message": h["error"], "fix": fix}
        ]


def test_unknown_host_key_then_accept_new(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    config, known_hosts = cluster.config_without_known_host(2)
    h2 = cluster.host(2)
    entry = f"[{h2.addr}]:{h2.port} "
    assert entry not in known_hosts.read_text()
    inv = healthy(cluster, tmp_path, free_port(), [2])

    refused = doctor(cluster, inv, config=config)
    assert_clean_failure(refused, ExitCode.CHECK_FAILED)
    message, fix = problem(refused.out, "h2", "ssh")
    assert "unknown host key SHA256:" in message and "refusing" in message
    assert "--accept-new-host-keys" in fix
    keyscan = fix_command(fix, "ssh-keyscan")
    assert keyscan == f"ssh-keyscan -p {h2.port} {h2.addr} >> {known_hosts}"
    assert entry not in known_hosts.read_text()
    run_fix(keyscan)
    scanned = doctor(cluster, inv, config=config)
    assert scanned.code == ExitCode.OK, scanned.explain()

    config, known_hosts = cluster.config_without_known_host(2)  # unknown again
    accepted = doctor(cluster, inv, "--accept-new-host-keys", config=config)
    assert accepted.code == ExitCode.OK, accepted.explain()
    recorded = [line for line in known_hosts.read_text().splitlines() if line.startswith(entry)]
    public = (cluster.host_key(2).parent / "host_ed25519.pub").read_text().split()[:2]
    assert [line.split()[1:] for line in recorded] == [public]

    again = doctor(cluster, inv, config=config)
    assert again.code == ExitCode.OK, again.explain()
    assert known_hosts.read_text().count(entry) == 1


@pytest.fixture
def host2_new_key(cluster: SshdCluster) -> Iterator[SshdCluster]:
    cluster.change_host_key(2)
    try:
        yield cluster
    finally:
        cluster.restore_host_key(2)


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_refused(
    host2_new_key: SshdCluster, tmp_path: Path, free_port: Port, accept_new: bool
) -> None:
    cluster = host2_new_key
    before = cluster.known_hosts.read_text()
    options = ["--accept-new-host-keys"] if accept_new else []
    inv = healthy(cluster, tmp_path, free_port(), [2])
    result = doctor(cluster, inv, *options)
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    message, fix = problem(result.out, "h2", "ssh")
    assert "CHANGED" in message and "attack" in message
    new_key = (cluster.host_key(2).parent / "host_ed25519.pub").read_text().split()[1]
    assert "it is now ssh-ed25519 SHA256:" in message and "known_hosts has SHA256:" in message
    assert cluster.known_hosts.read_text() == before
    # the fix, as pasted: the entry exactly as known_hosts stores it, then accept-new
    h2 = cluster.host(2)
    remove = fix_command(fix, "ssh-keygen -R")
    assert remove == f"ssh-keygen -R '[{h2.addr}]:{h2.port}' -f {cluster.known_hosts}"
    try:
        run_fix(remove)
        assert f"[{h2.addr}]:{h2.port} " not in cluster.known_hosts.read_text()
        fixed = doctor(cluster, inv, "--accept-new-host-keys")
        assert fixed.code == ExitCode.OK, fixed.explain()
        assert new_key in cluster.known_hosts.read_text()
    finally:
        cluster.known_hosts.write_text(before)  # the session cluster's, for the next tests


# ----------------------------------------------------------------- rendezvous


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_rendezvous_port_taken(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    port = free_port()
    inv = healthy(cluster, tmp_path, free_port(), [1, 2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen()
        result = doctor(cluster, inv, "--port", str(port))
        message, fix = problem(result.out, "h1", "port")
        holders = run_fix(fix_command(fix, "ss -ltnp")).stdout
        assert f":{port} " in holders and f"pid={os.getpid()}," in holders, holders
        picked = doctor(cluster, inv, "--port", "auto")  # the other fix
        assert picked.code == ExitCode.OK, picked.explain()
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h1", "port")}, result.out
    assert f"rendezvous port {port} is taken" in message
    assert "--port auto" in fix and f":{port}" in fix
    # the connects reached the port's holder, not a rendezvous: no verdict on them
    assert [row["rdzv"] for row in table(result.out).values()] == ["-", "-"]


def test_supervisor_port_taken(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    port = free_port()
    inv = healthy(cluster, tmp_path, free_port(), [1, 2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        try:
            holder.bind(("0.0.0.0", port + 1))
        except OSError:
            pytest.fail(f"port {port + 1} was not free for the test")
        holder.listen()
        result = doctor(cluster, inv, "--port", str(port))
        message, fix = problem(result.out, "h1", "port")
        holders = run_fix(fix_command(fix, "ss -ltnp")).stdout
        assert f":{port + 1} " in holders and f"pid={os.getpid()}," in holders, holders
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h1", "port")}, result.out
    assert f"port {port + 1}" in message and "supervisors" in message


def test_rendezvous_unreachable(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    """A rendezvous address where nothing listens: every host fails to connect.

    The first host's probe listens on every IPv4 address, so any 127.x address would
    connect; ``::1`` is loopback too but IPv6, where nothing listens on that port.
    """
    port = free_port()
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.bind(("::1", port))  # proves the port is free on ::1 (and IPv6 loopback works)
    inv = inventory(tmp_path, [("h1", None), ("h2", None)], port, rdzv_host="::1")
    result = doctor(cluster, inv)
    assert_clean_failure(result, ExitCode.CHECK_FAILED)
    assert failing(result.out) == {("h1", "rdzv"), ("h2", "rdzv")}, result.out
    message, fix = problem(result.out, "h2", "rdzv")
    assert f"cannot connect to the rendezvous [::1]:{port}" in message
    assert "refused" in message.lower()
    assert str(port) in fix
    assert f"`rendezvous.host` is ::1 in {inv}" in fix and "or delete it" in fix
    assert table(result.out)["h1"]["port"] == "ok"
    fixed = doctor(cluster, inventory(tmp_path, [("h1", None), ("h2", None)], port))
    assert fixed.code == ExitCode.OK, fixed.explain()


# ----------------------------------------------------------------- bad input


INVENTORY_ERRORS = [
    ("empty.yaml", "", "the inventory is empty"),
    ("notyaml.yaml", "hosts: [a, b\n", ":2:"),
    ("unknown.yaml", "hosts:\n  - host: h1\n    gpu: 2\n", ":3: hosts[0].gpu: unknown key"),
    ("type.yaml", "hosts:\n  - host: h1\n    gpus: many\n", ":3: hosts[0].gpus: expected"),
    ("dup.yaml", "hosts:\n  - h1\n  - h2\n  - h1\n", ":4: hosts[2]: host 'h1' is listed twice"),
    ("inject.yaml", "hosts:\n  - 'h1;rm -rf ~'\n", ":2: hosts[0]: expected a host name"),
    ("tab.yaml", "hosts:\n\t- h1\n", ":2:"),
]


@pytest.mark.parametrize(("name", "text", "needle"), INVENTORY_ERRORS)
def test_inventory_errors(
    cluster: SshdCluster, tmp_path: Path, name: str, text: str, needle: str
) -> None:
    inv = write(tmp_path, text, name)
    result = doctor(cluster, inv)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"sshddp: error: {inv}" in result.err
    assert needle in result.err, result.explain()
    assert result.out == ""


def test_inventory_not_found(cluster: SshdCluster, tmp_path: Path) -> None:
    result = doctor(cluster, tmp_path / "nope.yaml")
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{tmp_path / 'nope.yaml'}: inventory file not found" in result.err


def test_inventory_is_a_directory(cluster: SshdCluster, tmp_path: Path) -> None:
    result = doctor(cluster, tmp_path)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"{tmp_path}: is a directory" in result.err


def test_ssh_config_not_found(tmp_path: Path) -> None:
    inv = write(tmp_path, "hosts: [h1]\n")
    result = sshddp(["doctor", "--ssh-config", "/nonexistent", str(inv)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "--ssh-config /nonexistent: no such file" in result.err


def test_ssh_config_from_the_environment(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSHDDP_SSH_CONFIG is read like --ssh-config (a wrong one is refused the same way)."""
    inv = healthy(ssh_env, tmp_path, free_port(), [1])
    found = sshddp(["doctor", str(inv)])
    assert found.code == ExitCode.OK, found.explain()
    monkeypatch.setenv("SSHDDP_SSH_CONFIG", str(tmp_path / "missing_config"))
    result = sshddp(["doctor", str(inv)])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "missing_config: no such file" in result.err
