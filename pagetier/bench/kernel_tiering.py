"""The kernel's own tiering, set up as baselines for ``pagetier bench live`` (in the test VM only).

- ``KernelTiering``: NUMA balancing in memory-tiering mode (``kernel.numa_balancing = 2``) with
  demotion on (``/sys/kernel/mm/numa/demotion_enabled``). Hinting faults promote hot pages of a
  lower tier; kswapd demotes cold ones when the fast node runs short. It needs the slow node in a
  lower memory tier than the fast one (6.12 with the VM's HMAT description; not 6.1).
- ``DamosTiering``: DAMON's tiering schemes on physical addresses (6.11+): one kdamond watches the
  slow node and promotes hot regions (``migrate_hot``, ``target_nid`` = fast node), another
  watches the fast node and demotes regions idle for ``cold_s`` (``migrate_cold``). Both are
  limited to ``rate_mb_s``, like the daemon's ``--rate``.

Each class has ``probe()`` (None when it can run, else the reason), ``start()``, ``stop()`` (puts
back what it changed) and ``cpu_s()`` (CPU time of the kernel threads doing the work, where they
are separate threads). DAMON sysfs writes go through ``profiler.damon.SysfsIO``; both refuse to run
outside the test VM, the host's DAMON is not ours.
"""
from __future__ import annotations

import os
from pathlib import Path

from pagetier.checkout import in_guest
from pagetier.errors import PagetierError, Unavailable

NUMAB = Path("/proc/sys/kernel/numa_balancing")
DEMOTION = Path("/sys/kernel/mm/numa/demotion_enabled")
TIERS = Path("/sys/devices/virtual/memory_tiering")
NODES = Path("/sys/devices/system/node")
MEMORY = Path("/sys/devices/system/memory")
NUMA_BALANCING_MEMORY_TIERING = 2


def _guest_only(what: str) -> None:
    if not in_guest():
        raise PagetierError(f"{what} changes system-wide kernel settings: pagetier bench live "
                            "does that only inside the test VM")


def memory_tiers(root: Path = TIERS) -> dict[int, str]:
    """{tier id: nodelist} of the kernel's memory tiers (lower id: faster tier); {} without."""
    out = {}
    if not root.is_dir():
        return out
    for d in sorted(root.glob("memory_tier*")):
        try:
            out[int(d.name.removeprefix("memory_tier"))] = (d / "nodelist").read_text().strip()
        except (ValueError, OSError):
            continue
    return out


def _nodes_in(nodelist: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, nodelist.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def tier_of(node: int, tiers: dict[int, str]) -> int | None:
    return next((t for t, nl in tiers.items() if node in _nodes_in(nl)), None)


def read_sysctl(path: Path) -> str:
    return path.read_text().strip()


def write_sysctl(path: Path, value) -> None:
    try:
        path.write_text(f"{value}\n")
    except OSError as e:
        raise PagetierError(f"writing {value} to {path}: {os.strerror(e.errno or 0)}") from None


def thread_cpu_s(pid: int) -> float:
    """utime + stime of one process or kernel thread, in seconds (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kthread_pids(name: str) -> list[int]:
    """PIDs of the kernel threads called ``name`` (e.g. kswapd0)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == name:
                    out.append(int(d.name))
            except OSError:
                continue
    return out


class KernelTiering:
    """numa_balancing mode 2 plus demotion, for as long as it is started."""

    name = "kernel"

    def __init__(self, fast_node: int = 0, slow_node: int = 1):
        self.fast_node, self.slow_node = fast_node, slow_node
        self.saved: dict[Path, str] = {}
        self.kswapd = [f"kswapd{fast_node}"]

    def probe(self) -> str | None:
        if not NUMAB.exists():
            return "no kernel.numa_balancing (kernel built without CONFIG_NUMA_BALANCING)"
        if not DEMOTION.exists():
            return f"no {DEMOTION} (kernel without memory-tier demotion)"
        tiers = memory_tiers()
        fast, slow = tier_of(self.fast_node, tiers), tier_of(self.slow_node, tiers)
        if fast is None or slow is None or slow <= fast:
            have = ", ".join(f"memory_tier{t}: nodes {nl}" for t, nl in tiers.items()) or "none"
            return (f"node {self.slow_node} is not in a lower memory tier than node "
                    f"{self.fast_node} (tiers: {have}), so numa_balancing=2 has nothing to promote "
                    "from and demotion nowhere to go")
        return None

    def start(self) -> None:
        _guest_only("kernel tiering")
        why = self.probe()
        if why:
            raise Unavailable(f"kernel tiering: {why}")
        for path, value in ((NUMAB, NUMA_BALANCING_MEMORY_TIERING), (DEMOTION, "true")):
            self.saved.setdefault(path, read_sysctl(path))
            write_sysctl(path, value)

    def stop(self) -> None:
        while self.saved:
            path, value = self.saved.popitem()
            write_sysctl(path, value)

    def cpu_s(self) -> float:
        """kswapd's CPU time (it demotes); the promotion side runs in the workload's own task
        (NUMA scanning is task work, promotion happens in its hinting faults)."""
        return sum(thread_cpu_s(p) for n in self.kswapd for p in kthread_pids(n))


def node_phys_range(node: int, nodes: Path = NODES, memory: Path = MEMORY) -> tuple[int, int]:
    """[start, end) physical addresses spanned by ``node``'s memory blocks."""
    block = int((memory / "block_size_bytes").read_text().strip(), 16)
    ids = [int(d.name.removeprefix("memory")) for d in (nodes / f"node{node}").glob("memory[0-9]*")]
    if not ids:
        raise Unavailable(f"node {node} has no memory blocks in {nodes / f'node{node}'}")
    return min(ids) * block, (max(ids) + 1) * block


class DamosTiering:
    """Two paddr kdamonds: migrate_hot on the slow node, migrate_cold on the fast node."""

    name = "damos"

    def __init__(self, fast_node: int = 0, slow_node: int = 1, rate_mb_s: float = 512,
                 cold_s: float = 2.0, sample_us: int = 20000, aggr_ms: int = 200,
                 update_ms: int = 1000, max_regions: int = 200, io=None):
        from pagetier.profiler.damon import SysfsIO

        self.io = io or SysfsIO()
        self.fast_node, self.slow_node = fast_node, slow_node
        self.rate_mb_s, self.cold_s = rate_mb_s, cold_s
        self.sample_us, self.aggr_us, self.update_us = sample_us, aggr_ms * 1000, update_ms * 1000
        self.max_regions = max_regions
        self.started = False
        self.pids: list[int] = []

    def probe(self) -> str | None:
        from pagetier.profiler.damon import DAMON_ROOT

        if not DAMON_ROOT.exists():
            return "no DAMON sysfs interface (/sys/kernel/mm/damon/admin: CONFIG_DAMON_SYSFS)"
        try:
            n = int(self.io.read("kdamonds/nr_kdamonds"))
        except OSError as e:
            return f"cannot read DAMON sysfs: {e}"
        if n:
            return f"{n} kdamond(s) already exist here; this baseline only runs on an unused DAMON"
        if not in_guest():
            return "DAMOS tiering is only set up inside the test VM (it would change the host's DAMON)"
        # Whether the kernel knows the migrate actions shows only in a scheme's action file.
        try:
            self._layout(1, 1)
            act = "kdamonds/0/contexts/0/schemes/0"
            if not self.io.exists(f"{act}/target_nid"):
                return "DAMOS schemes have no target_nid (migrate_hot/migrate_cold need Linux 6.11+)"
            if not self.io.exists("kdamonds/0/contexts/0/avail_operations") or "paddr" not in \
                    self.io.read("kdamonds/0/contexts/0/avail_operations").split():
                return "DAMON has no paddr operations (CONFIG_DAMON_PADDR)"
            for action in ("migrate_hot", "migrate_cold"):
                try:
                    self.io.write(f"{act}/action", action)
                except PagetierError:
                    return f"DAMOS has no {action} action (Linux 6.11+)"
        finally:
            self._clear()
        return None

    def _layout(self, kdamonds: int, schemes: int) -> None:
        self.io.write("kdamonds/nr_kdamonds", kdamonds)
        for k in range(kdamonds):
            self.io.write(f"kdamonds/{k}/contexts/nr_contexts", 1)
            self.io.write(f"kdamonds/{k}/contexts/0/schemes/nr_schemes", schemes)

    def _clear(self) -> None:
        try:
            n = int(self.io.read("kdamonds/nr_kdamonds"))
        except OSError:
            return
        for k in range(n):
            if self.io.read(f"kdamonds/{k}/state") == "on":
                self.io.write(f"kdamonds/{k}/state", "off")
        if n:
            self.io.write("kdamonds/nr_kdamonds", 0)

    def _configure(self, k: int, node: int, action: str, target: int) -> None:
        c = f"kdamonds/{k}/contexts/0"
        self.io.write(f"{c}/operations", "paddr")
        a = f"{c}/monitoring_attrs"
        self.io.write(f"{a}/intervals/sample_us", self.sample_us)
        self.io.write(f"{a}/intervals/aggr_us", self.aggr_us)
        self.io.write(f"{a}/intervals/update_us", self.update_us)
        self.io.write(f"{a}/nr_regions/min", 10)
        self.io.write(f"{a}/nr_regions/max", self.max_regions)
        lo, hi = node_phys_range(node)
        t = f"{c}/targets"
        self.io.write(f"{t}/nr_targets", 1)
        self.io.write(f"{t}/0/regions/nr_regions", 1)
        self.io.write(f"{t}/0/regions/0/start", lo)
        self.io.write(f"{t}/0/regions/0/end", hi)
        s = f"{c}/schemes/0"
        self.io.write(f"{s}/action", action)
        self.io.write(f"{s}/target_nid", target)
        max_samples = self.aggr_us // self.sample_us
        if action == "migrate_hot":  # accessed in any sample of the last aggregation
            pattern = {"sz": (4096, 2**64 - 1), "nr_accesses": (1, max_samples), "age": (0, 2**32 - 1)}
        else:  # not accessed for cold_s
            cold_aggrs = max(1, int(self.cold_s * 1e6 / self.aggr_us))
            pattern = {"sz": (4096, 2**64 - 1), "nr_accesses": (0, 0), "age": (cold_aggrs, 2**32 - 1)}
        for key, (mn, mx) in pattern.items():
            self.io.write(f"{s}/access_pattern/{key}/min", mn)
            self.io.write(f"{s}/access_pattern/{key}/max", mx)
        if self.rate_mb_s:  # in 100 ms slices with a time quota: no long migration bursts
            self.io.write(f"{s}/quotas/reset_interval_ms", 100)
            self.io.write(f"{s}/quotas/bytes", int(self.rate_mb_s * 2**20 / 10))
            self.io.write(f"{s}/quotas/ms", 20)

    def start(self) -> None:
        _guest_only("DAMOS tiering")
        why = self.probe()
        if why:
            raise Unavailable(f"damos: {why}")
        try:
            self._layout(2, 1)
            self._configure(0, self.slow_node, "migrate_hot", self.fast_node)
            self._configure(1, self.fast_node, "migrate_cold", self.slow_node)
            for k in (0, 1):
                self.io.write(f"kdamonds/{k}/state", "on")
            self.started = True
            self.pids = [int(self.io.read(f"kdamonds/{k}/pid")) for k in (0, 1)]
        except BaseException:
            self._clear()
            raise

    def stop(self) -> None:
        if self.started:
            self.started = False
            self._clear()

    def cpu_s(self) -> float:
        """CPU time of the two kdamonds (they both monitor and migrate)."""
        return sum(thread_cpu_s(p) for p in self.pids)

    def applied_bytes(self) -> dict[str, int]:
        """Bytes each scheme has migrated so far (its stats, refreshed on demand)."""
        out = {}
        if not self.started:
            return out
        for k, action in ((0, "migrate_hot"), (1, "migrate_cold")):
            self.io.write(f"kdamonds/{k}/state", "update_schemes_stats")
            out[action] = int(self.io.read(f"kdamonds/{k}/contexts/0/schemes/0/stats/sz_applied"))
        return out
