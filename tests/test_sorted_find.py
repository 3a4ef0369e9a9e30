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
    assert sorted_find.load(tmp_path / "none.so") is None
