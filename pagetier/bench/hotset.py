"""Scoring a profiler's hot set against a workload's known one, shared by the benchmark scripts
(scripts/bench_profilers.py: per-interval precision and recall of each backend, and its cost;
scripts/bench_kmod.py: precision and recall of pagetier.ko's frequency estimates) and their
tests. Moved here unchanged from those scripts."""
from __future__ import annotations

import statistics

import numpy as np


def top_k(score: np.ndarray, k: int) -> np.ndarray:
    """Mask of the units ranked in the top k by ``score`` (every unit tied with the k-th
    included; units scoring 0 never)."""
    if not len(score) or k <= 0:
        return np.zeros(len(score), bool)
    kth = np.sort(score)[::-1][min(k, len(score)) - 1]
    return (score >= kth) & (score > 0)


def prec_rec(pred: np.ndarray, truth: np.ndarray) -> tuple[float, float]:
    tp = int((pred & truth).sum())
    return (tp / pred.sum() if pred.sum() else 0.0), (tp / truth.sum() if truth.sum() else 0.0)


def overlap_pages(addr: np.ndarray, npages: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """4 KiB pages of each unit (addr, npages) that lie in [lo, hi)."""
    a = addr.astype(np.int64)
    b = a + npages.astype(np.int64) * 4096
    return np.maximum(0, np.minimum(b, hi) - np.maximum(a, lo)) // 4096


def top_units(value: np.ndarray, npages: np.ndarray, budget: int,
              rng: np.random.Generator) -> np.ndarray:
    """Indices of the units with value > 0, hottest first (ties in random order), until their
    pages reach ``budget``."""
    cand = np.flatnonzero(value > 0)
    cand = cand[rng.permutation(len(cand))]
    cand = cand[np.argsort(-value[cand], kind="stable")]
    pages = np.cumsum(npages[cand].astype(np.int64))
    n = int(np.searchsorted(pages, budget, side="left")) + 1  # the unit reaching the budget too
    return cand[:n]


def interval_scores(trace, ready: dict, metric: str, n_intervals: int | None = None,
                    skip: int = 1, seed: int = 0) -> list[dict]:
    """Per interval (after the first ``skip``): precision and recall of the top units by
    ``metric`` (``freq``: Sample.rates; ``count``) against the workload's hot range, and the
    mean freq per page of the hot range and of the rest of the buffer (a unit's freq on each of
    its pages; pages not reported count as 0). An interval without rows scores 0."""
    rng = np.random.default_rng(seed)
    hot_lo, hot_hi = ready["hot_addr"], ready["hot_addr"] + ready["hot_size"]
    buf_lo, buf_hi = ready["addr"], ready["addr"] + ready["size"]
    hot_pages = ready["hot_size"] // 4096
    cold_pages = ready["size"] // 4096 - hot_pages
    interval_s = trace.interval_s or 1.0
    frames = {i: g for i, _, g in trace.intervals()}
    n = n_intervals if n_intervals is not None else max(frames, default=-1) + 1
    out = []
    for i in range(skip, n):
        group = frames.get(i, {})
        s = next(iter(group.values()), None)
        if s is None or not len(s):
            out.append({"precision": 0.0, "recall": 0.0, "hot_freq": 0.0, "cold_freq": 0.0,
                        "estimated": False, "units": 0, "huge_units": 0})
            continue
        value = (s.rates(interval_s) if metric == "freq" else s.count).astype(np.float64)
        take = top_units(value, s.npages, hot_pages, rng)
        tp = int(overlap_pages(s.addr[take], s.npages[take], hot_lo, hot_hi).sum())
        pred = int(s.npages[take].astype(np.int64).sum())
        f = s.rates(interval_s).astype(np.float64)
        in_hot = overlap_pages(s.addr, s.npages, hot_lo, hot_hi)
        in_cold = overlap_pages(s.addr, s.npages, buf_lo, buf_hi) - in_hot
        out.append({"precision": tp / pred if pred else 0.0, "recall": tp / hot_pages,
                    "hot_freq": float((f * in_hot).sum() / hot_pages),
                    "cold_freq": float((f * in_cold).sum() / max(cold_pages, 1)),
                    "estimated": len(s.freq) == len(s),
                    "units": int(len(s)), "huge_units": int((s.npages > 1).sum())})
    return out


def summarize_scores(scores: list[dict]) -> dict:
    if not scores:
        return {"intervals": 0}
    p = [x["precision"] for x in scores]
    r = [x["recall"] for x in scores]
    return {"intervals": len(scores), "p_med": statistics.median(p), "p_min": min(p),
            "r_med": statistics.median(r), "r_min": min(r)}


def scan_ns(stats: dict) -> int | None:
    """The profiler's own CPU time (ns) from record_trace's per-pid stats (pagetier.ko: its
    scans plus its frequency probes)."""
    for st in stats.values():
        if not isinstance(st, dict):
            continue
        if "scan_ns" in st:
            return int(st["scan_ns"]) + int(st.get("probe_ns", 0))
        if "cpu_ns" in st:
            return int(st["cpu_ns"])
        if isinstance(st.get("marker"), dict) and "scan_ns" in st["marker"]:
            return int(st["marker"]["scan_ns"]) + int(st["marker"].get("probe_ns", 0))
    return None


# --- one run ----------------------------------------------------------------------------------
