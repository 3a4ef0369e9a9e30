#!/usr/bin/env python3
"""Benchmarks of the daemon's own costs.

1. Interval cost against the tracked size: a stub profiler tracks 4 GiB .. 64 GiB of 4 KiB
   units (1M .. 16M units), a ``--hot`` fraction of them accessed every interval (1% and 5%
   by default) with noisy rates. Like pagetier.ko's READ, it lists only the accessed units
   when asked for them (READ_ACCESSED_ONLY) and every tracked unit otherwise (a complete read,
   which is what finds unmapped units). A small part of the hot set changes every interval
   (``--churn``); a stub mover records the daemon's moves and the stub's nodes follow them
   (``--dry-run``: plan the same moves every interval instead). Intervals are timed in parts:
   merging the samples into the PageState, the policy's decision, and the whole step (CPU
   time; the mean over the intervals, so that the daemon's periodic complete read counts
   at its share, and the worst interval; the stub's own time generating its samples, the
   kernel's work with pagetier.ko, is left out of the step). The same runs with a baseline revision's code
   (``--baseline``, default main: exported with git archive and run in a child process), side
   by side, as ratios. "%core/GiB" is the step's CPU per interval over a 1 s interval, per
   GiB tracked; "B/unit" the state's bytes per tracked unit.
2. move_pages throughput of pagetier.core.mover against a plain batched numa_move_pages loop
   over the same pages (pages/s and the ratio). With one node (the host) both "move" to node 0
   (the kernel checks each page and finds it in place); with two (the VM) each round moves the
   pages to the other node.

Usage:
  .venv/bin/python scripts/bench_daemon.py [--sizes 4G,64G] [--hot 0.01,0.05] [--intervals 17]
                                           [--baseline main] [--baseline-intervals N]
                                           [--move-size 64M] [--rounds 6] [--policy heuristic]
  scripts/vm -- .venv/bin/python scripts/bench_daemon.py --sizes 64M --move-size 256M
"""
from __future__ import annotations

import argparse
import ctypes
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

PAGE = 4096


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

    cfg = config_mod.load(None, {"policy": policy, "profiler": "stub", "dry_run": dry,
                                 "fast_budget": size // 2, "rate": 0, "json": True})
    cfg.handle_signals, cfg.status_file = False, "/dev/null"
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
        step.append(stats["cpu_s"] - Kstub.read_s)
    # the first interval creates the state: report the steady state
    mean = lambda xs: statistics.mean(xs[1:]) * 1000  # noqa: E731
    return {"size": size, "units": units, "state_b": d.state.nbytes / units,
            "moved": d.totals["promoted"] + d.totals["demoted"],
            "merge_ms": mean(merge), "decide_ms": mean(decide), "step_ms": mean(step),
            "max_ms": max(step[1:]) * 1000}


def baseline_tree(rev: str) -> Path:
    """``rev``'s pagetier exported into a temporary tree laid out as the installed package."""
    tmp = Path(tempfile.mkdtemp(prefix="pagetier-baseline-"))
    pkg = tmp / "pagetier"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pagetier", "daemon",
                              "profiler", "policies", "kmod/include"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    for sub in ("daemon", "profiler", "policies"):
        (tmp / sub).rename(pkg / sub)
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
    if argv[:1] == ["--worker"]:  # one measurement, as JSON (in a baseline's tree)
        size, intervals, policy, hot, churn, dry = argv[1:7]
        print(json.dumps(bench_intervals(int(size), int(intervals), policy, float(hot),
                                         float(churn), dry == "1")))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4G,64G", help="tracked sizes (default %(default)s)")
    ap.add_argument("--hot", default="0.01,0.05",
                    help="fractions of the units accessed each interval (default %(default)s)")
    ap.add_argument("--intervals", type=int, default=17,
                    help="intervals measured after the first (default %(default)s: one "
                         "complete read among them)")
    ap.add_argument("--churn", type=float, default=0.02,
                    help="fraction of the hot set replaced each interval (default %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="plan without moving (the same moves are planned every interval); "
                         "default: a stub mover records the moves, the stub's nodes follow")
    ap.add_argument("--baseline", default="main",
                    help="git revision to compare with; 'none' to skip (default %(default)s)")
    ap.add_argument("--baseline-intervals", type=int, default=None,
                    help="intervals measured for the baseline (default: as --intervals, so that "
                         "both means include the complete read; fewer halve the run but leave "
                         "it out of the baseline's mean)")
    ap.add_argument("--baseline-max-size", default="64G",
                    help="skip the baseline above this size (default %(default)s)")
    ap.add_argument("--policy", default="heuristic")
    ap.add_argument("--move-size", default="64M")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--skip-move", action="store_true")
    a = ap.parse_args(argv)
    if a.baseline_intervals is None:
        a.baseline_intervals = a.intervals
    if a.rounds < 1 and not a.skip_move:
        ap.error(f"--rounds must be at least 1, got {a.rounds} (--skip-move skips part 2)")

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
