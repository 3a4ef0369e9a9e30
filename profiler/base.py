"""The profiler interface: attach to PIDs, read per-page access counts per interval, detach.

Backends register by name with ``@register("name")`` in their own module; ``create(name)``
imports and probes them, raising Unavailable with a clear message when the kernel lacks
what a backend needs.
"""
from __future__ import annotations

import importlib
import os
from abc import ABC, abstractmethod

import numpy as np


# Sample and the page sizes live in the core (the daemon and the policies use them too); the
# backends import them from here
from pagetier.core.arrays import unique
from pagetier.core.sample import Sample  # noqa: F401
from pagetier.core.units import HUGE_PAGES, HUGE_SIZE, PAGE_SIZE  # noqa: F401
from pagetier.core.registry import registrar
from pagetier.errors import ConfigError, PagetierError

# /proc/kpageflags bits (include/uapi/linux/kernel-page-flags.h)
KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL, KPF_THP = 15, 16, 22
_PM_PRESENT, _PM_PFN_MASK = 1 << 63, (1 << 55) - 1

PROFILERS: dict[str, type["Profiler"]] = {}
# Backends live in modules named after them; importing one registers it.
_BACKEND_MODULES = {"kmod": "pagetier.profiler.kmod", "stub": "pagetier.profiler.stub",
                    "damon": "pagetier.profiler.damon", "bpf": "pagetier.profiler.bpf",
                    "replay": "pagetier.profiler.replay"}


register = registrar(PROFILERS)  # @register("name") on a class


def create(name: str, **options) -> "Profiler":
    """Instantiate backend ``name`` after probing that this kernel supports it."""
    if name not in PROFILERS and name in _BACKEND_MODULES:
        importlib.import_module(_BACKEND_MODULES[name])
    if name not in PROFILERS:
        known = ", ".join(sorted(set(PROFILERS) | set(_BACKEND_MODULES)))
        raise ConfigError(f"unknown profiler backend {name!r} (known: {known})")
    cls = PROFILERS[name]
    cls.probe()
    return cls(**options)


class Profiler(ABC):
    """A source of per-page access counts."""

    name = "?"
    # How old a Sample's node may be (the backend observes nodes when it scans); the daemon
    # keeps its own record of a unit it moved for that long.
    node_lag_s = 0.0
    # A backend whose estimates come at the end of each sampling period (kmod: a scan and its
    # frequency probes): that period in seconds (0: none). The daemon reads right after a
    # period ends (see ``periods``), so that its reads carry the newest estimates.
    period_s = 0.0

    @classmethod
    def probe(cls) -> None:
        """Raise pagetier.errors.Unavailable naming what this kernel lacks; default: nothing."""

    @abstractmethod
    def attach(self, pid: int) -> None: ...

    @abstractmethod
    def detach(self, pid: int) -> None: ...

    @abstractmethod
    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        """Counts since the last reset; ``reset`` starts a new interval."""

    def read_part(self, pid: int, part: int, parts: int) -> Sample | None:
        """A complete read of part ``part`` (0 <= part < parts) of ``pid``'s tracked address
        space, without starting a new interval (no reset); None: this backend cannot (the
        default), and the daemon reads everything now and then instead.

        The Sample is ``complete`` and its ``span`` says which addresses ``[start, end)`` it
        covers: it lists every unit starting there, with its node, npages and region flag (the
        daemon takes no counts from it: the accessed-only reads bring those). The spans of
        parts 0 .. parts-1 together cover every address (part 0 starting at 0, the last ending
        at 1 << 64), so that a unit is seen once every ``parts`` reads however the layout
        changes. The units are those of the backend's other reads (regions when it lists
        regions)."""
        return None

    def stats(self, pid: int) -> dict:
        return {}

    def periods(self, pid: int) -> int | None:
        """How many sampling periods have ended for ``pid`` (a read right after one carries its
        estimates); None when the backend has no periods or cannot say (the target is gone)."""
        return None

    def close(self) -> None:
        """Detach from every pid in ``self.pids``; safe to call twice. Backends that hold more
        call this first, then release their own resources."""
        for pid in list(getattr(self, "pids", ())):
            try:
                self.detach(pid)
            except PagetierError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def part_span(lo: int, hi: int, part: int, parts: int) -> tuple[int, int]:
    """Span of part ``part`` of ``parts`` of the addresses ``[lo, hi)`` cut at 2 MiB
    boundaries: about equal pieces, part 0 from address 0 and the last to 1 << 64 (see
    :meth:`Profiler.read_part`)."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} of {parts}")
    lo = lo // HUGE_SIZE
    blocks = max(0, -(-hi // HUGE_SIZE) - lo)

    def cut(k: int) -> int:
        return (lo + blocks * k // parts) * HUGE_SIZE

    start = 0 if part == 0 else cut(part)
    end = 1 << 64 if part == parts - 1 else cut(part + 1)
    return start, end


def in_span(sample: Sample, span: tuple[int, int]) -> Sample:
    """The units of ``sample`` starting in ``span``, as a complete sample of that span."""
    start, end = span
    a = sample.addr
    lo = int(np.searchsorted(a, np.uint64(start))) if start > 0 else 0
    hi = len(a) if end >= 1 << 64 else int(np.searchsorted(a, np.uint64(end)))
    return sample.take(slice(lo, hi), complete=True, span=(int(start), int(end)))


# --- the same units from every backend -------------------------------------------------------
def _pagemap_pfns(fd: int, vaddrs: np.ndarray) -> np.ndarray:
    """PFN of each virtual page (0: not present, or not allowed to see PFNs)."""
    out = np.zeros(len(vaddrs), np.uint64)
    for i, va in enumerate(vaddrs.tolist()):
        raw = os.pread(fd, 8, (va // PAGE_SIZE) * 8)
        if len(raw) == 8:
            e = int.from_bytes(raw, "little")
            if e & _PM_PRESENT:
                out[i] = e & _PM_PFN_MASK
    return out


def thp_blocks(pid: int, addrs: np.ndarray) -> np.ndarray:
    """The 2 MiB-aligned blocks, among those holding ``addrs``, that one transparent huge page
    backs whole: their starts, sorted (uint64).

    A block counts when /proc/PID/pagemap maps its first 4 KiB page to the head of a THP
    (/proc/kpageflags: THP and COMPOUND_HEAD) and its last page to the PFN 511 further on, a tail
    of a THP: one 2 MiB folio mapped in order, which is what the kernel maps with one PMD (the
    unit pagetier.ko reports with REC_HUGE). PFNs need CAP_SYS_ADMIN; without it, or without
    /proc/kpageflags, no block is found and every address stays its own 4 KiB unit.
    """
    addrs = np.asarray(addrs, np.uint64)
    if not len(addrs):
        return np.zeros(0, np.uint64)
    bases = unique(addrs & ~np.uint64(HUGE_SIZE - 1))
    try:
        pm = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    except OSError:
        return np.zeros(0, np.uint64)
    try:
        kf = os.open("/proc/kpageflags", os.O_RDONLY)
    except OSError:
        os.close(pm)
        return np.zeros(0, np.uint64)
    try:
        head = _pagemap_pfns(pm, bases)
        tail = _pagemap_pfns(pm, bases + np.uint64(HUGE_SIZE - PAGE_SIZE))
        ok = (head > 0) & (tail == head + np.uint64(HUGE_PAGES - 1))
        keep = []
        for b, h, t in zip(bases[ok].tolist(), head[ok].tolist(), tail[ok].tolist()):
            fh = int.from_bytes(os.pread(kf, 8, h * 8) or b"\0" * 8, "little")
            ft = int.from_bytes(os.pread(kf, 8, t * 8) or b"\0" * 8, "little")
            if (fh >> KPF_THP & 1 and fh >> KPF_COMPOUND_HEAD & 1
                    and ft >> KPF_THP & 1 and ft >> KPF_COMPOUND_TAIL & 1):
                keep.append(b)
    except OSError:  # the process exited while we read
        keep = []
    finally:
        os.close(pm)
        os.close(kf)
    return np.array(keep, np.uint64)


def _folded_kinds(sample: Sample, rows: np.ndarray, inv: np.ndarray, n: int, keep: np.ndarray,
                  order: np.ndarray) -> dict:
    """``kind`` and ``shared`` of a sample whose ``rows`` were folded into ``n`` units (``inv``:
    each row's unit) placed after the ``keep`` rows, all then put in ``order``: a unit is of
    the highest kind among its rows (file over shmem over anon, as pagetier.ko's regions) and
    shared if any row is. Empty where the sample does not tell."""
    out = {}
    if len(sample.kind) == len(sample):
        k = np.zeros(n, np.uint8)
        np.maximum.at(k, inv, sample.kind[rows])
        out["kind"] = np.concatenate([sample.kind[keep], k])[order]
    if len(sample.shared) == len(sample):
        sh = np.zeros(n, bool)
        np.logical_or.at(sh, inv, sample.shared[rows])
        out["shared"] = np.concatenate([sample.shared[keep], sh])[order]
    return out


def huge_units(sample: Sample, blocks: np.ndarray, how: str = "sum") -> Sample:
    """``sample`` with its 4 KiB rows inside ``blocks`` (2 MiB starts, as from
    :func:`thp_blocks`) folded into one 2 MiB unit each (npages 512).

    ``how`` combines the rows of one block: ``"sum"`` adds counts and freq (events counted per
    4 KiB address, such as page faults, that all belong to the one huge mapping), ``"mean"``
    averages them weighted by pages (per-page estimates of the one mapping's rate, such as
    DAMON's). A unit's node is its first row's.
    """
    if not len(blocks) or not len(sample):
        return sample
    blocks = np.asarray(blocks, np.uint64)
    base = sample.addr & ~np.uint64(HUGE_SIZE - 1)
    j = np.searchsorted(blocks, base)
    inside = (j < len(blocks)) & (blocks[np.minimum(j, len(blocks) - 1)] == base)
    inside &= sample.npages == 1
    if not inside.any():
        return sample
    has_freq = len(sample.freq) == len(sample)
    ub, first, inv = np.unique(base[inside], return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    n = len(ub)
    cnt = np.zeros(n, np.float64)
    np.add.at(cnt, inv, sample.count[inside].astype(np.float64))
    frq = np.zeros(n, np.float64)
    if has_freq:
        np.add.at(frq, inv, sample.freq[inside].astype(np.float64))
    if how == "mean":
        rows = np.bincount(inv, minlength=n).astype(np.float64)
        cnt /= rows
        frq /= rows
    elif how != "sum":
        raise ValueError(f"huge_units: how={how!r}")
    out = ~inside
    addr = np.concatenate([sample.addr[out], ub])
    order = np.argsort(addr, kind="stable")
    cat = lambda a, b: np.concatenate([a[out], b])[order]  # noqa: E731
    return Sample(
        pid=sample.pid, addr=addr[order],
        count=cat(sample.count, np.minimum(np.round(cnt), 2**32 - 1).astype(np.uint32)),
        node=cat(sample.node, sample.node[inside][first]),
        npages=cat(sample.npages, np.full(n, HUGE_PAGES, np.uint16)),
        complete=sample.complete,
        freq=cat(sample.freq, frq.astype(np.float32)) if has_freq else np.zeros(0, np.float32),
        **_folded_kinds(sample, inside, inv, n, out, order))


def region_units(sample: Sample) -> Sample:
    """``sample`` with its 4 KiB rows (npages 1) folded into one region unit per 2 MiB block
    (npages 512, ``region`` True): counts and freq summed over the block's rows, its node the
    one most of them are on. Units of 512 pages (huge mappings) stay as they are."""
    if not len(sample):
        return sample
    small = sample.npages == 1
    if not small.any():
        return sample
    base = sample.addr & ~np.uint64(HUGE_SIZE - 1)
    ub, inv = np.unique(base[small], return_inverse=True)
    inv = inv.reshape(-1)
    n = len(ub)
    cnt = np.bincount(inv, weights=sample.count[small].astype(np.float64), minlength=n)
    has_freq = len(sample.freq) == len(sample)
    frq = (np.bincount(inv, weights=sample.freq[small].astype(np.float64), minlength=n)
           if has_freq else None)
    nodes = sample.node[small].astype(np.int64)
    if len(nodes) and (nodes == nodes[0]).all():
        node = np.full(n, nodes[0], np.int16)
    else:  # the most frequent node of each block (ties: the lower node)
        span_ = int(nodes.max()) + 2
        votes = np.bincount(inv * span_ + (nodes + 1), minlength=n * span_).reshape(n, span_)
        node = (votes.argmax(axis=1) - 1).astype(np.int16)
    keep = ~small
    addr = np.concatenate([sample.addr[keep], ub])
    order = np.argsort(addr, kind="stable")
    cat = lambda a, b: np.concatenate([a[keep], b])[order]  # noqa: E731
    region = np.concatenate([sample.regions()[keep], np.ones(n, bool)])[order]
    return Sample(
        pid=sample.pid, addr=addr[order],
        count=cat(sample.count, np.minimum(cnt, 2**32 - 1).astype(np.uint32)),
        node=cat(sample.node, node),
        npages=cat(sample.npages, np.full(n, HUGE_PAGES, np.uint16)),
        complete=sample.complete,
        freq=cat(sample.freq, frq.astype(np.float32)) if has_freq else np.zeros(0, np.float32),
        region=region, span=sample.span, **_folded_kinds(sample, small, inv, n, keep, order))
