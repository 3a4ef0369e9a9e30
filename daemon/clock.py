"""The daemon's clock: monotonic time for intervals, wall time for the status file, and waiting.

The daemon takes a clock so that tests can run its loop without sleeping: :class:`FakeClock`
moves time forward only when the daemon waits.
"""
from __future__ import annotations

import time
from typing import Callable


class Clock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        """Wall-clock time (seconds since the epoch), for what people read."""
        return time.time()

    def wait(self, timeout: float, poll: Callable[[float], None] | None = None) -> None:
        """Let ``timeout`` seconds pass: in ``poll(timeout)`` (e.g. serving a socket, which
        returns at the first request or at the timeout), else asleep."""
        if poll is not None:
            poll(timeout)
        else:
            time.sleep(max(0.0, timeout))


class FakeClock(Clock):
    """A clock for tests: time stands still until the daemon waits, and then jumps by the whole
    timeout (after one non-blocking ``poll(0)``, so requests already queued are served)."""

    def __init__(self, start: float = 1000.0, wall: float = 1.7e9):
        self.now = float(start)
        self._wall0 = float(wall) - self.now
        self.waits: list[float] = []  # every wait, in order

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self._wall0 + self.now

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, float(seconds))

    def wait(self, timeout: float, poll: Callable[[float], None] | None = None) -> None:
        if poll is not None:
            poll(0.0)
        self.waits.append(timeout)
        self.advance(timeout)
