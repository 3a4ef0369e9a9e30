"""The default policy's view of a PageState: everything the rules read of it, in one place.

The rules never reach into a PageState; they ask a :class:`PageView`, one method per thing
they need. A state that keeps candidates (pagetier/core/state.py: ``hotter_than``,
``touched``, ``coldest``, ``rows``, ``keys``) is read through them: the
decision then looks at the units with heat at least ``min_heat`` and those accessed in this
interval, plus the fast node's coldest units that an exchange may demote. Any other object
with the state's columns (``heat``, ``rate``, ``node``, ``npages``, ``last_move``, ``target``,
``addr``) is read whole: the same decision, on every unit.

What of PageState this module touches (and nothing else in the policy does):

- attributes: ``interval``, ``decay`` (0.5 when absent), ``pids`` (``read_now`` only), the
  structured array ``a`` (only ``a.dtype.names``, to see whether there is a ``rate`` column);
- columns: ``heat``, ``rate``, ``node``, ``npages``, ``last_move``, and ``target``/``addr``
  when the state has no ``keys``;
- methods: ``hotter_than``, ``touched``, ``coldest``, ``rows`` (whole rows
  of some units, read by the field names above), ``columns`` when it has it (the same fields
  of some units, widened as :meth:`PageView.columns` returns them), ``keys``, ``pages_on``,
  ``stuck``, ``len()``;
- module helpers and constants: ``unit_keys``, ``union``, ``union_remap``, ``NEVER`` (the
  ``last_move`` of a unit never moved).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pagetier.core import sorted_find, state as core_state
from pagetier.core.state import NEVER, union, union_remap  # noqa: F401 (NEVER: for the rules)

# what a state must offer to be read by candidates rather than whole
CANDIDATE_API = ("hotter_than", "touched", "coldest", "rows", "keys")
COLUMNS = ("heat", "rate", "node", "npages", "last_move")


def unit_keys(state) -> np.ndarray:
    """Stable identity of each unit across calls: ``(target << 48) | (addr >> 12)``; the
    state's own sorted keys when it keeps them."""
    keys = getattr(state, "keys", None)
    if keys is not None:
        return keys()
    return core_state.unit_keys(state.target, state.addr)


@dataclass
class Units:
    """The columns of the units a decision looks at, as local arrays: ``idx`` their indices in
    the state (sorted), ``rate`` None when the state keeps no rates."""

    view: "PageView"
    idx: np.ndarray
    heat: np.ndarray
    rate: np.ndarray | None
    node: np.ndarray
    npages: np.ndarray
    last_move: np.ndarray
    # every unit's key, gathered from the state at the first call of keys(): the rules ask for
    # the keys of the same units several times a decision (the accessed ones, the hot set)
    _keys: np.ndarray | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.idx)

    def keys(self, local: np.ndarray) -> np.ndarray:
        """The keys of units ``local`` (positions in ``idx``)."""
        if self._keys is None:
            self._keys = self.view.keys(self.idx)
        return self._keys[local]

    def sorted_keys(self, local: np.ndarray) -> np.ndarray:
        """``np.sort(self.keys(local))`` for distinct positions ``local``. Read by candidates,
        the units' keys ascend with their positions (``idx`` is sorted, and so are a state's
        keys by index): a mask of ``local`` picks them in order, without a sort."""
        if not self.view.incremental:
            return np.sort(self.keys(local))
        if self._keys is None:
            self._keys = self.view.keys(self.idx)
        pick = np.zeros(len(self.idx), bool)
        pick[local] = True
        return sorted_find.masked(self._keys, pick)

    def subset(self, keep: np.ndarray) -> "Units":
        """The units of mask ``keep``, as a set of their own (every column cut in one
        compiled pass when the helpers are built)."""
        cols = [self.idx, self.heat, self.rate, self.node, self.npages, self.last_move,
                self._keys]
        have = [c for c in cols if c is not None]
        got = sorted_find.compress(keep, *have)
        if got is None:
            got = [c[keep] for c in have]
        it = iter(got)
        return Units(self.view, *[None if c is None else next(it) for c in cols])

    def extend(self, more: np.ndarray) -> np.ndarray:
        """Add state units ``more`` (sorted) to the set; returns where each old position went."""
        idx, remap, added = union_remap(self.idx, more)
        self.idx = idx
        # the old positions are all but the added ones, in order: a copy a run in compiled
        # code, else two masked copies (cheaper than scattering through remap and added)
        masks = []

        def merged(was: np.ndarray, got: np.ndarray) -> np.ndarray:
            col = sorted_find.spread(was, got, added)
            if col is not None:
                return col
            if not masks:
                new = np.zeros(len(idx), bool)
                new[added] = True
                masks.extend((~new, new))
            col = np.empty(len(idx), was.dtype)
            col[masks[0]] = was
            col[masks[1]] = got
            return col

        if self._keys is not None:
            self._keys = merged(self._keys, self.view.keys(idx[added]))
        for name, got in zip(COLUMNS, self.view.columns(idx[added])):
            setattr(self, name, merged(getattr(self, name), got))
        return remap


class PageView:
    """A PageState as the default policy reads it (see the module's docstring)."""

    def __init__(self, state, min_heat: float):
        self.state = state
        self.incremental = min_heat > 0 and all(hasattr(state, m) for m in CANDIDATE_API)
        self.min_heat = min_heat
        self._keys = None  # every unit's key, when read whole

    @property
    def interval(self) -> int:
        return int(self.state.interval)

    @property
    def decay(self) -> float:
        return float(getattr(self.state, "decay", 0.5))

    def candidates(self) -> tuple[np.ndarray, float]:
        """(sorted indices of the units to rank, the summed heat of the units left out)."""
        st = self.state
        if not self.incremental:
            return np.arange(len(st)), 0.0
        cand, rest = st.hotter_than(self.min_heat)
        # one merge of the two sorted sets (the touched units among the candidates are found
        # by it, not by a look at each one's row)
        return union(cand, st.touched()), rest

    def columns(self, idx: np.ndarray | None = None) -> tuple:
        """(heat, rate, node, npages, last_move) of units ``idx`` (all units when None), heat
        and rate as float64, npages and last_move as int64; rate None without a rate column."""
        st = self.state
        if idx is None:
            rate = st.rate if "rate" in st.a.dtype.names else None
            return (np.asarray(st.heat, np.float64),
                    None if rate is None else rate.astype(np.float64),
                    st.node, st.npages.astype(np.int64), st.last_move.astype(np.int64))
        if hasattr(st, "columns"):  # PageState: one pass over the rows
            return st.columns(idx)
        r = st.rows(idx)
        return (r["heat"].astype(np.float64), r["rate"].astype(np.float64), r["node"],
                r["npages"].astype(np.int64), r["last_move"].astype(np.int64))

    def units(self) -> tuple[Units, float]:
        """The units to rank with their columns, and the summed heat of those left out."""
        idx, rest = self.candidates()
        if self.incremental and hasattr(self.state, "columns"):  # the keys in the same pass
            *cols, keys = self.state.columns(idx, keys=True)
            return Units(self, idx, *cols, _keys=keys), rest
        cols = self.columns(idx if self.incremental else None)
        return Units(self, idx, *cols), rest

    def keys(self, idx: np.ndarray) -> np.ndarray:
        """The keys of state units ``idx``."""
        if self.incremental:
            return self.state.keys(idx)
        if self._keys is None:
            self._keys = unit_keys(self.state)
        return self._keys[idx]

    def pages_on(self, node: int, units: Units) -> int:
        """Pages on ``node``: the state's count, or summed over ``units`` when read whole."""
        if self.incremental:
            return self.state.pages_on(node)
        return int(units.npages[units.node == node].sum())

    def coldest(self, node: int, n: int) -> tuple[np.ndarray, bool]:
        """(at least ``n`` of the units on ``node``, coldest per page first, or all of them;
        whether that is all)."""
        return self.state.coldest(node, n)

    def pool_columns(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(last_move as int64, npages, rate) of state units ``idx``."""
        st = self.state
        return st.last_move[idx].astype(np.int64), st.npages[idx], st.rate[idx]

    def stuck(self, idx: np.ndarray) -> np.ndarray:
        """Which of state units ``idx`` the kernel refused to move (shared pages)."""
        return self.state.stuck(idx)

    def sample_keys(self, pid: int, addr: np.ndarray) -> np.ndarray | None:
        """The keys of a sample's units, None for a target the state has not read yet."""
        pids = self.state.pids
        if pid not in pids:
            return None
        return core_state.unit_keys(pids.index(pid), addr)
