"""Frames for the simulator and the oracle, built from a table of counts (host tests)."""
from __future__ import annotations

import numpy as np

from pagetier.profiler.base import Sample


def frames_of(counts, pid=7):
    """counts[t][i]: accesses of page i in interval t (0: not listed)."""
    out = []
    for t, row in enumerate(counts):
        row = np.asarray(row)
        sel = np.flatnonzero(row)
        s = Sample(pid=pid, addr=(0x1000 * (sel + 1)).astype(np.uint64),
                   count=row[sel].astype(np.uint32), node=np.full(len(sel), -1, np.int16),
                   npages=np.ones(len(sel), np.uint16), complete=False)
        out.append((t, float(t), {pid: s}))
    return out
