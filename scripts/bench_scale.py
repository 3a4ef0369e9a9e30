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
- with --daemon, the pagetier daemon (heuristic policy, budget twice the hot set, the "after"
  module at the daemon's default scan period, in each --daemon-modes: by default the daemon's
  own choice of mode) on the still and on the moving hot set, THP off: its CPU, and the
  precision and recall of its view (what its state ranks hottest after each interval's step,
  by heat and by the interval's rate) against the hot window of most of that interval;
  --daemon-before REV runs git revision REV's daemon beside it (on the same module and
  workload, the two taking turns, --daemon-repeat times each), and --profile saves each
  daemon's cProfile beside the results.

Columns of the tables:
- ms/pass: the module's time (STATS scan_ns + probe_ns) per full pass (STATS scans); /s: full
  passes per second (the goal: one in every 1 s interval); %: the module's time per second of
  run, in percent of one CPU; k: thousands of page-table entries walked per pass. These are
  wall-clock times in an emulated guest on a shared host: compare within one run;
- P/R: per-interval precision and recall of the hottest units by count, taken until they cover
  the hot set's size (ties in random order), against the tick's hot window, median/min over the
  intervals; "regions": the same from the "after" module's region records (2 MiB each);
- read: CPU ms of this process's accessed-only READ per interval; look: its READ_REGIONS of
  the accessed regions without a reset (what the daemon's looks between reads ask);
- kdamond: its CPU (/proc/<pid>/stat) in % of one CPU; DAMON's P/R ranks its regions by
  nr_accesses; end to end: the daemon's CPU (the whole process per second, and its step per
  1 s interval, median/max, after --daemon-warm intervals and the module's attach transient:
  see Settling), the module's CPU in that run, the
  mode the target got, (module + daemon) / kdamond for the same footprint, THP and hot set,
  and the P/R of the daemon's view beside DAMON's;
- sparse: a 16 TiB MAP_NORESERVE target with 4,096 pages touched 4 GiB apart against a dense
  16 MiB target with the same pages (tests/guest/test_kmod_hazards.py's targets), per pass.

Runs:
    scripts/bench_scale.py                       # boots 6.12 (HMAT) and 6.1, prints the tables
    scripts/bench_scale.py --kernels 6.12 --footprints 256M,512M --intervals 4   # a quick look
    scripts/bench_scale.py --daemon --sparse -o docs/scale.md   # all, and a dated section there
    scripts/bench_scale.py --kernels 6.12 --footprints 8G --thp off --hot still --modules after \\
        --daemon --daemon-before main --daemon-repeat 2     # a daemon change against main
    scripts/vm --kernel 6.12 --hmat --fast 2G --slow 10G -- \\
        .venv/bin/python scripts/bench_scale.py --guest --footprints 1G
    scripts/bench_scale.py --from-json build/vm/6.12-x/bench-scale.json -o docs/scale.md
The guest writes its results as JSON ($PAGETIER_VM_OUT/bench-scale.json, or --json FILE).
"""
from __future__ import annotations

import argparse
import errno
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
from pagetier.errors import PagetierError  # noqa: E402

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


def daemon_tree(rev: str) -> Path:
    """Where git revision ``rev``'s daemon is exported for --daemon-before (build/, which the
    guest sees): build/daemon-rev-<its commit, 12 digits>, laid out as the installed package."""
    got = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "--verify",
                          f"{rev}^{{commit}}"], capture_output=True, text=True)
    if got.returncode != 0:
        raise SystemExit(f"bench_scale: --daemon-before {rev}: not a git revision of {REPO}")
    return REPO / "build" / f"daemon-rev-{got.stdout.strip()}"


def export_daemon(rev: str) -> Path:
    """``rev``'s daemon in daemon_tree(rev), exported (with its compiled helpers built) unless
    it is there already; a tree half made by an interrupted export is never left in its place."""
    dest = daemon_tree(rev)
    if dest.is_dir():
        return dest
    sys.path.insert(0, str(REPO / "scripts"))
    import bench_daemon

    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    bench_daemon.baseline_tree(rev, tmp)
    tmp.rename(dest)
    return dest


def use_tree(root: Path) -> None:
    """From now on, this process imports pagetier from ``root`` (a daemon_tree): the modules
    already imported from this checkout are forgotten. For a forked child only."""
    for name in [m for m in sys.modules if m == "pagetier" or m.startswith("pagetier.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))


# ------------------------------------------------------------------ guest side: the pieces
class Ticks:
    """The workload's JSON lines, read without blocking (drain) or until the next tick."""

    def __init__(self, proc: subprocess.Popen):
        from pagetier.bench.live import Lines

        self.proc = proc
        self.lines = Lines(proc.stdout.fileno())
        self.pending: list[dict] = []
        self.done: dict | None = None
        self.log: list[tuple[float, dict]] | None = None  # see record()

    def _take(self, timeout: float) -> None:
        r, _, _ = select.select([self.lines.fd], [], [], timeout)
        if r:
            now = time.monotonic()
            for e in self.lines.read():
                if e.get("event") == "tick":
                    self.pending.append(e)
                    if self.log is not None:
                        self.log.append((now, e))
                elif e.get("event") == "done":
                    self.done = e

    def record(self) -> list[tuple[float, dict]]:
        """From now on, keep every tick with the time.monotonic() it was read at (a list that
        grows until stop_record)."""
        self.log = []
        return self.log

    def stop_record(self) -> None:
        self.log = None

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


def wait_settled(dev, pid: int, timeout: float) -> dict:
    """Wait for a pass that ended in one period: STATS scans one up with scan_resumes unchanged
    since the pass before it ended. After an attach a large target's passes are cut by the scan
    budget (pagetier_scan_budget) into several periods for a while: the first pass reads every
    page table, and the next ones read every table the program touched meanwhile, which after
    a long pass is most of them. Returns the target's STATS scans and scan_resumes (passes and
    budget-cut periods since the attach) at that pass's end, with "timed_out" after
    ``timeout`` s without one."""
    t0 = time.monotonic()
    last = dev.stats(pid)
    while time.monotonic() - t0 < timeout:
        st = dev.stats(pid)
        if st["scans"] > last["scans"]:
            if st["scan_resumes"] == last["scan_resumes"] and st["scans"] == last["scans"] + 1:
                return {"passes": st["scans"], "resumes": st["scan_resumes"]}
            last = st
        time.sleep(0.05)
    return {"passes": last["scans"], "resumes": last["scan_resumes"], "timed_out": True}


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
    t_attach = time.monotonic()
    dev.attach(pid, mode, scan_period_ms=a.period_ms)
    try:
        # abit lists what its first pass found accessed; fault's first pass only marks
        wait_passes(dev, pid, 1 if mode == "abit" else 2, timeout=a.warm_timeout)
        # then, unless --no-settle, the steady state: a pass in one period (wait_settled)
        settle = None if not a.settle else dict(wait_settled(dev, pid, a.warm_timeout),
                                                  s=time.monotonic() - t_attach)
        ticks.drain()
        ticks.next()
        dev.read(pid, reset=True, accessed_only=True)
        st0, t0 = dev.stats(pid), time.monotonic()
        waits0 = window_waits()
        pr = {"count": [], "freq": []}
        pr_reg = {"count": [], "freq": []}
        read_s, look_s, trail = [], [], []
        for _ in range(a.intervals):
            tick = ticks.next()
            if regions:  # the region records (what the daemon reads past 1 GiB), then the pages
                c0 = time.thread_time()
                reg = dev.read_regions(pid, accessed_only=True)  # as the daemon's looks read
                look_s.append(time.thread_time() - c0)
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
            # per interval: passes ended so far, records read, P and R by count, budget-cut
            # periods so far
            st = dev.stats(pid)
            trail.append((st["scans"] - st0["scans"], len(rec), round(pr["count"][-1][0], 3),
                          round(pr["count"][-1][1], 3), st["scan_resumes"] - st0["scan_resumes"]))
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
           "read_ms_max": 1e3 * max(read_s),
           "look_ms": 1e3 * statistics.median(look_s) if look_s else None,
           **pr_summary(pr["count"]),
           "freq_pr": pr_summary(pr["freq"]), "trail": trail,
           "window_waits": None if waits0 is None else waits1 - waits0, "settle": settle,
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


# --daemon-modes: the kmod profiler options of each (the daemon's scan period, its default)
DAEMON_OPTIONS = {
    # the daemon's default: fault mode, kinds auto (a target mostly in 4 KiB pages is attached
    # in abit mode, one mostly in THP in fault mode: profiler/kmod.py KmodProfiler.choose)
    "auto": {"mode": "fault"},
    "abit": {"mode": "abit"},
    "fault": {"mode": "fault", "kinds": "off"},  # fault mode whatever the target's pages
}


def runs_of(addr: np.ndarray, npages: np.ndarray) -> list[list[int]]:
    """The address ranges [start, end) that units (addr, npages) cover, adjacent ones merged."""
    if not len(addr):
        return []
    order = np.argsort(addr, kind="stable")
    lo = addr[order].astype(np.int64)
    hi = lo + npages[order].astype(np.int64) * PAGE
    new = np.ones(len(lo), bool)
    new[1:] = lo[1:] != hi[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(lo)) - 1
    return [[int(lo[i]), int(hi[j])] for i, j in zip(starts, ends)]


def daemon_view(state, pid: int, lo: int, hi: int, hot_pages: int,
                rng: np.random.Generator) -> dict:
    """What the daemon believes is hot after an interval's step: its units of ``pid`` in [lo,
    hi) ranked by heat (what every policy ranks by: the decayed sum of rates) and by this
    interval's rate, the hottest taken until they cover ``hot_pages`` (top_units), as address
    ranges."""
    if pid not in state.pids:
        return {"heat": [], "rate": [], "units": 0}
    a = state.a
    sel = np.flatnonzero((a["target"] == state.pids.index(pid)) & (a["addr"] >= lo)
                         & (a["addr"] < hi))
    addr, npages = a["addr"][sel], a["npages"][sel].astype(np.int64)
    out = {"units": int(len(sel))}
    for name, value in (("heat", state.heat_at(sel)), ("rate", a["rate"][sel])):
        take = top_units(np.asarray(value, np.float64), npages, hot_pages, rng)
        out[name] = runs_of(addr[take], npages[take])
    return out


def fork_watched_daemon(ready: dict, options: dict, budget_mb: int,
                        profile: Path | None = None, root: Path | None = None) -> tuple[int, int]:
    """The pagetier daemon (heuristic policy, 1 s intervals, kmod ``options``) on the workload
    in a forked child, as bench live forks it (pagetier/bench/live.py fork_run), each
    interval's JSON stats line also carrying "view": daemon_view of the state after the step,
    with "t" (time.monotonic() as the step began: its read follows at once) and "cpu_s" (the
    view's own CPU, not the daemon's). ``profile``: the child's whole run under cProfile, on
    its CPU time (the waits between reads cost nothing there), written to that file as it
    stops (``python -m pstats FILE``). ``root``: the daemon of that tree (daemon_tree), not
    this checkout's. Returns (child pid, read end of its lines)."""
    from pagetier.bench import live

    pid, lo, hi = ready["pid"], ready["addr"], ready["addr"] + ready["size"]
    hot_pages = ready["hot_size"] // PAGE
    rng = np.random.default_rng(1)

    def build(out):  # in the child
        if root is not None:
            use_tree(root)
            import pagetier

            if not Path(pagetier.__file__).resolve().is_relative_to(root.resolve()):
                raise RuntimeError(f"the daemon of {root} imported {pagetier.__file__}")
        from pagetier.daemon import config as config_mod
        from pagetier.daemon.loop import Daemon
        from pagetier.daemon.numab import NumaBalancing

        class Watched(Daemon):
            def step(self, boundary: bool = False) -> dict:
                t = time.monotonic()
                stats = super().step(boundary)
                if not boundary:
                    c0 = time.process_time()
                    view = daemon_view(self.state, pid, lo, hi, hot_pages, rng)
                    stats["view"] = dict(view, t=t, cpu_s=time.process_time() - c0)
                return stats

            def run(self) -> int:
                if profile is None:
                    return super().run()
                import cProfile

                prof = cProfile.Profile(time.process_time)
                try:
                    return prof.runcall(super().run)
                finally:
                    prof.dump_stats(str(profile))

        cfg = config_mod.load(None, {"policy": "heuristic", "fast_budget": f"{budget_mb}M",
                                     "interval": 1.0, "json": True, "profiler": "kmod",
                                     "profiler_options": options})
        config_mod.check_nodes(cfg)
        return Watched(cfg, pids=[pid], numab=NumaBalancing(), out=out)

    return live.fork_run(build)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tick_clock(log: list[tuple[float, dict]]) -> list[tuple[float, int]]:
    """(time.monotonic() at which each tick was printed, its hot_addr), in order. A tick's
    "t" is the workload's own monotonic clock from its start; the offset to ours is the
    smallest (arrival - t) seen, the tick read with the least delay."""
    if not log:
        return []
    offset = min(now - e["t"] for now, e in log)
    return sorted((e["t"] + offset, e["hot_addr"]) for _, e in log)


def score_views(views: list[dict], log: list[tuple[float, dict]], ready: dict) -> dict:
    """Per interval: precision and recall of the daemon's view (heat and rate, see
    daemon_view) against the hot window the workload used in most of that interval (the
    window of the first tick at or after its middle; a tick reports the window of the second
    before it). Intervals whose middle no tick has passed yet are left out."""
    clock = tick_clock(log)
    hot_size, hot_pages = ready["hot_size"], ready["hot_size"] // PAGE
    pr: dict[str, list] = {"heat": [], "rate": []}
    last_t = None
    for v in views:
        mid = v["t"] - (0.5 if last_t is None else (v["t"] - last_t) / 2)
        last_t = v["t"]
        hot = next((h for t, h in clock if t >= mid), None)
        if hot is None:
            continue
        for name, got in pr.items():
            runs = np.asarray(v[name], np.int64).reshape(-1, 2)
            npages = (runs[:, 1] - runs[:, 0]) // PAGE
            tp = int(overlap_pages(runs[:, 0], npages, hot, hot + hot_size).sum())
            pred = int(npages.sum())
            got.append((tp / pred if pred else 0.0, tp / hot_pages))
    return {"heat_pr": pr_summary(pr["heat"]), "rate_pr": pr_summary(pr["rate"]),
            "scored": len(pr["heat"]),
            # per interval: P and R by heat, then by rate
            "view_trail": [(round(h[0], 3), round(h[1], 3), round(r[0], 3), round(r[1], 3))
                           for h, r in zip(pr["heat"], pr["rate"])]}


class Settling:
    """Whether the module's passes over a target another process attached (the daemon) fit in
    one period again (see wait_settled), from its STATS each time :meth:`look` is called: a
    look that finds passes ended since the last one and no period cut by the scan budget
    meanwhile. An attach again (kinds auto re-attaches in the mode it chose) starts over."""

    def __init__(self, pid: int, dev=None):
        if dev is None:
            from pagetier.profiler import kmod

            dev = kmod.Device()
        self.dev, self.pid = dev, pid
        self.last: dict | None = None
        self.done_at: float | None = None

    def look(self) -> bool:
        if self.done_at is None:
            try:
                st = self.dev.stats(self.pid)
            except PagetierError as e:  # ESRCH: not attached yet, or between two attaches
                if getattr(e, "errno", None) != errno.ESRCH:
                    raise
                st = None
            last, self.last = self.last, st
            if st and last and last["scans"] >= 1 and st["scans"] > last["scans"] and \
                    st["scan_resumes"] == last["scan_resumes"]:
                self.done_at = time.monotonic()
        return self.done_at is not None

    def close(self) -> None:
        self.dev.close()


def measure_daemon(ready: dict, ticks: Ticks, mode: str, a, root: Path | None = None,
                   tag: str = "") -> dict:
    """The pagetier daemon (heuristic policy, budget twice the hot set, the daemon's scan
    period, kmod options DAEMON_OPTIONS[mode]) on the workload. Its intervals are counted from
    the first after a.daemon_warm of them and, unless --no-settle, after the module's passes
    over the target fit in one period (Settling): its CPU per interval (the step's, and the
    whole process's per second, the view's own CPU taken off), the module's CPU while it runs,
    the mode the target got, and the precision and recall of its view of the hot set per
    interval (score_views). ``root``: the daemon of that tree (--daemon-before), ``tag`` its
    name in the profile's file name."""
    t0 = time.monotonic()
    prof_path = None
    if a.profile:
        prof_path = result_path(a).parent / f"daemon-{ready['size'] >> 20}M-{mode}{tag}.prof"
    child, fd = fork_watched_daemon(ready, DAEMON_OPTIONS[mode], 2 * (ready["hot_size"] >> 20),
                                    prof_path, root)
    from pagetier.bench import live

    lines = live.Lines(fd)
    stats: list[dict] = []
    log = ticks.record()
    settling = Settling(ready["pid"])
    first = None  # the index in stats of the first interval counted
    cpu0 = cpu1 = None  # (process CPU s, time, lines read) at the first and last counted line
    try:
        deadline = time.monotonic() + a.warm_timeout + 10 * (a.daemon_warm + a.intervals)
        while (first is None or len(stats) < first + a.intervals) and not lines.eof \
                and time.monotonic() < deadline:
            # the ticks as they come: their arrival times set tick_clock's offset
            r, _, _ = select.select([fd, ticks.lines.fd], [], [], 1.0)
            settled = settling.look() or not a.settle
            if fd in r:
                stats += [e for e in lines.read() if "interval" in e]
                if first is None and settled and len(stats) >= a.daemon_warm:
                    first = len(stats)
                    cpu0 = (process_cpu_s(child), time.monotonic(), len(stats))
                elif first is not None and len(stats) > cpu0[2]:
                    cpu1 = (process_cpu_s(child), time.monotonic(), len(stats))
            ticks.drain()
        ticks.next()  # a tick after the last read: its interval can be scored
    finally:
        ticks.stop_record()
        settling.close()
        try:
            os.kill(child, signal.SIGTERM)
        except ProcessLookupError:
            pass
        live._reap(child)
        os.close(fd)
    # counted: from the interval after the one read when counting began
    kept = [s for s in stats[len(stats) if first is None else max(first - 1, 0):]
            if not s.get("boundary")]
    if len(kept) < 2:
        return {"error": f"the daemon gave {len(stats)} intervals"
                         + ("" if first is not None else ", none after the module settled")}
    cpu = [s["cpu_s"] for s in kept[1:]]
    span = kept[-1]["t"] - kept[0]["t"]
    prof = (kept[-1]["profiler_scan_s"] - kept[0]["profiler_scan_s"]) / span if span > 0 else None
    proc = None
    if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
        view_s = sum((s.get("view") or {}).get("cpu_s", 0.0) for s in stats[cpu0[2]:cpu1[2]])
        proc = (cpu1[0] - cpu0[0] - view_s) / (cpu1[1] - cpu0[1])
    modes = sorted({m for s in kept for m in (s.get("modes") or {}).values()})
    return {"intervals": len(cpu), "cpu_s_med": statistics.median(cpu), "cpu_s_max": max(cpu),
            "cpu_s_mean": statistics.fmean(cpu), "process_cpu": proc, "module_cpu": prof,
            "ran": "+".join(modes) or "?",
            "settle_s": None if settling.done_at is None else settling.done_at - t0,
            "warm_intervals": first,
            # per counted interval: the module's CPU (scan + probe time per second)
            "module_trail": [round((b["profiler_scan_s"] - a_["profiler_scan_s"])
                                   / max(b["t"] - a_["t"], 1e-3), 3)
                             for a_, b in zip(kept, kept[1:])],
            "units_med": statistics.median(s["units"] for s in kept[1:]),
            "promoted": sum(s["promoted"] for s in stats), "demoted": sum(s["demoted"] for s in stats),
            **score_views([s["view"] for s in kept[1:] if "view" in s], log, ready)}


def median_run(runs: list[dict]) -> dict:
    """Of repeated daemon runs, the one with the median CPU (a run that failed counts as the
    costliest)."""
    def cost(r):
        return float("inf") if "error" in r else (r.get("process_cpu") or r["cpu_s_mean"])
    return sorted(runs, key=cost)[(len(runs) - 1) // 2]


def measure_daemons(cell: dict, ready: dict, ticks: Ticks, mode: str, a, save) -> None:
    """The daemon in ``mode`` on the workload, --daemon-repeat times, and as many times the
    daemon of --daemon-before beside it, the two taking turns (the first turn goes to the one
    that went second in the last): cell["daemon"][mode] and [mode@REV], the median run of each
    (all runs in cell["daemon_runs"] when repeated)."""
    whos = [(mode, None, "")]
    if a.daemon_before:
        root = daemon_tree(a.daemon_before)
        rev = root.name.removeprefix("daemon-rev-")[:7]
        whos.append((f"{mode}@{rev}", root, f"-{rev}"))
    runs: dict[str, list] = {}
    for k in range(a.daemon_repeat):
        for key, root, tag in (whos if k % 2 == 0 else whos[::-1]):
            d = measure_daemon(ready, ticks, mode, a, root,
                               tag + (f"-{k + 1}" if a.daemon_repeat > 1 else ""))
            runs.setdefault(key, []).append(d)
            print(f"  daemon {key}: {d}", flush=True)
    for key, rs in runs.items():
        cell.setdefault("daemon", {})[key] = median_run(rs)
        if len(rs) > 1:
            cell.setdefault("daemon_runs", {})[key] = rs
    save()


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
                      + f" read {r['read_ms']:.1f} ms"
                      + (f" look {r['look_ms']:.1f} ms" if r.get("look_ms") is not None else ""),
                      flush=True)
                save()
        finally:
            dev.close()
        if name == "after" and a.daemon and not cell["thp"]:
            for mode in a.daemon_modes:
                measure_daemons(cell, ready, ticks, mode, a, save)
    swap_module(None, ready["pid"])
    if damon:
        r = measure_damon(ready, ticks, a, rng)
        cell["damon"] = r
        print(f"  damon        cpu {100 * (r['cpu'] or 0):5.1f}% P {r['p_med']:.3f}/"
              f"{r['p_min']:.3f} R {r['r_med']:.3f}/{r['r_min']:.3f} regions "
              f"{r['regions']:.0f}", flush=True)
        save()


def result_path(a) -> Path:
    """Where the guest writes its results: --json, else the run's output directory."""
    return Path(a.json or Path(os.environ.get("PAGETIER_VM_OUT", "/tmp")) / RESULT_NAME)


def guest_main(a) -> int:
    from pagetier.profiler import kmod

    release = platform.release()
    kos = {k: p for k, p in module_paths(release, a.before, a.after).items() if k in a.modules}
    missing = [str(p) for p in kos.values() if not p.exists()]
    if missing:
        print(f"bench_scale: missing {', '.join(missing)} (run it from the host, which builds the "
              "'before' module; build the working tree's with make -C kmod)", file=sys.stderr)
        return 1
    if a.daemon_before and not daemon_tree(a.daemon_before).is_dir():
        print(f"bench_scale: missing {daemon_tree(a.daemon_before)} (run it from the host, which "
              "exports --daemon-before's daemon there)", file=sys.stderr)
        return 1
    damon = Path("/sys/kernel/mm/damon/admin").exists() and not a.no_damon
    doc = {"kernel": release, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "before": a.before, "args": vars(a), "modules": {}, "cells": [], "sparse": [],
           "damon": damon}
    out_path = result_path(a)
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
    doc["numa_balancing"] = numa_balancing_off()
    ok = measure_all(doc, kos, a, rng, damon, save)
    print(render(doc))
    return 0 if ok else 1


NUMAB = Path("/proc/sys/kernel/numa_balancing")


def numa_balancing_off() -> str:
    """Switch the kernel's NUMA balancing off for the run; the value it had.

    Its hinting faults would move the workload's pages and take faults beside the module's and
    DAMON's, and each daemon start and stop would otherwise switch it off and on again: every
    change between 0 and not 0 patches the kernel's code (the sched_numa_balancing static key),
    which under emulation has left a CPU on a stale int3 (an "Oops: int3" in task_tick_fair
    between two daemons, in this benchmark; tests/guest/conftest.py numab_on). It is left off:
    the test VM is discarded after the run, and switching it on again would patch once more."""
    old = NUMAB.read_text().strip()
    NUMAB.write_text("0")
    return old


def measure_all(doc: dict, kos: dict[str, Path], a, rng, damon: bool, save) -> bool:
    """Every footprint and THP setting, each on its own workload, then the sparse rows; True
    when every workload's memory check passed."""
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
    return ok


# ------------------------------------------------------------------ tables
def _f(x, fmt: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _settle(r: dict | None) -> str:
    st = (r or {}).get("settle")
    if not st:
        return "-"
    when = "timed out" if st.get("timed_out") else f"{st['s']:.1f} s"
    return f"{when} ({st['passes']}, {st['resumes']} cut); {r['resumes']} cut"


def _pr(r: dict | None) -> str:
    return (f"{r['p_med']:.2f}/{r['p_min']:.2f} {r['r_med']:.2f}/{r['r_min']:.2f}"
            if r and "p_med" in r else "-")


def end_to_end(thp: bool, dmodes: list[str], sizes: list[int], cell, head) -> list[str]:
    """The daemon against the kdamond on the same workload: CPU and precision / recall, for
    each daemon mode and hot set."""
    lines = [f"**End to end, THP {'on' if thp else 'off'}: module + daemon against the kdamond** "
             "(% of one CPU. daemon: the whole process's CPU per second, its view's scoring "
             "taken off (older runs: the step's, marked *), and in brackets its step's ms per 1 s "
             "interval, median/max; module: STATS scan + probe time under the daemon; P/R: "
             "median/min of P, median/min of R per interval, of the daemon's units ranked by "
             "heat and of DAMON's regions by nr_accesses)", "", *head("who", "hot set")]
    totals = {}  # (mode, motion, size) -> (daemon, module + daemon), for the ratios to a REV's
    for m in dmodes:
        base, _, rev = m.partition("@")
        for motion in ("still", "moving"):
            got = {}
            for s in sizes:
                c = cell(s, thp, motion) or {}
                d = (c.get("daemon") or {}).get(m)
                k = (c.get("damon") or {}).get("cpu")
                if not d or "error" in d:
                    got[s] = {"ran": (d or {}).get("error", "-")}
                    continue
                own = d.get("process_cpu")
                daemon = own if own is not None else d["cpu_s_mean"]
                total = daemon + (d["module_cpu"] or 0)
                totals[m, motion, s] = (daemon, total)
                mine = totals.get((base, motion, s), (None, None)) if rev else (None, None)
                got[s] = {
                    "ran": d.get("ran", "?"),
                    "cpu": f"{100 * daemon:.1f}%{'' if own is not None else '*'} "
                           f"({1e3 * d['cpu_s_med']:.0f}/{1e3 * d['cpu_s_max']:.0f})",
                    "module": _f(None if d["module_cpu"] is None else 100 * d["module_cpu"]) + "%",
                    "total": f"{100 * total:.1f}%",
                    "kdamond": "-" if k is None else f"{100 * k:.1f}%",
                    "ratio": _ratio(total, k),
                    "view": _pr(d.get("heat_pr")),
                    "damon": _pr(c.get("damon")),
                    "vs_daemon": _ratio(mine[0], daemon), "vs_total": _ratio(mine[1], total)}
            if all(g["ran"] == "-" for g in got.values()):
                continue
            for key, label in (("ran", f"daemon {m}: the target's mode"),
                               ("cpu", "daemon"), ("module", "module under the daemon"),
                               ("total", "module + daemon"), ("kdamond", "kdamond"),
                               ("ratio", "(module + daemon) / kdamond"),
                               ("view", "P/R daemon's view (heat)"), ("damon", "P/R DAMON"),
                               ("vs_daemon", f"daemon: this tree / git {rev}"),
                               ("vs_total", f"module + daemon: this tree / git {rev}")):
                if key.startswith("vs_") and not rev:
                    continue
                lines.append(f"| {label} | {motion} | "
                             + " | ".join(got[s].get(key, "-") for s in sizes) + " |")
    return lines + [""]


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
    if doc.get("numa_balancing") is not None:
        lines += [f"kernel NUMA balancing: off for the run (it was {doc['numa_balancing']})", ""]
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
            if any(((cell(s, thp, m) or {}).get("module") or {}).get(k, {}).get("settle")
                   for s in sizes for m in ("still", "moving") for k in keys):
                lines += [f"From the attach to the steady state, THP {'on' if thp else 'off'}: "
                          "still / moving, s from the attach to the end of the first pass done "
                          "in one period (passes to then, periods the scan budget cut before "
                          "it; the intervals above were read after it), and periods cut while "
                          "they were read", "", *head("module/mode")]
                for k in keys:
                    row = []
                    for s in sizes:
                        got = [((cell(s, thp, m) or {}).get("module") or {}).get(k) for m in
                               ("still", "moving")]
                        row.append(" / ".join(_settle(r) for r in got))
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
        dmodes = sorted({m for c in cells if c["thp"] == thp for m in (c.get("daemon") or {})})
        rows += [(f"daemon {m} view by {what}", f"daemon:{m}", f"{what}_pr")
                 for m in dmodes for what in ("heat", "rate")]

        def part(c, k):  # the record row key k names in cell c
            if not c:
                return None
            if k == "damon":
                return c.get("damon")
            if k.startswith("daemon:"):
                return (c.get("daemon") or {}).get(k.split(":", 1)[1])
            return c["module"].get(k)

        for motion in ("still", "moving"):
            for label, k, field in rows:
                row = []
                for s in sizes:
                    r = part(cell(s, thp, motion), k)
                    r = (r or {}).get(field) if field else r
                    row.append(_pr(r))
                if any(x != "-" for x in row):
                    lines.append(f"| {label} | {motion} | " + " | ".join(row) + " |")
        lines.append("")
        # DAMON and the daemon: CPU
        if any((cell(s, thp, "still") or {}).get("damon") for s in sizes):
            lines += [f"**CPU, THP {'on' if thp else 'off'}, still** (% of one CPU; read: "
                      "this process's READ per interval, ms; look: its READ_REGIONS of the "
                      "accessed regions without a reset, as the daemon's looks between reads, ms; "
                      "the daemon: the end-to-end table)", "",
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
                rows[f"look {k}"] = [_f((c["module"].get(k) or {}).get("look_ms")) if c else "-"
                                     for c in (cell(s, thp, "still") for s in sizes)]
            for k, row in rows.items():
                lines.append(f"| {k} | " + " | ".join(row) + " |")
            lines.append("")
        if dmodes:
            lines += end_to_end(thp, dmodes, sizes, cell, head)
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
    if a.daemon_before:
        export_daemon(a.daemon_before)
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
        for f in sorted(res.outdir.glob("daemon-*.prof")) if a.profile else ():
            print(f"bench_scale: the daemon's profile: {f} (python -m pstats {f})")
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
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="measure each mode right after its first passes, not once a pass ends "
                         "in one period (see wait_settled)")
    ap.add_argument("--damon-warm", type=int, default=3, help="ticks before DAMON is read")
    ap.add_argument("--no-damon", action="store_true")
    ap.add_argument("--damon-alone", dest="damon_share", action="store_false",
                    help="DAMON without a busy process sharing the workload's CPU (see "
                         "measure_damon: under emulation it then sees almost no access)")
    ap.add_argument("--daemon", action="store_true",
                    help="also the daemon end to end (the after module, THP off, still and "
                         "moving): its CPU and its view's precision and recall")
    ap.add_argument("--daemon-modes", default="auto",
                    help="the daemon's kmod modes: auto (its default: kinds auto chooses per "
                         "target), abit, fault (kinds off)")
    ap.add_argument("--daemon-warm", type=int, default=4, help="daemon intervals not counted")
    ap.add_argument("--daemon-before", metavar="REV",
                    help="--daemon: also the daemon of git revision REV (exported to "
                         "build/daemon-rev-<commit>), on the same module and workload, the two "
                         "daemons taking turns; the table adds their ratio")
    ap.add_argument("--daemon-repeat", type=int, default=1,
                    help="--daemon: runs of each daemon per cell (the median run is shown)")
    ap.add_argument("--profile", action="store_true",
                    help="--daemon: run each daemon under cProfile (its CPU time), saved as "
                         "daemon-<footprint>M-<mode>.prof beside the results in the run's output "
                         "directory (build/vm/...); its CPU figures then include the "
                         "profiler's own cost")
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
    if a.daemon_repeat < 1:
        ap.error("--daemon-repeat must be at least 1")
    if a.daemon_before and not a.daemon:
        ap.error("--daemon-before needs --daemon")
    bad = ([m for m in a.modes if m not in ("abit", "fault")]
           + [m for m in a.daemon_modes if m not in DAEMON_OPTIONS]
           + [m for m in a.modules if m not in ("before", "after")]
           + [h for h in a.hot if h not in ("still", "moving")])
    if bad:
        ap.error(f"unknown value {bad[0]!r} (modes: abit, fault; daemon modes: auto, abit, "
                 "fault; modules: before, after; hot: still, moving)")
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
