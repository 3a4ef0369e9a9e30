"""Rule 2, the hot set: the units above the noise floor, ranked (per page with ``per_page``),
that fit the capacity the policy plans for (``low_watermark`` times the budget, or the fast
node's room when less). The heat of the coldest of them is the interval's hot threshold.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagetier.policies.rules.arrays import sorted_unique
from pagetier.policies.rules.noise import Cool, hot_order
from pagetier.policies.rules.planner import fill_budget


@dataclass
class HotSet:
    """``order``: every unit above the noise floor, hottest first (``pages`` in all);
    ``desired``: the prefix of it that fits (``desired_pages``), and the same units in index
    order (``by_index``); ``ref``: the reference heat; ``floor``: the noise floor."""

    order: np.ndarray
    ref: float
    floor: float
    pages: int
    desired: np.ndarray
    desired_pages: int
    by_index: np.ndarray

    def remap(self, remap: np.ndarray) -> None:
        """Follow the units to their new positions (``remap[old] == new``)."""
        self.order, self.desired, self.by_index = (
            remap[self.order], remap[self.desired], remap[self.by_index])


def hot_set(score, known, fast, npages, cap: int, c, rest: float = 0.0,
            cool: Cool | None = None) -> HotSet | None:
    """The hot set by ``score`` among units on a known node (``known``), ties to the fast
    ones (``fast``), fitting ``cap`` pages; ``rest``: the summed score of units left out.
    ``cool``: ranked units left out as well (rules/cool.py); None when ranking them might
    have given another hot set."""
    got = hot_order(score, np.flatnonzero(known & (score > 0)), fast, c, rest,
                    npages if c.per_page else None, cool)
    if got is None:
        return None
    order, ref, floor = got
    pages = int(npages[order].sum())
    desired = fill_budget(order, npages, cap)
    desired_pages = pages if len(desired) == len(order) else int(npages[desired].sum())
    return HotSet(order, ref, floor, pages, desired, desired_pages,
                  sorted_unique(desired, len(score)))
