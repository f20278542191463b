"""Launch paths through each host's single launch session: with and without the preflight,
and hosts that cannot be reached or cannot run the session at all."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Callable

import yaml
from launch_helpers import (
    JOB,
    SSHDDP,
    Run,
    cli_env,
    launch,
    run_id_of,
    wait_until,
    write_inventory,
)

from sshddp_lab.sshd import SshdCluster

MakeCluster = Callable[..., SshdCluster]


def test_no_check_launch_runs_the_job(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    run = launch(ssh_env, tmp_path, free_port(), ["ok"], opts=["--no-check"], hosts=[1, 2])
    assert run.rc == 0, run.stderr
    for node in range(2):
        sums = [j["sum"] for j in run.json_lines(node) if "sum" in j]
        assert sums == [6.0, 6.0]  # 4 ranks: 0 + 1 + 2 + 3
        assert run.local_log(node).read_bytes() == run.remote_log(node).read_bytes()
    assert "rank 0 line 49" in run.local_log(0).read_text()
    run_no_leak(run.run_id)


def _launch(cluster: SshdCluster, tmp: Path, port: int, opts: list[str]) -> Run:
    inv, workdir = write_inventory(cluster, tmp, port, hosts=[1, 2, 3], nproc=1)
    proc = subprocess.run(
        [*SSHDDP, "launch", *opts, str(inv), str(JOB), "wait"],
        cwd=tmp,
        env=cli_env(cluster),
        capture_output=True,
        text=True,
        timeout=180,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, run_id_of(proc.stderr), tmp, workdir)


def test_no_check_with_a_host_down_starts_nothing_anywhere(
    make_cluster: MakeCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """Every node stages its code before any starts: h3 cannot be reached, so h1 and h2,
    which staged, remove what they staged and nothing runs anywhere."""
    private = make_cluster(3)
    private.stop_host(3)
    run = _launch(private, tmp_path, free_port(), ["--no-check"])
    assert run.rc == 1, run.stderr
    assert "root cause: node 2 on h3" in run.stderr, run.stderr
    assert "refused" in run.stderr.lower(), run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.count("not started: node 2 (h3) could not be staged") == 2, run.stderr
    assert not (run.workdir / "runs" / run.run_id).exists()
    run_no_leak(run.run_id)


def test_no_check_with_node_0_down_starts_no_other_node(
    make_cluster: MakeCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    private = make_cluster(3)
    private.stop_host(1)
    run = _launch(private, tmp_path, free_port(), ["--no-check"])
    assert run.rc == 1, run.stderr
    assert "root cause: node 0 on h1" in run.stderr, run.stderr
    assert run.stderr.count("not started: node 0 (h1) could not be staged") == 2, run.stderr
    assert not (run.workdir / "runs" / run.run_id).exists()  # nothing was booted anywhere
    run_no_leak(run.run_id)


def test_failed_preflight_leaves_no_session_and_holds_no_port(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """A check fails (node 2's interpreter is missing): every session ends without booting,
    and host 0's probe lets go of the rendezvous port, so the next launch gets it."""
    port = free_port()
    inv, workdir = write_inventory(ssh_env, tmp_path, port, hosts=[1, 2, 3], nproc=1)
    text = inv.read_text()
    doc = yaml.safe_load(text)
    doc["hosts"][2]["python"] = "/nonexistent/python3"
    inv.write_text(yaml.safe_dump(doc))
    bad = subprocess.run(
        [*SSHDDP, "launch", str(inv), str(JOB), "ok"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert bad.returncode == 3, bad.stderr
    assert "/nonexistent/python3" in bad.stderr and "nothing was started" in bad.stderr
    assert not (workdir / "runs").exists() or not any((workdir / "runs").iterdir())
    inv.write_text(text)
    run = launch(ssh_env, tmp_path, port, ["ok"], hosts=[1, 2, 3], nproc=1)
    assert run.rc == 0, run.stderr
    run_no_leak(run.run_id)


def test_workdir_module_runs_like_python_dash_m(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """`--workdir DIR -m pkg.main`: the directory is shipped honouring .gitignore, and the
    module runs as `python -m` would run it from there (argv, __name__, sys.path[0], a
    relative import), through torchrun and the rank shim."""
    proj = tmp_path / "proj"
    (proj / "pkg").mkdir(parents=True)
    (proj / ".gitignore").write_text("secret.txt\n")
    (proj / "secret.txt").write_text("do not ship")
    (proj / "pkg" / "__init__.py").write_text("")
    (proj / "pkg" / "helper.py").write_text("VALUE = 'helper ok'\n")
    (proj / "pkg" / "main.py").write_text(
        "import json, os, sys\n"
        "from .helper import VALUE\n"
        "print(json.dumps({'argv': sys.argv[1:], 'argv0': sys.argv[0], 'name': __name__,\n"
        "    'path0': sys.path[0], 'cwd': os.getcwd(), 'value': VALUE,\n"
        "    'ignored_shipped': os.path.exists('secret.txt'), 'rank': os.environ['RANK']}))\n"
    )
    inv, _ = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    proc = subprocess.run(
        [*SSHDDP, "launch", "--workdir", str(proj), "-m", "pkg.main", str(inv), "a b", "--x=1"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    run = Run(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        run_id_of(proc.stderr),
        tmp_path,
        tmp_path / "remote",
    )
    for node in range(2):
        (out,) = run.json_lines(node)
        assert out["argv"] == ["a b", "--x=1"] and out["name"] == "__main__"
        workspace = str(
            tmp_path / "remote" / "work" / "proj-"
        )  # docs/runs.md "Outputs that survive"
        assert out["argv0"].startswith(workspace) and out["argv0"].endswith("/pkg/main.py")
        assert out["path0"] == out["cwd"] and out["cwd"].startswith(workspace)
        assert out["value"] == "helper ok" and out["ignored_shipped"] is False
        assert out["rank"] == str(node)
    run_no_leak(run.run_id)


def test_a_script_that_lives_on_the_hosts_is_checked_there_and_run(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """`~/remote_job.py` does not exist here, so it is taken as a path on the hosts: run
    from each host's home when there, refused by the preflight (exit 3) or by staging with
    --no-check (exit 1, nothing started anywhere) when one host lacks it."""
    name = f"remote_job_{tmp_path.name}.py"
    assert not (Path.home() / name).exists()
    for i in (1, 2):
        (ssh_env.home(i) / name).write_bytes(JOB.read_bytes())
    try:
        inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)

        def launch_remote(*opts: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*SSHDDP, "launch", *opts, str(inv), f"~/{name}", "argv", "x y"],
                cwd=tmp_path,
                env=cli_env(ssh_env),
                capture_output=True,
                text=True,
                timeout=180,
            )

        ok = launch_remote()
        assert ok.returncode == 0, ok.stderr
        run = Run(0, ok.stdout, ok.stderr, run_id_of(ok.stderr), tmp_path, workdir)
        for node in range(2):
            (summary,) = [j for j in run.json_lines(node) if "argv" in j]
            assert summary["argv"] == ["x y"] and summary["world"] == 2
        run_no_leak(run.run_id)

        (ssh_env.home(2) / name).unlink()
        refused = launch_remote()
        assert refused.returncode == 3, refused.stderr
        assert "h2" in refused.stderr and name in refused.stderr, refused.stderr
        unchecked = launch_remote("--no-check")
        assert unchecked.returncode == 1, unchecked.stderr
        assert f"the script {name} does not exist on this host" in unchecked.stderr
        assert "root cause: node 1 on h2" in unchecked.stderr, unchecked.stderr
        run_no_leak(run_id_of(unchecked.stderr))
        assert not (workdir / "runs" / run_id_of(unchecked.stderr)).exists()
    finally:
        for i in (1, 2):
            (ssh_env.home(i) / name).unlink(missing_ok=True)


def _fds(pid: int) -> dict[int, str]:
    fd_dir = Path(f"/proc/{pid}/fd")
    out = {}
    for entry in fd_dir.iterdir():
        try:
            out[int(entry.name)] = os.readlink(entry)
        except OSError:
            pass
    return out


def test_supervisor_is_forked_detached_from_the_channel(
    ssh_env: SshdCluster, tmp_path: Path, free_port: Callable[[], int], run_no_leak
) -> None:
    """The supervisor, forked off the launch session, keeps none of the session's SSH pipes,
    runs in its own session, and shows its run: its run id in its environment, its run dir
    in its command line. Its launch session (its parent) still follows the node's log."""
    inv, workdir = write_inventory(ssh_env, tmp_path, free_port(), hosts=[1, 2], nproc=1)
    proc = subprocess.Popen(
        [*SSHDDP, "launch", "--name", "forked", str(inv), str(JOB), "wait"],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        rundir = workdir / "runs" / "forked" / "n1"
        wait_until(lambda: "READY" in _text(rundir / "node.log"), 90, "node 1 to be ready")
        state = json.loads((rundir / "state.json").read_text())
        supervisor = state["supervisor_pid"]
        session = int(Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert str(rundir) in _cmdline(session) and str(rundir) in _cmdline(supervisor)
        assert os.getsid(supervisor) == supervisor  # its own session, no controlling tty
        assert os.getsid(session) != supervisor
        fds = _fds(supervisor)
        assert fds[0] == "/dev/null"
        assert fds[1] == fds[2] == str(rundir / "supervisor.log")
        channel = {t for fd, t in _fds(session).items() if fd <= 2}  # the session's SSH pipes
        assert channel and all(t.startswith(("pipe:", "socket:")) for t in channel), channel
        assert not channel & set(fds.values()), (channel, fds)
        assert b"SSHDDP_RUN_ID=forked" in Path(f"/proc/{supervisor}/environ").read_bytes()
        stop = subprocess.run(
            [*SSHDDP, "stop", "forked"],
            cwd=tmp_path,
            env=cli_env(ssh_env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert stop.returncode == 0, stop.stderr
        assert proc.wait(60) == 1, proc.returncode  # the run was stopped: it did not succeed
    finally:
        if proc.poll() is None:
            proc.kill()
    run_no_leak("forked")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
