"""The one move_pages wrapper: libnuma's numa_move_pages through ctypes, batched, per-page status.

Every page migration pagetier makes goes through :func:`move` (and every node query through
:func:`query_nodes`). A unit is passed as its start address: the kernel migrates the folio that
backs it, so a 2 MiB THP unit moves as one huge page. A *region* unit (2 MiB of separately
mapped 4 KiB pages, ``region`` True) is passed as its 512 page addresses, and its outcome is
made of theirs (below).

Per-page results, as the kernel reports them in ``status`` (mm/migrate.c, do_pages_move):

========================  ==========  =============================================
status                    outcome     what the daemon does
========================  ==========  =============================================
the destination node      moved       record the move
-EBUSY, -EAGAIN           busy        try again in a later interval
-ENOMEM                   nomem       stop moving for this interval (back off)
-EFAULT, -ENOENT          gone        forget the unit (unmapped, or never touched)
-EACCES (shared page)     failed      (only without CAP_SYS_NICE: below) counted,
                                      left in place
anything else             failed      count it
========================  ==========  =============================================

-EBUSY and -EAGAIN are normal for shared memory and page cache: a folio locked, under writeback,
or dirty on a filesystem that cannot migrate it without writing it back. They are counted by
errno name in :attr:`MoveResult.errors` and never retried within a call: the daemon's next
interval plans again.

Pages mapped by more than one process (shmem segments, shared file mappings, pages a fork
shares) move only with ``MPOL_MF_MOVE_ALL``, which needs CAP_SYS_NICE: with plain
``MPOL_MF_MOVE`` the kernel answers -EACCES for them. That flag changes nothing else
(add_page_for_migration in mm/migrate.c, 6.1 and 6.12, tests it only against the folio's
sharing), so with the capability :func:`move` passes it for every page from the first call:
one call per batch whether or not the profiler knew a page was shared (a second process may
have mapped it since the last scan). Without the capability (:func:`can_move_all`) the shared
pages answer -EACCES: it says so once, in one line, when a page is shared (``shared`` marks
it, or the kernel answered -EACCES), and moves the others.

A region's pages that are -ENOENT or -EFAULT are absent (never touched, or unmapped holes), not
a gone unit: the region is ``gone`` only when all 512 are. It is ``moved`` when every present
page reached the node, but those that failed for good (shared pages: moving the region again
would not move them), with at least one page there; ``nomem`` when a page met ENOMEM or was not
tried, else ``busy`` when a page was busy, else ``failed``. :attr:`MoveResult.region_pages`
counts the region units' pages per outcome (``absent`` for the holes).

When the kernel gives up on a batch part way (it then returns the number of pages it did not
move), the pages it never reached keep the status we pre-filled and count as ``busy``.
A whole-call ENOMEM (the kernel could not allocate the copies) counts as ``nomem`` for
the batch. Other whole-call errors are raised as :class:`MoveError` with a message saying what to do: ESRCH (the
process is gone), EINVAL (it is exiting: its mm is gone), EPERM (moving another user's pages needs CAP_SYS_NICE), EACCES, ENODEV (the
node has no memory or does not exist).
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
from dataclasses import dataclass, field

import numpy as np

from pagetier.core.units import HUGE_PAGES, PAGE_SIZE  # callers size their buffers with PAGE_SIZE
from pagetier.errors import PagetierError, Unavailable

MPOL_MF_MOVE = 1 << 1  # move pages owned only by this process
MPOL_MF_MOVE_ALL = 1 << 2  # move every page (CAP_SYS_NICE)
BATCH = 4096  # pages per numa_move_pages call

_NOT_REACHED = -(1 << 30)  # pre-filled status: the kernel did not get to this page
_NOT_TRIED = _NOT_REACHED + 1  # a page of a call never made (ENOMEM stopped the move first)
CAP_SYS_NICE = 23  # bit of CapEff in /proc/self/status
PROC_STATUS = "/proc/self/status"

log = logging.getLogger("pagetier.mover")
_lib = None
_move_all: bool | None = None  # whether MPOL_MF_MOVE_ALL is allowed; None: not said yet
_cap: bool | None = None  # whether CapEff holds CAP_SYS_NICE; None: not read yet


class MoveError(PagetierError):
    """numa_move_pages failed as a whole; ``errno`` says why."""

    def __init__(self, msg: str, err: int):
        super().__init__(msg)
        self.errno = err


def libnuma():
    """libnuma.so.1 with numa_move_pages bound; Unavailable when it is missing."""
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libnuma.so.1", use_errno=True)
        except OSError as e:
            raise Unavailable(f"libnuma.so.1 is missing ({e}): install libnuma1 (apt install libnuma1)")
        f = lib.numa_move_pages
        # int numa_move_pages(int pid, unsigned long count, void **pages, const int *nodes,
        #                     int *status, int flags)
        f.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_int]
        f.restype = ctypes.c_int
        _lib = lib
    return _lib


def _online_nodes() -> str:
    try:
        with open("/sys/devices/system/node/has_memory") as f:
            return f.read().strip()
    except OSError:
        return "?"


def _call_error(err: int, pid: int, node: int | None) -> MoveError:
    what = f"pid {pid}"
    msgs = {
        errno.ESRCH: f"{what}: no such process (it exited)",
        errno.EPERM: f"{what}: not allowed to move its pages: moving another user's process "
                     "needs root or CAP_SYS_NICE",
        errno.EACCES: f"{what}: node {node} is not allowed for it (cpuset mems?), or a page is "
                      "shared and MPOL_MF_MOVE_ALL is not allowed",
        errno.ENODEV: f"node {node} has no memory or does not exist (nodes with memory: "
                      f"{_online_nodes()}; see numactl -H)",
        errno.E2BIG: f"{what}: too many pages in one call",
        errno.EINVAL: f"{what}: it has no address space (exiting, or a kernel thread), or an "
                      f"invalid argument to move_pages (node {node})",
    }
    msg = msgs.get(err, f"{what}: move_pages failed: {os.strerror(err)}")
    return MoveError(f"move_pages: {msg}", err)


def _raw(pid: int, addrs: np.ndarray, nodes: np.ndarray | None, status: np.ndarray, flags: int) -> int:
    """One numa_move_pages call over contiguous uint64 ``addrs``; returns its result or raises."""
    f = libnuma().numa_move_pages
    ctypes.set_errno(0)
    r = f(pid, len(addrs), addrs.ctypes.data, None if nodes is None else nodes.ctypes.data,
          status.ctypes.data, flags)
    if r < 0:
        raise _call_error(ctypes.get_errno(), pid, None if nodes is None or not len(nodes) else int(nodes[0]))
    return int(r)


def query_nodes(pid: int, addrs: np.ndarray, batch: int = BATCH) -> np.ndarray:
    """Node of each page (int32), or -errno per page (-ENOENT: not present, -EFAULT: unmapped).

    ``pid`` 0 is the calling process.
    """
    addrs = np.ascontiguousarray(addrs, np.uint64)
    out = np.empty(len(addrs), np.int32)
    for s in range(0, len(addrs), batch):
        a = addrs[s:s + batch]
        st = out[s:s + batch]
        st.fill(_NOT_REACHED)
        _raw(pid, a, None, st, 0)
    out[out == _NOT_REACHED] = -errno.EBUSY
    return out


@dataclass
class MoveResult:
    """Indices (into the addresses passed to :func:`move`) of each outcome, plus counters."""

    moved: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    busy: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gone: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    failed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nomem: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # incl. not tried
    stopped: bool = False  # True when ENOMEM made us stop this round
    errors: dict = field(default_factory=dict)  # errno name -> pages
    calls: int = 0
    # 4 KiB pages of the region units per page outcome: moved (on the node after the call),
    # busy, failed, nomem (incl. not tried), absent (-ENOENT/-EFAULT); empty without regions
    region_pages: dict = field(default_factory=dict)


def classify(status: np.ndarray, node: int, offset: int = 0) -> dict[str, np.ndarray]:
    """Split per-page ``status`` (of a move to ``node``) into outcome index arrays."""
    idx = np.arange(offset, offset + len(status), dtype=np.int64)
    moved = status == node
    busy = (status == -errno.EBUSY) | (status == -errno.EAGAIN) | (status == _NOT_REACHED)
    gone = (status == -errno.EFAULT) | (status == -errno.ENOENT)
    nomem = (status == -errno.ENOMEM) | (status == _NOT_TRIED)
    failed = ~(moved | busy | gone | nomem)
    return {"moved": idx[moved], "busy": idx[busy], "gone": idx[gone], "nomem": idx[nomem],
            "failed": idx[failed]}


def page_addresses(addrs: np.ndarray, region: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the page addresses to pass to move_pages: a unit's start address, or a region's 512
    page addresses; the unit of each)."""
    reps = np.where(region, HUGE_PAGES, 1)
    owner = np.repeat(np.arange(len(addrs), dtype=np.int64), reps)
    starts = np.cumsum(reps) - reps
    offset = np.arange(len(owner), dtype=np.int64) - starts[owner]
    return addrs[owner] + offset.astype(np.uint64) * np.uint64(PAGE_SIZE), owner


def _has_cap_sys_nice() -> bool:
    """Whether this process's effective capabilities hold CAP_SYS_NICE (read once)."""
    global _cap
    if _cap is None:
        try:
            with open(PROC_STATUS) as f:
                caps = next((ln.split()[1] for ln in f if ln.startswith("CapEff:")), "0")
            _cap = bool(int(caps, 16) >> CAP_SYS_NICE & 1)
        except (OSError, ValueError):
            _cap = os.geteuid() == 0
    return _cap


def _move_all_quiet() -> bool:
    """Whether MPOL_MF_MOVE_ALL may be passed, without the warning (private pages need no word
    of it): what the kernel answered before, else the capability."""
    return _move_all if _move_all is not None else _has_cap_sys_nice()


def can_move_all() -> bool:
    """Whether this process may pass MPOL_MF_MOVE_ALL (it has CAP_SYS_NICE); the first time it
    may not, one line says what that leaves undone."""
    if _move_all is None:
        _set_move_all(_has_cap_sys_nice())
    return bool(_move_all)


def _set_move_all(allowed: bool) -> None:
    global _move_all
    if not allowed and _move_all is not False:
        log.warning("move_pages: no CAP_SYS_NICE, so no MPOL_MF_MOVE_ALL: pages mapped by "
                    "several processes (shared memory, shared file mappings) stay where they "
                    "are; run the daemon as root to move them")
    _move_all = allowed


def _run(pid: int, addrs: np.ndarray, node: int, flags: int, batch: int, status: np.ndarray,
         sel: np.ndarray, res: MoveResult) -> bool:
    """Move the pages ``addrs[sel]``, ``batch`` per call, their per-page results written to
    ``status[sel]``. False when a batch met ENOMEM (the calls stop there: the pages not sent
    keep _NOT_TRIED). A call with MPOL_MF_MOVE_ALL refused (EPERM: no CAP_SYS_NICE) is made
    again without it."""
    a = np.ascontiguousarray(addrs[sel])
    st = np.full(len(a), _NOT_TRIED, np.int32)
    nodes = np.full(min(len(a), batch), node, np.int32)
    ok = True
    for s in range(0, len(a), batch):
        e = min(len(a), s + batch)
        st[s:e] = _NOT_REACHED
        try:
            try:
                _raw(pid, a[s:e], nodes[:e - s], st[s:e], flags)
            except MoveError as err:
                if not (flags & MPOL_MF_MOVE_ALL and err.errno == errno.EPERM):
                    raise
                st[s:e] = _NOT_REACHED
                _raw(pid, a[s:e], nodes[:e - s], st[s:e], flags & ~MPOL_MF_MOVE_ALL)
                # allowed without the flag: it was the flag the kernel refused
                _set_move_all(False)
                flags &= ~MPOL_MF_MOVE_ALL
        except MoveError as err:
            if err.errno != errno.ENOMEM:
                raise
            st[s:e] = -errno.ENOMEM  # no memory for the copies: the node is full
        res.calls += 1
        if (st[s:e] == -errno.ENOMEM).any():
            ok = False
            break
    status[sel] = st
    return ok


def move(pid: int, addrs: np.ndarray, node: int, flags: int = MPOL_MF_MOVE,
         batch: int = BATCH, region: np.ndarray | None = None,
         shared: np.ndarray | None = None) -> MoveResult:
    """Move the units starting at ``addrs`` of process ``pid`` to ``node``, ``batch`` pages
    per call. ``region``: which units are regions (bool; None: none), moved page by page.
    ``shared``: which units are mapped by more than one process (bool; None: none known).
    With CAP_SYS_NICE every page goes with MPOL_MF_MOVE_ALL (shared or not: one call per
    batch); without it a shared page stays, and the first one says so (module docstring).

    Stops after the batch in which a page failed with ENOMEM (the rest count as ``nomem``).
    Raises MoveError for whole-call failures (see the module docstring).
    """
    addrs = np.ascontiguousarray(addrs, np.uint64)
    n_units = len(addrs)
    owner = None
    if region is not None and len(region) and np.asarray(region, bool).any():
        addrs, owner = page_addresses(addrs, np.asarray(region, bool))
    n = len(addrs)
    marked = shared is not None and len(shared) == n_units and bool(np.any(shared))
    status = np.full(n, _NOT_TRIED, np.int32)
    res = MoveResult()
    move_all = bool(flags & MPOL_MF_MOVE_ALL) or _move_all_quiet()
    ok = _run(pid, addrs, node, flags | MPOL_MF_MOVE_ALL if move_all else flags, batch, status,
              np.arange(n), res)
    if marked or (status == -errno.EACCES).any():
        can_move_all()  # shared pages met: without the capability, one line says so
    res.stopped = not ok
    pages = classify(status, node)
    if owner is None:
        for k, v in pages.items():
            setattr(res, k, v)
    else:
        _region_outcomes(res, pages, owner, region, n_units)
    tried = status[status != _NOT_TRIED]
    for code in np.unique(tried[(tried < 0) & (tried != _NOT_REACHED)]):
        res.errors[errno.errorcode.get(-int(code), str(-int(code)))] = int((tried == code).sum())
    if (tried == _NOT_REACHED).any():
        res.errors["not reached"] = int((tried == _NOT_REACHED).sum())
    return res


def _region_outcomes(res: MoveResult, pages: dict, owner: np.ndarray, region: np.ndarray,
                     n_units: int) -> None:
    """Units' outcomes from their pages' (``pages``: outcome -> page indices; ``owner``: the
    unit of each page), by the rules in the module docstring; a unit of one page takes its
    page's outcome."""
    per = {k: np.bincount(owner[v], minlength=n_units) for k, v in pages.items()}
    total = np.bincount(owner, minlength=n_units)
    gone = per["gone"] == total
    nomem = ~gone & (per["nomem"] > 0)
    busy = ~gone & ~nomem & (per["busy"] > 0)
    moved = ~gone & ~nomem & ~busy & (per["moved"] > 0)
    failed = ~(gone | nomem | busy | moved)
    for k, m in (("moved", moved), ("busy", busy), ("gone", gone), ("nomem", nomem),
                 ("failed", failed)):
        setattr(res, k, np.flatnonzero(m).astype(np.int64))
    reg = np.asarray(region, bool)
    res.region_pages = {("absent" if k == "gone" else k): int(per[k][reg].sum()) for k in per}
