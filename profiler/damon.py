"""The damon backend: the kernel's DAMON through sysfs, virtual-address operations.

DAMON samples one page per region every ``sample_us``, counts in how many samples the region was
accessed (``nr_accesses``) over one aggregation interval (``aggr_ms``), and splits and merges regions
to keep between ``min_regions`` and ``max_regions``. A ``stat`` scheme matching every region makes
the kernel list the regions of the last aggregation under ``schemes/0/tried_regions`` on demand
(``state`` <- ``update_schemes_tried_regions``). Each read returns that snapshot, expanded to one
unit per 4 KiB page inside the target's mappings, every page carrying its region's nr_accesses:
the rest of pagetier sees the same Sample shape as from the kmod backend. Nodes are not known
(-1); ``pagetier record`` fills them in with move_pages.

Units: with ``huge=True`` (default), the pages of every 2 MiB block that one transparent huge page
backs whole (``base.thp_blocks``: /proc/PID/pagemap and /proc/kpageflags, root only) are folded
into one 2 MiB unit (npages 512), as pagetier.ko reports a PMD-mapped huge page; its count and
freq are the page-weighted mean of its pages' (normally one region's value: DAMON checks a huge
page's Accessed bit in its PMD, so every address in it samples the same bit).

Frequency (``Sample.freq``, accesses per second, the scale every backend maps to): DAMON checks,
once per sampling interval ``dt = sample_us``, whether one page of the region was accessed since
the previous check, and ``nr_accesses`` counts the checks that found it accessed among the
``n = aggr_us / sample_us`` of an aggregation (6.12's tried_regions show the region's moving sum,
``nr_accesses_bp / 10000``, taken when the scheme is applied at the end of an aggregation: the
same count of checks). With accesses arriving as a Poisson process of
rate ``lambda``, a check finds the page accessed with probability ``p = 1 - exp(-lambda * dt)``,
so ``p = nr_accesses / n`` estimates it and

    lambda = -ln(1 - p) / dt.

``p = 1`` (every check found an access) has no finite estimate; it is taken as ``p = 1 - 1/(2n)``
(half a miss), so the estimate saturates at ``ln(2n) / dt``: about 740/s with the defaults
(dt 5 ms, n 20), and the smallest non-zero estimate is ``-ln(1 - 1/n) / dt``, about 10/s. Rates
outside that range cannot be told apart: DAMON's resolution is about 70x here, and a unit
touched once a second is seen (as 10/s) in roughly one aggregation in ten. The rate is the one
of the page-table entry DAMON checks: a 4 KiB page, or a whole huge page through its PMD.

Ownership: the DAMON sysfs interface can only change the number of kdamonds by rebuilding all of
their directories (mm/damon/sysfs.c ``nr_kdamonds_store``: -EBUSY while any runs, and every
existing directory is removed and created empty). This backend therefore adds its kdamond only when
no other kdamond runs and no other one holds a configuration (which the rebuild would erase), takes
the new last index, and on close stops it and shrinks ``nr_kdamonds`` back only while it is still
the last one and the others are still empty; otherwise it leaves its own directory stopped and
emptied. It never writes into a kdamond it did not create.

All file I/O goes through ``SysfsIO``; ``DryIO`` records the writes (unit tests).
"""
from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import numpy as np

from pagetier.errors import ConfigError, PagetierError, Unavailable
from pagetier.profiler.base import (PAGE_SIZE, Profiler, Sample, huge_units, register,
                                    thp_blocks)

DAMON_ROOT = Path("/sys/kernel/mm/damon/admin")
ULONG_MAX = 2**64 - 1
UINT_MAX = 2**32 - 1


class SysfsIO:
    """Reads and writes of DAMON's sysfs files, retried while the sysfs lock is busy."""

    def __init__(self, root: Path = DAMON_ROOT, retries: int = 50):
        self.root = Path(root)
        self.retries = retries

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text().strip()

    def write(self, rel: str, value) -> None:
        path = self.root / rel
        for i in range(self.retries):
            try:
                with open(path, "w") as f:
                    f.write(f"{value}\n")
                return
            except OSError as e:
                if e.errno == errno.EBUSY and i + 1 < self.retries:
                    time.sleep(0.02)  # damon_sysfs_lock is taken with trylock
                    continue
                raise PagetierError(f"damon: writing {value!r} to {path}: "
                                    f"{os.strerror(e.errno or 0)}") from None

    def listdir(self, rel: str) -> list[str]:
        return os.listdir(self.root / rel)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()


class DryIO(SysfsIO):
    """Serves reads from a dict and logs writes instead of making them."""

    def __init__(self, files: dict[str, str] | None = None):
        super().__init__(Path("/nonexistent"))
        self.files = dict(files or {})
        self.writes: list[tuple[str, str]] = []

    def read(self, rel: str) -> str:
        if rel not in self.files:
            raise FileNotFoundError(rel)
        return str(self.files[rel]).strip()

    def write(self, rel: str, value) -> None:
        self.writes.append((rel, str(value)))
        self.files[rel] = str(value)

    def listdir(self, rel: str) -> list[str]:
        pre = rel.rstrip("/") + "/"
        return sorted({k[len(pre):].split("/")[0] for k in self.files if k.startswith(pre)})

    def exists(self, rel: str) -> bool:
        pre = rel.rstrip("/") + "/"
        return rel in self.files or any(k.startswith(pre) for k in self.files)


def vmas(pid: int, maps_text: str | None = None) -> np.ndarray:
    """(start, end) of the accessible mappings of ``pid``, as an (n, 2) uint64 array."""
    if maps_text is None:
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps_text = f.read()
        except FileNotFoundError:
            raise ProcessLookupError(f"damon: no process {pid}") from None
    out = []
    for line in maps_text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[1].startswith("---"):
            continue  # guard pages and reservations: never accessed
        if len(parts) >= 6 and parts[5] == "[vsyscall]":
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        out.append((lo, hi))
    return np.array(out, np.uint64).reshape(-1, 2)


def poisson_rate(nr_accesses: np.ndarray, sample_us: int, aggr_us: int) -> np.ndarray:
    """Accesses per second from DAMON's nr_accesses (see the module docstring), float32."""
    n = max(1, aggr_us // sample_us)
    dt = sample_us / 1e6
    p = np.clip(np.asarray(nr_accesses, np.float64) / n, 0.0, 1.0 - 1.0 / (2 * n))
    return (-np.log1p(-p) / dt).astype(np.float32)


def expand_regions(regions: np.ndarray, spans: np.ndarray, accessed_only: bool,
                   max_pages: int) -> tuple[np.ndarray, np.ndarray]:
    """Pages (addr, count) of regions (start, end, nr_accesses) that lie inside ``spans``."""
    addrs, counts, total = [], [], 0
    for start, end, nr in regions:
        if accessed_only and nr == 0:
            continue
        for lo, hi in spans:
            a, b = max(int(start), int(lo)), min(int(end), int(hi))
            if a >= b:
                continue
            a -= a % PAGE_SIZE
            n = (b - a + PAGE_SIZE - 1) // PAGE_SIZE
            if total + n > max_pages:
                raise PagetierError(f"damon: more than {max_pages} pages to expand; raise "
                                    "max_pages or read accessed-only")
            addrs.append(np.arange(a, a + n * PAGE_SIZE, PAGE_SIZE, dtype=np.uint64))
            counts.append(np.full(n, nr, np.uint32))
            total += n
    if not addrs:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint32)
    addr, count = np.concatenate(addrs), np.concatenate(counts)
    addr, idx = np.unique(addr, return_index=True)  # regions never overlap; be safe anyway
    return addr, count[idx]


@register("damon")
class DamonProfiler(Profiler):
    """DAMON (vaddr): per-region nr_accesses of the last aggregation, expanded to pages."""

    def __init__(self, sample_us: int = 5000, aggr_ms: int = 100, update_ms: int = 1000,
                 min_regions: int = 10, max_regions: int = 1000, max_pages: int = 1 << 24,
                 cpus: str | int = "", huge: bool | int | str = True, io: SysfsIO | None = None):
        self.io = io or SysfsIO()
        self.sample_us, self.aggr_us = int(sample_us), int(aggr_ms) * 1000
        self.update_us = int(update_ms) * 1000
        self.min_regions, self.max_regions = int(min_regions), int(max_regions)
        self.max_pages = int(max_pages)
        self.huge = str(huge).lower() not in ("0", "false", "no", "")
        if not (0 < self.sample_us <= self.aggr_us):
            raise ConfigError("damon: need 0 < sample_us <= aggr_ms * 1000")
        if not (3 <= self.min_regions <= self.max_regions):
            raise ConfigError("damon: need 3 <= min_regions <= max_regions")
        try:  # CPUs the kdamond thread may run on, e.g. "0" or "0,2" (default: any)
            self.cpus = {int(c) for c in str(cpus).replace(",", " ").split()}
        except ValueError:
            raise ConfigError(f"damon: cpus={cpus!r}: give CPU numbers, e.g. 0 or 0,2") from None
        self.pids: list[int] = []
        self.index: int | None = None  # our kdamond's index
        self.running = False

    @classmethod
    def probe(cls) -> None:
        if not DAMON_ROOT.exists():
            raise Unavailable("damon: this kernel has no DAMON sysfs interface "
                              "(/sys/kernel/mm/damon/admin: CONFIG_DAMON_SYSFS, Linux 5.18+)")
        if not os.access(DAMON_ROOT / "kdamonds" / "nr_kdamonds", os.W_OK):
            raise Unavailable("damon: /sys/kernel/mm/damon needs root")

    # --- our kdamond -------------------------------------------------------------------------
    def _kd(self, rel: str = "") -> str:
        return f"kdamonds/{self.index}" + (f"/{rel}" if rel else "")

    def _others(self) -> list[int]:
        n = int(self.io.read("kdamonds/nr_kdamonds"))
        return [i for i in range(n) if i != self.index]

    def _in_use(self, i: int) -> str | None:
        """Why kdamond ``i`` (not ours) must not be rebuilt, or None when it is empty."""
        if self.io.read(f"kdamonds/{i}/state") == "on":
            return f"kdamond {i} is running"
        if int(self.io.read(f"kdamonds/{i}/contexts/nr_contexts")) > 0:
            return f"kdamond {i} holds a configuration"
        return None

    def _create(self) -> None:
        n = int(self.io.read("kdamonds/nr_kdamonds"))
        for i in range(n):
            why = self._in_use(i)
            if why:
                raise Unavailable(
                    f"damon: {why} and is not ours; adding a kdamond through sysfs rebuilds every "
                    "kdamond directory, so this backend will not start while another is in use")
        self.io.write("kdamonds/nr_kdamonds", n + 1)
        self.index = n

    def _configure(self) -> None:
        c = self._kd("contexts/0")
        self.io.write(self._kd("contexts/nr_contexts"), 1)
        self.io.write(f"{c}/operations", "vaddr")
        attrs = f"{c}/monitoring_attrs"
        self.io.write(f"{attrs}/intervals/sample_us", self.sample_us)
        self.io.write(f"{attrs}/intervals/aggr_us", self.aggr_us)
        self.io.write(f"{attrs}/intervals/update_us", self.update_us)
        self.io.write(f"{attrs}/nr_regions/min", self.min_regions)
        self.io.write(f"{attrs}/nr_regions/max", self.max_regions)
        self._write_targets()
        s = f"{c}/schemes"
        self.io.write(f"{s}/nr_schemes", 1)
        self.io.write(f"{s}/0/action", "stat")
        for rng, hi in (("sz", ULONG_MAX), ("nr_accesses", UINT_MAX), ("age", UINT_MAX)):
            self.io.write(f"{s}/0/access_pattern/{rng}/min", 0)
            self.io.write(f"{s}/0/access_pattern/{rng}/max", hi)

    def _write_targets(self) -> None:
        t = self._kd("contexts/0/targets")
        self.io.write(f"{t}/nr_targets", len(self.pids))
        for i, pid in enumerate(self.pids):
            self.io.write(f"{t}/{i}/pid_target", pid)

    def attach(self, pid: int) -> None:
        if pid in self.pids:
            raise PagetierError(f"damon: pid {pid} is already attached")
        if not os.path.exists(f"/proc/{pid}") and not isinstance(self.io, DryIO):
            raise ProcessLookupError(f"damon: no process {pid}")
        self.pids.append(pid)
        try:
            if self.index is None:
                self._create()
            if not self.running:
                self._configure()
                self.io.write(self._kd("state"), "on")
                self.running = True
                if self.cpus:
                    os.sched_setaffinity(int(self.io.read(self._kd("pid"))), self.cpus)
            else:
                self._write_targets()
                self.io.write(self._kd("state"), "commit")
        except PagetierError:
            self.pids.remove(pid)
            raise

    def detach(self, pid: int) -> None:
        if pid not in self.pids:
            return
        self.pids.remove(pid)
        if not self.running:
            return
        if not self.pids:
            self.io.write(self._kd("state"), "off")
            self.running = False
            return
        self._write_targets()
        self.io.write(self._kd("state"), "commit")

    # --- reading -----------------------------------------------------------------------------
    def regions(self) -> list[np.ndarray]:
        """Per attached pid, (start, end, nr_accesses) rows of the last aggregation."""
        if not self.running:
            return [np.zeros((0, 3), np.uint64) for _ in self.pids]
        self.io.write(self._kd("state"), "update_schemes_tried_regions")
        base = self._kd("contexts/0/schemes/0/tried_regions")
        names = sorted((d for d in self.io.listdir(base) if d.isdigit()), key=int)
        rows = [(int(self.io.read(f"{base}/{d}/start")), int(self.io.read(f"{base}/{d}/end")),
                 int(self.io.read(f"{base}/{d}/nr_accesses"))) for d in names]
        return self._split_by_target(rows)

    def _split_by_target(self, rows) -> list[np.ndarray]:
        """Regions come target by target, each target's in rising address order."""
        per: list[list] = [[] for _ in self.pids]
        t, last = 0, -1
        for start, end, nr in rows:
            if start < last and t + 1 < len(per):
                t += 1
            per[t].append((start, end, nr))
            last = end
        return [np.array(p, np.uint64).reshape(-1, 3) for p in per]

    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        """nr_accesses of the last aggregation interval per page (``reset`` has no effect: DAMON
        starts a new aggregation every ``aggr_ms`` by itself)."""
        if pid not in self.pids:
            raise ProcessLookupError(f"damon: pid {pid} is not attached")
        regs = self.regions()[self.pids.index(pid)]
        addr, count = expand_regions(regs, vmas(pid), accessed_only, self.max_pages)
        n = len(addr)
        s = Sample(pid=pid, addr=addr, count=count, node=np.full(n, -1, np.int16),
                   npages=np.ones(n, np.uint16), complete=not accessed_only,
                   freq=poisson_rate(count, self.sample_us, self.aggr_us))
        if self.huge and n:
            s = huge_units(s, thp_blocks(pid, addr), how="mean")
        return s

    def kdamond_cpu_ns(self) -> int | None:
        """CPU time our kdamond thread has used (user + system), from /proc; None if unknown."""
        if self.index is None or not self.running:
            return None
        try:
            kpid = int(self.io.read(self._kd("pid")))
            with open(f"/proc/{kpid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            return None
        ticks = int(fields[11]) + int(fields[12])  # utime, stime
        return int(ticks * 1e9 / os.sysconf("SC_CLK_TCK"))

    def stats(self, pid: int) -> dict:
        st = {"kdamond": self.index, "aggr_us": self.aggr_us, "sample_us": self.sample_us,
              "max_rate": float(poisson_rate([UINT_MAX], self.sample_us, self.aggr_us)[0])}
        cpu = self.kdamond_cpu_ns()
        if cpu is not None:
            st["cpu_ns"] = cpu
        return st

    def close(self) -> None:
        if self.index is None:
            return
        try:
            if self.running or self.io.read(self._kd("state")) == "on":
                self.io.write(self._kd("state"), "off")
            self.running = False
            self.pids.clear()
            n = int(self.io.read("kdamonds/nr_kdamonds"))
            if n == self.index + 1 and not any(self._in_use(i) for i in range(self.index)):
                self.io.write("kdamonds/nr_kdamonds", self.index)  # remove ours
            else:  # someone else is using DAMON now: leave our directory stopped and empty
                self.io.write(self._kd("contexts/nr_contexts"), 0)
        finally:
            self.index = None
