"""The move planner for targets in groups (the daemon's managed cgroups), each with its own fast
budget: :func:`plan` keeps a policy's moves within every group's budget as well as the
daemon's budget, rate and the fast node's room.

- A group's demotions are the policy's demotions of its own units, kept only when the group
  promotes in the same decision (an exchange within the group) or holds more than its budget:
  a policy deciding for all targets at once may demote one group's units to make room for
  another's, and one group never evicts another's pages.
- Forced demotions: a group over its budget demotes its own coldest fast units.
- Promotions: a group's own, within its budget left after its demotions. Room on the fast node
  for them comes from the group's own demotions and from the node's free room; the free room
  is shared fairly (max-min: each group gets what it asks up to an equal share of what is
  left, and what a group leaves goes to the others).
- The rate is used group by group, the group that goes first turning each interval.

Sizes are 4 KiB pages. Like pagetier/core/planner.py, pure: ``state`` is not changed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagetier.core import planner
from pagetier.core.planner import Moves, fit, unique_in_order


@dataclass(frozen=True)
class Group:
    """Targets planned together: a name (a cgroup's path), their pids and their budget."""

    name: str
    pids: frozenset
    budget: int


def members(state, pids) -> np.ndarray:
    """Boolean per unit: which belong to one of ``pids``."""
    return group_ids(state, [Group("", frozenset(pids), 0)]) == 0


def _target_groups(state, groups, extra: int = 0) -> np.ndarray:
    """Per target index (and ``extra`` more slots at -1), the index of its group in ``groups``
    (-1: none; a target in several groups takes the last)."""
    table = np.full(len(state.pids) + extra, -1, np.int64)
    for i, g in enumerate(groups):
        for t, p in enumerate(state.pids):
            if p != -1 and p in g.pids:
                table[t] = i
    return table


def group_ids(state, groups) -> np.ndarray:
    """Per unit, the index of its target's group in ``groups`` (-1: none), in one pass."""
    table = _target_groups(state, groups, extra=1)
    if not len(state):
        return np.zeros(0, np.int64)
    return table[state.target]


def _per_group(gid: np.ndarray, sel: np.ndarray, w: np.ndarray, k: int) -> np.ndarray:
    """Sum of ``w`` over the units selected by ``sel``, per group (k groups)."""
    m = sel & (gid >= 0)
    return np.bincount(gid[m], weights=w[m], minlength=k)[:k].astype(np.int64)


def _split(idx: np.ndarray, gid: np.ndarray, k: int) -> list[np.ndarray]:
    """``idx`` split by group (k groups), each part in ``idx``'s order."""
    g = gid[idx]
    order = np.argsort(g, kind="stable")
    bounds = np.searchsorted(g[order], np.arange(k + 1))
    return [idx[order[bounds[i]:bounds[i + 1]]] for i in range(k)]


def _pages(state, idx) -> int:
    return int(state.npages[idx].sum(dtype=np.int64))


def fair_shares(asked: list[int], total: int) -> list[int]:
    """Max-min fair split of ``total`` among demands ``asked``."""
    out = [0] * len(asked)
    left = max(0, total)
    todo = sorted(range(len(asked)), key=lambda i: asked[i])
    for k, i in enumerate(todo):
        out[i] = min(asked[i], left // (len(todo) - k))
        left -= out[i]
    return out


def plan(state, decision, groups: list[Group], budget: int, node_room: int | None, rate: int,
         *, fast: int = 0, slow: int = 1) -> Moves:
    """The moves of ``decision`` within each group's budget, ``budget`` (all targets), the
    node's room (None: unknown) and ``rate`` pages (see the module doc). Units of no group
    are not moved."""
    n = len(state)
    promote_all = unique_in_order(decision.promote, n)
    demote_all = unique_in_order(decision.demote, n)
    asked = len(promote_all) + len(demote_all)
    gid = group_ids(state, groups)
    npages = state.npages.astype(np.int64)
    on_fast = state.node == fast
    movable_fast = _per_group(gid, on_fast & ~state.unmovable(np.arange(n)), npages, len(groups))
    pro_by, dem_by = _split(promote_all, gid, len(groups)), _split(demote_all, gid, len(groups))
    start = state.interval % len(groups) if groups else 0
    order = list(range(start, len(groups))) + list(range(start))
    rate_left = rate
    total_used = state.movable_on(fast)
    per: dict[int, dict] = {}
    for i in order:  # demotions, group by group
        g = groups[i]
        pro = pro_by[i]
        pro = pro[(state.node[pro] != fast) & ~state.stuck(pro)]
        dem = dem_by[i]
        dem = dem[(state.node[dem] != slow) & (state.node[dem] >= 0) & ~state.stuck(dem)]
        dem = dem[~np.isin(dem, pro)]
        used = int(movable_fast[i])
        if not len(pro) and used <= g.budget:
            dem = dem[:0]  # the group neither exchanges nor is over budget: its pages stay
        dem = fit(dem, state.npages, rate_left)
        rate_left -= _pages(state, dem)
        dem_fast = dem[state.node[dem] == fast]
        used -= _pages(state, dem_fast[~state.unmovable(dem_fast)])
        forced = dem[:0]
        if used > g.budget:
            cand = np.flatnonzero((gid == i) & on_fast)
            cand = cand[~np.isin(cand, dem) & ~np.isin(cand, pro) & ~state.stuck(cand)]
            cand = cand[np.lexsort((state.last_access[cand], state.heat[cand]))]
            c = np.cumsum(state.npages[cand].astype(np.int64))
            k = int(np.searchsorted(c, used - g.budget, side="left")) + 1
            forced = fit(cand[:k], state.npages, rate_left)
            rate_left -= _pages(state, forced)
            f = forced[~state.unmovable(forced)]
            used -= _pages(state, f)
        out = np.concatenate([dem, forced]).astype(np.int64)
        freed = _pages(state, out[state.node[out] == fast])
        total_used -= _pages(state, out[(state.node[out] == fast) & ~state.unmovable(out)])
        per[i] = {"demote": dem, "forced": forced, "promote": pro, "used": used, "freed": freed}
    # promotions: each group's budget, then the free room shared fairly, then the rate
    limit = None
    want = []
    for i in range(len(groups)):
        p = per[i]
        kept = fit(p["promote"], state.npages, max(0, groups[i].budget - p["used"]))
        if len(kept) < len(p["promote"]):
            limit = "budget"
        p["kept"] = kept
        want.append(max(0, _pages(state, kept) - p["freed"]))
    room = None if node_room is None else fair_shares(want, node_room)
    global_left = budget - total_used
    promote = []
    for i in order:
        p = per[i]
        kept = p["kept"]
        if room is not None:
            r = fit(kept, state.npages, room[i] + p["freed"])
            if len(r) < len(kept):
                limit = "node"
            kept = r
        cap = min(rate_left, global_left)
        r = fit(kept, state.npages, cap)
        if len(r) < len(kept):
            limit = "rate" if rate_left < global_left else "budget"
        kept = r
        rate_left -= _pages(state, kept)
        global_left -= _pages(state, kept)
        promote.append(kept)

    def cat(key):
        parts = [per[i][key] for i in order]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    forced = cat("forced")
    kw = {}
    if "wanted" in Moves.__dataclass_fields__ and hasattr(planner, "wanted_pages"):
        kw["wanted"] = planner.wanted_pages(state, decision.demote, decision.promote, fast=fast,
                                            slow=slow) + _pages(state, forced)
    return Moves(demote=cat("demote"), forced=forced,
                 promote=np.concatenate(promote).astype(np.int64) if promote else forced[:0],
                 limit=limit, asked=asked, **kw)


def refit(state, promote: np.ndarray, groups: list[Group], *, fast: int = 0) -> np.ndarray:
    """``promote`` (a plan's promotions, planned again after the demotions) less what would take
    a group over its budget now (the kernel may have refused some of its demotions)."""
    gid = group_ids(state, groups)
    n = len(state)
    used = _per_group(gid, (state.node == fast) & ~state.unmovable(np.arange(n)),
                      state.npages.astype(np.int64), len(groups))
    keep = np.zeros(len(promote), bool)
    pg = gid[promote]
    for i, g in enumerate(groups):
        mine = np.flatnonzero(pg == i)
        ok = fit(promote[mine], state.npages, g.budget - int(used[i]))
        keep[mine[:len(ok)]] = True
    return promote[keep]


def usage(state, groups: list[Group], fast: int, slow: int) -> list[tuple[int, int, int]]:
    """Per group, (pages on the fast node, those of them the kernel refused to move (outside
    the budget), pages on the slow node) of its targets' units, from the state's per-target
    counters (a target in several groups counts in the last, as :func:`group_ids` has it)."""
    f, u = state.target_pages(fast)
    s, _ = state.target_pages(slow)
    table = _target_groups(state, groups)
    k = len(groups)
    m = table >= 0
    return [(int(a), int(b), int(c)) for a, b, c in
            zip(*(np.bincount(table[m], weights=x[m], minlength=k)[:k].astype(np.int64)
                  for x in (f, u, s)))]
