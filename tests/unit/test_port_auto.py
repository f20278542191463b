"""``--port auto`` in the pure parts: the inventory, the plan before and after node 0's
pick, the --dry-run text; and the doctor JSON document's version and secrets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli_helpers import assert_clean_failure, sshddp
from sshddp import defaults
from sshddp.errors import ExitCode, UsageError
from sshddp.model.checks import CHECKS, Context, HostFacts, evaluate
from sshddp.model.inventory import Host, parse_inventory
from sshddp.model.plan import CodeSpec, LaunchOptions, LaunchPlan, describe, make_plan, with_port
from sshddp.model.report import DOCTOR_JSON_SCHEMA, doctor_json

INV = "rendezvous: {port: auto}\nhosts:\n  - {host: a, nproc: 2, addr: 10.0.0.1}\n  - b\n"
CODE = CodeSpec("file", "train.py", "/home/me/train.py")


SCRIPT = LaunchOptions(script="train.py")


def plan(options: LaunchOptions = SCRIPT, text: str = INV) -> LaunchPlan:
    inv = parse_inventory(text, source="inv.yaml")
    return make_plan(inv, options, "r1", CODE, lambda h: h.addr or "10.0.0.2")


def test_inventory_port_auto_is_the_auto_port() -> None:
    assert parse_inventory(INV).rendezvous.port == defaults.AUTO_PORT


def test_the_pick_reaches_every_node_argv_and_spec() -> None:
    inv = parse_inventory(INV, source="inv.yaml")
    before = plan()
    assert before.rdzv_port == defaults.AUTO_PORT
    after = with_port(inv, SCRIPT, before, 29502)
    assert after.rdzv_port == 29502 and after.peer_port == 29503
    for node in after.nodes:
        argv = list(after.argv(node))
        assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29502"
        spec = after.spec(node)
        assert spec["peers"]["port"] == 29503
        assert spec["torchrun"]["rdzv_endpoint"] == "10.0.0.1:29502"
    fixed = LaunchOptions(script="train.py", port=29400)
    before_pick = plan(fixed)
    assert with_port(inv, fixed, before_pick, 29400) == before_pick


def test_the_pick_reaches_a_node_launchers_environment_and_placeholders() -> None:
    inv = parse_inventory(INV, source="inv.yaml")
    node = LaunchOptions(launcher="node", command=("run", "--port", "{master_port}"))
    after = with_port(inv, node, plan(node), 29502)
    for n in after.nodes:
        assert n.env["MASTER_PORT"] == "29502" and after.argv(n)[-2:] == ("--port", "29502")


def test_port_auto_on_the_command_line_overrides_the_inventory() -> None:
    text = INV.replace("port: auto", "port: 29400")
    assert plan(LaunchOptions(script="train.py", port=defaults.AUTO_PORT), text).rdzv_port == -1
    with pytest.raises(UsageError) as err:
        plan(LaunchOptions(script="train.py", port=0), text)
    assert "--port 0" in err.value.message and "or auto" in err.value.message


def test_dry_run_shows_auto_for_the_port_to_be_picked() -> None:
    text = describe(plan())
    assert "rendezvous:  10.0.0.1:auto (static, node 0 hosts it; the preflight picks" in text
    assert "--rdzv-endpoint 10.0.0.1:auto" in text and ":-1" not in text


def test_launch_dry_run_and_doctor_accept_port_auto(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts: [{host: a, addr: 10.0.0.1}]\n")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = sshddp(["launch", "--dry-run", "--port", "auto", str(inv), str(script)])
    assert result.code == ExitCode.OK, result.explain()
    assert "10.0.0.1:auto" in result.out
    bad = sshddp(["launch", "--dry-run", "--port", "otto", str(inv), str(script)])
    assert_clean_failure(bad, ExitCode.BAD_INPUT)
    assert "'otto': expected a port number (1-65534) or auto" in bad.err
    doctor = sshddp(["doctor", "--port", "65535", str(inv)])
    assert_clean_failure(doctor, ExitCode.BAD_INPUT)
    assert "--port 65535: expected a TCP port, 1-65534, or auto" in doctor.err


def test_port_auto_needs_the_preflight(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts: [{host: a, addr: 10.0.0.1}]\n")
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    result = sshddp(
        [
            "launch",
            "--no-check",
            "--port",
            "auto",
            "--log-dir",
            str(tmp_path),
            str(inv),
            str(script),
        ]
    )
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "--port auto" in result.err and "drop --no-check" in result.err


def test_doctor_json_has_its_schema_and_never_a_secret_value() -> None:
    host = Host("a", 0, nproc=1, env={"HF_TOKEN": "hf_secret"})
    facts = {"login_env": {"RANK": "0", "MY_API_KEY": "k-123"}, "python": {"version": "3.11.7"}}
    secrets = frozenset({"MY_API_KEY", "HF_TOKEN"})
    ctx = Context("10.0.0.1", 29500, secret_names=secrets)
    hosts = [HostFacts(host, facts)]
    doc = json.loads(doctor_json(hosts, evaluate(hosts, ctx), secrets))
    assert doc["schema"] == DOCTOR_JSON_SCHEMA == 2
    assert doc["checks"] == list(CHECKS)
    assert doc["hosts"][0]["facts"]["login_env"] == {"RANK": "0", "MY_API_KEY": "***"}
    text = json.dumps(doc)
    assert "k-123" not in text and "hf_secret" not in text
    assert facts["login_env"]["MY_API_KEY"] == "k-123"  # the facts themselves are untouched
