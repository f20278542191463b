"""``launch()``'s keyword options as the ``sshddp launch`` command line they stand for, so
the command's own parser checks them and says what is wrong in the CLI's words.

Pure: a name is the long option without its dashes (``max_restarts`` for
``--max-restarts``); ``True`` gives a flag, a list repeats an option. What the API does not
support yet is refused by name, never ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Optional

from sshddp.errors import UsageError

#: the command's options launch() does not take, and why
REFUSED = {
    "env": "give the environment as launch(..., env={'KEY': 'value'})",
    "module": "launch() runs the function it is given, not a module",
    "launcher": "launch() calls the function once per rank, under torchrun on every node",
    "workdir": "launch() ships the function by value, with what it closes over",
    "include": "launch() ships no --workdir",
    "fresh_cwd": "every launch() runs in a directory of its own already",
    "dry_run": "a dry run starts nothing, so there would be no values to return; "
    "`sshddp launch --dry-run INVENTORY SCRIPT` prints a launch's plan",
    "detach": "launch() returns when the run ends; sshddp.start(..., detach=True) starts a "
    "run that outlives this process",
    "tty": "the ranks' output comes back to this process's stdout (a notebook's cell, a "
    "pipe), which is not a terminal to give them",
    "local_rank_arg": "the function reads LOCAL_RANK from os.environ",
    "hosts": "give the hosts as the inventory: launch(fn, 'host-a:2,host-b:2')",
}
#: torchrun options that change what torchrun runs: the call's shim must be what it runs
PROGRAM_OPTIONS = ("--no-python", "--no_python", "--run-path", "--run_path", "-m", "--module")


def option_names(long_options: Iterable[str]) -> dict[str, str]:
    """API name -> long option, for the command's long options (``--max-restarts``)."""
    return {opt[2:].replace("-", "_"): opt for opt in long_options if opt.startswith("--")}


def options_argv(
    options: Mapping[str, object], known: Mapping[str, str], flags: frozenset[str]
) -> list[str]:
    """The command-line words for ``options``; ``known`` maps API names to long options,
    ``flags`` are the API names that take no value."""
    argv: list[str] = []
    for name, value in options.items():
        if name in REFUSED:
            raise UsageError(f"launch(): option {name!r}: {REFUSED[name]}")
        if name not in known:
            raise UsageError(
                f"launch(): unknown option {name!r}; the options are the launch command's, "
                f"without dashes: {', '.join(sorted(n for n in known if n not in REFUSED))}"
            )
        argv += _words(name, known[name], value, name in flags)
    _check_torchrun_args(options.get("torchrun_arg"))
    return argv


def _check_torchrun_args(value: object) -> None:
    values = value if isinstance(value, (list, tuple)) else [] if value is None else [value]
    for arg in map(str, values):
        if arg.split("=", 1)[0] in PROGRAM_OPTIONS:
            raise UsageError(
                f"launch(): option 'torchrun_arg': {arg!r} changes what torchrun runs; under "
                "launch() it runs the call of the function on every rank"
            )


def _words(name: str, option: str, value: object, flag: bool) -> list[str]:
    if flag:
        if not isinstance(value, bool):
            raise UsageError(f"launch(): option {name!r} is True or False, not {value!r}")
        return [option] if value else []
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [w for v in value for w in (option, str(v))]
    return [option, str(value)]


def env_argv(env: Optional[Mapping[str, str]]) -> list[str]:
    """``--env KEY=VALUE`` for every variable of ``env``."""
    words: list[str] = []
    for key, value in (env or {}).items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise UsageError(f"launch(env=...): {key!r}: names and values are str")
        words += ["--env", f"{key}={value}"]
    return words


def inventory_argv(inventory: str, exists: bool) -> Sequence[str]:
    """An inventory file (or ``slurm``, ``slurm:JOBID``) as INVENTORY; a host list such as
    ``gpu-a:8,gpu-b:8`` (not a file here) as ``-H``."""
    if exists or inventory == "slurm" or inventory.startswith("slurm:"):
        return [inventory]
    if ":" in inventory or "," in inventory:
        return ["-H", inventory]
    return [inventory]  # the command says the file is missing
