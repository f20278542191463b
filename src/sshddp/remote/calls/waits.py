"""Where a rank's time goes, from one sample of its stacks: waiting inside a collective (for
the other ranks) or working, and at which line of the program.

Pure: it reads threads as ``sshddp stacks`` records them (``contract.ThreadRecord``, from
faulthandler's dump or py-spy's). The rank's training thread is its main thread: the one
whose outermost frame is the script's ``<module>`` (or runpy's), else the first. It waits
when a frame of that stack is a collective:
- torch.distributed's calls (all_reduce, barrier, broadcast, all_gather, a work's wait...:
  every function of ``distributed_c10d.py`` and the functional collectives), which is
  where Lightning's, accelerate's and transformers' own barriers end too;
- DDP's backward: the reducer all-reduces the gradients inside ``backward`` and the call
  returns once every rank's gradients are in, so the ranks that wait for a straggler wait
  there (backward's own compute counts too, alike on every rank of a DDP run, so it does
  not change which rank waits least);
- DDP's own syncs (buffers broadcast before a forward, the join hooks);
- native frames, where py-spy read them: gloo's, NCCL's, c10d's ProcessGroup and Work.
"""

from __future__ import annotations

import os
from typing import Optional

from sshddp.protocol.contract import FrameRecord, StackSample, ThreadRecord

#: files whose every function is a collective (or waits for one)
COLLECTIVE_FILES = (
    "torch/distributed/distributed_c10d.py",
    "torch/distributed/_functional_collectives.py",
    "torch/distributed/c10d_logger.py",
)
#: (file, function): DDP's backward and syncs, which wait for the other ranks
COLLECTIVE_CALLS = (
    ("torch/autograd/graph.py", "_engine_run_backward"),
    ("torch/autograd/__init__.py", "backward"),
    ("torch/nn/parallel/distributed.py", "_sync_buffers"),
    ("torch/nn/parallel/distributed.py", "_sync_module_buffers"),
    ("torch/nn/parallel/distributed.py", "_check_global_requires_backward_grad_sync"),
    ("torch/nn/parallel/distributed.py", "_match_all_reduce_for_bwd_pass"),
    ("torch/distributed/utils.py", "_sync_params_and_buffers"),
    ("torch/distributed/utils.py", "_verify_param_shape_across_processes"),
    ("torch/nn/parallel/distributed.py", "_distributed_broadcast_coalesced"),
)
#: words of a native frame's function that make it a collective's
NATIVE_WORDS = ("gloo::", "nccl", "c10d::", "ProcessGroup", "Reducer::", "Work::wait")
_OUTERMOST = ("<module>", "_run_module_as_main")
_LIBRARY = ("site-packages", "dist-packages", "<frozen ", "/lib/python")
WHERE_CHARS = 120  #: of the line a sample names


def classify(threads: list[ThreadRecord]) -> Optional[StackSample]:
    """Whether the rank's training thread waits in a collective, and where it is: the
    innermost line of the program's own code (outside the libraries) with its source.
    None without a stack."""
    main = training_thread(threads)
    if main is None or not main["frames"]:
        return None
    frames = main["frames"]
    return {"wait": any(is_collective(f) for f in frames), "where": where(frames)}


def training_thread(threads: list[ThreadRecord]) -> Optional[ThreadRecord]:
    for thread in threads:
        if thread["frames"] and thread["frames"][0]["func"] in _OUTERMOST:
            return thread
    return threads[0] if threads else None


def is_collective(frame: FrameRecord) -> bool:
    if frame["native"]:
        return any(word in frame["func"] for word in NATIVE_WORDS)
    file = frame["file"].replace("\\", "/")
    if file.endswith(COLLECTIVE_FILES):
        return True
    return any(file.endswith(f) and frame["func"] == func for f, func in COLLECTIVE_CALLS)


def where(frames: list[FrameRecord]) -> str:
    """``train.py:13 (time.sleep(0.2))``: the innermost Python frame of the program's own
    files (the innermost of all when every one is a library's)."""
    python = [f for f in frames if not f["native"] and f["file"]]
    if not python:
        return ""
    own = [f for f in python if not any(mark in f["file"] for mark in _LIBRARY)]
    frame = (own or python)[-1]
    said = frame["code"] or frame["func"]
    return f"{os.path.basename(frame['file'])}:{frame['line']} ({said})"[:WHERE_CHARS]
