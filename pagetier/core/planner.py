"""The move planner: which of a policy's moves fit in the fast budget, the fast node's room and
the migration rate limit.

:func:`plan` is a pure function of the unit state and the limits: the daemon calls it in its
dry run and in its live step, and the trace simulator calls it every interval, so what the
bench measures is what the daemon does. Sizes are 4 KiB pages.

- Demotions first, in the policy's order: units not on the slow node, of known node, not stuck
  and not also asked to be promoted, as many as the rate allows.
- Forced demotions: when the fast node still holds more than ``budget`` movable pages after
  them, the coldest fast units (lowest heat, then least recently accessed) that the policy
  neither promotes nor demotes, enough to get under the budget, within the rate left.
- Promotions, in the policy's order: units not on the fast node and not stuck, that fit in the
  budget left after the demotions, the rate left, and the fast node's room (``node_room``: pages
  it can take before its free memory reaches the high watermark, None when unknown) plus what
  the demotions free on it.

The budget counts *movable* pages (:meth:`PageState.movable_on`): fast pages the kernel refused
to move (shared with other processes) cannot be demoted, so they sit outside the budget and
are reported apart.

The live daemon moves the demotions first; the kernel may refuse some, so before its
promotions it asks :func:`plan_promotions` again with the state as the moves left it and the
node's room read again.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagetier.core.units import MB, PAGE_SIZE

NO_LIMIT = 1 << 62


def rate_pages(rate_mb_s: float, interval_s: float, page_size: int = PAGE_SIZE) -> int:
    """Pages the rate limit allows per interval: ``rate_mb_s`` MB/s (MB = 2**20 bytes) over
    ``interval_s`` seconds. A rate of 0 (or less) means no limit."""
    if rate_mb_s <= 0:
        return NO_LIMIT
    return max(1, int(rate_mb_s * MB * interval_s) // page_size)


def unique_in_order(idx, n: int) -> np.ndarray:
    """Valid (0 <= i < n) indices of ``idx``, duplicates dropped, first occurrence order kept."""
    idx = np.asarray(idx, np.int64).ravel()
    idx = idx[(idx >= 0) & (idx < n)]
    _, first = np.unique(idx, return_index=True)
    return idx[np.sort(first)]


def fit(idx: np.ndarray, npages: np.ndarray, limit: int) -> np.ndarray:
    """The longest prefix of ``idx`` whose pages add up to at most ``limit``."""
    if limit <= 0 or not len(idx):
        return idx[:0]
    c = np.cumsum(npages[idx].astype(np.int64))
    return idx[: int(np.searchsorted(c, limit, side="right"))]


def _pages(state, idx: np.ndarray) -> int:
    return int(state.npages[idx].sum(dtype=np.int64))


@dataclass(frozen=True)
class Moves:
    """A plan, as unit indices into the state (int64 arrays, in the order to move them)."""

    demote: np.ndarray  # the policy's demotions that fit
    forced: np.ndarray  # the planner's own demotions: the fast node was over budget
    promote: np.ndarray  # the policy's promotions that fit
    limit: str | None  # what cut the moves: "budget", "rate", "node" (its room) or None
    asked: int  # units the policy asked to move (distinct valid indices)
    # pages the interval wanted moved: the policy's moves that have somewhere to go (not on
    # their node already, not stuck) plus the forced demotions' pages
    wanted: int = 0

    @property
    def demotions(self) -> np.ndarray:
        """Every demotion: the policy's, then the forced ones."""
        return np.concatenate([self.demote, self.forced]).astype(np.int64)

    @property
    def clipped(self) -> int:
        """Units the policy asked to move that the limits kept in place."""
        return self.asked - len(self.demote) - len(self.promote)


def plan_demotions(state, demote, promote, budget: int, rate: int, *, fast: int = 0,
                   slow: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(policy demotions, forced demotions) that fit in ``rate`` pages (see the module doc)."""
    n = len(state)
    promote = unique_in_order(promote, n)
    return _plan_demotions(state, _movable_demotions(state, unique_in_order(demote, n), promote,
                                                     slow), promote, budget, rate, fast=fast)


def _movable_demotions(state, demote, promote, slow: int) -> np.ndarray:
    """The policy's demotions (``demote``, ``promote``: as :func:`unique_in_order` gives them)
    that can move: on a known node but the slow one, not stuck, not promoted as well."""
    demote = demote[(state.node[demote] != slow) & (state.node[demote] >= 0) & ~state.stuck(demote)]
    return demote[~np.isin(demote, promote)]


def _plan_demotions(state, demote, promote, budget: int, rate: int, *,
                    fast: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`plan_demotions` of the movable demotions ``demote`` (:func:`_movable_demotions`)
    and the promotions ``promote`` (as :func:`unique_in_order` gives them)."""
    demote = fit(demote, state.npages, rate)
    used = state.movable_on(fast) - _pages(state, demote)
    forced = demote[:0]
    if used > budget:
        cand = np.flatnonzero(state.node == fast)
        cand = cand[~np.isin(cand, demote) & ~np.isin(cand, promote) & ~state.stuck(cand)]
        order = np.lexsort((state.last_access[cand], state.heat[cand]))
        cand = cand[order]
        c = np.cumsum(state.npages[cand].astype(np.int64))
        k = int(np.searchsorted(c, used - budget, side="left")) + 1
        forced = fit(cand[:k], state.npages, rate - _pages(state, demote))
    return demote, forced


def plan_promotions(state, promote, budget: int, node_room: int | None, rate: int, *,
                    fast: int = 0, fast_used: int | None = None) -> tuple[np.ndarray, str | None]:
    """(promotions, the limit that cut them) for the state as it is: ``fast_used`` (default:
    the movable pages on the fast node now) against ``budget``, ``rate`` pages to move and the
    node's room (None: unknown, no limit)."""
    return _plan_promotions(state, unique_in_order(promote, len(state)), budget, node_room,
                            rate, fast=fast, fast_used=fast_used)


def _plan_promotions(state, promote, budget: int, node_room: int | None, rate: int, *,
                     fast: int = 0, fast_used: int | None = None) -> tuple[np.ndarray, str | None]:
    """:func:`plan_promotions` of ``promote`` as :func:`unique_in_order` gives it."""
    if fast_used is None:
        fast_used = state.movable_on(fast)
    promote = promote[(state.node[promote] != fast) & ~state.stuck(promote)]
    left = budget - fast_used
    kept = fit(promote, state.npages, min(rate, left))
    limit = None
    if len(kept) < len(promote):
        limit = "rate" if rate < left else "budget"
    if node_room is not None:
        in_room = fit(kept, state.npages, node_room)
        if len(in_room) < len(kept):
            limit = "node"
        kept = in_room
    return kept, limit


def plan(state, decision, budget: int, node_room: int | None, rate: int, *, fast: int = 0,
         slow: int = 1) -> Moves:
    """The moves of ``decision`` (anything with ``promote`` and ``demote`` unit-index arrays,
    e.g. a policies.Decision) that fit in ``budget`` movable fast pages, the fast node's
    ``node_room`` (None: unknown) and ``rate`` pages moved, plus the forced demotions that keep
    the fast node within the budget. Pure: ``state`` is not changed."""
    n = len(state)
    # each list made valid and distinct once, for every step below
    up, down = unique_in_order(decision.promote, n), unique_in_order(decision.demote, n)
    asked = len(up) + len(down)
    movable_down = _movable_demotions(state, down, up, slow)
    wanted = _wanted(state, up, movable_down, fast)
    demote, forced = _plan_demotions(state, movable_down, up, budget, rate, fast=fast)
    out = np.concatenate([demote, forced]).astype(np.int64)
    on_fast = out[state.node[out] == fast]
    # after the demotions: the movable fast pages they take off, and the room they free
    fast_used = state.movable_on(fast) - _pages(state, on_fast) + _pages(
        state, on_fast[state.unmovable(on_fast)])
    room = None if node_room is None else node_room + _pages(state, on_fast)
    promote, limit = _plan_promotions(state, up, budget, room, rate - _pages(state, out),
                                      fast=fast, fast_used=fast_used)
    if limit is None and _pages(state, demote) < _pages(state, movable_down):
        limit = "rate"  # the rate cut the policy's demotions (the only limit they have)
    return Moves(demote=demote.astype(np.int64), forced=forced.astype(np.int64),
                 promote=promote.astype(np.int64), limit=limit, asked=asked,
                 wanted=wanted + _pages(state, forced))


def wanted_pages(state, demote, promote, *, fast: int = 0, slow: int = 1) -> int:
    """Pages of the policy's moves that have somewhere to go: promotions not on the fast node
    and demotions (as plan_demotions filters them), neither stuck."""
    n = len(state)
    up = unique_in_order(promote, n)
    return _wanted(state, up, _movable_demotions(state, unique_in_order(demote, n), up, slow),
                   fast)


def _wanted(state, up, movable_down, fast: int) -> int:
    """:func:`wanted_pages` of promotions ``up`` (as :func:`unique_in_order` gives them) and
    the movable demotions ``movable_down`` (:func:`_movable_demotions`)."""
    up = up[(state.node[up] != fast) & ~state.stuck(up)]
    return _pages(state, up) + _pages(state, movable_down)
