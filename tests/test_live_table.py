"""bench live's figures: metrics of one run, ratios against kernel tiering, the tables; and the
scenario table the command builds its runs from."""
import json

import pytest
from click.testing import CliRunner

from pagetier.bench import live as live_bench, live_table
from pagetier.cli.bench import bench_live
from pagetier.errors import ConfigError


def _ticks(hot_share, phase_s=0, rate=1000.0, access=None):
    return [{"t": float(i + 1), "phase": int((i + 1 - 1e-9) // phase_s) if phase_s else 0,
             "fast_fraction": f, "access_fast_fraction": f if access is None else access[i],
             "accesses_per_s": rate}
            for i, f in enumerate(hot_share)]


def _samples(n, pgmigrate=0, moved=0, pp=0, fast_mb=0.0, cpu=None):
    return [{"t": float(i + 1), "fast_mb": fast_mb, "moved_pages": moved, "ping_pongs": pp,
             "pgmigrate": pgmigrate, "mgr_cpu_s": cpu, "prof_cpu_s": None} for i in range(n)]


def _rec(config, shares, scenario="noise100", phase_s=0, moved_mb=0.0, pp=0, rate=1000.0,
         cpu=None, hot_mb=64):
    pages = int(moved_mb * 256)
    return {"scenario": scenario, "config": config, "phase_s": phase_s, "hot_mb": hot_mb,
            "ticks": _ticks(shares, phase_s, rate),
            "samples": _samples(len(shares), pgmigrate=pages, moved=pages, pp=pp, cpu=cpu),
            "vmstat": {"pgmigrate_success": pages}}


def test_time_to_95_per_phase():
    # phases of 4 s: phase 0 (ticks 1-4) gets there at t=3; phase 1 (5-8) at t=6, 2 s after
    # its start; phase 2 (9-) never
    ticks = _ticks([0.1, 0.5, 0.96, 0.99, 0.2, 0.97, 0.99, 0.99, 0.1, 0.3], phase_s=4)
    assert [t["phase"] for t in ticks] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert live_table.time_to_hot(ticks, 4) == [3.0, 2.0, None]
    assert live_table.time_to_hot(ticks[:2], 4) == [None]
    assert live_table.time_to_hot([], 4) == []
    # a late tick: the hot part moved at t=4.6 (the last tick of phase 0), not at 4
    late = _ticks([0.1, 0.5, 0.96, 0.99, 0.2, 0.97], phase_s=4)
    late[3]["t"], late[4]["t"], late[5]["t"] = 4.6, 5.6, 6.6
    late[3]["phase"] = 0
    assert live_table.time_to_hot(late, 4) == [3.0, 2.0]
    # 0.94 is not 95%; an unknown share (-1 from the workload) is not reached either
    assert live_table.time_to_hot(_ticks([0.94, -1.0, 0.95]), 0) == [3.0]


def test_held_is_the_last_third_of_each_phase():
    # one phase of 9 s: the last third is t >= 6: ticks 6..9
    ticks = _ticks([1.0] * 5 + [0.8, 0.6, 0.4, 0.2])
    assert abs(live_table.held_share(ticks, 0) - 0.5) < 1e-9
    # two phases of 6 s: each phase's last third (t >= 4, t >= 10), then their mean
    ticks = _ticks([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5], phase_s=6)
    assert abs(live_table.held_share(ticks, 6) - 0.75) < 1e-9
    assert live_table.held_share([], 0) is None
    assert live_table.held_share(_ticks([-1.0, -1.0, -1.0]), 0) is None  # never known: no figure


def test_ratios_to_kernel_tiering_per_scenario():
    recs = [
        _rec("kernel", [0.5, 0.97, 1.0, 1.0, 1.0, 1.0], moved_mb=80.0, cpu=0.5),
        _rec("pagetier:heuristic", [0.2, 0.6, 0.96, 0.9, 0.9, 0.9], moved_mb=200.0, pp=512,
             rate=900.0, cpu=2.0),
        _rec("none", [0.0] * 6),
        {"scenario": "noise100", "config": "damos", "runnable": False,
         "reason": "no DAMON sysfs interface"},
    ]
    rows = live_table.add_ratios([live_table.summarize(r) for r in recs])
    by = {r["config"]: r for r in rows}
    k, p, n = by["kernel"], by["pagetier:heuristic"], by["none"]
    assert k["t95"] == 2.0 and k["t95_x"] == 1.0 and k["held_d"] == 0.0 and k["moved_x"] == 1.0
    assert p["t95"] == 3.0 and p["t95_x"] == 1.5
    assert abs(p["held"] - 0.9) < 1e-9 and abs(p["held_d"] - (-0.1)) < 1e-9
    assert p["moved_mb"] == 200.0 and p["moved_x"] == 2.5 and p["moved_per_hot"] == 200.0 / 64
    assert abs(p["accesses_x"] - 0.9) < 1e-9 and p["ping_pongs"] == 512 and p["reached"] == "1/1"
    assert n["t95"] is None and n["t95_x"] is None and n["reached"] == "0/1"
    assert n["held_d"] == -1.0 and n["moved_x"] == 0.0

    table = live_table.format_table(rows).splitlines()
    assert table[0].split()[:4] == ["scenario", "config", "t95", "s"]
    prow = next(ln for ln in table if "pagetier:heuristic" in ln).split()
    # t95 3.0 s, 1.50 x kernel, 1/1 phases; held 90.0%, -10 points; 200 MB moved, 2.50 x kernel,
    # 3.1 x the hot set; 512 ping-pongs; 2.00 CPU s; 0.90 x kernel's accesses/s
    assert prow == ["noise100", "pagetier:heuristic", "3.0", "1.50", "1/1", "90.0", "-10",
                    "200.0", "2.50", "3.1", "512", "2.00", "0.90"]
    nrow = next(ln for ln in table if ln.startswith("noise100") and " none " in ln).split()
    assert nrow[2:5] == ["--", "--", "0/1"] and nrow[-2] == "n/a"  # not reached; no CPU figure
    assert "  noise100 damos: no DAMON sysfs interface" in table  # listed with its reason


def test_ratios_stay_within_a_scenario_and_missing_baseline_gives_none():
    recs = [_rec("kernel", [1.0] * 3, scenario="a", moved_mb=10.0),
            _rec("pagetier:heuristic", [1.0] * 3, scenario="a", moved_mb=20.0),
            _rec("pagetier:heuristic", [1.0] * 3, scenario="b", moved_mb=30.0)]
    rows = live_table.add_ratios([live_table.summarize(r) for r in recs])
    assert rows[1]["moved_x"] == 2.0
    assert rows[2]["moved_x"] is None and rows[2]["t95_x"] is None and rows[2]["held_d"] is None
    # kernel moved nothing: no ratio (not a division by zero)
    rows = live_table.add_ratios([live_table.summarize(_rec("kernel", [0.0] * 3)),
                                  live_table.summarize(_rec("none", [0.0] * 3, moved_mb=1.0))])
    assert rows[1]["moved_x"] is None
    lines = live_table.format_table(rows).splitlines()
    assert lines[2].split()[8] == "--"


def test_moved_counts_the_counter_at_the_end_not_the_last_sample():
    rec = _rec("pagetier:heuristic", [1.0] * 3, moved_mb=10.0)
    rec["vmstat"]["pgmigrate_success"] = 40 * 256  # a batch that landed after the last sample
    assert live_table.summarize(rec)["moved_mb"] == 40.0
    del rec["vmstat"]
    assert live_table.summarize(rec)["moved_mb"] == 10.0


def test_a_t95_in_the_same_tick_as_the_kernels_counts_as_no_later():
    row = {"runnable": True, "held_d": 0.0, "moved_d": 0.0}
    rows = [{**row, "config": "kernel", "t95": 2.0, "t95_x": 1.0},
            {**row, "config": "pagetier:heuristic", "t95": 1.01, "t95_x": 1.01},
            {**row, "config": "pagetier:heuristic", "t95": 1.1, "t95_x": 1.1}]
    assert "reached 95% no later in 1," in live_table.family_summary(rows)


def test_series_and_summary():
    recs = [_rec("kernel", [0.0] * 5 + [1.0] * 5), _rec("pagetier:heuristic", [1.0] * 10),
            _rec("kernel", [1.0] * 10, scenario="phases"),
            _rec("pagetier:heuristic", [0.5] * 10, scenario="phases", moved_mb=5.0),
            _rec("none", [0.0] * 10, scenario="phases")]
    rows = []
    for sc in ("noise100", "phases"):
        rows += live_table.add_ratios([live_table.summarize(r) for r in recs
                                       if r["scenario"] == sc])
    out = live_table.format_series(rows).splitlines()
    assert out[1].split() == ["noise100", "kernel", "0", "100"]
    assert out[3] == ""  # a blank line between scenarios
    assert out[4].split() == ["phases", "kernel", "100", "100"]
    summary = live_table.family_summary(rows)
    assert summary == ("pagetier:heuristic: against kernel tiering in 2 scenario(s): reached 95% "
                       "no later in 1, held within 5 points in 1, moved no more in 1")  # none: no line
    assert live_table.format_phases(rows) == ""  # one phase each: no section


def test_time_to_95_by_phase_listed():
    """Per phase, in seconds and, for a pagetier run, in its daemon's intervals: the median
    time between its reads (the fuller-node goal counts intervals)."""
    shares = [0.1, 0.5, 0.96, 0.99, 0.2, 0.97, 0.99, 0.99, 0.1, 0.3]
    ours = _rec("pagetier:heuristic", shares, scenario="fuller", phase_s=4)
    ours["daemon_stats"] = [{"t": t} for t in (0.5, 1.7, 2.9, 4.1, 6.0, 7.2)]  # median 1.2 s
    rows = live_table.add_ratios([
        live_table.summarize(_rec("kernel", [0.0] * 10, scenario="fuller", phase_s=4)),
        live_table.summarize(ours)])
    assert rows[0]["t95_intervals"] is None and rows[1]["interval_s"] == 1.2
    assert rows[1]["t95_intervals"] == [2.5, 1.7, None]
    assert live_table.format_phases(rows).splitlines() == [
        "t95 s by phase                         0     1     2",
        "fuller kernel                         --    --    --",
        "fuller pagetier:heuristic            3.0   2.0    --",
        "  in intervals of 1.20 s             2.5   1.7    --"]


def test_runs_with_huge_pages_split_to_migrate_are_named():
    """A run in which the kernel split huge pages to migrate them is named under the table,
    with the count: its MB moved is not comparable with a run without splits."""
    ours = _rec("pagetier:heuristic", [0.5, 1.0], scenario="noise1000")
    ours["vmstat"]["thp_migration_split"] = 19
    kern = _rec("kernel", [0.5, 1.0], scenario="noise1000")
    kern["vmstat"]["thp_migration_split"] = 0
    rows = live_table.add_ratios([live_table.summarize(kern), live_table.summarize(ours)])
    assert live_table.format_splits(rows) == (
        "huge pages split to migrate (thp_migration_split): noise1000 pagetier:heuristic 19")
    assert live_table.format_splits(rows[:1]) == ""


def test_scenarios_and_selection():
    table = live_bench.scenarios()
    noise = [s for s in table.values() if s.family == "noise"]
    assert sorted((s.noise_ppm, s.thp) for s in noise) == [
        (p, t) for p in (0, 10, 100, 1000) for t in (False, True)]
    fuller = table["fuller"]
    assert fuller.free_mb() < fuller.budget_mb < fuller.size_mb  # node fuller than the budget
    assert 2 * fuller.hot_mb > fuller.free_mb() >= fuller.hot_mb  # a phase change needs exchange
    ph = table["phases"]
    assert ph.phase and ph.size_mb == 3 * ph.hot_mb and 2 * ph.hot_mb > ph.budget_mb
    args = table["noise100-nothp"].workload_args()
    assert args[args.index("--noise-ppm") + 1] == "100" and "--no-thp" in args
    assert "--noise-ppm" not in table["noise0"].workload_args()

    quick = live_bench.select_scenarios(None, quick=True)
    assert [s.name for s in quick] == list(live_bench.QUICK_SCENARIOS)
    assert all(s.seconds <= live_bench.QUICK_NOISE_SECONDS for s in quick if s.family == "noise")
    assert [s.name for s in live_bench.select_scenarios("phases,noise1000")] == ["phases",
                                                                                 "noise1000"]
    assert len(live_bench.select_scenarios("noise")) == 8  # a family
    assert {s.seconds for s in live_bench.select_scenarios("noise,fuller", seconds=7)} == {7}
    with pytest.raises(ConfigError, match="unknown scenario 'nope'"):
        live_bench.select_scenarios("nope")
    # the daemon's interval in pagetier's runs: shown in the scenario, checked against its length
    (f,) = live_bench.select_scenarios("fuller", interval=3)
    assert f.interval_s == 3.0 and f.describe().endswith("; pagetier interval 3 s")
    assert not table["fuller"].describe().endswith("interval 1 s")
    for bad in (0.0, 30.0):
        with pytest.raises(ConfigError, match="--interval must be in"):
            live_bench.select_scenarios("fuller", interval=bad)


def test_config_names():
    assert live_bench.config_names("heuristic,lru") == [
        "kernel", "pagetier:heuristic", "pagetier:lru", "damos", "none"]
    assert live_bench.config_names("heuristic", "none,kernel") == [
        "kernel", "pagetier:heuristic", "none"]
    assert live_bench.config_names("", "damos") == ["damos"]
    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        live_bench.config_names("nope")
    with pytest.raises(ConfigError, match="unknown baseline 'numab'"):
        live_bench.config_names("heuristic", "numab")


def test_a_policy_with_options_is_a_configuration_of_its_own():
    """``POLICY+KEY=VALUE``: the policy run with that option, beside the plain one in the same
    boot; its daemon gets the option as the config's policy_options. A key the policy does not
    know is an error before anything runs."""
    assert live_bench.config_names("heuristic,heuristic+finish_change=false", "kernel") == [
        "kernel", "pagetier:heuristic", "pagetier:heuristic+finish_change=false"]
    assert live_bench.policy_spec("heuristic+finish_change=false+margin=0.5") == (
        "heuristic", {"finish_change": False, "margin": 0.5})
    assert live_bench.policy_spec("lru") == ("lru", {})
    with pytest.raises(ConfigError, match="no_such_key"):
        live_bench.config_names("heuristic+no_such_key=1")
    with pytest.raises(ConfigError, match="POLICY\\+KEY=VALUE"):
        live_bench.config_names("heuristic+finish_change")


def test_a_configuration_may_set_pagetier_ko_knobs(tmp_path, monkeypatch):
    """``POLICY+kmod.KNOB=N``: that configuration's runs with pagetier.ko's sysfs knob set, the
    knob put back after each; the policy never sees it. A knob the module has not is an error
    naming it, with nothing written; a value that is not a whole number is refused at once."""
    from pagetier.profiler import kmod

    assert live_bench.config_names("heuristic,heuristic+kmod.upper_window_ms=0", "") == [
        "pagetier:heuristic", "pagetier:heuristic+kmod.upper_window_ms=0"]
    name, options = live_bench.policy_spec("heuristic+kmod.upper_window_ms=0+margin=0.5")
    assert live_bench.kmod_knobs(options) == ({"margin": 0.5}, {"upper_window_ms": "0"})
    with pytest.raises(ConfigError, match="kmod.KNOB=N"):
        live_bench.policy_spec("heuristic+kmod.upper_window_ms=off")
    monkeypatch.setattr(kmod, "SYSFS", tmp_path)
    (tmp_path / "upper_window_ms").write_text("20\n")
    (tmp_path / "probe_every").write_text("1\n")
    before = live_bench.set_kmod_knobs({"upper_window_ms": "0", "probe_every": "4"})
    assert before == {"upper_window_ms": "20", "probe_every": "1"}
    assert (tmp_path / "upper_window_ms").read_text() == "0"
    live_bench.set_kmod_knobs(before)
    assert (tmp_path / "upper_window_ms").read_text() == "20"
    with pytest.raises(ConfigError, match="no knob 'nope'"):
        live_bench.set_kmod_knobs({"upper_window_ms": "0", "nope": "1"})
    assert (tmp_path / "upper_window_ms").read_text() == "20"
    live_bench.check_kmod_knobs(["kernel", "pagetier:heuristic",
                                 "pagetier:heuristic+kmod.upper_window_ms=0@fault"])
    with pytest.raises(ConfigError, match="pagetier:lru\\+kmod.nope=1: pagetier.ko has no knob"):
        live_bench.check_kmod_knobs(["kernel", "pagetier:lru+kmod.nope=1"])


def _doc():
    recs = [_rec("kernel", [0.5, 1.0, 1.0], moved_mb=64.0), _rec("pagetier:heuristic",
                                                                 [0.2, 0.97, 1.0], moved_mb=70.0)]
    spec = live_bench.scenarios()["noise100"]
    from dataclasses import asdict
    return {"kernel": "6.12.0-test", "memory_tiers": {"4": "0", "90": "1"},
            "scenarios": [{"spec": asdict(spec), "records": recs}], "vm_seconds": 100.0}


def test_saved_results_print_as_table_or_json_only(tmp_path):
    saved = tmp_path / "live.json"
    saved.write_text(json.dumps(_doc()))
    runner = CliRunner()
    res = runner.invoke(bench_live, ["--records", str(saved)])
    assert res.exit_code == 0, res.output
    assert "noise100         256 MiB, hot 64 MiB, noise 100 ppm, THP; budget 96 MiB" in res.output
    assert any(ln.startswith("noise100") and "pagetier:heuristic" in ln and "1.09" in ln
               for ln in res.output.splitlines())  # 70 / 64 MB moved
    res = runner.invoke(bench_live, ["--records", str(saved), "--json"])
    assert res.exit_code == 0
    doc = json.loads(res.output)  # only JSON on stdout
    assert [r["config"] for r in doc["rows"]] == ["kernel", "pagetier:heuristic"]
    assert doc["rows"][1]["moved_x"] == 70.0 / 64.0 and doc["scenarios"][0]["name"] == "noise100"


def test_repeated_runs_give_medians_and_each_run_is_listed(tmp_path):
    """--repeat: one row per configuration with the median of its runs (a run that never got
    to 95% counts as the slowest), ratios of the medians, and every run's own figures listed
    under the tables; a run that could not run is named, not counted."""
    recs = [
        _rec("kernel", [0.5, 1.0, 1.0, 1.0], moved_mb=60.0),
        _rec("pagetier:heuristic", [1.0] * 4, moved_mb=90.0),
        _rec("kernel", [0.5, 0.5, 1.0, 1.0], moved_mb=80.0),
        _rec("pagetier:heuristic", [0.5, 1.0, 1.0, 1.0], moved_mb=180.0, pp=512),
        _rec("kernel", [0.5, 0.5, 0.5, 0.5], moved_mb=70.0),
        {"scenario": "noise100", "config": "pagetier:heuristic", "runnable": False,
         "reason": "failed: the daemon exited"},
    ]
    doc = _doc()
    doc["scenarios"][0]["records"] = recs
    doc["repeat"] = 3
    rows = live_bench.results(doc)
    k, p = rows
    assert k["runs"] == 3 and p["runs"] == 2
    # kernel's t95: 2, 3 and never -> the median is 3; held: the last third (t >= 3)
    assert k["t95"] == 3.0 and k["reached"] == "2/3" and k["moved_mb"] == 70.0
    assert abs(k["held"] - 1.0) < 1e-9  # runs held 1.0, 1.0, 0.5
    # pagetier: t95 1 and 2 -> 1.5; MB moved 90 and 180 -> 135; pp 0 and 512 -> 256
    assert p["t95"] == 1.5 and p["moved_mb"] == 135.0 and p["ping_pongs"] == 256
    assert p["vmstat"]["pgmigrate_success"] == 270 * 256  # summed over the runs
    assert p["t95_x"] == 0.5 and abs(p["moved_x"] - 135.0 / 70.0) < 1e-9
    assert p["failed_runs"] == ["failed: the daemon exited"]
    assert [r["moved_mb"] for r in p["per_run"]] == [90.0, 180.0]  # in the order they ran
    assert live_table.median([None, 2.0, 1.0], none_last=True) == 2.0
    assert live_table.median([None, None, 1.0], none_last=True) is None
    assert live_table.median([None, 4.0, 1.0]) == 2.5

    saved = tmp_path / "live.json"
    saved.write_text(json.dumps(doc))
    res = CliRunner().invoke(bench_live, ["--records", str(saved)])
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert any(ln.startswith("each configuration ran 3 times") for ln in out)
    prow = next(ln for ln in out if ln.startswith("noise100") and "pagetier:heuristic" in ln)
    assert prow.split()[2:5] == ["1.5", "0.50", "2/2"] and prow.split()[10] == "256"
    i = out.index("each run (t95 s / held % / MB moved / pp); the tables show their medians:")
    assert out[i + 1].split() == ["noise100", "kernel", "2.0/100/60/0", "3.0/100/80/0",
                                  "--/50/70/0"]
    assert out[i + 2].split()[:4] == ["noise100", "pagetier:heuristic", "1.0/100/90/0",
                                      "2.0/100/180/512"]
    assert "(1 could not run: failed: the daemon exited)" in out[i + 2]


def test_repeat_must_be_a_positive_count():
    res = CliRunner().invoke(bench_live, ["--repeat", "0", "--scenarios", "noise0"])
    assert res.exit_code == 2 and "--repeat" in res.output and "0" in res.output


def test_the_daemons_move_throughput_is_listed():
    """A pagetier row says how fast the daemon's moves went: MB moved over the seconds its
    move_pages calls took (intervals without moves left out); a baseline has no such figure."""
    ours = _rec("pagetier:heuristic", [0.5, 1.0], scenario="fuller")
    ours["daemon_stats"] = [
        {"t": 1.0, "promoted": 0, "demoted": 0, "move_s": 0.001},
        {"t": 2.0, "promoted": 20480, "demoted": 5120, "move_s": 2.0},  # 100 MB
        {"t": 3.0, "promoted": 2560, "demoted": 0, "move_s": 0.5},  # 10 MB
    ]
    kern = _rec("kernel", [0.5, 1.0], scenario="fuller")
    rows = live_table.add_ratios([live_table.summarize(kern), live_table.summarize(ours)])
    assert rows[0]["move_mb_s"] is None
    assert rows[1]["move_mb"] == 110.0 and rows[1]["move_s"] == 2.5
    assert rows[1]["move_mb_s"] == 44.0
    text = live_table.format_moves(rows)
    assert text.splitlines()[1].split() == ["fuller", "pagetier:heuristic", "44", "MB/s:", "110",
                                            "MB", "in", "2.5", "s"]
    assert live_table.format_moves(rows[:1]) == ""
    # repeated runs: the median, and each run's figure
    again = dict(ours, daemon_stats=[{"t": 2.0, "promoted": 25600, "demoted": 0, "move_s": 1.0}])
    row = live_table.combine([live_table.summarize(ours), live_table.summarize(again)])
    assert row["move_mb_s"] == 72.0  # (44 + 100) / 2
    assert "(runs: 44, 100)" in live_table.format_moves([row])
