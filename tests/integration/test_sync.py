"""``sshddp sync`` against real sshd hosts, each with its own workdir, with real uv.

The projects install offline-capably from this machine's local indexes (/opt/pypi*) and
wheels (/opt/wheels: torch's CPU build). The hosts share one uv cache, given through the
inventory's ``env`` (which applies to the install), so each package is unpacked once.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

import pytest
import yaml
from launch_helpers import SSHDDP, cli_env, run_id_of

from cli_helpers import Result, assert_clean_failure, sshddp
from sshddp.defaults import KEEP_ENVS
from sshddp.errors import ExitCode
from sshddp_lab.sshd import SshdCluster

UV = Path(__import__("uv").find_uv_bin())
INDEXES = """
[tool.uv]
package = false
find-links = ["/opt/wheels"]
index-strategy = "unsafe-best-match"

[[tool.uv.index]]
url = "file:///opt/pypi/simple"
default = true

[[tool.uv.index]]
url = "file:///opt/pypi-more/simple"
"""


def make_project(
    folder: Path, deps: list[str], cache: Path, python: str = ">=3.11", version: str = "0.1.0"
) -> Path:
    """A uv project pinning ``deps``, locked with this machine's uv against local indexes."""
    folder.mkdir(parents=True, exist_ok=True)
    listed = ", ".join(json.dumps(d) for d in deps)
    (folder / "pyproject.toml").write_text(
        f'[project]\nname = "demo"\nversion = "{version}"\nrequires-python = "{python}"\n'
        f"dependencies = [{listed}]\n{INDEXES}"
    )
    env = {"UV_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "HOME": str(folder)}
    subprocess.run([UV, "lock", "--quiet"], cwd=folder, env=env, check=True, timeout=120)
    return folder


@pytest.fixture(scope="module")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


def inventory(cluster: SshdCluster, tmp: Path, hosts: list[int], cache: Path, **env: str) -> Path:
    """An inventory of ``hosts``, each with its own workdir (under its own HOME)."""
    doc = yaml.safe_load(cluster.inventory_yaml(hosts, workdir=f"~/w-{tmp.name}"))
    doc["defaults"]["env"] = {"UV_CACHE_DIR": str(cache), "GLOO_SOCKET_IFNAME": "lo"}
    for entry in doc["hosts"]:
        entry["env"] = {k.replace("__", ":"): v for k, v in env.items() if entry["host"] in k}
        entry["env"] = {k.split(":")[1]: v for k, v in entry["env"].items()}
    path = tmp / "inv.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def envs_of(cluster: SshdCluster, tmp: Path, i: int) -> Path:
    return cluster.home(i) / f"w-{tmp.name}" / "envs"


def sync(cluster: SshdCluster, inv: Path, project: Path, *more: str) -> Result:
    return sshddp(["sync", "--ssh-config", str(cluster.ssh_config), *more, str(inv), str(project)])


def keys(result: Result) -> dict[str, str]:
    """host -> the environment hash its line names."""
    found = {}
    for line in result.out.splitlines():
        host, _, rest = line.partition(": ")
        if " env " in rest:
            found[host] = rest.split(" env ")[1].split()[0]
    return found


def test_sync_builds_every_hosts_env_then_answers_ready(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["numpy==2.2.6", "six==1.17.0"], uv_cache)
    # each host its own uv cache, as separate machines have: each one downloads and installs
    caches = {f"h{i}__UV_CACHE_DIR": str(tmp_path / f"cache{i}") for i in (1, 2)}
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache, **caches)

    first = sync(ssh_env, inv, project)
    assert first.code == 0, first.explain()
    assert [line.split()[1] for line in first.out.splitlines()] == ["built", "built"]
    key = keys(first)["h1"]
    assert keys(first) == {"h1": key, "h2": key}  # same lock, platform and Python
    for i in (1, 2):
        python = envs_of(ssh_env, tmp_path, i) / key / "bin" / "python"
        code = "import numpy, six, sys; print(numpy.__version__, six.__version__, sys.prefix)"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["2.2.6", "1.17.0", str(python.parent.parent)]
        # sshddp brought its own uv (the lab hosts have none on PATH)
        assert (ssh_env.home(i) / f"w-{tmp_path.name}" / "tools").is_dir()
        assert not [p for p in envs_of(ssh_env, tmp_path, i).iterdir() if p.name != key]
    # not a terminal: a plain line each time a host moves on, with what uv said
    for host in ("h1", "h2"):
        said = [line for line in first.err.splitlines() if line.startswith(f"{host}: ")]
        assert [line.split()[1] for line in said] == [
            "resolving",
            "downloading",
            "installing",
            "done",
        ], first.explain()
        # uv's count: what this host's uv prepared (the other host may have cached some)
        assert re.fullmatch(rf"{host}: installing [12] packages?", said[2]), first.explain()
        assert said[3].endswith("MiB"), first.explain()  # the environment's size

    # a warm sync runs no uv at all (the interpreter the first found is remembered): with
    # h1's uv broken, it still answers ready
    (uv,) = (ssh_env.home(1) / f"w-{tmp_path.name}" / "tools").glob("uv-*/uv")
    uv.write_text("#!/bin/sh\necho 'this uv must not run' >&2\nexit 3\n")
    again = sync(ssh_env, inv, project)
    assert again.code == 0, again.explain()
    assert [line.split()[1] for line in again.out.splitlines()] == ["ready", "ready"]
    assert not [line for line in again.err.splitlines() if line.startswith("h")]  # one call
    assert keys(again) == keys(first)


def test_a_changed_lock_reaches_every_host_as_a_new_env(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["six==1.17.0"], uv_cache)
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache)
    first = sync(ssh_env, inv, project)
    assert first.code == 0, first.explain()
    make_project(project, ["six==1.17.0", "numpy==2.0.2"], uv_cache)
    second = sync(ssh_env, inv, project)
    assert second.code == 0, second.explain()
    assert "built" in second.out and "ready" not in second.out
    new, old = keys(second)["h1"], keys(first)["h1"]
    assert new != old and set(keys(second).values()) == {new}
    for i in (1, 2):
        python = envs_of(ssh_env, tmp_path, i) / new / "bin" / "python"
        out = subprocess.run(
            [python, "-c", "import numpy; print(numpy.__version__)"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == "2.0.2"
        assert (envs_of(ssh_env, tmp_path, i) / old).is_dir()  # a run on it keeps it


def test_a_python_no_host_has_names_host_wanted_and_found(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["six==1.17.0"], uv_cache)
    (project / ".python-version").write_text("3.99\n")
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache)
    result = sync(ssh_env, inv, project)
    assert_clean_failure(result, ExitCode.SYNC_FAILED)
    for host in ("h1", "h2"):
        line = next(x for x in result.out.splitlines() if x.startswith(f"{host}: "))
        assert "no Python 3.99 on this host (found: " in line, result.explain()
        assert "3.11" in line and "fix: install Python 3.99" in line, result.explain()
    assert "failed on 2 of 2 host(s)" in result.err
    assert not envs_of(ssh_env, tmp_path, 1).exists() or not list(
        envs_of(ssh_env, tmp_path, 1).iterdir()
    )


def test_a_host_that_fails_to_install_is_named_and_the_others_finish(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["six==1.17.0"], uv_cache)
    # h2's uv may not use six's wheel, and six has no sdist: uv's own message says so
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache, h2__UV_NO_BINARY_PACKAGE="six")
    result = sync(ssh_env, inv, project)
    assert_clean_failure(result, ExitCode.SYNC_FAILED)
    lines = result.out.splitlines()
    assert lines[0].startswith("h1: built  env "), result.explain()
    assert lines[1].startswith("h2: failed: "), result.explain()
    assert "marked as `--no-binary` but has no source distribution" in lines[1], result.explain()
    assert "failed on 1 of 2 host(s): h2 (failed)" in result.err
    assert not [p for p in envs_of(ssh_env, tmp_path, 2).iterdir()]  # nothing half-built


def test_a_directory_without_a_lock_is_a_clear_error(ssh_env: SshdCluster, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "0"\n')
    inv = inventory(ssh_env, tmp_path, [1], tmp_path)
    result = sync(ssh_env, inv, tmp_path)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "no uv.lock there" in result.err and "uv lock" in result.err


def test_a_library_from_a_local_path_is_refused_naming_it(
    ssh_env: SshdCluster, tmp_path: Path
) -> None:
    """Each host would build it from its own copy of the path, under a key that does not
    follow its content: refused before any host is asked."""
    lib = tmp_path / "mylib"
    (lib / "src" / "mylib").mkdir(parents=True)
    (lib / "src" / "mylib" / "__init__.py").write_text("VERSION = 1\n")
    (lib / "pyproject.toml").write_text(
        '[project]\nname = "mylib"\nversion = "0.1.0"\n[build-system]\n'
        'requires = ["hatchling"]\nbuild-backend = "hatchling.build"\n'
    )
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "0"\nrequires-python = ">=3.9"\n'
        'dependencies = ["mylib"]\n[tool.uv]\npackage = false\n'
        f'[tool.uv.sources]\nmylib = {{ path = "{lib}", editable = true }}\n'
    )
    env = {"UV_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "HOME": str(proj)}
    subprocess.run([UV, "lock", "--offline", "--quiet"], cwd=proj, env=env, check=True, timeout=120)
    inv = inventory(ssh_env, tmp_path, [1, 2], tmp_path)
    result = sync(ssh_env, inv, proj)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert f"the lock installs mylib (editable {lib}) from a local path" in result.err, result.err
    assert "git URL" in result.err and "--workdir" in result.err
    assert not any((envs_of(ssh_env, tmp_path, i)).parent.exists() for i in (1, 2))


RANK_SCRIPT = """
import json, os, sys
import numpy, six, torch
print(json.dumps({"rank": int(os.environ["RANK"]), "prefix": sys.prefix}), flush=True)
"""


def test_launch_sync_runs_every_rank_in_the_synced_env(
    ssh_env: SshdCluster,
    tmp_path: Path,
    uv_cache: Path,
    free_port: Callable[[], int],
    run_no_leak: Callable[..., None],
) -> None:
    deps = ["torch==2.13.0", "numpy==2.2.6", "six==1.17.0"]
    project = make_project(tmp_path / "proj", deps, uv_cache)
    inv = inventory(ssh_env, tmp_path, [1, 2, 3], uv_cache)
    doc = yaml.safe_load(inv.read_text())
    doc["rendezvous"] = {"port": free_port()}
    for entry in doc["hosts"]:
        entry["nproc"] = 1
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    script = tmp_path / "where.py"
    script.write_text(RANK_SCRIPT)
    args = ["launch", "--sync", project, "--ssh-config", ssh_env.ssh_config, inv, script]
    proc = subprocess.run(
        [*SSHDDP, *map(str, args)],
        cwd=tmp_path,
        env=cli_env(ssh_env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sshddp: sync: env " in proc.stderr and "on all 3 host(s)" in proc.stderr
    seen = {}
    for line in proc.stdout.splitlines():
        if '"prefix"' in line:
            record = json.loads(line[line.index("{") :])
            seen[record["rank"]] = Path(record["prefix"])
    assert sorted(seen) == [0, 1, 2], proc.stdout
    for rank, prefix in seen.items():
        assert prefix.parent == envs_of(ssh_env, tmp_path, rank + 1), prefix
    run_no_leak(run_id_of(proc.stderr))


def test_doctor_sync_checks_in_the_env_and_shows_the_same_hash_on_all(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path, free_port: Callable[[], int]
) -> None:
    deps = ["torch==2.13.0", "numpy==2.2.6", "six==1.17.0"]
    project = make_project(tmp_path / "proj", deps, uv_cache)
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache)
    doc = yaml.safe_load(inv.read_text())
    doc["rendezvous"] = {"port": free_port()}
    doc["defaults"]["sync"] = "proj"  # beside the inventory
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    doctor = ["doctor", "--ssh-config", str(ssh_env.ssh_config), str(inv)]

    before = sshddp(doctor)
    assert_clean_failure(before, ExitCode.CHECK_FAILED)
    assert "h1: no env " in before.err and "fix: `sshddp sync`" in before.err, before.explain()
    assert not envs_of(ssh_env, tmp_path, 1).exists()  # doctor builds nothing

    assert sync(ssh_env, inv, project).code == 0
    after = sshddp(doctor)
    assert after.code == 0, after.explain()
    hashes = {
        line.split(": ")[0]: line.split(" env ")[1].split()[0]
        for line in after.err.splitlines()
        if " env " in line and line.startswith("h")
    }
    assert set(hashes) == {"h1", "h2"} and len(set(hashes.values())) == 1, after.explain()


def test_old_envs_are_pruned_but_never_one_in_use(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    inv = inventory(ssh_env, tmp_path, [1], uv_cache)
    envs = envs_of(ssh_env, tmp_path, 1)
    made = []
    for n in range(KEEP_ENVS + 2):
        project = make_project(tmp_path / f"p{n}", ["six==1.17.0"], uv_cache, version=f"0.{n}")
        result = sync(ssh_env, inv, project)
        assert result.code == 0, result.explain()
        made.append(keys(result)["h1"])
        if n == 0:  # a run on the first environment holds it
            busy = subprocess.Popen(
                [envs / made[0] / "bin" / "python", "-c", "input()"], stdin=subprocess.PIPE
            )
    try:
        # the newest KEEP_ENVS stay, the one in use stays, the one between them went
        assert sorted(p.name for p in envs.iterdir()) == sorted([made[0], *made[-KEEP_ENVS:]])
    finally:
        busy.communicate(b"\n", timeout=30)
    project = make_project(tmp_path / "last", ["six==1.17.0"], uv_cache, version="1.0")
    last = sync(ssh_env, inv, project)
    assert last.code == 0, last.explain()
    assert sorted(p.name for p in envs.iterdir()) == sorted(
        [*made[-KEEP_ENVS + 1 :], keys(last)["h1"]]
    )


def test_ctrl_c_during_a_sync_leaves_nothing_a_later_sync_picks_up(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["six==1.17.0", "numpy==1.26.4"], uv_cache)
    inv = inventory(ssh_env, tmp_path, [1], uv_cache)
    envs = envs_of(ssh_env, tmp_path, 1)
    args = ["sync", "--ssh-config", ssh_env.ssh_config, inv, project]
    proc = subprocess.Popen(
        [*SSHDDP, *map(str, args)],
        env=cli_env(ssh_env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (envs.is_dir() and any(p.name.startswith(".build-") for p in envs.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == ExitCode.INTERRUPTED, err
    # whatever the host had done by then: no environment a run would use is half-built
    for path in envs.iterdir():
        aside = path.name.startswith((".build-", ".lock-"))  # a build, the lock it held
        assert aside or (path / "sshddp-env.json").is_file(), path
    again = sync(ssh_env, inv, project)
    assert again.code == 0, again.explain()
    key = keys(again)["h1"]
    out = subprocess.run([envs / key / "bin" / "python", "-c", "import numpy, six"])
    assert out.returncode == 0
    wait_for_no_builds = time.monotonic() + 60  # the interrupted one's process may still run
    while any(p.name.startswith(".build-") for p in envs.iterdir()):
        assert time.monotonic() < wait_for_no_builds, list(envs.iterdir())
        time.sleep(0.5)
        sync(ssh_env, inv, project)


def test_a_loose_requirements_file_gives_every_host_the_same_versions(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("--index-url file:///opt/pypi/simple\nsix\nnumpy<2.1\n")
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache)
    result = sync(ssh_env, inv, requirements)
    assert result.code == 0, result.explain()
    key = keys(result)["h1"]
    assert keys(result) == {"h1": key, "h2": key}
    code = "import numpy, six; print(numpy.__version__, six.__version__)"
    versions = set()
    for i in (1, 2):
        python = envs_of(ssh_env, tmp_path, i) / key / "bin" / "python"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        versions.add(out.stdout.strip())
    assert versions == {"2.0.2 1.17.0"}  # the newest under the bound, resolved once


def test_a_requirements_file_that_cannot_resolve_is_a_clear_error(
    ssh_env: SshdCluster, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("--index-url file:///opt/pypi/simple\nsix>=99\n")
    inv = inventory(ssh_env, tmp_path, [1], tmp_path)
    result = sync(ssh_env, inv, requirements)
    assert_clean_failure(result, ExitCode.BAD_INPUT)
    assert "uv could not resolve it" in result.err and "six" in result.err, result.explain()


def test_a_pylock_toml_gives_every_host_its_packages(
    ssh_env: SshdCluster, tmp_path: Path, uv_cache: Path
) -> None:
    project = make_project(tmp_path / "proj", ["numpy==2.0.2", "six==1.17.0"], uv_cache)
    env = {"UV_CACHE_DIR": str(uv_cache), "PATH": "/usr/bin:/bin", "HOME": str(project)}
    export = [UV, "export", "--quiet", "--format", "pylock.toml", "-o", "pylock.toml"]
    subprocess.run(export, cwd=project, env=env, check=True, timeout=120)
    alone = tmp_path / "locked"  # a directory with a pylock.toml and no uv.lock
    alone.mkdir()
    (alone / "pylock.toml").write_text((project / "pylock.toml").read_text())
    inv = inventory(ssh_env, tmp_path, [1, 2], uv_cache)
    result = sync(ssh_env, inv, project / "pylock.toml")
    assert result.code == 0, result.explain()
    key = keys(result)["h1"]
    assert keys(result) == {"h1": key, "h2": key}
    code = "import numpy, six, sys; print(numpy.__version__, six.__version__, sys.version_info[1])"
    for i in (1, 2):
        python = envs_of(ssh_env, tmp_path, i) / key / "bin" / "python"
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.split()[:2] == ["2.0.2", "1.17.0"]
        assert int(out.stdout.split()[2]) >= 11  # the lock's requires-python
    again = sync(ssh_env, inv, alone)
    assert again.code == 0 and keys(again) == keys(result), again.explain()  # the same lock
