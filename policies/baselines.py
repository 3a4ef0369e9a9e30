"""Baseline policies: small re-implementations of known approaches, to compare against.

- ``first-touch``: Linux's default placement; pages stay where they were first touched.
- ``lru``: like the kernel's NUMA-balancing memory tiering (hint-fault promotion, LRU demotion).
- ``heat-classes``: like memtierd's heat-based tiering (heat classes filled hottest first).
- ``ping-pong``: not a baseline but a stress policy: every unit to the other node, every
  interval (for data-integrity tests).

They are deliberately simple: no watermarks, no hysteresis, no throttle beyond the rate
limit. All respect the fast budget and the rate limit through the shared ``plan_moves``.
Like the default policy, lru and heat-classes leave stuck units (the kernel refused their last
move: pages shared with another process) where they are: they are neither promoted nor chosen
to make room, which they could not.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagetier.core.state import NEVER
from pagetier.errors import ConfigError
from pagetier.policies.base import Context, Decision, Policy, register
from pagetier.policies.heuristic import fill_budget, plan_moves, unit_keys


def _stats(state, ctx: Context, promote: np.ndarray, demote: np.ndarray, **extra) -> dict:
    npages = state.npages.astype(np.int64)
    used = int(npages[state.node == ctx.fast_node].sum())
    up, down = int(npages[promote].sum()), int(npages[demote].sum())
    return {"fast_used": used, "fast_after": used + up - down, "promote_pages": up,
            "demote_pages": down, **extra}


@register("first-touch")
class FirstTouch(Policy):
    """Re-implementation of first-touch placement (the Linux default): never migrates.

    Pages stay on the node where they were first touched; the baseline every tiering policy
    must beat.
    """

    @dataclass
    class Config:
        pass

    def decide(self, state, ctx: Context) -> Decision:
        none = np.zeros(0, np.int64)
        return Decision(promote=none, demote=none, stats=_stats(state, ctx, none, none))


@register("lru")
class LRU(Policy):
    """Small re-implementation of the kernel's NUMA-balancing memory tiering.

    Like ``NUMA_BALANCING_MEMORY_TIERING`` (hint-fault promotion with a second-access check,
    demotion of the least recently used pages by reclaim): a slow-node unit is promoted when
    it was accessed in two of the last ``window`` intervals, most recently accessed first; when
    the fast node needs room (or is over budget), its least recently used units are demoted,
    and only units accessed less recently than the unit being promoted.

    The policy remembers, per unit (keyed by target and address), the access before the last
    one, so it needs to see every interval's state once.
    """

    @dataclass
    class Config:
        window: int = 4  # intervals in which two accesses make a unit a promotion candidate

        def check(self):
            if self.window < 2:
                raise ConfigError(f"policy lru: option 'window' must be >= 2, got {self.window!r}")

    def __init__(self, config=None):
        super().__init__(config)
        self._keys = np.zeros(0, np.uint64)  # sorted unit keys seen at the last call
        self._last = np.zeros(0, np.int64)  # their last access at the last call
        self._prev = np.zeros(0, np.int64)  # the distinct access before that

    def _history(self, state) -> np.ndarray:
        """Per unit: the interval of the access before ``last_access`` (NEVER if none)."""
        keys = unit_keys(state)
        last = state.last_access.astype(np.int64)
        prev = np.full(len(keys), NEVER, np.int64)
        old_last = np.full(len(keys), NEVER, np.int64)
        if len(self._keys):
            pos = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
            seen = self._keys[pos] == keys
            prev[seen] = self._prev[pos[seen]]
            old_last[seen] = self._last[pos[seen]]
        newer = last > old_last  # accessed again since the last call
        prev = np.where(newer & (old_last != NEVER), old_last, prev)
        order = np.argsort(keys, kind="stable")
        self._keys, self._last, self._prev = keys[order], last[order], prev[order]
        return prev

    def decide(self, state, ctx: Context) -> Decision:
        now = int(state.interval)
        node = state.node
        npages = state.npages.astype(np.int64)
        last = state.last_access.astype(np.int64)
        prev = self._history(state)
        horizon = now - self.config.window  # accesses after it are recent
        second = (last > horizon) & (prev > horizon) & (last != NEVER) & (prev != NEVER)

        fast = node == ctx.fast_node
        movable = ~state.stuck(np.arange(len(state)))
        cand = np.flatnonzero(second & (node >= 0) & ~fast & movable)
        cand = cand[np.lexsort((-prev[cand], -last[cand]))]  # most recent first
        victims = np.flatnonzero(fast & movable)
        victims = victims[np.lexsort((prev[victims], last[victims]))]  # least recent first
        budget = max(0, int(ctx.fast_budget))
        used = int(npages[fast].sum())
        p, d = plan_moves(
            npages, cand, last[cand].astype(np.float64), victims, last[victims].astype(np.float64),
            used=used, cap=budget, must=max(0, used - budget), max_moves=ctx.max_moves,
        )
        return Decision(promote=p, demote=d, stats=_stats(state, ctx, p, d, candidates=len(cand)))


@register("heat-classes")
class HeatClasses(Policy):
    """Small re-implementation of memtierd's heat-based tiering.

    Like memtierd's ``heat`` policy: decayed heat is split into ``classes`` classes by log2
    (class 0 below ``min_heat``, class c for heat in [min_heat * 2**(c-1), min_heat * 2**c),
    the last class open-ended), and the fast node is filled hottest class first (within a
    class, units already there first). Units of class 0 are never promoted. Fast-node units
    outside the filled classes are demoted when promotions of a hotter class need room or the
    node is over budget.
    """

    @dataclass
    class Config:
        classes: int = 8
        min_heat: float = 1.0

        def check(self):
            where = "policy heat-classes: option"
            if self.classes < 2:
                raise ConfigError(f"{where} 'classes' must be >= 2, got {self.classes!r}")
            if not self.min_heat > 0:
                raise ConfigError(f"{where} 'min_heat' must be > 0, got {self.min_heat!r}")

    def heat_class(self, heat: np.ndarray) -> np.ndarray:
        c = self.config
        h = np.maximum(heat.astype(np.float64) / c.min_heat, 0.5)
        cls = np.floor(np.log2(h)).astype(np.int64) + 1
        return np.clip(cls, 0, c.classes - 1)

    def decide(self, state, ctx: Context) -> Decision:
        node = state.node
        npages = state.npages.astype(np.int64)
        cls = self.heat_class(state.heat)
        fast = node == ctx.fast_node
        known = node >= 0
        budget = max(0, int(ctx.fast_budget))
        used = int(npages[fast].sum())

        # stuck units stay where they are: those on the fast node take their room first
        movable = ~state.stuck(np.arange(len(state)))
        pinned = int(npages[fast & ~movable].sum())
        warm = np.flatnonzero(known & (cls > 0) & movable)
        order = warm[np.lexsort((~fast[warm], -cls[warm]))]  # hottest class first, residents first
        desired = fill_budget(order, npages, budget - pinned)
        in_set = np.zeros(len(state), bool)
        in_set[desired] = True
        promo = order[(in_set & ~fast)[order]]
        victims = np.flatnonzero(fast & movable)
        # outside the filled classes first, coldest first
        victims = victims[np.lexsort((cls[victims], in_set[victims]))]
        p, d = plan_moves(
            npages, promo, cls[promo].astype(np.float64), victims, cls[victims].astype(np.float64),
            used=used, cap=budget, must=max(0, used - budget), max_moves=ctx.max_moves,
        )
        counts = np.bincount(cls, weights=npages, minlength=self.config.classes).astype(np.int64)
        return Decision(promote=p, demote=d,
                        stats=_stats(state, ctx, p, d, class_pages=counts.tolist()))


@register("ping-pong")
class PingPong(Policy):
    """A stress policy, not a placement policy: every interval it asks to move every unit to
    the other node (the daemon still enforces the budget and the rate limit).

    It forces as many migrations as the limits allow, whatever the profiler sees: the
    data-integrity tests (tests/guest/test_daemon_integrity.py) use it to check that memory
    survives a hundred thousand page migrations.
    """

    @dataclass
    class Config:
        pass

    def decide(self, state, ctx: Context) -> Decision:
        fast = np.flatnonzero(state.node == ctx.fast_node)
        slow = np.flatnonzero(state.node == ctx.slow_node)
        return Decision(promote=slow, demote=fast, stats=_stats(state, ctx, slow, fast))
