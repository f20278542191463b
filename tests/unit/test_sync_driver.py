"""doctor --sync: a host whose NVIDIA driver cannot run the lock's torch CUDA build is
flagged; the lock's build and the driver table, from hand-built fixtures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sshddp.model import cudadriver
from sshddp.model.checks import Context, HostFacts, Status, evaluate
from sshddp.model.inventory import Host

UV_LOCK = """\
version = 1
requires-python = ">=3.10"

[[package]]
name = "numpy"
version = "2.2.6"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "torch"
version = "2.5.1+cu124"
source = { registry = "https://download.pytorch.org/whl/cu124" }
"""
#: one lock for macOS (a plain build) and Linux (a CUDA 11.8 and a CUDA 12.1 one)
TWO_BUILDS = UV_LOCK.replace("2.5.1+cu124", "2.5.1") + (
    '\n[[package]]\nname = "torch"\nversion = "2.5.1+cu121"\n'
    '\n[[package]]\nname = "torch"\nversion = "2.5.1+cu118"\n'
)
CTX = Context(rdzv_addr="10.0.0.1", rdzv_port=29500)


def facts(driver: str, gpus: int = 2) -> dict[str, Any]:
    """A probe of a GPU host in the synced environment (see remote/calls/probe.py)."""
    torch = {"version": "2.5.1+cu124", "cuda": "12.4", "device_count": gpus, "nccl": "2.21.5"}
    gpu = {"name": "NVIDIA A100", "memory_mib": 81920, "driver": driver}
    return {
        "hostname": "node",
        "python": {"version": "3.11.7", "executable": "/w/envs/k/bin/python"},
        "torch": dict(torch, cuda_available=True, distributed=True),
        "nvidia_smi": {"gpus": [gpu] * gpus, "processes": [], "error": None},
        "gpu_dev_count": gpus,
    }


def hosts(*drivers: str) -> list[HostFacts]:
    return [
        HostFacts(Host(host=f"gpu-{i}", index=i, gpus=2, python="/w/envs/k/bin/python"), facts(d))
        for i, d in enumerate(drivers)
    ]


@pytest.mark.parametrize(
    ("files", "cuda"),
    [
        ({"uv.lock": UV_LOCK}, "12.4"),
        ({"uv.lock": TWO_BUILDS}, "11.8"),  # any host may get the oldest
        ({"requirements.txt": "numpy==2.2.6\ntorch==2.4.1+cu121\n"}, "12.1"),
        ({"pylock.toml": '[[packages]]\nname = "torch"\nversion = "2.6.0+cu126"\n'}, "12.6"),
        ({"uv.lock": UV_LOCK.replace("+cu124", "+cpu")}, None),
        ({"uv.lock": UV_LOCK.replace("+cu124", "")}, None),  # untagged: nothing to judge
        ({"requirements.txt": "torchvision==0.20.1+cu124\n"}, None),
    ],
)
def test_the_locks_torch_build_names_its_cuda(files: dict[str, str], cuda: str) -> None:
    assert cudadriver.locked_cuda(files) == cuda


def test_the_driver_table_follows_nvidia_s() -> None:
    assert cudadriver.driver_needed("12.4") == "550.54.14"
    assert cudadriver.driver_needed("11.8") == "520.61.05"
    assert cudadriver.driver_needed("12.7") == "570.26"  # no 12.7 toolkit: 12.8's
    assert cudadriver.driver_needed("99.0") is None
    assert cudadriver.too_old(["535.104.05"], "12.4") == "535.104.05"
    assert cudadriver.too_old(["550.54.14"], "12.4") is None
    assert cudadriver.too_old(["560.35.03", "535.104.05"], "12.1") is None
    assert cudadriver.too_old(["N/A"], "12.4") is None


def test_doctor_sync_flags_the_host_whose_driver_is_too_old_for_the_locked_build() -> None:
    ctx = replace(CTX, locked_cuda=cudadriver.locked_cuda({"uv.lock": UV_LOCK}))
    reports = evaluate(hosts("550.54.15", "535.104.05", "570.86.10"), ctx)
    bad = [(r.host.host, f) for r in reports for f in r.findings if f.check == "driver"]
    assert [(h, f.status) for h, f in bad] == [
        ("gpu-0", Status.OK),
        ("gpu-1", Status.FAIL),
        ("gpu-2", Status.OK),
    ]
    failed = bad[1][1]
    assert "535.104.05" in failed.message and "CUDA 12.4" in failed.message
    assert "550.54.14" in failed.message and "gpu-1" in failed.fix


def test_without_a_locked_cuda_build_or_a_driver_there_is_no_driver_check() -> None:
    plain = evaluate(hosts("535.104.05"), CTX)  # doctor without --sync
    assert plain[0].get("driver") is None
    cpu_host = hosts("535.104.05")[0]
    cpu_facts = dict(cpu_host.facts or {}, nvidia_smi=None)
    locked = replace(CTX, locked_cuda="12.4")
    assert evaluate([replace(cpu_host, facts=cpu_facts)], locked)[0].get("driver") is None
