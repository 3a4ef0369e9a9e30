"""Rule 6, the young read: the read in which most of the hot set's pages have their first
estimate, and the read after it.

First estimates tell a hot unit from noise by a small factor only, so on a young read a unit
moves only at ``young_ratio`` times the median heat of the hot set's units of its size or,
with units of more than one size, per page at ``young_ratio`` times the hot set's median heat
per page (weighted by pages, so the size that holds most of the hot set sets it: a small unit
hotter per page than the hot huge units is not noise). In the read after it a unit must also
be at the exchange bar by this read's rate: its heat is still mostly that first estimate.
"""
from __future__ import annotations

import numpy as np


def is_young(dsize, prev_desired, desired_pages: int, c) -> bool:
    """Whether most of the hot set's pages (sizes ``dsize``, heat after the last read
    ``prev_desired``, ``desired_pages`` in all) have their first estimate in this read (no heat
    of ``min_heat`` before it)."""
    first = int(dsize[prev_desired < c.min_heat].sum())
    return bool(len(dsize)) and 2 * first >= desired_pages


def weighted_median_per_page(desired_score, dsize) -> float:
    """The hot set's median heat per page, each unit weighted by its pages."""
    pp = desired_score / dsize
    srt = np.argsort(pp, kind="stable")
    cw = np.cumsum(dsize[srt])
    return float(pp[srt][np.searchsorted(cw, 0.5 * cw[-1])])


def young_bar(med, desired_score, dsize, npages, c) -> np.ndarray:
    """The heat each candidate (sizes ``npages``, its size's median ``med``) is measured
    against on a young read, before ``young_ratio``: its size's median or, with ``per_page``
    and more than one size in the hot set, the lower of that and the weighted median per page
    times its pages."""
    if c.per_page and int(dsize.min()) != int(dsize.max()):
        return np.minimum(med, weighted_median_per_page(desired_score, dsize) * npages)
    return med


def young_ok(young: bool, fs, fnow, fbar, ybar, c) -> np.ndarray:
    """Which candidates (heat ``fs``, this read's rate as heat ``fnow``, exchange bar
    ``fbar``) may move on a young read (``young``, against ``ybar``) or on the read after it."""
    if young:
        return fs >= c.young_ratio * ybar
    return np.minimum(fs, fnow) >= fbar
