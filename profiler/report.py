"""pagetier report: what a trace says about a program's memory.

- Working set per interval: the bytes of the units counted in that interval.
- Hot set per interval: the bytes of the units counted in at least ``hot_fraction`` of the last
  ``window`` intervals (persistently used, whatever a backend's count scale is).
- Per-node residency: bytes of the pages seen, and of the hot set at the end, per NUMA node.
- Split by kind of memory (anonymous, shmem, file): bytes of the units seen and the accesses
  counted, per kind (a trace older than the ``kind`` column is anonymous memory throughout).
- Hottest regions: runs of adjacent counted units ranked by one metric, each named by the
  mapping that holds it (/proc/PID/maps at record time) and by the ELF data/bss objects it
  overlaps. Metrics (``--metric``): ``freq``, the region's estimated accesses per second (the sum
  of its units' ``freq``, averaged over the trace's intervals: ``rate``), the default when the
  trace carries a backend's estimate; ``count``, its total count (``accesses``), the default for
  traces without estimates.
"""
from __future__ import annotations

import math
import os

import numpy as np

from pagetier.core.arrays import unique
from pagetier.core.sample import KIND_NAMES
from pagetier.profiler.base import PAGE_SIZE

MB = 1 << 20


def _unit_bytes(npages: np.ndarray) -> np.ndarray:
    return npages.astype(np.int64) * PAGE_SIZE


def timeline(trace, window: int = 5, hot_fraction: float = 0.5) -> list[dict]:
    iv_all, t_all = trace.column("interval"), trace.column("t")
    if not len(iv_all):
        return []
    n = int(iv_all.max()) + 1
    cnt = trace.column("count")
    acc = cnt > 0
    iv = iv_all[acc]
    pid, addr = trace.column("pid")[acc], trace.column("addr")[acc]
    nbytes = _unit_bytes(trace.column("npages")[acc])
    node = trace.column("node")[acc]
    t_of = np.full(n, np.nan)
    t_of[iv_all] = t_all
    # units as (pid, addr) keys
    keys = np.stack([pid.astype(np.uint64), addr], axis=1)
    uniq, unit = np.unique(keys, axis=0, return_inverse=True) if len(keys) else (keys, iv)
    unit = unit.reshape(-1)
    unit_bytes = np.zeros(len(uniq), np.int64)
    unit_bytes[unit] = nbytes
    need = max(1, math.ceil(hot_fraction * window))
    # seen[u] = intervals of unit u: walk intervals in order with a sliding window count
    hits = np.zeros(len(uniq), np.int32)
    by_iv = [np.flatnonzero(iv == i) for i in range(n)]
    nodes = sorted({int(x) for x in unique(node)})
    out = []
    for i in range(n):
        rows = by_iv[i]
        hits[unique(unit[rows])] += 1
        if i >= window:
            hits[unique(unit[by_iv[i - window]])] -= 1
        hot = hits >= need
        ws = int(nbytes[rows].sum())
        per_node = {str(k): int(nbytes[rows][node[rows] == k].sum()) for k in nodes}
        out.append({"interval": i, "t": None if math.isnan(t_of[i]) else round(float(t_of[i]), 3),
                    "working_set": ws, "hot_set": int(unit_bytes[hot].sum()),
                    "per_node": per_node})
    return out


def residency(trace, window: int = 5, hot_fraction: float = 0.5) -> dict:
    """Bytes per node of every unit seen (at its last reported node) and of the final hot set."""
    acc = trace.column("count") > 0
    if not acc.any():
        return {"seen": {}, "hot": {}}
    iv = trace.column("interval")[acc]
    keys = np.stack([trace.column("pid")[acc].astype(np.uint64), trace.column("addr")[acc]], 1)
    node, nbytes = trace.column("node")[acc], _unit_bytes(trace.column("npages")[acc])
    order = np.lexsort((iv,))
    uniq, first = np.unique(keys[order][::-1], axis=0, return_index=True)  # last occurrence
    last_rows = order[::-1][first]
    seen = {}
    for k in unique(node[last_rows]):
        seen[str(int(k))] = int(nbytes[last_rows][node[last_rows] == k].sum())
    n = int(iv.max()) + 1
    recent = iv >= n - window
    need = max(1, math.ceil(hot_fraction * min(window, n)))
    rk, rinv = np.unique(keys[recent], axis=0, return_inverse=True)
    hits = np.zeros(len(rk), np.int64)
    np.add.at(hits, rinv.reshape(-1), 1)  # units appear once per interval
    hot_keys = {tuple(k) for k in rk[hits >= need].tolist()}
    hot = {}
    for r in last_rows:
        if tuple(keys[r].tolist()) in hot_keys:
            k = str(int(node[r]))
            hot[k] = hot.get(k, 0) + int(nbytes[r])
    return {"seen": dict(sorted(seen.items())), "hot": dict(sorted(hot.items()))}


def kinds(trace) -> dict:
    """Per kind of memory (KIND_NAMES), the bytes of the units in the trace (each (pid,
    address) once, of the kind of its last row) and the accesses counted; kinds with neither
    are left out."""
    cnt = trace.column("count").astype(np.int64)
    if not len(cnt):
        return {}
    kind = trace.column("kind")
    keys = np.stack([trace.column("pid").astype(np.uint64), trace.column("addr")], 1)
    _, last = np.unique(keys[::-1], axis=0, return_index=True)
    last = len(cnt) - 1 - last
    nbytes = _unit_bytes(trace.column("npages")[last])
    out = {}
    for code, name in enumerate(KIND_NAMES):
        b = int(nbytes[kind[last] == code].sum())
        a = int(cnt[kind == code].sum())
        if b or a:
            out[name] = {"bytes": b, "accesses": a}
    return out


def _mapping(maps: list, addr: int) -> str:
    for lo, hi, perms, name in maps:
        if lo <= addr < hi:
            return name or "[anon]"
    return "?"


METRICS = ("freq", "count")


def default_metric(trace) -> str:
    """``freq`` when the trace carries a backend's estimate, else ``count``."""
    return "freq" if trace.has_freq else "count"


def hottest(trace, top: int = 10, metric: str = "count") -> list[dict]:
    freq_all = trace.column("freq").astype(np.float64)
    acc = (trace.column("count") > 0) | (freq_all > 0)
    if not acc.any():
        return []
    pid = trace.column("pid")[acc]
    addr = trace.column("addr")[acc]
    npg = trace.column("npages")[acc].astype(np.int64)
    cnt = trace.column("count")[acc].astype(np.int64)
    frq = freq_all[acc]
    n_iv = len(unique(trace.column("interval"))) or 1
    total_all = int(cnt.sum())
    freq_all_sum = float(frq.sum())
    keys = np.stack([pid.astype(np.uint64), addr], 1)
    uk, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    tot = np.zeros(len(uk), np.int64)
    np.add.at(tot, inv, cnt)
    ftot = np.zeros(len(uk), np.float64)
    np.add.at(ftot, inv, frq)
    upages = np.zeros(len(uk), np.int64)
    upages[inv] = npg
    procs = trace.meta.get("processes") or {}
    # which mapping each unit is in (-1: none known), to split runs at mapping boundaries
    map_idx = np.full(len(uk), -1, np.int64)
    for p in unique(uk[:, 0]):
        maps = (procs.get(str(int(p))) or {}).get("maps") or []
        if not maps:
            continue
        lo = np.array([m[0] for m in maps], np.uint64)
        order = np.argsort(lo)
        sel = uk[:, 0] == p
        j = np.searchsorted(lo[order], uk[sel, 1], side="right") - 1
        hi = np.array([m[1] for m in maps], np.uint64)[order]
        inside = (j >= 0) & (uk[sel, 1] < hi[np.maximum(j, 0)])
        map_idx[sel] = np.where(inside, order[np.maximum(j, 0)], -1)
    nxt = uk[:-1, 1] + upages[:-1].astype(np.uint64) * np.uint64(PAGE_SIZE)
    brk = (uk[1:, 0] != uk[:-1, 0]) | (uk[1:, 1] != nxt) | (map_idx[1:] != map_idx[:-1])
    bounds = np.concatenate([[0], np.flatnonzero(brk) + 1, [len(uk)]])
    regions = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    out = []
    for a, b in regions:
        p, lo = int(uk[a, 0]), int(uk[a, 1])
        hi = int(uk[b - 1, 1]) + int(upages[b - 1]) * PAGE_SIZE
        pages = int(upages[a:b].sum())
        total = int(tot[a:b].sum())
        ftotal = float(ftot[a:b].sum())
        info = procs.get(str(p)) or {}
        syms = [s for s in info.get("symbols") or [] if s[0] < hi and s[0] + s[1] > lo]
        syms.sort(key=lambda s: -s[1])
        row = {"pid": p, "start": hex(lo), "end": hex(hi), "bytes": hi - lo,
               "accesses": total, "share": round(total / total_all, 4) if total_all else 0,
               "per_page": round(total / pages, 2),
               "mapping": _mapping(info.get("maps") or [], lo),
               "symbols": [f"{s[2]} ({s[3]})" for s in syms[:3]]}
        if metric == "freq":
            row["rate"] = round(ftotal / n_iv, 2)
            row["share"] = round(ftotal / freq_all_sum, 4) if freq_all_sum else 0
        out.append(row)
    key = "rate" if metric == "freq" else "accesses"
    out.sort(key=lambda r: (-r[key], r["start"]))
    return out[:top]


def summarize(trace, window: int = 5, hot_fraction: float = 0.5, top: int = 10,
              metric: str | None = None) -> dict:
    m = trace.meta
    metric = metric or default_metric(trace)
    tl = timeline(trace, window, hot_fraction)
    return {
        "metric": metric,
        "trace": {k: m.get(k) for k in ("backend", "mode", "interval_s", "pids", "command",
                                        "kernel", "page_size", "created")},
        "intervals": len(tl), "rows": len(trace),
        "hot_rule": {"window": window, "hot_fraction": hot_fraction},
        "peak_working_set": max((r["working_set"] for r in tl), default=0),
        "peak_hot_set": max((r["hot_set"] for r in tl), default=0),
        "timeline": tl,
        "residency": residency(trace, window, hot_fraction),
        "kinds": kinds(trace),
        "hottest": hottest(trace, top, metric),
    }


def _mb(b: int) -> str:
    return f"{b / MB:.1f}"


def _si(x: float) -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.1f}{suf}"
    return f"{x:.1f}"


def render(rep: dict, max_rows: int = 20) -> str:
    tr = rep["trace"]
    mode = f" ({tr['mode']})" if tr.get("mode") else ""
    lines = [f"trace: {tr['backend']}{mode}, every {tr['interval_s']} s, pids "
             f"{', '.join(map(str, tr['pids']))}, kernel {tr['kernel']}",
             f"command: {(tr.get('command') or '-')[:70]}",
             f"{rep['intervals']} intervals, {rep['rows']} rows; peak working set "
             f"{_mb(rep['peak_working_set'])} MB, peak hot set {_mb(rep['peak_hot_set'])} MB",
             f"hot: counted in >= {rep['hot_rule']['hot_fraction']:.0%} of the last "
             f"{rep['hot_rule']['window']} intervals", ""]
    tl = rep["timeline"]
    nodes = sorted({k for r in tl for k in r["per_node"]}, key=int)
    head = f"{'t (s)':>8} {'working MB':>11} {'hot MB':>9}" + "".join(
        f" {('node ' + k if k != '-1' else 'node ?'):>8}" for k in nodes[:4])
    lines.append(head)
    step = max(1, math.ceil(len(tl) / max_rows))
    picked = tl[::step] + ([tl[-1]] if tl and (len(tl) - 1) % step else [])
    for r in picked:
        t = f"{r['t']:.1f}" if r["t"] is not None else "-"
        lines.append(f"{t:>8} {_mb(r['working_set']):>11} {_mb(r['hot_set']):>9}" + "".join(
            f" {_mb(r['per_node'].get(k, 0)):>8}" for k in nodes[:4]))
    lines += ["", f"{'node':>6} {'seen MB':>10} {'hot MB (end)':>13}"]
    res = rep["residency"]
    for k in sorted(set(res["seen"]) | set(res["hot"]), key=int):
        lines.append(f"{(k if k != '-1' else '?'):>6} {_mb(res['seen'].get(k, 0)):>10} "
                     f"{_mb(res['hot'].get(k, 0)):>13}")
    kd = rep.get("kinds") or {}
    if kd:
        total_acc = sum(v["accesses"] for v in kd.values())
        lines += ["", f"{'kind':>6} {'MB':>10} {'accesses':>12} {'share':>6}"]
        for name, v in kd.items():
            share = v["accesses"] / total_acc if total_acc else 0.0
            lines.append(f"{name:>6} {_mb(v['bytes']):>10} {v['accesses']:>12} {share:6.1%}")
    by_freq = rep.get("metric") == "freq"
    lines += ["", "hottest regions" + (" (by estimated accesses/s):" if by_freq else ":"),
              f"{'start':>14} {'MB':>7} {'share':>6} {'acc/s' if by_freq else 'per pg':>7}  what"]
    for r in rep["hottest"]:
        what = os.path.basename(r["mapping"]) if r["mapping"].startswith("/") else r["mapping"]
        if r["symbols"]:
            what += ": " + ", ".join(s.split(" (")[0] for s in r["symbols"])
        v = _si(r["rate"]) if by_freq else f"{r['per_page']:7.1f}"
        line = f"{r['start']:>14} {_mb(r['bytes']):>7} {r['share']:6.1%} {v:>7}  "
        lines.append(line + (what if len(line + what) <= 79 else what[:76 - len(line)] + "..."))
    return "\n".join(lines)
