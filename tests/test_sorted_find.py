"""The compiled sorted lookups (pagetier/core/sorted_find.py) give numpy's results: positions
and membership for sorted and unsorted needles, both dtypes, duplicates and empty arrays; and
the rules' and the state's helpers built on them agree with and without the library."""
import shutil
import subprocess

import numpy as np
import pytest

from pagetier.core import sorted_find, state as core_state
from pagetier.policies.rules.arrays import jaccard_sorted, member_sorted


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The library, built here from the source (not whatever build/ holds)."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("native")
    subprocess.run(["make", "-s", "-C", str(sorted_find.SOURCE.parent), f"OUT={out}"],
                   check=True)
    lib = sorted_find.load(out / sorted_find.LIB_NAME)
    assert lib is not None
    return lib


def cases():
    rng = np.random.default_rng(7)
    for dtype in (np.uint64, np.int64):
        for n, m in ((0, 5), (5, 0), (1, 1), (100, 1000), (5000, 300), (20000, 20000)):
            hay = np.sort(rng.integers(0, 4 * max(n, 1), n)).astype(dtype)  # with duplicates
            hay_unique = np.unique(hay)
            x = rng.integers(-2 if dtype is np.int64 else 0, 4 * max(n, 1) + 3, m).astype(dtype)
            yield hay, np.sort(x)
            yield hay, x  # out of order
            yield hay_unique, np.unique(x)
    big = np.array([0, 1, 2**63 - 1, 2**64 - 2, 2**64 - 1], np.uint64)
    yield big, big.copy()
    yield big, big[::-1].copy()


CASES = list(cases())


@pytest.mark.parametrize("k", range(len(CASES)))
def test_compiled_find_is_searchsorted(compiled, monkeypatch, k):
    hay, x = CASES[k]
    monkeypatch.setattr(sorted_find, "_LIB", compiled)
    pos, found = sorted_find.find(hay, x)
    want_pos, want_found = sorted_find.find_numpy(hay, x)
    assert pos.dtype == np.int64 and found.dtype == bool
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(pos, np.searchsorted(hay, x))
    got = sorted_find.member(hay, x)
    assert got.dtype == bool
    np.testing.assert_array_equal(got, want_found)
    assert sorted_find.common(hay, x) == int(np.count_nonzero(want_found))


def test_member_dense_and_sparse_paths(compiled, monkeypatch):
    """member and common step one by one (needles at least as many as hay) or count and
    gallop (fewer): both give find's membership, with long gaps, runs and out-of-order keys."""
    monkeypatch.setattr(sorted_find, "_LIB", compiled)
    rng = np.random.default_rng(11)
    for n, m in ((28_000, 54_000), (54_000, 28_000), (300, 30_000), (30_000, 300), (7, 7),
                 (1, 100), (100, 1)):
        hay = np.unique(rng.integers(0, 524_288, n)).astype(np.uint64)
        x = np.unique(rng.integers(0, 524_288, m)).astype(np.uint64)
        # a run of needles past the hay's end and a stretch in one long gap
        x = np.unique(np.concatenate([x, np.arange(600_000, 600_050, dtype=np.uint64)]))
        for xs in (x, x[::-1].copy(), rng.permutation(x)):
            want = sorted_find.find_numpy(hay, xs)[1]
            np.testing.assert_array_equal(sorted_find.member(hay, xs), want)
            assert sorted_find.common(hay, xs) == int(np.count_nonzero(want))


def test_helpers_agree_with_and_without_the_library(compiled, monkeypatch):
    rng = np.random.default_rng(3)
    for n, m in ((50_000, 40_000), (300, 20_000), (20_000, 300), (0, 10), (10, 0)):
        b = np.unique(rng.integers(0, 200_000, n)).astype(np.uint64)
        a = np.unique(rng.integers(0, 200_000, m)).astype(np.uint64)
        ai, bi = a.astype(np.int64), b.astype(np.int64)
        got = {}
        for lib in (compiled, None):
            monkeypatch.setattr(sorted_find, "_LIB", lib)
            got[lib is None] = (member_sorted(a, b), member_sorted(a[::-1].copy(), b),
                                  jaccard_sorted(a, b), core_state.union(ai, bi),
                                  core_state._find(bi, ai))
        native, plain = got[False], got[True]
        for x, y in zip(native[:2], plain[:2]):
            np.testing.assert_array_equal(x, y)
        assert native[2] == plain[2]
        np.testing.assert_array_equal(native[3], plain[3])
        for x, y in zip(native[4], plain[4]):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(native[0], np.isin(a, b))


def test_compiled_union_is_the_sorted_union(compiled, monkeypatch):
    monkeypatch.setattr(sorted_find, "_LIB", compiled)
    rng = np.random.default_rng(5)
    for n, m in ((0, 0), (0, 7), (7, 0), (1000, 1000), (100, 5000), (30_000, 20_000)):
        a = np.unique(rng.integers(-50, 3 * max(n, 1), n))
        b = np.unique(rng.integers(-50, 3 * max(m, 1), m))
        got = sorted_find.union(a, b)
        np.testing.assert_array_equal(got, np.union1d(a, b).astype(np.int64))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(core_state.union(a, b), got)


def test_missing_library_falls_back(tmp_path, monkeypatch):
    monkeypatch.setattr(sorted_find, "_LIB", None)
    assert sorted_find.union(np.arange(3), np.arange(2)) is None
    np.testing.assert_array_equal(sorted_find.member(np.arange(3), np.array([1, 5])),
                                  [True, False])
    assert sorted_find.common(np.arange(3), np.array([1, 2, 5])) == 2
    assert sorted_find.load(tmp_path / "none.so") is None


def test_argsort_desc_with_and_without_the_library(compiled, monkeypatch):
    """The rules' ranking sort (keys made and read back by the library, or by numpy) is the
    stable descending argsort, with near-equal values (the keys' index bits hide their last
    bits: the runs put in order afterwards), -0.0, ties, negatives and NaN."""
    from pagetier.policies.rules.arrays import argsort_desc

    rng = np.random.default_rng(13)
    near = 1.0 + rng.integers(0, 40, 5000) * np.finfo(np.float64).eps
    xs = [rng.random(60_000) * 1e4, rng.integers(0, 5, 3000).astype(np.float64), near,
          np.where(rng.random(4000) < 0.4, 1.0, 1.000000001), np.r_[near, [0.0, -0.0, 7.0]],
          np.array([0.0, -0.0, 1e-300, 2.0, 2.0, np.inf]), np.array([1.0, -1.0, 0.5]),
          np.array([1.0, np.nan]), np.array([3.0]), np.zeros(0),
          rng.random(2000).astype(np.float32)]
    for lib in (compiled, None):
        monkeypatch.setattr(sorted_find, "_LIB", lib)
        for x in xs:
            got = argsort_desc(x)
            assert got.dtype == np.int64
            np.testing.assert_array_equal(got, np.argsort(-np.asarray(x, np.float64),
                                                          kind="stable"))


def test_spread_is_the_masked_merge(compiled, monkeypatch):
    """A column merged after a union (the decision's units joined by the victim pool): the
    added values at their places, the old ones in order at the rest, for each dtype."""
    monkeypatch.setattr(sorted_find, "_LIB", compiled)
    rng = np.random.default_rng(17)
    for total, k in ((0, 0), (5, 0), (5, 5), (1, 1), (1000, 1), (60_000, 300), (100, 60)):
        added = np.sort(rng.choice(total, k, replace=False)).astype(np.int64)
        new = np.zeros(total, bool)
        new[added] = True
        for dtype in (np.float64, np.int64, np.uint64, np.int16, np.uint8, bool):
            was = rng.integers(0, 100, total - k).astype(dtype)
            got = rng.integers(100, 200, k).astype(dtype)
            want = np.empty(total, dtype)
            want[~new] = was
            want[new] = got
            out = sorted_find.spread(was, got, added)
            assert out.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(out, want)
    monkeypatch.setattr(sorted_find, "_LIB", None)
    assert sorted_find.spread(np.zeros(2), np.zeros(1), np.array([0])) is None


def test_insert_shift_scale_fast_and_union_remap(compiled, monkeypatch):
    """The places of a union's old elements, the ranking's tie-break to fast units, and
    union_remap with and without the library: numpy's results."""
    from pagetier.policies.rules.noise import hot_order

    rng = np.random.default_rng(19)
    for n, k in ((0, 0), (1, 1), (10, 0), (1000, 30), (60_000, 300)):
        at = np.sort(rng.integers(0, n + 1, k)).astype(np.int64)
        want = np.arange(n) + np.cumsum(np.bincount(at, minlength=n + 1)[:n])
        monkeypatch.setattr(sorted_find, "_LIB", compiled)
        np.testing.assert_array_equal(sorted_find.insert_shift(at, n), want)
    score = np.r_[rng.random(5000) * 1e4, [0.0, 1e-300, 1.0, np.inf]]
    fast = rng.random(len(score)) < 0.4
    cand = np.flatnonzero(score > 0)
    got = sorted_find.scale_fast(score, cand, fast)
    np.testing.assert_array_equal(got.view(np.uint64),
                                  (score[cand] * (1.0 + 1e-9 * fast[cand])).view(np.uint64))
    assert sorted_find.scale_fast(score.astype(np.float32), cand, fast) is None
    for n, m in ((0, 5), (5, 0), (2000, 300), (300, 2000), (50_000, 500)):
        a = np.unique(rng.integers(0, 200_000, n))
        b = np.unique(rng.integers(0, 200_000, m))
        out = {}
        for lib in (compiled, None):
            monkeypatch.setattr(sorted_find, "_LIB", lib)
            out[lib is None] = core_state.union_remap(a, b)
            u, remap, added = out[lib is None]
            np.testing.assert_array_equal(u, np.union1d(a, b))
            np.testing.assert_array_equal(u[remap], a)
            assert not np.isin(u[added], a).any() and len(added) + len(a) == len(u)
        for x, y in zip(out[False], out[True]):
            np.testing.assert_array_equal(x, y)
    from pagetier.policies.rules.config import Config
    c = Config()
    sc = np.where(rng.random(3000) < 0.5, 1.0, rng.random(3000) * 1e3)
    fa = rng.random(3000) < 0.3
    res = {}
    for lib in (compiled, None):
        monkeypatch.setattr(sorted_find, "_LIB", lib)
        res[lib is None] = hot_order(sc, np.flatnonzero(sc > 0), fa, c, 10.0)
    np.testing.assert_array_equal(res[False][0], res[True][0])
    assert res[False][1:] == res[True][1:]


def test_radix_sort_is_numpys_sort(compiled, monkeypatch):
    """sorted_find.sort, with and without the library: np.sort of uint64 keys (random, the
    ranking's float keys whose high bytes all agree, duplicates, the extremes) and of float32
    rates (with -0.0, negatives, NaN and inf, which go to numpy), and of other dtypes; and the
    sparse evidence's sorted rates."""
    from pagetier.policies.rules.sparse import sorted_rates

    rng = np.random.default_rng(23)
    heat = rng.exponential(10.0, 40_000)
    keys = (~heat.view(np.uint64) & ~np.uint64(0xFFFF)) | np.arange(40_000, dtype=np.uint64)
    rates = rng.exponential(3.0, 54_000).astype(np.float32)
    xs = [rng.integers(0, 2**64 - 1, 30_000, dtype=np.uint64), keys,
          rng.integers(0, 7, 5000).astype(np.uint64), np.full(2000, 2**64 - 1, np.uint64),
          np.r_[np.arange(3000, dtype=np.uint64), [0, 2**63, 2**64 - 1]][::-1].copy(),
          rng.integers(0, 9, sorted_find.SORT_MIN).astype(np.uint64), np.zeros(0, np.uint64),
          np.arange(5, dtype=np.uint64), rates, np.r_[rates[:3000], [0.0, np.inf]],
          np.r_[rates[:3000], [-0.0]].astype(np.float32),
          np.r_[rates[:3000], [-1.0]].astype(np.float32),
          np.r_[rates[:3000], [np.nan]].astype(np.float32),
          rng.random(5000), rng.integers(-5, 5, 5000), rates[::2]]
    for lib in (compiled, None):
        monkeypatch.setattr(sorted_find, "_LIB", lib)
        for x in xs:
            before = x.copy()
            got = sorted_find.sort(x)
            assert got.dtype == x.dtype
            np.testing.assert_array_equal(got, np.sort(x))
            np.testing.assert_array_equal(x, before)  # a copy: the argument is left alone
        r = rates.astype(np.float64)
        np.testing.assert_array_equal(sorted_rates(r), np.sort(r))


def test_compress_is_the_masked_copy(compiled, monkeypatch):
    """Several columns cut by one mask (the decision's units without the cool ones): numpy's
    ``c[keep]`` for each dtype, empty and full masks; and Units.subset with and without the
    library."""
    from pagetier.policies.rules.view import Units

    monkeypatch.setattr(sorted_find, "_LIB", compiled)
    rng = np.random.default_rng(29)
    for n, share in ((0, 0.5), (1, 1.0), (1, 0.0), (1000, 0.0), (1000, 1.0), (57_000, 0.55),
                     (5000, 0.01)):
        keep = rng.random(n) < share
        cols = [rng.integers(0, 1 << 40, n), rng.random(n), rng.random(n).astype(np.float32),
                rng.integers(-3, 3, n).astype(np.int8), rng.integers(0, 512, n).astype(np.uint16),
                rng.integers(0, 2**63, n).astype(np.uint64), rng.random(n) < 0.5,
                rng.integers(0, 9, n)[::-1]]  # a reversed view
        got = sorted_find.compress(keep, *cols)
        for g, c in zip(got, cols):
            assert g.dtype == c.dtype
            np.testing.assert_array_equal(g, c[keep])
    assert sorted_find.compress(np.ones(3, bool), np.zeros((3, 2))) is None
    assert sorted_find.compress(np.ones(3, np.int8), np.zeros(3)) is None
    n = 20_000
    keep = rng.random(n) < 0.5
    for rate in (rng.random(n), None):
        u = Units(None, np.arange(n) * 3, rng.random(n), rate, rng.integers(-1, 2, n).astype(
            np.int8), rng.integers(1, 513, n), rng.integers(0, 50, n),
            _keys=np.arange(n, dtype=np.uint64) * 7)
        subs = {}
        for lib in (compiled, None):
            monkeypatch.setattr(sorted_find, "_LIB", lib)
            subs[lib is None] = u.subset(keep)
        for name in ("idx", "heat", "rate", "node", "npages", "last_move", "_keys"):
            a, b = getattr(subs[False], name), getattr(subs[True], name)
            if a is None or b is None:
                assert a is None and b is None
                continue
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def test_masked_is_boolean_indexing(compiled, monkeypatch):
    """sorted_find.masked, with and without the library, under and over MASK_MIN, at any
    share kept: ``x[keep]``."""
    rng = np.random.default_rng(31)
    for lib in (compiled, None):
        monkeypatch.setattr(sorted_find, "_LIB", lib)
        for n in (0, 10, sorted_find.MASK_MIN - 1, sorted_find.MASK_MIN, 86_000):
            for share in (0.0, 0.01, 0.5, 0.99, 1.0):
                keep = rng.random(n) < share
                for x in (rng.random(n), rng.integers(0, 99, n), rng.random(n) < 0.3,
                          rng.integers(0, 2**63, n).astype(np.uint64)):
                    got = sorted_find.masked(x, keep)
                    assert got.dtype == x.dtype
                    np.testing.assert_array_equal(got, x[keep])
