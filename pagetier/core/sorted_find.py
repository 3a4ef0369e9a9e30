"""Where sorted keys are in a sorted array: ``np.searchsorted`` and the membership it gives,
by a merge-join in compiled code when it is built, by numpy otherwise (the same results).

The daemon looks up each interval's accessed units among every unit it tracks (sorted keys:
tens of thousands among hundreds of thousands at 1 TiB in region units), and its rules ask
which of a read's units are in the last hot set. The needles come sorted, so each search can
start where the last one ended and gallop forward: a few steps a key instead of a binary
search of the whole array (at 1 TiB, 54,000 keys among 524,288: about 1 ms instead of 4-5).
The union of two sorted index sets (the candidates and the units an interval touched) is one
merge likewise, not a sort of their concatenation.

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
    """The library's functions: ``find`` by dtype, ``union`` of int64 arrays."""

    def __init__(self, lib: ctypes.CDLL):
        self.find = {}
        for dtype, name in ((np.dtype(np.uint64), "find_u64"), (np.dtype(np.int64), "find_i64")):
            f = getattr(lib, name)
            f.argtypes = [_P, _N, _P, _N, _P, _P]
            f.restype = None
            self.find[dtype] = f
        self.union = lib.union_i64
        self.union.argtypes = [_P, _N, _P, _N, _P]
        self.union.restype = _N


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
