"""Asking Slurm about a job: its client command ``scontrol``, run here.

Inside an allocation the environment is full of ``SLURM_*`` variables that Slurm's client
commands read as options (``SLURM_NTASKS_PER_NODE`` means ``--ntasks-per-node``), and
``SQUEUE_FORMAT`` and the like change what they print. Every command sshddp runs gets the
environment without them, but with ``SLURM_CONF`` (which cluster to ask), and names the
job explicitly. A failure becomes an error that says what was asked and what Slurm said.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Optional

from sshddp import defaults
from sshddp.errors import HostUnreachable, InventoryError

#: Prefixes of variables that Slurm's commands read as options or formats.
_OPTION_PREFIXES = ("SLURM_", "SLURMD_", "SQUEUE_", "SCONTROL_", "SRUN_", "SALLOC_", "SBATCH_")
#: How the controller says a job does not exist (or is gone from its memory).
_NO_SUCH_JOB = ("Invalid job id", "Invalid job ID")


def client_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` for a Slurm client command: no option-like variable, ``SLURM_CONF`` kept."""
    env = {k: v for k, v in environ.items() if not k.startswith(_OPTION_PREFIXES)}
    if environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = environ["SLURM_CONF"]
    return env


def run_client(
    argv: Sequence[str], environ: Mapping[str, str], timeout: float = defaults.SLURM_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command to completion, its output as text."""
    try:
        return subprocess.run(
            list(argv),
            env=client_env(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except FileNotFoundError:
        raise InventoryError(
            f"Slurm's client commands are not installed here ({argv[0]} is not on PATH): "
            "run sshddp on a login node of the cluster, or inside the allocation"
        ) from None
    except subprocess.TimeoutExpired:
        raise HostUnreachable(
            "slurmctld",
            f"`{' '.join(argv)}` did not answer within {timeout:.0f} s: is Slurm's controller "
            "up? (`scontrol ping`)",
        ) from None


def _said(proc: subprocess.CompletedProcess[str]) -> str:
    text = (proc.stderr or proc.stdout).strip().splitlines()
    return " | ".join(text[-3:]) or f"exit status {proc.returncode}"


def show_job(job: str, environ: Mapping[str, str], where: str) -> str:
    """``scontrol -o show job -d JOB``'s record; an error naming ``where`` if there is none."""
    proc = run_client(["scontrol", "-o", "show", "job", "-d", job], environ)
    if proc.returncode == 0 and "JobId=" in proc.stdout:
        return proc.stdout
    said = _said(proc)
    if any(text in said for text in _NO_SUCH_JOB):
        raise InventoryError(
            f"{where}: Slurm has no job {job} (scontrol: {said}). `squeue --me` lists your "
            "running jobs"
        )
    raise HostUnreachable("slurmctld", f"{where}: `scontrol show job {job}` failed: {said}")


def node_addrs(names: Sequence[str], environ: Mapping[str, str]) -> str:
    """``scontrol -o show node LIST``: one line per node, ``NodeAddr`` among its fields."""
    proc = run_client(["scontrol", "-o", "show", "node", ",".join(names)], environ)
    if proc.returncode != 0:
        raise HostUnreachable(
            "slurmctld", f"`scontrol show node` for {','.join(names)} failed: {_said(proc)}"
        )
    return proc.stdout


def job_state(job: str, environ: Mapping[str, str]) -> Optional[str]:
    """The job's state (``RUNNING``, ``COMPLETING``, ``CANCELLED``, ``TIMEOUT``, ...); None
    when the controller no longer knows the job. Raises ``HostUnreachable`` if it did not
    answer."""
    proc = run_client(["scontrol", "-o", "show", "job", job], environ)
    if proc.returncode == 0:
        match = re.search(r"(?:^|\s)JobState=(\S+)", proc.stdout)
        return match.group(1) if match else None
    if any(text in _said(proc) for text in _NO_SUCH_JOB):
        return None
    raise HostUnreachable("slurmctld", f"`scontrol show job {job}` failed: {_said(proc)}")
