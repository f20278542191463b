"""remote/calls/pyspy: the real py-spy (pinned in the test extras) reading a real process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sshddp.remote.calls import pyspy

NAPS = """
import threading, time

def nap():
    time.sleep(600)

threading.Thread(target=nap, name="napper", daemon=True).start()
print("ready", flush=True)
nap()
"""


@pytest.fixture
def napping(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    (tmp_path / "naps.py").write_text(NAPS)
    proc = subprocess.Popen(
        [sys.executable, "naps.py"], cwd=tmp_path, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_python_process_is_read_with_its_native_frames(napping: subprocess.Popen[str]) -> None:
    found = pyspy.find()
    assert found is not None
    threads, raw, error = pyspy.dump(found, napping.pid)
    assert error == "" and raw.lstrip().startswith("[")
    assert [t["name"] for t in threads] == ["MainThread", "napper"]  # the main thread first
    for t in threads:
        python = [f for f in t["frames"] if not f["native"]]
        assert python[-1]["func"] == "nap" and python[-1]["code"] == "time.sleep(600)"
        assert t["frames"][-1]["native"]  # the innermost frame is C (the sleep)
    assert "Thread.run" not in {f["func"] for f in threads[1]["frames"]}  # named as Python does
    assert napping.poll() is None


def test_a_process_py_spy_cannot_read_gives_py_spy_s_message_only() -> None:
    found = pyspy.find()
    assert found is not None
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.2)
        threads, _, error = pyspy.dump(found, sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert threads == [] and error.startswith("Error: ") and "\n" not in error
