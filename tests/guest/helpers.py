"""Shared by the guest tests: the module, vmstat, the built-in workload's truth."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import numpy as np

from pagetier.profiler import kmod

HERE = Path(__file__).resolve().parent


def build_hazards(directory: Path) -> str:
    """tests/guest/kmod_hazards.c compiled for this guest into ``directory``; its path."""
    exe = Path(directory) / "kmod_hazards"
    subprocess.run(["gcc", "-O2", "-Wall", "-I", str(HERE.parent.parent / "kmod/include/uapi"),
                    "-o", str(exe), str(HERE / "kmod_hazards.c")], check=True)
    return str(exe)


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


def wait_until(cond, timeout: float, what: str, every: float = 0.05):
    """Poll ``cond()`` until it returns something true, and return that; fail with ``what`` after
    ``timeout`` seconds (deadlines are generous: the guest runs under emulation on a shared host)."""
    t0 = time.monotonic()
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"no {what} in {timeout:.0f} s")
        time.sleep(every)


def targets() -> str:
    """The module's attached targets, one "PID MODE ..." line each (sysfs)."""
    return (kmod.SYSFS / "targets").read_text()


def node_free(node: int) -> int:
    """Bytes free on NUMA node ``node``."""
    with open(f"/sys/devices/system/node/node{node}/meminfo") as f:
        for line in f:
            if "MemFree:" in line:
                return int(line.split()[-2]) * 1024
    raise KeyError("MemFree")


def wait_scans(dev: kmod.Device, pid: int, n: int, timeout: float = 60) -> dict:
    t0 = time.monotonic()
    start = dev.stats(pid)["scans"]
    while time.monotonic() - t0 < timeout:
        st = dev.stats(pid)
        if st["scans"] >= start + n:
            return st
        time.sleep(0.05)
    raise TimeoutError(f"fewer than {n} scans in {timeout} s")


def split_json_lines(stdout: str) -> tuple[list[dict], list[dict]]:
    """(daemon stats lines, workload events) from a `pagetier run --json` stdout: events are
    the JSON lines with an "event" key; lines that are not JSON are skipped."""
    stats, events = [], []
    for line in stdout.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        (events if isinstance(d, dict) and "event" in d else stats).append(d)
    return stats, events


def minor_faults(pid: int) -> int:
    """``pid``'s minor page faults so far (/proc/PID/stat); a hinting fault is one."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[7])


def faults_in(pids, seconds: float) -> int:
    """Hinting faults the processes ``pids`` take in ``seconds``: none once the module has
    stopped marking them and restored what it marked. Two counters, each with noise of its own,
    bound that number from above, and the smaller one is returned: vmstat's numa_hint_faults
    also counts pages the kernel's own NUMA balancing marked in other processes (pytest itself)
    while an earlier test had it on, which fault whenever touched; the targets' minor faults also
    count faults of other kinds (seen on 6.1: about 2 a second per huge page of the built-in
    workload after a fault-mode detach, while numa_hint_faults stood still)."""
    pids = list(pids)
    g0, f0 = vmstat("numa_hint_faults"), [minor_faults(p) for p in pids]
    time.sleep(seconds)
    own = sum(minor_faults(p) - f for p, f in zip(pids, f0))
    return min(vmstat("numa_hint_faults") - g0, own)
