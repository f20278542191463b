"""Bytes that leave the laptop for ``launch --workdir`` of MB to N lab hosts, twice; or
for a first ``sync`` of a project without dependencies to N lab hosts, then a warm one.

    python scripts/handoff_bytes.py MB N SRC
    python scripts/handoff_bytes.py sync N SRC

Starts N sshd hosts (``sshddp_lab``), each with a workdir of its own, puts every host
behind the counting ProxyCommand (``sshddp_lab/countproxy.py``), makes a workdir of MB MiB of
random bytes, and launches it twice with the sshddp whose sources are in SRC (a ``src/``
folder: this checkout's, or another commit's from ``git archive``, to compare), printing
the bytes towards the hosts per byte of the workdir (a sync's: per byte of the compressed uv
binary that a host without uv needs). docs/notes/2026-12-handoff.md holds what it
measured.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sshddp_lab import workers
from sshddp_lab.countproxy import total_up
from sshddp_lab.sshd import SshdCluster

JOB = Path(__file__).parent.parent / "tests" / "integration" / "payloads" / "hashwork.py"


def counted(cluster: SshdCluster, counts: Path, path: Path) -> Path:
    proxy = f"    ProxyCommand {sys.executable} -m sshddp_lab.countproxy {counts} %h %p\n"
    blocks = cluster.ssh_config.read_text().split("\n\n")
    path.write_text("\n".join(b.rstrip("\n") + "\n" + proxy for b in blocks if b.strip()))
    return path


def project(root: Path, mb: int) -> int:
    (root / "data").mkdir(parents=True)
    (root / "hashwork.py").write_bytes(JOB.read_bytes())
    for i in range(mb // 8):
        (root / "data" / f"p{i}.bin").write_bytes(os.urandom(8 << 20))
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def counted_run(
    argv: list[str], counts: Path, src: str, cwd: Path
) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run sshddp (``src`` first on its path) and count the bytes it sent towards the hosts."""
    before = total_up(str(counts)) if counts.exists() else 0
    env = {**os.environ, "PYTHONPATH": src}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    return done, total_up(str(counts)) - before


def main(mb: int, n: int, src: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sshddp-handoff-"))
    with SshdCluster(tmp / "sshd", n, first_octet=workers.session_first_octet()) as cluster:
        cluster.start()
        root = tmp / "project"
        size = project(root, mb)
        hosts = [
            {"host": f"h{i}", "nproc": 1, "workdir": str(tmp / f"host{i}")} for i in range(1, n + 1)
        ]
        inv = tmp / "inv.yaml"
        inv.write_text(yaml.safe_dump({"defaults": {"python": sys.executable}, "hosts": hosts}))
        counts = tmp / "counts"
        config = counted(cluster, counts, tmp / "ssh_config")
        argv = [sys.executable, "-m", "sshddp", "launch", "--ssh-config", str(config)]
        argv += ["--launcher", "node", "--no-check", "--log-dir", str(tmp / "logs")]
        argv += ["--workdir", str(root), str(inv), str(root / "hashwork.py")]
        for launch in (1, 2):
            started = time.time()
            done, up = counted_run(argv, counts, src, tmp)
            print(
                f"launch {launch}: exit {done.returncode}, {mb} MB to {n} hosts: {up} bytes "
                f"towards the hosts for {size}: {up / size:.3f}x, {time.time() - started:.1f} s",
                flush=True,
            )


def locked_project(root: Path) -> None:
    """A uv project without dependencies, locked here (no index needed)."""
    import uv

    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0.1.0"\nrequires-python = ">=3.8"\n'
        "dependencies = []\n[tool.uv]\npackage = false\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(root), "UV_CACHE_DIR": str(root / ".c")}
    argv = [uv.find_uv_bin(), "lock", "--quiet", "--offline"]
    subprocess.run(argv, cwd=root, env=env, check=True)


def sync(n: int, src: str) -> None:
    from sshddp.run.sync import _uv_packed, local_platform

    packed = len(_uv_packed(local_platform()))
    tmp = Path(tempfile.mkdtemp(prefix="sshddp-handoff-sync-"))
    with SshdCluster(tmp / "sshd", n, first_octet=workers.session_first_octet()) as cluster:
        cluster.start()
        root = tmp / "project"
        locked_project(root)
        hosts = [{"host": f"h{i}", "workdir": str(tmp / f"host{i}")} for i in range(1, n + 1)]
        doc = {"python": sys.executable, "env": {"UV_CACHE_DIR": str(tmp / "uv-cache")}}
        inv = tmp / "inv.yaml"
        inv.write_text(yaml.safe_dump({"defaults": doc, "hosts": hosts}))
        counts = tmp / "counts"
        config = counted(cluster, counts, tmp / "ssh_config")
        argv = [sys.executable, "-m", "sshddp", "sync", "--ssh-config", str(config)]
        argv += [str(inv), str(root)]
        for which in ("first", "warm"):
            started = time.time()
            done, up = counted_run(argv, counts, src, tmp)
            print(
                f"{which} sync: exit {done.returncode}, {n} hosts: {up} bytes towards the hosts "
                f"for uv of {packed} (compressed): {up / packed:.3f}x, "
                f"{time.time() - started:.1f} s",
                flush=True,
            )


if __name__ == "__main__":
    if sys.argv[1] == "sync":
        sync(int(sys.argv[2]), sys.argv[3])
    else:
        main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
