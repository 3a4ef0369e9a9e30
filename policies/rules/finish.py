"""Rule 12, finishing a phase change: the change's exchange completed on this read's rates.

A read that sees a phase change covers time before it as well as after: the last hot set's
units still show part of their old rate, and the new set's units only part of theirs. Judged
with the exchange margin (rules/exchange.py), the new set's cooler units do not beat the last
set's warmer ones, and 5-10% of the new set stayed on the slow node. In the reads after it,
ranked by decayed heat again, the last set's units keep their heat for a few reads, and that
tail came in over 2-3 more intervals (bench live phases-nothp: 89% of a 96 MiB window in the
change's read, 95% only 2-3 reads later).

So with ``finish_change``, in the read of a change seen in its rates (rules/phase.py) and for
``thrash_window`` reads after a change, units the change brought that are in the hot set and
still off the fast node are exchanged against units it left that are still on it, both judged
on this read's rates alone, with no margin: a brought unit goes in when its rate now is above
the noise floor and above the rate now of the unit it pushes out, and a left unit goes only
when it is leaving (rules/phase.py: its rate fell under half of what its heat stood for).
Hysteresis holds on both sides, stuck units do not move, and the moves fit what the plan left
of the interval's moves and the capacity the hot set is sized to (above it, only one for one). Units
of neither set are left to the other rules, and a set that comes back (a ping-pong) finds the
units it would move at the higher rate now, and moves nothing.

A change found in decayed heat alone is not finished in its own read: the read's rates showed
no change, and in bench sim's churn trace (short phases, sets coming back) finishing those,
or bringing units of the new set beyond the hot set, cost 2-5% more time.
"""
from __future__ import annotations

import numpy as np

from pagetier.policies.rules.arrays import member_sorted
from pagetier.policies.rules.phase import leaving
from pagetier.policies.rules.planner import plan_moves
from pagetier.policies.rules.throttle import Plan


def finish_change(plan: Plan, f, keys: np.ndarray, rate: np.ndarray, heat: np.ndarray,
                  stuck: np.ndarray,
                  left: np.ndarray, brought: np.ndarray, floor: float, decay: float,
                  max_moves: int, cap: int) -> tuple[Plan, int]:
    """(``plan`` with the change's exchange carried on, the pages that added).

    ``f``: the plan's Frame; ``keys``/``rate``/``heat``/``stuck``: each unit's key, rate in
    this read, heat and whether the kernel refused its last move; ``left``/``brought``: the
    sorted keys of the hot sets the change left and brought; ``floor``: the noise floor (heat); ``decay``: the
    heat's decay, with which a rate is compared to heat as a steady unit's; ``cap``: the fast
    pages the hot set is sized to (the low watermark's), which promotions do not pass (above
    it, a promotion goes only in exchange: nothing is demoted to get down to it)."""
    room = int(max_moves) - plan.pages
    if room <= 0:
        return plan, 0
    n = len(keys)
    moved = np.zeros(n, bool)
    moved[plan.promote] = True
    moved[plan.demote] = True
    free = ~moved & ~f.recent & ~stuck
    per = f.per
    now = rate / per
    hot_now = rate / (1.0 - decay) >= floor
    cand = np.flatnonzero(free & ~f.fast & f.in_set & hot_now & member_sorted(keys, brought))
    vict = free & f.fast & member_sorted(keys, left)
    if decay > 0:
        vict &= leaving(rate, heat, decay)
    vict = np.flatnonzero(vict)
    if not len(cand):
        return plan, 0
    cand = cand[np.argsort(-now[cand], kind="stable")]
    vict = vict[np.argsort(now[vict], kind="stable")]
    used = f.used + int(f.npages[plan.promote].sum()) - int(f.npages[plan.demote].sum())
    p, d = plan_moves(f.npages, cand, now[cand], vict, now[vict], used=used,
                      cap=max(int(cap), used), max_moves=room)
    if not len(p):
        return plan, 0
    added = int(f.npages[p].sum()) + int(f.npages[d].sum())
    return Plan(np.concatenate([plan.promote, p]), np.concatenate([plan.demote, d]),
                plan.promo, plan.pages + added, plan.backs), added
