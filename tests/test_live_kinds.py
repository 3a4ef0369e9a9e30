"""bench live's scenarios on shared memory and on a shared file mapping: the scenario table,
the workload's arguments, and the report that puts them beside kernel tiering and beside the
same scenario on anonymous memory."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from pagetier.bench import live as live_bench
from pagetier.errors import PagetierError


def _rec(config, shares, scenario, moved_mb, errors=None):
    pages = int(moved_mb * 256)
    rec = {"scenario": scenario, "config": config, "phase_s": 0, "hot_mb": 64,
           "ticks": [{"t": float(i + 1), "phase": 0, "fast_fraction": f,
                      "access_fast_fraction": f, "accesses_per_s": 1000.0}
                     for i, f in enumerate(shares)],
           "samples": [{"t": float(i + 1), "fast_mb": 0.0, "moved_pages": pages,
                        "ping_pongs": 0, "pgmigrate": pages, "mgr_cpu_s": None,
                        "prof_cpu_s": None} for i in range(len(shares))],
           "vmstat": {"pgmigrate_success": pages}}
    if errors is not None:
        rec["daemon_totals"] = {"errors": errors}
    return rec


def test_every_kind_scenario_is_its_anonymous_scenario_on_other_memory():
    table = live_bench.scenarios()
    for kind in ("shmem", "file"):
        picked = live_bench.select_scenarios(kind)  # a family
        assert [s.name for s in picked] == [f"{b}-{kind}" for b in live_bench.KIND_SCENARIOS]
        for s in picked:
            base = table[s.name[:-len(kind) - 1]]
            assert s.memory == kind and base.memory == "anon"
            assert asdict(s) | {"name": base.name, "family": base.family,
                                "memory": "anon"} == asdict(base)
    args = table["fuller-shmem"].workload_args()
    assert args[args.index("--memory") + 1] == "shmem"
    args = table["phases-file"].workload_args(Path("/mnt/x/buf"))
    assert args[args.index("--memory") + 1] == "file:/mnt/x/buf"
    assert "--memory" not in table["phases"].workload_args()
    assert "shared memory" in table["noise0-shmem"].describe()
    assert "file on ext4" in table["noise0-file"].describe()
    assert "THP" not in table["noise0-file"].describe()  # page cache here is 4 KiB pages


def test_a_private_file_mapping_runs_the_kind_scenarios_on_its_own_file():
    table = live_bench.scenarios()
    picked = live_bench.select_scenarios("private")
    assert [s.name for s in picked] == [f"{b}-private" for b in live_bench.KIND_SCENARIOS]
    for s in picked:
        base = s.name[:-len("-private")]
        assert asdict(s) | {"name": base, "family": table[base].family, "memory": "anon"} == \
            asdict(table[base])
    s = table["noise0-private"]
    args = s.workload_args(Path("/mnt/x/buf"))
    assert args[args.index("--memory") + 1] == "private:/mnt/x/buf"
    args = table["phases-private"].workload_args(Path("/mnt/x/buf"))
    assert args[args.index("--memory") + 1] == "private:/mnt/x/buf"
    assert "MAP_PRIVATE" in s.describe()
    for name in ("noise0-private", "fuller-private"):
        with pytest.raises(PagetierError, match="needs a file system"):
            live_bench.ConfigRun("none", table[name])


def test_a_file_scenario_needs_a_file_system():
    with pytest.raises(PagetierError, match="needs a file system"):
        live_bench.ConfigRun("none", live_bench.scenarios()["noise0-file"])


def test_report_sets_the_kinds_beside_kernel_tiering_and_beside_anon():
    table = live_bench.scenarios()
    doc = {"kernel": "6.12.0-test", "memory_tiers": {"4": "0", "90": "1"}, "vm_seconds": 10.0,
           "scenarios": [
               {"spec": asdict(table["noise100"]), "records": [
                   _rec("kernel", [0.5, 1.0, 1.0], "noise100", 64.0),
                   _rec("pagetier:heuristic", [1.0, 1.0, 1.0], "noise100", 64.0, {})]},
               {"spec": asdict(table["noise100-file"]), "records": [
                   _rec("kernel", [0.0, 0.0, 0.0], "noise100-file", 0.1),
                   _rec("pagetier:heuristic", [0.5, 1.0, 1.0], "noise100-file", 96.0,
                        {"EBUSY": 3, "EAGAIN": 1})]}]}
    rows = live_bench.results(doc)
    by = {(r["scenario"], r["config"]): r for r in rows}
    assert by[("noise100-file", "pagetier:heuristic")]["daemon_errors"] == {"EBUSY": 3,
                                                                            "EAGAIN": 1}
    text = live_bench.report(doc, "pagetier bench live --scenarios noise100,noise100-file")
    lines = text.splitlines()
    # the main table: the file form's row has its ratios to kernel tiering in that form
    assert any(ln.startswith("noise100-file") and "pagetier:heuristic" in ln for ln in lines)
    # the kinds section: t95 2 s against 1 s on anon (x2.00), held 100% both, 96 MB moved
    # against 64 (x1.50), and the daemon's per-page errors
    i = next(k for k, ln in enumerate(lines) if ln.startswith("memory kind"))
    kinds = {tuple(ln.split()[:2]): ln.split() for ln in lines[i + 1:] if ln.strip()
             and ln.startswith("noise100-file")}
    got = kinds[("noise100-file", "pagetier:heuristic")]
    assert got[2:9] == ["2.0", "1.0", "2.00", "100.0", "100.0", "96.0", "1.50"]
    assert got[9] == "EAGAIN:1,EBUSY:3"
    assert kinds[("noise100-file", "kernel")][2:4] == ["--", "2.0"]  # never got there; 2 s on anon


def test_the_report_of_anonymous_scenarios_has_no_kinds_section():
    table = live_bench.scenarios()
    doc = {"kernel": "6.12.0-test", "memory_tiers": {}, "scenarios": [
        {"spec": asdict(table["noise100"]), "records": [
            _rec("kernel", [0.5, 1.0, 1.0], "noise100", 64.0)]}]}
    assert "memory kind" not in live_bench.report(doc, "x")


def test_several_modes_are_a_configuration_each_in_one_boot():
    from pagetier.errors import ConfigError

    assert live_bench.config_names("heuristic", "kernel") == ["kernel", "pagetier:heuristic"]
    assert live_bench.config_names("heuristic", "kernel", "abit") == ["kernel",
                                                                     "pagetier:heuristic"]
    assert live_bench.config_names("heuristic", "kernel", "fault,abit") == [
        "kernel", "pagetier:heuristic@fault", "pagetier:heuristic@abit"]
    spec = live_bench.select_scenarios("noise0-shmem", mode="abit")[0]
    assert live_bench.config_mode("pagetier:heuristic", spec) == ("heuristic", "abit")
    assert live_bench.config_mode("pagetier:lru@fault", spec) == ("lru", "fault")
    for bad in ("", "fault,dirty"):
        with pytest.raises(ConfigError, match="mode"):
            live_bench.parse_modes(bad)


def test_a_named_mode_is_that_mode_for_every_target_and_auto_is_the_default():
    """@fault and @abit pin the mode (kinds off); auto is fault mode with kinds left to the
    daemon's default (abit for the 4 KiB kinds); -O kinds wins over the pin."""
    assert live_bench.config_names("heuristic", "kernel", "auto,fault") == [
        "kernel", "pagetier:heuristic@auto", "pagetier:heuristic@fault"]
    spec = live_bench.select_scenarios("noise100-file", mode="auto")[0]
    opts = live_bench.daemon_profiler_options
    assert opts("pagetier:heuristic@auto", spec) == {"mode": "fault"}
    assert opts("pagetier:heuristic", spec) == {"mode": "fault"}
    assert opts("pagetier:heuristic@fault", spec) == {"mode": "fault", "kinds": "off"}
    assert opts("pagetier:heuristic@abit", spec) == {"mode": "abit", "kinds": "off"}
    plain = live_bench.select_scenarios("noise0", mode="fault")[0]
    assert opts("pagetier:heuristic", plain) == {"mode": "fault"}  # the daemon's default
    given = live_bench.select_scenarios("noise0", mode="fault",
                                        profiler_options={"kinds": "auto"})[0]
    assert opts("pagetier:heuristic@fault", given) == {"mode": "fault", "kinds": "auto"}
