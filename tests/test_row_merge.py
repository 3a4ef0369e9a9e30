"""The compiled row passes (pagetier/core/row_merge.py) leave a PageState exactly as numpy
does: the same rows to the bit, the same candidates, the same heat of the rest, the same
touched units, over reads that bring new units, new nodes and sizes, regions, heat that decays
below the candidates' floor, and reads the library declines (unsorted, other types)."""
import shutil
import subprocess

import numpy as np
import pytest

from pagetier.core import row_merge
from pagetier.core.sample import Sample
from pagetier.core.state import PageState


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The library, built here from the source (not whatever build/ holds)."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("native")
    subprocess.run(["make", "-s", "-C", str(row_merge.SOURCE.parent), f"OUT={out}"], check=True)
    lib = row_merge.load(out / row_merge.LIB_NAME)
    assert lib is not None
    return lib


BASE = 0x7F0000000000


def reads(seed: int, units: int = 4000, intervals: int = 30):
    """Each interval's reads: accessed-only reads of a drifting hot set plus noise, with
    nodes and sizes that change now and then, regions, and a complete read every 8."""
    rng = np.random.default_rng(seed)
    addr = np.uint64(BASE) + np.arange(units, dtype=np.uint64) * np.uint64(2 << 20)
    node = rng.integers(0, 2, units).astype(np.int16)
    npages = np.full(units, 512, np.uint16)
    region = rng.random(units) < 0.7
    hot = rng.choice(units, units // 10, replace=False)
    for i in range(intervals):
        hot[rng.integers(0, len(hot), 20)] = rng.integers(0, units, 20)
        flip = rng.integers(0, units, 30)
        node[flip] = 1 - node[flip]
        npages[rng.integers(0, units, 5)] = rng.choice([1, 512], 5)
        region[rng.integers(0, units, 5)] ^= True
        sel = np.unique(np.concatenate([hot, rng.integers(0, units, 50)]))
        sel = sel[sel < units - (i % 3) * 100]  # some units seen for the first time later
        count = rng.integers(0, 40, len(sel)).astype(np.uint32)
        out = []
        freq = rng.random(len(sel)).astype(np.float32) * 100 if i % 4 == 1 else None
        s = Sample(pid=1, addr=addr[sel], count=count, node=node[sel], npages=npages[sel],
                   region=region[sel], **({} if freq is None else {"freq": freq}))
        if i % 5 == 2:  # out of order: numpy's way
            p = rng.permutation(len(sel))
            s = Sample(pid=1, addr=s.addr[p], count=count[p], node=s.node[p],
                       npages=s.npages[p], region=s.region[p])
        out.append((s, {"trust_moves": 2 if i % 2 else 0}))
        if i % 8 == 7:
            c = np.zeros(units, np.uint32)
            c[sel] = count
            out.append((Sample(pid=1, addr=addr, count=c, node=node, npages=npages,
                               region=region, complete=True), {}))
        yield out


def run(lib, monkeypatch, seed: int, decay: float, floors):
    monkeypatch.setattr(row_merge, "_LIB", lib)
    st = PageState(decay=decay)
    seen = []
    for i, rs in enumerate(reads(seed)):
        st.begin_interval()
        for s, kw in rs:
            st.update(s, **kw)
        cand, rest = st.hotter_than(floors[i % len(floors)])
        if i % 6 == 3:
            st.record_moves(cand[:5], 0)
        seen.append((cand.copy(), rest, st.touched().copy()))
    return st, seen


@pytest.mark.parametrize("seed,decay,floors", [(1, 0.5, [1.0]), (2, 0.5, [0.5, 2.0, 8.0]),
                                               (3, 0.0, [1.0]), (4, 0.9, [3.0, 0.25])])
def test_state_the_same_with_and_without_the_library(compiled, monkeypatch, seed, decay, floors):
    a, seen_a = run(compiled, monkeypatch, seed, decay, floors)
    b, seen_b = run(None, monkeypatch, seed, decay, floors)
    assert a.a.tobytes() == b.a.tobytes()
    assert a.scale == b.scale
    for (ca, ra, ta), (cb, rb, tb) in zip(seen_a, seen_b):
        np.testing.assert_array_equal(ca, cb)
        assert ra == rb
        np.testing.assert_array_equal(ta, tb)


@pytest.mark.parametrize("seed,decay,floors", [(1, 0.5, [1.0]), (4, 0.9, [3.0, 0.25])])
def test_lookup_and_accesses_in_one_pass_as_in_two(compiled, monkeypatch, seed, decay, floors):
    """The merge's lookup with the unchanged units' accesses in the same pass
    (row_merge.lookup_add; the changed units take their node, then their accesses) leaves the
    state as the two passes do (lookup_rows, then add_accesses), reads with changed nodes,
    sizes and regions among them."""
    calls = {"fused": 0, "changed": 0}
    fused = row_merge.lookup_add

    def counted(*args):
        got = fused(*args)
        if got is not None:
            calls["fused"] += 1
            calls["changed"] += int(got[2].any())
        return got

    monkeypatch.setattr(row_merge, "lookup_add", counted)
    a, seen_a = run(compiled, monkeypatch, seed, decay, floors)
    monkeypatch.setattr(row_merge, "lookup_add", lambda *args: None)
    b, seen_b = run(compiled, monkeypatch, seed, decay, floors)
    assert calls["fused"] > 10 and calls["changed"] > 5
    assert a.a.tobytes() == b.a.tobytes() and a._out == b._out
    for (ca, ra, ta), (cb, rb, tb) in zip(seen_a, seen_b):
        np.testing.assert_array_equal(ca, cb)
        assert ra == rb
        np.testing.assert_array_equal(ta, tb)


def test_library_used_on_a_sorted_read_and_declines_an_unsorted_one(compiled, monkeypatch):
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    st = PageState()
    addr = np.uint64(BASE) + np.arange(10, dtype=np.uint64) * np.uint64(4096)
    st.update(Sample(pid=1, addr=addr, count=np.ones(10, np.uint32),
                     node=np.zeros(10, np.int16), npages=np.ones(10, np.uint16)))
    keys, a = st.keys(), st.a
    node, npages = np.zeros(3, np.int16), np.array([1, 512, 1], np.uint16)
    pos, found, changed = row_merge.lookup_rows(keys, keys[[1, 4, 9]], a, node, npages, None)
    np.testing.assert_array_equal(pos, [1, 4, 9])
    assert found.all() and changed.tolist() == [False, True, False]
    assert row_merge.lookup_rows(keys, keys[[4, 1, 9]], a, node, npages, None) is None
    assert row_merge.lookup_rows(keys, keys[[1, 4, 9]], a, node.astype(np.int64), npages,
                                 None) is None


def _spaced_state(n: int, rng) -> PageState:
    """A state of n 4 KiB units at addresses with gaps of 1-40 pages between them, so that a
    key between two units is absent."""
    gaps = rng.integers(1, 41, n).astype(np.uint64)
    addr = np.uint64(BASE) + np.cumsum(gaps) * np.uint64(4096)
    st = PageState()
    st.update(Sample(pid=1, addr=addr, count=np.ones(n, np.uint32),
                     node=np.zeros(n, np.int16), npages=np.ones(n, np.uint16)))
    return st


@pytest.mark.parametrize("pattern", ["runs", "gaps", "far", "absent", "ends", "one"])
def test_lookup_places_keys_as_searchsorted(compiled, monkeypatch, pattern):
    """Both lookups place every key of a sorted read where np.searchsorted does and find the
    units it finds, over reads of runs of adjacent units, gaps of a few units, jumps of
    thousands, keys absent before, between and past the units, and the first and last unit;
    lookup_add changes the found rows as lookup_rows and add_accesses do."""
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    rng = np.random.default_rng(len(pattern))
    n = 20000
    st = _spaced_state(n, rng)
    keys = st.keys()
    if pattern == "runs":  # runs of 1-40 adjacent units
        starts = np.sort(rng.choice(n - 40, 300, replace=False))
        sel = np.unique(np.concatenate([s + np.arange(rng.integers(1, 41)) for s in starts]))
        x = keys[sel]
    elif pattern == "gaps":  # a few units apart, inside and just past the counted window
        x = keys[np.cumsum(rng.integers(1, 40, 600))]
    elif pattern == "far":
        x = keys[np.cumsum(rng.integers(1000, 5000, 4))]
    elif pattern == "absent":  # keys between units, before the first, past the last
        between = keys[rng.choice(n - 1, 2000, replace=False)] + np.uint64(1)
        x = np.unique(np.concatenate([keys[:1] - np.uint64(5), between,
                                      keys[rng.choice(n, 2000, replace=False)],
                                      keys[-1:] + np.uint64(1), keys[-1:] + np.uint64(9)]))
    elif pattern == "ends":
        x = np.concatenate([keys[:3], keys[-3:]])
    else:
        x = keys[-1:]
    want = np.searchsorted(keys, x)
    m = len(x)
    node = rng.integers(0, 2, m).astype(np.int16)
    npages = np.ones(m, np.uint16)
    pos, found, changed = row_merge.lookup_rows(keys, x, st.a, node, npages, None)
    np.testing.assert_array_equal(pos, want)
    inside = want < n
    np.testing.assert_array_equal(found, inside & (keys[np.minimum(want, n - 1)] == x))
    np.testing.assert_array_equal(changed, found & (node != 0))
    count = rng.integers(0, 3, m).astype(np.uint32)
    rate = count.astype(np.float32)
    two = st.a.copy()
    fused = row_merge.lookup_add(keys, x, st.a, node, npages, None, count, rate,
                                 np.float32(1), 5, False)
    np.testing.assert_array_equal(fused[0], want)
    np.testing.assert_array_equal(fused[1], found)
    np.testing.assert_array_equal(fused[2], changed)
    same = found & ~changed
    acc, _, _ = row_merge.add_accesses(two, pos[same], count[same], rate[same], np.float32(1),
                                       5, False)
    np.testing.assert_array_equal(fused[3][0], acc)
    assert st.a.tobytes() == two.tobytes()


def test_lookup_add_declines_an_unsorted_read_before_writing(compiled, monkeypatch):
    """A read whose keys are out of order only at its end leaves every row as it was."""
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    st = _spaced_state(500, np.random.default_rng(3))
    keys, before = st.keys(), st.a.copy()
    x = np.concatenate([keys[:400], keys[450:451], keys[449:450]])
    m = len(x)
    got = row_merge.lookup_add(keys, x, st.a, np.zeros(m, np.int16), np.ones(m, np.uint16),
                               None, np.ones(m, np.uint32), np.ones(m, np.float32),
                               np.float32(1), 5, True)
    assert got is None
    assert st.a.tobytes() == before.tobytes()


def test_prune_keeps_heat_at_the_floor_as_numpy_compares(compiled, monkeypatch):
    """The floor is compared in float32, as numpy compares a float32 column with a float."""
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    st = PageState()
    n = 6
    addr = np.uint64(BASE) + np.arange(n, dtype=np.uint64) * np.uint64(4096)
    st.update(Sample(pid=1, addr=addr, count=np.zeros(n, np.uint32),
                     node=np.zeros(n, np.int16), npages=np.ones(n, np.uint16)))
    x = 0.1000000010  # above float32(0.1) as a double, equal to it as a float32
    st.a["heat"] = np.array([0.1, 0.0999999, 0.2, 0.1, 0.05, 1.0], np.float32)
    st.hotter_than(0.05)
    cand, rest = st.hotter_than(x)
    h = st.a["heat"]
    np.testing.assert_array_equal(cand, np.flatnonzero(h >= x))
    assert rest == pytest.approx(float(h[h < np.float32(x)].sum(dtype=np.float64)))


@pytest.mark.parametrize("decay", [0.5, 0.9])
def test_columns_are_the_rows_widened(compiled, monkeypatch, decay):
    """PageState.columns: the compiled pass gives the rows' fields as numpy widens them, the
    heat scaled in float32 first (a state whose scale is not 1)."""
    st, _ = run(compiled, monkeypatch, 6, decay, [1.0])
    assert st.scale != 1.0
    idx = np.sort(np.random.default_rng(1).choice(len(st), len(st) // 3, replace=False))
    got = st.columns(idx, keys=True)
    monkeypatch.setattr(row_merge, "_LIB", None)
    want = st.columns(idx, keys=True)
    assert len(got) == len(want) == 6
    np.testing.assert_array_equal(want[5], st.keys(idx))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert g.tobytes() == w.tobytes()
    # an index out of range is left to numpy (which wraps a negative one or raises)
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    assert row_merge.columns(st.a, idx, np.float32(st.scale)) is not None
    assert row_merge.columns(st.a, np.array([len(st)]), np.float32(st.scale)) is None
    assert row_merge.columns(st.a, np.array([-1]), np.float32(st.scale)) is None


def test_new_interval_and_rated_units_the_same(compiled, monkeypatch):
    """begin_interval clears the last interval's rates and counts, and rated counts the
    touched units with a rate, to the same state with and without the library."""
    st, _ = run(compiled, monkeypatch, 7, 0.5, [1.0])
    plain, _ = run(None, monkeypatch, 7, 0.5, [1.0])
    monkeypatch.setattr(row_merge, "_LIB", compiled)
    assert st.rated(st.touched()) == int(np.count_nonzero(st.rate[st.touched()] > 0)) > 0
    st.begin_interval()
    monkeypatch.setattr(row_merge, "_LIB", None)
    assert plain.rated(plain.touched()) == int(np.count_nonzero(plain.rate[plain.touched()] > 0))
    plain.begin_interval()
    assert st.a.tobytes() == plain.a.tobytes()
    assert not st.rate.any() and not st.count.any()


def test_in_candidates_is_the_flag(compiled, monkeypatch):
    st, _ = run(compiled, monkeypatch, 8, 0.5, [50.0])
    idx = np.random.default_rng(2).integers(0, len(st), 3000)
    got = st.in_candidates(idx)
    assert got.any() and not got.all()
    np.testing.assert_array_equal(got, (st.flags[idx] & 8) != 0)  # F_CAND
    assert row_merge.has_flag(st.a, np.array([len(st)]), 8) is None


@pytest.mark.parametrize("native", [True, False])
def test_rated_count_kept_by_the_merges_matches_the_rows(compiled, monkeypatch, native):
    """rated's count, kept as the reads are merged, is the touched units with a rate after
    every read: reads that bring new units, change nodes and sizes, make regions that cover
    units (forgotten), complete reads that forget unmapped units, and intervals with a second
    read before the next begin_interval (an early read shares its interval's rates)."""
    monkeypatch.setattr(row_merge, "_LIB", compiled if native else None)
    st = PageState(decay=0.5)
    for i, rs in enumerate(reads(5)):
        if i % 3 != 2:
            st.begin_interval()
        for s, kw in rs:
            st.update(s, **kw)
            t = st.touched()
            assert st.rated() == int(np.count_nonzero(st.rate[t] > 0))
        st.hotter_than(1.0)
    assert st.rated() > 0
    fresh = PageState(decay=0.5)
    fresh.a = st.a.copy()  # rows set from outside: counted from them
    assert fresh.rated() == int(np.count_nonzero(st.a["rate"] > 0))
