"""The NCCL flight recorder: asked for a dump through each rank's pipe, the dumps read
without running anything in them, and which rank never entered which collective.

``data/nccl_trace_h100_torch2.11`` is a real dump: ``scripts/gpu_smoke.sh`` on an H100
(torch 2.11, NCCL 2.28), one rank whose second all-reduce never completes, dumped when
sshddp's stall watchdog asked for it."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from sshddp.remote import flight

REAL = Path(__file__).parents[1] / "unit" / "data" / "nccl_trace_h100_torch2.11"


def test_a_dump_is_read_without_running_anything_in_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Hostile:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return os.system, (f"touch {marker}",)  # what plain pickle.load would run

    (tmp_path / "trace_0").write_bytes(pickle.dumps({"entries": [Hostile()]}, protocol=2))
    assert flight.read(str(tmp_path / "trace_0"), 0) is None
    assert not marker.exists()
    (tmp_path / "trace_1").write_bytes(REAL.read_bytes()[:200])  # still being written
    assert flight.read(str(tmp_path / "trace_1"), 1) is None
    (tmp_path / "trace_2").write_bytes(pickle.dumps([1, 2]))  # not a dump
    assert flight.read(str(tmp_path / "trace_2"), 2) is None
    assert flight.read(str(tmp_path / "missing"), 3) is None
