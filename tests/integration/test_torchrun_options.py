"""torchrun's own options through ``--torchrun-arg``, and ``--local-rank-arg`` for scripts
written for ``torch.distributed.launch``, on real hosts with real torchrun."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path
from typing import Callable

import yaml
from launch_helpers import SSHDDP, Run, cli_env, launch, run_id_of, write_inventory

from cli_helpers import sshddp
from sshddp_lab.sshd import SshdCluster

LEGACY = Path(__file__).parent / "payloads" / "legacy_launch.py"


def test_local_ranks_filter_shows_only_local_rank_zero(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(
        ssh_env,
        tmp_path,
        free_port(),
        ["ok"],
        opts=["--torchrun-arg=--local-ranks-filter=0"],
        hosts=[1, 2],
    )
    assert run.rc == 0, run.stderr
    for node in range(2):
        summaries = [j for j in run.json_lines(node) if "sum" in j]
        assert [(j["rank"], j["local_rank"]) for j in summaries] == [(2 * node, 0)]
        assert f"rank {2 * node + 1} line" not in run.local_log(node).read_text()
    run_no_leak(run.run_id)


def test_local_rank_arg_feeds_a_torch_distributed_launch_script(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch_legacy(ssh_env, tmp_path, free_port(), "--local-rank-arg")
    assert run.rc == 0, run.stderr
    for node in range(2):
        lines = sorted(run.json_lines(node), key=lambda j: j["rank"])
        assert [j["local_rank"] for j in lines] == [j["LOCAL_RANK"] for j in lines] == [0, 1]
        assert {tuple(j["rest"]) for j in lines} == {("$x", "${local_rank}")}  # still verbatim
    run_no_leak(run.run_id)
    without = launch_legacy(ssh_env, tmp_path / "without", free_port())
    assert without.rc == 1 and "the following arguments are required: --local_rank" in (
        without.stderr
    ), without.stderr
    assert "\nhint: the script wants --local_rank" in without.stderr, without.stderr
    assert "launch with --local-rank-arg" in without.stderr, without.stderr


def launch_legacy(
    cluster: SshdCluster, tmp: Path, port: int, *opts: str, own_disks: bool = False
) -> Run:
    """legacy_launch.py on h1 and h2, 2 processes each; ``own_disks``: each host keeps its
    files in its own workdir, as separate machines do (the lab's hosts share this disk)."""
    tmp.mkdir(exist_ok=True)
    inv, workdir = write_inventory(cluster, tmp, port, [1, 2], nproc=2)
    if own_disks:
        doc = yaml.safe_load(inv.read_text())
        for i, host in enumerate(doc["hosts"]):
            host["workdir"] = str(workdir / f"h{i + 1}")
        inv.write_text(yaml.safe_dump(doc))
    proc = subprocess.run(
        [*SSHDDP, "launch", *opts, str(inv), str(LEGACY), "$x", "${local_rank}"],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=180,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, run_id_of(proc.stderr), tmp, workdir)


def test_tee_and_log_dir_keep_torchrun_s_own_logs_in_the_workspace(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    opts = ("--torchrun-arg=--tee=3", "--torchrun-arg=--log-dir=torchrun-logs", "--local-rank-arg")
    run = launch_legacy(ssh_env, tmp_path, free_port(), *opts, own_disks=True)
    assert run.rc == 0, run.stderr
    assert "[default0]:{" in run.local_log(0).read_text()  # torchrun's tee, through the node log
    fetched = sshddp(["fetch", run.run_id, "torchrun-logs", tmp_path / "got"])
    assert fetched.code == 0, fetched.explain()
    for node in range(2):
        logs = sorted((tmp_path / "got" / f"node{node}-h{node + 1}").rglob("stdout.log"))
        ranks = sorted(json.loads(p.read_text())["rank"] for p in logs)
        assert ranks == [2 * node, 2 * node + 1]
    run_no_leak(run.run_id)


def test_the_c10d_rendezvous_backend_passes_through(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(
        ssh_env,
        tmp_path,
        free_port(),
        ["ok"],
        opts=["--torchrun-arg=--rdzv-backend=c10d"],
        hosts=[1, 2],
        nproc=1,
    )
    assert run.rc == 0, run.stderr
    summaries = [j for n in range(2) for j in run.json_lines(n) if "sum" in j]
    assert sorted(j["rank"] for j in summaries) == [0, 1]
    assert {j["sum"] for j in summaries} == {1.0}
    run_no_leak(run.run_id)


def test_torchruns_own_error_is_the_reports_tail_when_no_rank_wrote(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A bad torchrun option, and a rendezvous port taken under --no-check: no rank ran, so
    the report's tail is torchrun's own error, not only its exit code."""
    opts = ["--torchrun-arg=--monitor-interval=abc"]
    bad = launch(ssh_env, tmp_path, free_port(), ["ok"], opts=opts, hosts=[1])
    assert bad.rc == 1, bad.stderr
    assert "invalid float value: 'abc'" in bad.stderr.split("root cause:")[1], bad.stderr
    run_no_leak(bad.run_id)
    port = free_port()
    (tmp_path / "busy").mkdir()
    with socket.socket() as taken:
        taken.bind(("", port))
        taken.listen()
        busy = launch(ssh_env, tmp_path / "busy", port, ["ok"], opts=["--no-check"], hosts=[1])
    assert busy.rc == 1, busy.stderr
    assert "EADDRINUSE" in busy.stderr.split("root cause:")[1], busy.stderr
    run_no_leak(busy.run_id)
