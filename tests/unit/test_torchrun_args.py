"""torchrun's own options (``--torchrun-arg``) and ``--local-rank-arg``: what passes, what
sshddp refuses, and where they land in torchrun's command."""

from __future__ import annotations

from pathlib import Path
from string import Template

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp.errors import ExitCode, UsageError
from sshddp.model.commands import Program, TorchrunOptions
from sshddp.model.torchrun import DOCUMENTED, OWNED, owned_by_sshddp, torchrun_args
from sshddp.protocol import compose, contract
from sshddp.protocol.contract import SpecRecord


def torchrun_argv(
    program: tuple[str, ...], options: tuple[str, ...] = (), local_rank_arg: bool = False
) -> tuple[str, ...]:
    """Node 1 of 2's command line, as its host composes it."""
    run = TorchrunOptions(2, 1, 2, "10.0.0.1:29500", "r1", 0, options, local_rank_arg)
    spec: SpecRecord = {
        "launcher": contract.LAUNCH_TORCHRUN,
        "torchrun": run.record(),
        "program": Program("script", program[0], program[1:]).record(),
    }
    return tuple(compose.node_argv(spec, "python3", "/w/runs/r1/n1"))


@pytest.mark.parametrize(
    "value",
    [
        "--local-ranks-filter=0",
        "--local_ranks_filter=0,1",
        "--rdzv-backend=c10d",
        "--rdzv-conf=timeout=900",
        "--tee=3",
        "-t3",
        "--redirects=1",
        "-r3",
        "--log-dir=torchrun-logs",
        "--monitor-interval=0.5",
        "--start-method=spawn",
        "--signals-to-handle=SIGTERM,SIGINT",
        "--virtual-local-rank",
    ],
)
def test_torchrun_options_pass_through_unchanged(value: str) -> None:
    assert torchrun_args([value]) == (value,)


@pytest.mark.parametrize(
    ("value", "owned"),
    [
        ("--nnodes=3", "--nnodes"),
        ("--nnod=3", "--nnodes"),  # argparse would take a unique prefix
        ("--node-rank=0", "--node-rank"),
        ("--node_rank=0", "--node-rank"),
        ("--nproc-per-node=8", "--nproc-per-node"),
        ("--nproc_per_node=8", "--nproc-per-node"),
        ("--nproc=8", "--nproc-per-node"),
        ("--rdzv-endpoint=h:1", "--rdzv-endpoint"),
        ("--rdzv_endpoint=h:1", "--rdzv-endpoint"),
        ("--rdzv-id=x", "--rdzv-id"),
        ("--master-port=1", "--master-port"),
        ("--master_addr=h", "--master-addr"),
        ("--standalone", "--standalone"),
        ("--max-restarts=3", "--max-restarts"),
        ("--no-python", "--no-python"),
        ("--no_python", "--no-python"),
        ("--module", "--module"),
        ("-m", "--module"),
        ("-mpkg", "--module"),
        ("--run-path", "--run-path"),
        ("--help", "--help"),
        ("-h", "--help"),
    ],
)
def test_options_sshddp_owns_are_refused_with_what_to_do(value: str, owned: str) -> None:
    assert owned_by_sshddp(value) == owned
    with pytest.raises(UsageError) as caught:
        torchrun_args(["--tee=3", value])
    message = caught.value.message
    assert message.startswith(f"--torchrun-arg {value!r}: sshddp sets torchrun's {owned}")
    assert OWNED[owned] in message


@pytest.mark.parametrize("value", ["3", "train.py", "--", "-", ""])
def test_a_value_on_its_own_is_refused(value: str) -> None:
    with pytest.raises(UsageError, match="expected one torchrun option, with its value after"):
        torchrun_args([value])


def test_the_documented_options_are_not_owned() -> None:
    assert [name for name in DOCUMENTED if owned_by_sshddp(name)] == []


def test_options_go_before_the_program_and_win_over_sshddp_defaults() -> None:
    argv = torchrun_argv(("train.py", "--lr", "$x"), ("--tee=3",))
    assert argv[argv.index("--no-python") - 1] == "--tee=3"
    assert argv[-3:] == ("train.py", "--lr", "$$x")
    # torchrun keeps the last value given: a passed --rdzv-backend overrides sshddp's static
    argv = torchrun_argv(("t.py",), ("--rdzv-backend=c10d",))
    assert argv.index("--rdzv-backend=c10d") > argv.index("static")


def test_local_rank_arg_is_the_one_argument_torchrun_templates() -> None:
    argv = torchrun_argv(("t.py", "${local_rank}"), local_rank_arg=True)
    assert argv[-2:] == ("$${local_rank}", "--local_rank=${local_rank}")
    # what torchrun does to each worker's arguments (torch.distributed.elastic.utils.api)
    worker = [Template(a).safe_substitute(local_rank="3") for a in argv[-3:]]
    assert worker == ["t.py", "${local_rank}", "--local_rank=3"]
    assert "--local_rank" not in " ".join(torchrun_argv(("t.py",)))


def test_launch_shows_them_in_the_dry_run(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {host: gpu-a, gpus: 2}\n")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    args = ["launch", "--dry-run", "--torchrun-arg=--local-ranks-filter=0", "--local-rank-arg"]
    result = sshddp([*args, inv, script, "--x"])
    assert result.code == ExitCode.OK, result.explain()
    command = next(ln for ln in result.out.splitlines() if ln.startswith("  command: "))
    assert "--local-ranks-filter=0 --no-python " in command
    assert command.endswith(" train.py --x '--local_rank=${local_rank}'")


def test_launch_refuses_an_owned_option_before_connecting(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  - {host: unreachable.invalid, gpus: 2}\n")
    result = sshddp(["launch", "--torchrun-arg=--nnodes=4", inv, "t.py"])
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "sshddp sets torchrun's --nnodes itself" in result.err
