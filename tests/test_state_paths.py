"""The daemon's shortcuts at scale give what the plain computations give: merging sorted sets
instead of searching them, looking keys up directly after noisy reads, a pool of coldest
units brought up to date from the units that changed, and a decision's units keeping their
keys (pagetier/core/state.py, policies/rules/arrays.py, policies/rules/view.py)."""
import numpy as np
import pytest

from pagetier.core import row_merge, state as state_mod
from pagetier.core.state import PageState, union
from pagetier.policies.rules.arrays import member_sorted
from pagetier.policies.rules.view import PageView

from test_state_incremental import FAST, SLOW, sample  # the same Sample builder


@pytest.mark.parametrize("na,nb", [(50_000, 40_000), (40_000, 2_000), (3_000, 60_000), (0, 10),
                                   (10, 0), (20_000, 20_000)])
def test_union_of_large_sets_is_numpys(na, nb):
    rng = np.random.default_rng(na + nb)
    a = np.unique(rng.integers(0, 200_000, na))
    b = np.unique(rng.integers(0, 200_000, nb))
    got = union(a, b)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.union1d(a, b))
    assert np.array_equal(union(a, a), a)


@pytest.mark.parametrize("na,nb", [(50_000, 30_000), (8_000, 16_000), (5_000, 100),
                                   (5_000, 40_000), (100, 5_000)])
def test_member_sorted_is_isin(na, nb):
    rng = np.random.default_rng(na * 7 + nb)
    a = np.unique(rng.integers(0, 1 << 40, na).astype(np.uint64))
    b = np.sort(rng.integers(0, 1 << 40, nb).astype(np.uint64))
    b = np.sort(np.concatenate([b, a[rng.random(len(a)) < 0.3], b[:10]]))  # shared, duplicated
    assert np.array_equal(member_sorted(a, b), np.isin(a, b))
    shuffled = rng.permutation(a)  # not sorted: searched
    assert np.array_equal(member_sorted(shuffled, b), np.isin(shuffled, b))
    assert not member_sorted(a, b[:0]).any() and len(member_sorted(a[:0], b)) == 0


def test_direct_lookups_after_noisy_reads_find_the_same_units(monkeypatch):
    """Reads with most of their units outside the last interval's (noise anywhere) switch the
    lookup to a direct search of every key; the state must end as one that always searches
    the last interval's units first. (numpy's lookup: the compiled one, pagetier/core/row_merge.py,
    gallops through every key.)"""
    monkeypatch.setattr(row_merge, "_LIB", None)
    rng = np.random.default_rng(1)
    universe = 0x7F0000000000 + np.arange(40_000, dtype=np.uint64) * 4096
    direct, two_stage = PageState(), PageState()
    seen = []
    for i in range(24):
        for st in (direct, two_stage):
            st.begin_interval()
        hot = np.arange(5000, 9000) if i < 12 else np.arange(20_000, 26_000)
        noise = rng.choice(len(universe), 4000 if i % 4 else 100)
        rows = np.union1d(hot[rng.random(len(hot)) < 0.95], noise)
        rate = rng.exponential(30, len(rows)) + 0.5
        node = np.where(rng.random(len(rows)) < 0.3, FAST, SLOW)
        s = sample(universe[rows], rate, node, complete=i == 0)
        monkeypatch.setattr(state_mod, "LOOKUP_MISS", 0.25)
        direct.update(s, trust_moves=2)
        seen.append(direct._direct)
        monkeypatch.setattr(state_mod, "LOOKUP_MISS", 2.0)  # never switches
        two_stage.update(s, trust_moves=2)
        assert two_stage._direct == 0
        movers = np.sort(rng.choice(len(direct), 30, replace=False))
        for st in (direct, two_stage):
            st.record_moves(movers, FAST)
        assert np.array_equal(direct.a, two_stage.a), i
        assert np.array_equal(direct.touched(), two_stage.touched()), i
    assert max(seen) > 0  # the direct search was taken


def brute_coldest(st, node):
    on = np.flatnonzero(st.node == node)
    return on[np.lexsort((on, st.heat[on].astype(np.float64) / st.npages[on]))]


@pytest.mark.parametrize("seed", range(3))
def test_coldest_pool_follows_changed_units(seed, monkeypatch):
    """The fast node's coldest units, asked every interval while units get heat (some of them
    pool members, some staying colder than the pool's key), move between nodes, change size,
    appear and are forgotten: always a true prefix of the node's units by heat per page."""
    monkeypatch.setattr(state_mod, "POOL_MIN", 64)
    rng = np.random.default_rng(seed)
    n = 3000
    universe = 0x7F0000000000 + np.arange(2 * n, dtype=np.uint64) * 4096
    st = PageState()
    st.begin_interval()
    # every unit warm (a pool's key has heat), a few cold
    st.update(sample(universe[:n], np.where(rng.random(n) < 0.1, 0.0, rng.exponential(5, n)),
                     np.where(rng.random(n) < 0.6, FAST, SLOW), complete=True))
    for i in range(60):
        st.begin_interval()
        acc = np.unique(rng.choice(len(st), int(rng.integers(1, 200))))
        # tiny rates keep some touched pool members colder than the pool's key
        rate = np.where(rng.random(len(acc)) < 0.3, 1e-6, rng.exponential(5, len(acc)) + 0.1)
        s = sample(st.addr[acc], rate, st.node[acc])
        if i % 9 == 4:  # a few sizes change (a huge page formed)
            s.npages[: 3] = 512
        st.update(s)
        if i % 11 == 7:  # new units mapped, some forgotten
            new = universe[n + i * 10: n + i * 10 + 10]
            st.update(sample(new, np.zeros(10), [FAST] * 10))
            st.forget(rng.choice(len(st), 5, replace=False))
        k = int(rng.integers(1, 300))
        got, whole = st.coldest(FAST, k)
        want = brute_coldest(st, FAST)
        assert list(got) == list(want[:len(got)]), i
        assert len(got) >= min(k, len(want)) and whole == (len(got) == len(want)), i
        moved = rng.choice(len(st), 20, replace=False)
        st.record_moves(moved[:10], FAST)
        st.record_moves(moved[10:], SLOW)


def test_units_keep_their_keys_through_extend():
    rng = np.random.default_rng(0)
    st = PageState()
    st.begin_interval()
    addrs = 0x7F0000000000 + np.sort(rng.choice(50_000, 5000, replace=False)).astype(
        np.uint64) * 4096
    st.update(sample(addrs, rng.exponential(5, 5000) + 1.5, np.where(rng.random(5000) < 0.5,
                                                                        FAST, SLOW),
                     complete=True))
    view = PageView(st, 1.0)
    u, _ = view.units()
    local = np.arange(0, len(u), 3)
    assert np.array_equal(u.keys(local), st.keys(u.idx[local]))
    more = np.setdiff1d(np.arange(len(st)), u.idx)[::2]
    u.extend(more)
    assert np.array_equal(u.keys(np.arange(len(u))), st.keys(u.idx))
