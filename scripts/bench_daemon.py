#!/usr/bin/env python3
"""Benchmarks of the daemon's own costs.

1. Interval cost against the tracked size: a stub profiler tracks 4 GiB .. 64 GiB of 4 KiB
   units (1M .. 16M units), a ``--hot`` fraction of them accessed every interval (1% and 5%
   by default) with noisy rates. Like pagetier.ko's READ, it lists only the accessed units
   when asked for them (READ_ACCESSED_ONLY) and every tracked unit otherwise (a complete read,
   which is what finds unmapped units; spread over 16 intervals, one part each, where the code
   reads parts). A small part of the hot set changes every interval
   (``--churn``); a stub mover records the daemon's moves and the stub's nodes follow them
   (``--dry-run``: plan the same moves every interval instead). Intervals are timed in parts:
   merging the samples into the PageState, the policy's decision, and the whole step with
   the status file's write that follows it in the daemon's loop (CPU time; the mean over the intervals, so that the daemon's periodic complete read counts
   at its share, and the worst interval; the stub's own time generating its samples, the
   kernel's work with pagetier.ko, is left out of the step). The same runs with a baseline revision's code
   (``--baseline``, default main: exported with git archive and run in a child process), side
   by side, as ratios. "%core/GiB" is the step's CPU per interval over a 1 s interval, per
   GiB tracked; "B/unit" the state's bytes per tracked unit.
2. ``--scale``: the native scale run. Footprints of 64 GiB, 1 TiB and 4 TiB (``--sizes``), 1%
   and 5% of the memory accessed per interval (``--hot``), clustered as real hot sets are
   (runs of 2-64 MiB for nine runs in ten, of under 2 MiB for the rest, at random places; 2% of
   the runs replaced each interval) plus 100 ppm of the 4 KiB pages accessed anywhere (noise,
   new each interval; ``--noise 0,100`` runs each cell without it and with it, to show what
   scattered single accesses cost: each lands in a region of its own). The stub lists region units (2 MiB of 4 KiB pages, pagetier.ko's
   granularity "region": counts summed over the pages of each region), the accessed ones each
   interval and one part in 16 of every region (``Profiler.read_part``: the complete read,
   spread). Per size: the daemon's CPU per 1 s interval (mean of ``--intervals``, the first
   interval, which creates the state, left out; the stub's own time is the kernel's work and
   left out too), as % of one core, the worst interval over the median, the state's bytes and
   the records read per interval. Beside it, the code before (``--baseline``, default d4ff290)
   at page granularity on the same accesses, where its state fits in memory (64 GiB: 16.8
   million units; 1 TiB would be 268 million, 11.8 GB of state); with
   ``--baseline-granularity region``, at region granularity and every size (to compare two
   revisions of the region-unit daemon). ``--repeat N`` alternates N runs of each and reports
   the median (the host's speed drifts within minutes).
3. move_pages throughput of pagetier.core.mover against a plain batched numa_move_pages loop
   over the same pages (pages/s and the ratio). With one node (the host) both "move" to node 0
   (the kernel checks each page and finds it in place); with two (the VM) each round moves the
   pages to the other node.

Usage:
  .venv/bin/python scripts/bench_daemon.py [--sizes 4G,64G] [--hot 0.01,0.05] [--intervals 17]
                                           [--baseline main] [--baseline-intervals N]
                                           [--move-size 64M] [--rounds 6] [--policy heuristic]
  scripts/vm -- .venv/bin/python scripts/bench_daemon.py --sizes 64M --move-size 256M
  .venv/bin/python scripts/bench_daemon.py --scale [--sizes 64G,1T,4T] [--hot 0.01,0.05] [--noise 100]
                                           [--baseline d4ff290] [-o docs/daemon-scale.md]
                                           [--baseline-granularity region] [--repeat 3]
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# --worker runs inside a baseline's exported tree: import that tree's pagetier
sys.path.insert(0, os.environ.get("PAGETIER_BENCH_ROOT", str(ROOT)))

from pagetier.daemon import config as config_mod  # noqa: E402
from pagetier.core import mover  # noqa: E402
from pagetier.daemon.loop import Daemon  # noqa: E402
from pagetier.profiler.base import Sample  # noqa: E402
from pagetier.profiler.stub import StubProfiler  # noqa: E402

try:  # a baseline from before read_part has no parts
    from pagetier.profiler.base import part_span  # noqa: E402
except ImportError:
    part_span = None

PAGE = 4096


def _status_s(d) -> float:
    """CPU seconds of the status file's write that ends each of the daemon's intervals (its
    run loop writes it after every step: per-target and per-cgroup bytes, the last stats)."""
    t0 = time.process_time()
    d.write_status()
    return time.process_time() - t0


def bench_intervals(size: int, intervals: int, policy: str, hot_frac: float = 0.02,
                    churn: float = 0.02, dry: bool = False) -> dict:
    units = size // PAGE
    hot = max(1, int(units * hot_frac))
    rng = np.random.default_rng(1)
    base = 0x7F0000000000
    addr = np.uint64(base) + np.arange(units, dtype=np.uint64) * np.uint64(PAGE)
    node = np.where(rng.random(units) < 0.4, 0, 1).astype(np.int16)  # 80% of the budget
    hot_idx = np.sort(rng.choice(units, hot, replace=False))
    n_churn = int(hot * churn)

    class Mover:
        """Moves nothing in the kernel; the stub's nodes follow the moves (as the kernel's)."""

        def move(self, pid, addrs, to):
            node[((np.asarray(addrs, np.uint64) - np.uint64(base)) // np.uint64(PAGE)).astype(
                np.int64)] = to
            return mover.MoveResult(moved=np.arange(len(addrs)))

    class Kstub(StubProfiler):
        """Reads as pagetier.ko's READ: the accessed units only, or every tracked unit."""

        read_s = 0.0  # the stub's own CPU: generating a sample is the kernel's work

        def read(self, pid, reset=True, accessed_only=False):
            t0 = time.process_time()
            try:
                return self._read(pid, accessed_only)
            finally:
                Kstub.read_s += time.process_time() - t0

        def _read(self, pid, accessed_only):
            nonlocal hot_idx
            self.attached[pid] += 1
            if n_churn:  # a few hot units go cold, as many others become hot
                hot_idx[rng.choice(len(hot_idx), n_churn, replace=False)] = rng.choice(units, n_churn)
                hot_idx = np.unique(hot_idx)
            count = rng.integers(1, 50, len(hot_idx)).astype(np.uint32)  # noisy counts
            if accessed_only:
                return Sample(pid=pid, addr=addr[hot_idx], count=count, node=node[hot_idx],
                              npages=np.ones(len(hot_idx), np.uint16), complete=False)
            full = np.zeros(units, np.uint32)
            full[hot_idx] = count
            return Sample(pid=pid, addr=addr, count=full, node=node,
                          npages=np.ones(units, np.uint16), complete=True)

        def read_part(self, pid, part, parts):
            """One part of the complete read (as pagetier.ko's range read); none in a baseline
            from before parts."""
            if part_span is None:
                return None
            t0 = time.process_time()
            try:
                start, end = part_span(base, base + size, part, parts)
                lo = max(0, -(-(start - base) // PAGE))
                hi = min(units, max(0, -(-(end - base) // PAGE)))
                return Sample(pid=pid, addr=addr[lo:hi], count=np.zeros(hi - lo, np.uint32),
                              node=node[lo:hi], npages=np.ones(hi - lo, np.uint16),
                              span=(start, end))
            finally:
                Kstub.read_s += time.process_time() - t0

    cfg = config_mod.load(None, {"policy": policy, "profiler": "stub", "dry_run": dry,
                                 "fast_budget": size // 2, "rate": 0, "json": True})
    cfg.handle_signals, cfg.status_file = False, os.path.join(tempfile.mkdtemp(), "status.json")
    prof = Kstub()
    from pagetier import policies

    d = Daemon(cfg, pids=[1], profiler=prof, policy=policies.create(policy), numab=False,
               mover=Mover(), out=open(os.devnull, "w"))
    d.tracker.alive = lambda pid: True
    d.tracker.attach(1)
    merge, decide, step = [], [], []
    for i in range(intervals + 1):
        Kstub.read_s = 0.0
        stats = d.step()
        merge.append(stats["merge_s"])
        decide.append(stats["decide_s"])
        step.append(stats["cpu_s"] - Kstub.read_s + _status_s(d))
    # the first interval creates the state: report the steady state
    mean = lambda xs: statistics.mean(xs[1:]) * 1000  # noqa: E731
    return {"size": size, "units": units, "state_b": d.state.nbytes / units,
            "moved": d.totals["promoted"] + d.totals["demoted"],
            "merge_ms": mean(merge), "decide_ms": mean(decide), "step_ms": mean(step),
            "max_ms": max(step[1:]) * 1000}

# --------------------------------------------------------------------------- the scale run
HUGE_PAGES = 512
NOISE_PPM = 100
SCALE_CHURN = 0.02  # share of the hot runs replaced each interval
BASE = 0x7F0000000000


class ClusteredAccesses:
    """Each interval's accessed 4 KiB pages of a ``size`` footprint: a hot set of runs (nine in
    ten 2-64 MiB long, the rest under 2 MiB, at random places) covering about ``hot_frac`` of
    the pages, a ``churn`` share of the runs replaced each interval, plus ``noise_ppm`` of the
    pages anywhere (one access each), new each interval. Kept as runs, never as one array of
    every page."""

    def __init__(self, size: int, hot_frac: float, churn: float = SCALE_CHURN, seed: int = 1,
                 noise_ppm: float = NOISE_PPM):
        self.pages = size // PAGE
        self.noise_ppm = noise_ppm
        # a stream of its own: the hot runs are the same whatever the noise
        self.noise_rng = np.random.default_rng(seed + 1)
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        want = int(self.pages * hot_frac)
        # mean run length: 0.9 * mean(log-uniform 512..16384) + 0.1 * 256 pages
        mean = 0.9 * (16384 - 512) / np.log(16384 / 512) + 0.1 * 256
        n = max(1, int(round(want / mean)))
        self.start, self.length = self._runs(n)
        self.per_page = rng.integers(1, 50, n).astype(np.int64)  # accesses per page of a run
        self.n_churn = int(round(n * churn))

    def _runs(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        rng = self.rng
        long_ = rng.random(n) < 0.9
        length = np.where(long_, np.exp(rng.uniform(np.log(512), np.log(16384), n)),
                          rng.integers(1, 512, n)).astype(np.int64)
        start = rng.integers(0, self.pages - length)
        return start.astype(np.int64), length

    def advance(self) -> None:
        if self.n_churn:
            k = self.rng.choice(len(self.start), self.n_churn, replace=False)
            self.start[k], self.length[k] = self._runs(self.n_churn)
            self.per_page[k] = self.rng.integers(1, 50, self.n_churn)

    def noise(self) -> np.ndarray:
        return self.noise_rng.integers(0, self.pages, int(self.pages * self.noise_ppm / 1e6))

    def regions(self, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted region indices with an access, their accesses summed over their pages)."""
        first = self.start // HUGE_PAGES
        last = (self.start + self.length - 1) // HUGE_PAGES
        nreg = last - first + 1
        run = np.repeat(np.arange(len(first)), nreg)
        reg = first[run] + (np.arange(len(run)) - np.repeat(np.cumsum(nreg) - nreg, nreg))
        lo = np.maximum(self.start[run], reg * HUGE_PAGES)
        hi = np.minimum(self.start[run] + self.length[run], (reg + 1) * HUGE_PAGES)
        idx = np.concatenate([reg, noise // HUGE_PAGES])
        cnt = np.concatenate([(hi - lo) * self.per_page[run], np.ones(len(noise), np.int64)])
        u, inv = np.unique(idx, return_inverse=True)
        return u, np.bincount(inv.reshape(-1), weights=cnt, minlength=len(u)).astype(np.int64)

    def page_set(self, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted page indices with an access, their accesses)."""
        run = np.repeat(np.arange(len(self.start)), self.length)
        off = np.arange(len(run)) - np.repeat(np.cumsum(self.length) - self.length, self.length)
        idx = np.concatenate([self.start[run] + off, noise])
        cnt = np.concatenate([self.per_page[run], np.ones(len(noise), np.int64)])
        u, inv = np.unique(idx, return_inverse=True)
        return u, np.bincount(inv.reshape(-1), weights=cnt, minlength=len(u)).astype(np.int64)


def bench_scale(size: int, intervals: int, policy: str, hot_frac: float,
                granularity: str = "region", noise_ppm: float = NOISE_PPM) -> dict:
    """The daemon over ``intervals`` intervals (after the first) of ClusteredAccesses, with a
    stub reading as pagetier.ko at ``granularity`` ("region" or "page"), a stub mover whose
    moves the stub's nodes follow; runs on this tree or a baseline's (``--scale-worker``)."""
    region = granularity == "region"
    unit_pages = HUGE_PAGES if region else 1
    units = size // PAGE // unit_pages
    acc = ClusteredAccesses(size, hot_frac, noise_ppm=noise_ppm)
    rng = np.random.default_rng(2)
    addr = np.uint64(BASE) + np.arange(units, dtype=np.uint64) * np.uint64(PAGE * unit_pages)
    node = np.where(rng.random(units) < 0.4, 0, 1).astype(np.int16)  # 80% of the budget
    npages = np.full(units, unit_pages, np.uint16)
    kw = {"region": np.ones(units, bool)} if region else {}  # a baseline's Sample has none
    records = []  # records read per interval
    on_fast = []  # per interval: the share of its accesses on the fast node (0) as read

    def sample(pid, sel, count, complete, span=None):
        extra = {k: v[sel] for k, v in kw.items()}
        if span is not None:
            extra["span"] = span
        records.append(len(addr[sel]))
        return Sample(pid=pid, addr=addr[sel], count=np.minimum(count, 2**32 - 1).astype(np.uint32),
                      node=node[sel], npages=npages[sel], complete=complete, **extra)

    class Mover:
        """move_pages as the stub sees it: the units' nodes follow; its time is the kernel's."""

        def move(self, pid, addrs, to, region=None):
            t0 = time.process_time()
            i = ((np.asarray(addrs, np.uint64) - np.uint64(BASE))
                 // np.uint64(PAGE * unit_pages)).astype(np.int64)
            node[i] = to
            res = mover.MoveResult(moved=np.arange(len(addrs)))
            if region is not None:
                res.region_pages = {"moved": int(np.count_nonzero(region)) * HUGE_PAGES}
            Kstub.read_s += time.process_time() - t0
            return res

    class Kstub(StubProfiler):
        read_s = 0.0  # the stub's own CPU (its reads and moves): the kernel's work

        def read(self, pid, reset=True, accessed_only=False):
            t0 = time.process_time()
            try:
                self.attached[pid] += 1
                acc.advance()
                sel, count = (acc.regions if region else acc.page_set)(acc.noise())
                if reset:  # a read proper, not a look between reads
                    on_fast.append(float(count[node[sel] == 0].sum()) / max(1, count.sum()))
                if accessed_only:
                    return sample(pid, sel, count, False)
                full = np.zeros(units, np.int64)
                full[sel] = count
                return sample(pid, slice(None), full, True)
            finally:
                Kstub.read_s += time.process_time() - t0

        def read_part(self, pid, part, parts):
            t0 = time.process_time()
            try:
                start, end = part_span(BASE, BASE + size, part, parts)
                step = PAGE * unit_pages
                lo = max(0, -(-(start - BASE) // step))
                hi = min(units, max(0, -(-(end - BASE) // step)))
                sel = slice(lo, hi)
                return sample(pid, sel, np.zeros(hi - lo, np.int64), True, (start, end))
            finally:
                Kstub.read_s += time.process_time() - t0

    # the default migration rate (512 MB/s): what the daemon moves in an interval as it would
    cfg = config_mod.load(None, {"policy": policy, "profiler": "stub", "dry_run": False,
                                 "fast_budget": size // 2, "json": True})
    cfg.handle_signals, cfg.status_file = False, os.path.join(tempfile.mkdtemp(), "status.json")
    from pagetier import policies

    prof = Kstub()  # (a baseline's daemon never asks for a part)
    d = Daemon(cfg, pids=[1], profiler=prof, policy=policies.create(policy), numab=False,
               mover=Mover(), out=open(os.devnull, "w"))
    d.tracker.alive = lambda pid: True
    d.tracker.attach(1)
    step, recs, merge, decide = [], [], [], []
    for i in range(intervals + 1):
        Kstub.read_s = 0.0
        n0 = len(records)
        stats = d.step()
        step.append(stats["cpu_s"] - Kstub.read_s + _status_s(d))
        merge.append(stats["merge_s"])
        decide.append(stats["decide_s"])
        recs.append(sum(records[n0:]))
    steady = step[1:]
    med = statistics.median(steady)
    return {"size": size, "units": units, "granularity": granularity,
            "accessed": float(np.mean([r for r in recs[1:]])),
            "step_ms": statistics.mean(steady) * 1000, "median_ms": med * 1000,
            "merge_ms": statistics.mean(merge[1:]) * 1000,
            "decide_ms": statistics.mean(decide[1:]) * 1000,
            "max_ms": max(steady) * 1000, "worst_ratio": max(steady) / med if med else 0.0,
            "state_bytes": int(d.state.nbytes), "records": statistics.mean(recs[1:]),
            # placement: the accesses on the fast node, mean over the intervals after the
            # first, and in the last one
            "on_fast": statistics.mean(on_fast[1:]), "on_fast_last": on_fast[-1],
            "moved": d.totals["promoted"] + d.totals["demoted"]}


def fmt_bytes(n: float) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.1f} {unit}"
    return f"{n:.0f} B"


def run_scale(a, tree) -> int:
    """The native scale run (``--scale``): print the table; with ``-o`` append it to a file."""
    sizes = a.sizes or "64G,1T,4T"
    max_base = config_mod.parse_size(a.baseline_max_size)
    head = ["tracked", "accessed", "noise ppm", "records/interval", "merge ms", "decide ms",
            "CPU ms/interval", "% of a core", "worst/median", "state", "on fast", "before: CPU ms",
            "before: % core", "before: worst/median", "before: state", "before: on fast",
            "ratio"]
    rows = []
    print(f"scale run: stub profiler at region granularity, daemon policy {a.policy}, mean of "
          f"{a.intervals} intervals of 1 s; accessed: clustered runs (90% of 2-64 MiB) plus "
          f"{a.noise} ppm of the pages anywhere (noise); on fast: the share of the accesses "
          f"each read found on the fast node, mean over the intervals / in the last one")
    if tree is not None:
        print(f"before: {a.baseline} at {bgran_text(a)}, same accesses")
    if a.repeat > 1:
        print(f"each figure: the median of {a.repeat} runs (this tree and the baseline "
              f"alternating)")
    print(f"this tree's compiled helpers: {lookups_text()}")
    print(" | ".join(head))
    bgran = a.baseline_granularity
    for s in sizes.split(","):
        size = config_mod.parse_size(s)
        for h, ppm in ((float(x), float(n)) for x in a.hot.split(",")
                       for n in a.noise.split(",")):
            base_runs = tree is not None and (bgran == "region" or size <= max_base)
            # with --repeat, this tree's and the baseline's runs alternate (the host's speed
            # drifts within minutes); each figure is the run with the median CPU per interval
            mine, theirs = [], []
            for _ in range(a.repeat):
                mine.append(run_scale_worker(None, size, a.intervals, a.policy, h, "region",
                                             ppm))
                if base_runs:
                    theirs.append(run_scale_worker(tree, size, a.baseline_intervals, a.policy,
                                                   h, bgran, ppm))
            r = median_run(mine)
            row = [s, f"{h:.0%}", f"{ppm:g}", f"{r['records']:,.0f}", f"{r['merge_ms']:.1f}",
                   f"{r['decide_ms']:.1f}", f"{r['step_ms']:.1f}",
                   f"{r['step_ms'] / 10:.2f}%", f"{r['worst_ratio']:.2f}",
                   fmt_bytes(r["state_bytes"]), on_fast_text(r)]
            if tree is None:
                row += ["-"] * 6
            elif not base_runs:
                units = size // PAGE
                row += [f"not run: {units / 1e6:,.0f} M page units, "
                        f"{fmt_bytes(units * 44)} of state", "-", "-", "-", "-", "-"]
            else:
                b = median_run(theirs)
                row += [f"{b['step_ms']:.1f}", f"{b['step_ms'] / 10:.2f}%",
                        f"{b['worst_ratio']:.2f}", fmt_bytes(b["state_bytes"]), on_fast_text(b),
                        f"{b['step_ms'] / r['step_ms']:.{1 if bgran == 'region' else 0}f}x"]
            rows.append(row)
            print(" | ".join(row), flush=True)
    if a.output:
        table = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        table += ["| " + " | ".join(r) + " |" for r in rows]
        day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        cmd = (f"--scale --sizes {sizes} --hot {a.hot} --noise {a.noise} "
               f"--intervals {a.intervals} --baseline {a.baseline}")
        if bgran == "region":
            cmd += " --baseline-granularity region"
        if a.repeat > 1:
            cmd += f" --repeat {a.repeat}"
        text = (f"\n### {day}: native scale run, region units\n\n"
                f"`scripts/bench_daemon.py {cmd}`: the stub profiler lists region units "
                f"(2 MiB of 4 KiB pages), the accessed ones each interval and 1/16 of all of them "
                f"(the complete read, spread); accessed: clustered runs (nine in ten of 2-64 MiB) "
                f"plus the noise: that many ppm of the pages anywhere, one access each, in a "
                f"region of its own as a rule; CPU per 1 s interval, mean of "
                f"{a.intervals} (merge: the reads into the PageState; decide: the policy), the "
                f"stub's own time (its reads and moves: the kernel's work) left out; the default "
                f"migration rate (512 MB/s); on fast: the share of the accesses each read "
                f"found on the fast node, mean over the intervals / in the last one (every "
                f"unit starts on a random node, 40% fast). \"before\": {a.baseline} at "
                f"{bgran_text(a)} on the same accesses. This tree's compiled helpers: "
                f"{lookups_text()}."
                + (f" Each figure: the median of {a.repeat} runs, this tree's and the "
                   f"baseline's alternating." if a.repeat > 1 else "")
                + "\n\n" + "\n".join(table) + "\n")
        with open(a.output, "a") as f:
            f.write(text)
        print(f"appended to {a.output}")
    return 0


def on_fast_text(r: dict) -> str:
    """A run's placement: the share of the accesses read on the fast node, mean / last."""
    if "on_fast" not in r:
        return "-"
    return f"{r['on_fast']:.3f} / {r['on_fast_last']:.3f}"


def lookups_text() -> str:
    """Whether this tree's compiled helpers are in use (pagetier/core/sorted_find.py and
    row_merge.py)."""
    try:
        from pagetier.core import sorted_find
    except ImportError:  # a tree from before them
        return "numpy"
    try:
        from pagetier.core import row_merge
    except ImportError:  # a tree with the sorted lookups only
        return "compiled (build/native)" if sorted_find.native() else "numpy (library not built)"
    both = {sorted_find.native(), row_merge.native()}
    if both == {True}:
        return "compiled (build/native), with the row passes"
    return "numpy (libraries not built)" if both == {False} else "partly compiled"


def bgran_text(a) -> str:
    """How the baseline is run, for the scale run's heading."""
    if a.baseline_granularity == "region":
        return "region granularity (the same units as this tree)"
    return (f"page granularity (4 KiB units), run only where its state fits (up to "
            f"{a.baseline_max_size})")


def median_run(runs: list[dict]) -> dict:
    """Of several runs of one measurement, the one with the median CPU per interval."""
    return sorted(runs, key=lambda r: r["step_ms"])[(len(runs) - 1) // 2]


def run_scale_worker(tree: Path | None, size: int, intervals: int, policy: str, hot: float,
                     granularity: str, noise_ppm: float = NOISE_PPM) -> dict:
    """One scale measurement in a child process (each starts with a clean heap): this tree's
    code, or ``tree``'s (a baseline)."""
    env = dict(os.environ)
    if tree is not None:
        env["PAGETIER_BENCH_ROOT"] = str(tree)
    out = subprocess.run([sys.executable, __file__, "--scale-worker", str(size), str(intervals),
                          policy, str(hot), granularity, str(noise_ppm)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def baseline_tree(rev: str, dest: Path | None = None) -> Path:
    """``rev``'s pagetier exported into a tree laid out as the installed package: ``dest``
    (created), or a temporary directory."""
    if dest is None:
        tmp = Path(tempfile.mkdtemp(prefix="pagetier-baseline-"))
    else:
        tmp = dest
        tmp.mkdir(parents=True)
    pkg = tmp / "pagetier"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pagetier", "daemon",
                              "profiler", "policies", "kmod/include"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    for sub in ("daemon", "profiler", "policies"):
        (tmp / sub).rename(pkg / sub)
    native = pkg / "core" / "native"
    if (native / "Makefile").is_file():  # its compiled lookups, where it has them, as installed
        subprocess.run(["make", "-s", "-C", str(native), f"OUT={native / 'lib'}"], check=True)
    return tmp


def run_worker(tree: Path, size: int, intervals: int, policy: str, hot: float, churn: float,
               dry: bool) -> dict:
    env = dict(os.environ, PAGETIER_BENCH_ROOT=str(tree))
    out = subprocess.run([sys.executable, __file__, "--worker", str(size), str(intervals), policy,
                          str(hot), str(churn), "1" if dry else "0"], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def raw_loop(addrs: np.ndarray, node: int, batch: int = mover.BATCH) -> int:
    """The plain way: numa_move_pages over fixed batches, nothing else."""
    f = mover.libnuma().numa_move_pages
    n = len(addrs)
    nodes = np.full(batch, node, np.int32)
    status = np.zeros(batch, np.int32)
    done = 0
    for s in range(0, n, batch):
        a = addrs[s:s + batch]
        f(0, len(a), a.ctypes.data, nodes.ctypes.data, status.ctypes.data, mover.MPOL_MF_MOVE)
        done += int((status[:len(a)] == node).sum())
    return done


def bench_move(size: int, rounds: int) -> dict:
    nodes = config_mod.nodes_with_memory()
    targets = [0, 1] if 1 in nodes else [0, 0]
    buf = mmap.mmap(-1, size)
    buf.write(b"\x01" * size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    addrs = np.arange(base, base + size, PAGE, dtype=np.uint64)
    res = {"pages": len(addrs), "nodes": targets}
    for name, fn in (("mover", lambda node: len(mover.move(0, addrs, node).moved)),
                     ("raw", lambda node: raw_loop(addrs, node))):
        rates = []
        for r in range(rounds):
            node = targets[r % 2]
            t0 = time.perf_counter()
            moved = fn(node)
            dt = time.perf_counter() - t0
            if moved < 0.9 * len(addrs):
                print(f"  warning: {name} round {r}: only {moved} of {len(addrs)} pages moved",
                      file=sys.stderr)
            rates.append(moved / dt)
        res[name] = statistics.median(rates)
    mover.move(0, addrs, 0)
    del buf
    return res


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--scale-worker"]:  # one scale measurement, as JSON (maybe in a baseline)
        size, intervals, policy, hot, gran, noise = argv[1:7]
        print(json.dumps(bench_scale(int(size), int(intervals), policy, float(hot), gran,
                                     float(noise))))
        return 0
    if argv[:1] == ["--worker"]:  # one measurement, as JSON (in a baseline's tree)
        size, intervals, policy, hot, churn, dry = argv[1:7]
        print(json.dumps(bench_intervals(int(size), int(intervals), policy, float(hot),
                                         float(churn), dry == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", action="store_true",
                    help="the native scale run (region units, 64 GiB to 4 TiB) instead of 1-2")
    ap.add_argument("--sizes", default=None,
                    help="tracked sizes (default 4G,64G; with --scale 64G,1T,4T)")
    ap.add_argument("--hot", default="0.01,0.05",
                    help="fractions of the units accessed each interval (default %(default)s)")
    ap.add_argument("--intervals", type=int, default=17,
                    help="intervals measured after the first (default %(default)s: one "
                         "complete read among them)")
    ap.add_argument("--noise", default=f"{NOISE_PPM}",
                    help="--scale: accesses anywhere, in ppm of the pages (one each, new every "
                         "interval), comma-separated for several runs (default %(default)s)")
    ap.add_argument("--churn", type=float, default=0.02,
                    help="fraction of the hot set replaced each interval (default %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="plan without moving (the same moves are planned every interval); "
                         "default: a stub mover records the moves, the stub's nodes follow")
    ap.add_argument("--baseline", default=None,
                    help="git revision to compare with; 'none' to skip (default main; with "
                         "--scale d4ff290, the code before region units)")
    ap.add_argument("--baseline-intervals", type=int, default=None,
                    help="intervals measured for the baseline (default: as --intervals, so that "
                         "both means include the complete read; fewer halve the run but leave "
                         "it out of the baseline's mean)")
    ap.add_argument("--baseline-max-size", default="64G",
                    help="skip the baseline above this size (default %(default)s; --scale: "
                         "at page granularity only)")
    ap.add_argument("--baseline-granularity", choices=("page", "region"), default="page",
                    help="--scale: the baseline's units (default %(default)s: 4 KiB, the code "
                         "before region units; region: the same units as this tree, every "
                         "size)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="--scale: runs of each measurement, this tree's and the baseline's "
                         "alternating; the median is reported (default %(default)s)")
    ap.add_argument("--policy", default="heuristic")
    ap.add_argument("--move-size", default="64M")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--skip-move", action="store_true")
    ap.add_argument("-o", "--output", metavar="FILE",
                    help="--scale: append the table to FILE (markdown, a dated section)")
    a = ap.parse_args(argv)
    if a.baseline_intervals is None:
        a.baseline_intervals = a.intervals
    if a.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {a.repeat}")
    if a.rounds < 1 and not a.skip_move:
        ap.error(f"--rounds must be at least 1, got {a.rounds} (--skip-move skips part 2)")

    if a.baseline is None:
        a.baseline = "d4ff290" if a.scale else "main"
    def fail(msg: str) -> int:
        print(f"bench_daemon.py: {msg}", file=sys.stderr)
        return 1

    if a.output and not a.scale:
        return fail("-o/--output goes with --scale")
    if a.output and not os.access(os.path.dirname(os.path.abspath(a.output)), os.W_OK):
        return fail(f"-o {a.output}: cannot write there")
    try:
        for x in (a.sizes or "64G").split(","):
            config_mod.parse_size(x)
        [float(h) for h in a.hot.split(",")]
        if any(float(n) < 0 for n in a.noise.split(",")):
            raise ValueError(f"--noise must not be negative, got {a.noise}")
    except (ValueError, config_mod.ConfigError) as e:
        return fail(f"--sizes/--hot/--noise: {e}")
    if a.scale:
        tree = None if a.baseline == "none" else baseline_tree(a.baseline)
        try:
            return run_scale(a, tree)
        finally:
            if tree is not None:
                subprocess.run(["rm", "-rf", str(tree)], check=False)
    a.sizes = a.sizes or "4G,64G"
    tree = None if a.baseline == "none" else baseline_tree(a.baseline)
    print(f"1. {'dry-run ' if a.dry_run else ''}intervals, stub profiler reading as pagetier.ko, "
          f"4 KiB units, fast budget half, 80% used, {a.churn:.0%} of the hot set new each "
          f"interval\n   "
          f"(policy {a.policy}; CPU ms per interval: mean of {a.intervals}, worst)")
    if tree is not None:
        print(f"   baseline: {a.baseline} (mean of {a.baseline_intervals}); ratio = baseline / this")
    print(f"{'tracked':>7} {'hot':>4} {'units':>9} {'B/unit':>6} {'merge':>7} {'decide':>7} "
          f"{'step':>7} {'worst':>7} {'%core/GiB':>9} | {'base step':>9} {'%core/GiB':>9} "
          f"{'B/unit':>6} {'ratio':>6}")
    try:
        for s in a.sizes.split(","):
            size = config_mod.parse_size(s)
            for h in (float(x) for x in a.hot.split(",")):
                r = bench_intervals(size, a.intervals, a.policy, h, a.churn, a.dry_run)
                pct = r["step_ms"] / 1000 / (size / 2**30) * 100
                line = (f"{s:>7} {h * 100:>3.0f}% {r['units']:>9} {r['state_b']:>6.1f} "
                        f"{r['merge_ms']:>7.1f} {r['decide_ms']:>7.1f} {r['step_ms']:>7.1f} "
                        f"{r['max_ms']:>7.1f} {pct:>9.3f} |")
                if tree is not None and size <= config_mod.parse_size(a.baseline_max_size):
                    b = run_worker(tree, size, a.baseline_intervals, a.policy, h, a.churn,
                                   a.dry_run)
                    bpct = b["step_ms"] / 1000 / (size / 2**30) * 100
                    line += (f" {b['step_ms']:>9.1f} {bpct:>9.3f} {b['state_b']:>6.1f} "
                             f"{b['step_ms'] / r['step_ms']:>5.1f}x")
                print(line, flush=True)
    finally:
        if tree is not None:
            subprocess.run(["rm", "-rf", str(tree)], check=False)
    if a.skip_move:
        return 0
    m = bench_move(config_mod.parse_size(a.move_size), a.rounds)
    print(f"\n2. move_pages, {m['pages']} pages of our own, rounds to nodes "
          f"{m['nodes'][0]}/{m['nodes'][1]} alternately (median of {a.rounds})")
    print(f"{'':>10} {'pages/s':>12}")
    print(f"{'mover':>10} {m['mover']:>12,.0f}")
    print(f"{'raw loop':>10} {m['raw']:>12,.0f}")
    print(f"{'ratio':>10} {m['mover'] / m['raw']:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
