"""Pure checks: host facts (from the probe) + what the run needs -> findings with fixes.

Parity checks compare each host with the most common value across reachable hosts (ties go
to the earliest host), so a single odd host is the one flagged. Fleet checks (``env``,
``net``, ``unique``, ``clock``, ``imports``) see every reachable host at once (``Fleet``):
two entries that are one machine, interface names that differ between hosts.

A fix is meant to be pasted: a command in backticks runs as written where its host is, and
an inventory edit names the entry (``hosts[i]``), its line and the YAML to write.
"""

from __future__ import annotations

import ipaddress
import posixpath
import shlex
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Literal, Optional, TypedDict

from sshddp import defaults
from sshddp.model import cudadriver, health, rankenv
from sshddp.model.commands import endpoint, quote_path
from sshddp.model.envvars import MASK, EnvPairs, hide_url_credentials
from sshddp.model.imports import ScriptImports
from sshddp.model.inventory import Host
from sshddp.model.plan import LaunchPlan
from sshddp.protocol import gpu_health as gpus

LOW_DISK = 1 << 30
START_HEADROOM = 1 << 20  # spec, supervisor, state files and the first lines of node.log
CHECKS = (
    "ssh",
    "python",
    "torch",
    "cuda",
    "driver",
    "nccl",
    "gpus",
    "gpu_model",
    "env",
    "net",
    "unique",
    "port",
    "rdzv",
    "clock",
    "workdir",
    "disk",
    "script",
    "imports",
    "slurm",
    "quarantine",
    "health",
    "gpu_health",
    "xid",
    "ib",
    "dcgm",
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
    port: Optional[int]  #: None: no free pair was found (auto)
    free: bool  #: the rendezvous port could be bound
    error: Optional[str]
    peer_free: bool  #: so could the port above it (the supervisors')
    peer_error: Optional[str]
    auto: int  #: the port was picked, from this one up (--port auto)


class RendezvousFacts(TypedDict, total=False):
    ok: bool  #: a TCP connect to the rendezvous endpoint succeeded
    addr: str
    port: int
    error: str


class ScriptFacts(TypedDict, total=False):
    path: str
    exists: bool


class InterfaceFacts(TypedDict, total=False):
    mtu: Optional[int]
    up: bool
    addrs: list[str]  #: "address/prefix length"


class RouteFacts(TypedDict, total=False):
    dev: Optional[str]  #: the interface a connection to node 0 leaves by
    src: Optional[str]  #: from this address
    local: bool  #: node 0's address is this host's own (dev: the interface holding it)


class NetFacts(TypedDict, total=False):
    """The network path to node 0 (``remote/calls/network.py``)."""

    method: str  #: "ip" (iproute2) or "socket" (the kernel's files and a UDP connect)
    target: Optional[str]  #: node 0's address as this host resolves it
    route: Optional[RouteFacts]
    interfaces: dict[str, InterfaceFacts]
    routes: list[dict[str, str]]  #: the main table: {"dst": "10.0.0.0/24" or "default", "dev"}
    error: str


class ImportFacts(TypedDict, total=False):
    found: dict[str, bool]  #: top-level module -> found by the ranks' interpreter
    method: str  #: "in-process" or "subprocess"
    error: str


class SshFacts(TypedDict, total=False):
    """Added by the coordinator: what the connection says of the machine."""

    host_key: Optional[str]  #: "ssh-ed25519 SHA256:..." (None for localhost)
    endpoint: str  #: the address and port connected to, as ssh_config resolves the entry


class ClockFacts(TypedDict, total=False):
    """Added by the coordinator: the host's clock against this machine's."""

    offset: float  #: seconds the host's clock is ahead (negative: behind)
    rtt: float  #: round trip of the best sample; the offset is right within rtt / 2


class HealthFacts(TypedDict, total=False):
    """``remote/calls/host_health.py``'s looks (``doctor --health``); a command's result is
    {"exit": int|None, "timed_out": bool, "output": its last bytes}."""

    command: Optional[dict[str, Any]]  #: the inventory's ``health:`` command (None: none)
    smi: Optional[dict[str, Any]]  #: ``nvidia-smi -q`` (None: not on PATH)
    dcgm: Optional[dict[str, Any]]  #: ``dcgmi diag -r 1`` (--health=deep; None: not on PATH)
    kernel: dict[str, Any]  #: {"xids": [kernel log lines]} or {"unreadable": why}
    ib: list[dict[str, Any]]  #: InfiniBand/RoCE ports: state, link_downed (twice)
    gpu_dev_count: int  #: GPUs under /proc/driver/nvidia/gpus


class ProbeFacts(TypedDict, total=False):
    """What ``remote/calls/probe.py`` reports of a host (its JSON document)."""

    hostname: str
    os: str
    python: PythonFacts
    cuda_visible_devices: Optional[str]
    cpus: Optional[int]  #: CPUs the host's processes may use (what `nproc` prints)
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
    login_env: dict[str, str]  #: the login environment's values of rankenv's watched names
    net: NetFacts
    imports: ImportFacts
    pip: dict[str, bool]  #: {"pip", "ensurepip"}: importable (reported when torch is not)
    ssh: SshFacts
    clock: ClockFacts
    health: HealthFacts  #: doctor --health only


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
    rdzv_port: int  #: defaults.AUTO_PORT: node 0 picks a free pair
    script: Optional[str] = None  #: --script given to doctor / launch
    script_is_local: bool = False  #: it exists on this machine (it will be shipped)
    nproc_override: Optional[int] = None
    code_bytes: Optional[int] = None  #: bytes the shipped code takes on a host's disk (launch)
    inventory: str = ""  #: the inventory file, for fixes that edit it
    rdzv_host_set: bool = False  #: the inventory sets rendezvous.host
    cli_env: EnvPairs = ()  #: --env, applied over every host's inventory env
    secret_names: frozenset[str] = frozenset()  #: env names whose values are never shown
    imports: Optional[ScriptImports] = None  #: what the script imports (None: no check)
    locked_cuda: Optional[str] = None  #: doctor --sync: the CUDA of the lock's torch build
    #: doctor --health[=deep]; "command": the ``health:`` command alone (doctor); "launch":
    #: the command and the GPUs' nvidia-smi -q where the driver is (a launch's preflight)
    health: Optional[Literal["command", "launch", "basic", "deep"]] = None

    @classmethod
    def for_launch(
        cls,
        plan: LaunchPlan,
        code_bytes: int,
        cli_env: EnvPairs = (),
        imports: Optional[ScriptImports] = None,
        inventory: str = "",
        rdzv_host_set: bool = False,
    ) -> Context:
        """What a launch's preflight checks: everything comes from the plan."""
        remote = plan.code.target if plan.code.kind == "remote" else None
        return cls(
            rdzv_addr=plan.rdzv_addr,
            rdzv_port=plan.rdzv_port,
            script=remote,
            nproc_override=plan.nproc_per_node,
            code_bytes=code_bytes,
            inventory=inventory,
            rdzv_host_set=rdzv_host_set,
            cli_env=cli_env,
            secret_names=plan.secret_names,
            imports=imports,
            health="launch",
        )

    @property
    def auto_port(self) -> bool:
        return self.rdzv_port == defaults.AUTO_PORT


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
    fleet = Fleet.of(live, ctx)
    reports = []
    for hf in hosts:
        if hf.facts is None:
            findings: tuple[Finding, ...] = (
                Finding("ssh", Status.FAIL, hf.error or "unreachable", hf.hint),
            )
        else:
            found = [f for check in _CHECKS if (f := check(hf, refs, ctx)) is not None]
            found += [f for check in _FLEET_CHECKS if (f := check(hf, fleet, ctx)) is not None]
            findings = tuple(sorted(found, key=lambda f: CHECKS.index(f.check)))
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
    if _no_python(f):
        return Finding("torch", Status.SKIP, _NOT_CHECKED)
    if ver is None:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch is not installed for {hf.host.python}",
            f"{pip_install(hf, torch_requirement(ref))}, or set `python:` in the inventory to "
            "the interpreter that has torch",
        )
    err = (f.get("torch") or {}).get("error")
    if err:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch {ver} is installed but failed to import: {err}",
            f"run `{_py(hf)} -c 'import torch'` on {hf.host.host} and fix its error",
        )
    if ref and ver != ref:
        return Finding(
            "torch",
            Status.FAIL,
            f"torch {ver}; {_who_has(ref)}",
            pip_install(hf, torch_requirement(ref)),
        )
    return Finding("torch", Status.OK, f"torch {ver}")


_TORCH_INDEX = "https://download.pytorch.org/whl/"


def torch_requirement(version: Optional[str]) -> str:
    """What pip needs to install this torch build: a local version (``2.4.1+cu121``,
    ``+cpu``) is on PyTorch's own index only, under the tag's name."""
    if not version or version == "unknown":
        return "torch"
    public, _, local = version.partition("+")
    if local and (local == "cpu" or local.startswith(("cu", "rocm", "xpu"))):
        return f"torch=={public} --index-url {_TORCH_INDEX}{local}"
    return f"torch=={version}"


def _py(hf: HostFacts) -> str:
    return quote_path(hf.host.python)


def pip_install(hf: HostFacts, requirement: str) -> str:
    """A fix that installs ``requirement`` for the host's interpreter, runnable as written
    there: pip first made available when the probe found it missing."""
    install = f"{_py(hf)} -m pip install {requirement}"
    pip = (hf.facts or {}).get("pip") or {}
    where = f" on {hf.host.host}"
    if pip.get("pip", True):
        return f"`{install}`{where}"
    if pip.get("ensurepip"):
        return f"`{_py(hf)} -m ensurepip --upgrade && {install}`{where}"
    return (
        f"{hf.host.python} has no pip{where}: install it (Debian/Ubuntu: `sudo apt install "
        f"python3-pip`), then `{install}`"
    )


def _driver(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    """doctor --sync: the host's NVIDIA driver can run the lock's torch CUDA build."""
    smi = (hf.facts or {}).get("nvidia_smi") or {}
    drivers = [str(g.get("driver", "")) for g in smi.get("gpus", [])]
    if ctx.locked_cuda is None or not drivers:
        return None
    old = cudadriver.too_old(drivers, ctx.locked_cuda)
    if old is None:
        return Finding("driver", Status.OK, f"driver runs the lock's CUDA {ctx.locked_cuda}")
    return Finding(
        "driver",
        Status.FAIL,
        f"NVIDIA driver {old} cannot run the lock's torch build for CUDA {ctx.locked_cuda} "
        f"(it needs {cudadriver.driver_needed(ctx.locked_cuda)} or newer)",
        f"update the NVIDIA driver on {hf.host.host}, or lock a torch build for an older "
        "CUDA (docs/sync.md: torch's CUDA build per host)",
    )


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
        return _cpu_host(hf, f, ctx.nproc_override or hf.host.procs)
    if _no_python(f):
        return Finding("gpus", Status.SKIP, _NOT_CHECKED)
    have = gpu_count(f)
    cvd = ranks_env(hf, ctx).get(rankenv.CUDA_VISIBLE_DEVICES)
    if not have and not f.get("nvidia_smi") and f.get("gpu_dev_count") is None:
        return Finding(
            "gpus",
            Status.FAIL,
            f"{want} GPUs expected, none found (no nvidia-smi, no driver)",
            f"install the NVIDIA driver on {hf.host.host}, or run it as a CPU host: "
            f"`nproc: {want}` in place of `gpus: {want}` in {_gpus_entry(hf.host, ctx)}",
        )
    have = have or 0
    if have < want:
        why = f" ({_shown(cvd, ctx)} {_from(cvd, hf.host)} hides the rest)" if cvd else ""
        fix = _drop_var(cvd, hf.host, ctx) if cvd else ""
        place = _gpus_entry(hf.host, ctx) if hf.host.gpus_defaults_line else ""
        fix = fix or f"set `gpus: {have}` for {place or hf.host.host + ' in the inventory'}"
        return Finding("gpus", Status.FAIL, f"{have} GPUs visible, {want} expected{why}", fix)
    procs = ctx.nproc_override or want
    if procs > have:
        return Finding(
            "gpus",
            Status.WARN,
            f"{procs} processes on {have} GPUs: ranks would share GPUs (NCCL refuses that)",
            f"--nproc-per-node {have} or fewer for {hf.host.host}",
        )
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


def _cpu_host(hf: HostFacts, f: Facts, procs: int) -> Finding:
    cpus = f.get("cpus")
    if cpus and procs > cpus:
        return Finding(
            "gpus",
            Status.WARN,
            f"CPU host, {procs} processes on {cpus} CPUs: they will slow each other down",
            f"`nproc: {cpus}` or fewer for {hf.host.host} in the inventory (or "
            f"--nproc-per-node {cpus})",
        )
    return Finding("gpus", Status.OK, f"CPU host, {procs} process(es)")


def _port(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    port = (hf.facts or {}).get("port")
    if port is None:
        return None
    if ctx.auto_port:
        return _auto_port(hf, port)
    pick = "pass `--port auto` (node 0 then picks a free pair), or"
    if port.get("free") and port.get("peer_free") is False:
        peer = ctx.rdzv_port + 1
        return Finding(
            "port",
            Status.FAIL,
            f"port {peer} (sshddp's supervisors, rendezvous port + 1) is taken "
            f"({port.get('peer_error')})",
            f"{pick} find the holder with `ss -ltnp 'sport = :{peer}'` on {hf.host.host}",
        )
    if port.get("free"):
        return Finding("port", Status.OK, f"ports {ctx.rdzv_port} and {ctx.rdzv_port + 1} free")
    return Finding(
        "port",
        Status.FAIL,
        f"rendezvous port {ctx.rdzv_port} is taken ({port.get('error')})",
        f"{pick} find the holder with `ss -ltnp 'sport = :{ctx.rdzv_port}'` on {hf.host.host}",
    )


def _auto_port(hf: HostFacts, port: PortFacts) -> Finding:
    chosen = port.get("port")
    if chosen is None or not port.get("free"):
        return Finding(
            "port",
            Status.FAIL,
            f"no free pair of ports for the rendezvous: {port.get('error')}",
            f"free some ports on {hf.host.host} (`ss -ltnp` lists their holders), or give one "
            "with --port N / `rendezvous: {port: N}`",
        )
    first = int(port.get("auto") or chosen)
    skipped = f"; {first}-{chosen - 1} were taken" if chosen > first else ""
    return Finding("port", Status.OK, f"picked ports {chosen} and {chosen + 1}{skipped}")


def _rdzv(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    r = (hf.facts or {}).get("rendezvous")
    if r is None:
        return Finding(
            "rdzv",
            Status.SKIP,
            "not tested (no probe from the rendezvous host, or none from this one)",
        )
    port = int(r.get("port") or ctx.rdzv_port)
    target = endpoint(ctx.rdzv_addr, port)
    if r.get("ok"):
        return Finding("rdzv", Status.OK, f"connects to {target}")
    if ctx.rdzv_host_set:
        where = (
            f"`rendezvous.host` is {ctx.rdzv_addr} in {ctx.inventory or 'the inventory'}: set it "
            "to an address of the first host that every host can reach, or delete it (the "
            "first host's address is used then)"
        )
    else:
        where = "set `addr:` of the first host to an address both can use"
    return Finding(
        "rdzv",
        Status.FAIL,
        f"cannot connect to the rendezvous {target}: {r.get('error')}",
        f"open TCP port {port} on the first host to {hf.host.host} (firewall, security "
        f"group), or {where}",
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


# --- what the checks share: the ranks' environment and where things are -------------------


def ranks_env(hf: HostFacts, ctx: Context) -> dict[str, rankenv.EnvValue]:
    """The watched variables the host's ranks get: login, inventory env, --env."""
    f = hf.facts or {}
    login = dict(f.get("login_env") or {})
    cvd = f.get("cuda_visible_devices")
    if cvd is not None:
        login.setdefault(rankenv.CUDA_VISIBLE_DEVICES, cvd)
    return rankenv.ranks_env(login, hf.host.env, dict(ctx.cli_env))


def _shown(v: rankenv.EnvValue, ctx: Context) -> str:
    """``NAME='value'``, or ``NAME=***`` for a value that must not be shown."""
    if v.name in ctx.secret_names:
        return f"{v.name}={MASK}"
    return f"{v.name}={hide_url_credentials(v.value)!r}"


def _from(v: rankenv.EnvValue, host: Host) -> str:
    if v.source == "login":
        return f"(from {host.host}'s login environment)"
    return "(from the inventory's env)" if v.source == "inventory" else "(from --env)"


def _entry(host: Host, ctx: Context) -> str:
    """``hosts[i] (name, line L of inv.yaml)``: where to edit a host in the inventory."""
    where = f", line {host.line} of {ctx.inventory}" if host.line and ctx.inventory else ""
    return f"hosts[{host.index}] ({host.host}{where})"


def _gpus_entry(host: Host, ctx: Context) -> str:
    """Where the host's ``gpus:`` is given: its entry, or ``defaults:`` (for every host that
    does not set its own)."""
    line = host.gpus_defaults_line
    if not line:
        return _entry(host, ctx)
    where = f" (line {line} of {ctx.inventory})" if ctx.inventory else ""
    return f"`defaults:`{where}, which {host.host} takes it from (or in {_entry(host, ctx)})"


def _drop_var(v: rankenv.EnvValue, host: Host, ctx: Context) -> str:
    """How to stop setting ``v`` where it comes from."""
    if v.source == "--env":
        return f"drop `--env {v.name}` from the command line"
    if v.source == "inventory":
        return (
            f"delete {v.name} from `env:` of {_entry(host, ctx)}, or from `defaults: env:` "
            "if it is set there"
        )
    return (
        f"unset {v.name} in {host.host}'s login environment: remove it from the SSH user's "
        "shell startup files there (~/.bashrc, ~/.profile, /etc/environment), "
        "~/.ssh/environment, or sshd's SetEnv"
    )


def _most_common(values: Sequence[Any]) -> Any:
    """The most common value (ties: the earliest), None when there is none."""
    if not values:
        return None
    counts = Counter(values)
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)


def _combine(check: str, problems: list[tuple[Status, str, str]]) -> Finding:
    """One finding for several problems of one check: the worst status, every message."""
    status = Status.FAIL if any(p[0] is Status.FAIL for p in problems) else Status.WARN
    fixes = list(dict.fromkeys(p[2] for p in problems if p[2]))
    return Finding(check, status, "; ".join(p[1] for p in problems), "; ".join(fixes))


# --- fleet checks: every reachable host at once ---------------------------------------------


@dataclass(frozen=True)
class Twin:
    """Another inventory entry that is the same machine, and how that shows."""

    host: Host
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Fleet:
    """What a fleet check compares one host with: every reachable host."""

    route_dev: Optional[str] = None  #: the interface most hosts reach node 0 by
    route_mtu: Optional[int] = None  #: that interface's MTU on most hosts
    twins: dict[int, tuple[Twin, ...]] = field(default_factory=dict, hash=False)
    offsets: tuple[float, ...] = ()  #: every host's clock offset

    @classmethod
    def of(cls, live: Sequence[HostFacts], ctx: Context) -> Fleet:
        routes = [r for hf in live if (r := _route(hf)) is not None]
        clocks = [(hf.facts or {}).get("clock") for hf in live]
        return cls(
            route_dev=_most_common([dev for dev, _ in routes]),
            route_mtu=_most_common([mtu for _, mtu in routes if mtu]),
            twins=_twins(live, ctx),
            offsets=tuple(c["offset"] for c in clocks if c and "offset" in c),
        )


def _route(hf: HostFacts) -> Optional[tuple[str, Optional[int]]]:
    """(interface, MTU) by which the host reaches node 0, when known."""
    net = (hf.facts or {}).get("net") or {}
    dev = (net.get("route") or {}).get("dev")
    if not dev:
        return None
    return dev, (net.get("interfaces", {}).get(dev) or {}).get("mtu")


def used_gpus(hf: HostFacts, ctx: Context) -> set[str]:
    """UUIDs of the GPUs the host's ranks would use: those CUDA_VISIBLE_DEVICES leaves, one
    per process."""
    smi = (hf.facts or {}).get("nvidia_smi") or {}
    uuids = [g["uuid"] for g in smi.get("gpus", []) if g.get("uuid")]
    if not uuids or not hf.host.gpus:
        return set()
    cvd = ranks_env(hf, ctx).get(rankenv.CUDA_VISIBLE_DEVICES)
    visible = rankenv.visible_gpus(cvd.value, uuids) if cvd else uuids
    return set(visible[: ctx.nproc_override or hf.host.procs])


def _same_machine(a: HostFacts, b: HostFacts, ctx: Context) -> tuple[str, ...]:
    """How two entries show they are one machine (empty: they do not)."""
    sa, sb = (a.facts or {}).get("ssh") or {}, (b.facts or {}).get("ssh") or {}
    reasons = []
    if sa.get("host_key") and sa.get("host_key") == sb.get("host_key"):
        reasons.append(f"the same host key {sa['host_key']}")
    if sa.get("endpoint") and sa.get("endpoint") == sb.get("endpoint"):
        reasons.append(f"the same address and port {sa['endpoint']}")
    shared = sorted(used_gpus(a, ctx) & used_gpus(b, ctx))
    if shared:
        reasons.append(f"the same GPU{'s' if len(shared) > 1 else ''} {', '.join(shared)}")
    return tuple(reasons)


def _twins(live: Sequence[HostFacts], ctx: Context) -> dict[int, tuple[Twin, ...]]:
    found: dict[int, list[Twin]] = {}
    for i, a in enumerate(live):
        for b in live[i + 1 :]:
            reasons = _same_machine(a, b, ctx)
            if reasons:
                found.setdefault(a.host.index, []).append(Twin(b.host, reasons))
                found.setdefault(b.host.index, []).append(Twin(a.host, reasons))
    return {index: tuple(twins) for index, twins in found.items()}


def _unique(hf: HostFacts, fleet: Fleet, ctx: Context) -> Optional[Finding]:
    twins = fleet.twins.get(hf.host.index)
    if not twins:
        if not (hf.facts or {}).get("ssh"):
            return None
        return Finding("unique", Status.OK, "no other entry is this machine")
    twin = twins[0]
    first, later = sorted((hf.host, twin.host), key=lambda h: h.index)
    message = (
        f"{_entry(first, ctx)} and {_entry(later, ctx)} are one machine "
        f"({'; '.join(twin.reasons)}): the ranks of both would share its GPUs "
        "(NCCL: 'Duplicate GPU detected')"
    )
    fix = (
        f"list each machine once: delete {_entry(later, ctx)} and give {first.host} all of "
        "the machine's processes with `gpus:` (or `nproc:`)"
    )
    if all(r.startswith("the same host key") for r in twin.reasons):
        fix += (
            "; if they are two machines cloned from one image, give one of them new host "
            "keys (`sudo rm /etc/ssh/ssh_host_* && sudo ssh-keygen -A` there)"
        )
    return Finding("unique", Status.FAIL, message, fix)


def _env(hf: HostFacts, fleet: Fleet, ctx: Context) -> Optional[Finding]:
    env = ranks_env(hf, ctx)
    problems = [
        _stray(v, hf.host, ctx) for name, v in sorted(env.items()) if rankenv.is_stray(name)
    ]
    cvd = env.get(rankenv.CUDA_VISIBLE_DEVICES)
    hidden = _hidden_gpus(cvd, hf, ctx) if cvd else None
    problems += [hidden] if hidden else []
    if problems:
        return _combine("env", problems)
    return Finding("env", Status.OK, "nothing set that sshddp or torchrun sets for the ranks")


def _stray(v: rankenv.EnvValue, host: Host, ctx: Context) -> tuple[Status, str, str]:
    shown, where, fix = _shown(v, ctx), _from(v, host), _drop_var(v, host, ctx)
    if v.name == rankenv.NODE_RANK and v.value != str(host.index):
        return (
            Status.FAIL,
            f"{shown} {where} reaches node {host.index}'s ranks: a script or framework that "
            f"reads NODE_RANK (PyTorch Lightning does) takes the wrong node rank; sshddp sets "
            f"it with torchrun's --node-rank {host.index} (GROUP_RANK in the ranks)",
            fix,
        )
    if v.name == rankenv.NODE_RANK:
        why = "sshddp sets the node rank with torchrun's --node-rank (GROUP_RANK in the ranks)"
    elif v.name in rankenv.TORCHRUN_SETS:
        why = f"torchrun sets {v.name} for every rank, so this value never reaches them"
    else:
        why = "torchrun sets its TORCHELASTIC_* variables for the ranks, and reads some itself"
    return Status.WARN, f"{shown} {where}: {why}", fix


def _hidden_gpus(
    cvd: rankenv.EnvValue, hf: HostFacts, ctx: Context
) -> Optional[tuple[Status, str, str]]:
    """CUDA_VISIBLE_DEVICES leaving fewer GPUs than the inventory expects on the host."""
    want = hf.host.gpus or 0
    smi = (hf.facts or {}).get("nvidia_smi") or {}
    uuids = [g.get("uuid", f"#{i}") for i, g in enumerate(smi.get("gpus", []))] or None
    left = len(rankenv.visible_gpus(cvd.value, uuids))
    if want == 0 or left >= want:
        return None
    fix = _drop_var(cvd, hf.host, ctx)
    if left:
        fix += f", or set `gpus: {left}` for {_gpus_entry(hf.host, ctx)}"
    return (
        Status.FAIL,
        f"{_shown(cvd, ctx)} {_from(cvd, hf.host)} leaves {left} GPU(s) to the ranks; the "
        f"inventory expects {want} (gpus: {want})",
        fix,
    )


def _net(hf: HostFacts, fleet: Fleet, ctx: Context) -> Optional[Finding]:
    net = (hf.facts or {}).get("net")
    if net is None:
        return None
    host = hf.host.host
    if net.get("error"):
        return Finding(
            "net",
            Status.FAIL,
            f"{net['error']} (on {host})",
            f"make {ctx.rdzv_addr} resolvable on {host} (DNS or /etc/hosts), or set `addr:` "
            "of the first host to its IP address",
        )
    target = str(net.get("target"))
    route = net.get("route") or {}
    dev = route.get("dev")
    if not dev:
        return Finding(
            "net",
            Status.FAIL,
            f"{host} has no route to node 0's address {target}",
            f"give {host} a route to {target} (`ip route get {target}` there says why not)",
        )
    mtu = (net.get("interfaces", {}).get(dev) or {}).get("mtu")
    env = ranks_env(hf, ctx)
    named = [env[v] for v in (rankenv.NCCL_SOCKET_IFNAME, rankenv.GLOO_SOCKET_IFNAME) if v in env]
    problems = [p for v in named if (p := _ifname_problem(v, hf, net, dev, ctx))]
    if not named:
        problems += _odd_interface(hf, fleet, dev, ctx)
    if mtu and fleet.route_mtu and mtu != fleet.route_mtu:
        problems.append(_odd_mtu(host, dev, mtu, fleet.route_mtu))
    if problems:
        return _combine("net", problems)
    picks = "".join(f"; {_shown(v, ctx)} selects it" for v in named)
    return Finding(
        "net", Status.OK, f"{dev} ({route.get('src')}, MTU {mtu}) reaches {target}{picks}"
    )


def selected_interfaces(v: rankenv.EnvValue, interfaces: dict[str, InterfaceFacts]) -> list[str]:
    """The interfaces an NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME value selects on a host
    (gloo: every name it gives, present or not)."""
    if v.name == rankenv.GLOO_SOCKET_IFNAME:
        return rankenv.gloo_interfaces(v.value)
    return [n for n in rankenv.nccl_interfaces(v.value, interfaces) if interfaces[n].get("addrs")]


def _ifname_problem(
    v: rankenv.EnvValue, hf: HostFacts, net: NetFacts, dev: str, ctx: Context
) -> Optional[tuple[Status, str, str]]:
    interfaces = net.get("interfaces", {})
    names = selected_interfaces(v, interfaces)
    missing = [n for n in names if n not in interfaces]
    target = str(net.get("target"))
    unrouted = [n for n in names if n in interfaces and not reaches(net, n, target)]
    shown, where, host = _shown(v, ctx), _from(v, hf.host), hf.host.host
    has = ", ".join(sorted(n for n, i in interfaces.items() if i.get("up"))) or "none up"
    secret = v.name in ctx.secret_names  # then its value, interface names too, stays unsaid

    def listed(found: list[str]) -> str:
        return "an interface" if secret else ", ".join(found)

    if missing:
        message = f"{shown} {where} names {listed(missing)}, which {host} does not have"
        message += f" (it has {has})"
    elif not names:
        message = f"{shown} {where} matches no interface of {host} with an address (it has {has})"
    elif len(unrouted) == len(names) or (v.name == rankenv.GLOO_SOCKET_IFNAME and unrouted):
        message = (
            f"{shown} {where} selects {listed(unrouted)} on {host}, which has no route to "
            f"node 0's address {target}"
        )
    else:
        return None
    fix = f"under `env:` of {_entry(hf.host, ctx)}, set `{v.name}: {dev}` (the interface "
    fix += f"{host} reaches node 0 by)"
    if v.source == "--env":
        fix = f"drop `--env {v.name}` (it sets every host alike) and, {fix}"
    return Status.FAIL, message, fix


def reaches(net: NetFacts, name: str, target: str) -> bool:
    """Whether interface ``name`` is up and carries a route to ``target``: the target is in
    one of its subnets, or a route of the main table through it (the default one too)
    covers the target."""
    info = net.get("interfaces", {}).get(name)
    if not info or not info.get("up", True):
        return False
    ip = ipaddress.ip_address(target)
    for cidr in info.get("addrs") or []:
        own = ipaddress.ip_interface(cidr)
        if own.ip == ip or (own.version == ip.version and ip in own.network):
            return True
    for route in net.get("routes") or []:
        if route.get("dev") != name:
            continue
        dst = route.get("dst", "")
        if dst == "default" or (dst and _covers(dst, ip)):
            return True
    return False


def _covers(dst: str, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    try:
        net = ipaddress.ip_network(dst, strict=False)
    except ValueError:
        return False
    return net.version == ip.version and ip in net


def _odd_interface(
    hf: HostFacts, fleet: Fleet, dev: str, ctx: Context
) -> list[tuple[Status, str, str]]:
    if not fleet.route_dev or dev == fleet.route_dev:
        return []
    names = f"`{rankenv.NCCL_SOCKET_IFNAME}: {dev}` and `{rankenv.GLOO_SOCKET_IFNAME}: {dev}`"
    return [
        (
            Status.WARN,
            f"{hf.host.host} reaches node 0 by {dev}, most hosts by {fleet.route_dev}; with "
            "no NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set, NCCL and gloo pick an interface "
            "on each host on their own",
            f"name each host's interface: under `env:` of {_entry(hf.host, ctx)}, set {names}",
        )
    ]


def _odd_mtu(host: str, dev: str, mtu: int, ref: int) -> tuple[Status, str, str]:
    return (
        Status.WARN,
        f"MTU {mtu} on {dev}; most hosts reach node 0 with MTU {ref}: messages larger than "
        "the smaller MTU can stall (NCCL hangs)",
        f"set the same MTU everywhere, e.g. `sudo ip link set dev {dev} mtu {ref}` on {host}",
    )


def _clock(hf: HostFacts, fleet: Fleet, ctx: Context) -> Optional[Finding]:
    clock = (hf.facts or {}).get("clock")
    if not clock or "offset" not in clock:
        return None
    offset, error = clock["offset"], clock.get("rtt", 0.0) / 2
    least = abs(offset) - error  # what the offset is at least, given the round trip
    side = "ahead of" if offset > 0 else "behind"
    message = f"clock {_duration(abs(offset))} {side} this machine's (±{_duration(error)})"
    if least <= defaults.CLOCK_WARN:
        return Finding("clock", Status.OK, message)
    status = Status.FAIL if least > defaults.CLOCK_FAIL else Status.WARN
    bound = defaults.CLOCK_FAIL if status is Status.FAIL else defaults.CLOCK_WARN
    others = [o for o in fleet.offsets if o is not offset]
    if len(fleet.offsets) > 1 and all(abs(o - offset) <= defaults.CLOCK_WARN for o in others):
        fix = (
            f"every host is about {abs(offset):.0f} s {side} this machine: this machine's "
            "clock is the odd one; turn on its time sync (`sudo timedatectl set-ntp true`)"
        )
    else:
        fix = (
            f"turn on time sync on {hf.host.host}: `sudo timedatectl set-ntp true` "
            "(systemd-timesyncd), or run chrony or ntpd there"
        )
    return Finding("clock", status, f"{message}: more than {bound:.0f} s off", fix)


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.1f} s"


#: Distributions whose name differs from the module they install (a fix installs them).
_DISTRIBUTIONS = {
    "yaml": "pyyaml",
    "cv2": "opencv-python",
    "sklearn": "scikit-learn",
    "skimage": "scikit-image",
    "PIL": "pillow",
    "bs4": "beautifulsoup4",
    "dateutil": "python-dateutil",
    "dotenv": "python-dotenv",
    "jwt": "pyjwt",
    "zmq": "pyzmq",
    "git": "gitpython",
    "attr": "attrs",
}


def _imports(hf: HostFacts, fleet: Fleet, ctx: Context) -> Optional[Finding]:
    imp = ctx.imports
    if imp is None:
        return None
    if imp.error:
        return Finding("imports", Status.SKIP, f"not checked: {imp.error}")
    if not imp.names:
        what = f"{len(imp.shipped)} shipped with it" if imp.shipped else "none to look for"
        return Finding("imports", Status.OK, f"imports of {imp.script}: {what}")
    f = hf.facts or {}
    looked = f.get("imports") or {}
    if _no_python(f) or "found" not in looked:
        why = looked.get("error") or _NOT_CHECKED.removeprefix("not checked ")
        return Finding("imports", Status.SKIP, f"not checked: {why}")
    missing = [n for n in imp.names if not looked["found"].get(n)]
    if not missing:
        return Finding("imports", Status.OK, f"{len(imp.names)} module(s) found")
    return Finding(
        "imports",
        Status.FAIL,
        f"{imp.script} imports {', '.join(missing)}, which {hf.host.python} on {hf.host.host} "
        "does not find (with the ranks' environment)",
        "; ".join(_import_fix(n, hf, imp) for n in missing),
    )


def _import_fix(name: str, hf: HostFacts, imp: ScriptImports) -> str:
    if name == "torch":  # the torch check pins the build the other hosts have
        return "install torch as the torch check says (the other hosts' build)"
    if name in imp.beside:
        folder = posixpath.dirname(imp.script) or "."
        return (
            f"{name} is next to {imp.script} here but only the script is shipped: ship the "
            f"folder with `--workdir {shlex.quote(folder)}`"
        )
    install = pip_install(hf, _DISTRIBUTIONS.get(name, name))
    return (
        f"{install}, or make {name} importable there (`PYTHONPATH:` under the host's `env:`), "
        "or ship it beside the script with --workdir"
    )


_FLEET_CHECKS: tuple[Callable[[HostFacts, Fleet, Context], Optional[Finding]], ...] = (
    _env,
    _net,
    _unique,
    _clock,
    _imports,
)


def visible_gpus(f: Facts) -> Optional[int]:
    """GPUs the host's processes would see: CUDA_VISIBLE_DEVICES's list when set (Slurm sets
    it in a job step), else every GPU found."""
    cvd = f.get("cuda_visible_devices")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "NoDevFiles"])
    return gpu_count(f)


def _slurm(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    """A Slurm node: the GPUs its processes see match the inventory, nobody set
    CUDA_VISIBLE_DEVICES by hand, and the job was not sized for one torchrun per GPU."""
    host, f = hf.host, hf.facts or {}
    if host.slurm_job is None:
        return None
    if _no_python(f):
        return Finding("slurm", Status.SKIP, _NOT_CHECKED)
    fails = _slurm_gpu_problems(host, f)
    if fails:
        text = "; ".join(message for message, _ in fails)
        return Finding("slurm", Status.FAIL, text, " ".join(fix for _, fix in fails))
    want = host.gpus or 0
    if want and (host.nproc or 0) > 1:
        return Finding(
            "slurm",
            Status.WARN,
            f"job {host.slurm_job} runs {host.nproc} tasks on this node: `srun torchrun` "
            f"would start {host.nproc} torchruns here, one per GPU, where one per node is "
            f"meant; sshddp starts one, with {want} processes",
            "in your own job scripts ask for --ntasks-per-node=1 and let torchrun start one "
            "process per GPU",
        )
    what = f"{want} GPU(s) visible" if want else f"CPU node, {host.procs} process(es)"
    return Finding("slurm", Status.OK, f"job {host.slurm_job}: {what}")


def _slurm_gpu_problems(host: Host, f: Facts) -> list[tuple[str, str]]:
    """(message, fix) of each GPU mistake on a Slurm node."""
    problems = []
    by_hand = host.env.get("CUDA_VISIBLE_DEVICES")
    session = f.get("cuda_visible_devices")
    if by_hand is None and host.transport == "ssh" and session is not None:
        by_hand = session  # over SSH Slurm sets none: the shell's startup files did
    if by_hand is not None:
        problems.append(
            (
                f"CUDA_VISIBLE_DEVICES={by_hand!r} is set by hand; Slurm gives each job step "
                "its own GPUs, and a fixed list makes every node use the same GPU numbers, "
                "allocated to this job or not",
                "remove CUDA_VISIBLE_DEVICES from the inventory's env and the shell startup "
                "files; ask Slurm for the GPUs (--gpus-per-node) and use transport: srun.",
            )
        )
    want, seen = host.gpus or 0, visible_gpus(f)
    if want and seen is not None and seen != want:
        where = "the job step" if host.transport == "srun" else "an SSH session"
        fix = (
            f"set gpus to what job {host.slurm_job} holds on the node (or drop gpus: from "
            f"defaults), or ask Slurm for {want} per node (--gpus-per-node={want})."
        )
        if host.transport == "ssh":
            fix = (
                "Slurm binds GPUs to job steps, not to SSH sessions: use transport: srun, "
                "so each node's ranks see exactly its allocated GPUs."
            )
        problems.append((f"{where} sees {seen} GPU(s), the inventory says {want}", fix))
    return problems


# --- doctor --health (model/health and protocol/gpu_health judge the facts) ---------------


def _as_finding(check: str, problems: Sequence[health.Problem]) -> Optional[Finding]:
    """One finding of ``check``: its warnings and failures, or its notes when all is well."""
    bad = [(Status(level), msg, fix) for level, msg, fix in problems if level != "ok"]
    if bad:
        return _combine(check, bad)
    notes = "; ".join(msg for _, msg, _ in problems)
    return Finding(check, Status.OK, notes) if notes else None


def _health(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    """The inventory's ``health:`` command."""
    result = (hf.facts or {}).get("health", {}).get("command")
    if result is None or not hf.host.health:
        return None
    problem = health.command_problem(hf.host.health, result, defaults.HEALTH_TIMEOUT)
    return _as_finding("health", [problem])


def _gpu_health(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    looks = (hf.facts or {}).get("health")
    if looks is None or "smi" not in looks:  # the health: command alone was asked
        return None
    found = looks.get("gpu_dev_count") or 0
    problems = gpus.smi_problems(looks.get("smi"), hf.host.gpus, found)
    return _as_finding("gpu_health", problems)


def _xid(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    """The kernel log's Xids, looked at where the host has NVIDIA GPUs."""
    looks = (hf.facts or {}).get("health")
    if looks is None or "kernel" not in looks:
        return None
    if looks.get("smi") is None and not looks.get("gpu_dev_count"):
        return None
    return _as_finding("xid", gpus.xid_problems(looks.get("kernel") or {}))


def _ib(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    ports = (hf.facts or {}).get("health", {}).get("ib")
    if not ports:
        return None
    problems = health.ib_problems(ports) or [("ok", f"{len(ports)} port(s) active", "")]
    return _as_finding("ib", problems)


def _dcgm(hf: HostFacts, refs: dict[str, Optional[str]], ctx: Context) -> Optional[Finding]:
    looks = (hf.facts or {}).get("health")
    if looks is None or "dcgm" not in looks:
        return None
    return _as_finding("dcgm", health.dcgm_problems(looks["dcgm"]))


_CHECKS: tuple[Callable[..., Optional[Finding]], ...] = (
    _ssh,
    _python,
    _torch,
    _parity("cuda", "CUDA", "install the same torch build (same +cuXXX) on every host"),
    _driver,
    _parity("nccl", "NCCL", "install the same torch build (its NCCL comes with it) everywhere"),
    _gpus,
    _gpu_model,
    _port,
    _rdzv,
    _workdir,
    _disk,
    _script,
    _slurm,
    _health,
    _gpu_health,
    _xid,
    _ib,
    _dcgm,
)


def reports_ok(reports: Sequence[HostReport]) -> bool:
    """No check failed on any host (warnings pass)."""
    return not any(r.failed for r in reports)
