"""A deterministic fake profiler for tests and benchmarks: no kernel, no root.

It reports what it is given, per target pid, one of:

- ``source``: a callable ``source(pid, interval) -> Sample | (addr, count[, node[, npages[,
  freq]]])``;
- ``intervals``: a list of per-interval entries (a Sample or such a tuple), the last repeated;
- ``units``/``hot``: a simple layout: ``units`` 4 KiB units starting at ``base``, the first
  ``hot`` of them accessed ``hot_count`` times per interval, the rest never, on ``node``.

Frequency (``Sample.freq``, accesses per second): a Sample or a tuple's fifth element carries
it through; without one, ``freq`` is derived from the count as ``count / interval_s`` when the
stub is given ``interval_s``, and left empty otherwise (``Sample.rates`` then derives it).

Granularity: ``"page"`` (the default) reports the units as given; ``"region"`` folds the 4 KiB
units into region units, one per 2 MiB block (``profiler.base.region_units``), as pagetier.ko
reports a large target.

Parts: :meth:`StubProfiler.read_part` gives the units of one part of the address range of what
it reports (``profiler.base.part_span``), without advancing to the next interval.

Nodes: the daemon records its moves in its own PageState; set ``track_moves=True`` and give the
stub to the stub mover (tests) to have reported nodes follow the moves, or ``query=True`` to ask
the kernel (mover.query_nodes) for a real pid's pages.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from pagetier.errors import ConfigError
from pagetier.profiler.base import (PAGE_SIZE, Profiler, Sample, in_span, part_span, region_units,
                                    register)

GRANULARITIES = ("page", "region")


def as_sample(pid: int, entry) -> Sample:
    if isinstance(entry, Sample):
        return entry
    addr, count, *rest = entry
    addr = np.asarray(addr, np.uint64)
    n = len(addr)
    count = np.broadcast_to(np.asarray(count, np.uint32), (n,)).copy()
    node = np.broadcast_to(np.asarray(rest[0] if rest else -1, np.int16), (n,)).copy()
    npages = np.broadcast_to(np.asarray(rest[1] if len(rest) > 1 else 1, np.uint16), (n,)).copy()
    freq = (np.broadcast_to(np.asarray(rest[2], np.float32), (n,)).copy() if len(rest) > 2
            else np.zeros(0, np.float32))
    return Sample(pid=pid, addr=addr, count=count, node=node, npages=npages, freq=freq)


@register("stub")
class StubProfiler(Profiler):
    def __init__(self, source: Callable | None = None, intervals: list | None = None,
                 units: int = 0, hot: int = 0, hot_count: int = 10, node: int = 1,
                 base: int = 0x7f0000000000, query: bool = False, track_moves: bool = False,
                 interval_s: float = 0.0, granularity: str = "page"):
        if granularity not in GRANULARITIES:
            raise ConfigError(f"stub profiler: granularity {granularity!r} (known: "
                              f"{', '.join(GRANULARITIES)})")
        self.granularity = granularity
        self.source = source
        self.intervals = intervals
        self.units, self.hot, self.hot_count = int(units), int(hot), int(hot_count)
        self.base = int(base)
        self.query = bool(query)
        self.track_moves = bool(track_moves)
        self.attached: dict[int, int] = {}  # pid -> reads so far
        self.detached: list[int] = []
        self.nodes: dict[int, dict[int, int]] = {}  # pid -> {addr: node}, if track_moves
        self.default_node = int(node)
        self.interval_s = float(interval_s)
        self.closed = False
        self._parted: dict[int, tuple] = {}  # pid -> (interval, entry) of the last read_part

    def attach(self, pid: int) -> None:
        self.attached.setdefault(pid, 0)

    def detach(self, pid: int) -> None:
        if self.attached.pop(pid, None) is not None:
            self.detached.append(pid)

    def _entry(self, pid: int, i: int):
        if self.source is not None:
            return self.source(pid, i)
        if self.intervals is not None:
            if not self.intervals:
                return (np.zeros(0, np.uint64), 0)
            return self.intervals[min(i, len(self.intervals) - 1)]
        addr = self.base + np.arange(self.units, dtype=np.uint64) * np.uint64(PAGE_SIZE)
        count = np.zeros(self.units, np.uint32)
        count[: self.hot] = self.hot_count
        return (addr, count, self.default_node, 1)

    def _sample(self, pid: int, i: int, part: tuple[int, int] | None = None) -> Sample:
        """Interval ``i``'s sample of ``pid``, at the stub's granularity, nodes filled in;
        ``part`` (part, parts): only the units of that part (see :meth:`read_part`)."""
        cached = self._parted.pop(pid, None)
        entry = cached[1] if cached is not None and cached[0] == i else self._entry(pid, i)
        if part is not None:  # the read that follows takes the same entry: one source call
            self._parted[pid] = (i, entry)
        s = as_sample(pid, entry)
        if self.granularity == "region":
            s = region_units(s)
        if self.interval_s > 0 and len(s.freq) != len(s):
            s.freq = s.rates(self.interval_s)
        if part is not None:
            if len(s) > 1 and not (s.addr[1:] > s.addr[:-1]).all():
                order = np.argsort(s.addr, kind="stable")
                s = s.take(order)
            lo = int(s.addr[0]) if len(s) else 0
            hi = int(s.addr[-1]) + int(s.npages[-1]) * PAGE_SIZE if len(s) else 0
            s = in_span(s, part_span(lo, hi, *part))
        if self.query and len(s):
            from pagetier.core import mover

            s.node = mover.query_nodes(pid, s.addr).clip(-1, None).astype(np.int16)
        elif self.track_moves and pid in self.nodes:
            known = self.nodes[pid]
            s.node = np.array([known.get(int(a), int(n)) for a, n in zip(s.addr, s.node)], np.int16)
        return s

    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        if pid not in self.attached:
            raise ProcessLookupError(f"stub profiler: pid {pid} is not attached")
        i = self.attached[pid]
        if reset:
            self.attached[pid] = i + 1
        s = self._sample(pid, i)
        if accessed_only:
            keep = s.count > 0
            s = s.take(keep, complete=False, span=None)
        return s

    def read_part(self, pid: int, part: int, parts: int) -> Sample | None:
        """Part ``part`` of ``parts`` of what the next read would list (no reset): the units
        starting in that part of the span from the lowest unit to the end of the highest.
        None for a subclass with a read of its own (its units are not the stub's), unless it
        has its own read_part too."""
        cls = type(self)
        if cls.read is not StubProfiler.read and cls.read_part is StubProfiler.read_part:
            return None
        if pid not in self.attached:
            raise ProcessLookupError(f"stub profiler: pid {pid} is not attached")
        return self._sample(pid, self.attached[pid], (part, parts))

    def moved(self, pid: int, addrs: np.ndarray, node: int) -> None:
        """Called by the test mover: later reads report ``node`` for these units."""
        if self.track_moves:
            d = self.nodes.setdefault(pid, {})
            for a in np.asarray(addrs, np.uint64).tolist():
                d[a] = node

    def stats(self, pid: int) -> dict:
        return {"reads": self.attached.get(pid, 0)}

    def close(self) -> None:
        for pid in list(self.attached):
            self.detach(pid)
        self.closed = True
