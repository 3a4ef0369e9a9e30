"""Rule 5, fill: which hot-set units off the fast node may take free room (no resident
pushed out).

A unit at the exchange bar fills free room; a warm unit (under the bar) only at
``fill_ratio`` times the median heat of the hot set's units of its size. With
``sustained_fill`` free room is filled on two reads as well: a unit at the bar by one estimate
that jumped waits for the next read, as for an exchange, and a warm unit must be at
``fill_ratio`` times the hot set's median on each of its last estimates (this read's rate, its
heat now and its heat after the last read) and must have been above the noise floor before
this read. A page of sparse noise is above the floor in the read after its one access and
never again: it must not fill the room every interval only to be demoted again.

A unit the last decision promoted that is still off the fast node (its move was deferred or a
limit clipped it) fills free room on that decision's evidence (``promoted_last``): the reads
after a long move find the program slowed, and the two-read tests would hold it back again.
"""
from __future__ import annotations

import numpy as np

from pagetier.policies.rules.arrays import median_by_size, member_sorted


def fill_ok(fs, fbar, med, c) -> np.ndarray:
    """Which candidates (heat ``fs``, exchange bar ``fbar``, their size's median heat in the
    hot set ``med``) may fill free room on this read alone: at the bar, or at ``fill_ratio``
    times the median."""
    return (fs >= fbar) | (fs >= c.fill_ratio * med)


def sustained_fill(fs, fbar, steady, fnow, fb, scale, floor: float, c) -> np.ndarray:
    """Which candidates may fill free room on two reads: at the bar by their steady heat
    (``steady``, None: by ``fs``), or warm at ``fill_ratio`` times ``scale`` (the hot set's
    median at the better of its heat now and before) by the lowest of ``fs``, this read's rate
    as a steady heat ``fnow`` and the heat after the last read ``fb``, with ``fb`` at least
    the noise ``floor``."""
    hot_fill = (fs if steady is None else steady) >= fbar
    warm = np.minimum(fs, np.minimum(fnow, fb))
    return hot_fill | ((warm >= c.fill_ratio * scale) & (fb >= floor))


def fill_scale(desired_score, prev_desired, dsize, npages) -> np.ndarray:
    """The hot set's median heat for ``sustained_fill``, per size of ``npages``: each hot unit
    at the better of its heat now and after the last read (a read that finds the hot units
    slowed lowers the hot set's estimates, not what a warm unit must reach)."""
    return median_by_size(np.maximum(desired_score, prev_desired), dsize, npages)


def promoted_last(keys_of, fc, chosen) -> np.ndarray:
    """Which candidates ``fc`` (``keys_of(fc)``: their keys) the last decision promoted
    (``chosen``: sorted keys, or None): they fill free room on that decision's evidence."""
    if chosen is None or not len(chosen) or not len(fc):
        return np.zeros(len(fc), bool)
    return member_sorted(keys_of(fc), chosen)
