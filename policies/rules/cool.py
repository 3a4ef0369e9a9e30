"""Cool units: candidates a decision can leave out of its work on each unit.

At scale many of the units a decision looks at are far below the noise floor: at 1 TiB in
region units with 5% accessed, nearly half of the candidates (four fifths with 1%), most of
them regions that one noise page touched in this interval, at about ``min_heat``. None of
them is hot, none fills room, none is a victim (the victims come from the fast node's
coldest units, and those join the decision whatever it left out). They count in two places
only: the ranked heat that sets the reference heat (rules/noise.py), and the accessed units
the phase detector, the sparse evidence and the next read's bookkeeping look at, which are
given every candidate.

So the units under half the last decision's noise floor are left out (:func:`split`) and the
ranking is told how many there are and their summed heat (rules/noise.py: :class:`Cool`). The
result is the one ranking them too gives whenever the reference heat and the floor come out
above every one of them, which the ranking checks; when not (a floor that fell by half, the
first decision), the decision ranks every candidate as before. The victim pool joins the
decision's units after the ranking, cool ones among them (a pool that is the whole fast node
brings every cool unit on it back).
"""
from __future__ import annotations

import numpy as np

from pagetier.core import sorted_find
from pagetier.policies.rules.noise import Cool

# the share of the last noise floor under which a unit is left out: a margin for a floor that
# falls from one decision to the next (the ranking checks it, and ranks every unit if not)
COOL_SHARE = 0.5


def below(last_floor: float | None, c) -> float | None:
    """The score under which units are left out this decision, given the last decision's
    noise floor; None (leave none out) when that is not above ``min_heat``: the units at
    ``min_heat`` (a page touched once) would stay in, and nothing is saved."""
    if last_floor is None:
        return None
    t = COOL_SHARE * last_floor
    return t if t > c.min_heat else None


def split(score: np.ndarray, known: np.ndarray, under: float) -> tuple[np.ndarray, Cool]:
    """(which units stay in: all but the ranked ones, on a known node with a positive score,
    scoring under ``under``; the units left out, as the ranking is told them)."""
    cool = known & (score > 0) & (score < under)
    heat = sorted_find.masked(score, cool)
    return ~cool, Cool(n=len(heat), heat=float(heat.sum()), below=float(under))
