"""The ILP oracle against brute force on tiny instances, and its replay in the simulator."""
import itertools

import numpy as np
import pytest

pytest.importorskip("highspy")

from pagetier.policies import oracle, synth  # noqa: E402
from pagetier.policies.simulate import SimConfig, cost_model, simulate  # noqa: E402
from pagetier.profiler.base import Sample  # noqa: E402

COST = cost_model("dram-cxl", fast_ns=100, slow_ns=300, migrate_us=1.0, migrate_mb_s=4096)
ONE_PAGE_PER_S = 4096 / (1 << 20)  # MB/s giving a rate limit of one page per 1 s interval


def frames_of(counts, pid=7):
    out = []
    for t, row in enumerate(counts):
        row = np.asarray(row)
        sel = np.flatnonzero(row)
        s = Sample(pid=pid, addr=(0x1000 * (sel + 1)).astype(np.uint64),
                   count=row[sel].astype(np.uint32), node=np.full(len(sel), -1, np.int16),
                   npages=np.ones(len(sel), np.uint16), complete=False)
        out.append((t, float(t), {pid: s}))
    return out


def brute_force(counts, capacity, max_moves):
    """Every placement per interval enumerated: pages first touched on the slow node; during
    interval t a page may be fast only if it was touched before t."""
    counts = np.asarray(counts, float)
    T, P = counts.shape
    first = np.array([np.flatnonzero(counts[:, i])[0] for i in range(P)])
    f, s, m = COST.fast_s, COST.slow_s, COST.page_move_s
    options = []
    for t in range(T):
        exist = [i for i in range(P) if first[i] < t]
        subs = [frozenset(c) for k in range(len(exist) + 1) for c in itertools.combinations(exist, k)
                if k <= capacity]
        options.append(subs)
    best = np.inf
    for seq in itertools.product(*options):
        moved_ok, total = True, 0.0
        for t, fast in enumerate(seq):
            total += sum(counts[t, i] * (f if i in fast else s) for i in range(P))
            if t:
                moved = len(fast ^ seq[t - 1])
                if moved > max_moves:
                    moved_ok = False
                    break
                total += moved * m
        if moved_ok:
            best = min(best, total)
    return best


CASES = [
    # (counts per interval x page, capacity, rate MB/s)
    ([[50, 1, 1], [50, 1, 1], [1, 60, 1], [1, 60, 40]], 1, 0.0),
    ([[50, 1, 1], [50, 1, 1], [1, 60, 1], [1, 60, 40]], 2, ONE_PAGE_PER_S),
    ([[5, 0, 0], [30, 30, 0], [0, 30, 30], [30, 0, 30], [2, 2, 2]], 2, 0.0),
    ([[1, 1, 1], [100, 0, 0], [0, 100, 0], [0, 0, 100], [100, 0, 0]], 1, ONE_PAGE_PER_S),
    ([[3, 3, 3], [2, 9, 1], [9, 2, 1], [1, 1, 1]], 3, 0.0),  # moves that do not pay off
]


@pytest.mark.parametrize("counts,capacity,rate", CASES)
def test_oracle_matches_brute_force_and_its_replay(counts, capacity, rate):
    fr = frames_of(counts)
    res = oracle.solve(fr, capacity, COST, rate_mb_s=rate, group_pages=1, window=1,
                       time_limit=20)
    max_moves = 1 if rate else 10**9
    assert res.optimal and res.exact_model
    assert res.objective_s == pytest.approx(brute_force(counts, capacity, max_moves), rel=1e-9)
    sim = simulate(fr, oracle.OraclePolicy(res), SimConfig(capacity=capacity, cost=COST,
                                                           rate_mb_s=rate))
    assert sim.est_time_s == pytest.approx(res.objective_s, rel=1e-9)
    assert sim.clipped == 0


def test_oracle_is_a_lower_bound_for_policies():
    fr = synth.generate("phased", pages=128, intervals=16, accesses=4000, phase=5, seed=3)
    cfg = SimConfig(capacity=32, cost=COST)
    res = oracle.solve(fr, 32, COST, group_pages=1, time_limit=20)
    assert res.optimal
    best = simulate(fr, oracle.OraclePolicy(res), cfg).est_time_s
    for p in ("first-touch", "lru", "heat-classes", "heuristic"):
        assert simulate(fr, p, cfg).est_time_s >= best * (1 - 1e-9)


def test_groups_and_windows_coarsen_and_bounded_answers_say_so():
    fr = synth.generate("zipf", pages=1000, intervals=30, accesses=20000, seed=2)
    res = oracle.solve(fr, 250, COST, max_groups=50, max_windows=10, time_limit=20)
    assert len(res.groups) == 50 and res.groups.group_pages == 20
    assert res.plan.shape == (50, 10) and res.window == 3
    assert (res.plan.astype(int) * res.groups.npages[:, None]).sum(axis=0).max() <= 250
    sim = simulate(fr, oracle.OraclePolicy(res), SimConfig(capacity=250, cost=COST))
    assert sim.est_time_s == pytest.approx(res.objective_s, rel=1e-9)
    quick = oracle.solve(fr, 250, COST, group_pages=1, time_limit=0.01)
    assert not quick.optimal and "optimal" not in quick.describe().split(":")[0]
    assert "bounded" in quick.describe()
    assert quick.bound_s <= quick.objective_s


def test_fast_first_is_marked_approximate():
    fr = frames_of([[5, 5], [5, 5]])
    res = oracle.solve(fr, 1, COST, placement="fast-first", group_pages=1)
    assert not res.exact_model
