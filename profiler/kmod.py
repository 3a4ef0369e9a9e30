"""The kmod backend: pagetier.ko's access counts through /dev/pagetier ioctls.

Records are decoded with the layout in pagetier.uapi (read from the module's UAPI header);
``load_module()`` inserts the module built for the running kernel and refuses a .ko whose
vermagic names another kernel.
"""
from __future__ import annotations

import errno
import fcntl
import os
import platform
import struct
import subprocess
import time
from pathlib import Path

import numpy as np

from pagetier import uapi
from pagetier.errors import ConfigError, PagetierError, Unavailable
from pagetier.core.arrays import unique
from pagetier.core.sample import KIND_ANON, KIND_FILE, KIND_SHMEM
from pagetier.profiler.base import HUGE_PAGES, Profiler, Sample, part_span, register

REPO = Path(__file__).resolve().parent.parent
SYSFS = Path("/sys/kernel/pagetier")
FIRST_SCAN_WAIT_S = 5.0  # attach waits this long at most for the module's first scan

_ERRNO_HINTS = {
    errno.ESRCH: "no such process (or it is not attached)",
    errno.EBUSY: "already attached",
    errno.EINVAL: "invalid argument (a kernel thread, or a field out of range)",
    errno.EACCES: "permission denied: ptrace access to the process is required",
    errno.EPERM: "permission denied: CAP_SYS_ADMIN is required",
    errno.ENOSPC: "too many targets (see /sys/kernel/pagetier/max_targets)",
}


class KmodError(PagetierError):
    def __init__(self, what: str, err: int):
        self.errno = err
        hint = _ERRNO_HINTS.get(err, os.strerror(err))
        super().__init__(f"{what}: {hint} [{errno.errorcode.get(err, err)}]")


def module_path(release: str | None = None) -> Path:
    """pagetier.ko as a checkout builds it (make -C kmod, scripts/setup.sh)."""
    return REPO / "build" / "kmod" / (release or platform.release()) / "pagetier.ko"


def installed_path(release: str | None = None) -> Path | None:
    """pagetier.ko installed for the kernel (by `dkms install`), as modprobe finds it; or None."""
    try:
        r = subprocess.run(["modinfo", "-k", release or platform.release(), "-n", "pagetier"],
                           capture_output=True, text=True)
    except OSError:  # no modinfo (kmod package)
        return None
    path = r.stdout.strip()
    return Path(path) if r.returncode == 0 and path.startswith("/") else None


def vermagic(ko: Path) -> str:
    """The vermagic string in a .ko's .modinfo section (no modinfo binary needed): the ELF64
    section headers read with struct (the daemon's start reads it; an ELF library's import
    alone took seconds in the emulated guest)."""
    data = Path(ko).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELF, 64-bit, little-endian
        raise Unavailable(f"{ko}: not a kernel module (not a 64-bit little-endian ELF file)")
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

        def section(i: int) -> tuple[int, int, int]:  # (name offset, file offset, size)
            name, = struct.unpack_from("<I", data, shoff + i * shentsize)
            off, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
            return name, off, size

        _, stroff, _ = section(shstrndx)
        for i in range(shnum):
            name, off, size = section(i)
            if data[stroff + name:data.index(b"\0", stroff + name)] == b".modinfo":
                for item in data[off:off + size].split(b"\0"):
                    if item.startswith(b"vermagic="):
                        return item[len(b"vermagic="):].decode()
                raise Unavailable(f"{ko}: no vermagic in .modinfo")
    except (struct.error, ValueError):
        raise Unavailable(f"{ko}: not a kernel module (its section headers are cut short)") from None
    raise Unavailable(f"{ko}: not a kernel module (no .modinfo)")


def is_loaded() -> bool:
    return SYSFS.exists()


def load_module(ko: Path | None = None) -> None:
    """insmod pagetier.ko built for the running kernel (a no-op if it is loaded). With no ``ko``
    and no build in the checkout, modprobe the module installed for this kernel (DKMS)."""
    if is_loaded():
        return
    if not ko and not module_path().exists():
        installed = installed_path()
        if installed is not None:
            res = subprocess.run(["modprobe", "pagetier"], capture_output=True, text=True)
            if res.returncode != 0:
                raise Unavailable(f"modprobe pagetier ({installed}) failed: {res.stderr.strip()} "
                                  "(see dmesg)")
            return
    ko = Path(ko) if ko else module_path()
    if not ko.exists():
        raise Unavailable(
            f"{ko} does not exist: build it with `make -C kmod KERNEL_DIR=/lib/modules/"
            f"{platform.release()}/build` (scripts/setup.sh builds it for every installed kernel), "
            f"or install it with DKMS (README.md)"
        )
    magic = vermagic(ko).split()[0]
    if magic != platform.release():
        raise Unavailable(f"{ko} was built for kernel {magic}, but this kernel is "
                          f"{platform.release()}: rebuild it for this kernel")
    res = subprocess.run(["insmod", str(ko)], capture_output=True, text=True)
    if res.returncode != 0:
        raise Unavailable(f"insmod {ko} failed: {res.stderr.strip()} (see dmesg)")


def unload_module() -> None:
    if not is_loaded():
        return
    res = subprocess.run(["rmmod", "pagetier"], capture_output=True, text=True)
    if res.returncode != 0:
        if "in use" in res.stderr:
            raise PagetierError("rmmod pagetier: the module is in use: a pagetier daemon or "
                                "recorder has /dev/pagetier open (see `pagetier status`); stop it first")
        raise PagetierError(f"rmmod pagetier failed: {res.stderr.strip()}")


_STATS_SCANS = uapi.STATS_T.fields["scans"][1]
_STATS_RESUMES = uapi.STATS_T.fields["scan_resumes"][1]
# STATS read with one struct unpack: the daemon asks for it every interval (its scan time), and
# a numpy scalar a field costs more than the ioctl under emulation. Its fields are 32- and
# 64-bit integers with no padding between them (checked here); Device.stats returns all but pid
_STATS_STRUCT = struct.Struct("<" + "".join("Q" if uapi.STATS_T[k].itemsize == 8 else "I"
                                            for k in uapi.STATS_T.names))
assert _STATS_STRUCT.size == uapi.STATS_T.itemsize


class Device:
    """/dev/pagetier and its ioctls, one method each."""

    def __init__(self, path: str = uapi.DEVICE):
        if not os.path.exists(path):
            raise Unavailable(f"{path} is missing: load the module (`pagetier kmod load`)")
        try:
            self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            raise Unavailable(f"{path}: permission denied (CAP_SYS_ADMIN is required)") from None
        self._periods_buf = bytearray(uapi.STATS_T.itemsize)
        self._bufs: dict[tuple, np.ndarray] = {}  # the reads' record buffers, kept for the next

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _ioctl(self, cmd: int, arr: np.ndarray, what: str) -> np.ndarray:
        buf = bytearray(arr.tobytes())
        try:
            fcntl.ioctl(self.fd, cmd, buf, True)
        except OSError as e:
            raise KmodError(what, e.errno) from None
        return np.frombuffer(bytes(buf), arr.dtype)[0]

    def version(self) -> tuple[int, int, int, int]:
        v = self._ioctl(uapi.IOC_VERSION, np.zeros(1, uapi.VERSION_T), "VERSION")
        return int(v["major"]), int(v["minor"]), int(v["patch"]), int(v["record_size"])

    def attach(self, pid: int, mode: str = "fault", scan_period_ms: int = 0,
               sample_ratio: int = 0, page_budget: int = 0, flags: int = 0) -> None:
        """``flags``: PAGETIER_ATTACH_* (module 0.5 on; an older one refuses any with EINVAL)."""
        if mode not in uapi.MODES:
            raise ConfigError(f"unknown kmod mode {mode!r} (known: {', '.join(uapi.MODES)})")
        a = np.zeros(1, uapi.ATTACH_T)
        a["pid"], a["mode"], a["scan_period_ms"] = pid, uapi.MODES[mode], scan_period_ms
        a["sample_ratio"], a["page_budget"], a["flags"] = sample_ratio, page_budget, flags
        self._ioctl(uapi.IOC_ATTACH, a, f"attach pid {pid}")

    def detach(self, pid: int) -> None:
        d = np.zeros(1, uapi.DETACH_T)
        d["pid"] = pid
        self._ioctl(uapi.IOC_DETACH, d, f"detach pid {pid}")

    def read(self, pid: int, reset: bool = False, accessed_only: bool = False,
             chunk: int = 65536) -> np.ndarray:
        """All records of ``pid`` (RECORD_T array), read in chunks with the cursor."""
        return self._read(uapi.IOC_READ, uapi.READ_T, uapi.RECORD_T, pid, reset, accessed_only,
                          chunk)

    def read_regions(self, pid: int, reset: bool = False, accessed_only: bool = False,
                     start: int = 0, end: int = 0, chunk: int = 16384) -> np.ndarray:
        """``pid``'s region records (REGION_T array: one per 2 MiB holding present pages) in
        [start, end) (end 0: no limit). Module 0.4 and later."""
        return self._read(uapi.IOC_READ_REGIONS, uapi.READ_RANGE_T, uapi.REGION_T, pid, reset,
                          accessed_only, chunk, start, end)

    def read_pages(self, pid: int, start: int, end: int, reset: bool = False,
                   accessed_only: bool = False, chunk: int = 65536) -> np.ndarray:
        """``pid``'s per-page records (RECORD_T array) in [start, end): the drill-down into
        regions. Module 0.4 and later."""
        return self._read(uapi.IOC_READ_PAGES, uapi.READ_RANGE_T, uapi.RECORD_T, pid, reset,
                          accessed_only, chunk, start, end)

    def _read(self, cmd: int, arg_t: np.dtype, rec_t: np.dtype, pid: int, reset: bool,
              accessed_only: bool, chunk: int, start: int | None = None,
              end: int | None = None) -> np.ndarray:
        out = []
        cursor = 0
        # one buffer per record type and size, reused: the module writes the records it returns
        # and nothing else is read, so it is neither zeroed nor allocated again (a daemon reads
        # several times an interval, and a look between reads lists few records)
        buf = self._bufs.get((rec_t, chunk))
        if buf is None:
            buf = self._bufs[(rec_t, chunk)] = np.empty(chunk, rec_t)
        flags = (uapi.READ_RESET if reset else 0) | (uapi.READ_ACCESSED_ONLY if accessed_only else 0)
        r = np.zeros(1, arg_t)
        r["pid"], r["flags"], r["buf"], r["buf_len"] = pid, flags, buf.ctypes.data, chunk
        if start is not None:
            r["start"], r["end"] = start, end
        arg = bytearray(r.tobytes())
        cursor_at = arg_t.fields["cursor"][1]
        nr_at = arg_t.fields["nr_records"][1]
        while True:
            struct.pack_into("<Q", arg, cursor_at, cursor)
            try:
                fcntl.ioctl(self.fd, cmd, arg, True)
            except OSError as e:
                raise KmodError(f"read pid {pid}", e.errno) from None
            n = struct.unpack_from("<Q", arg, nr_at)[0]
            out.append(buf[:n].copy())
            cursor = struct.unpack_from("<Q", arg, cursor_at)[0]
            if cursor == 0:
                break
        return out[0] if len(out) == 1 else np.concatenate(out)

    def unmark(self, pid: int, addrs: np.ndarray) -> int:
        """Make the pages holding ``addrs`` accessible again; returns mappings changed."""
        addrs = np.ascontiguousarray(addrs, np.uint64)
        done = 0
        for s in range(0, len(addrs), uapi.UNMARK_MAX):
            chunk = addrs[s:s + uapi.UNMARK_MAX]
            u = np.zeros(1, uapi.UNMARK_T)
            u["pid"], u["addrs"], u["nr"] = pid, chunk.ctypes.data, len(chunk)
            done += int(self._ioctl(uapi.IOC_UNMARK, u, f"unmark pid {pid}")["done"])
        return done

    def scan_periods(self, pid: int) -> int:
        """STATS' ``scans + scan_resumes`` alone: the daemon polls it at every wait for a period
        end (dozens of times a second), so one reused buffer and two fields, not a dict."""
        buf = self._stats_into(pid, self._periods_buf)
        return (struct.unpack_from("<Q", buf, _STATS_SCANS)[0] +
                struct.unpack_from("<Q", buf, _STATS_RESUMES)[0])

    def stats(self, pid: int) -> dict:
        got = dict(zip(uapi.STATS_T.names,
                       _STATS_STRUCT.unpack(self._stats_into(pid, bytearray(_STATS_STRUCT.size)))))
        del got["pid"]
        return got

    def _stats_into(self, pid: int, buf: bytearray) -> bytearray:
        """``buf`` (STATS' size) filled by the STATS ioctl for ``pid``."""
        buf[:] = bytes(len(buf))
        struct.pack_into("<I", buf, 0, pid)
        try:
            fcntl.ioctl(self.fd, uapi.IOC_STATS, buf, True)
        except OSError as e:
            raise KmodError(f"stats pid {pid}", e.errno) from None
        return buf


FREQ_SINCE = (0, 3)  # module versions before this leave pagetier_record.freq 0 (padding)
REGIONS_SINCE = (0, 4)  # READ_REGIONS, READ_PAGES, and UNMARK's re-read of moved regions
KINDS_SINCE = (0, 5)  # shmem and file-backed pages tracked, their kind flags, the attach flags


def decode_kinds(flags: np.ndarray, shmem: int, file: int, shared: int) -> tuple[np.ndarray, np.ndarray]:
    """(kind, shared) arrays from record or region flags: KIND_FILE where the file bit is set,
    else KIND_SHMEM where the shmem bit is, else KIND_ANON."""
    flags = np.asarray(flags, np.uint32)
    kind = np.full(len(flags), KIND_ANON, np.uint8)
    kind[(flags & shmem) != 0] = KIND_SHMEM
    kind[(flags & file) != 0] = KIND_FILE
    return kind, (flags & shared) != 0


def records_to_sample(pid: int, rec: np.ndarray, complete: bool, freq: bool = True,
                      kinds: bool = True) -> Sample:
    """A Sample from RECORD_T records; ``freq``: the module fills pagetier_record.freq (0.3 on),
    else Sample.freq stays empty and Sample.rates() falls back to counts; ``kinds``: the module
    flags each record's kind of memory and sharing (0.5 on), else Sample.kind and
    Sample.shared stay empty."""
    huge = (rec["flags"] & uapi.REC_HUGE) != 0
    node = rec["node"].astype(np.int64)
    node[rec["node"] == uapi.NODE_NONE] = -1
    kind, shared = (decode_kinds(rec["flags"], uapi.REC_SHMEM, uapi.REC_FILE, uapi.REC_SHARED)
                    if kinds else (np.zeros(0, np.uint8), np.zeros(0, bool)))
    return Sample(pid=pid, addr=rec["addr"].astype(np.uint64), count=rec["count"].astype(np.uint32),
                  node=node.astype(np.int16),
                  npages=np.where(huge, HUGE_PAGES, 1).astype(np.uint16), complete=complete,
                  freq=rec["freq"].astype(np.float32) if freq else np.zeros(0, np.float32),
                  kind=kind, shared=shared)


def regions_to_sample(pid: int, rec: np.ndarray, complete: bool, freq: bool = True,
                      span: tuple[int, int] | None = None, kinds: bool = True) -> Sample:
    """A Sample of region units from REGION_T records (module 0.4 on): one unit of 512 pages per
    record, a region (moved page by page) unless it is one huge mapping. Its node is its first
    page's (the daemon re-reads a region it moved: see KmodProfiler.moved). ``kinds`` (0.5 on):
    its kind is file if it holds file-backed pages, else shmem if it holds shmem, else anon;
    shared if any of its pages is."""
    huge = (rec["flags"] & uapi.REGION_HUGE) != 0
    node = rec["node"].astype(np.int64)
    node[rec["node"] == uapi.NODE_NONE] = -1
    kind, shared = (decode_kinds(rec["flags"], uapi.REGION_SHMEM, uapi.REGION_FILE,
                                 uapi.REGION_SHARED)
                    if kinds else (np.zeros(0, np.uint8), np.zeros(0, bool)))
    return Sample(pid=pid, addr=rec["addr"].astype(np.uint64), count=rec["count"].astype(np.uint32),
                  node=node.astype(np.int16), npages=np.full(len(rec), HUGE_PAGES, np.uint16),
                  complete=complete,
                  freq=rec["freq"].astype(np.float32) if freq else np.zeros(0, np.float32),
                  region=~huge, span=span, kind=kind, shared=shared)


def mapped_span(pid: int) -> tuple[int, int]:
    """[lowest start, highest end) of ``pid``'s mappings (the vsyscall page left out)."""
    with open(f"/proc/{pid}/maps") as f:
        lines = f.read().splitlines()
    # the file lists mappings by address: the first line and the last one below the kernel's
    # half (the daemon reads this every interval: no parse of the lines between)
    user = [line.split(None, 1)[0].split("-") for line in lines[:1] + lines[-2:]]
    user = [(int(a, 16), int(b, 16)) for a, b in user if int(a, 16) < 1 << 63]
    if not user:
        return 0, 0
    return user[0][0], user[-1][1]


def resident_bytes(pid: int) -> int:
    """``pid``'s resident memory (VmRSS), 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


GRANULARITIES = ("auto", "page", "region")
AUTO_REGION_BYTES = 1 << 30  # granularity auto: regions for targets that map more than this

# The mode for memory in 4 KiB pages (``kinds`` "auto", module 0.5 on): in fault mode, a
# target whose memory is mostly 4 KiB pages (shmem, page cache, a private file mapping's
# copies, or anonymous memory outside transparent huge pages) is attached in abit mode. Fault
# mode takes a hinting fault on every 4 KiB page it marks, in the program's own time (a THP
# anon target takes one per 2 MiB); abit tests and clears Accessed bits in the module's scan
# and takes no faults. A target mostly in THP anonymous memory keeps the configured mode.
# Measured in bench live: docs/benchmarks.md, "Memory kinds" and "4 KiB anonymous pages".
KINDS = ("auto", "off")
KINDS_MODE = "abit"
# too little of either kind to tell yet: decided again when the target has more (refresh)
KINDS_MIN_BYTES = 16 << 20


def memory_mix(pid: int) -> dict[str, int] | None:
    """Bytes of ``pid``'s resident memory from /proc/PID/smaps: ``anon`` (private anonymous,
    in file mappings too), ``anon_huge`` (of it, in THP), ``anon_file`` (of it, in file
    mappings: the copies of a private file mapping's pages, always 4 KiB) and ``rss``; None
    when the file cannot be read (gone, or no permission)."""
    keys = {"Anonymous:": "anon", "AnonHugePages:": "anon_huge", "Rss:": "rss"}
    out = dict.fromkeys((*keys.values(), "anon_file"), 0)
    in_file = False
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                k, _, rest = line.partition(" ")
                if k in keys:
                    n = int(rest.split()[0]) * 1024
                    out[keys[k]] += n
                    if in_file and k == "Anonymous:":
                        out["anon_file"] += n
                elif not k.endswith(":"):  # a mapping's first line: ADDR PERMS OFFSET DEV INODE PATH
                    fields = rest.split(maxsplit=4)
                    in_file = len(fields) == 5 and fields[3] != "0" and fields[4].startswith("/")
    except (OSError, ValueError, IndexError):
        return None
    return out


@register("kmod")
class KmodProfiler(Profiler):
    """pagetier.ko: mode 'fault' (hinting faults on sampled pages) or 'abit' (Accessed bits)."""

    def __init__(self, mode: str = "fault", scan_period_ms: int = 0, sample_ratio: int = 0,
                 page_budget: int = 0, load: bool = True, granularity: str = "auto",
                 readonly_files: bool = False, kinds: str = "auto"):
        """``granularity``: the units reads list. "page": a record per 4 KiB page and per huge
        mapping; "region": a record per 2 MiB region (512 times fewer for 4 KiB pages, moved
        whole); "auto" (default): regions for a target with more than 1 GiB of present pages
        at its first read, pages otherwise. Regions need module 0.4.

        ``readonly_files``: also track read-only file mappings (shared libraries, files mapped
        PROT_READ), which the module leaves out by default as NUMA balancing does. Module 0.5.

        ``kinds``: "auto" (default): in fault mode, with no ``sample_ratio`` or ``page_budget``
        given, a target whose memory is mostly in 4 KiB pages (shmem, page cache, a private
        file mapping's copies, anonymous memory outside transparent huge pages) is attached in
        abit mode (KINDS_MODE, :meth:`choose`), a target mostly in THP in ``mode``; "off":
        every target in ``mode``. :attr:`tuning` says what each target got and why."""
        if kinds not in KINDS:
            raise ConfigError(f"kmod: unknown kinds {kinds!r} (known: {', '.join(KINDS)})")
        if mode not in uapi.MODES:
            raise ConfigError(f"kmod: unknown mode {mode!r} (known: {', '.join(uapi.MODES)})")
        if granularity not in GRANULARITIES:
            raise ConfigError(f"kmod: unknown granularity {granularity!r} "
                              f"(known: {', '.join(GRANULARITIES)})")
        if load:
            load_module()
        self.mode, self.scan_period_ms = mode, int(scan_period_ms)
        self.sample_ratio, self.page_budget = int(sample_ratio), int(page_budget)
        self.dev = Device()
        version = self.dev.version()[:2]
        self.has_freq, self.has_regions = version >= FREQ_SINCE, version >= REGIONS_SINCE
        self.has_kinds = version >= KINDS_SINCE
        if readonly_files and not self.has_kinds:
            raise ConfigError(f"kmod: readonly_files needs pagetier.ko 0.5 or later; the loaded "
                              f"module is {version[0]}.{version[1]} (pagetier kmod load)")
        self.attach_flags = uapi.ATTACH_READONLY_FILES if readonly_files else 0
        if granularity == "region" and not self.has_regions:
            raise ConfigError(f"kmod: granularity region needs pagetier.ko 0.4 or later; the "
                              f"loaded module is {version[0]}.{version[1]} (pagetier kmod load)")
        self.granularity = granularity
        self.kinds = kinds
        # pid -> what it was attached with: mode, sample_ratio, why, and whether that is
        # settled (False: too little memory to tell yet, see :meth:`retune`)
        self.tuning: dict[int, dict] = {}
        self._regions: dict[int, bool] = {}  # pid -> whether its reads list regions
        self.pids: set[int] = set()
        period = self.scan_period_ms or int((SYSFS / "default_scan_period_ms").read_text())
        self.node_lag_s = self.period_s = period / 1000.0

    @classmethod
    def probe(cls) -> None:
        if platform.system() != "Linux":
            raise Unavailable("kmod: Linux only")

    def attach(self, pid: int) -> None:
        """Attach, then wait (FIRST_SCAN_WAIT_S at most) for the module's first scan of the
        target: until it ends the module knows only part of the target's pages. With
        ``kinds`` auto, that scan's kinds choose the target's mode (:meth:`choose`): when it is
        not the configured one, the target is attached again in it."""
        self._attach(pid, self.mode)
        choice = self.choose(pid)
        if choice["mode"] != self.mode:
            self.dev.detach(pid)
            self._attach(pid, choice["mode"])
        self.tuning[pid] = choice

    def _attach(self, pid: int, mode: str) -> None:
        self.dev.attach(pid, mode, self.scan_period_ms, self.sample_ratio, self.page_budget,
                        self.attach_flags)
        self.pids.add(pid)
        deadline = time.monotonic() + FIRST_SCAN_WAIT_S
        while not self._scanned(pid) and time.monotonic() < deadline:
            time.sleep(0.01)

    def mode_of(self, pid: int) -> str:
        """The mode ``pid`` is attached in (the configured one until :meth:`attach` chose)."""
        return self.tuning.get(pid, {}).get("mode", self.mode)

    def choose(self, pid: int) -> dict:
        """The mode for attached ``pid``, from the module's last scan of it: the configured
        one, or with ``kinds`` auto in fault mode and no sample ratio or page budget
        configured, KINDS_MODE where its memory in 4 KiB pages (the module's ``pages_shmem``
        + ``pages_file``, and from /proc/PID/smaps the anonymous memory outside huge pages,
        private file mappings' copies among it) is at least KINDS_MIN_BYTES and more than its
        anonymous memory in huge pages. Returns {"mode", "sample_ratio" (the configured one),
        "why", "settled", "small_bytes", "huge_bytes"}; not settled while the target has under
        KINDS_MIN_BYTES of both (a program just started: see :meth:`retune`)."""
        out = {"mode": self.mode, "sample_ratio": self.sample_ratio, "settled": True}
        if self.kinds != "auto":
            return dict(out, why="")  # nothing chosen: nothing to say
        if self.mode != "fault" or not self.has_kinds:
            return dict(out, why=f"{self.mode} mode as configured" + (
                "" if self.has_kinds else " (a module before 0.5 tracks no kinds)"))
        if self.sample_ratio > 1 or self.page_budget:
            return dict(out, why="fault mode as configured (sample_ratio or page_budget given)")
        try:
            st = self.dev.stats(pid)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise
            return dict(out, why="gone")
        mix = memory_mix(pid) or {}
        copies = int(mix.get("anon_file", 0))
        huge = int(mix.get("anon_huge", 0))
        small_anon = max(int(mix.get("anon", 0)) - huge - copies, 0)
        shared = (int(st.get("pages_shmem", 0)) + int(st.get("pages_file", 0))) * 4096
        small = shared + copies + small_anon
        out.update(small_bytes=small, huge_bytes=huge)
        mib = (f"{shared / (1 << 20):.1f} MiB of 4 KiB shmem/file pages"
               + (f", {copies / (1 << 20):.1f} MiB private copies" if copies else "")
               + f", {small_anon / (1 << 20):.1f} MiB 4 KiB anonymous"
               + f", {huge / (1 << 20):.1f} MiB in huge pages")
        if small >= KINDS_MIN_BYTES and small > huge:
            return dict(out, mode=KINDS_MODE,
                        why=f"{mib}: {KINDS_MODE} mode (no hinting faults on 4 KiB pages)")
        settled = max(small, huge) >= KINDS_MIN_BYTES
        return dict(out, settled=settled,
                    why=f"{mib}: fault mode" + ("" if settled else " (too little to tell yet)"))

    def retune(self, pid: int) -> bool:
        """For a target whose choice was not settled: choose again; True when the mode it
        should have differs from its own (the caller attaches it again: detach, attach)."""
        t = self.tuning.get(pid)
        if t is None or t["settled"] or pid not in self.pids:
            return False
        choice = self.choose(pid)
        if choice["mode"] == t["mode"]:
            self.tuning[pid] = choice
            return False
        return True

    def first_estimate_ready(self, pid: int) -> bool | None:
        """Whether a read of ``pid`` now carries the module's frequency estimate of the units
        accessed since attach; None when the module gives none (before 0.3, or probes off).

        The module probes the units a scan lists as accessed. abit: the first scan (which
        attach waits for) lists every unit whose Accessed bit was set since it was touched.
        fault: the first scan only marks the units; the second lists those that faulted since.
        """
        try:
            windows = int((SYSFS / "probe_windows").read_text())
        except (OSError, ValueError):
            windows = 0
        if not self.has_freq or windows <= 0:
            return None
        try:
            return self.dev.stats(pid)["scans"] >= (1 if self.mode_of(pid) == "abit" else 2)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise
            return True

    def _scanned(self, pid: int) -> bool:
        """Whether the module has scanned ``pid`` once (or cannot say: the target is gone)."""
        try:
            return self.dev.stats(pid)["scans"] > 0
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise
            return True

    def detach(self, pid: int) -> None:
        self.pids.discard(pid)
        self._regions.pop(pid, None)
        self.tuning.pop(pid, None)
        try:
            self.dev.detach(pid)
        except KmodError as e:
            if e.errno != errno.ESRCH:  # already gone: the module forgot it
                raise

    def regions(self, pid: int) -> bool:
        """Whether ``pid``'s reads list regions; "auto" decides once, at the first read, from
        the larger of the module's regions and the process's resident memory (a large target's
        first pass spans several scan periods, and its regions are counted when it ends)."""
        if pid not in self._regions:
            use = self.granularity == "region"
            if self.granularity == "auto" and self.has_regions:
                present = self.dev.stats(pid)["regions_tracked"] * uapi.REGION_SIZE
                use = max(present, resident_bytes(pid)) > AUTO_REGION_BYTES
            self._regions[pid] = use
        return self._regions[pid]

    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        # a read before the module's first scan ends lists only the pages scanned so far
        complete = not accessed_only and self._scanned(pid)
        if self.regions(pid):
            rec = self.dev.read_regions(pid, reset=reset, accessed_only=accessed_only)
            return regions_to_sample(pid, rec, complete=complete, freq=self.has_freq,
                                     kinds=self.has_kinds)
        rec = self.dev.read(pid, reset=reset, accessed_only=accessed_only)
        return records_to_sample(pid, rec, complete=complete, freq=self.has_freq,
                                 kinds=self.has_kinds)

    def read_part(self, pid: int, part: int, parts: int) -> Sample | None:
        """Part ``part`` of ``parts`` of ``pid``'s address space, read whole without a reset
        (READ_REGIONS or READ_PAGES over its span: module 0.4 on); None before 0.4 or when the
        process is gone."""
        if not self.has_regions:
            return None
        try:
            lo, hi = mapped_span(pid)
        except OSError:
            return None
        span = part_span(lo, hi, part, parts)
        start, end = span[0], (0 if span[1] >= 1 << 64 else span[1])
        try:
            if self.regions(pid):
                rec = self.dev.read_regions(pid, start=start, end=end)
                return regions_to_sample(pid, rec, complete=True, freq=self.has_freq, span=span,
                                         kinds=self.has_kinds)
            rec = self.dev.read_pages(pid, start, end)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise
            return None  # gone: the daemon's next read finds out
        sample = records_to_sample(pid, rec, complete=True, freq=self.has_freq,
                                   kinds=self.has_kinds)
        sample.span = span
        return sample

    def stats(self, pid: int) -> dict:
        return self.dev.stats(pid)

    def periods(self, pid: int) -> int | None:
        """Scan periods ended for ``pid``: whole passes (``scans``) and periods that stopped at
        the scan budget (``scan_resumes``); either ends with its probes. None once it is gone."""
        try:
            return self.dev.scan_periods(pid)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise
            return None

    def prepare_move(self, pid: int, addrs: np.ndarray) -> None:
        """Before the daemon moves units: pages fault mode left PROT_NONE cannot be moved by
        move_pages on every kernel (6.1), so make them accessible; the next scan marks again."""
        if self.mode_of(pid) != "fault" or not len(addrs):
            return
        try:
            self.dev.unmark(pid, addrs)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise

    def moved(self, pid: int, addrs: np.ndarray, node: int) -> None:
        """After the daemon moved units: the module carries a region whose page table was not
        used over from pass to pass, with the node its pages had; UNMARK (0.4 on) has the next
        pass read the page tables of these units again, so that reads report where they are.
        One address per 2 MiB region is enough."""
        if not self.has_regions or not len(addrs):
            return
        regions = unique(np.asarray(addrs, np.uint64) & ~np.uint64(uapi.REGION_SIZE - 1))
        try:
            self.dev.unmark(pid, regions)
        except KmodError as e:
            if e.errno != errno.ESRCH:
                raise

    def close(self) -> None:
        super().close()
        if getattr(self, "dev", None):
            self.dev.close()
