"""The one composer of a node's command line (``protocol/compose.py``): each launcher's argv
from spec.json's structure, and ``--dry-run`` showing exactly what the host composes."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import pytest

from cli_helpers import sshddp
from sshddp.errors import ExitCode
from sshddp.model.commands import Program, TorchrunOptions
from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import CodeSpec, LaunchOptions, describe, make_plan
from sshddp.protocol import compose, contract
from sshddp.protocol.contract import SpecRecord
from sshddp.remote.node.supervisor import torchrun_argv

PY, RUNDIR = "/opt/py", "/w/runs/r1/n1"
AGENT, RANK = [PY, f"{RUNDIR}/agent.py"], [PY, f"{RUNDIR}/rank.py"]
STATIC = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "4"]
STATIC += ["--rdzv-backend", "static", "--rdzv-endpoint", "10.0.0.1:29500"]
STATIC += ["--rdzv-id", "r1", "--max-restarts", "0"]
HOSTILE = ("two words", 'it\'s "quoted"', "$HOME", "${local_rank}", "", "-m", "--no-python")


def spec(launcher: str, program: Program, torchrun: Optional[TorchrunOptions] = None) -> SpecRecord:
    """A spec.json's command part, through JSON as the host reads it."""
    record: SpecRecord = {"launcher": launcher, "program": program.record()}
    if torchrun is not None:
        record["torchrun"] = torchrun.record()
    return json.loads(json.dumps(record))  # type: ignore[no-any-return]


def torchrun(options: tuple[str, ...] = (), local_rank_arg: bool = False) -> TorchrunOptions:
    return TorchrunOptions(2, 1, 4, "10.0.0.1:29500", "r1", 0, options, local_rank_arg)


# ------------------------------------------------------------------- each launcher


def test_torchrun_runs_through_the_agent_shim_and_its_ranks_through_the_rank_shim() -> None:
    record = spec(
        contract.LAUNCH_TORCHRUN, Program("script", "train.py", ("--lr", "3")), torchrun()
    )
    argv = compose.node_argv(record, PY, RUNDIR)
    assert argv == [*AGENT, *STATIC, "--no-python", "--", *RANK, "train.py", "--lr", "3"]


def test_the_users_torchrun_options_come_after_sshddps_and_before_the_program() -> None:
    run = torchrun(("--tee=3", "--rdzv-backend=c10d"), local_rank_arg=True)
    record = spec(contract.LAUNCH_TORCHRUN, Program("module", "pkg.train", ("--x",)), run)
    argv = compose.node_argv(record, PY, RUNDIR)
    tail = ["--no-python", "--", *RANK, "-m", "pkg.train", "--x", compose.LOCAL_RANK_ARG]
    assert argv == [*AGENT, *STATIC, "--tee=3", "--rdzv-backend=c10d", *tail]


def test_torchrun_gets_every_program_argument_literal() -> None:
    record = spec(contract.LAUNCH_TORCHRUN, Program("script", "t.py", HOSTILE), torchrun())
    argv = compose.node_argv(record, PY, RUNDIR)
    # torchrun templates every argument after the program: each `$` goes doubled
    assert argv[-len(HOSTILE) - 1 :] == ["t.py", *(a.replace("$", "$$") for a in HOSTILE)]
    assert argv[: len(AGENT) + len(STATIC)] == [*AGENT, *STATIC]


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        (Program("script", "t.py", HOSTILE), ["t.py", *HOSTILE]),
        (Program("module", "pkg.m", ("a b",)), ["-m", "pkg.m", "a b"]),
    ],
)
def test_a_node_launcher_runs_the_program_through_the_rank_shim(
    program: Program, expected: list[str]
) -> None:
    assert compose.node_argv(spec(contract.LAUNCH_NODE, program), PY, RUNDIR) == [
        *RANK,
        *expected,
    ]


def test_a_command_runs_as_it_is() -> None:
    record = spec(contract.LAUNCH_COMMAND, Program("command", "accelerate", ("launch", *HOSTILE)))
    assert compose.node_argv(record, PY, RUNDIR) == ["accelerate", "launch", *HOSTILE]


# ------------------------------------------------- --dry-run is what the host runs

INV = "hosts:\n  - {host: a, nproc: 2, addr: 10.0.0.1}\n  - {host: b, nproc: 3}\n"
HERE = CodeSpec("file", "t.py", "/l/t.py")


@pytest.mark.parametrize(
    ("options", "code"),
    [
        (LaunchOptions(script="t.py", script_args=HOSTILE), HERE),
        (LaunchOptions(script="t.py", torchrun_args=("--tee=3",), local_rank_arg=True), HERE),
        (LaunchOptions(module="pkg.m", script_args=("a b",)), CodeSpec("none", "pkg.m")),
        (LaunchOptions(script="t.py", script_args=HOSTILE, launcher="node"), HERE),
        (
            LaunchOptions(launcher="node", command=("run", "{node_rank}", "it's", "$X")),
            CodeSpec("none", "run"),
        ),
    ],
)
def test_the_dry_run_shows_what_the_supervisor_starts(
    tmp_path: Path, options: LaunchOptions, code: CodeSpec
) -> None:
    """The same function on the same inputs: the dry run's command line, read back as a
    shell reads it, is what the node's supervisor composes from spec.json, given the host's
    interpreter (this one here) and the run directory."""
    text = f"defaults: {{python: {sys.executable}, workdir: {tmp_path}}}\n{INV}"
    inventory = parse_inventory(text, source="inv.yaml")
    plan = make_plan(inventory, options, "r1", code, lambda h: "10.0.0.1")
    shown = [ln[len("  command: ") :] for ln in describe(plan).splitlines() if "command:" in ln]
    for node, line in zip(plan.nodes, shown, strict=True):
        on_host = json.loads(json.dumps(plan.spec(node)))  # spec.json, as the host reads it
        assert shlex.split(line) == torchrun_argv(node.rundir, on_host)
        assert list(plan.argv(node)) == torchrun_argv(node.rundir, on_host)


def test_launch_dry_run_shows_the_composed_command(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("defaults: {python: /opt/py, workdir: /w}\nhosts:\n  - {host: h, nproc: 2}\n")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = sshddp(["launch", "--dry-run", "--name", "r1", str(inv), str(script), "it's"])
    assert result.code == ExitCode.OK, result.explain()
    (line,) = [ln for ln in result.out.splitlines() if ln.startswith("  command: ")]
    rundir = "/w/runs/r1/n0"
    assert shlex.split(line[len("  command: ") :]) == [
        "/opt/py",
        f"{rundir}/agent.py",
        *["--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "2", "--rdzv-backend", "static"],
        "--rdzv-endpoint",
        line.split("--rdzv-endpoint ")[1].split()[0],
        *["--rdzv-id", "r1", "--max-restarts", "0", "--no-python", "--", "/opt/py"],
        f"{rundir}/rank.py",
        "train.py",
        "it's",
    ]
