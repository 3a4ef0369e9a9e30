"""Rule 8, the throttle: what keeps units of about the same heat from trading places.

When more than ``thrash_ratio`` of a plan's pages (or of their moving average) are move-backs
(policies/rules/residency.py), for the next ``thrash_window`` intervals an exchange needs
``thrash_margin`` instead of ``margin`` (by default more than four times the victim's heat:
pagetier.ko's probe windows are 4 times apart, so two units one window apart are not told
apart by one estimate), judged on two reads (the candidate's lower estimate
against the victim's higher one), and exchanges use ``throttle_scale`` of the rate limit. A
unit clearly hotter than the one it would replace still moves. When the plans made under the
throttle still move back more than ``freeze_ratio`` of their pages (a moving average), units
moved within ``thrash_window`` stay where they are for the next ``thrash_window`` intervals
("frozen").

A hot set larger than the fast capacity ("oversubscribed") cuts exchanges to
``throttle_scale`` of the rate limit as well, except in the ``thrash_window`` intervals after
a phase change (the last phase's units are still warm, but on their way out) and on a read
that sees a new hot set in part ("weak"). In the interval of a phase change nothing is
throttled and its moves are no move-backs: the last phase's units go and the new hot set comes
in, in one batch. After a change, when the units at the exchange bar are more than twice what
the fast node holds, move-backs do not throttle either: the fast node then holds a small part
of the new phase, chosen again as its units warm. Promotions into free room are never
throttled.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np


class Plan(NamedTuple):
    """One plan: the units to promote and demote, the candidates it chose from (``promo``),
    its pages moved and how many of them are counted move-backs."""

    promote: np.ndarray
    demote: np.ndarray
    promo: np.ndarray
    pages: int
    backs: int

    @property
    def back_share(self) -> float:
        return self.backs / self.pages if self.pages else 0.0


def throttled_moves(max_moves: int, free_room: int, c) -> int:
    """The pages a throttled plan may move: ``throttle_scale`` of the rate limit, or the free
    room when that is more (filling free room is never throttled), at most the rate limit."""
    return min(max_moves, max(int(max_moves * c.throttle_scale), free_room))


def oversubscribed(after_change: bool, hot_pages: int, holds: int, phase_check) -> bool:
    """Whether the hot set (``hot_pages``) is larger than what the fast node holds, outside
    the intervals after a phase change and a read that saw a new hot set in part."""
    return not after_change and hot_pages > holds and phase_check != "weak"


def resampled(after_change: bool, order, score, bar, npages, holds: int) -> bool:
    """Whether, after a phase change, the units at the exchange bar among the hot units
    ``order`` hold more than twice what the fast node holds (move-backs do not throttle)."""
    if not after_change:
        return False
    at_bar = order[score[order] >= bar[order]]
    return int(npages[at_bar].sum()) > 2 * holds


class Throttle:
    """The throttle's memory, kept on the policy: the move-back share's moving averages (all
    plans, and the plans made under the throttle) and the intervals up to which the throttle
    and the freeze hold."""

    def _init_throttle(self) -> None:
        self._thrash = 0.0  # moving average of the move-back fraction
        self._throttle_until = None  # interval up to which the throttle holds
        self._freeze_until = None  # interval up to which recent movers stay put
        self._thrash_kept = 0.0  # moving average of the move-back fraction under the throttle

    def _expire_throttle(self, now: int) -> None:
        if self._throttle_until is not None and now > self._throttle_until:
            self._throttle_until = None
        if self._freeze_until is not None and now > self._freeze_until:
            self._freeze_until = None

    def _keep(self, plan: Plan) -> None:
        self._thrash_kept = 0.5 * self._thrash_kept + 0.5 * plan.back_share

    def _throttled_plan(self, plan: Callable[..., Plan], reasons: list, *, now: int,
                        change: bool, resampled: bool, max_moves: int,
                        throttled_max: int) -> Plan:
        """The interval's plan under the throttle: ``plan(throttle, max_moves, freeze)`` is
        made unthrottled first; its move-backs may start the throttle, and the plan is then
        made again throttled (and frozen, when throttled plans keep moving back). Appends the
        throttle's reasons to ``reasons`` (which may hold "oversubscribed")."""
        c = self.config
        p = plan(False, max_moves)
        frac = p.back_share
        if change:  # the hot set moved: moving back what the last phase brought is no thrashing
            frac = 0.0
            self._throttle_until = self._freeze_until = None
        self._thrash = 0.5 * self._thrash + 0.5 * frac
        was_throttled = self._throttle_until is not None
        thrashing = frac > c.thrash_ratio or self._thrash > c.thrash_ratio
        if not change and not resampled and thrashing:
            self._throttle_until = now + c.thrash_window
        if self._throttle_until is not None:
            reasons.append("move-backs")
        if change and reasons:
            # only "oversubscribed": in the interval of a phase change it does not cut the
            # moves (the last phase's units make the hot set look larger than they will be)
            reasons.remove("oversubscribed")
            self._keep(p)
        elif "move-backs" in reasons or (reasons and throttled_max < max_moves):
            freeze = self._freeze_until is not None
            p = plan("move-backs" in reasons, throttled_max, freeze)
            self._keep(p)
            if not freeze and was_throttled and self._thrash_kept > c.freeze_ratio:
                # move-backs even with thrash_margin, throttled since an earlier interval:
                # the same units keep trading places; freeze recent movers
                self._freeze_until = now + c.thrash_window
                p = plan(True, throttled_max, True)
        if self._freeze_until is not None:
            reasons.append("frozen")
        return p
