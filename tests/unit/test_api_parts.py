"""The API's pure parts: options as the command's words, what travels, the records read back."""

from __future__ import annotations

import pickle
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

import sshddp
from sshddp.api import call
from sshddp.api.launch import LaunchResult, _command_options, launch
from sshddp.api.options import env_argv, inventory_argv, options_argv
from sshddp.errors import SshddpError, UsageError


def argv(**options: Any) -> list[str]:
    return options_argv(options, *_command_options())


def test_options_become_the_commands_words() -> None:
    assert argv(max_restarts=2, port="auto", share=["a.pt", "b.pt"], verbose=True) == [
        "--max-restarts",
        "2",
        "--port",
        "auto",
        "--share",
        "a.pt",
        "--share",
        "b.pt",
        "--verbose",
    ]
    assert argv(verbose=False, name=None) == []
    assert argv(sync="proj", stall_timeout=30) == ["--sync", "proj", "--stall-timeout", "30"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_restart": 1}, "unknown option 'max_restart'"),
        ({"detach": True}, "option 'detach': launch() returns when the run ends"),
        ({"dry_run": True}, "option 'dry_run': a dry run starts nothing"),
        ({"tty": True}, "option 'tty': the ranks' output comes back to this process"),
        ({"launcher": "node"}, "option 'launcher': launch() calls the function once per rank"),
        ({"module": "m"}, "option 'module'"),
        ({"local_rank_arg": True}, "LOCAL_RANK from os.environ"),
        ({"torchrun_arg": ["--no-python"]}, "'--no-python' changes what torchrun runs"),
        ({"torchrun_arg": "--run-path=x.py"}, "'--run-path=x.py' changes what torchrun runs"),
        ({"workdir": "."}, "option 'workdir'"),
        ({"env": {"A": "1"}}, "launch(..., env="),
        ({"verbose": "yes"}, "True or False"),
    ],
)
def test_options_launch_does_not_take_are_refused(options: dict[str, Any], words: str) -> None:
    with pytest.raises(UsageError, match=None) as raised:
        argv(**options)
    assert words in raised.value.message


def test_env_and_inventory_words() -> None:
    assert env_argv({"A": "1 2"}) == ["--env", "A=1 2"]
    with pytest.raises(UsageError):
        env_argv({"A": 1})  # type: ignore[dict-item]
    assert inventory_argv("inv.yaml", True) == ["inv.yaml"]
    assert inventory_argv("gpu-a:8,gpu-b:8", False) == ["-H", "gpu-a:8,gpu-b:8"]
    assert inventory_argv("slurm:123", False) == ["slurm:123"]
    assert inventory_argv("missing.yaml", False) == ["missing.yaml"]


def test_what_cannot_travel_is_a_usage_error_naming_the_function() -> None:
    lock = threading.Lock()

    def holds_a_lock() -> bool:
        return lock.locked()

    with pytest.raises(UsageError) as raised:
        call.pickled_call(holds_a_lock, (), {})
    assert "holds_a_lock" in raised.value.message and "cannot travel" in raised.value.message
    with socket.socket() as sock, pytest.raises(UsageError):
        call.pickled_call(lambda: sock, (), {})
    with pytest.raises(UsageError, match="not a function"):
        call.pickled_call(3, (), {})  # type: ignore[arg-type]


def test_a_closure_travels_by_value() -> None:
    base = {"k": 41}
    data = call.pickled_call(lambda x: base["k"] + x, (1,), {})
    fn, args, kwargs = pickle.loads(data)
    assert fn(*args, **kwargs) == 42


def record(rank: int, attempt: int = 1, **fields: Any) -> dict[str, Any]:
    return {"rank": rank, "attempt": attempt, "time": float(rank), **fields}


def write(tmp: Path, *records: dict[str, Any]) -> list[Path]:
    paths = []
    for r in records:
        path = tmp / f"node{r['rank']}" / f"rank{r['rank']}-{r['attempt']}.pkl"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(pickle.dumps(r))
        paths.append(path)
    return paths


def test_only_the_newest_attempts_records_count(tmp_path: Path) -> None:
    ok = {"ok": True, "value": pickle.dumps("v")}
    stale = record(0, 1, **ok)
    fresh = [record(0, 2, ok=True, value=pickle.dumps("new")), record(1, 2, **ok)]
    got = call.read_records(write(tmp_path, stale, *fresh))
    assert call.values(got, "r") == {0: "new", 1: "v"}
    assert call.in_rank_order(call.values(got, "r"), 2, "r") == ["new", "v"]


def test_a_missing_or_oversized_value_names_the_rank() -> None:
    with pytest.raises(call.ResultError, match=r"rank\(s\) 1 left no return value"):
        call.in_rank_order({0: 1}, 2, "r")
    records = {2: record(2, ok=False, result_error="its return value (bytes) is 9 bytes")}
    with pytest.raises(call.ResultError, match="rank 2: its return value") as raised:
        call.values(records, "r")
    assert raised.value.rank == 2


def test_the_first_rank_to_raise_is_the_one_named() -> None:
    def raised(rank: int, when: float) -> dict[str, Any]:
        return {**record(rank), "ok": False, "type": "E", "message": "m", "traceback": "tb"}

    records = {1: {**raised(1, 0), "time": 5.0}, 3: {**raised(3, 0), "time": 2.0}}
    first = call.first_raised(records)
    assert first is not None and first.rank == 3
    assert call.first_raised({0: record(0, ok=True, value=b"")}) is None


def test_the_errors_belong_to_sshddps_tree() -> None:
    assert issubclass(sshddp.RankFailed, SshddpError)
    assert issubclass(sshddp.RunHung, SshddpError)
    assert issubclass(sshddp.ResultError, SshddpError)
    assert sshddp.UsageError is UsageError


def test_by_host_keeps_rank_order() -> None:
    res: LaunchResult[int] = LaunchResult([0, 1, 2, 3], "r", None, "", ("a", "a", "b", "b"))  # type: ignore[arg-type]
    assert res.by_host() == {"a": [0, 1], "b": [2, 3]}


def test_launch_inside_a_rank_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSHDDP_RUN_ID", "abc")
    with pytest.raises(UsageError, match="inside a rank of run abc"):
        launch(print, "h:1")


def test_start_inside_a_rank_is_refused_and_launch_refuses_detach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SSHDDP_RUN_ID", "abc")
    with pytest.raises(UsageError, match="inside a rank of run abc"):
        sshddp.start(print, "h:1")
    monkeypatch.delenv("SSHDDP_RUN_ID")
    with pytest.raises(UsageError, match=r"option 'detach': .* sshddp.start\(..., detach=True\)"):
        sshddp.launch(print, "h:1", detach=True)
    assert repr(sshddp.Run("k3f9xq", {})) == "Run('k3f9xq')"


@pytest.mark.parametrize("option", ["tty", "dry_run", "local_rank_arg"])
def test_an_unsupported_option_is_refused_before_anything_starts(option: str) -> None:
    """No host is reached: this inventory's host does not exist."""
    with pytest.raises(UsageError, match=f"option {option!r}: "):
        sshddp.launch(print, "no-such-host.invalid:1", **{option: True})
    with pytest.raises(UsageError, match=f"option {option!r}: "):
        sshddp.start(print, "no-such-host.invalid:1", **{option: True})


def test_torchrun_options_that_keep_the_program_pass() -> None:
    words = argv(torchrun_arg=["--local-ranks-filter=0"])
    assert words == ["--torchrun-arg", "--local-ranks-filter=0"]
