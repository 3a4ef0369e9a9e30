#!/usr/bin/env python3
"""Side-by-side accuracy of the profiler backends on the built-in workload (run as root, in the VM).

Each backend records the same kind of run: hotcold with a known hot range, recorded for a few
intervals into a trace; the pages counted in the last intervals are compared with the truth
(precision: counted pages that are hot; recall: hot pages that were counted).

    pagetier vm run -k 6.12 -- python scripts/bench_profilers.py
    pagetier vm run -k 6.12 -- python scripts/bench_profilers.py --json --seconds 8
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "guest"))

WORKLOAD = ["--size", "256", "--hot", "26", "--hot-offset", "100", "--duration", "0", "--quiet",
            "--no-thp"]
# name -> (backend, options)
CONFIGS = {
    "kmod-fault": ("kmod", {"mode": "fault", "scan_period_ms": 200}),
    "kmod-abit": ("kmod", {"mode": "abit", "scan_period_ms": 200}),
    "damon": ("damon", {}),
    # the workload alone on CPU 1; the recorder and kdamond on CPU 0 (docs/kernel-facts.md: DAMON
    # clears Accessed bits without a TLB flush)
    "damon-alone": ("damon", {"pin": True, "cpus": "0"}),
    "damon-fine": ("damon", {"sample_us": 1000, "aggr_ms": 200, "min_regions": 100}),
    "bpf+kmod-marks": ("bpf", {"mark": "kmod", "scan_period_ms": 200}),
}


def ensure_tracefs() -> None:
    """bcc finds tracepoints and kprobes through debugfs/tracefs; the test VM may not mount them.
    (Only for the guest: on a real machine, mount them yourself if you want them.)"""
    import subprocess

    for fs, where in (("debugfs", "/sys/kernel/debug"), ("tracefs", "/sys/kernel/tracing")):
        if os.path.isdir(where) and not os.listdir(where):
            subprocess.run(["mount", "-t", fs, fs, where], capture_output=True)


def merged(trace, last: int):
    """One Sample per pid: counts of the last ``last`` intervals summed per unit."""
    from pagetier.profiler.base import Sample

    frames = list(trace.intervals())[-last:]
    addr = np.concatenate([s.addr for _, _, g in frames for s in g.values()] or [np.zeros(0, np.uint64)])
    count = np.concatenate([s.count for _, _, g in frames for s in g.values()]
                           or [np.zeros(0, np.uint32)]).astype(np.uint64)
    npages = np.concatenate([s.npages for _, _, g in frames for s in g.values()]
                            or [np.zeros(0, np.uint16)])
    u, inv = np.unique(addr, return_inverse=True)
    tot = np.zeros(len(u), np.uint64)
    np.add.at(tot, inv, count)
    np_u = np.ones(len(u), np.uint16)
    np_u[inv] = npages
    return Sample(pid=0, addr=u, count=np.minimum(tot, 2**32 - 1).astype(np.uint32),
                  node=np.full(len(u), -1, np.int16), npages=np_u)


def measure(name: str, backend: str, options: dict, seconds: float = 6.0, last: int = 3,
            workload: list[str] | None = None, outdir: str | None = None) -> dict:
    """Record the workload with one backend; precision and recall of its hot set."""
    from helpers import precision_recall

    from pagetier.profiler.base import create
    from pagetier.profiler.record import record_trace
    from pagetier.profiler.trace import read_trace
    from pagetier.workload import Workload

    # in the test VM, keep the traces where the host can see them
    outdir = outdir or os.environ.get("PAGETIER_VM_OUT") or tempfile.mkdtemp(prefix="pagetier-bench-")
    path = os.path.join(outdir, f"{name}.parquet")
    t0 = time.monotonic()
    options = dict(options)
    pin = options.pop("pin", False)
    prefix = []
    if pin:
        if os.cpu_count() < 2:
            raise RuntimeError("pinning needs two CPUs")
        prefix = ["taskset", "-c", "1"]
        os.sched_setaffinity(0, {0})
    prof = create(backend, **options)
    try:
        with Workload(*(workload or WORKLOAD), cmd_prefix=prefix) as w:
            summary = record_trace(prof, [w.pid], path, interval_s=1.0, duration=seconds,
                                   nodes=False)
            rc = w.stop()
    finally:
        prof.close()
        if pin:
            os.sched_setaffinity(0, set(range(os.cpu_count())))
    trace = read_trace(path)
    p, r, n = precision_recall(merged(trace, last), w.ready)
    return {"name": name, "backend": backend, "options": options, "precision": round(p, 3),
            "recall": round(r, 3), "pages_counted": n,
            "hot_pages": w.ready["hot_size"] // 4096, "intervals": summary["intervals"],
            "rows": summary["rows"], "workload_exit": rc, "seconds": round(time.monotonic() - t0, 1),
            "trace": path, "stats": summary["stats"],
            "counted_per_interval": [int(sum((x.count > 0).sum() for x in g.values()))
                                     for _, _, g in trace.intervals()]}


def table(results: list[dict]) -> str:
    lines = [f"{'backend':<16} {'precision':>9} {'recall':>7} {'counted':>8} {'hot':>7} {'s':>5}"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['name']:<16} {'-':>9} {'-':>7}  {r['error'][:50]}")
            continue
        lines.append(f"{r['name']:<16} {r['precision']:9.3f} {r['recall']:7.3f} "
                     f"{r['pages_counted']:8d} {r['hot_pages']:7d} {r['seconds']:5.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0, help="recording length per backend")
    ap.add_argument("--last", type=int, default=3, help="intervals merged for the hot set")
    ap.add_argument("--only", action="append", help=f"configs to run ({', '.join(CONFIGS)})")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from pagetier.errors import PagetierError
    from pagetier.profiler import kmod

    if os.environ.get("PAGETIER_IN_GUEST"):
        ensure_tracefs()
    results = []
    for name, (backend, options) in CONFIGS.items():
        if args.only and name not in args.only:
            continue
        try:
            results.append(measure(name, backend, options, args.seconds, args.last))
        except PagetierError as e:
            results.append({"name": name, "backend": backend, "error": str(e)})
    kmod.unload_module()
    print(table(results))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
