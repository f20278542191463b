"""Every number the user gives, on the command line and in the inventory, is checked for
range and finiteness: nan, inf and absurd sizes end in exit 2 naming the option or key.

The options are found by looking at every command's click parameters, so a numeric option
added later without a row here fails ``test_every_numeric_option_has_a_row``.
"""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp import defaults
from sshddp.cli.app import COMMANDS
from sshddp.cli.options import PortOrAuto
from sshddp.errors import ExitCode, InventoryError
from sshddp.model.inventory import parse_host_list, parse_inventory

NON_FINITE = ["nan", "NaN", "inf", "-inf", "1e400"]
SECONDS_BAD = [*NON_FINITE, "-1", str(defaults.MAX_SECONDS * 2)]
HUGE = "99999999999"
COUNT_BAD = ["nan", "inf", "-1", "1e3", "1.5", HUGE]

#: (command, option) -> values it must refuse
TABLE: dict[tuple[str, str], list[str]] = {
    **{(cmd, "--connect-timeout"): SECONDS_BAD for cmd in ("attach", "doctor", "exec")},
    **{(cmd, "--connect-timeout"): SECONDS_BAD for cmd in ("fetch", "launch", "logs")},
    **{
        (cmd, "--connect-timeout"): SECONDS_BAD
        for cmd in ("smoke", "stacks", "stop", "sync", "top")
    },
    **{(cmd, "--fanout"): [*COUNT_BAD, "0"] for cmd in ("attach", "doctor", "exec", "fetch")},
    **{(cmd, "--fanout"): [*COUNT_BAD, "0"] for cmd in ("launch", "logs", "smoke", "stacks")},
    **{(cmd, "--fanout"): [*COUNT_BAD, "0"] for cmd in ("stop", "ps", "sync", "top")},
    ("ps", "--connect-timeout"): SECONDS_BAD,
    ("launch", "--grace"): SECONDS_BAD,
    ("launch", "--heartbeat-timeout"): [*SECONDS_BAD, "0.1"],
    ("launch", "--init-timeout"): SECONDS_BAD,
    ("launch", "--stall-timeout"): SECONDS_BAD,
    ("launch", "--max-restarts"): COUNT_BAD,
    ("launch", "--min-nodes"): [*COUNT_BAD, "0", "2"],  # the inventory has one host
    ("launch", "--nproc-per-node"): [*COUNT_BAD, "0"],
    ("launch", "--port"): ["nan", "inf", "0", "-1", "-5", "65535", HUGE],
    ("doctor", "--port"): ["nan", "inf", "0", "-1", "-5", "65535", HUGE],
    ("exec", "--timeout"): [*SECONDS_BAD, "0"],
    ("smoke", "--port"): ["nan", "inf", "0", "-1", "65535", HUGE],
    ("smoke", "--nproc-per-node"): [*COUNT_BAD, "0"],
    ("smoke", "--iters"): [*COUNT_BAD, "0"],
    # a node number's range is the run's: it is checked against the run (check_node)
    **{(cmd, "--node"): ["nan", "inf", "-1", "1.5"] for cmd in ("fetch", "logs", "stacks", "top")},
    ("logs", "--tail"): ["nan", "inf", "-1", "1.5"],  # any count of lines is a tail
}

INVENTORY = "hosts:\n  - {host: gpu-a, gpus: 2}\n"


def _numeric_options() -> set[tuple[str, str]]:
    found = set()
    for name, command in COMMANDS.items():
        for param in command.params:
            kind = param.type
            numeric = isinstance(kind, (click.types.IntParamType, click.types.FloatParamType))
            if isinstance(param, click.Option) and (numeric or isinstance(kind, PortOrAuto)):
                found.add((name, max(param.opts, key=len)))
    return found


def test_every_numeric_option_has_a_row() -> None:
    found = _numeric_options()
    assert ("launch", "--heartbeat-timeout") in found  # the search sees what it must
    assert found == set(TABLE)


def _args(command: str, option: str, value: str, inv: Path, script: Path) -> list[str]:
    given = [f"{option}={value}"]  # `=`: a value such as -1 is not taken for an option
    if command == "launch":
        return ["launch", "--dry-run", *given, str(inv), str(script)]
    if command in ("doctor", "smoke"):
        return [command, *given, str(inv)]
    if command == "exec":
        return ["exec", *given, str(inv), "--", "true"]
    if command == "ps":
        return ["ps", *given]
    return [command, *given, "no-such-run", *(["path"] if command == "fetch" else [])]


@pytest.mark.parametrize(
    ("command", "option", "value"),
    [(cmd, opt, value) for (cmd, opt), values in sorted(TABLE.items()) for value in values],
)
def test_a_bad_number_is_refused_naming_the_option(
    command: str, option: str, value: str, tmp_path: Path
) -> None:
    inv, script = tmp_path / "inv.yaml", tmp_path / "train.py"
    inv.write_text(INVENTORY)
    script.write_text("print('hi')\n")
    result = sshddp(_args(command, option, value, inv, script), environ={})
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert option in result.err, result.explain()


@pytest.mark.parametrize(
    "given",
    ["--grace=0", "--grace=604800", "--heartbeat-timeout=0.5", "--max-restarts=1000"],
)
def test_the_limits_themselves_are_accepted(given: str, tmp_path: Path) -> None:
    inv, script = tmp_path / "inv.yaml", tmp_path / "train.py"
    inv.write_text(INVENTORY)
    script.write_text("print('hi')\n")
    result = sshddp(["launch", "--dry-run", given, str(inv), str(script)], environ={})
    assert result.code == ExitCode.OK, result.explain()


INVENTORY_BAD = [".nan", ".inf", "-.inf", "-1", "1.5", "true", HUGE]

#: an inventory with a number in it -> the key path the error must name
INVENTORY_KEYS = {
    "hosts:\n  - {host: a, port: V}\n": "hosts[0].port",
    "hosts:\n  - {host: a, gpus: V}\n": "hosts[0].gpus",
    "hosts:\n  - {host: a, nproc: V}\n": "hosts[0].nproc",
    "defaults: {port: V}\nhosts: [a]\n": "defaults.port",
    "defaults: {gpus: V}\nhosts: [a]\n": "defaults.gpus",
    "defaults: {nproc: V}\nhosts: [a]\n": "defaults.nproc",
    "rendezvous: {port: V}\nhosts: [a]\n": "rendezvous.port",
}


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [(t, k, v) for t, k in INVENTORY_KEYS.items() for v in INVENTORY_BAD],
)
def test_a_bad_number_in_the_inventory_names_its_key(text: str, key: str, value: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text.replace("V", value), "inv.yaml", fmt="yaml")
    assert "inv.yaml:" in caught.value.message and key in caught.value.message


@pytest.mark.parametrize("value", ["-1", "1.5", "nan", "inf", HUGE])
def test_a_bad_count_in_a_hostfile_or_host_list_names_its_entry(value: str) -> None:
    with pytest.raises(InventoryError, match=r"hosts\[0\]\.slots"):
        parse_inventory(f"gpu-a slots={value}\n", "hosts.txt", fmt="hostfile")
    with pytest.raises(InventoryError, match=r"hosts\[0\]"):
        parse_host_list(f"gpu-a:{value}")


def test_the_largest_count_is_accepted() -> None:
    most = defaults.MAX_PROCS_PER_NODE
    inv = parse_inventory(f"hosts:\n  - {{host: a, nproc: {most}}}\n", "inv.yaml", fmt="yaml")
    assert inv.hosts[0].procs == most
    assert parse_host_list(f"a:{most}").hosts[0].procs == most
