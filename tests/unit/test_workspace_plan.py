"""Where the ranks run (pure): the workspace a local directory keeps on each host, run after
run, or a fresh directory per run with ``--fresh-cwd``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sshddp.errors import UsageError
from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import (
    CodeSpec,
    LaunchOptions,
    LaunchPlan,
    describe,
    make_plan,
    workspace_dir,
)
from sshddp.run.payload import code_spec
from sshddp.run.registry import RunRecord, record_json, record_of

INVENTORY = """\
hosts:
  - {host: a, nproc: 1, workdir: /scratch/sshddp}
  - {host: b, nproc: 1}
"""


def plan(code: CodeSpec, run_id: str = "r1", fresh_cwd: bool = False) -> LaunchPlan:
    inv = parse_inventory(INVENTORY, source="inv.yaml")
    opts = LaunchOptions(script=code.target, fresh_cwd=fresh_cwd)
    return make_plan(inv, opts, run_id, code, lambda h: "10.0.0.1")


def test_a_local_script_runs_in_its_directory_s_workspace_on_every_run(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("")
    (tmp_path / "proj" / "eval.py").write_text("")
    code = code_spec(LaunchOptions(script=str(tmp_path / "proj" / "train.py")))
    first, second = plan(code, "r1"), plan(code, "r2")
    spaces = [n.cwd for n in first.nodes]
    assert spaces[0].startswith("/scratch/sshddp/work/proj-")
    assert spaces[1].startswith("~/.sshddp/work/proj-")
    assert spaces[0].rsplit("/", 1)[1] == spaces[1].rsplit("/", 1)[1]
    assert [n.cwd for n in second.nodes] == spaces  # the next run finds it again
    assert [n.workspace for n in first.nodes] == spaces
    assert "/runs/" not in spaces[0]  # where retention never looks
    # another script of the same directory shares it, as under torchrun in that directory
    other = code_spec(LaunchOptions(script=str(tmp_path / "proj" / "eval.py")))
    assert [n.cwd for n in plan(other).nodes] == spaces
    # so does --workdir of that directory
    tar = code_spec(LaunchOptions(script="train.py", workdir=str(tmp_path / "proj")))
    assert [n.cwd for n in plan(tar).nodes] == spaces
    assert f"  cwd:     {spaces[0]}" in describe(first).splitlines()


def test_different_directories_get_different_workspaces() -> None:
    one = workspace_dir("/w", CodeSpec("file", "t.py", "t.py", "/home/me/a/proj"))
    two = workspace_dir("/w", CodeSpec("file", "t.py", "t.py", "/home/me/b/proj"))
    assert one and two and one != two
    assert one.startswith("/w/work/proj-") and two.startswith("/w/work/proj-")


@pytest.mark.parametrize(
    ("home", "prefix"),
    [("/", "root-"), ("/home/me/my proj", "my_proj-"), ("/x/.hidden", "hidden-"), ("/x/ü", "_-")],
)
def test_workspace_names_are_plain(home: str, prefix: str) -> None:
    space = workspace_dir("~/.sshddp/", CodeSpec("tar", "t.py", home, home))
    assert space is not None
    name = space.rsplit("/", 1)[1]
    assert space == f"~/.sshddp/work/{name}" and name.startswith(prefix)
    assert len(name) == len(prefix) + 10


def test_fresh_cwd_is_the_run_s_own_directory(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    code = code_spec(LaunchOptions(script=str(tmp_path / "t.py")))
    fresh = plan(code, fresh_cwd=True)
    assert [n.cwd for n in fresh.nodes] == [f"{n.rundir}/code" for n in fresh.nodes]
    assert [n.workspace for n in fresh.nodes] == [None, None]


def test_code_on_the_hosts_runs_in_the_home_directory() -> None:
    remote = plan(CodeSpec("remote", "proj/train.py"))
    assert [(n.cwd, n.workspace) for n in remote.nodes] == [("~", None), ("~", None)]
    with pytest.raises(UsageError, match="--fresh-cwd: only for code sshddp ships"):
        plan(CodeSpec("remote", "proj/train.py"), fresh_cwd=True)


def test_the_registry_keeps_each_node_s_cwd_for_fetch(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("")
    p = plan(code_spec(LaunchOptions(script=str(tmp_path / "t.py"))))
    record = RunRecord.of(p, "inv.yaml", None)
    again = record_of(record_json(record))
    assert [n.cwd for n in again.layout().nodes] == [n.cwd for n in p.nodes]
    old = record_json(record)
    for node in old["nodes"]:
        del node["cwd"]  # a record written before there was one
    assert [n.cwd for n in record_of(old).nodes] == ["", ""]
