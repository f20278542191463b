"""The straggler of a coupled run: each stack sample classified (``remote/calls/waits.py``, on
py-spy's real dumps of a DDP run's ranks), each rank's window (``node_top.waits``), the
judgement (``model/straggler.py``) and how ``top`` shows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sshddp.model import straggler, top
from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, RunResult
from sshddp.model.straggler import Waits
from sshddp.model.top import RankRow
from sshddp.protocol.contract import SampleRecord, ThreadRecord
from sshddp.remote.calls import node_sampler, node_top, pyspy, waits

#: ``py-spy dump --json`` (and ``--native``) of the ranks of ``straggler.py`` (the
#: integration payload) under torchrun, 2-3 ranks on gloo: a rank waiting in DDP's
#: backward for the straggler, the straggler in ``time.sleep`` and in its extra compute
DUMPS = Path(__file__).parent / "data" / "pyspy_ddp"


def _threads(name: str) -> list[ThreadRecord]:
    raw = json.loads((DUMPS / name).read_text())
    return pyspy.parse(raw, raw[0]["pid"])


def test_a_rank_in_ddps_backward_waits_and_the_straggler_works() -> None:
    waiting = waits.classify(_threads("backward_waiting.json"))
    assert waiting is not None and waiting["wait"] is True
    assert waiting["where"].startswith("straggler.py:39 (")  # loss.backward(), its own line
    sleeping = waits.classify(_threads("sleeping.json"))
    assert sleeping is not None and sleeping["wait"] is False
    assert sleeping["where"].startswith("straggler.py:34 (")
    computing = waits.classify(_threads("computing.json"))
    assert computing is not None and computing["wait"] is False
    assert computing["where"].startswith("straggler.py:29 (")  # inside extra_work


def test_native_frames_of_the_reducer_are_a_collective() -> None:
    threads = _threads("native_backward_waiting.json")
    sample = waits.classify(threads)
    assert sample is not None and sample["wait"] is True
    natives = [f for f in threads[0]["frames"] if f["native"]]
    assert any(waits.is_collective(f) for f in natives)  # c10d::Reducer::finalize_backward
    python = [f for f in threads[0]["frames"] if not f["native"]]
    only = [{**t, "frames": natives} for t in threads]  # the native frames alone suffice
    assert waits.classify(only) == {"wait": True, "where": ""} and python


def _frame(file: str, func: str, line: int = 1, code: str = "") -> dict[str, Any]:
    return {"file": file, "line": line, "func": func, "code": code, "native": False}


def test_torch_distributed_calls_wait_and_the_training_thread_is_the_scripts() -> None:
    c10d = "/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    main = [_frame("train.py", "<module>", 20, "dist.barrier()"), _frame(c10d, "barrier")]
    helper = [_frame("/v/lib/python3.11/threading.py", "_bootstrap"), _frame("x.py", "run")]
    threads: list[Any] = [
        {"id": "2", "name": "", "status": "", "current": True, "frames": helper},
        {"id": "1", "name": "", "status": "", "current": False, "frames": main},
    ]
    assert waits.classify(threads) == {"wait": True, "where": "train.py:20 (dist.barrier())"}
    assert waits.classify([]) is None


def test_ddps_constructor_waits_for_the_other_ranks() -> None:
    """DDP's constructor checks the parameters' shapes and broadcasts rank 0's across ranks:
    a rank there waits for the others (a straggler is not named for being slow to build)."""
    ddp = "/v/lib/python3.11/site-packages/torch/nn/parallel/distributed.py"
    utils = "/v/lib/python3.11/site-packages/torch/distributed/utils.py"
    build = _frame("train.py", "<module>", 21, "model = DistributedDataParallel(net)")
    for inner in ("_verify_param_shape_across_processes", "_sync_params_and_buffers"):
        frames = [build, _frame(ddp, "__init__"), _frame(utils, inner)]
        thread = {"id": "1", "name": "", "status": "", "current": True, "frames": frames}
        assert waits.classify([thread]) == {"wait": True, "where": build_where(build)}, inner


def build_where(frame: dict[str, Any]) -> str:
    return f"{frame['file']}:{frame['line']} ({frame['code']})"


def _samples(points: list[tuple[float, bool | None]]) -> list[SampleRecord]:
    out: list[Any] = []
    for at, wait in points:
        stack = None if wait is None else {"wait": wait, "where": "t.py:3 (work())"}
        rank = {"rank": 5, "local_rank": 1, "stack": stack}
        out.append({"at": at, "ranks": [rank]})
    return out


def test_a_node_sends_each_ranks_stack_samples_of_the_last_window() -> None:
    points = [(float(t), t % 3 == 0 if t != 4 else None) for t in range(40)]
    sent = node_top.waits(_samples(points))
    assert list(sent) == ["1"]
    assert sent["1"][0][0] == 39.0 - node_top.WINDOW  # the window's oldest, the rest older
    assert len(sent["1"]) == node_top.WINDOW + 1
    assert sent["1"][-1] == [39.0, True, "t.py:3 (work())"]
    assert node_top.waits([]) == {}


def _window(waiting: int, samples: int = 20, where: str = "t.py:9 (f())") -> Waits:
    return Waits(samples, waiting, where)


def test_the_rank_the_others_wait_for_is_named_with_its_evidence() -> None:
    ranks = [(r, f"h{r // 2 + 1}", _window(1 if r == 4 else 17)) for r in range(6)]
    found = straggler.judge(ranks)
    assert [(s.rank, s.host) for s in found] == [(4, "h3")]
    assert straggler.line(found) == (
        "straggler: rank 4 on h3 waits 5% of its time in collectives, the others 85%; "
        "it spends its time at t.py:9 (f())"
    )


def test_nobody_is_named_in_a_balanced_run_nor_on_thin_evidence() -> None:
    balanced = [(r, "h1", _window(w)) for r, w in enumerate([12, 16, 9, 14])]
    assert straggler.judge(balanced) == []  # a spread of 35 points is noise, not a gap
    idle = [(r, "h1", _window(2 if r else 0)) for r in range(4)]
    assert straggler.judge(idle) == []  # nobody waits: nobody is waited for
    young = [(r, "h1", _window(0 if r == 1 else 5, samples=5)) for r in range(4)]
    assert straggler.judge(young) == []  # too few samples yet
    missing = [(0, "h1", _window(0)), (1, "h1", None), (2, "h2", _window(18))]
    assert straggler.judge(missing) == []  # a rank without samples: the run is not judged
    assert straggler.judge([(0, "h1", _window(0))]) == []
    assert straggler.waits_of([]) is None


def test_a_window_says_where_the_rank_works_most() -> None:
    points = [[0, False, "a.py:1 (x)"], [1, False, "b.py:2 (y)"], [2, False, "b.py:2 (y)"]]
    assert straggler.waits_of([*points, [3, True, "c.py:3 (z)"]]) == Waits(4, 1, "b.py:2 (y)")


def _row(rank: int, window: Waits | None, rate: float | None = 4.45) -> RankRow:
    host = f"h{rank // 2 + 1}"
    return RankRow(rank, host, rank // 2, 9, 99.0, 1, rate, 0.5, None, waits=window)


def test_top_names_the_straggler_of_ranks_at_one_rate() -> None:
    """DDP keeps every rank at the straggler's pace: the rates are alike, the stacks tell."""
    rows = top.flag_slow([_row(r, _window(0 if r == 4 else 18)) for r in range(6)])
    assert not any(r.slow for r in rows)
    assert [r.rank for r in rows if r.straggler] == [4]
    assert top.summary(rows).startswith("straggler: rank 4 on h3 waits 0% of its time")
    table = top.render([], rows).splitlines()
    assert [x.split()[0] for x in table if x.endswith("STRAGGLER")] == ["4"]
    doc = top.json_doc("r1", 1.0, [], rows)
    assert doc["stragglers"][0]["rank"] == 4 and doc["ranks"][4]["straggler"] is True
    assert doc["ranks"][0]["waits"] == 0.9 and doc["ranks"][0]["stack_samples"] == 20
    even = top.flag_slow([_row(r, _window(15)) for r in range(6)])
    assert not any(r.straggler for r in even)
    assert top.summary(even) == "no slow rank: median 4.45 it/s"


def _ended(node: int, waits: dict[str, list[Any]]) -> NodeResult:
    result = NodeResult(node, f"h{node + 1}")
    usage = {"samples": 90, "gpus": 0, "gpu_util": None, "waits": waits}
    result.apply({"state": "stopped", "returncode": None, "usage": usage})
    return result


def test_the_runs_report_names_the_straggler_from_the_nodes_kept_samples() -> None:
    """Each node's exit record keeps where its ranks' time went (``usage.waits``, summed
    by the sampler over its kept samples); the report adds one line naming the straggler."""

    def sample(at: float, rank: int, wait: bool) -> Any:
        stack = {"wait": wait, "where": "t.py:13 (time.sleep(0.2))" if not wait else "b.py:1"}
        return {"at": at, "ranks": [{"rank": rank, "local_rank": 0, "stack": stack}]}

    kept = [sample(t, 3, t % 20 == 0) for t in range(60)]
    assert node_sampler.waits_of(kept) == {"3": [60, 3, "t.py:13 (time.sleep(0.2))"]}
    run = RunResult(
        "r1",
        [
            _ended(0, {"0": [60, 55, ""], "1": [60, 52, "x.py:2 (f())"]}),
            _ended(1, {"2": [60, 57, ""], "3": [60, 3, "t.py:13 (time.sleep(0.2))"]}),
        ],
    )
    text = run_report(run, [])
    assert (
        "straggler: rank 3 on h2 waits 5% of its time in collectives, the others 92%; "
        "it spends its time at t.py:13 (time.sleep(0.2))"
    ) in text.splitlines(), text
    balanced = RunResult("r1", [_ended(0, {"0": [60, 55, ""]}), _ended(1, {"1": [60, 50, ""]})])
    assert "straggler" not in run_report(balanced, [])
    older = RunResult("r1", [_ended(0, {}), _ended(1, {"1": [60, 0, ""]})])
    assert "straggler" not in run_report(older, [])
