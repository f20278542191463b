"""Slurm hostlists and per-node counts: documented examples, and errors that name the text,
the position and the expected form (tests/integration/test_slurm_hostlist_scontrol.py
checks the expansion against the real scontrol)."""

from __future__ import annotations

import pytest

from sshddp.errors import ExitCode, InventoryError
from sshddp.model.slurm import expand_hostlist, expand_tasks_per_node

# Slurm accepts these with a guess (skips empty elements, closes a bracket for you, reads
# "1-" as "1", splits on spaces, pads " 1" to width 2); sshddp refuses to guess.
STRICTER_THAN_SLURM = ["", "   ", "a,,b", "a,", ",a", "a[1-2", "a]", "a[1-]", "a b",
                       "n[ 1-2]", "a[1-1000]b[1-1000]", "a/b", "a[1-2]\tb"]  # fmt: skip


# ------------------------------------------------------------------ agreement with Slurm


def test_examples_expand_as_documented() -> None:
    assert expand_hostlist("gpu[01-04,07]") == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]
    assert expand_hostlist("a[1-2]b[3-4]") == ["a1b3", "a1b4", "a2b3", "a2b4"]
    assert expand_hostlist("a1,b[2-3],c") == ["a1", "b2", "b3", "c"]
    # Slurm's own order for three brackets: middle outermost, last innermost.
    assert expand_hostlist("a[1-2]b[1-2]c[1-2]")[:4] == ["a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2"]


def test_surrounding_whitespace_is_ignored() -> None:
    """A list read from a file or ``$(...)`` ends in a newline; Slurm would refuse it
    after a bracket, sshddp drops it (it changes no name)."""
    assert expand_hostlist(" node[1-3]\n") == ["node1", "node2", "node3"]
    assert expand_tasks_per_node("2(x3)\n") == [2, 2, 2]


@pytest.mark.parametrize("text", STRICTER_THAN_SLURM)
def test_refuses_what_slurm_would_guess(text: str) -> None:
    with pytest.raises(InventoryError) as info:
        expand_hostlist(text)
    assert info.value.exit_code == ExitCode.BAD_INPUT


# ----------------------------------------------------------------------- generated lists


# -------------------------------------------------------------------------- error text


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("gpu[01-04", "character 4", "a matching ']'"),
        ("gpu01-04]", "character 9", "'[' first"),
        ("gpu[4-1]", "character 5", "LOW <= HIGH"),
        ("gpu[1-2]x", "character 9", "',' or the end"),
        ("", "character 1", "at least one host name"),
        ("n[1-99999]", "character 3", "a smaller range"),
        ("a,,b", "character 3", "a host name between commas"),
    ],
)
def test_error_names_text_position_and_expected_form(
    text: str, position: str, expected: str
) -> None:
    with pytest.raises(InventoryError) as info:
        expand_hostlist(text)
    message = str(info.value)
    assert repr(text) in message
    assert position in message
    assert f"expected {expected}" in message
    assert "\n" not in message


def test_error_quotes_only_the_bad_part_of_a_long_list() -> None:
    text = ",".join(f"node{i}" for i in range(500)) + ",n[5-2]"
    with pytest.raises(InventoryError) as info:
        expand_hostlist(text)
    message = str(info.value)
    assert "'5-2' goes down" in message
    assert f"character {len(text) - 3}" in message  # the 5 of 5-2
    assert len(message) < 500


# ---------------------------------------------------------------------- per-node counts


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("1,2,3", [1, 2, 3]),
        ("8(x2)", [8, 8]),
        ("1(x1),16(x4),2", [1, 16, 16, 16, 16, 2]),
    ],
)
def test_tasks_per_node(text: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize(
    "text", ["", "2(x0)", "(x3)", "2(3)", "2(x3", "1,,2", "2,", "-1", "2x3", "a", "2(x3)1"]
)
def test_tasks_per_node_rejects(text: str) -> None:
    with pytest.raises(InventoryError) as info:
        expand_tasks_per_node(text)
    assert repr(text) in str(info.value)


def test_tasks_per_node_bounded() -> None:
    with pytest.raises(InventoryError, match="over 65536 nodes"):
        expand_tasks_per_node("1(x70000)")
