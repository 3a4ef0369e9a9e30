"""The figures of ``pagetier bench live``: one run's raw record turned into metrics, ratios
against the no-migration run, and the side-by-side table. Pure functions (unit-tested on the host).

A run's record (what the guest side writes) holds:

- ``ticks``: the workload's own lines, once a second: ``t`` (its clock), ``phase``,
  ``access_fast_fraction`` (share of that second's accesses served by the fast node),
  ``fast_fraction`` (share of the hot part on the fast node), ``accesses_per_s``;
- ``samples``: the bench's own look once a second, cumulative since the workload started:
  ``t``, ``fast_mb`` (workload pages on the fast node), ``moved_pages`` and ``ping_pongs`` (of
  the workload's pages, seen by comparing each page's node between samples), ``pgmigrate``
  (/proc/vmstat ``pgmigrate_success`` since the start: every page migrated in the guest),
  ``mgr_cpu_s`` and ``prof_cpu_s`` (None where not measurable);
- ``phase_s``: seconds per phase of the workload (its hot part moves to the next window then).
"""
from __future__ import annotations

import math

HOT_THRESHOLD = 0.9  # the hot set "reached" the fast node when this share of accesses is served there
PAGE = 4096


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def time_to_hot(ticks: list[dict], phase_s: float, threshold: float = HOT_THRESHOLD):
    """Per phase that started during the run: seconds from its start to the first tick where at
    least ``threshold`` of the accesses went to the fast node (None: not within the phase)."""
    if not ticks:
        return []
    last_t = ticks[-1]["t"]
    nphases = max(t["phase"] for t in ticks) + 1 if phase_s else 1
    out = []
    for k in range(nphases):
        start = k * phase_s if phase_s else 0.0
        if start >= last_t:
            break
        hit = next((t["t"] for t in ticks
                    if t["phase"] == k and t["access_fast_fraction"] >= threshold), None)
        out.append(None if hit is None else round(hit - start, 2))
    return out


def summarize(rec: dict) -> dict:
    """The metrics of one configuration's run (a not-runnable one keeps its reason)."""
    out = {"config": rec["config"], "runnable": rec.get("runnable", True),
           "reason": rec.get("reason")}
    if not out["runnable"]:
        return out
    ticks, samples = rec.get("ticks", []), rec.get("samples", [])
    fr = [t["access_fast_fraction"] for t in ticks]
    hot = time_to_hot(ticks, rec.get("phase_s", 0))
    reached = [h for h in hot if h is not None]
    last = samples[-1] if samples else {}
    out.update({
        "seconds": ticks[-1]["t"] if ticks else 0.0,
        "fast_access": _mean(fr),  # mean over the run of the per-second shares
        "fast_access_end": _mean(fr[-3:]),  # the last three seconds
        "fast_access_series": [round(x, 4) for x in fr],
        "time_to_hot": hot,
        "time_to_hot_mean": _mean(reached),
        "phases_reached": f"{len(reached)}/{len(hot)}",
        "accesses_per_s": _mean([t["accesses_per_s"] for t in ticks]),
        "migrated_mb": last.get("pgmigrate", 0) * PAGE / 2**20,
        "workload_moved_mb": last.get("moved_pages", 0) * PAGE / 2**20,
        "ping_pongs": last.get("ping_pongs", 0),
        "peak_fast_mb": max((s["fast_mb"] for s in samples), default=0.0),
        "mgr_cpu_s": last.get("mgr_cpu_s"),
        "prof_cpu_s": last.get("prof_cpu_s"),
        "fast_capacity_mb": rec.get("fast_capacity_mb"),
        "memory_ok": rec.get("memory_ok"),
        "notes": rec.get("notes", []),
    })
    return out


def ratio(x, base):
    """x / base, or None when either is missing or base is 0."""
    if x is None or base is None or base == 0:
        return None
    return x / base


def add_ratios(rows: list[dict], baseline: str = "none") -> list[dict]:
    """Ratios of each runnable row against the baseline row (fast-access share, accesses/s)."""
    base = next((r for r in rows if r["config"] == baseline and r["runnable"]), None)
    for r in rows:
        if not r["runnable"]:
            continue
        r["fast_access_vs_none"] = ratio(r["fast_access"], base and base["fast_access"])
        r["accesses_vs_none"] = ratio(r["accesses_per_s"], base and base["accesses_per_s"])
    return rows


def _f(x, fmt: str, none: str = "n/a") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, fmt)


def format_table(rows: list[dict]) -> str:
    """The side-by-side table (about 105 columns), then the rows that could not run."""
    head = (f"{'config':<20} {'fast acc':>8} {'x none':>6} {'end':>6} {'t->hot':>7} "
            f"{'MB moved':>8} {'vm MB':>6} {'pp':>5} {'peak MB':>7} {'mgr s':>6} {'prof s':>6} "
            f"{'acc/s x':>7}")
    out = [head]
    for r in rows:
        if not r["runnable"]:
            continue
        hot = _f(r["time_to_hot_mean"], ".1f", "--")
        hot = f"{hot}s" if hot != "--" else hot
        out.append(
            f"{r['config']:<20} {_f(r['fast_access'] and r['fast_access'] * 100, '.1f')+'%':>8} "
            f"{_f(r.get('fast_access_vs_none'), '.2f'):>6} "
            f"{_f(r['fast_access_end'] and r['fast_access_end'] * 100, '.0f')+'%':>6} "
            f"{hot:>7} {r['workload_moved_mb']:>8.1f} {r['migrated_mb']:>6.1f} {r['ping_pongs']:>5} "
            f"{r['peak_fast_mb']:>7.1f} "
            f"{_f(r['mgr_cpu_s'], '.2f'):>6} {_f(r['prof_cpu_s'], '.2f'):>6} "
            f"{_f(r.get('accesses_vs_none'), '.2f'):>7}")
    skipped = [r for r in rows if not r["runnable"]]
    if skipped:
        out.append("")
        out.append("not run:")
        out += [f"  {r['config']}: {r['reason']}" for r in skipped]
    return "\n".join(out)


def format_series(rows: list[dict], step: int = 5) -> str:
    """Share of accesses served by the fast node over time: ``step``-second means, in percent."""
    runnable = [r for r in rows if r["runnable"]]
    if not runnable:
        return ""
    n = max(len(r["fast_access_series"]) for r in runnable)
    cols = list(range(0, n, step))
    out = [f"{'fast-access % by second':<24}" + "".join(f"{c:>4}-" for c in cols)]
    for r in runnable:
        s = r["fast_access_series"]
        cells = []
        for c in cols:
            m = _mean(s[c:c + step])
            cells.append(f"{_f(None if m is None else m * 100, '.0f', ''):>5}")
        out.append(f"{r['config']:<24}" + "".join(cells))
    return "\n".join(out)
