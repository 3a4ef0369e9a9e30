"""Rule 4, the exchange bar: when a promotion needs room, which candidates may push a resident
out, and how far ahead of their victims they must be.

A promotion that evicts is taken only for a unit measurably hotter than what it evicts (heat
per page above the victim's times ``1 + margin``, and ahead by ``gap_ratio`` times the
reference heat over its pages: two noise units never swap), and hot rather than warm: at
least ``exchange_ratio`` times the median heat of the hot set's units of its size (2 MiB units
are compared with 2 MiB units, 4 KiB ones with 4 KiB ones, so a few small units cannot drag
the median down among the noise). Colder units are warm: they may fill free room
(policies/rules/fill.py) but never push a resident out.

With ``sustained_exchange`` a unit must be at the bar on two reads: now, and before this
interval's read when it was warm already. One estimate that jumped is not a hot unit. A unit
cold before is not held back (a new hot unit evicts at once), nor one at ``one_read_ratio``
times the median by this read alone: that is as hot as the hot set, not a jump from the noise.
"""
from __future__ import annotations

import numpy as np

from pagetier.policies.rules.arrays import median_by_size


def exchange_bar(desired_score, dsize, npages, c) -> tuple[np.ndarray, np.ndarray]:
    """(the median heat of the hot set's units of each unit's size, the exchange bar: that
    times ``exchange_ratio``). ``desired_score``/``dsize``: the hot set's heat and sizes;
    ``npages``: the sizes of the units to give a median to."""
    med = median_by_size(desired_score, dsize, npages)
    return med, c.exchange_ratio * med


def heat_before(heat, rate, decay: float) -> tuple[np.ndarray, np.ndarray]:
    """(each unit's heat before this read, decayed; the same as the last read left it).
    A unit's heat is this read's rate plus ``decay`` times its heat after the last read."""
    before = np.maximum(heat - rate, 0.0)
    return before, before / decay


def steady_heat(score, before, prev, med, c) -> np.ndarray:
    """The heat an exchange judges a unit on with ``sustained_exchange``: the lower of its
    score now and its heat after the last read (``prev``) for a unit warm before (``before``
    at least ``min_heat``) and under ``one_read_ratio`` times the median ``med``; its score
    for the others."""
    held = before >= c.min_heat
    if c.one_read_ratio > 0:
        held &= score < c.one_read_ratio * med
    return np.where(held, np.minimum(score, prev), score)
