"""The ranks' stacks thread (``ranksite``: what the samplers that run unasked ask, in place
of faulthandler's signal handler) is no part of the program's stacks. Its dumps are read in
tests/integration/test_remote_stacks.py, from a real process."""

from __future__ import annotations

from sshddp.remote.calls.host_stacks import _without_ours, parse_faulthandler


def test_the_stacks_thread_is_dropped_from_what_a_user_reads() -> None:
    dump = (
        "Thread 0x00007f0000000002 (most recent call first):\n"
        '  File "/r/n0/site/sitecustomize.py", line 160 in _serve\n'
        '  File "/usr/lib/python3.11/threading.py", line 982 in run\n'
        "\n"
        "Current thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/w/train.py", line 9 in step\n'
        '  File "/w/train.py", line 20 in <module>\n'
    )
    record = {"threads": parse_faulthandler(dump)}
    kept = _without_ours(record)["threads"]  # type: ignore[arg-type]
    assert [[f["func"] for f in t["frames"]] for t in kept] == [["<module>", "step"]]
