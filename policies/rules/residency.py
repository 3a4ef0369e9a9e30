"""Rule 7, residency, and what counts as a move-back.

A unit that moved in the last ``min_residency`` intervals stays where it was moved
(hysteresis; only an over-budget fast node may demote it). A move of a unit moved within
``thrash_window`` intervals is a move-back, which the throttle (policies/rules/throttle.py)
counts, except two kinds that correct rather than thrash: moving back what a young read moved
(``young_corrections``: that move was a guess on first estimates), and demoting a recent mover
that this read found idle and outside the hot set (its accesses moved on).
"""
from __future__ import annotations

import numpy as np

from pagetier.policies.rules.view import NEVER


def movers(last_move, now: int, c) -> tuple[np.ndarray, np.ndarray]:
    """(units moved within ``min_residency`` intervals: they stay put; units moved within
    ``thrash_window``: moving them again is a move-back)."""
    moved_ever = last_move != NEVER
    recent = moved_ever & (now - last_move < c.min_residency)
    within = moved_ever & (now - last_move <= c.thrash_window)
    return recent, within


def counted_move_backs(within, last_move, young_moves, idle_out, c) -> np.ndarray:
    """The move-backs the throttle counts: ``within`` but for units a young read moved (the
    intervals ``young_moves``, with ``young_corrections``) and units ``idle_out`` (None: none)."""
    counted = within
    if c.young_corrections and young_moves:
        counted = within & ~np.isin(last_move, np.fromiter(young_moves, np.int64))
    if idle_out is not None:
        counted = counted & ~idle_out
    return counted


def idle_out(fast, in_set, rate) -> np.ndarray:
    """Fast units outside the hot set that this read found idle."""
    return fast & ~in_set & (rate <= 0)
