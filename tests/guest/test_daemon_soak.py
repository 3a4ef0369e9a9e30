"""Soak: the daemon manages a churning target (churn: mmap/munmap/mremap/madvise/mprotect/fork)
and a moving hot set (hotcold --phase) for a long time. Every ~10 s the test samples the
daemon's RSS, the kernel's unreclaimable slab (where pagetier.ko's per-target memory lives) and
the daemon's status file, and checks that the status file's totals equal the sum of the JSON
stats lines so far and that bytes_moved equals the pages moved.

At the end: no growth trend of the daemon's RSS beyond noise, both workloads' memory checks
passed. The curve is printed and saved as JSON in $PAGETIER_VM_OUT/soak.json (scripts/hardening.sh
copies it to build/). The default run lasts 40 s; the long one (-m long) PAGETIER_SOAK_S seconds
(1800 by default).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from pagetier.profiler import kmod
from pagetier.workload import Workload, binary

from daemon_run import COUNTERS, DaemonRun, meminfo_kib, rss_kib, run_env

pytestmark = pytest.mark.vm
MIB_KIB = 1024


pytestmark = pytest.mark.usefixtures("kmod_loaded")


def check_counters(d: DaemonRun, timeout: float = 10) -> dict | None:
    """The status file's totals against the stats lines of the intervals it covers."""
    st = d.status()
    if st is None or st["last"] is None:
        return None
    n = st["last"]["interval"]
    t0 = time.monotonic()
    while not any(s["interval"] >= n for s in d.stats) and time.monotonic() - t0 < timeout:
        time.sleep(0.05)  # the line is written before the status file; the reader may lag
    lines = [s for s in list(d.stats) if s["interval"] <= n]
    sums = {k: sum(s[k] for s in lines) for k in COUNTERS}
    assert st["totals"] == sums, f"status file totals {st['totals']} != stats lines {sums}"
    assert sums["bytes_moved"] == (sums["promoted"] + sums["demoted"]) * 4096
    return st


def trend_kib(t: np.ndarray, v: np.ndarray) -> float:
    """Growth over the run by a least-squares line through the samples after warm-up (the
    first fifth of the managed time)."""
    keep = t >= t[0] + (t[-1] - t[0]) * 0.2
    if keep.sum() < 3:
        return 0.0
    slope = np.polyfit(t[keep], v[keep], 1)[0]
    return float(slope * (t[keep][-1] - t[keep][0]))


def sparkline(v, width: int = 60) -> str:
    bars = "▁▂▃▄▅▆▇█"
    v = [float(x) for x in np.asarray(v)[np.linspace(0, len(v) - 1, min(width, len(v))).astype(int)]]
    lo, hi = min(v), max(v)
    return "".join(bars[int((x - lo) / (hi - lo) * 7)] if hi > lo else bars[0] for x in v)


def soak(tmp_path, seconds: float, every: float = 10.0) -> dict:
    churn = subprocess.Popen([str(binary("churn")), str(seconds + 30)], stdout=subprocess.PIPE,
                             text=True)
    hot = Workload("--size", "64", "--hot", "24", "--phase", "5", "--start-node", "1",
                   "--duration", "0", "--quiet")
    d = DaemonRun(["attach", f"{churn.pid},{hot.pid}", "--json", "--fast-budget", "16M",
                   "--interval", "1", "--duration", str(seconds)], run_env(tmp_path))
    samples = []
    overran = False
    t0 = time.monotonic()
    try:
        while d.proc.poll() is None:
            time.sleep(min(every, max(0.1, seconds + 60 - (time.monotonic() - t0))))
            if d.proc.poll() is not None:
                break
            st = check_counters(d)
            if st is None:  # still starting (imports): its memory is not the daemon's yet
                continue
            try:
                rss = rss_kib(d.proc.pid)
            except FileNotFoundError:
                break
            if not rss:  # exited between the two reads
                break
            samples.append({
                "t": round(time.monotonic() - t0, 1), "rss_kib": rss,
                "sunreclaim_kib": meminfo_kib("SUnreclaim"), "slab_kib": meminfo_kib("Slab"),
                "intervals": st["last"]["interval"],
                "moved_pages": st["totals"]["promoted"] + st["totals"]["demoted"],
                "targets": len(st["targets"]),
                "units": st["last"]["units"],
                **st.get("memory", {}),  # state_kib; traced_kib under PYTHONTRACEMALLOC
            })
            if time.monotonic() - t0 > seconds + 1200:  # its start counts: imports can take minutes
                overran = True
                d.stop()
                break
        rc = d.finish()
    finally:
        if d.proc.poll() is None:
            d.stop()
        hot_rc = hot.stop()
        try:
            churn_out, _ = churn.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            churn.kill()
            churn_out, _ = churn.communicate()
    assert len(samples) >= 2, (samples, d.stderr[-3000:])
    assert (kmod.SYSFS / "targets").read_text() == "", "targets left attached after the daemon"

    t = np.array([s["t"] for s in samples])
    rss = np.array([s["rss_kib"] for s in samples], float)
    slab = np.array([s["sunreclaim_kib"] for s in samples], float)
    growth, slab_growth = trend_kib(t, rss), trend_kib(t, slab)
    moved = d.moved()
    result = {"kernel": platform.release(), "seconds": seconds, "intervals": len(d.stats),
              "moved_pages": moved, "rss_growth_kib": round(growth), "rss_median_kib":
              float(np.median(rss)), "sunreclaim_growth_kib": round(slab_growth),
              "churn": churn_out.strip(), "hotcold": hot.done, "samples": samples}
    print(f"soak: {seconds:.0f} s, {len(d.stats)} intervals, {moved} page migrations, "
          f"{len(samples)} samples")
    print(f"soak: daemon RSS MiB {rss[0] / MIB_KIB:.1f} -> {rss[-1] / MIB_KIB:.1f} "
          f"(min {rss.min() / MIB_KIB:.1f}, max {rss.max() / MIB_KIB:.1f}, trend "
          f"{growth / MIB_KIB:+.2f} MiB)  {sparkline(rss)}")
    print(f"soak: SUnreclaim MiB {slab[0] / MIB_KIB:.1f} -> {slab[-1] / MIB_KIB:.1f} "
          f"(trend {slab_growth / MIB_KIB:+.2f} MiB)  {sparkline(slab)}")
    if all("traced_kib" in s for s in samples):  # run with PYTHONTRACEMALLOC=1
        traced = np.array([s["traced_kib"] for s in samples], float)
        result["traced_growth_kib"] = round(trend_kib(t, traced))
        print(f"soak: traced by tracemalloc MiB {traced[0] / MIB_KIB:.2f} -> "
              f"{traced[-1] / MIB_KIB:.2f} (max {traced.max() / MIB_KIB:.2f}, trend "
              f"{result['traced_growth_kib'] / MIB_KIB:+.2f} MiB)  {sparkline(traced)}")
        top = d.stderr.partition("largest live allocations")[2]
        print("soak: largest live allocations at exit" + "\n".join(top.splitlines()[:13]))
    out = os.environ.get("PAGETIER_VM_OUT")
    if out:
        Path(out, "soak.json").write_text(json.dumps(result, indent=1))
    print("soak:   t(s)  RSS(MiB)  SUnreclaim(MiB)  moved  units")
    step = max(1, len(samples) // 20)
    for s in samples[::step]:
        print(f"soak: {s['t']:6.0f}  {s['rss_kib'] / MIB_KIB:8.1f}  {s['sunreclaim_kib'] / MIB_KIB:15.1f}"
              f"  {s['moved_pages']:6d}  {s['units']:5d}")
    assert not overran, "the daemon did not stop at --duration"
    assert rc == 0, d.stderr[-3000:]
    assert "--duration" in d.stderr and "stopping" in d.stderr
    assert hot_rc == 0 and hot.done["pages_corrupt"] == 0, hot.done
    assert churn.returncode == 0, churn_out
    if "traced_growth_kib" in result:
        # tracemalloc's own bookkeeping and its snapshot at exit inflate RSS: judge what it traced
        assert result["traced_growth_kib"] < MIB_KIB, \
            f"memory traced by tracemalloc grows: {result['traced_growth_kib'] / MIB_KIB:+.2f} MiB"
    else:
        # flat: the fitted growth stays within noise (4 MiB or 5% of the median, whichever is more)
        assert growth < max(4 * MIB_KIB, 0.05 * float(np.median(rss))), \
            f"daemon RSS grows: {growth / MIB_KIB:+.1f} MiB over the run"
    assert slab_growth < 8 * MIB_KIB, f"unreclaimable slab grows: {slab_growth / MIB_KIB:+.1f} MiB"
    assert moved > 0
    return result


def test_soak_short(tmp_path):
    soak(tmp_path, 40, every=4)


@pytest.mark.long
def test_soak_long(tmp_path):
    soak(tmp_path, float(os.environ.get("PAGETIER_SOAK_S", "1800")))
