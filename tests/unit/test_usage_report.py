"""The end of a run's report: each node's GPUs over its kept samples (exit.json's ``usage``),
and the node whose GPUs sat mostly idle while the others worked."""

from __future__ import annotations

from typing import Any, Optional

from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, RunResult

GIB = 1 << 30


def _usage(util: Optional[float], gpus: int = 8, peak: Optional[int] = None) -> dict[str, Any]:
    return {
        "samples": 60,
        "gpus": gpus,
        "gpu_util": util,
        "gpu_mem_peak": peak,
        "gpu_mem_total": 80 * GIB if peak is not None else None,
    }


def _run(*usages: dict[str, Any]) -> RunResult:
    nodes = []
    for i, usage in enumerate(usages):
        node = NodeResult(i, f"h{i + 1}")
        node.apply({"state": "succeeded", "returncode": 0, "usage": usage})
        nodes.append(node)
    return RunResult("r1", nodes)


def test_each_gpu_node_shows_its_mean_utilisation_and_peak_memory() -> None:
    text = run_report(_run(_usage(87.4, peak=61 * GIB), _usage(91.0, peak=62 * GIB)), [])
    assert "  node 0   h1                   8 GPU  87%  61.0 GiB of 80.0 GiB" in text
    assert "  node 1   h2                   8 GPU  91%  62.0 GiB of 80.0 GiB" in text
    assert "idle GPUs" not in text


def test_a_node_whose_gpus_sat_idle_while_the_others_worked_is_named() -> None:
    run = _run(_usage(87.0, peak=GIB), _usage(88.0, peak=GIB), _usage(4.2, peak=GIB))
    text = run_report(run, [])
    assert text.splitlines()[-1] == "idle GPUs: node 2 (h3) averaged 4% against a median of 87%"


def test_no_node_is_idle_when_none_worked() -> None:
    text = run_report(_run(_usage(3.0), _usage(12.0), _usage(0.0)), [])
    assert "node 2   h3                   8 GPU  0%  -" in text
    assert "idle GPUs" not in text


def test_a_run_without_gpus_says_nothing_of_gpus() -> None:
    text = run_report(_run(_usage(None, gpus=0), _usage(None, gpus=0)), [])
    assert "GPU" not in text


def test_a_record_without_usage_says_nothing_of_gpus() -> None:
    node = NodeResult(0, "h1")
    node.apply({"state": "succeeded", "returncode": 0})
    assert node.usage is None
    assert "GPU" not in run_report(RunResult("r1", [node]), [])
