"""A Slurm job's node reached through job steps: ``transport: srun``, for clusters whose
nodes take no SSH.

Every command line sshddp would send over SSH runs instead as a step of the job on that
node::

    srun --jobid J --nodelist NODE --nodes 1 --ntasks 1 --overlap ... bash -c 'COMMAND'

with its stdin, stdout and stderr passed through srun, so the launch session, ``stop``,
``follow`` and ``status`` speak the same protocol as over SSH. ``--overlap`` lets the step
share the job's CPUs, memory and GPUs with the job's other steps (a batch script's own
``srun``, another sshddp call); the step gets every GPU the job holds on the node, so
Slurm sets its ``CUDA_VISIBLE_DEVICES``.

What the command sees is what an SSH session would give it: ``PATH``, ``HOME``, ``USER``
and the locale from here (``--export``), and no ``SLURM_*`` variable (unset before the
command runs: libraries that see them act as if they were launched by srun, one process
per task). srun itself runs without this shell's ``SLURM_*`` options (``hosts.slurm``).

A node's supervisor lives in its launch session's step, and Slurm ends a step's processes
when the step ends, so a run over srun lives as long as this coordinator holds its steps:
see ``remote/node/bound.py`` for how the hosts make that end orderly.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

from sshddp.errors import HostUnreachable, UsageError
from sshddp.hosts.local import _LocalProcess
from sshddp.hosts.slurm import client_env
from sshddp.hosts.transport import RemoteProcess
from sshddp.model.inventory import Host

SRUN_OPTIONS = (
    "--nodes=1",
    "--ntasks=1",
    "--overlap",  # share the job's resources with its other steps
    "--quiet",  # no "job step created" chatter; errors still come
    "--unbuffered",  # pass output on as it comes, not a line at a time
    "--mpi=none",
    "--cpu-bind=none",  # torchrun and its ranks get every CPU of the step, as over SSH
    "--chdir=/",  # this directory may not exist there; the command goes home itself
    "--job-name=sshddp",  # how `squeue -s` names sshddp's steps
)
#: What the command gets from this environment, as an SSH session would (plus LC_*).
EXPORTED = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "VIRTUAL_ENV")
#: Unsets every SLURM* variable, then goes home, as an SSH session starts there.
PREAMBLE = 'unset "${!SLURM@}"; cd 2>/dev/null; '
CLOSE_WAIT = 30.0  # seconds a closed step has to end on its own before srun is told to end it
_SLURM_LINE = re.compile(rb"^(?:srun|slurmstepd(?:-[\w.-]+)?): ")


def srun_argv(job: str, node: str, command: str, names: list[str]) -> list[str]:
    """The srun command line that runs ``command`` as a step of ``job`` on ``node``."""
    exported = ",".join(names) or "NONE"
    return [
        "srun",
        f"--jobid={job}",
        f"--nodelist={node}",
        *SRUN_OPTIONS,
        f"--export={exported}",
        "bash",
        "-c",
        PREAMBLE + command,
    ]


def exported_names(environ: dict[str, str]) -> list[str]:
    """The variables of ``environ`` that go to the step."""
    names = [n for n in EXPORTED if n in environ]
    return names + sorted(n for n in environ if n.startswith("LC_"))


class _SrunProcess(_LocalProcess):
    """A step running one command; Slurm's own messages come before the command's stderr,
    so the command's last line (a status record) stays last."""

    def read_stderr(self) -> bytes:
        lines = super().read_stderr().splitlines(keepends=True)
        slurm = [line for line in lines if _SLURM_LINE.match(line)]
        own = [line for line in lines if not _SLURM_LINE.match(line)]
        return b"".join(slurm + own)

    def close(self) -> None:
        """Like a dropped channel: stdin closes and the command ends on its own (a launch
        session first stops its node). A step that outlasts ``CLOSE_WAIT`` is ended by
        srun (on SIGTERM it has Slurm kill the step's processes), then srun is killed."""
        popen = self._popen
        if popen.poll() is None:
            self.close_stdin()
            try:
                popen.wait(timeout=CLOSE_WAIT)
            except subprocess.TimeoutExpired:
                popen.terminate()
                try:
                    popen.wait(timeout=CLOSE_WAIT)
                except subprocess.TimeoutExpired:
                    pass  # _LocalProcess.close kills it
        super().close()


class SrunTransport:
    """Runs commands as steps of the host's Slurm job on its node."""

    def __init__(self, host: Host) -> None:
        if host.slurm_job is None:
            raise UsageError(
                f"{host.host}: transport srun needs the host to be a node of a Slurm job "
                "(hosts: {slurm: JOBID})"
            )
        self.host = host
        self.job: str = host.slurm_job
        self.label = f"{host.host} (srun, job {self.job})"

    def connect(self) -> None:
        if shutil.which("srun") is None:
            raise HostUnreachable(
                self.host.host,
                f"{self.label}: srun is not installed here",
                "run sshddp on a login node of the cluster or inside the allocation, or "
                "use transport: ssh",
            )

    def start(self, command: str) -> RemoteProcess:
        self.connect()
        env = client_env(os.environ)
        argv = srun_argv(self.job, self.host.host, command, exported_names(env))
        return _SrunProcess(command, argv, env)

    def close(self) -> None:
        pass  # nothing is held between steps
