"""Rendering results for people and machines: the doctor table and JSON, and the run report.

Pure: everything here returns text or rich renderables; the CLI prints them.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

from sshddp import defaults
from sshddp.model import envvars, straggler
from sshddp.model.checks import CHECKS, HostFacts, HostReport, Status, reports_ok
from sshddp.model.escape import visible, visible_line
from sshddp.model.leftout import missing_hints
from sshddp.model.state import (
    NodeResult,
    NodeState,
    RunResult,
    never_talked,
    peer_cause,
    stop_reason,
)

if TYPE_CHECKING:  # rich is imported when a table is printed: a launch never needs it
    from rich.console import RenderableType

_SYMBOL = {Status.OK: "ok", Status.WARN: "warn", Status.FAIL: "FAIL", Status.SKIP: "-"}
_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.SKIP: "dim"}


def doctor_table(reports: Sequence[HostReport]) -> list[RenderableType]:
    """One row per host, one column per check, then every problem with its fix."""
    from rich.markup import escape
    from rich.table import Table

    used = [c for c in CHECKS if any(r.get(c) for r in reports)]
    table = Table(show_lines=False, header_style="bold")
    table.add_column("node")
    table.add_column("host")
    for check in used:
        table.add_column(check)
    for r in reports:
        cells = []
        for check in used:
            f = r.get(check)
            cells.append("" if f is None else f"[{_STYLE[f.status]}]{_SYMBOL[f.status]}[/]")
        table.add_row(str(r.host.index), escape(r.host.host), *cells)
    return [table, *_problems(reports)]


def _problems(reports: Sequence[HostReport]) -> list[RenderableType]:
    from rich.markup import escape

    problems = [
        (r, f) for r in reports for f in r.findings if f.status in (Status.FAIL, Status.WARN)
    ]
    if not problems:
        return [f"All checks passed on {len(reports)} host(s)."]
    lines: list[RenderableType] = [""]
    for r, f in problems:
        label = "FAIL" if f.status is Status.FAIL else "warn"
        host, msg = escape(r.host.host), escape(visible(f.message))
        lines.append(f"[{_STYLE[f.status]}]{label}[/] {host} [bold]{f.check}[/]: {msg}")
        if f.fix:
            lines.append(f"     fix: {escape(visible(f.fix))}")
    fails = sum(1 for _, f in problems if f.status is Status.FAIL)
    warns = len(problems) - fails
    lines.append(f"\n{fails} failing check(s), {warns} warning(s) on {len(reports)} host(s).")
    return lines


def launch_warnings(reports: Sequence[HostReport]) -> list[str]:
    """The preflight's warnings, as a launch prints them before it starts (plain text)."""
    lines = []
    for r in reports:
        for f in r.findings:
            if f.status is Status.WARN:
                fix = f"\n  fix: {f.fix}" if f.fix else ""
                lines.append(f"sshddp: warning: {r.host.host} {f.check}: {f.message}{fix}")
    return lines


#: Version of ``sshddp doctor --json``'s document; bump it when its shape changes. Output
#: without ``schema`` came from version 1 (no env, net, unique, clock or imports checks).
DOCTOR_JSON_SCHEMA = 2


def doctor_json(
    facts: Sequence[HostFacts],
    reports: Sequence[HostReport],
    secret_names: frozenset[str] = frozenset(),
) -> str:
    """``doctor --json``: the schema version, the verdict, and per host its facts (as its
    probe reported them, plus ``ssh`` and ``clock`` measured here) and findings (docs/doctor.md,
    "doctor --json"). No value of a variable in ``secret_names`` is written."""
    hosts: list[dict[str, Any]] = []
    for hf, r in zip(facts, reports):
        findings = [
            {"check": f.check, "status": f.status.value, "message": f.message, "fix": f.fix}
            for f in r.findings
        ]
        host_facts: Optional[dict[str, Any]] = dict(hf.facts) if hf.facts is not None else None
        login = (hf.facts or {}).get("login_env")
        if host_facts is not None and login:
            host_facts["login_env"] = envvars.masked(login, secret_names)
        hosts.append(
            {
                "host": r.host.host,
                "node": r.host.index,
                "facts": host_facts,
                "error": hf.error,
                "findings": findings,
            }
        )
    doc = {"schema": DOCTOR_JSON_SCHEMA, "ok": reports_ok(reports), "checks": list(CHECKS)}
    return json.dumps({**doc, "hosts": hosts}, indent=2, sort_keys=False)


_RANK_RE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT_RE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_SIGNAL_RE = re.compile(r"Signal (\d+) \((SIG\w+)\)")


def torchrun_failure(lines: Sequence[str]) -> dict[str, Any]:
    """What torchrun's failure summary says of its root cause: ranks, exit code, signal."""
    start = max((i for i, line in enumerate(lines) if "Root Cause" in line), default=0)
    found: dict[str, Any] = {}
    for line in lines[start:]:
        if m := _RANK_RE.search(line):
            found.setdefault("rank", int(m.group(1)))
            found.setdefault("local_rank", int(m.group(2)))
        elif m := _EXIT_RE.search(line):
            code = int(m.group(1))
            found.setdefault("exitcode", code)
            if code < 0:
                found.setdefault("signal", _signame(-code))
        elif m := _SIGNAL_RE.search(line):
            found.setdefault("signal", m.group(2))
    return found


# What node launchers say of a worker that failed: torch.multiprocessing.spawn's
# ProcessRaisedException / ProcessExitedException, and Lightning's child-process observer.
_LAUNCHER_RES = (
    (re.compile(r"-- Process (\d+) terminated with the following error"), "mp.spawn"),
    (re.compile(r"\bprocess (\d+) terminated with (?:signal|exit code) (\S+)"), "mp.spawn"),
    (
        re.compile(r"\[rank: (\d+)\] Child process with PID \d+ terminated with code (-?\d+)"),
        "Lightning",
    ),
)


# torch prefixes an uncaught error's traceback with ``[rankN]:``; a peer's follow-on error
# (its connection to the failed rank closed) is not the root cause.
_RANK_ERROR_RE = re.compile(r"^\[rank(\d+)\]: [\w.]*(?:Error|Exception)\b")
_FOLLOW_ON = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def launcher_failure(lines: Sequence[str]) -> dict[str, Any]:
    """Which worker failed first, as a node launcher says (its ``local_rank``, and ``by``
    whom), and the first global ``rank`` whose own traceback (``[rankN]:``) ends in an
    error of its own rather than a peer's follow-on."""
    found: dict[str, Any] = {}
    for line in lines:
        for pattern, who in _LAUNCHER_RES:
            if "by" not in found and (m := pattern.search(line)):
                found.update(local_rank=int(m.group(1)), by=who)
        m = _RANK_ERROR_RE.match(line)
        if "rank" not in found and m and not any(text in line for text in _FOLLOW_ON):
            found["rank"] = int(m.group(1))
    return found


def _signame(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def user_tail(
    lines: Sequence[str], n: int = defaults.TAIL_LINES, rank: Optional[int] = None
) -> list[str]:
    """The last ``n`` lines of the ranks' own output, without torchrun's failure summary.

    When torchrun names the failing ``rank`` and that rank's error lines are there (torch
    prefixes them ``[rankN]:``), those: the other ranks' follow-on errors (a peer closed the
    connection) would otherwise push the root cause's traceback out of the tail.
    """
    if rank is not None:
        own = [line for line in lines if line.startswith(f"[rank{rank}]:")]
        if own:
            return own[-n:]
    cut = len(lines)
    for i in range(len(lines) - 1, -1, -1):
        if "ChildFailedError" in lines[i]:
            cut = i
            break
    if cut < len(lines):  # also drop torchrun's own traceback just above its summary
        for i in range(cut - 1, max(-1, cut - 40), -1):
            if lines[i].startswith("Traceback (most recent call last)"):
                cut = i
                break
    return list(lines[:cut])[-n:]


TAIL_PREFIX = "  | "  #: before each line of a rank's output in the report: no rank can
#: print a line that reads as one of sshddp's own


def run_report(
    result: RunResult, full_tail: Sequence[str], ranks_tail: Optional[Sequence[str]] = None
) -> str:
    """Every node's state, then the root cause with the failing node's last lines (a
    successful run that never formed its world: a warning that says so). ``full_tail``
    holds every line of the node's log (torchrun's failure summary names the failing rank);
    ``ranks_tail``, where the node's log tells them apart, the ranks' lines alone: the ones
    shown, unless the ranks wrote none (then torchrun's own last lines are).

    Whatever came from the hosts (reasons, the ranks' lines) is shown with its control
    characters escaped (``escape.visible``): it cannot move the cursor or forge a line.
    The hosts the run's end quarantined close it (``model/quarantine.py``)."""
    said = "\n".join(visible(q) for q in result.quarantined)
    return _report(result, full_tail, ranks_tail) + ("\n" + said if said else "")


def _report(
    result: RunResult, full_tail: Sequence[str], ranks_tail: Optional[Sequence[str]]
) -> str:
    out = [f"sshddp: run {result.run_id} " + _verdict(result)]
    for n in result.nodes:
        detail = visible(n.reason or "")
        if n.returncode not in (None, 0) and not n.reason:
            detail = f"exit code {n.returncode}"
        out.append(f"  node {n.node_rank:<3} {n.host:<20} {n.state.value:<12} {detail}".rstrip())
    out.extend(attempts_lines(result))
    out.extend(world_warning(result))
    out.extend(usage_lines(result))
    out.extend(straggler_lines(result))
    if result.cause and not result.ok:
        out.append(f"root cause: {result.cause}")
        return "\n".join(out)
    node = result.root
    if result.hung and result.hang_cause:
        out.append(f"root cause: {visible(result.hang_cause)}")
    elif node is None:
        cause = peer_cause(result)
        if cause:
            out.append(f"root cause (as the supervisors saw it): {visible(cause)}")
    if node is None:
        return "\n".join(out)
    rank = None if result.hung and result.hang_cause else _root_line(out, node, full_tail)
    # The ranks' own lines where they wrote any (torchrun's banner stays out); where none
    # did, torchrun's (or the node launcher's) own last lines: its error is the news.
    shown = ranks_tail if ranks_tail else full_tail
    out.extend(_tail_lines(node, shown, rank))
    out.extend(f"hint: {hint}" for hint in missing_hints(shown, result.left_out))
    return "\n".join(out)


def _root_line(out: list[str], node: NodeResult, full_tail: Sequence[str]) -> Optional[int]:
    """Add the root-cause line of a failed node; the global rank whose lines to show."""
    info = torchrun_failure(full_tail)
    where = f"node {node.node_rank} on {node.host}"
    if "rank" in info:
        where += f", global rank {info['rank']} (local rank {info['local_rank']})"
    elif said := launcher_failure(full_tail):
        if "by" in said:
            where += f", local rank {said['local_rank']} (as {said['by']} says)"
        else:
            where += f", global rank {said['rank']} (as its traceback says)"
        if "rank" in said:  # the tail shows that rank's own lines
            info["rank"] = said["rank"]
    out.append(f"root cause: {where}: {visible(_how(info, node.reason or node.state.value))}")
    return info.get("rank")


def _tail_lines(node: NodeResult, full_tail: Sequence[str], rank: Optional[int]) -> list[str]:
    """The node's last lines, what they hint at, and where its full log is."""
    out = []
    tail = user_tail(full_tail, rank=rank)
    if tail:
        out.append(f"--- last {len(tail)} lines of node {node.node_rank}'s output ---")
        out.extend(TAIL_PREFIX + visible_line(line) for line in tail)
        out.append("---")
    out.extend(f"hint: {hint}" for hint in failure_hints(tail))
    if node.log_path:
        out.append(f"full log: {visible(str(node.log_path))}")
    return out


_LOCAL_RANK_REQUIRED = re.compile(r"error: the following arguments are required: .*--local_rank")
_UNRECOGNIZED = re.compile(r"error: unrecognized arguments: .*(--local[-_]rank)")
_PLACEHOLDER = re.compile(r"\{(node_rank|nnodes|master_addr|master_port|nproc|world_size)\}")


def failure_hints(lines: Sequence[str]) -> list[str]:
    """What a failed node's last lines say of a well-known mistake, and its fix: a script
    written for torch.distributed.launch (``--local_rank``), a placeholder given to torchrun
    literally."""
    hints: list[str] = []
    for line in lines:
        if _LOCAL_RANK_REQUIRED.search(line):
            hints.append(
                "the script wants --local_rank (written for torch.distributed.launch), which "
                "torchrun does not pass (it sets LOCAL_RANK): launch with --local-rank-arg, or "
                "read os.environ['LOCAL_RANK'] in the script"
            )
        elif m := _UNRECOGNIZED.search(line):
            hints.append(_unrecognized_hint(m.group(1)))
        elif m := _PLACEHOLDER.search(line):
            hints.append(
                f"{m.group(0)} reached the script as it is: placeholders are expanded only in "
                "a command after `--` with --launcher node (`sshddp launch --launcher node "
                "INVENTORY -- COMMAND {node_rank} ...`); torchrun's ranks read RANK, "
                "LOCAL_RANK, WORLD_SIZE and GROUP_RANK from their environment"
            )
    return list(dict.fromkeys(hints))


def _unrecognized_hint(option: str) -> str:
    if option == "--local-rank":
        return (
            "the script's parser does not take --local-rank (what torch.distributed.launch "
            "passes since torch 2.0): accept both spellings, "
            "`parser.add_argument('--local-rank', '--local_rank', type=int)`, or read "
            "os.environ['LOCAL_RANK']"
        )
    return (
        "the script does not take --local_rank: launch it without --local-rank-arg "
        "(torchrun's ranks read LOCAL_RANK from their environment)"
    )


def world_warning(result: RunResult) -> list[str]:
    """A run that succeeded without forming its planned world: the warning, with every
    node's numbers, the likely cause and the fix (nothing for a distributed run)."""
    if not result.undistributed:
        return []
    worlds = [(n, n.world) for n in result.nodes if n.world is not None]
    planned = worlds[0][1].planned
    sizes = sorted({s for _, w in worlds for s in w.sizes})
    silent = never_talked(result.nodes)
    said = _silent_said(planned) if silent else _world_said(planned, sizes)
    out = [f"sshddp: WARNING: run {result.run_id} was not distributed: " + said]
    for n, w in worlds:
        seen = f" (world size {_sizes(w.sizes)})" if w.sizes else ""
        out.append(
            f"  node {n.node_rank:<3} {n.host:<20} {w.joined} of {w.ranks} process(es) "
            f"joined a process group{seen}"
        )
    out.extend(_silent_fix() if silent else _world_fix(bool(sizes)))
    out.append("  (the exit code stays 0: the processes themselves succeeded)")
    return out


IDLE_BELOW = 0.5  #: a node's mean GPU use below this times the others' median is idle
IDLE_BUSY = 20.0  #: % mean use: a median below this means no node worked, so none idled


def usage_lines(result: RunResult) -> list[str]:
    """Per node with GPUs, their mean utilisation and peak memory, and the nodes whose GPUs
    sat mostly idle while the others worked; nothing at all for a run without GPUs."""
    used = [(n, n.usage) for n in result.nodes if n.usage is not None]
    if not used:
        return []
    out = ["GPUs (mean utilisation, peak memory of one GPU):"]
    for n, u in used:
        peak = "-" if u.mem_peak is None else _gib(u.mem_peak)
        of = "" if u.mem_total is None or u.mem_peak is None else f" of {_gib(u.mem_total)}"
        out.append(f"  node {n.node_rank:<3} {n.host:<20} {u.gpus} GPU  {u.util:.0f}%  {peak}{of}")
    median = statistics.median(u.util for _, u in used)
    idle = [(n, u) for n, u in used if median >= IDLE_BUSY and u.util < IDLE_BELOW * median]
    if len(used) >= 2 and idle:
        named = ", ".join(f"node {n.node_rank} ({n.host}) averaged {u.util:.0f}%" for n, u in idle)
        out.append(f"idle GPUs: {named} against a median of {median:.0f}%")
    return out


def straggler_lines(result: RunResult) -> list[str]:
    """The rank the others waited for over the nodes' kept stack samples (``straggler``),
    with its evidence; nothing when nobody was, or the samples were too few."""
    ranks = [(rank, n.host, w) for n in result.nodes for rank, w in sorted(n.waits.items())]
    said = straggler.line(straggler.judge(ranks))
    return [visible(said)] if said else []


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _sizes(sizes: Sequence[int]) -> str:
    return ", ".join(str(s) for s in sorted(set(sizes)))


def _world_said(planned: int, sizes: Sequence[int]) -> str:
    if not sizes:
        return (
            f"none of its processes called torch.distributed.init_process_group, so they "
            f"never formed the planned world of {planned}: each ran on its own"
        )
    return (
        f"its processes formed process groups of size {_sizes(sizes)}, never one of the "
        f"planned world size {planned}"
    )


def _silent_said(planned: int) -> str:
    return (
        f"the world formed (size {planned} of {planned}), but no collective ran on it (no "
        "all-reduce, broadcast or barrier): its processes never exchanged a tensor"
    )


def _silent_fix() -> list[str]:
    """What was seen first, then the guesses: the script itself, then a framework."""
    return [
        "  seen: every process joined the world, and each said as it left that no "
        "collective ran on its groups",
        "  likely cause (a guess): the script never calls one (a model not wrapped in "
        "DistributedDataParallel, no all-reduce), or a framework chose to run each process "
        "alone: accelerate (and a transformers Trainer, built on it) does so on hosts "
        "without a GPU unless told to use the CPU",
        "  fix: wrap the model in DistributedDataParallel (or call the collectives); for "
        "accelerate or a Trainer on CPU hosts, `--env ACCELERATE_USE_CPU=1`, or in the code "
        "`Accelerator(cpu=True)` / `TrainingArguments(use_cpu=True)`",
    ]


def _world_fix(joined: bool) -> list[str]:
    if joined:
        return [
            "  likely cause: each node (or each launcher) formed a world of its own: a "
            "command after `--` must pass the run's figures ({nnodes}, {node_rank}, "
            "{world_size}, {master_addr}, {master_port}), and init_process_group must not "
            "be given a world_size of its own"
        ]
    return [
        "  likely cause: the script never reaches init_process_group (it exits first, "
        "or never calls it), or a framework chose to run each process alone: accelerate "
        "(and a transformers Trainer, built on it) does so on hosts without a GPU unless "
        "told to use the CPU",
        "  fix: call torch.distributed.init_process_group; for accelerate on CPU hosts, "
        "`--env ACCELERATE_USE_CPU=1` or `Accelerator(cpu=True)`",
    ]


def attempts_lines(result: RunResult) -> list[str]:
    """With ``--max-restarts``: the attempt the run ended in, of how many, and why each
    earlier one ended (the node that went furthest says; every node restarts together)."""
    if not result.nodes:
        return []
    last = max(result.nodes, key=lambda n: n.attempt)
    if last.attempts <= 1:
        return []
    out = [f"attempt {last.attempt} of {last.attempts}"]
    for k, why in enumerate(last.earlier, 1):
        out.append(f"  attempt {k} ended: {visible(why)}; every node restarted")
    return out


def attempt_line(attempt: int, attempts: object, why: str) -> str:
    """What the console says when every node starts ``attempt`` (``--max-restarts``)."""
    of = f" of {attempts}" if isinstance(attempts, int) else ""
    return f"sshddp: attempt {attempt}{of}: {visible(why)}; restarting every node"


def replacement(node_rank: int, host: str, lost: str, attempt: object) -> str:
    """How ``top`` and ``logs`` name a spare seated mid-run: ``node 2: h4 since attempt 2
    (h3 lost)``."""
    since = f" since attempt {attempt}" if isinstance(attempt, int) else ""
    return f"node {node_rank}: {host}{since} ({lost} lost)"


def attempt_marks(node: str, status: Mapping[str, Any]) -> list[tuple[int, str]]:
    """Where each attempt after the first starts in a node's log (from its status record),
    and the line ``logs`` prints there: node.log holds only the ranks' bytes."""
    offsets, earlier, attempts = (
        status.get("offsets"),
        status.get("earlier"),
        status.get("attempts"),
    )
    if not isinstance(offsets, list) or not isinstance(earlier, list):
        return []
    marks = []
    for k, (offset, why) in enumerate(zip(offsets[1:], earlier), 2):
        if isinstance(offset, int):
            text = f"sshddp: {node}: attempt {k} of {attempts} starts here; attempt {k - 1} ended: "
            marks.append((offset, text + visible(str(why))))
    return marks


def _how(info: dict[str, Any], otherwise: str) -> str:
    if "signal" in info:
        return f"killed by {info['signal']}"
    if "exitcode" in info:
        return f"exit code {info['exitcode']}"
    return otherwise


def _verdict(result: RunResult) -> str:
    """The run's end in words: the same for every command that reports it (launch, attach)
    since it follows from the nodes' states, which the hosts keep."""
    if result.ok:
        return "succeeded"
    if result.interrupted:
        return "was stopped: " + visible(stop_reason(result) or "interrupted by the user (Ctrl-C)")
    if result.log_error:
        return (
            f"goes on without us (detached): {visible(result.log_error)}. The hosts keep every "
            f"byte: free space, then `sshddp attach {result.run_id}` (or `sshddp logs`) "
            "completes the local logs"
        )
    if result.detached:
        return "goes on without us (detached)"
    if result.cause:
        return "was ended from outside: its Slurm job ended"
    stopped = stop_reason(result)
    if stopped:
        return f"was stopped: {visible(stopped)}"
    if any(n.state.unanswered for n in result.nodes):
        if peer_cause(result):  # a cut-off supervisor stops its own node
            return "failed; lost contact with some hosts, whose supervisors stop on their own"
        return "lost contact with some hosts; the run may still be going"
    if result.hung:
        return "hung: a watchdog stopped it (`sshddp stacks` shows the stacks it took)"
    gone = [str(n.node_rank) for n in result.nodes if n.state is NodeState.GONE]
    if gone and not any(n.state.bad for n in result.nodes):
        return (
            f"ended; how node(s) {', '.join(gone)} ended is unknown: their run directories "
            "are gone from their hosts"
        )
    return "failed"
