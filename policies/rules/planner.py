"""The two helpers every ranking policy shares (the baselines and the RL policy call them too):
``fill_budget`` takes the best units that fit a number of pages, and ``plan_moves`` pairs
promotions with the demotions that make room for them, within the rate limit, taking an
exchange only for a candidate that passes the exchange test.
"""
from __future__ import annotations

import numpy as np


def fill_budget(order: np.ndarray, npages: np.ndarray, cap: int) -> np.ndarray:
    """The units of ``order`` (best first) that fit in ``cap`` pages, greedily in order.

    A unit too big for the room left (a 2 MiB unit near the end) is skipped and smaller units
    after it still fill the room: the second pass takes, in order, the rest that fit.
    """
    cap = int(cap)
    if cap <= 0 or len(order) == 0:
        return order[:0]
    size = npages[order].astype(np.int64)
    cum = np.cumsum(size)
    k = int(np.searchsorted(cum, cap, "right"))
    room = cap - (int(cum[k - 1]) if k else 0)
    if k == len(order) or room <= 0:
        return order[:k]
    rest = order[k + 1 :]  # order[k] did not fit
    rest = rest[size[k + 1 :] <= room]
    cum2 = np.cumsum(npages[rest].astype(np.int64))
    k2 = int(np.searchsorted(cum2, room, "right"))
    return np.concatenate([order[:k], rest[:k2]])


class _Victims:
    """The fast-node units an exchange may demote, in eviction order, as cumulative pages
    (``dc``), and the running highest of their ranks (times ``1 + margin`` in ``vmax``, plain
    in ``vtop``) from the first one past the mandatory demotions (``j0``)."""

    def __init__(self, npages, victims, victim_rank, must, max_moves, n_room, margin):
        nv = len(victims)
        self.n = nv
        self.dc = np.zeros(nv + 1, np.int64)
        np.cumsum(npages[victims].astype(np.int64), out=self.dc[1:])
        n_room = nv if n_room is None else min(int(n_room), nv)
        # mandatory demotions: the shortest prefix freeing `must` pages, within the rate limit
        j0 = min(int(np.searchsorted(self.dc, max(0, int(must)), "left")), nv)
        self.j0 = min(j0, int(np.searchsorted(self.dc, max_moves, "right")) - 1)
        self.room_lim = max(self.j0, n_room)
        vr = victim_rank[self.j0:].astype(np.float64)
        self.vmax = np.maximum.accumulate(vr * (1.0 + margin))
        self.vtop = np.maximum.accumulate(vr)

    def beaten(self, jc, cand, promo_rank, gap, bar, bar_rank) -> np.ndarray:
        """Whether each candidate ``cand`` that evicts victims up to ``jc`` passes the
        exchange test: rank above every evicted victim's times ``1 + margin`` and by more than
        ``gap``, and its ``bar_rank`` at least ``bar``."""
        last = np.clip(jc - self.j0 - 1, 0, None)
        vm = self.vmax[last] if len(self.vmax) else np.full(len(jc), np.inf)
        vt = self.vtop[last] if len(self.vtop) else np.full(len(jc), np.inf)
        pr = promo_rank[cand].astype(np.float64)
        br = pr if bar_rank is None else bar_rank[cand].astype(np.float64)
        g = gap if np.ndim(gap) == 0 else gap[cand]
        return (pr > vm) & (pr > vt + g) & (br >= (bar if np.ndim(bar) == 0 else bar[cand]))


def plan_moves(npages: np.ndarray, promo: np.ndarray, promo_rank: np.ndarray,
               victims: np.ndarray, victim_rank: np.ndarray, *, used: int, cap: int,
               must: int = 0, max_moves: int, margin: float = 0.0,
               gap: float | np.ndarray = 0.0, bar: float | np.ndarray = 0.0,
               bar_rank: np.ndarray | None = None, n_room: int | None = None,
               passes: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Choose promotions from ``promo`` and demotions from a prefix of ``victims``.

    promo: unit indices best first, promo_rank their rank values (non-increasing).
    victims: fast-node unit indices in eviction order, victim_rank their rank values.
    used: pages on the fast node now; cap: fast-node pages promotions may fill up to;
    must: pages to demote whatever the promotions (watermark or over budget);
    max_moves: pages that may move in all; n_room: how many leading victims may be evicted to
    make room for a promotion (default all; the rest serve only ``must``).
    A promotion that needs evictions is taken only if its rank exceeds every evicted victim's
    rank times ``1 + margin`` and by more than ``gap`` (a number, or one per unit of ``promo``),
    and is at least ``bar`` (a number, or one per unit of ``promo``; compared with
    ``bar_rank``, the candidates' values for that test, when given). Promotions are taken in
    order; a candidate that does not fit is skipped and the next ones are tried, up to
    ``passes`` times.

    Returns (promote, demote) unit indices. Guarantees: demoted + promoted pages <=
    max_moves, and used + promoted - demoted <= max(cap, used - demoted) (promotions never
    push the fast node over ``cap``).
    """
    max_moves = max(0, int(max_moves))
    pn = npages[promo].astype(np.int64)
    v = _Victims(npages, victims, victim_rank, must, max_moves, n_room, margin)
    dc = v.dc
    j = v.j0
    moved = int(dc[v.j0])
    fast = int(used) - moved
    taken = []
    start = 0
    for _ in range(passes):
        left = max_moves - moved
        if start >= len(promo) or left <= 0:
            break
        cand = np.arange(start, min(len(promo), start + left + 1))
        if start:  # after a skip, only candidates that could still fit the rate limit
            cand = cand[pn[cand] <= left]
        if len(cand) == 0:
            break
        pc = np.cumsum(pn[cand])
        # total victim pages needed so the fast node stays within cap
        need = dc[j] + np.maximum(0, fast + pc - int(cap))
        jk = np.searchsorted(dc, need, "left")
        jc = np.minimum(jk, v.n)
        ok = (jk <= v.room_lim) & (moved + pc + dc[jc] - dc[j] <= max_moves)
        evicts = jc > v.j0
        if evicts.any():
            ok &= ~evicts | v.beaten(jc, cand, promo_rank, gap, bar, bar_rank)
        k = len(ok) if ok.all() else int(np.argmin(ok))
        if k:
            taken.append(promo[cand[:k]])
            jn = int(jk[k - 1])
            freed = int(dc[jn] - dc[j])
            moved += int(pc[k - 1]) + freed
            fast += int(pc[k - 1]) - freed
            j = jn
        if k == len(cand):
            break
        start = int(cand[k]) + 1  # skip the candidate that did not fit
    promote = np.concatenate(taken) if taken else np.zeros(0, np.int64)
    return promote.astype(np.int64), victims[:j].astype(np.int64)
