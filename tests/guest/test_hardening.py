"""pagetier.ko under churn and fuzzing. Short versions run by default; the long ones are marked
``long`` (scripts/hardening.sh runs them with -m long). The harness fails the boot on any kernel
report (Oops, BUG, WARNING, lockdep, RCU stalls)."""
from __future__ import annotations

import ctypes
import errno
import mmap
import random
import subprocess
import threading
import time

import numpy as np
import pytest

from pagetier import uapi
from pagetier.profiler import kmod
from pagetier.workload import Workload, binary

from helpers import faults_in, targets, wait_scans

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_fresh")]


def _reader(pid: int, stop: threading.Event, counts: list) -> None:
    """Another reader, on its own descriptor, reading whatever is attached at the time."""
    dev = kmod.Device()
    try:
        while not stop.is_set():
            try:
                dev.read(pid, reset=False)
                counts[0] += 1
            except kmod.KmodError as e:
                if e.errno != errno.ESRCH:  # not attached at this moment
                    raise
            time.sleep(0.005)
    finally:
        dev.close()


def test_attach_detach_cycles_while_target_churns():
    """Attach/detach in both modes, with reads, while the target maps, remaps, mprotects,
    discards, forks and shares memory; the target's own checks must all pass."""
    attach_detach_cycles(12, min_cycles=3)


@pytest.mark.long
def test_attach_detach_cycles_long():
    attach_detach_cycles(240, min_cycles=100)


@pytest.mark.long
def test_attach_detach_cycles_rapid():
    """Thousands of cycles: attach and detach back to back, a read every 16th cycle."""
    attach_detach_cycles(240, min_cycles=1000, rapid=True)


def attach_detach_cycles(seconds: float, min_cycles: int, rapid: bool = False) -> None:
    churn = subprocess.Popen([str(binary("churn")), str(seconds)], stdout=subprocess.PIPE, text=True)
    dev, other = kmod.Device(), kmod.Device()
    cycles = reads = 0
    stop, extra = threading.Event(), [0]
    reader = threading.Thread(target=_reader, args=(churn.pid, stop, extra))
    reader.start()
    end = time.monotonic() + seconds - 1
    try:
        while time.monotonic() < end and churn.poll() is None:
            mode = ("fault", "abit")[cycles % 2]
            try:
                dev.attach(churn.pid, mode, scan_period_ms=10, sample_ratio=1 + cycles % 3)
            except kmod.KmodError as e:
                if e.errno == errno.ESRCH:
                    break
                raise
            n_reads = (1 if cycles % 16 == 0 else 0) if rapid else 1 + cycles % 3
            for _ in range(n_reads):
                if not rapid:
                    time.sleep(0.01)
                (dev if reads % 2 else other).read(churn.pid, reset=bool(reads % 3),
                                                   accessed_only=bool(reads % 5 == 0))
                reads += 1
            dev.detach(churn.pid)
            cycles += 1
    finally:
        stop.set()
        reader.join()
        dev.close()
        other.close()
    out, _ = churn.communicate(timeout=120)
    print(f"churn: {cycles} attach/detach cycles, {reads + extra[0]} reads; target says {out.strip()}")
    assert churn.returncode == 0, out
    assert cycles >= min_cycles
    assert targets() == ""


def test_rmmod_under_load():
    """rmmod while several targets are attached and scanned fast; their memory stays intact."""
    rmmod_under_load()


@pytest.mark.long
def test_rmmod_under_load_repeated():
    for _ in range(5):
        rmmod_under_load()


def rmmod_under_load() -> None:
    ws = [Workload("--size", "32", "--hot", "16", "--duration", "0", "--quiet") for _ in range(3)]
    dev = kmod.Device()
    for i, w in enumerate(ws):
        dev.attach(w.pid, ("fault", "abit")[i % 2], scan_period_ms=10)
    for w in ws:  # each scanned, its pages marked, before the module goes
        wait_scans(dev, w.pid, 3)
    dev.close()
    try:
        kmod.unload_module()
        faults = faults_in([w.pid for w in ws], 1.5)
        assert faults == 0, f"{faults} hinting faults in the targets after rmmod"
        assert all(w.stop() == 0 for w in ws)
    finally:
        for w in ws:
            w.stop()
        kmod.load_module()  # the next tests need it whatever happened here


@pytest.fixture
def ext4(tmp_path):
    """A directory on ext4 (an image on a loop device): page cache of a file system that
    writes back, as bench live's file-mapped scenarios have."""
    from pagetier.bench.live import FileSystem

    fs = FileSystem(96, root=tmp_path / "fs")
    yield fs.__enter__()
    fs.__exit__(None, None, None)


def _kind_workloads(ext4) -> tuple[list[Workload], list]:
    """hotcold on shared memory, on a file mapped MAP_SHARED (its hot pages dirtied all the
    time), on a file mapped MAP_PRIVATE (copies), and on a tmpfs segment two processes share;
    with the files to check after they end."""
    from pagetier.workload import Workload as W

    common = ["--size", "16", "--hot", "8", "--duration", "0", "--quiet"]
    seg = ext4.parent / "segment"  # tmp_path: the guest's /tmp is a tmpfs, its files shmem
    ws = [W("--memory", "shmem", *common), W("--memory", f"file:{ext4 / 'shared'}", *common),
          W("--memory", f"private:{ext4 / 'private'}", *common),
          W("--memory", f"file:{seg}", *common)]
    ws.append(W("--memory", f"file:{seg}", "--reuse", *common))
    return ws, [ext4 / "shared", seg]


def _stop_and_check(ws, files) -> None:
    from pagetier.workload import check_file

    rcs = [w.stop() for w in ws]
    assert rcs == [0] * len(ws), f"a workload found its memory corrupt: {rcs}"
    for f in files:
        checked, bad = check_file(f, 16 << 20)
        assert checked == 16 * 256 and bad == [], f"{f}: corrupt pages {bad[:20]}"


def test_rmmod_under_load_on_shared_memory_and_files(ext4):
    """rmmod while targets on shmem, a shared and a private file mapping and a segment two
    processes share are attached and scanned fast (marked, in fault mode): no hinting fault
    after it, every process's memory and the files intact."""
    kinds_rmmod_under_load(ext4)


@pytest.mark.long
def test_rmmod_under_load_on_shared_memory_and_files_repeated(ext4):
    for _ in range(5):
        kinds_rmmod_under_load(ext4)


def kinds_rmmod_under_load(ext4) -> None:
    ws, files = _kind_workloads(ext4)
    try:
        dev = kmod.Device()
        modes = [("fault", "abit")[i % 2 if i < 4 else 0] for i in range(len(ws))]
        for w, mode in zip(ws, modes):
            dev.attach(w.pid, mode, scan_period_ms=10)
        for w in ws:
            wait_scans(dev, w.pid, 3)
        assert any(dev.stats(w.pid)["pages_shmem"] + dev.stats(w.pid)["pages_file"] > 0
                   for w in ws)
        dev.close()
        kmod.unload_module()
        # hinting faults in the targets the module marked (fault mode): abit marks nothing, and
        # the ext4 file's target takes write-protect faults of its own each time writeback
        # cleans its dirty pages, which its minor-fault count cannot tell from hinting faults
        faults = faults_in([w.pid for w, mode in zip(ws, modes) if mode == "fault"], 1.5)
        assert faults == 0, f"{faults} hinting faults in the targets after rmmod"
        _stop_and_check(ws, files)
    finally:
        for w in ws:
            w.stop()
        kmod.load_module()


def test_attach_detach_cycles_on_shared_memory_and_files(ext4):
    """Attach/detach cycles in both modes and several sample ratios, with reads and moves of
    the hot pages between the nodes, against targets on shmem, file mappings and a shared
    segment: every process's memory and the files intact, nothing left attached."""
    kinds_attach_detach_cycles(ext4, 12, min_cycles=6)


@pytest.mark.long
def test_attach_detach_cycles_on_shared_memory_and_files_long(ext4):
    kinds_attach_detach_cycles(ext4, 240, min_cycles=100)


def kinds_attach_detach_cycles(ext4, seconds: float, min_cycles: int) -> None:
    from pagetier.core import mover

    ws, files = _kind_workloads(ext4)
    dev = kmod.Device()
    cycles = moved = 0
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            w = ws[cycles % len(ws)]
            mode = ("fault", "abit")[(cycles // len(ws)) % 2]
            dev.attach(w.pid, mode, scan_period_ms=10, sample_ratio=1 + cycles % 4)
            wait_scans(dev, w.pid, 1 + cycles % 2)
            rec = dev.read(w.pid, reset=bool(cycles % 2))
            addrs = np.asarray(rec["addr"][:256], np.uint64)
            if len(addrs):
                res = mover.move(w.pid, addrs, cycles % 2)
                moved += int(np.count_nonzero(res.moved))
            dev.detach(w.pid)
            cycles += 1
        assert targets() == ""
        _stop_and_check(ws, files)
    finally:
        dev.close()
        for w in ws:
            w.stop()
    print(f"churn: {cycles} attach/detach cycles on shmem and file targets, {moved} units moved")
    assert cycles >= min_cycles


def test_closing_the_descriptor_detaches():
    """Targets attached through a descriptor are detached when it is closed, or when the
    process holding it is killed: nothing stays marked behind a dead profiler."""
    with Workload("--size", "32", "--hot", "8", "--duration", "0", "--quiet") as w:
        dev = kmod.Device()
        dev.attach(w.pid, "fault", scan_period_ms=50)
        dev.close()
        assert targets() == ""
        holder = subprocess.Popen(
            ["python3", "-c", "import sys, time; from pagetier.profiler import kmod\n"
             f"kmod.Device().attach({w.pid}, 'fault', scan_period_ms=50)\n"
             "print('attached', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
        assert holder.stdout.readline().strip() == "attached"
        assert targets().startswith(f"{w.pid} fault")
        probe = kmod.Device()  # attaches nothing: closing it detaches nothing
        wait_scans(probe, w.pid, 2)  # the holder's target scanned, its pages marked
        probe.close()
        holder.kill()
        holder.wait()
        assert targets() == ""
        faults = faults_in([w.pid], 1.5)
        assert faults == 0, f"{faults} hinting faults in the target after the holder died"
        assert w.stop() == 0


def _pointers(rng, good: int) -> list[int]:
    return [0, 1, 8, good, good + 3, good + 4095, 0xFFFF_FFFF_FFFF_F000, 0xFFFF_8880_0000_0000,
            0xFFFF_FFFF_8100_0000, 0x7FFF_FFFF_F000, (1 << 63) | rng.getrandbits(63)]


def test_ioctl_fuzz():
    """Random commands, sizes, pointers and field values: every call answered with an errno
    or success, the kernel quiet, nothing left attached to processes the fuzzer did not own."""
    ioctl_fuzz(20_000, seed=1234)


@pytest.mark.long
def test_ioctl_fuzz_long():
    ioctl_fuzz(100_000, seed=4321)


def ioctl_fuzz(calls: int, seed: int) -> None:
    rng = random.Random(seed)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
    dev = kmod.Device()
    with Workload("--size", "16", "--hot", "4", "--duration", "0", "--quiet") as w:
        # Arguments and record buffers point into one 2 MiB arena with room to spare, so that the
        # kernel's legitimate writes never land on the fuzzer's own heap.
        arena = mmap.mmap(-1, 2 << 20)
        buf = (ctypes.c_char * (1 << 20)).from_buffer(arena)
        good = ctypes.addressof(buf)
        rec = (ctypes.c_char * (1 << 20)).from_buffer(arena, 1 << 20)
        valid = [uapi.IOC_VERSION, uapi.IOC_ATTACH, uapi.IOC_DETACH, uapi.IOC_READ, uapi.IOC_STATS,
                 uapi.IOC_UNMARK]
        pids = [w.pid, 0, 2, 999_999, 2**31 - 1, 2**32 - 1]  # never a process it does not own
        errnos: dict[int, int] = {}
        for i in range(calls):
            r = rng.random()
            if r < 0.15:
                cmd = rng.getrandbits(32)
            elif r < 0.3:  # a valid number with a random size or direction
                cmd = (rng.choice(valid) & ~(0x3FFF << 16)) | (rng.getrandbits(14) << 16)
                cmd ^= rng.getrandbits(2) << 30 if rng.random() < 0.5 else 0
            else:
                cmd = rng.choice(valid)
            ctypes.memset(buf, 0, 256)
            words = np.frombuffer(buf, np.uint64, 32)
            n = rng.randrange(1, 16)
            words[1:n] = [rng.choice([0, 1, 2, rng.getrandbits(32), rng.getrandbits(64)])
                          for _ in range(n - 1)]
            pid_word = rng.choice(pids) | (rng.choice([1, 2, 3, 0]) << 32)
            np.frombuffer(buf, np.uint64, 1)[0] = pid_word
            if cmd == uapi.IOC_READ:  # its buffer pointer: the arena, unmapped or kernel only
                np.frombuffer(buf, np.uint64, 4)[1] = rng.choice(_pointers(rng, ctypes.addressof(rec)))
                np.frombuffer(buf, np.uint64, 4)[2] = rng.choice([0, 1, 64, 2**40])  # <= 64 fits
                np.frombuffer(buf, np.uint64, 4)[3] = rng.choice([0, 4096, rng.getrandbits(64)])
            if cmd == uapi.IOC_UNMARK:  # addrs: the arena (random words), unmapped or kernel
                np.frombuffer(buf, np.uint64, 4)[1] = rng.choice(_pointers(rng, ctypes.addressof(rec)))
                np.frombuffer(buf, np.uint64, 4)[2] = rng.choice([0, 1, 512, 1 << 20, (1 << 20) + 1,
                                                                  rng.getrandbits(64)])
            arg = good if rng.random() < 0.8 else rng.choice(_pointers(rng, good))
            ret = libc.ioctl(dev.fd, cmd & 0xFFFF_FFFF, ctypes.c_void_p(arg))
            e = ctypes.get_errno() if ret < 0 else 0
            assert ret in (0, -1), f"ioctl returned {ret}"
            errnos[e] = errnos.get(e, 0) + 1
        targets = (kmod.SYSFS / "targets").read_text().split("\n")
        for line in filter(None, targets):
            pid = int(line.split()[0])
            assert pid == w.pid, f"fuzzer left pid {pid} attached"
            dev.detach(pid)
        assert w.stop() == 0
    dev.close()
    names = {errno.errorcode.get(k, str(k)) if k else "ok": v for k, v in sorted(errnos.items())}
    print(f"ioctl fuzz: {calls} calls: {names}")
    assert set(errnos) <= {0, errno.ENOTTY, errno.EINVAL, errno.EFAULT, errno.ESRCH,
                           errno.EBUSY, errno.EACCES, errno.ENOSPC, errno.ENOMEM}
