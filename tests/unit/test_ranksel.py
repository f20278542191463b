"""--ranks: parsing, checking against the run, and how nodes are labelled."""

from __future__ import annotations

import pytest

from sshddp.errors import ExitCode, UsageError
from sshddp.model.ranksel import check_ranks, parse_ranks, rank_label, shows


def test_ranks_and_ranges() -> None:
    assert parse_ranks("0") == {0}
    assert parse_ranks("0,3-5") == {0, 3, 4, 5}
    assert parse_ranks(" 2 , 2-3") == {2, 3}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "'' is not a rank or a range"),
        ("a", "'a' is not a rank or a range"),
        ("1,,2", "'' is not a rank or a range"),
        ("-1", "'-1' is not a rank or a range"),
        ("5-3", "the range '5-3' goes down"),
        ("0-99999999", "the range '0-99999999' is too large"),
    ],
)
def test_bad_ranks_name_the_part(text: str, says: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_ranks(text, "--rank")
    assert error.value.message.startswith(f"--rank {text}: {says}")
    assert error.value.exit_code == ExitCode.BAD_INPUT


def test_a_rank_the_run_lacks_is_refused() -> None:
    check_ranks(frozenset({0, 5}), 6, "r1")
    with pytest.raises(UsageError, match=r"run r1 has ranks 0-5; there is no rank 6"):
        check_ranks(frozenset({0, 6, 9}), 6, "r1")


def test_labels_and_which_nodes_show() -> None:
    assert rank_label(3, 1) == "3"
    assert rank_label(4, 4) == "4-7"
    assert shows(None, range(0, 2))
    assert shows(frozenset({1}), range(0, 2))
    assert not shows(frozenset({2}), range(0, 2))
