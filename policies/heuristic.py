"""The default policy, ``heuristic``: rate-ranked placement with a noise floor, exchange under
node pressure, watermarks, hysteresis, a thrashing throttle and phase detection.

The signal is ``state.heat``: the decayed sum of each unit's estimated accesses per second
(pagetier/core/state.py). Each interval the policy ranks the units above the noise floor, takes
the hottest that fit the fast capacity it plans for, and moves what it may of the difference.
Each rule is a module of policies/rules/ (its docstring says what it decides and why):

1. noise floor (rules/noise.py): the reference heat, and the units too cold to rank;
2. hot set (rules/hotset.py): the ranked units that fit the capacity;
3. watermarks (rules/capacity.py): the capacity, and what must be demoted;
4. exchange bar (rules/exchange.py): which candidates may push a resident out;
5. fill (rules/fill.py): which may take free room;
6. young read (rules/young.py): first estimates move only clearly hot units;
7. residency (rules/residency.py): hysteresis, and what counts as a move-back;
8. throttle (rules/throttle.py): move-backs and oversubscription slow exchanges down;
9. phase change (rules/phase.py): the access pattern, and a new hot set acted on at once;
10. victims (rules/victims.py): which fast units make room, in what order;
11. sparse evidence (rules/sparse.py): on thinly sampled reads, rates estimated across reads
    with Poisson confidence bounds decide instead of one read's margins;
12. finishing a phase change (rules/finish.py): the change's exchange completed on this
    read's rates, without the margin;

and rules/plan.py puts the verdicts together into moves. The policy reads the state only
through rules/view.py. Stats (``Decision.stats``, shown under "policy" in the daemon's JSON
lines) include the pattern, ``limit`` (what kept hot units off the fast node: "budget",
"node", "rate", or None), ``exchange``, ``noise_floor``, ``reference_heat``, the throttle's
reasons, ``move_back_pages``, ``warm_promote_pages`` (warm units filling free room),
``young_read`` and ``phase_check`` (which test ruled out a phase change by this read's rates).

The helpers ``fill_budget`` and ``plan_moves`` are shared with the baselines (baselines.py).
docs/placement-log.md records what each rule measured when it was made.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from pagetier.core.sorted_find import masked
from pagetier.policies.base import Context, Decision, Policy, register
from pagetier.policies.rules.arrays import argsort_desc as _argsort_desc  # noqa: F401
from pagetier.policies.rules.arrays import jaccard_sorted as _jaccard_sorted  # noqa: F401
from pagetier.policies.rules.arrays import median_by_size as _median_by_size  # noqa: F401
from pagetier.policies.rules.arrays import member_sorted
from pagetier.policies.rules.arrays import sorted_unique as _sorted_unique  # noqa: F401
from pagetier.policies.rules import cool
from pagetier.policies.rules.capacity import Capacity
from pagetier.policies.rules.config import Config
from pagetier.policies.rules.exchange import exchange_bar, heat_before, steady_heat
from pagetier.policies.rules.finish import finish_change
from pagetier.policies.rules.fill import fill_ok, fill_scale, promoted_last, sustained_fill
from pagetier.policies.rules.hotset import HotSet, hot_set
from pagetier.policies.rules.phase import (INTERVAL_SCALE, PHASE_CHANGE_SCALE,  # noqa: F401
                                           THROTTLED_MIN_SCALE, PhaseWatch, core_units,
                                           interval_scale)
from pagetier.policies.rules.plan import Frame, make_plan, which_limit
from pagetier.policies.rules.planner import fill_budget, plan_moves  # noqa: F401
from pagetier.policies.rules.residency import counted_move_backs, idle_out, movers
from pagetier.policies.rules.sparse import TRACK_FACTOR, SparseEvidence, sparse_plan
from pagetier.policies.rules.throttle import (Throttle, oversubscribed, resampled,
                                              throttled_moves)
from pagetier.policies.rules.victims import coldest_first, victim_pool
from pagetier.policies.rules.view import PageView, Units, unit_keys  # noqa: F401
from pagetier.policies.rules.young import is_young, young_bar, young_ok


def rate_score(u: Units, decay: float) -> np.ndarray:
    """A unit's score when a phase change is seen in this read's rates: the heat a steady
    unit at this rate would have, decayed heat breaking ties."""
    return u.rate / (1.0 - decay) + 1e-6 * u.heat


@register("heuristic")
class Heuristic(PhaseWatch, Throttle, Policy):
    """Rate-ranked placement with a noise floor, exchange under node pressure, watermarks,
    hysteresis, a thrashing throttle and phase detection."""

    Config = Config

    def __init__(self, config=None):
        super().__init__(config)
        self._init_phase()
        self._init_throttle()
        self._young_at = None  # the read of the last young read
        self._chosen: np.ndarray | None = None  # sorted keys of the last decision's promotions
        # the intervals of the last young reads (their moves are guesses, rules/young.py)
        self._young_moves: deque[int] = deque(maxlen=self.config.thrash_window + 1)
        self._evidence = SparseEvidence(self.config.sparse_decay)  # samples across reads
        self._last_floor: float | None = None  # the last noise floor (rules/cool.py)

    def decide(self, state, ctx: Context) -> Decision:
        """The decision looks at candidates, not at every unit, when the state keeps them
        (rules/view.py). The result is the one ranking every unit would give; only the
        reference heat differs when more than ``1 - ref_mass`` of all heat is in units colder
        than ``min_heat`` (no hot set): it is then ``min_heat``. The candidates far under the
        last noise floor are left out of the work on each unit when the ranking shows that
        they change nothing (rules/cool.py)."""
        c = self.config
        view = PageView(state, c.min_heat)
        now, decay = view.interval, view.decay
        u, rest = view.units()
        cap = Capacity.of(ctx, c)
        if c.sparse and u.rate is not None:
            sampled = np.flatnonzero(u.rate > 0)
            self._evidence.add(u.keys(sampled), u.rate[sampled],
                               track_below=TRACK_FACTOR * c.sparse_samples)
            if self._evidence.sparse(c):
                return self._sparse_decision(view, ctx, cap)
        known, fast = u.node >= 0, u.node == ctx.fast_node
        used = view.pages_on(ctx.fast_node, u)
        last_hot = self._prev_hot  # sorted keys of the last hot set (_classify replaces it)
        last_set = self._prev_set  # ...and of all of it, warm units too (phase_core)
        # a phase change seen in this interval's rates: rank by them, not by decayed heat
        self._phase_check = None
        seen_now = u.rate is not None and self._rate_phase_change(
            u.keys, decay, u.rate, known, fast, u.npages, cap.low, u.heat)
        score = rate_score(u, decay) if seen_now else u.heat
        # every candidate, for the rules that read the accessed units (the phase detector
        # above, the sparse evidence, the next read's bookkeeping); the rest of the decision
        # may leave the cool ones out (rules/cool.py)
        everyone, known_all = u, known
        u, hot, cool_idx = self._hot_set(view, u, score, known, fast, rest, cap, seen_now)
        if cool_idx is not None:
            known, fast = u.node >= 0, u.node == ctx.fast_node
        must, max_moves = cap.must(used), max(0, int(ctx.max_moves))
        fast_idx, pool = self._fast_units(view, u, hot, fast, must, max_moves, seen_now,
                                          ctx.fast_node)
        known, fast = u.node >= 0, u.node == ctx.fast_node
        score = rate_score(u, decay) if seen_now else u.heat
        per = u.npages if c.per_page else np.ones(len(u), np.int64)
        fast_idx = coldest_first(fast_idx, score, per)
        fast_idx = fast_idx[~view.stuck(u.idx[fast_idx])]
        f, young_test, (desired_score, dsize, fast_d) = self._frame(
            view, u, hot, score, fast, fast_idx, per, used, must, cap, seen_now)

        after_change = self._since_change is not None and self._since_change < c.thrash_window
        reasons = (["oversubscribed"] if oversubscribed(after_change, hot.pages, cap.holds,
                                                        self._phase_check) else [])
        res = resampled(after_change, hot.order, score, f.bar, u.npages, cap.holds)
        self._expire_throttle(now)
        throttled_max = throttled_moves(max_moves, max(0, cap.high - used), c)
        keys = u.keys(hot.by_index) if view.incremental else np.sort(u.keys(hot.desired))
        # the pattern of the hot units, not of the warm ones filling the rest of the capacity
        core = u.sorted_keys(core_units(hot.order, score, f.bar)) if c.phase_core else keys
        # a new hot set is a phase change only when about as hot and as large as the last one
        pattern, jaccard, change = self._classify(
            keys, self._like_last(hot.ref, hot.desired_pages), core)
        if seen_now and not change:
            change, pattern = True, "phased"
        plan = self._throttled_plan(
            lambda throttle, moves, freeze=False: make_plan(f, c, throttle, moves, freeze),
            reasons, now=now, change=change, resampled=res, max_moves=max_moves,
            throttled_max=throttled_max)
        finished = 0
        sets = self._finish_sets(change, seen_now, last_hot, core)
        thrashing = "move-backs" in reasons or "frozen" in reasons
        if sets is not None and u.rate is not None and not thrashing:
            plan, finished = finish_change(plan, f, u.keys(np.arange(len(u))), u.rate, u.heat,
                                           view.stuck(u.idx), *sets, hot.floor, decay,
                                           max_moves, cap.low)
        limit = which_limit(f, plan, throttled_max if reasons else max_moves, cap.low,
                            cap.node_bound)
        # with cool units left out, every unit accessed is among every candidate (the victim
        # pool adds none)
        seen, seen_known = (u, known) if cool_idx is None else (everyone, known_all)
        self._note_read(seen, seen_known, change, last_hot, core, hot.ref, hot.desired_pages,
                        last_set)
        p, d = plan.promote, plan.demote
        self._chosen = np.sort(u.keys(p)) if len(p) else None
        promoted, demoted = int(u.npages[p].sum()), int(u.npages[d].sum())
        stats = {
            "pattern": pattern, "phase_change": change,
            "ranked_by": "rate" if seen_now else "heat", "phase_check": self._phase_check,
            "jaccard": jaccard, "interval_scale": interval_scale(pattern, change, bool(reasons)),
            "throttled": bool(reasons), "throttle_reasons": reasons, "limit": limit,
            "hot_threshold": float(desired_score.min()) if len(hot.desired) else None,
            "reference_heat": round(hot.ref, 3), "noise_floor": round(hot.floor, 3),
            "hot_pages": hot.pages, "hot_set_pages": hot.desired_pages,
            # of the hot set, the pages on the fast node before this interval's moves
            "hot_set_fast_pages": int(dsize[fast_d].sum()),
            "fast_capacity": cap.node, "fast_used": used,
            "fast_after": used + promoted - demoted,
            "promote_pages": promoted, "demote_pages": demoted,
            "exchange": bool(promoted and demoted and not must),
            "move_back_pages": plan.backs,
            # pages moved finishing a phase change's exchange on this read's rates (finish.py)
            "finish_pages": finished,
            # promoted pages under the exchange bar: warm units filling free room
            "warm_promote_pages": int(u.npages[p[score[p] < f.bar[p]]].sum()),
            "young_read": bool(young_test), "thrash": round(self._thrash, 4),
            # every candidate and the victim pool's units among none of them: the units
            # looked at, the cool ones left out counted too
            "candidates": int(len(everyone)) + int(np.count_nonzero(
                ~member_sorted(pool, everyone.idx))),
        }
        # a new hot set seen in part (its units' rates not all estimated yet): read again soon
        return Decision(promote=u.idx[p].astype(np.int64), demote=u.idx[d].astype(np.int64),
                        stats=stats, read_soon=self._phase_check == "weak")

    def _finish_sets(self, change: bool, seen_now: bool, last_hot, core):
        """(the hot sets a phase change left and brought) in its read, when seen in the
        read's rates, and for ``thrash_window`` reads after it, with ``finish_change``; else
        None."""
        c = self.config
        if not c.finish_change:
            return None
        if change:
            if not seen_now or last_hot is None or not len(last_hot):
                return None  # a change in decayed heat: the read's rates are no new evidence
            return last_hot, core
        if self._changed and self._reads - self._changed[-1][2] < c.thrash_window:
            return self._changed[-1][:2]
        return None

    def _sparse_decision(self, view: PageView, ctx: Context, cap: Capacity) -> Decision:
        """The decision on sparse evidence (rules/sparse.py), over every unit of the state."""
        idx = np.arange(len(view.state))
        _, _, node, npages, last_move = view.columns(None if not view.incremental else idx)
        used = int(npages[node == ctx.fast_node].sum())
        p, d, stats = sparse_plan(view.keys(idx), node, npages, last_move, view.stuck(idx),
                                  self._evidence, ctx.fast_node, view.interval, used,
                                  cap.high, cap.must(used), max(0, int(ctx.max_moves)),
                                  self.config)
        promoted, demoted = int(npages[p].sum()), int(npages[d].sum())
        stats.update({"fast_capacity": cap.node, "fast_used": used,
                      "fast_after": used + promoted - demoted, "promote_pages": promoted,
                      "demote_pages": demoted, "exchange": bool(promoted and demoted)})
        self._chosen = None
        return Decision(promote=p.astype(np.int64), demote=d.astype(np.int64), stats=stats)

    def _hot_set(self, view: PageView, u: Units, score, known, fast, rest: float,
                 cap: Capacity, seen_now: bool):
        """(the units the rest of the decision looks at, the hot set among them, the state
        indices of the cool units left out or None). Read by candidates and ranked by heat,
        the units under half the last noise floor are left out when the ranking shows that
        they change nothing (rules/cool.py); otherwise every candidate is ranked."""
        c = self.config
        under = None if seen_now or not view.incremental else cool.below(self._last_floor, c)
        hot = cool_idx = None
        if under is not None:
            keep, left = cool.split(score, known, under)
            if left.n:
                part = u.subset(keep)
                p_known, p_fast = masked(known, keep), masked(fast, keep)
                hot = hot_set(part.heat, p_known, p_fast, part.npages, cap.low, c, rest, left)
                if hot is not None:
                    u, cool_idx = part, masked(u.idx, ~keep)
        if hot is None:
            hot = hot_set(score, known, fast, u.npages, cap.low, c,
                          rest * 1e-6 if seen_now else rest)
        self._last_floor = hot.floor
        return u, hot, cool_idx

    def _fast_units(self, view: PageView, u: Units, hot: HotSet, fast, must: int,
                    max_moves: int, seen_now: bool, node: int) -> tuple[np.ndarray, np.ndarray]:
        """(the fast units an exchange may demote, as positions in ``u``; the victim pool, as
        sorted state indices). Read by candidates, the state's coldest fast units (the pool)
        join ``u`` (and ``hot`` follows its units' new positions): enough of them that the
        exchanges never reach past them. Read whole, there is no pool (empty)."""
        if not view.incremental:
            return np.flatnonzero(fast), u.idx[:0]
        promo_pages = int(u.npages[hot.desired][~fast[hot.desired]].sum())
        need = min(max_moves, must + promo_pages) + 1
        pool, complete = victim_pool(view, node, need, u.idx[hot.by_index], seen_now,
                                     view.interval, self.config)
        pool_sorted = np.sort(pool)  # the pool comes coldest first
        if len(pool):
            hot.remap(u.extend(pool_sorted))
        if complete:  # the pool is every unit on the node, the cool ones among them
            return np.flatnonzero(u.node == node), pool_sorted
        return np.searchsorted(u.idx, pool), pool_sorted

    def _frame(self, view, u, hot, score, fast, fast_idx, per, used, must, cap, seen_now):
        """(what the plans are made from, whether this read is young or the one after it, and
        the hot set's heat, sizes and whether on the fast node: ``score``, ``u.npages`` and
        ``fast`` at ``hot.desired``, gathered once)."""
        c = self.config
        recent, within = movers(u.last_move, view.interval, c)
        in_set = np.zeros(len(u), bool)
        in_set[hot.desired] = True
        counted = counted_move_backs(
            within, u.last_move, self._young_moves,
            None if u.rate is None else idle_out(fast, in_set, u.rate), c)
        if c.follow_change:  # the reads after a phase change finish its exchange
            counted = counted & ~self._change_units(u, fast)
        # stuck units (the kernel refused their last move) are not planned for
        fast_d = fast[hot.desired]
        slow_wanted = hot.desired[~fast_d]
        in_set[slow_wanted[view.stuck(u.idx[slow_wanted])]] = False
        desired_score, dsize = score[hot.desired], u.npages[hot.desired]
        med, bar = exchange_bar(desired_score, dsize, u.npages, c)
        ok, steady, prev, young = self._fill_verdicts(u, hot, score, in_set & ~fast, med, bar,
                                                      view, seen_now, desired_score, dsize)
        f = Frame(npages=u.npages, score=score, bar=bar, order=hot.order, in_set=in_set,
                  fast=fast, fill_ok=ok, recent=recent, within=within, counted=counted,
                  fast_idx=fast_idx, steady=steady, prev=prev, per=per,
                  gap=c.gap_ratio * hot.ref, used=used, budget=cap.budget, cap_high=cap.high,
                  must=must)
        return f, young, (desired_score, dsize, fast_d)

    def _fill_verdicts(self, u, hot, score, slow_in_set, med, bar, view, seen_now,
                       desired_score, dsize):
        """(which units may fill free room, the heat an exchange judges them on or None, their
        heat after the last read or None, whether the read is young or the one after it).
        ``desired_score``, ``dsize``: ``score`` and ``u.npages`` at ``hot.desired``."""
        c = self.config
        decay = view.decay
        fc = np.flatnonzero(slow_in_set)  # the hot set's units a promotion can take
        fs, fbar = score[fc], bar[fc]
        ok = fill_ok(fs, fbar, med[fc], c)
        steady = prev = None
        young_test = False
        if u.rate is not None and decay > 0:
            before, prev = heat_before(u.heat, u.rate, decay)
            prev_d = prev[hot.desired]
            if c.sustained_exchange and not seen_now:
                steady = steady_heat(score, before, prev, med, c)
            fnow = u.rate[fc] / (1.0 - decay)  # this read's rate as a steady unit's heat
            if c.sustained_fill:
                ok = sustained_fill(fs, fbar, None if steady is None else steady[fc], fnow,
                                    prev[fc], fill_scale(desired_score, prev_d, dsize,
                                                         u.npages[fc]), hot.floor, c)
            young = is_young(dsize, prev_d, hot.desired_pages, c)
            young_test = c.young_ratio > 0 and (young or self._young_at == self._reads - 1)
            if young_test:
                ybar = young_bar(med[fc], desired_score, dsize, u.npages[fc], c) if young else None
                ok &= young_ok(young, fs, fnow, fbar, ybar, c)
            if young:
                self._young_at = self._reads
                self._young_moves.append(view.interval)
        ok |= promoted_last(u.keys, fc, self._chosen)
        fill = np.zeros(len(u), bool)
        fill[fc] = ok
        return fill, steady, prev, young_test
