"""`pagetier bench live` inside the VM, on tiny scenarios (a few seconds each): what a user checks
in its output. The runs are measured and leave the system as they found it; kernel tiering runs
on 6.12 (the suite boots it with the slow node a lower memory tier, through HMAT) and is reported
not runnable, with the reason, on 6.1 (no lower tier there); DAMOS likewise (6.1 has no DAMON)."""
import json

import pytest

from pagetier.bench import kernel_tiering as tiering, live as live_bench, live_table
from pagetier.profiler import damon, kmod

pytestmark = pytest.mark.vm

# noise and no THP: the workload options the scenario families use
TINY = live_bench.Spec("tiny", seconds=4, phase=0, size_mb=32, hot_mb=8, budget_mb=16,
                       noise_ppm=1000, thp=False)


def _sysctls():
    return {p: tiering.read_sysctl(p) for p in (tiering.NUMAB, tiering.DEMOTION) if p.exists()}


def test_scenario_without_migration_is_measured(tmp_path):
    """guest_main: one scenario, no migration, run twice (--repeat 2); the fast node is cut to
    less than the budget ('fuller') and given back after each run; the results file gives a
    row per configuration, the median of its runs."""
    fuller = live_bench.Spec("tiny-fuller", seconds=4, phase=2, size_mb=32, hot_mb=8,
                             budget_mb=24, node_free_mb=16)
    out = tmp_path / "live.json"
    assert live_bench.guest_main(["none"], [fuller], out, log=lambda m: None, repeat=2) == 0
    doc = json.loads(out.read_text())
    recs = doc["scenarios"][0]["records"]
    assert [r["run"] for r in recs] == [0, 1]
    for rec in recs:
        assert rec["runnable"] and rec["memory_ok"], rec.get("reason")
        assert abs(rec["fast_capacity_mb"] - 16) <= 4  # the node's free memory, not the budget...
        assert rec["ticks"] and rec["samples"] and {t["phase"] for t in rec["ticks"]} >= {0, 1}
    assert int(live_bench.FastCapacity().path.read_text()) == 0  # ...and given back
    [row] = live_bench.results(doc)
    assert row["runs"] == 2 and row["reached"].startswith("0/")  # no phase got there
    assert row["scenario"] == "tiny-fuller" and row["config"] == "none"
    assert row["held"] == 0.0 and row["t95"] is None  # first touched on the slow node; nothing moves it
    assert row["workload_moved_mb"] == 0 and row["ping_pongs"] == 0


def test_pagetier_run_is_measured():
    before = _sysctls()
    kmod.load_module()
    try:
        rec = live_bench.run_config("pagetier:heuristic", TINY)
    finally:
        kmod.unload_module()
    row = live_table.summarize(rec)
    assert row["runnable"] and rec["memory_ok"]
    assert rec["daemon_stats"], "the forked daemon reported no interval"
    assert row["mgr_cpu_s"] > 0 and row["prof_cpu_s"] is not None
    assert rec["scenario"] == "tiny" and row["hot_mb"] == 8
    assert _sysctls() == before


def test_a_policy_option_reaches_the_daemon():
    """pagetier:POLICY+KEY=VALUE: the forked daemon's policy runs with the option. With
    min_heat above any unit's heat no unit ranks, and nothing is promoted."""
    kmod.load_module()
    try:
        rec = live_bench.run_config("pagetier:heuristic+min_heat=1e12", TINY)
    finally:
        kmod.unload_module()
    assert rec["runnable"] and rec["memory_ok"], rec.get("reason")
    assert rec["daemon_stats"], "the forked daemon reported no interval"
    assert sum(s["promoted"] for s in rec["daemon_stats"]) == 0, rec["daemon_stats"]


def test_kernel_tiering_runs_on_612_and_says_why_not_on_61(kernel_series):
    before = _sysctls()
    spec = live_bench.Spec("tiny", seconds=8, phase=0, size_mb=32, hot_mb=8, budget_mb=16)
    kern = live_bench.run_config("kernel", spec)
    if kernel_series == "6.1":
        assert not kern["runnable"] and "lower memory tier" in kern["reason"], kern
        return
    # the suite boots 6.12 with node 1 a lower tier (tests/test_vm.py: hmat); by hand:
    # `pagetier vm run --hmat`
    assert kern["runnable"], f"{kern.get('reason')} (booted without --hmat?)"
    assert kern["memory_ok"] and kern["ticks"] and kern["samples"]
    # it really ran: NUMA hinting faults on the slow node's pages during the run
    assert kern["vmstat"]["numa_hint_faults"] > 0, kern["vmstat"]
    row = live_table.add_ratios([live_table.summarize(kern)])[0]
    assert row["t95_x"] in (1.0, None) and row["held_d"] == 0.0  # the baseline of its own ratios
    assert _sysctls() == before  # numa_balancing and demotion put back


def test_damos_runs_on_612_and_says_why_not_on_61(kernel_series):
    damos = live_bench.run_config("damos", live_bench.Spec("tiny", seconds=2, phase=0, size_mb=16,
                                                           hot_mb=4, budget_mb=16))
    if kernel_series == "6.1":
        assert not damos["runnable"] and "no DAMON sysfs" in damos["reason"]
        return
    assert damos["runnable"] and damos["memory_ok"], damos.get("reason")
    assert set(damos["damos_applied_bytes"]) == {"migrate_hot", "migrate_cold"}
    assert damon.SysfsIO().read("kdamonds/nr_kdamonds") == "0"  # left as found
