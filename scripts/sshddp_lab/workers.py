"""Which share of the lab a test process owns when pytest-xdist runs the suite on workers.

Every worker starts its own session cluster and its own private clusters, so two workers
must never pick the same loopback addresses (an sshd's listen address, the stop of one
host), the same rendezvous ports, or the same temporary directory (a machine's port claims
live there: one worker's run would take the other's). Worker ``w``
(``PYTEST_XDIST_WORKER=gw<w>``; 0 without xdist) gets:

* the session cluster on ``127.0.0.{41 + 10w}..``, the address after its last host free for
  a test's own listener;
* ``make_cluster``'s clusters on ``127.0.0.{101 + 30w}..``;
* rendezvous ports in its own slice of 10000-21000.

This module reads the environment only; it imports only the standard library.
"""

from __future__ import annotations

import os

MAX_WORKERS = 5  # the last worker's private hosts, 127.0.0.221..250, end below .254
SESSION_OCTETS = 10  # per worker: 4 session hosts and a spare address
PRIVATE_OCTETS = 30  # per worker: make_cluster's hosts of one test
PORTS = range(10000, 21000)  # rendezvous ports, below Linux's ephemeral range


class WorkerError(RuntimeError):
    """More workers than the lab has addresses for."""


def worker() -> int:
    """This process's xdist worker number: ``gw1`` -> 1; 0 when not under xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0
    if number >= MAX_WORKERS:
        raise WorkerError(
            f"PYTEST_XDIST_WORKER={name}: the test lab has addresses for {MAX_WORKERS} "
            f"workers (gw0..gw{MAX_WORKERS - 1}); run pytest with -n {MAX_WORKERS} or fewer"
        )
    return number


def session_first_octet() -> int:
    """Host ``i`` of this worker's session cluster is ``127.0.0.{this + i}``."""
    return 40 + SESSION_OCTETS * worker()


def private_first_octet() -> int:
    """``make_cluster``'s first host is ``127.0.0.{this + 1}``."""
    return 100 + PRIVATE_OCTETS * worker()


def port_range() -> range:
    """This worker's even rendezvous ports (a run uses P and P + 1)."""
    width = len(PORTS) // MAX_WORKERS // 2 * 2
    start = PORTS.start + width * worker()
    return range(start, start + width, 2)
