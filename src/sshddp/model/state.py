"""Node and run outcomes as data: every node's state, and the run's verdict and exit code.

Per-node outcomes are values, aggregated into a ``RunResult``, never an exception thrown at
the first failure (torch elastic's ``WorkerState`` / ``RunResult`` do the same).
"""

from __future__ import annotations


