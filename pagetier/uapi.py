"""The UAPI of pagetier.ko, read from its one header (kmod/include/uapi/linux/pagetier.h).

An installed package carries a copy of the header (pagetier/include/linux/pagetier.h, put there by
setup.py's build step); a checkout reads kmod/'s own. Struct layouts are numpy dtypes; a test
checks them against the built module's DWARF.
"""
from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import numpy as np


def _header() -> Path:
    """The UAPI header: the package's copy if installed, else the source tree's."""
    tree = Path(__file__).resolve().parent.parent / "kmod/include/uapi/linux/pagetier.h"
    packaged = resources.files("pagetier").joinpath("include/linux/pagetier.h")
    if packaged.is_file():
        return Path(str(packaged))
    if tree.is_file():
        return tree
    raise RuntimeError(f"pagetier's UAPI header is missing: neither {packaged} (installed package) "
                       f"nor {tree} (source tree) exists; reinstall pagetier")


HEADER = _header()
_text = HEADER.read_text()


def _define(name: str) -> int:
    m = re.search(rf"^#define {name}\s+(\(1U << \d+\)|\S+)", _text, re.M)
    if not m:
        raise RuntimeError(f"{HEADER}: no #define {name}")
    v = m.group(1)
    m2 = re.fullmatch(r"\(1U << (\d+)\)", v)
    return 1 << int(m2.group(1)) if m2 else int(v.rstrip("U"), 0)


VERSION_MAJOR = _define("PAGETIER_VERSION_MAJOR")
VERSION_MINOR = _define("PAGETIER_VERSION_MINOR")
VERSION_PATCH = _define("PAGETIER_VERSION_PATCH")
VERSION = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"

MODE_FAULT = _define("PAGETIER_MODE_FAULT")
MODE_ABIT = _define("PAGETIER_MODE_ABIT")
MODES = {"fault": MODE_FAULT, "abit": MODE_ABIT}
SCAN_PERIOD_MIN_MS = _define("PAGETIER_SCAN_PERIOD_MIN_MS")
SCAN_PERIOD_MAX_MS = _define("PAGETIER_SCAN_PERIOD_MAX_MS")
SAMPLE_RATIO_MAX = _define("PAGETIER_SAMPLE_RATIO_MAX")
REC_PRESENT = _define("PAGETIER_REC_PRESENT")
REC_HUGE = _define("PAGETIER_REC_HUGE")
REC_ACCESSED = _define("PAGETIER_REC_ACCESSED")
REC_SHMEM = _define("PAGETIER_REC_SHMEM")
REC_FILE = _define("PAGETIER_REC_FILE")
REC_SHARED = _define("PAGETIER_REC_SHARED")
ATTACH_READONLY_FILES = _define("PAGETIER_ATTACH_READONLY_FILES")
NODE_NONE = _define("PAGETIER_NODE_NONE")
READ_RESET = _define("PAGETIER_READ_RESET")
READ_ACCESSED_ONLY = _define("PAGETIER_READ_ACCESSED_ONLY")
REGION_SHIFT = _define("PAGETIER_REGION_SHIFT")
REGION_SIZE = 1 << REGION_SHIFT
REGION_HUGE = _define("PAGETIER_REGION_HUGE")
REGION_ACCESSED = _define("PAGETIER_REGION_ACCESSED")
REGION_MIXED = _define("PAGETIER_REGION_MIXED")
REGION_IDLE = _define("PAGETIER_REGION_IDLE")
REGION_SHMEM = _define("PAGETIER_REGION_SHMEM")
REGION_FILE = _define("PAGETIER_REGION_FILE")
REGION_SHARED = _define("PAGETIER_REGION_SHARED")
IOC_MAGIC = _define("PAGETIER_IOC_MAGIC")
DEVICE = "/dev/pagetier"

_u32, _u64 = np.uint32, np.uint64
VERSION_T = np.dtype([("major", _u32), ("minor", _u32), ("patch", _u32), ("record_size", _u32)])
ATTACH_T = np.dtype(
    [("pid", _u32), ("mode", _u32), ("scan_period_ms", _u32), ("sample_ratio", _u32),
     ("page_budget", _u64), ("flags", _u32), ("reserved0", _u32), ("reserved", _u64, 3)]
)
DETACH_T = np.dtype([("pid", _u32), ("flags", _u32), ("reserved", _u64, 2)])
RECORD_T = np.dtype([("addr", _u64), ("count", _u32), ("node", _u32), ("flags", _u32), ("freq", _u32)])
READ_T = np.dtype(
    [("pid", _u32), ("flags", _u32), ("buf", _u64), ("buf_len", _u64), ("cursor", _u64),
     ("nr_records", _u64), ("reserved", _u64, 2)]
)
STATS_T = np.dtype(
    [("pid", _u32), ("mode", _u32), ("scans", _u64), ("pages_tracked", _u64),
     ("pages_marked", _u64), ("faults", _u64), ("accesses", _u64), ("scan_ns", _u64),
     ("probe_ns", _u64), ("units_probed", _u64), ("walk_entries", _u64), ("scan_resumes", _u64),
     ("regions_tracked", _u64), ("regions_idle", _u64), ("pages_shmem", _u64),
     ("pages_file", _u64)]
)
REGION_T = np.dtype(
    [("addr", _u64), ("count", _u32), ("node", _u32), ("flags", _u32), ("freq", _u32),
     ("nr_present", _u32), ("nr_accessed", _u32), ("idle_passes", _u32), ("reserved", _u32)]
)
READ_RANGE_T = np.dtype(
    [("pid", _u32), ("flags", _u32), ("buf", _u64), ("buf_len", _u64), ("cursor", _u64),
     ("nr_records", _u64), ("start", _u64), ("end", _u64), ("reserved", _u64, 2)]
)
UNMARK_T = np.dtype(
    [("pid", _u32), ("flags", _u32), ("addrs", _u64), ("nr", _u64), ("done", _u64),
     ("reserved", _u64, 2)]
)
UNMARK_MAX = _define("PAGETIER_UNMARK_MAX")
# C struct name -> dtype, for the DWARF check
STRUCTS = {
    "pagetier_version": VERSION_T, "pagetier_attach": ATTACH_T, "pagetier_detach": DETACH_T,
    "pagetier_record": RECORD_T, "pagetier_read": READ_T, "pagetier_stats": STATS_T,
    "pagetier_unmark": UNMARK_T, "pagetier_region": REGION_T,
    "pagetier_read_range": READ_RANGE_T,
}

# asm-generic/ioctl.h encoding (x86)
_IOC_WRITE, _IOC_READ = 1, 2


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (IOC_MAGIC << 8) | nr


IOC_VERSION = _ioc(_IOC_READ, 0, VERSION_T.itemsize)
IOC_ATTACH = _ioc(_IOC_WRITE, 1, ATTACH_T.itemsize)
IOC_DETACH = _ioc(_IOC_WRITE, 2, DETACH_T.itemsize)
IOC_READ = _ioc(_IOC_READ | _IOC_WRITE, 3, READ_T.itemsize)
IOC_STATS = _ioc(_IOC_READ | _IOC_WRITE, 4, STATS_T.itemsize)
IOC_UNMARK = _ioc(_IOC_READ | _IOC_WRITE, 5, UNMARK_T.itemsize)
IOC_READ_REGIONS = _ioc(_IOC_READ | _IOC_WRITE, 6, READ_RANGE_T.itemsize)
IOC_READ_PAGES = _ioc(_IOC_READ | _IOC_WRITE, 7, READ_RANGE_T.itemsize)
