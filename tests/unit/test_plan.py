"""Pure planning: ranks, torchrun argv, env, the --dry-run text, and what code is shipped."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from string import Template
from typing import Optional

import pytest

from sshddp.errors import ExitCode, UsageError
from sshddp.model.commands import endpoint
from sshddp.model.envvars import MASK, parse_env_pairs
from sshddp.model.inventory import Host, Inventory, parse_inventory
from sshddp.model.plan import (
    CodeSpec,
    LaunchOptions,
    LaunchPlan,
    describe,
    make_plan,
    new_run_id,
    run_dir,
    validate_options,
)
from sshddp.run.payload import build_payload, code_spec, shipped_files
from sshddp.run.registry import RunRecord, record_json, record_of

THREE_HOSTS = """\
defaults:
  python: /opt/venv/bin/python
  workdir: /scratch/sshddp
  env: {NCCL_DEBUG: WARN, WANDB_API_KEY: k-123456, HF_TOKEN: hf_abcdef}
rendezvous: {port: 29400}
hosts:
  - {host: gpu-a, nproc: 2, addr: 10.0.0.1}
  - {host: gpu-b, nproc: 2, env: {NCCL_DEBUG: INFO}}
  - {host: gpu-c, nproc: 2, python: /usr/bin/python3, workdir: ~/work}
"""
SCRIPT = CodeSpec("file", "train.py", "/home/me/train.py")
ADDRS = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}


def inventory(text: str = THREE_HOSTS) -> Inventory:
    return parse_inventory(text, source="inv.yaml")


def addr_of(host: Host) -> str:
    return host.addr or ADDRS.get(host.host, "10.0.0.9")


def plan_of(
    options: Optional[LaunchOptions] = None,
    text: str = THREE_HOSTS,
    code: CodeSpec = SCRIPT,
    secrets: frozenset[str] = frozenset(),
    run_id: str = "run42",
) -> LaunchPlan:
    opts = options or LaunchOptions(script="train.py")
    return make_plan(inventory(text), opts, run_id, code, addr_of, secrets)


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value after ``name`` in ``argv`` (which must hold it exactly once)."""
    assert argv.count(name) == 1, argv
    return argv[argv.index(name) + 1]


# ----------------------------------------------------------------- ranks and argv


def test_three_hosts_get_node_ranks_and_first_ranks() -> None:
    plan = plan_of()
    assert [n.node_rank for n in plan.nodes] == [0, 1, 2]
    assert [n.host.host for n in plan.nodes] == ["gpu-a", "gpu-b", "gpu-c"]
    assert [n.nproc for n in plan.nodes] == [2, 2, 2]
    assert [n.first_rank for n in plan.nodes] == [0, 2, 4]
    assert plan.world_size == 6
    assert (plan.rdzv_addr, plan.rdzv_port) == ("10.0.0.1", 29400)


def test_torchrun_argv_of_every_node() -> None:
    plan = plan_of()
    for node in plan.nodes:
        argv = plan.argv(node)
        assert argv[:2] == (node.host.python, f"{node.rundir}/agent.py")
        assert flag(argv, "--nnodes") == "3"
        assert flag(argv, "--node-rank") == str(node.node_rank)
        assert flag(argv, "--nproc-per-node") == "2"
        assert flag(argv, "--rdzv-backend") == "static"
        assert flag(argv, "--rdzv-endpoint") == "10.0.0.1:29400"
        assert flag(argv, "--rdzv-id") == "run42"
        assert argv[-1] == "train.py"
    assert plan.argv(plan.nodes[2])[0] == "/usr/bin/python3"


def test_nproc_per_node_overrides_every_host() -> None:
    plan = plan_of(LaunchOptions(script="train.py", nproc_per_node=3))
    assert [n.nproc for n in plan.nodes] == [3, 3, 3]
    assert [n.first_rank for n in plan.nodes] == [0, 3, 6]
    assert plan.world_size == 9
    assert all(flag(plan.argv(n), "--nproc-per-node") == "3" for n in plan.nodes)


def test_heterogeneous_hosts() -> None:
    text = """\
hosts:
  - {host: big, gpus: 8}
  - {host: small, gpus: 2}
  - {host: cpu, nproc: 3}
  - {host: tiny}
"""
    plan = make_plan(
        inventory(text), LaunchOptions(script="t.py"), "r1", SCRIPT, lambda h: "10.9.9.9"
    )
    assert [n.nproc for n in plan.nodes] == [8, 2, 3, 1]
    assert [n.first_rank for n in plan.nodes] == [0, 8, 10, 13]
    assert plan.world_size == 14
    again = record_of(record_json(RunRecord.of(plan, "inv.yaml", None))).layout()
    assert [n.first_rank for n in again.nodes] == [0, 8, 10, 13]  # attach and logs name ranks
    assert [flag(plan.argv(n), "--nproc-per-node") for n in plan.nodes] == ["8", "2", "3", "1"]
    assert flag(plan.argv(plan.nodes[0]), "--rdzv-endpoint") == "10.9.9.9:29500"


def test_rendezvous_host_and_port_options() -> None:
    text = "rendezvous: {host: 10.1.1.1, port: 1234}\nhosts: [a, b]\n"
    plan = plan_of(LaunchOptions(script="t.py", port=4321), text=text)
    assert flag(plan.argv(plan.nodes[1]), "--rdzv-endpoint") == "10.1.1.1:4321"
    assert plan.rdzv_port == 4321


WEIRD_ARGS = (
    "--lr",
    "3e-4",
    "two words",
    'it\'s "quoted"',
    "$(touch /tmp/pwned)",
    "`id`; rm -rf ~",
    "line1\nline2",
    "naïve ☃ 日本",
    "",
    "--",
    "-m",
)


def test_script_args_follow_the_script_verbatim() -> None:
    plan = plan_of(LaunchOptions(script="train.py", script_args=WEIRD_ARGS))
    assert plan.script_args == WEIRD_ARGS
    for node in plan.nodes:
        argv = plan.argv(node)
        i = argv.index("train.py")
        # torchrun expands `$` templates in the script's arguments: each `$` goes doubled.
        assert argv[i + 1 :] == tuple(a.replace("$", "$$") for a in WEIRD_ARGS)
        assert [Template(a).safe_substitute(local_rank=0) for a in argv[i + 1 :]] == list(
            WEIRD_ARGS
        )
        assert "--node-rank" in argv[:i]


def test_module_runs_with_dash_m() -> None:
    code = CodeSpec("none", "pkg.train")
    plan = plan_of(LaunchOptions(module="pkg.train", script_args=("--x", "1")), code=code)
    for node in plan.nodes:
        assert plan.argv(node)[-4:] == ("-m", "pkg.train", "--x", "1")
        assert plan.argv(node)[-6:-4] == (node.host.python, f"{node.rundir}/rank.py")
        assert node.cwd == "~"


def test_env_merge_order_inventory_then_env_option() -> None:
    pairs, secrets = parse_env_pairs(("NCCL_DEBUG=TRACE", "EXTRA=1"), {}.get)
    plan = plan_of(LaunchOptions(script="t.py", env=pairs), secrets=secrets)
    a, b, c = (dict(n.env) for n in plan.nodes)
    assert a["NCCL_DEBUG"] == "TRACE" and b["NCCL_DEBUG"] == "TRACE"
    assert a["EXTRA"] == "1"
    assert a["WANDB_API_KEY"] == "k-123456"
    plain = plan_of()
    assert dict(plain.nodes[0].env)["NCCL_DEBUG"] == "WARN"  # defaults
    assert dict(plain.nodes[1].env)["NCCL_DEBUG"] == "INFO"  # the host's own wins
    assert c == {**a, "NODE_RANK": "2"}  # same inventory env on gpu-c, same --env


def test_ranks_draw_rich_live_displays_when_the_console_is_a_terminal() -> None:
    """Lightning's RichProgressBar redraws over the ranks' pipe only when told it may; the
    user's own setting (inventory or --env) wins."""
    assert "TTY_COMPATIBLE" not in plan_of().nodes[0].env  # piped: rich prints final frames
    live = plan_of(LaunchOptions(script="t.py", live=True)).nodes[0].env
    assert live["TTY_COMPATIBLE"] == live["TTY_INTERACTIVE"] == "1"
    pairs, _ = parse_env_pairs(("TTY_COMPATIBLE=0",), {}.get)
    mine = plan_of(LaunchOptions(script="t.py", live=True, env=pairs)).nodes[0].env
    assert mine["TTY_COMPATIBLE"] == "0"


def test_node_env_is_read_only() -> None:
    node = plan_of().nodes[0]
    with pytest.raises(TypeError):
        node.env["X"] = "1"  # type: ignore[index]


def test_run_dir_per_node() -> None:
    plan = plan_of()
    assert [n.rundir for n in plan.nodes] == [
        "/scratch/sshddp/runs/run42/n0",
        "/scratch/sshddp/runs/run42/n1",
        "~/work/runs/run42/n2",
    ]
    assert [n.cwd for n in plan.nodes] == [f"{n.rundir}/code" for n in plan.nodes]
    assert plan.mark(plan.nodes[1]).startswith("run42/n1/")
    assert plan.spec(plan.nodes[1])["mark"] == plan.mark(plan.nodes[1])
    assert run_dir("/w/", "r", 3) == "/w/runs/r/n3"
    assert plan.log_dir == "sshddp-logs/run42"


@pytest.mark.parametrize(
    ("addr", "port", "expected"),
    [
        ("10.0.0.1", 29500, "10.0.0.1:29500"),
        ("gpu-a", 1, "gpu-a:1"),
        ("fd00::1", 29500, "[fd00::1]:29500"),
        ("::1", 80, "[::1]:80"),
        ("[fd00::2]", 29500, "[fd00::2]:29500"),
    ],
)
def test_endpoint(addr: str, port: int, expected: str) -> None:
    assert endpoint(addr, port) == expected


def test_ipv6_rendezvous_endpoint_in_argv() -> None:
    text = "hosts:\n  - {host: a, addr: 'fd00::1'}\n  - b\n"
    plan = plan_of(text=text)
    assert flag(plan.argv(plan.nodes[1]), "--rdzv-endpoint") == "[fd00::1]:29500"
    assert "rendezvous:  [fd00::1]:29500" in describe(plan)


# ----------------------------------------------------------------- --dry-run text


def test_describe_is_stable_and_complete() -> None:
    pairs, secrets = parse_env_pairs(("SECRET_SAUCE=hunter2", "LR=0.0042"), {}.get)
    options = LaunchOptions(script="train.py", env=pairs, script_args=("--epochs", "3"))
    first = describe(plan_of(options, secrets=secrets))
    again = describe(plan_of(options, secrets=secrets))
    assert first == again
    lines = first.splitlines()
    assert lines[:5] == [
        "run id:      run42",
        "rendezvous:  10.0.0.1:29400 (static, node 0 hosts it)",
        "world size:  6 processes on 3 nodes",
        "code:        file /home/me/train.py",
        "logs:        sshddp-logs/run42/",
    ]
    assert "node 0: gpu-a  (global ranks 0-1)" in lines
    assert "node 2: gpu-c  (global ranks 4-5)" in lines
    assert "  run dir: /scratch/sshddp/runs/run42/n1" in lines
    command = next(line for line in lines if line.startswith("  command: /usr/bin/python3"))
    assert command.startswith(
        "  command: /usr/bin/python3 '~/work/runs/run42/n2/agent.py' --nnodes 3 --node-rank 2 "
        "--nproc-per-node 2 --rdzv-backend static --rdzv-endpoint 10.0.0.1:29400 "
        "--rdzv-id run42 --max-restarts 0 "
    )
    assert command.endswith(" train.py --epochs 3")
    assert first.endswith("\n")


def test_describe_masks_env_option_values_and_secret_names() -> None:
    pairs, secrets = parse_env_pairs(("SECRET_SAUCE=hunter2", "LR=0.0042"), {}.get)
    text = describe(plan_of(LaunchOptions(script="t.py", env=pairs), secrets=secrets))
    for secret in ("hunter2", "0.0042", "k-123456", "hf_abcdef"):
        assert secret not in text, secret
    env_lines = [line for line in text.splitlines() if line.startswith("  env:")]
    assert len(env_lines) == 3
    for line in env_lines:
        assert f"SECRET_SAUCE={MASK}" in line
        assert f"LR={MASK}" in line  # every --env value is treated as a secret
        assert f"WANDB_API_KEY={MASK}" in line
        assert f"HF_TOKEN={MASK}" in line
    assert "NCCL_DEBUG=WARN" in env_lines[0]  # plain inventory values are shown
    assert "NCCL_DEBUG=INFO" in env_lines[1]


def test_describe_quotes_values_and_args_for_the_shell() -> None:
    text = "hosts:\n  - {host: a, env: {MSG: 'two words'}}\n"
    out = describe(plan_of(LaunchOptions(script="t.py", script_args=("a b", "$(x)")), text=text))
    assert "MSG='two words'" in out
    assert "train.py 'a b' '$$(x)'" in out  # exactly what torchrun gets (it halves `$$`)


def test_describe_without_env() -> None:
    out = describe(plan_of(text="hosts: [a]\n"))
    assert "  env:     NODE_RANK=0" in out.splitlines()  # sshddp's own, nothing else


# ----------------------------------------------------------------- --env parsing


def test_parse_env_pairs() -> None:
    local = {"HOME_TOKEN": "from-here", "EMPTY": ""}
    pairs, secrets = parse_env_pairs(("A=1", "B=x=y", "C=", "HOME_TOKEN", "EMPTY"), local.get)
    assert pairs == (
        ("A", "1"),
        ("B", "x=y"),
        ("C", ""),
        ("HOME_TOKEN", "from-here"),
        ("EMPTY", ""),
    )
    assert secrets == frozenset({"A", "B", "C", "HOME_TOKEN", "EMPTY"})


@pytest.mark.parametrize("item", ["1A=x", "A-B=1", "=1", "A B=1", "", "Ä=1", "A;B=1"])
def test_parse_env_pairs_rejects_bad_names(item: str) -> None:
    with pytest.raises(UsageError) as err:
        parse_env_pairs((item,), {}.get)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert "KEY=VALUE" in err.value.message


def test_parse_env_name_not_set_locally() -> None:
    with pytest.raises(UsageError, match="MISSING is not set locally"):
        parse_env_pairs(("MISSING",), {}.get)


def test_parse_env_error_does_not_echo_the_value() -> None:
    with pytest.raises(UsageError) as err:
        parse_env_pairs(("BAD-NAME=hunter2",), {}.get)
    assert "hunter2" not in err.value.message


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("options", "run_id", "needle"),
    [
        (LaunchOptions(script="t.py"), "bad name", "--name 'bad name'"),
        (LaunchOptions(script="t.py"), "-rf", "--name '-rf'"),
        (LaunchOptions(script="t.py"), "../x", "--name '../x'"),
        (LaunchOptions(script="t.py"), "", "--name ''"),
        (LaunchOptions(script="t.py"), "x" * 65, "--name"),
        (LaunchOptions(script="t.py"), "run1\n", "--name 'run1\\n'"),  # $ matches before \n
        (LaunchOptions(script="t.py"), "y" * 300, "(300 characters)"),
        (LaunchOptions(script="t.py", port=0), "ok", "--port 0"),
        (LaunchOptions(script="t.py", port=65536), "ok", "--port 65536"),
        (LaunchOptions(script="t.py", port=65535), "ok", "port + 1"),  # the peers' port
        (LaunchOptions(script="t.py", heartbeat_timeout=0), "ok", "--heartbeat-timeout"),
        (LaunchOptions(script="t.py", nproc_per_node=0), "ok", "--nproc-per-node 0"),
        (LaunchOptions(script="t.py", nproc_per_node=-2), "ok", "--nproc-per-node -2"),
        (LaunchOptions(script="t.py", grace=-1.0), "ok", "--grace"),
    ],
)
def test_validate_options_rejects(options: LaunchOptions, run_id: str, needle: str) -> None:
    with pytest.raises(UsageError) as err:
        validate_options(options, run_id)
    assert needle in err.value.message
    with pytest.raises(UsageError):
        make_plan(inventory(), options, run_id, SCRIPT, addr_of)


@pytest.mark.parametrize("run_id", ["a", "run-1", "R_2.b", "x" * 64])
def test_validate_options_accepts(run_id: str) -> None:
    validate_options(LaunchOptions(script="t.py", port=65534, nproc_per_node=1), run_id)


def test_node_marks_are_unique_per_launch_even_for_the_same_name_and_workdir() -> None:
    """Teardown finds a node's processes by its mark: two launches of one name (two
    laptops, or a name reused in another workdir) must never share one."""
    first, second = plan_of(), plan_of()
    marks = {first.mark(n) for n in first.nodes} | {second.mark(n) for n in second.nodes}
    assert len(marks) == 2 * len(first.nodes)
    assert all("\0" not in m and "=" not in m for m in marks)


def test_inventory_rendezvous_port_leaves_room_for_the_peer_port() -> None:
    """A run also listens on port + 1 (the supervisors' peer port)."""
    assert plan_of(text="rendezvous: {port: 65534}\nhosts: [a]\n").peer_port == 65535
    with pytest.raises(UsageError) as err:
        plan_of(text="rendezvous: {port: 65535}\nhosts: [a]\n")
    assert "65535" in err.value.message and "65534" in err.value.message
    assert "inv.yaml" in err.value.message


def test_new_run_ids_are_valid_and_distinct() -> None:
    ids = {new_run_id() for _ in range(50)}
    assert len(ids) == 50
    for run_id in ids:
        validate_options(LaunchOptions(script="t.py"), run_id)


# ----------------------------------------------------------------- code to ship


def test_local_script_is_a_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code = code_spec(LaunchOptions(script=str(script)))
    assert code == CodeSpec("file", "train.py", str(script), str(tmp_path.resolve()))
    payload = build_payload(code)
    data = payload.read_all()
    assert (payload.kind, payload.name, data) == ("file", "train.py", b"print('hi')\n")
    assert payload.sha256 == hashlib.sha256(b"print('hi')\n").hexdigest()
    assert payload.header()["size"] == len(data)


def test_missing_script_is_taken_as_a_path_on_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert code_spec(LaunchOptions(script="code/train.py")) == CodeSpec("remote", "code/train.py")
    assert code_spec(LaunchOptions(script="~/code/t.py")) == CodeSpec("remote", "code/t.py")
    assert code_spec(LaunchOptions(script="/srv/t.py")) == CodeSpec("remote", "/srv/t.py")
    payload = build_payload(CodeSpec("remote", "code/train.py"))
    assert (payload.kind, payload.read_all()) == ("none", b"")


def test_module_without_workdir_ships_nothing() -> None:
    assert code_spec(LaunchOptions(module="pkg.train")) == CodeSpec("none", "pkg.train")


def test_directory_as_script_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        code_spec(LaunchOptions(script=str(tmp_path)))


def make_project(root: Path) -> None:
    files = {
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "W = 1\n",
        "pkg/local.txt": "per-directory ignore\n",
        "pkg/.gitignore": "local.txt\n",
        "data/big.bin": "x" * 1000,
        "ckpt/last.ckpt": "weights",
        "model.ckpt": "weights",
        "keep.ckpt": "kept by a negation",
        "__pycache__/train.cpython-311.pyc": "bytecode",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".git/objects/ab/cdef": "blob",
        ".gitignore": "data/\n*.ckpt\n!keep.ckpt\n__pycache__/\n",
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


SHIPPED = [
    ".gitignore",
    "keep.ckpt",
    "train.py",
    "pkg/.gitignore",
    "pkg/__init__.py",
    "pkg/model.py",
]


def test_shipped_files_honour_gitignore(tmp_path: Path) -> None:
    make_project(tmp_path)
    assert sorted(shipped_files(tmp_path)) == sorted(SHIPPED)


def test_workdir_payload_is_a_tar_of_the_shipped_files(tmp_path: Path) -> None:
    root = tmp_path / "proj"
    make_project(root)
    code = code_spec(LaunchOptions(script=str(root / "train.py"), workdir=str(root)))
    assert code == CodeSpec("tar", "train.py", str(root), str(root))
    payload = build_payload(code)
    assert payload.kind == "tar"
    data = payload.read_all()
    assert payload.sha256 == hashlib.sha256(data).hexdigest()
    assert payload.disk_bytes == sum(len((root / f).read_bytes()) for f in SHIPPED)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == sorted(SHIPPED)
        model = tar.extractfile(members["pkg/model.py"])
        assert model is not None and model.read() == b"W = 1\n"
        assert {(m.uid, m.gid, m.uname) for m in members.values()} == {(0, 0, "")}


def test_workdir_relative_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_project(tmp_path / "proj")
    monkeypatch.chdir(tmp_path)
    assert code_spec(LaunchOptions(script="proj/train.py", workdir="proj")).target == "train.py"
    assert code_spec(LaunchOptions(script="pkg/model.py", workdir="proj")).target == "pkg/model.py"
    monkeypatch.chdir(tmp_path / "proj")
    assert code_spec(LaunchOptions(script="train.py", workdir=".")).target == "train.py"


def test_workdir_with_module(tmp_path: Path) -> None:
    make_project(tmp_path)
    code = code_spec(LaunchOptions(module="pkg.model", workdir=str(tmp_path)))
    assert code == CodeSpec("tar", "pkg.model", str(tmp_path), str(tmp_path))
    plan = plan_of(LaunchOptions(module="pkg.model"), code=code)
    assert plan.argv(plan.nodes[0])[-2:] == ("-m", "pkg.model")
    assert plan.nodes[0].cwd == plan.nodes[0].workspace
    assert plan.nodes[0].cwd.startswith(f"/scratch/sshddp/work/{tmp_path.name}-")


def test_workdir_errors(tmp_path: Path) -> None:
    make_project(tmp_path)
    with pytest.raises(UsageError, match="not a local directory"):
        code_spec(LaunchOptions(script="t.py", workdir=str(tmp_path / "nope")))
    with pytest.raises(UsageError, match="not a file inside --workdir"):
        code_spec(LaunchOptions(script="missing.py", workdir=str(tmp_path)))


def test_workdir_and_script_mixing_absolute_and_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_project(tmp_path / "proj")
    (tmp_path / "outside.py").write_text("")
    monkeypatch.chdir(tmp_path)
    absolute = str(tmp_path / "proj")
    assert code_spec(LaunchOptions(script="proj/train.py", workdir=absolute)).target == "train.py"
    script = str(tmp_path / "proj" / "pkg" / "model.py")
    assert code_spec(LaunchOptions(script=script, workdir="proj")).target == "pkg/model.py"
    for outside in ("outside.py", str(tmp_path / "outside.py"), "proj/../outside.py"):
        with pytest.raises(UsageError, match="not a file inside --workdir"):
            code_spec(LaunchOptions(script=outside, workdir="proj"))


def test_a_run_ends_with_its_caller_only_when_the_api_asks() -> None:
    """The Python API's runs are bound to their caller's sessions; the CLI's outlive it."""
    from sshddp.run.boot import _bound_to

    cli = plan_of()
    api = plan_of(LaunchOptions(script="train.py", end_with_caller=True))
    assert not cli.end_with_caller and api.end_with_caller
    assert [_bound_to(n, cli) for n in cli.nodes] == [None] * 3
    assert [_bound_to(n, api) for n in api.nodes] == ["caller"] * 3
