"""The oracle: offline optimal placement for a recorded trace, after AutoTM (ASPLOS'20).

Not a live policy (it needs the future): :func:`solve` builds an integer linear program over
windows x page groups and solves it with HiGHS (``highspy``, the ``ilp`` extra);
:class:`OraclePolicy` replays the plan through the Policy interface, so the simulator runs it
like any other policy and every policy can be reported as a distance to it.

The model uses the simulator's rules (policies/simulate.py), so that with one unit per group
and first touch on the slow node the ILP objective is exactly the simulated time of the plan:

- units are coarsened into groups: runs of ``group_pages`` pages of consecutive touched units
  of one target (contiguous address chunks); a group is on the fast node or on the slow node
  as a whole;
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
  limit of one interval (the daemon's limit), so the daemon's clipping never cuts the plan.

Large traces: ``max_groups`` and ``max_windows`` bound the problem size and ``time_limit``
the solve; ``OracleResult.optimal`` is False (and ``status`` says why) when HiGHS stopped at
the time limit or with a gap above ``mip_rel_gap``: then the plan is the best one found, and
``bound_s`` is a lower bound on the optimum of the coarsened model.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from pagetier.daemon.mover import rate_pages
from pagetier.errors import ConfigError, Unavailable
from pagetier.policies.base import Context, Decision, Policy
from pagetier.policies.simulate import PLACEMENTS, CostModel, frame_interval_s


@dataclass
class Groups:
    """Units of a trace, per target pid: sorted addresses, pages and group ids."""

    pids: list  # sorted pids
    addr: dict  # pid -> sorted uint64 addresses
    gid: dict  # pid -> int64 group of each address
    npages: np.ndarray  # pages per group (all units ever seen)
    group_pages: int

    def __len__(self) -> int:
        return len(self.npages)

    def lookup(self, pid: int, addr: np.ndarray) -> np.ndarray:
        """Group of each (pid, addr); -1 for units the trace never showed."""
        out = np.full(len(addr), -1, np.int64)
        a = self.addr.get(int(pid))
        if a is None or not len(a):
            return out
        addr = np.asarray(addr, np.uint64)
        pos = np.minimum(np.searchsorted(a, addr), len(a) - 1)
        hit = a[pos] == addr
        out[hit] = self.gid[int(pid)][pos[hit]]
        return out


def make_groups(frames, group_pages: int | None = None, max_groups: int = 256) -> Groups:
    """Coarsen the trace's units into contiguous address chunks of ``group_pages`` pages."""
    units: dict[int, dict[int, int]] = {}
    for _, _, samples in frames:
        for pid, s in samples.items():
            d = units.setdefault(int(pid), {})
            d.update(zip(s.addr.tolist(), s.npages.tolist()))
    total = sum(sum(d.values()) for d in units.values())
    if group_pages is None:
        group_pages = max(1, math.ceil(total / max(1, max_groups)))
    addr, gid, sizes = {}, {}, []
    for pid in sorted(units):
        a = np.array(sorted(units[pid]), np.uint64)
        n = np.array([units[pid][x] for x in a.tolist()], np.int64)
        before = np.cumsum(n) - n
        g = before // group_pages
        _, g = np.unique(g, return_inverse=True)  # dense ids (huge units may skip some)
        g = g.astype(np.int64) + len(sizes)
        sizes.extend(np.bincount(g - len(sizes), weights=n).astype(np.int64).tolist())
        addr[pid], gid[pid] = a, g
    return Groups(sorted(units), addr, gid, np.array(sizes, np.int64), int(group_pages))


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
    info: dict = field(default_factory=dict)

    def describe(self) -> str:
        kind = "optimal" if self.optimal else f"bounded ({self.status}, gap {self.gap:.1%})"
        return (f"oracle {kind}: {len(self.groups)} groups of {self.groups.group_pages} pages, "
                f"{self.plan.shape[1]} windows of {self.window} intervals, "
                f"{self.objective_s:.4g} s (bound {self.bound_s:.4g} s), solved in {self.solve_s:.1f} s")


def _tables(frames, groups: Groups, window: int):
    """Per group and window: counts of units seen before (c_old) and first seen in (c_new)
    the window, pages seen before (n_prev) and first seen in (a) the window."""
    G = len(groups)
    W = max(1, math.ceil(len(frames) / window))
    c_old = np.zeros((G, W))
    c_new = np.zeros((G, W))
    a = np.zeros((G, W))
    seen = {pid: np.full(len(groups.addr[pid]), -1, np.int64) for pid in groups.pids}
    for k, (_, _, samples) in enumerate(frames):
        w = k // window
        for pid, s in samples.items():
            pid = int(pid)
            addr = np.asarray(s.addr, np.uint64)
            pos = np.searchsorted(groups.addr[pid], addr)
            g = groups.gid[pid][pos]
            first = seen[pid][pos]
            new = first < 0
            seen[pid][pos[new]] = w
            first = np.where(new, w, first)
            cnt = np.asarray(s.count, np.float64)
            fresh = first == w
            np.add.at(c_new[:, w], g[fresh], cnt[fresh])
            np.add.at(c_old[:, w], g[~fresh], cnt[~fresh])
            np.add.at(a[:, w], g[new], np.asarray(s.npages, np.float64)[new])
    n_prev = np.cumsum(a, axis=1) - a
    return c_old, c_new, n_prev, a


def solve(frames, capacity: int, cost: CostModel, *, rate_mb_s: float = 512.0,
          interval_s: float | None = None, placement: str = "slow",
          group_pages: int | None = None, max_groups: int = 256, window: int | None = None,
          max_windows: int = 120, time_limit: float = 60.0, mip_rel_gap: float = 1e-4,
          threads: int = 1) -> OracleResult:
    """Solve the placement ILP for ``frames`` (see the module docstring)."""
    try:
        import highspy
    except ImportError as e:
        raise Unavailable("the oracle needs HiGHS: pip install 'pagetier[ilp]' (highspy)") from e
    if placement not in PLACEMENTS:
        raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if hasattr(frames, "intervals"):
        frames = frames.intervals()
    frames = list(frames)
    t_start = time.monotonic()
    interval_s = interval_s or frame_interval_s(frames)
    max_moves = rate_pages(rate_mb_s, interval_s)
    if window is None:
        window = max(1, math.ceil(len(frames) / max(1, max_windows)))
    groups = make_groups(frames, group_pages, max_groups)
    c_old, c_new, n_prev, a = _tables(frames, groups, window)
    G, W = c_old.shape
    slow_first = placement == "slow"
    f, s, m = cost.fast_s, cost.slow_s, cost.page_move_s
    unit = f  # the objective in units of one fast access keeps HiGHS's tolerances meaningful
    if not slow_first:  # new units placed with their group, free
        c_old, c_new = c_old + c_new, np.zeros_like(c_new)
        n_prev, a = n_prev + a, np.zeros_like(a)
    N = n_prev + a  # pages present at the end of each window

    # columns: x[g, w] (G*W), then u[g, b], d[g, b] for boundaries b = w -> w+1 (G*(W-1) each)
    B = W - 1
    nx, nb = G * W, G * B
    ix = lambda g, w: g * W + w  # noqa: E731
    ncol = nx + 2 * nb
    cost_col = np.zeros(ncol)
    cost_col[:nx] = ((f - s) * c_old).ravel() / unit
    # new units joining a fast group at the next window are migrated
    cost_col[:nx].reshape(G, W)[:, 1:] += m * a[:, :-1] / unit
    mig = (m * n_prev[:, :B] / unit).ravel() if B else np.zeros(0)
    cost_col[nx:nx + nb] = mig
    cost_col[nx + nb:] = mig
    const = float((s * c_old).sum() + (s * c_new).sum()) / unit
    lower = np.zeros(ncol)
    upper = np.full(ncol, np.inf)
    upper[:nx] = 1.0
    if slow_first:
        upper[[ix(g, 0) for g in range(G)]] = 0.0  # nothing is on the fast node at the start

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
        size = n_prev[:, w]
        rows.append(np.full(G, r))
        cols.append(gg * W + w)
        vals.append(size.astype(np.float64))
        rlo.append(np.array([-np.inf]))
        rhi.append(np.array([float(capacity)]))
        r += 1
    if max_moves < (1 << 60):
        for b in range(B):  # rate: pages moved at a boundary <= one interval's limit
            rows += [np.full(G, r)] * 3
            cols += [nx + gg * B + b, nx + nb + gg * B + b, gg * W + b + 1]
            vals += [n_prev[:, b], n_prev[:, b], a[:, b]]
            rlo.append(np.array([-np.inf]))
            rhi.append(np.array([float(max_moves)]))
            r += 1
    R = np.concatenate(rows) if rows else np.zeros(0, np.int64)
    C = np.concatenate(cols) if cols else np.zeros(0, np.int64)
    V = np.concatenate(vals) if vals else np.zeros(0)
    keep = V != 0
    R, C, V = R[keep].astype(np.int64), C[keep].astype(np.int64), V[keep]
    order = np.lexsort((R, C))
    R, C, V = R[order], C[order], V[order]
    start = np.searchsorted(C, np.arange(ncol + 1))

    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, r
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = cost_col, lower, upper
    lp.row_lower_ = np.concatenate(rlo) if rlo else np.zeros(0)
    lp.row_upper_ = np.concatenate(rhi) if rhi else np.zeros(0)
    lp.offset_ = const
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = start.astype(np.int32)
    lp.a_matrix_.index_ = R.astype(np.int32)
    lp.a_matrix_.value_ = V
    lp.integrality_ = [highspy.HighsVarType.kInteger] * nx + [highspy.HighsVarType.kContinuous] * (2 * nb)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", float(mip_rel_gap))
    h.setOptionValue("threads", int(threads))
    h.setOptionValue("random_seed", 0)
    h.passModel(lp)
    h.run()
    status = h.modelStatusToString(h.getModelStatus())
    info = h.getInfo()
    sol = np.asarray(h.getSolution().col_value)
    found = len(sol) >= nx and int(info.primal_solution_status) == 2  # kSolutionStatusFeasible
    if found:
        plan = sol[:nx].reshape(G, W) > 0.5
    else:  # all on the slow node is always feasible
        plan = np.zeros((G, W), bool)
        status = f"{status}, no plan found: all-slow used"
    # the plan's time, recomputed from the rounded solution (exactly the model's objective)
    x = plan.astype(np.float64)
    moved = (n_prev[:, :B] * np.abs(np.diff(x, axis=1))).sum() + (a[:, :B] * x[:, 1:]).sum()
    obj = float((s * c_old).sum() + ((f - s) * c_old * x).sum() + (s * c_new).sum() + m * moved)
    gap = float(info.mip_gap) if np.isfinite(info.mip_gap) else float("inf")
    bound = float(info.mip_dual_bound) * unit if np.isfinite(info.mip_dual_bound) else 0.0
    optimal = found and status == "Optimal" and gap <= max(mip_rel_gap, 1e-9) * 1.0001
    if status == "Optimal" and not optimal:
        status = f"{status}, gap above {mip_rel_gap:g}"
    if optimal:
        bound = min(bound, obj) if bound else obj
    return OracleResult(
        plan=plan, groups=groups, window=int(window), frames=len(frames), objective_s=obj,
        bound_s=min(bound, obj), optimal=optimal, status=status, gap=max(0.0, gap),
        solve_s=time.monotonic() - t_start, exact_model=slow_first, capacity=int(capacity),
        max_moves=int(max_moves),
        info={"columns": ncol, "rows": r, "mip_nodes": int(info.mip_node_count)},
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
        gid = np.full(len(state), -1, np.int64)
        pids = state.pid_of(np.arange(len(state)))
        for pid in np.unique(pids).tolist():
            sel = np.flatnonzero(pids == pid)
            gid[sel] = res.groups.lookup(pid, state.addr[sel])
        desired = np.zeros(len(state), bool)
        desired[gid >= 0] = want[gid[gid >= 0]]
        fast = state.node == ctx.fast_node
        promote = np.flatnonzero(desired & ~fast & (state.node >= 0))
        demote = np.flatnonzero(~desired & fast)
        return Decision(promote=promote, demote=demote,
                        stats={"oracle_window": nxt // res.window,
                               "fast_groups": int(want.sum())})
