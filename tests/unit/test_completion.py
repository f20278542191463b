"""Small things people reach for: ``-V``, and shell completion (``_SSHDDP_COMPLETE``) that
completes run ids for attach, logs, ps, stop, stacks and fetch from the local registry alone."""

from __future__ import annotations

import json

import pytest

from cli_helpers import sshddp
from completion_runs import RUN_IDS, record_runs
from sshddp import __version__
from sshddp.run import registry

# Hosts that cannot be reached: completing a run id must never try.


@pytest.mark.parametrize("flag", ["-V", "--version"])
def test_version(flag: str) -> None:
    result = sshddp([flag])
    assert (result.code, result.out) == (0, f"sshddp, version {__version__}\n")


def test_ps_of_one_run_shows_it_even_when_finished() -> None:
    record_runs()
    for run_id in RUN_IDS:  # every run ended (as a coordinator that followed it recorded)
        path = registry.runs_dir() / f"{run_id}.json"
        data = json.loads(path.read_text())
        node = {"node_rank": 0, "state": "succeeded", "returncode": 0, "reason": ""}
        data["result"] = {"nodes": [node], "root_cause": None}
        path.write_text(json.dumps(data))
    assert sshddp(["ps"]).out.startswith("no runs in progress")
    one = sshddp(["ps", "abd"])
    assert one.code == 0, one.explain()
    assert "abd456" in one.out and "0:succeeded" in one.out
    assert "abc123" not in one.out and "zzz999" not in one.out
    assert sshddp(["ps", "ab"]).code == 2  # ambiguous, as for every command taking RUN
