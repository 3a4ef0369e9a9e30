"""The daemon's per-interval cost follows the accessed set (daemon/state.py, policies/heuristic.py):
lazy decay, counters kept as units change, and the heuristic deciding on candidates must give
what the eager, every-unit computation gives."""
import numpy as np
import pytest

from pagetier.core import state as state_mod
from pagetier.core.state import NEVER, PageState
from pagetier.policies import Context, create
from pagetier.profiler.base import Sample

FAST, SLOW = 0, 1


def sample(addrs, rates, nodes, pid=1, complete=False):
    addrs = np.asarray(addrs, np.uint64)
    rates = np.asarray(rates, np.float32)
    return Sample(pid=pid, addr=addrs, count=(rates > 0).astype(np.uint32),
                  node=np.asarray(nodes, np.int16), npages=np.ones(len(addrs), np.uint16),
                  complete=complete, freq=rates)


def test_lazy_decay_equals_eager_decay():
    rng = np.random.default_rng(0)
    n = 500
    addrs = 0x10000 + np.arange(n, dtype=np.uint64) * 4096
    st = PageState(decay=0.5)
    eager = np.zeros(n, np.float64)
    for i in range(200):  # past several renormalisations of the global scale
        st.begin_interval()
        eager *= 0.5
        hit = rng.random(n) < (1.0 if i == 0 else 0.1)
        r = np.where(hit, rng.exponential(100, n), 0).astype(np.float32)
        s = sample(addrs[hit], r[hit], np.ones(hit.sum()), complete=False)
        st.update(s)
        eager += r
        np.testing.assert_allclose(st.heat, eager, rtol=1e-4, atol=1e-30)
        assert np.array_equal(np.flatnonzero(st.rate > 0), np.flatnonzero(hit))
        assert (st.count[~hit] == 0).all()


def test_counters_follow_moves_inserts_and_forgets():
    st = PageState()
    st.begin_interval()
    st.update(sample(np.arange(10) * 4096, np.ones(10), [SLOW] * 10, complete=True))
    st.record_moves(np.arange(4), FAST)
    st.mark_stuck(np.array([0]))
    st.begin_interval()
    st.update(sample([50 * 4096, 2 * 4096], [3, 3], [FAST, FAST]))  # one new, one re-noded
    st.forget(np.array([1]))
    for node in (FAST, SLOW):
        assert st.pages_on(node) == int((st.node == node).sum())
    assert st.unmovable_on(FAST) == 1
    st.begin_interval()
    st.update(sample(np.arange(5) * 4096, np.zeros(5), [FAST] * 5, complete=True))
    assert list(st.addr) == [i * 4096 for i in range(5)]  # unmapped units forgotten
    assert st.pages_on(FAST) == 5 and st.pages_on(SLOW) == 0


def test_per_target_counters_follow_two_targets_and_a_reused_slot():
    """The status document's per-target and per-cgroup bytes come from counters kept as units
    are inserted, moved, marked unmovable and forgotten, and a forgotten target's slot reused:
    always what a pass over the units gives."""
    from pagetier.core.shares import Group, usage

    def brute(st, node):
        t, n, w = st.target.astype(np.int64), st.node, st.npages.astype(np.int64)
        um = st.unmovable(np.arange(len(st)))
        k = len(st.pids)
        on = n == node
        return (np.bincount(t[on], weights=w[on], minlength=k).astype(np.int64),
                np.bincount(t[on & um], weights=w[on & um], minlength=k).astype(np.int64))

    rng = np.random.default_rng(3)
    st = PageState()
    pids = [11, 12]
    for i in range(40):
        if i == 20:  # the first target goes, another takes its slot
            st.forget_target(11)
            pids = [13, 12]
        st.begin_interval()
        for pid in pids:
            hit = np.flatnonzero(rng.random(300) < 0.3)
            st.update(sample(hit * 4096, rng.exponential(5, len(hit)), rng.integers(0, 2, len(hit)),
                             pid=pid, complete=i % 7 == 0))
        if len(st):
            st.record_moves(rng.choice(len(st), 20), int(rng.integers(0, 2)))
            st.mark_stuck(rng.choice(len(st), 3))
        for node in (FAST, SLOW):
            want = brute(st, node)
            got = st.target_pages(node)
            assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
            assert st.pages_on(node) == int((st.npages[st.node == node]).sum())
        groups = [Group("a", frozenset({pids[0]}), 0), Group("b", frozenset({12}), 0)]
        fast, slow = brute(st, FAST), brute(st, SLOW)
        want = [(int(fast[0][t].sum()), int(fast[1][t].sum()), int(slow[0][t].sum()))
                for t in ([st.pids.index(pids[0])], [st.pids.index(12)])]
        assert usage(st, groups, FAST, SLOW) == want


def test_candidates_hold_every_unit_above_the_floor():
    rng = np.random.default_rng(1)
    st = PageState()
    addrs = np.arange(2000, dtype=np.uint64) * 4096
    for i in range(30):
        st.begin_interval()
        hit = rng.random(len(addrs)) < 0.05
        st.update(sample(addrs[hit], rng.exponential(20, hit.sum()), np.ones(hit.sum())))
        cand, rest = st.hotter_than(1.0)
        h = st.heat.astype(np.float64)
        assert np.array_equal(cand, np.flatnonzero(h >= 1.0))
        assert np.array_equal(st.in_candidates(np.arange(len(st))), h >= 1.0)
        assert rest == pytest.approx(h[h < 1.0].sum(), rel=1e-3, abs=1e-6)


class _Plain:
    """A PageState seen through its columns only: the heuristic decides on every unit."""

    def __init__(self, st):
        self._st = st

    def __len__(self):
        return len(self._st)

    def __getattr__(self, k):
        if k in ("hotter_than", "in_candidates", "touched", "coldest", "rows", "keys"):
            raise AttributeError(k)
        return getattr(self._st, k)


@pytest.mark.parametrize("pool_min", [65536, 16])
@pytest.mark.parametrize("seed", range(4))
def test_heuristic_on_candidates_decides_as_on_every_unit(seed, pool_min, monkeypatch):
    """Over intervals with a drifting hot set and moves applied, the candidate path returns
    the same promotions and demotions as the every-unit path; also with pools of the fast
    node's coldest units far smaller than the node (as at scale: rebuilt, trimmed, joined)."""
    monkeypatch.setattr(state_mod, "POOL_MIN", pool_min)
    rng = np.random.default_rng(seed)
    n = 3000
    addrs = np.arange(n, dtype=np.uint64) * 4096
    st = PageState()
    inc, plain = create("heuristic"), create("heuristic")
    hot = rng.choice(n, 150, replace=False)
    st.begin_interval()
    st.update(sample(addrs, np.zeros(n), rng.choice([FAST, SLOW], n), complete=True))
    for i in range(40):
        if i % 10 == 9:
            hot = rng.choice(n, 150, replace=False)  # a phase change
        st.begin_interval()
        hit = np.zeros(n, bool)
        hit[hot] = rng.random(len(hot)) < 0.9
        hit |= rng.random(n) < 0.01  # noise
        r = np.where(np.isin(np.arange(n), hot), 500.0, 3.0)[hit]
        st.update(sample(addrs[hit], r, st.node[hit]))  # the profiler sees the moves
        ctx = Context(fast_budget=int(rng.integers(100, 1600)),
                      max_moves=int(rng.choice([16, 200, 1 << 40])))
        a = inc.decide(st, ctx)
        b = plain.decide(_Plain(st), ctx)
        assert np.array_equal(a.promote, b.promote) and np.array_equal(a.demote, b.demote), i
        assert a.stats["reference_heat"] == b.stats["reference_heat"], (i, a.stats, b.stats)
        st.record_moves(a.promote, FAST)
        st.record_moves(a.demote, SLOW)


def test_unit_not_seen_for_long_is_still_demotable():
    """A fast unit accessed once long ago (outside every candidate set) is the first victim
    when a hotter unit needs its room."""
    st = PageState()
    st.begin_interval()
    st.update(sample([0, 4096, 8192], [100, 100, 0], [FAST, FAST, SLOW], complete=True))
    for _ in range(60):
        st.begin_interval()
        st.update(sample([4096], [100], [FAST]))
    st.begin_interval()
    st.update(sample([4096, 8192], [100, 400], [FAST, SLOW]))
    d = create("heuristic").decide(st, Context(fast_budget=2, max_moves=10))
    assert list(d.demote) == [0] and list(d.promote) == [2]
    assert st.last_access[0] != NEVER and st.heat[0] < 1e-10


def test_first_access_after_an_empty_candidate_set():
    """Every unit cold (an empty candidate set), then one accessed: it joins the set (the
    daemon's first intervals on a program that has not run yet)."""
    st = PageState()
    st.begin_interval()
    st.update(sample([0, 4096], [0, 0], [SLOW, SLOW], complete=True))
    assert len(st.hotter_than(1.0)[0]) == 0
    st.begin_interval()
    st.update(sample([4096], [50], [SLOW]))
    st.forget(np.array([0]))
    assert list(st.hotter_than(1.0)[0]) == [0] and st.heat[0] == 50


@pytest.mark.parametrize("seed", range(6))
def test_phase_change_bound_changes_no_decision(seed, monkeypatch):
    """The cheap bound that skips ranking by rate (Heuristic._change_possible) never hides a
    phase change: with mixed unit sizes, noise and hot sets that jump, the policy decides as
    it does without the bound."""
    from pagetier.policies.heuristic import Heuristic

    rng = np.random.default_rng(seed)
    n = 2000
    npages = np.where(rng.random(n) < 0.2, 512, 1).astype(np.uint16)
    addrs = (np.cumsum(npages.astype(np.uint64)) - npages) * np.uint64(4096)

    def smp(idx, rates, nodes, complete=False):
        s = sample(addrs[idx], rates, nodes, complete=complete)
        s.npages = npages[idx]
        return s

    def run(bound):
        if not bound:
            monkeypatch.setattr(Heuristic, "_change_possible", lambda self, *a: True)
        st = PageState()
        pol = create("heuristic")
        r = np.random.default_rng(seed)
        hot = r.choice(n, 120, replace=False)
        st.begin_interval()
        st.update(smp(np.arange(n), np.zeros(n), r.choice([FAST, SLOW], n), complete=True))
        out = []
        for i in range(40):
            if r.random() < 0.15:  # a phase change, often partial
                k = int(r.integers(20, 121))
                hot = np.unique(np.r_[hot[k:], r.choice(n, k, replace=False)])
            st.begin_interval()
            hit = np.zeros(n, bool)
            hit[hot] = r.random(len(hot)) < 0.9
            hit |= r.random(n) < 0.02
            idx = np.flatnonzero(hit)
            rates = np.where(np.isin(idx, hot), 400.0, 3.0) * r.uniform(0.5, 2, len(idx))
            st.update(smp(idx, rates, st.node[idx]))
            d = pol.decide(st, Context(fast_budget=int(r.integers(2000, 60000)), max_moves=1 << 40))
            out.append((d.promote.tolist(), d.demote.tolist(), d.stats["ranked_by"]))
            st.record_moves(d.promote, FAST)
            st.record_moves(d.demote, SLOW)
        return out

    with_bound = run(True)
    without = run(False)
    assert with_bound == without
    print("intervals ranked by rate:", sum(x[2] == "rate" for x in without))


def brute_coldest(st, node):
    on = np.flatnonzero(st.node == node)
    return on[np.lexsort((on, st.heat[on].astype(np.float64) / st.npages[on]))]


def test_coldest_stays_exact_when_the_pool_key_unit_is_forgotten(monkeypatch):
    """The pool's key (the first unit left out) forgotten with units before it: the key moves
    to where the unit after it now is, so a tie of its heat that joins the node later lands on
    the right side of it."""
    monkeypatch.setattr(state_mod, "POOL_MIN", 4)
    st = PageState()
    st.begin_interval()
    nodes = [FAST] * 8
    nodes[6] = SLOW
    st.update(sample(np.arange(8) * 4096, np.ones(8), nodes, complete=True))  # all heat 1
    got, _ = st.coldest(FAST, 1)  # a pool of units 0-3; the key: unit 4
    assert list(got) == [0]
    st.forget(np.array([0, 1, 2, 4]))  # three pool members and the key: 3 5 6 7 are now 0 1 2 3
    st.record_moves(np.array([2]), FAST)  # (once unit 6) joins the fast node: after unit 1
    for k in (1, 2, 3, 4):
        got, _ = st.coldest(FAST, k)
        assert list(got) == list(brute_coldest(st, FAST)[:len(got)]) and len(got) >= k, k


def test_kth_smallest_is_the_partition():
    """The pool's selection (state_mod.kth_smallest): np.partition's k-th value with no zeros,
    few, most or only zeros, ties, negatives and NaN; and a pool built from a node whose units
    are mostly without heat is the node's coldest, as brute force orders them."""
    rng = np.random.default_rng(37)
    for n in (1, 2, 17, 5000):
        for zeros in (0.0, 0.3, 0.95, 1.0):
            h = np.where(rng.random(n) < zeros, 0.0, rng.integers(1, 9, n) / 4.0)
            for extra in (None, -1.0, np.nan):
                x = h.copy()
                if extra is not None:
                    x[rng.integers(0, n)] = extra
                for k in sorted({0, n // 2, n - 1}):
                    got, want = state_mod.kth_smallest(x, k), np.partition(x, k)[k]
                    assert (got == want or (np.isnan(got) and np.isnan(want))), (n, zeros, k)
    st = PageState()
    st.begin_interval()
    n = 3 * state_mod.POOL_MIN
    st.update(sample(np.arange(n, dtype=np.uint64) * 4096, np.where(np.arange(n) % 7, 0, 3),
                     [FAST] * n, complete=True))
    got, _ = st.coldest(FAST, 10)
    assert list(got) == list(brute_coldest(st, FAST)[:len(got)]) and len(got) >= 10


@pytest.mark.parametrize("estimates", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_merge_shortcuts_equal_the_plain_lookup(seed, estimates):
    """Two shortcuts of PageState.update: looking units up among the last interval's accessed
    ones first, and merging a complete read of unchanged units on a slice. A state that takes
    neither (every unit looked up) must end with the same rows, interval after interval, with
    units added, unmapped, re-noded and moved, for two targets, with frequency estimates and
    with counts alone."""
    rng = np.random.default_rng(seed)
    universe = 0x7F0000000000 + np.arange(6000, dtype=np.uint64) * 4096
    fast, plain = PageState(), PageState()

    def no_recent_no_slice(st):
        forget_absent = st._forget_absent

        def forget_then_look_up(t, addr, span=None):
            forget_absent(t, addr, span)
            return None
        st._forget_absent = forget_then_look_up

    no_recent_no_slice(plain)
    mapped = {pid: np.sort(rng.choice(len(universe), 3000, replace=False)) for pid in (1, 2)}
    for i in range(40):
        for st in (fast, plain):
            st.begin_interval()
        plain._recent = None
        for pid in (1, 2):
            if i % 7 == 3:  # some units unmapped, some mapped
                m = mapped[pid]
                m = m[rng.random(len(m)) > 0.02]
                mapped[pid] = np.union1d(m, rng.choice(len(universe), 50))
            m = mapped[pid]
            complete = i % 5 == 0
            hot = m[: len(m) // 2] if i < 20 else m[len(m) // 2:]  # a phase change
            acc = np.union1d(hot[rng.random(len(hot)) < 0.9], rng.choice(m, 100))
            rows = m if complete else acc
            rate = np.where(np.isin(rows, acc), rng.exponential(50, len(rows)), 0.0)
            node = np.where(rng.random(len(rows)) < 0.01, FAST, SLOW)
            s = sample(universe[rows], rate, node, pid=pid, complete=complete)
            if not estimates:
                s.count = np.ceil(rate / 10).astype(np.uint32)
                s.freq = np.zeros(0, np.float32)
            for st in (fast, plain):
                st.update(s, trust_moves=2, interval_s=1.0, elapsed_s=1.5 if i % 3 else 0.5,
                          max_count=None if estimates else 3)
        movers = np.sort(rng.choice(len(fast), 40, replace=False))
        for st in (fast, plain):
            st.record_moves(movers, FAST)
            cand, _ = st.hotter_than(5.0 if i < 30 else 2.0)  # a lower floor rebuilds the set
            assert np.array_equal(st.in_candidates(np.arange(len(st))),
                                  st.heat.astype(np.float64) >= (5.0 if i < 30 else 2.0)), i
        assert np.array_equal(fast.a, plain.a), i
        assert np.array_equal(fast.touched(), plain.touched()), i


def test_union_remap_places_both_inputs():
    from pagetier.core.state import union, union_remap

    rng = np.random.default_rng(0)
    for _ in range(500):
        a = np.unique(rng.integers(0, int(rng.integers(1, 200)), int(rng.integers(0, 60))))
        b = np.unique(rng.integers(0, int(rng.integers(1, 200)), int(rng.integers(0, 60))))
        u, at_a, added = union_remap(a, b)
        assert np.array_equal(u, union(a, b))
        assert np.array_equal(u[at_a], a)
        rest = np.ones(len(u), bool)
        rest[at_a] = False
        assert np.array_equal(np.flatnonzero(rest), added)


@pytest.mark.parametrize("pool_min", [65536, 16])
@pytest.mark.parametrize("seed", range(4))
def test_cool_units_left_out_change_no_decision(seed, pool_min, monkeypatch):
    """Leaving the units far under the last noise floor out of the decision's work
    (policies/rules/cool.py) decides as ranking every candidate does: the same moves and the
    same stats (the reference heat to the last bit, the candidates counted), with region
    units, single-page noise at about min_heat, a hot set that moves, fast budgets small and
    large (a victim pool that is the whole fast node, and one far smaller than it)."""
    from pagetier.policies.heuristic import Heuristic
    from pagetier.policies.rules import cool

    monkeypatch.setattr(state_mod, "POOL_MIN", pool_min)
    hot_set, split = Heuristic._hot_set, []

    def counted(self, *a):
        u, hot, cool_idx = hot_set(self, *a)
        split.append(cool_idx is not None)
        return u, hot, cool_idx

    monkeypatch.setattr(Heuristic, "_hot_set", counted)
    n = 4000
    addrs = np.arange(n, dtype=np.uint64) * np.uint64(512 * 4096)

    def smp(idx, rates, nodes, complete=False):
        s = sample(addrs[idx], rates, nodes, complete=complete)
        s.npages = np.full(len(idx), 512, np.uint16)
        return s

    def run(leave_out):
        below = cool.below
        monkeypatch.setattr(cool, "below", below if leave_out else lambda *a: None)
        st = PageState()
        pol = create("heuristic")
        r = np.random.default_rng(seed)
        hot = r.choice(n, 300, replace=False)
        st.begin_interval()
        st.update(smp(np.arange(n), np.zeros(n), r.choice([FAST, SLOW], n), complete=True))
        out = []
        for i in range(40):
            if r.random() < 0.15:  # a phase change, often partial
                k = int(r.integers(30, 301))
                hot = np.unique(np.r_[hot[k:], r.choice(n, k, replace=False)])
            st.begin_interval()
            hit = np.zeros(n, bool)
            hit[hot] = r.random(len(hot)) < (0.3 if r.random() < 0.2 else 0.9)  # some partial
            noise = r.random(n) < 0.02
            hit |= noise
            idx = np.flatnonzero(hit)
            rates = np.where(np.isin(idx, hot), r.uniform(50, 25000, len(idx)),
                             np.where(r.random(len(idx)) < 0.8, 1.0, 2.0))
            st.update(smp(idx, rates, st.node[idx]))
            budget = int(r.choice([20, 200, 3000])) * 512
            moves = int(r.choice([2048, 1 << 40]))
            d = pol.decide(st, Context(fast_budget=budget, max_moves=moves))
            out.append((d.promote.tolist(), d.demote.tolist(), d.stats))
            st.record_moves(d.promote, FAST)
            st.record_moves(d.demote, SLOW)
        return out

    with_cool = run(True)
    left = sum(split)
    every = run(False)
    assert left >= 20 and sum(split) == left  # left out in most decisions, and only with it on
    for i, (a, b) in enumerate(zip(with_cool, every)):
        assert a == b, i
