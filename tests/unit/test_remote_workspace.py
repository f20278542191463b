"""The working directory that outlives a run (remote/node/workspace.py), run here in-process: the
shipped code replaces its own files there and leaves everything else alone."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any

import pytest

from sshddp.remote.node import host_boot
from sshddp.remote.node.workspace import WorkspaceError, fill
from workspace_trees import code_dir, tree


def test_code_lands_in_an_empty_workspace_without_the_digest_file(tmp_path: Path) -> None:
    code = code_dir(tmp_path, {"train.py": b"print(1)\n", "pkg/m.py": b"W = 1\n"})
    space = tmp_path / "work" / "proj-abc"
    fill(str(code), str(space))
    assert tree(space) == {"train.py": b"print(1)\n", "pkg/m.py": b"W = 1\n"}
    assert (space / "train.py").stat().st_ino == (code / "train.py").stat().st_ino  # a link


def test_new_code_replaces_old_code_and_keeps_everything_else(tmp_path: Path) -> None:
    space = tmp_path / "space"
    fill(str(code_dir(tmp_path, {"train.py": b"v1", "pkg/m.py": b"v1"}, "c1")), str(space))
    (space / "checkpoint.pt").write_bytes(b"weights of run 1")
    (space / "pkg" / "cache.bin").write_bytes(b"cache")
    reader = open(space / "train.py", "rb")  # a process of the older run still has it open
    fill(str(code_dir(tmp_path, {"train.py": b"v2", "pkg/m.py": b"v2"}, "c2")), str(space))
    assert tree(space) == {
        "checkpoint.pt": b"weights of run 1",
        "pkg/cache.bin": b"cache",
        "pkg/m.py": b"v2",
        "train.py": b"v2",
    }
    assert reader.read() == b"v1"  # renamed over, never rewritten in place
    reader.close()
    assert (tmp_path / "c1" / "train.py").read_bytes() == b"v1"  # each run's copy stays


@pytest.mark.parametrize(
    ("files", "make", "why"),
    [
        ({"pkg/m.py": b"x"}, lambda s: (s / "pkg").write_bytes(b"a file"), "is a file in"),
        ({"data": b"x"}, lambda s: (s / "data").mkdir(), "is a directory in"),
        (
            {"out/m.py": b"x"},
            lambda s: (s / "out").symlink_to(s.parent / "elsewhere"),
            "is a symbolic link in",
        ),
    ],
)
def test_paths_the_workspace_cannot_take_are_refused(
    tmp_path: Path, files: dict[str, bytes], make: Any, why: str
) -> None:
    space = tmp_path / "space"
    space.mkdir()
    (tmp_path / "elsewhere").mkdir()
    make(space)
    with pytest.raises(WorkspaceError, match=why) as caught:
        fill(str(code_dir(tmp_path, files)), str(space))
    assert "--fresh-cwd" in str(caught.value)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_staging_fills_the_workspace_and_a_refusal_fails_the_stage(tmp_path: Path) -> None:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        for name, body in (("train.py", b"print(2)\n"), ("pkg/m.py", b"W = 2\n")):
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    payload = data.getvalue()
    space = tmp_path / "work" / "proj-abc"
    space.mkdir(parents=True)
    (space / "ckpt.pt").write_bytes(b"kept")

    def stage(run: str) -> dict[str, Any]:
        args = {
            "rundir": str(tmp_path / "runs" / run / "n0"),
            "spec": {"run_id": run, "node_rank": 0, "cwd": str(space)},
            "env": {},
            "payload": {
                "kind": "tar",
                "name": "",
                "size": len(payload),
                "sha256": hashlib.sha256(payload).hexdigest(),
            },
            "rank": "# rank shim\n",
            "agent": "# agent shim\n",
            "site": "# sitecustomize\n",
            "wire": "# the standby wire's module\n",
            "remote_script": None,
            "workspace": str(space),
        }
        answer: dict[str, Any] = host_boot.stage(args, io.BytesIO(payload))
        return answer

    assert stage("r1")["ok"]
    assert tree(space) == {"ckpt.pt": b"kept", "pkg/m.py": b"W = 2\n", "train.py": b"print(2)\n"}
    (space / "pkg" / "m.py").unlink()
    (space / "pkg").rmdir()
    (space / "pkg").write_bytes(b"now a file")
    answer = stage("r2")
    assert not answer["ok"] and "is a file in the workspace" in answer["error"], answer
    assert not (tmp_path / "runs" / "r2").exists()  # a failed stage leaves no run directory


def test_shipped_links_are_made_again_in_the_workspace_and_never_lead_out(
    tmp_path: Path,
) -> None:
    code = code_dir(tmp_path, {"real_helper.py": b"X = 1\n", "pkg/m.py": b"W = 1\n"})
    (code / "helper.py").symlink_to("real_helper.py")
    (code / "alias").symlink_to("pkg")
    space = tmp_path / "space"
    space.mkdir()
    (space / "helper.py").write_bytes(b"an older run's copy")
    fill(str(code), str(space))
    assert str((space / "helper.py").readlink()) == "real_helper.py"
    assert (space / "helper.py").read_bytes() == b"X = 1\n"
    assert str((space / "alias").readlink()) == "pkg" and (space / "alias" / "m.py").exists()
    (code / "out").symlink_to("../../outside")
    with pytest.raises(WorkspaceError, match="would lead out of"):
        fill(str(code), str(space))
    assert not (space / "out").is_symlink()
    assert not list(space.glob("out.sshddp-*"))
