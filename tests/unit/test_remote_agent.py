"""The agent shim (remote/rankside/agent.py), in-process: the failure summary names the script, the
exit code is the interpreter's, and waiting for node 0's store."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import pytest

from sshddp.remote.rankside.agent import await_store, exit_code, program_name, store_endpoint


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["/r/n1/rank.py", "train.py", "--lr", "1"], "train.py"),
        (["/r/n1/rank.py", "-m", "pkg.train", "x"], "pkg.train"),
        (["/r/n1/rank.py", "cost$$.py"], "cost$.py"),  # as the script got it
        (["/r/n1/rank.py"], "/r/n1/rank.py"),  # nothing after the shim: left as it is
        (["train.py", "rank.py"], "train.py"),  # the program is not the shim
    ],
)
def test_torchruns_summary_names_the_script_the_rank_shim_runs(args: list[str], name: str) -> None:
    torchruns = next(arg for arg in args if not arg.startswith("-"))  # its rule, for python
    assert program_name(torchruns, list(args)) == name


def test_exit_code_is_the_interpreters(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(SystemExit()) == 0
    assert exit_code(SystemExit(None)) == 0
    assert exit_code(SystemExit(3)) == 3
    assert exit_code(SystemExit(256 + 7)) == 7
    assert capsys.readouterr().err == ""
    assert exit_code(SystemExit("torchrun: bad")) == 1
    assert capsys.readouterr().err == "torchrun: bad\n"


# ------------------------------------------------------------- node 0's store first


STATIC_1 = "--node-rank 1 --rdzv-backend static"


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (f"{STATIC_1} --rdzv-endpoint 10.0.0.1:29500", ("10.0.0.1", 29500)),
        ("--node_rank=2 --rdzv_backend=static --rdzv_endpoint=h1:7", ("h1", 7)),
        (f"{STATIC_1} --rdzv-endpoint [fd00::1]:29500", ("fd00::1", 29500)),
        # node 0 serves the store; another backend is torchrun's own business
        ("--node-rank 0 --rdzv-backend static --rdzv-endpoint h1:7", None),
        ("--node-rank 1 --rdzv-backend c10d --rdzv-endpoint h1:7", None),
        # the last of an option counts, as in argparse (the user's options come after ours)
        (f"{STATIC_1} --rdzv-endpoint h1:7 --rdzv-backend c10d", None),
        # no port, no endpoint, no rank: nothing to wait for
        (f"{STATIC_1} --rdzv-endpoint h1", None),
        (STATIC_1, None),
        ("--rdzv-backend static --rdzv-endpoint h1:7", None),
        # the program's own arguments are not torchrun's
        (f"{STATIC_1} --no-python python rank.py --rdzv-endpoint h9:9", None),
        (f"{STATIC_1} --rdzv-endpoint h1:7 --no-python python rank.py --node-rank 0", ("h1", 7)),
        ("--node-rank 1 --rdzv-backend", None),
    ],
)
def test_store_endpoint_is_node_0s_for_the_other_nodes_of_a_static_rendezvous(
    args: str, want: tuple[str, int] | None
) -> None:
    assert store_endpoint(args.split()) == want


def test_await_store_returns_once_the_endpoint_listens_and_leaves_no_connection(
    free_port: Callable[[], int],
) -> None:
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    listening = threading.Event()

    def listen_later() -> None:
        time.sleep(0.3)  # the node's tries are refused until then
        server.listen()
        listening.set()

    thread = threading.Thread(target=listen_later)
    thread.start()
    try:
        assert await_store("127.0.0.1", port, limit=60)
        assert listening.is_set()
        conn, _ = server.accept()  # the one try that got through, closed at once
        with conn:
            assert conn.recv(16) == b""
    finally:
        thread.join()
        server.close()


def test_await_store_gives_up_after_its_limit(free_port: Callable[[], int]) -> None:
    assert not await_store("127.0.0.1", free_port(), limit=0.2)
    assert not await_store("no-such-host.invalid", 1, limit=0.2)


def test_a_try_of_the_store_leaves_it_serving_its_clients(free_port: Callable[[], int]) -> None:
    """The try is a connection the store sees open and close with nothing sent; its clients
    connect and work as before."""
    from datetime import timedelta

    import torch.distributed as dist

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30), False)
    for _ in range(3):
        assert await_store("127.0.0.1", port, limit=10)
    client = dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
    client.set("key", "value")
    assert server.get("key") == b"value"
