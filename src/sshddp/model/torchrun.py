"""Pure: torchrun's own options that a launch passes through (``--torchrun-arg``), and the
ones sshddp must own.

sshddp decides every node's place in the run (``--nnodes``, ``--node-rank``,
``--nproc-per-node``, the rendezvous endpoint and id) and how a rank starts (through the
rank shim, with ``--no-python``), so those are refused with a clear error. Anything else goes
to torchrun unchanged, placed before the program so torchrun never substitutes
``${local_rank}`` in it; torchrun checks it itself and a node whose torchrun refuses an
option fails with torchrun's own message.
"""

from __future__ import annotations

from collections.abc import Iterable

from sshddp.errors import UsageError

#: Options sshddp decides itself, with what to use instead (names as torchrun spells them).
OWNED: dict[str, str] = {
    "--nnodes": "sshddp runs one node per inventory host",
    "--node-rank": "host i of the inventory is node rank i",
    "--nproc-per-node": "use sshddp's --nproc-per-node, or `gpus:` / `nproc:` in the inventory",
    "--rdzv-endpoint": "use --port, or `rendezvous: {host, port}` in the inventory",
    "--rdzv-id": "sshddp uses the run id",
    "--master-addr": "use `rendezvous: {host}` in the inventory",
    "--master-port": "use --port",
    "--standalone": "sshddp always runs a rendezvous on the first host",
    "--max-restarts": "use sshddp's own --max-restarts",
    "--no-python": "every rank starts through sshddp's rank shim",
    "--module": "give -m MODULE to sshddp launch in place of SCRIPT",
    "--run-path": "sshddp runs SCRIPT as `python SCRIPT` would",
    "--help": "run `python -m torch.distributed.run --help` on a host",
}
#: Short spellings of owned options (torchrun's ``-m`` and argparse's ``-h``).
OWNED_SHORT = {"-m": "--module", "-h": "--help"}
#: The options docs/launching.md documents and the tests run (any other passes through as well).
DOCUMENTED = (
    "--local-ranks-filter",
    "--rdzv-backend",
    "--rdzv-conf",
    "--tee",
    "--redirects",
    "--log-dir",
    "--monitor-interval",
    "--start-method",
)


def canonical(name: str) -> str:
    """``--nproc_per_node`` -> ``--nproc-per-node``: torchrun accepts both spellings."""
    return "--" + name[2:].replace("_", "-")


def owned_by_sshddp(token: str) -> str:
    """The owned option ``token`` names, or "". argparse also takes a unique prefix of a
    long option (``--nnod``) and a short option's value glued to it (``-mpkg``), so those
    count too."""
    if not token.startswith("--"):
        short = token[:2]
        return OWNED_SHORT.get(short, "")
    name = canonical(token.split("=", 1)[0])
    if len(name) <= 2:
        return ""
    return next((owned for owned in OWNED if owned.startswith(name)), "")


def torchrun_args(values: Iterable[str]) -> tuple[str, ...]:
    """Check ``--torchrun-arg`` values; each is one torchrun option, ``--name=value``."""
    checked = []
    for value in values:
        if value == "--" or not value.startswith("-") or value == "-":
            raise UsageError(
                f"--torchrun-arg {value!r}: expected one torchrun option, with its value "
                "after '=' (e.g. --torchrun-arg=--tee=3); give each option its own "
                "--torchrun-arg"
            )
        owned = owned_by_sshddp(value)
        if owned:
            raise UsageError(
                f"--torchrun-arg {value!r}: sshddp sets torchrun's {owned} itself ({OWNED[owned]})"
            )
        checked.append(value)
    return tuple(checked)
