"""Which files of a --workdir travel (run/workfiles.py): links that stay inside go as links,
links that leave are refused by name, ignored files are counted with their rule and sent
with --include; and the report explains a rank missing one of them (model/leftout.py)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from sshddp.errors import ExitCode, UsageError
from sshddp.model.inventory import parse_inventory
from sshddp.model.leftout import LeftOut, missing_hints, summary, unshared_files
from sshddp.model.plan import CodeSpec, LaunchOptions
from sshddp.model.report import run_report
from sshddp.model.state import NodeResult, NodeState, RunResult
from sshddp.run import workfiles
from sshddp.run.payload import build_payload, code_spec
from sshddp.run.workfiles import select, shipped_files


def project(root: Path) -> Path:
    files = {
        "train.py": b"import helper\n",
        "real_helper.py": b"X = 1\n",
        "pkg/__init__.py": b"",
        "data/train.bin": b"t" * 5000,
        "data/val.bin": b"v" * 300,
        "data/README": b"how to make the data\n",
        "__pycache__/train.cpython-311.pyc": b"bytecode",
        ".venv/lib/site.py": b"an environment",
        ".gitignore": b"data/*.bin\n__pycache__/\n.venv/\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "helper.py").symlink_to("real_helper.py")
    (root / "absolute.py").symlink_to(root / "real_helper.py")
    (root / "alias").symlink_to("pkg")
    return root


def test_links_that_stay_inside_travel_as_links_with_relative_targets(tmp_path: Path) -> None:
    root = project(tmp_path / "proj")
    chosen = select(root)
    assert dict(chosen.links) == {
        "absolute.py": "real_helper.py",
        "alias": "pkg",
        "helper.py": "real_helper.py",
    }
    assert "helper.py" in shipped_files(root)
    code = code_spec(LaunchOptions(script=str(root / "train.py"), workdir=str(root)))
    payload = build_payload(code)
    with tarfile.open(fileobj=io.BytesIO(payload.read_all()), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["helper.py"].issym() and members["helper.py"].linkname == "real_helper.py"
    assert members["alias"].issym() and "alias/__init__.py" not in members
    names = list(members)
    assert names.index("helper.py") > names.index("real_helper.py")  # links come last


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside.py"])
def test_a_link_that_leaves_the_workdir_is_refused_by_name(tmp_path: Path, target: str) -> None:
    root = project(tmp_path / "proj")
    (root / "pkg" / "leak.py").symlink_to(target if target.startswith("/") else "../" + target)
    with pytest.raises(UsageError) as caught:
        select(root)
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    assert "pkg/leak.py -> " in str(caught.value) and "nothing was started" in str(caught.value)
    (root / ".gitignore").write_text("data/*.bin\npkg/leak.py\n")  # ignored: left out, fine
    assert "pkg/leak.py" not in shipped_files(root)


def test_the_left_out_files_are_counted_with_their_rule_beyond_caches(tmp_path: Path) -> None:
    root = project(tmp_path / "proj")
    chosen = select(root, count=True)
    assert chosen.left == (
        LeftOut("data/train.bin", 5000, ".gitignore line 1: data/*.bin"),
        LeftOut("data/val.bin", 300, ".gitignore line 1: data/*.bin"),
    )
    line = summary(chosen.left, chosen.more)
    assert line.startswith("sshddp: --workdir: ignore rules left out 2 files, 5.3 kB: ")
    assert "data/train.bin (5.0 kB, .gitignore line 1: data/*.bin), data/val.bin" in line
    assert "--include PATTERN" in line
    assert summary(()) == ""
    assert build_payload(CodeSpec("tar", "train.py", str(root), str(root))).left == chosen.left


def test_the_count_of_a_huge_ignored_tree_stops_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = project(tmp_path / "proj")
    (root / ".gitignore").write_text("big/\n")
    for d in range(3):
        (root / "big" / f"d{d}").mkdir(parents=True)
        for i in range(4):
            (root / "big" / f"d{d}" / f"{i}.bin").write_bytes(b"x")
    monkeypatch.setattr(workfiles, "COUNT_CAP", 5)
    chosen = select(root, count=True)
    assert len(chosen.left) == 5 and chosen.more
    assert "ignore rules left out 5+ files" in summary(chosen.left, chosen.more)
    assert len(select(root, ("big/d2/*",)).files) == len(select(root).files) + 4


def test_include_sends_ignored_files(tmp_path: Path) -> None:
    root = project(tmp_path / "proj")
    assert "data/train.bin" not in shipped_files(root)
    chosen = select(root, ("data/*.bin",), count=True)
    assert {"data/train.bin", "data/val.bin", "data/README"} <= set(chosen.files)
    assert chosen.left == ()
    options = LaunchOptions(script="train.py", workdir=str(root), include=("data/*.bin",))
    code = code_spec(options)
    assert code.include == ("data/*.bin",)
    with tarfile.open(fileobj=io.BytesIO(build_payload(code).read_all()), mode="r:") as tar:
        assert "data/train.bin" in tar.getnames()


def test_the_inventory_names_patterns_to_include() -> None:
    text = "defaults:\n  include: ['data/*.bin', 'ckpt/']\nhosts: [a, b]\n"
    assert parse_inventory(text).include == ("data/*.bin", "ckpt/")
    from sshddp.errors import InventoryError

    with pytest.raises(InventoryError, match="include"):
        parse_inventory("defaults:\n  include: data\nhosts: [a]\n")


LEFT = (LeftOut("data/train.bin", 5000, ".gitignore line 1: data/*.bin"),)


def test_a_rank_missing_a_left_out_file_is_told_the_rule_and_the_fix() -> None:
    tail = [
        "[rank0]: Traceback (most recent call last):",
        "[rank0]: FileNotFoundError: [Errno 2] No such file or directory: "
        "'/home/u/.sshddp/work/proj-1/data/train.bin'",
    ]
    (hint,) = missing_hints(tail, LEFT)
    assert "/home/u/.sshddp/work/proj-1/data/train.bin (data/train.bin) was not sent" in hint
    assert ".gitignore line 1: data/*.bin" in hint and "--include 'data/train.bin'" in hint
    node = NodeResult(0, "h1", NodeState.FAILED, 1)
    report = run_report(RunResult("r1", [node], root_cause=0, left_out=LEFT), tail)
    assert report.splitlines()[-1] == f"hint: {hint}"
    assert "hint:" not in run_report(RunResult("r1", [node], root_cause=0), tail)
    assert missing_hints(["FileNotFoundError: ... 'other.bin'"], LEFT) == []


def test_a_missing_module_left_out_is_explained() -> None:
    left = (LeftOut("helper.py", 6, ".gitignore line 2: helper.py"),)
    said = missing_hints(["ModuleNotFoundError: No module named 'helper'"], left)
    assert said and "helper (helper.py) was not sent" in said[0]
    pkg = (LeftOut("lib/util/__init__.py", 0, ".gitignore line 1: lib/"),)
    assert missing_hints(["ModuleNotFoundError: No module named 'lib.util.io'"], pkg)


def test_a_failure_after_the_share_warning_points_back_at_it() -> None:
    left = unshared_files([("snapshot.pt", 2000, [1])], ["h1", "h2"])
    tail = ["FileNotFoundError: [Errno 2] No such file or directory: 'snapshot.pt'"]
    (hint,) = missing_hints(tail, left)
    assert "node 1 (h2) lacked when the run started, as the launch warned" in hint
    assert "--share snapshot.pt" in hint
