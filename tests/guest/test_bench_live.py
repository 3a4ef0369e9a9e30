"""`pagetier bench live` inside the VM, kept short: a no-migration run and a pagetier run are
measured, and the kernel baselines run or say why they cannot (the default VM has no HMAT, so no
lower memory tier; 6.1 has no DAMON)."""
import pytest

from pagetier import live_bench, live_table, tiering
from pagetier.profiler import damon, kmod

pytestmark = pytest.mark.vm

SPEC = live_bench.Spec(seconds=4, phase=0, size_mb=32, hot_mb=8, budget_mb=16)


def test_no_migration_run_is_measured():
    rec = live_bench.run_config("none", SPEC)
    row = live_table.summarize(rec)
    assert row["runnable"] and rec["memory_ok"]
    assert rec["ticks"] and rec["samples"]
    assert row["fast_access"] == 0.0  # first touched on the slow node, and nothing moves it
    assert row["workload_moved_mb"] == 0 and row["ping_pongs"] == 0
    assert abs(rec["fast_capacity_mb"] - SPEC.budget_mb) <= 4  # the fast node was cut down...
    assert int(live_bench.FastCapacity().path.read_text()) == 0  # ...and given back


def test_pagetier_run_is_measured():
    kmod.load_module()
    try:
        rec = live_bench.run_config("pagetier:heuristic", SPEC)
    finally:
        kmod.unload_module()
    row = live_table.summarize(rec)
    assert row["runnable"] and rec["memory_ok"]
    assert rec["daemon_stats"], "the forked daemon reported no interval"
    assert row["mgr_cpu_s"] > 0 and row["prof_cpu_s"] is not None
    assert open(tiering.NUMAB).read().strip() == "0"


def test_kernel_baselines_run_or_say_why(kernel_series):
    kern = live_bench.run_config("kernel", SPEC)
    assert not kern["runnable"] and "lower memory tier" in kern["reason"], kern
    damos = live_bench.run_config("damos", live_bench.Spec(seconds=2, phase=0, size_mb=16,
                                                           hot_mb=4, budget_mb=16))
    if kernel_series == "6.1":
        assert not damos["runnable"] and "no DAMON sysfs" in damos["reason"]
    else:
        assert damos["runnable"] and damos["memory_ok"], damos.get("reason")
        assert set(damos["damos_applied_bytes"]) == {"migrate_hot", "migrate_cold"}
        assert damon.SysfsIO().read("kdamonds/nr_kdamonds") == "0"  # left as found
