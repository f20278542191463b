"""Any argv and env value reaches the remote process unchanged, on every step before exec.

Each test drives the real code of a step and decodes with the real code of the next one,
never with a re-implementation: the CLI's own parser, the plan, the ``--dry-run`` text
read back with ``shlex``, the executor's boot request decoded by the shipped bootstrap and
``boot.py`` (run in this process), the supervisor's exec of torchrun, and torchrun's own
argument parser and macro expansion. The values come from ``hostile_values`` (which says
what a value may be). The integration twin, ``tests/integration/test_hostile.py``, runs
real launches.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from fake_process import ScriptedOutput
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.distributed.elastic.utils.api import macros
from torch.distributed.run import config_from_args, parse_args

from cli_helpers import sshddp
from hostile_values import NASTY, argv_values, env_names, has_surrogate, yaml_values
from sshddp.hosts.pool import HostPool
from sshddp.hosts.session import HostSession
from sshddp.hosts.transport import SshOptions
from sshddp.model.envvars import MASK, SECRET_NAME_RE, parse_env_pairs
from sshddp.model.inventory import parse_inventory
from sshddp.model.plan import LaunchOptions, LaunchPlan, make_plan
from sshddp.protocol import compose, contract
from sshddp.protocol import session_messages as msgs
from sshddp.protocol.contract import Secrets
from sshddp.remote.importer import unpack
from sshddp.remote.node.supervisor import Supervisor
from sshddp.run.boot import Boot
from sshddp.run.payload import build_payload, code_spec
from sshddp.run.runstate import LaunchState
from sshddp.run.sinks import Console, NodeLogs
from sshddp.run.teardown import Teardown

SCRIPT_NAME = "train.py"
argv_lists = st.lists(argv_values, max_size=10)
yaml_envs = st.dictionaries(env_names, yaml_values, max_size=5)
option_envs = st.dictionaries(env_names, argv_values, max_size=4)


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("code") / SCRIPT_NAME
    path.write_text("print('hi')\n")
    return path


def inventory_text(env: Mapping[str, str], workdir: str = "~/.sshddp") -> str:
    """Two hosts (never contacted), written the way a user's YAML tool would."""
    doc = {
        "defaults": {"python": sys.executable, "nproc": 1, "workdir": workdir, "env": dict(env)},
        "hosts": [{"host": "a", "addr": "10.0.0.1"}, {"host": "b", "addr": "10.0.0.2"}],
    }
    # Escaped (the default): PyYAML's allow_unicode=True writes U+0085 raw, which YAML
    # itself folds to a space on reading; that is PyYAML's writer, not sshddp.
    return str(yaml.safe_dump(doc))


def worker_argv(torchrun: list[str]) -> list[str]:
    """What torchrun execs for local rank 0, decoded by torchrun's own code: the python, the
    rank shim (which runs the script as `python SCRIPT ARGS` would), the script, its args.
    ``torchrun``: as planned (``-m torch.distributed.run``) or as the supervisor runs it
    (through the run directory's agent shim, which runs that module)."""
    if torchrun[1] == "-m":
        assert torchrun[2] == "torch.distributed.run", torchrun
        options = torchrun[3:]
    else:
        assert os.path.basename(torchrun[1]) == contract.AGENT_SHIM, torchrun
        options = torchrun[2:]
    with mock.patch.dict(os.environ):  # config_from_args may set OMP_NUM_THREADS
        _, cmd, cmd_args = config_from_args(parse_args(options))
    return [str(cmd), *macros.substitute(cmd_args, "0")]


# ------------------------------------------------------------------ inventory and --env


@given(env=yaml_envs)
@example(env={f"N{i}": v for i, v in enumerate(NASTY) if not has_surrogate(v)})
def test_inventory_env_values_are_read_back_exactly(env: dict[str, str]) -> None:
    inventory = parse_inventory(inventory_text(env), source="inv.yaml")
    assert all(dict(h.env) == env for h in inventory.hosts)


@given(name=env_names, value=argv_values)
def test_env_option_keeps_the_value(name: str, value: str) -> None:
    pairs, secrets = parse_env_pairs((f"{name}={value}", name), {name: value}.get)
    assert pairs == ((name, value), (name, value))
    assert secrets == {name}


# ------------------------------------------------------------------ --dry-run


def shell_words(text: str) -> tuple[list[str], str]:
    """The shell words of ``text`` up to its first unquoted newline, and the text after it."""
    lines = text.split("\n")
    for k in range(1, len(lines) + 1):
        try:
            return shlex.split("\n".join(lines[:k])), "\n".join(lines[k:])
        except ValueError:  # a quote is still open: the newline belongs to a value
            continue
    raise AssertionError(f"unbalanced quoting in {text!r}")


def dry_run_nodes(out: str) -> list[tuple[dict[str, str], list[str]]]:
    """(env, command argv) of every node block of ``--dry-run`` output, read as a shell would."""
    nodes = []
    rest = out[out.index("\n\nnode 0: ") + 1 :]  # the lines before hold no user value
    while rest:
        assert rest.startswith(f"\nnode {len(nodes)}: "), rest
        rest = rest[rest.index("\n  env:     ") + len("\n  env:     ") :]
        words, rest = shell_words(rest)
        env = {} if words == ["-"] else dict(w.split("=", 1) for w in words)  # type: ignore[misc]
        assert rest.startswith("  command: "), rest
        command, rest = shell_words(rest[len("  command: ") :])
        nodes.append((env, command))
    return nodes


@settings(deadline=None)
@given(args=argv_lists, inv_env=yaml_envs, opt_env=option_envs)
@example(args=list(NASTY), inv_env={"PLAIN": "a b\nc", "HF_TOKEN": "t$x"}, opt_env={"K": "'"})
def test_dry_run_prints_what_runs_shell_quoted_with_secrets_masked(
    script: Path, args: list[str], inv_env: dict[str, str], opt_env: dict[str, str]
) -> None:
    secrets = {k: f"S3CR3T-{i}-{v}" for i, (k, v) in enumerate(opt_env.items())}
    with tempfile.TemporaryDirectory() as tmp:
        inv = Path(tmp) / "inv.yaml"
        inv.write_text(inventory_text(inv_env), encoding="utf-8")
        # Half the --env values come from the local environment (`--env NAME`).
        opts = [
            x
            for i, (k, v) in enumerate(secrets.items())
            for x in ("--env", k if i % 2 else f"{k}={v}")
        ]
        result = sshddp(["launch", "--dry-run", *opts, inv, script, *args], environ=secrets)
    assert result.code == 0, result.explain()
    shown = {**inv_env, **secrets}
    masked = {k for k in shown if k in secrets or SECRET_NAME_RE.search(k)}
    expected_env = {k: MASK if k in masked else v for k, v in shown.items()}
    nodes = dry_run_nodes(result.out)
    # sshddp adds NODE_RANK (torchrun leaves it unset; Lightning reads it).
    assert [env for env, _ in nodes] == [{**expected_env, "NODE_RANK": str(r)} for r in (0, 1)]
    for rank, (_, command) in enumerate(nodes):
        assert command[command.index("--node-rank") + 1] == str(rank)
        python, shim, *rest = worker_argv(command)
        assert python == sys.executable and shim.endswith(f"/n{rank}/rank.py")
        assert rest == [SCRIPT_NAME, *args]
    assert not any(v in result.text for v in secrets.values())


# ------------------------------------------------------------------ boot and supervisor


@contextlib.contextmanager
def saved_process_state() -> Iterator[None]:
    """The remote scripts set the umask and signal handlers of the process they run in."""
    umask = os.umask(0o022)
    os.umask(umask)
    handlers = {
        s: signal.getsignal(s)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP)
    }
    try:
        yield
    finally:
        os.umask(umask)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def shipped_modules_only() -> Iterator[None]:
    """The host-side modules as a host gets them: the shipped sources, not the ones this
    process imported already; the import system is put back as it was after."""
    saved = {k: v for k, v in sys.modules.items() if k.startswith("sshddp.remote.")}
    meta_path = list(sys.meta_path)
    for name in saved:
        del sys.modules[name]
    try:
        yield
    finally:
        for name in [k for k in sys.modules if k.startswith("sshddp.remote.")]:
            del sys.modules[name]
        sys.modules.update(saved)
        sys.meta_path[:] = meta_path


def _fork_started(rundir: str) -> Callable[[], int]:
    """Stands in for the fork of the detached supervisor ``boot.py`` starts: the parent's
    side of it, with the node recorded as running."""

    def fork() -> int:
        Path(rundir, "state.json").write_text(json.dumps({"state": "running", "started": 0}))
        return 2**22 + 1  # a child pid the parent never waits for

    return fork


class _InProcessCommand(ScriptedOutput):
    """A host command whose shipped bootstrap runs in this process once it is read from.

    By then the coordinator has sent the launch session its header, the go line and the
    code; with the start line it sends next, the session runs start to end: stage, start,
    then (replaced here, as there is no run to follow) the log follower."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.stdin = b""
        self.ran = False

    def write(self, data: bytes) -> None:
        if not self.ran:  # the start line, once run, is already in
            self.stdin += data

    def close_stdin(self) -> None:
        pass

    def _run(self) -> bytes:
        exec_, env, run_id, python, dash_c, bootstrap, label = shlex.split(self.command)  # as sh
        assert (exec_, env, python, dash_c) == ("exec", "env", sys.executable, "-c")
        assert run_id.startswith("SSHDDP_RUN_ID=") and "/runs/" in label
        header, _, rest = self.stdin.partition(b"\n")
        body = json.loads(header)
        size = body.pop("packed")  # the modules follow the header line, packed
        body["modules"] = unpack(io.BytesIO(rest[:size]), size)
        rest = rest[size:]
        rundir = os.path.expanduser(json.loads(rest.partition(b"\n")[0])["boot"]["rundir"])
        assert body["main"] == "sshddp.remote.node.host_session"
        body["modules"]["sshddp.remote.node.host_follow"] += (
            "\n\ndef main(args):\n    return None\n"
        )
        # The start line the coordinator sends once every node staged comes at the end.
        stdin = json.dumps(body).encode() + b"\n" + rest + msgs.encode(msgs.start(True))
        fake_stdin = mock.Mock(buffer=io.BytesIO(stdin))
        out = io.StringIO()
        with (
            mock.patch.object(sys, "stdin", fake_stdin),
            mock.patch.object(sys, "stdout", out),
            mock.patch("os.fork", _fork_started(rundir)),
            shipped_modules_only(),
        ):
            exec(bootstrap, {"__name__": "__main__"})
        return out.getvalue().encode()

    def read(self, n: int = 65536) -> bytes:
        if not self.ran:  # the first read: the header, the go and the code are in
            self.ran = True
            self.out = self._run()
        return super().read(n)


class _InProcessHost:
    def __init__(self, host: Any) -> None:
        self.host = host
        self.label = host.host

    def start(self, command: str) -> _InProcessCommand:
        return _InProcessCommand(command)

    def close(self) -> None:
        pass


def boot_in_process(plan: LaunchPlan, script: Path, logs: Path) -> None:
    """The executor's real boot of every node, each host's side run here, one at a time."""
    pool = HostPool([], SshOptions(), fanout=1)
    pool.transports = {n.host.index: _InProcessHost(n.host) for n in plan.nodes}  # type: ignore[misc]
    state = LaunchState(plan, pool, NodeLogs(logs), Console(io.BytesIO(), False))
    state.sessions = {
        n.host.index: HostSession(pool.transports[n.host.index], plan.run_id, n.rundir, None)
        for n in plan.nodes
    }
    with saved_process_state():
        assert Boot(state, build_payload(plan.code)).run(Teardown(state))
    assert all(r.state.value == "running" for r in state.results.values())


def supervisor_exec(rundir: str, secrets: Secrets) -> tuple[list[str], dict[str, str]]:
    """The argv and environment the real supervisor starts torchrun with."""
    started: dict[str, Any] = {}

    def popen(argv: list[str], **kwargs: Any) -> Any:
        started.update(argv=argv, env=kwargs["env"])
        return mock.Mock(pid=os.getpid())

    supervisor = Supervisor(rundir, secrets=secrets)
    with saved_process_state(), mock.patch("subprocess.Popen", popen):
        assert supervisor.start()
    assert supervisor.output is not None and supervisor.sampler is not None
    supervisor.sampler.stop()  # (the node never ends here: its samples stop with the test)
    supervisor.output.close()
    return started["argv"], started["env"]


@settings(deadline=None)
@given(args=argv_lists, inv_env=yaml_envs, opt_env=option_envs)
@example(args=list(NASTY), inv_env={"N": "\r\n", "M": "$$"}, opt_env={"N": "\udc80;`id`"})
def test_values_reach_torchrun_workers_through_boot_and_supervisor(
    script: Path, args: list[str], inv_env: dict[str, str], opt_env: dict[str, str]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        inventory = parse_inventory(inventory_text(inv_env, workdir=f"{tmp}/w"), source="inv")
        options = LaunchOptions(
            script=str(script), script_args=tuple(args), env=tuple(opt_env.items())
        )
        plan = make_plan(inventory, options, "hx1", code_spec(options), lambda h: str(h.addr))
        boot_in_process(plan, script, Path(tmp, "logs"))
        expected_env = {**inv_env, **opt_env}
        for node in plan.nodes:
            spec = json.loads(Path(node.rundir, "spec.json").read_text())
            planned = plan.spec(node)
            assert (spec["program"], spec["torchrun"]) == (planned["program"], planned["torchrun"])
            assert dict(node.env) == {**expected_env, "NODE_RANK": str(node.node_rank)}
            assert Path(node.rundir, "code", SCRIPT_NAME).read_bytes() == script.read_bytes()
            argv, env = supervisor_exec(node.rundir, {"env": dict(node.env), "peer_key": None})
            shim = os.path.join(node.rundir, "rank.py")
            assert worker_argv(argv) == [sys.executable, shim, SCRIPT_NAME, *args]
            assert argv == compose.node_argv(planned, sys.executable, node.rundir)
            assert {k: env[k] for k in expected_env} == expected_env
            assert env["SSHDDP_RUN_ID"] == "hx1"
            assert not Path(node.rundir, "env.json").exists()
