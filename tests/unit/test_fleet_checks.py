"""Pure fleet checks (env, net, unique, clock, imports) and the fixes meant to be pasted,
from hand-built probe facts: what breaks a multi-node run before it starts."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest

from sshddp import defaults
from sshddp.model import rankenv
from sshddp.model.checks import (
    Context,
    Finding,
    HostFacts,
    HostReport,
    Status,
    evaluate,
    pip_install,
    reaches,
    torch_requirement,
)
from sshddp.model.imports import ScriptImports
from sshddp.model.inventory import Host, parse_inventory

PORT = 29500
ADDR = "10.0.0.1"
CTX = Context(rdzv_addr=ADDR, rdzv_port=PORT, inventory="inv.yaml")
UUIDS = ["GPU-aaaa-0", "GPU-aaaa-1", "GPU-aaaa-2", "GPU-aaaa-3"]


def net(dev: str = "eth0", mtu: int = 1500, addr: str = "10.0.0.2/24", **more: Any) -> Any:
    """What remote/calls/network.py reports for a host reaching node 0 by ``dev``."""
    interfaces = {
        "lo": {"mtu": 65536, "up": True, "addrs": ["127.0.0.1/8", "::1/128"]},
        dev: {"mtu": mtu, "up": True, "addrs": [addr]},
        "docker0": {"mtu": 1500, "up": True, "addrs": ["172.17.0.1/16"]},
    }
    interfaces.update(more.pop("interfaces", {}))
    return {
        "method": "ip",
        "target": ADDR,
        "route": {"dev": dev, "src": addr.split("/")[0], "local": False},
        "interfaces": interfaces,
        "routes": [{"dst": "10.0.0.0/24", "dev": dev}, {"dst": "172.17.0.0/16", "dev": "docker0"}],
        **more,
    }


def facts(**more: Any) -> dict[str, Any]:
    """A healthy CPU host's probe facts, plus what the coordinator adds (ssh, clock)."""
    base: dict[str, Any] = {
        "hostname": "node",
        "python": {"version": "3.11.7", "executable": "/opt/venv/bin/python"},
        "cuda_visible_devices": None,
        "login_env": {},
        "disk": {"path": "/home/u/.sshddp", "free_bytes": 500 << 30},
        "torch": {"version": "2.4.1", "cuda": None, "device_count": 0},
        "nvidia_smi": None,
        "gpu_dev_count": None,
        "net": net(),
        "clock": {"offset": 0.002, "rtt": 0.001},
    }
    base.update(more)
    return base


def gpu_smi(uuids: list[str]) -> dict[str, Any]:
    gpus = [{"name": "H100", "memory_mib": 81559, "driver": "550", "uuid": u} for u in uuids]
    return {"gpus": gpus, "processes": [], "error": None}


def host(i: int, **kw: Any) -> Host:
    kw.setdefault("nproc", 2)
    return Host(host=f"n{i}", index=i, line=4 + 2 * i, python="/opt/venv/bin/python", **kw)


def run(*hosts: tuple[Host, Optional[dict[str, Any]]], ctx: Context = CTX) -> list[HostReport]:
    return evaluate([HostFacts(h, f) for h, f in hosts], ctx)


def find(reports: list[HostReport], index: int, check: str) -> Finding:
    f = reports[index].get(check)
    assert f is not None, (check, reports[index].findings)
    return f


def fix_commands(fix: str) -> list[str]:
    """The commands a fix gives in backticks."""
    return fix.split("`")[1::2]


# ----------------------------------------------------------------- env


def test_node_rank_from_the_inventory_fails_where_it_is_wrong() -> None:
    env = {"NODE_RANK": "0"}
    reports = run((host(0, env=env), facts()), (host(1, env=env), facts()))
    first, second = find(reports, 0, "env"), find(reports, 1, "env")
    assert first.status is Status.WARN  # right by chance on node 0, still not ours to set
    assert second.status is Status.FAIL
    assert "NODE_RANK='0' (from the inventory's env) reaches node 1's ranks" in second.message
    assert "--node-rank 1" in second.message
    assert second.fix.startswith(
        "delete NODE_RANK from `env:` of hosts[1] (n1, line 6 of inv.yaml)"
    )


def test_rank_variables_torchrun_sets_warn_naming_where_they_come_from() -> None:
    login = {"RANK": "3", "MASTER_ADDR": "10.9.9.9", "TORCHELASTIC_RUN_ID": "x", "HOME": "/h"}
    reports = run((host(0), facts(login_env=login)))
    f = find(reports, 0, "env")
    assert f.status is Status.WARN
    assert "RANK='3' (from n0's login environment): torchrun sets RANK" in f.message
    assert "MASTER_ADDR='10.9.9.9'" in f.message and "TORCHELASTIC_RUN_ID='x'" in f.message
    assert "HOME" not in f.message
    assert "unset RANK in n0's login environment" in f.fix and "SetEnv" in f.fix


def test_env_values_given_with_env_are_masked_and_the_fix_drops_them() -> None:
    ctx = Context(ADDR, PORT, cli_env=(("NODE_RANK", "5"),), secret_names=frozenset({"NODE_RANK"}))
    f = find(run((host(0), facts()), ctx=ctx), 0, "env")
    assert f.status is Status.FAIL
    assert "NODE_RANK=*** (from --env)" in f.message and "5" not in f.message
    assert f.fix == "drop `--env NODE_RANK` from the command line"


def test_cli_env_wins_over_inventory_env_over_login() -> None:
    merged = rankenv.ranks_env({"RANK": "1"}, {"RANK": "2"}, {"RANK": "3"})
    assert merged["RANK"] == rankenv.EnvValue("RANK", "3", "--env")
    merged = rankenv.ranks_env({"RANK": "1", "PATH": "/bin"}, {"RANK": "2"}, {})
    assert merged == {"RANK": rankenv.EnvValue("RANK", "2", "inventory")}


def test_clean_environment_is_ok() -> None:
    f = find(run((host(0), facts(login_env={"NCCL_SOCKET_IFNAME": "eth0"}))), 0, "env")
    assert f.status is Status.OK


@pytest.mark.parametrize(
    ("value", "uuids", "left"),
    [
        ("0", UUIDS, 1),
        ("0,1,2,3", UUIDS, 4),
        ("", UUIDS, 0),
        ("-1", UUIDS, 0),
        ("1,7,2", UUIDS, 1),  # CUDA stops at the first index past the last GPU
        ("2,2", UUIDS, 1),
        ("GPU-aaaa-3,0", UUIDS, 2),
        ("GPU-aaaa", UUIDS, 0),  # an ambiguous UUID prefix names no GPU
        ("0,1", None, 2),
        ("0,x,1", None, 1),
    ],
)
def test_visible_gpus_reads_cuda_visible_devices_as_cuda_does(
    value: str, uuids: Optional[list[str]], left: int
) -> None:
    assert len(rankenv.visible_gpus(value, uuids)) == left


def test_cuda_visible_devices_hiding_gpus_fails_with_the_count_it_leaves() -> None:
    gpu_host = host(0, gpus=4, nproc=None, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    f = find(run((gpu_host, facts(nvidia_smi=gpu_smi(UUIDS)))), 0, "env")
    assert f.status is Status.FAIL
    assert "CUDA_VISIBLE_DEVICES='0,1' (from the inventory's env) leaves 2 GPU(s)" in f.message
    assert "expects 4 (gpus: 4)" in f.message
    assert "delete CUDA_VISIBLE_DEVICES from `env:` of hosts[0]" in f.fix
    assert "or set `gpus: 2` for hosts[0]" in f.fix


def test_cuda_visible_devices_counts_without_knowing_the_gpus() -> None:
    """No GPU probe at all (a launch preflight, or no driver): the value alone counts."""
    gpu_host = host(0, gpus=2, nproc=None)
    f = find(run((gpu_host, facts(login_env={"CUDA_VISIBLE_DEVICES": "0"}))), 0, "env")
    assert f.status is Status.FAIL and "leaves 1 GPU(s)" in f.message
    assert "login environment" in f.fix


def test_cuda_visible_devices_on_a_cpu_host_is_no_matter() -> None:
    f = find(run((host(0, env={"CUDA_VISIBLE_DEVICES": ""}), facts())), 0, "env")
    assert f.status is Status.OK


# ----------------------------------------------------------------- net


@pytest.mark.parametrize(
    ("spec", "selected"),
    [
        ("eth", ["eth0", "eth1", "eth10"]),
        ("=eth1", ["eth1"]),
        ("eth1", ["eth1", "eth10"]),
        ("^docker,lo", ["eth0", "eth1", "eth10", "ib0"]),
        ("^=eth1", ["lo", "eth0", "eth10", "docker0", "ib0"]),
        ("ib0:5000,eth0", ["eth0", "ib0"]),
        ("eth9", []),
    ],
)
def test_nccl_socket_ifname_syntax(spec: str, selected: list[str]) -> None:
    names = ["lo", "eth0", "eth1", "eth10", "docker0", "ib0"]
    assert rankenv.nccl_interfaces(spec, names) == selected


def test_gloo_socket_ifname_is_exact_names() -> None:
    assert rankenv.gloo_interfaces("eth0, ib0") == ["eth0", "ib0"]


def test_interface_that_does_not_exist_fails_with_the_per_host_env_that_fixes_it() -> None:
    reports = run(
        (host(0), facts()),
        (host(1, env={"NCCL_SOCKET_IFNAME": "eth9"}), facts(net=net(dev="ens5"))),
    )
    assert find(reports, 0, "net").status is Status.OK
    f = find(reports, 1, "net")
    assert f.status is Status.FAIL
    assert f.message == (
        "NCCL_SOCKET_IFNAME='eth9' (from the inventory's env) matches no interface of n1 with "
        "an address (it has docker0, ens5, lo)"
    )
    assert f.fix == (
        "under `env:` of hosts[1] (n1, line 6 of inv.yaml), set `NCCL_SOCKET_IFNAME: ens5` "
        "(the interface n1 reaches node 0 by)"
    )


def test_gloo_interface_missing_is_named_unless_the_value_is_secret() -> None:
    ctx = Context(ADDR, PORT, cli_env=(("GLOO_SOCKET_IFNAME", "eth0,ib0"),))
    f = find(run((host(0), facts()), ctx=ctx), 0, "net")
    assert f.status is Status.FAIL
    assert "names ib0, which n0 does not have" in f.message
    secret = Context(
        ADDR, PORT, cli_env=ctx.cli_env, secret_names=frozenset({"GLOO_SOCKET_IFNAME"})
    )
    f = find(run((host(0), facts()), ctx=secret), 0, "net")
    assert "GLOO_SOCKET_IFNAME=*** (from --env) names an interface, which n0" in f.message
    assert "ib0" not in f.message
    assert f.fix.startswith("drop `--env GLOO_SOCKET_IFNAME` (it sets every host alike) and, ")


def test_interface_without_a_route_to_node_0_fails() -> None:
    f = find(run((host(0, env={"GLOO_SOCKET_IFNAME": "docker0"}), facts())), 0, "net")
    assert f.status is Status.FAIL
    assert "selects docker0 on n0, which has no route to node 0's address 10.0.0.1" in f.message
    assert "`GLOO_SOCKET_IFNAME: eth0`" in f.fix


def test_nccl_exclusion_leaving_a_routed_interface_is_ok() -> None:
    f = find(run((host(0, env={"NCCL_SOCKET_IFNAME": "^docker,lo"}), facts())), 0, "net")
    assert f.status is Status.OK
    assert (
        f.message
        == "eth0 (10.0.0.2, MTU 1500) reaches 10.0.0.1; NCCL_SOCKET_IFNAME='^docker,lo' selects it"
    )


def test_different_interface_names_without_the_variables_warn_on_the_odd_host() -> None:
    reports = run((host(0), facts()), (host(1), facts()), (host(2), facts(net=net(dev="ens5"))))
    assert [find(reports, i, "net").status for i in range(3)] == [Status.OK, Status.OK, Status.WARN]
    f = find(reports, 2, "net")
    assert "n2 reaches node 0 by ens5, most hosts by eth0" in f.message
    assert "`NCCL_SOCKET_IFNAME: ens5` and `GLOO_SOCKET_IFNAME: ens5`" in f.fix
    assert "hosts[2] (n2, line 8 of inv.yaml)" in f.fix


def test_different_names_with_the_variables_set_are_fine() -> None:
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    reports = run(
        (host(0, env=env), facts()),
        (host(1, env={"NCCL_SOCKET_IFNAME": "ens5"}), facts(net=net(dev="ens5"))),
    )
    assert find(reports, 1, "net").status is Status.OK


def test_mtu_mismatch_warns() -> None:
    reports = run((host(0), facts()), (host(1), facts()), (host(2), facts(net=net(mtu=9000))))
    f = find(reports, 2, "net")
    assert f.status is Status.WARN and "MTU 9000 on eth0" in f.message and "1500" in f.message
    assert fix_commands(f.fix) == ["sudo ip link set dev eth0 mtu 1500"]


def test_unresolvable_rendezvous_address_fails() -> None:
    broken = {"target": None, "error": "cannot resolve gpu-a: Name or service not known"}
    f = find(run((host(0), facts(net=broken))), 0, "net")
    assert f.status is Status.FAIL and "cannot resolve gpu-a" in f.message
    assert "/etc/hosts" in f.fix


def test_reaches_by_subnet_default_route_and_loopback() -> None:
    facts_ = net()
    facts_["interfaces"]["ib0"] = {"mtu": 4092, "up": False, "addrs": ["10.0.0.7/24"]}
    assert reaches(facts_, "eth0", ADDR)
    assert not reaches(facts_, "docker0", ADDR)
    assert not reaches(facts_, "ib0", ADDR)  # down
    assert reaches(facts_, "lo", "127.0.0.41")
    facts_["routes"].append({"dst": "default", "dev": "docker0"})
    assert reaches(facts_, "docker0", ADDR)


# ----------------------------------------------------------------- unique


def ssh(key: Optional[str], endpoint: str) -> dict[str, Any]:
    return {"host_key": key, "endpoint": endpoint}


def test_two_entries_reaching_one_sshd_fail_naming_both() -> None:
    one = ssh("ssh-ed25519 SHA256:abc", "127.0.0.41:2222")
    reports = run(
        (host(0), facts(ssh=one)),
        (host(1), facts(ssh=ssh("ssh-ed25519 SHA256:def", "127.0.0.42:2222"))),
        (host(2), facts(ssh=one)),
    )
    assert find(reports, 1, "unique").status is Status.OK
    for i in (0, 2):
        f = find(reports, i, "unique")
        assert f.status is Status.FAIL
        assert f.message.startswith(
            "hosts[0] (n0, line 4 of inv.yaml) and hosts[2] (n2, line 8 of inv.yaml) are one "
            "machine (the same host key ssh-ed25519 SHA256:abc; the same address and port "
            "127.0.0.41:2222)"
        )
        assert "Duplicate GPU detected" in f.message
        assert f.fix.startswith("list each machine once: delete hosts[2] (n2, line 8 of inv.yaml)")
        assert "ssh-keygen -A" not in f.fix


def test_same_host_key_alone_mentions_cloned_machines() -> None:
    reports = run(
        (host(0), facts(ssh=ssh("k SHA256:same", "10.0.0.1:22"))),
        (host(1), facts(ssh=ssh("k SHA256:same", "10.0.0.2:22"))),
    )
    f = find(reports, 1, "unique")
    assert f.status is Status.FAIL and "ssh-keygen -A" in f.fix


def test_shared_gpus_fail_unless_cuda_visible_devices_splits_them() -> None:
    def gpu_host(i: int, cvd: Optional[str] = None) -> Host:
        env = {"CUDA_VISIBLE_DEVICES": cvd} if cvd is not None else {}
        return host(i, gpus=2, nproc=None, env=env)

    smi = gpu_smi(UUIDS)
    a = facts(ssh=ssh("k1", "10.0.0.1:22"), nvidia_smi=smi)
    b = facts(ssh=ssh("k2", "10.0.0.2:2222"), nvidia_smi=smi)  # a container on the same box
    shared = run((gpu_host(0), a), (gpu_host(1), b))
    f = find(shared, 1, "unique")
    assert f.status is Status.FAIL
    assert "the same GPUs GPU-aaaa-0, GPU-aaaa-1" in f.message
    split = run((gpu_host(0, "0,1"), a), (gpu_host(1, "2,3"), b))
    assert find(split, 1, "unique").status is Status.OK


def test_localhost_and_unreached_hosts_have_no_twin() -> None:
    reports = run((host(0), facts(ssh=ssh(None, "localhost"))), (host(1), None))
    assert find(reports, 0, "unique").status is Status.OK
    assert reports[1].get("unique") is None


# ----------------------------------------------------------------- clock


@pytest.mark.parametrize(
    ("offset", "rtt", "status"),
    [
        (0.2, 0.01, Status.OK),
        (-1.5, 0.01, Status.WARN),
        (1.2, 0.6, Status.OK),  # within the round trip's uncertainty of 1 s: not proven
        (75.0, 0.01, Status.FAIL),
        (-75.0, 0.01, Status.FAIL),
    ],
)
def test_clock_offset_against_the_bounds(offset: float, rtt: float, status: Status) -> None:
    reports = run(
        (host(0), facts()),
        (host(1), facts(clock={"offset": offset, "rtt": rtt})),
        (host(2), facts()),
    )
    f = find(reports, 1, "clock")
    assert f.status is status, f
    side = "ahead of" if offset > 0 else "behind"
    assert side in f.message
    if status is not Status.OK:
        assert "timedatectl set-ntp true" in f.fix and "on n1" in f.fix


def test_every_host_off_alike_blames_this_machine() -> None:
    off = {"offset": -120.0, "rtt": 0.002}
    reports = run((host(0), facts(clock=off)), (host(1), facts(clock=dict(off, offset=-120.3))))
    f = find(reports, 0, "clock")
    assert f.status is Status.FAIL
    assert "this machine's clock is the odd one" in f.fix
    assert defaults.CLOCK_FAIL == 60.0 and defaults.CLOCK_WARN == 1.0


# ----------------------------------------------------------------- imports


def test_missing_module_fails_with_an_install_fix() -> None:
    imp = ScriptImports("train.py", ("torch", "yaml", "helpers"), beside=("helpers",))
    ctx = Context(ADDR, PORT, imports=imp)
    looked = {"found": {"torch": True, "yaml": False, "helpers": False}, "method": "in-process"}
    reports = run((host(0), facts(imports=looked)), ctx=ctx)
    f = find(reports, 0, "imports")
    assert f.status is Status.FAIL
    assert f.message.startswith("train.py imports yaml, helpers, which /opt/venv/bin/python on n0")
    assert "`/opt/venv/bin/python -m pip install pyyaml` on n0" in f.fix
    assert "`--workdir .`" in f.fix


def test_a_missing_torch_import_defers_to_the_pinned_torch_fix() -> None:
    ctx = Context(ADDR, PORT, imports=ScriptImports("t.py", ("torch",)))
    looked = {"found": {"torch": False}}
    f = find(run((host(0), facts(torch=None, imports=looked)), ctx=ctx), 0, "imports")
    assert f.status is Status.FAIL
    assert f.fix == "install torch as the torch check says (the other hosts' build)"
    assert "pip install torch" not in f.fix  # never an unpinned torch


def test_imports_found_everywhere_pass() -> None:
    ctx = Context(ADDR, PORT, imports=ScriptImports("t.py", ("json",), shipped=("models",)))
    f = find(run((host(0), facts(imports={"found": {"json": True}})), ctx=ctx), 0, "imports")
    assert (f.status, f.message) == (Status.OK, "1 module(s) found")


def test_imports_not_looked_for_or_unreadable_are_skipped() -> None:
    ctx = Context(ADDR, PORT, imports=ScriptImports("t.py", ("json",)))
    assert find(run((host(0), facts()), ctx=ctx), 0, "imports").status is Status.SKIP
    bad = Context(ADDR, PORT, imports=ScriptImports("t.py", (), error="t.py:3: does not parse"))
    f = find(run((host(0), facts()), ctx=bad), 0, "imports")
    assert f.status is Status.SKIP and "does not parse" in f.message
    assert run((host(0), facts()))[0].get("imports") is None


# ----------------------------------------------------------------- fixes that paste


@pytest.mark.parametrize(
    ("version", "requirement"),
    [
        ("2.4.1", "torch==2.4.1"),
        ("2.13.0+cpu", "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"),
        ("2.4.1+cu121", "torch==2.4.1 --index-url https://download.pytorch.org/whl/cu121"),
        ("2.5.0+rocm6.2", "torch==2.5.0 --index-url https://download.pytorch.org/whl/rocm6.2"),
        ("2.5.0+local", "torch==2.5.0+local"),
        (None, "torch"),
        ("unknown", "torch"),
    ],
)
def test_torch_requirement_is_installable_as_written(
    version: Optional[str], requirement: str
) -> None:
    assert torch_requirement(version) == requirement


def test_pip_install_makes_pip_first_when_it_is_missing() -> None:
    h = Host("n0", 0, python="~/venv/bin/python")
    assert (
        pip_install(HostFacts(h, {}), "torch") == "`~/venv/bin/python -m pip install torch` on n0"
    )
    no_pip = HostFacts(h, {"pip": {"pip": False, "ensurepip": True}})
    assert fix_commands(pip_install(no_pip, "torch")) == [
        "~/venv/bin/python -m ensurepip --upgrade && ~/venv/bin/python -m pip install torch"
    ]
    bare = HostFacts(h, {"pip": {"pip": False, "ensurepip": False}})
    assert "sudo apt install python3-pip" in pip_install(bare, "torch")


def test_cpu_host_with_gpus_suggests_nproc() -> None:
    f = find(run((host(0, gpus=2, nproc=None), facts())), 0, "gpus")
    assert f.status is Status.FAIL
    assert "`nproc: 2` in place of `gpus: 2` in hosts[0] (n0, line 4 of inv.yaml)" in f.fix


def test_rendezvous_failure_names_rendezvous_host_when_it_was_set() -> None:
    bad = facts(rendezvous={"ok": False, "addr": "::1", "port": PORT, "error": "refused"})
    ctx = Context("::1", PORT, inventory="inv.yaml", rdzv_host_set=True)
    f = find(run((host(0), bad), ctx=ctx), 0, "rdzv")
    assert "`rendezvous.host` is ::1 in inv.yaml" in f.fix
    f = find(run((host(0), bad)), 0, "rdzv")
    assert "rendezvous.host" not in f.fix and "`addr:` of the first host" in f.fix


def test_auto_port_reports_the_pick() -> None:
    ctx = Context(ADDR, defaults.AUTO_PORT)
    picked = facts(port={"port": 29502, "free": True, "peer_free": True, "auto": 29500})
    f = find(run((host(0), picked), ctx=ctx), 0, "port")
    assert (f.status, f.message) == (
        Status.OK,
        "picked ports 29502 and 29503; 29500-29501 were taken",
    )
    none = facts(port={"port": None, "free": False, "error": "no free pair", "auto": 29500})
    f = find(run((host(0), none), ctx=ctx), 0, "port")
    assert f.status is Status.FAIL and "--port N" in f.fix


def test_taken_port_suggests_auto() -> None:
    taken = facts(port={"port": PORT, "free": False, "error": "Address already in use"})
    f = find(run((host(0), taken)), 0, "port")
    assert fix_commands(f.fix) == ["--port auto", f"ss -ltnp 'sport = :{PORT}'"]


def test_fleet_checks_leave_the_facts_alone() -> None:
    hosts = [HostFacts(host(0, env={"NODE_RANK": "1"}), facts()), HostFacts(host(1), facts())]
    before = copy.deepcopy([h.facts for h in hosts])
    evaluate(hosts, CTX)
    assert [h.facts for h in hosts] == before


def test_a_fix_of_gpus_given_under_defaults_names_the_defaults_line() -> None:
    text = "defaults:\n  python: /opt/venv/bin/python\n  gpus: 2\n"
    text += "hosts:\n  - n0\n  - host: n1\n    gpus: 4\n"
    n0, n1 = parse_inventory(text, "inv.yaml").hosts
    none = find(run((n0, facts()), (n1, facts())), 0, "gpus")
    assert "`nproc: 2` in place of `gpus: 2` in `defaults:` (line 3 of inv.yaml)" in none.fix
    own = find(run((n0, facts()), (n1, facts())), 1, "gpus")
    assert "in hosts[1] (n1, line 6 of inv.yaml)" in own.fix and "defaults" not in own.fix
    fewer = facts(nvidia_smi=gpu_smi(["GPU-a"]), torch={"version": "2.4.1", "device_count": 1})
    one = find(run((n0, fewer), (n1, facts())), 0, "gpus")
    assert one.fix.startswith("set `gpus: 1` for `defaults:` (line 3 of inv.yaml)")
