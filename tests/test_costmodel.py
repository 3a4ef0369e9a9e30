"""The measured cost model (policies/costmodel.py): derivation, file round trip, bad files.
The two real runs under numactl are tested in the VM (tests/guest/test_costmodel.py)."""
import json

import pytest
from click.testing import CliRunner

from pagetier.errors import ConfigError
from pagetier.policies import costmodel
from pagetier.policies.simulate import PRESETS, cost_model


def _measured(fast, slow):
    return {"command": "x", "fast_node": 0, "slow_node": 1, "cpu_node": 0,
            "runs_fast_s": fast, "runs_slow_s": slow}


def test_derive_scales_counts_to_the_trace_duration_and_the_run_ratio():
    cost, clamped = costmodel.derive(_measured([2.2, 2.0], [3.1, 3.0]), counts=1000, seconds=10.0,
                                     base=PRESETS["dram-pmem"])
    assert not clamped
    assert cost.fast_ns == pytest.approx(10.0 / 1000 * 1e9)
    assert cost.slow_ns / cost.fast_ns == pytest.approx(1.5)  # best runs: 3.0 / 2.0
    assert cost.migrate_mb_s == PRESETS["dram-pmem"].migrate_mb_s  # migration from the preset
    assert cost.accesses_per_count == 1.0


def test_derive_clamps_a_slow_node_that_was_not_slower():
    cost, clamped = costmodel.derive(_measured([2.0], [1.9]), 100, 1.0, PRESETS["dram-cxl"])
    assert clamped and cost.slow_ns == cost.fast_ns


def test_cost_file_round_trip_and_overrides(tmp_path):
    cost, _ = costmodel.derive(_measured([1.0], [2.0]), 100, 1.0, PRESETS["dram-cxl"])
    path = tmp_path / "cost.json"
    costmodel.save(path, cost, _measured([1.0], [2.0]), {"trace": "t"})
    back = cost_model(base_file=path, migrate_us=5.0)
    assert back.slow_ns == pytest.approx(cost.slow_ns) and back.migrate_us == 5.0


@pytest.mark.parametrize("text, match", [
    ("not json", "not a JSON cost file"),
    ('{"format": 1}', "not a cost file"),
    ('{"format": 1, "cost": {"fast_ns": 1, "bogus": 2}}', "unknown cost field"),
    ('{"format": 1, "cost": {"fast_ns": -1}}', "fast_ns must be > 0"),
])
def test_bad_cost_files_are_one_line_errors(tmp_path, text, match):
    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        costmodel.load(path)


def test_bench_sim_reads_a_cost_file(tmp_path):
    from pagetier.cli.bench import command as bench

    cost, _ = costmodel.derive(_measured([1.0], [3.0]), 100, 1.0, PRESETS["dram-cxl"])
    path = tmp_path / "cost.json"
    costmodel.save(path, cost, _measured([1.0], [3.0]), {})
    res = CliRunner().invoke(bench, ["sim", "synth:hotcold:pages=128,intervals=4,accesses=2000",
                                     "--capacity", "25%", "--policies", "first-touch",
                                     "--no-oracle", "--cost-file", str(path), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["preset"] == "measured"
    # first touch on the slow node, never moved: every access at the slow time, 3x all-fast
    assert doc["runs"][0]["slowdown"] == pytest.approx(3.0)
