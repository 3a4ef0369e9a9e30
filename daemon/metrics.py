"""The daemon's Prometheus endpoint (``--metrics [ADDR:]PORT``, config key ``metrics``).

Every series the daemon itself counts comes from the status document of the last interval
(:meth:`Metrics.update`, called where the status file is written: daemon/loop.py), so a scrape
and ``pagetier status --json`` give the same numbers until the next interval. The kernel's
counters (per-node vmstat, /proc/vmstat, the cgroups' memory.stat) are read at each scrape;
fields a kernel lacks are absent series. The text format is prometheus_client's.
"""
from __future__ import annotations

import copy
import errno
import logging
import threading
import time
from pathlib import Path

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    InfoMetricFamily)

from pagetier.daemon.config import NODE_ROOT, parse_listen
from pagetier.daemon.report import per_target_bytes
from pagetier.errors import ConfigError

log = logging.getLogger("pagetier.daemon")

PAGE = 4096
CGROUP_ROOT = Path("/sys/fs/cgroup")
# what a step reports as its binding limit (stats "limit"; None is "none"; "candidates":
# everything wanted was moved); another value a policy reports is added to these
LIMITS = ("budget", "node", "rate", "throughput", "candidates", "none")
# the kernel counters exported: vmstat fields with these prefixes (promotion, demotion,
# migration, NUMA hinting and allocation locality)
KERNEL_PREFIXES = ("pgpromote_", "pgdemote_", "pgmigrate_", "numa_")


def _kv_file(path: Path) -> dict[str, int]:
    """A "name value" file (vmstat, memory.stat) as a dict of ints; {} when unreadable."""
    out = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def kernel_fields(d: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in d.items() if k.startswith(KERNEL_PREFIXES)}


def cgroup_dir(path: str, root: Path = CGROUP_ROOT) -> Path:
    """A cgroup's directory: ``path`` as it is when it exists (absolute), else under ``root``."""
    p = Path(path)
    if p.is_absolute() and p.is_dir():
        return p
    return root / str(path).lstrip("/")


class Collector:
    """Yields the metric families of the last snapshot (a status document plus the profiler's
    per-target stats and the daemon's CPU time), and the kernel's counters read now."""

    def __init__(self, node_root: Path = NODE_ROOT, vmstat: Path = Path("/proc/vmstat"),
                 cgroup_root: Path = CGROUP_ROOT):
        self.node_root, self.vmstat, self.cgroup_root = Path(node_root), Path(vmstat), cgroup_root
        self.snapshot: dict | None = None  # replaced whole, never changed in place

    def set(self, doc: dict, profiler_stats: dict | None = None,
            cpu_s: float | None = None) -> None:
        last, prev = doc.get("last") or {}, (self.snapshot or {}).get("last") or {}
        # the last interval's length: from the previous interval's end to this one's
        took = None
        if last and prev and last.get("interval", 0) > prev.get("interval", 0):
            took = (last["t"] - prev["t"]) / (last["interval"] - prev["interval"])
        elif self.snapshot is not None:
            took = self.snapshot.get("took")
        self.snapshot = {"doc": doc, "last": last, "took": took, "profiler": profiler_stats or {},
                         "cpu_s": time.process_time() if cpu_s is None else cpu_s}

    def describe(self):
        return []  # families vary with the snapshot: no checks at registration

    def collect(self):
        snap = self.snapshot
        if snap is not None:
            yield from self._daemon(snap)
        yield from self._kernel(snap["doc"] if snap else {})

    # ------------------------------------------------------------------ the daemon's numbers
    def _daemon(self, snap: dict):
        doc, last = snap["doc"], snap["doc"].get("last") or {}
        tot, cfg = doc.get("totals", {}), doc.get("config", {})
        fast, slow = str(cfg.get("fast_node", 0)), str(cfg.get("slow_node", 1))
        info = InfoMetricFamily("pagetier_daemon", "The daemon's configuration")
        info.add_metric([], {"policy": str(cfg.get("policy")), "profiler": str(cfg.get("profiler")),
                             "fast_node": fast, "slow_node": slow,
                             "dry_run": str(bool(cfg.get("dry_run"))).lower(),
                             "pid": str(doc.get("pid", ""))})
        yield info

        def gauge(name, doc_, value):
            g = GaugeMetricFamily(name, doc_)
            g.add_metric([], value)
            return g

        def counter(name, doc_, value):
            c = CounterMetricFamily(name, doc_)
            c.add_metric([], value)
            return c

        yield gauge("pagetier_start_time_seconds", "When the daemon started (Unix time)",
                    doc.get("started", 0))
        yield gauge("pagetier_last_update_timestamp_seconds",
                    "When the last interval's numbers were taken (Unix time)",
                    doc.get("updated", 0))
        yield gauge("pagetier_interval_seconds", "The configured interval",
                    cfg.get("interval", 0) or 0)
        yield counter("pagetier_cpu_seconds", "CPU time the daemon has used (user + system)",
                      snap["cpu_s"])
        yield gauge("pagetier_targets", "Processes managed", len(doc.get("targets", [])))
        if last:
            yield gauge("pagetier_interval", "Number of the last interval", last.get("interval", 0))
            if snap.get("took") is not None:
                yield gauge("pagetier_interval_duration_seconds",
                            "How long the last interval took (read to read)", snap["took"])
            yield gauge("pagetier_step_duration_seconds",
                        "Wall time of the last interval's step (read, decide, move)",
                        last.get("wall_s", 0))
            yield gauge("pagetier_step_cpu_seconds", "CPU time of the last interval's step",
                        last.get("cpu_s", 0))
            yield gauge("pagetier_units", "Units (pages, huge pages, regions) tracked",
                        last.get("units", 0))
            res = GaugeMetricFamily("pagetier_resident_bytes",
                                    "The targets' tracked memory per node (node unknown: -1)",
                                    labels=["node"])
            for n, b in sorted(last.get("resident", {}).items()):
                res.add_metric(["-1" if n == "unknown" else str(n)], b)
            yield res
            yield gauge("pagetier_fast_used_bytes",
                        "The targets' fast-node memory that counts against the budget",
                        last.get("fast_used", 0))
            yield gauge("pagetier_fast_unmovable_bytes",
                        "The targets' fast-node memory the kernel refused to move",
                        last.get("fast_unmovable", 0))
            yield gauge("pagetier_fast_budget_bytes", "The fast budget of the last interval",
                        last.get("budget", 0))
            if last.get("fast_capacity") is not None:
                yield gauge("pagetier_fast_capacity_bytes",
                            "Fast memory the node can hold for the targets", last["fast_capacity"])
            lim = GaugeMetricFamily(
                "pagetier_limit", "The limit that kept wanted pages off the fast node in the "
                "last interval (1: that one)", labels=["limit"])
            bound = last.get("limit") or "none"
            for name in LIMITS + (() if bound in LIMITS else (str(bound),)):
                lim.add_metric([name], 1 if bound == name else 0)
            yield lim
            pol = last.get("policy") or {}
            if pol.get("hot_set_pages") is not None:
                yield gauge("pagetier_hot_set_bytes",
                            "The hot set the policy wants on the fast node",
                            pol["hot_set_pages"] * PAGE)
            if pol.get("hot_pages") is not None:
                yield gauge("pagetier_hot_bytes", "Memory the policy ranks as hot",
                            pol["hot_pages"] * PAGE)
            if pol.get("hot_set_pages") and pol.get("hot_set_fast_pages") is not None:
                yield gauge("pagetier_hot_set_fast_ratio",
                            "Share of the hot set on the fast node, as the policy sees it",
                            pol["hot_set_fast_pages"] / pol["hot_set_pages"])
        for key, name, what, scale in (
                ("promoted", "pagetier_promoted_bytes", "Bytes promoted to the fast node", PAGE),
                ("demoted", "pagetier_demoted_bytes", "Bytes demoted to the slow node", PAGE),
                ("bytes_moved", "pagetier_moved_bytes", "Bytes moved", 1),
                ("ping_pongs", "pagetier_ping_pongs", "Units moved back within ping_pong_window "
                 "intervals of their last move", 1),
                ("busy", "pagetier_busy_pages", "Pages the kernel could not move this time "
                 "(EBUSY, EAGAIN, not reached)", 1),
                ("failed", "pagetier_failed_pages", "Pages that failed to move for good", 1),
                ("forced_demotions", "pagetier_forced_demotions", "Units demoted to keep "
                 "within the budget", 1),
                ("deferred", "pagetier_deferred_pages", "Pages planned but not tried in an "
                 "interval's time", 1),
                ("clipped", "pagetier_clipped_pages", "Moves cut by the rate limit", 1)):
            yield counter(name, what, tot.get(key, 0) * scale)
        errs = CounterMetricFamily("pagetier_move_errors_pages",
                                   "Pages that failed to move, by errno", labels=["errno"])
        for name, n in sorted((doc.get("move_errors") or {}).items()):
            errs.add_metric([name], n)
        yield errs
        yield from self._targets(doc, fast, slow, snap["profiler"])

    def _targets(self, doc: dict, fast: str, slow: str, prof: dict):
        tb = GaugeMetricFamily("pagetier_target_resident_bytes",
                               "A target's tracked memory on the fast and the slow node",
                               labels=["pid", "cgroup", "tier", "node"])
        moves = {key: CounterMetricFamily(name, what, labels=["pid", "cgroup"])
                 for key, name, what in (
                     ("promoted_bytes", "pagetier_target_promoted_bytes",
                      "Bytes of a target moved to the fast node"),
                     ("demoted_bytes", "pagetier_target_demoted_bytes",
                      "Bytes of a target moved to the slow node"),
                     ("ping_pongs", "pagetier_target_ping_pongs",
                      "A target's units moved back within the ping-pong window"))}
        for t in doc.get("targets", []):
            labels = [str(t["pid"]), t.get("cgroup") or ""]
            if "fast_bytes" in t:
                tb.add_metric(labels + ["fast", fast], t["fast_bytes"])
                tb.add_metric(labels + ["slow", slow], t["slow_bytes"])
            for key, fam in moves.items():
                if key in t:
                    fam.add_metric(labels, t[key])
        yield tb
        yield from moves.values()
        cgroups = doc.get("cgroups") or []
        if cgroups:
            cb = GaugeMetricFamily("pagetier_cgroup_resident_bytes",
                                   "A cgroup's tracked memory on the fast and the slow node",
                                   labels=["cgroup", "tier", "node"])
            budget = GaugeMetricFamily("pagetier_cgroup_fast_budget_bytes",
                                       "A cgroup's own fast budget", labels=["cgroup"])
            ct = GaugeMetricFamily("pagetier_cgroup_targets", "Processes managed in a cgroup",
                                   labels=["cgroup"])
            unmov = GaugeMetricFamily("pagetier_cgroup_fast_unmovable_bytes",
                                      "A cgroup's fast memory the kernel refused to move (outside "
                                      "its budget)", labels=["cgroup"])
            for c in cgroups:
                cb.add_metric([c["path"], "fast", fast], c.get("fast_bytes", 0))
                cb.add_metric([c["path"], "slow", slow], c.get("slow_bytes", 0))
                if c.get("fast_budget") is not None:
                    budget.add_metric([c["path"]], c["fast_budget"])
                ct.add_metric([c["path"]], len(c.get("pids", [])))
                if c.get("fast_unmovable_bytes") is not None:
                    unmov.add_metric([c["path"]], c["fast_unmovable_bytes"])
            yield from (cb, budget, ct, unmov)
        scan = CounterMetricFamily("pagetier_profiler_scan_seconds",
                                   "The kernel module's scan time for a target", labels=["pid"])
        probe = CounterMetricFamily("pagetier_profiler_probe_seconds",
                                    "The kernel module's frequency-probe time for a target",
                                    labels=["pid"])
        scans = CounterMetricFamily("pagetier_profiler_scans", "The kernel module's scans of a "
                                    "target", labels=["pid"])
        for pid, st in sorted(prof.items()):
            if "scan_ns" in st:
                scan.add_metric([str(pid)], st["scan_ns"] / 1e9)
            if "probe_ns" in st:
                probe.add_metric([str(pid)], st["probe_ns"] / 1e9)
            if "scans" in st:
                scans.add_metric([str(pid)], st["scans"])
        yield from (scan, probe, scans)

    # ------------------------------------------------------------------ the kernel's counters
    def _kernel(self, doc: dict):
        fams: dict[str, CounterMetricFamily] = {}

        def add(prefix, what, label, fields, value):
            for k, v in sorted(fields.items()):
                name = f"{prefix}_{k}"
                fam = fams.get(name)
                if fam is None:
                    fam = fams[name] = CounterMetricFamily(
                        name, f"{k} from {what}", labels=[label] if label else [])
                fam.add_metric([value] if label else [], v)

        for p in sorted(self.node_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            add("pagetier_node_vmstat", "/sys/devices/system/node/nodeN/vmstat", "node",
                kernel_fields(_kv_file(p / "vmstat")), p.name[4:])
        add("pagetier_vmstat", "/proc/vmstat", None, kernel_fields(_kv_file(self.vmstat)), None)
        paths = [c["path"] for c in doc.get("cgroups") or []]
        if doc.get("cgroup") and doc["cgroup"] not in paths:
            paths.append(doc["cgroup"])
        for path in paths:
            add("pagetier_cgroup_memory_stat", "the cgroup's memory.stat", "cgroup",
                kernel_fields(_kv_file(cgroup_dir(path, self.cgroup_root) / "memory.stat")), path)
        yield from fams.values()


class Metrics:
    """The HTTP endpoint: prometheus_client's server on a thread, serving :class:`Collector`."""

    def __init__(self, spec: str, collector: Collector | None = None):
        self.addr, self.port = parse_listen(spec, "metrics")
        self.collector = collector or Collector()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.server = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2] if self.server else (self.addr, self.port)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        """Listen, or a ConfigError (the port in use, an address not on this machine)."""
        from prometheus_client import start_http_server

        try:
            self.server, self._thread = start_http_server(self.port, self.addr,
                                                          registry=self.registry)
        except OSError as e:
            why = ("the port is in use" if e.errno == errno.EADDRINUSE
                   else e.strerror or str(e))
            raise ConfigError(f"metrics {self.addr}:{self.port}: cannot listen: {why}")
        log.info("metrics on http://%s/metrics", self.address)

    def update(self, doc: dict, profiler=None) -> None:
        """The numbers of the interval ``doc`` (the status document) describes; with
        ``profiler``, its stats of each target (kmod: scan and probe time)."""
        stats = {}
        if profiler is not None:
            for t in doc.get("targets", []):
                try:
                    stats[t["pid"]] = profiler.stats(t["pid"])
                except Exception:  # a target that just exited: no stats
                    continue
        # a copy: the document shares dicts the next step changes in place (the totals), while
        # a scrape may be reading them on the server's thread
        self.collector.set(copy.deepcopy(doc), stats)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
