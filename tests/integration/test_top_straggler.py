"""``sshddp top`` names the straggler of a coupled run: real sshd hosts, real torchrun,
DDP on gloo (``payloads/straggler.py``: gradients all-reduced every step, so every rank
steps at the straggler's rate and only where their time goes tells it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest
from launch_helpers import sshddp, wait_until, write_inventory

from sshddp.model.straggler import MIN_SAMPLES
from sshddp_lab.sshd import SshdCluster

PAYLOAD = Path(__file__).parent / "payloads" / "straggler.py"


def _top(cluster: SshdCluster, cwd: Path, run: str) -> dict[str, Any]:
    done = sshddp(cluster, cwd, "top", "--json", run)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return dict(json.loads(done.stdout))


def _judged(doc: dict[str, Any]) -> bool:
    """Every rank of the run has enough stack samples to be judged."""
    ranks = doc["ranks"]
    return len(ranks) == 4 and all(r["stack_samples"] >= MIN_SAMPLES for r in ranks)


@pytest.mark.parametrize(
    ("mode", "evidence"),
    [("sleep", "(time.sleep(0.2))"), ("compute", "torch.mm(heavy, heavy)"), ("even", "")],
)
def test_top_names_the_rank_a_ddp_run_waits_for(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[[str], None],
    mode: str,
    evidence: str,
) -> None:
    """2 hosts x 2 ranks, detached: rank 3 (on h2) sleeps 0.2 s a step or computes 0.2 s
    more, and `top --json` names it with its evidence; in a balanced run, nobody, while
    every rank has been sampled enough to be judged."""
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2])
    run = f"strag-{mode}"
    started = sshddp(
        ssh_env, tmp_path, "launch", "--detach", "--name", run, inv, PAYLOAD, mode, "3"
    )
    assert started.returncode == 0, started.stderr
    try:
        docs: list[dict[str, Any]] = []

        def seen() -> bool:
            docs.append(_top(ssh_env, tmp_path, run))
            if mode == "even":
                return sum(_judged(d) for d in docs) >= 3
            return bool(docs[-1]["stragglers"])

        wait_until(seen, 150, f"top to judge the {mode} run")
    finally:
        stop = sshddp(ssh_env, tmp_path, "stop", run)
    assert stop.returncode == 0, stop.stderr
    run_no_leak(run)
    doc = docs[-1]
    if mode == "even":
        assert not any(d["stragglers"] for d in docs), [d["summary"] for d in docs]
        assert not any(r["straggler"] for d in docs for r in d["ranks"])
    else:
        assert [(s["rank"], s["host"]) for s in doc["stragglers"]] == [(3, "h2")], doc
        assert [r["rank"] for r in doc["ranks"] if r["straggler"]] == [3]
        assert doc["summary"].startswith("straggler: rank 3 on h2 waits "), doc["summary"]
        assert "it spends its time at straggler.py:" in doc["summary"], doc["summary"]
        assert evidence in doc["summary"], doc["summary"]
