"""Running ``sshddp doctor`` against the test cluster and reading what it printed, and
fixes as a user pastes them: the commands a fix gives in backticks, run here (every test
host is this machine, so a command meant for a host runs here too)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Callable, Optional

from cli_helpers import Result, sshddp
from sshddp_lab.sshd import SshdCluster

Port = Callable[[], int]


def write(tmp_path: Path, text: str, name: str = "inv.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def inventory(
    tmp_path: Path, hosts: list[tuple[str, str | None]], port: int, rdzv_host: str = ""
) -> Path:
    """An inventory of (alias, python or None for ours) with rendezvous port ``port``."""
    lines = [f"defaults: {{python: {sys.executable}, nproc: 1}}"]
    rdzv = f"host: '{rdzv_host}', " if rdzv_host else ""
    lines.append(f"rendezvous: {{{rdzv}port: {port}}}")
    lines.append("hosts:")
    for alias, python in hosts:
        own = f", python: {python}" if python else ""
        lines.append(f"  - {{host: {alias}{own}}}")
    return write(tmp_path, "\n".join(lines) + "\n")


def healthy(cluster: SshdCluster, tmp_path: Path, port: int, hosts: list[int]) -> Path:
    return write(tmp_path, cluster.inventory_yaml(hosts, rdzv_port=port, nproc=1))


def doctor(cluster: SshdCluster, inv: Path, *options: str, config: Path | None = None) -> Result:
    config = config or cluster.ssh_config
    return sshddp(
        ["doctor", "--ssh-config", str(config), "--connect-timeout", "5", *options, str(inv)]
    )


def table(out: str) -> dict[str, dict[str, str]]:
    """The doctor table as {host: {column: cell}}."""
    rows = [
        [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]
        for line in out.splitlines()
        if line.count("│") + line.count("┃") >= 3
    ]
    header, body = rows[0], rows[1:]
    return {row[1]: dict(zip(header, row)) for row in body}


def problem(out: str, host: str, check: str, label: str = "FAIL") -> tuple[str, str]:
    """The (message, fix) lines that doctor prints for ``check`` failing (or, with
    ``label="warn"``, warning) on ``host``."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"{label} {host} {check}: "):
            fix = lines[i + 1].strip() if i + 1 < len(lines) else ""
            assert fix.startswith("fix: "), out
            return line, fix[len("fix: ") :]
    raise AssertionError(f"no {label} {check!r} for {host} in:\n{out}")


def failing(out: str) -> set[tuple[str, str]]:
    """Every (host, check) doctor printed as failing."""
    found = set()
    for line in out.splitlines():
        if line.startswith("FAIL "):
            host, check = line.split()[1:3]
            found.add((host, check.rstrip(":")))
    return found


def fix_commands(fix: str) -> list[str]:
    """Everything a fix gives in backticks: commands, options and YAML to write."""
    return fix.split("`")[1::2]


def fix_command(fix: str, program: str) -> str:
    """The one command of ``fix`` that starts with ``program``."""
    found = [c for c in fix_commands(fix) if c.startswith(program)]
    assert len(found) == 1, f"no single `{program} ...` command in the fix: {fix}"
    return found[0]


def run_fix(
    command: str, env: Optional[Mapping[str, str]] = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a fix's command as pasted into bash; it must succeed."""
    proc = subprocess.run(
        ["bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else dict(env),
    )
    assert proc.returncode == 0, (
        f"`{command}` failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    )
    return proc
