#!/usr/bin/env python3
"""The scale benchmark, in the test VM: what pagetier.ko costs and how well it sees a fixed hot
set as the footprint grows, beside the module before a change and beside DAMON.

For each footprint (default 1, 2, 4, 8 GiB) and THP off and on, one hotcold process
(pagetier/workloads/hotcold.c: a --hot-mb hot set, --noise-ppm of its accesses sent to a random
page of the whole buffer, every page first touched on the slow node) is measured with its hot
set still, then (SIGUSR2) moving every --phase-s seconds, in turn by:

- pagetier.ko "before" (built from git revision --before into build/kmod-before/<release>; the
  host builds it) and "after" (the working tree's build, build/kmod/<release>), each in abit and
  fault mode, scanning every --period-ms (default 250: the daemon's for 1 s intervals). Right
  after each of the workload's 1 s ticks the accessed-only records are read (reset), as the
  daemon reads every interval, so an interval's truth is the hot window that tick reports;
- DAMON (6.12; profiler/damon.py, its own kdamond in the guest's sysfs), its regions read at each
  tick. DAMON clears Accessed bits without a TLB flush, and under emulation a process alone on
  its CPU keeps its translations for seconds; so, unless --damon-alone, a busy process shares the
  workload's CPU while DAMON runs, forcing the context switches other tasks make on a real host;
- with --daemon, the pagetier daemon (heuristic policy, budget twice the hot set, abit, the
  "after" module at the daemon's default scan period) on the still hot set, THP off.

Columns of the tables:
- ms/pass: the module's time (STATS scan_ns + probe_ns) per full pass (STATS scans); /s: full
  passes per second (the goal: one in every 1 s interval); %: the module's time per second of
  run, in percent of one CPU; k: thousands of page-table entries walked per pass. These are
  wall-clock times in an emulated guest on a shared host: compare within one run;
- P/R: per-interval precision and recall of the hottest units by count, taken until they cover
  the hot set's size (ties in random order), against the tick's hot window, median/min over the
  intervals; "regions": the same from the "after" module's region records (2 MiB each);
- read: CPU ms of this process's accessed-only READ per interval;
- kdamond: its CPU (/proc/<pid>/stat) in % of one CPU; DAMON's P/R ranks its regions by
  nr_accesses; daemon: its CPU per 1 s interval (median/max, after --daemon-warm intervals) and
  the module's CPU in that run; (module + daemon) / kdamond for the same footprint and THP;
- sparse: a 16 TiB MAP_NORESERVE target with 4,096 pages touched 4 GiB apart against a dense
  16 MiB target with the same pages (tests/guest/test_kmod_hazards.py's targets), per pass.

Runs:
    scripts/bench_scale.py                       # boots 6.12 (HMAT) and 6.1, prints the tables
    scripts/bench_scale.py --kernels 6.12 --footprints 256M,512M --intervals 4   # a quick look
    scripts/bench_scale.py --daemon --sparse -o docs/scale.md   # all, and a dated section there
    scripts/vm --kernel 6.12 --hmat --fast 2G --slow 10G -- \\
        .venv/bin/python scripts/bench_scale.py --guest --footprints 1G
    scripts/bench_scale.py --from-json build/vm/6.12-x/bench-scale.json -o docs/scale.md
The guest writes its results as JSON ($PAGETIER_VM_OUT/bench-scale.json, or --json FILE).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import select
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pagetier.bench.hotset import overlap_pages, top_units  # noqa: E402

PAGE = 4096
HUGE_PAGES = 512
RESULT_NAME = "bench-scale.json"
BEFORE_REV = "d4ff290"
MEMORY_LIMIT_MB = 12 * 1024  # the guest's memory, at most (the host is shared)


def size_mb(text: str) -> int:
    """'512M', '1G' or '2' (GiB) in MiB."""
    t = text.strip().upper()
    try:
        if t.endswith("M"):
            return int(t[:-1])
        return int(float(t.rstrip("G")) * 1024)
    except ValueError:
        raise SystemExit(f"bench_scale: bad size {text!r}: use e.g. 512M or 2G") from None


def label_mb(mb: int) -> str:
    return f"{mb // 1024}G" if mb % 1024 == 0 else f"{mb}M"


def module_paths(release: str, before_rev: str, after_rev: str = "tree") -> dict[str, Path]:
    """The two builds of pagetier.ko for ``release``: before (git revision ``before_rev``, built
    out of tree) and after (the working tree's build, or git revision ``after_rev``'s)."""
    after = (REPO / "build" / "kmod" if after_rev == "tree" else
             REPO / "build" / f"kmod-rev-{after_rev}")
    # a build is kept per revision: another --before must not find the last one's module
    before = (REPO / "build" / "kmod-before" if before_rev == BEFORE_REV else
              REPO / "build" / f"kmod-rev-{before_rev}")
    return {"before": before / release / "pagetier.ko",
            "after": after / release / "pagetier.ko"}


def build_rev(rev: str, releases: list[str], which: str, after_rev: str = "tree") -> None:
    """pagetier.ko of git revision ``rev`` for each kernel, out of the working tree, where
    module_paths puts ``which`` ("before" or "after")."""
    todo = [r for r in releases if not module_paths(r, rev, after_rev)[which].exists()]
    if not todo:
        return
    src = Path(tempfile.mkdtemp(prefix="pagetier-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "kmod"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    for rel in todo:
        out = module_paths(rel, rev, after_rev)[which].parent
        subprocess.run(["make", "-s", "-C", str(src / "kmod"), f"KERNEL_DIR=/lib/modules/{rel}/build",
                        f"O={out}", "module"], check=True, stdout=subprocess.DEVNULL)


# ------------------------------------------------------------------ guest side: the pieces
class Ticks:
    """The workload's JSON lines, read without blocking (drain) or until the next tick."""

    def __init__(self, proc: subprocess.Popen):
        from pagetier.bench.live import Lines

        self.proc = proc
        self.lines = Lines(proc.stdout.fileno())
        self.pending: list[dict] = []
        self.done: dict | None = None

    def _take(self, timeout: float) -> None:
        r, _, _ = select.select([self.lines.fd], [], [], timeout)
        if r:
            for e in self.lines.read():
                if e.get("event") == "tick":
                    self.pending.append(e)
                elif e.get("event") == "done":
                    self.done = e

    def drain(self) -> None:
        """Forget the ticks so far (the workload blocks once its pipe is full)."""
        while not self.lines.eof:
            before = len(self.lines.buf), len(self.pending)
            self._take(0)
            if (len(self.lines.buf), len(self.pending)) == before:
                break
        self.pending.clear()

    def next(self, timeout: float = 30) -> dict:
        """The newest tick, once there is one not returned yet (older ones are dropped: a read
        that took longer than a tick is scored against the hot window of the newest)."""
        deadline = time.monotonic() + timeout
        self._take(0)
        while not self.pending:
            if self.lines.eof or time.monotonic() > deadline:
                raise RuntimeError("the workload stopped ticking")
            self._take(max(0.0, deadline - time.monotonic()))
        tick = self.pending[-1]
        self.pending.clear()
        return tick


def start_workload(size: int, hot: int, noise: int, thp: bool, phase: int, verify: bool):
    """hotcold over ``size`` MiB, its pages first touched on the slow node (1), its hot set still
    until SIGUSR2, then moving every ``phase`` s; (proc, ready)."""
    from pagetier.workload import binary

    argv = [str(binary()), "--size", str(size), "--hot", str(hot), "--noise-ppm", str(noise),
            "--duration", "0", "--tick-ms", "1000", "--start-node", "1", "--fast-node", "0",
            "--phase", str(phase), "--phase-on-signal", *([] if thp else ["--no-thp"]),
            *([] if verify else ["--no-verify"])]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    line = b""
    while not line.endswith(b"\n"):  # the ready line, byte by byte: the rest stays in the pipe
        c = os.read(proc.stdout.fileno(), 1)
        if not c:
            raise RuntimeError(f"the workload exited ({proc.wait()}) before it was ready: {argv}")
        line += c
    return proc, json.loads(line)


def stop_workload(proc: subprocess.Popen, ticks: Ticks) -> bool:
    """SIGTERM; True when it exited 0 and found no page corrupted (with --no-verify it checks
    none)."""
    proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 300
    while not ticks.lines.eof and time.monotonic() < deadline:
        ticks._take(1.0)
    rc = proc.wait()
    return rc == 0 and (ticks.done or {}).get("pages_corrupt", 1) == 0


def score(addr: np.ndarray, npages: np.ndarray, value: np.ndarray, ready: dict, hot_addr: int,
          rng: np.random.Generator) -> tuple[float, float]:
    """Precision and recall of the hottest units by ``value`` (taken until they cover the hot
    set's pages) against the hot window at ``hot_addr``; units outside the buffer count as cold."""
    hot_pages = ready["hot_size"] // PAGE
    take = top_units(value.astype(np.float64), npages, hot_pages, rng)
    if not len(take):
        return 0.0, 0.0
    tp = int(overlap_pages(addr[take], npages[take], hot_addr, hot_addr + ready["hot_size"]).sum())
    pred = int(npages[take].astype(np.int64).sum())
    return tp / pred, tp / hot_pages


def pr_summary(pr: list[tuple[float, float]]) -> dict:
    if not pr:
        return {}
    p, r = [x[0] for x in pr], [x[1] for x in pr]
    return {"p_med": statistics.median(p), "p_min": min(p), "r_med": statistics.median(r),
            "r_min": min(r), "intervals": len(pr)}


def wait_passes(dev, pid: int, n: int, timeout: float) -> dict:
    start = dev.stats(pid)["scans"]
    deadline = time.monotonic() + timeout
    while True:
        st = dev.stats(pid)
        if st["scans"] >= start + n or time.monotonic() > deadline:
            return st
        time.sleep(0.05)


def window_waits() -> int | None:
    """abit's windows waited again because the target touched nothing (modules that count them)."""
    from pagetier.profiler import kmod

    p = kmod.SYSFS / "window_waits"
    return int(p.read_text()) if p.exists() else None


def measure_module(dev, ready: dict, ticks: Ticks, mode: str, a, rng) -> dict:
    """One mode of the loaded module on the running workload: a.intervals reads at its ticks."""
    from pagetier import uapi

    pid = ready["pid"]
    lo, hi = ready["addr"], ready["addr"] + ready["size"]
    regions = hasattr(dev, "read_regions") and dev.version()[:2] >= (0, 4)
    dev.attach(pid, mode, scan_period_ms=a.period_ms)
    try:
        # abit lists what its first pass found accessed; fault's first pass only marks
        wait_passes(dev, pid, 1 if mode == "abit" else 2, timeout=a.warm_timeout)
        ticks.drain()
        ticks.next()
        dev.read(pid, reset=True, accessed_only=True)
        st0, t0 = dev.stats(pid), time.monotonic()
        waits0 = window_waits()
        pr = {"count": [], "freq": []}
        pr_reg = {"count": [], "freq": []}
        read_s, trail = [], []
        for _ in range(a.intervals):
            tick = ticks.next()
            if regions:  # the region records (what the daemon reads past 1 GiB), then the pages
                reg = dev.read_regions(pid, accessed_only=True)
                reg = reg[(reg["addr"] >= lo) & (reg["addr"] < hi)]
                for m, got in pr_reg.items():
                    got.append(score(reg["addr"], np.full(len(reg), HUGE_PAGES, np.int64),
                                     reg[m], ready, tick["hot_addr"], rng))
            c0 = time.thread_time()
            rec = dev.read(pid, reset=True, accessed_only=True)  # as the daemon reads each interval
            read_s.append(time.thread_time() - c0)
            rec = rec[(rec["addr"] >= lo) & (rec["addr"] < hi)]
            npages = np.where(rec["flags"] & uapi.REC_HUGE, HUGE_PAGES, 1).astype(np.int64)
            for m, got in pr.items():
                got.append(score(rec["addr"], npages, rec[m], ready, tick["hot_addr"], rng))
            # per interval: passes ended so far, records read, P and R by count
            trail.append((dev.stats(pid)["scans"] - st0["scans"], len(rec),
                          round(pr["count"][-1][0], 3), round(pr["count"][-1][1], 3)))
        st1, t1 = dev.stats(pid), time.monotonic()
        if st1["scans"] == st0["scans"]:  # no whole pass in the window: wait for one
            st1 = wait_passes(dev, pid, 1, timeout=a.warm_timeout)
            t1 = time.monotonic()
        waits1 = window_waits()
    finally:
        dev.detach(pid)
    d = {k: st1[k] - st0[k] for k in ("scans", "scan_ns", "probe_ns", "walk_entries",
                                       "scan_resumes")}
    busy = d["scan_ns"] + d["probe_ns"]
    passes = max(d["scans"], 1)
    out = {"seconds": t1 - t0, "passes": d["scans"], "pass_per_s": d["scans"] / (t1 - t0),
           "ms_per_pass": busy / passes / 1e6, "cpu": busy / 1e9 / (t1 - t0),
           "entries_per_pass": d["walk_entries"] / passes, "resumes": d["scan_resumes"],
           "pages_tracked": st1["pages_tracked"], "read_ms": 1e3 * statistics.median(read_s),
           "read_ms_max": 1e3 * max(read_s), **pr_summary(pr["count"]),
           "freq_pr": pr_summary(pr["freq"]), "trail": trail,
           "window_waits": None if waits0 is None else waits1 - waits0,
           # where a pass's time goes: the walk (and window) against the probes, busy time;
           # the wall time between passes ends (sleeps, waits and the period included); and
           # the intervals in which no pass ended (they score 0)
           "scan_ms_per_pass": d["scan_ns"] / passes / 1e6,
           "probe_ms_per_pass": d["probe_ns"] / passes / 1e6,
           "wall_ms_per_pass": 1e3 * (t1 - t0) / passes,
           "no_pass_intervals": sum(1 for i, tr in enumerate(trail)
                                    if tr[0] == (trail[i - 1][0] if i else 0))}
    if pr_reg["count"]:
        out["regions_pr"] = pr_summary(pr_reg["count"])
        out["regions_freq_pr"] = pr_summary(pr_reg["freq"])
    if "regions_tracked" in st1:
        out["regions_tracked"] = st1["regions_tracked"]
        out["regions_idle_per_pass"] = (st1["regions_idle"] - st0["regions_idle"]) / passes
    return out


def measure_damon(ready: dict, ticks: Ticks, a, rng) -> dict:
    """DAMON on the running workload (its own kdamond, through the guest's sysfs)."""
    from pagetier.profiler.damon import DamonProfiler

    prof = DamonProfiler()
    spinner = None
    if a.damon_share:
        # DAMON clears Accessed bits without a TLB flush, and under emulation a process alone on
        # its CPU keeps its translations for seconds (no PCID: only a context switch flushes
        # them), so DAMON would see almost no access. A busy process sharing the workload's CPU
        # forces those switches, as other tasks do on a real machine.
        os.sched_setaffinity(ready["pid"], {1})
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        os.sched_setaffinity(spinner.pid, {1})
    try:
        prof.attach(ready["pid"])
        ticks.drain()
        for _ in range(a.damon_warm):  # its regions adapt first
            ticks.next()
        c0, t0 = prof.kdamond_cpu_ns(), time.monotonic()
        pr, nregions = [], []
        for _ in range(a.intervals):
            tick = ticks.next()
            regs = prof.regions()[0]
            nregions.append(len(regs))
            if not len(regs):
                pr.append((0.0, 0.0))
                continue
            start, end = regs[:, 0].astype(np.int64), regs[:, 1].astype(np.int64)
            pr.append(score(start.astype(np.uint64), (end - start) // PAGE, regs[:, 2], ready,
                            tick["hot_addr"], rng))
        c1, t1 = prof.kdamond_cpu_ns(), time.monotonic()
    finally:
        prof.close()
        if spinner is not None:
            spinner.kill()
            spinner.wait()
            os.sched_setaffinity(ready["pid"], set(range(os.cpu_count() or 1)))
    return {"seconds": t1 - t0, "cpu": (c1 - c0) / 1e9 / (t1 - t0) if c0 is not None and c1 is not None else None,
            "regions": statistics.median(nregions), **pr_summary(pr)}


def measure_daemon(ready: dict, ticks: Ticks, mode: str, a) -> dict:
    """The pagetier daemon (heuristic policy, the daemon's default scan period) on the workload:
    its CPU per interval and the module's CPU while it runs."""
    from pagetier.bench import live

    spec = live.Spec(name="scale", seconds=max(60, 4 * a.intervals), size_mb=ready["size"] >> 20,
                     hot_mb=ready["hot_size"] >> 20, budget_mb=2 * (ready["hot_size"] >> 20),
                     mode=mode)
    child, fd = live.fork_daemon(ready["pid"], "heuristic", spec)
    lines = live.Lines(fd)
    stats: list[dict] = []
    try:
        want = a.daemon_warm + a.intervals
        deadline = time.monotonic() + 120 + 10 * want
        while len(stats) < want and not lines.eof and time.monotonic() < deadline:
            r, _, _ = select.select([fd], [], [], 1.0)
            if r:
                stats += [e for e in lines.read() if "interval" in e]
            ticks.drain()
    finally:
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass
        live._reap(child)
        os.close(fd)
    kept = [s for s in stats[a.daemon_warm:] if not s.get("boundary")]
    if len(kept) < 2:
        return {"error": f"the daemon gave {len(stats)} intervals"}
    cpu = [s["cpu_s"] for s in kept]
    span = kept[-1]["t"] - kept[0]["t"]
    prof = (kept[-1]["profiler_scan_s"] - kept[0]["profiler_scan_s"]) / span if span > 0 else None
    return {"intervals": len(kept), "cpu_s_med": statistics.median(cpu), "cpu_s_max": max(cpu),
            "cpu_s_mean": statistics.fmean(cpu), "module_cpu": prof,
            "units_med": statistics.median(s["units"] for s in kept),
            "promoted": sum(s["promoted"] for s in stats), "demoted": sum(s["demoted"] for s in stats)}


def sparse_rows(kos: dict[str, Path], modes: list[str]) -> list[dict]:
    """tests/guest/test_kmod_hazards.py's sparse and dense targets, per pass, each module."""
    from pagetier.profiler import kmod

    sys.path.insert(0, str(REPO / "tests" / "guest"))
    import test_kmod_hazards as hz

    exe = Path(tempfile.mkdtemp()) / "kmod_hazards"
    subprocess.run(["gcc", "-O2", "-Wall", "-I", str(hz.UAPI_DIR), "-o", str(exe),
                    str(hz.HERE / "kmod_hazards.c")], check=True)
    shapes = {"dense 16 MiB": (16 << 20, PAGE), "sparse 16 TiB": (hz.SPARSE_SIZE, hz.SPARSE_STRIDE)}
    rows = []
    for name, ko in kos.items():
        kmod.unload_module()
        kmod.load_module(ko)
        for mode in modes:
            r = {"module": name, "mode": mode}
            for shape, (size, stride) in shapes.items():
                c = hz._scan_cost(str(exe), mode, size, stride)
                r[shape.split()[0]] = c
            rows.append(r)
            print(f"sparse {name} {mode}: sparse {r['sparse']['scan_ms']:.2f} ms, dense "
                  f"{r['dense']['scan_ms']:.2f} ms per pass", flush=True)
    kmod.unload_module()
    return rows


def swap_module(ko: Path | None, pid: int) -> None:
    """Load ``ko`` (None: none) in place of the loaded pagetier.ko, the workload ``pid`` stopped
    meanwhile.

    Unloading the module while a target it had in fault mode kept faulting crashed the 6.12
    guest once (the hinting fault's kretprobe returned to address 0 during rmmod: an Oops in
    __handle_mm_fault, then a soft lockup): a stopped target takes no fault while the module
    goes."""
    from pagetier.profiler import kmod

    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # stopped: state T in /proc/PID/stat
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "Tt":
                break
            time.sleep(0.01)
        kmod.unload_module()
        if ko is not None:
            kmod.load_module(ko)
    finally:
        os.kill(pid, signal.SIGCONT)


def measure_cell(cell: dict, kos: dict[str, Path], ready: dict, ticks: Ticks, a, rng, damon: bool,
                 save) -> None:
    """Every module and mode, the daemon (still hot set, THP off) and DAMON on one workload."""
    from pagetier.profiler import kmod

    print(f"[{label_mb(cell['size_mb'])} thp {'on' if cell['thp'] else 'off'} {cell['motion']}]",
          flush=True)
    for name, ko in kos.items():
        swap_module(ko, ready["pid"])
        dev = kmod.Device()
        try:
            for mode in a.modes:
                r = measure_module(dev, ready, ticks, mode, a, rng)
                cell["module"][f"{name}/{mode}"] = r
                reg, fq = r.get("regions_pr"), r["freq_pr"]
                print(f"  {name:6} {mode:5} {r['ms_per_pass']:8.1f} ms/pass "
                      f"{r['pass_per_s']:5.2f} pass/s cpu {100 * r['cpu']:5.1f}% "
                      f"P {r['p_med']:.3f}/{r['p_min']:.3f} R {r['r_med']:.3f}/{r['r_min']:.3f}"
                      f" (freq P {fq['p_med']:.3f} R {fq['r_med']:.3f})"
                      + (f" regions P {reg['p_med']:.3f} R {reg['r_med']:.3f}" if reg else "")
                      + f" read {r['read_ms']:.1f} ms", flush=True)
                save()
        finally:
            dev.close()
        if name == "after" and a.daemon and cell["motion"] == "still" and not cell["thp"]:
            for mode in a.daemon_modes:
                d = measure_daemon(ready, ticks, mode, a)
                cell.setdefault("daemon", {})[mode] = d
                print(f"  daemon {mode}: {d}", flush=True)
                save()
    swap_module(None, ready["pid"])
    if damon:
        r = measure_damon(ready, ticks, a, rng)
        cell["damon"] = r
        print(f"  damon        cpu {100 * (r['cpu'] or 0):5.1f}% P {r['p_med']:.3f}/"
              f"{r['p_min']:.3f} R {r['r_med']:.3f}/{r['r_min']:.3f} regions "
              f"{r['regions']:.0f}", flush=True)
        save()


def guest_main(a) -> int:
    from pagetier.profiler import kmod

    release = platform.release()
    kos = {k: p for k, p in module_paths(release, a.before, a.after).items() if k in a.modules}
    missing = [str(p) for p in kos.values() if not p.exists()]
    if missing:
        print(f"bench_scale: missing {', '.join(missing)} (run it from the host, which builds the "
              "'before' module; build the working tree's with make -C kmod)", file=sys.stderr)
        return 1
    damon = Path("/sys/kernel/mm/damon/admin").exists() and not a.no_damon
    doc = {"kernel": release, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "before": a.before, "args": vars(a), "modules": {}, "cells": [], "sparse": [],
           "damon": damon}
    out_path = Path(a.json or Path(os.environ.get("PAGETIER_VM_OUT", "/tmp")) / RESULT_NAME)
    rng = np.random.default_rng(0)

    def save():
        out_path.write_text(json.dumps(doc, indent=1))

    for name, ko in kos.items():
        kmod.unload_module()
        kmod.load_module(ko)
        dev = kmod.Device()
        doc["modules"][name] = ".".join(map(str, dev.version()[:3]))
        dev.close()
        # which build: the working tree's changes while a run is prepared
        src = subprocess.run(["modinfo", "-F", "srcversion", str(ko)], capture_output=True,
                             text=True).stdout.strip()
        doc.setdefault("builds", {})[name] = {
            "srcversion": src, "built": time.strftime("%Y-%m-%d %H:%M UTC",
                                                      time.gmtime(ko.stat().st_mtime))}
    kmod.unload_module()
    ok = True
    for thp in a.thp:  # THP off at every footprint first: the goals are stated for it
        for size in a.footprints:
            t_start = time.monotonic()
            proc, ready = start_workload(size, a.hot_mb, a.noise_ppm, thp, a.phase_s, a.verify)
            ticks = Ticks(proc)
            print(f"[{label_mb(size)} thp {'on' if thp else 'off'}] workload ready in "
                  f"{time.monotonic() - t_start:.0f} s", flush=True)
            cells = []
            try:
                for motion in a.hot:
                    if motion == "moving":
                        proc.send_signal(signal.SIGUSR2)  # the hot set moves from now on
                    cell = {"size_mb": size, "thp": thp, "motion": motion, "module": {}}
                    cells.append(cell)
                    doc["cells"].append(cell)
                    measure_cell(cell, kos, ready, ticks, a, rng, damon, save)
            finally:
                memory_ok = stop_workload(proc, ticks)
                ok = ok and memory_ok
                for cell in cells:
                    cell["memory_ok"] = memory_ok
                cells[-1:] and cells[-1].update(wall_s=round(time.monotonic() - t_start, 1))
                save()
    if a.sparse:
        doc["sparse"] = sparse_rows(kos, a.modes)
    save()
    print(render(doc))
    return 0 if ok else 1


# ------------------------------------------------------------------ tables
def _f(x, fmt: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def render(doc: dict) -> str:
    """One kernel's tables, as markdown."""
    cells = doc["cells"]
    sizes = sorted({c["size_mb"] for c in cells})
    keys = sorted({k for c in cells for k in c["module"]},
                  key=lambda k: (k.split("/")[1], k.split("/")[0] != "before"))
    lines = [f"### {doc['kernel']} ({doc['date']})", "",
             "modules: " + ", ".join(
                 f"{k} {v}" + (f" (git {doc['before']})" if k == "before" else
                               " (working tree)" if doc["args"].get("after", "tree") == "tree"
                               else f" (git {doc['args']['after']})")
                 for k, v in doc["modules"].items()), ""]
    if doc.get("command"):
        lines[1:1] = ["", f"    $ {doc['command']}"]
    if doc.get("host_load"):
        lo = doc["host_load"]
        lines += [f"host load (1-minute average, sampled every {LoadSampler.EVERY_S:.0f} s): "
                  f"{lo['start']:.1f} at the boot, median {lo['median']:.1f}, "
                  f"{lo['min']:.1f}-{lo['max']:.1f} ({doc.get('vm_seconds', '?')} s in the VM)", ""]
    if doc.get("note"):
        lines += [doc["note"], ""]

    def cell(size, thp, motion):
        return next((c for c in cells if c["size_mb"] == size and c["thp"] == thp
                     and c["motion"] == motion), None)

    def head(*cols):
        """A table's header and rule: the columns ``cols``, then one per footprint."""
        return ["| " + " | ".join([*cols, *map(label_mb, sizes)]) + " |",
                "|---" * (len(cols) + len(sizes)) + "|"]

    for thp in (False, True):
        if not any(c["thp"] == thp for c in cells):
            continue
        lines += [f"**Module, THP {'on' if thp else 'off'}, hot set still**: ms per full pass "
                  "(pass/s, cpu % of one CPU, entries per pass)", ""]
        hdr = "| module/mode | " + " | ".join(label_mb(s) for s in sizes) + \
              f" | {label_mb(sizes[-1])} / {label_mb(sizes[0])} |"
        lines += [hdr, "|---" * (len(sizes) + 2) + "|"]
        for k in keys:
            row, first, last = [], None, None
            for s in sizes:
                c = cell(s, thp, "still")
                r = c and c["module"].get(k)
                if not r:
                    row.append("-")
                    continue
                first = r["ms_per_pass"] if first is None else first
                last = r["ms_per_pass"]
                row.append(f"{r['ms_per_pass']:.1f} ({r['pass_per_s']:.2f}/s, "
                           f"{100 * r['cpu']:.1f}%, {r['entries_per_pass'] / 1e3:.0f}k)")
            lines.append(f"| {k} | " + " | ".join(row) + f" | {_ratio(last, first)} |")
        lines.append("")
        # where the time goes
        if any("scan_ms_per_pass" in ((cell(s, thp, "still") or {}).get("module", {}).get(k) or {})
               for s in sizes for k in keys):
            lines += [f"Where a pass's time goes, THP {'on' if thp else 'off'}, still: walk ms + "
                      "probe ms per pass (STATS scan_ns, probe_ns: busy time), wall ms from one "
                      "pass's end to the next, intervals of the run with no pass ended", "",
                      *head("module/mode")]
            for k in keys:
                row = []
                for s in sizes:
                    r = ((cell(s, thp, "still") or {}).get("module") or {}).get(k)
                    row.append(f"{r['scan_ms_per_pass']:.0f} + {r['probe_ms_per_pass']:.0f}, "
                               f"{r['wall_ms_per_pass']:.0f} wall, {r['no_pass_intervals']} none"
                               if r and "scan_ms_per_pass" in r else "-")
                lines.append(f"| {k} | " + " | ".join(row) + " |")
            lines.append("")
            # the goal's first line, for both motions: a pass ended in every 1 s interval
            lines += [f"Intervals with no pass ended, THP {'on' if thp else 'off'}: still / "
                      "moving (of the intervals read in each)", "",
                      *head("module/mode")]
            for k in keys:
                row = []
                for s in sizes:
                    got = [((cell(s, thp, m) or {}).get("module") or {}).get(k) for m in
                           ("still", "moving")]
                    row.append(" / ".join(f"{r['no_pass_intervals']} of {len(r['trail'])}"
                                          if r and "no_pass_intervals" in r else "-" for r in got))
                lines.append(f"| {k} | " + " | ".join(row) + " |")
            lines.append("")
        # after / before
        modes = sorted({k.split("/")[1] for k in keys})
        if any(k.startswith("before/") for k in keys) and any(k.startswith("after/") for k in keys):
            lines += [f"after / before, THP {'on' if thp else 'off'}, still: ms per pass "
                      "(cpu per second)", "",
                      *head("mode")]
            for m in modes:
                row = []
                for s in sizes:
                    c = cell(s, thp, "still")
                    b, af = (c["module"].get(f"before/{m}"), c["module"].get(f"after/{m}")) if c else (None, None)
                    row.append(f"{_ratio(af['ms_per_pass'], b['ms_per_pass'])} "
                               f"({_ratio(af['cpu'], b['cpu'])})" if b and af else "-")
                lines.append(f"| {m} | " + " | ".join(row) + " |")
            lines.append("")
        # precision and recall
        lines += [f"**Precision / recall per 1 s interval, THP {'on' if thp else 'off'}** "
                  "(median/min of P, median/min of R)", "",
                  *head("who", "hot set")]
        # (label, where in a cell's record the P/R summary is)
        rows = [(f"{k} {what}", k, field) for k in keys
                for what, field in (("count", None), ("freq", "freq_pr"),
                                    ("regions count", "regions_pr"),
                                    ("regions freq", "regions_freq_pr"))]
        rows.append(("DAMON nr_accesses", "damon", None))
        for motion in ("still", "moving"):
            for label, k, field in rows:
                row = []
                for s in sizes:
                    c = cell(s, thp, motion)
                    r = c and (c.get("damon") if k == "damon" else c["module"].get(k))
                    r = (r or {}).get(field) if field else r
                    row.append(f"{r['p_med']:.2f}/{r['p_min']:.2f} {r['r_med']:.2f}/{r['r_min']:.2f}"
                               if r and "p_med" in r else "-")
                if any(x != "-" for x in row):
                    lines.append(f"| {label} | {motion} | " + " | ".join(row) + " |")
        lines.append("")
        # DAMON and the daemon: CPU
        if any((cell(s, thp, "still") or {}).get("damon") for s in sizes):
            lines += [f"**CPU, THP {'on' if thp else 'off'}, still** (% of one CPU; daemon: ms "
                      "per 1 s interval, median/max; read: this process's READ per interval, ms)", "",
                      "| | " + " | ".join(label_mb(s) for s in sizes) + " |",
                      "|---" * (len(sizes) + 1) + "|"]
            rows = {"kdamond": [], "DAMON regions": []}
            for s in sizes:
                d = (cell(s, thp, "still") or {}).get("damon") or {}
                rows["kdamond"].append(f"{100 * d['cpu']:.1f}%" if d.get("cpu") is not None else "-")
                rows["DAMON regions"].append(f"{d['regions']:.0f}" if d else "-")
            for k in keys:
                rows[f"read {k}"] = [f"{c['module'][k]['read_ms']:.1f}" if c and k in c["module"]
                                     else "-" for c in (cell(s, thp, "still") for s in sizes)]
            dmodes = sorted({m for s in sizes for m in ((cell(s, thp, "still") or {}).get("daemon") or {})})
            for m in dmodes:
                d_row, mod_row, vs = [], [], []
                for s in sizes:
                    c = cell(s, thp, "still") or {}
                    d = (c.get("daemon") or {}).get(m)
                    k = (c.get("damon") or {}).get("cpu")
                    if not d or "error" in d:
                        d_row.append((d or {}).get("error", "-"))
                        mod_row.append("-")
                        vs.append("-")
                        continue
                    d_row.append(f"{1e3 * d['cpu_s_med']:.0f}/{1e3 * d['cpu_s_max']:.0f}")
                    mod_row.append(f"{100 * d['module_cpu']:.1f}%" if d["module_cpu"] is not None else "-")
                    total = d["cpu_s_mean"] + (d["module_cpu"] or 0)
                    vs.append(_ratio(total, k))
                rows[f"daemon ({m}) ms/interval"] = d_row
                rows[f"module under the daemon ({m})"] = mod_row
                rows[f"(module + daemon) / kdamond ({m})"] = vs
            for k, row in rows.items():
                lines.append(f"| {k} | " + " | ".join(row) + " |")
            lines.append("")
    if doc.get("sparse"):
        lines += ["**Sparse address space** (per pass: a 16 TiB MAP_NORESERVE target with 4,096 "
                  "pages touched 4 GiB apart, against a dense 16 MiB target with the same pages)", "",
                  "| module | mode | sparse ms | dense ms | sparse / dense | entries sparse | "
                  "entries dense | entries sparse / dense | found |", "|---" * 9 + "|"]
        for r in doc["sparse"]:
            sp, de = r["sparse"], r["dense"]
            lines.append(f"| {r['module']} | {r['mode']} | {sp['scan_ms']:.2f} | {de['scan_ms']:.2f} | "
                         f"{_ratio(sp['scan_ms'], de['scan_ms'])} | {sp['entries']} | "
                         f"{de['entries']} | {_ratio(sp['entries'], de['entries'])} | "
                         f"{sp['found']}/{de['found']} |")
        lines.append("")
    bad = [c for c in cells if not c.get("memory_ok", True)]
    for c in bad:
        lines.append(f"WARNING: {label_mb(c['size_mb'])} thp {c['thp']} {c['motion']}: the "
                     "workload's memory check failed")
    return "\n".join(lines)


def markdown_section(docs: list[dict], command: str) -> str:
    a = docs[0]["args"]
    run = [] if all(d.get("command") for d in docs) else [f"    $ {command}", ""]
    head = [f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "", *run,
            f"hotcold: {a['hot_mb']} MiB hot set, {a['noise_ppm']} ppm noise, first touched on "
            f"the slow node, one process per footprint and THP setting: still, then moving every "
            f"{a['phase_s']} s. Module scan every {a['period_ms']} ms; {a['intervals']} intervals "
            "of 1 s per measurement, each ending with an accessed-only read (reset) right after "
            "the workload's tick. P/R: precision and recall per interval (median/min) of the "
            "hottest units, ranked by count or by the module's freq estimate (pages, or the "
            "'after' module's 2 MiB region records), taken until they cover the hot set's size; "
            "an interval in which no pass walked the hot set reads only noise and scores 0. "
            "ms/pass: STATS (scan_ns + probe_ns) / scans, wall time in the "
            "kernel of an emulated guest on a shared host: compare within one table. DAMON: "
            + ("its own kdamond, the workload's CPU shared with a busy process (see --help)"
               if a.get("damon_share", True) else "its own kdamond, the workload alone on its CPU")
            + ".", ""]
    return "\n".join(head + [render(d) + "\n" for d in docs])


# ------------------------------------------------------------------ host side
class LoadSampler:
    """The host's 1-minute load average at the start and every EVERY_S seconds of a VM run (a
    context manager; summary() after it)."""

    EVERY_S = 15.0

    def __init__(self):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.EVERY_S):
                return

    def __enter__(self) -> "LoadSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict:
        s = self.samples
        return {"start": s[0], "median": statistics.median(s), "min": min(s), "max": max(s),
                "samples": len(s)}


def host_main(a, argv: list[str]) -> int:
    from pagetier.checkout import test_vm
    from pagetier.workload import binary

    vm = test_vm()
    binary()
    releases = {k: vm.resolve_kernel(k) for k in a.kernels}
    if "before" in a.modules:
        build_rev(a.before, list(releases.values()), "before", a.after)
    if "after" in a.modules and a.after != "tree":
        build_rev(a.after, list(releases.values()), "after", a.after)
    for k, rel in releases.items():
        for name, p in module_paths(rel, a.before, a.after).items():
            if name in a.modules and not p.exists():
                print(f"bench_scale: {p} is missing: make -C kmod KERNEL_DIR=/lib/modules/{rel}/build",
                      file=sys.stderr)
                return 1
    fast, slow = size_mb(a.fast), size_mb(a.slow)
    if fast + slow > MEMORY_LIMIT_MB:
        print(f"bench_scale: --fast + --slow is over {MEMORY_LIMIT_MB} MiB", file=sys.stderr)
        return 1
    # the guest gets the options but the host's own (and their values)
    cleaned, skip = [], False
    for x in argv:
        if skip:
            skip = False
            continue
        if x in ("-o", "--kernels", "--fast", "--slow"):
            skip = True
            continue
        if x.startswith(("--kernels=", "--fast=", "--slow=", "-o=")):
            continue
        cleaned.append(x)
    guest_args = cleaned
    docs, ok = [], True
    for k in a.kernels:
        cmd = ("python scripts/bench_scale.py --guest " + " ".join(shlex.quote(x) for x in guest_args)
               + f" --json \"$PAGETIER_VM_OUT/{RESULT_NAME}\"")
        with LoadSampler() as load:  # the host's: the figures move with what else runs
            res = vm.run(cmd, kernel=k, fast=label_mb(fast), slow=label_mb(slow),
                         hmat=(k == "6.12"), echo=True, timeout=a.timeout)
        out = res.outdir / RESULT_NAME
        if out.exists():
            docs.append(json.loads(out.read_text()))
            docs[-1]["vm_seconds"] = round(res.seconds)
            docs[-1]["host_load"] = load.summary()
            docs[-1]["command"] = ("scripts/bench_scale.py " + " ".join(shlex.quote(x) for x in argv)
                                   if len(a.kernels) == 1 else f"(the {k} boot of the command above)")
            docs[-1]["kernel_reports"] = res.reports
        if not res.ok:
            ok = False
            print(f"bench_scale: the {k} run failed (exit {res.returncode}; reports: {res.reports}); "
                  f"output in {res.outdir}", file=sys.stderr)
    return finish(docs, a, "scripts/bench_scale.py " + " ".join(shlex.quote(x) for x in argv)) and ok


def finish(docs: list[dict], a, command: str) -> bool:
    if not docs:
        return False
    text = markdown_section(docs, command)
    print(text)
    if a.output:
        path = Path(a.output)
        old = path.read_text() if path.exists() else (
            "# Scale: pagetier.ko against the footprint, before and after, beside DAMON\n\n"
            "Written by scripts/bench_scale.py -o (see its --help for what each column means).\n\n")
        path.write_text(old.rstrip("\n") + "\n\n" + text)
        print(f"appended to {path}")
    return True


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 1 (argparse's default is usage and exit 2)
        print(f"bench_scale: {message}", file=sys.stderr)
        sys.exit(1)


def parse(argv: list[str]):
    ap = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--guest", action="store_true", help="run here (inside the test VM)")
    ap.add_argument("--kernels", default="6.12,6.1", help="host: kernels to boot, one VM each")
    ap.add_argument("--fast", default="2G", help="host: the guest's fast node")
    ap.add_argument("--slow", default="10G", help="host: the guest's slow node")
    ap.add_argument("--footprints", default="1G,2G,4G,8G")
    ap.add_argument("--thp", default="off,on")
    ap.add_argument("--hot", default="still,moving",
                    help="still, moving or both (in that order, on one workload)")
    ap.add_argument("--hot-mb", type=int, default=32)
    ap.add_argument("--noise-ppm", type=int, default=100)
    ap.add_argument("--phase-s", type=int, default=5, help="the moving hot set moves this often")
    ap.add_argument("--verify", action="store_true",
                    help="the workload fills every page and checks it at the end (slow to start)")
    ap.add_argument("--modes", default="abit,fault")
    ap.add_argument("--modules", default="before,after")
    ap.add_argument("--before", default=BEFORE_REV, help="git revision of the 'before' module")
    ap.add_argument("--after", default="tree",
                    help="the 'after' module: 'tree' (the working tree's build, build/kmod) or a "
                         "git revision, built out of tree")
    ap.add_argument("--period-ms", type=int, default=250,
                    help="the module's scan period (250: the daemon's default for 1 s intervals)")
    ap.add_argument("--intervals", type=int, default=8, help="1 s intervals per measurement")
    ap.add_argument("--warm-timeout", type=float, default=120,
                    help="s to wait for the first passes of a mode")
    ap.add_argument("--damon-warm", type=int, default=3, help="ticks before DAMON is read")
    ap.add_argument("--no-damon", action="store_true")
    ap.add_argument("--damon-alone", dest="damon_share", action="store_false",
                    help="DAMON without a busy process sharing the workload's CPU (see "
                         "measure_damon: under emulation it then sees almost no access)")
    ap.add_argument("--daemon", action="store_true",
                    help="also the daemon's CPU (after module, still hot set, THP off)")
    ap.add_argument("--daemon-modes", default="abit")
    ap.add_argument("--daemon-warm", type=int, default=4, help="daemon intervals not counted")
    ap.add_argument("--sparse", action="store_true", help="also the sparse-address-space rows")
    ap.add_argument("--only-sparse", action="store_true", help="the sparse rows alone")
    ap.add_argument("--json", help="guest: write the results here")
    ap.add_argument("--from-json", nargs="+", help="print (and -o) saved results, boot nothing")
    ap.add_argument("-o", "--output", help="append a dated markdown section to this file")
    ap.add_argument("--timeout", type=float, default=5400, help="s per VM run")
    a = ap.parse_args(argv)
    try:
        a.footprints = [size_mb(x) for x in a.footprints.split(",") if x]
        a.thp = [{"off": False, "on": True}[x] for x in a.thp.split(",") if x]
    except KeyError:
        ap.error("--thp takes off, on or off,on")
    a.kernels = [k for k in a.kernels.split(",") if k]
    a.hot = sorted({x for x in a.hot.split(",") if x}, key=lambda h: h != "still")
    a.modes = [m for m in a.modes.split(",") if m]
    a.modules = [m for m in a.modules.split(",") if m]
    a.daemon_modes = [m for m in a.daemon_modes.split(",") if m]
    if a.only_sparse:
        a.footprints, a.sparse = [], True
    bad = ([m for m in a.modes + a.daemon_modes if m not in ("abit", "fault")]
           + [m for m in a.modules if m not in ("before", "after")]
           + [h for h in a.hot if h not in ("still", "moving")])
    if bad:
        ap.error(f"unknown value {bad[0]!r} (modes: abit, fault; modules: before, after; "
                 "hot: still, moving)")
    if any(f > 10 * 1024 for f in a.footprints) or a.hot_mb <= 0 or \
            any(a.hot_mb * 2 > f for f in a.footprints):
        ap.error("footprints must be at most 10G and at least twice --hot-mb")
    return a


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.from_json:
        try:
            docs = [json.loads(Path(p).read_text()) for p in a.from_json]
        except (OSError, ValueError) as e:
            print(f"bench_scale: --from-json: {e}", file=sys.stderr)
            return 1
        return 0 if finish(docs, a, "scripts/bench_scale.py " + " ".join(argv)) else 1
    from pagetier.checkout import in_guest

    if a.guest or in_guest():
        return guest_main(a)
    return 0 if host_main(a, argv) else 1


if __name__ == "__main__":
    sys.exit(main())
