"""The ``--workdir`` archive leaves the laptop once: one host gets it from sshddp, the others
from each other (issue 47). Counted by a ProxyCommand between sshddp and every sshd, as a
user's bastion would sit there; each host has a workdir of its own (no shared disk)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from cli_helpers import Result, sshddp
from handoff_faults import killing_server
from sshddp_lab.countproxy import total_up
from sshddp_lab.sshd import SshdCluster

HASHWORK = Path(__file__).parent / "payloads" / "hashwork.py"
MB = 1 << 20
HOSTS = (1, 2, 3, 4)


def counted_config(cluster: SshdCluster, counts: Path) -> Path:
    """The cluster's ssh_config with every host behind the counting ProxyCommand."""
    proxy = f"    ProxyCommand {sys.executable} -m sshddp_lab.countproxy {counts} %h %p\n"
    blocks = cluster.ssh_config.read_text().split("\n\n")
    config = counts.parent / "ssh_config.counted"
    config.write_text("\n".join(b.rstrip("\n") + "\n" + proxy for b in blocks if b.strip()))
    return config


def project(tmp: Path, mb: int) -> Path:
    """A workdir of ``mb`` MB of incompressible data and the job that hashes it."""
    root = tmp / "project"
    (root / "data").mkdir(parents=True)
    (root / "hashwork.py").write_bytes(HASHWORK.read_bytes())
    for i in range(mb // 8):
        (root / "data" / f"part{i}.bin").write_bytes(os.urandom(8 * MB))
    return root


def inventory(cluster: SshdCluster, tmp: Path, port: int) -> Path:
    doc: dict[str, Any] = {
        "defaults": {"python": sys.executable},
        "rendezvous": {"port": port},
        "hosts": [
            {"host": cluster.host(i).alias, "nproc": 1, "workdir": str(tmp / f"host{i}")}
            for i in HOSTS
        ],
    }
    inv = tmp / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


class Lab:
    """Launches of one project on the four hosts, each counted on its own."""

    def __init__(self, cluster: SshdCluster, tmp: Path, port: int, mb: int) -> None:
        self.tmp = tmp
        self.root = project(tmp, mb)
        self.inv = inventory(cluster, tmp, port)
        # One counting proxy per connection, kept across launches (sshddp's connections may
        # outlive a command): a launch's bytes are the growth of their sum.
        self.counts = tmp / "counts"
        self.config = counted_config(cluster, self.counts)
        self.launches = itertools.count(1)

    def launch(self) -> tuple[Result, str, int]:
        """One launch: its result (its stderr followed by its trace), run id and the bytes
        that went towards the hosts. The trace goes to a file of its own (SSHDDP_LOG): ``-v``
        writes to the stream the first tracing command of this process installed, which in
        a worker that ran other in-process commands first need not be this one's stderr."""
        before = total_up(str(self.counts)) if self.counts.exists() else 0
        opts = ["--ssh-config", self.config, "--launcher", "node", "--no-check"]
        opts += ["--log-dir", self.tmp / "logs", "--workdir", self.root]
        log = self.tmp / f"trace-{next(self.launches)}.log"
        environ = {**os.environ, "SSHDDP_LOG": str(log)}
        result = sshddp(["launch", *opts, self.inv, self.root / "hashwork.py"], environ)
        assert "sshddp: run " in result.err and self.counts.exists(), result.explain()
        run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
        result = replace(result, err=result.err + log.read_text())
        return result, run_id, total_up(str(self.counts)) - before

    def lines(self, run_id: str) -> list[dict[str, Any]]:
        found = []
        for log in sorted((self.tmp / "logs" / run_id).glob("node*.log")):
            found += [json.loads(ln) for ln in log.read_text().splitlines() if ln[:1] == "{"]
        return found

    def expected(self) -> dict[str, str]:
        import hashlib

        data = self.root / "data"
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data.iterdir()}


def size_of(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@pytest.mark.timeout(300)
def test_a_40_mb_workdir_leaves_the_laptop_once_and_a_second_launch_sends_none_of_it(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    lab = Lab(ssh_env, tmp_path, free_port(), 40)
    size = size_of(lab.root)
    first, run_id, sent = lab.launch()
    assert first.code == 0, first.explain()
    assert sent <= 1.15 * size, (sent / size, first.err[-3000:])
    lines = lab.lines(run_id)
    assert len(lines) == 4 and all(line["data"] == lab.expected() for line in lines), lines
    assert "handoff: node 0 (h1) got it from this machine" in first.err, first.err[-3000:]
    assert "handoff: node 3 (h4) got it from node 0 (h1)" in first.err
    run_no_leak(run_id)
    ps = sshddp(["ps", "--all", "--json", run_id])
    (row,) = json.loads(ps.out)["runs"]
    delivery = row["code_delivery"]
    assert delivery["from_laptop"] == delivery["size"] and delivery["kept"] == [], delivery
    assert delivery["got"] == {
        "h1": "this machine",
        **{f"h{i}": "node 0 (h1)" for i in (2, 3, 4)},
    }

    # The same code again: every host keeps it, nothing of it is sent.
    second, run_id, sent = lab.launch()
    assert second.code == 0, second.explain()
    assert sent < size / 20, (sent, second.err[-3000:])
    assert "kept it from an earlier launch" in second.err and "got it from" not in second.err
    assert all(line["data"] == lab.expected() for line in lab.lines(run_id))
    run_no_leak(run_id)

    # A tampered kept copy (same size, one byte changed) is refused, named, and replaced.
    (kept,) = (tmp_path / "host3" / "payloads").iterdir()
    data = bytearray(kept.read_bytes())
    data[len(data) // 2] ^= 0xFF
    kept.write_bytes(bytes(data))
    third, run_id, sent = lab.launch()
    assert third.code == 0, third.explain()
    assert "node 2 (h3): its kept copy" in third.err and "failed its SHA-256" in third.err
    assert "node 2 (h3) got it from node 0 (h1)" in third.err, third.err[-3000:]
    assert sent < size / 20, sent  # from node 0, not from the laptop
    assert all(line["data"] == lab.expected() for line in lab.lines(run_id))
    run_no_leak(run_id)


@pytest.mark.timeout(300)
def test_hosts_whose_source_dies_mid_transfer_get_the_code_from_the_laptop(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    lab = Lab(ssh_env, tmp_path, free_port(), 40)
    rundirs = f"{tmp_path / 'host1' / 'runs'}/"
    with killing_server(rundirs) as killed:
        result, run_id, _ = lab.launch()
    assert result.code == 0, result.explain()
    assert killed, "node 0's hand-off server was never seen"
    notes = [ln for ln in result.err.splitlines() if "could not get the code from node 0" in ln]
    assert notes and all("sent from this machine instead" in n for n in notes), result.err[-3000:]
    lines = lab.lines(run_id)
    assert len(lines) == 4 and all(line["data"] == lab.expected() for line in lines), lines
    for i in HOSTS:  # no partial copy left beside the kept one
        assert [p.name for p in (tmp_path / f"host{i}" / "payloads").iterdir()] != [], i
        assert not [p for p in (tmp_path / f"host{i}" / "payloads").iterdir() if p.name[0] == "."]
    run_no_leak(run_id)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """host3's workdir on a tmpfs of 12 MiB: a disk the code does not fit on."""
    path = tmp_path / "host3"
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=12m,mode=0700", "sshddp-test", str(path)]
    made = subprocess.run(mount, capture_output=True, text=True)
    if made.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs at {path} (needs root; CI runs as root): {made.stderr}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@pytest.mark.timeout(300)
def test_a_host_whose_disk_fills_as_it_receives_is_named_and_keeps_nothing(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
    small_disk: Path,
) -> None:
    lab = Lab(ssh_env, tmp_path, free_port(), 16)
    result, run_id, sent = lab.launch()
    assert result.code == 74, result.explain()
    assert "no space left on node 2 (h3)" in result.err, result.err[-3000:]
    assert "nothing was started" in result.err
    assert sent < 1.15 * size_of(lab.root), sent  # no second copy to a full disk
    assert list((small_disk / "payloads").iterdir()) == []  # nothing a later launch trusts
    assert not lab.lines(run_id)  # no rank ran
    run_no_leak(run_id)


@pytest.mark.timeout(300)
def test_hosts_that_cannot_reach_each_other_get_the_code_from_the_laptop(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    """Node 0's address for the other hosts leads nowhere (as behind a bastion that sees
    every host where they see only each other's rendezvous): each gets it from here."""
    lab = Lab(ssh_env, tmp_path, free_port(), 8)
    doc = yaml.safe_load(lab.inv.read_text())
    doc["rendezvous"]["host"] = ssh_env.host(1).addr
    doc["hosts"][0]["addr"] = "192.0.2.1"  # TEST-NET-1: nothing answers there
    lab.inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    result, run_id, sent = lab.launch()
    assert result.code == 0, result.explain()
    notes = [ln for ln in result.err.splitlines() if "could not get the code from node 0" in ln]
    assert len(notes) == 3 and all("192.0.2.1" in n for n in notes), result.err[-3000:]
    assert sent >= 4 * size_of(lab.root)  # each its own copy, as before the hand-off
    lines = lab.lines(run_id)
    assert len(lines) == 4 and all(line["data"] == lab.expected() for line in lines), lines
    run_no_leak(run_id)
