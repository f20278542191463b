"""Inventory parsing and validation: the formats, the merged hosts, and every rejection."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sshddp.defaults import PYTHON as DEFAULT_PYTHON
from sshddp.defaults import RDZV_PORT as DEFAULT_RDZV_PORT
from sshddp.defaults import WORKDIR as DEFAULT_WORKDIR
from sshddp.errors import ExitCode, InventoryError
from sshddp.model.inventory import Host, Inventory, Rendezvous, parse_inventory
from sshddp.run import inputs
from sshddp.run.inputs import load_inventory

EXAMPLE = """\
defaults:            # optional; applies to every host unless the host overrides it
  user: ubuntu
  python: /opt/venv/bin/python
  env: {NCCL_SOCKET_IFNAME: eth0}
rendezvous: {port: 29500}        # optional keys: port, host
hosts:
  - host: gpu-a
    gpus: 8
  - host: gpu-b
    gpus: 8
    addr: 10.0.0.2
    port: 2222
  - host: cpu-box
    nproc: 2
"""


def reject(text: str, fmt: str = "auto") -> str:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml", fmt=fmt)
    return str(caught.value)


def assert_points_at(message: str, text: str, line: int, path: str, token: str) -> None:
    """The message is one paragraph for ``inv.yaml:LINE: PATH:``, then the line and a caret."""
    paragraph, shown, caret = message.split("\n")
    assert paragraph.startswith(f"inv.yaml:{line}: {path}: "), paragraph
    source = text.splitlines()[line - 1]
    assert shown == f"{line:>5} | {source}"
    assert caret == "      | " + " " * source.index(token) + "^"


# --- what parses -------------------------------------------------------------------------


def test_example_parses_to_merged_hosts() -> None:
    inventory = parse_inventory(EXAMPLE, "inv.yaml")
    env = {"NCCL_SOCKET_IFNAME": "eth0"}
    common = {"user": "ubuntu", "python": "/opt/venv/bin/python", "env": env}
    assert inventory == Inventory(
        source="inv.yaml",
        hosts=(
            Host(host="gpu-a", index=0, gpus=8, line=7, **common),
            Host(
                host="gpu-b",
                index=1,
                gpus=8,
                addr="10.0.0.2",
                port=2222,
                line=9,
                **common,
            ),
            Host(host="cpu-box", index=2, nproc=2, line=13, **common),
        ),
        rendezvous=Rendezvous(port=29500, host=None),
    )
    assert [host.procs for host in inventory.hosts] == [8, 8, 2]
    assert all(host.workdir == DEFAULT_WORKDIR for host in inventory.hosts)


def test_host_values_win_and_env_maps_merge() -> None:
    text = """\
defaults:
  user: ubuntu
  port: 2200
  env: {A: from-defaults, B: from-defaults}
hosts:
  - host: a
    user: root
    port: 22
    env: {B: from-host, C: 3}
  - b
"""
    first, second = parse_inventory(text).hosts
    assert (first.user, first.port) == ("root", 22)
    assert dict(first.env) == {"A": "from-defaults", "B": "from-host", "C": "3"}
    assert (second.user, second.port, dict(second.env)) == (
        "ubuntu",
        2200,
        {"A": "from-defaults", "B": "from-defaults"},
    )


def test_bare_string_hosts_take_the_defaults() -> None:
    inventory = parse_inventory("hosts:\n  - localhost\n  - gpu-a\n")
    local, remote = inventory.hosts
    assert local == Host(host="localhost", index=0, line=2)
    assert (remote.host, remote.index, remote.line) == ("gpu-a", 1, 3)
    assert local.is_local and not remote.is_local
    assert (local.python, local.workdir, local.procs) == (DEFAULT_PYTHON, DEFAULT_WORKDIR, 1)
    assert inventory.rendezvous == Rendezvous(port=DEFAULT_RDZV_PORT, host=None)


@pytest.mark.parametrize(
    ("gpus", "nproc", "procs"),
    [(8, None, 8), (8, 2, 8), (0, 2, 2), (0, None, 1), (None, 0, 1), (None, None, 1)],
)
def test_procs(gpus: int | None, nproc: int | None, procs: int) -> None:
    assert Host(host="h", index=0, gpus=gpus, nproc=nproc).procs == procs


def test_host_env_is_read_only_and_host_is_hashable() -> None:
    env = {"A": "1"}
    host = Host(host="h", index=0, env=env)
    env["A"] = "changed"
    assert isinstance(host.env, MappingProxyType)
    assert host.env == {"A": "1"}
    assert hash(host) == hash(Host(host="h", index=0, env={"B": "2"}))


def test_values_are_kept_as_written() -> None:
    text = """\
rendezvous: {host: 10.0.0.1, port: 29400}
hosts:
  - host: 1:2:3:4:5:6:7:8     # YAML 1.1 would read this as a base-60 int
    env: {OMP_NUM_THREADS: 04, RATIO: 1.50, EMPTY: '', FLAG: 'on'}
  - host: '[fe80::1%eth0]'
    workdir: /scratch/run-1
  - host: ssh_alias.example
    python: ~/venv/bin/python3.11
    workdir: '~'
"""
    inventory = parse_inventory(text)
    first, second, third = inventory.hosts
    assert first.host == "1:2:3:4:5:6:7:8"
    assert dict(first.env) == {"OMP_NUM_THREADS": "04", "RATIO": "1.50", "EMPTY": "", "FLAG": "on"}
    assert (second.host, second.workdir) == ("[fe80::1%eth0]", "/scratch/run-1")
    assert (third.python, third.workdir) == ("~/venv/bin/python3.11", "~")
    assert inventory.rendezvous == Rendezvous(port=29400, host="10.0.0.1")


def test_same_host_on_other_ports_is_allowed() -> None:
    text = "hosts:\n  - {host: box, port: 2201}\n  - {host: box, port: 2202}\n"
    assert [host.port for host in parse_inventory(text).hosts] == [2201, 2202]


def test_empty_sections_mean_defaults() -> None:
    text = "defaults:\nrendezvous:\nhosts:\n  - host: a\n    env:\n"
    inventory = parse_inventory(text)
    assert inventory.hosts == (Host(host="a", index=0, line=4),)
    assert inventory.rendezvous == Rendezvous()


HOSTFILE = """\
# DeepSpeed style
gpu-a slots=8
gpu-b slots=8 user=ubuntu port=2222 addr=10.0.0.2   # trailing comment

cpu-box nproc=2 python=/opt/venv/bin/python workdir=/data/sshddp
"""


def test_hostfile_format() -> None:
    inventory = parse_inventory(HOSTFILE, "hosts.txt", fmt="hostfile")
    assert inventory == Inventory(
        source="hosts.txt",
        hosts=(
            Host(host="gpu-a", index=0, gpus=8, line=2),
            Host(host="gpu-b", index=1, gpus=8, user="ubuntu", port=2222, addr="10.0.0.2", line=3),
            Host(
                host="cpu-box",
                index=2,
                nproc=2,
                python="/opt/venv/bin/python",
                workdir="/data/sshddp",
                line=5,
            ),
        ),
        rendezvous=Rendezvous(),
    )


def test_auto_format_reads_a_hostfile() -> None:
    assert parse_inventory(HOSTFILE) == parse_inventory(HOSTFILE, fmt="hostfile")
    assert parse_inventory("gpu-a\n").hosts == (Host(host="gpu-a", index=0, line=1),)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("inv.yaml", EXAMPLE),
        ("inv.YML", EXAMPLE),
        ("inventory", EXAMPLE),  # no suffix: auto
        ("hosts.txt", HOSTFILE),
        ("cluster.hosts", HOSTFILE),
        ("hostfile", HOSTFILE),
        ("inventory.conf", HOSTFILE),  # unknown suffix: auto
    ],
)
def test_load_inventory_picks_the_format_by_name(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    inventory = load_inventory(path)
    assert inventory.source == str(path)
    assert len(inventory.hosts) == 3


def test_load_inventory_accepts_a_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + EXAMPLE.replace("\n", "\r\n").encode())
    assert load_inventory(str(path)) == parse_inventory(EXAMPLE, str(path))


def test_yaml_suffix_forces_yaml(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("gpu-a slots=8\n", encoding="utf-8")
    with pytest.raises(InventoryError, match="got 'gpu-a slots=8' at the top level"):
        load_inventory(path)


# --- file errors -------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(InventoryError, match="inventory file not found") as caught:
        load_inventory(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert caught.value.exit_code == ExitCode.BAD_INPUT


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=f"^{tmp_path}: is a directory"):
        load_inventory(tmp_path)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    # chmod 0 does not stop root, so fail the open itself.
    monkeypatch.setattr(inputs, "open", denied, raising=False)
    with pytest.raises(InventoryError, match=r"inv.yaml: cannot read the inventory: permission"):
        load_inventory(tmp_path / "inv.yaml")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"hosts:\n  - caf\xe9\n")
    with pytest.raises(InventoryError, match=r":2: not UTF-8 text \(byte 0xe9 at offset 14\)"):
        load_inventory(path)


def test_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_bytes(b"#" * (2 << 20))
    with pytest.raises(InventoryError, match="not an inventory file"):
        load_inventory(path)


# --- rejections, each pointing at file, line, key path and column -------------------------

HOST_FORM = "expected a host name, ssh alias or IP address"
COUNT = "expected a non-negative integer up to 1024"
PORT = "expected an integer port from 1 to 65535"

# (inventory text, line, key path, token under the caret, words the message must have)
REJECTIONS = [
    # unknown keys, with the closest known key suggested
    ("hosts: [a]\nrendezvus: {}\n", 2, "rendezvus", "rendezvus", "did you mean 'rendezvous'?"),
    ("defaults:\n  pyton: p\nhosts: [a]\n", 2, "defaults.pyton", "pyton", "mean 'python'?"),
    ("hosts:\n  - host: a\n    gpuz: 1\n", 3, "hosts[0].gpuz", "gpuz", "did you mean 'gpus'?"),
    ("rendezvous: {prt: 1}\nhosts: [a]\n", 1, "rendezvous.prt", "prt", "did you mean 'port'?"),
    ("hosts: [a]\nzzz: 1\n", 2, "zzz", "zzz", "unknown key 'zzz'. Known keys: defaults,"),
    ("defaults: {host: a}\nhosts: [b]\n", 1, "defaults.host", "host", "'host' has no default"),
    # wrong types and ranges
    ("hosts:\n  - host: a\n    port: '22'\n", 3, "hosts[0].port", "'22'", f"{PORT}, got '22'"),
    ("hosts:\n  - host: a\n    port: 70000\n", 3, "hosts[0].port", "70000", "got 70000"),
    ("hosts:\n  - host: a\n    gpus: 8.0\n", 3, "hosts[0].gpus", "8.0", f"{COUNT}, got 8.0"),
    ("hosts:\n  - host: a\n    gpus: yes\n", 3, "hosts[0].gpus", "yes", "got True (YAML"),
    ("hosts:\n  - host: a\n    gpus: -1\n", 3, "hosts[0].gpus", "-1", f"{COUNT}, got -1."),
    ("hosts:\n  - host: a\n    nproc: -2\n", 3, "hosts[0].nproc", "-2", f"{COUNT}, got -2."),
    ("hosts:\n  - host: a\n    gpus: [1]\n", 3, "hosts[0].gpus", "[1]", f"{COUNT}, got a list."),
    ("hosts:\n  - host: a\n    user: root x\n", 3, "hosts[0].user", "root", "got 'root x'"),
    ("hosts:\n  - host: a\n    user:\n", 3, "hosts[0].user", "user", "got None (the value is"),
    ("hosts:\n  - {host: a, python: 'p; id'}\n", 2, "hosts[0].python", "'p;", "got 'p; id'"),
    ("hosts:\n  - {host: a, addr: '$(id)'}\n", 2, "hosts[0].addr", "'$", "got '$(id)'"),
    ("hosts:\n  - {host: a, workdir: tmp/x}\n", 2, "hosts[0].workdir", "tmp", "an absolute path"),
    ("hosts:\n  - {host: a, workdir: /a/../b}\n", 2, "hosts[0].workdir", "/a", "no '..'"),
    ("hosts:\n  - {host: a, workdir: ~}\n", 2, "hosts[0].workdir", "~", "YAML reads ~ as null"),
    ("rendezvous: {port: 0}\nhosts: [a]\n", 1, "rendezvous.port", "0", f"{PORT}, or auto, got 0."),
    ("rendezvous: {host: -x}\nhosts: [a]\n", 1, "rendezvous.host", "-x", HOST_FORM),
    ("rendezvous: [1]\nhosts: [a]\n", 1, "rendezvous", "[1]", "expected a mapping with keys"),
    # host names that would be shell syntax or ssh options
    ("hosts:\n  - 'a;reboot'\n", 2, "hosts[0]", "'a;", f"{HOST_FORM} (letters"),
    ("hosts:\n  - -oProxyCommand=x\n", 2, "hosts[0]", "-o", "not starting with '-'"),
    ("hosts:\n  - host: a b\n", 2, "hosts[0].host", "a b", "got 'a b'"),
    ("hosts:\n  - on\n", 2, "hosts[0]", "on", "YAML reads on as a boolean; quote it"),
    ("hosts:\n  - ~\n", 2, "hosts[0]", "~", "got None (YAML reads ~ as null"),
    # env
    ("defaults:\n  env: [A]\nhosts: [a]\n", 2, "defaults.env", "[A]", "mapping of NAME: value"),
    ("defaults:\n  env: {A-B: 1}\nhosts: [a]\n", 2, "defaults.env.A-B", "A-B", "variable name"),
    ("defaults:\n  env: {1A: x}\nhosts: [a]\n", 2, "defaults.env.1A", "1A", "got '1A'"),
    ("defaults:\n  env:\n    FOO: [1]\nhosts: [a]\n", 3, "defaults.env.FOO", "[1]", "a list"),
    ("defaults:\n  env:\n    FOO:\nhosts: [a]\n", 3, "defaults.env.FOO", "FOO", "got None"),
    ("hosts:\n  - host: a\n    env: {X: off}\n", 3, "hosts[0].env.X", "off", "got False"),
    # duplicates
    ("hosts:\n  - host: a\n    gpus: 1\n    gpus: 2\n", 4, "hosts[0].gpus", "gpus", "first given"),
    ("hosts: [a]\nhosts: [b]\n", 2, "hosts", "hosts", "duplicate key 'hosts'"),
    ("hosts:\n  - a\n  - b\n  - host: a\n", 4, "hosts[2].host", "a", "at lines 2 and 4"),
    ("hosts:\n  - {host: a, port: 22}\n  - {host: a, port: 22}\n", 3, "hosts[1].host", "a,", "22"),
    # structure
    ("hosts:\n  - host: a\n   gpus: 1\n", 3, "", "gpus", "not valid YAML"),
    ("hosts:\n\t- a\n", 2, "", "\t", "found character '\\t'"),
    ("- a\n- b\n", 1, "", "-", "got a list at the top level"),
    ("defaults: {user: x}\n", 1, "", "defaults", "missing the required key 'hosts'"),
    ("hosts:\n", 1, "hosts", "hosts", "the list of hosts is empty"),
    ("hosts: []\n", 1, "hosts", "[]", "the list of hosts is empty"),
    ("hosts: {a: 1}\n", 1, "hosts", "{a", "expected a list of hosts, got a mapping"),
    ("hosts:\n  - gpus: 2\n", 2, "hosts[0]", "gpus", "missing 'host'"),
    ("hosts:\n  - [a]\n", 2, "hosts[0]", "[a]", "got a list"),
    ("? [a]\n: 1\nhosts: [b]\n", 1, "", "[a]", "expected a key name"),
]


@pytest.mark.parametrize(("text", "line", "path", "token", "words"), REJECTIONS)
def test_rejection_names_file_line_path_and_column(
    text: str, line: int, path: str, token: str, words: str
) -> None:
    message = reject(text)
    assert words in message.split("\n")[0]
    if path:
        assert_points_at(message, text, line, path, token)
    else:
        _, shown, caret = message.split("\n")
        assert message.startswith(f"inv.yaml:{line}: ")
        assert caret.index("^") - len("      | ") == text.splitlines()[line - 1].index(token)


def test_duplicate_key_names_both_lines() -> None:
    message = reject("hosts: [a]\ndefaults: {}\ndefaults: {}\n")
    assert "duplicate key 'defaults'; it is first given at line 2." in message


def test_long_values_are_cut() -> None:
    message = reject(f"hosts:\n  - host: a\n    user: '{'x' * 500} y'\n")
    paragraph = message.split("\n")[0]
    assert "got 'xxxxx" in paragraph and "...'." in paragraph
    assert len(paragraph) < 250


def test_empty_and_comment_only_inventories() -> None:
    for text in ("", "\n\n", "# just a comment\n   # another\n"):
        for fmt in ("auto", "yaml", "hostfile"):
            message = reject(text, fmt)
            assert message.startswith("inv.yaml: the inventory is empty; expected YAML with")
            assert "\n" not in message


HOSTFILE_REJECTIONS = [
    ("gpu-a slots=8\ngpu-b eight\n", 2, "hosts[1]", "eight", "expected key=value, got 'eight'"),
    ("gpu-a slots=-8\n", 1, "hosts[0].slots", "-8", f"{COUNT}, got -8."),
    ("gpu-a slots=many\n", 1, "hosts[0].slots", "many", "got 'many'"),
    ("gpu-a port=0\n", 1, "hosts[0].port", "0", f"{PORT}, got 0."),
    ("gpu-a slot=8\n", 1, "hosts[0].slot", "slot", "did you mean 'slots'?"),
    ("gpu-a env=X\n", 1, "hosts[0].env", "env", "'env' needs a YAML inventory"),
    ("gpu-a slots=8 gpus=2\n", 1, "hosts[0].gpus", "gpus", "given twice"),
    ("a;b slots=1\n", 1, "hosts[0]", "a;b", HOST_FORM),
    ("gpu-a\ngpu-a\n", 2, "hosts[1]", "gpu-a", "listed twice, at lines 1 and 2"),
    ("hosts:\n  - gpu-a\n", 1, "hosts[0]", "hosts:", "this looks like YAML"),
]


@pytest.mark.parametrize(("text", "line", "path", "token", "words"), HOSTFILE_REJECTIONS)
def test_hostfile_rejection_points_at_the_word(
    text: str, line: int, path: str, token: str, words: str
) -> None:
    message = reject(text, fmt="hostfile")
    assert words in message.split("\n")[0]
    assert "`host [slots=N] [key=value ...]`" in message or "hostfile" not in words
    assert_points_at(message, text, line, path, token)


def test_hostfile_bad_word_names_the_form() -> None:
    message = reject("gpu-a eight\n", fmt="hostfile")
    assert "a hostfile line is `host [slots=N] [key=value ...]`" in message


def test_auto_format_reports_a_hostfile_error_in_hostfile_terms() -> None:
    message = reject("gpu-a slots=8\ngpu-b slots=x\n")
    assert message.startswith("inv.yaml:2: hosts[1].slots: expected a non-negative integer")


def test_control_characters_do_not_reach_the_terminal() -> None:
    message = reject("hosts:\n  - a\x1b[31m\n")
    assert "\x1b" not in message
    assert message.startswith("inv.yaml:2: not valid YAML: character '\\x1b' is not allowed.")


def test_deep_nesting_is_an_inventory_error() -> None:
    assert "nested too deeply" in reject("hosts: " + "[" * 1200)


# --- nothing but InventoryError, whatever the input ---------------------------------------

FORMATS = st.sampled_from(["auto", "yaml", "hostfile"])
KEYS = st.sampled_from(
    ["hosts", "defaults", "rendezvous", "host", "user", "port", "gpus", "nproc", "python"]
    + ["addr", "env", "workdir", "slots", "FOO", "<<", ""]
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.sampled_from(["gpu-a", "localhost", "~", "/opt/py", "-x", "a b", "~/w", "::1", "1:30"])
    | st.text(max_size=12)
)
STRUCTURES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=20,
)
YAMLISH = st.text(alphabet=" \t\n\r:-[]{}#'\"&*!|>%@,.=~0123456789abghostlcpu\x85\u2028é\x00")


def assert_parses_or_rejects(text: str, fmt: str) -> None:
    try:
        inventory = parse_inventory(text, "fuzz", fmt=fmt)
    except InventoryError as exc:
        assert str(exc).count("\n") in (0, 2)  # a paragraph, then maybe line and caret
    else:
        assert inventory.hosts
        assert [host.index for host in inventory.hosts] == list(range(len(inventory.hosts)))


PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(text=st.text(max_size=200) | YAMLISH, fmt=FORMATS)
def test_any_text_parses_or_is_an_inventory_error(text: str, fmt: str) -> None:
    assert_parses_or_rejects(text, fmt)


@PROPERTY
@given(
    data=STRUCTURES | st.dictionaries(st.just("hosts"), STRUCTURES, min_size=1),
    flow=st.sampled_from([None, True, False]),
    fmt=FORMATS,
)
def test_any_yaml_structure_parses_or_is_an_inventory_error(
    data: object, flow: bool | None, fmt: str
) -> None:
    assert_parses_or_rejects(yaml.safe_dump(data, default_flow_style=flow), fmt)


# --- health: the user's own check (doctor --health) ----------------------------------------


def test_health_command_from_defaults_or_the_host() -> None:
    text = (
        "defaults:\n"
        "  health: 'test -e /scratch/ok'\n"
        "hosts:\n"
        "  - gpu-a\n"
        "  - host: gpu-b\n"
        "    health: /opt/site/check-node --quick\n"
    )
    inventory = parse_inventory(text, "inv.yaml")
    assert [h.health for h in inventory.hosts] == [
        "test -e /scratch/ok",
        "/opt/site/check-node --quick",
    ]
    assert parse_inventory("hosts: [gpu-a]\n").hosts[0].health is None


@pytest.mark.parametrize(
    ("value", "token"),
    [("''", "''"), ("[check]", "["), ("|\n      check\n      more", "|")],
)
def test_a_bad_health_value_names_the_key_and_line(value: str, token: str) -> None:
    text = f"hosts:\n  - host: gpu-a\n    health: {value}\n"
    message = reject(text)
    assert_points_at(message, text, 3, "hosts[0].health", token)
    assert "a shell command on one line" in message
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    assert caught.value.exit_code == 2


def test_health_needs_a_yaml_inventory() -> None:
    message = reject("gpu-a slots=8 health=true\n", fmt="hostfile")
    assert "'health' needs a YAML inventory" in message
