"""Whether a quiet node's ranks still work (``remote/node/node_progress``): the pure judgement of
two samples of their stacks and CPU time, taken seconds apart."""

from __future__ import annotations

from sshddp.protocol.contract import ThreadRecord
from sshddp.remote.node.joined import still
from sshddp.remote.node.node_progress import CPU_SHARE, interval, moved, stack_key


def threads(*frames: tuple[str, int, str]) -> list[ThreadRecord]:
    return [
        {
            "id": "0x1",
            "name": "",
            "status": "",
            "current": True,
            "frames": [
                {"file": f, "line": n, "func": fn, "code": "", "native": False}
                for f, n, fn in frames
            ],
        }
    ]


WAIT = stack_key(threads(("/r/n0/train.py", 9, "main"), ("/t/c10d.py", 80, "all_reduce")))
STEP = stack_key(threads(("/r/n0/train.py", 7, "main"), ("/t/module.py", 12, "forward")))


def test_ranks_blocked_in_a_collective_or_asleep_did_not_move() -> None:
    """Same stacks, CPU time that barely moved (a gloo wait, a sleep, the dump itself)."""
    before = {10: (5.00, WAIT), 11: (7.00, WAIT)}
    after = {10: (5.01, WAIT), 11: (7.00, WAIT)}
    assert moved(before, after, 2.0, cpu_counts=True) == ""


def test_a_rank_whose_stacks_changed_worked() -> None:
    before = {10: (5.0, WAIT), 11: (7.0, WAIT)}
    after = {10: (5.0, WAIT), 11: (7.0, STEP)}
    assert moved(before, after, 2.0, cpu_counts=False) == "the stacks of pid 11 changed"


def test_cpu_time_counts_only_where_it_means_something() -> None:
    """A rank at the same line that used most of a core between the samples worked (a long
    op on a CPU host); on a GPU host the same figures say nothing (a rank waiting for a
    kernel that never ends spins in cudaStreamSynchronize)."""
    before = {10: (5.0, STEP)}
    after = {10: (6.8, STEP)}
    assert moved(before, after, 2.0, cpu_counts=True) == "pid 10 used 90% of a core"
    assert moved(before, after, 2.0, cpu_counts=False) == ""
    below = {10: (5.0 + CPU_SHARE * 2.0 * 0.9, STEP)}
    assert moved(before, below, 2.0, cpu_counts=True) == ""


def test_a_process_that_came_or_went_is_work_and_unread_values_are_no_evidence() -> None:
    before = {10: (5.0, WAIT)}
    assert moved(before, {10: (5.0, WAIT), 12: (0.1, None)}, 2.0, True) == ("its processes changed")
    assert moved({10: (None, None)}, {10: (9.0, STEP)}, 2.0, True) == ""


def test_stacks_compare_by_file_name_and_in_any_thread_order() -> None:
    one = threads(("/a/train.py", 3, "main")) + threads(("/a/t.py", 1, "loop"))
    other = threads(("/b/t.py", 1, "loop")) + threads(("/b/train.py", 3, "main"))
    assert stack_key(one) == stack_key(other)


def test_still_counts_from_the_last_output_or_the_last_work_seen() -> None:
    assert still(100.0, quiet=30.0, moved_at=None) == 30.0
    assert still(100.0, quiet=30.0, moved_at=98.0) == 2.0
    assert still(100.0, quiet=5.0, moved_at=50.0) == 5.0  # it wrote since


def test_several_samples_within_a_stall_timeout() -> None:
    assert [interval(s) for s in (2, 8, 20, 900)] == [1.0, 2.0, 5.0, 30.0]
