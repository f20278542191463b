"""The job the launch tests run under torchrun: behaviour picked by argv[1].

ok            all-reduce the ranks, print a JSON summary and 50 numbered lines per rank
argv ...      print the JSON summary (it carries sys.argv[2:])
echo ...      print only {"rank", "argv": sys.argv[2:], "env": every HOSTILE_* variable}, as
              ASCII-only JSON, so any value (non-UTF-8 bytes too) survives the terminal
env NAME...   print the values of the named environment variables
secret NAME   look for the value of $NAME in every process's /proc/*/cmdline
raise R       rank R raises RuntimeError after the first all-reduce; the others keep going
sigkill R     rank R SIGKILLs itself; the others keep going
hang H R      rank H ignores SIGTERM and sleeps forever; rank R raises
stream N      print N numbered lines, 10 ms apart
flood MB [exit]  print MB megabytes of numbered 1 KB lines at once, then FLOODED and wait
                (or end, with `exit`)
wait          print READY and sleep forever (to be stopped)
setsid        fork a grandchild that calls setsid and sleeps forever, then wait
"""

import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

MODE = sys.argv[1]
ARGS = sys.argv[2:]


def summary(rank: int, world: int, value: float) -> None:
    print(
        json.dumps(
            {
                "rank": rank,
                "world": world,
                "node_rank": int(os.environ["GROUP_RANK"]),
                "local_rank": int(os.environ["LOCAL_RANK"]),
                "sum": value,
                "argv": ARGS,
                "host": socket.gethostname(),
                "run_id": os.environ.get("SSHDDP_RUN_ID"),
                "netns": os.readlink("/proc/self/ns/net"),
                "slurm_vars": sorted(k for k in os.environ if k.startswith("SLURM")),
            },
            ensure_ascii=False,
        ),
        flush=True,
    )


def forever() -> None:
    while True:
        time.sleep(1)


def echo(rank: int) -> None:
    env = {k: v for k, v in os.environ.items() if k.startswith("HOSTILE_")}
    print(json.dumps({"rank": rank, "argv": ARGS, "env": env}), flush=True)


def mode_ok(rank: int, value: torch.Tensor) -> None:
    for i in range(50):
        print(f"rank {rank} line {i}", flush=True)


def mode_env(rank: int, value: torch.Tensor) -> None:
    print(json.dumps({"rank": rank, "env": {n: os.environ.get(n) for n in ARGS}}), flush=True)


def mode_secret(rank: int, value: torch.Tensor) -> None:
    found = []
    needle = os.environ[ARGS[0]].encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(pid)
        except OSError:
            pass
    print(json.dumps({"rank": rank, "secret_in_cmdline": found}), flush=True)


def mode_raise(rank: int, value: torch.Tensor) -> None:
    if rank == int(ARGS[0]):
        raise RuntimeError(f"boom on rank {rank}")
    dist.all_reduce(value)  # blocks: the failed rank never joins
    forever()


def mode_sigkill(rank: int, value: torch.Tensor) -> None:
    if rank == int(ARGS[0]):
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(value)
    forever()


def mode_hang(rank: int, value: torch.Tensor) -> None:
    if rank == int(ARGS[0]):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("HANGING", flush=True)
        forever()
    if rank == int(ARGS[1]):
        time.sleep(1)
        raise RuntimeError(f"boom on rank {rank}")
    dist.all_reduce(value)
    forever()


def mode_stream(rank: int, value: torch.Tensor) -> None:
    for i in range(int(ARGS[0])):
        print(f"rank {rank} tick {i}", flush=True)
        time.sleep(0.01)


def mode_flood(rank: int, value: torch.Tensor) -> None:
    pad = "x" * 1000
    for i in range(int(ARGS[0]) * 1024):
        print(f"rank {rank} flood {i:07d} {pad}", flush=True)
    print(f"FLOODED {rank}", flush=True)
    if ARGS[1:] != ["exit"]:
        forever()


def mode_wait(rank: int, value: torch.Tensor) -> None:
    print(f"READY {rank}", flush=True)
    forever()


def mode_setsid(rank: int, value: torch.Tensor) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            forever()
        os._exit(0)
    mode_wait(rank, value)


MODES = {
    "ok": mode_ok,
    "env": mode_env,
    "secret": mode_secret,
    "raise": mode_raise,
    "sigkill": mode_sigkill,
    "hang": mode_hang,
    "wait": mode_wait,
    "setsid": mode_setsid,
    "stream": mode_stream,
    "flood": mode_flood,
    "argv": lambda rank, value: None,
}


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    value = torch.tensor([float(rank)])
    dist.all_reduce(value)
    if MODE == "echo":  # hostile values: no other output, which might not survive them
        echo(rank)
    else:
        summary(rank, world, value.item())
        MODES[MODE](rank, value)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
