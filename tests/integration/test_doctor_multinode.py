"""What breaks multi-node runs, caught by ``sshddp doctor`` and the launch preflight on real
sshd hosts: an interface variable naming a missing interface, stray rank variables (from
the inventory, from sshd's own ``SetEnv``), ``CUDA_VISIBLE_DEVICES`` hiding GPUs, two
entries that are one sshd, a module one host cannot import, a shifted clock, and a port
picked with ``--port auto`` while the default one is taken. Each fix is applied and doctor
passes afterwards.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from doctor_helpers import Port, doctor, failing, fix_commands, problem, table, write
from launch_helpers import launch, run_id_of, sshddp, write_inventory

from sshddp import defaults
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

FAKETIME_GLOB = "/usr/lib/*/faketime/libfaketime.so.1"  # Debian's libfaketime


def inv_text(hosts: list[dict[str, Any]], port: int, **defaults_: Any) -> str:
    doc = {
        "defaults": {"python": sys.executable, "nproc": 1, **defaults_},
        "rendezvous": {"port": port},
        "hosts": hosts,
    }
    return str(yaml.safe_dump(doc, sort_keys=False))


# ----------------------------------------------------------------- interfaces


def test_interface_variable_naming_a_missing_interface(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    port = free_port()
    bad = [{"host": "h1"}, {"host": "h2", "env": {"NCCL_SOCKET_IFNAME": "eth9"}}]
    inv = write(tmp_path, inv_text(bad, port))
    result = doctor(cluster, inv)
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h2", "net")}, result.out
    message, fix = problem(result.out, "h2", "net")
    assert "NCCL_SOCKET_IFNAME='eth9' (from the inventory's env) matches no interface" in message
    assert "of h2 with an address (it has " in message and "lo" in message
    assert f"under `env:` of hosts[1] (h2, line 8 of {inv})" in fix
    assert fix_commands(fix) == ["env:", "NCCL_SOCKET_IFNAME: lo"]
    assert table(result.out)["h1"]["net"] == "ok"

    fixed = [{"host": "h1"}, {"host": "h2", "env": {"NCCL_SOCKET_IFNAME": "lo"}}]
    again = doctor(cluster, write(tmp_path, inv_text(fixed, port)), "--json")
    assert again.code == ExitCode.OK, again.explain()
    net = {h["host"]: h["findings"] for h in json.loads(again.out)["hosts"]}
    (h2,) = [f for f in net["h2"] if f["check"] == "net"]
    assert h2["message"] == (
        f"lo (127.0.0.1, MTU 65536) reaches {cluster.host(1).addr}; "
        "NCCL_SOCKET_IFNAME='lo' selects it"
    )


def test_gloo_interface_from_env_option_is_masked(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    """--env values are secrets (never shown); the check still reads them."""
    inv = write(tmp_path, inv_text([{"host": "h1"}, {"host": "h2"}], free_port()))
    result = doctor(cluster, inv, "--env", "GLOO_SOCKET_IFNAME=nosuch0")
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h1", "net"), ("h2", "net")}, result.out
    message, fix = problem(result.out, "h1", "net")
    assert "GLOO_SOCKET_IFNAME=*** (from --env) names an interface, which h1 does not" in message
    assert "nosuch0" not in result.text
    assert fix.startswith("drop `--env GLOO_SOCKET_IFNAME` (it sets every host alike)")
    fixed = doctor(cluster, inv, "--env", "GLOO_SOCKET_IFNAME=lo")
    assert fixed.code == ExitCode.OK, fixed.explain()


# ----------------------------------------------------------------- stray variables


def test_inventory_env_node_rank(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    port = free_port()
    hosts = [{"host": "h1"}, {"host": "h2"}]
    inv = write(tmp_path, inv_text(hosts, port, env={"NODE_RANK": "0"}))
    result = doctor(cluster, inv)
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h2", "env")}, result.out
    message, fix = problem(result.out, "h2", "env")
    assert "NODE_RANK='0' (from the inventory's env) reaches node 1's ranks" in message
    assert "delete NODE_RANK from `env:` of hosts[1]" in fix and "`defaults: env:`" in fix
    warned, _ = problem(result.out, "h1", "env", label="warn")
    assert "sshddp sets the node rank with torchrun's --node-rank" in warned

    fixed = doctor(cluster, write(tmp_path, inv_text(hosts, port)))
    assert fixed.code == ExitCode.OK and "warn" not in fixed.out, fixed.explain()


def test_inventory_env_cuda_visible_devices(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    """This machine has no GPU: the count CUDA_VISIBLE_DEVICES leaves is read from the
    value; the gpus check's own fix (a CPU host: nproc) makes doctor pass."""
    port = free_port()
    hosts = [{"host": "h1"}, {"host": "h2", "gpus": 2, "env": {"CUDA_VISIBLE_DEVICES": "0"}}]
    inv = write(tmp_path, inv_text(hosts, port))
    result = doctor(cluster, inv)
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h2", "env"), ("h2", "gpus")}, result.out
    message, fix = problem(result.out, "h2", "env")
    assert "CUDA_VISIBLE_DEVICES='0' (from the inventory's env) leaves 1 GPU(s)" in message
    assert "the inventory expects 2 (gpus: 2)" in message
    assert "delete CUDA_VISIBLE_DEVICES from `env:` of hosts[1]" in fix
    _, gpus_fix = problem(result.out, "h2", "gpus")
    assert "`nproc: 2` in place of `gpus: 2`" in gpus_fix

    fixed_hosts = [{"host": "h1"}, {"host": "h2", "nproc": 2}]  # both fixes applied
    fixed = doctor(cluster, write(tmp_path, inv_text(fixed_hosts, port)))
    assert fixed.code == ExitCode.OK, fixed.explain()


def test_stray_variable_from_sshd_setenv(
    make_cluster: Callable[..., SshdCluster], tmp_path: Path, free_port: Port
) -> None:
    """h2's sshd sets NODE_RANK and MASTER_PORT in every session (its own SetEnv)."""
    cluster = make_cluster(2, extra_config={2: ["SetEnv NODE_RANK=0 MASTER_PORT=1234"]})
    inv = write(tmp_path, cluster.inventory_yaml(nproc=1, rdzv_port=free_port()))
    result = doctor(cluster, inv)
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h2", "env")}, result.out
    message, fix = problem(result.out, "h2", "env")
    assert "NODE_RANK='0' (from h2's login environment) reaches node 1's ranks" in message
    assert "MASTER_PORT='1234' (from h2's login environment): torchrun sets MASTER_PORT" in message
    assert "unset MASTER_PORT in h2's login environment" in fix and "SetEnv" in fix
    assert table(result.out)["h1"]["env"] == "ok"

    cluster.set_extra_config(2, [])  # the fix: h2's sshd no longer sets them
    fixed = doctor(cluster, inv)
    assert fixed.code == ExitCode.OK, fixed.explain()


# ----------------------------------------------------------------- one machine twice


def test_two_aliases_of_one_sshd(cluster: SshdCluster, tmp_path: Path, free_port: Port) -> None:
    blocks = cluster.ssh_config.read_text().split("\n\n")
    h1 = next(b for b in blocks if b.startswith("Host h1\n"))
    config = write(tmp_path, "\n\n".join([*blocks, h1.replace("Host h1\n", "Host h1b\n")]), "cfg")
    port = free_port()
    inv = write(tmp_path, inv_text([{"host": "h1"}, {"host": "h2"}, {"host": "h1b"}], port))
    result = doctor(cluster, inv, config=config)
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h1", "unique"), ("h1b", "unique")}, result.out
    key = (cluster.host_key(1).parent / "host_ed25519.pub").read_text().split()
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", str(cluster.host_key(1)) + ".pub"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    h1_ = cluster.host(1)
    for host in ("h1", "h1b"):
        message, fix = problem(result.out, host, "unique")
        assert message.endswith(
            f"hosts[0] (h1, line 7 of {inv}) and hosts[2] (h1b, line 9 of {inv}) are one "
            f"machine (the same host key {key[0]} {fingerprint}; the same address and port "
            f"{h1_.addr}:{h1_.port}): the ranks of both would share its GPUs (NCCL: "
            "'Duplicate GPU detected')"
        )
        assert fix.startswith(f"list each machine once: delete hosts[2] (h1b, line 9 of {inv})")
    assert table(result.out)["h2"]["unique"] == "ok"

    fixed = doctor(cluster, write(tmp_path, inv_text([{"host": "h1"}, {"host": "h2"}], port)))
    assert fixed.code == ExitCode.OK, fixed.explain()


# ----------------------------------------------------------------- imports


def test_module_only_one_hosts_environment_finds(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    """train.py imports a module that h1's ranks find through PYTHONPATH in its inventory
    env and h2's do not."""
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "sshddp_extra_mod.py").write_text("VALUE = 1\n")
    script = write(tmp_path, "import os\nimport sshddp_extra_mod\n", "train.py")
    port = free_port()
    with_path = {"PYTHONPATH": str(extra)}
    hosts = [{"host": "h1", "env": with_path}, {"host": "h2"}]
    inv = write(tmp_path, inv_text(hosts, port))
    result = doctor(cluster, inv, "--script", str(script))
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    assert failing(result.out) == {("h2", "imports")}, result.out
    message, fix = problem(result.out, "h2", "imports")
    assert message.endswith(
        f"{script} imports sshddp_extra_mod, which {sys.executable} on h2 does not find "
        "(with the ranks' environment)"
    )
    assert f"`{sys.executable} -m pip install sshddp_extra_mod` on h2" in fix
    assert "`PYTHONPATH:` under the host's `env:`" in fix

    fixed_hosts = [{"host": "h1", "env": with_path}, {"host": "h2", "env": with_path}]
    fixed = doctor(cluster, write(tmp_path, inv_text(fixed_hosts, port)), "--script", str(script))
    assert fixed.code == ExitCode.OK, fixed.explain()


def test_module_beside_the_script_is_shipped_only_with_workdir(
    cluster: SshdCluster, tmp_path: Path, free_port: Port
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "sshddp_helper_mod.py").write_text("")
    script = write(code, "import sshddp_helper_mod\n", "train.py")
    inv = write(tmp_path, inv_text([{"host": "h1"}, {"host": "h2"}], free_port()))
    result = doctor(cluster, inv, "--script", str(script))
    assert failing(result.out) == {("h1", "imports"), ("h2", "imports")}, result.out
    _, fix = problem(result.out, "h2", "imports")
    assert f"ship the folder with `--workdir {code}`" in fix
    workdir = fix_commands(fix)[0].split()[1]
    fixed = doctor(cluster, inv, "--script", str(script), "--workdir", workdir)
    assert fixed.code == ExitCode.OK, fixed.explain()
    assert "imports" in table(fixed.out)["h1"]


# ----------------------------------------------------------------- clocks


@pytest.fixture
def faketime() -> Path:
    found = sorted(Path("/").glob(FAKETIME_GLOB.lstrip("/")))
    if not found:
        pytest.fail(f"no {FAKETIME_GLOB}: install Debian's libfaketime (.ci/run does)")
    return found[0]


def test_hosts_with_shifted_clocks(
    make_cluster: Callable[..., SshdCluster], tmp_path: Path, free_port: Port, faketime: Path
) -> None:
    """libfaketime in h2's and h3's sessions (their sshd's SetEnv) moves their clocks.
    It shifts the monotonic clock by as much (a constant offset changes no interval):
    with FAKETIME_DONT_FAKE_MONOTONIC, libfaketime 0.9.10 breaks Python 3.11's sleep."""

    def shifted(offset: str) -> list[str]:
        return [f"SetEnv LD_PRELOAD={faketime} FAKETIME={offset}"]

    cluster = make_cluster(3, extra_config={2: shifted("+5"), 3: shifted("-90")})
    inv = write(tmp_path, cluster.inventory_yaml(nproc=1, rdzv_port=free_port()))
    result = doctor(cluster, inv, "--json")
    assert result.code == ExitCode.CHECK_FAILED, result.explain()
    hosts = {h["host"]: h for h in json.loads(result.out)["hosts"]}
    assert all(h["facts"] for h in hosts.values()), result.out
    clocks = {name: h["facts"]["clock"] for name, h in hosts.items()}
    assert abs(clocks["h1"]["offset"]) < defaults.CLOCK_WARN, clocks
    assert 4 < clocks["h2"]["offset"] < 6 and -91 < clocks["h3"]["offset"] < -89, clocks
    found = {
        name: next(f for f in h["findings"] if f["check"] == "clock") for name, h in hosts.items()
    }
    assert [found[h]["status"] for h in ("h1", "h2", "h3")] == ["ok", "warn", "fail"]
    assert "s ahead of this machine's" in found["h2"]["message"]
    assert "s behind this machine's" in found["h3"]["message"]
    assert "more than 60 s off" in found["h3"]["message"]
    assert "`sudo timedatectl set-ntp true`" in found["h3"]["fix"] and "on h3" in found["h3"]["fix"]

    for i in (2, 3):  # timedatectl cannot run here; what it does, an honest clock, fixes it
        cluster.set_extra_config(i, [])
    fixed = doctor(cluster, inv)
    assert fixed.code == ExitCode.OK, fixed.explain()


def test_a_launch_checks_clocks_from_the_sessions_first_line(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Port,
    faketime: Path,
    run_no_leak: Callable[..., None],
) -> None:
    """A launch's clock check, whose sample is the session's first line (one more round
    trip only for a clock that sample does not prove in sync): h3 90 s behind fails the
    preflight and nothing starts; with h3 set right, h2 5 s ahead is a warning and the run
    goes on. The node launcher runs a script without torch, which libfaketime need not
    meet."""

    def shifted(offset: str) -> list[str]:
        return [f"SetEnv LD_PRELOAD={faketime} FAKETIME={offset}"]

    cluster = make_cluster(3, extra_config={2: shifted("+5"), 3: shifted("-90")})
    inv, workdir = write_inventory(cluster, tmp_path, free_port(), nproc=1)
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('hello from node', os.environ['SSHDDP_NODE_RANK'])\n")
    argv = ["launch", "--launcher", "node", inv, script]

    failed = sshddp(cluster, tmp_path, *argv)
    assert failed.returncode == ExitCode.CHECK_FAILED, failed.stderr
    assert "h3" in failed.stderr and "more than 60 s off" in failed.stderr, failed.stderr
    assert "Traceback" not in failed.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())

    cluster.set_extra_config(3, [])
    ran = sshddp(cluster, tmp_path, *argv)
    assert ran.returncode == ExitCode.OK, ran.stderr
    assert re.search(r"sshddp: warning: h2 clock: clock 5\.\d s ahead", ran.stderr), ran.stderr
    assert "h1 clock" not in ran.stderr and "h3 clock" not in ran.stderr, ran.stderr
    assert [f"hello from node {n}" in ran.stdout for n in range(3)] == [True] * 3, ran.stdout
    run_no_leak(run_id_of(ran.stderr))


# ----------------------------------------------------------------- --port auto


@pytest.fixture
def default_port_taken() -> Iterator[int]:
    """Port 29500 held (by this test, or already by someone else on this machine)."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        holder.bind(("", defaults.RDZV_PORT))
        holder.listen()
    except OSError:
        pass  # taken already: just as good
    try:
        yield defaults.RDZV_PORT
    finally:
        holder.close()


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_doctor_port_auto_with_the_default_port_taken(
    cluster: SshdCluster, tmp_path: Path, default_port_taken: int
) -> None:
    inv = write(tmp_path, inv_text([{"host": "h1"}, {"host": "h2"}], default_port_taken))
    result = doctor(cluster, inv, "--port", "auto", "--json")
    assert result.code == ExitCode.OK, result.explain()
    hosts = json.loads(result.out)["hosts"]
    picked = hosts[0]["facts"]["port"]
    assert picked["free"] and picked["port"] > default_port_taken and picked["auto"] == 29502
    for h in hosts:  # every host connected to the picked port while node 0 held it
        assert h["facts"]["rendezvous"]["ok"] and h["facts"]["rendezvous"]["port"] == picked["port"]
    (port,) = [f for f in hosts[0]["findings"] if f["check"] == "port"]
    assert port["message"].startswith(f"picked ports {picked['port']} and {picked['port'] + 1}")


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_port_auto_never_picks_the_default_pair(cluster: SshdCluster, tmp_path: Path) -> None:
    """Even when 29500 and 29501 are free: a default launch of another user takes them."""
    inv = write(tmp_path, inv_text([{"host": "h1"}], defaults.RDZV_PORT))
    result = doctor(cluster, inv, "--port", "auto", "--json")
    assert result.code == ExitCode.OK, result.explain()
    picked = json.loads(result.out)["hosts"][0]["facts"]["port"]
    assert picked["free"] and picked["port"] >= defaults.RDZV_PORT + 2, picked


@pytest.mark.xdist_group("rdzv-29500")  # port 29500 and --port auto's range: one worker
def test_two_launches_with_port_auto_never_clash(
    ssh_env: SshdCluster, tmp_path: Path, default_port_taken: int, run_no_leak: Any
) -> None:
    """Two runs on the same hosts at once, with the default port taken: node 0 of each
    picks its own pair, holds it until its nodes start, and both runs succeed. The
    chosen port is in the banner, the registry, and the ranks' MASTER_PORT."""
    runs: dict[str, Any] = {}

    def one(name: str) -> None:
        (tmp_path / name).mkdir()
        runs[name] = launch(
            ssh_env,
            tmp_path / name,
            default_port_taken,
            ["env", "MASTER_PORT"],
            opts=["--port", "auto"],
            hosts=[1, 2],
            nproc=1,
        )

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ports = set()
    for run in runs.values():
        assert run.rc == 0, run.stderr
        banner = next(line for line in run.stderr.splitlines() if line.startswith("sshddp: run"))
        port = int(banner.split("rendezvous ")[1].split(",")[0].rsplit(":", 1)[1])
        assert port != default_port_taken
        ports.add(port)
        record = json.loads(
            (
                Path(os.environ["XDG_STATE_HOME"]) / "sshddp" / "runs" / f"{run.run_id}.json"
            ).read_text()
        )
        assert record["rdzv"] == [ssh_env.host(1).addr, port]
        for node in (0, 1):
            (seen,) = [j for j in run.json_lines(node) if "env" in j]
            assert seen["env"] == {"MASTER_PORT": str(port)}
        run_no_leak(run.run_id)
    assert len(ports) == 2, ports


def test_launch_preflight_runs_the_new_checks(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Port, run_no_leak: Any
) -> None:
    """A stray NODE_RANK in the inventory env fails the launch's preflight: exit 3, the
    finding in the table, nothing started: no run named, no run directory on any host."""
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], hosts=[1, 2], env={"NODE_RANK": "0"})
    assert run.rc == ExitCode.CHECK_FAILED, run.stderr
    assert "FAIL h2 env: NODE_RANK='0' (from the inventory's env) reaches node 1's ranks" in (
        run.stderr
    )
    assert "nothing was started" in run.stderr
    assert run.run_id == "", run.stderr  # the banner comes only once the preflight passed
    runs = run.workdir / "runs"
    assert not runs.exists() or not any(runs.iterdir()), list(runs.iterdir())
