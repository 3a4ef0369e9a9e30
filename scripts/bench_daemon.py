#!/usr/bin/env python3
"""Benchmarks of the daemon's own costs.

1. Interval bookkeeping and decision time against the tracked size: a stub profiler reports
   64 MiB .. 4 GiB of 4 KiB units (16K .. 1M units, a quarter of them hot); one dry-run
   interval of the Daemon is timed in parts: merging the sample into the PageState, the
   policy's decision, and the whole step (CPU time, median of several intervals; the step
   includes the stub generating its sample, which a real profiler does in the kernel).
2. move_pages throughput of pagetier.core.mover against a plain batched numa_move_pages loop
   over the same pages (pages/s and the ratio). With one node (the host) both "move" to node 0
   (the kernel checks each page and finds it in place); with two (the VM) each round moves the
   pages to the other node.

Usage:
  .venv/bin/python scripts/bench_daemon.py [--sizes 64M,256M,1G,4G] [--intervals 5]
                                           [--move-size 64M] [--rounds 6] [--policy heuristic]
  scripts/vm -- .venv/bin/python scripts/bench_daemon.py --sizes 64M --move-size 256M
"""
from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagetier.daemon import config as config_mod  # noqa: E402
from pagetier.core import mover  # noqa: E402
from pagetier.daemon.loop import Daemon  # noqa: E402
from pagetier.profiler.stub import StubProfiler  # noqa: E402

PAGE = 4096


def bench_intervals(size: int, intervals: int, policy: str) -> dict:
    units = size // PAGE
    hot = units // 4
    rng = np.random.default_rng(1)
    addr = np.uint64(0x7F0000000000) + np.arange(units, dtype=np.uint64) * np.uint64(PAGE)
    node = np.where(rng.random(units) < 0.5, 0, 1).astype(np.int16)

    def source(pid, i):
        count = np.zeros(units, np.uint32)
        count[:hot] = rng.integers(1, 50, hot)  # the hot quarter, noisy counts
        return (addr, count, node, 1)

    cfg = config_mod.load(None, {"policy": policy, "profiler": "stub", "dry_run": True,
                                 "fast_budget": size // 2, "rate": 0, "json": True})
    cfg.handle_signals, cfg.status_file = False, "/dev/null"
    prof = StubProfiler(source=source)
    from pagetier import policies

    d = Daemon(cfg, pids=[1], profiler=prof, policy=policies.create(policy), numab=False,
               out=open(os.devnull, "w"))
    d.tracker.alive = lambda pid: True
    d.tracker.attach(1)
    merge, decide, step = [], [], []
    for i in range(intervals + 1):
        stats = d.step()
        merge.append(stats["merge_s"])
        decide.append(stats["decide_s"])
        step.append(stats["cpu_s"])
    # the first interval creates the state: report the steady state
    med = lambda xs: statistics.median(xs[1:]) * 1000  # noqa: E731
    return {"size": size, "units": units, "state_mib": d.state.nbytes / 2**20,
            "merge_ms": med(merge), "decide_ms": med(decide), "step_ms": med(step)}


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
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64M,256M,1G,4G", help="tracked sizes (default %(default)s)")
    ap.add_argument("--intervals", type=int, default=5)
    ap.add_argument("--policy", default="heuristic")
    ap.add_argument("--move-size", default="64M")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--skip-move", action="store_true")
    a = ap.parse_args(argv)

    print("1. one dry-run interval, stub profiler, 4 KiB units, 1/4 hot "
          f"(policy {a.policy}, CPU ms, median of {a.intervals})")
    print(f"{'tracked':>8} {'units':>8} {'state':>8} {'merge':>8} {'decide':>8} {'step':>8}")
    for s in a.sizes.split(","):
        r = bench_intervals(config_mod.parse_size(s), a.intervals, a.policy)
        print(f"{s:>8} {r['units']:>8} {r['state_mib']:>6.1f}M {r['merge_ms']:>8.1f} "
              f"{r['decide_ms']:>8.1f} {r['step_ms']:>8.1f}")
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
