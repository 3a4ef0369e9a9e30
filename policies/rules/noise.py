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

from dataclasses import dataclass

import numpy as np

from pagetier.core import sorted_find
from pagetier.policies.rules.arrays import argsort_desc


def reference_heat(ranked: np.ndarray, rest: float, c, cool: Cool | None = None) -> float | None:
    """The heat of the coldest of the units ``ranked`` (hottest first) that carry ``ref_mass``
    of all the heat, ``rest`` being the summed heat of units left out of ``ranked`` (all colder
    than ``min_heat``; when the reference falls among them it is ``min_heat``). 0.0 if none.

    ``cool``: ranked units left out of ``ranked``, each colder than all of it (:class:`Cool`).
    All the heat is then the ranked sum continued over them in order, and only the unit on
    which the share falls matters: it is the one the share falls on for every total within
    the sums' rounding (:func:`_share_index`), or None (the bounds disagree, or the share
    falls among the cool units): the caller ranks the cool units too."""
    if not len(ranked):
        return 0.0 if cool is None or not cool.n else None
    cum = np.cumsum(ranked)
    if cool is not None:
        k = _share_index(cum, rest, cool, c)
        if k is None or k >= len(ranked):
            return None
        return float(ranked[k])
    k = int(np.searchsorted(cum, c.ref_mass * (cum[-1] + rest), "left"))
    if k < len(ranked):
        return float(ranked[k])
    return float(ranked[-1]) if rest <= 0 else min(float(ranked[-1]), c.min_heat)


@dataclass(frozen=True)
class Cool:
    """Ranked units a decision left out (rules/cool.py): ``n`` of them, ``heat`` their summed
    score (in any order), each score under ``below``."""

    n: int
    heat: float
    below: float

    @property
    def bound(self) -> float:
        """Above every cool unit's ranking key (its score times at most ``1 + 1e-9``, the
        tie-break to fast units)."""
        return self.below * (1.0 + 4e-9)


# the relative error of a float64 sum of n positive terms, in any order, is under n units in
# the last place (2**-53 each); the bounds below allow four times that
_ULP = 2.0 ** -53


def _share_index(cum: np.ndarray, rest: float, cool: Cool, c) -> int | None:
    """The index :func:`reference_heat` finds in the cumulative sum of every ranked unit (the
    ``cum`` of the ranked ones, then the cool ones after them), when the share's target falls
    on the same index for every total within the sums' rounding: the exact total's bits
    (the ordered sum over every unit) then do not matter. None when the bounds disagree."""
    total = float(cum[-1]) + cool.heat
    err = 4.0 * (len(cum) + cool.n + 2) * _ULP * (total + abs(rest))
    lo = int(np.searchsorted(cum, c.ref_mass * ((total - err) + rest), "left"))
    hi = int(np.searchsorted(cum, c.ref_mass * ((total + err) + rest), "left"))
    return lo if lo == hi else None


def noise_floor(ref: float, c) -> float:
    """The heat under which a unit is noise: ``noise_ratio`` times the reference, at least
    ``min_heat``."""
    return max(c.min_heat, c.noise_ratio * ref)


def hot_order(score, cand, fast, c, rest: float = 0.0, npages=None, cool: Cool | None = None):
    """(units of ``cand`` above the noise floor, hottest first with ties to fast residents;
    reference heat; floor). Given the units' sizes ``npages``, when there is more than one
    among them: hottest per page first (the floor is a unit's heat all the same).
    ``rest``: the summed score of units left out of ``cand``. ``cool``: ranked units left out
    of ``cand`` (:class:`Cool`); None when the result is not the one ranking them too would
    give (the reference, or the floor, not above every one of them)."""
    s = sorted_find.scale_fast(score, cand, fast)  # one pass in compiled code, when built
    if s is None:
        s = score[cand] * (1.0 + 1e-9 * fast[cand])
    by = argsort_desc(s)
    order = cand[by]
    ranked = score[order]
    ref = reference_heat(ranked, rest, c, cool)
    if ref is None:
        return None
    floor = noise_floor(ref, c)
    if cool is not None and cool.n and not (ref > cool.bound and floor > cool.bound):
        return None  # a cool unit could rank before the reference or be hot
    # ranked is non-increasing up to the 1e-9 tie-break: the hot units are a prefix
    n_hot = int(np.count_nonzero(ranked >= floor))
    order = order[:n_hot]
    if npages is not None and n_hot > 1:
        size = npages[order]
        if int(size.min()) != int(size.max()):  # one size: the same order
            order = order[argsort_desc(s[by[:n_hot]] / size)]
    return order, ref, floor
