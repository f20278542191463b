"""``--share``'s files down the hand-off's tree (issue 47): node 0 sends a checkpoint of a
few MB once, to node 1, which hands it on to nodes 2 and 3; a node whose parent fails gets
it from node 0, named. Each host has a workdir of its own (no shared disk)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from cli_helpers import Result, sshddp
from handoff_faults import killing_server
from sshddp.model.plan import CodeSpec, workspace_dir
from sshddp_lab.sshd import SshdCluster

SHAREHASH = Path(__file__).parent / "payloads" / "sharehash.py"
MB = 1 << 20
HOSTS = (1, 2, 3, 4)


class Lab:
    """A project whose node 0 holds a ckpt.bin of ``mb`` MB in its workspace; the others
    none."""

    def __init__(self, cluster: SshdCluster, tmp: Path, port: int, mb: int = 8) -> None:
        self.tmp = tmp
        self.size = mb * MB
        project = tmp / "project"
        project.mkdir()
        self.script = project / "sharehash.py"
        self.script.write_bytes(SHAREHASH.read_bytes())
        code = CodeSpec("file", "sharehash.py", str(self.script), str(project.resolve()))
        self.spaces = [Path(str(workspace_dir(str(tmp / f"host{i}"), code))) for i in HOSTS]
        self.spaces[0].mkdir(parents=True)
        data = os.urandom(self.size)
        (self.spaces[0] / "ckpt.bin").write_bytes(data)
        self.digest = hashlib.sha256(data).hexdigest()
        doc: dict[str, Any] = {
            "defaults": {"python": sys.executable},
            "rendezvous": {"port": port},
            "hosts": [
                {"host": cluster.host(i).alias, "nproc": 1, "workdir": str(tmp / f"host{i}")}
                for i in HOSTS
            ],
        }
        self.inv = tmp / "inv.yaml"
        self.inv.write_text(yaml.safe_dump(doc, sort_keys=False))

    def launch(self) -> tuple[Result, str, dict[int, Any]]:
        """A launch with ``--share ckpt.bin``: its result (stderr, then its trace), run id
        and each node's digest of its ckpt.bin."""
        log = self.tmp / "trace.log"
        environ = {**os.environ, "SSHDDP_LOG": str(log)}
        args = ["launch", "--launcher", "node", "--no-check", "--share", "ckpt.bin"]
        args += ["--log-dir", str(self.tmp / "logs"), str(self.inv), str(self.script)]
        result = sshddp(args, environ)
        assert "sshddp: run " in result.err, result.explain()
        run_id = result.err.split("sshddp: run ", 1)[1].split(":", 1)[0]
        result = Result(result.code, result.out, result.err + log.read_text(), result.raw)
        log.unlink()
        digests = {}
        for path in sorted((self.tmp / "logs" / run_id).glob("node*.log")):
            for line in path.read_text().splitlines():
                if line.startswith("{"):
                    found = json.loads(line)
                    digests[found["node"]] = found["ckpt"]
        return result, run_id, digests


def test_node_0_sends_a_shared_checkpoint_once_and_the_nodes_hand_it_on(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    lab = Lab(ssh_env, tmp_path, free_port())
    result, run_id, digests = lab.launch()
    assert result.code == 0, result.explain()
    assert digests == {n: lab.digest for n in range(4)}, digests
    # Node 0 is the source of one node (fan-out 4 bounds it); the others got it from node 1.
    assert f"node 0 sent 1 file(s), {8 * MB} bytes in all" in result.err, result.err[-3000:]
    assert "share: node 1 (h2) got the --share files from node 0 (h1)" in result.err
    for node in (2, 3):
        assert f"share: node {node} (h{node + 1}) got the --share files from node 1 (h2)" in (
            result.err
        )
    assert "could not get" not in result.err
    run_no_leak(run_id)
    for space in lab.spaces:  # no temporary copy left beside the file
        assert [p.name for p in space.iterdir() if p.name.startswith(".ckpt")] == []

    # Every node holds node 0's copy now: nothing is sent.
    again, run_id, digests = lab.launch()
    assert again.code == 0, again.explain()
    assert "node 0's copy is on every node; nothing sent" in again.err
    assert digests == {n: lab.digest for n in range(4)}
    run_no_leak(run_id)


def test_nodes_whose_relay_dies_get_the_shared_file_from_node_0_named(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    # Large enough that node 1's relay is killed before it has served both its children.
    lab = Lab(ssh_env, tmp_path, free_port(), 48)
    rundirs = f"{tmp_path / 'host2' / 'runs'}/"  # node 1's session forks only its relay
    with killing_server(rundirs) as killed:
        result, run_id, digests = lab.launch()
    assert result.code == 0, result.explain()
    assert killed, "node 1's relay server was never seen"
    for node in (2, 3):
        note = f"node {node} (h{node + 1}) could not get the --share files from node 1 (h2)"
        assert note in result.err, result.err[-3000:]
        assert f"share: node {node} (h{node + 1}) got the --share files from node 0 (h1)" in (
            result.err
        )
    assert "sent from node 0 (h1) instead" in result.err
    assert f"node 0 sent 3 file(s), {3 * lab.size} bytes in all" in result.err
    assert digests == {n: lab.digest for n in range(4)}, digests
    run_no_leak(run_id)


def tamper_when_kept(path: Path, size: int, done: threading.Event) -> bool:
    """Flip a byte of ``path`` in place as soon as it is whole (``size`` bytes, renamed
    into place): a copy changed on the relay after it was checked; whether it was."""
    while not done.is_set():
        try:
            if path.stat().st_size == size:
                with open(path, "r+b") as fh:
                    fh.seek(size // 2)
                    byte = fh.read(1)
                    fh.seek(size // 2)
                    fh.write(bytes([byte[0] ^ 0xFF]))
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.001)
    return False


def test_a_copy_changed_on_the_relay_is_refused_and_node_0_sends_it(
    ssh_env: SshdCluster,
    tmp_path: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    lab = Lab(ssh_env, tmp_path, free_port())
    done = threading.Event()
    tampered: list[bool] = []
    target = lab.spaces[1] / "ckpt.bin"
    watcher = threading.Thread(
        target=lambda: tampered.append(tamper_when_kept(target, 8 * MB, done))
    )
    watcher.start()
    try:
        result, run_id, digests = lab.launch()
    finally:
        done.set()
        watcher.join()
    assert result.code == 0, result.explain()
    assert tampered == [True]
    for node in (2, 3):
        note = f"node {node} (h{node + 1}) could not get the --share files from node 1 (h2)"
        assert note in result.err, result.err[-3000:]
    assert "arrived from node 1 (h2) with SHA-256" in result.err and "refused" in result.err
    # Nodes 2 and 3 hold node 0's copy; node 1 runs on the file changed under it after its
    # check (what a node's own disk does to its file is not the hand-off's to catch).
    assert [digests[n] for n in (0, 2, 3)] == [lab.digest] * 3, digests
    assert digests[1] != lab.digest
    run_no_leak(run_id)
