"""What a profiler hands the daemon, the simulator and the trace files: one interval's access
counts of one process, per unit (a 4 KiB page, a 2 MiB huge mapping, or a region: 2 MiB of
separately mapped 4 KiB pages)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Sample.kind codes: the kind of memory a unit is
KIND_ANON, KIND_SHMEM, KIND_FILE = 0, 1, 2
KIND_NAMES = ("anon", "shmem", "file")


@dataclass
class Sample:
    """One interval's access counts for one process, one entry per tracked mapping unit.

    addr: start address (uint64); count: accesses since the last read (uint32);
    node: NUMA node or -1 if unknown (int16); npages: 4 KiB pages in the unit, 1 or 512 (uint16);
    freq: estimated accesses per second of the unit over the interval (float32), the one
    frequency signal every backend maps to (0: not accessed). Empty when a backend gives no
    estimate: use :meth:`rates` rather than reading it directly.

    region: which units are regions (bool), or empty when none is. A region is 2 MiB of
    separately mapped 4 KiB pages (``addr`` 2 MiB aligned, ``npages`` 512), its count and freq
    summed over its pages and its node that of most of them; it is moved page by page. A unit
    of 512 pages that is not a region is one huge mapping, moved by its start address.

    span: for a complete sample, the addresses ``[start, end)`` whose units it lists, all of
    them (a unit is inside when its start address is); None: the whole address space.

    kind: the kind of memory of each unit (uint8: KIND_ANON, KIND_SHMEM, KIND_FILE), or empty
    when the backend does not know: use :meth:`kinds`. A region holding more than one kind has
    the first of file, shmem it holds.

    shared: which units were mapped more than once (bool: by other processes too, or shared
    copy-on-write after a fork; move_pages moves them only with MPOL_MF_MOVE_ALL), or empty
    when the backend does not know.
    """

    pid: int
    addr: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    node: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    npages: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16))
    complete: bool = True  # False when only accessed units are listed
    freq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    region: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    span: tuple[int, int] | None = None
    kind: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    def __len__(self) -> int:
        return len(self.addr)

    def take(self, sel, **fields) -> "Sample":
        """The units ``sel`` picks (a slice, a mask or indices), every per-unit array cut alike
        (one left empty stays empty); ``fields`` replace any field of the result."""
        n = len(self.addr)
        cut = lambda x: x[sel] if len(x) == n else x  # noqa: E731
        out = Sample(pid=self.pid, addr=self.addr[sel], count=cut(self.count),
                     node=cut(self.node), npages=cut(self.npages), complete=self.complete,
                     freq=cut(self.freq), region=cut(self.region), span=self.span,
                     kind=cut(self.kind), shared=cut(self.shared))
        for name, value in fields.items():
            setattr(out, name, value)
        return out

    def regions(self) -> np.ndarray:
        """Which units are regions (bool, one per unit; all False when ``region`` is empty)."""
        if len(self.region) == len(self.addr):
            return self.region.astype(bool, copy=False)
        return np.zeros(len(self.addr), bool)

    def kinds(self) -> np.ndarray:
        """The kind of each unit (uint8, one per unit; KIND_ANON for all when ``kind`` is empty)."""
        if len(self.kind) == len(self.addr):
            return self.kind.astype(np.uint8, copy=False)
        return np.full(len(self.addr), KIND_ANON, np.uint8)

    def rates(self, interval_s: float) -> np.ndarray:
        """Estimated accesses per second per unit: ``freq`` when the backend estimated it, else
        the interval's count over its length (a lower bound: one count per scan at most)."""
        if len(self.freq) == len(self.addr):
            return self.freq.astype(np.float32, copy=False)
        return (self.count.astype(np.float64) / max(float(interval_s), 1e-6)).astype(np.float32)
