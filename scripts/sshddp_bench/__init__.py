"""Benchmarks of sshddp against pdsh and plain OpenSSH, on real sshd servers on loopback.

The suite starts its own ``SshdCluster`` (``sshddp_lab.sshd``) in a temporary directory,
runs every case and its baselines in the same run, interleaving the methods repetition by
repetition, and prints a markdown report (medians with min-max); ``--out`` also writes it
to a file (BENCHMARKS.md). Every "host" is this machine, so remote work competes with the
coordinator for the same cores: absolute numbers are pessimistic, the comparisons are fair.

    .venv/bin/python -m sshddp_bench [--quick] [--reps N] [--only ...] [--out BENCHMARKS.md]
    .venv/bin/python -m sshddp_bench --reps 1 --only launch --sizes 1   # a smoke run

``harness`` holds what every case shares, one module per case measures and renders it
(``doctor``, ``launch``, ``teardown``, ``nodeloss``, ``logs``, ``scale``), ``registry``
lists them, ``report`` assembles the markdown, and ``internals`` is the only module that
imports sshddp itself.
"""
