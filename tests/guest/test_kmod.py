"""pagetier.ko in a real kernel: counting, placement, lifecycle, errors, permissions."""
from __future__ import annotations

import errno
import fcntl
import platform
import subprocess

import numpy as np
import pytest

from pagetier import uapi
from pagetier.profiler import kmod
from pagetier.workload import Workload

from helpers import faults_in, precision_recall, targets, vmstat, wait_scans, wait_until

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_fresh")]


def test_version_and_sysfs(dev):
    major, minor, patch, record_size = dev.version()
    assert (major, minor, patch) == (uapi.VERSION_MAJOR, uapi.VERSION_MINOR, uapi.VERSION_PATCH)
    assert record_size == uapi.RECORD_T.itemsize
    assert (kmod.SYSFS / "version").read_text().strip() == uapi.VERSION
    assert kmod.vermagic(kmod.module_path()).split()[0] == platform.release()
    # abit's upper-level window is on by default
    assert (kmod.SYSFS / "upper_window_ms").read_text().strip() == "20"


@pytest.mark.parametrize("mode", ["fault", "abit"])
@pytest.mark.parametrize("thp", [True, False], ids=["thp", "nothp"])
def test_hot_set_is_found(dev, mode, thp):
    """10% of 256 MiB touched constantly, the rest once: the module ranks the hot pages."""
    args = ["--size", "256", "--hot", "26", "--hot-offset", "100", "--duration", "0", "--quiet"]
    with Workload(*args, *([] if thp else ["--no-thp"])) as w:
        dev.attach(w.pid, mode, scan_period_ms=200)
        try:
            wait_scans(dev, w.pid, 2)
            dev.read(w.pid, reset=True)  # start a clean interval
            st = wait_scans(dev, w.pid, 4)
            sample = kmod.records_to_sample(w.pid, dev.read(w.pid, reset=True), True)
        finally:
            dev.detach(w.pid)
        assert w.stop() == 0, "workload memory corrupted"
    precision, recall, n = precision_recall(sample, w.ready)
    print(f"{mode} thp={thp}: precision {precision:.3f} recall {recall:.3f} "
          f"({n} pages predicted hot, stats {st})")
    assert precision >= 0.95 and recall >= 0.95
    if mode == "fault":
        assert st["faults"] > 0 and st["pages_marked"] > 0


def test_accessed_only_read_lists_touched_pages(dev):
    with Workload("--size", "64", "--hot", "8", "--duration", "0", "--quiet", "--no-thp") as w:
        dev.attach(w.pid, "abit", scan_period_ms=100)
        wait_scans(dev, w.pid, 2)
        dev.read(w.pid, reset=True)
        wait_scans(dev, w.pid, 2)
        full = dev.read(w.pid)
        acc = dev.read(w.pid, accessed_only=True)
        dev.detach(w.pid)
        w.stop()
    assert 0 < len(acc) < len(full)
    assert np.all(acc["flags"] & uapi.REC_ACCESSED)
    assert np.all(acc["count"] > 0)


def test_read_in_chunks_with_cursor(dev):
    with Workload("--size", "32", "--hot", "4", "--duration", "0", "--quiet", "--no-thp") as w:
        dev.attach(w.pid, "abit", scan_period_ms=100)
        wait_scans(dev, w.pid, 1)
        whole = dev.read(w.pid, chunk=1 << 20)
        chunked = dev.read(w.pid, chunk=1000)
        dev.detach(w.pid)
        w.stop()
    assert len(whole) >= 8192
    assert np.array_equal(whole["addr"], chunked["addr"])
    assert np.all(np.diff(whole["addr"].astype(np.int64)) > 0)


def test_fault_mode_leaves_pages_where_they_are(dev):
    """Hinting faults of a target never make the kernel migrate its pages to the CPU's node."""
    with open("/proc/sys/kernel/numa_balancing") as f:
        assert f.read().strip() == "0"
    with Workload("--size", "64", "--hot", "32", "--start-node", "1", "--duration", "0",
                  "--no-thp") as w:
        dev.attach(w.pid, "fault", scan_period_ms=100)
        faults0 = vmstat("numa_hint_faults")
        ticks = [w.next_tick() for _ in range(4)]
        st = dev.stats(w.pid)
        dev.detach(w.pid)
        assert w.stop() == 0
    assert vmstat("numa_hint_faults") > faults0 and st["faults"] > 1000
    assert all(t["fast_fraction"] == 0.0 for t in ticks), ticks


def test_detach_restores_every_page(dev):
    with Workload("--size", "64", "--hot", "64", "--duration", "0", "--quiet") as w:
        dev.attach(w.pid, "fault", scan_period_ms=100)
        wait_scans(dev, w.pid, 3)
        dev.detach(w.pid)  # restores every page before it returns
        assert targets() == ""
        grown = faults_in([w.pid], 1.5)
        assert w.stop() == 0
    assert grown == 0, f"{grown} hinting faults after detach"


@pytest.mark.parametrize("mode", ["fault", "abit"])
def test_profiler_first_read_lists_every_page(mode):
    """The first read after attach holds every page of the target (the module's first scan has
    ended), so a daemon's first interval decides on all of them; a read before that scan ends
    would say it is partial."""
    with Workload("--size", "256", "--hot", "8", "--no-thp", "--duration", "0", "--quiet") as w:
        prof = kmod.KmodProfiler(mode=mode, scan_period_ms=5000, kinds="off")  # 4 KiB: as asked
        try:
            prof.attach(w.pid)
            sample = prof.read(w.pid)
        finally:
            prof.detach(w.pid)
            prof.close()
        assert w.stop() == 0
    assert sample.complete
    assert int(sample.npages.sum()) >= (256 << 20) // 4096, int(sample.npages.sum())


def test_target_exit_while_attached(dev):
    w = Workload("--size", "32", "--hot", "8", "--duration", "1", "--quiet")
    dev.attach(w.pid, "fault", scan_period_ms=50)
    assert w.stop() == 0
    # the module drops a target when its mm goes away, a moment after the exit
    wait_until(lambda: targets() == "", 60, "detach of the exited target")
    with pytest.raises(kmod.KmodError) as e:
        dev.stats(w.pid)
    assert e.value.errno == errno.ESRCH


def test_several_targets_and_readers(dev):
    with Workload("--size", "32", "--hot", "8", "--duration", "0", "--quiet") as a, \
         Workload("--size", "32", "--hot", "8", "--duration", "0", "--quiet") as b:
        dev.attach(a.pid, "fault", scan_period_ms=100)
        dev.attach(b.pid, "abit", scan_period_ms=100)
        other = kmod.Device()
        wait_scans(dev, a.pid, 2)
        wait_scans(dev, b.pid, 2)
        assert len(dev.read(a.pid)) and len(other.read(b.pid))
        targets = (kmod.SYSFS / "targets").read_text().split("\n")
        assert {t.split()[0] for t in targets if t} == {str(a.pid), str(b.pid)}
        other.close()
        dev.detach(a.pid)
        dev.detach(b.pid)
        assert a.stop() == 0 and b.stop() == 0


def test_rmmod_while_attached_restores_pages():
    dev = kmod.Device()
    with Workload("--size", "64", "--hot", "64", "--duration", "0", "--quiet") as w:
        dev.attach(w.pid, "fault", scan_period_ms=100)
        wait_scans(dev, w.pid, 3)
        dev.close()
        kmod.unload_module()  # rmmod returns once the module's exit has restored every page
        assert not kmod.is_loaded()
        grown = faults_in([w.pid], 1.5)
        assert w.stop() == 0
    kmod.load_module()
    assert grown == 0


def _ioctl_errno(fd, cmd, arr) -> int:
    try:
        fcntl.ioctl(fd, cmd, bytearray(arr.tobytes()), True)
    except OSError as e:
        return e.errno
    return 0


def test_bad_input_gets_clear_errnos(dev):
    fd = dev.fd
    a = np.zeros(1, uapi.ATTACH_T)
    assert _ioctl_errno(fd, uapi.IOC_ATTACH - 1, a) == errno.ENOTTY
    assert _ioctl_errno(fd, (uapi.IOC_MAGIC << 8) | 0x7F, a) == errno.ENOTTY
    a["pid"], a["mode"] = 999_999, uapi.MODE_FAULT
    assert _ioctl_errno(fd, uapi.IOC_ATTACH, a) == errno.ESRCH
    a["pid"] = 2  # kthreadd
    assert _ioctl_errno(fd, uapi.IOC_ATTACH, a) == errno.EINVAL
    with Workload("--size", "8", "--hot", "1", "--duration", "0", "--quiet") as w:
        for field, value in (("mode", 7), ("scan_period_ms", 1), ("sample_ratio", 1 << 30)):
            bad = np.zeros(1, uapi.ATTACH_T)
            bad["pid"], bad["mode"] = w.pid, uapi.MODE_ABIT
            bad[field] = value
            assert _ioctl_errno(fd, uapi.IOC_ATTACH, bad) == errno.EINVAL, field
        bad = np.zeros(1, uapi.ATTACH_T)
        bad["pid"], bad["mode"], bad["reserved"][0][1] = w.pid, uapi.MODE_ABIT, 1
        assert _ioctl_errno(fd, uapi.IOC_ATTACH, bad) == errno.EINVAL
        dev.attach(w.pid, "abit")
        with pytest.raises(kmod.KmodError) as e:
            dev.attach(w.pid, "fault")
        assert e.value.errno == errno.EBUSY
        wait_scans(dev, w.pid, 1)  # records to copy out: before the first scan a read copies none
        r = np.zeros(1, uapi.READ_T)
        r["pid"], r["buf_len"] = w.pid, 16
        for ptr in (0, 8, 0xFFFF_FFFF_FFFF_F000, 0xFFFF_8880_0000_0000):
            r["buf"] = ptr
            assert _ioctl_errno(fd, uapi.IOC_READ, r) == errno.EFAULT, hex(ptr)
        r["buf"], r["flags"] = 0, 1 << 7
        assert _ioctl_errno(fd, uapi.IOC_READ, r) == errno.EINVAL
        assert _ioctl_errno(fd, uapi.IOC_VERSION, np.zeros(1, uapi.VERSION_T)) == 0
        with pytest.raises(OSError) as e:
            fcntl.ioctl(fd, uapi.IOC_STATS, 0)  # NULL pointer
        assert e.value.errno == errno.EFAULT
        dev.detach(w.pid)
        with pytest.raises(kmod.KmodError) as e:
            dev.detach(w.pid)
        assert e.value.errno == errno.ESRCH
        assert w.stop() == 0


def test_unprivileged_user_cannot_open_the_device():
    res = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
         "python3", "-c", "import os; os.open('/dev/pagetier', os.O_RDWR)"],
        capture_output=True, text=True)
    assert res.returncode != 0
    assert "PermissionError" in res.stderr


def test_module_for_another_kernel_is_refused(tmp_path):
    others = [p for p in kmod.module_path().parent.parent.glob("*/pagetier.ko")
              if p.parent.name != platform.release()]
    if not others:
        pytest.skip("no module built for another kernel")
    kmod.unload_module()
    try:
        with pytest.raises(Exception, match="built for kernel"):
            kmod.load_module(others[0])
    finally:
        kmod.load_module()


def test_target_that_calls_execve_is_followed(dev):
    """A target that execs (a wrapper script, `pagetier workload`) is tracked in its new image."""
    from pagetier.workload import binary

    proc = subprocess.Popen(["sh", "-c", f"sleep 1; exec {binary()} --size 32 --hot 8 --duration 4 --quiet"],
                            stdout=subprocess.PIPE, text=True)
    dev.attach(proc.pid, "abit", scan_period_ms=100)
    ready = proc.stdout.readline()
    assert '"ready"' in ready
    # scans of the new image, its buffer mapped: a loaded host may need more than two passes
    # before every page has a record, so read after each pass, up to ten
    seen = []
    for _ in range(10):
        st = wait_scans(dev, proc.pid, 1)
        rec = dev.read(proc.pid)
        seen.append(int(np.where(rec["flags"] & uapi.REC_HUGE, 512, 1).sum()))
        if seen[-1] >= 8192:
            break
    dev.detach(proc.pid)
    assert proc.wait() == 0
    assert seen[-1] >= 8192 and st["scans"] > 0, f"pages recorded after each pass: {seen}"


def test_unmark_makes_marked_pages_movable(dev):
    """Cold pages the fault mode left PROT_NONE move with move_pages after UNMARK (6.1's
    move_pages skips protnone entries)."""
    from pagetier.core import mover

    with Workload("--size", "32", "--hot", "4", "--duration", "0", "--quiet", "--no-thp") as w:
        # a slow scan, so that none re-marks the pages between the unmark and the move
        dev.attach(w.pid, "fault", scan_period_ms=3000)
        wait_scans(dev, w.pid, 2)
        r = w.ready
        cold = np.arange(r["addr"] + (8 << 20), r["addr"] + r["size"], 4096, dtype=np.uint64)
        done = dev.unmark(w.pid, cold)
        res = mover.move(w.pid, cold, 1)
        moved, left, tries = len(res.moved), np.setdiff1d(cold, cold[res.moved]), 1
        while len(left) and tries < 3:  # a scan of a slowed-down guest re-marked some in between
            dev.unmark(w.pid, left)
            again = mover.move(w.pid, left, 1)
            moved, left, tries = moved + len(again.moved), np.setdiff1d(left, left[again.moved]), tries + 1
        dev.detach(w.pid)
        assert w.stop() == 0
    assert done >= len(cold) * 0.9, done
    assert moved == len(cold), (tries, res.errors)
    with pytest.raises(kmod.KmodError) as e:
        dev.unmark(999_999, cold[:1])
    assert e.value.errno == errno.ESRCH
