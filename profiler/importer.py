"""Import sampled-address traces (PEBS, ``perf mem``, ...) into pagetier traces.

The input is CSV or Feather with one row per sample: a timestamp and a virtual data address,
optionally a pid and a NUMA node. Column names are matched case-insensitively, the first found
in this order:

    time:    timestamp, time, ts, t, time_ns, timestamp_ns, ts_ns, time_us, timestamp_us,
             time_ms, timestamp_ms, time_s, timestamp_s, sample_time
    address: address, addr, vaddr, data_addr, daddr, data_address, data_vaddr, virt_addr,
             mem_addr, sample_addr
    pid:     pid, tgid, process_id (default 0)
    node:    node, numa_node, node_id, nid (default -1)

``columns`` names them instead (``pagetier record --import F --columns time=T,addr=A``; keys
time, addr, pid, node). pagetier places pages of a process's address space, so the address must
be a virtual data address: an instruction-pointer column (ip, pc, rip, ...) or a physical-address
column (phys_addr, paddr, ...) is refused, whether named in ``columns`` or the only candidate.

Timestamps are in the unit of the column's suffix (``time_ns`` is nanoseconds, ``ts_us``
microseconds) or of ``time_unit`` ("s", "ms", "us", "ns"); with neither ("auto"), integers above
1e12 are nanoseconds and anything else seconds. Addresses are integers or hex strings ("0x7f...").
Samples are binned into intervals of ``interval_s`` and pages of ``page_size``; each (interval,
pid, page) row counts the samples that fell in it.
"""
from __future__ import annotations

import os

import numpy as np

from pagetier.errors import ConfigError
from pagetier.profiler.base import Sample
from pagetier.profiler.trace import write_trace

COLUMNS = {
    "timestamp": ("timestamp", "time", "ts", "t", "time_ns", "timestamp_ns", "ts_ns", "time_us",
                  "timestamp_us", "ts_us", "time_ms", "timestamp_ms", "ts_ms", "time_s",
                  "timestamp_s", "sample_time"),
    "address": ("address", "addr", "vaddr", "data_addr", "daddr", "data_address", "data_vaddr",
                "virt_addr", "mem_addr", "sample_addr"),
    "pid": ("pid", "tgid", "process_id"),
    "node": ("node", "numa_node", "node_id", "nid"),
}
# keys of a columns mapping (--columns time=...,addr=...) -> role
COLUMN_KEYS = {"time": "timestamp", "timestamp": "timestamp", "ts": "timestamp",
               "addr": "address", "address": "address", "pid": "pid", "node": "node"}
# address columns that are not virtual data addresses: name -> what they hold
NOT_DATA_ADDRESS = {
    **dict.fromkeys(("ip", "pc", "rip", "eip", "iaddr", "insn_addr", "inst_addr", "instr_addr",
                     "code_addr", "symaddr", "sym_addr", "instruction_pointer", "program_counter"),
                    "instruction pointers (the code that made the access)"),
    **dict.fromkeys(("phys_addr", "paddr", "physaddr", "phys", "data_phys_addr", "physical_addr",
                     "physical_address", "pa"),
                    "physical addresses (page frames, not the process's address space)"),
}
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# unit suffixes of time column names
_SUFFIX_UNITS = {"s": "s", "sec": "s", "secs": "s", "ms": "ms", "msec": "ms", "us": "us",
                 "usec": "us", "ns": "ns", "nsec": "ns"}


def parse_columns(text: str | None) -> dict[str, str]:
    """``time=T,addr=A[,pid=P,node=N]`` -> {role: column name}; ConfigError if malformed."""
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, eq, name = part.partition("=")
        key, name = key.strip().lower(), name.strip()
        if not eq or not name:
            raise ConfigError(f"--columns: {part.strip()!r} is not KEY=COLUMN "
                              "(e.g. time=time_ns,addr=data_addr)")
        if key not in COLUMN_KEYS:
            raise ConfigError(f"--columns: unknown key {key!r} (time, addr, pid, node)")
        out[COLUMN_KEYS[key]] = name
    return out


def _unit_of(name: str) -> str | None:
    """The time unit a column's name states (time_ns -> ns), if any."""
    stem, sep, suffix = str(name).strip().lower().rpartition("_")
    return _SUFFIX_UNITS.get(suffix) if sep and stem else None


def _load(path: str):
    import pandas as pd

    if not os.path.exists(path):
        raise ConfigError(f"{path}: no such file")
    lower = path.lower()
    try:
        if lower.endswith((".feather", ".arrow", ".ipc")):
            import pyarrow.feather as feather

            return feather.read_table(path).to_pandas()
        return pd.read_csv(path, comment="#", skipinitialspace=True)
    except (ValueError, OSError, pd.errors.ParserError) as e:
        raise ConfigError(f"{path}: cannot read as {'Feather' if 'feather' in lower else 'CSV'} "
                          f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise ConfigError(f"{path}: cannot read ({str(e).splitlines()[0]})") from None


def _refuse_address(path: str, name, found: bool) -> None:
    what = NOT_DATA_ADDRESS.get(str(name).strip().lower())
    if what is None:
        return
    how = "the only address-like column" if found else "given as the address"
    raise ConfigError(f"{path}: column {name!r} ({how}) holds {what}; pagetier needs the virtual "
                      "data address each sample touched (perf mem's 'addr', a PEBS export's "
                      "'data_addr'): name that column with --columns addr=COLUMN")


def _find(df, role: str, path: str, required: bool, given: str | None = None):
    names = {str(c).strip().lower(): c for c in df.columns}
    found = ", ".join(map(str, df.columns)) or "none"
    if given is not None:
        if role == "address":
            _refuse_address(path, given, found=False)
        col = names.get(given.strip().lower())
        if col is None:
            raise ConfigError(f"{path}: no column {given!r} (given as the {role}; found {found})")
        return df[col], str(col)
    for cand in COLUMNS[role]:
        if cand in names:
            return df[names[cand]], str(names[cand])
    if required:
        if role == "address":
            for name in names:
                _refuse_address(path, names[name], found=True)
        raise ConfigError(f"{path}: no {role} column (looked for {', '.join(COLUMNS[role])}; "
                          f"found {found}; name it with --columns)")
    return None, None


def _addresses(col, path: str) -> np.ndarray:
    if col.dtype.kind in "iu":
        if col.dtype.kind == "i" and (col < 0).any():
            raise ConfigError(f"{path}: negative addresses")
        return col.to_numpy().astype(np.uint64)
    try:
        return np.array([int(str(v).strip(), 0) for v in col], np.uint64)
    except (ValueError, OverflowError) as e:
        raise ConfigError(f"{path}: an address is not an integer or hex string ({e})") from None


def import_samples(src: str, out: str, interval_s: float = 1.0, page_size: int = 4096,
                   time_unit: str = "auto", meta: dict | None = None,
                   columns: dict[str, str] | str | None = None) -> dict:
    """Convert sampled addresses in ``src`` into a trace at ``out``; returns a summary.

    ``columns`` maps roles to column names ({"timestamp"|"time": ..., "address"|"addr": ...,
    "pid": ..., "node": ...}, or the text ``time=T,addr=A``); roles not given are looked up."""
    if interval_s <= 0:
        raise ConfigError("import: the interval must be positive")
    if page_size <= 0 or page_size & (page_size - 1):
        raise ConfigError("import: the page size must be a power of two")
    if time_unit not in ("auto", *_UNITS):
        raise ConfigError(f"import: unknown time unit {time_unit!r} (auto, s, ms, us, ns)")
    if isinstance(columns, str) or columns is None:
        given = parse_columns(columns)
    else:
        given = {}
        for key, name in columns.items():
            if key not in COLUMN_KEYS:
                raise ConfigError(f"import: unknown column key {key!r} (time, addr, pid, node)")
            given[COLUMN_KEYS[key]] = name
    df = _load(src)
    ts_col, ts_name = _find(df, "timestamp", src, True, given.get("timestamp"))
    addr_col, addr_name = _find(df, "address", src, True, given.get("address"))
    addr = _addresses(addr_col, src)
    pid_col, pid_name = _find(df, "pid", src, False, given.get("pid"))
    node_col, node_name = _find(df, "node", src, False, given.get("node"))
    if len(df) == 0:
        cols = ", ".join(map(str, df.columns))
        raise ConfigError(f"{src}: no samples: the file has its columns ({cols}) but no rows; "
                          "export the samples too (one row per sampled access)")
    try:
        ts = ts_col.to_numpy().astype(np.float64)
    except (ValueError, TypeError):
        raise ConfigError(f"{src}: timestamps are not numbers") from None
    if np.isnan(ts).any():
        raise ConfigError(f"{src}: missing timestamps")
    unit = time_unit
    if unit == "auto":
        unit = _unit_of(ts_name) or "auto"
    if unit == "auto":
        unit = "ns" if ts_col.dtype.kind in "iu" and len(ts) and ts.max() > 1e12 else "s"
    secs = (ts - (ts.min() if len(ts) else 0.0)) * _UNITS[unit]
    pid = pid_col.to_numpy().astype(np.int64) if pid_col is not None else np.zeros(len(ts), np.int64)
    node = (node_col.fillna(-1).to_numpy().astype(np.int16) if node_col is not None
            else np.full(len(ts), -1, np.int16))
    interval = np.floor(secs / interval_s).astype(np.int64)
    page = addr & ~np.uint64(page_size - 1)
    frames = []
    if len(ts):
        # count samples per (interval, pid, page); node: the last seen
        order = np.lexsort((page, pid, interval))
        iv, pd_, pg, nd = interval[order], pid[order], page[order], node[order]
        new = np.ones(len(iv), bool)
        new[1:] = (iv[1:] != iv[:-1]) | (pd_[1:] != pd_[:-1]) | (pg[1:] != pg[:-1])
        starts = np.flatnonzero(new)
        counts = np.diff(np.append(starts, len(iv)))
        last = np.append(starts[1:], len(iv)) - 1
        u_iv, u_pid, u_pg, u_nd = iv[starts], pd_[starts], pg[starts], nd[last]
        key_new = np.ones(len(starts), bool)
        key_new[1:] = (u_iv[1:] != u_iv[:-1]) | (u_pid[1:] != u_pid[:-1])
        bounds = np.append(np.flatnonzero(key_new), len(starts))
        for a, b in zip(bounds[:-1], bounds[1:]):
            s = Sample(pid=int(u_pid[a]), addr=u_pg[a:b], count=counts[a:b].astype(np.uint32),
                       node=u_nd[a:b], npages=np.full(b - a, page_size // 4096 or 1, np.uint16),
                       complete=False)
            frames.append((int(u_iv[a]), (int(u_iv[a]) + 1) * interval_s, s))
    m = {"backend": "import", "mode": "sampled", "interval_s": float(interval_s),
         "pids": sorted({int(p) for p in np.unique(pid)}), "command": "",
         "kernel": "", "page_size": page_size, "complete": False,
         "source": os.path.basename(src), "samples": int(len(ts)), "time_unit": unit,
         "columns": {k: v for k, v in (("time", ts_name), ("addr", addr_name), ("pid", pid_name),
                                       ("node", node_name)) if v is not None}}
    m.update(meta or {})
    write_trace(out, frames, m)
    return {"samples": int(len(ts)), "rows": int(sum(len(f[2]) for f in frames)),
            "intervals": len({f[0] for f in frames}), "pids": m["pids"], "output": str(out)}
