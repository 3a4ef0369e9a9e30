"""Recorded access traces: one Parquet file (pyarrow, zstd) per recording.

One row per interval, process and mapping unit, with the columns in ``TRACE_COLUMNS``:

    interval int32    0, 1, 2, ... (the profiler read that produced the row)
    t        float64  seconds since the recording started, at the end of the interval
    pid      int32
    addr     uint64   start of the unit (virtual address)
    npages   uint16   4 KiB pages in the unit (1, or 512 for a 2 MiB mapping)
    count    uint32   accesses seen in the interval
    node     int16    NUMA node, -1 if unknown
    freq     float32  estimated accesses per second of the unit over the interval, on the one
                      scale every backend maps to (see each backend's docstring); NaN where the
                      backend gave no estimate
    kind     uint8    the kind of memory of the unit: 0 anonymous, 1 shmem/tmpfs, 2 file
                      (page cache); KIND_NAMES in pagetier/core/sample.py. 0 where the
                      backend does not tell kinds

Traces written before the ``kind`` column existed read as anonymous memory throughout
(``Trace.has_kind`` is False). Traces written before the ``freq`` column existed still load,
as do rows with NaN: there ``Trace.column("freq")`` and the Samples of ``intervals()`` hold
the interval's count over the trace's nominal interval (``interval_s``), the same fallback as
``Sample.rates``: a lower bound (one count per scan at most). ``Trace.has_freq`` tells
whether any row carries a backend's estimate. The format number stays 1: the new columns are
optional for readers, and an older pagetier reads a new trace, ignoring them.

The schema's metadata key ``b"pagetier"`` holds JSON: ``format`` (1), ``backend``, ``mode``,
``interval_s``, ``pids``, ``command``, ``kernel``, ``page_size``, ``created`` and optional extras
(``maps``: per pid, the /proc/PID/maps lines at record time; ``symbols``: ELF data/bss objects;
``complete``: whether zero-count units were kept). pandas reads it as is:
``pd.read_parquet(path)``.

``write_trace(path, frames, meta)`` or the streaming ``TraceWriter`` write one;
``read_trace(path)`` returns a ``Trace``. A missing, corrupt or foreign file raises
``pagetier.errors.ConfigError`` naming the file and what is wrong.
"""
from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from pagetier.errors import ConfigError, Unavailable
from pagetier.core.sample import KIND_ANON
from pagetier.profiler.base import PAGE_SIZE, Sample

FORMAT = 1
META_KEY = b"pagetier"
# column -> numpy dtype, in file order
TRACE_COLUMNS: dict[str, str] = {
    "interval": "int32",
    "t": "float64",
    "pid": "int32",
    "addr": "uint64",
    "npages": "uint16",
    "count": "uint32",
    "node": "int16",
    "freq": "float32",
    "kind": "uint8",
}
OPTIONAL_COLUMNS = ("freq", "kind")  # older traces lack them
META_KEYS = ("format", "backend", "mode", "interval_s", "pids", "command", "kernel", "page_size",
             "created")
_ROW_GROUP = 1 << 20  # rows buffered before a row group is written


def _pa():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise Unavailable("traces need pyarrow: pip install -e . (or pip install pyarrow)") from None
    return pa, pq


def schema(meta: dict | None = None):
    pa, _ = _pa()
    fields = [pa.field(name, pa.from_numpy_dtype(np.dtype(dt)), nullable=False)
              for name, dt in TRACE_COLUMNS.items()]
    md = {META_KEY: json.dumps(meta, sort_keys=True).encode()} if meta is not None else None
    return pa.schema(fields, metadata=md)


def full_meta(meta: dict) -> dict:
    """``meta`` with the required keys filled in (format, kernel, page size, creation time)."""
    out = {"format": FORMAT, "backend": "?", "mode": "", "interval_s": 0.0, "pids": [],
           "command": "", "kernel": platform.release(), "page_size": PAGE_SIZE,
           "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out.update(meta or {})
    out["format"] = FORMAT
    return out


class TraceWriter:
    """Streams frames into a trace: ``with TraceWriter(path, meta) as w: w.add(i, t, sample)``."""

    def __init__(self, path, meta: dict):
        pa, pq = _pa()
        self.path = Path(path)
        self.meta = full_meta(meta)
        self._schema = schema(self.meta)
        self._parts: dict[str, list[np.ndarray]] = {c: [] for c in TRACE_COLUMNS}
        self._buffered = 0
        self.rows = 0
        self.frames = 0
        try:
            self._writer = pq.ParquetWriter(str(self.path), self._schema, compression="zstd")
        except OSError as e:
            raise ConfigError(f"{self.path}: cannot write trace: {e}") from None

    def add(self, interval: int, t: float, sample: Sample) -> None:
        n = len(sample)
        self.frames += 1
        if n == 0:
            return
        cols = {
            "interval": np.full(n, interval, np.int32),
            "t": np.full(n, t, np.float64),
            "pid": np.full(n, sample.pid, np.int32),
            "addr": sample.addr, "npages": sample.npages, "count": sample.count,
            "node": sample.node,
            "freq": (sample.freq if len(sample.freq) == n
                     else np.full(n, np.nan, np.float32)),
            "kind": (sample.kind if len(sample.kind) == n
                     else np.full(n, KIND_ANON, np.uint8)),
        }
        for name, dt in TRACE_COLUMNS.items():
            self._parts[name].append(np.asarray(cols[name]).astype(dt, copy=False))
        self._buffered += n
        if self._buffered >= _ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if not self._buffered:
            return
        pa, _ = _pa()
        arrays = [pa.array(np.concatenate(self._parts[c])) for c in TRACE_COLUMNS]
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self._schema))
        self.rows += self._buffered
        self._parts = {c: [] for c in TRACE_COLUMNS}
        self._buffered = 0

    def close(self) -> None:
        if self._writer is None:
            return
        self.flush()
        self._writer.close()
        self._writer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_trace(path, frames: Iterable[tuple[int, float, Sample]], meta: dict) -> None:
    """Write ``(interval, t, sample)`` frames to ``path`` in one go."""
    with TraceWriter(path, meta) as w:
        for interval, t, sample in frames:
            w.add(interval, t, sample)


class Trace:
    """A recorded trace: ``meta`` (dict) and ``table`` (pyarrow Table with TRACE_COLUMNS; an
    old trace's without ``freq`` or ``kind``)."""

    def __init__(self, table, meta: dict, path: str = ""):
        self.table = table
        self.meta = meta
        self.path = path
        self._np: dict[str, np.ndarray] | None = None
        self._has_freq = False

    def column(self, name: str) -> np.ndarray:
        """A column as numpy; ``freq`` with the backend's estimate where there is one and the
        count over ``interval_s`` elsewhere (and in traces older than the column); ``kind``
        anonymous throughout in traces older than its column."""
        if self._np is None:
            names = self.table.column_names
            self._np = {c: self.table.column(c).to_numpy() for c in TRACE_COLUMNS if c in names}
            if "kind" not in self._np:
                self._np["kind"] = np.full(self.table.num_rows, KIND_ANON, np.uint8)
            raw = self._np.get("freq")
            self._has_freq = raw is not None and bool(np.isfinite(raw).any())
            derived = (self._np["count"].astype(np.float64)
                       / max(self.interval_s or 1.0, 1e-6)).astype(np.float32)
            self._np["freq"] = derived if raw is None else np.where(np.isfinite(raw), raw, derived)
        return self._np[name]

    @property
    def has_freq(self) -> bool:
        """Whether any row carries a backend's frequency estimate (not only counts)."""
        self.column("freq")
        return self._has_freq

    @property
    def has_kind(self) -> bool:
        """Whether the trace has the ``kind`` column (older ones are anonymous memory only)."""
        return "kind" in self.table.column_names

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def interval_s(self) -> float:
        return float(self.meta.get("interval_s") or 0.0)

    def intervals(self) -> Iterator[tuple[int, float, dict[int, Sample]]]:
        """``(interval, t, {pid: Sample})`` per recorded interval, in order.

        Intervals in which no process had a row (nothing accessed, with accessed-only
        recording) are not yielded.
        """
        iv, t, pid = self.column("interval"), self.column("t"), self.column("pid")
        if not len(iv):
            return
        order = np.lexsort((pid, iv))  # stable: rows keep their order within (interval, pid)
        iv_s, pid_s = iv[order], pid[order]
        key_change = np.flatnonzero((np.diff(iv_s) != 0) | (np.diff(pid_s) != 0)) + 1
        starts = np.concatenate([[0], key_change])
        ends = np.concatenate([key_change, [len(order)]])
        cur, cur_t, group = None, 0.0, {}
        for s, e in zip(starts, ends):
            rows = order[s:e]
            i, p = int(iv_s[s]), int(pid_s[s])
            if cur is not None and i != cur:
                yield cur, cur_t, group
                group = {}
            cur, cur_t = i, float(t[rows[0]])
            group[p] = Sample(pid=p, addr=self.column("addr")[rows],
                              count=self.column("count")[rows], node=self.column("node")[rows],
                              npages=self.column("npages")[rows],
                              complete=bool(self.meta.get("complete", True)),
                              freq=(self.column("freq")[rows] if self.has_freq
                                    else np.zeros(0, np.float32)),
                              kind=(self.column("kind")[rows] if self.has_kind
                                    else np.zeros(0, np.uint8)))
        if cur is not None:
            yield cur, cur_t, group

    def to_pandas(self):
        try:
            return self.table.to_pandas()
        except ImportError:
            raise Unavailable("to_pandas needs pandas: pip install pandas") from None


def read_trace(path) -> Trace:
    """Open a pagetier trace; ConfigError naming the file when it is not a valid one."""
    pa, pq = _pa()
    p = str(path)
    if not os.path.exists(p):
        raise ConfigError(f"{p}: no such trace file")
    if os.path.isdir(p):
        raise ConfigError(f"{p}: is a directory, not a trace file")
    try:
        pf = pq.ParquetFile(p)
        sch = pf.schema_arrow
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ConfigError(f"{p}: not a Parquet trace file ({_short(e)})") from None
    raw = (sch.metadata or {}).get(META_KEY)
    if raw is None:
        raise ConfigError(f"{p}: a Parquet file but not a pagetier trace (no 'pagetier' metadata); "
                          "sampled-address CSV/Feather traces go through `pagetier record --import`")
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise ConfigError(f"{p}: pagetier metadata is not valid JSON ({e})") from None
    if meta.get("format") != FORMAT:
        raise ConfigError(f"{p}: trace format {meta.get('format')!r} is not supported "
                          f"(this pagetier reads format {FORMAT})")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ConfigError(f"{p}: pagetier metadata lacks {', '.join(missing)}")
    for name, dt in TRACE_COLUMNS.items():
        if name not in sch.names:
            if name in OPTIONAL_COLUMNS:
                continue
            raise ConfigError(f"{p}: column {name!r} is missing")
        want = pa.from_numpy_dtype(np.dtype(dt))
        if sch.field(name).type != want:
            raise ConfigError(f"{p}: column {name!r} has type {sch.field(name).type}, "
                              f"expected {want}")
    cols = [c for c in TRACE_COLUMNS if c in sch.names]
    try:
        table = pf.read(columns=cols)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise ConfigError(f"{p}: trace data is corrupt ({_short(e)})") from None
    if table.num_rows and any(table.column(c).null_count for c in cols):
        raise ConfigError(f"{p}: trace has missing values")
    return Trace(table, meta, p)


def _short(e: Exception) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return s if len(s) < 160 else s[:157] + "..."
