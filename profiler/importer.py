"""Import sampled-address traces (PEBS, ``perf mem``, ...) into pagetier traces.

The input is CSV or Feather with one row per sample: a timestamp and a virtual address, optionally
a pid and a NUMA node. Column names are matched case-insensitively:

    timestamp: timestamp, time, ts, t       address: address, addr, vaddr, data_addr
    pid:       pid, tgid (default 0)        node:    node, numa_node (default -1)

Timestamps are seconds unless ``time_unit`` says otherwise ("ms", "us", "ns"); "auto" takes
integers above 1e12 as nanoseconds. Addresses are integers or hex strings ("0x7f...").
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
    "timestamp": ("timestamp", "time", "ts", "t"),
    "address": ("address", "addr", "vaddr", "data_addr"),
    "pid": ("pid", "tgid"),
    "node": ("node", "numa_node"),
}
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


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


def _find(df, role: str, path: str, required: bool):
    names = {str(c).strip().lower(): c for c in df.columns}
    for cand in COLUMNS[role]:
        if cand in names:
            return df[names[cand]]
    if required:
        raise ConfigError(f"{path}: no {role} column (looked for {', '.join(COLUMNS[role])}; "
                          f"found {', '.join(map(str, df.columns)) or 'none'})")
    return None


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
                   time_unit: str = "auto", meta: dict | None = None) -> dict:
    """Convert sampled addresses in ``src`` into a trace at ``out``; returns a summary."""
    if interval_s <= 0:
        raise ConfigError("import: the interval must be positive")
    if page_size <= 0 or page_size & (page_size - 1):
        raise ConfigError("import: the page size must be a power of two")
    if time_unit not in ("auto", *_UNITS):
        raise ConfigError(f"import: unknown time unit {time_unit!r} (auto, s, ms, us, ns)")
    df = _load(src)
    ts_col = _find(df, "timestamp", src, True)
    addr = _addresses(_find(df, "address", src, True), src)
    pid_col, node_col = _find(df, "pid", src, False), _find(df, "node", src, False)
    try:
        ts = ts_col.to_numpy().astype(np.float64)
    except (ValueError, TypeError):
        raise ConfigError(f"{src}: timestamps are not numbers") from None
    if np.isnan(ts).any():
        raise ConfigError(f"{src}: missing timestamps")
    unit = time_unit
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
         "source": os.path.basename(src), "samples": int(len(ts)), "time_unit": unit}
    m.update(meta or {})
    write_trace(out, frames, m)
    return {"samples": int(len(ts)), "rows": int(sum(len(f[2]) for f in frames)),
            "intervals": len({f[0] for f in frames}), "pids": m["pids"], "output": str(out)}
