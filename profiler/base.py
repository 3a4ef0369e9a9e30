"""The profiler interface: attach to PIDs, read per-page access counts per interval, detach.

Backends register by name with ``@register("name")`` in their own module; ``create(name)``
imports and probes them, raising Unavailable with a clear message when the kernel lacks
what a backend needs.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from pagetier.errors import ConfigError, PagetierError

PAGE_SIZE = 4096
HUGE_PAGES = 512  # 4 KiB pages in a 2 MiB mapping

PROFILERS: dict[str, type["Profiler"]] = {}
# Backends live in modules named after them; importing one registers it.
_BACKEND_MODULES = {"kmod": "pagetier.profiler.kmod", "stub": "pagetier.profiler.stub",
                    "damon": "pagetier.profiler.damon", "bpf": "pagetier.profiler.bpf",
                    "replay": "pagetier.profiler.replay"}


def register(name: str):
    def deco(cls):
        cls.name = name
        PROFILERS[name] = cls
        return cls

    return deco


def create(name: str, **options) -> "Profiler":
    """Instantiate backend ``name`` after probing that this kernel supports it."""
    if name not in PROFILERS and name in _BACKEND_MODULES:
        importlib.import_module(_BACKEND_MODULES[name])
    if name not in PROFILERS:
        known = ", ".join(sorted(set(PROFILERS) | set(_BACKEND_MODULES)))
        raise ConfigError(f"unknown profiler backend {name!r} (known: {known})")
    cls = PROFILERS[name]
    cls.probe()
    return cls(**options)


@dataclass
class Sample:
    """One interval's access counts for one process, one entry per tracked mapping unit.

    addr: start address (uint64); count: accesses since the last read (uint32);
    node: NUMA node or -1 if unknown (int16); npages: 4 KiB pages in the unit, 1 or 512 (uint16);
    freq: estimated accesses per second of the unit over the interval (float32), the one
    frequency signal every backend maps to (0: not accessed). Empty when a backend gives no
    estimate: use :meth:`rates` rather than reading it directly.
    """

    pid: int
    addr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    npages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16))
    complete: bool = True  # False when only accessed units are listed
    freq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    def __len__(self) -> int:
        return len(self.addr)

    def rates(self, interval_s: float) -> np.ndarray:
        """Estimated accesses per second per unit: ``freq`` when the backend estimated it, else
        the interval's count over its length (a lower bound: one count per scan at most)."""
        if len(self.freq) == len(self.addr):
            return self.freq.astype(np.float32, copy=False)
        return (self.count.astype(np.float64) / max(float(interval_s), 1e-6)).astype(np.float32)


class Profiler(ABC):
    """A source of per-page access counts."""

    name = "?"
    # How old a Sample's node may be (the backend observes nodes when it scans); the daemon
    # keeps its own record of a unit it moved for that long.
    node_lag_s = 0.0

    @classmethod
    def probe(cls) -> None:
        """Raise pagetier.errors.Unavailable naming what this kernel lacks; default: nothing."""

    @abstractmethod
    def attach(self, pid: int) -> None: ...

    @abstractmethod
    def detach(self, pid: int) -> None: ...

    @abstractmethod
    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        """Counts since the last reset; ``reset`` starts a new interval."""

    def stats(self, pid: int) -> dict:
        return {}

    def close(self) -> None:
        """Detach from every pid in ``self.pids``; safe to call twice. Backends that hold more
        call this first, then release their own resources."""
        for pid in list(getattr(self, "pids", ())):
            try:
                self.detach(pid)
            except PagetierError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
