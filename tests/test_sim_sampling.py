"""bench sim on sampled traces: Bernoulli thinning of a trace's counts (policies/simulate.py
``thin``), the cost model charging the true accesses, the --sample option's errors, and the
default policy's sparse-evidence rule (policies/rules/sparse.py)."""
from __future__ import annotations

import numpy as np
import pytest

from pagetier import cli
from pagetier.policies import create
from pagetier.policies.simulate import SimConfig, parse_sample_rate, simulate, thin
from pagetier.profiler.base import Sample

PID = 77
BASE = 0x7F0000000000


def frames_of(counts: np.ndarray) -> list:
    """One frame per row of ``counts`` (reads x units), 4 KiB units, a pid."""
    n = counts.shape[1]
    addr = BASE + np.arange(n, dtype=np.uint64) * np.uint64(4096)
    return [(i, float(i), {PID: Sample(PID, addr, row.astype(np.uint32), np.full(n, -1, np.int16),
                                       np.ones(n, np.uint16))})
            for i, row in enumerate(counts)]


def all_counts(frames) -> np.ndarray:
    return np.stack([f[2][PID].count for f in frames]).astype(np.int64)


def test_thinning_is_deterministic_for_a_seed():
    fr = frames_of(np.full((6, 500), 40))
    a, b = all_counts(thin(fr, 0.1, seed=3)), all_counts(thin(fr, 0.1, seed=3))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, all_counts(thin(fr, 0.1, seed=4)))


@pytest.mark.parametrize("rate,per_count", [(0.01, 1.0), (0.001, 10.0), (0.5, 1.0)])
def test_thinning_keeps_expected_counts(rate, per_count):
    fr = frames_of(np.full((4, 20000), 50))
    got = all_counts(thin(fr, rate, seed=1, per_count=per_count))
    want = rate * 50 * per_count
    assert abs(got.mean() - want) < 0.03 * want + 0.01
    assert got.shape == (4, 20000)  # units with no sample stay, with count 0
    assert (got <= 50 * per_count).all()


def test_the_cost_model_charges_the_true_accesses():
    rng = np.random.default_rng(0)
    true = frames_of(rng.integers(0, 30, (8, 64)))
    seen = thin(true, 0.01, seed=0)
    cfg = SimConfig(capacity=16)
    full = simulate(true, "first-touch", cfg)
    sampled = simulate(seen, "first-touch", cfg, truth=true)
    assert sampled.accesses == full.accesses == int(all_counts(true).sum())
    assert sampled.access_s == pytest.approx(full.access_s)
    # without the truth, only the samples would be charged
    assert simulate(seen, "first-touch", cfg).accesses < full.accesses


@pytest.mark.parametrize("text", ["0", "2", "-1/10", "1/0", "x", "1/x", ","])
def test_bad_sample_rates_are_one_line_errors(text, capsys):
    try:
        cli.main(["bench", "sim", "synth:hotcold:pages=64,intervals=4", "--no-oracle",
                  "--sample", text])
    except SystemExit as e:
        code = e.code
    else:
        code = 0
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert "--sample" in lines[0] and "Traceback" not in err


def test_sample_rates_parse():
    assert parse_sample_rate("1/1000") == pytest.approx(0.001)
    assert parse_sample_rate("0.25") == 0.25


def test_bench_sim_prints_a_table_and_a_summary_per_rate(capsys):
    cli_args = ["bench", "sim", "synth:hotcold:pages=64,intervals=6,accesses=2000",
                "--no-oracle", "--policies", "lru,heuristic", "--sample", "1/10,1/100"]
    try:
        cli.main(cli_args)
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for label in ("1/10", "1/100"):
        assert f"sampled at {label}" in out
        assert f"sample {label}: time / static: heuristic" in out


def _steady_and_burst(reads=14):
    """Ten steady units, each sampled once every other read (five each read), and five burst
    units sampled twice each in the next-to-last read only; the last read has no samples (it
    only lets the simulator apply the decision made after the burst)."""
    counts = np.zeros((reads, 15), np.int64)
    for r in range(reads - 1):
        counts[r, (r % 2) * 5:(r % 2) * 5 + 5] = 1
    counts[reads - 2, 10:] = 2
    return frames_of(counts)


def _fast_units_after(frames, options) -> set[int]:
    pol = create("heuristic", options)
    seen = {}
    decide = pol.decide

    def watching(state, ctx):
        seen["state"] = state
        return decide(state, ctx)

    pol.decide = watching
    simulate(frames, pol, SimConfig(capacity=10))
    st = seen["state"]
    return {int((a - BASE) // 4096) for a in st.addr[st.node == 0]}


def test_sparse_rule_ranks_a_steadily_sampled_unit_above_a_one_off_burst():
    frames = _steady_and_burst()
    fast = _fast_units_after(frames, None)
    assert fast == set(range(10)), fast  # the steady units hold the fast tier
    # without the rule, one read's burst pushes steady units out
    without = _fast_units_after(frames, {"sparse": False})
    assert without & set(range(10, 15)), without


def test_sparse_rule_stays_out_of_dense_reads():
    """Every unit seen several times in every read: the rule does not engage."""
    counts = np.zeros((10, 20), np.int64)
    counts[:, :8] = 5
    counts[:, 8:] = 1
    pol = create("heuristic")
    stats = []
    decide = pol.decide

    def watching(state, ctx):
        d = decide(state, ctx)
        stats.append(d.stats)
        return d

    pol.decide = watching
    simulate(frames_of(counts), pol, SimConfig(capacity=8))
    assert stats and not any(s.get("sparse") for s in stats)


def test_sparse_rule_fills_room_from_the_sampled_region_first():
    """Two 2 MiB regions of 4 KiB units, each unit known (count 0 entries); region A's units
    are sampled now and then, region B's never but for one sample each on two units. With room
    for A's units, the unsampled units of A go to the fast node before any of B's. The weight
    is fixed here (``sparse_region_fit`` off): the fit would learn from these reads that A's
    four other units never get a sample."""
    reads, per = 12, 8
    counts = np.zeros((reads, 2 * per), np.int64)
    for r in range(reads):
        counts[r, r % 4] = 1  # four of A's eight units, in turn
    counts[3, per] = counts[7, per + 1] = 1
    n = 2 * per
    offsets = np.arange(per, dtype=np.uint64) * np.uint64(4096)
    addr = np.concatenate([BASE + offsets, BASE + np.uint64(2 << 20) + offsets])
    frames = [(i, float(i), {PID: Sample(PID, addr, row.astype(np.uint32),
                                         np.full(n, -1, np.int16), np.ones(n, np.uint16))})
              for i, row in enumerate(counts)]
    pol = create("heuristic", {"sparse_region_fit": False})
    seen = {}
    decide = pol.decide

    def watching(state, ctx):
        seen["state"] = state
        return decide(state, ctx)

    pol.decide = watching
    simulate(frames, pol, SimConfig(capacity=per))
    st = seen["state"]
    fast = set(st.addr[st.node == 0].tolist())
    assert fast == {int(a) for a in addr[:per]}, sorted(fast)


def test_dense_reads_keep_no_per_unit_evidence():
    """Reads far denser than sparse_samples (pagetier.ko's) never engage the rule: the evidence
    keeps its typical count but no per-unit counts, which would cost the daemon every interval;
    thin reads keep them."""
    from pagetier.policies.rules.sparse import SparseEvidence

    keys = np.arange(1000, dtype=np.uint64)
    dense, thin = SparseEvidence(0.9), SparseEvidence(0.9)
    for _ in range(5):
        dense.add(keys, np.full(1000, 300.0), track_below=12.0)
        thin.add(keys[:10], np.ones(10), track_below=12.0)
    assert dense.typical == 300.0 and len(dense.keys) == 0
    assert len(thin.keys) == 10 and thin.counts(keys[:1])[0] > 1


def test_the_first_reads_start_up_counts_do_not_delay_the_rule():
    """The first read counts what the program touched before it (11-129 samples a unit on the
    built-in traces thinned to 1/10,000, against 1-4 later): it is left out of the typical
    count, so reads that see each unit about once are judged sparse after SETTLE_READS more."""
    from pagetier.policies.rules.sparse import SETTLE_READS, SKIP_READS, SparseEvidence

    class C:
        sparse_samples = 1.2

    keys = np.arange(100, dtype=np.uint64)
    ev = SparseEvidence(0.9)
    ev.add(keys, np.full(100, 50.0))
    for _ in range(SETTLE_READS):
        assert not ev.sparse(C)
        ev.add(keys, np.ones(100))
    assert SKIP_READS == 1 and ev.typical == 1.0 and ev.sparse(C)
    assert ev.exposure > SETTLE_READS  # the skipped read still counts in the rates' exposure


def test_region_fit_lends_alike_regions_more_than_mixed_ones():
    """RegionFit scores each lent weight by how well the counts before a read predict where its
    samples land: in regions of alike units (each sampled now and then at the same rate) the
    region's samples predict a unit's next ones, and a large weight wins; where a few hot units
    share regions with cold ones, lending to the cold units is a bad bet, and a small one wins."""
    from pagetier.policies.rules.sparse import RegionFit, SparseEvidence

    rng = np.random.default_rng(0)
    n = 512  # four regions of 128 4 KiB units (sparse_region 128 pages)
    keys = np.arange(n, dtype=np.uint64)
    npages = np.ones(n, np.int64)
    alike = np.full(n, 0.05)
    mixed = np.where(np.arange(n) % 128 < 8, 1.0, 0.0)
    got = {}
    for name, rate in (("alike", alike), ("mixed", mixed)):
        ev, fit = SparseEvidence(0.9), RegionFit(0.9)
        for _ in range(30):
            x = rng.poisson(rate).astype(np.float64)
            fit.update(keys, ev.counts(keys), x, npages, 128)
            ev.add(keys[x > 0], x[x > 0])
        got[name] = fit.weight(8.0)
    assert got["alike"] >= 8.0 and got["mixed"] <= 1.0, got
