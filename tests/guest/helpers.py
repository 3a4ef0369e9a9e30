"""Shared by the guest tests: the module, vmstat, the built-in workload's truth."""
from __future__ import annotations

import time

import numpy as np

from pagetier.profiler import kmod


def vmstat(key: str) -> int:
    with open("/proc/vmstat") as f:
        for line in f:
            k, v = line.split()
            if k == key:
                return int(v)
    raise KeyError(key)


def fresh_module() -> None:
    kmod.unload_module()
    kmod.load_module()


def pages_in(rec_addr: np.ndarray, npages: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """4 KiB page addresses covered by units (addr, npages) that lie in [lo, hi)."""
    parts = [np.arange(int(a), int(a) + int(n) * 4096, 4096, dtype=np.uint64)
             for a, n in zip(rec_addr, npages)]
    pages = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return pages[(pages >= lo) & (pages < hi)]


def precision_recall(sample, ready: dict) -> tuple[float, float, int]:
    """Pages of the workload's buffer counted as accessed, against its true hot range."""
    lo, hi = ready["addr"], ready["addr"] + ready["size"]
    hot_lo, hot_hi = ready["hot_addr"], ready["hot_addr"] + ready["hot_size"]
    acc = sample.count > 0
    pred = pages_in(sample.addr[acc], sample.npages[acc], lo, hi)
    truth = np.arange(hot_lo, hot_hi, 4096, dtype=np.uint64)
    tp = np.intersect1d(pred, truth).size
    precision = tp / pred.size if pred.size else 0.0
    return precision, tp / truth.size, int(pred.size)


def wait_scans(dev: kmod.Device, pid: int, n: int, timeout: float = 60) -> dict:
    t0 = time.monotonic()
    start = dev.stats(pid)["scans"]
    while time.monotonic() - t0 < timeout:
        st = dev.stats(pid)
        if st["scans"] >= start + n:
            return st
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {n} scans in {timeout} s")
