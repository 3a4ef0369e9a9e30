"""A server polled on a thread for the length of a with-block (the control-socket tests)."""
from __future__ import annotations

import contextlib
import threading


@contextlib.contextmanager
def polled(poll, every: float = 0.02):
    """Call ``poll(every)`` on a thread until the block ends; then stop and join the thread."""
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            poll(every)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
