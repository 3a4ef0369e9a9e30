"""Traces, the importer, the replay and damon backends (without a kernel), and record's errors."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from pagetier.errors import ConfigError, PagetierError, Unavailable
from pagetier.profiler.base import Sample, create
from pagetier.profiler.trace import (META_KEY, TRACE_COLUMNS, TraceWriter, read_trace,
                                     write_trace)

BASE = 0x7F0000000000


def sample(pid=7, n=5, start=0, node=0, huge=False):
    addr = BASE + (start + np.arange(n, dtype=np.uint64)) * np.uint64(4096)
    return Sample(pid=pid, addr=addr, count=np.arange(1, n + 1, dtype=np.uint32),
                  node=np.full(n, node, np.int16),
                  npages=np.full(n, 512 if huge else 1, np.uint16))


META = {"backend": "stub", "mode": "x", "interval_s": 0.5, "pids": [7, 8], "command": "prog -a"}


def test_round_trip(tmp_path):
    p = tmp_path / "t.parquet"
    frames = [(0, 0.5, sample()), (0, 0.5, sample(pid=8, n=2, node=1)), (1, 1.0, sample(n=3)),
              (3, 2.0, sample(huge=True, n=1))]
    write_trace(p, frames, META)
    tr = read_trace(p)
    assert tr.meta["format"] == 1 and tr.meta["backend"] == "stub" and tr.meta["pids"] == [7, 8]
    assert tr.meta["page_size"] == 4096 and tr.meta["kernel"] and tr.meta["created"]
    assert [f.name for f in tr.table.schema] == list(TRACE_COLUMNS)
    for f in tr.table.schema:
        assert f.type == pa.from_numpy_dtype(np.dtype(TRACE_COLUMNS[f.name]))
    got = list(tr.intervals())
    assert [(i, t, sorted(g)) for i, t, g in got] == [(0, 0.5, [7, 8]), (1, 1.0, [7]),
                                                      (3, 2.0, [7])]
    s = got[0][2][8]
    np.testing.assert_array_equal(s.addr, sample(pid=8, n=2).addr)
    np.testing.assert_array_equal(s.node, [1, 1])
    assert got[2][2][7].npages.tolist() == [512]
    df = tr.to_pandas()
    assert len(df) == 11 and str(df["addr"].dtype) == "uint64"
    # pandas reads the file directly, too
    import pandas as pd

    assert len(pd.read_parquet(p)) == 11
    assert pq.ParquetFile(p).metadata.row_group(0).column(0).compression == "ZSTD"


def test_streaming_writer_many_row_groups(tmp_path, monkeypatch):
    import pagetier.profiler.trace as trace_mod

    monkeypatch.setattr(trace_mod, "_ROW_GROUP", 10)
    p = tmp_path / "s.parquet"
    with TraceWriter(p, META) as w:
        for i in range(20):
            w.add(i, i * 0.5, sample(n=4, start=i))
        w.add(20, 10.0, Sample(pid=7))  # empty: no rows
    assert pq.ParquetFile(p).num_row_groups > 1
    tr = read_trace(p)
    assert len(tr) == 80 and len(list(tr.intervals())) == 20


@pytest.mark.parametrize("make, message", [
    (lambda p: p.write_bytes(b"not parquet at all" * 10), "not a Parquet trace file"),
    (lambda p: pq.write_table(pa.table({"a": [1]}), p), "not a pagetier trace"),
    (lambda p: pq.write_table(pa.table({"a": [1]}).replace_schema_metadata(
        {META_KEY: b"{nope"}), p), "not valid JSON"),
    (lambda p: pq.write_table(pa.table({"a": [1]}).replace_schema_metadata(
        {META_KEY: json.dumps({"format": 99}).encode()}), p), "format 99 is not supported"),
    (lambda p: pq.write_table(pa.table({"interval": pa.array([1], pa.int32())})
                              .replace_schema_metadata({META_KEY: json.dumps(
                                  {"format": 1, "backend": "x", "mode": "", "interval_s": 1,
                                   "pids": [], "command": "", "kernel": "", "page_size": 4096,
                                   "created": ""}).encode()}), p), "column 't' is missing"),
])
def test_bad_files(tmp_path, make, message):
    p = tmp_path / "bad.parquet"
    make(p)
    with pytest.raises(ConfigError, match=message) as e:
        read_trace(p)
    assert str(p) in str(e.value)


def test_truncated_file(tmp_path):
    p = tmp_path / "t.parquet"
    write_trace(p, [(0, 1.0, sample(n=1000))], META)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2] + data[-200:])
    with pytest.raises(ConfigError, match=str(p)):
        read_trace(p)
    with pytest.raises(ConfigError, match="no such trace file"):
        read_trace(tmp_path / "missing.parquet")


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_text("garbage")
    exe = [sys.executable, "-m", "pagetier.cli"]
    for args in (["report", str(bad)], ["heatmap", str(bad), "--ascii"],
                 ["record", "-b", "stub", "--pid", "999999999", "-o", str(tmp_path / "o")],
                 ["record", "-b", "nosuch", "--pid", "1", "-o", str(tmp_path / "o")]):
        r = subprocess.run([*exe, *args], capture_output=True, text=True)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("pagetier: ")


# --- replay ----------------------------------------------------------------------------------
def test_replay_plays_back(tmp_path):
    p = tmp_path / "t.parquet"
    write_trace(p, [(0, 1.0, sample(n=2)), (1, 2.0, sample(n=3)),
                    (1, 2.0, sample(pid=8, n=1))], META)
    r = create("replay", path=str(p))
    assert r.pids() == [7, 8]
    r.attach(7)
    assert len(r.read(7)) == 2 and len(r.read(7)) == 3
    assert len(r.read(7)) == 0 and r.finished
    with pytest.raises(ProcessLookupError, match="not in the trace"):
        r.attach(99)
    looped = create("replay", path=str(p), loop=True, pid_map={1234: 8})
    looped.attach(1234)
    assert [len(looped.read(1234)) for _ in range(3)] == [1, 1, 1]
    assert looped.read(1234, accessed_only=True).complete is False


# --- importer --------------------------------------------------------------------------------
def test_import_csv(tmp_path):
    from pagetier.profiler.importer import import_samples

    src = tmp_path / "perf.csv"
    src.write_text("# perf mem samples\nTimestamp,Address,pid\n"
                   "100.00,0x7f0000000010,5\n100.10,0x7f0000000ff0,5\n100.20,0x7f0000001000,5\n"
                   "101.60,0x7f0000000000,5\n101.70,0x7f0000000000,6\n")
    out = tmp_path / "t.parquet"
    summary = import_samples(str(src), str(out), interval_s=1.0)
    assert summary["samples"] == 5 and summary["pids"] == [5, 6]
    tr = read_trace(out)
    assert tr.meta["backend"] == "import" and tr.meta["source"] == "perf.csv"
    got = {(i, p): (s.addr.tolist(), s.count.tolist()) for i, _, g in tr.intervals()
           for p, s in g.items()}
    assert got == {(0, 5): ([BASE, BASE + 4096], [2, 1]), (1, 5): ([BASE], [1]),
                   (1, 6): ([BASE], [1])}


def test_import_feather_ns_and_errors(tmp_path):
    from pagetier.profiler.importer import import_samples

    src = tmp_path / "pebs.feather"
    t0 = 1_700_000_000_000_000_000
    feather.write_feather(pa.table({"time": [t0, t0 + 500_000_000, t0 + 2_100_000_000],
                                    "vaddr": pa.array([BASE, BASE + 8192, BASE], pa.uint64())}),
                          str(src))
    out = tmp_path / "t.parquet"
    import_samples(str(src), str(out), interval_s=1.0)
    tr = read_trace(out)
    assert tr.meta["time_unit"] == "ns"
    assert [(i, g[0].addr.tolist()) for i, _, g in tr.intervals()] == \
        [(0, [BASE, BASE + 8192]), (2, [BASE])]
    bad = tmp_path / "bad.csv"
    bad.write_text("when,where\n1,2\n")
    with pytest.raises(ConfigError, match=r"bad.csv: no timestamp column .*found when, where"):
        import_samples(str(bad), str(out))
    bad.write_text("t,addr\n1,zzz\n")
    with pytest.raises(ConfigError, match="not an integer or hex"):
        import_samples(str(bad), str(out))


def test_record_import_cli(tmp_path):
    src = tmp_path / "s.csv"
    src.write_text("t,addr\n0.0,4096\n0.2,8192\n")
    out = tmp_path / "t.parquet"
    r = subprocess.run([sys.executable, "-m", "pagetier.cli", "record", "--import", str(src),
                        "--interval", "100", "-o", str(out), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 2
    assert read_trace(out).meta["interval_s"] == 0.1


# --- record with the stub backend on a real (harmless) process -------------------------------
def test_record_trace_stub(tmp_path):
    from pagetier.profiler.record import record_trace

    proc = subprocess.Popen(["sleep", "30"])
    try:
        prof = create("stub", units=64, hot=8, node=1)
        out = tmp_path / "r.parquet"
        summary = record_trace(prof, [proc.pid], str(out), interval_s=0.05, duration=0.3,
                               nodes=False)
    finally:
        proc.kill()
        proc.wait()
    tr = read_trace(out)
    # (it failed in CI on a loaded host once, unexplained, and again on 2026-11-28 with an
    # empty command line: the first look found sleep mid-exec; record now describes such a
    # process again, see the test after this one)
    assert summary["intervals"] >= 1 and len(tr) == 8 * summary["intervals"], (summary, len(tr))
    assert tr.meta["backend"] == "stub" and tr.meta["complete"] is False, tr.meta
    info = tr.meta["processes"][str(proc.pid)]
    assert "sleep" in info["cmdline"][0], info["cmdline"]
    assert any("sleep" in m[3] for m in info["maps"]), info["maps"][:8]


def test_record_describes_a_process_read_mid_exec_again(tmp_path, monkeypatch):
    """A command read in the middle of its execve shows an empty command line (its new memory
    has no argument area yet): the next read describes it again, and the trace's metadata has
    its command line, maps and command."""
    from pagetier.profiler import record as record_mod

    real = record_mod.describe_process
    calls = []

    def describe(pid):
        calls.append(pid)
        info = real(pid)
        if len(calls) == 1:  # the first look, mid-exec
            info.update(cmdline=[], maps=[], symbols=[], exe="")
        return info

    monkeypatch.setattr(record_mod, "describe_process", describe)
    proc = subprocess.Popen(["sleep", "30"])
    try:
        prof = create("stub", units=8, hot=2, node=1)
        out = tmp_path / "r.parquet"
        record_mod.record_trace(prof, [proc.pid], str(out), interval_s=0.05, duration=0.2,
                                nodes=False)
    finally:
        proc.kill()
        proc.wait()
    meta = read_trace(out).meta
    info = meta["processes"][str(proc.pid)]
    assert len(calls) == 2, calls  # described again once, not every read
    assert info["cmdline"] == ["sleep", "30"] and meta["command"] == "sleep 30", meta
    assert any("sleep" in m[3] for m in info["maps"]), info["maps"][:8]


def test_record_stop_reads_once_more(tmp_path):
    """Ctrl-C mid-interval keeps the counts gathered since the last read: one final read."""
    from pagetier.profiler.record import record_trace

    proc = subprocess.Popen(["sleep", "30"])
    reads = []

    def source(pid, interval):
        reads.append(interval)
        return ([0x7f0000000000], 5, 1)

    try:
        prof = create("stub", source=source)
        out = tmp_path / "s.parquet"
        summary = record_trace(prof, [proc.pid], str(out), interval_s=60, nodes=False,
                               stop=lambda: True)
    finally:
        proc.kill()
        proc.wait()
    assert summary["intervals"] == 1 and len(reads) == 1
    assert int(read_trace(out).column("count").sum()) == 5


# --- damon, against recorded sysfs I/O -------------------------------------------------------
def _damon_files(nr=0, **extra):
    files = {"kdamonds/nr_kdamonds": str(nr)}
    files.update(extra)
    return files


def test_damon_creates_and_removes_only_its_own():
    from pagetier.profiler.damon import DamonProfiler, DryIO

    io = DryIO(_damon_files(1, **{"kdamonds/0/state": "off",
                                  "kdamonds/0/contexts/nr_contexts": "0"}))
    d = DamonProfiler(io=io, aggr_ms=200)
    d.attach(4242)
    assert d.index == 1
    w = dict(io.writes)
    assert io.writes[0] == ("kdamonds/nr_kdamonds", "2")
    assert w["kdamonds/1/contexts/0/operations"] == "vaddr"
    assert w["kdamonds/1/contexts/0/monitoring_attrs/intervals/aggr_us"] == "200000"
    assert w["kdamonds/1/contexts/0/targets/0/pid_target"] == "4242"
    assert w["kdamonds/1/contexts/0/schemes/0/action"] == "stat"
    assert w["kdamonds/1/contexts/0/schemes/0/access_pattern/nr_accesses/max"] == str(2**32 - 1)
    assert io.writes[-1] == ("kdamonds/1/state", "on")
    assert not any(k.startswith("kdamonds/0/") for k, _ in io.writes), "touched kdamond 0"
    n = len(io.writes)
    d.close()
    assert io.writes[n:] == [("kdamonds/1/state", "off"), ("kdamonds/nr_kdamonds", "1")]


def test_damon_refuses_when_another_kdamond_is_in_use():
    from pagetier.profiler.damon import DamonProfiler, DryIO

    for state, nctx, why in (("on", "1", "running"), ("off", "1", "holds a configuration")):
        io = DryIO(_damon_files(1, **{"kdamonds/0/state": state,
                                      "kdamonds/0/contexts/nr_contexts": nctx}))
        with pytest.raises(Unavailable, match=f"kdamond 0 is {why}|kdamond 0 {why}"):
            DamonProfiler(io=io).attach(4242)
        assert io.writes == []


def test_damon_close_leaves_others_alone():
    """Someone configured kdamond 0 while ours ran: ours is stopped and emptied, not removed."""
    from pagetier.profiler.damon import DamonProfiler, DryIO

    io = DryIO(_damon_files(0))
    d = DamonProfiler(io=io)
    d.attach(4242)
    io.files.update({"kdamonds/nr_kdamonds": "2", "kdamonds/1/state": "on",
                     "kdamonds/1/contexts/nr_contexts": "1"})
    n = len(io.writes)
    d.close()
    assert io.writes[n:] == [("kdamonds/0/state", "off"),
                             ("kdamonds/0/contexts/nr_contexts", "0")]


def test_damon_regions_expand_to_pages():
    from pagetier.profiler.damon import DamonProfiler, DryIO, expand_regions, vmas

    spans = vmas(0, "7f0000000000-7f0000004000 rw-p 0 0:0 0\n"
                    "7f0000004000-7f0000008000 ---p 0 0:0 0\n"
                    "7f0000010000-7f0000012000 rw-p 0 0:0 0 [heap]\n")
    regions = np.array([[BASE, BASE + 0x8000, 3], [BASE + 0x8000, BASE + 0x12000, 0]], np.uint64)
    addr, count = expand_regions(regions, spans, accessed_only=False, max_pages=100)
    assert [hex(a) for a in addr] == [hex(BASE + i * 4096) for i in (0, 1, 2, 3, 16, 17)]
    assert count.tolist() == [3, 3, 3, 3, 0, 0]
    addr, _ = expand_regions(regions, spans, accessed_only=True, max_pages=100)
    assert len(addr) == 4
    with pytest.raises(PagetierError, match="more than 2 pages"):
        expand_regions(regions, spans, accessed_only=False, max_pages=2)
    # regions of two targets come one target after the other
    d = DamonProfiler(io=DryIO())
    d.pids = [1, 2]
    per = d._split_by_target([(10, 20, 1), (30, 40, 2), (5, 8, 0), (50, 60, 4)])
    assert [p.tolist() for p in per] == [[[10, 20, 1], [30, 40, 2]], [[5, 8, 0], [50, 60, 4]]]


# --- the freq column and the one frequency scale ----------------------------------------------
def test_freq_round_trip_and_old_traces(tmp_path):
    """freq is written and read back; a row without an estimate, and a trace older than the
    column, read as count / interval_s."""
    p = tmp_path / "f.parquet"
    s = sample(n=3)
    s.freq = np.array([1e5, 2.5, 0.0], np.float32)
    write_trace(p, [(0, 0.5, s), (1, 1.0, sample(n=2))], META)
    tr = read_trace(p)
    assert tr.has_freq
    raw = tr.table.column("freq").to_numpy()
    assert raw[:3].tolist() == [1e5, 2.5, 0.0] and np.isnan(raw[3:]).all()
    # no estimate in interval 1: count over the 0.5 s interval
    assert tr.column("freq").tolist() == [1e5, 2.5, 0.0, 2.0, 4.0]
    (_, _, g0), (_, _, g1) = tr.intervals()
    assert g0[7].freq.tolist() == [1e5, 2.5, 0.0] and g1[7].rates(0.5).tolist() == [2.0, 4.0]
    # a format-1 trace written before the column existed
    old = tmp_path / "old.parquet"
    pf = pq.read_table(p)
    pq.write_table(pf.drop(["freq"]).replace_schema_metadata(pf.schema.metadata), old)
    tr = read_trace(old)
    assert not tr.has_freq and "freq" not in tr.table.column_names
    assert tr.column("freq").tolist() == (tr.column("count") / 0.5).tolist()
    (_, _, g0), _ = tr.intervals()
    assert len(g0[7].freq) == 0 and g0[7].rates(0.5).tolist() == [2.0, 4.0, 6.0]
    # a freq column of the wrong type is refused like any other column
    bad = tmp_path / "bad.parquet"
    pq.write_table(pf.set_column(pf.schema.get_field_index("freq"), "freq",
                                 pa.array(np.zeros(len(pf)), pa.float64())), bad)
    with pytest.raises(ConfigError, match="column 'freq' has type double"):
        read_trace(bad)


# --- the kind column --------------------------------------------------------------------------
def test_kind_round_trip_and_old_traces_read_as_anon(tmp_path):
    """kind is written where the backend tells it (anon where it does not) and read back, into
    the Samples too; a trace older than the column is anonymous memory throughout; the report
    splits bytes and accesses by kind."""
    from pagetier.core.sample import KIND_ANON, KIND_FILE, KIND_SHMEM
    from pagetier.profiler import report

    p = tmp_path / "k.parquet"
    s = sample(n=3)  # counts 1, 2, 3
    s.kind = np.array([KIND_SHMEM, KIND_FILE, KIND_ANON], np.uint8)
    write_trace(p, [(0, 0.5, s), (1, 1.0, sample(n=2, start=3))], META)  # no kind: anon
    tr = read_trace(p)
    assert tr.has_kind and tr.column("kind").tolist() == [1, 2, 0, 0, 0]
    (_, _, g0), (_, _, g1) = tr.intervals()
    assert g0[7].kind.tolist() == [1, 2, 0] and g1[7].kind.tolist() == [0, 0]
    assert report.kinds(tr) == {"anon": {"bytes": 3 * 4096, "accesses": 3 + 1 + 2},
                                "shmem": {"bytes": 4096, "accesses": 1},
                                "file": {"bytes": 4096, "accesses": 2}}
    text = report.render(report.summarize(tr))
    assert [ln.split()[0] for ln in text.splitlines()
            if ln.split()[:1] in (["anon"], ["shmem"], ["file"])] == ["anon", "shmem", "file"]
    old = tmp_path / "old.parquet"
    pf = pq.read_table(p)
    pq.write_table(pf.drop(["kind"]).replace_schema_metadata(pf.schema.metadata), old)
    tr = read_trace(old)
    assert not tr.has_kind and tr.column("kind").tolist() == [0] * 5
    (_, _, g0), _ = tr.intervals()
    assert len(g0[7].kind) == 0
    assert list(report.kinds(tr)) == ["anon"]


def test_replay_and_stub_carry_freq(tmp_path):
    p = tmp_path / "t.parquet"
    s = sample(n=3)
    s.freq = np.array([9.0, 0.0, 3.0], np.float32)
    write_trace(p, [(0, 1.0, s)], META)
    r = create("replay", path=str(p))
    r.attach(7)
    got = r.read(7, accessed_only=True)
    assert got.freq.tolist() == [9.0, 0.0, 3.0] and got.rates(1.0).tolist() == [9.0, 0.0, 3.0]
    stub = create("stub", intervals=[([BASE, BASE + 4096], [1, 0], 0, 1, [50.0, 0.0])])
    stub.attach(1)
    assert stub.read(1, accessed_only=True).freq.tolist() == [50.0]
    derived = create("stub", units=4, hot=2, hot_count=3, interval_s=0.5)
    derived.attach(1)
    assert derived.read(1).freq.tolist() == [6.0, 6.0, 0.0, 0.0]


def test_record_keeps_freq(tmp_path):
    from pagetier.profiler.record import record_trace

    proc = subprocess.Popen(["sleep", "30"])
    try:
        prof = create("stub", intervals=[([BASE, BASE + 4096, BASE + 8192], [2, 0, 1], 1, 1,
                                          [2e4, 0.0, 7.0])])
        out = tmp_path / "r.parquet"
        record_trace(prof, [proc.pid], str(out), interval_s=0.05, duration=0.2, nodes=False)
    finally:
        proc.kill()
        proc.wait()
    tr = read_trace(out)
    assert tr.has_freq and set(tr.column("freq").tolist()) == {2e4, 7.0}


def test_damon_poisson_rate():
    from pagetier.profiler.damon import poisson_rate

    # 20 checks of 5 ms per aggregation: p = nr / 20, lambda = -ln(1 - p) / 5 ms
    r = poisson_rate(np.array([0, 1, 10, 19, 20, 25]), 5000, 100_000)
    assert r[0] == 0
    np.testing.assert_allclose(r[1:4], -np.log1p(-np.array([0.05, 0.5, 0.95])) / 0.005, rtol=1e-5)
    assert r[4] == r[5] == pytest.approx(np.log(40) / 0.005, rel=1e-5)  # saturated: p = 1 - 1/40
    assert r[3] < r[4] and r[4] / r[1] > 70


def test_huge_units_fold_4k_rows_into_2m_units():
    from pagetier.profiler.base import HUGE_SIZE, huge_units

    H = np.uint64(BASE)  # 2 MiB aligned
    addr = np.array([H + np.uint64(4096), H + np.uint64(8192), H + np.uint64(HUGE_SIZE + 4096),
                     H + np.uint64(3 * HUGE_SIZE)], np.uint64)
    s = Sample(pid=1, addr=addr, count=np.array([1, 3, 2, 5], np.uint32),
               node=np.array([1, 1, 0, 0], np.int16), npages=np.ones(4, np.uint16),
               freq=np.array([10, 30, 20, 50], np.float32))
    blocks = np.array([H, H + np.uint64(3 * HUGE_SIZE)], np.uint64)
    summed = huge_units(s, blocks, how="sum")
    assert summed.addr.tolist() == [int(H), int(H) + HUGE_SIZE + 4096, int(H) + 3 * HUGE_SIZE]
    assert summed.npages.tolist() == [512, 1, 512]
    assert summed.count.tolist() == [4, 2, 5] and summed.freq.tolist() == [40, 20, 50]
    assert summed.node.tolist() == [1, 0, 0]
    mean = huge_units(s, blocks, how="mean")
    assert mean.count.tolist() == [2, 2, 5] and mean.freq.tolist() == [20, 20, 50]
    assert huge_units(s, np.zeros(0, np.uint64)) is s
    nofreq = Sample(pid=1, addr=addr, count=s.count, node=s.node, npages=s.npages)
    assert len(huge_units(nofreq, blocks).freq) == 0


def test_thp_blocks_without_pfns_finds_none():
    """Unprivileged, pagemap shows no PFNs: no block is taken for a huge page."""
    import os

    from pagetier.profiler.base import thp_blocks

    if os.geteuid() == 0:
        pytest.skip("as root the PFNs are visible")
    buf = np.zeros(1 << 20, np.uint8)
    assert len(thp_blocks(os.getpid(), np.array([buf.ctypes.data], np.uint64))) == 0


def test_bench_scores_per_interval(tmp_path):
    """scripts/bench_profilers.py ranks each interval's units by freq or by count: a hot set
    estimated at 10^5/s among cold units counted as often is found by freq, not by count."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_profilers", Path(__file__).parent.parent / "scripts" / "bench_profilers.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    H = 2 << 20
    ready = {"addr": BASE, "size": 64 * H, "hot_addr": BASE + 8 * H, "hot_size": 8 * H}
    addr = BASE + np.arange(64, dtype=np.uint64) * np.uint64(H)
    hot = (addr >= ready["hot_addr"]) & (addr < ready["hot_addr"] + ready["hot_size"])
    frames = []
    for i in range(4):
        if i == 2:
            continue  # an interval without rows scores 0
        frames.append((i, i + 1.0, Sample(pid=1, addr=addr, count=np.full(64, 5, np.uint32),
                                          node=np.zeros(64, np.int16),
                                          npages=np.full(64, 512, np.uint16),
                                          freq=np.where(hot, 1e5, 3.0).astype(np.float32))))
    p = tmp_path / "b.parquet"
    write_trace(p, frames, {"backend": "stub", "interval_s": 1.0, "pids": [1]})
    tr = read_trace(p)
    by_freq = bench.interval_scores(tr, ready, "freq", n_intervals=4)
    by_count = bench.interval_scores(tr, ready, "count", n_intervals=4)
    assert [x["precision"] for x in by_freq] == [1.0, 0.0, 1.0]
    assert [x["recall"] for x in by_freq] == [1.0, 0.0, 1.0]
    assert all(x["precision"] < 0.6 for x in by_count)  # ties in random order
    assert by_freq[0]["hot_freq"] == 1e5 and by_freq[0]["cold_freq"] == 3.0
    s = bench.summarize_scores(by_freq)
    assert (s["p_med"], s["p_min"], s["r_med"]) == (1.0, 0.0, 1.0)
