"""Rule 1, the noise floor: which units are hot enough to rank at all, and in what order.

The reference heat is the heat of the coldest of the hottest units that together carry
``ref_mass`` of all the heat. Units touched now and then carry a tiny share of the accesses,
so the reference is a hot unit's heat however many of them there are. A unit colder than
``noise_ratio`` times the reference (and than ``min_heat``) cannot be told from noise: it is
never promoted, so spare room is not filled with it.

Rule 2, ranking: the units above the floor are ranked hottest first, per page when there is
more than one unit size among them (``per_page``): the budget is in pages and a 2 MiB unit
takes 512 of them, so a huge unit must be hot for each of its pages to come before small ones.
"""
from __future__ import annotations

import numpy as np

from pagetier.core import sorted_find
from pagetier.policies.rules.arrays import argsort_desc


def reference_heat(ranked: np.ndarray, rest: float, c) -> float:
    """The heat of the coldest of the units ``ranked`` (hottest first) that carry ``ref_mass``
    of all the heat, ``rest`` being the summed heat of units left out of ``ranked`` (all colder
    than ``min_heat``; when the reference falls among them it is ``min_heat``). 0.0 if none."""
    if not len(ranked):
        return 0.0
    cum = np.cumsum(ranked)
    k = int(np.searchsorted(cum, c.ref_mass * (cum[-1] + rest), "left"))
    if k < len(ranked):
        return float(ranked[k])
    return float(ranked[-1]) if rest <= 0 else min(float(ranked[-1]), c.min_heat)


def noise_floor(ref: float, c) -> float:
    """The heat under which a unit is noise: ``noise_ratio`` times the reference, at least
    ``min_heat``."""
    return max(c.min_heat, c.noise_ratio * ref)


def hot_order(score, cand, fast, c, rest: float = 0.0, npages=None):
    """(units of ``cand`` above the noise floor, hottest first with ties to fast residents;
    reference heat; floor). Given the units' sizes ``npages``, when there is more than one
    among them: hottest per page first (the floor is a unit's heat all the same).
    ``rest``: the summed score of units left out of ``cand``."""
    s = sorted_find.scale_fast(score, cand, fast)  # one pass in compiled code, when built
    if s is None:
        s = score[cand] * (1.0 + 1e-9 * fast[cand])
    by = argsort_desc(s)
    order = cand[by]
    ranked = score[order]
    ref = reference_heat(ranked, rest, c)
    floor = noise_floor(ref, c)
    # ranked is non-increasing up to the 1e-9 tie-break: the hot units are a prefix
    n_hot = int(np.count_nonzero(ranked >= floor))
    order = order[:n_hot]
    if npages is not None and n_hot > 1:
        size = npages[order]
        if int(size.min()) != int(size.max()):  # one size: the same order
            order = order[argsort_desc(s[by[:n_hot]] / size)]
    return order, ref, floor
