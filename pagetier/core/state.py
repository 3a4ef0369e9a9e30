"""Per-page state the daemon keeps, as numpy arrays (36 bytes per tracked unit, plus 8 for a
sorted key index).

A unit is a 4 KiB page, a 2 MiB huge mapping (npages 512), or a region: 2 MiB of separately
mapped 4 KiB pages (npages 512, flag F_REGION; its rate is summed over its pages, and it is
moved page by page). Units are kept sorted by
``key = (target << 48) | (addr >> 12)`` so that merging an interval's sample is a
searchsorted, not a Python loop.

The access signal is a rate, not a count: each sample gives every unit an estimated number of
accesses per second (``Sample.rates``: the profiler's frequency estimate where it has one, else
the interval's count over its length, which is about one per scan and so close to yes/no).

- ``rate``: this interval's rate (accesses/s), 0 for a unit not accessed in it;
- ``heat``: the decayed sum of the rates, ``heat = decay * heat + rate`` once per interval, so
  a unit accessed at a steady rate r has heat r / (1 - decay) (2r with the default 0.5). Heat
  is what every policy ranks by: with a real frequency signal a hot unit (hundreds to
  thousands of accesses/s) and a unit touched now and then (a few/s) differ by orders of
  magnitude in heat, where one count per interval made them tie. With one read per interval of
  1 s and no frequency estimate, heat is what it was before rates: the decayed sum of counts.
- ``count``: the raw accesses counted in the interval (summed over the interval's reads).

A read that covers only part of an interval (the sentinel policy reads at layer boundaries)
adds its rate weighted by the part of the interval it covers, so that several reads in one
interval add up to the interval's rate.

Cost per interval: what the interval's samples hold, not what is tracked.

- Decay is lazy. The ``heat`` column stores heat divided by a global scale ``G`` (``decay``
  to the power of the intervals since the last renormalisation): one interval's decay is
  ``G *= decay``, adding a rate r adds ``r / G``, and :attr:`heat` reads ``stored * G``.
  Units keep their order under decay, so ranking stored values ranks heat. When G falls
  below 2**-64 the column is multiplied by G once and G is 1 again (every 64 intervals with
  decay 0.5). With decay 0 a unit's heat is its rate: the units touched in the last interval
  are zeroed, as their rate and count are.
- ``rate`` and ``count`` are cleared for the units the last interval touched only (their
  indices are kept; the rest are already 0).
- A sample is merged by looking up its keys in the sorted key index (``searchsorted``: the
  accessed units of an accessed-only read, O(accessed log tracked)). New units are inserted
  in place (one copy of the arrays when a sample brings new units). A *complete* sample (every
  unit the profiler tracks) also forgets the target's units it lacks (unmapped): that costs
  the target's units, and a reader takes complete samples only now and then (daemon/loop.py).
  When the compiled helpers are built (pagetier/core/row_merge.py), an accessed-only read's
  lookup, node check and accesses are one pass over its keys and the state's rows (the units
  whose node or size changed take their accesses after their new node), and the candidates'
  pruning one more; numpy does the same otherwise.
  A complete sample of a span of addresses (``Sample.span``: one part of the address space)
  forgets the target's units in that span only; :meth:`PageState.sync` takes one for the units
  it lists (which exist, their nodes and sizes) without their counts, so a reader can take one
  part each interval and spread the cost of finding unmapped units.
- Pages per node (and the unmovable ones) are counted as units are added, moved, re-noded
  and forgotten: :meth:`pages_on` is O(1).
- :meth:`hotter_than` gives the candidates a policy ranks (heat at least x) from a kept set,
  pruned as heat decays, with the heat of the rest as one sum; :meth:`coldest` the coldest
  units of a node per page (heat over pages: a 2 MiB unit takes 512 pages of a budget), the
  victims of an exchange.

Assigning ``state.a`` (tests, the simulator) drops all of that and it is rebuilt on demand;
columns written in place through ``state.a[...]`` must keep ``heat`` in stored units (equal to
heat while G is 1, as in a new state).
"""
from __future__ import annotations

import numpy as np

from pagetier.core import row_merge, sorted_find
from pagetier.core.arrays import unique
from pagetier.core.sample import Sample

NEVER = np.iinfo(np.int32).min

# flags
F_STUCK = 2  # its last move failed for good (e.g. -EACCES: a page shared with another process)
F_UNMOVABLE = 4  # a move failed for good and none has succeeded since: outside the fast budget
F_CAND = 8  # in the candidate set (see hotter_than); meaningless while there is none
F_REGION = 16  # a region: 2 MiB of separately mapped 4 KiB pages, moved page by page

DTYPE = np.dtype(
    [
        ("addr", np.uint64),  # start address of the unit
        ("heat", np.float32),  # decayed sum of rates, divided by the global scale (see above)
        ("rate", np.float32),  # accesses/s in the current interval
        ("count", np.uint32),  # accesses in the last interval
        ("last_access", np.int32),  # interval of the last access, NEVER if none
        ("last_move", np.int32),  # interval of the last migration, NEVER if none
        ("target", np.uint16),  # index of the target process (see PageState.pids)
        ("npages", np.uint16),  # 4 KiB pages in the unit
        ("moves", np.uint16),  # migrations of this unit
        ("node", np.int8),  # NUMA node, -1 unknown
        ("flags", np.uint8),
    ]
)
assert DTYPE.itemsize == 36

# a lookup that finds more than this share of its keys outside the last interval's units
# searches every unit's key directly for the next LOOKUP_DIRECT lookups (see _lookup)
LOOKUP_MISS = 0.25
LOOKUP_DIRECT = 8
POOL_MIN = 65536  # units a pool of a node's coldest units keeps at least (see coldest)
MIN_SCALE = 2.0 ** -64  # renormalise heat when the global scale falls below this
_NODES = 129  # node -1 (unknown) .. 127, counted at node + 1
_TOP = 1 << 64  # a span's end that means "to the end of the address space"


def unit_keys(target: int | np.ndarray, addr: np.ndarray) -> np.ndarray:
    """A unit's identity across intervals: ``(target << 48) | (addr >> 12)``."""
    return (np.asarray(target, np.uint64) << np.uint64(48)) | (addr >> np.uint64(12))


def _find(sorted_arr: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(``np.searchsorted(sorted_arr, x)``, whether each of ``x`` is in ``sorted_arr``): a
    merge-join when the compiled lookups are built (pagetier/core/sorted_find.py)."""
    return sorted_find.find(sorted_arr, x)


def union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sorted unique union of two sorted unique index arrays: ``b``'s elements missing from
    ``a`` inserted in place (O(len(a) + len(b) log len(a)), no sort, no hash)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    if not len(b):
        return a
    if not len(a):
        return b
    if len(b) * 16 < len(a):  # a few to add: search them, insert
        p, found = _find(a, b)
        miss = ~found
        if not miss.any():
            return a
        return np.insert(a, p[miss], b[miss])
    merged = sorted_find.union(a, b)  # one merge in compiled code, when built
    if merged is not None:
        return merged
    # many: merge the two sorted runs (a stable sort finds them; no binary search), drop the
    # duplicates
    c = np.concatenate([a, b])
    c.sort(kind="stable")
    keep = np.empty(len(c), bool)
    keep[0] = True
    np.not_equal(c[1:], c[:-1], out=keep[1:])
    return c[keep]


def union_remap(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`union` of sorted unique ``a`` and ``b``, with where ``a``'s elements are in it and
    where the added ones (``b``'s missing from ``a``) are: (union, a's places, added places),
    without searching the union for ``a``."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    if not len(a):
        return b, np.zeros(0, np.int64), np.arange(len(b))
    p, found = _find(a, b)
    miss = ~found
    at = p[miss]
    if not len(at):
        return a, np.arange(len(a)), np.zeros(0, np.int64)
    added = at + np.arange(len(at))
    # a[i] moves right by the number of elements inserted before it (at <= i)
    remap = sorted_find.insert_shift(at, len(a))
    if remap is None:
        remap = np.arange(len(a)) + np.cumsum(np.bincount(at, minlength=len(a) + 1)[:len(a)])
    merged = sorted_find.spread(a, b[miss], added)
    return merged if merged is not None else np.insert(a, at, b[miss]), remap, added


def _kept(mask: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``arrays`` each masked by ``mask``; the arrays themselves when it keeps all (the usual
    case: every key of an accessed-only read found, every unit accessed), not copies of them
    (a copy of 36-byte rows costs as much as their gather)."""
    if mask.all():
        return arrays
    return tuple(x[mask] for x in arrays)


def _in_index_order(a: tuple, b: tuple) -> tuple:
    """Two results of row_merge.add_accesses (acc, before, joined) on disjoint units, as one:
    in the order of their units, as one call over both would give them."""
    acc = np.concatenate([a[0], b[0]])
    order = np.argsort(acc, kind="stable")
    joined = None if a[2] is None else np.concatenate([a[2], b[2]])[order]
    return acc[order], np.concatenate([a[1], b[1]])[order], joined


def _rate_count(a: np.ndarray) -> np.ndarray | None:
    """The ``rate`` and ``count`` fields of each row (adjacent, 8 bytes) as one uint64 column
    of ``a`` (a view: zeroing it zeroes both), or None when ``a`` is not laid out so."""
    off = DTYPE.fields["rate"][1]
    if (a.dtype != DTYPE or not a.flags.c_contiguous or DTYPE.fields["count"][1] != off + 4
            or not len(a)):
        return None
    return np.ndarray((len(a),), np.uint64, buffer=a, offset=off, strides=(DTYPE.itemsize,))


def kth_smallest(h: np.ndarray, k: int):
    """``np.partition(h, k)[k]`` for a 1-d ``h``. numpy's selection slows down on many equal
    values: the coldness of a large node's units is mostly 0.0 (188,000 of 210,000 at 1 TiB
    in region units: 35 ms for the selection, 2 for a sort). Without negative values the
    zeros are counted and the selection runs on the others."""
    zeros = h == 0
    nz = int(np.count_nonzero(zeros))
    if not nz or bool((h < 0).any()):
        return np.partition(h, k)[k]
    if nz > k:
        return h[np.argmax(zeros)]  # a zero of h's own (0.0 or -0.0)
    rest = sorted_find.masked(h, ~zeros)
    return np.partition(rest, k - nz)[k - nz]


def _prefix(order: np.ndarray, n: int, whole: bool) -> tuple[np.ndarray, bool]:
    """The first ``max(n, 1)`` of ``order`` (a pool kept larger than asked: handing all of it
    out would make the caller gather it every interval), or all of it; whether that is all of
    the node's units."""
    k = max(int(n), 1)
    if len(order) > k:
        return order[:k], False
    return order, whole


def _member(sorted_arr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Boolean: which of ``x`` are in ``sorted_arr`` (sorted)."""
    return _find(sorted_arr, x)[1]


def _remap_insert(idx: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Indices ``idx`` after inserting rows before old positions ``pos`` (sorted)."""
    return idx + np.searchsorted(pos, idx, side="right")


def _remap_delete(idx: np.ndarray, gone: np.ndarray) -> np.ndarray:
    """Indices ``idx`` after deleting rows ``gone`` (sorted unique); deleted ones dropped."""
    if not len(gone) or not len(idx):
        return idx
    p = np.searchsorted(gone, idx)
    hit = (p < len(gone)) & (gone[np.minimum(p, len(gone) - 1)] == idx)
    return (idx - p)[~hit]


class PageState:
    """Sorted structured array of units; columns are exposed as attributes (views; ``heat`` is
    computed: see the module's docstring)."""

    def __init__(self, decay: float = 0.5):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.pids: list[int] = []  # target index -> pid (-1: a free slot, reused)
        self.interval = 0
        self.scale = 1.0  # heat = stored heat * scale
        self.a = np.zeros(0, DTYPE)

    # ------------------------------------------------------------------ storage
    @property
    def a(self) -> np.ndarray:
        return self._a

    @a.setter
    def a(self, value: np.ndarray) -> None:
        """A new array (tests, the simulator): the derived structures are rebuilt on demand."""
        self._a = value
        self._k = None  # sorted keys, or None
        self._touched = None  # sorted indices merged in this interval; None: unknown
        # how many units have a rate in this interval, counted as they are merged (rated);
        # None: unknown (counted from the rows when asked)
        self._rated = None
        self._recent = None  # the last interval's touched units: where to look up first
        self._direct = 0  # lookups left that search every unit's key directly (see _lookup)
        self._node_pages = None  # pages per target and node + 1, and the unmovable ones
        self._unmov_pages = None
        self._cand = None  # sorted indices: every other unit's heat is below _cand_floor
        self._cand_floor = 0.0
        self._out = 0.0  # the stored heat of the units outside _cand
        # node -> [sorted indices, T heat, T index]: every other unit on the node has
        # (stored heat, index) >= (T heat, T index) (heat only grows between decays)
        self._pools: dict[int, list] = {}
        self._became: list[np.ndarray] = []  # keys of units that became regions (see update)

    def __len__(self) -> int:
        return len(self._a)

    def __getattr__(self, col):
        # columns as views: state.node, state.rate, ...; heat is computed
        if col == "heat":
            return self.heat_at(None)
        if col in DTYPE.names:
            return self.__dict__["_a"][col]
        raise AttributeError(col)

    @property
    def nbytes(self) -> int:
        return self._a.nbytes + (self._k.nbytes if self._k is not None else 0)

    def heat_at(self, idx: np.ndarray | None) -> np.ndarray:
        """Heat (float32) of units ``idx`` (all when None)."""
        h = self._a["heat"] if idx is None else self._a["heat"][idx]
        return self._true_heat(h.copy() if idx is None else h)

    def _true_heat(self, stored: np.ndarray) -> np.ndarray:
        """Stored heat times the global scale, as float32 (``stored`` itself when the scale is
        1: pass a copy)."""
        if self.scale == 1.0:
            return stored
        return (stored * np.float32(self.scale)).astype(np.float32, copy=False)

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """A copy of units ``idx``'s rows, their ``heat`` the true heat (see :meth:`heat_at`):
        one gather of whole rows, cheaper than one per column."""
        r = np.take(self._a, idx)
        r["heat"] = self._true_heat(r["heat"])
        return r

    def columns(self, idx: np.ndarray, keys: bool = False) -> tuple:
        """(heat, rate, node, npages, last_move) of units ``idx``, as a decision reads them
        (pagetier/policies/rules/view.py): heat (the true heat) and rate as float64, npages and
        last_move as int64; with ``keys``, their :meth:`keys` after them. One compiled pass over
        the rows when built."""
        got = row_merge.columns(self._a, idx, np.float32(self.scale), keys)
        if got is not None:
            return got
        r = self.rows(idx)
        cols = (r["heat"].astype(np.float64), r["rate"].astype(np.float64), r["node"],
                r["npages"].astype(np.int64), r["last_move"].astype(np.int64))
        return cols + ((self.keys(idx),) if keys else ())

    def keys(self, idx: np.ndarray | None = None) -> np.ndarray:
        """The sorted key of each unit (of ``idx``): ``(target << 48) | (addr >> 12)``."""
        if self._k is None or len(self._k) != len(self._a):
            self._k = unit_keys(self._a["target"], self._a["addr"])
        return self._k if idx is None else self._k[idx]

    def target_index(self, pid: int) -> int:
        if pid not in self.pids:
            if -1 in self.pids:  # the slot of a forgotten target: indices stay below 2**16
                self.pids[self.pids.index(-1)] = pid
            else:
                self.pids.append(pid)
        return self.pids.index(pid)

    # ------------------------------------------------------------------ counters
    def _counts(self):
        """Per target index and node (+1, so that -1, unknown, is column 0): the 4 KiB pages
        tracked and the unmovable ones among them, two (targets, _NODES) arrays kept up to date
        by :meth:`_account` once built."""
        if self._node_pages is None:
            a = self._a
            t = a["target"].astype(np.int64)
            rows = max(len(self.pids), int(t.max()) + 1 if len(t) else 0, 1)
            cell = t * _NODES + a["node"].astype(np.int64) + 1
            w = a["npages"].astype(np.int64)
            um = (a["flags"] & F_UNMOVABLE) != 0
            n = rows * _NODES
            self._node_pages, self._unmov_pages = (
                np.bincount(c, weights=x, minlength=n).astype(np.int64).reshape(rows, _NODES)
                for c, x in ((cell, w), (cell[um], w[um])))
        return self._node_pages, self._unmov_pages

    def _account(self, idx: np.ndarray, sign: int) -> None:
        """Add (sign 1) or take off (-1) units ``idx`` in the per-target, per-node counters."""
        if self._node_pages is None or not len(idx):
            return
        a = self._a
        t = a["target"][idx].astype(np.int64)
        rows = int(t.max()) + 1
        if rows > len(self._node_pages):  # a new target's first units
            grow = np.zeros((rows - len(self._node_pages), _NODES), np.int64)
            self._node_pages = np.vstack([self._node_pages, grow])
            self._unmov_pages = np.vstack([self._unmov_pages, grow])
        cell = t * _NODES + a["node"][idx].astype(np.int64) + 1
        w = a["npages"][idx].astype(np.int64) * sign
        np.add.at(self._node_pages.reshape(-1), cell, w)
        um = (a["flags"][idx] & F_UNMOVABLE) != 0
        if um.any():
            np.add.at(self._unmov_pages.reshape(-1), cell[um], w[um])

    def pages_on(self, node: int) -> int:
        """4 KiB pages tracked on ``node``."""
        if not -1 <= node < _NODES - 1:
            return 0
        return int(self._counts()[0][:, node + 1].sum())

    def unmovable_on(self, node: int) -> int:
        """4 KiB pages on ``node`` the kernel refused to move (shared with other processes:
        library text, memory of a forked parent) and has not moved since."""
        if not -1 <= node < _NODES - 1:
            return 0
        return int(self._counts()[1][:, node + 1].sum())

    def target_pages(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        """Per target index (as :attr:`pids`), the 4 KiB pages tracked on ``node`` and the
        unmovable ones among them: the status document's per-target and per-cgroup bytes,
        without a pass over the units."""
        k = len(self.pids)
        if not -1 <= node < _NODES - 1:
            return np.zeros(k, np.int64), np.zeros(k, np.int64)
        pages, unmov = self._counts()
        out = []
        for c in (pages, unmov):
            col = c[:k, node + 1]
            out.append(np.concatenate([col, np.zeros(k - len(col), np.int64)]) if len(col) < k
                       else col.copy())
        return out[0], out[1]

    def movable_on(self, node: int) -> int:
        """4 KiB pages on ``node`` that count against a budget: all but :meth:`unmovable_on`."""
        return self.pages_on(node) - self.unmovable_on(node)

    def resident(self) -> dict[int, int]:
        """4 KiB pages per node (-1: unknown), the nodes holding any."""
        np_ = self._counts()[0].sum(axis=0)
        return {int(i) - 1: int(np_[i]) for i in np.flatnonzero(np_)}

    def set_nodes(self, idx: np.ndarray, node: np.ndarray | int) -> None:
        """Record that units ``idx`` are on ``node`` (e.g. looked up with move_pages)."""
        idx = np.asarray(idx, np.int64)
        self._account(idx, -1)
        self._a["node"][idx] = node
        self._account(idx, 1)
        self._pool_join(unique(idx))

    # ------------------------------------------------------------------ candidates
    def touched(self) -> np.ndarray:
        """Units merged with an access in this interval (sorted indices)."""
        if self._touched is None:
            a = self._a
            self._touched = np.flatnonzero((a["count"] > 0) | (a["rate"] > 0))
        return self._touched

    def rated(self, idx: np.ndarray | None = None) -> int:
        """How many of units ``idx`` (default: :meth:`touched`) have a rate in this interval.
        By default the count the merges kept since :meth:`begin_interval`, when they kept one
        (no pass over the touched rows)."""
        if idx is None:
            if self._rated is not None:
                return self._rated
            idx = self.touched()
        n = row_merge.count_rated(self._a, idx)
        if n is None:
            n = int(np.count_nonzero(self._a["rate"][idx] > 0)) if len(idx) else 0
        return n

    def hotter_than(self, x: float) -> tuple[np.ndarray, float]:
        """(sorted indices of the units with heat >= ``x``, the heat of all the others summed).

        Kept between calls: units touched since are added, units decayed below ``x`` pruned
        (their heat joins the sum). A unit outside the set only cools, so the set stays
        complete; a lower ``x`` than the last one asked rebuilds it from every unit."""
        x = float(x)
        s = np.float32(self.scale)
        a = self._a
        if self._cand is None or x < self._cand_floor:
            st = a["heat"]
            keep = st * s >= x
            self._cand = np.flatnonzero(keep)
            self._out = float(st[~keep].sum(dtype=np.float64))
            a["flags"] &= np.uint8(~F_CAND & 0xFF)
            a["flags"][self._cand] |= np.uint8(F_CAND)
            self._cand_floor = x
        else:
            self._prune(s, x)
            self._cand_floor = x
        return self._cand, max(0.0, self._out) * self.scale

    def _prune(self, s: np.float32, x: float) -> None:
        """The candidates whose heat (stored times ``s``) fell below ``x`` leave the set, their
        stored heat joins the sum of the rest: one compiled pass over their rows when built."""
        a = self._a
        got = row_merge.prune(a, self._cand, s, np.float32(x))
        if got is not None:
            kept, dropped = got
            if len(dropped):
                self._out += float(dropped.sum(dtype=np.float64))
                self._cand = kept
            return
        h = a["heat"][self._cand]
        keep = h * s >= x
        if not keep.all():
            self._out += float(h[~keep].sum(dtype=np.float64))
            a["flags"][self._cand[~keep]] &= np.uint8(~F_CAND & 0xFF)
            self._cand = self._cand[keep]

    def in_candidates(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of units ``idx`` are in the set :meth:`hotter_than` last returned
        (a flag on each unit: no search of the set)."""
        if self._cand is None:
            return np.zeros(len(idx), bool)
        got = row_merge.has_flag(self._a, idx, F_CAND)
        return (self._a["flags"][idx] & F_CAND) != 0 if got is None else got

    def _join_candidates(self, idx: np.ndarray, stored_before: np.ndarray,
                         flags: np.ndarray) -> None:
        """Units ``idx`` (sorted unique) got heat: into the candidate set, their stored heat
        before (``stored_before``) off the sum of the rest. ``flags``: a copy of their flags,
        which the caller writes back (the candidate flag is set in it)."""
        if self._cand is None or not len(idx):
            return
        new = (flags & F_CAND) == 0
        out = idx[new]
        if len(out):
            self._out -= float(stored_before[new].sum(dtype=np.float64))
            self._cand = union(self._cand, out)
            flags[new] |= np.uint8(F_CAND)

    def _coldness(self, idx: np.ndarray) -> np.ndarray:
        """The pools' order key of units ``idx``: heat per page (stored scale)."""
        a = self._a
        return a["heat"][idx].astype(np.float64) / a["npages"][idx]

    def coldest(self, node: int, n: int) -> tuple[np.ndarray, bool]:
        """(units on ``node``, coldest first (heat per page, then index), at least ``n`` of them
        or all; whether that is all of them). A true prefix of the node's units in that order.

        Kept between calls: a pool of the node's coldest units and the key (heat per page,
        index) of the first unit outside it. Units outside only get hotter (a touched unit's heat
        grows), units that join the node colder than that key join the pool, so the pool's
        members below the key stay the node's coldest; it is rebuilt (one pass over the
        units) when fewer than ``n`` are left."""
        n = max(0, int(n))
        a = self._a
        pool = self._pools.get(node)
        if pool is not None and pool[3] is not None and pool[4] is not None:
            self._pool_settle(pool, node)
        if (pool is not None and pool[3] is not None and pool[4] is not None
                and (pool[1] == np.inf or len(pool[0]) >= n)):
            # no member changed, or those that changed left: the order stands
            order = pool[3]
            pool[4] = []
            return _prefix(self._trim(pool, order, n), n, pool[1] == np.inf)
        if pool is not None:
            pool[4] = []  # checked in full below
            idx, th, ti = pool[:3]
            idx = idx[a["node"][idx] == node]
            h = self._coldness(idx)
            below = (h < th) | ((h == th) & (idx < ti))
            idx, h = idx[below], h[below]
            pool[0] = idx
            if th == np.inf or len(idx) >= n:
                order = pool[3]
                if order is not None:  # still in order (members rarely warm up): no sort
                    # members that left dropped (members only join with the order reset,
                    # so the members are idx exactly when the lengths are equal)
                    if len(order) != len(idx):
                        order = order[np.isin(order, idx, assume_unique=True)]
                    ho = self._coldness(order)
                    if len(order) == len(idx) and (len(order) < 2 or bool(np.all(
                            (ho[1:] > ho[:-1]) | ((ho[1:] == ho[:-1]) & (order[1:] > order[:-1]))))):
                        pool[3] = order
                        return _prefix(self._trim(pool, order, n), n, pool[1] == np.inf)
                order = self._by_coldness(idx, h)
                pool[3] = order
                return _prefix(self._trim(pool, order, n), n, pool[1] == np.inf)
        on = np.flatnonzero(a["node"] == node)
        h = self._coldness(on)
        k = max(4 * n, POOL_MIN)
        if k >= len(on):
            sel, th, ti = on, np.inf, 0
        else:
            v = kth_smallest(h, k)
            below = on[h < v]
            eq = on[h == v]
            take = k - len(below)
            sel = np.concatenate([below, eq[:take]])
            sel.sort()
            th, ti = float(v), int(eq[take]) if take < len(eq) else 1 << 62
        order = self._by_coldness(sel, self._coldness(sel))
        self._pools[node] = [sel, th, ti, order, []]
        return _prefix(order, n, th == np.inf)

    def _pool_settle(self, pool: list, node: int) -> None:
        """Bring an ordered pool up to date from the units that changed since it was last
        checked (``pool[4]``: index arrays of units that got heat or a new node or size): a
        changed member that is still on ``node`` and colder than the key may have moved in the
        order, so the pool is left for the full check (``pool[4]`` None); the others left the
        pool and are dropped from it and its order. Costs the changed units, not the pool."""
        changed = pool[4]
        if not changed:
            return
        idx, th, ti, order = pool[:4]
        mark = np.zeros(len(self._a), bool)
        for c in changed:
            mark[c] = True
        hit = mark[idx]
        if not hit.any():
            return
        ch = idx[hit]
        h = self._coldness(ch)
        stay = (self._a["node"][ch] == node) & ((h < th) | ((h == th) & (ch < ti)))
        if stay.any():
            pool[4] = None
            return
        pool[0] = idx[~hit]
        pool[3] = order[~mark[order]]

    def _by_coldness(self, idx: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Units ``idx`` (sorted) in the pools' order: heat per page, then index. Units of no
        heat come first as they are (most of a large node's units: those untouched for about
        150 intervals), the others are sorted on their values' bits (non-negative float64
        values order as their bit patterns, and numpy sorts 64-bit integers faster). ``h``:
        their :meth:`_coldness`."""
        h = np.ascontiguousarray(h, np.float64)
        zero = h == 0
        if not zero.any():
            return idx[np.argsort(h.view(np.int64), kind="stable")]
        warm = ~zero
        rest, hr = idx[warm], h[warm]
        return np.concatenate([idx[zero], rest[np.argsort(hr.view(np.int64), kind="stable")]])

    def _trim(self, pool: list, order: np.ndarray, n: int) -> np.ndarray:
        """Shrink a pool far larger than asked for (built for a large first demand) to its
        coldest ``POOL_MIN``-or-4n units, so that keeping it costs little each interval; the
        first unit left out becomes the key."""
        keep = max(4 * n, POOL_MIN)
        if len(order) <= 2 * keep:
            return order
        first_out = int(order[keep])
        order = order[:keep]
        pool[:] = [np.sort(order), float(self._coldness(np.array([first_out]))[0]), first_out,
                   order, pool[4]]
        return order

    def _pool_join(self, idx: np.ndarray) -> None:
        """Units ``idx`` (sorted unique) have a new node or are new: into that node's pool when
        colder than its key."""
        if not self._pools or not len(idx):
            return
        self._pool_changed(idx)
        a = self._a
        nd = a["node"][idx]
        for node, pool in self._pools.items():
            j = idx[nd == node]
            if not len(j):
                continue
            h = self._coldness(j)
            th, ti = pool[1], pool[2]
            j = j[(h < th) | ((h == th) & (j < ti))]
            if len(j):
                pool[0] = union(pool[0], j)
                pool[3] = None

    def _pool_changed(self, idx: np.ndarray) -> None:
        """Units ``idx`` got heat, or a new node or size: noted for each pool's next
        :meth:`_pool_settle` (past a state's worth of notes, the pool is checked in full)."""
        for pool in self._pools.values():
            notes = pool[4]
            if notes is None:
                continue
            notes.append(idx)
            if sum(len(x) for x in notes) > len(self._a):
                pool[4] = None

    def _pool_remap(self, fn, key_fn=None) -> None:
        """Pools' members through ``fn``, their keys' indices through ``key_fn`` (default
        ``fn``, for a remap that drops nothing; after deletions a key unit that was deleted
        must become the index of the unit after it: the same place in the (heat, index)
        order)."""
        key_fn = key_fn or (lambda ti: fn(np.array([ti], np.int64))[0])
        for pool in self._pools.values():
            pool[0] = fn(pool[0])
            pool[3] = None
            pool[4] = None
            if pool[2] < 1 << 62:
                pool[2] = int(key_fn(pool[2]))

    # ------------------------------------------------------------------ intervals
    def begin_interval(self) -> None:
        """Decay heat and clear last-interval counts once per interval, before updates."""
        self.interval += 1
        a = self._a
        t = self._touched
        if self.decay == 0.0:  # heat is this interval's rate: clear the last one's
            self._pools = {}
            if t is None:
                a["heat"] = 0
            else:
                if self._cand is not None:
                    self._out = 0.0
                a["heat"][t] = 0
        else:
            self.scale *= self.decay
            if self.scale < MIN_SCALE:
                self._pools = {}
                a["heat"] *= np.float32(self.scale)
                self._out *= self.scale
                self.scale = 1.0
        if t is None:
            a["count"] = 0
            a["rate"] = 0
        elif row_merge.clear_rates(a, t):  # one compiled pass over the rows
            pass
        else:
            both = _rate_count(a)
            if both is not None:  # one scatter for the two fields, which share 8 bytes
                both[t] = 0
            else:
                a["count"][t] = 0
                a["rate"][t] = 0
        self._recent = t
        self._touched = np.zeros(0, np.int64)
        self._rated = 0  # every rate was cleared

    def update(self, sample: Sample, trust_moves: int = 0, interval_s: float = 1.0,
               elapsed_s: float | None = None, max_count: int | None = None) -> None:
        """Merge one target's sample for the current interval.

        ``interval_s``: the daemon's interval; ``elapsed_s``: the time the sample covers (since
        the target's previous read; default ``interval_s``). Its rates
        (``sample.rates(elapsed_s)``) are added to ``rate`` and ``heat`` weighted by
        ``min(1, elapsed_s / interval_s)``. ``max_count``: for a sample without a frequency
        estimate, the most counts a unit can show in the time (the scans it covers): a count of
        one per scan says accessed or not, and a unit that shows two because a second scan
        passed it before the read is no hotter than one that shows one.

        A profiler observes nodes when it scans, which may be before the daemon's last move:
        for units moved within the last ``trust_moves`` intervals the node the daemon recorded
        is kept over the sample's.

        A complete sample (``sample.complete``) lists every unit of the target: the target's
        units it lacks are unmapped, and forgotten. A unit that becomes a region takes the place
        of the target's units inside its 2 MiB: they are forgotten.
        """
        t = self.target_index(sample.pid)
        addr = sample.addr.astype(np.uint64, copy=False)
        if len(addr) > 1 and not (addr[1:] > addr[:-1]).all():
            order = np.argsort(addr, kind="stable")
        else:
            order = None
        pick = (lambda x: x) if order is None else (lambda x: x[order])  # noqa: E731
        addr = pick(addr)
        count = pick(sample.count)
        elapsed = float(interval_s if elapsed_s is None else elapsed_s)
        weight = np.float32(min(1.0, max(elapsed, 1e-6) / max(float(interval_s), 1e-6)))
        has_freq = len(sample.freq) == len(sample.addr)
        freq = pick(sample.freq) if has_freq else None

        def rates(sel=slice(None)):
            """The rates of units ``sel`` (all by default), as float32."""
            if not has_freq and max_count is not None:
                clipped = np.minimum(count[sel], np.uint32(max(1, int(max_count))))
                return (clipped / max(elapsed, 1e-6)).astype(np.float32) * weight
            r = freq[sel].astype(np.float32, copy=False) if has_freq else (
                count[sel].astype(np.float64) / max(elapsed, 1e-6)).astype(np.float32)
            return r * weight if weight != 1 else r

        node = pick(sample.node)
        npages = pick(sample.npages)
        region = pick(sample.region) if len(sample.region) == len(sample.addr) else None
        if self._touched is None:
            self.touched()

        same = self._forget_absent(t, addr, sample.span) if sample.complete else None
        if same is not None:  # the target's units, exactly (the usual complete read)
            # mostly cold units: rates of the accessed ones only
            acc = np.flatnonzero((count > 0) | (freq > 0)) if has_freq else np.flatnonzero(count)
            self._merge_rows(same, acc, count[acc], rates(acc), node, npages, region, trust_moves)
            self._forget_covered()
            return
        rate = rates()
        keys = unit_keys(t, addr)
        pos, found = self._merge_found(keys, count, rate, node, npages, region, trust_moves)
        # new units
        new = ~found
        if new.any():
            self._add_units(t, pos[new], keys[new], addr[new], count[new], rate[new], node[new],
                            npages[new], None if region is None else region[new])
        self._forget_covered()

    def _merge_found(self, keys: np.ndarray, count: np.ndarray, rate: np.ndarray,
                     node: np.ndarray, npages: np.ndarray, region: np.ndarray | None,
                     trust_moves: int) -> tuple[np.ndarray, np.ndarray]:
        """Merge a read's units that exist (``keys`` sorted): their nodes and sizes, then their
        accesses. Returns (each key's unit or where it would go, whether it exists)."""
        scale, cand = np.float32(self.scale), self._cand is not None
        rated = np.zeros(1, np.int64)
        got = row_merge.lookup_add(self.keys(), keys, self._a, node, npages, region, count,
                                   rate, scale, self.interval, cand, rated)
        if got is not None:  # compiled: the lookup and the unchanged units' accesses, one pass
            pos, found, changed, added = got
            if changed.any():  # their new node first, then their accesses
                ch = pos[changed]
                self._take_nodes(ch, node[changed], npages[changed], trust_moves,
                                 None if region is None else region[changed])
                more = row_merge.add_accesses(self._a, ch, count[changed], rate[changed],
                                              scale, self.interval, cand, rated)
                added = _in_index_order(added, more)
            self._count_rated(int(rated[0]))
            self._accessed(*added)
            return pos, found
        got = row_merge.lookup_rows(self.keys(), keys, self._a, node, npages, region)
        if got is not None:  # compiled: one pass each for the lookup and the accesses
            pos, found, changed = got
            if changed.any():
                self._take_nodes(pos[changed], node[changed], npages[changed], trust_moves,
                                 None if region is None else region[changed])
            idx, f_count, f_rate = _kept(found, pos, count, rate)
            if len(idx):
                self._add_accesses_native(idx, f_count, f_rate)
            return pos, found
        pos, found = self._lookup(keys)
        idx, f_count, f_rate, f_node, f_npages = _kept(found, pos, count, rate, node, npages)
        if len(idx):
            rows = np.take(self._a, idx)  # gathered once for both steps
            self._take_changed(idx, f_node, f_npages,
                               None if region is None else region[found], trust_moves, rows)
            hit = (f_count > 0) | (f_rate > 0)
            self._add_accesses(*_kept(hit, idx, f_count, f_rate, rows))
        return pos, found

    def sync(self, sample: Sample, trust_moves: int = 0) -> None:
        """Take a complete sample of part of a target's address space (``sample.span``; None:
        all of it) for which units exist, their nodes and sizes, without its counts: the
        target's units in the span that it lacks are forgotten (unmapped), those it adds are
        new and cold, and nodes and sizes follow it (but see ``trust_moves`` in
        :meth:`update`). Costs the units of the span."""
        t = self.target_index(sample.pid)
        addr = sample.addr.astype(np.uint64, copy=False)
        order = None
        if len(addr) > 1 and not (addr[1:] > addr[:-1]).all():
            order = np.argsort(addr, kind="stable")
        pick = (lambda x: x) if order is None else (lambda x: x[order])  # noqa: E731
        addr, node, npages = pick(addr), pick(sample.node), pick(sample.npages)
        region = pick(sample.region) if len(sample.region) == len(sample.addr) else None
        if self._touched is None:
            self.touched()
        same = self._forget_absent(t, addr, sample.span)
        if same is not None:
            self._take_changed(same + np.arange(len(addr)), node, npages, region, trust_moves)
            self._forget_covered()
            return
        keys = unit_keys(t, addr)
        pos, found = _find(self.keys(), keys)
        if found.any():
            self._take_changed(pos[found], node[found], npages[found],
                               None if region is None else region[found], trust_moves)
        new = ~found
        if new.any():
            n = int(new.sum())
            self._add_units(t, pos[new], keys[new], addr[new], np.zeros(n, np.uint32),
                            np.zeros(n, np.float32), node[new], npages[new],
                            None if region is None else region[new])
        self._forget_covered()

    def _add_units(self, t: int, pos: np.ndarray, keys: np.ndarray, addr: np.ndarray,
                   count: np.ndarray, rate: np.ndarray, node: np.ndarray, npages: np.ndarray,
                   region: np.ndarray | None) -> None:
        """New units of target ``t`` (sorted; ``pos``: where they go in the old rows)."""
        n = np.zeros(len(addr), DTYPE)
        n["addr"] = addr
        n["count"] = count
        n["rate"] = rate
        self._count_rated(int(np.count_nonzero(n["rate"] > 0)))
        n["heat"] = rate / np.float32(self.scale)
        hit = (count > 0) | (rate > 0)
        n["last_access"] = np.where(hit, self.interval, NEVER)
        n["last_move"] = NEVER
        n["target"] = t
        n["npages"] = npages
        n["node"] = node
        if region is not None:
            n["flags"] = np.where(region, np.uint8(F_REGION), np.uint8(0))
            if region.any():
                self._became.append(keys[region])
        self._insert(pos, n, keys, hit)

    def _take_changed(self, idx: np.ndarray, node: np.ndarray, npages: np.ndarray,
                      region: np.ndarray | None, trust_moves: int,
                      rows: np.ndarray | None = None) -> None:
        """Existing units ``idx`` (sorted unique) as a sample shows them: those whose node,
        size or (when the sample says, ``region`` not None) region flag differ take them.
        ``rows``: a copy of the units' rows (gathered by the caller), kept up to date here."""
        if rows is not None:
            r = rows
        elif len(idx) and int(idx[-1]) - int(idx[0]) == len(idx) - 1:  # a run of rows (a part)
            r = self._a[int(idx[0]):int(idx[-1]) + 1]
        else:
            r = np.take(self._a, idx)  # one gather of the rows, not one per field
        ch = (r["node"] != node) | (r["npages"] != npages)
        if region is not None:
            ch |= ((r["flags"] & F_REGION) != 0) != region
        diff = np.flatnonzero(ch)
        if len(diff):
            self._take_nodes(idx[diff], node[diff], npages[diff], trust_moves,
                             None if region is None else region[diff])
            if rows is not None:
                rows[diff] = np.take(self._a, idx[diff])

    def _lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(index of each key's unit, or where it would be inserted; whether it is there) for
        sorted ``keys``. The units accessed in the last interval are looked up first: most of
        an interval's accesses are to them, and searching their keys is much cheaper than
        searching every unit's."""
        all_keys = self.keys()
        recent = self._recent
        if recent is None or not len(recent) or self._direct > 0:
            # after a lookup that found many keys outside the last interval's units (noise:
            # pages touched once, anywhere), searching those first costs more than it saves
            self._direct = max(0, self._direct - 1)
            return _find(all_keys, keys)
        p, found = _find(all_keys[recent], keys)
        pos = np.empty(len(keys), np.int64)
        pos[found] = recent[p[found]]
        miss = np.flatnonzero(~found)
        if len(miss):
            pos[miss], found[miss] = _find(all_keys, keys[miss])
        if len(miss) > LOOKUP_MISS * len(keys):
            self._direct = LOOKUP_DIRECT  # then the last interval's units are tried again
        return pos, found

    def _merge_rows(self, lo: int, acc: np.ndarray, count: np.ndarray, rate: np.ndarray,
                    node: np.ndarray, npages: np.ndarray, region: np.ndarray | None,
                    trust_moves: int) -> None:
        """Merge a complete sample whose units are exactly rows ``lo .. lo + len(node)``: the
        same as :meth:`update`'s lookup path, on a slice (no index arrays of every unit).
        ``acc``: the units with a count or an estimate (sorted), ``count`` and ``rate`` theirs."""
        a = self._a[lo:lo + len(node)]  # a view
        ch = (a["node"] != node) | (a["npages"] != npages)
        if region is not None:
            ch |= ((a["flags"] & F_REGION) != 0) != region
        diff = np.flatnonzero(ch)
        self._take_nodes(lo + diff, node[diff], npages[diff], trust_moves,
                         None if region is None else region[diff])
        hit = (count > 0) | (rate > 0)
        self._add_accesses(lo + acc[hit], count[hit], rate[hit])

    def _take_nodes(self, idx: np.ndarray, node: np.ndarray, npages: np.ndarray,
                    trust_moves: int, region: np.ndarray | None = None) -> None:
        """Units ``idx`` (sorted unique), whose node or size in a sample (``node``, ``npages``)
        differs from the state's, take the sample's; but a unit moved within the last
        ``trust_moves`` intervals keeps the node the daemon recorded (the profiler may have
        looked before the move). ``region``: the units' region flags in the sample (None:
        not a region unless one of 512 pages that was)."""
        a = self._a
        if trust_moves > 0 and len(idx):
            recent = (self.interval - a["last_move"][idx].astype(np.int64)) < trust_moves
            node = np.where(recent, a["node"][idx], node)
            keep = (a["node"][idx] != node) | (a["npages"][idx] != npages)
            if region is not None:
                keep |= ((a["flags"][idx] & F_REGION) != 0) != region
                region = region[keep]
            idx, node, npages = idx[keep], node[keep], npages[keep]
        if not len(idx):
            return
        self._account(idx, -1)
        a["node"][idx] = node
        a["npages"][idx] = npages
        was = (a["flags"][idx] & F_REGION) != 0
        if region is None:
            region = (npages > 1) & was
        f = a["flags"][idx] & np.uint8(~F_REGION & 0xFF)
        a["flags"][idx] = f | np.where(region, np.uint8(F_REGION), np.uint8(0))
        if (region & ~was).any():
            self._became.append(np.asarray(self.keys(idx[region & ~was])))
        self._account(idx, 1)
        self._pool_join(idx)

    def _add_accesses(self, acc: np.ndarray, count: np.ndarray, rate: np.ndarray,
                      rows: np.ndarray | None = None) -> None:
        """Add an interval's counts and rates to existing units ``acc`` (sorted unique).

        The units' rows are gathered once (or given: ``rows``, a current copy, which is
        consumed), updated and put back whole (``np.put``): a pass over their rows each way,
        where updating field by field costs a pass per field read and one per field written,
        each missing the cache again on a large state."""
        if not len(acc):
            return
        a = self._a
        r = np.take(a, acc) if rows is None else rows
        col = r["count"]
        col += count
        col = r["rate"]
        was = int(np.count_nonzero(col > 0))
        col += rate
        self._count_rated(int(np.count_nonzero(col > 0)) - was)
        before = r["heat"].copy()
        r["heat"] = before + rate / np.float32(self.scale)
        r["last_access"] = self.interval
        self._join_candidates(acc, before, r["flags"])
        np.put(a, acc, r)
        if self._pools:
            self._pool_changed(acc)
        self._touched = union(self._touched, acc)

    def _add_accesses_native(self, idx: np.ndarray, count: np.ndarray,
                             rate: np.ndarray) -> None:
        """:meth:`_add_accesses` of units ``idx`` (sorted unique) with a count or a rate, in
        one compiled pass over their rows (pagetier.core.row_merge), or by numpy."""
        rated = np.zeros(1, np.int64)
        got = row_merge.add_accesses(self._a, idx, count, rate, np.float32(self.scale),
                                     self.interval, self._cand is not None, rated)
        if got is None:
            hit = (count > 0) | (rate > 0)
            self._add_accesses(*_kept(hit, idx, count, rate))
            return
        self._count_rated(int(rated[0]))
        self._accessed(*got)

    def _count_rated(self, more: int) -> None:
        """``more`` units have a rate than before (rated's count, when kept)."""
        if self._rated is not None:
            self._rated += more

    def _accessed(self, acc: np.ndarray, before: np.ndarray, joined: np.ndarray | None) -> None:
        """The bookkeeping of units ``acc`` (sorted unique) that took accesses in their rows
        (``before``: their stored heat before; ``joined``: which joined the candidates, None
        when the state keeps none): the candidates and the heat of the rest, the pools, the
        touched units."""
        if not len(acc):
            return
        if joined is not None and joined.any():
            self._out -= float(sorted_find.masked(before, joined).sum(dtype=np.float64))
            self._cand = union(self._cand, sorted_find.masked(acc, joined))
        if self._pools:
            self._pool_changed(acc)
        self._touched = union(self._touched, acc)

    def _insert(self, pos: np.ndarray, rows: np.ndarray, keys: np.ndarray, hit: np.ndarray) -> None:
        """Insert ``rows`` (sorted, keys ``keys``) before old positions ``pos``."""
        if self._k is not None and len(self._k) == len(self._a):
            self._k = np.insert(self._k, pos, keys)
        else:
            self._k = None
        self._a = np.insert(self._a, pos, rows)
        new_idx = pos + np.arange(len(pos))
        if self._touched is not None:
            self._touched = union(_remap_insert(self._touched, pos), new_idx[hit])
        if self._recent is not None:
            self._recent = _remap_insert(self._recent, pos)
        if self._cand is not None:
            c = _remap_insert(self._cand, pos)
            # the new units' heat is their rate: candidates if it reaches the floor
            hot = rows["heat"] * np.float32(self.scale) >= self._cand_floor
            self._out += float(rows["heat"][~hot].sum(dtype=np.float64))
            self._cand = union(c, new_idx[hot])
            self._a["flags"][new_idx[hot]] |= np.uint8(F_CAND)
        self._pool_remap(lambda i: _remap_insert(i, pos))
        self._account(new_idx, 1)
        self._pool_join(new_idx)

    def _forget_covered(self) -> None:
        """Forget the units inside the 2 MiB of each unit that became a region in this merge
        (``_became``: their keys): a target read in 4 KiB pages, then in regions (pagetier.ko
        switches a target that grows past 1 GiB), keeps one unit per 2 MiB, not the region and
        511 pages besides it until their parts are read again."""
        if not self._became:
            return
        starts = unique(np.concatenate(self._became))
        self._became = []
        k = self.keys()
        lo = np.searchsorted(k, starts + np.uint64(1))
        hi = np.searchsorted(k, starts + np.uint64(512))
        n = hi - lo
        if not n.any():
            return
        first = np.repeat(lo - np.cumsum(n) + n, n)
        self.forget(first + np.arange(int(n.sum())))

    def _span_rows(self, t: int, span: tuple[int, int] | None) -> tuple[int, int]:
        """Rows ``[lo, hi)`` of target ``t``'s units starting in ``span`` (None: all)."""
        k = self.keys()
        base = np.uint64(t) << np.uint64(48)
        top = np.uint64(t + 1) << np.uint64(48)
        start, end = (0, _TOP) if span is None else span
        klo = base + np.uint64(min(int(start) >> 12, (1 << 48) - 1)) if start > 0 else base
        khi = top if end >= 1 << 60 else base + np.uint64(int(end) >> 12)
        return int(np.searchsorted(k, klo)), int(np.searchsorted(k, khi))

    def _forget_absent(self, t: int, addr: np.ndarray,
                       span: tuple[int, int] | None = None) -> int | None:
        """Forget target ``t``'s units in ``span`` (None: all of them) whose addresses are not
        in ``addr`` (sorted). Returns the index of the first of them when they are exactly
        ``addr``, else None."""
        lo, hi = self._span_rows(t, span)
        if hi - lo == len(addr) and np.array_equal(self._a["addr"][lo:hi], addr):
            return lo  # nothing unmapped, nothing new (the usual case): one comparison
        k = self.keys()
        keys = unit_keys(t, addr)
        mine = k[lo:hi]
        if not len(keys):
            gone = np.arange(lo, hi)
        else:
            p = np.minimum(np.searchsorted(keys, mine), len(keys) - 1)
            gone = lo + np.flatnonzero(keys[p] != mine)
        if len(gone):
            self.forget(gone)
        return None

    def forget_target(self, pid: int) -> None:
        if pid in self.pids:
            t = self.pids.index(pid)
            k = self.keys()
            lo = int(np.searchsorted(k, np.uint64(t) << np.uint64(48)))
            hi = int(np.searchsorted(k, np.uint64(t + 1) << np.uint64(48)))
            if hi > lo:
                self.forget(np.arange(lo, hi))
            self.pids[t] = -1

    def forget(self, idx: np.ndarray) -> None:
        gone = unique(np.asarray(idx, np.int64))
        if not len(gone):
            return
        self._account(gone, -1)
        if self._rated is not None:
            self._rated -= int(np.count_nonzero(self._a["rate"][gone] > 0))
        if self._cand is not None:
            c = self._cand
            inside = _member(c, gone)
            self._out -= float(self._a["heat"][gone[~inside]].sum(dtype=np.float64))
            self._cand = _remap_delete(c, gone)
        if self._touched is not None:
            self._touched = _remap_delete(self._touched, gone)
        if self._recent is not None:
            self._recent = _remap_delete(self._recent, gone)
        self._pool_remap(lambda i: _remap_delete(i, gone),
                         lambda ti: ti - np.searchsorted(gone, ti))
        keep = np.ones(len(self._a), bool)
        keep[gone] = False
        self._a = self._a[keep]
        if self._k is not None:
            self._k = self._k[keep]

    def mark_stuck(self, idx: np.ndarray) -> None:
        """Units whose move failed for good: the daemon leaves them until :meth:`unstick`, and
        they count as unmovable (outside the fast budget) until a move of theirs succeeds."""
        idx = unique(np.asarray(idx, np.int64))
        self._account(idx, -1)
        self._a["flags"][idx] |= np.uint8(F_STUCK | F_UNMOVABLE)
        self._account(idx, 1)

    def unstick(self) -> None:
        """Let stuck units be tried again (they stay unmovable until a move succeeds)."""
        self._a["flags"] &= ~np.uint8(F_STUCK)

    def stuck(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of ``idx`` are stuck."""
        return (self._a["flags"][idx] & F_STUCK) != 0

    def unmovable(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of ``idx`` the kernel refused to move and has not moved since."""
        return (self._a["flags"][idx] & F_UNMOVABLE) != 0

    def record_moves(self, idx: np.ndarray, node: int) -> None:
        idx = unique(np.asarray(idx, np.int64))
        a = self._a
        self._account(idx, -1)
        a["node"][idx] = node
        a["flags"][idx] &= ~np.uint8(F_UNMOVABLE)
        self._account(idx, 1)
        self._pool_join(idx)
        a["last_move"][idx] = self.interval
        a["moves"][idx] = np.minimum(a["moves"][idx].astype(np.int64) + 1, 65535)

    def is_region(self, idx: np.ndarray) -> np.ndarray:
        """Boolean: which of units ``idx`` are regions (moved page by page)."""
        return (self._a["flags"][idx] & F_REGION) != 0

    def addresses(self, idx: np.ndarray) -> np.ndarray:
        return self._a["addr"][idx]

    def pid_of(self, idx: np.ndarray) -> np.ndarray:
        return np.asarray(self.pids, np.int64)[self._a["target"][idx]]
