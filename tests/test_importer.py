"""record --import: the usual column names, a --columns mapping, and the address columns refused
(instruction pointers, physical addresses). More importer tests are in test_trace.py."""
from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.feather as feather
import pytest

from pagetier.errors import ConfigError
from pagetier.profiler.importer import import_samples, parse_columns
from pagetier.profiler.trace import read_trace

BASE = 0x7F00_0000_0000
T0 = 1_700_000_000_000_000_000  # ns


def _pages(out) -> list[tuple[int, list[int], list[int]]]:
    tr = read_trace(out)
    return [(i, g[p].addr.tolist(), g[p].count.tolist()) for i, _, g in tr.intervals() for p in g]


@pytest.mark.parametrize("time_name", ["time_ns", "timestamp_ns", "TS_NS", "Time"])
@pytest.mark.parametrize("addr_name", ["data_addr", "daddr", "vaddr", "Address"])
def test_usual_names_are_found(tmp_path, time_name, addr_name):
    src = tmp_path / "pebs.csv"
    src.write_text(f"{time_name},ip,{addr_name},phys_addr\n"
                   f"{T0},0x401000,{BASE + 16:#x},0x1000\n"
                   f"{T0 + 400_000_000},0x401004,{BASE + 4100:#x},0x2000\n"
                   f"{T0 + 1_500_000_000},0x401008,{BASE + 20:#x},0x1000\n")
    out = tmp_path / "t.parquet"
    summary = import_samples(str(src), str(out), interval_s=1.0)
    assert summary["samples"] == 3
    # the data address is read, not ip or phys_addr; time in ns (from the name or its size)
    assert _pages(out) == [(0, [BASE, BASE + 4096], [1, 1]), (1, [BASE], [1])]
    meta = read_trace(out).meta
    assert meta["time_unit"] == "ns"
    assert meta["columns"] == {"time": time_name, "addr": addr_name}


def test_unit_from_the_column_name(tmp_path):
    # small integers: without the suffix "auto" would take them as seconds
    src = tmp_path / "s.csv"
    src.write_text("timestamp_us,data_addr,tgid,numa_node\n0,4096,7,1\n999999,4096,7,1\n"
                   "1000000,8192,7,0\n")
    out = tmp_path / "t.parquet"
    import_samples(str(src), str(out), interval_s=1.0)
    tr = read_trace(out)
    assert tr.meta["time_unit"] == "us" and tr.meta["pids"] == [7]
    got = [(i, s.addr.tolist(), s.count.tolist(), s.node.tolist())
           for i, _, g in tr.intervals() for s in g.values()]
    assert got == [(0, [4096], [2], [1]), (1, [8192], [1], [0])]
    # an explicit unit wins over the name
    import_samples(str(src), str(out), interval_s=1.0, time_unit="ns")
    assert read_trace(out).meta["time_unit"] == "ns"
    assert [i for i, *_ in _pages(out)] == [0]


def test_columns_mapping(tmp_path):
    src = tmp_path / "odd.csv"
    src.write_text("when_ms,where,who\n0,0x1000,3\n250,0x1008,3\n1200,0x5000,4\n")
    out = tmp_path / "t.parquet"
    with pytest.raises(ConfigError, match=r"no timestamp column .*found when_ms, where, who"):
        import_samples(str(src), str(out))
    import_samples(str(src), str(out), interval_s=1.0,
                   columns="time=when_ms, addr=WHERE,pid=who")
    tr = read_trace(out)
    assert tr.meta["time_unit"] == "ms" and tr.meta["pids"] == [3, 4]
    assert _pages(out) == [(0, [0x1000], [2]), (1, [0x5000], [1])]
    # a dict does the same
    import_samples(str(src), str(out), interval_s=1.0,
                   columns={"time": "when_ms", "addr": "where"})
    assert read_trace(out).meta["pids"] == [0]
    # a mapped column that is not there
    with pytest.raises(ConfigError, match=r"no column 'nope' \(given as the address; found "
                                          r"when_ms, where, who\)"):
        import_samples(str(src), str(out), columns="time=when_ms,addr=nope")


def test_columns_mapping_is_checked():
    assert parse_columns("time=a, addr=b,pid=c,node=d") == \
        {"timestamp": "a", "address": "b", "pid": "c", "node": "d"}
    assert parse_columns(None) == {} and parse_columns("") == {}
    with pytest.raises(ConfigError, match="unknown key 'cpu'"):
        parse_columns("time=a,cpu=b")
    with pytest.raises(ConfigError, match="'addr' is not KEY=COLUMN"):
        parse_columns("time=a,addr")
    with pytest.raises(ConfigError, match="'time=' is not KEY=COLUMN"):
        parse_columns("time=")


@pytest.mark.parametrize("name, what", [("ip", "instruction pointers"), ("PC", "instruction pointers"),
                                        ("phys_addr", "physical addresses"),
                                        ("paddr", "physical addresses")])
def test_code_or_physical_address_given_is_refused(tmp_path, name, what):
    src = tmp_path / "s.csv"
    src.write_text(f"time,{name},data_addr\n0,4096,8192\n")
    with pytest.raises(ConfigError, match=rf"column '{name}' \(given as the address\) holds {what}"):
        import_samples(str(src), str(tmp_path / "t.parquet"), columns=f"time=time,addr={name}")
    assert not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize("name, what", [("ip", "instruction pointers"),
                                        ("phys_addr", "physical addresses")])
def test_code_or_physical_address_found_is_refused(tmp_path, name, what):
    src = tmp_path / "s.feather"
    feather.write_feather(pa.table({"time_ns": [T0], name: pa.array([BASE], pa.uint64())}), str(src))
    with pytest.raises(ConfigError, match=rf"column '{name}' \(the only address-like column\) "
                                          rf"holds {what}.*--columns addr="):
        import_samples(str(src), str(tmp_path / "t.parquet"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pagetier.cli", "record", *args],
                          capture_output=True, text=True)


def test_record_import_columns_cli(tmp_path):
    src = tmp_path / "s.csv"
    src.write_text("cycles,ip,va\n0,0x401000,0x1000\n5,0x401000,0x2000\n")
    out = tmp_path / "t.parquet"
    r = _cli("--import", str(src), "--columns", "time=cycles,addr=va", "-o", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["samples"] == 2
    assert read_trace(out).meta["columns"] == {"time": "cycles", "addr": "va"}
    r = _cli("--import", str(src), "--columns", "time=cycles,addr=ip", "-o", str(out))
    assert r.returncode == 1
    assert "column 'ip' (given as the address) holds instruction pointers" in r.stderr, r.stderr
    r = _cli("--columns", "time=a", "-p", "1", "-o", str(out))
    assert r.returncode == 1 and "--columns goes with --import" in r.stderr, r.stderr
