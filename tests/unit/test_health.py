"""``doctor --health``'s judgement (model/health): recorded answers in their real formats,
``nvidia-smi -q`` of healthy and broken cards (r470, r525 and r550 spellings), kernel log
lines with Xids, sysfs InfiniBand counters and ``dcgmi diag``'s table, then the findings a
host gets from them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from sshddp.model import health
from sshddp.model.checks import Context, HostFacts, Status, evaluate
from sshddp.model.inventory import Host
from sshddp.protocol import gpu_health as gpus
from sshddp.run import preflight

DATA = Path(__file__).parent / "data" / "health"


def smi(name: str, code: int = 0) -> dict[str, Any]:
    """A recorded ``nvidia-smi -q`` as host_health reports its run."""
    return {"exit": code, "timed_out": False, "output": (DATA / name).read_text()}


def levels(problems: list[health.Problem]) -> list[tuple[str, str]]:
    return [(level, message) for level, message, _ in problems]


def test_a_healthy_h100_pair_parses_and_passes() -> None:
    attached, cards = gpus.parse_smi(smi("smi-q-h100-healthy.txt")["output"])
    assert attached == 2
    assert [c["bus"] for c in cards] == ["00000000:18:00.0", "00000000:2A:00.0"]
    assert cards[0]["PCI/GPU Link Info/Link Width/Max"] == "16x"
    assert cards[0]["ECC Errors/Aggregate/DRAM Uncorrectable"] == "1"
    assert cards[0]["Clocks Event Reasons/HW Thermal Slowdown"] == "Not Active"
    # an aggregate (not volatile) error, its row remapped: the card is fine
    assert gpus.gpu_problems(cards[0]) == []
    # an idle card's link runs slower to save power: a note, not a warning
    assert levels(gpus.gpu_problems(cards[1])) == [
        (
            "ok",
            "GPU 00000000:2A:00.0: PCIe generation 1 of 5 "
            "(idle: the link slows down to save power)",
        )
    ]
    problems = gpus.smi_problems(smi("smi-q-h100-healthy.txt"), expected=2, in_proc=2)
    assert {level for level, _ in levels(problems)} == {"ok"}


def test_a_broken_a100_fails_on_volatile_ecc_and_a_pending_remap() -> None:
    problems = gpus.smi_problems(smi("smi-q-a100-broken.txt"), expected=1, in_proc=1)
    assert levels(problems) == [
        (
            "fail",
            "GPU 00000000:3B:00.0: 2 volatile uncorrectable ECC error(s) since the driver loaded",
        ),
        ("fail", "GPU 00000000:3B:00.0: a row remap is pending"),
        (
            "warn",
            "GPU 00000000:3B:00.0: clocks held down by the hardware (HW Slowdown, "
            "HW Thermal Slowdown)",
        ),
        ("warn", "GPU 00000000:3B:00.0: PCIe link x8 of x16"),
    ]
    assert "nvidia-smi -r -i 00000000:3B:00.0" in problems[0][2]


def test_an_old_driver_s_double_bit_counts_and_pending_retirement() -> None:
    problems = gpus.smi_problems(smi("smi-q-v100-retired.txt"), expected=1, in_proc=1)
    assert levels(problems) == [
        (
            "fail",
            "GPU 00000000:86:00.0: 1 volatile uncorrectable ECC error(s) since the driver loaded",
        ),
        ("fail", "GPU 00000000:86:00.0: a page retirement is pending"),
        (
            "warn",
            "GPU 00000000:86:00.0: clocks held down by the hardware (HW Power Brake Slowdown)",
        ),
    ]


def test_a_recovery_action_and_a_failed_remap() -> None:
    card = {
        "bus": "00000000:C1:00.0",
        "Remapped Rows/Remapping Failure Occurred": "Yes",
        "GPU Recovery Action": "Node Reboot Required",
    }
    assert levels(gpus.gpu_problems(card)) == [
        ("fail", "GPU 00000000:C1:00.0: a row remapping failed"),
        ("fail", "GPU 00000000:C1:00.0: the driver asks for recovery: Node Reboot Required"),
    ]
    assert gpus.gpu_problems({"bus": "x", "GPU Recovery Action": "None"}) == []


def test_missing_and_lost_gpus() -> None:
    healthy = smi("smi-q-h100-healthy.txt")
    assert levels(gpus.smi_problems(healthy, expected=8, in_proc=2))[-1] == (
        "fail",
        "2 GPU(s) answer, the inventory expects 8",
    )
    fallen = levels(gpus.smi_problems(healthy, expected=None, in_proc=3))
    assert fallen[-1][0] == "fail" and "3 GPU(s) known to the driver, 2 answer" in fallen[-1][1]
    lost = {
        "exit": 15,
        "timed_out": False,
        "output": "Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error\n",
    }
    assert levels(gpus.smi_problems(lost, expected=None, in_proc=1)) == [
        (
            "fail",
            "nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error",
        ),
        ("fail", "1 GPU(s) known to the driver, 0 answer nvidia-smi: one fell off the bus?"),
    ]
    hung = {"exit": None, "timed_out": True, "output": ""}
    assert levels(gpus.smi_problems(hung, None, 8))[0][0] == "fail"


def test_no_gpu_is_a_quiet_note() -> None:
    assert gpus.smi_problems(None, expected=None, in_proc=0) == [("ok", "no NVIDIA GPU", "")]
    assert gpus.smi_problems(None, expected=None, in_proc=2)[0][0] == "fail"


def test_xids_by_the_table() -> None:
    lines = (DATA / "kmsg-xids.txt").read_text().splitlines()
    found = levels(gpus.xid_problems({"xids": lines}))
    assert [(level, message.split(";")[0]) for level, message in found] == [
        ("fail", "Xid 79 on PCI:0000:3b:00: GPU has fallen off the bus"),
        ("warn", "Xid 13 on PCI:0000:18:00: graphics engine exception (2 times)"),
        (
            "warn",
            "Xid 94 on PCI:0000:2a:00: contained ECC error "
            "(the program using the memory was stopped)",
        ),
        ("warn", "Xid 150 on PCI:0000:2a:00: an Xid not in sshddp's table"),
    ]
    assert found[0][1].endswith("last: " + lines[0])
    assert gpus.xid_problems({"xids": []}) == []


def test_an_unreadable_kernel_log_is_a_note_never_a_failure() -> None:
    problems = gpus.xid_problems({"unreadable": "/dev/kmsg: Operation not permitted"})
    assert problems == [
        (
            "ok",
            "cannot read the kernel log (/dev/kmsg: Operation not permitted): Xids not checked",
            "",
        )
    ]


def port(
    state: str = "4: ACTIVE", downed: Optional[int] = 0, before: Optional[int] = 0
) -> dict[str, Any]:
    """A port as host_health reads it from /sys/class/infiniband/DEV/ports/N."""
    phys = "5: LinkUp" if "ACTIVE" in state else "3: Disabled"
    return {
        "dev": "mlx5_0",
        "port": "1",
        "state": state,
        "phys_state": phys,
        "link_layer": "InfiniBand",
        "link_downed": downed,
        "link_downed_before": before,
    }


def test_infiniband_ports() -> None:
    assert health.ib_problems([port()]) == []
    assert levels(health.ib_problems([port("1: DOWN")])) == [
        ("warn", "mlx5_0 port 1: 1: DOWN (3: Disabled)")
    ]
    assert levels(health.ib_problems([port(downed=3, before=3)])) == [
        ("warn", "mlx5_0 port 1: link_downed is 3 since the counter was reset")
    ]
    assert levels(health.ib_problems([port(downed=5, before=3)])) == [
        ("fail", "mlx5_0 port 1: link went down 2 time(s) while checked")
    ]
    assert health.ib_problems([port(downed=None, before=None)]) == []


def test_the_user_s_command() -> None:
    out = "".join(f"line {i}\n" for i in range(8))
    failed = health.command_problem("check-node", {"exit": 4, "timed_out": False, "output": out}, 8)
    assert failed[:2] == (
        "fail",
        "`check-node` exited 4: line 3 | line 4 | line 5 | line 6 | line 7",
    )
    passed = health.command_problem("check-node", {"exit": 0, "timed_out": False, "output": ""}, 8)
    assert passed == ("ok", "`check-node` passed", "")
    late = health.command_problem("sleep 99", {"exit": None, "timed_out": True, "output": ""}, 8)
    assert late[:2] == ("fail", "`sleep 99` did not finish in 8 s: no output")


DCGM_PASS = """\
Successfully ran diagnostic for group.
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
| Driver Version Detected   | 550.90.07                                      |
| GPU Device IDs Detected   | 2330,2330                                      |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| NVML Library              | Pass                                           |
| CUDA Main Library         | Pass                                           |
| Permissions and OS Blocks | Pass                                           |
| Persistence Mode          | Pass                                           |
| Environment Variables     | Pass                                           |
| Page Retirement/Row Remap | Pass                                           |
| Graphics Processes        | Pass                                           |
| Inforom                   | Pass                                           |
+---------------------------+------------------------------------------------+
"""


def test_dcgm_diag() -> None:
    ok = {"exit": 0, "timed_out": False, "output": DCGM_PASS}
    assert health.dcgm_problems(ok) == [("ok", "dcgmi diag -r 1: 9 tests passed", "")]
    broken = DCGM_PASS.replace(
        "| Page Retirement/Row Remap | Pass ", "| Page Retirement/Row Remap | Fail "
    )
    failed = {"exit": 226, "timed_out": False, "output": broken}
    assert levels(health.dcgm_problems(failed)) == [
        ("fail", "dcgmi diag: Page Retirement/Row Remap: Fail")
    ]
    assert health.dcgm_problems(None)[0][0] == "ok"
    engine_down = {
        "exit": 255,
        "timed_out": False,
        "output": "Error: unable to establish a connection to the specified host: localhost\n",
    }
    assert health.dcgm_problems(engine_down)[0][0] == "warn"


def test_findings_in_doctor_s_report() -> None:
    looks = {
        "command": {"exit": 1, "timed_out": False, "output": "GPU 3 too hot\n"},
        "smi": smi("smi-q-a100-broken.txt"),
        "kernel": {"unreadable": "/dev/kmsg: Operation not permitted"},
        "ib": [port()],
        "gpu_dev_count": 1,
    }
    host = Host(host="gpu-0", index=0, gpus=1, health="/opt/check")
    reports = evaluate([HostFacts(host, {"health": looks})], Context("10.0.0.1", 29500))
    found = {f.check: f for f in reports[0].findings}
    assert found["health"].status is Status.FAIL
    assert found["health"].message == "`/opt/check` exited 1: GPU 3 too hot"
    assert found["gpu_health"].status is Status.FAIL
    assert "2 volatile uncorrectable" in found["gpu_health"].message
    assert "PCIe link x8 of x16" in found["gpu_health"].message
    assert found["xid"].status is Status.OK and "cannot read the kernel log" in found["xid"].message
    assert (found["ib"].status, found["ib"].message) == (Status.OK, "1 port(s) active")
    assert "dcgm" not in found  # --health=deep only


def test_no_health_findings_without_the_option() -> None:
    host = Host(host="cpu-0", index=0, health="/opt/check")
    reports = evaluate([HostFacts(host, {})], Context("10.0.0.1", 29500))
    assert not {"health", "gpu_health", "xid", "ib", "dcgm"} & {
        f.check for f in reports[0].findings
    }


def test_doctor_without_the_option_asks_for_the_health_command_alone() -> None:
    plain = Context("10.0.0.1", 29500, health="command")
    with_check = Host(host="gpu-0", index=0, gpus=8, health="/opt/check")
    assert preflight._health_args(Host(host="gpu-1", index=1, gpus=8), plain) is None
    asked = preflight._health_args(with_check, plain)
    assert asked is not None and asked["hardware"] is False
    assert asked["command"] == "/opt/check"
    doctor = preflight._health_args(Host(host="gpu-1", index=1), Context("a", 1, health="deep"))
    assert doctor is not None and doctor["hardware"] and doctor["deep"]
    assert doctor["command"] is None
    looks = {"command": {"exit": 0, "timed_out": False, "output": ""}}
    reports = evaluate([HostFacts(with_check, {"health": looks})], plain)
    checks = {f.check for f in reports[0].findings}
    assert checks & {"health", "gpu_health", "xid", "ib", "dcgm"} == {"health"}


def test_a_launch_asks_for_the_command_and_the_gpus_subset() -> None:
    """Every host is asked (the host looks for NVIDIA's driver itself); a broken GPU fails
    the launch's preflight as doctor --health fails it, with nothing of the kernel log or
    the ports; a host that ran no nvidia-smi (no driver) gets no GPU finding."""
    launch = Context("10.0.0.1", 29500, health="launch")
    host = Host(host="gpu-1", index=1, gpus=8)
    asked = preflight._health_args(host, launch)
    assert asked is not None and asked["hardware"] == "gpus" and asked["command"] is None
    looks = {"command": None, "smi": smi("smi-q-a100-broken.txt"), "gpu_dev_count": 8}
    reports = evaluate([HostFacts(host, {"health": looks})], launch)
    found = {f.check: f for f in reports[0].findings}
    assert found["gpu_health"].status is Status.FAIL, found["gpu_health"]
    assert {"health", "xid", "ib", "dcgm"}.isdisjoint(found)
    quiet = evaluate([HostFacts(host, {"health": {"command": None}})], launch)
    assert {"health", "gpu_health", "xid", "ib", "dcgm"}.isdisjoint(
        f.check for f in quiet[0].findings
    )
