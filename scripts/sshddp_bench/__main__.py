"""The command line: ``python -m sshddp_bench``. Parses the flags into ``Sizes``, runs the
selected cases on one sshd cluster, stores each case's result (``store``), prints the report
and writes it to ``--out``. ``python -m sshddp_bench report --write BENCHMARKS.md`` writes
BENCHMARKS.md from the stored results alone."""

from __future__ import annotations

import argparse
import compileall
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from sshddp_bench import internals, mechanisms
from sshddp_bench.case import Sizes
from sshddp_bench.harness import reap_leftovers, running_bench
from sshddp_bench.logs import L8_MB
from sshddp_bench.machine import load_average, machine
from sshddp_bench.registry import NAMES, CaseFault, hosts_needed, run_cases
from sshddp_bench.report import Results, render, render_stored
from sshddp_bench.store import RESULTS, Stored, load, save

DESCRIPTION = (
    "Benchmarks of sshddp against pdsh and plain OpenSSH, on real sshd servers on loopback."
)
MAX_HOSTS = 64  # sshddp_lab's limit on one cluster on 127.0.0.x
MANY_HOSTS = 256  # and on 127.1.x.y, where the scale256 case's cluster goes


def host_list(text: str, most: int = MAX_HOSTS) -> list[int]:
    sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    if not sizes or sizes[0] < 1 or sizes[-1] > most:
        raise argparse.ArgumentTypeError(f"host counts between 1 and {most}, got {text!r}")
    return sizes


def many_list(text: str) -> list[int]:
    return host_list(text, MANY_HOSTS)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sshddp_bench", description=DESCRIPTION)
    p.add_argument(
        "--quick",
        action="store_true",
        help="Smaller sizes: doctor to 16 hosts, launch to 8, 100 MB of logs from one rank, "
        "10 MB per host from 8, the scale case at 16 hosts.",
    )
    p.add_argument("--reps", type=int, default=5, help="Repetitions per case (default 5).")
    p.add_argument("--out", metavar="FILE", help="Also write the report there.")
    p.add_argument(
        "--results",
        metavar="DIR",
        default=str(RESULTS),
        help="Where each case's result is stored (default benchmarks/results/ of the checkout).",
    )
    p.add_argument("--no-store", action="store_true", help="Store no result.")
    p.add_argument(
        "--only",
        default=",".join(NAMES),
        help=f"Comma-separated subset of {','.join(NAMES)}.",
    )
    p.add_argument(
        "--sizes",
        type=host_list,
        metavar="N,N,..",
        help="Host counts of the doctor and launch cases (default 1,4,16,32,64 and 1,4,8,16).",
    )
    p.add_argument(
        "--doctor-sizes",
        type=host_list,
        metavar="N,N,..",
        help="Host counts of the doctor case alone (default: --sizes, else 1,4,16,32,64).",
    )
    p.add_argument(
        "--logs-mb",
        type=int,
        metavar="N",
        help="MB from the one rank of the logs case (default 200, 100 with --quick).",
    )
    p.add_argument(
        "--logs-hosts", type=int, metavar="N", help="Hosts of the logs8 case (default 8)."
    )
    p.add_argument(
        "--scale-hosts", type=int, metavar="N", help="Hosts of the scale32 case (default 32)."
    )
    p.add_argument(
        "--many-sizes",
        type=many_list,
        metavar="N,N,..",
        help="Host counts of the scale256 and runs256 cases (default 16,64,256).",
    )
    p.add_argument(
        "--slurm-nodes",
        type=host_list,
        metavar="N,N,..",
        help="Nodes of the slurm case's Slurm cluster (default 3,8,16; 3,8 with --quick).",
    )
    p.add_argument(
        "--stacks-hosts", type=int, metavar="N", help="Hosts of the stacks case (default 8)."
    )
    p.add_argument(
        "--workdir-mb", type=int, metavar="N", help="MB of the workdir case's directory (200)."
    )
    p.add_argument(
        "--workdir-hosts", type=int, metavar="N", help="Hosts of the workdir case (default 4)."
    )
    return p


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    unknown = set(args.only.split(",")) - set(NAMES)
    if unknown:
        p.error(f"--only: unknown case(s) {', '.join(sorted(unknown))}")
    for opt in ("logs_mb", "workdir_mb"):
        if getattr(args, opt) is not None and getattr(args, opt) < 1:
            p.error(f"--{opt.replace('_', '-')} must be at least 1")
    for opt in ("logs_hosts", "scale_hosts", "stacks_hosts", "workdir_hosts"):
        value = getattr(args, opt)
        if value is not None and not 1 <= value <= MAX_HOSTS:
            p.error(f"--{opt.replace('_', '-')} must be between 1 and 64")
    return args


def sizes_of(args: argparse.Namespace) -> Sizes:
    return Sizes(
        only=frozenset(args.only.split(",")),
        doctor=tuple(
            args.doctor_sizes or args.sizes or ([1, 4, 16] if args.quick else [1, 4, 16, 32, 64])
        ),
        launch=tuple(args.sizes or ([1, 4, 8] if args.quick else [1, 4, 8, 16])),
        mb=args.logs_mb or (100 if args.quick else 200),
        logs8_hosts=args.logs_hosts or 8,
        logs8_mb=L8_MB // 2 if args.quick else L8_MB,
        scale=args.scale_hosts or (16 if args.quick else 32),
        slurm=tuple(args.slurm_nodes or ([3, 8] if args.quick else [3, 8, 16])),
        stacks=args.stacks_hosts or 8,
        workdir_mb=args.workdir_mb or (100 if args.quick else 200),
        workdir_hosts=args.workdir_hosts or 4,
        many=tuple(args.many_sizes or [16, 64, 256]),
    )


def store_results(
    args: argparse.Namespace, res: Results, info: list[tuple[str, str]], cmd: str
) -> None:
    """Every case that ran to its end, stored for ``report`` (a case that stopped keeps
    its earlier result)."""
    if args.no_store:
        return
    for name, row in res.rows.items():
        if not isinstance(row, CaseFault):
            stored = Stored(name, row, tuple(info), cmd, args.reps, sizes_of(args))
            print(f"bench: stored {save(Path(args.results), stored)}", file=sys.stderr)


def report_main(argv: Sequence[str]) -> int:
    """``report [--results DIR] [--write FILE]``: BENCHMARKS.md from the stored results."""
    p = argparse.ArgumentParser(
        prog="python -m sshddp_bench report",
        description="Write BENCHMARKS.md from the results the suite stored, and nothing else.",
    )
    p.add_argument("--results", metavar="DIR", default=str(RESULTS), help="The stored results.")
    p.add_argument("--write", metavar="FILE", help="Write the file there (else: stdout).")
    args = p.parse_args(argv)
    text = render_stored(load(Path(args.results), (*NAMES, mechanisms.NAME, mechanisms.SLURM_NAME)))
    if args.write:
        Path(args.write).write_text(text)
    else:
        print(text, end="")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    args = parse_args(argv)
    compileall.compile_dir(internals.package_dir(), quiet=1)  # as pip install leaves it
    sizes = sizes_of(args)
    info = machine()
    started = time.monotonic()
    with running_bench(hosts_needed(sizes)) as bench:
        res = Results(run_cases(bench, sizes, args.reps))
        res.leftovers = reap_leftovers()
        info.append(("hosts", bench.describe_hosts()))
    info.append(("load average at end", load_average()))
    info.append(("suite duration", f"{time.monotonic() - started:.0f} s"))
    cmd = shlex.join([".venv/bin/python", "-m", "sshddp_bench", *argv])
    store_results(args, res, info, cmd)
    report = render(res, args.reps, sizes, info, cmd)
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
