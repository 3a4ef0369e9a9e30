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

Samples are few per unit but many per region: each unit is lent a weight times the samples
per page of the other units of its ``sparse_region``-page region (2 MiB by default), so that a
unit among sampled ones ranks above one in a region nobody sampled before its own first sample
lands (PEBS-driven tiering promotes by huge page for the same reason). How much a region says
about its units depends on the program (an array swept in full, or a hash table's hot and cold
values side by side) and on the sampling rate (the thinner, the less a unit's own count is
worth), so the weight is learnt from the trace (:class:`RegionFit`, ``sparse_region_fit``):
each read scores every weight by how well the counts before the read predicted where its
samples landed, and the best one over the decayed reads is lent (``sparse_region_weight``, 8,
until a read is scored, or always with the fit off).

The rule engages when evidence is sparse: the running mean (over the same decayed reads) of
each read's sample-weighted median count is under ``sparse_samples`` (1.3): the units that
carry half of a read's samples are seen about once in it, as in a thinly sampled trace. The
first read is left out of that mean (``SKIP_READS``): it counts what the program touched
before it (on pagerank and redis thinned to 1/10,000 of their accesses its median is 24 and
11, against 1-3 in the reads after it), and kept pagerank's mean above 1.2 in every read. The
recorded traces of ``pagetier record`` (scan hits: a hot unit is found in most of a read's
scans) are not sparse by this test (the lowest such mean on the built-in set is 1.41, churn's
fourth read, then 1.76 on hotcold-phased; 1.0 and 1.16 on redis and pagerank thinned to
1/10,000), so the other rules decide there as before.
"""
from __future__ import annotations

import numpy as np

from pagetier.core import sorted_find
from pagetier.core.arrays import unique
from pagetier.policies.rules.planner import plan_moves
from pagetier.policies.rules.view import NEVER

SETTLE_READS = 3  # reads in the typical count before the evidence is judged sparse
# reads with samples left out of the typical count: the first one's counts are the start-up's
# (what the program touched before it: a median of 24 on pagerank at 1/10,000, then 1-3)
SKIP_READS = 1
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


def sorted_rates(x: np.ndarray) -> np.ndarray:
    """``np.sort(x)`` for float64 ``x``, sorted as float32 when every value is one (rates read
    from a PageState are): the same values in the same order, by a radix sort with the
    compiled helpers (pagetier/core/sorted_find.py)."""
    with np.errstate(over="ignore"):  # a value out of float32's range: sorted as float64
        x32 = x.astype(np.float32)
    if not np.array_equal(x32, x):
        return np.sort(x)
    return sorted_find.sort(x32).astype(np.float64)


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
        self.seen = 0  # reads with samples, the first SKIP_READS of them not in the mean
        self.last_keys = np.zeros(0, np.uint64)  # the last read's sampled units (sorted)...
        self.last = np.zeros(0, np.float64)  # ...and their samples
        self.fit = None  # RegionFit: the lent weight that predicts each read's samples best
        self._typical_exp = 0.0  # the decayed number of reads in the mean

    def add(self, keys: np.ndarray, samples: np.ndarray, track_below: float = np.inf) -> None:
        """One read: everything decays a read, units ``keys`` gain ``samples``; the per-unit
        counts are dropped, and not kept, while the typical count is ``track_below`` or more."""
        self.exposure = self.decay * self.exposure + 1.0
        samples = np.asarray(samples, np.float64)
        if samples.sum() > 0:  # the count at which half of this read's samples are
            self.seen += 1
            if self.seen > SKIP_READS:  # the first read's counts are the start-up's
                x = sorted_rates(samples)
                cw = np.cumsum(x)
                med = float(x[np.searchsorted(cw, 0.5 * cw[-1])])
                self._typical_exp = self.decay * self._typical_exp + 1.0
                w = 1.0 / self._typical_exp  # a running mean over the decayed reads
                self.typical = med if not self.reads else (1 - w) * self.typical + w * med
                self.reads += 1
        if self.reads and self.typical >= track_below:
            self.keys, self.count = self.keys[:0], self.count[:0]
            return
        srt = np.argsort(keys, kind="stable")
        keys, samples = np.asarray(keys)[srt], samples[srt]
        self.last_keys, self.last = np.asarray(keys, np.uint64), samples
        count = self.count * self.decay
        keep = count >= 1e-3  # counts that have faded out are forgotten
        old_k, old_c = self.keys[keep], count[keep]
        keys = np.asarray(keys, np.uint64)
        allk = unique(np.concatenate([old_k, keys]))  # np.union1d hashes: slow on numpy 2.4
        c = np.zeros(len(allk), np.float64)
        c[np.searchsorted(allk, old_k)] += old_c
        np.add.at(c, np.searchsorted(allk, keys), np.asarray(samples, np.float64))
        self.keys, self.count = allk, c

    def last_samples(self, keys: np.ndarray) -> np.ndarray:
        """The last read's samples of units ``keys`` (0 for units it did not sample)."""
        if not len(self.last_keys):
            return np.zeros(len(keys), np.float64)
        pos = np.minimum(np.searchsorted(self.last_keys, keys), len(self.last_keys) - 1)
        return np.where(self.last_keys[pos] == keys, self.last[pos], 0.0)

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


def lent_samples(keys, k, npages, region: int) -> np.ndarray:
    """Each unit's share of its region's other samples: the samples per page of the other
    units of its ``region``-page region, times its pages."""
    reg = (np.asarray(keys, np.uint64) >> np.uint64(int(np.log2(region))))
    uniq, inv = np.unique(reg, return_inverse=True)
    rc = np.bincount(inv, weights=k, minlength=len(uniq))
    rp = np.bincount(inv, weights=npages.astype(np.float64), minlength=len(uniq))
    others_pages = np.maximum(rp[inv] - npages, 1.0)
    return (rc[inv] - k) / others_pages * npages


def pooled(keys, k, npages, c, weight=None) -> np.ndarray:
    """Each unit's count with its region's samples lent to it: ``weight`` (by default
    ``sparse_region_weight``) times :func:`lent_samples`. Memory is used by the region: a
    unit next to sampled ones is likely hot even before a sample lands on it."""
    w = c.sparse_region_weight if weight is None else weight
    return k + w * lent_samples(keys, k, npages, c.sparse_region)


# the lent weights RegionFit chooses from
FIT_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


class RegionFit:
    """How much a region's samples say about its units, learnt from the trace: for each
    weight of :data:`FIT_WEIGHTS`, the decayed log-likelihood of each read's samples under
    the rates the weight gave from the reads before it (a sample lands on a unit with
    probability proportional to its estimated rate). The best weight is lent.

    A region whose units are alike (an array swept in full) says much about each of them; one
    that mixes hot and cold units (a hash table's values) says little. Thinner samples make a
    unit's own count worth less, so the best weight also grows as the sampling rate falls (on
    pagerank, redis, sqlite and torch-mlp a fixed weight of 2 did best at 1/10,000 of the
    accesses, 8 at 1/100,000). Scoring costs a pass over the units per weight, only on the
    reads the rule decides.
    """

    def __init__(self, decay: float):
        self.decay = decay
        self.ll = np.zeros(len(FIT_WEIGHTS), np.float64)
        self.reads = 0

    def update(self, keys, k_before, x, npages, region: int) -> None:
        """One read: ``x`` its samples of units ``keys``, ``k_before`` their counts before it."""
        tot = float(x.sum())
        if tot <= 0:
            return
        lent = lent_samples(keys, k_before, npages, region)
        # a unit with no count and nothing lent may still be sampled: a small share, not 0
        eps = 5e-4 * tot / max(len(keys), 1)
        hit = x > 0
        ll = np.empty(len(FIT_WEIGHTS))
        for i, w in enumerate(FIT_WEIGHTS):
            lam = k_before + w * lent + eps
            ll[i] = float(np.dot(x[hit], np.log(lam[hit]))) - tot * np.log(lam.sum())
        self.ll = self.decay * self.ll + ll / tot  # per sample: reads weigh alike
        self.reads += 1

    def weight(self, default: float) -> float:
        """The weight with the best decayed likelihood; ``default`` until a read is scored."""
        return float(FIT_WEIGHTS[int(np.argmax(self.ll))]) if self.reads else default


def sparse_plan(keys, node, npages, last_move, stuck, ev: SparseEvidence, fast_node: int,
                now: int, used: int, cap_high: int, must: int, max_moves: int, c):
    """(promote, demote, stats) over the units given (every unit of the state): sampled units
    off the fast node fill free room best lower bound first; one pushes residents out only
    with its lower bound per page above each evicted resident's upper bound per page.
    Units moved within ``min_residency`` reads, and stuck ones, stay where they are."""
    k = ev.counts(keys)
    weight = c.sparse_region_weight
    if c.sparse_region > 0:
        if c.sparse_region_fit:
            if ev.fit is None:
                ev.fit = RegionFit(ev.decay)
            x = ev.last_samples(keys)
            ev.fit.update(keys, (k - x) / ev.decay, x, npages, c.sparse_region)
            weight = ev.fit.weight(weight)
        k = pooled(keys, k, npages, c, weight)
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
             "sampled_units": int(len(ev.keys)), "exposure": round(ev.exposure, 3),
             "region_weight": weight}
    return p, d, stats
