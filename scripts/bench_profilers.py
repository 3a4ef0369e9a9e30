#!/usr/bin/env python3
"""Accuracy and cost of the profiler backends on the built-in workload (run as root, in the VM).

Each cell of a grid records hotcold (256 MiB, a known 32 MiB hot range, ``--noise-ppm`` of its
accesses sent anywhere) with one backend into a trace, at 1 s intervals; one hotcold process per
(noise, THP) is recorded by each backend in turn, and its memory checked at the end. The grid:

- backends: kmod fault, kmod abit, damon (6.12: DAMON's sysfs), bpf with kmod's marks (where
  bcc runs);
- noise 0, 10, 100, 1000 accesses per million going anywhere in the buffer;
- transparent huge pages on and off (hotcold's ``--no-thp``).

For every interval but the first (the attach and DAMON's first regions), the units are ranked by
a metric, ties in random order, and taken, hottest first, until they cover the hot set's size:
precision is the share of the taken pages that are hot, recall the share of the hot pages taken.
Each cell prints the median and the minimum over intervals, once ranked by ``freq``
(``Sample.rates``: the backend's estimate of accesses per second, or its count over the interval
when it gave none: the ``est`` column says which) and once by ``count``, and the ratio of the
two medians (freq / count: above 1, the frequency estimate ranks better; a backend whose freq is
a monotone function of its count, such as DAMON's, ranks the same either way). ``hot/cold`` is
the mean freq per page of the hot range over that of the rest of the buffer (a unit's freq on
each of its pages, pages not reported as 0); ``whole`` is the old whole-run measure (every unit
counted in the last 3 intervals, as one set); ``2M/units``: units of 2 MiB and all units in
the last interval.

``CPU`` is the profiler's own scan time per second of recording per GiB of the workload's
buffer, in percent of one CPU: pagetier.ko's ``scan_ns`` (STATS; for bpf, the time of the kmod
marker that makes its faults, the BPF program's own time is not counted), or the kdamond
thread's user + system time from /proc/PID/stat.

    scripts/vm -k 6.12 -- python scripts/bench_profilers.py            # the full grid
    scripts/vm -k 6.12 -- python scripts/bench_profilers.py --quick    # noise 0 and 100, THP on
    scripts/vm -k 6.1 -- python scripts/bench_profilers.py --only kmod-fault --noise 100

The cost before a change: save a run's cells with ``--save FILE`` (e.g. on main, before a
module change), then give it as ``--baseline FILE`` to a later run: each cell then also shows
its CPU as a ratio to the same cell of the baseline (``CPU x``), and its per-interval median
precision by freq against the baseline's (``P x``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# the scoring is shared with bench_kmod.py and the tests (these names are used through this module)
from pagetier.bench.hotset import (interval_scores, overlap_pages, scan_ns,  # noqa: F401
                                    summarize_scores, top_units)

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "guest"))

SIZE_MB, HOT_MB, HOT_OFFSET_MB = 256, 32, 100
WORKLOAD = ["--size", str(SIZE_MB), "--hot", str(HOT_MB), "--hot-offset", str(HOT_OFFSET_MB),
            "--duration", "0", "--quiet"]
# name -> (backend, options)
CONFIGS = {
    "kmod-fault": ("kmod", {"mode": "fault", "kinds": "off", "scan_period_ms": 200}),
    "kmod-abit": ("kmod", {"mode": "abit", "scan_period_ms": 200}),
    "damon": ("damon", {}),
    # the workload alone on CPU 1; the recorder and kdamond on CPU 0 (DAMON clears Accessed
    # bits without a TLB flush: alone on its CPU, the workload keeps its cached translations)
    "damon-alone": ("damon", {"pin": True, "cpus": "0"}),
    "damon-fine": ("damon", {"sample_us": 1000, "aggr_ms": 200, "min_regions": 100}),
    "bpf+kmod-marks": ("bpf", {"mark": "kmod", "scan_period_ms": 200}),
}
GRID_CONFIGS = ["kmod-fault", "kmod-abit", "damon", "bpf+kmod-marks"]
GRID_NOISE = [0, 10, 100, 1000]
QUICK_NOISE = [0, 100]


def ensure_tracefs() -> None:
    """bcc finds tracepoints and kprobes through debugfs/tracefs; the test VM may not mount them.
    (Only for the guest: on a real machine, mount them yourself if you want them.)"""
    import subprocess

    for fs, where in (("debugfs", "/sys/kernel/debug"), ("tracefs", "/sys/kernel/tracing")):
        if os.path.isdir(where) and not os.listdir(where):
            subprocess.run(["mount", "-t", fs, fs, where], capture_output=True)


def available(backend: str) -> str | None:
    """Why ``backend`` cannot run here, or None."""
    from pagetier.errors import Unavailable

    if backend == "damon" and not os.path.exists("/sys/kernel/mm/damon/admin"):
        return f"no DAMON sysfs in {platform.release()}"
    if backend == "bpf":
        from pagetier.profiler.bpf import BpfProfiler

        try:
            BpfProfiler.probe()
        except Unavailable as e:
            return str(e)
    return None


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


# --- per-interval scores ----------------------------------------------------------------------
def measure(name: str, backend: str, options: dict, seconds: float = 6.0, last: int = 3,
            workload: list[str] | None = None, outdir: str | None = None, running=None,
            prof=None) -> dict:
    """Record the workload with one backend; whole-run and per-interval precision and recall.

    ``running``: a Workload already running to record (it is left running, and
    ``workload_exit`` is None); ``prof``: a profiler to use and leave open (bpf compiles its
    program once per instance)."""
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
    own = prof is None
    prof = prof or create(backend, **options)
    try:
        if running is not None:
            if pin:
                raise RuntimeError("a pinned config starts its own workload")
            w, rc = running, None
            summary = record_trace(prof, [w.pid], path, interval_s=1.0, duration=seconds,
                                   nodes=False)
        else:
            with Workload(*(workload or [*WORKLOAD, "--no-thp"]), cmd_prefix=prefix) as w:
                summary = record_trace(prof, [w.pid], path, interval_s=1.0, duration=seconds,
                                       nodes=False)
                rc = w.stop()
    finally:
        if own:
            prof.close()
        if pin:
            os.sched_setaffinity(0, set(range(os.cpu_count())))
    trace = read_trace(path)
    p, r, n = precision_recall(merged(trace, last), w.ready)
    by_freq = interval_scores(trace, w.ready, "freq", summary["intervals"])
    by_count = interval_scores(trace, w.ready, "count", summary["intervals"])
    cpu = scan_ns(summary["stats"])
    gib = w.ready["size"] / 2**30
    hot = [x["hot_freq"] for x in by_freq]
    cold = [x["cold_freq"] for x in by_freq]
    return {"name": name, "backend": backend, "options": options, "precision": round(p, 3),
            "recall": round(r, 3), "pages_counted": n,
            "hot_pages": w.ready["hot_size"] // 4096, "intervals": summary["intervals"],
            "rows": summary["rows"], "workload_exit": rc, "seconds": round(time.monotonic() - t0, 1),
            "trace": path, "stats": summary["stats"],
            "by_freq": summarize_scores(by_freq), "by_count": summarize_scores(by_count),
            "per_interval": by_freq,
            "estimated": any(x["estimated"] for x in by_freq),
            "hot_freq": statistics.mean(hot) if hot else 0.0,
            "cold_freq": statistics.mean(cold) if cold else 0.0,
            "cpu_pct_per_gib": (None if cpu is None else
                                100 * cpu / 1e9 / max(summary["seconds"], 1e-3) / gib),
            "counted_per_interval": [int(sum((x.count > 0).sum() for x in g.values()))
                                     for _, _, g in trace.intervals()]}


def workload_args(noise: int, thp: bool, cold_rate: int = 0) -> list[str]:
    return ([*WORKLOAD, "--noise-ppm", str(noise)] + ([] if thp else ["--no-thp"])
            + (["--cold-rate", str(cold_rate)] if cold_rate else []))


def cells(configs: list[str], noise: int, thp: bool, seconds: float, profs: dict,
          outdir: str | None = None, cold_rate: int = 0, show=None) -> list[dict]:
    """One workload (noise, THP), recorded by each config in turn; its memory is checked once
    at the end (``workload_exit``, the same for every cell of the group)."""
    from pagetier.errors import PagetierError
    from pagetier.workload import Workload

    out = []
    with Workload(*workload_args(noise, thp, cold_rate)) as w:
        for config in configs:
            backend, options = CONFIGS[config]
            tag = {"config": config, "noise_ppm": noise, "thp": thp}
            why = available(backend)
            if why:
                out.append({**tag, "error": why})
            else:
                name = f"{config}-n{noise}-{'thp' if thp else 'nothp'}"
                try:
                    res = measure(name, backend, options, seconds=seconds, outdir=outdir,
                                  running=w, prof=profs.get(config))
                    out.append({**res, **tag})
                except (PagetierError, RuntimeError) as e:
                    out.append({**tag, "error": str(e)})
            if show:
                show(out[-1])
        rc = w.stop()
    for r in out:
        r["workload_exit"] = rc
    return out


# --- output -----------------------------------------------------------------------------------
def _f(x, fmt="4.2f") -> str:
    return "-" if x is None else format(x, fmt)


def table(results: list[dict]) -> str:
    """The old whole-run table (one row per backend run)."""
    lines = [f"{'backend':<16} {'precision':>9} {'recall':>7} {'counted':>8} {'hot':>7} {'s':>5}"]
    for r in results:
        if "error" in r:
            lines.append(f"{r['name']:<16} {'-':>9} {'-':>7}  {r['error'][:50]}")
            continue
        lines.append(f"{r['name']:<16} {r['precision']:9.3f} {r['recall']:7.3f} "
                     f"{r['pages_counted']:8d} {r['hot_pages']:7d} {r['seconds']:5.0f}")
    return "\n".join(lines)


def _key(r: dict) -> tuple:
    return (r.get("config"), bool(r.get("thp")), int(r.get("noise_ppm", -1)))


def grid_table(results: list[dict], baseline: list[dict] | None = None) -> str:
    base = {_key(b): b for b in baseline or [] if "error" not in b}
    head = (f"{'config':<15} {'thp':>3} {'noise':>5} {'est':>3} | {'by freq: P med/min':>18} "
            f"{'R med/min':>9} | {'by count: P med/min':>19} {'R med/min':>9} | {'P f/c':>5} "
            f"| {'hot/cold':>8} {'whole P/R':>9} {'CPU%/GiB':>8} 2M/units"
            + (f" | {'CPU x':>5} {'P x':>5}" if base else ""))
    lines = [head, "-" * len(head)]
    for r in results:
        tag = f"{r['config']:<15} {'on' if r['thp'] else 'off':>3} {r['noise_ppm']:>5}"
        if "error" in r:
            lines.append(f"{tag}  {r['error'][:90]}")
            continue
        f, c = r["by_freq"], r["by_count"]
        if not f.get("intervals"):
            lines.append(f"{tag}  no interval to score ({r['intervals']} read)")
            continue
        ratio = f["p_med"] / c["p_med"] if c["p_med"] else None
        hc = r["hot_freq"] / r["cold_freq"] if r["cold_freq"] else None
        units = r["per_interval"][-1]
        lines.append(
            f"{tag} {'yes' if r['estimated'] else 'no':>3} | "
            f"{f['p_med']:>9.2f}/{f['p_min']:<4.2f}    {f['r_med']:4.2f}/{f['r_min']:<4.2f} | "
            f"{c['p_med']:>10.2f}/{c['p_min']:<4.2f}    {c['r_med']:4.2f}/{c['r_min']:<4.2f} | "
            f"{_f(ratio, '5.2f'):>5} | {_f(hc, '8.1f'):>8} {r['precision']:4.2f}/{r['recall']:<4.2f} "
            f"{_f(r['cpu_pct_per_gib'], '8.2f'):>8} {units['huge_units']:>3}/{units['units']:<4}")
        b = base.get(_key(r))
        if base:
            cpu_x = (r["cpu_pct_per_gib"] / b["cpu_pct_per_gib"]
                     if b and r["cpu_pct_per_gib"] and b.get("cpu_pct_per_gib") else None)
            p_x = (f["p_med"] / b["by_freq"]["p_med"]
                   if b and b.get("by_freq", {}).get("p_med") else None)
            lines[-1] += f" | {_f(cpu_x, '5.2f'):>5} {_f(p_x, '5.2f'):>5}"
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="recording length per cell")
    ap.add_argument("--quick", action="store_true",
                    help=f"noise {', '.join(map(str, QUICK_NOISE))} only, THP on only")
    ap.add_argument("--only", action="append", help=f"configs to run ({', '.join(CONFIGS)}; "
                                                    f"default {', '.join(GRID_CONFIGS)})")
    ap.add_argument("--noise", help="noise levels, comma-separated (default 0,10,100,1000)")
    ap.add_argument("--thp", choices=["on", "off", "both"], help="default both (--quick: on)")
    ap.add_argument("--cold-rate", type=int, default=0, help="hotcold --cold-rate HZ")
    ap.add_argument("--save", metavar="FILE", help="write the cells as JSON, for --baseline")
    ap.add_argument("--baseline", metavar="FILE",
                    help="cells saved by an earlier run (--save): print CPU and precision ratios")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
    from pagetier.errors import PagetierError
    from pagetier.profiler import kmod
    from pagetier.profiler.base import create

    if os.environ.get("PAGETIER_IN_GUEST"):
        ensure_tracefs()
    noise = ([int(x) for x in args.noise.split(",")] if args.noise
             else QUICK_NOISE if args.quick else GRID_NOISE)
    thp = {"on": [True], "off": [False], "both": [True, False]}[
        args.thp or ("on" if args.quick else "both")]
    configs = args.only or GRID_CONFIGS
    print(f"# kernel {platform.release()}: hotcold {SIZE_MB} MiB, hot {HOT_MB} MiB, "
          f"{args.seconds:g} s per cell at 1 s intervals, first interval not scored", flush=True)
    results, t0 = [], time.monotonic()
    profs = {}
    try:
        for config in configs:  # bpf: compile the program once for the whole grid
            backend, options = CONFIGS[config]
            if backend == "bpf" and available(backend) is None:
                try:
                    profs[config] = create(backend, **options)
                except PagetierError as e:
                    print(f"# {config}: {e}", flush=True)
        for t in thp:
            for n in noise:
                results += cells(configs, n, t, args.seconds, profs, cold_rate=args.cold_rate,
                                 show=lambda r: print(grid_table([r], baseline).splitlines()[-1],
                                                      flush=True))
    finally:
        for p in profs.values():
            p.close()
        kmod.unload_module()
    print()
    print(grid_table(results, baseline))
    bad = sorted({r["workload_exit"] for r in results if r.get("workload_exit")})
    print(f"# {len(results)} cells in {time.monotonic() - t0:.0f} s; workload memory check: "
          + (f"FAILED (exit {bad})" if bad else "intact"))
    for r in results:
        r.pop("per_interval", None)
    if args.save:
        Path(args.save).write_text(json.dumps(results))
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
