"""pagetier.ko hazards a careful reading found, each aimed at by one test: a target that calls
execve while others read and unmark it, a reader stalled in its own user memory, a sparse
multi-TiB address space, and a secondary MMU (an mmu notifier) on the target. Short versions run by default; the long ones are marked ``long``
(scripts/hardening.sh). The harness fails the run on any kernel report (Oops, BUG, WARNING,
soft lockup, lockdep)."""
from __future__ import annotations

import ctypes
import errno
import mmap
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pagetier import uapi
from pagetier.profiler import kmod
from pagetier.workload import binary

from helpers import build_hazards, fresh_module, wait_scans

pytestmark = pytest.mark.vm

DEADLINE_S = 10.0  # an ioctl that must not wait on another target: generous, under emulation


@pytest.fixture(scope="module", autouse=True)
def module_loaded():
    fresh_module()
    yield
    kmod.unload_module()


@pytest.fixture(scope="module")
def helper(tmp_path_factory) -> str:
    """kmod_hazards.c, compiled for this guest."""
    return build_hazards(tmp_path_factory.mktemp("hazards"))


def _span(helper: str, size: int, stride: int, n: int) -> tuple[subprocess.Popen, int]:
    """A target touching n pages stride apart in a MAP_NORESERVE mapping of size bytes."""
    p = subprocess.Popen([helper, "span", str(size), str(stride), str(n)], stdout=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline().split()
    assert line and line[0] == "ready", line
    return p, int(line[1])


def _stop(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def _timed(fn, *args) -> float:
    """Run fn(*args) in a thread; its duration, or fail if it is still blocked at DEADLINE_S."""
    err: list[BaseException] = []

    def run():
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            err.append(e)

    t0 = time.monotonic()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(DEADLINE_S)
    assert not th.is_alive(), f"{fn.__name__}{args} still blocked after {DEADLINE_S} s"
    if err:
        raise err[0]
    return time.monotonic() - t0


# --- a target that calls execve in a loop --------------------------------------------------

def test_exec_race(helper):
    """A target execs itself in a loop (one pid, a new mm each time) while one thread attaches
    and detaches it in fault mode with a 10 ms period and two others READ with reset, UNMARK what
    they read and ask STATS: every call answers, and the target's memory stays intact."""
    exec_race(helper, 6.0)


def exec_race(helper_exe: str, seconds: float, alone: bool = True) -> None:
    until = time.monotonic_ns() + int(seconds * 1e9)
    target = subprocess.Popen([helper_exe, "exec", str(until)], stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    calls = {"attach": 0, "read": 0, "unmark": 0, "stats": 0, "records": 0}
    errors: list[BaseException] = []

    def expected(e: kmod.KmodError) -> bool:
        return e.errno in (errno.ESRCH, errno.EBUSY)  # detached or gone at that moment

    def attach_once(dev):
        dev.attach(target.pid, "fault", scan_period_ms=10)
        calls["attach"] += 1
        time.sleep(0.05)
        dev.detach(target.pid)

    def read_once(dev):
        rec = dev.read(target.pid, reset=True, chunk=512)
        calls["read"] += 1
        calls["records"] += len(rec)
        dev.unmark(target.pid, rec["addr"][:4096])
        calls["unmark"] += 1
        dev.stats(target.pid)
        calls["stats"] += 1

    def loop(once):
        """Call ``once`` with a device of its own until told to stop or the target ends."""
        dev = kmod.Device()
        try:
            while not stop.is_set() and target.poll() is None:
                try:
                    once(dev)
                except kmod.KmodError as e:
                    if not expected(e):
                        raise
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            dev.close()

    threads = [threading.Thread(target=loop, args=(once,))
               for once in (attach_once, read_once, read_once)]
    for th in threads:
        th.start()
    try:
        out, _ = target.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    print(f"exec race: {seconds:.0f} s, target says {out.strip()!r}; calls {calls}")
    assert not errors, errors
    assert target.returncode == 0, out
    assert int(out.split()[0]) > 1, "the target never called execve"
    assert calls["attach"] > 0 and calls["read"] > 0
    if alone:
        assert (kmod.SYSFS / "targets").read_text() == ""


@pytest.mark.long
def test_hazards_together(helper):
    """The exec race, a churning target attached and detached in both modes with reads, and
    random ioctls (the fuzzer's pids: the two targets, its own and bad ones), all at once for
    PAGETIER_HAZARDS_S seconds (default 1800; scripts/hardening.sh runs it)."""
    seconds = float(os.environ.get("PAGETIER_HAZARDS_S", "1800"))
    churn = subprocess.Popen([str(binary("churn")), str(seconds)], stdout=subprocess.PIPE, text=True)
    own, _ = _span(helper, 16 << 20, 4096, 1024)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts = {"churn cycles": 0, "fuzz calls": 0}
    pids: list[int] = [churn.pid, own.pid, 0, 999_999, 2**31 - 1]

    def churner():
        dev = kmod.Device()
        try:
            while not stop.is_set() and churn.poll() is None:
                try:
                    dev.attach(churn.pid, ("fault", "abit")[counts["churn cycles"] % 2],
                               scan_period_ms=10)
                    time.sleep(0.02)
                    dev.read(churn.pid, reset=True)
                    dev.detach(churn.pid)
                    counts["churn cycles"] += 1
                except kmod.KmodError as e:
                    if e.errno not in (errno.ESRCH, errno.EBUSY):
                        raise
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            dev.close()

    def fuzzer():
        rng = random.Random(1717)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
        dev = kmod.Device()
        arena = mmap.mmap(-1, 2 << 20)
        buf = (ctypes.c_char * (1 << 20)).from_buffer(arena)
        rec = ctypes.addressof(buf) + (512 << 10)
        valid = [uapi.IOC_VERSION, uapi.IOC_ATTACH, uapi.IOC_DETACH, uapi.IOC_READ,
                 uapi.IOC_STATS, uapi.IOC_UNMARK]
        allowed = {0, errno.ENOTTY, errno.EINVAL, errno.EFAULT, errno.ESRCH, errno.EBUSY,
                   errno.EACCES, errno.ENOSPC, errno.ENOMEM}
        try:
            while not stop.is_set():
                cmd = rng.choice(valid) if rng.random() < 0.9 else rng.getrandbits(32)
                words = np.frombuffer(buf, np.uint64, 16)
                words[:] = [rng.choice([0, 1, 64, rng.getrandbits(32)]) for _ in range(16)]
                words[0] = rng.choice(pids) | (rng.choice([0, 1, 2]) << 32)
                if cmd in (uapi.IOC_READ, uapi.IOC_UNMARK):
                    words[1] = rng.choice([rec, 0, 8, 0xFFFF_8880_0000_0000])
                    words[2] = rng.choice([0, 1, 64, 1000])  # records or addresses: fit
                ret = libc.ioctl(dev.fd, cmd, ctypes.c_void_p(ctypes.addressof(buf)))
                e = ctypes.get_errno() if ret < 0 else 0
                assert ret in (0, -1) and e in allowed, (hex(cmd), ret, e)
                counts["fuzz calls"] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            dev.close()

    others = [threading.Thread(target=f) for f in (churner, fuzzer)]
    for th in others:
        th.start()
    try:
        exec_race(helper, seconds, alone=False)
    finally:
        stop.set()
        for th in others:
            th.join(120)
        out, _ = churn.communicate(timeout=120)
        _stop(own)
    print(f"together: {seconds:.0f} s, {counts}; churn says {out.strip()}")
    assert not errors, errors
    assert churn.returncode == 0, out
    dev = kmod.Device()
    for line in filter(None, (kmod.SYSFS / "targets").read_text().split("\n")):
        try:  # the fuzzer may have attached a target the others did not detach since
            dev.detach(int(line.split()[0]))
        except kmod.KmodError as e:
            assert e.errno == errno.ESRCH
    dev.close()


# --- a reader stalled in its own user memory ------------------------------------------------

def _wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def test_stalled_reader_blocks_no_one(helper):
    """A READ whose buffer is a userfaultfd range nobody serves blocks in its copy to user
    space. Meanwhile other descriptors' STATS, READ, UNMARK, DETACH and ATTACH, on that target
    and another, return, and the stalled target keeps being scanned. Killing the stalled reader
    ends its READ; nothing is left behind (the module unloads)."""
    a, _ = _span(helper, 16 << 20, 4096, 4096)
    b, b_addr = _span(helper, 16 << 20, 4096, 4096)
    dev, other = kmod.Device(), kmod.Device()
    stall = None
    try:
        dev.attach(a.pid, "fault", scan_period_ms=50)
        dev.attach(b.pid, "abit", scan_period_ms=50)
        wait_scans(dev, a.pid, 1)
        wait_scans(dev, b.pid, 1)
        stall = subprocess.Popen([helper, "stall", str(a.pid)], stdout=subprocess.PIPE, text=True)
        assert stall.stdout.readline().strip() == "stalling"
        deadline = time.monotonic() + 60
        while "userfault" not in _wchan(stall.pid) and time.monotonic() < deadline:
            assert stall.poll() is None, stall.stdout.read()
            time.sleep(0.05)
        print(f"stalled reader waits in {_wchan(stall.pid)!r}")
        assert "userfault" in _wchan(stall.pid)

        took = {
            "stats other": _timed(other.stats, b.pid),
            "stats stalled": _timed(other.stats, a.pid),
            "read other": _timed(other.read, b.pid, True),
            "read stalled": _timed(other.read, a.pid),
            "unmark stalled": _timed(other.unmark, a.pid, np.arange(8, dtype=np.uint64) * 4096),
            "sysfs targets": _timed((kmod.SYSFS / "targets").read_text),
            "detach other": _timed(dev.detach, b.pid),
            "attach other": _timed(other.attach, b.pid, "fault", 50),
        }
        wait_scans(other, b.pid, 1, timeout=DEADLINE_S * 3)
        took["detach other again"] = _timed(other.detach, b.pid)
        st = wait_scans(dev, a.pid, 2, timeout=DEADLINE_S * 3)  # its scans go on
        took["detach stalled"] = _timed(dev.detach, a.pid)
        print("while a reader stalls: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in took.items()))
        print(f"stalled target's stats: {st}")
        assert stall.poll() is None, "the stalled READ returned"
        assert (kmod.SYSFS / "targets").read_text() == ""
        stall.kill()
        assert stall.wait(timeout=DEADLINE_S) != 0
        stall = None
    finally:
        if stall is not None:
            stall.kill()
            stall.wait()
        dev.close()
        other.close()
        _stop(a)
        _stop(b)
    fresh_module()  # nothing holds the module or a target: it unloads


# --- a sparse target ---------------------------------------------------------------------

SPARSE_SIZE, SPARSE_STRIDE, TOUCHED = 16 << 40, 4 << 30, 4096
SMALL_SIZE, SMALL_STRIDE = 16 << 30, 4 << 20  # the same pages, one per other PMD


def _count_touched(dev: kmod.Device, pid: int, base: int, stride: int, timeout: float) -> int:
    """How many of the TOUCHED pages at base + i * stride the module counted as accessed, read
    until all are or the deadline passes."""
    want = base + np.arange(TOUCHED, dtype=np.uint64) * np.uint64(stride)
    seen = np.zeros(0, np.uint64)
    deadline = time.monotonic() + timeout
    while True:
        rec = dev.read(pid, reset=True, accessed_only=True)
        seen = np.union1d(seen, rec["addr"][rec["count"] > 0])
        found = int(np.isin(want, seen).sum())
        if found == TOUCHED or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _pass_end(dev: kmod.Device, pid: int, n: int, timeout: float = 120) -> dict:
    """The stats just after the n-th pass from now ends. A pass the scan budget splits adds its
    parts' walk_entries as they run but counts in scans only at its end, so stats read at any
    other moment hold part of a pass: over 5 passes, up to a fifth of the entries."""
    deadline = time.monotonic() + timeout
    start = dev.stats(pid)["scans"]
    while time.monotonic() < deadline:
        st = dev.stats(pid)
        if st["scans"] >= start + n:
            return st
        time.sleep(0.005)
    raise TimeoutError(f"fewer than {n} scans in {timeout} s")


def _scan_cost(helper: str, mode: str, size: int, stride: int) -> dict:
    p, base = _span(helper, size, stride, TOUCHED)
    dev = kmod.Device()
    try:
        dev.attach(p.pid, mode, scan_period_ms=100)
        wait_scans(dev, p.pid, 2, timeout=120)
        found = _count_touched(dev, p.pid, base, stride, timeout=120)
        st0 = _pass_end(dev, p.pid, 1)
        st1 = _pass_end(dev, p.pid, 5)
        dev.detach(p.pid)
    finally:
        dev.close()
        _stop(p)
    scans = st1["scans"] - st0["scans"]
    return {"found": found, "tracked": st1["pages_tracked"],
            "scan_ms": (st1["scan_ns"] - st0["scan_ns"]) / scans / 1e6,
            "entries": (st1["walk_entries"] - st0["walk_entries"]) // scans,
            "resumes": st1["scan_resumes"]}


def _soft_lockups() -> int:
    out = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    return out.count("soft lockup")


@pytest.mark.parametrize("mode", ["fault", "abit"])
def test_sparse_target_costs_its_pages(helper, mode):
    """A 16 TiB MAP_NORESERVE mapping with 4096 pages touched 4 GiB apart: the module counts
    every touched page, no soft lockup is reported, and a scan costs what its page tables hold,
    not what its reservation spans: it examines about as many entries as the same 4096 pages
    touched 4 MiB apart in a 16 GiB reservation (one PTE table per page in both). Printed beside
    a dense 16 MiB target with the same 4096 pages touched (8 PTE tables)."""
    lockups = _soft_lockups()
    dense = _scan_cost(helper, mode, 16 << 20, 4096)
    small = _scan_cost(helper, mode, SMALL_SIZE, SMALL_STRIDE)
    sparse = _scan_cost(helper, mode, SPARSE_SIZE, SPARSE_STRIDE)
    print(f"{mode}: per scan, 16 TiB sparse {sparse['scan_ms']:.2f} ms, {sparse['entries']} entries "
          f"({sparse['tracked']} tracked); 16 GiB sparse {small['scan_ms']:.2f} ms, "
          f"{small['entries']} entries ({small['tracked']} tracked); dense 16 MiB "
          f"{dense['scan_ms']:.2f} ms, {dense['entries']} entries ({dense['tracked']} tracked); "
          f"time 16 TiB / 16 GiB {sparse['scan_ms'] / max(small['scan_ms'], 1e-6):.2f}, "
          f"16 TiB / dense {sparse['scan_ms'] / max(dense['scan_ms'], 1e-6):.1f}")
    assert (dense["found"], small["found"], sparse["found"]) == (TOUCHED,) * 3, (dense, small, sparse)
    assert _soft_lockups() == lockups
    # counters, not time: 1024 times the reservation, at most 4 times the entries. The 16 TiB
    # one has a PMD table per touched page as well as a PTE table (the 16 GiB one 16 PMD
    # tables), and abit's window walks those PMD tables once more: 2.99 times when every table
    # is read; the bound leaves room for a pass whose end the stats were read late after.
    assert sparse["entries"] < 4 * small["entries"], (sparse, small)
    assert small["entries"] >= 0.75 * 512 * TOUCHED  # most of the 4096 PTE tables examined



# --- a secondary MMU ------------------------------------------------------------------------

NOTIFIER_PARAMS = Path("/sys/module/pt_notifier_test/parameters")
IDLE_TARGET = """
import ctypes, mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
def touch():
    for i in range(n):
        m[i * 4096] = (m[i * 4096] + 1) % 256
touch()
print(ctypes.addressof(ctypes.c_char.from_buffer(m)), flush=True)
for line in sys.stdin:  # touch all again on each line, else leave the pages alone
    touch()
    print("done", flush=True)
"""


def _notifier(name: str) -> int:
    return int((NOTIFIER_PARAMS / name).read_text())


def _counted(dev: kmod.Device, pid: int, base: int, n: int) -> int:
    """Pages of [base, base + n pages) with a count since the last reset (read with reset)."""
    rec = dev.read(pid, reset=True)
    inside = (rec["addr"] >= base) & (rec["addr"] < base + n * 4096)
    return int((rec["count"][inside] > 0).sum())


def test_secondary_mmu_is_notified():
    """An mmu notifier on the target, as KVM or a device sharing its page table registers
    (kmod/test/pt_notifier_test.ko, a stand-in that answers the young checks as told): abit mode
    counts the pages the notifier reports young though the CPU leaves them alone, and none once
    it reports them old; fault mode brackets its marks with invalidate_range_start/end, one pair
    per page table at least each scan, all ended, and still counts the CPU's accesses."""
    n = 512
    ko = kmod.module_path().parent / "test" / "pt_notifier_test.ko"
    target = subprocess.Popen([sys.executable, "-c", IDLE_TARGET, str(n)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    base = int(target.stdout.readline())
    subprocess.run(["insmod", str(ko), f"pid={target.pid}"], check=True)
    dev = kmod.Device()
    try:
        dev.attach(target.pid, "abit", scan_period_ms=50)
        wait_scans(dev, target.pid, 3, timeout=120)  # the first scan arms; then 2 count
        young = _counted(dev, target.pid, base, n)
        cleared = _notifier("clear_young")
        (NOTIFIER_PARAMS / "young").write_text("0")
        wait_scans(dev, target.pid, 2, timeout=120)  # a scan that may have seen young=1 ends
        _counted(dev, target.pid, base, n)
        wait_scans(dev, target.pid, 3, timeout=120)
        old = _counted(dev, target.pid, base, n)
        dev.detach(target.pid)

        starts, ends = _notifier("starts"), _notifier("ends")
        dev.attach(target.pid, "fault", scan_period_ms=50)
        st = wait_scans(dev, target.pid, 3, timeout=120)
        _counted(dev, target.pid, base, n)
        target.stdin.write("touch\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "done"
        touched = _counted(dev, target.pid, base, n)
        dev.detach(target.pid)
        starts, ends = _notifier("starts") - starts, _notifier("ends") - ends
    finally:
        dev.close()
        subprocess.run(["rmmod", "pt_notifier_test"], check=False)
        target.kill()
        target.wait()
    print(f"secondary MMU: abit counted {young}/{n} pages it reported young ({cleared} "
          f"clear_young calls), {old} once it reported them old; fault mode: {starts} "
          f"invalidations started, {ends} ended over {st['scans']}+ scans, "
          f"{st['pages_marked']} marks; {touched}/{n} CPU accesses counted")
    assert young == n and cleared >= n
    assert old == 0
    assert starts >= 3 and starts == ends
    assert touched == n


def bench(kos: list[str]) -> None:
    """Scan cost per pass of a dense 16 MiB target and of the same 4096 pages spread over a
    16 GiB and a 16 TiB reservation, in both modes, for each pagetier.ko given (the first is the
    baseline), printed as a table with ratios. Run in the guest:
    python tests/guest/test_kmod_hazards.py [OLD.ko] NEW.ko"""
    import platform
    import tempfile

    exe = build_hazards(Path(tempfile.mkdtemp()))
    shapes = {"dense 16 MiB": (16 << 20, 4096), "sparse 16 GiB": (SMALL_SIZE, SMALL_STRIDE),
              "sparse 16 TiB": (SPARSE_SIZE, SPARSE_STRIDE)}
    rows = {}
    for ko in kos:
        kmod.unload_module()
        kmod.load_module(Path(ko))
        for mode in ("fault", "abit"):
            for name, (size, stride) in shapes.items():
                rows[ko, mode, name] = _scan_cost(exe, mode, size, stride)
    kmod.unload_module()
    print(f"kernel {platform.release()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          "per scan pass (module time, STATS scan_ns and walk_entries)")
    for ko in kos:
        print(f"\n{ko}")
        for mode in ("fault", "abit"):
            base = rows[ko, mode, "dense 16 MiB"]
            for name in shapes:
                r = rows[ko, mode, name]
                vs = f" vs {kos[0].split('/')[-3]}: {r['scan_ms'] / rows[kos[0], mode, name]['scan_ms']:.2f}" \
                    if ko != kos[0] else ""
                print(f"  {mode:5} {name:14} {r['scan_ms']:8.2f} ms {r['entries']:9} entries "
                      f"{r['tracked']:5} tracked {r['found']:4} found; x dense "
                      f"{r['scan_ms'] / base['scan_ms']:5.1f} time, "
                      f"{r['entries'] / base['entries']:6.1f} entries{vs}")


if __name__ == "__main__":
    bench(sys.argv[1:] or [str(kmod.module_path())])
