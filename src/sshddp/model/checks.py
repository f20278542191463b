"""Pure checks: host facts (from the probe) + what the run needs -> findings with fixes.

Parity checks compare each host with the most common value across reachable hosts (ties go
to the earliest host), so a single odd host is the one flagged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional, TypedDict

from sshddp.model.commands import endpoint
from sshddp.model.inventory import Host
from sshddp.model.plan import LaunchPlan

LOW_DISK = 1 << 30
START_HEADROOM = 1 << 20  # spec, supervisor, state files and the first lines of node.log
CHECKS = (
    "ssh",
    "python",
    "torch",
    "cuda",
    "nccl",
    "gpus",
    "gpu_model",
    "port",
    "rdzv",
    "workdir",
    "disk",
    "script",
)


class PythonFacts(TypedDict, total=False):
    version: str
    executable: str


class TorchFacts(TypedDict, total=False):
    """torch as installed for the host's interpreter; the deep probe imports it too."""

    version: Optional[str]  #: the installed distribution's version
    cuda: Optional[str]  #: the CUDA it was built for (None: a CPU build)
    nccl_package: Optional[str]  #: the nvidia-nccl wheel beside it
    cuda_available: bool
    device_count: int
    nccl: Optional[str]
    gpu_names: list[str]
    distributed: bool
    error: str  #: importing torch failed


class DiskFacts(TypedDict, total=False):
    path: str
    free_bytes: int
    error: str


class WorkdirFacts(TypedDict, total=False):
    path: str  #: the workdir, or its nearest existing parent
    readonly: bool  #: on a read-only file system
    problem: Optional[str]  #: why the workdir or its runs/ must not be used (owner, mode)
    fix: str  #: what to do about the problem


class PortFacts(TypedDict, total=False):
    port: int
    free: bool  #: the rendezvous port could be bound
    error: Optional[str]
    peer_free: bool  #: so could the port above it (the supervisors')
    peer_error: Optional[str]


class RendezvousFacts(TypedDict, total=False):
    ok: bool  #: a TCP connect to the rendezvous endpoint succeeded
    addr: str
    port: int
    error: str


class ScriptFacts(TypedDict, total=False):
    path: str
    exists: bool


class ProbeFacts(TypedDict, total=False):
    """What ``remote/probe.py`` reports of a host (its JSON document)."""

    hostname: str
    os: str
    python: PythonFacts
    cuda_visible_devices: Optional[str]
    disk: DiskFacts
    workdir: WorkdirFacts
    port: PortFacts  #: only from the rendezvous host
    rendezvous: RendezvousFacts
    torch: Optional[TorchFacts]
    nvidia_smi: Optional[dict[str, Any]]  #: {"gpus": [...], "processes": [...], "error"}
    gpu_dev_count: Optional[int]
    script: ScriptFacts
    too_old: str  #: the interpreter is older than 3.8 (its version)
    executable: str
    python_missing: str  #: the configured interpreter does not exist (its path)
    reached: bool


Facts = ProbeFacts


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


@dataclass(frozen=True)
class Finding:
    """The outcome of one check on one host."""

    check: str  #: one of CHECKS
    status: Status
    message: str  #: what was found
    fix: str = ""  #: what to do about it (empty when ok)


@dataclass(frozen=True)
class HostFacts:
    """What we know of one host: probe facts, or why there are none."""

    host: Host
    facts: Optional[Facts] = None  #: the probe's JSON document
    error: Optional[str] = None  #: connection or probe failure
    hint: str = ""  #: how to fix that failure


@dataclass(frozen=True)
class Context:
    """What the checks compare against beyond the facts."""

    rdzv_addr: str
    rdzv_port: int
    script: Optional[str] = None  #: --script given to doctor / launch
    script_is_local: bool = False  #: it exists on this machine (it will be shipped)
    nproc_override: Optional[int] = None
    code_bytes: Optional[int] = None  #: bytes the shipped code takes on a host's disk (launch)

    @classmethod
    def for_launch(cls, plan: LaunchPlan, code_bytes: int) -> Context:
        """What a launch's preflight checks: everything comes from the plan."""
        remote = plan.code.target if plan.code.kind == "remote" else None
        return cls(
            rdzv_addr=plan.rdzv_addr,
            rdzv_port=plan.rdzv_port,
            script=remote,
            nproc_override=plan.nproc_per_node,
            code_bytes=code_bytes,
        )


@dataclass(frozen=True)
class HostReport:
    host: Host
    findings: tuple[Finding, ...] = field(default_factory=tuple)

    def get(self, check: str) -> Optional[Finding]:
        return next((f for f in self.findings if f.check == check), None)

    @property
    def failed(self) -> bool:
        return any(f.status is Status.FAIL for f in self.findings)


def evaluate(hosts: Sequence[HostFacts], ctx: Context) -> list[HostReport]:
    """Every check on every host."""
    live = [h for h in hosts if h.facts is not None]
    refs = _references(live)
    reports = []
    for hf in hosts:
        if hf.facts is None:
            findings: tuple[Finding, ...] = (
                Finding("ssh", Status.FAIL, hf.error or "unreachable", hf.hint),
            )
        else:
            findings = tuple(f for check in _CHECKS if (f := check(hf, refs, ctx)) is not None)
        reports.append(HostReport(hf.host, findings))
    return reports


def python_version(f: Facts) -> Optional[str]:
    if f.get("too_old"):
        return ".".join(str(f["too_old"]).split(".")[:2])
    ver = (f.get("python") or {}).get("version")
    return ".".join(ver.split(".")[:2]) if ver else None


def torch_version(f: Facts) -> Optional[str]:
    return (f.get("torch") or {}).get("version")


def cuda_version(f: Facts) -> Optional[str]:
    torch = f.get("torch")
    if not torch or not torch.get("version"):
        return None
    return torch.get("cuda") or "none (CPU build)"


def nccl_version(f: Facts) -> Optional[str]:
    t = f.get("torch") or {}
    return t.get("nccl") or t.get("nccl_package")


def gpu_models(f: Facts) -> Optional[str]:
    smi = f.get("nvidia_smi") or {}
    names = sorted({g["name"] for g in smi.get("gpus", [])}) or (f.get("torch") or {}).get(
        "gpu_names"
    )
    return ", ".join(sorted(set(names))) if names else None


def driver_version(f: Facts) -> Optional[str]:
    smi = f.get("nvidia_smi") or {}
    drivers = sorted({g["driver"] for g in smi.get("gpus", [])})
    return ", ".join(drivers) if drivers else None


def gpu_count(f: Facts) -> Optional[int]:
    torch = f.get("torch") or {}
    if "device_count" in torch and "error" not in torch:
        return int(torch["device_count"])
    smi = f.get("nvidia_smi")
    if smi and smi.get("gpus"):
        return len(smi["gpus"])
    count = f.get("gpu_dev_count")
    return int(count) if count is not None else None


_PARITY: dict[str, Callable[[Facts], Optional[str]]] = {
    "python": python_version,
    "torch": torch_version,
    "cuda": cuda_version,
    "nccl": nccl_version,
    "gpu_model": gpu_models,
    "driver": driver_version,
}


def _references(live: Sequence[HostFacts]) -> dict[str, Optional[str]]:
    refs: dict[str, Optional[str]] = {}
    for name, getter in _PARITY.items():
        values = [v for h in live if h.facts is not None and (v := getter(h.facts)) is not None]
        if not values:
            refs[name] = None
            continue
        counts = Counter(values)
        best = max(counts.values())
        refs[name] = next(v for v in values if counts[v] == best)
    return refs


def _no_python(f: Facts) -> bool:
    """The probe could not run: what it would have found is unknown, not missing."""
    return bool(f.get("too_old") or f.get("python_missing"))


_NOT_CHECKED = "not checked (no usable Python)"


def _who_has(ref: str) -> str:
    return f"the other hosts have {ref}"


def _ssh(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Finding:
    f = hf.facts or {}
    return Finding("ssh", Status.OK, f"reached {f.get('hostname', hf.host.host)}")


def _python(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Finding:
    f = hf.facts or {}
    ver = python_version(f)
    if f.get("python_missing"):
        return Finding(
            "python",
            Status.FAIL,
            f"the interpreter {hf.host.python} does not exist",
            f"set `python:` for {hf.host.host} in the inventory to the interpreter that has "
            "torch (e.g. /opt/venv/bin/python)",
        )
    if f.get("too_old"):
        return Finding(
            "python",
            Status.FAIL,
            f"{hf.host.python} is Python {f['too_old']}; 3.8+ is needed",
            f"set `python:` for {hf.host.host} in the inventory to a Python 3.8+ interpreter",
        )
    ref = refs["python"]
    exe = (f.get("python") or {}).get("executable", hf.host.python)
    if ref and ver != ref:
        return Finding(
            "python",
            Status.FAIL,
            f"Python {ver} ({exe}); {_who_has(ref)}",
            f"use the same Python minor version everywhere: set `python:` for {hf.host.host} "
            f"to a Python {ref} interpreter (e.g. a venv made with python{ref})",
        )
    return Finding("python", Status.OK, f"Python {ver} ({exe})")


def _torch(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Finding:
    f = hf.facts or {}
    ver = torch_version(f)
    ref = refs["torch"]
    pin = f"=={ref}" if ref else ""
    if _no_python(f):
        return Finding("torch", Status.SKIP, _NOT_CHECKED)
    if ver is None:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch is not installed for {hf.host.python}",
            f"`{hf.host.python} -m pip install torch{pin}` on {hf.host.host}, or set "
            "`python:` in the inventory to the interpreter that has torch",
        )
    err = (f.get("torch") or {}).get("error")
    if err:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch {ver} is installed but failed to import: {err}",
            f"run `{hf.host.python} -c 'import torch'` on {hf.host.host} and fix its error",
        )
    if ref and ver != ref:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch {ver}; {_who_has(ref)}",
            f"`{hf.host.python} -m pip install torch=={ref}` on {hf.host.host}",
        )
    return Finding("torch", Status.OK, f"torch {ver}")


def _parity(name: str, label: str, fix: str) -> Callable[..., Optional[Finding]]:
    def check(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
        value = _PARITY[name](hf.facts or {})
        ref = refs[name]
        if value is None:
            return Finding(name, Status.SKIP, f"no {label}")
        if ref and value != ref:
            return Finding(name, Status.FAIL, f"{label} {value}; {_who_has(ref)}", fix)
        return Finding(name, Status.OK, f"{label} {value}")

    return check


def _gpu_model(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    f = hf.facts or {}
    notes = []
    for name, label in (("gpu_model", "GPU"), ("driver", "driver")):
        value, ref = _PARITY[name](f), refs[name]
        if value and ref and value != ref:
            notes.append(f"{label} {value}; {_who_has(ref)}")
    if notes:
        return Finding(
            "gpu_model",
            Status.WARN,
            "; ".join(notes),
            "mixed GPU models or drivers work but the slowest node sets the pace; "
            "align drivers with your package manager where you can",
        )
    model = gpu_models(f)
    return Finding("gpu_model", Status.OK if model else Status.SKIP, model or "no GPU")


def _gpus(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Finding:
    f = hf.facts or {}
    want = hf.host.gpus or 0
    if want == 0:
        procs = ctx.nproc_override or hf.host.procs
        return Finding("gpus", Status.OK, f"CPU host, {procs} process(es)")
    if _no_python(f):
        return Finding("gpus", Status.SKIP, _NOT_CHECKED)
    have = gpu_count(f)
    cvd = f.get("cuda_visible_devices")
    if have is None:
        return Finding(
            "gpus",
            Status.FAIL,
            f"{want} GPUs expected, none found (no nvidia-smi, no driver)",
            f"install the NVIDIA driver on {hf.host.host}, or set `gpus: 0` and `nproc:` for "
            "a CPU host",
        )
    if have < want:
        why = (
            f" (CUDA_VISIBLE_DEVICES={cvd!r} in a non-interactive SSH session hides the rest)"
            if cvd is not None
            else ""
        )
        fix = (
            f"unset CUDA_VISIBLE_DEVICES in {hf.host.host}'s shell startup files"
            if cvd is not None
            else f"set `gpus: {have}` for {hf.host.host} in the inventory"
        )
        return Finding("gpus", Status.FAIL, f"{have} GPUs visible, {want} expected{why}", fix)
    busy = ((f.get("nvidia_smi") or {}).get("processes")) or []
    if busy:
        pids = ", ".join(f"{p['pid']} ({p['name']}, {p['mib']} MiB)" for p in busy[:4])
        return Finding(
            "gpus",
            Status.WARN,
            f"{have} GPUs; already in use by {pids}",
            f"stop those processes on {hf.host.host} if they are left over from an old run",
        )
    return Finding("gpus", Status.OK, f"{have} GPUs")


def _port(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    port = (hf.facts or {}).get("port")
    if port is None:
        return None
    if port.get("free") and port.get("peer_free") is False:
        peer = ctx.rdzv_port + 1
        return Finding(
            "port",
            Status.FAIL,
            f"port {peer} (sshddp's supervisors, rendezvous port + 1) is taken "
            f"({port.get('peer_error')})",
            f"pick another rendezvous port with --port / `rendezvous: {{port: N}}`, or find "
            f"the holder with `ss -ltnp 'sport = :{peer}'` on {hf.host.host}",
        )
    if port.get("free"):
        return Finding("port", Status.OK, f"ports {ctx.rdzv_port} and {ctx.rdzv_port + 1} free")
    return Finding(
        "port",
        Status.FAIL,
        f"rendezvous port {ctx.rdzv_port} is taken ({port.get('error')})",
        f"pick another with --port / `rendezvous: {{port: N}}`, or find the holder with "
        f"`ss -ltnp 'sport = :{ctx.rdzv_port}'` on {hf.host.host}",
    )


def _rdzv(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    r = (hf.facts or {}).get("rendezvous")
    if r is None:
        return Finding(
            "rdzv",
            Status.SKIP,
            "not tested (no probe from the rendezvous host, or none from this one)",
        )
    target = endpoint(ctx.rdzv_addr, ctx.rdzv_port)
    if r.get("ok"):
        return Finding("rdzv", Status.OK, f"connects to {target}")
    return Finding(
        "rdzv",
        Status.FAIL,
        f"cannot connect to the rendezvous {target}: {r.get('error')}",
        f"open TCP port {ctx.rdzv_port} on the first host to {hf.host.host} (firewall, "
        "security group), or set `addr:` of the first host to an address both can use",
    )


def _workdir(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    found = (hf.facts or {}).get("workdir")
    if found is None:
        return None
    if found.get("readonly"):
        return Finding(
            "workdir",
            Status.FAIL,
            f"{found.get('path')} is on a read-only file system: no run directory can be made "
            "there",
            f"point `workdir:` of {hf.host.host} to a writable directory",
        )
    problem = found.get("problem")
    if problem:
        return Finding("workdir", Status.FAIL, problem, found.get("fix") or "")
    return Finding("workdir", Status.OK, f"{found.get('path')} is yours alone to write")


def _disk(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    facts = hf.facts or {}
    disk = facts.get("disk") or {}
    free = disk.get("free_bytes")
    if free is None or (facts.get("workdir") or {}).get("readonly"):
        return None  # a read-only disk is the workdir check's finding, not "no space"
    gib = free / (1 << 30)
    need = (ctx.code_bytes or 0) + START_HEADROOM
    if ctx.code_bytes is not None and free < need:
        return Finding(
            "disk",
            Status.FAIL,
            f"only {_mb(free)} free under {disk.get('path')}; the run needs about {_mb(need)} "
            f"there ({_mb(ctx.code_bytes)} of code); it would fail with 'No space left on device'",
            f"free space on {hf.host.host}, ship less code (.gitignore), or point `workdir:` "
            "to a bigger disk",
        )
    if free < LOW_DISK:
        return Finding(
            "disk",
            Status.WARN,
            f"only {gib:.2f} GiB free under {disk.get('path')}",
            f"free space on {hf.host.host} or point `workdir:` to a bigger disk",
        )
    return Finding("disk", Status.OK, f"{gib:.0f} GiB free")


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MB"


def _script(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    if not ctx.script:
        return None
    if ctx.script_is_local:
        return Finding("script", Status.OK, f"{ctx.script} will be shipped")
    if _no_python(hf.facts or {}):
        return Finding("script", Status.SKIP, _NOT_CHECKED)
    s = (hf.facts or {}).get("script") or {}
    if s.get("exists"):
        return Finding("script", Status.OK, f"{ctx.script} present on the host")
    return Finding(
        "script",
        Status.FAIL,
        f"{ctx.script} is neither a local file nor present on the host",
        f"copy it to {hf.host.host} or run sshddp from the directory that holds it",
    )


_CHECKS: tuple[Callable[..., Optional[Finding]], ...] = (
    _ssh,
    _python,
    _torch,
    _parity("cuda", "CUDA", "install the same torch build (same +cuXXX) on every host"),
    _parity("nccl", "NCCL", "install the same torch build (its NCCL comes with it) everywhere"),
    _gpus,
    _gpu_model,
    _port,
    _rdzv,
    _workdir,
    _disk,
    _script,
)


def reports_ok(reports: Sequence[HostReport]) -> bool:
    """No check failed on any host (warnings pass)."""
    return not any(r.failed for r in reports)
