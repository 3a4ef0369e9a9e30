"""Rule 11, sparse evidence: when the reads are sampled so thinly that a hot unit shows up a
few times or not at all in a read (hardware-sampled, PEBS-like traces), decide on rates
estimated across reads, with a confidence that grows with the samples, not on one read's
margins.

Every read, each unit's samples (this read's rate, taken as its sample count) go into a count
decayed by ``sparse_decay`` per read; the exposure is the same decayed sum of reads, so a
unit's rate estimate is count / exposure samples per read. Its confidence bounds are the
Poisson ones for that count (Wilson-Hilferty's approximation, ``sparse_z`` standard
deviations): a unit seen 1 time in 10 reads could be at 0 or at 0.4 a read; seen 10 times it
is at 0.5-1.5. With sparse evidence, a sampled unit off the fast node takes free room (best
lower bound first), and it pushes a resident out only when its lower bound per page is above
that resident's upper bound per page (the resident with the lowest upper bound goes first). A
one-off burst of samples does not outrank a unit sampled steadily: both are judged on their
counts over many reads, and the burst's decays.

Samples are few per unit but many per region: each unit is lent ``sparse_region_weight``
times the samples per page of the other units of its ``sparse_region``-page region (2 MiB by
default), so that a unit among sampled ones ranks above one in a region nobody sampled
before its own first sample lands (PEBS-driven tiering promotes by huge page for the same
reason). On the built-in traces thinned to 1/100,000 of their accesses, this took the mean
time over static placement from 1.107 to 1.047 (torch-mlp at 25%: 1.202 to 1.018).

The rule engages when evidence is sparse: the running mean (over the same decayed reads) of
each read's sample-weighted median count is under ``sparse_samples``: the units that carry
half of a read's samples are seen about once in it, as in a thinly sampled trace. The
recorded traces of ``pagetier record`` (scan hits: a hot unit is found in most of a read's
scans) are not sparse by this test (the lowest such mean on the built-in set is 1.3, on
hotcold-phased, against 1.0 on redis and pagerank thinned to 1/10,000 of their accesses), so
the other rules decide there as before.
"""
from __future__ import annotations

import numpy as np

from pagetier.core.arrays import unique
from pagetier.policies.rules.planner import plan_moves
from pagetier.policies.rules.view import NEVER

SETTLE_READS = 3  # reads before the evidence is judged sparse
# per-unit counts are kept only while the typical count a read is below this many times
# sparse_samples: reads far denser than that (pagetier.ko's, at hundreds a second) never engage
# the rule, and its bookkeeping over every sampled unit would cost the daemon each interval
TRACK_FACTOR = 10.0


def poisson_bounds(k: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) confidence bounds on the mean of a Poisson count ``k`` (a float array:
    decayed counts are not whole), ``z`` standard deviations out (Wilson-Hilferty)."""
    k = np.asarray(k, np.float64)
    kp = np.maximum(k, 1e-12)
    lo = kp * np.clip(1.0 - 1.0 / (9.0 * kp) - z / (3.0 * np.sqrt(kp)), 0.0, None) ** 3
    lo = np.where(k > 0, lo, 0.0)
    k1 = k + 1.0
    hi = k1 * (1.0 - 1.0 / (9.0 * k1) + z / (3.0 * np.sqrt(k1))) ** 3
    return lo, hi


class SparseEvidence:
    """Each sampled unit's decayed sample count (sorted ``keys``, ``count``), and the decayed
    number of reads (``exposure``) they are counted over."""

    def __init__(self, decay: float):
        self.decay = decay
        self.keys = np.zeros(0, np.uint64)
        self.count = np.zeros(0, np.float64)
        self.exposure = 0.0
        self.reads = 0
        self.typical = 0.0  # running mean of each read's sample-weighted median count

    def add(self, keys: np.ndarray, samples: np.ndarray, track_below: float = np.inf) -> None:
        """One read: everything decays a read, units ``keys`` gain ``samples``; the per-unit
        counts are dropped, and not kept, while the typical count is ``track_below`` or more."""
        self.exposure = self.decay * self.exposure + 1.0
        samples = np.asarray(samples, np.float64)
        if samples.sum() > 0:  # the count at which half of this read's samples are
            x = np.sort(samples)
            cw = np.cumsum(x)
            med = float(x[np.searchsorted(cw, 0.5 * cw[-1])])
            w = 1.0 / self.exposure  # a running mean over the decayed reads
            self.typical = med if not self.reads else (1 - w) * self.typical + w * med
            self.reads += 1
        if self.reads and self.typical >= track_below:
            self.keys, self.count = self.keys[:0], self.count[:0]
            return
        srt = np.argsort(keys, kind="stable")
        keys, samples = np.asarray(keys)[srt], samples[srt]
        count = self.count * self.decay
        keep = count >= 1e-3  # counts that have faded out are forgotten
        old_k, old_c = self.keys[keep], count[keep]
        keys = np.asarray(keys, np.uint64)
        allk = unique(np.concatenate([old_k, keys]))  # np.union1d hashes: slow on numpy 2.4
        c = np.zeros(len(allk), np.float64)
        c[np.searchsorted(allk, old_k)] += old_c
        np.add.at(c, np.searchsorted(allk, keys), np.asarray(samples, np.float64))
        self.keys, self.count = allk, c

    def counts(self, keys: np.ndarray) -> np.ndarray:
        """The decayed sample counts of units ``keys`` (0 for units never sampled)."""
        if not len(self.keys):
            return np.zeros(len(keys), np.float64)
        pos = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[pos] == keys, self.count[pos], 0.0)

    def sparse(self, c) -> bool:
        """Whether the evidence is sparse: after ``SETTLE_READS`` reads, the typical sample
        count a read (:meth:`add`'s running mean) is under ``sparse_samples``."""
        return self.reads >= SETTLE_READS and self.typical < c.sparse_samples


def pooled(keys, k, npages, c) -> np.ndarray:
    """Each unit's count with its region's samples lent to it: ``sparse_region_weight``
    times the samples per page of the other units of its ``sparse_region``-page region,
    times its pages. Memory is used by the region: a unit next to sampled ones is likely
    hot even before a sample lands on it."""
    shift = int(np.log2(c.sparse_region))
    reg = (np.asarray(keys, np.uint64) >> np.uint64(shift))
    uniq, inv = np.unique(reg, return_inverse=True)
    rc = np.bincount(inv, weights=k, minlength=len(uniq))
    rp = np.bincount(inv, weights=npages.astype(np.float64), minlength=len(uniq))
    others_pages = np.maximum(rp[inv] - npages, 1.0)
    lent = (rc[inv] - k) / others_pages * npages
    return k + c.sparse_region_weight * lent


def sparse_plan(keys, node, npages, last_move, stuck, ev: SparseEvidence, fast_node: int,
                now: int, used: int, cap_high: int, must: int, max_moves: int, c):
    """(promote, demote, stats) over the units given (every unit of the state): sampled units
    off the fast node fill free room best lower bound first; one pushes residents out only
    with its lower bound per page above each evicted resident's upper bound per page.
    Units moved within ``min_residency`` reads, and stuck ones, stay where they are."""
    k = ev.counts(keys)
    if c.sparse_region > 0:
        k = pooled(keys, k, npages, c)
    exp = max(ev.exposure, 1e-9)
    per = npages.astype(np.float64)
    lo, hi = poisson_bounds(k, c.sparse_z)
    lo_pp, hi_pp, est_pp = lo / exp / per, hi / exp / per, k / exp / per
    still = (last_move != NEVER) & (now - last_move < c.min_residency)
    fast = node == fast_node
    free = ~still & ~stuck
    cand = np.flatnonzero(~fast & (node >= 0) & (k > 0) & free)
    cand = cand[np.lexsort((-est_pp[cand], -lo_pp[cand]))]
    vict = np.flatnonzero(fast & free)
    vict = vict[np.lexsort((est_pp[vict], hi_pp[vict]))]
    p, d = plan_moves(npages.astype(np.int64), cand, lo_pp[cand] if len(cand) else lo_pp[:0],
                      vict, hi_pp[vict], used=used, cap=cap_high, must=must,
                      max_moves=max_moves)
    stats = {"sparse": True, "typical_samples": round(ev.typical, 3),
             "sampled_units": int(len(ev.keys)), "exposure": round(ev.exposure, 3)}
    return p, d, stats
