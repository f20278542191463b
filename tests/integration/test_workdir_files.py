"""Files of the ranks' working directory that would silently not travel: a --workdir's
symbolic links (shipped as links when they stay inside, refused by name when they leave),
its ignored data (named at launch, explained when a rank misses it, sent with --include),
and node 0's files that another node lacks (the report points back at the launch's
warning)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import write_inventory

from cli_helpers import Result, assert_clean_failure, sshddp
from sshddp_lab.sshd import SshdCluster

#: every rank imports ``helper`` (a link to real_helper.py), reads the ignored data, and
#: all-reduces what it found with the others (gloo), so the ranks really couple
TRAIN = """\
import json
import torch
import torch.distributed as dist
import helper
with open("data/train.bin", "rb") as fh:
    size = len(fh.read())
dist.init_process_group("gloo")
total = torch.tensor([float(helper.X + size)])
dist.all_reduce(total)
print(json.dumps({"rank": dist.get_rank(), "total": total.item()}), flush=True)
dist.destroy_process_group()
"""


def workdir_with_link_and_data(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text(TRAIN)
    (root / "real_helper.py").write_text("X = 1\n")
    (root / "helper.py").symlink_to("real_helper.py")
    (root / "data" / "train.bin").write_bytes(b"\0" * 2000)
    (root / ".gitignore").write_text("__pycache__/\ndata/*.bin\n")
    return root


def launch(cluster: SshdCluster, inv: Path, code: Path, logs: Path, *opts: str) -> Result:
    args = ["launch", "--ssh-config", str(cluster.ssh_config), "--log-dir", str(logs), *opts]
    return sshddp([*args, "--workdir", str(code), str(inv), "train.py"])


def run_id(result: Result) -> str:
    return result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]


def test_a_linked_module_travels_and_ignored_data_is_named_explained_and_included(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    code = workdir_with_link_and_data(tmp_path / "proj")
    logs = tmp_path / "logs"

    # Without --include: the launch names what .gitignore left out; every rank imports the
    # linked helper, then misses the data; the report names the rule that dropped it.
    failed = launch(ssh_env, inv, code, logs)
    assert failed.code == 1, failed.explain()
    said = "sshddp: --workdir: ignore rules left out 1 file, 2.0 kB: data/train.bin (2.0 kB, "
    assert said + ".gitignore line 2: data/*.bin)" in failed.err, failed.err
    assert "ModuleNotFoundError" not in failed.err, failed.err
    assert "FileNotFoundError" in failed.err, failed.err
    hint = [line for line in failed.err.splitlines() if "was not sent to the hosts" in line]
    assert hint and "the ignore rule .gitignore line 2: data/*.bin" in hint[0], failed.err
    assert "--include 'data/train.bin'" in hint[0]
    run_no_leak(run_id(failed))

    # With it, the data travels too and the coupled ranks agree on what they all read.
    done = launch(ssh_env, inv, code, logs, "--include", "data/*.bin")
    assert done.code == 0, done.explain()
    assert "ignore rules left out" not in done.err
    lines = []
    for log in sorted((logs / run_id(done)).glob("node*.log")):
        lines += [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]
    assert sorted((line["rank"], line["total"]) for line in lines) == [(0, 4002.0), (1, 4002.0)]
    run_no_leak(run_id(done))


def test_links_leaving_the_workdir_are_refused_by_name_before_anything_starts(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int]
) -> None:
    inv, remote = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    code = workdir_with_link_and_data(tmp_path / "proj")
    (tmp_path / "outside.py").write_text("SECRET = 1\n")
    (code / "passwd").symlink_to("/etc/passwd")
    (code / "outside.py").symlink_to("../outside.py")
    result = launch(ssh_env, inv, code, tmp_path / "logs")
    assert_clean_failure(result, 2)
    assert "symbolic links lead out of it: outside.py -> ../outside.py, passwd -> /etc/passwd" in (
        result.err
    ), result.err
    assert "sshddp: run " not in result.err  # no run was named, none recorded
    assert not remote.exists()  # no host was even reached
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


NEEDS_SNAPSHOT = """\
import os
import sys
if sys.argv[1:] == ["save"]:
    if os.environ["NODE_RANK"] == "0":
        with open("snapshot.pt", "w") as fh:
            fh.write("weights")
else:
    open("snapshot.pt").close()
"""


def test_a_failure_after_the_share_warning_points_back_at_it(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    doc: dict[str, Any] = {
        "defaults": {"python": sys.executable},
        "rendezvous": {"port": free_port()},
        "hosts": [
            {"host": ssh_env.host(i).alias, "nproc": 1, "workdir": str(tmp_path / f"host{i}")}
            for i in (1, 2)
        ],
    }
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    script = tmp_path / "code" / "needs.py"
    script.parent.mkdir()
    script.write_text(NEEDS_SNAPSHOT)
    base = ["launch", "--launcher", "node", "--log-dir", str(tmp_path / "logs"), str(inv)]
    saved = sshddp([*base, str(script), "save"])
    assert saved.code == 0, saved.explain()
    run_no_leak(run_id(saved))
    failed = sshddp([*base, str(script)])
    assert failed.code == 1, failed.explain()
    assert "sshddp: warning: node 0 (h1) has files" in failed.err, failed.err
    assert "root cause: node 1 on h2" in failed.err, failed.err
    hint = [line for line in failed.err.splitlines() if line.startswith("hint: snapshot.pt")]
    assert hint, failed.err
    assert "node 1 (h2) lacked when the run started, as the launch warned" in hint[0]
    assert "--share snapshot.pt" in hint[0]
    run_no_leak(run_id(failed))
