"""The error boundary's signal handling (commands/root.py) where the kernel's choice of thread matters."""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from pathlib import Path

import pytest

from edgespec.commands.root import Terminated, _terminate_by_exception, terminations_reach_the_main_thread

NEVER = 60.0  # what the main thread waits for: far longer than any signal takes to arrive


@pytest.fixture
def restored_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def in_select(native_id: int) -> bool:
    wchan = Path(f"/proc/self/task/{native_id}/wchan").read_text()
    return "select" in wchan or "poll" in wchan


def sigterm_to_another_thread_once_main_waits() -> threading.Thread:
    """A thread that, once the main thread waits in select(), takes a SIGTERM itself, as one of
    llama.cpp's OpenMP workers may: the kernel gives a process's signal to any thread not blocking it."""
    main = threading.main_thread().native_id

    def run():
        deadline = time.monotonic() + NEVER
        while not in_select(main) and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def wait_in_c(seconds: float, waited: list[float]) -> None:
    """Wait in select() on a pipe nobody writes (as readline waits for a key)."""
    r, w = os.pipe()
    start = time.monotonic()
    try:
        select.select([r], [], [], seconds)
    finally:
        waited.append(time.monotonic() - start)
        os.close(r)
        os.close(w)


def test_a_sigterm_another_thread_took_still_ends_the_wait_of_the_main_thread(restored_handlers):
    waited: list[float] = []
    with pytest.raises(Terminated) as caught:
        with _terminate_by_exception(), terminations_reach_the_main_thread():
            sigterm_to_another_thread_once_main_waits()
            wait_in_c(NEVER, waited)
    assert caught.value.signum == signal.SIGTERM
    assert waited and waited[0] < NEVER / 2  # interrupted, not timed out
    # nothing is left behind: the wakeup fd is Python's again, the watcher gone
    assert signal.set_wakeup_fd(-1) == -1
    assert not any(t.name == "edgespec-signals" and t.is_alive() for t in threading.enumerate())


def test_without_the_watcher_the_wait_of_the_main_thread_runs_to_its_end(restored_handlers):
    """What the watcher is for: the handler is due, yet nothing interrupts the main thread's wait."""
    waited: list[float] = []
    with pytest.raises(Terminated):
        with _terminate_by_exception():
            sigterm_to_another_thread_once_main_waits()
            wait_in_c(1.0, waited)
    assert waited and waited[0] >= 1.0  # select's own timeout ended it; the handler ran after
