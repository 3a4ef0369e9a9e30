"""bench live's families not tuned on (pagetier/bench/live.py): THP off, the hot part swept in
address order, a workload under numactl --preferred=SLOW, third-party programs; what the
workload and the programs are started with, and how the programs' figures are read and set
beside kernel tiering's (live_table.format_programs). No VM."""
from __future__ import annotations

import pytest

from pagetier.bench import live, live_table
from pagetier.errors import ConfigError


def test_the_new_families_and_what_they_run():
    table = live.scenarios()
    fams = {f: sorted(n for n, s in table.items() if s.family == f)
            for f in ("nothp", "sweep", "preferred", "programs")}
    assert fams == {"nothp": ["fuller-nothp", "phases-nothp"], "sweep": ["phases-sweep"],
                    "preferred": ["phases-preferred"],
                    "programs": ["stress-ng-vm", "sysbench-memory"]}
    nothp = table["phases-nothp"]
    assert "--no-thp" in nothp.workload_args() and nothp.prefix() == []
    assert (nothp.size_mb, nothp.hot_mb, nothp.phase) == (table["phases"].size_mb, 96, 5)
    sweep = table["phases-sweep"].workload_args()
    assert sweep[sweep.index("--pattern") + 1] == "sweep"
    assert "--pattern" not in table["phases"].workload_args()  # random: hotcold's default
    assert table["phases-preferred"].prefix() == ["numactl", f"--preferred={live.SLOW}"]
    assert "numactl --preferred=1" in table["phases-preferred"].describe()


def test_programs_run_for_the_scenarios_seconds():
    [s] = live.select_scenarios("stress-ng-vm", seconds=12)
    argv = s.program_argv()
    assert argv[:2] == ["stress-ng", "--vm"] and "--vm-keep" in argv
    # told to run longer than the scenario: the bench ends it with SIGINT after 12 s
    assert argv[argv.index("--vm-bytes") + 1] == "96M"
    assert argv[argv.index("--timeout") + 1] == f"{12 + live.PROGRAM_SLACK_S}s"
    [s] = live.select_scenarios("programs", seconds=12)[1:]
    assert s.program_argv()[:2] == ["sysbench", "memory"]
    assert f"--time={12 + live.PROGRAM_SLACK_S}" in s.program_argv()
    assert "--report-interval=1" in s.program_argv()
    assert "--memory-block-size=64M" in s.program_argv()  # sysbench: a power of two
    assert "--memory-access-mode=rnd" in s.program_argv()


def test_bad_pattern_and_program_are_config_errors():
    with pytest.raises(ConfigError, match="pattern"):
        live.Spec(pattern="zigzag").check()
    with pytest.raises(ConfigError, match="unknown program"):
        live.Spec(program="nope").check()


def test_program_rates_are_read_from_their_output():
    out = ("stress-ng: metrc: [13727] stressor  bogo ops real time  usr time  sys time   "
           "bogo ops/s     bogo ops/s\n"
           "stress-ng: metrc: [13727] vm                41290      3.06      1.53      0.15     "
           "13476.28       24499.01\n")
    assert live.program_rate("stress-ng-vm", out) == (13476.28, "bogo ops/s")
    assert live.program_rate("sysbench-memory",
                             "448.00 MiB transferred (136.22 MiB/sec)\n") == (136.22, "MiB/s")
    assert live.program_rate("sysbench-memory", "FATAL: oops") == (None, "MiB/s")
    reports = "[ 5s ] 100.00 MiB/sec\n[ 6s ] 200.00 MiB/sec\n"
    assert live.program_rate("sysbench-memory", reports) == (150.0, "MiB/s")


def test_numa_maps_pages_counts_anonymous_mappings_by_node(tmp_path, monkeypatch):
    maps = ("55d0 default file=/usr/bin/x mapped=3 N0=2 N1=1 kernelpagesize_kB=4\n"
            "7f00 default anon=24576 dirty=24576 N0=20000 N1=4576 kernelpagesize_kB=4\n"
            "7ffd default stack anon=3 dirty=3 N1=3 kernelpagesize_kB=4\n")
    real = live.Path

    def fake(p):
        return real(tmp_path / "numa_maps") if str(p).endswith("numa_maps") else real(p)

    (tmp_path / "numa_maps").write_text(maps)
    monkeypatch.setattr(live, "Path", fake)
    assert live.numa_maps_pages(123) == (20000, 4579)


def _rec(config, rate, shares):
    return {"scenario": "sysbench-memory", "config": config, "runnable": True, "phase_s": 0,
            "hot_mb": 96, "ticks": [{"t": float(i + 1), "phase": 0, "fast_fraction": f,
                                     "access_fast_fraction": -1, "accesses_per_s": None}
                                    for i, f in enumerate(shares)],
            "samples": [{"t": 1.0, "fast_mb": 0, "moved_pages": 0, "ping_pongs": None,
                         "pgmigrate": 0, "mgr_cpu_s": None, "prof_cpu_s": None}],
            "vmstat": {"pgmigrate_success": 24576}, "program_rate": rate,
            "program_unit": "MiB/s"}


def test_programs_table_sets_their_throughput_beside_kernel_and_none():
    rows = live_table.add_ratios([live_table.summarize(r) for r in (
        _rec("kernel", 100.0, [0, 0.5, 0.9, 0.96]),
        _rec("pagetier:heuristic", 150.0, [0, 1.0, 1.0, 1.0]),
        _rec("none", 50.0, [0, 0, 0, 0]))])
    text = live_table.format_programs(rows)
    line = next(ln for ln in text.splitlines() if "pagetier:heuristic" in ln)
    assert "150.0 MiB/s" in line and line.split()[-2:] == ["1.50", "3.00"]
    assert line.split()[2] == "2.0" and line.split()[3] == "100.0"  # t95 s, held %
    kern = next(ln for ln in text.splitlines() if ln.split()[1] == "kernel")
    assert kern.split()[2] == "4.0"
    assert live_table.format_programs([r for r in rows if r["config"] == "x"]) == ""
    # the main table has no ping-pong figure for a program (n/a), not a zero
    assert " n/a " in live_table.format_row(rows[1])


def test_limits_section_counts_why_the_daemons_exchanges_stopped():
    stats = [{"promoted": 256, "demoted": 0, "move_s": 0.1, "wanted_bytes": 4 << 20,
              "limit": "throughput"},
             {"promoted": 512, "demoted": 256, "move_s": 0.1, "wanted_bytes": 3 << 20,
              "limit": "candidates"},
             {"promoted": 0, "demoted": 0, "move_s": 0.0, "wanted_bytes": 0, "limit": "candidates"},
             {"promoted": 256, "demoted": 0, "move_s": 0.1, "wanted_bytes": 2 << 20,
              "limit": "throughput"}]
    rec = {**_rec("pagetier:heuristic", None, [0, 1]), "daemon_stats": stats}
    row = live_table.summarize(rec)
    assert row["limits"] == {"throughput": 2, "candidates": 1} and row["wanted_mb"] == 9
    text = live_table.format_limits([row])
    assert "throughput 2, candidates 1; wanted 9 MB, moved 5 MB" in text
    assert live_table.format_limits([live_table.summarize(_rec("kernel", None, [0]))]) == ""
