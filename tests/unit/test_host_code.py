"""What every host of a launch gets beside its session's modules (run/boot.py): the
supervisor file, the rank and agent shims and the ranks' sitecustomize, and those packed
for the go. They are the same for every host, so a launch builds them once, whichever of
its pool's threads asks first, and packs them in a thread of its own while the hosts'
probes run."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from sshddp.hosts import shipped
from sshddp.run import boot

THREADS = 8


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    """Each test starts with nothing built, and leaves nothing of its own built."""

    def clear() -> None:
        boot._host_code.cache_clear()
        boot._packed_host_code.cache_clear()
        boot._pack_started.clear()

    clear()
    yield
    clear()


def test_threads_asking_at_once_build_the_host_code_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight pool threads (eight hosts) ask for the packed code at the same moment, while the
    first build is still under way: one build, and every thread gets its bytes."""
    built: list[str] = []
    real = shipped.standalone

    def slow_standalone(name: str) -> str:
        built.append(name)
        time.sleep(0.05)  # every other thread asks before this build ends
        return real(name)

    monkeypatch.setattr(shipped, "standalone", slow_standalone)
    start = threading.Barrier(THREADS)

    def ask(_: int) -> bytes:
        start.wait()
        return boot.packed_host_code()

    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(ask, range(THREADS)))
    assert built == ["supervisor"]
    assert len(set(answers)) == 1
    files = json.loads(zlib.decompress(answers[0]))
    assert sorted(files) == ["agent", "rank", "site", "supervisor", "wire"]
    assert files["supervisor"] == real("supervisor")


def test_the_first_session_opened_starts_the_packing_and_later_ones_reuse_it() -> None:
    thread = boot.pack_soon()
    assert thread is not None and thread.daemon  # never keeps a finished launch alive
    assert boot.pack_soon() is None  # the second session opened: already under way
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert boot._packed_host_code.cache_info().currsize == 1
    packed = boot.packed_host_code()
    boot._packed_host_code.cache_clear()
    assert boot.packed_host_code() == packed  # what the go would have packed itself


def test_a_session_opening_never_waits_for_the_packing() -> None:
    """While the packing runs, another host's session still gets the files at once."""
    boot.host_code()
    packing = threading.Event()
    release = threading.Event()
    cached = boot._packed_host_code

    def slow_pack() -> bytes:
        packing.set()
        release.wait(30)
        return cached()

    boot._packed_host_code = slow_pack  # type: ignore[assignment]
    try:
        _pack_while_a_session_opens(packing, release)
    finally:
        release.set()
        boot._packed_host_code = cached


def _pack_while_a_session_opens(packing: threading.Event, release: threading.Event) -> None:
    with ThreadPoolExecutor(1) as pool:
        packed = pool.submit(boot.packed_host_code)
        assert packing.wait(30)
        got: list[tuple[str, str, str, str]] = []
        opener = threading.Thread(target=lambda: got.append(boot.host_code()))
        opener.start()
        opener.join(timeout=5)
        assert got and not opener.is_alive()  # it did not wait for the packing
        release.set()
        assert json.loads(zlib.decompress(packed.result(30)))["agent"] == got[0][3]
