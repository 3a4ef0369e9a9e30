"""The oracle: offline optimal placement for a recorded trace, after AutoTM (ASPLOS'20), and the
best static placement it must never lose to.

Not live policies (they need the future). :func:`best_static` picks the best fixed set of
units, computed exactly on the trace's own units; :func:`solve` builds an integer linear
program over windows x groups of units and solves it with HiGHS (``highspy``, the ``ilp``
extra), starting from that static set; :class:`StaticPolicy` and :class:`OraclePolicy` replay
the two answers through the Policy interface, so the simulator runs them like any other
policy. :func:`yardstick` does all of it and keeps the better of the two replays, so the
yardstick the bench measures every policy against is never worse than static placement.

**Static placement.** One set of units stays on the fast node for the whole run. Under the
simulator's rules (first touch on the slow node, moves decided at the end of an interval take
effect for the next) a unit of the set is promoted at the end of the interval that first
shows it and never moves again, so it gains ``(slow - fast)`` time on each of its later
accesses and costs one migration. The set is the units with the highest net gain per page
(gain > 0) that fit in the capacity: the top-k by accesses per page, computed on the
uncoarsened units (a greedy knapsack: a unit that does not fit is passed over for smaller
ones). Without a rate limit this is the static optimum up to the knapsack's last unit.

**The ILP** uses the simulator's rules, so that with one window per interval and first
touch on the slow node its objective is exactly the simulated time of its plan:

- units are coarsened into at most ``max_groups`` groups; a group is on the fast node or on
  the slow node as a whole. ``coarsen="signature"`` (the default) clusters units by their
  heat over time: the feature of a unit is its access density (counts per page) in each
  window; the static set and the other units are clustered apart, so the static placement
  is one of the ILP's solutions; a cluster is split (along its first principal direction)
  while its units differ (page-weighted sum of squares) or while it is warm and larger than
  ``footprint / max_groups`` pages, the largest such loss first. A trace with at most
  ``max_groups`` units keeps one group per unit. ``coarsen="address"`` is the former scheme
  (runs of adjacent addresses of ``group_pages`` pages), kept to compare with: on a trace
  whose hot units are interleaved with cold ones it loses to static placement;
- frames are coarsened into windows of ``window`` intervals; moves happen only at window
  boundaries (decided at the end of a window's last interval, effective for the next window);
- variables: x[g, w] = 1 when group g is on the fast node during window w; u/d >= the
  increase/decrease of x between windows;
- a unit first touched in window w is placed by the first-touch rule: ``slow``: it is on the
  slow node during w (its accesses cost slow time) and joining a fast group at w+1 costs a
  migration; ``fast-first``: modelled optimistically as placed where its group is planned,
  free of charge (the simulator fills the fast node first, so the replay can differ: the
  result says ``exact_model = False``);
- objective: access time (per-access fast/slow time times the counts) plus migration time
  (pages moved times the per-page cost);
- per window: pages on the fast node <= capacity; per boundary: pages moved <= the rate
  limit of one interval (the daemon's limit), so the daemon's clipping never cuts the plan;
- the static set, as groups (fast from the window after the first), is handed to HiGHS as a
  starting solution when it is feasible (it is not when the rate limit cannot move its units
  in time), and the answer is the better of the two in the model.

Large traces: ``max_groups`` and ``max_windows`` bound the problem size and ``time_limit``
the solve; ``OracleResult.optimal`` is False (and ``status`` says why) when HiGHS stopped at
the time limit or with a gap above ``mip_rel_gap``: then the plan is the best one found, and
``bound_s`` is a lower bound on the optimum of the coarsened model.

HiGHS writes a banner to file descriptor 1 when a solver object is made, whatever its
options; the solver is made and run with descriptor 1 pointed at /dev/null (``_no_stdout``),
so that a command's ``--json`` output stays JSON.
"""
from __future__ import annotations

import contextlib
import ctypes
import heapq
import math
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from pagetier.core.planner import rate_pages
from pagetier.errors import ConfigError, Unavailable
from pagetier.policies.base import Context, Decision, Policy
from pagetier.policies.simulate import (PLACEMENTS, CostModel, SimConfig, SimResult,
                                        frame_interval_s, simulate)

COARSEN = ("signature", "address")
SIGNATURE_DIMS = 32  # at most this many time slices in a unit's heat signature


# ----------------------------------------------------------------------------- units
@dataclass
class Units:
    """Every unit a trace shows, sorted by (pid, addr), with its samples as rows."""

    pid: np.ndarray  # int64 per unit
    addr: np.ndarray  # uint64 per unit
    npages: np.ndarray  # int64 per unit: the most pages any sample gave it (a 4 KiB run can
    #                    become a huge page and back; the capacity must hold the largest)
    first: np.ndarray  # int64 per unit: frame of its first sample
    row_unit: np.ndarray  # int64 per sample row: its unit
    row_frame: np.ndarray  # int64 per sample row: its frame
    row_count: np.ndarray  # float64 per sample row
    frames: int

    def __len__(self) -> int:
        return len(self.addr)

    def index(self, pid: int, addr) -> np.ndarray:
        """Unit index of each address of ``pid``; -1 for units the trace never showed."""
        addr = np.asarray(addr, np.uint64)
        out = np.full(len(addr), -1, np.int64)
        lo, hi = np.searchsorted(self.pid, [int(pid), int(pid) + 1])
        if hi <= lo or not len(addr):
            return out
        a = self.addr[lo:hi]
        pos = np.minimum(np.searchsorted(a, addr), len(a) - 1)
        hit = a[pos] == addr
        out[hit] = lo + pos[hit]
        return out

    def total(self) -> np.ndarray:
        """Counts of each unit over the whole trace."""
        return np.bincount(self.row_unit, self.row_count, minlength=len(self))

    def per_slice(self, window: int, windows: int, slices: int) -> np.ndarray:
        """[units, slices] counts: the ``windows`` windows of ``window`` frames, merged into
        ``slices`` runs of consecutive windows."""
        w = np.minimum(self.row_frame // window, windows - 1) * slices // windows
        flat = np.bincount(self.row_unit * slices + w, self.row_count,
                           minlength=len(self) * slices)
        return flat.reshape(len(self), slices)


def trace_units(frames) -> Units:
    """The units of ``frames`` (a list of (index, t, {pid: Sample}))."""
    pids, addrs, counts, npages, fr = [], [], [], [], []
    nframes = 0
    for k, (_, _, samples) in enumerate(frames):
        nframes = k + 1
        for pid, s in samples.items():
            n = len(s.addr)
            pids.append(np.full(n, int(pid), np.int64))
            addrs.append(np.asarray(s.addr, np.uint64))
            counts.append(np.asarray(s.count, np.float64))
            npages.append(np.asarray(s.npages, np.int64))
            fr.append(np.full(n, k, np.int64))
    if not pids:
        z = np.zeros(0, np.int64)
        return Units(z, np.zeros(0, np.uint64), z, z, z, z, np.zeros(0), nframes)
    pid, addr, cnt, npg, frame = (np.concatenate(x) for x in (pids, addrs, counts, npages, fr))
    order = np.lexsort((frame, addr, pid))
    pid, addr, cnt, npg, frame = pid[order], addr[order], cnt[order], npg[order], frame[order]
    new = np.ones(len(pid), bool)
    new[1:] = (pid[1:] != pid[:-1]) | (addr[1:] != addr[:-1])
    unit = np.cumsum(new) - 1
    starts = np.flatnonzero(new)
    return Units(pid=pid[starts], addr=addr[starts], npages=np.maximum.reduceat(npg, starts),
                 first=frame[starts],
                 row_unit=unit, row_frame=frame, row_count=cnt, frames=nframes)


def _frames_list(frames) -> list:
    if hasattr(frames, "intervals"):  # a profiler.trace.Trace
        frames = frames.intervals()
    return list(frames)


# ----------------------------------------------------------------------------- static
@dataclass
class StaticPlan:
    """The best static placement: ``fast[i]`` says unit i of ``units`` stays on the fast node."""

    units: Units
    fast: np.ndarray  # bool per unit
    capacity: int
    model_s: float  # its time under the simulator's rules, the rate limit aside
    pages: int

    def describe(self) -> str:
        return (f"static: {int(self.fast.sum())} of {len(self.units)} units "
                f"({self.pages} of {self.capacity} pages)")


def best_static(frames, capacity: int, cost: CostModel, placement: str = "slow",
                units: Units | None = None) -> StaticPlan:
    """The static set with the highest gain that fits in ``capacity`` pages (module docstring)."""
    if units is None:
        units = trace_units(_frames_list(frames))
    f, s, m = cost.fast_s, cost.slow_s, cost.page_move_s
    n = len(units)
    total = units.total()
    first_rows = units.row_frame == units.first[units.row_unit]
    later = total - np.bincount(units.row_unit[first_rows], units.row_count[first_rows],
                                minlength=n)
    npages = np.maximum(units.npages, 1)
    gain = (s - f) * later - m * npages
    fast = np.zeros(n, bool)
    cand = np.flatnonzero(gain > 0)
    # by gain per page, then by address order (deterministic)
    cand = cand[np.lexsort((cand, -(gain[cand] / npages[cand])))]
    room = int(capacity)
    if len(cand):
        cum = np.cumsum(npages[cand])
        k = int(np.searchsorted(cum, room, side="right"))
        fast[cand[:k]] = True
        room -= int(cum[k - 1]) if k else 0
        rest = cand[k:]
        if len(rest) and room >= int(npages[rest].min()):
            for i in rest.tolist():  # the knapsack's tail: smaller units that still fit
                if npages[i] <= room:
                    fast[i] = True
                    room -= int(npages[i])
    model = float(s * total.sum() - ((s - f) * later)[fast].sum() + m * npages[fast].sum())
    return StaticPlan(units=units, fast=fast, capacity=int(capacity), model_s=model,
                      pages=int(npages[fast].sum()))


def _desired(units: Units, want_unit: np.ndarray, state) -> np.ndarray:
    """Per unit of ``state``: ``want_unit`` of its trace unit (False for units not in it)."""
    out = np.zeros(len(state), bool)
    if not len(state):
        return out
    pids = state.pid_of(np.arange(len(state)))
    for pid in np.unique(pids).tolist():
        sel = np.flatnonzero(pids == pid)
        idx = units.index(pid, state.addr[sel])
        ok = idx >= 0
        out[sel[ok]] = want_unit[idx[ok]]
    return out


def _follow(units: Units, want_unit: np.ndarray, state, ctx: Context):
    """The moves that bring ``state`` to ``want_unit`` (per unit of ``units``): (promote,
    demote) indices of the wanted units present and not on the fast node, and of the other
    units found there."""
    desired = _desired(units, want_unit, state)
    fast = state.node == ctx.fast_node
    return (np.flatnonzero(desired & ~fast & (state.node >= 0)),
            np.flatnonzero(~desired & fast))


class StaticPolicy(Policy):
    """Keeps a :class:`StaticPlan`'s units on the fast node: promotes each one present and not
    there yet (at the end of the interval that first shows it; again later if the rate limit
    held it back) and demotes any other unit found there (fast-first placement).

    Not registered by name: it needs a plan (``StaticPolicy(best_static(...))``)."""

    name = "static"

    @dataclass
    class Config:
        pass

    def __init__(self, plan: StaticPlan):
        super().__init__(None)
        self.plan = plan

    def decide(self, state, ctx: Context) -> Decision:
        stats = {"static_units": int(self.plan.fast.sum())}
        if not len(state):
            return Decision(stats=stats)
        promote, demote = _follow(self.plan.units, self.plan.fast, state, ctx)
        return Decision(promote=promote, demote=demote, stats=stats)


# ----------------------------------------------------------------------------- groups
@dataclass
class Groups:
    """A group id for each unit of ``units``."""

    units: Units
    gid: np.ndarray  # int64 per unit
    npages: np.ndarray  # pages per group
    method: str

    def __len__(self) -> int:
        return len(self.npages)

    @property
    def group_pages(self) -> int:
        """Pages of the largest group."""
        return int(self.npages.max()) if len(self.npages) else 0

    def lookup(self, pid: int, addr) -> np.ndarray:
        """Group of each (pid, addr); -1 for units the trace never showed."""
        idx = self.units.index(pid, addr)
        out = np.full(len(idx), -1, np.int64)
        out[idx >= 0] = self.gid[idx[idx >= 0]]
        return out


def _dense(units: Units, label: np.ndarray, method: str) -> Groups:
    _, gid = np.unique(label, return_inverse=True)
    gid = gid.astype(np.int64).ravel()
    sizes = np.bincount(gid, weights=units.npages, minlength=int(gid.max()) + 1 if len(gid) else 0)
    return Groups(units, gid, sizes.astype(np.int64), method)


def address_groups(units: Units, group_pages: int | None = None, max_groups: int = 256) -> Groups:
    """Runs of adjacent addresses of ``group_pages`` pages (the former coarsening)."""
    total = int(units.npages.sum())
    if group_pages is None:
        group_pages = max(1, math.ceil(total / max(1, max_groups)))
    label = np.zeros(len(units), np.int64)
    base = 0
    for pid in np.unique(units.pid).tolist():
        sel = np.flatnonzero(units.pid == pid)  # sorted by address already
        n = units.npages[sel]
        g = (np.cumsum(n) - n) // group_pages
        label[sel] = base + g
        base += int(g.max()) + 1
    return _dense(units, label, "address")


def _split(X: np.ndarray, w: np.ndarray, balanced: bool) -> np.ndarray | None:
    """Boolean mask of one side of a two-way split of rows X (weights w), or None.

    Along the first principal direction (power iteration) of the centred rows: at the best
    two-cluster cut of the projections, or (``balanced``) at their weighted median."""
    mean = w @ X / w.sum()
    Xc = X - mean
    var = w @ (Xc * Xc)
    if var.max() > 0:
        v = np.zeros(X.shape[1])
        v[int(np.argmax(var))] = 1.0
        for _ in range(12):
            nv = Xc.T @ (w * (Xc @ v))
            norm = np.linalg.norm(nv)
            if norm <= 0:
                break
            v = nv / norm
        p = Xc @ v
    else:
        p = np.zeros(len(X))
    order = np.argsort(p, kind="stable")  # ties: address order
    ws, ps = w[order], p[order]
    cw = np.cumsum(ws)
    if balanced or not var.max() > 0:
        k = int(np.searchsorted(cw, cw[-1] / 2.0)) + 1
    else:  # the cut with the least within-cluster sum of squares of the projections
        cwp, cwp2 = np.cumsum(ws * ps), np.cumsum(ws * ps * ps)
        left = cwp2[:-1] - cwp[:-1] ** 2 / cw[:-1]
        rw, rwp, rwp2 = cw[-1] - cw[:-1], cwp[-1] - cwp[:-1], cwp2[-1] - cwp2[:-1]
        right = rwp2 - rwp ** 2 / np.maximum(rw, 1e-300)
        k = int(np.argmin(left + right)) + 1
    k = min(max(k, 1), len(X) - 1)
    mask = np.zeros(len(X), bool)
    mask[order[:k]] = True
    return mask


def signature_groups(units: Units, max_groups: int, window: int, windows: int,
                     static_fast: np.ndarray | None = None) -> Groups:
    """Units clustered by their heat over time (module docstring), at most ``max_groups``."""
    n = len(units)
    if n <= max_groups:
        return _dense(units, np.arange(n), "unit")
    C = units.per_slice(window, windows, min(windows, SIGNATURE_DIMS))
    w = np.maximum(units.npages, 1).astype(np.float64)
    X = np.sqrt(C / w[:, None])
    target = max(1.0, w.sum() / max_groups)

    def entry(idx):
        ww, XX = w[idx], X[idx]
        pages = ww.sum()
        mean = ww @ XX / pages
        sse = float(ww @ ((XX - mean) ** 2).sum(axis=1))
        energy = float(pages * (mean ** 2).sum())
        size_loss = energy * max(0.0, pages / target - 1.0)
        return sse + size_loss, sse >= size_loss, idx

    parts = [np.arange(n)] if static_fast is None else [np.flatnonzero(static_fast),
                                                         np.flatnonzero(~static_fast)]
    heap, done, seq = [], [], 0
    for idx in parts:
        if len(idx):
            score, hetero, _ = entry(idx)
            heapq.heappush(heap, (-score, seq, hetero, idx))
            seq += 1
    while heap and len(heap) + len(done) < max_groups:
        neg, _, hetero, idx = heapq.heappop(heap)
        if -neg <= 0 or len(idx) < 2:
            done.append(idx)
            if -neg <= 0:  # every other cluster scores no more: nothing left to gain
                done.extend(item[3] for item in heap)
                heap = []
            continue
        mask = _split(X[idx], w[idx], balanced=not hetero)
        for side in (idx[mask], idx[~mask]):
            score, het, _ = entry(side)
            heapq.heappush(heap, (-score, seq, het, side))
            seq += 1
    label = np.zeros(n, np.int64)
    for g, idx in enumerate(done + [item[3] for item in heap]):
        label[idx] = g
    return _dense(units, label, "signature")


def make_groups(frames, group_pages: int | None = None, max_groups: int = 256, *,
                coarsen: str = "signature", window: int = 1,
                static_fast: np.ndarray | None = None) -> Groups:
    """Coarsen the trace's units (``frames`` or their :class:`Units`) into groups (module
    docstring); ``static_fast``: the static set, kept apart by the signature coarsening."""
    units = frames if isinstance(frames, Units) else trace_units(_frames_list(frames))
    if coarsen == "address":
        return address_groups(units, group_pages, max_groups)
    if coarsen != "signature":
        raise ConfigError(f"coarsen must be one of {', '.join(COARSEN)}, got {coarsen!r}")
    windows = max(1, math.ceil(units.frames / window))
    return signature_groups(units, max_groups, window, windows, static_fast)


# ----------------------------------------------------------------------------- the ILP
@contextlib.contextmanager
def _no_stdout():
    """File descriptor 1 points at /dev/null meanwhile (HiGHS's banner; Python's own
    sys.stdout is flushed first and is not affected otherwise)."""
    for stream in (sys.stdout, sys.__stdout__):
        with contextlib.suppress(Exception):
            stream.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        yield
    finally:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None).fflush(None)  # C stdio's buffer, before descriptor 1 comes back
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


@dataclass
class OracleResult:
    plan: np.ndarray  # bool [groups, windows]: group on the fast node during the window
    groups: Groups
    window: int  # intervals per window
    frames: int
    objective_s: float  # the model's estimated time of the plan
    bound_s: float  # lower bound on the model's optimum (== objective_s when optimal)
    optimal: bool
    status: str  # HiGHS model status, plus why the answer is bounded
    gap: float
    solve_s: float
    exact_model: bool  # the simulator's rules modelled exactly (first touch on slow)
    capacity: int
    max_moves: int
    static_model_s: float = math.inf  # the static seed's time in the model (inf: infeasible)
    from_seed: bool = False  # the answer is the static seed (HiGHS found nothing better)
    info: dict = field(default_factory=dict)

    def describe(self) -> str:
        kind = "optimal" if self.optimal else f"bounded ({self.status}, gap {self.gap:.1%})"
        seed = ", static seed kept" if self.from_seed else ""
        return (f"oracle {kind}: {len(self.groups)} {self.groups.method} groups (largest "
                f"{self.groups.group_pages} pages), {self.plan.shape[1]} windows of "
                f"{self.window} intervals, {self.objective_s:.4g} s (bound {self.bound_s:.4g} s)"
                f"{seed}, solved in {self.solve_s:.1f} s")


@dataclass
class _Model:
    """The ILP's data per group and window, and its objective and constraints on a plan.

    ``c_old``/``c_new``: counts of units seen before / first seen in the window; ``n_prev``/``a``:
    pages of units seen before / first seen in the window. With fast-first placement the new
    units count as old ones (placed with their group, free)."""

    c_old: np.ndarray
    c_new: np.ndarray
    n_prev: np.ndarray
    a: np.ndarray
    cost: CostModel
    capacity: int
    max_moves: int
    slow_first: bool

    @property
    def G(self) -> int:
        return self.c_old.shape[0]

    @property
    def W(self) -> int:
        return self.c_old.shape[1]

    @property
    def B(self) -> int:
        """Window boundaries, where moves happen."""
        return self.W - 1

    def objective(self, plan: np.ndarray) -> float:
        """The plan's time in the model: access time plus migration time."""
        f, s, m, B = self.cost.fast_s, self.cost.slow_s, self.cost.page_move_s, self.B
        x = plan.astype(np.float64)
        moved = ((self.n_prev[:, :B] * np.abs(np.diff(x, axis=1))).sum()
                 + (self.a[:, :B] * x[:, 1:]).sum())
        return float((s * self.c_old).sum() + ((f - s) * self.c_old * x).sum()
                     + (s * self.c_new).sum() + m * moved)

    def feasible(self, plan: np.ndarray) -> bool:
        """The plan keeps the first-touch rule, the capacity and the rate limit."""
        B = self.B
        x = plan.astype(np.float64)
        if self.slow_first and x[:, 0].any():
            return False
        if ((self.n_prev * x).sum(axis=0) > self.capacity).any():
            return False
        moved = (self.n_prev[:, :B] * np.abs(np.diff(x, axis=1)) + self.a[:, :B] * x[:, 1:]).sum(axis=0)
        return not (moved > self.max_moves).any()


def _model(units: Units, groups: Groups, window: int, W: int, cost: CostModel, capacity: int,
           max_moves: int, slow_first: bool) -> _Model:
    """Per group and window: counts of units seen before (c_old) and first seen in (c_new)
    the window, pages seen before (n_prev) and first seen in (a) the window."""
    G, gid = len(groups), groups.gid
    fw = units.first // window
    rw = units.row_frame // window
    g = gid[units.row_unit]
    fresh = fw[units.row_unit] == rw
    key = g * W + rw
    c_new = np.bincount(key, units.row_count * fresh, minlength=G * W).reshape(G, W)
    c_old = np.bincount(key, units.row_count * ~fresh, minlength=G * W).reshape(G, W)
    a = np.bincount(gid * W + fw, units.npages.astype(np.float64), minlength=G * W).reshape(G, W)
    n_prev = np.cumsum(a, axis=1) - a
    if not slow_first:  # new units placed with their group, free
        c_old, c_new = c_old + c_new, np.zeros_like(c_new)
        n_prev, a = n_prev + a, np.zeros_like(a)
    return _Model(c_old, c_new, n_prev, a, cost, capacity, max_moves, slow_first)


def _seed_plan(model: _Model, groups: Groups, static: StaticPlan) -> np.ndarray | None:
    """The static set as a plan: groups wholly in it, fast from the first window they can be;
    None when the plan is infeasible (the rate limit cannot move its units in time)."""
    G, W = model.G, model.W
    in_static = np.bincount(groups.gid, static.fast.astype(np.float64), minlength=G)
    members = np.bincount(groups.gid, minlength=G)
    whole = (in_static == members) & (members > 0)
    plan = np.zeros((G, W), bool)
    plan[whole, (1 if model.slow_first else 0):] = True
    return plan if model.feasible(plan) else None


def _columns(model: _Model, unit: float):
    """Per column (x[g, w] for G*W, then u[g, b] and d[g, b] for each boundary b = w -> w+1):
    its cost, in units of ``unit`` seconds, its bounds, and the objective's constant."""
    G, W, B = model.G, model.W, model.B
    f, s, m = model.cost.fast_s, model.cost.slow_s, model.cost.page_move_s
    nx, nb = G * W, G * B
    ncol = nx + 2 * nb
    cost_col = np.zeros(ncol)
    cost_col[:nx] = ((f - s) * model.c_old).ravel() / unit
    # new units joining a fast group at the next window are migrated
    cost_col[:nx].reshape(G, W)[:, 1:] += m * model.a[:, :-1] / unit
    mig = (m * model.n_prev[:, :B] / unit).ravel() if B else np.zeros(0)
    cost_col[nx:nx + nb] = mig
    cost_col[nx + nb:] = mig
    const = float((s * model.c_old).sum() + (s * model.c_new).sum()) / unit
    lower = np.zeros(ncol)
    upper = np.full(ncol, np.inf)
    upper[:nx] = 1.0
    if model.slow_first:
        upper[np.arange(G) * W] = 0.0  # nothing is on the fast node at the start
    return cost_col, lower, upper, const


def _rows(model: _Model):
    """The constraints as (row, column, value) triples and row bounds: the moves u and d at
    each boundary, the capacity in each window, and (if any) the rate limit at each boundary."""
    G, W, B = model.G, model.W, model.B
    nx, nb = G * W, G * B
    n_prev, a = model.n_prev, model.a
    rows, cols, vals, rlo, rhi = [], [], [], [], []
    r = 0
    gg = np.arange(G)
    for b in range(B):
        # u >= x[w+1] - x[w]  ->  x[w+1] - x[w] - u <= 0 ; d >= x[w] - x[w+1] -> x[w] - x[w+1] - d <= 0
        for sign, off in ((1.0, nx), (-1.0, nx + nb)):
            rid = r + gg
            rows += [rid, rid, rid]
            cols += [gg * W + b + 1, gg * W + b, off + gg * B + b]
            vals += [np.full(G, sign), np.full(G, -sign), np.full(G, -1.0)]
            rlo.append(np.full(G, -np.inf))
            rhi.append(np.zeros(G))
            r += G
    for w in range(W):  # capacity: pages of fast groups present during w (new ones: slow)
        rows.append(np.full(G, r))
        cols.append(gg * W + w)
        vals.append(n_prev[:, w].astype(np.float64))
        rlo.append(np.array([-np.inf]))
        rhi.append(np.array([float(model.capacity)]))
        r += 1
    if model.max_moves < (1 << 60):
        for b in range(B):  # rate: pages moved at a boundary <= one interval's limit
            rows += [np.full(G, r)] * 3
            cols += [nx + gg * B + b, nx + nb + gg * B + b, gg * W + b + 1]
            vals += [n_prev[:, b], n_prev[:, b], a[:, b]]
            rlo.append(np.array([-np.inf]))
            rhi.append(np.array([float(model.max_moves)]))
            r += 1
    return rows, cols, vals, rlo, rhi, r


def _colwise(rows, cols, vals, ncol: int):
    """The nonzero triples as a column-wise sparse matrix: (start, index, value)."""
    R = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    C = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    V = np.concatenate(vals) if vals else np.zeros(0)
    keep = V != 0
    R, C, V = R[keep].astype(np.int64), C[keep].astype(np.int64), V[keep]
    order = np.lexsort((R, C))
    R, C, V = R[order], C[order], V[order]
    start = np.searchsorted(C, np.arange(ncol + 1))
    return start.astype(np.int32), R.astype(np.int32), V


def _highs_lp(highspy, model: _Model, unit: float):
    """The ILP as a ``highspy.HighsLp``, with its column and row counts."""
    cost_col, lower, upper, const = _columns(model, unit)
    ncol, nx = len(cost_col), model.G * model.W
    rows, cols, vals, rlo, rhi, nrow = _rows(model)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, nrow
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost_col, lower, upper
    lp.row_lower_ = np.concatenate(rlo) if rlo else np.zeros(0)
    lp.row_upper_ = np.concatenate(rhi) if rhi else np.zeros(0)
    lp.offset_ = const
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = _colwise(rows, cols, vals, ncol)
    lp.integrality_ = ([highspy.HighsVarType.kInteger] * nx
                       + [highspy.HighsVarType.kContinuous] * (ncol - nx))
    return lp, ncol, nrow


def _run_highs(highspy, lp, seed_plan: np.ndarray | None, time_left, mip_rel_gap: float,
               threads: int):
    """Solve ``lp`` from ``seed_plan`` (if any), quietly; ``time_left()``: seconds it may take.
    Returns HiGHS's model status, its info and the column values."""
    with _no_stdout():
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("log_to_console", False)
        h.setOptionValue("time_limit", max(0.0, time_left()))
        h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
        h.setOptionValue("threads", int(threads))
        h.setOptionValue("random_seed", 0)
        h.passModel(lp)
        if seed_plan is not None:
            x = seed_plan.astype(np.float64)
            dx = np.diff(x, axis=1)
            start_sol = highspy.HighsSolution()
            start_sol.col_value = np.concatenate([x.ravel(), np.maximum(dx, 0).ravel(),
                                                  np.maximum(-dx, 0).ravel()]).tolist()
            start_sol.value_valid = True
            h.setSolution(start_sol)
        h.run()
        return (h.modelStatusToString(h.getModelStatus()), h.getInfo(),
                np.asarray(h.getSolution().col_value))


def _pick_plan(model: _Model, sol: np.ndarray, feasible_found: bool, seed_plan, seed_s: float,
               status: str):
    """The plan to keep: HiGHS's (if it found a feasible one), unless the static seed (of
    time ``seed_s``) is better; all-slow when neither exists. Returns (plan, found,
    from_seed, status)."""
    G, W = model.G, model.W
    found = feasible_found and len(sol) >= G * W
    plan = sol[:G * W].reshape(G, W) > 0.5 if found else None
    if plan is not None and not model.feasible(plan):  # rounding went wrong: do not trust it
        plan, found = None, False
    from_seed = False
    if plan is None or (seed_plan is not None and seed_s < model.objective(plan)):
        if seed_plan is not None:
            plan, from_seed = seed_plan, True
        else:  # all on the slow node is always feasible
            plan = np.zeros((G, W), bool)
            status = f"{status}, no plan found: all-slow used"
    return plan, found, from_seed, status


def solve(frames, capacity: int, cost: CostModel, *, rate_mb_s: float = 512.0,
          interval_s: float | None = None, placement: str = "slow",
          group_pages: int | None = None, max_groups: int = 256, coarsen: str = "signature",
          window: int | None = None, max_windows: int = 120, time_limit: float = 60.0,
          mip_rel_gap: float = 1e-4, threads: int = 1, seed: bool = True) -> OracleResult:
    """Solve the placement ILP for ``frames`` (see the module docstring). ``seed``: start from
    the best static placement (and keep it when HiGHS finds nothing better)."""
    try:
        import highspy
    except ImportError as e:
        raise Unavailable("the oracle needs HiGHS (highspy, a dependency of pagetier): pip install highspy") from e
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    frames = _frames_list(frames)
    t_start = time.monotonic()
    interval_s = interval_s or frame_interval_s(frames)
    max_moves = rate_pages(rate_mb_s, interval_s)
    if window is None:
        window = max(1, math.ceil(len(frames) / max(1, max_windows)))
    units = trace_units(frames)
    W = max(1, math.ceil(len(frames) / window))
    static = best_static(None, capacity, cost, placement, units=units)
    groups = make_groups(units, group_pages, max_groups, coarsen=coarsen, window=window,
                         static_fast=static.fast if seed else None)
    slow_first = placement == "slow"
    model = _model(units, groups, window, W, cost, capacity, max_moves, slow_first)
    seed_plan = _seed_plan(model, groups, static) if seed and len(groups) else None
    unit = cost.fast_s  # the objective in units of one fast access keeps HiGHS's tolerances meaningful
    lp, ncol, nrow = _highs_lp(highspy, model, unit)
    status, info, sol = _run_highs(highspy, lp, seed_plan,
                                   lambda: float(time_limit) - (time.monotonic() - t_start),
                                   mip_rel_gap, threads)
    seed_s = model.objective(seed_plan) if seed_plan is not None else math.inf
    feasible_found = int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
    plan, found, from_seed, status = _pick_plan(model, sol, feasible_found, seed_plan, seed_s,
                                                status)
    obj = model.objective(plan)  # the plan's time, recomputed (exactly the model's objective)
    gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else float("inf")
    bound = float(info.mip_dual_bound) * unit if np.isfinite(info.mip_dual_bound) else 0.0
    optimal = found and status == "Optimal" and gap <= max(mip_rel_gap, 1e-9) * 1.0001
    if status == "Optimal" and not optimal and found:
        status = f"{status}, gap above {mip_rel_gap:g}"
    if optimal:
        bound = min(bound, obj) if bound else obj
    return OracleResult(
        plan=plan, groups=groups, window=int(window), frames=len(frames), objective_s=obj,
        bound_s=min(bound, obj), optimal=optimal, status=status, gap=max(0.0, gap),
        solve_s=time.monotonic() - t_start, exact_model=slow_first, capacity=int(capacity),
        max_moves=int(max_moves), static_model_s=seed_s, from_seed=from_seed,
        info={"columns": ncol, "rows": nrow, "mip_nodes": int(info.mip_node_count),
              "seeded": seed_plan is not None},
    )


class OraclePolicy(Policy):
    """Follows an :class:`OracleResult`'s plan: at the end of the last interval of a window,
    promote the units of the next window's fast groups and demote the others' fast units.

    Not registered by name: it needs a solved plan (``OraclePolicy(result)``). It counts its
    own calls, so it must see the trace's frames in order from the first, once each.
    """

    name = "oracle"

    @dataclass
    class Config:
        pass

    def __init__(self, result: OracleResult):
        super().__init__(None)
        self.result = result
        self._calls = 0

    def decide(self, state, ctx: Context) -> Decision:
        res = self.result
        k = self._calls  # frame index of this call
        self._calls += 1
        none = np.zeros(0, np.int64)
        nxt = k + 1
        if nxt >= res.frames or nxt % res.window or not len(state):
            return Decision(promote=none, demote=none, stats={"oracle_window": k // res.window})
        want = res.plan[:, nxt // res.window]
        promote, demote = _follow(res.groups.units, want[res.groups.gid], state, ctx)
        return Decision(promote=promote, demote=demote,
                        stats={"oracle_window": nxt // res.window,
                               "fast_groups": int(want.sum())})


# ----------------------------------------------------------------------------- the yardstick
@dataclass
class Yardstick:
    """The oracle as the bench reports it: the better replay of the ILP's plan and of the best
    static placement (``source`` says which), with both replays and the ILP's answer."""

    best: SimResult
    source: str  # "ilp" or "static"
    static: SimResult
    static_plan: StaticPlan
    ilp: SimResult | None = None
    solution: OracleResult | None = None

    @property
    def gap_to_static(self) -> float:
        """The oracle's time over static placement's, minus 1 (<= 0)."""
        return self.best.est_time_s / self.static.est_time_s - 1.0 if self.static.est_time_s else 0.0

    @property
    def ilp_gap_to_static(self) -> float | None:
        if self.ilp is None or not self.static.est_time_s:
            return None
        return self.ilp.est_time_s / self.static.est_time_s - 1.0


def static_run(frames, cfg: SimConfig, units: Units | None = None) -> tuple[StaticPlan, SimResult]:
    """The best static placement for ``cfg`` and its replay in the simulator."""
    frames = _frames_list(frames)
    plan = best_static(frames, cfg.capacity, cfg.cost, cfg.placement, units=units)
    return plan, simulate(frames, StaticPolicy(plan), cfg, name="static")


def yardstick(frames, cfg: SimConfig, *, ilp: bool = True, units: Units | None = None,
              **solve_options) -> Yardstick:
    """Static placement and (``ilp``) the ILP's plan, both replayed with ``cfg``; the better
    one is the oracle. ``units``: the trace's units, if already made; ``solve_options`` go
    to :func:`solve`."""
    frames = _frames_list(frames)
    plan, st = static_run(frames, cfg, units=units)
    if not ilp:
        return Yardstick(best=st, source="static", static=st, static_plan=plan)
    sol = solve(frames, cfg.capacity, cfg.cost, rate_mb_s=cfg.rate_mb_s, interval_s=cfg.interval_s,
                placement=cfg.placement, **solve_options)
    run = simulate(frames, OraclePolicy(sol), cfg, name="oracle")
    best, source = (run, "ilp") if run.est_time_s <= st.est_time_s else (st, "static")
    return Yardstick(best=best, source=source, static=st, static_plan=plan, ilp=run, solution=sol)
