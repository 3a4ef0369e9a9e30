"""Where sorted keys are in a sorted array: ``np.searchsorted`` and the membership it gives,
by a merge-join in compiled code when it is built, by numpy otherwise (the same results).

The daemon looks up each interval's accessed units among every unit it tracks (sorted keys:
tens of thousands among hundreds of thousands at 1 TiB in region units), and its rules ask
which of a read's units are in the last hot set. The needles come sorted, so each search can
start where the last one ended and gallop forward: a few steps a key instead of a binary
search of the whole array (at 1 TiB, 54,000 keys among 524,288: about 1 ms instead of 4-5).
The union of two sorted index sets (the candidates and the units an interval touched) is one
merge likewise, not a sort of their concatenation. ``member`` and ``common`` give only the
membership or its count (the rules' memberships and overlaps), without the positions.

A few one-pass helpers of the decision live here too, each numpy's result: the ranking sort's
keys made and read back (``rank_keys``, ``rank_order``), the tie-break to fast units
(``scale_fast``), a column merged after a union (``spread``, ``insert_shift``), several
columns cut by one mask (``compress``, ``masked``), and the decision's sorts of keys and rates
(``sort``: a radix sort, numpy's order).

The library (native/sorted_find.c, loaded with ctypes) is built by the build: in a checkout by
scripts/setup.sh into build/native, in an installed package by setup.py's build step into
pagetier/core/native/lib. Without it (or with PAGETIER_NO_NATIVE set) numpy does the work.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "native" / "sorted_find.c"
LIB_NAME = "libsorted_find.so"
_ROOT = HERE.parent.parent
CHECKOUT = (_ROOT / "setup.py").is_file() and (_ROOT / "kmod").is_dir()
LIB_PATH = (_ROOT / "build" / "native" if CHECKOUT else HERE / "native" / "lib") / LIB_NAME

_P = ctypes.c_void_p
_N = ctypes.c_int64


class _Lib:
    """The library's functions: ``find``, ``member`` and ``common`` by dtype, ``union`` of
    int64 arrays."""

    def __init__(self, lib: ctypes.CDLL):
        self.find, self.member, self.common = {}, {}, {}
        for dtype, sfx in ((np.dtype(np.uint64), "u64"), (np.dtype(np.int64), "i64")):
            f = getattr(lib, "find_" + sfx)
            f.argtypes = [_P, _N, _P, _N, _P, _P]
            f.restype = None
            self.find[dtype] = f
            f = getattr(lib, "member_" + sfx)
            f.argtypes = [_P, _N, _P, _N, _P]
            f.restype = None
            self.member[dtype] = f
            f = getattr(lib, "common_" + sfx)
            f.argtypes = [_P, _N, _P, _N]
            f.restype = _N
            self.common[dtype] = f
        self.union = lib.union_i64
        self.union.argtypes = [_P, _N, _P, _N, _P]
        self.union.restype = _N
        self.spread = lib.spread
        self.spread.argtypes = [_P, _P, _P, _P, _N, _N, _N]
        self.spread.restype = None
        self.insert_shift = lib.insert_shift
        self.insert_shift.argtypes = [_P, _N, _N, _P]
        self.insert_shift.restype = None
        self.scale_fast = lib.scale_fast
        self.scale_fast.argtypes = [_P, _P, _P, _N, _P]
        self.scale_fast.restype = None
        self.rank_keys = lib.rank_keys
        self.rank_keys.argtypes = [_P, _N, ctypes.c_int, _P]
        self.rank_keys.restype = ctypes.c_int
        self.rank_order = lib.rank_order
        self.rank_order.argtypes = [_P, _N, ctypes.c_int, _P, _P]
        self.rank_order.restype = _N
        self.sort_u64 = lib.sort_u64
        self.sort_u64.argtypes = [_P, _N, _P]
        self.sort_u64.restype = None
        self.sort_f32 = lib.sort_f32
        self.sort_f32.argtypes = [_P, _N, _P]
        self.sort_f32.restype = ctypes.c_int
        self.compress = lib.compress
        self.compress.argtypes = [_P, _N, _N, _P, _P, _P]
        self.compress.restype = _N


def load(path: Path = LIB_PATH) -> _Lib | None:
    """The library at ``path``, or None when it is not built (or, in a checkout, older than
    its source)."""
    try:
        if CHECKOUT and path.stat().st_mtime < SOURCE.stat().st_mtime:
            return None  # stale: scripts/setup.sh builds it again
        return _Lib(ctypes.CDLL(str(path)))
    except (OSError, AttributeError):  # AttributeError: a library without a function
        return None


_LIB = None if os.environ.get("PAGETIER_NO_NATIVE") else load()


def native() -> bool:
    """Whether the compiled lookups are in use."""
    return _LIB is not None


def find_numpy(hay: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`find` by numpy."""
    p = np.searchsorted(hay, x)
    if not len(hay):
        return p, np.zeros(len(x), bool)
    return p, hay[np.minimum(p, len(hay) - 1)] == x


def find(hay: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``np.searchsorted(hay, x)`` as int64, whether each of ``x`` is in ``hay``) for sorted
    ``hay``; fastest when ``x`` is sorted too."""
    f = None if _LIB is None else _LIB.find.get(hay.dtype)
    if f is None or x.dtype != hay.dtype or x.ndim != 1 or hay.ndim != 1:
        return find_numpy(hay, x)
    hay = np.ascontiguousarray(hay)
    x = np.ascontiguousarray(x)
    pos = np.empty(len(x), np.int64)
    found = np.empty(len(x), bool)
    f(hay.ctypes.data, len(hay), x.ctypes.data, len(x), pos.ctypes.data, found.ctypes.data)
    return pos, found


def _native_pair(table: str, hay: np.ndarray, x: np.ndarray):
    """The compiled function of ``table`` for ``hay`` and ``x`` (contiguous copies when
    needed), or None when numpy must do it."""
    if _LIB is None or x.dtype != hay.dtype or x.ndim != 1 or hay.ndim != 1:
        return None
    f = getattr(_LIB, table).get(hay.dtype)
    if f is None:
        return None
    return f, np.ascontiguousarray(hay), np.ascontiguousarray(x)


def member(hay: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Whether each of ``x`` is in sorted ``hay``: ``find(hay, x)[1]`` without the positions
    (fastest when ``x`` is sorted too)."""
    got = _native_pair("member", hay, x)
    if got is None:
        return find_numpy(hay, x)[1]
    f, hay, x = got
    found = np.empty(len(x), bool)
    f(hay.ctypes.data, len(hay), x.ctypes.data, len(x), found.ctypes.data)
    return found


def common(hay: np.ndarray, x: np.ndarray) -> int:
    """How many of ``x`` are in sorted ``hay``: ``count_nonzero(member(hay, x))``."""
    got = _native_pair("common", hay, x)
    if got is None:
        return int(np.count_nonzero(find_numpy(hay, x)[1]))
    f, hay, x = got
    return int(f(hay.ctypes.data, len(hay), x.ctypes.data, len(x)))


def spread(was: np.ndarray, got: np.ndarray, added: np.ndarray) -> np.ndarray | None:
    """A column merged after a union: ``len(was) + len(got)`` elements of ``was``'s dtype,
    ``got`` at the places ``added`` (strictly increasing) and ``was`` in order at the others;
    one copy a run. None without the library."""
    if _LIB is None:
        return None
    was = np.ascontiguousarray(was)
    got = np.ascontiguousarray(got, was.dtype)
    added = np.ascontiguousarray(added, np.int64)
    out = np.empty(len(was) + len(got), was.dtype)
    _LIB.spread(out.ctypes.data, was.ctypes.data, got.ctypes.data, added.ctypes.data,
                len(added), len(out), was.dtype.itemsize)
    return out


def insert_shift(at: np.ndarray, n: int) -> np.ndarray | None:
    """Where each of ``n`` sorted elements goes when elements are inserted before the places
    ``at`` (sorted int64, each in ``[0, n]``): ``arange(n) + cumsum(bincount(at, minlength=n +
    1)[:n])`` in one pass. None without the library."""
    if _LIB is None:
        return None
    at = np.ascontiguousarray(at, np.int64)
    out = np.empty(n, np.int64)
    _LIB.insert_shift(at.ctypes.data, len(at), n, out.ctypes.data)
    return out


def scale_fast(score: np.ndarray, cand: np.ndarray, fast: np.ndarray) -> np.ndarray | None:
    """``score[cand] * (1.0 + 1e-9 * fast[cand])`` in one pass, for float64 ``score``, int64
    ``cand`` and boolean ``fast``; None without the library or for other dtypes."""
    if (_LIB is None or score.dtype != np.float64 or cand.dtype != np.int64
            or fast.dtype != np.bool_ or score.ndim != 1 or fast.ndim != 1
            or len(fast) != len(score)):
        return None
    score = np.ascontiguousarray(score)
    cand = np.ascontiguousarray(cand)
    fast = np.ascontiguousarray(fast)
    out = np.empty(len(cand), np.float64)
    _LIB.scale_fast(score.ctypes.data, cand.ctypes.data, fast.ctypes.data, len(cand),
                    out.ctypes.data)
    return out


def rank_keys(x: np.ndarray, b: int) -> np.ndarray | None:
    """The sort keys of ``rules.arrays.argsort_desc`` for float64 ``x`` (contiguous) with
    ``b`` index bits, in one pass: None without the library or when a value is negative or
    NaN."""
    if _LIB is None:
        return None
    key = np.empty(len(x), np.uint64)
    if _LIB.rank_keys(x.ctypes.data, len(x), b, key.ctypes.data):
        return None
    return key


def rank_order(key: np.ndarray, b: int, x: np.ndarray) -> tuple[np.ndarray, int]:
    """(the indices in sorted ``key``, how many adjacent keys tie in their high bits but not
    in full value), in one pass (the library must be loaded: after :func:`rank_keys`)."""
    order = np.empty(len(key), np.int64)
    bad = _LIB.rank_order(key.ctypes.data, len(key), b, x.ctypes.data, order.ctypes.data)
    return order, int(bad)


# under this many elements numpy's sort is as fast
SORT_MIN = 1024


def sort(a: np.ndarray) -> np.ndarray:
    """``np.sort(a)``: by a radix sort in compiled code for 1-d uint64 arrays and float32 arrays
    of non-negative values (the ranking's keys, a read's rates) of ``SORT_MIN`` elements or
    more, by numpy otherwise. The result is the same array either way: equal keys are
    indistinguishable, and so are equal non-negative floats (NaN and a sign bit go to numpy)."""
    if (_LIB is None or a.ndim != 1 or not SORT_MIN <= len(a) < 1 << 31
            or a.dtype not in _RADIX):
        return np.sort(a)
    out = np.array(a, order="C")  # a copy
    tmp = np.empty_like(out)
    if a.dtype == np.float32:
        if _LIB.sort_f32(out.ctypes.data, len(out), tmp.ctypes.data):
            return np.sort(a)
        return out
    _LIB.sort_u64(out.ctypes.data, len(out), tmp.ctypes.data)
    return out


_RADIX = (np.dtype(np.uint64), np.dtype(np.float32))


# from this many elements a mask is taken in compiled code (numpy's boolean indexing steps
# through the mask with a branch an element: 0.4 ms for 86,000 at half kept, on this host)
MASK_MIN = 8192


def masked(x: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``x[keep]`` for a 1-d ``x`` and a boolean ``keep`` of its length: by :func:`compress`
    from ``MASK_MIN`` elements when the library is built, else by numpy."""
    if len(keep) >= MASK_MIN:
        got = compress(keep, x)
        if got is not None:
            return got[0]
    return x[keep]


def compress(keep: np.ndarray, *cols: np.ndarray) -> list[np.ndarray] | None:
    """``[c[keep] for c in cols]`` in one compiled pass over the mask, for a boolean ``keep``
    and 1-d columns of its length; None without the library (or for other shapes)."""
    if (_LIB is None or keep.dtype != np.bool_ or keep.ndim != 1
            or any(c.ndim != 1 or len(c) != len(keep) or c.dtype.hasobject for c in cols)):
        return None
    if any(c.dtype.itemsize not in (1, 2, 4, 8) for c in cols):
        return None
    keep = np.ascontiguousarray(keep)
    cols = [np.ascontiguousarray(c) for c in cols]
    m = int(np.count_nonzero(keep))
    outs = [np.empty(m + 1, c.dtype) for c in cols]  # room for the last element's write
    ptr = ctypes.c_void_p * len(cols)
    sizes = np.array([c.dtype.itemsize for c in cols], np.int64)
    _LIB.compress(keep.ctypes.data, len(keep), len(cols), ptr(*[c.ctypes.data for c in cols]),
                  ptr(*[o.ctypes.data for o in outs]), sizes.ctypes.data)
    return [o[:m] for o in outs]


def union(a: np.ndarray, b: np.ndarray) -> np.ndarray | None:
    """The sorted distinct elements of sorted int64 arrays ``a`` and ``b`` by one merge; None
    without the library (the caller merges with numpy)."""
    if _LIB is None:
        return None
    a = np.ascontiguousarray(a, np.int64)
    b = np.ascontiguousarray(b, np.int64)
    out = np.empty(len(a) + len(b), np.int64)
    k = _LIB.union(a.ctypes.data, len(a), b.ctypes.data, len(b), out.ctypes.data)
    return out[:k]
