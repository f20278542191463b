"""The Slurm test lab itself: real slurmctld, slurmd and munged, with nothing mocked.

Each node is a network namespace with its own address, so a task proves where it ran by
the address and the namespace it sees. The allocations' node lists are the compressed
form (``node[1-3]``) that sshddp's hostlist parser expands.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from sshddp.model.slurm import expand_hostlist, expand_tasks_per_node
from sshddp_lab.slurm import SlurmCluster, SlurmClusterError

BOUND = 60.0  # generous upper bound for anything that should take seconds

# Prints what a task sees: its node, ranks, source address towards the controller
# (a UDP connect sends nothing) and network namespace.
WHERE = (
    "import os, socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.connect((sys.argv[1], 9))\n"
    "e = os.environ\n"
    "print('WHERE', e['SLURMD_NODENAME'], e['SLURM_PROCID'], e['SLURM_LOCALID'],\n"
    "      s.getsockname()[0], os.readlink('/proc/self/ns/net'), flush=True)\n"
)


def where_argv(cluster: SlurmCluster) -> list[str]:
    return [sys.executable, "-c", WHERE, cluster.ctld_addr]


def where_lines(output: str) -> list[tuple[str, int, int, str, str]]:
    """(node, procid, localid, address, netns) of each task, sorted by procid."""
    rows = []
    for line in output.splitlines():
        if line.startswith("WHERE "):
            _, node, procid, localid, addr, netns = line.split()
            rows.append((node, int(procid), int(localid), addr, netns))
    return sorted(rows, key=lambda row: row[1])


def assert_on_its_node(cluster: SlurmCluster, row: tuple[str, int, int, str, str]) -> None:
    """The task ran inside the namespace of the node Slurm says it ran on."""
    node, _, _, addr, netns = row
    i = cluster.nodelist.index(node) + 1
    assert addr == cluster.node(i).addr, row
    assert netns == f"net:[{cluster.netns_inode(i)}]", row


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def assert_cluster_idle(cluster: SlurmCluster) -> None:
    """The shared cluster is as a test found it: no job, no step process, nodes idle."""
    wait_until(lambda: not cluster.job_ids(), BOUND, "the job queue to empty")
    wait_until(lambda: not cluster.job_processes(), BOUND, "job processes to end")
    wait_until(lambda: set(cluster.node_states().values()) == {"idle"}, BOUND, "nodes to be idle")


def popen(cluster: SlurmCluster, argv: list[str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv, cwd=cwd, env=cluster.client_env(), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# ------------------------------------------------------------------------------ nodes


def test_sinfo_shows_three_idle_nodes(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %c %P"])
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split() for line in proc.stdout.splitlines())
    assert rows == [[f"node{i}", "idle", "4", "debug*"] for i in (1, 2, 3)]


def test_srun_runs_one_task_in_each_namespace(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["srun", "-N3", "--ntasks-per-node=1", *where_argv(slurm_cluster)])
    assert proc.returncode == 0, proc.stderr
    rows = where_lines(proc.stdout)
    assert [(node, procid) for node, procid, *_ in rows] == [
        ("node1", 0),
        ("node2", 1),
        ("node3", 2),
    ]
    for row in rows:
        assert_on_its_node(slurm_cluster, row)
    assert len({row[4] for row in rows}) == 3, "the three tasks share a namespace"


def test_srun_three_nodes_two_tasks_each(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["srun", "-N3", "--ntasks-per-node=2", *where_argv(slurm_cluster)])
    assert proc.returncode == 0, proc.stderr
    rows = where_lines(proc.stdout)
    assert [row[1] for row in rows] == list(range(6))
    for name in slurm_cluster.nodelist:
        assert sorted(row[2] for row in rows if row[0] == name) == [0, 1], rows
    for row in rows:
        assert_on_its_node(slurm_cluster, row)


def test_ssh_reaches_the_same_nodes(slurm_cluster: SlurmCluster) -> None:
    """ssh_config's ``Host nodeI`` is the namespace where slurmd runs node I's tasks."""
    for i, name in enumerate(slurm_cluster.nodelist, start=1):
        proc = subprocess.run(
            ["ssh", "-F", str(slurm_cluster.ssh_config), name, "readlink /proc/self/ns/net"],
            capture_output=True, text=True, timeout=BOUND, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"net:[{slurm_cluster.netns_inode(i)}]"


# ------------------------------------------------------------------------ allocations


ALLOC_ENV = (
    "echo NODELIST=$SLURM_NODELIST JOB_NODELIST=$SLURM_JOB_NODELIST CPUS=$SLURM_JOB_CPUS_PER_NODE"
)


def alloc_vars(output: str) -> dict[str, str]:
    line = next(ln for ln in output.splitlines() if ln.startswith("NODELIST="))
    return dict(item.split("=", 1) for item in line.split())


def test_salloc_gives_compressed_lists(slurm_cluster: SlurmCluster) -> None:
    """salloc runs its command here, in the root namespace. Five tasks on three nodes
    give ``node[1-3]`` and uneven counts in the run-length form (Slurm 22.05 packs them
    as ``3,1(x2)``), and a step inside the allocation puts its tasks where they say."""
    script = (
        f"{ALLOC_ENV} TASKS=$SLURM_TASKS_PER_NODE; srun {shlex.join(where_argv(slurm_cluster))}"
    )
    proc = slurm_cluster.run(["salloc", "-N3", "-n5", "sh", "-c", script], timeout=BOUND)
    assert proc.returncode == 0, proc.stderr
    env = alloc_vars(proc.stdout)
    assert env["NODELIST"] == env["JOB_NODELIST"] == "node[1-3]"
    assert env["TASKS"] == env["CPUS"] and "(x" in env["TASKS"]
    names = expand_hostlist(env["JOB_NODELIST"])
    assert names == ["node1", "node2", "node3"]
    counts = expand_tasks_per_node(env["TASKS"])
    assert len(counts) == 3 and sum(counts) == 5 and min(counts) >= 1
    per_node = dict(zip(names, counts))
    rows = where_lines(proc.stdout)
    assert {name: [row[0] for row in rows].count(name) for name in names} == per_node
    for row in rows:
        assert_on_its_node(slurm_cluster, row)
    assert_cluster_idle(slurm_cluster)


def test_sbatch_wait_runs_the_batch_script_on_the_first_node(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/sh\n"
        f"{ALLOC_ENV} TASKS=$SLURM_TASKS_PER_NODE\n"
        f"{shlex.join(where_argv(slurm_cluster))}\n"  # the batch step, on node1
        f"srun --ntasks-per-node=2 {shlex.join(where_argv(slurm_cluster))}\n"
    )
    proc = slurm_cluster.run(
        ["sbatch", "-N3", "--ntasks-per-node=2", "--wait", "-o", "out.txt", str(script)],
        cwd=tmp_path,
        timeout=BOUND,
    )
    assert proc.returncode == 0, proc.stderr
    out = (tmp_path / "out.txt").read_text()
    env = alloc_vars(out)
    assert env["NODELIST"] == env["JOB_NODELIST"] == "node[1-3]"
    assert expand_tasks_per_node(env["TASKS"]) == [2, 2, 2]
    rows = where_lines(out)
    batch, steps = rows[0], rows[1:]
    assert batch[0] == "node1"
    assert sorted(row[0] for row in steps) == ["node1", "node1", "node2", "node2", "node3", "node3"]
    for row in rows:
        assert_on_its_node(slurm_cluster, row)
    assert_cluster_idle(slurm_cluster)


# --------------------------------------------------------------------------- scancel


def sleeping(cluster: SlurmCluster, arg: str) -> int:
    """How many job processes on the nodes are ``sleep ARG`` (tasks, not their srun)."""
    return sum(
        1
        for _, cmd in cluster.job_processes()
        if cmd.split()[:1] in (["sleep"], ["/usr/bin/sleep"]) and cmd.split()[1:] == [arg]
    )


def running_job(cluster: SlurmCluster, steps: int) -> str:
    """Wait until exactly one job runs with ``steps`` steps and 3 sleeping tasks; its id."""

    def started() -> bool:
        jobs = cluster.run(["squeue", "-h", "-t", "R", "-o", "%A"]).stdout.split()
        step_ids = cluster.run(["squeue", "-h", "-s", "-o", "%i"]).stdout.split()
        return len(jobs) == 1 and len(step_ids) >= steps and sleeping(cluster, "3171") == 3

    wait_until(started, BOUND, "the job and its steps to run")
    return cluster.job_ids()[0]


@pytest.mark.parametrize("submit", ["srun", "sbatch"])
def test_scancel_ends_a_running_job_and_its_steps(
    slurm_cluster: SlurmCluster, tmp_path: Path, submit: str
) -> None:
    """A 3-node ``sleep`` as an interactive srun, or as a batch job whose script runs it
    as a step: scancel ends the job, every step and every task on every node."""
    step = "srun -N3 --ntasks-per-node=1 sleep 3171"
    argv = step.split() if submit == "srun" else ["sbatch", "-N3", "-o", "out.txt", "--wrap", step]
    client = popen(slurm_cluster, argv, tmp_path)
    try:
        job = running_job(slurm_cluster, steps=1 if submit == "srun" else 2)
        proc = slurm_cluster.run(["scancel", job])
        assert proc.returncode == 0, proc.stderr
        assert_cluster_idle(slurm_cluster)
        client.wait(timeout=BOUND)
        if submit == "srun":
            assert client.returncode != 0  # srun reports the cancelled job
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()


# ------------------------------------------------------------------------- lifecycle


def stat_fields(pid: int | str) -> list[str] | None:
    """``/proc/PID/stat`` after the command name: state first, start time at [19]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def live_pids_of(inodes: set[int], marker: bytes, pids: dict[int, str]) -> list[str]:
    """Every live process in one of ``inodes``' namespaces, naming ``marker`` on its
    command line, or in ``pids`` (pid -> start time): a fresh scan of /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            inode = int(os.readlink(entry / "ns" / "net").partition("[")[2].rstrip("]"))
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat_fields(entry.name)
        if fields is None or fields[0] == "Z":
            continue
        if inode in inodes or marker in cmdline or pids.get(int(entry.name)) == fields[19]:
            found.append(f"{entry.name}: {cmdline.decode(errors='replace')}")
    return found


def test_close_with_running_jobs_leaves_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A private cluster (beside the session's) closed while a batch job and an
    interactive step run: no process, namespace or bridge of it survives, its srun client
    is told and exits, and closing twice is harmless."""
    base = tmp_path_factory.mktemp("slurm-close")
    cluster = SlurmCluster(base, 3, ssh=True)
    try:
        cluster.start()
    except SlurmClusterError as exc:
        pytest.fail(f"cannot start the Slurm test cluster: {exc}")
    client = None
    try:
        batch = cluster.run(["sbatch", "-N1", "-o", "/dev/null", "--wrap", "sleep 3172"], cwd=base)
        assert batch.returncode == 0, batch.stderr
        client = popen(cluster, ["srun", "-N2", "sleep", "3173"], base)
        wait_until(
            lambda: sleeping(cluster, "3172") == 1 and sleeping(cluster, "3173") == 2,
            BOUND,
            "both jobs to run",
        )
        inodes = {cluster.netns_inode(i) for i in (1, 2, 3)}
        netns_names = [node.netns for node in cluster.nodes]
        bridge = cluster.net.bridge if cluster.net else ""
        before = {pid: fields[19] for pid, _ in cluster.processes() if (fields := stat_fields(pid))}
        assert len(before) >= 3 + 2 + 3  # slurmds, munged and slurmctld, sshds
    finally:
        started = time.monotonic()
        cluster.close()
        took = time.monotonic() - started
        if client is not None:
            try:
                client.communicate(timeout=BOUND)  # srun is told its job ended
            finally:
                if client.poll() is None:
                    client.kill()
                    client.communicate()
    cluster.close()
    assert took < 30, f"close() took {took:.1f} s"
    assert cluster.processes() == []
    assert live_pids_of(inodes, (str(base) + "/").encode(), before) == []
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [name for name in netns_names if name in listed]
    assert not Path(f"/sys/class/net/{bridge}").exists()


class BrokenController(SlurmCluster):
    """A cluster whose slurm.conf names a select plugin that does not exist."""

    def render_conf(self) -> str:
        return super().render_conf().replace("select/cons_tres", "select/nonexistent")


def test_start_fails_loudly_with_the_logs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A controller that cannot start fails start() within the bound, with slurmctld's
    own log in the message, and leaves nothing behind."""
    # A short base (not tmp_path, named for the test): under xdist's popen-gwN/ a longer
    # one leaves no room for slurmd's unix sockets (107 bytes at most).
    cluster = BrokenController(tmp_path_factory.mktemp("slurm-broken"), 1)
    started = time.monotonic()
    with pytest.raises(SlurmClusterError) as info:
        cluster.start()
    assert time.monotonic() - started < BOUND
    message = str(info.value)
    assert "slurmctld" in message and "slurmctld.log" in message
    assert "select/nonexistent" in message
    assert cluster.processes() == []
