"""run.interrupts: Ctrl-C raises until a node may start, and only counts from then on."""

from __future__ import annotations

import os
import signal
import time

import pytest

from sshddp.run.interrupts import Interrupts


def sigint() -> None:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.05)  # the handler runs at the next bytecode


def test_raises_until_deferred_then_counts() -> None:
    previous = signal.getsignal(signal.SIGINT)
    try:
        interrupts = Interrupts().install()
        with pytest.raises(KeyboardInterrupt):
            sigint()
        interrupts.defer()
        sigint()
        sigint()
        assert interrupts.count == 3 and interrupts.event.is_set()
    finally:
        signal.signal(signal.SIGINT, previous)
