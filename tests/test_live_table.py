"""bench live's figures: metrics of one run, ratios against no migration, the table."""
from pagetier import live_bench, live_table


def _ticks(fractions, phase_s=0, rate=1000.0):
    return [{"t": float(i + 1), "phase": i // phase_s if phase_s else 0,
             "access_fast_fraction": f, "fast_fraction": f, "accesses_per_s": rate}
            for i, f in enumerate(fractions)]


def _samples(n, pgmigrate=0, moved=0, pp=0, fast_mb=0.0, cpu=None):
    return [{"t": float(i + 1), "fast_mb": fast_mb, "moved_pages": moved, "ping_pongs": pp,
             "pgmigrate": pgmigrate, "mgr_cpu_s": cpu, "prof_cpu_s": None} for i in range(n)]


def test_time_to_hot_per_phase():
    # phase 0: reaches 90% at t=3; phase 1 (starts at t=4): at t=6; phase 2 (t=8): never
    ticks = _ticks([0.1, 0.5, 0.95, 0.99, 0.2, 0.92, 0.99, 0.1, 0.3], phase_s=4)
    assert live_table.time_to_hot(ticks, 4) == [3.0, 2.0, None]
    assert live_table.time_to_hot(ticks[:2], 4) == [None]
    assert live_table.time_to_hot([], 4) == []


def test_summary_and_ratios():
    none = {"config": "none", "phase_s": 0, "ticks": _ticks([0.2] * 10, rate=1000.0),
            "samples": _samples(10)}
    pt = {"config": "pagetier:heuristic", "phase_s": 0,
          "ticks": _ticks([0.2, 0.6] + [1.0] * 8, rate=900.0),
          "samples": _samples(10, pgmigrate=256 * 64, moved=256 * 64, pp=3, fast_mb=64.0, cpu=1.5)}
    skipped = {"config": "damos", "runnable": False, "reason": "no DAMON sysfs interface"}
    rows = live_table.add_ratios([live_table.summarize(r) for r in (none, pt, skipped)])
    by = {r["config"]: r for r in rows}
    p = by["pagetier:heuristic"]
    assert abs(p["fast_access"] - 0.88) < 1e-9
    assert abs(p["fast_access_vs_none"] - 0.88 / 0.2) < 1e-9
    assert abs(p["accesses_vs_none"] - 0.9) < 1e-9
    assert p["migrated_mb"] == 64.0 and p["ping_pongs"] == 3 and p["peak_fast_mb"] == 64.0
    assert p["time_to_hot"] == [3.0] and p["fast_access_end"] == 1.0
    assert by["none"]["fast_access_vs_none"] == 1.0
    table = live_table.format_table(rows)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["config", "fast", "acc"]
    assert any(ln.startswith("pagetier:heuristic") and "88.0%" in ln and "4.40" in ln for ln in lines)
    assert "  damos: no DAMON sysfs interface" in lines  # not runnable: listed with its reason
    assert "n/a" in next(ln for ln in lines if ln.startswith("none"))  # no CPU figure for none


def test_zero_baseline_has_no_ratio():
    none = {"config": "none", "ticks": _ticks([0.0] * 5), "samples": _samples(5)}
    k = {"config": "kernel", "ticks": _ticks([0.5] * 5), "samples": _samples(5)}
    rows = live_table.add_ratios([live_table.summarize(r) for r in (none, k)])
    assert rows[1]["fast_access_vs_none"] is None
    assert " n/a " in live_table.format_table(rows).splitlines()[2]


def test_series_in_five_second_steps():
    rows = [live_table.summarize({"config": "none", "ticks": _ticks([0.0] * 5 + [1.0] * 5),
                                  "samples": _samples(10)})]
    out = live_table.format_series(rows).splitlines()
    assert out[1].split() == ["none", "0", "100"]


def test_config_names_check_policies():
    import pytest

    from pagetier.errors import ConfigError

    assert live_bench.config_names("heuristic,lru") == ["none", "pagetier:heuristic",
                                                        "pagetier:lru", "kernel", "damos"]
    assert live_bench.config_names("") == ["none", "kernel", "damos"]
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        live_bench.config_names("nope")
