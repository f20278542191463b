"""Jobs that hang on purpose, for ``sshddp stacks``: behaviour picked by argv[1].

sleeper R   every rank joins the gloo group; rank R sleeps forever before its all-reduce
            (in sleep_before_allreduce) while the others wait in the all-reduce
blocked     no collective; every rank installs its own SIGUSR1 and SIGUSR2 handlers (they
            print "rank R got SIGUSR1"), then, by global rank modulo 4:
            0: blocks in libc's recv (through ctypes: C code that does not retry on EINTR)
               until a file named "release" appears in its cwd, then prints what recv
               returned and sleeps in after_recv
            1: blocks on a lock, with two more threads (heartbeat, waiter)
            2: starts a forked and a spawned worker (forked_worker, spawned_worker) and
               waits for them
            3: sleeps in plain_sleep
initblock N the ranks of node N (GROUP_RANK) sleep forever before init_process_group (in
            block_before_init); the others wait in it
slowinit S  no hang: every rank sleeps S seconds in silence before init_process_group (a slow
            import), then all-reduces, prints "DONE <rank>" and ends
silent S    no hang: every rank joins the gloo group and works for S seconds in silence, a
            small DDP step (all-reduced gradients) after another, then prints
            "DONE <rank> <steps>" and ends
Every rank prints "READY <rank>" once it stands where it will hang.
"""

import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time


def forever() -> None:
    while True:
        time.sleep(3600)  # FOREVER


def sleep_before_allreduce() -> None:
    forever()  # SLEEPS HERE


def sleeper(culprit: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"READY {rank}", flush=True)
    if rank == culprit:
        sleep_before_allreduce()
    dist.all_reduce(torch.ones(1))  # WAITS HERE


def block_before_init() -> None:
    forever()  # BLOCKS BEFORE INIT


def initblock(node: int) -> None:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    print(f"READY {rank}", flush=True)
    if int(os.environ["GROUP_RANK"]) == node:
        block_before_init()
    dist.init_process_group("gloo")  # INIT WAITS HERE
    print(f"rank {rank} joined", flush=True)
    forever()


def recv_in_c(rank: int) -> None:
    ours, theirs = socket.socketpair()

    def release() -> None:
        while not os.path.exists("release"):
            time.sleep(0.1)
        theirs.send(b"hello")

    threading.Thread(target=release, daemon=True).start()
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(16)
    print(f"READY {rank}", flush=True)
    got = libc.recv(ours.fileno(), buf, 16, 0)  # RECV HERE
    print(f"rank {rank} recv returned {got} errno {ctypes.get_errno()}", flush=True)
    after_recv()


def after_recv() -> None:
    forever()


def heartbeat() -> None:
    forever()


def waiter(event: threading.Event) -> None:
    event.wait()


def wait_on_lock(rank: int) -> None:
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
    threading.Thread(target=waiter, args=(threading.Event(),), name="waiter", daemon=True).start()
    lock = threading.Lock()
    lock.acquire()
    print(f"READY {rank}", flush=True)
    lock.acquire()  # LOCKED HERE


def forked_worker() -> None:
    forever()


def spawned_worker() -> None:
    forever()


def with_workers(rank: int) -> None:
    workers = [
        mp.get_context("fork").Process(target=forked_worker, daemon=True),
        mp.get_context("spawn").Process(target=spawned_worker, daemon=True),
    ]
    for worker in workers:
        worker.start()
    print(f"READY {rank}", flush=True)
    for worker in workers:
        worker.join()


def plain_sleep(rank: int) -> None:
    print(f"READY {rank}", flush=True)
    forever()


def blocked() -> None:
    rank = int(os.environ["RANK"])
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(
            sig, lambda num, frame: print(f"rank {rank} got {signal.Signals(num).name}", flush=True)
        )
    (recv_in_c, wait_on_lock, with_workers, plain_sleep)[rank % 4](rank)


def slowinit(seconds: float) -> None:
    time.sleep(seconds)  # as a slow import would, before any output
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    print(f"DONE {dist.get_rank()}", flush=True)
    dist.destroy_process_group()


def silent(seconds: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    end, steps = time.time() + seconds, 0
    while True:  # every rank ends at the same step, on the ranks' common word
        opt.zero_grad()
        model(torch.randn(64, 256)).pow(2).mean().backward()
        opt.step()
        steps += 1
        go = torch.tensor([float(time.time() < end)])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)
        if not go.item():
            break
    print(f"DONE {dist.get_rank()} {steps}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "silent":
        silent(float(sys.argv[2]))
    elif sys.argv[1] == "slowinit":
        slowinit(float(sys.argv[2]))
    elif sys.argv[1] == "sleeper":
        sleeper(int(sys.argv[2]))
    elif sys.argv[1] == "initblock":
        initblock(int(sys.argv[2]))
    else:
        blocked()
