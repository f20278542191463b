"""A rank that dies of a hardware error sends its node to a spare mid-run, and a spare's
health is checked when it is needed, for real: real sshd hosts, real torchrun, gloo
all-reducing every step (``payloads/ckpt_train.py``), each host its own workdir and the
checkpoint ``--share``d (as in test_spares_midrun.py).

Rank 2 (node 2, h3) prints CUDA's uncorrectable ECC error and exits 1 in attempt 1: node 0
seats the spare in node 2's rank, h3's supervisor ends (nothing of the run left there), the
run resumes from node 0's checkpoint and h3 is quarantined with the ECC line. A rank that
raises its own ValueError restarts on the same hosts and quarantines nobody. A spare whose
``health:`` command fails when it is needed (its flag file made after the launch) is skipped
and named; with no other spare, the run ends saying why. No process of a run survives on
any host.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import yaml
from launch_helpers import finish, sshddp, start, wait_until
from test_faults_infra import contains, remote_log

from sshddp_lab.sshd import SshdCluster

TRAIN = Path(__file__).parent / "payloads" / "ckpt_train.py"
STEPS = "60"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
OPTS = ["--max-restarts", "2", "--heartbeat-timeout", "5", "--grace", "2"]


def workdir(tmp: Path, slot: int) -> Path:
    """Mesh slot ``slot``'s workdir: host h(slot + 1)'s own."""
    return tmp / f"remote-h{slot + 1}"


def _inventory(tmp: Path, port: int, spares: int, sick_flag: Path | None = None) -> Path:
    """3 hosts and ``spares`` spares (h4, h5); with ``sick_flag``, h4's ``health:`` fails
    once that file exists."""
    spare_hosts: list[dict[str, Any]] = []
    for slot in range(3, 3 + spares):
        entry: dict[str, Any] = {"host": f"h{slot + 1}", "workdir": str(workdir(tmp, slot))}
        if slot == 3 and sick_flag is not None:
            entry["health"] = f"test ! -e {sick_flag}"
        spare_hosts.append(entry)
    doc = {
        "defaults": {
            "python": sys.executable,
            "nproc": 1,
            "env": {"GLOO_SOCKET_IFNAME": "lo"},
            "share": ["ckpt.json"],
        },
        "rendezvous": {"port": port},
        "hosts": [{"host": f"h{i}", "workdir": str(workdir(tmp, i - 1))} for i in (1, 2, 3)],
        "spares": spare_hosts,
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def _fault_past_step_7(tmp: Path, run: str, before: Callable[[], None] = lambda: None) -> None:
    """Once every rank is past its first checkpoints: ``before``, then rank 2 may fail."""
    wait_until(
        lambda: all(
            contains(remote_log(workdir(tmp, n), run, n), f"rank {n} step 7\n") for n in range(3)
        ),
        180,
        "every rank past its first checkpoints",
    )
    before()
    (tmp / "fault.now").write_text("")


def _exit(tmp: Path, run: str, slot: int) -> dict[str, Any]:
    path = workdir(tmp, slot) / "runs" / run / f"n{slot}" / "exit.json"
    return dict(json.loads(path.read_text())) if path.exists() else {}


def _launch(cluster: SshdCluster, tmp: Path, run: str, inv: Path, fault: str, **kw: Any) -> Any:
    proc = start(
        cluster,
        tmp,
        "launch",
        "--name",
        run,
        *OPTS,
        str(inv),
        str(TRAIN),
        STEPS,
        fault,
        "2",
        str(tmp / "fault.now"),
    )
    try:
        _fault_past_step_7(tmp, run, **kw)
        return finish(proc, 300)
    finally:
        if proc.poll() is None:
            proc.kill()


def _quarantined(cluster: SshdCluster, tmp: Path) -> dict[str, dict[str, Any]]:
    listed = sshddp(cluster, tmp, "quarantine", "--json")
    return {e["host"]: e for e in json.loads(listed.stdout)["hosts"]}


def _resumed(tmp: Path, run: str, slot: int) -> int:
    log = remote_log(workdir(tmp, slot), run, slot).read_text()
    lines = log.splitlines()
    (begin,) = [ln for ln in lines if ln.startswith("attempt 2 ") and " starts at step " in ln]
    return int(begin.rsplit(" ", 1)[1])


def test_a_rank_that_dies_of_an_ecc_error_sends_its_node_to_a_spare(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    cluster = make_cluster(4)
    inv = _inventory(tmp_path, free_port(), spares=1)
    rc, err = _launch(cluster, tmp_path, "hw", inv, "ecc")
    assert rc == 0 and "Traceback" not in err, err
    report = err[err.index("sshddp: run hw succeeded") :]
    said = "attempt 1 ended: node 2 (h3): rank 2 died of a hardware error (uncorrectable ECC error)"
    assert said in report, report
    assert f"`{ECC}`" in report and "; h4 took its place" in report, report
    ends = {slot: _exit(tmp_path, "hw", slot) for slot in range(4)}
    assert all(ends[s]["state"] == "succeeded" for s in (0, 1, 3)), ends
    assert ends[3]["node_rank"] == 2 and ends[3]["attempt"] == 2, ends[3]
    assert ends[2]["state"] == "stopped", ends[2]  # h3's supervisor ended cleanly, replaced
    assert ends[2]["reason"].startswith("replaced mid-run: node 2 (h3): rank 2 died of a hardware")
    assert _resumed(tmp_path, "hw", 3) >= 6  # node 0's checkpoint, not step 0
    assert _resumed(tmp_path, "hw", 1) == _resumed(tmp_path, "hw", 3)
    lines = [line for line in err.splitlines() if line.startswith("sshddp: quarantined")]
    assert len(lines) == 1 and lines[0].startswith("sshddp: quarantined h3 until "), err
    entry = _quarantined(cluster, tmp_path)["h3"]
    assert entry["reason"] == "uncorrectable ECC error" and ECC in entry["evidence"], entry
    run_no_leak("hw")


def test_a_rank_that_raises_restarts_on_the_same_hosts_and_quarantines_nobody(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    cluster = make_cluster(4)
    inv = _inventory(tmp_path, free_port(), spares=1)
    rc, err = _launch(cluster, tmp_path, "hwraise", inv, "raise")
    assert rc == 0 and "Traceback" not in err.split("sshddp: run hwraise")[-1], err
    report = err[err.index("sshddp: run hwraise succeeded") :]
    assert "attempt 1 ended: node 2 (h3) failed: rank 2 exited with code 1; every node" in report
    assert "took its place" not in report and "quarantined" not in err, err
    ends = {slot: _exit(tmp_path, "hwraise", slot) for slot in range(4)}
    assert all(ends[s]["state"] == "succeeded" and ends[s]["attempt"] == 2 for s in range(3))
    assert ends[3]["reason"].startswith("a spare: the run ended without needing it"), ends[3]
    assert _quarantined(cluster, tmp_path) == {}
    run_no_leak("hwraise")


def test_a_spare_unhealthy_when_needed_is_skipped_and_named(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Two spares; h4's ``health:`` fails once its flag exists (made after the launch's own
    look at it): h4 is skipped and named, h5 takes node 2's place, h4 is quarantined."""
    cluster = make_cluster(5)
    flag = tmp_path / "h4-sick"
    inv = _inventory(tmp_path, free_port(), spares=2, sick_flag=flag)
    rc, err = _launch(cluster, tmp_path, "hwsick", inv, "ecc", before=flag.touch)
    assert rc == 0 and "Traceback" not in err, err
    report = err[err.index("sshddp: run hwsick succeeded") :]
    skipped = f"h5 took its place (spare h4 skipped: failed its health check: `test ! -e {flag}`"
    assert skipped in report, report
    ends = {slot: _exit(tmp_path, "hwsick", slot) for slot in range(5)}
    assert ends[4]["node_rank"] == 2 and ends[4]["state"] == "succeeded", ends[4]
    assert ends[3]["reason"].startswith("a spare that failed its health check when needed: ")
    assert _resumed(tmp_path, "hwsick", 4) >= 6
    quarantined = _quarantined(cluster, tmp_path)
    assert set(quarantined) == {"h3", "h4"}, quarantined
    assert quarantined["h4"]["reason"] == "failed its health check", quarantined
    run_no_leak("hwsick")


def test_a_single_spare_unhealthy_when_needed_ends_the_run_saying_why(
    make_cluster: Callable[..., SshdCluster],
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    cluster = make_cluster(4)
    flag = tmp_path / "h4-sick"
    inv = _inventory(tmp_path, free_port(), spares=1, sick_flag=flag)
    rc, err = _launch(cluster, tmp_path, "hwnone", inv, "ecc", before=flag.touch)
    assert rc == 1 and "Traceback" not in err, err
    why = (
        "not restarted: node(s) 2 died of a hardware error and no spare can take its place "
        f"(spare h4 failed its health check: `test ! -e {flag}` exited 1"
    )
    assert why in err, err
    assert "h4" in _quarantined(cluster, tmp_path)
    run_no_leak("hwnone")
