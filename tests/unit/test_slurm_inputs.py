"""The pure parts of running on Slurm beyond the allocation itself: the YAML forms
(``hosts: {slurm: ...}``, ``defaults.transport``), the srun command line and how its
stderr is read, and the report of a run whose Slurm job ended."""

from __future__ import annotations

import pytest

from sshddp.errors import ExitCode, InventoryError
from sshddp.hosts.srun import PREAMBLE, exported_names, srun_argv
from sshddp.model.inventory import parse_inventory
from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, NodeState, RunResult

# ------------------------------------------------------------------------------ YAML


@pytest.mark.parametrize("job", ["current", "123", "123_4"])
def test_hosts_slurm_is_a_request_with_the_defaults(job: str) -> None:
    text = (
        "defaults:\n  python: /opt/venv/bin/python\n  transport: srun\n"
        f"  env: {{A: '1'}}\nrendezvous: {{port: 29600}}\nhosts: {{slurm: {job}}}\n"
    )
    inv = parse_inventory(text, "inv.yaml")
    assert inv.hosts == () and inv.rendezvous.port == 29600
    assert inv.slurm is not None
    assert (inv.slurm.job, inv.slurm.source, inv.slurm.line) == (job, "inv.yaml", 6)
    assert dict(inv.slurm.defaults) == {
        "python": "/opt/venv/bin/python",
        "transport": "srun",
        "env": {"A": "1"},
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "hosts: {slurm: abc}\n",
            "inv.yaml:1: hosts.slurm: expected a Slurm job id (digits, or 123_4",
        ),
        ("hosts: {slurm: 12, x: 1}\n", "expected a list of hosts, got a mapping with key 'x'"),
        ("hosts: {}\n", "expected a list of hosts, got a mapping that is empty"),
        (
            "defaults: {transport: srun}\nhosts: [a]\n",
            "inv.yaml:1: defaults.transport: transport: srun reaches hosts as steps of a Slurm",
        ),
        ("defaults: {transport: rsh}\nhosts: [a]\n", "expected ssh or srun"),
        (
            "hosts:\n  - {host: a, transport: ssh}\n",
            "'transport' applies to every host: put it under 'defaults'",
        ),
    ],
)
def test_bad_slurm_yaml_is_refused_where_it_is(text: str, says: str) -> None:
    with pytest.raises(InventoryError) as info:
        parse_inventory(text, "inv.yaml")
    assert says in info.value.message
    assert info.value.exit_code == ExitCode.BAD_INPUT


def test_a_hostfile_takes_no_transport() -> None:
    with pytest.raises(InventoryError, match="unknown key 'transport'"):
        parse_inventory("a transport=srun\n", "hosts.txt", fmt="hostfile")


# ------------------------------------------------------------------------------ srun


def test_srun_argv_runs_the_command_as_one_step_on_the_node() -> None:
    argv = srun_argv("12", "gpu07", "exec python3 -c 'x'", ["PATH", "HOME"])
    assert argv[:3] == ["srun", "--jobid=12", "--nodelist=gpu07"]
    for option in ("--nodes=1", "--ntasks=1", "--overlap", "--unbuffered", "--export=PATH,HOME"):
        assert option in argv
    assert argv[-3:] == ["bash", "-c", PREAMBLE + "exec python3 -c 'x'"]
    assert "--export=NONE" in srun_argv("12", "n", "true", [])


def test_exported_names() -> None:
    env = {"PATH": "x", "HOME": "y", "LC_ALL": "C", "SECRET": "s", "SLURM_CONF": "c"}
    assert exported_names(env) == ["PATH", "HOME", "LC_ALL"]


# ---------------------------------------------------------------------------- report


def test_the_report_names_the_jobs_end_as_the_root_cause() -> None:
    nodes = [
        NodeResult(0, "node1", NodeState.STOPPED, reason="stopped on request"),
        NodeResult(1, "node2", NodeState.FAILED, returncode=1, reason="torchrun exited 1"),
    ]
    result = RunResult("r1", nodes, root_cause=1, cause="the Slurm job 5 was cancelled (scancel)")
    text = run_report(result, ["some output"])
    assert text.splitlines()[0] == "sshddp: run r1 was ended from outside: its Slurm job ended"
    assert text.splitlines()[-1] == "root cause: the Slurm job 5 was cancelled (scancel)"
    assert result.exit_code == ExitCode.RUN_FAILED
