"""Pure: what ``nvidia-smi -q`` and the kernel log's Xid lines say of a host's GPUs.

Which Xids and counters fail and which warn is the table of docs/health.md, with its
sources: NVIDIA's Xid catalog ("Xid Errors", in NVIDIA's GPU deployment and management
documentation), the NVML reference (``nvmlDeviceGetRemappedRows``,
``nvmlDeviceGetRetiredPagesPendingStatus``, ``nvmlClocksEventReasons``) and
``nvidia-smi -q``'s section names, which parse here in their older and newer spellings.
Stdlib only: a spare judges its own GPUs with it when node 0 needs it mid-run
(``remote/node/spare_health``); ``doctor --health`` and a launch's preflight on the laptop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

from sshddp.protocol.health_command import Level, Problem

_RESET = (
    "drain the host: once no process uses the GPU, reset it (`nvidia-smi -r -i {bus}`, as "
    "root) or reboot; if it comes back, the card needs service"
)
_REBOOT = "drain the host and reboot it; if it comes back, the card needs service"
_APP = "usually the program's own fault (see its log); if it recurs with good code, drain the host"

#: Xid -> (level, meaning, fix), from NVIDIA's Xid catalog. An Xid not listed warns.
XIDS: Mapping[int, tuple[Level, str, str]] = {
    13: ("warn", "graphics engine exception", _APP),
    31: ("warn", "GPU memory page fault", _APP),
    43: ("warn", "GPU stopped processing", _APP),
    45: ("warn", "preemptive cleanup, after an earlier error", _APP),
    48: ("fail", "double-bit ECC error", _RESET),
    61: ("fail", "internal micro-controller breakpoint/warning", _RESET),
    62: ("fail", "internal micro-controller halt", _RESET),
    63: ("warn", "ECC page retirement or row remapping recorded", _RESET),
    64: ("fail", "ECC page retirement or row remapping failed", _REBOOT),
    74: ("fail", "NVLink error", _RESET),
    79: ("fail", "GPU has fallen off the bus", _REBOOT),
    92: ("warn", "high single-bit ECC error rate", _RESET),
    94: ("warn", "contained ECC error (the program using the memory was stopped)", _RESET),
    95: ("fail", "uncontained ECC error", _RESET),
    119: ("fail", "GSP RPC timeout", _RESET),
    120: ("fail", "GSP error", _RESET),
    140: ("fail", "unrecovered ECC error", _RESET),
    143: ("fail", "GPU initialization failure", _REBOOT),
    154: ("fail", "GPU recovery action changed (reset or reboot required)", _REBOOT),
}

_XID = re.compile(r"NVRM: Xid \((?P<where>[^)]*)\): (?P<xid>\d+)")
_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_FIELD = re.compile(r"^(?P<indent>\s*)(?P<key>\S.*?)\s+:\s?(?P<value>.*)$")
_LOST = ("GPU is lost", "Unable to determine the device handle")


# --- nvidia-smi -q ----------------------------------------------------------------------


def parse_smi(text: str) -> tuple[Optional[int], list[dict[str, str]]]:
    """(``Attached GPUs``, one {"Section/Sub/Key": value} per GPU, its bus id as "bus")
    from ``nvidia-smi -q``'s text."""
    attached: Optional[int] = None
    gpus: list[dict[str, str]] = []
    stack: list[tuple[int, str]] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("="):
            continue
        header = _GPU.match(line)
        if header:
            gpus.append({"bus": header.group(1)})
            stack = []
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        field = _FIELD.match(line)
        if field is None:  # a section's name: what follows, further in, belongs to it
            stack.append((indent, line.strip()))
            continue
        key = "/".join([s for _, s in stack] + [field.group("key")])
        if gpus:
            gpus[-1][key] = field.group("value").strip()
        elif key == "Attached GPUs" and field.group("value").strip().isdigit():
            attached = int(field.group("value"))
    return attached, gpus


def _number(value: Optional[str]) -> int:
    """A counter's value; "N/A" and the like count as 0."""
    return int(value) if value and value.strip().isdigit() else 0


def _under(gpu: Mapping[str, str], *sections: str) -> dict[str, str]:
    """The fields of the first of ``sections`` the GPU shows, by their path below it."""
    for section in sections:
        found = {k[len(section) + 1 :]: v for k, v in gpu.items() if k.startswith(section + "/")}
        if found:
            return found
    return {}


def gpu_problems(gpu: Mapping[str, str]) -> list[Problem]:
    """Every problem one GPU's ``nvidia-smi -q`` shows (an empty list: a healthy card)."""
    bus = gpu.get("bus", "?")
    return [
        *_ecc(gpu, bus),
        *_remaps(gpu, bus),
        *_recovery(gpu, bus),
        *_slowdown(gpu, bus),
        *_pcie(gpu, bus),
    ]


def _ecc(gpu: Mapping[str, str], bus: str) -> list[Problem]:
    volatile = _under(gpu, "ECC Errors/Volatile")
    errors = sum(
        _number(v)
        for k, v in volatile.items()
        if "Uncorrectable" in k or k == "Double Bit/Total"  # r525+ names, then older ones
    )
    if errors:
        return [
            (
                "fail",
                f"GPU {bus}: {errors} volatile uncorrectable ECC error(s) since the driver loaded",
                _RESET.format(bus=bus),
            )
        ]
    return []


def _remaps(gpu: Mapping[str, str], bus: str) -> list[Problem]:
    rows = _under(gpu, "Remapped Rows")
    pages = _under(gpu, "Retired Pages")
    problems: list[Problem] = []
    if rows.get("Remapping Failure Occurred") == "Yes":
        problems.append(("fail", f"GPU {bus}: a row remapping failed", _REBOOT))
    if rows.get("Pending") == "Yes":
        problems.append(("fail", f"GPU {bus}: a row remap is pending", _RESET.format(bus=bus)))
    pending = pages.get("Pending Page Blacklist") or pages.get("Pending Page Retirement")
    if pending == "Yes":
        message = f"GPU {bus}: a page retirement is pending"
        problems.append(("fail", message, _RESET.format(bus=bus)))
    return problems


def _recovery(gpu: Mapping[str, str], bus: str) -> list[Problem]:
    """NVML's GPU recovery action (r570+), where this driver's nvidia-smi shows it."""
    for key, value in gpu.items():
        if key.endswith("Recovery Action") and value not in ("None", "N/A", ""):
            return [("fail", f"GPU {bus}: the driver asks for recovery: {value}", _REBOOT)]
    return []


_SLOWDOWNS = ("HW Slowdown", "HW Thermal Slowdown", "HW Power Brake Slowdown")


def _slowdown(gpu: Mapping[str, str], bus: str) -> list[Problem]:
    reasons = _under(gpu, "Clocks Event Reasons", "Clocks Throttle Reasons")
    active = [
        k.split("/")[-1]
        for k, v in reasons.items()
        if v == "Active" and k.split("/")[-1] in _SLOWDOWNS
    ]
    if not active:
        return []
    return [
        (
            "warn",
            f"GPU {bus}: clocks held down by the hardware ({', '.join(active)})",
            "check the node's cooling and power supply (`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,"
            "POWER`); a slow GPU slows every rank of the run",
        )
    ]


def _pcie(gpu: Mapping[str, str], bus: str) -> list[Problem]:
    link = _under(gpu, "PCI/GPU Link Info")
    problems: list[Problem] = []
    width, width_max = link.get("Link Width/Current"), link.get("Link Width/Max")
    if _number((width or "").rstrip("x")) < _number((width_max or "").rstrip("x")):
        problems.append(
            (
                "warn",
                f"GPU {bus}: PCIe link x{width.rstrip('x') if width else '?'} of "
                f"x{(width_max or '').rstrip('x')}",
                "reseat the card or its riser; check the slot (`lspci -vv -s "
                f"{bus}`: LnkSta against LnkCap)",
            )
        )
    gen, gen_max = link.get("PCIe Generation/Current"), link.get("PCIe Generation/Max")
    if _number(gen) < _number(gen_max):
        idle = _under(gpu, "Clocks Event Reasons", "Clocks Throttle Reasons").get("Idle")
        level: Level = "ok" if idle == "Active" else "warn"
        why = " (idle: the link slows down to save power)" if level == "ok" else ""
        message = f"GPU {bus}: PCIe generation {gen} of {gen_max}{why}"
        problems.append(
            (
                level,
                message,
                "" if level == "ok" else "check the slot's BIOS settings and the riser",
            )
        )
    return problems


def smi_problems(
    smi: Optional[Mapping[str, Any]], expected: Optional[int], in_proc: int
) -> list[Problem]:
    """nvidia-smi's run (``host_health``'s result) judged: every GPU's problems, and GPUs
    missing against the inventory's ``gpus`` or against the driver's own count (a GPU fallen
    off the bus is still under /proc/driver/nvidia/gpus)."""
    if smi is None:
        if in_proc:
            return [
                (
                    "fail",
                    f"{in_proc} GPU(s) under /proc/driver/nvidia, yet no nvidia-smi on PATH",
                    "install the driver's utilities (nvidia-utils) or put nvidia-smi on PATH",
                )
            ]
        return [("ok", "no NVIDIA GPU", "")]
    output = str(smi.get("output") or "")
    if smi.get("timed_out"):
        return [
            ("fail", "nvidia-smi -q did not answer in time (a GPU or the driver hangs)", _REBOOT)
        ]
    attached, gpus = parse_smi(output)
    problems = [p for gpu in gpus for p in gpu_problems(gpu)]
    lost = [line.strip() for line in output.splitlines() if any(m in line for m in _LOST)]
    if lost:
        problems.append(("fail", f"nvidia-smi: {lost[0]}", _REBOOT))
    seen = attached if attached is not None else len(gpus)
    if expected and seen < expected:
        problems.append(
            ("fail", f"{seen} GPU(s) answer, the inventory expects {expected}", _REBOOT)
        )
    if in_proc > seen:
        problems.append(
            (
                "fail",
                f"{in_proc} GPU(s) known to the driver, {seen} answer nvidia-smi: one fell "
                "off the bus?",
                _REBOOT,
            )
        )
    if smi.get("exit") not in (0, None) and not problems:
        tail = " | ".join(output.strip().splitlines()[-2:])
        problems.append(("fail", f"nvidia-smi -q exited {smi.get('exit')}: {tail}", _REBOOT))
    return problems or [("ok", f"{seen} GPU(s) healthy", "")]


# --- the kernel log ----------------------------------------------------------------------


def xid_problems(kernel: Mapping[str, Any]) -> list[Problem]:
    """The kernel log's Xid lines judged by ``XIDS``; an unreadable log is a note, never a
    failure (``kernel.dmesg_restrict`` keeps it to root on many distributions)."""
    if "unreadable" in kernel:
        return [
            ("ok", f"cannot read the kernel log ({kernel['unreadable']}): Xids not checked", "")
        ]
    problems: list[Problem] = []
    seen: dict[tuple[str, int], int] = {}
    lines: dict[tuple[str, int], str] = {}
    for line in kernel.get("xids") or ():
        match = _XID.search(line)
        if match:
            key = (match.group("where"), int(match.group("xid")))
            seen[key] = seen.get(key, 0) + 1
            lines[key] = line
    for (where, xid), count in seen.items():
        level, meaning, fix = XIDS.get(xid, ("warn", "an Xid not in sshddp's table", _APP))
        times = f" ({count} times)" if count > 1 else ""
        problems.append(
            (
                level,
                f"Xid {xid} on {where}: {meaning}{times}; last: {lines[where, xid]}",
                fix.format(bus=where),
            )
        )
    return problems
