"""The root-cause report's reading of a failed node's log (pure)."""

from __future__ import annotations

from sshddp.model.report import torchrun_failure, user_tail

SUMMARY = """\
Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
job.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 5 (local_rank: 1)
  exitcode  : -15 (pid: 13097)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 4 (local_rank: 0)
  exitcode  : 1 (pid: 13094)
============================================================""".splitlines()


def _log(root_lines: int, follow_on_lines: int) -> list[str]:
    own = ["[rank4]: Traceback (most recent call last):"]
    own += [f"[rank4]:   frame {i}" for i in range(root_lines)]
    own += ["[rank4]: RuntimeError: boom on rank 4"]
    other = ["[rank5]: Traceback (most recent call last):"]
    other += [f"[rank5]:   frame {i}" for i in range(follow_on_lines)]
    other += ["[rank5]: RuntimeError: Connection closed by peer"]
    return ["step 1", "step 2", *own, *other, *SUMMARY]


def test_the_root_cause_ranks_traceback_survives_a_peers_longer_follow_on_error() -> None:
    lines = _log(root_lines=6, follow_on_lines=30)
    info = torchrun_failure(lines)
    assert (info["rank"], info["local_rank"], info["exitcode"]) == (4, 0, 1)
    tail = user_tail(lines, rank=info["rank"])
    assert tail[0] == "[rank4]: Traceback (most recent call last):"
    assert tail[-1] == "[rank4]: RuntimeError: boom on rank 4"
    assert not any("rank5" in line for line in tail)


def test_a_long_root_traceback_keeps_its_last_lines() -> None:
    lines = _log(root_lines=40, follow_on_lines=2)
    tail = user_tail(lines, n=20, rank=4)
    assert len(tail) == 20 and tail[-1] == "[rank4]: RuntimeError: boom on rank 4"


def test_without_rank_prefixes_the_tail_stops_above_torchruns_summary() -> None:
    lines = ["step 1", "ValueError: plain", *SUMMARY]
    assert user_tail(lines, rank=4) == ["step 1", "ValueError: plain"]
    assert user_tail(lines) == ["step 1", "ValueError: plain"]
