"""``pagetier bench live``: pagetier's policies against the kernel's own tiering, DAMON's tiering
schemes and no migration, side by side, on the built-in workload in the two-node test VM.

On the host it boots the VM once (6.12 by default, with the slow node described through HMAT as a
lower memory tier) and runs itself inside (``--in-guest``). Inside, each configuration runs in turn
against a fresh workload: every page first touched on the slow node, a hot part that moves to the
next window every ``phase`` seconds, so that whatever manages placement has to promote the new hot
part and demote the old one to make room. Before the workload starts its accesses (it waits for
SIGUSR1), the manager is set up, and the fast node's free memory is cut to the same size for every
configuration by reserving the rest as 2 MiB hugetlb pages (which nothing can migrate or reclaim):
the fast budget plus the node's promotion watermark, below which the kernel stops promoting.
pagetier's daemon gets that budget as ``--fast-budget``.

Configurations: ``none`` (numa_balancing 0, no demotion), ``pagetier:POLICY`` (the daemon, forked
from the bench process with the same Daemon and config a ``pagetier attach`` would build, on
pagetier.ko), ``kernel`` (numa_balancing 2 with demotion: see tiering.KernelTiering) and ``damos``
(tiering.DamosTiering). One that cannot run here is listed with the reason.

Measured each second: the workload's own report of the share of its accesses served by the fast
node; where each of its pages is (move_pages queries), hence MB on the fast node, pages moved and
ping-pongs (a page moved back to the node it left within PING_PONG_S); /proc/vmstat
pgmigrate_success (all migrations in the guest); CPU time of whatever decides and moves (the
daemon process, kswapd, the kdamonds) and of pagetier.ko's scans. live_table.py turns it into the
table.
"""
from __future__ import annotations

import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

import click

from pagetier import live_table, vm
from pagetier.daemon import config as config_mod
from pagetier.errors import ConfigError, PagetierError

DEFAULT_POLICIES = "heuristic,lru,heat-classes,first-touch"
PING_PONG_S = 10.0
PAGE = 4096
HUGE = 2 << 20
FAST, SLOW = 0, 1
RESULT_NAME = "bench-live.json"


@dataclass
class Spec:
    """One bench run's parameters (the same for every configuration)."""
    seconds: int = 120
    phase: int = 40
    size_mb: int = 256
    hot_mb: int = 64
    budget_mb: int = 96
    mode: str = "fault"
    scan_period_ms: int = 500

    def check(self) -> None:
        if self.seconds < 2 or self.phase < 0:
            raise ConfigError("bench live: --seconds must be >= 2 and --phase >= 0")
        if not (0 < self.hot_mb <= self.size_mb):
            raise ConfigError("bench live: need 0 < hot <= size")
        if self.budget_mb <= 0:
            raise ConfigError("bench live: --fast-budget must be > 0")


def config_names(policies: str) -> list[str]:
    """none, pagetier:POLICY for each policy, kernel, damos."""
    from pagetier.policies import base

    names = ["none"]
    for p in filter(None, (x.strip() for x in policies.split(","))):
        if p not in base.known():
            raise ConfigError(f"bench live: unknown policy {p!r} (known: {', '.join(base.known())})")
        names.append(f"pagetier:{p}")
    return names + ["kernel", "damos"]


# ------------------------------------------------------------------ guest side: the pieces
class FastCapacity:
    """Leaves about ``free`` bytes free on a node by reserving the rest as 2 MiB hugetlb pages."""

    def __init__(self, node: int = FAST):
        self.node = node
        self.path = Path(f"/sys/devices/system/node/node{node}/hugepages/hugepages-2048kB/nr_hugepages")

    def free(self) -> int:
        from pagetier.daemon.config import node_meminfo

        return node_meminfo(self.node)["MemFree"]

    def set(self, free: int) -> int:
        """Reserve until MemFree is within 2 MiB of ``free``; return the MemFree reached.

        A reservation takes its memory at once, but a released huge page may come back to MemFree
        only later (6.12 frees them from a worker), and the allocator's own use moves MemFree too.
        So each step waits for MemFree to settle, and the approach is from above: most of the way
        in one step, the rest a page at a time."""
        if not self.path.exists():
            raise PagetierError(f"no {self.path}: the kernel lacks 2 MiB hugetlb pages")
        have = self.free()
        for _ in range(40):
            diff = (have - free) // HUGE
            if abs(have - free) < HUGE:
                break
            if diff > 8:
                diff -= 4  # slack for what the allocator takes besides the pages
            cur = int(self.path.read_text())
            want = max(0, cur + diff)
            if want == cur:
                break
            self.path.write_text(f"{want}\n")
            have = self._settled()
        return have

    def _settled(self, timeout: float = 5.0) -> int:
        """MemFree once two looks 0.1 s apart agree within 256 KiB (or after ``timeout``)."""
        last = self.free()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.free()
            if abs(now - last) < 256 << 10:
                return now
            last = now
        return last

    def release(self) -> None:
        if self.path.exists():
            self.path.write_text("0\n")


class PageTracker:
    """Where each page of the workload's buffer is, once a second: moves and ping-pongs."""

    def __init__(self, pid: int, addr: int, size: int, window_s: float = PING_PONG_S):
        import numpy as np

        self.np = np
        self.pid, self.window = pid, window_s
        self.addrs = np.arange(addr, addr + size, PAGE, dtype=np.uint64)
        self.node = self._query()
        self.last_from = np.full(len(self.addrs), -1, np.int32)
        self.last_t = np.full(len(self.addrs), -1e9)
        self.moved = self.ping_pongs = 0

    def _query(self):
        from pagetier.daemon import mover

        return mover.query_nodes(self.pid, self.addrs)

    def sample(self, t: float) -> float | None:
        """Update from a fresh look; return MB of the buffer on the fast node."""
        np = self.np
        try:
            cur = self._query()
        except (PagetierError, OSError):  # the workload just exited
            return None
        idx = np.nonzero((cur >= 0) & (self.node >= 0) & (cur != self.node))[0]
        back = (cur[idx] == self.last_from[idx]) & (t - self.last_t[idx] <= self.window)
        self.ping_pongs += int(back.sum())
        self.moved += len(idx)
        self.last_from[idx] = self.node[idx]
        self.last_t[idx] = t
        self.node = np.where(cur >= 0, cur, self.node)
        return int((cur == FAST).sum()) * PAGE / 2**20


class Lines:
    """JSON lines from a pipe read without blocking (select, then os.read)."""

    def __init__(self, fd: int):
        self.fd, self.buf, self.eof = fd, b"", False

    def read(self) -> list[dict]:
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            self.eof = True
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = []
        for ln in lines:
            try:
                out.append(json.loads(ln))
            except ValueError:
                sys.stderr.write(ln.decode(errors="replace") + "\n")
        return out


def vmstat(key: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    return 0


def fork_daemon(pid: int, policy: str, spec: Spec) -> tuple[int, int]:
    """The pagetier daemon on ``pid`` in a forked child (the modules are imported already: no
    second interpreter start under emulation). Returns (child pid, read end of its JSON lines)."""
    from pagetier.daemon.loop import Daemon, create_policy, create_profiler
    from pagetier.daemon.numab import NumaBalancing

    overrides = {"policy": policy, "fast_budget": f"{spec.budget_mb}M", "interval": 1.0,
                 "json": True, "profiler": "kmod",
                 "profiler_options": {"mode": spec.mode, "scan_period_ms": spec.scan_period_ms}}
    cfg = config_mod.load(None, overrides)  # errors here, in the parent
    config_mod.check_nodes(cfg)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the guest
        rc = 1
        try:
            os.close(r)
            out = os.fdopen(w, "w")
            profiler = create_profiler(cfg)
            daemon = Daemon(cfg, pids=[pid], profiler=profiler, policy=create_policy(cfg),
                            numab=NumaBalancing(), out=out, overrides=overrides)
            rc = daemon.run()
            out.flush()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(rc)
    os.close(w)
    return child, r


def _set_sysctls(numab: str, demotion: str) -> None:
    from pagetier import tiering

    if tiering.NUMAB.exists():
        tiering.write_sysctl(tiering.NUMAB, numab)
    if tiering.DEMOTION.exists():
        tiering.write_sysctl(tiering.DEMOTION, demotion)


def run_config(name: str, spec: Spec, log=print) -> dict:
    """One configuration against a fresh workload; its record (see live_table)."""
    from pagetier import tiering
    from pagetier.workload import binary

    rec: dict = {"config": name, "runnable": True, "phase_s": spec.phase, "notes": []}
    manager = None
    if name == "kernel":
        manager = tiering.KernelTiering(FAST, SLOW)
    elif name == "damos":
        manager = tiering.DamosTiering(FAST, SLOW)
    if manager is not None:
        why = manager.probe()
        if why:
            rec.update(runnable=False, reason=why)
            return rec
    _set_sysctls("0", "false")
    if manager is not None:
        manager.start()
    capacity = FastCapacity(FAST)
    daemon_pid = daemon_fd = None
    proc = None
    try:
        argv = [str(binary()), "--size", str(spec.size_mb), "--hot", str(spec.hot_mb),
                "--start-node", str(SLOW), "--fast-node", str(FAST), "--duration", str(spec.seconds),
                "--phase", str(spec.phase), "--wait"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
        wl = Lines(proc.stdout.fileno())
        ready = None
        while ready is None and not wl.eof:
            select.select([wl.fd], [], [], 5)
            evs = wl.read()
            ready = next((e for e in evs if e.get("event") == "ready"), None)
        if ready is None:
            raise PagetierError(f"{name}: the workload exited before it was ready ({argv})")
        pid = ready["pid"]
        dm = None
        dstats: list[dict] = []
        if name.startswith("pagetier:"):
            daemon_pid, daemon_fd = fork_daemon(pid, name.split(":", 1)[1], spec)
            dm = Lines(daemon_fd)
            deadline = time.monotonic() + 300
            while not dstats and not dm.eof and time.monotonic() < deadline:
                select.select([daemon_fd], [], [], 5)
                dstats += [e for e in dm.read() if "interval" in e]
            if not dstats:
                raise PagetierError(f"{name}: the daemon did not start (see its output above)")
        promo = config_mod.zone_watermark(FAST, "promo", page_size=PAGE)  # read once: a watermark boost moves it
        reached = capacity.set(spec.budget_mb * 2**20 + promo)
        rec["fast_capacity_mb"] = round((reached - promo) / 2**20, 1)
        tracker = PageTracker(pid, ready["addr"], ready["size"])
        mig0 = vmstat("pgmigrate_success")

        def mgr_cpu():
            if daemon_pid is not None:
                return tiering.thread_cpu_s(daemon_pid)
            return manager.cpu_s() if manager is not None else None

        def prof_cpu():
            if daemon_pid is None:
                return None
            return dstats[-1].get("profiler_scan_s", 0.0) if dstats else 0.0

        cpu0, prof0 = mgr_cpu(), prof_cpu()
        log(f"[{name}] workload pid {pid}: {spec.size_mb} MiB first touched on node {SLOW}; "
            f"fast node free {reached / 2**20:.0f} MiB (budget {spec.budget_mb} MiB + promotion "
            f"watermark); go")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        ticks, samples = [], []
        next_sample = t0 + 1.0
        while not wl.eof:
            fds = [wl.fd] + ([daemon_fd] if dm is not None and not dm.eof else [])
            ready_fds, _, _ = select.select(fds, [], [], max(0.0, next_sample - time.monotonic()))
            if wl.fd in ready_fds:
                for e in wl.read():
                    if e.get("event") == "tick":
                        ticks.append(e)
                    elif e.get("event") == "done":
                        rec["done"] = e
            if dm is not None and daemon_fd in ready_fds:
                dstats += [e for e in dm.read() if "interval" in e]
            now = time.monotonic()
            if now >= next_sample and "done" not in rec and now - t0 <= spec.seconds + 0.5:
                t = now - t0
                fast_mb = tracker.sample(t)
                if fast_mb is None:  # the workload is exiting
                    next_sample += 1.0
                    continue
                c, p = mgr_cpu(), prof_cpu()
                samples.append({
                    "t": round(t, 2), "fast_mb": round(fast_mb, 1), "moved_pages": tracker.moved,
                    "ping_pongs": tracker.ping_pongs,
                    "pgmigrate": vmstat("pgmigrate_success") - mig0,
                    "mgr_cpu_s": None if c is None else round(c - cpu0, 3),
                    "prof_cpu_s": None if p is None else round(p - prof0, 3)})
                next_sample += 1.0
                if ticks:
                    log(f"[{name}] t={t:4.0f}s fast-access {ticks[-1]['access_fast_fraction'] * 100:5.1f}% "
                        f"workload on fast {fast_mb:6.1f} MB, migrated "
                        f"{samples[-1]['pgmigrate'] * PAGE / 2**20:6.1f} MB")
        rc = proc.wait()
        rec["memory_ok"] = rc == 0 and rec.get("done", {}).get("pages_corrupt", 1) == 0
        rec.update(ticks=ticks, samples=samples)
        if daemon_pid is not None:
            rec["daemon_totals"] = {k: sum(s.get(k, 0) for s in dstats)
                                    for k in ("promoted", "demoted", "bytes_moved", "ping_pongs",
                                              "failed", "nomem", "busy", "clipped")}
            rec["daemon_stats"] = [{k: s.get(k) for k in ("t", "units", "promoted", "demoted",
                                                          "fast_used", "cpu_s", "wall_s",
                                                          "profiler_scan_s", "policy", "errors")}
                                   for s in dstats]
        if isinstance(manager, tiering.DamosTiering):
            rec["damos_applied_bytes"] = manager.applied_bytes()
        rec["notes"] = _notes(name)
        return rec
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if daemon_pid is not None:
            _reap(daemon_pid)
            os.close(daemon_fd)
        if manager is not None:
            manager.stop()
        capacity.release()
        _set_sysctls("0", "false")


def _reap(pid: int, timeout: float = 60) -> None:
    """Wait for the daemon (it ends when its target has); kill it if it hangs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def _notes(name: str) -> list[str]:
    if name == "kernel":
        return ["mgr s: kswapd0 (demotion); NUMA scanning and promotion run in the workload's "
                "own task, visible only in its accesses/s"]
    if name == "damos":
        return ["mgr s: both kdamonds (monitoring and migration)"]
    if name.startswith("pagetier:"):
        return ["mgr s: the daemon process; prof s: pagetier.ko scan time (its hinting faults "
                "run in the workload's task)"]
    return []


def guest_main(names: list[str], spec: Spec, out_path: Path, log=print) -> int:
    """Runs inside the VM: every configuration in turn; the records as JSON to ``out_path``."""
    from pagetier import tiering
    from pagetier.profiler import kmod

    saved = {p: tiering.read_sysctl(p) for p in (tiering.NUMAB, tiering.DEMOTION) if p.exists()}
    tiers = tiering.memory_tiers()
    log("memory tiers: " + (", ".join(f"memory_tier{t} = nodes {nl}" for t, nl in tiers.items())
                            or "none"))
    records = []
    loaded = False
    try:
        if any(n.startswith("pagetier:") for n in names):
            kmod.load_module()
            loaded = True
        for name in names:
            t = time.monotonic()
            try:
                rec = run_config(name, spec, log=log)
            except PagetierError as e:
                rec = {"config": name, "runnable": False, "reason": f"failed: {e}"}
            rec["wall_s"] = round(time.monotonic() - t, 1)
            log(f"[{name}] " + ("done" if rec["runnable"] else f"not run: {rec['reason']}")
                + f" ({rec['wall_s']:.0f} s)")
            records.append(rec)
    finally:
        for p, v in saved.items():
            tiering.write_sysctl(p, v)
        if loaded:
            kmod.unload_module()
    doc = {"spec": asdict(spec), "kernel": os.uname().release, "memory_tiers": tiers,
           "records": records}
    out_path.write_text(json.dumps(doc))
    return 0


# ------------------------------------------------------------------ host side
def results(doc: dict) -> list[dict]:
    rows = [live_table.summarize(r) for r in doc["records"]]
    return live_table.add_ratios(rows)


def report(doc: dict, command_line: str) -> str:
    spec = doc["spec"]
    rows = results(doc)
    tiers = ", ".join(f"memory_tier{t}: nodes {nl}" for t, nl in doc["memory_tiers"].items())
    head = [
        f"$ {command_line}",
        f"kernel {doc['kernel']}; memory tiers: {tiers or 'none'}",
        f"workload: {spec['size_mb']} MiB first touched on the slow node, hot part "
        f"{spec['hot_mb']} MiB moving every {spec['phase']} s, {spec['seconds']} s per config; "
        f"fast node cut to {spec['budget_mb']} MiB + the promotion watermark",
        "fast acc: share of the workload's accesses served by the fast node (mean of seconds); "
        "x none: ratio to no migration; end: last 3 s; t->hot: s from a phase start until "
        f">= {live_table.HOT_THRESHOLD:.0%} (mean of phases); MB moved: workload pages seen changing "
        "node (sampled each second); vm MB: pgmigrate_success of the whole guest; "
        f"pp: pages moved back within {PING_PONG_S:.0f} s; peak MB: workload on fast node; "
        "mgr s / prof s: CPU s of the mover / the profiler; acc/s x: workload speed vs none",
        "",
        live_table.format_table(rows),
        "",
        live_table.format_series(rows),
    ]
    for r in rows:
        if r["runnable"] and r.get("memory_ok") is False:
            head.append(f"WARNING: {r['config']}: the workload's memory check failed")
    notes = sorted({n for r in rows if r["runnable"] for n in r.get("notes", [])})
    if notes:
        head += [""] + [f"note: {n}" for n in notes]
    if doc.get("vm_seconds"):
        head.append(f"VM run: {doc['vm_seconds']:.0f} s from boot to results")
    for rep in doc.get("kernel_reports", []):
        head.append(f"KERNEL REPORT during the run: {rep.strip()}")
    return "\n".join(head)


@click.command("live")
@click.option("--quick", is_flag=True, help="40 s per configuration, the hot part moving at 20 s")
@click.option("--policies", default=DEFAULT_POLICIES, show_default=True,
              help="pagetier policies to run, comma-separated ('' for none)")
@click.option("--kernel", "-k", default="6.12", show_default=True, help="6.12 or 6.1")
@click.option("--seconds", type=int, help="seconds per configuration (default 120; quick 40)")
@click.option("--phase", type=int, help="seconds before the hot part moves (default 40; quick 20)")
@click.option("--fast-budget", default="96M", show_default=True,
              help="fast memory for the workload, the same for every configuration")
@click.option("--mode", type=click.Choice(["fault", "abit"]), default="fault", show_default=True,
              help="pagetier.ko profiling mode")
@click.option("--json", "as_json", is_flag=True, help="print the results as JSON")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="also write the results here")
@click.option("--configs", hidden=True, help="exactly these configurations, comma-separated")
@click.option("--in-guest", is_flag=True, hidden=True)
@click.option("--records", type=click.Path(dir_okay=False), hidden=True,
              help="print the table of a saved results file instead of running")
def command(quick, policies, kernel, seconds, phase, fast_budget, mode, as_json, output,
            configs, in_guest, records):
    """Compare pagetier's policies with the kernel's tiering, DAMOS and no migration, live in
    the two-node test VM (6.12: the slow node is a lower memory tier).

    \b
    Examples:
      pagetier bench live --quick
      pagetier bench live --policies heuristic,lru -o live.json
      pagetier bench live --quick --json
    """
    from pagetier.daemon.config import parse_size

    budget = parse_size(fast_budget, "--fast-budget", "command line")
    spec = Spec(seconds=seconds or (40 if quick else 120), phase=(20 if quick else 40)
                if phase is None else phase, budget_mb=budget // 2**20, mode=mode)
    spec.check()
    names = config_names(policies)
    if configs:
        names = [c.strip() for c in configs.split(",") if c.strip()]
        bad = [c for c in names if c not in ("none", "kernel", "damos") and not c.startswith("pagetier:")]
        if bad:
            raise ConfigError(f"bench live: unknown configuration {bad[0]!r}")
    if in_guest or vm.in_guest():
        if not output:
            raise ConfigError("bench live --in-guest needs -o")
        sys.exit(guest_main(names, spec, Path(output), log=lambda m: click.echo(m, err=True)))
    argv = ["pagetier", *sys.argv[1:]]
    if records:
        doc = json.loads(Path(records).read_text())
    else:
        doc = run_in_vm(names, spec, kernel, echo=not as_json)
    doc["command"] = shlex.join(argv)
    if output:
        Path(output).write_text(json.dumps({**doc, "rows": results(doc)}, indent=1))
    if as_json:
        click.echo(json.dumps({"command": doc["command"], "kernel": doc["kernel"],
                               "spec": doc["spec"], "rows": results(doc)}))
    else:
        click.echo(report(doc, doc["command"]))
    if doc.get("kernel_reports"):
        sys.exit(1)


def run_in_vm(names, spec: Spec, kernel: str, echo: bool = True) -> dict:
    from pagetier.workload import binary

    binary()
    cmd = (f"pagetier bench live --in-guest --configs {shlex.quote(','.join(names))} "
           f"--seconds {spec.seconds} --phase {spec.phase} --fast-budget {spec.budget_mb}M "
           f"--mode {spec.mode} -o \"$PAGETIER_VM_OUT/{RESULT_NAME}\"")
    t0 = time.monotonic()
    res = vm.run(cmd, kernel=kernel, fast="1G", slow="1G", hmat=True, echo=echo,
                 timeout=900 + len(names) * (spec.seconds + 120))
    result = res.outdir / RESULT_NAME
    if res.returncode != 0 or not result.exists():
        res.check()
        raise PagetierError(f"bench live: the guest wrote no results ({result})")
    doc = json.loads(result.read_text())
    # A kernel report during a run is a result too (e.g. a kdamond soft lockup under emulation):
    # shown with the table, and the command exits non-zero.
    doc["kernel_reports"] = res.reports
    doc["vm_seconds"] = round(time.monotonic() - t0, 1)
    return doc
