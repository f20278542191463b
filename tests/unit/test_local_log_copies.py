"""run.logfiles / run.sinks.NodeLogs: a local copy of a node's log is never made shorter, is
shown whole, and lives only in a directory and files that are ours."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli_helpers import sshddp
from sshddp.errors import ExitCode, UsageError
from sshddp.model import spans
from sshddp.protocol.contract import SOURCE_NODE as NODE
from sshddp.run import logread
from sshddp.run.nodefeed import NodeFeed
from sshddp.run.sinks import NodeLogs

RAW = b"node 0 line 0\nnode 0 line 1\n"


def reopened(directory: Path, notes: list[str] | None = None, fresh: bool = False) -> NodeLogs:
    logs = NodeLogs(directory, fresh, (notes if notes is not None else []).append)
    logs.open(0, "h1")
    return logs


def test_a_copy_without_index_is_kept_whole_and_resumed_from_its_size(tmp_path: Path) -> None:
    """A node that keeps no index (--launcher node, --tty) sends its log raw: reopening its
    copy keeps every byte, makes no index, and what the host sends next is appended."""
    logs = reopened(tmp_path)
    NodeFeed(logs, None, 0).feed(b"R" + RAW)
    logs.close()
    for _ in range(2):  # a `logs` that reads it, then another
        again = reopened(tmp_path)
        assert again.size(0) == len(RAW) and again.index_size(0) == 0
        assert list(logread.attributed(again.paths[0], again.index_paths[0])) == [(RAW, NODE)]
        again.close()
    assert not (tmp_path / "node0-h1.idx").exists()
    again = reopened(tmp_path)
    NodeFeed(again, None, 0).feed(b"R" + b"more\n")
    again.close()
    assert (tmp_path / "node0-h1.log").read_bytes() == RAW + b"more\n"


def test_an_empty_index_beside_a_whole_log_shows_the_log_whole(tmp_path: Path) -> None:
    """What an older sshddp left: an empty index made beside a raw copy. The copy is read
    whole (the bytes no record names are the node's own) and never cut."""
    (tmp_path / "node0-h1.log").write_bytes(RAW)
    (tmp_path / "node0-h1.idx").write_bytes(b"")
    logs = reopened(tmp_path)
    assert logs.size(0) == len(RAW) and logs.index_size(0) == 0
    assert b"".join(d for d, _s in logread.attributed(logs.paths[0], logs.index_paths[0])) == RAW
    logs.close()
    assert (tmp_path / "node0-h1.log").read_bytes() == RAW


def test_bytes_past_the_last_span_are_shown_as_the_node_s(tmp_path: Path) -> None:
    logs = reopened(tmp_path)
    NodeFeed(logs, None, 0).feed(b"I" + spans.pack(0, 4, 1) + b"one\n")
    logs.write(0, b"tail")  # part of a span whose record never came
    logs.close()
    got = list(logread.attributed(tmp_path / "node0-h1.log", tmp_path / "node0-h1.idx"))
    assert got == [(b"one\n", 1), (b"tail", NODE)]
    assert list(logread.attributed(tmp_path / "node0-h1.log", tmp_path / "node0-h1.idx", 2, 6))


def test_a_copy_that_differs_from_its_host_s_log_is_kept_with_a_note(tmp_path: Path) -> None:
    (tmp_path / "node0-h1.log").write_bytes(b"edited by hand\n")
    notes: list[str] = []
    logs = reopened(tmp_path, notes)
    NodeFeed(logs, None, 0).feed(b"I" + spans.pack(0, 20, 0) + b"what the rank wrote\n")
    assert logs.size(0) == 20 and logs.index_size(0) == 16  # where the host's stream is
    logs.close()
    assert (tmp_path / "node0-h1.log").read_bytes() == b"edited by hand\n"
    assert not (tmp_path / "node0-h1.idx").exists()
    assert len(notes) == 1 and "differs from its host's log at byte 0" in notes[0]
    assert str(tmp_path / "node0-h1.log") in notes[0]


def test_a_second_follower_of_a_run_shows_without_writing(tmp_path: Path) -> None:
    """Two followers of one run (two attach, or logs while the launch follows): the first
    writes the copy, the second counts where the stream is and writes nothing."""
    first = reopened(tmp_path)
    writer = NodeFeed(first, None, 0)
    writer.feed(b"I" + spans.pack(0, 4, 1) + b"one\n")
    notes: list[str] = []
    second = reopened(tmp_path, notes)
    assert second.shadow(0) and not first.shadow(0)
    assert "being written by another sshddp" in notes[0] and "node0-h1.log" in notes[0]
    assert (second.size(0), second.index_size(0)) == (4, 16)
    more = spans.pack(4, 4, 0) + b"two\n"
    writer.feed(more)
    NodeFeed(second, None, 0).feed(b"I" + more)  # the same span, from its own follower
    assert (second.size(0), second.index_size(0)) == (8, 32)
    second.close()
    first.close()
    assert (tmp_path / "node0-h1.log").read_bytes() == b"one\ntwo\n"
    assert spans.parse((tmp_path / "node0-h1.idx").read_bytes()) == [(0, 4, 1), (4, 4, 0)]


@pytest.mark.parametrize("name", ["node0-h1.log", "node0-h1.idx"])
def test_a_planted_symlink_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_bytes(b"someone else's\n")
    (tmp_path / name).symlink_to(victim)
    with pytest.raises(UsageError) as err:
        reopened(tmp_path)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert f"{tmp_path / name} is a symbolic link" in err.value.message
    assert victim.read_bytes() == b"someone else's\n"


def test_a_log_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "node0-h1.log")
    with pytest.raises(UsageError, match="node0-h1.log is not a regular file"):
        reopened(tmp_path)


def test_a_run_directory_others_may_write_in_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "run"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UsageError, match=r"run other users may write in it \(mode 0777\)"):
        reopened(shared)
    assert list(shared.iterdir()) == []
    (tmp_path / "link").symlink_to(shared)
    with pytest.raises(UsageError, match="link is a symbolic link or not a directory"):
        reopened(tmp_path / "link")


def test_the_run_directory_is_made_owner_only_and_a_readable_one_is_closed(
    tmp_path: Path,
) -> None:
    reopened(tmp_path / "logs" / "r1").close()
    assert (tmp_path / "logs" / "r1").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "logs" / "r1" / "node0-h1.log").stat().st_mode & 0o777 == 0o600
    (tmp_path / "logs" / "r1").chmod(0o755)
    reopened(tmp_path / "logs" / "r1").close()
    assert (tmp_path / "logs" / "r1").stat().st_mode & 0o777 == 0o700


def test_a_launch_takes_a_fresh_directory_and_leaves_none_when_nothing_started(
    tmp_path: Path,
) -> None:
    logs = reopened(tmp_path / "r1", fresh=True)
    logs.open(1, "h2")
    logs.discard_if_empty()
    logs.close()
    assert not (tmp_path / "r1").exists()
    old = tmp_path / "r2"
    old.mkdir(mode=0o700)
    (old / "node0-h1.log").write_bytes(RAW)
    with pytest.raises(UsageError, match="r2 exists already and is not empty"):
        reopened(old, fresh=True)
    assert (old / "node0-h1.log").read_bytes() == RAW


@pytest.mark.parametrize("command", ["launch", "smoke"])
def test_log_dir_has_help_text(command: str) -> None:
    shown = sshddp([command, "--help"])
    assert shown.code == 0
    assert "Local copies of the nodes' logs go in DIR/RUN" in " ".join(shown.out.split())
