"""A host given more processes than it has CPUs (a CPU host) or GPUs: a warning with its fix,
in doctor's findings and in what a launch prints before it starts."""

from __future__ import annotations

from typing import Any, Optional

from sshddp.model.checks import Context, Finding, HostFacts, Status, evaluate
from sshddp.model.inventory import Host
from sshddp.model.report import launch_warnings

CTX = Context(rdzv_addr="10.0.0.1", rdzv_port=29500)


def facts(cpus: Optional[int], gpus: int = 0) -> dict[str, Any]:
    """What remote/calls/probe.py reports, cut to what the gpus check reads."""
    torch = {"version": "2.13.0", "cuda": "13.0" if gpus else None, "device_count": gpus}
    return {"python": {"version": "3.11.7"}, "cpus": cpus, "torch": torch}


def gpus_finding(host: Host, f: dict[str, Any], ctx: Context = CTX) -> Finding:
    (report,) = evaluate([HostFacts(host, f)], ctx)
    found = report.get("gpus")
    assert found is not None
    return found


def test_a_cpu_host_with_more_processes_than_cpus_is_warned_about() -> None:
    host = Host("cpu-a", 0, nproc=4)
    found = gpus_finding(host, facts(cpus=2))
    assert found.status is Status.WARN
    assert found.message == "CPU host, 4 processes on 2 CPUs: they will slow each other down"
    assert found.fix == "`nproc: 2` or fewer for cpu-a in the inventory (or --nproc-per-node 2)"
    assert gpus_finding(Host("cpu-a", 0, nproc=2), facts(cpus=2)).status is Status.OK
    override = Context(rdzv_addr="10.0.0.1", rdzv_port=29500, nproc_override=3)
    assert gpus_finding(Host("cpu-a", 0, nproc=1), facts(cpus=2), override).status is Status.WARN
    unknown = gpus_finding(host, facts(cpus=None))  # an older probe: no count, no warning
    assert (unknown.status, unknown.message) == (Status.OK, "CPU host, 4 process(es)")


def test_a_gpu_host_with_more_processes_than_gpus_is_warned_about() -> None:
    host = Host("gpu-a", 0, gpus=2)
    assert gpus_finding(host, facts(cpus=64, gpus=2)).status is Status.OK
    ctx = Context(rdzv_addr="10.0.0.1", rdzv_port=29500, nproc_override=4)
    found = gpus_finding(host, facts(cpus=64, gpus=2), ctx)
    assert found.status is Status.WARN
    assert found.message == "4 processes on 2 GPUs: ranks would share GPUs (NCCL refuses that)"
    assert found.fix == "--nproc-per-node 2 or fewer for gpu-a"


def test_a_launch_prints_every_warning_with_its_fix() -> None:
    reports = evaluate(
        [HostFacts(Host("cpu-a", 0, nproc=4), facts(cpus=2))],
        CTX,
    )
    assert launch_warnings(reports) == [
        "sshddp: warning: cpu-a gpus: CPU host, 4 processes on 2 CPUs: they will slow each "
        "other down\n  fix: `nproc: 2` or fewer for cpu-a in the inventory (or "
        "--nproc-per-node 2)"
    ]
