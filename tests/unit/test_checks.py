"""Pure checks: hand-built probe facts -> findings, the odd host out flagged with a fix."""

from __future__ import annotations

import copy
from typing import Any, Optional

import pytest

from sshddp.model.checks import (
    CHECKS,
    LOW_DISK,
    Context,
    Finding,
    HostFacts,
    HostReport,
    Status,
    evaluate,
)
from sshddp.model.inventory import Host

PORT = 29500
CTX = Context(rdzv_addr="10.0.0.1", rdzv_port=PORT)


def failures(reports: list[HostReport]) -> list[tuple[Host, Finding]]:
    """Every failing finding, host by host."""
    return [(r.host, f) for r in reports for f in r.findings if f.status is Status.FAIL]


def gpu_facts(
    *,
    python: str = "3.11.7",
    torch: Optional[str] = "2.4.1",
    cuda: Optional[str] = "12.1",
    nccl: Optional[str] = "2.20.5",
    gpus: int = 2,
    model: str = "NVIDIA H100 80GB HBM3",
    driver: str = "550.54.15",
) -> dict[str, Any]:
    """What the probe reports for a healthy GPU host (see remote/calls/probe.py)."""
    torch_facts: Optional[dict[str, Any]] = None
    if torch is not None:
        torch_facts = {
            "version": torch,
            "cuda": cuda,
            "nccl_package": nccl,
            "cuda_available": cuda is not None and gpus > 0,
            "device_count": gpus if cuda else 0,
            "nccl": nccl if cuda else None,
            "gpu_names": [model] * gpus if cuda else [],
            "distributed": True,
        }
    return {
        "hostname": "node",
        "os": "Linux-6.1",
        "python": {"version": python, "executable": "/opt/venv/bin/python"},
        "cuda_visible_devices": None,
        "disk": {"path": "/home/u/.sshddp", "free_bytes": 500 << 30},
        "torch": torch_facts,
        "nvidia_smi": {
            "gpus": [{"name": model, "memory_mib": 81559, "driver": driver}] * gpus,
            "processes": [],
            "error": None,
        },
        "gpu_dev_count": gpus,
        "rendezvous": {"ok": True, "addr": CTX.rdzv_addr, "port": PORT},
    }


def cpu_facts(python: str = "3.11.7", torch: Optional[str] = "2.4.1+cpu") -> dict[str, Any]:
    facts = gpu_facts(python=python, torch=torch, cuda=None, nccl=None, gpus=0)
    facts["nvidia_smi"] = None
    facts["gpu_dev_count"] = None
    return facts


def host(i: int, gpus: Optional[int] = 2, **kw: Any) -> Host:
    return Host(host=f"gpu-{i}", index=i, gpus=gpus, python="/opt/venv/bin/python", **kw)


def hosts_of(*facts: Optional[dict[str, Any]], gpus: Optional[int] = 2) -> list[HostFacts]:
    return [HostFacts(host(i, gpus), f) for i, f in enumerate(facts)]


def finding(reports: list[HostReport], index: int, check: str) -> Finding:
    f = reports[index].get(check)
    assert f is not None, f"no {check!r} finding for host {index}: {reports[index].findings}"
    return f


def statuses(report: HostReport) -> dict[str, Status]:
    return {f.check: f.status for f in report.findings}


def assert_only_failure(reports: list[HostReport], index: int, check: str) -> Finding:
    """Exactly one failing finding in all reports: ``check`` on host ``index``, with a fix."""
    failing = [(h.index, f.check) for h, f in failures(reports)]
    assert failing == [(index, check)], failing
    f = finding(reports, index, check)
    assert f.fix.strip(), f
    assert reports[index].host.host in f.fix or check in ("cuda", "nccl"), f
    return f


def test_healthy_gpu_hosts_pass_every_check() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(), gpu_facts()), CTX)
    assert len(reports) == 3
    for r in reports:
        assert not r.failed
        assert {f.status for f in r.findings} == {Status.OK}, r.findings
        assert all(f.fix == "" for f in r.findings)
        assert [f.check for f in r.findings] == [c for c in CHECKS if r.get(c)]
    assert finding(reports, 0, "gpus").message == "2 GPUs"
    assert finding(reports, 0, "torch").message == "torch 2.4.1"


# ----------------------------------------------------------------- parity


@pytest.mark.parametrize("odd", [0, 1, 2])
def test_python_minor_mismatch_flags_the_odd_host(odd: int) -> None:
    facts = [gpu_facts() for _ in range(3)]
    facts[odd] = gpu_facts(python="3.10.13")
    reports = evaluate(hosts_of(*facts), CTX)
    f = assert_only_failure(reports, odd, "python")
    assert "Python 3.10" in f.message and "3.11" in f.message
    assert "python3.11" in f.fix


def test_python_patch_versions_may_differ() -> None:
    reports = evaluate(hosts_of(gpu_facts(python="3.11.2"), gpu_facts(python="3.11.9")), CTX)
    assert failures(reports) == []


def test_two_hosts_that_differ_flag_the_second() -> None:
    """A tie goes to the earliest host: node 0 is the reference."""
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(torch="2.3.0")), CTX)
    f = assert_only_failure(reports, 1, "torch")
    assert "2.3.0" in f.message and "2.4.1" in f.message
    assert "pip install torch==2.4.1" in f.fix


def test_torch_version_mismatch() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(torch="2.5.0"), gpu_facts()), CTX)
    f = assert_only_failure(reports, 1, "torch")
    assert f.message == "torch 2.5.0; the other hosts have 2.4.1"


def test_torch_missing_says_how_to_install_it() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(torch=None), gpu_facts()), CTX)
    failing = [(h.index, f.check) for h, f in failures(reports)]
    assert (1, "torch") in failing
    assert all(i == 1 for i, _ in failing), failing
    f = finding(reports, 1, "torch")
    assert "not installed" in f.message
    assert "/opt/venv/bin/python -m pip install torch==2.4.1" in f.fix
    assert "gpu-1" in f.fix


def test_torch_that_fails_to_import() -> None:
    broken = gpu_facts()
    broken["torch"]["error"] = "ImportError: libcudart.so.12: cannot open shared object file"
    reports = evaluate(hosts_of(gpu_facts(), broken), CTX)
    f = finding(reports, 1, "torch")
    assert f.status is Status.FAIL
    assert "libcudart" in f.message
    assert "import torch" in f.fix


def test_cuda_version_mismatch() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(), gpu_facts(cuda="11.8")), CTX)
    f = assert_only_failure(reports, 2, "cuda")
    assert "11.8" in f.message and "12.1" in f.message
    assert "+cu" in f.fix


def test_cpu_build_of_torch_among_cuda_builds() -> None:
    """Same version string, but one host has the CPU wheel: torchrun would hang in NCCL."""
    cpu_build = gpu_facts(cuda=None)
    reports = evaluate(hosts_of(gpu_facts(), cpu_build, gpu_facts()), CTX)
    f = finding(reports, 1, "cuda")
    assert f.status is Status.FAIL
    assert "CPU build" in f.message and "12.1" in f.message
    assert f.fix.strip()
    # and the GPUs the inventory promises are not usable by that torch
    assert finding(reports, 1, "gpus").status is Status.FAIL
    assert {h.index for h, _ in failures(reports)} == {1}


def test_nccl_version_mismatch() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(nccl="2.18.1"), gpu_facts()), CTX)
    f = assert_only_failure(reports, 1, "nccl")
    assert "2.18.1" in f.message and "2.20.5" in f.message


def test_cpu_hosts_have_no_cuda_or_nccl_to_compare() -> None:
    reports = evaluate(hosts_of(cpu_facts(), cpu_facts(), gpus=None), CTX)
    assert failures(reports) == []
    for r in reports:
        assert statuses(r)["cuda"] is Status.OK  # "none (CPU build)" on both
        assert statuses(r)["nccl"] is Status.SKIP
        assert statuses(r)["gpu_model"] is Status.SKIP
        gpus = r.get("gpus")
        assert gpus is not None and gpus.message == "CPU host, 1 process(es)"


def test_unreachable_hosts_are_left_out_of_the_reference() -> None:
    facts = hosts_of(gpu_facts(torch="2.3.0"), None, None, gpu_facts(torch="2.3.0"))
    facts[1] = HostFacts(facts[1].host, error="gpu-1: connection refused", hint="start sshd")
    facts[2] = HostFacts(facts[2].host, error="gpu-2: connection refused", hint="start sshd")
    reports = evaluate(facts, CTX)
    assert finding(reports, 0, "torch").status is Status.OK
    assert finding(reports, 3, "torch").status is Status.OK


# ----------------------------------------------------------------- GPUs


def test_fewer_gpus_than_the_inventory_says() -> None:
    reports = evaluate(hosts_of(gpu_facts(gpus=2), gpu_facts(gpus=1), gpus=2), CTX)
    f = finding(reports, 1, "gpus")
    assert f.status is Status.FAIL
    assert f.message == "1 GPUs visible, 2 expected"
    assert "CUDA_VISIBLE_DEVICES" not in f.message
    assert f.fix == "set `gpus: 1` for gpu-1 in the inventory"
    assert finding(reports, 0, "gpus").status is Status.OK


def test_fewer_gpus_because_cuda_visible_devices_is_set() -> None:
    hidden = gpu_facts(gpus=1)
    hidden["cuda_visible_devices"] = "0"
    reports = evaluate(hosts_of(gpu_facts(), hidden), CTX)
    f = finding(reports, 1, "gpus")
    assert f.status is Status.FAIL
    assert "CUDA_VISIBLE_DEVICES='0'" in f.message
    assert "CUDA_VISIBLE_DEVICES" in f.fix and "gpu-1" in f.fix


def test_gpu_host_without_driver() -> None:
    facts = cpu_facts()
    facts["torch"] = gpu_facts()["torch"]
    facts["torch"]["error"] = "RuntimeError: no driver"  # so device_count is not trusted
    reports = evaluate(hosts_of(facts, gpus=2), CTX)
    f = finding(reports, 0, "gpus")
    assert f.status is Status.FAIL
    assert "none found" in f.message
    assert "NVIDIA driver" in f.fix


def test_gpu_count_falls_back_to_nvidia_smi_then_proc() -> None:
    no_torch = gpu_facts(gpus=2)
    no_torch["torch"] = None
    f = finding(evaluate(hosts_of(no_torch), CTX), 0, "gpus")
    assert (f.status, f.message) == (Status.OK, "2 GPUs")
    only_proc = cpu_facts(torch=None)
    only_proc["gpu_dev_count"] = 1
    f = finding(evaluate(hosts_of(only_proc), CTX), 0, "gpus")
    assert (f.status, f.message) == (Status.FAIL, "1 GPUs visible, 2 expected")


def test_gpu_model_mismatch_is_a_warning() -> None:
    reports = evaluate(
        hosts_of(gpu_facts(), gpu_facts(), gpu_facts(model="NVIDIA A100-SXM4-80GB")), CTX
    )
    assert failures(reports) == []
    f = finding(reports, 2, "gpu_model")
    assert f.status is Status.WARN
    assert "A100" in f.message and "H100" in f.message
    assert f.fix.strip()
    assert finding(reports, 0, "gpu_model").status is Status.OK


def test_driver_mismatch_is_a_warning() -> None:
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts(driver="535.104.05")), CTX)
    assert failures(reports) == []
    f = finding(reports, 1, "gpu_model")
    assert f.status is Status.WARN
    assert "driver 535.104.05" in f.message and "550.54.15" in f.message


def test_busy_gpus_warn_naming_the_processes() -> None:
    busy = gpu_facts()
    busy["nvidia_smi"]["processes"] = [{"pid": "4242", "name": "python", "mib": "70000"}]
    reports = evaluate(hosts_of(gpu_facts(), busy), CTX)
    assert failures(reports) == []
    f = finding(reports, 1, "gpus")
    assert f.status is Status.WARN
    assert "4242 (python, 70000 MiB)" in f.message
    assert "gpu-1" in f.fix


# ----------------------------------------------------------------- network


def test_port_taken_on_the_rendezvous_host_fails() -> None:
    first = gpu_facts()
    first["port"] = {"port": PORT, "free": False, "error": "Address already in use"}
    reports = evaluate(hosts_of(first, gpu_facts()), CTX)
    f = assert_only_failure(reports, 0, "port")
    assert f.message == f"rendezvous port {PORT} is taken (Address already in use)"
    assert "--port" in f.fix and f"sport = :{PORT}" in f.fix
    assert reports[1].get("port") is None  # only the rendezvous host listens


def test_port_free() -> None:
    first = gpu_facts()
    first["port"] = {"port": PORT, "free": True, "error": None, "peer_free": True}
    f = finding(evaluate(hosts_of(first), CTX), 0, "port")
    assert (f.status, f.message) == (Status.OK, f"ports {PORT} and {PORT + 1} free")


def test_supervisor_port_taken_fails() -> None:
    first = gpu_facts()
    first["port"] = {
        "port": PORT,
        "free": True,
        "error": None,
        "peer_free": False,
        "peer_error": "Address already in use",
    }
    f = finding(evaluate(hosts_of(first), CTX), 0, "port")
    assert f.status is Status.FAIL
    assert f"port {PORT + 1}" in f.message and "supervisors" in f.message
    assert f"sport = :{PORT + 1}" in f.fix


def test_rendezvous_connect_failure_fails() -> None:
    good, bad = gpu_facts(), gpu_facts()
    good["rendezvous"] = {"ok": True, "addr": "10.0.0.1", "port": PORT}
    bad["rendezvous"] = {"ok": False, "addr": "10.0.0.1", "port": PORT, "error": "timed out"}
    reports = evaluate(hosts_of(good, bad), CTX)
    f = assert_only_failure(reports, 1, "rdzv")
    assert f.message == f"cannot connect to the rendezvous 10.0.0.1:{PORT}: timed out"
    assert str(PORT) in f.fix
    assert finding(reports, 0, "rdzv").message == f"connects to 10.0.0.1:{PORT}"


def test_rendezvous_endpoint_with_ipv6_address_is_bracketed() -> None:
    bad = gpu_facts()
    bad["rendezvous"] = {"ok": False, "addr": "fd00::1", "port": PORT, "error": "refused"}
    ctx = Context(rdzv_addr="fd00::1", rdzv_port=PORT)
    f = finding(evaluate(hosts_of(bad), ctx), 0, "rdzv")
    assert f"[fd00::1]:{PORT}" in f.message


def test_rendezvous_not_tested_is_a_skip() -> None:
    untested = gpu_facts()
    del untested["rendezvous"]
    f = finding(evaluate(hosts_of(untested), CTX), 0, "rdzv")
    assert f.status is Status.SKIP


# ----------------------------------------------------------------- reachability, interpreter


def test_unreachable_host_fails_ssh_with_the_hint() -> None:
    facts = hosts_of(gpu_facts(), None)
    facts[1] = HostFacts(
        facts[1].host,
        error="u@gpu-1:22: connection refused",
        hint="is sshd running on that host and port?",
    )
    reports = evaluate(facts, CTX)
    assert [f.check for f in reports[1].findings] == ["ssh"]
    f = finding(reports, 1, "ssh")
    assert f.status is Status.FAIL
    assert f.message == "u@gpu-1:22: connection refused"
    assert f.fix == "is sshd running on that host and port?"
    assert [(h.index, x.check) for h, x in failures(reports)] == [(1, "ssh")]
    assert finding(reports, 0, "ssh").status is Status.OK


def test_missing_interpreter_is_the_only_failure_of_its_host() -> None:
    has_script = {**gpu_facts(), "script": {"path": "~/t.py", "exists": True}}
    missing = {"python_missing": "/opt/venv/bin/python", "reached": True}
    reports = evaluate(hosts_of(has_script, missing), Context("10.0.0.1", PORT, "~/t.py"))
    f = assert_only_failure(reports, 1, "python")
    assert f.message == "the interpreter /opt/venv/bin/python does not exist"
    assert "`python:`" in f.fix
    assert finding(reports, 1, "ssh").status is Status.OK
    assert finding(reports, 1, "torch").status is Status.SKIP
    assert finding(reports, 1, "gpus").status is Status.SKIP
    assert finding(reports, 1, "script").status is Status.SKIP


def test_python_too_old() -> None:
    old = {"too_old": "3.6.15", "executable": "/usr/bin/python3"}
    reports = evaluate(hosts_of(gpu_facts(), old), CTX)
    f = assert_only_failure(reports, 1, "python")
    assert f.message == "/opt/venv/bin/python is Python 3.6.15; 3.8+ is needed"
    assert "3.8+" in f.fix
    assert finding(reports, 1, "torch").status is Status.SKIP


# ----------------------------------------------------------------- script, disk


def test_local_script_will_be_shipped() -> None:
    ctx = Context("10.0.0.1", PORT, script="train.py", script_is_local=True)
    reports = evaluate(hosts_of(gpu_facts(), gpu_facts()), ctx)
    assert failures(reports) == []
    assert finding(reports, 1, "script").message == "train.py will be shipped"


def test_remote_script_present_or_absent() -> None:
    ctx = Context("10.0.0.1", PORT, script="~/code/train.py", script_is_local=False)
    has, lacks = gpu_facts(), gpu_facts()
    has["script"] = {"path": "~/code/train.py", "exists": True}
    lacks["script"] = {"path": "~/code/train.py", "exists": False}
    reports = evaluate(hosts_of(has, lacks), ctx)
    assert finding(reports, 0, "script").status is Status.OK
    f = assert_only_failure(reports, 1, "script")
    assert "~/code/train.py" in f.message and "neither a local file" in f.message


def test_no_script_no_script_check() -> None:
    reports = evaluate(hosts_of(gpu_facts()), CTX)
    assert reports[0].get("script") is None


def test_low_disk_warns() -> None:
    low = gpu_facts()
    low["disk"] = {"path": "/home/u", "free_bytes": LOW_DISK // 2}
    reports = evaluate(hosts_of(gpu_facts(), low), CTX)
    assert failures(reports) == []
    f = finding(reports, 1, "disk")
    assert f.status is Status.WARN
    assert f.message == "only 0.50 GiB free under /home/u"
    assert "workdir" in f.fix
    assert finding(reports, 0, "disk").status is Status.OK


def test_every_failure_in_a_bad_cluster_has_a_fix() -> None:
    """A cluster that breaks every check: each failing finding says what to do."""
    odd = gpu_facts(python="3.10.1", torch="2.3.0", cuda="11.8", nccl="2.18.1", gpus=1)
    odd["port"] = {"port": PORT, "free": False, "error": "in use"}
    odd["rendezvous"] = {"ok": False, "error": "refused"}
    odd["script"] = {"exists": False}
    missing = {"python_missing": "/x/python", "reached": True}
    facts = hosts_of(odd, gpu_facts(), gpu_facts(), missing, None)
    facts[4] = HostFacts(facts[4].host, error="auth failed", hint="check your key")
    reports = evaluate(facts, Context("10.0.0.1", PORT, "~/t.py"))
    failing = failures(reports)
    checks = {f.check for _, f in failing}
    assert {"python", "torch", "cuda", "nccl", "gpus", "port", "rdzv", "script", "ssh"} <= checks
    for h, f in failing:
        assert f.fix.strip(), (h.host, f)


def test_evaluate_does_not_change_the_facts() -> None:
    facts = hosts_of(gpu_facts(), gpu_facts(torch="2.3.0"))
    before = copy.deepcopy([hf.facts for hf in facts])
    evaluate(facts, CTX)
    evaluate(facts, CTX)
    assert [hf.facts for hf in facts] == before
