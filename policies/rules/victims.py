"""Rule 10, victims: which fast-node units an exchange may demote, in what order.

Victims are the coldest fast units, per page with ``per_page`` (as the hot set is ranked).
Units the kernel refused to move (shared pages) neither go nor make room. When the state keeps
candidates, the decision looks at a pool of the fast node's coldest units only: enough of them
that the exchanges never reach past them (the rate limit, or the promotions plus what the
watermark demands, in units free to move). In each plan, units free to move come first, then
those outside the hot set; hysteresis holds unless the budget is already exceeded.
"""
from __future__ import annotations

import numpy as np

from pagetier.policies.rules.arrays import member_sorted
from pagetier.policies.rules.view import NEVER


def victim_pool(view, node: int, need: int, hot: np.ndarray, idle_only: bool, now: int,
                c) -> tuple[np.ndarray, bool]:
    """(the coldest units on ``node``, coldest first, enough that those free to move hold
    ``need`` pages, or all of them; whether that is all). Free to move: not moved within
    ``thrash_window``, not in the hot set (``hot``: sorted state indices), and with
    ``idle_only`` not accessed in this read."""
    # need is in pages and the pool in units: start from as many 2 MiB units as hold need (with
    # region and huge units, need + 64 would be the whole node), and grow it until the free
    # units hold need pages
    n = need // 512 + 64
    while True:
        pool, complete = view.coldest(node, n)
        last_move, npages, rate = view.pool_columns(pool)
        within = (last_move != NEVER) & (now - last_move <= c.thrash_window)
        free = ~within & ~member_sorted(pool, hot)
        if idle_only:
            free &= rate <= 0
        if complete or int(npages[free].sum(dtype=np.int64)) >= need:
            return pool, complete
        n *= 4


def coldest_first(fast_idx, score, per) -> np.ndarray:
    """The fast units ``fast_idx``, coldest first by ``score`` over ``per`` (their pages with
    ``per_page``, else 1), ties in index order."""
    return fast_idx[np.argsort(score[fast_idx] / per[fast_idx], kind="stable")]


def victim_order(fast_idx, still, in_set, used: int, budget: int) -> tuple[np.ndarray, int]:
    """(the victims in eviction order: free to move first, then outside the hot set, each
    group coldest first as ``fast_idx``; how many lead free to move). Units held by
    hysteresis (``still``) are left out unless ``used`` exceeds the ``budget``."""
    group = (still[fast_idx].astype(np.int8) << 1) | in_set[fast_idx].astype(np.int8)
    fidx = fast_idx[np.argsort(group, kind="stable")]
    n_room = int(np.count_nonzero(~still[fidx]))
    if used <= budget:
        fidx = fidx[:n_room]
    return fidx, n_room
