#!/usr/bin/env python3
"""Benchmark pagetier.ko: time per scan in each mode and the workload's slowdown, in one run.

Runs inside the test VM (it boots one when started on the host):
    scripts/bench_kmod.py [--size-mb 1024] [--seconds 10] [--kernel 6.12]
For each of: no module attached, fault mode, abit mode, it runs the built-in workload over
SIZE MiB (hot part 1/8) for SECONDS and prints accesses per second, the slowdown against the
unattached run, and the module's time per scan.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--period-ms", type=int, default=1000)
    ap.add_argument("--kernel", default="6.12")
    a = ap.parse_args()
    from pagetier import vm

    if not vm.in_guest():
        from pagetier.workload import binary

        binary()
        res = vm.run(f"python scripts/bench_kmod.py --size-mb {a.size_mb} --seconds {a.seconds} "
                     f"--period-ms {a.period_ms}", kernel=a.kernel, fast="3G", slow="3G", echo=True)
        return 0 if res.ok else 1
    import platform

    from pagetier.profiler import kmod

    kmod.load_module()
    rows = [run_one(m, a.size_mb, a.seconds, a.period_ms) for m in (None, "fault", "abit")]
    kmod.unload_module()
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
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
