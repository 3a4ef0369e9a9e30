#!/usr/bin/env python3
"""Benchmark pagetier.ko: time per scan in each mode and the workload's slowdown, in one run.

Runs inside the test VM (it boots one when started on the host):
    scripts/bench_kmod.py [--size-mb 1024] [--seconds 10] [--kernel 6.12]
For each of: no module attached, fault mode, abit mode, it runs the built-in workload over
SIZE MiB (hot part 1/8) for SECONDS and prints accesses per second, the slowdown against the
unattached run, and the module's time per scan.

Then the frequency probes (--freq-scans N, 0 skips them): for each mode, THP on and off, and
noise 0/10/100/1000 per million accesses sent to random pages (hotcold --noise-ppm), one
workload of 256 MiB with 32 MiB hot runs N scan periods with probes off (probe_windows 0), then
N with probes on. Printed per cell: the module's scan + probe time per GiB tracked per second of
run, probes on against off (the cost ratio), and the per-interval precision and recall of the
top-k units (k: the hot part's units; ties at the k-th score included) ranked by the interval's
count and by freq.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagetier.bench.hotset import prec_rec, top_k  # noqa: E402


def xa_bytes() -> int:
    """Bytes in the kernel's radix_tree_node slab (xarray nodes): the module's count storage."""
    with open("/proc/slabinfo") as f:
        for line in f:
            if line.startswith("radix_tree_node "):
                _, active, _, objsize, *_ = line.split()
                return int(active) * int(objsize)
    return 0


def run_one(mode: str | None, size: int, seconds: int, period_ms: int) -> dict:
    from pagetier.profiler import kmod
    from pagetier.workload import Workload

    with Workload("--size", str(size), "--hot", str(size // 8), "--duration", str(seconds),
                  "--no-thp") as w:
        st = {}
        mem = 0
        if mode:
            dev = kmod.Device()
            before = xa_bytes()
            dev.attach(w.pid, mode, scan_period_ms=period_ms)
            while dev.stats(w.pid)["scans"] < 1:
                time.sleep(0.05)
            mem = xa_bytes() - before
        while w.next_tick() is not None:  # stats while the target lives
            if mode:
                st = dev.stats(w.pid)
        rc = w.proc.wait()
        if mode:
            try:
                dev.detach(w.pid)
            except kmod.KmodError:
                pass
            dev.close()
    done = w.done or {}
    return {"mode": mode or "none", "rc": rc, "accesses_per_s": done.get("accesses", 0) / max(done.get("seconds", 1), 1e-9),
            "scans": st.get("scans", 0), "scan_ms": st.get("scan_ns", 0) / 1e6 / max(st.get("scans", 1), 1),
            "pages": st.get("pages_tracked", 0), "faults": st.get("faults", 0),
            "bytes_per_page": mem / max(st.get("pages_tracked", 1), 1)}


FREQ_NOISE_PPM = (0, 10, 100, 1000)


def run_freq(mode: str, thp: bool, noise_ppm: int, scans: int, period_ms: int) -> dict:
    """One cell: N periods with probes off, then N with probes on, one workload."""
    from pagetier.profiler import kmod
    from pagetier.workload import Workload

    knob, marks = kmod.SYSFS / "probe_windows", kmod.SYSFS / "probe_fault_marks"
    windows = knob.read_text().strip()
    marks.write_text("1" if mode == "fault-marks" else "0")
    args = ["--size", "256", "--hot", "32", "--duration", "0", "--quiet",
            "--noise-ppm", str(noise_ppm), *([] if thp else ["--no-thp"])]
    out = {"mode": mode, "thp": thp, "noise": noise_ppm}
    dev = kmod.Device()
    with Workload(*args) as w:
        hot_lo, hot_hi = w.ready["hot_addr"], w.ready["hot_addr"] + w.ready["hot_size"]
        dev.attach(w.pid, mode.split("-")[0], scan_period_ms=period_ms)
        try:
            for phase, on in (("off", False), ("on", True)):
                knob.write_text(windows if on else "0")
                st0 = wait_scan(dev, w.pid)  # the first period of the phase starts here
                dev.read(w.pid, reset=True)
                t0 = time.monotonic()
                pr = {"count": [], "freq": []}
                for _ in range(scans):
                    st = wait_scan(dev, w.pid)
                    rec = dev.read(w.pid, reset=True)
                    inbuf = (rec["addr"] >= w.ready["addr"]) & \
                            (rec["addr"] < w.ready["addr"] + w.ready["size"])
                    rec = rec[inbuf]
                    truth = (rec["addr"] >= hot_lo) & (rec["addr"] < hot_hi)
                    k = int(truth.sum())
                    for key in pr:
                        pr[key].append(prec_rec(top_k(rec[key].astype(np.float64), k), truth))
                secs = time.monotonic() - t0
                gib = w.ready["size"] / 2**30  # the workload's buffer: nearly all it maps
                busy = (st["scan_ns"] - st0["scan_ns"]) + (st["probe_ns"] - st0["probe_ns"])
                out[f"cpu_{phase}"] = busy / 1e9 / secs / gib  # CPU s per s per GiB
                out[f"probe_share_{phase}"] = (st["probe_ns"] - st0["probe_ns"]) / max(busy, 1)
                out[f"scans_{phase}"] = st["scans"] - st0["scans"]
                for key, vals in pr.items():
                    out[f"{key}_{phase}"] = tuple(float(np.mean(v)) for v in zip(*vals))
        finally:
            knob.write_text(windows)
            marks.write_text("0")
            dev.detach(w.pid)
            dev.close()
        out["rc"] = w.stop()
    return out


def wait_scan(dev, pid: int, timeout: float = 120) -> dict:
    """Stats once the target's next scan (and its probes) has ended."""
    start = dev.stats(pid)["scans"]
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        st = dev.stats(pid)
        if st["scans"] > start:
            return st
        time.sleep(0.02)
    raise TimeoutError("no scan in time")


def freq_table(scans: int, period_ms: int, modes: list[str]) -> bool:
    import platform

    rows = [run_freq(m, thp, n, scans, period_ms)
            for m in modes for thp in (True, False) for n in FREQ_NOISE_PPM]
    print(f"\nfrequency probes on {platform.release()}: 256 MiB, 32 MiB hot, scan every "
          f"{period_ms} ms, {scans} periods per phase; top-k precision/recall per interval")
    print(f"{'mode':<11} {'thp':<5} {'ppm':>5} {'count P/R':>11} {'freq P/R':>11} "
          f"{'cpu off':>9} {'cpu on':>9} {'ratio':>6} {'probe%':>6} {'+probe':>6}")
    for r in rows:
        print(f"{r['mode']:<11} {'on' if r['thp'] else 'off':<5} {r['noise']:>5} "
              f"{r['count_on'][0]:>5.2f}/{r['count_on'][1]:<5.2f} "
              f"{r['freq_on'][0]:>5.2f}/{r['freq_on'][1]:<5.2f} "
              f"{r['cpu_off'] * 1e3:>8.1f}m {r['cpu_on'] * 1e3:>8.1f}m "
              f"{r['cpu_on'] / max(r['cpu_off'], 1e-12):>5.2f}x {r['probe_share_on'] * 100:>5.1f}% "
              f"{1 / max(1 - r['probe_share_on'], 1e-9):>5.2f}x")
    print("fault-marks: fault mode probing with hinting marks (probe_fault_marks 1)")
    print("cpu: module CPU seconds (scan + probes) per second per GiB tracked, in milli; ratio: "
          "probes on against off in the same run; probe%: the probes' share of it; +probe: "
          "(scan + probes) / scan within the probes-on phase (steadier than ratio when the "
          "host is busy: scan times are wall clock)")
    return all(r["rc"] == 0 for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--period-ms", type=int, default=1000)
    ap.add_argument("--kernel", default="6.12")
    ap.add_argument("--freq-scans", type=int, default=4,
                    help="scan periods per phase of the frequency table (0: skip it)")
    ap.add_argument("--freq-period-ms", type=int, default=500)
    ap.add_argument("--freq-modes", default="fault,abit",
                    help="modes of the frequency table (fault, fault-marks, abit)")
    ap.add_argument("--skip-modes", action="store_true", help="only the frequency table")
    a = ap.parse_args()
    from pagetier.checkout import in_guest, test_vm

    if not in_guest():
        vm = test_vm()
        from pagetier.workload import binary

        binary()
        res = vm.run(f"python scripts/bench_kmod.py --size-mb {a.size_mb} --seconds {a.seconds} "
                     f"--period-ms {a.period_ms} --freq-scans {a.freq_scans} "
                     f"--freq-period-ms {a.freq_period_ms} --freq-modes {a.freq_modes}"
                     f"{' --skip-modes' if a.skip_modes else ''}",
                     kernel=a.kernel, fast="3G", slow="3G", echo=True)
        return 0 if res.ok else 1
    import platform

    from pagetier.profiler import kmod

    kmod.load_module()
    ok = True
    if not a.skip_modes:
        ok = modes_table(a)
    if a.freq_scans:
        ok = freq_table(a.freq_scans, a.freq_period_ms, a.freq_modes.split(",")) and ok
    kmod.unload_module()
    return 0 if ok else 1


def modes_table(a) -> bool:
    import platform

    rows = [run_one(m, a.size_mb, a.seconds, a.period_ms) for m in (None, "fault", "abit")]
    base = rows[0]["accesses_per_s"] or 1
    print(f"\npagetier.ko on {platform.release()}: {a.size_mb} MiB tracked (4 KiB pages), "
          f"scan every {a.period_ms} ms, {a.seconds} s per run")
    print(f"{'mode':<6} {'accesses/s':>12} {'vs none':>8} {'scans':>6} {'ms/scan':>8} {'pages':>8} "
          f"{'faults':>9} {'B/page':>7}")
    for r in rows:
        print(f"{r['mode']:<6} {r['accesses_per_s']:>12.0f} {r['accesses_per_s'] / base:>7.3f}x "
              f"{r['scans']:>6} {r['scan_ms']:>8.1f} {r['pages']:>8} {r['faults']:>9} "
              f"{r['bytes_per_page']:>7.1f}")
    print("B/page: growth of the kernel's xarray-node slab per tracked page at attach (approximate)")
    return all(r["rc"] == 0 for r in rows)


if __name__ == "__main__":
    sys.exit(main())
