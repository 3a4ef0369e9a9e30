"""Per-page state the daemon keeps, as numpy arrays (36 bytes per tracked unit).

A unit is a 4 KiB page or a 2 MiB huge mapping (npages 512). Units are kept sorted by
``key = (target << 48) | (addr >> 12)`` so that merging an interval's sample is a
searchsorted, not a Python loop.

The access signal is a rate, not a count: each sample gives every unit an estimated number of
accesses per second (``Sample.rates``: the profiler's frequency estimate where it has one, else
the interval's count over its length, which is about one per scan and so close to yes/no).

- ``rate``: this interval's rate (accesses/s), 0 for a unit not accessed in it;
- ``heat``: the decayed sum of the rates, ``heat = decay * heat + rate`` once per interval, so
  a unit accessed at a steady rate r has heat r / (1 - decay) (2r with the default 0.5). Heat
  is what every policy ranks by: with a real frequency signal a hot unit (hundreds to
  thousands of accesses/s) and a unit touched now and then (a few/s) differ by orders of
  magnitude in heat, where one count per interval made them tie. With one read per interval of
  1 s and no frequency estimate, heat is what it was before rates: the decayed sum of counts.
- ``count``: the raw accesses counted in the interval (summed over the interval's reads).

A read that covers only part of an interval (the sentinel policy reads at layer boundaries)
adds its rate weighted by the part of the interval it covers, so that several reads in one
interval add up to the interval's rate.
"""
from __future__ import annotations

import numpy as np

from pagetier.core.sample import Sample

NEVER = np.iinfo(np.int32).min

# flags
F_PRESENT = 1  # seen in the target's last complete sample
F_STUCK = 2  # its last move failed for good (e.g. -EACCES: a page shared with another process)
F_UNMOVABLE = 4  # a move failed for good and none has succeeded since: outside the fast budget

DTYPE = np.dtype(
    [
        ("addr", np.uint64),  # start address of the unit
        ("heat", np.float32),  # decayed sum of rates (see above)
        ("rate", np.float32),  # accesses/s in the current interval
        ("count", np.uint32),  # accesses in the last interval
        ("last_access", np.int32),  # interval of the last access, NEVER if none
        ("last_move", np.int32),  # interval of the last migration, NEVER if none
        ("target", np.uint16),  # index of the target process (see PageState.pids)
        ("npages", np.uint16),  # 4 KiB pages in the unit
        ("moves", np.uint16),  # migrations of this unit
        ("node", np.int8),  # NUMA node, -1 unknown
        ("flags", np.uint8),
    ]
)
assert DTYPE.itemsize == 36


def _keys(target: int | np.ndarray, addr: np.ndarray) -> np.ndarray:
    return (np.asarray(target, np.uint64) << np.uint64(48)) | (addr >> np.uint64(12))


class PageState:
    """Sorted structured array of units; columns are exposed as attributes (views)."""

    def __init__(self, decay: float = 0.5):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.a = np.zeros(0, DTYPE)
        self.pids: list[int] = []  # target index -> pid (-1: a free slot, reused)
        self.interval = 0

    def __len__(self) -> int:
        return len(self.a)

    def __getattr__(self, col):
        # columns as views: state.heat, state.node, ...
        if col in DTYPE.names:
            return self.__dict__["a"][col]
        raise AttributeError(col)

    @property
    def nbytes(self) -> int:
        return self.a.nbytes

    def target_index(self, pid: int) -> int:
        if pid not in self.pids:
            if -1 in self.pids:  # the slot of a forgotten target: indices stay below 2**16
                self.pids[self.pids.index(-1)] = pid
            else:
                self.pids.append(pid)
        return self.pids.index(pid)

    def begin_interval(self) -> None:
        """Decay heat and clear last-interval counts once per interval, before updates."""
        self.interval += 1
        self.a["heat"] *= np.float32(self.decay)
        self.a["count"] = 0
        self.a["rate"] = 0

    def update(self, sample: Sample, trust_moves: int = 0, interval_s: float = 1.0,
               elapsed_s: float | None = None, max_count: int | None = None) -> None:
        """Merge one target's sample for the current interval.

        ``interval_s``: the daemon's interval; ``elapsed_s``: the time the sample covers (since
        the target's previous read; default ``interval_s``). Its rates
        (``sample.rates(elapsed_s)``) are added to ``rate`` and ``heat`` weighted by
        ``min(1, elapsed_s / interval_s)``. ``max_count``: for a sample without a frequency
        estimate, the most counts a unit can show in the time (the scans it covers): a count of
        one per scan says accessed or not, and a unit that shows two because a second scan
        passed it before the read is no hotter than one that shows one.

        A profiler observes nodes when it scans, which may be before the daemon's last move:
        for units moved within the last ``trust_moves`` intervals the node the daemon recorded
        is kept over the sample's.
        """
        t = self.target_index(sample.pid)
        order = np.argsort(sample.addr, kind="stable")
        addr = sample.addr[order].astype(np.uint64)
        count = sample.count[order]
        elapsed = float(interval_s if elapsed_s is None else elapsed_s)
        weight = np.float32(min(1.0, max(elapsed, 1e-6) / max(float(interval_s), 1e-6)))
        if max_count is not None and len(sample.freq) != len(sample.addr):
            clipped = np.minimum(sample.count, np.uint32(max(1, int(max_count))))
            rate = (clipped[order] / max(elapsed, 1e-6)).astype(np.float32) * weight
        else:
            rate = sample.rates(elapsed)[order].astype(np.float32) * weight
        node = sample.node[order]
        npages = sample.npages[order]
        keys = _keys(t, addr)
        mine = self.a["target"] == t
        if sample.complete:
            # Units of this target absent from a complete sample are gone (unmapped).
            self.a["flags"][mine] &= ~np.uint8(F_PRESENT)
        all_keys = _keys(self.a["target"], self.a["addr"])
        pos = np.searchsorted(all_keys, keys)
        if len(all_keys):
            found = (pos < len(all_keys)) & (all_keys[np.minimum(pos, len(all_keys) - 1)] == keys)
        else:
            found = np.zeros(len(keys), bool)
        # existing units
        idx = pos[found]
        self.a["count"][idx] += count[found]
        self.a["rate"][idx] += rate[found]
        self.a["heat"][idx] += rate[found]
        recent = (self.interval - self.a["last_move"][idx].astype(np.int64)) < trust_moves
        self.a["node"][idx] = np.where(recent, self.a["node"][idx], node[found])
        self.a["npages"][idx] = npages[found]
        self.a["flags"][idx] |= np.uint8(F_PRESENT)
        acc = idx[(count[found] > 0) | (rate[found] > 0)]
        self.a["last_access"][acc] = self.interval
        # new units
        new = ~found
        if new.any():
            n = np.zeros(int(new.sum()), DTYPE)
            n["addr"] = addr[new]
            n["count"] = count[new]
            n["rate"] = rate[new]
            n["heat"] = rate[new]
            n["last_access"] = np.where((count[new] > 0) | (rate[new] > 0), self.interval, NEVER)
            n["last_move"] = NEVER
            n["target"] = t
            n["npages"] = npages[new]
            n["node"] = node[new]
            n["flags"] = F_PRESENT
            merged = np.concatenate([self.a, n])
            self.a = merged[np.argsort(_keys(merged["target"], merged["addr"]), kind="stable")]
        if sample.complete:
            self.a = self.a[(self.a["target"] != t) | (self.a["flags"] & F_PRESENT != 0)]

    def forget_target(self, pid: int) -> None:
        if pid in self.pids:
            t = self.pids.index(pid)
            self.a = self.a[self.a["target"] != t]
            self.pids[t] = -1

    def mark_stuck(self, idx: np.ndarray) -> None:
        """Units whose move failed for good: the daemon leaves them until :meth:`unstick`, and
        they count as unmovable (outside the fast budget) until a move of theirs succeeds."""
        self.a["flags"][idx] |= np.uint8(F_STUCK | F_UNMOVABLE)

    def unstick(self) -> None:
        """Let stuck units be tried again (they stay unmovable until a move succeeds)."""
        self.a["flags"] &= ~np.uint8(F_STUCK)

    def stuck(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of ``idx`` are stuck."""
        return (self.a["flags"][idx] & F_STUCK) != 0

    def unmovable(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of ``idx`` the kernel refused to move and has not moved since."""
        return (self.a["flags"][idx] & F_UNMOVABLE) != 0

    def forget(self, idx: np.ndarray) -> None:
        keep = np.ones(len(self.a), bool)
        keep[idx] = False
        self.a = self.a[keep]

    def pages_on(self, node: int) -> int:
        """4 KiB pages tracked on ``node``."""
        return int(self.a["npages"][self.a["node"] == node].sum(dtype=np.int64))

    def unmovable_on(self, node: int) -> int:
        """4 KiB pages on ``node`` the kernel refused to move (shared with other processes:
        library text, memory of a forked parent) and has not moved since."""
        sel = (self.a["node"] == node) & (self.a["flags"] & F_UNMOVABLE != 0)
        return int(self.a["npages"][sel].sum(dtype=np.int64))

    def movable_on(self, node: int) -> int:
        """4 KiB pages on ``node`` that count against a budget: all but :meth:`unmovable_on`."""
        return self.pages_on(node) - self.unmovable_on(node)

    def record_moves(self, idx: np.ndarray, node: int) -> None:
        self.a["node"][idx] = node
        self.a["flags"][idx] &= ~np.uint8(F_UNMOVABLE)
        self.a["last_move"][idx] = self.interval
        self.a["moves"][idx] = np.minimum(self.a["moves"][idx].astype(np.int64) + 1, 65535)

    def addresses(self, idx: np.ndarray) -> np.ndarray:
        return self.a["addr"][idx]

    def pid_of(self, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self.pids, np.int64)[self.a["target"][idx]]
