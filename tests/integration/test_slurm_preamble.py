"""The shell preamble of a node's srun step, run by a real shell: it drops every Slurm
variable and goes home, and Slurm's own lines come before the command's last line."""

from __future__ import annotations

import shlex
import subprocess
import sys

from sshddp.hosts.srun import PREAMBLE, _SrunProcess


def test_the_preamble_drops_every_slurm_variable_and_goes_home(tmp_path: object) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "1", "SLURMD_X": "2"}
    env["SLURM_STEP_ID"] = "0"
    out = subprocess.run(
        ["bash", "-c", PREAMBLE + "pwd; env"], env=env, capture_output=True, text=True
    ).stdout
    assert out.splitlines()[0] == str(tmp_path)
    assert "SLURM" not in out


def test_slurms_own_lines_come_before_the_commands_last_line() -> None:
    """The command's status record is its stderr's last line, whatever srun adds after."""
    script = (
        "import sys\n"
        "w = sys.stderr.write\n"
        "w('srun: error: node2: task 0: Exited\\n'); w('own 1\\n'); w('{\"state\": \"x\"}\\n')\n"
        "w('slurmstepd-node2: error: *** STEP 5.0 ON node2 CANCELLED ***\\n')\n"
        "w('srun: Job step aborted\\n')\n"
    )
    command = shlex.join([sys.executable, "-c", script])
    proc = _SrunProcess(command, ["bash", "-c", command], {"PATH": "/usr/bin:/bin"})
    proc.close_stdin()
    assert proc.wait() == 0
    lines = proc.read_stderr().decode().splitlines()
    proc.close()
    assert lines[-2:] == ["own 1", '{"state": "x"}']
    assert [line.split(":")[0] for line in lines[:3]] == ["srun", "slurmstepd-node2", "srun"]
