"""The bpf backend: an eBPF program (bcc) that counts user page faults per page.

It attaches to the ``exceptions:page_fault_user`` tracepoint (x86), or to a kprobe on
``handle_mm_fault`` where that tracepoint is missing, keeps only the processes attached (a BPF
hash of tgids), and counts faults in a BPF hash keyed by (tgid, page address). What it measures is
*faults*, not accesses: a page is counted when something made its next access trap. In a steady
process that is nothing, unless:

- the kernel's NUMA balancing marks pages (its hinting faults), or
- ``mark="kmod"``: this backend attaches pagetier.ko in fault mode, which marks a sample of pages
  PROT_NONE every scan, and counts the hinting faults those marks cause (the module's own counts
  are not read; the BPF map is the measurement), or
- first touches, copy-on-write and swap-ins, which it counts too.

Nodes are not known (-1); ``pagetier record`` fills them in with move_pages.

Units: the BPF map is keyed by the faulting 4 KiB address, but a fault on a transparent huge
page is a fault of the whole 2 MiB mapping (one PMD). At each read, with ``huge=True``
(default), addresses inside a 2 MiB block that one THP backs whole (``base.thp_blocks``:
/proc/PID/pagemap and /proc/kpageflags, which this root-only backend can read) are folded into
one 2 MiB unit (npages 512) whose count is the sum of their faults: the same units pagetier.ko
reports. Without that, a THP-backed hot set showed up as scattered 4 KiB rows.

Frequency (``Sample.freq``): faults per second of the unit, its count over the time since the
previous reset read (measured here, not the nominal interval). That is the rate of *faults*: with
``mark=kmod`` a unit faults at most once per marking scan, so it is a lower bound on the access
rate that saturates at the scan rate, and tells a unit touched in every scan from one touched in
some scans only; it says nothing of how often a unit is touched between marks.
"""
from __future__ import annotations

import os
import platform
import time

import numpy as np

from pagetier.errors import ConfigError, PagetierError, Unavailable
from pagetier.profiler.base import (PAGE_SIZE, Profiler, Sample, huge_units, register,
                                    thp_blocks)

BPF_TEXT = r"""
#include <linux/sched.h>

struct key_t {
    u32 tgid;
    u32 pad;
    u64 page;
};

BPF_HASH(targets, u32, u8, 1024);
BPF_HASH(counts, struct key_t, u64, MAX_PAGES);

static __always_inline int count_fault(u64 addr)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!targets.lookup(&tgid))
        return 0;
    struct key_t key = {};
    key.tgid = tgid;
    key.page = addr & ~(u64)(PAGE_SIZE_ - 1);
    u64 zero = 0, *c = counts.lookup_or_try_init(&key, &zero);
    if (c)
        __sync_fetch_and_add(c, 1);
    return 0;
}

#ifdef USE_TRACEPOINT
TRACEPOINT_PROBE(exceptions, page_fault_user)
{
    return count_fault(args->address);
}
#else
int kprobe__handle_mm_fault(struct pt_regs *ctx, void *vma, unsigned long address)
{
    return count_fault(address);
}
#endif
"""


def _import_bcc():
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise Unavailable("bpf: the bcc Python module is missing (Debian: apt-get install "
                          "python3-bpfcc; the venv must include system site-packages)") from None
    return bcc


@register("bpf")
class BpfProfiler(Profiler):
    """Page faults per page and process, counted in a BPF hash map."""

    def __init__(self, mark: str = "", max_pages: int = 1 << 20, scan_period_ms: int = 0,
                 sample_ratio: int = 0, huge: bool | int | str = True):
        if mark not in ("", "none", "kmod"):
            raise ConfigError(f"bpf: unknown mark {mark!r} (use kmod, or none to count the faults "
                              "that happen anyway)")
        bcc = _import_bcc()
        self.tracepoint = bool(bcc.BPF.tracepoint_exists("exceptions", "page_fault_user"))
        # -w: the kernel headers' own warnings under bcc's clang are noise to a user
        cflags = ["-w", f"-DMAX_PAGES={int(max_pages)}", f"-DPAGE_SIZE_={PAGE_SIZE}"]
        if self.tracepoint:
            cflags.append("-DUSE_TRACEPOINT")
        try:
            self.bpf = bcc.BPF(text=BPF_TEXT.encode(), cflags=cflags)
        except Exception as e:  # bcc raises plain Exception on compile/load failures
            raise Unavailable(f"bpf: could not load the eBPF program ({e}); kernel headers for "
                              f"{platform.release()} are needed") from None
        self.targets = self.bpf[b"targets"]
        self.counts = self.bpf[b"counts"]
        self.pids: set[int] = set()
        self.since: dict[int, float] = {}  # pid -> time of the last reset
        self.huge = str(huge).lower() not in ("0", "false", "no", "")
        self.marker = None
        if mark == "kmod":
            from pagetier.profiler.kmod import KmodProfiler

            # the marks are what the eBPF program counts: fault mode for every target (kinds
            # auto would attach one mostly in 4 KiB pages in abit, which makes no marks)
            self.marker = KmodProfiler(mode="fault", scan_period_ms=scan_period_ms,
                                       sample_ratio=sample_ratio, kinds="off")

    @classmethod
    def probe(cls) -> None:
        bcc = _import_bcc()
        if os.geteuid() != 0:
            raise Unavailable("bpf: loading eBPF programs needs root")
        try:
            ok = (bcc.BPF.tracepoint_exists("exceptions", "page_fault_user")
                  or len(bcc.BPF.get_kprobe_functions(b"^handle_mm_fault$")) > 0)
        except OSError as e:  # no tracefs/debugfs mounted, or not allowed to read it
            raise Unavailable(f"bpf: cannot look for the page-fault tracepoint or kprobe ({e}); "
                              "is tracefs mounted (/sys/kernel/tracing)?") from None
        if not ok:
            raise Unavailable("bpf: this kernel has neither the exceptions:page_fault_user "
                              "tracepoint nor a handle_mm_fault to probe")

    def attach(self, pid: int) -> None:
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessLookupError(f"bpf: no process {pid}")
        self.targets[self.targets.Key(pid)] = self.targets.Leaf(1)
        self.pids.add(pid)
        self.since[pid] = time.monotonic()
        if self.marker is not None:
            self.marker.attach(pid)

    def detach(self, pid: int) -> None:
        if pid not in self.pids:
            return
        self.pids.discard(pid)
        self.since.pop(pid, None)
        if self.marker is not None:
            self.marker.detach(pid)
        try:
            del self.targets[self.targets.Key(pid)]
        except KeyError:
            pass
        self._take(pid, delete=True)

    def _take(self, pid: int, delete: bool) -> tuple[np.ndarray, np.ndarray]:
        addrs, counts, keys = [], [], []
        for k, v in self.counts.items():
            if k.tgid == pid:
                addrs.append(k.page)
                counts.append(v.value)
                keys.append(k)
        if delete:
            for k in keys:  # a fault between the walk and here is lost: at most one per page
                try:
                    del self.counts[k]
                except KeyError:
                    pass
        addr = np.array(addrs, np.uint64)
        order = np.argsort(addr)
        return addr[order], np.minimum(np.array(counts, np.uint64), 2**32 - 1).astype(
            np.uint32)[order]

    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        """Faults per unit since the last reset; only faulted units are listed."""
        if pid not in self.pids:
            raise ProcessLookupError(f"bpf: pid {pid} is not attached")
        now = time.monotonic()
        addr, count = self._take(pid, delete=reset)
        elapsed = max(now - self.since.get(pid, now), 1e-3)
        if reset:
            self.since[pid] = now
        n = len(addr)
        s = Sample(pid=pid, addr=addr, count=count, node=np.full(n, -1, np.int16),
                   npages=np.ones(n, np.uint16), complete=False,
                   freq=(count / elapsed).astype(np.float32))
        if self.huge and n:
            s = huge_units(s, thp_blocks(pid, addr), how="sum")
        return s

    def stats(self, pid: int) -> dict:
        st = {"attach": "tracepoint exceptions:page_fault_user" if self.tracepoint
              else "kprobe handle_mm_fault"}
        if self.marker is not None:
            try:
                st["marker"] = self.marker.stats(pid)
            except PagetierError:
                pass
        return st

    def close(self) -> None:
        super().close()
        if self.marker is not None:
            self.marker.close()
            self.marker = None
        if getattr(self, "bpf", None) is not None:
            self.bpf.cleanup()
            self.bpf = None
