"""The rl policy: gymnasium environment, training, model files, budget and rate invariants."""
import warnings

import numpy as np
import pytest

gym = pytest.importorskip("gymnasium")

from pagetier.errors import ConfigError  # noqa: E402
from pagetier.policies import create, rl, synth  # noqa: E402
from pagetier.policies.base import Context  # noqa: E402
from pagetier.policies.simulate import SimConfig, cost_model, simulate  # noqa: E402
from pagetier.core.state import PageState  # noqa: E402
from pagetier.profiler.base import Sample  # noqa: E402

COST = cost_model("dram-cxl")


def traces(seeds=(1,), patterns=("hotcold", "scan"), pages=256, intervals=16):
    return [synth.generate(p, pages=pages, intervals=intervals, accesses=10000, seed=s)
            for p in patterns for s in seeds]


def test_env_passes_gymnasium_checker():
    from gymnasium.utils.env_checker import check_env

    env = rl.TraceEnv(traces(), capacities=(0.25,), cost=COST, n_chunks=8, history=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unbounded observation space: a warning, not an error
        check_env(env, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (8 * 5,)
    obs, reward, term, trunc, info = env.step(np.linspace(1, -1, 8))
    assert reward < 0 and not trunc and info["fast_pages"] <= 0.25 * 256 + 1e-6


def test_chunk_moves_respect_capacity_and_rate():
    rng = np.random.default_rng(0)
    for _ in range(200):
        present = rng.integers(0, 20, 8).astype(float)
        fast = np.minimum(present, rng.integers(0, 10, 8))
        cap = float(rng.integers(0, 60))
        rate = float(rng.integers(1, 30))
        f, moved = rl.chunk_moves(rng.normal(size=8), present, fast, cap, rate)
        assert moved <= rate + 1e-9
        assert np.abs(f - fast).sum() <= moved + 1e-9
        assert (f >= -1e-9).all() and (f <= present + 1e-9).all()
        assert f.sum() <= max(cap, fast.sum()) + 1e-9


def test_tiny_training_beats_random_and_model_round_trips(tmp_path):
    tr = traces(seeds=(1, 2))
    model, curve = rl.train(tr, capacities=(0.25,), cost=COST, epochs=4, population=8,
                            n_chunks=8, history=3, hidden=4, seed=0)
    assert curve[-1] <= curve[0]
    env = rl.TraceEnv(tr, capacities=(0.25,), cost=COST, n_chunks=8, history=3)
    episodes = [(i, 0.25) for i in range(len(tr))]
    rng = np.random.default_rng(1)
    random_fit = np.mean([rl.evaluate(env, rl.Model(3, 8, 4, rng.normal(0, 0.5, model.params.shape)),
                                      episodes) for _ in range(4)])
    assert rl.evaluate(env, model, episodes) < random_fit
    path = tmp_path / "m.npz"
    model.save(path)
    back = rl.Model.load(path)
    assert (back.history, back.n_chunks, back.hidden) == (3, 8, 4)
    np.testing.assert_array_equal(back.params, model.params)
    pol = create("rl", {"model": str(path)})
    res = simulate(tr[0], pol, SimConfig(capacity=64, cost=COST))
    assert res.max_fast_pages <= 64 and res.slowdown < COST.slow_ns / COST.fast_ns


def test_bad_model_files_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="required"):
        create("rl", {})
    with pytest.raises(ConfigError, match="no such model"):
        create("rl", {"model": str(tmp_path / "missing.npz")})
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="not a pagetier rl model"):
        create("rl", {"model": str(bad)})


@pytest.mark.parametrize("budget,max_moves", [(0, 100), (10, 3), (40, 7), (1000, 1)])
def test_rl_policy_obeys_budget_and_rate(budget, max_moves):
    rng = np.random.default_rng(budget)
    model = rl.Model(3, 8, 4, rng.normal(0, 1, rl.Model.n_params(3, 4)))
    pol = rl.RLPolicy(model=model)
    st = PageState()
    n = 120
    addr = (0x10000 + 0x1000 * np.arange(n)).astype(np.uint64)
    node = np.where(rng.random(n) < 0.4, 0, 1).astype(np.int16)
    npages = np.where(rng.random(n) < 0.05, 4, 1).astype(np.uint16)
    for i in range(5):
        st.begin_interval()
        st.update(Sample(pid=1, addr=addr, count=rng.integers(0, 50, n).astype(np.uint32),
                         node=node, npages=npages))
        used = st.pages_on(0)
        dec = pol.decide(st, Context(fast_budget=budget, max_moves=max_moves, interval=i + 1))
        p, d = dec.promote, dec.demote
        moved = int(st.npages[p].sum()) + int(st.npages[d].sum())
        assert moved <= max_moves
        assert (st.node[p] == 1).all() and (st.node[d] == 0).all()
        assert not np.intersect1d(p, d).size
        after = used + int(st.npages[p].sum()) - int(st.npages[d].sum())
        assert after <= max(budget, used - int(st.npages[d].sum()))
        st.record_moves(d, 1)
        st.record_moves(p, 0)
        node = st.node.astype(np.int16)


def test_train_rl_cli(tmp_path):
    from click.testing import CliRunner

    from pagetier.cli.train_rl import command as train_rl

    out = tmp_path / "model.npz"
    res = CliRunner().invoke(train_rl, ["synth:hotcold:pages=128,intervals=8,accesses=2000",
                                        "-o", str(out), "--epochs", "2", "--population", "4",
                                        "--chunks", "4", "--budget", "25%"])
    assert res.exit_code == 0, res.output
    assert rl.Model.load(out).n_chunks == 4
