"""The interval's plan: the rules' verdicts put together into promotions and demotions, and
which limit, if any, kept hot units off the fast node.

Promotions are the hot set's units off the fast node that are not held by hysteresis and pass
the fill rule, hottest first; while the watermark demands demotions, warm units (under the
exchange bar) do not refill what it freed. The exchange planner (``plan_moves``) pairs them
with victims. Throttled, both sides of an exchange are judged on two reads: the candidate on
the lower of its estimates (now, and after the last read), the victim on the higher.
Demotions come first in the plan and the daemon moves them first, so the promotions find the
room freed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagetier.policies.rules.planner import plan_moves
from pagetier.policies.rules.throttle import Plan
from pagetier.policies.rules.victims import victim_order


@dataclass
class Frame:
    """What a plan is made from, one entry per unit the decision looks at: ``order`` the hot
    units hottest first, ``in_set`` the hot set (minus stuck units), ``fill_ok`` the fill
    rule's verdict, ``recent``/``within`` units moved within ``min_residency``/
    ``thrash_window``, ``counted`` the move-backs the throttle counts, ``fast_idx`` the fast
    units coldest first, ``steady`` the heat an exchange judges on (None: ``score``), ``prev``
    the heat after the last read, ``per`` the divisor that makes a rank per page."""

    npages: np.ndarray
    score: np.ndarray
    bar: np.ndarray
    order: np.ndarray
    in_set: np.ndarray
    fast: np.ndarray
    fill_ok: np.ndarray
    recent: np.ndarray
    within: np.ndarray
    counted: np.ndarray
    fast_idx: np.ndarray
    steady: np.ndarray | None
    prev: np.ndarray | None
    per: np.ndarray
    gap: float
    used: int
    budget: int
    cap_high: int
    must: int


def make_plan(f: Frame, c, throttle: bool, max_moves: int, freeze: bool = False) -> Plan:
    """A plan within ``max_moves`` pages. Throttled: an exchange only for a clearly hotter
    unit (``thrash_margin``); frozen: units moved within ``thrash_window`` stay put."""
    still = f.within if freeze else f.recent
    margin = c.thrash_margin if throttle else c.margin
    pmask = f.in_set & ~f.fast & ~still & f.fill_ok
    if f.must:
        pmask &= f.score >= f.bar  # warm units do not refill what the watermark demoted
    promo = f.order[pmask[f.order]]
    fidx, n_room = victim_order(f.fast_idx, still, f.in_set, f.used, f.budget)
    sure = throttle and f.steady is not None
    per = f.per
    p, d = plan_moves(
        f.npages, promo, (f.steady if sure else f.score)[promo] / per[promo], fidx,
        (np.maximum(f.score[fidx], f.prev[fidx]) if sure else f.score[fidx]) / per[fidx],
        used=f.used, cap=f.cap_high, must=f.must, max_moves=max_moves,
        margin=margin, gap=f.gap / per[promo], bar=f.bar[promo], n_room=n_room,
        bar_rank=(f.score if f.steady is None else f.steady)[promo],
    )
    back = np.concatenate([p[f.counted[p]], d[f.counted[d]]])
    pages = int(f.npages[p].sum()) + int(f.npages[d].sum())
    return Plan(p, d, promo, pages, int(f.npages[back].sum()))


def which_limit(f: Frame, plan: Plan, cap_moves: int, cap_low: int, node_bound: bool):
    """What kept hot units off the fast node after ``plan``: "rate" (``cap_moves``), "node"
    or "budget" (``cap_low``), or None: none did, or room was left and the rules held them
    (warm units waiting for a second read, hysteresis)."""
    npages, p = f.npages, plan.promote
    # (a mask of the promotions: np.setdiff1d would sort both sides)
    promoted = np.zeros(len(npages), bool)
    promoted[p] = True
    # hot units still off the fast node after this decision: one mask, gathered once
    off = f.order[(~f.fast & ~promoted)[f.order]]
    if not len(off):
        return None
    left = plan.promo[~promoted[plan.promo]]
    up, down = int(npages[p].sum()), int(npages[plan.demote].sum())
    if len(left) and up + down + int(npages[left].min()) > cap_moves:
        return "rate"
    if f.used + up - down + int(npages[off].min()) > cap_low:
        return "node" if node_bound else "budget"
    return None
