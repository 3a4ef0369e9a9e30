"""Unit tests for the default policy's rules, one group per rule (policies/rules/).

Each case gives a rule a handful of units where the right verdict is known by hand; the
policy as a whole is tested in test_policies.py.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pagetier.core.state import NEVER
from pagetier.policies.rules import (capacity, exchange, fill, hotset, noise, phase, plan,
                                     planner, residency, throttle, victims, view, young)
from pagetier.policies.rules.config import Config
from test_policies import make_state
from test_state_incremental import _Plain

C = Config()
F = np.array


def units_state(heat, node, npages=None, last_move=None, rate=None, interval=100):
    """make_state's PageState, each unit accessed in this interval at ``rate`` (its heat
    unless given)."""
    st = make_state(heat=heat, node=node, npages=npages, last_move=last_move,
                    interval=interval)
    st.a["rate"] = st.heat if rate is None else rate
    return st


# --- 1. noise floor ---------------------------------------------------------------------------


def test_reference_heat_is_the_coldest_of_the_units_carrying_ref_mass():
    # 90% of 302 is 271.8: the first three units carry it, the third's heat is the reference
    assert noise.reference_heat(F([100.0, 100, 100, 1, 1]), 0.0, C) == 100.0
    # with most heat in units left out (colder than min_heat), the reference is min_heat
    assert noise.reference_heat(F([5.0, 4]), 1000.0, C) == C.min_heat
    assert noise.reference_heat(F([]), 0.0, C) == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_hot_order_without_the_cool_units_is_the_order_with_them(seed):
    """Left out of the ranking (policies/rules/cool.py: counted, their heat summed), the units
    under a bound give the same order, reference heat and floor to the last bit, or None when
    the bound is not under the floor."""
    rng = np.random.default_rng(seed)
    n = 3000
    score = np.where(rng.random(n) < 0.4, rng.choice([1.0, 1.0000001, 2.0], n),
                     rng.lognormal(5, 2, n))
    fast = rng.random(n) < 0.5
    rest = float(rng.choice([0.0, 50.0, 1e5]))
    every = noise.hot_order(score, np.arange(n), fast, C, rest)
    under = float(rng.choice([3.0, 0.5 * every[2], 2 * every[2]]))
    keep = score >= under
    cool = noise.Cool(n=int((~keep).sum()), heat=float(score[~keep].sum()), below=under)
    part = noise.hot_order(score[keep], np.arange(int(keep.sum())), fast[keep], C, rest,
                           cool=cool)
    if under >= every[2]:  # the floor is not above the cool units
        assert part is None
        return
    assert part is not None
    order, ref, floor = part
    assert ref == every[1] and floor == every[2]
    assert np.array_equal(np.flatnonzero(keep)[order], every[0])


def test_reference_heat_asks_for_every_unit_when_the_share_falls_past_the_ranked_ones():
    cool = noise.Cool(n=100, heat=1000.0, below=20.0)
    assert noise.reference_heat(F([100.0, 50]), 0.0, C, cool) is None
    assert noise.reference_heat(F([]), 0.0, C, cool) is None
    assert noise.reference_heat(F([10000.0, 50]), 0.0, C, cool) == 10000.0


def test_sorted_rates_are_numpys_sort():
    from pagetier.policies.rules.sparse import sorted_rates

    rng = np.random.default_rng(3)
    as32 = rng.lognormal(0, 3, 5000).astype(np.float32).astype(np.float64)
    for x in (as32, rng.lognormal(0, 3, 5000), np.r_[as32, 1e300], np.zeros(0)):
        got = sorted_rates(x)
        assert got.dtype == np.float64 and np.array_equal(got, np.sort(x))


def test_noise_floor_is_a_share_of_the_reference_but_at_least_min_heat():
    assert noise.noise_floor(1000.0, C) == pytest.approx(C.noise_ratio * 1000)
    assert noise.noise_floor(2.0, C) == C.min_heat


def test_hot_order_drops_the_noise_and_ranks_per_page_with_mixed_sizes():
    score = F([100.0, 1.5, 200.0, 100.0, 50.0])
    fast = F([False, False, False, True, False])
    npages = F([1, 1, 512, 1, 1])
    order, ref, floor = noise.hot_order(score, np.arange(5), fast, C)
    assert floor == pytest.approx(C.noise_ratio * ref) and 1.5 < floor
    assert list(order) == [2, 3, 0, 4]  # unit 1 is noise; the tie 0/3 goes to the fast unit
    order, _, _ = noise.hot_order(score, np.arange(5), fast, C, npages=npages)
    assert list(order) == [3, 0, 4, 2]  # the 2 MiB unit is coldest per page


# --- 2. hot set --------------------------------------------------------------------------------


def test_hot_set_fits_the_capacity_skipping_a_unit_too_big_for_the_room_left():
    score = F([90.0, 80, 70, 60])
    npages = F([4, 512, 4, 4])
    hs = hotset.hot_set(score, np.ones(4, bool), np.zeros(4, bool), npages, 10, C)
    assert list(hs.desired) == [0, 2]  # the 2 MiB unit does not fit, the smaller ones after it do
    assert hs.desired_pages == 8 and hs.pages == 524
    assert list(hs.by_index) == [0, 2] and hs.floor >= C.min_heat


def test_fill_budget_takes_the_best_that_fit_in_order():
    order = F([3, 1, 0, 2])
    npages = F([1, 5, 2, 1])
    assert list(planner.fill_budget(order, npages, 3)) == [3, 0]  # 1 + 2; unit 1 skipped
    assert list(planner.fill_budget(order, npages, 0)) == []


# --- 3. watermarks -----------------------------------------------------------------------------


def test_capacity_takes_the_node_room_when_smaller_and_must_demote_above_high():
    ctx = SimpleNamespace(fast_budget=1000, fast_capacity=None)
    cap = capacity.Capacity.of(ctx, C)
    assert (cap.low, cap.high, cap.node_bound, cap.holds) == (950, 1000, False, 1000)
    assert cap.must(1000) == 0 and cap.must(1001) == 1001 - 950
    cap = capacity.Capacity.of(SimpleNamespace(fast_budget=1000, fast_capacity=600), C)
    assert (cap.low, cap.high, cap.node_bound, cap.holds) == (600, 600, True, 600)
    assert cap.must(700) == 0  # the node's limit never makes the policy demote


# --- 4. exchange bar ---------------------------------------------------------------------------


def test_exchange_bar_compares_units_with_the_hot_set_units_of_their_size():
    desired_score, dsize = F([100.0, 120, 4, 6]), F([512, 512, 1, 1])
    med, bar = exchange.exchange_bar(desired_score, dsize, F([512, 1, 4]), C)
    assert list(med) == [110.0, 5.0, 53.0]  # a size not in the hot set: the whole set's median
    assert list(bar) == pytest.approx([C.exchange_ratio * m for m in med])


def test_steady_heat_holds_back_a_jump_but_not_a_new_or_clearly_hot_unit():
    heat, rate = F([40.0, 40.0, 100.0]), F([38.0, 40.0, 90.0])
    before, prev = exchange.heat_before(heat, rate, 0.5)
    assert list(prev) == [4.0, 0.0, 20.0]
    steady = exchange.steady_heat(heat, before, prev, F([100.0] * 3), C)
    assert steady[0] == 4.0  # warm before, jumped now: judged on its heat before
    assert steady[1] == 40.0  # cold before: a new hot unit, not held back
    assert steady[2] == 100.0  # at one_read_ratio times the median by this read: not held


# --- 5. fill -----------------------------------------------------------------------------------


def test_fill_takes_units_at_the_bar_or_at_fill_ratio_of_the_median():
    ok = fill.fill_ok(F([30.0, 16.0, 14.0]), F([25.0] * 3), F([100.0] * 3), C)
    assert list(ok) == [True, True, False]


def test_sustained_fill_wants_a_warm_unit_warm_on_every_recent_estimate():
    fs, fbar, scale = F([20.0, 20.0, 20.0, 30.0]), F([25.0] * 4), F([100.0] * 4)
    fnow = F([20.0, 20.0, 20.0, 30.0])
    fb = F([20.0, 5.0, 20.0, 30.0])  # the second was colder before this read
    ok = fill.sustained_fill(fs, fbar, None, fnow, fb, scale, floor=18.0, c=C)
    assert list(ok) == [True, False, True, True]
    ok = fill.sustained_fill(fs, fbar, None, fnow, fb, scale, floor=25.0, c=C)
    assert list(ok) == [False, False, False, True]  # under the noise floor before: only the hot
    steady = F([20.0, 20.0, 20.0, 10.0])  # the hot one's estimate jumped
    ok = fill.sustained_fill(fs, fbar, steady, fnow, F([5.0] * 4), scale, floor=1.0, c=C)
    assert not ok.any()


def test_units_promoted_last_time_fill_on_that_evidence():
    keys = F([10, 20, 30], np.uint64)
    got = fill.promoted_last(lambda idx: keys[idx], np.arange(3), F([20, 40], np.uint64))
    assert list(got) == [False, True, False]
    assert not fill.promoted_last(lambda idx: keys[idx], np.arange(3), None).any()


# --- 6. young read -----------------------------------------------------------------------------


def test_a_read_is_young_when_most_hot_pages_have_their_first_estimate():
    dsize = F([4, 4, 4])
    assert young.is_young(dsize, F([0.0, 0.0, 50.0]), 12, C)
    assert not young.is_young(dsize, F([0.0, 50.0, 50.0]), 12, C)
    assert not young.is_young(dsize[:0], F([]), 0, C)


def test_young_bar_is_per_page_with_mixed_sizes():
    desired_score, dsize = F([512.0, 512.0, 8.0]), F([512, 512, 4])
    med = F([512.0, 8.0])
    ybar = young.young_bar(med, desired_score, dsize, F([512, 4]), C)
    assert list(ybar) == [512.0, 4.0]  # 1 access per page (most pages) times its 4 pages
    assert list(young.young_bar(med, desired_score, F([4, 4, 4]), F([4, 4]), C)) == [512.0, 8.0]
    ok = young.young_ok(True, F([300.0, 1.6]), None, None, ybar, C)
    assert list(ok) == [True, True]  # at young_ratio (0.4) times its bar
    after = young.young_ok(False, F([50.0, 50.0]), F([50.0, 10.0]), F([20.0, 20.0]), None, C)
    assert list(after) == [True, False]  # the read after: at the bar by this read's rate too


# --- 7. residency ------------------------------------------------------------------------------


def test_recent_movers_stay_and_move_backs_spare_young_guesses_and_idle_retirements():
    last = F([NEVER, 99, 97, 96, 90], np.int64)
    recent, within = residency.movers(last, 100, C)
    assert list(recent) == [False, True, False, False, False]
    assert list(within) == [False, True, True, True, False]
    counted = residency.counted_move_backs(within, last, [97], None, C)
    assert list(counted) == [False, True, False, True, False]
    idle = residency.idle_out(F([True] * 5), F([False, True, False, False, False]), F([0.0] * 5))
    counted = residency.counted_move_backs(within, last, [], idle, C)
    assert list(counted) == [False, True, False, False, False]


# --- 8. throttle -------------------------------------------------------------------------------


def test_throttle_limits():
    assert throttle.throttled_moves(1000, 10, C) == 250
    assert throttle.throttled_moves(1000, 600, C) == 600  # free room is never throttled
    assert throttle.oversubscribed(False, 200, 100, None)
    assert not throttle.oversubscribed(True, 200, 100, None)
    assert not throttle.oversubscribed(False, 200, 100, "weak")
    order, score, bar = F([0, 1, 2]), F([10.0, 10.0, 1.0]), F([5.0] * 3)
    assert throttle.resampled(True, order, score, bar, F([150, 100, 500]), 100)
    assert not throttle.resampled(True, order, score, bar, F([100, 100, 500]), 100)
    assert not throttle.resampled(False, order, score, bar, F([500] * 3), 100)


class _Throttled(throttle.Throttle):
    def __init__(self):
        self.config = C
        self._init_throttle()


def _plans(backs):
    calls = []

    def make(throttled, moves, freeze=False):
        calls.append((throttled, moves, freeze))
        return throttle.Plan(F([0]), F([1]), F([0]), 100, backs)
    return make, calls


def test_move_backs_throttle_then_freeze_and_a_phase_change_lifts_both():
    t = _Throttled()
    make, calls = _plans(backs=100)  # every page moved back
    reasons = []
    t._throttled_plan(make, reasons, now=10, change=False, resampled=False, max_moves=100,
                      throttled_max=25)
    assert reasons == ["move-backs"] and calls == [(False, 100, False), (True, 25, False)]
    assert t._throttle_until == 10 + C.thrash_window
    calls.clear()
    reasons = []
    t._throttled_plan(make, reasons, now=11, change=False, resampled=False, max_moves=100,
                      throttled_max=25)
    assert reasons == ["move-backs", "frozen"] and calls[-1] == (True, 25, True)
    reasons = ["oversubscribed"]
    t._throttled_plan(make, reasons, now=12, change=True, resampled=False, max_moves=100,
                      throttled_max=25)
    assert reasons == [] and t._throttle_until is None and t._freeze_until is None


def test_few_move_backs_do_not_throttle():
    t = _Throttled()
    make, calls = _plans(backs=1)
    reasons = []
    t._throttled_plan(make, reasons, now=10, change=False, resampled=False, max_moves=100,
                      throttled_max=25)
    assert reasons == [] and calls == [(False, 100, False)]


# --- 9. phase change ---------------------------------------------------------------------------


class _Watch(phase.PhaseWatch):
    def __init__(self, **opts):
        self.config = Config(**opts)
        self._init_phase()


def keys(*k):
    return F(sorted(k), np.uint64)


def test_pattern_from_overlap_and_a_phase_change_after_a_regular_run():
    w = _Watch()
    assert w._classify(keys(1, 2, 3))[0] == "warmup"
    assert w._classify(keys(1, 2, 3))[0] == "warmup"
    assert w._classify(keys(1, 2, 3)) == ("stable", 1.0, False)
    pattern, j, change = w._classify(keys(7, 8, 9))
    assert (pattern, j, change) == ("phased", 0.0, True)
    assert not w._classify(keys(1, 2, 3), credible=False)[2]


def test_a_weak_new_set_is_not_like_the_last():
    w = _Watch()
    w._prev_ref, w._prev_hot_pages = 100.0, 1000
    assert w._like_last(60.0, 600)
    assert not w._like_last(40.0, 600) and not w._like_last(60.0, 400)


def test_interval_scale():
    assert phase.interval_scale("stable", False, False) == 2.0
    assert phase.interval_scale("stable", True, False) == phase.PHASE_CHANGE_SCALE
    assert phase.interval_scale("warmup", False, True) == phase.THROTTLED_MIN_SCALE


def test_a_read_mostly_on_the_last_hot_set_is_no_phase_change():
    w = _Watch()
    akeys, arate = keys(1, 2, 3, 4), F([10.0, 10.0, 1.0, 1.0])
    assert w._mostly_on(akeys, arate, keys(1, 2))
    assert not w._mostly_on(akeys, arate, keys(3, 4))


# --- 10. victims -------------------------------------------------------------------------------


def test_victims_free_to_move_first_then_outside_the_hot_set():
    fast_idx = F([4, 3, 2, 1, 0])  # coldest first
    still = F([False, True, False, False, False])
    in_set = F([False, False, True, False, True])
    fidx, n_room = victims.victim_order(fast_idx, still, in_set, used=10, budget=10)
    assert list(fidx) == [3, 0, 4, 2] and n_room == 4  # unit 1 held by hysteresis
    fidx, _ = victims.victim_order(fast_idx, still, in_set, used=11, budget=10)
    assert list(fidx) == [3, 0, 4, 2, 1]  # over budget: it may go too, last


def test_coldest_first_is_per_page():
    assert list(victims.coldest_first(F([0, 1, 2]), F([10.0, 600.0, 5.0]), F([1, 512, 1]))) \
        == [1, 2, 0]


def test_victim_pool_grows_until_enough_units_are_free_to_move(monkeypatch):
    from pagetier.core import state as state_mod

    monkeypatch.setattr(state_mod, "POOL_MIN", 16)
    st = units_state(heat=np.arange(1.0, 301.0), node=[0] * 300,
                     last_move=[99] * 100 + [NEVER] * 200)  # the coldest 100 moved just now

    def pool(need):
        return victims.victim_pool(view.PageView(st, 1.0), 0, need=need,
                                   hot=np.zeros(0, np.int64), idle_only=False, now=100, c=C)

    got, complete = pool(10)  # the first pool holds 10 free units past the 100 recent movers
    assert not complete and 110 <= len(got) < 300 and list(got) == list(range(len(got)))
    got, complete = pool(len(got))  # not enough free units: the pool grows
    assert complete and list(got) == list(range(300))


# --- the plan ----------------------------------------------------------------------------------


def frame(**kw):
    n = 4  # units 0 and 1 on the fast node, 2 and 3 off it and in the hot set
    base = dict(npages=np.ones(n, np.int64), score=F([1.0, 2.0, 50.0, 40.0]),
                bar=np.full(n, 10.0), order=F([2, 3, 1, 0]), in_set=F([0, 0, 1, 1], bool),
                fast=F([1, 1, 0, 0], bool), fill_ok=np.ones(n, bool), recent=np.zeros(n, bool),
                within=np.zeros(n, bool), counted=np.zeros(n, bool), fast_idx=F([0, 1]),
                steady=None, prev=None, per=np.ones(n, np.int64), gap=1.0, used=2, budget=2,
                cap_high=2, must=0)
    base.update(kw)
    return plan.Frame(**base)


def test_a_plan_exchanges_hot_units_for_the_coldest_residents():
    p = plan.make_plan(frame(), C, False, 100)
    assert list(p.promote) == [2, 3] and list(p.demote) == [0, 1] and p.backs == 0
    assert plan.which_limit(frame(), p, 100, 2, False) is None
    p = plan.make_plan(frame(bar=np.full(4, 45.0)), C, False, 100)
    assert list(p.promote) == [2] and list(p.demote) == [0]  # unit 3 is under the bar
    assert plan.which_limit(frame(bar=np.full(4, 45.0)), p, 100, 2, False) == "budget"
    p = plan.make_plan(frame(), C, False, 2)
    assert list(p.promote) == [2] and plan.which_limit(frame(), p, 2, 2, False) == "rate"


def test_plan_moves_keeps_the_node_within_cap_and_the_rate_limit():
    npages = np.ones(6, np.int64)
    p, d = planner.plan_moves(npages, F([4, 5]), F([9.0, 8.0]), F([0, 1]), F([1.0, 8.5]),
                              used=2, cap=2, max_moves=10, margin=0.25)
    assert list(p) == [4] and list(d) == [0]  # 8 is not 1.25 times 8.5
    p, d = planner.plan_moves(npages, F([4, 5]), F([9.0, 8.0]), F([0, 1]), F([1.0, 1.0]),
                              used=2, cap=3, max_moves=1)
    assert list(p) == [4] and list(d) == []  # one free page, one move


# --- the view ----------------------------------------------------------------------------------


def test_the_view_reads_candidates_or_every_unit_alike():
    st = units_state(heat=[0.0, 5.0, 0.5, 9.0], node=[0, 1, 1, 0], npages=[1, 512, 1, 4],
                     rate=[0.0, 5.0, 0.0, 9.0])  # unit 2: warm before, not accessed now
    inc, whole = view.PageView(st, 1.0), view.PageView(_Plain(st), 1.0)
    assert inc.incremental and not whole.incremental and not view.PageView(st, 0.0).incremental
    u, rest = inc.units()
    assert list(u.idx) == [1, 3] and rest == pytest.approx(0.5)
    w, _ = whole.units()
    assert list(w.idx) == [0, 1, 2, 3]
    assert list(u.keys(np.arange(2))) == list(w.keys(F([1, 3])))
    assert inc.pages_on(0, u) == whole.pages_on(0, w) == 5
    remap = u.extend(F([0]))
    assert list(u.idx) == [0, 1, 3] and list(remap) == [1, 2] and list(u.npages) == [1, 512, 4]
    assert whole.sample_keys(1000, F([4096], np.uint64)) is not None
    assert whole.sample_keys(42, F([4096], np.uint64)) is None
