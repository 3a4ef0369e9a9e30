"""PageState's passes over its rows in compiled code, when it is built; None otherwise (the
state then does the same with numpy, to the same bits).

At 1 TiB in region units an interval's read brings about 54,000 accessed units among 524,288,
and the state keeps about 58,000 candidates. numpy looks up the read's keys, gathers the units'
36-byte rows, compares nodes and sizes, updates five fields and scatters the rows back: a pass
over scattered rows for each step. Here each is one pass, each row fetched a few rows ahead
of its use so that the cache misses overlap:

- :func:`lookup_rows`: each key's place among the state's sorted keys (a merge-join, as
  pagetier.core.sorted_find), and whether a found unit's node, size or region flag differ from
  the read's;
- :func:`add_accesses`: the accessed units' count, rate, heat and last access, and which of
  them join the candidate set; :func:`lookup_add`: both in one pass over the rows;
- :func:`prune`: the candidates whose heat decayed below the floor leave the set;
- :func:`clear_rates`: the rates and counts of the last interval's units cleared;
  :func:`count_rated`: how many of the touched ones have a rate; :func:`has_flag`: which of
  them are candidates;
- :func:`columns`: the decision's columns of some units (heat, rate, node, size, last move),
  widened as the decision reads them.

The library (native/row_merge.c, loaded with ctypes) is built beside the sorted lookups'
(see pagetier.core.sorted_find); PAGETIER_NO_NATIVE switches both off.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np

from pagetier.core import sorted_find

SOURCE = sorted_find.HERE / "native" / "row_merge.c"
LIB_NAME = "librow_merge.so"
LIB_PATH = sorted_find.LIB_PATH.parent / LIB_NAME
# the fields' byte offsets, in the order of row_merge.c's OFF_*
FIELDS = ("heat", "rate", "count", "last_access", "npages", "node", "flags", "last_move", "addr",
          "target")

_P = ctypes.c_void_p
_N = ctypes.c_int64


class _Lib:
    def __init__(self, lib: ctypes.CDLL):
        self.lookup_rows = lib.lookup_rows
        self.lookup_rows.argtypes = [_P, _N, _P, _N, _P, _N, _P, _P, _P, _P, _P, _P, _P]
        self.lookup_rows.restype = _N
        self.add_accesses = lib.add_accesses
        self.add_accesses.argtypes = [_P, _N, _P, _P, _N, _P, _P, ctypes.c_float,
                                      ctypes.c_int32, ctypes.c_int32, _P, _P, _P, _P]
        self.add_accesses.restype = _N
        self.lookup_add = lib.lookup_add
        self.lookup_add.argtypes = [_P, _N, _P, _N, _P, _N, _P, _P, _P, _P, _P, _P,
                                    ctypes.c_float, ctypes.c_int32, ctypes.c_int32, _P, _P, _P,
                                    _P, _P, _P, _P, _P]
        self.lookup_add.restype = _N
        self.prune = lib.prune
        self.prune.argtypes = [_P, _N, _P, _P, _N, ctypes.c_float, ctypes.c_float, _P]
        self.prune.restype = _N
        self.columns = lib.columns
        self.columns.argtypes = [_P, _N, _P, _P, _N, ctypes.c_float, _P, _P, _P, _P, _P, _P]
        self.columns.restype = None
        self.clear_rates = lib.clear_rates
        self.clear_rates.argtypes = [_P, _N, _P, _P, _N]
        self.clear_rates.restype = None
        self.count_rated = lib.count_rated
        self.count_rated.argtypes = [_P, _N, _P, _P, _N]
        self.count_rated.restype = _N
        self.has_flag = lib.has_flag
        self.has_flag.argtypes = [_P, _N, _P, _P, _N, ctypes.c_int32, _P]
        self.has_flag.restype = None


def load(path: Path = LIB_PATH) -> _Lib | None:
    """The library at ``path``, or None when it is not built (or, in a checkout, older than
    its source)."""
    try:
        if sorted_find.CHECKOUT and path.stat().st_mtime < SOURCE.stat().st_mtime:
            return None  # stale: scripts/setup.sh builds it again
        return _Lib(ctypes.CDLL(str(path)))
    except (OSError, AttributeError):
        return None


_LIB = None if os.environ.get("PAGETIER_NO_NATIVE") else load()
_OFFSETS: dict = {}  # dtype -> int64 offsets of FIELDS


def native() -> bool:
    """Whether the compiled row passes are in use."""
    return _LIB is not None


def _layout(a: np.ndarray):
    """(the offsets array, the row stride) for ``a`` when the library can work on it in
    place (C-contiguous rows holding FIELDS in their types), else None."""
    if _LIB is None or not a.flags.c_contiguous or a.dtype.names is None:
        return None
    off = _OFFSETS.get(a.dtype)
    if off is None:
        want = {"heat": np.float32, "rate": np.float32, "count": np.uint32,
                "last_access": np.int32, "npages": np.uint16, "node": np.int8,
                "flags": np.uint8, "last_move": np.int32, "addr": np.uint64,
                "target": np.uint16}
        f = a.dtype.fields
        if any(n not in f or f[n][0] != np.dtype(t) for n, t in want.items()):
            return None
        off = np.array([f[n][1] for n in FIELDS], np.int64)
        _OFFSETS[a.dtype] = off
    return off, a.dtype.itemsize


def _c(x: np.ndarray, dtype) -> np.ndarray | None:
    x = np.asarray(x)
    return np.ascontiguousarray(x) if x.dtype == dtype and x.ndim == 1 else None


def lookup_rows(keys: np.ndarray, x: np.ndarray, a: np.ndarray, node: np.ndarray,
                npages: np.ndarray, region: np.ndarray | None):
    """(positions as ``np.searchsorted(keys, x)``, found, changed: a found unit whose row in
    ``a`` has another node or npages than ``node``/``npages``, or, ``region`` given, another
    region flag) for ``keys`` (uint64, sorted unique: ``a``'s keys) and ``x`` (uint64); None
    when the library cannot do it (not built, other types, ``x`` not strictly increasing)."""
    lay = _layout(a)
    args = (_c(keys, np.uint64), _c(x, np.uint64), _c(node, np.int16), _c(npages, np.uint16))
    reg = None if region is None else _c(region, np.bool_)
    if lay is None or any(v is None for v in args) or (region is not None and reg is None):
        return None
    keys, x, node, npages = args
    if len(keys) != len(a) or len(node) != len(x) or len(npages) != len(x):
        return None
    m = len(x)
    pos = np.empty(m, np.int64)
    found = np.empty(m, bool)
    changed = np.empty(m, bool)
    k = _LIB.lookup_rows(keys.ctypes.data, len(keys), x.ctypes.data, m, a.ctypes.data, lay[1],
                         lay[0].ctypes.data, node.ctypes.data, npages.ctypes.data,
                         None if reg is None else reg.ctypes.data, pos.ctypes.data,
                         found.ctypes.data, changed.ctypes.data)
    if k < 0:
        return None
    return pos, found, changed


def lookup_add(keys: np.ndarray, x: np.ndarray, a: np.ndarray, node: np.ndarray,
               npages: np.ndarray, region: np.ndarray | None, count: np.ndarray,
               rate: np.ndarray, scale: np.float32, interval: int, cand: bool,
               rated: np.ndarray | None = None):
    """:func:`lookup_rows` and, in the same pass over the rows, :func:`add_accesses` of the
    found units that did not change (``count``, ``rate``: the read's, for each of ``x``):
    (pos, found, changed, then add_accesses' result for those units). The changed units'
    accesses are not added: the caller gives them their new node first, then adds them.
    ``rated`` as in :func:`add_accesses`. None when the library cannot do it."""
    lay = _layout(a)
    args = (_c(keys, np.uint64), _c(x, np.uint64), _c(node, np.int16), _c(npages, np.uint16),
            _c(count, np.uint32), _c(rate, np.float32))
    reg = None if region is None else _c(region, np.bool_)
    if lay is None or any(v is None for v in args) or (region is not None and reg is None):
        return None
    keys, x, node, npages, count, rate = args
    m = len(x)
    if (len(keys) != len(a) or len(node) != m or len(npages) != m or len(count) != m
            or len(rate) != m):
        return None
    pos = np.empty(m, np.int64)
    found = np.empty(m, bool)
    changed = np.empty(m, bool)
    acc = np.empty(m, np.int64)
    before = np.empty(m, np.float32)
    joined = np.empty(m, bool)
    nacc = np.zeros(1, np.int64)
    out = _rated_out(rated)
    k = _LIB.lookup_add(keys.ctypes.data, len(keys), x.ctypes.data, m, a.ctypes.data, lay[1],
                        lay[0].ctypes.data, node.ctypes.data, npages.ctypes.data,
                        None if reg is None else reg.ctypes.data, count.ctypes.data,
                        rate.ctypes.data, float(scale), int(interval), int(cand),
                        pos.ctypes.data, found.ctypes.data, changed.ctypes.data, acc.ctypes.data,
                        before.ctypes.data, joined.ctypes.data, nacc.ctypes.data,
                        out.ctypes.data)
    if k < 0:
        return None
    if rated is not None:
        rated += out
    n = int(nacc[0])
    return pos, found, changed, (acc[:n], before[:n], joined[:n] if cand else None)


def add_accesses(a: np.ndarray, idx: np.ndarray, count: np.ndarray, rate: np.ndarray,
                 scale: np.float32, interval: int, cand: bool,
                 rated: np.ndarray | None = None):
    """Rows ``idx`` (int64, sorted unique) of ``a`` with ``count[i] > 0`` or ``rate[i] > 0``
    take the accesses in place: count and rate added, heat plus rate / scale, last access
    ``interval``; with ``cand``, their candidate flag set. Returns (their indices, their
    stored heat before, whether each joined the candidates: None without ``cand``), or None
    when the library cannot do it. ``rated`` (int64, one element), when given, grows by how
    many more of the rows have a rate above 0 (the rows with a rate, counted as merged)."""
    lay = _layout(a)
    idx, count, rate = _c(idx, np.int64), _c(count, np.uint32), _c(rate, np.float32)
    if lay is None or idx is None or count is None or rate is None:
        return None
    m = len(idx)
    acc = np.empty(m, np.int64)
    before = np.empty(m, np.float32)
    joined = np.empty(m, bool)
    out = _rated_out(rated)
    k = _LIB.add_accesses(a.ctypes.data, lay[1], lay[0].ctypes.data, idx.ctypes.data, m,
                          count.ctypes.data, rate.ctypes.data, float(scale), int(interval),
                          int(cand), acc.ctypes.data, before.ctypes.data, joined.ctypes.data,
                          out.ctypes.data)
    if rated is not None:
        rated += out
    return acc[:k], before[:k], (joined[:k] if cand else None)


def _rated_out(rated: np.ndarray | None) -> np.ndarray:
    """The library's counter for ``rated``: a zeroed int64 of one element."""
    if rated is not None and (rated.dtype != np.int64 or rated.shape != (1,)):
        raise ValueError("rated: an int64 array of one element")
    return np.zeros(1, np.int64)


def prune(a: np.ndarray, cand: np.ndarray, scale: np.float32, floor: np.float32):
    """(the candidates ``cand`` (int64) whose heat, stored heat times ``scale`` as float32, is
    at least ``floor``; the stored heats of the others, in order), the others' candidate flags
    cleared in ``a``; None when the library cannot do it."""
    lay = _layout(a)
    c = _c(cand, np.int64)
    if lay is None or c is None:
        return None
    c = c.copy()
    dropped = np.empty(len(c), np.float32)
    k = _LIB.prune(a.ctypes.data, lay[1], lay[0].ctypes.data, c.ctypes.data, len(c),
                   float(scale), float(floor), dropped.ctypes.data)
    return c[:k], dropped[:len(c) - k]


def columns(a: np.ndarray, idx: np.ndarray, scale: np.float32, keys: bool = False):
    """(heat, rate, node, npages, last_move) of rows ``idx`` of ``a``: heat as
    ``(a["heat"][idx] * scale).astype(np.float64)`` (float32 product), rate as float64, node as
    in ``a``, npages and last_move as int64; with ``keys``, the units' keys after them
    (``(target << 48) | (addr >> 12)``, uint64). None when the library cannot do it (or an
    index is out of ``range(len(a))``)."""
    lay = _layout(a)
    if lay is None or a.ndim != 1:
        return None
    idx = _c(idx, np.int64)
    if idx is None or (len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= len(a))):
        return None
    m = len(idx)
    heat, rate = np.empty(m, np.float64), np.empty(m, np.float64)
    node = np.empty(m, np.int8)
    npages, last_move = np.empty(m, np.int64), np.empty(m, np.int64)
    k = np.empty(m, np.uint64) if keys else None
    _LIB.columns(a.ctypes.data, lay[1], lay[0].ctypes.data, idx.ctypes.data, m, float(scale),
                 heat.ctypes.data, rate.ctypes.data, node.ctypes.data, npages.ctypes.data,
                 last_move.ctypes.data, None if k is None else k.ctypes.data)
    return (heat, rate, node, npages, last_move) + ((k,) if keys else ())


def clear_rates(a: np.ndarray, idx: np.ndarray) -> bool:
    """Set ``rate`` and ``count`` of rows ``idx`` (int64, within bounds: not checked, the
    state's touched units) of ``a`` to 0; False when the library cannot do it."""
    lay = _layout(a)
    idx = _c(idx, np.int64)
    if lay is None or idx is None:
        return False
    _LIB.clear_rates(a.ctypes.data, lay[1], lay[0].ctypes.data, idx.ctypes.data, len(idx))
    return True


def count_rated(a: np.ndarray, idx: np.ndarray) -> int | None:
    """``np.count_nonzero(a["rate"][idx] > 0)`` for int64 ``idx`` within bounds (not checked:
    the state's touched units); None when the library cannot do it."""
    lay = _layout(a)
    idx = _c(idx, np.int64)
    if lay is None or idx is None:
        return None
    return int(_LIB.count_rated(a.ctypes.data, lay[1], lay[0].ctypes.data, idx.ctypes.data,
                                len(idx)))


def has_flag(a: np.ndarray, idx: np.ndarray, flag: int) -> np.ndarray | None:
    """``(a["flags"][idx] & flag) != 0`` for int64 ``idx``; None when the library cannot do
    it (or an index is out of ``range(len(a))``: numpy's way then wraps or raises)."""
    lay = _layout(a)
    idx = _c(idx, np.int64)
    if lay is None or idx is None or (len(idx) and (int(idx.min()) < 0
                                                    or int(idx.max()) >= len(a))):
        return None
    out = np.empty(len(idx), bool)
    _LIB.has_flag(a.ctypes.data, lay[1], lay[0].ctypes.data, idx.ctypes.data, len(idx),
                  int(flag), out.ctypes.data)
    return out
