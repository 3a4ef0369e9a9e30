"""The mover's choice of move_pages flags for shared pages, and its per-page errno counts
(pagetier/core/mover.py), against a stand-in kernel."""
from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

from pagetier.core import mover

PAGE = 4096
HUGE = 2 << 20
BASE = 0x7F0000000000


class Kernel:
    """move_pages as the kernel answers it: a page in ``shared`` moves only with
    MPOL_MF_MOVE_ALL (else -EACCES), a page in ``busy`` answers its errno every time;
    ``perm``: a call with MPOL_MF_MOVE_ALL fails with EPERM (no CAP_SYS_NICE). Records each
    call's (addresses, flags)."""

    def __init__(self, shared=(), busy=None, perm=False):
        self.shared, self.busy, self.perm = set(shared), dict(busy or {}), perm
        self.calls: list[tuple[list[int], int]] = []

    def __call__(self, pid, addrs, nodes, status, flags):
        if self.perm and flags & mover.MPOL_MF_MOVE_ALL:
            raise mover.MoveError("move_pages: not allowed", errno.EPERM)
        self.calls.append((addrs.tolist(), flags))
        for i, a in enumerate(addrs.tolist()):
            if a in self.busy:
                status[i] = -self.busy[a]
            elif a in self.shared and not flags & mover.MPOL_MF_MOVE_ALL:
                status[i] = -errno.EACCES
            else:
                status[i] = int(nodes[i])
        return 0

    def sent(self, flags=None) -> list[int]:
        return [a for addrs, f in self.calls for a in addrs if flags is None or f == flags]


@pytest.fixture
def kernel(monkeypatch):
    def make(**kw):
        k = Kernel(**kw)
        monkeypatch.setattr(mover, "_raw", k)
        return k
    monkeypatch.setattr(mover, "_move_all", True)
    monkeypatch.setattr(mover, "_cap", True)
    return make


ALL = mover.MPOL_MF_MOVE | mover.MPOL_MF_MOVE_ALL


def units(n):
    return np.array([BASE + i * PAGE for i in range(n)], np.uint64)


def test_with_the_capability_every_page_goes_with_move_all_in_one_call(kernel):
    """Shared pages, marked or not (a second process may map a page after the scan that saw
    it alone): one call, MPOL_MF_MOVE_ALL, every page moved; no page sent twice."""
    k = kernel(shared=[BASE + PAGE, BASE + 2 * PAGE])
    res = mover.move(1, units(4), 0, shared=np.array([False, True, False, False]))
    assert res.moved.tolist() == [0, 1, 2, 3] and not res.errors
    assert [f for _, f in k.calls] == [ALL] and k.sent() == units(4).tolist()


def test_a_region_marked_shared_sends_its_pages_with_move_all(kernel):
    k = kernel(shared=[BASE + HUGE + 3 * PAGE])
    addrs = np.array([BASE, BASE + HUGE], np.uint64)
    res = mover.move(1, addrs, 0, region=np.array([True, True]), shared=np.array([False, True]))
    assert res.moved.tolist() == [0, 1] and res.region_pages["moved"] == 1024
    assert len(k.sent(ALL)) == 1024 == len(k.sent())


def test_batches_are_one_call_each(kernel):
    k = kernel(shared=[BASE + 5 * PAGE])
    res = mover.move(1, units(8), 0, batch=3)
    assert res.moved.tolist() == list(range(8)) and res.calls == 3 == len(k.calls)


def test_without_the_capability_it_says_so_once_and_moves_what_it_can(kernel, monkeypatch,
                                                                      caplog, tmp_path):
    (tmp_path / "status").write_text("CapEff:\t0000000000000000\n")  # no CAP_SYS_NICE
    monkeypatch.setattr(mover, "PROC_STATUS", str(tmp_path / "status"))
    monkeypatch.setattr(mover, "_move_all", None)
    monkeypatch.setattr(mover, "_cap", None)
    k = kernel(shared=[BASE, BASE + 3 * PAGE])
    with caplog.at_level(logging.WARNING, logger="pagetier.mover"):
        for _ in range(3):
            res = mover.move(1, units(4), 0, shared=np.array([True, False, False, False]))
            assert res.moved.tolist() == [1, 2] and res.failed.tolist() == [0, 3]
            assert res.errors == {"EACCES": 2}
    assert caplog.text.count("no CAP_SYS_NICE") == 1
    assert not k.sent(ALL)  # never asked for what it cannot have


def test_move_all_refused_eperm_falls_back_to_a_plain_move(kernel, caplog):
    """The kernel refuses MPOL_MF_MOVE_ALL (EPERM): the same pages go without it, the shared
    one is counted as EACCES, one line says why, and later moves do not ask again."""
    k = kernel(shared=[BASE], perm=True)
    with caplog.at_level(logging.WARNING, logger="pagetier.mover"):
        res = mover.move(1, units(3), 0, shared=np.array([True, False, False]))
        res2 = mover.move(1, units(3), 0)
    assert res.moved.tolist() == [1, 2] and res.failed.tolist() == [0]
    assert res.errors == {"EACCES": 1} and res2.errors == {"EACCES": 1}
    assert caplog.text.count("no CAP_SYS_NICE") == 1
    assert all(f == mover.MPOL_MF_MOVE for _, f in k.calls)
    assert mover.can_move_all() is False


@pytest.mark.parametrize("err", [errno.EBUSY, errno.EAGAIN])
def test_busy_page_cache_pages_are_counted_by_errno_and_not_retried(kernel, err):
    """-EBUSY / -EAGAIN (a locked, dirty or under-writeback page-cache folio): counted by name,
    the unit busy, each page sent once."""
    k = kernel(busy={BASE + PAGE: err, BASE + 2 * PAGE: err})
    res = mover.move(1, units(4), 0, batch=2)
    assert res.busy.tolist() == [1, 2] and res.moved.tolist() == [0, 3]
    assert res.errors == {errno.errorcode[err]: 2}
    assert sorted(k.sent()) == units(4).tolist()


def test_counts_of_mixed_outcomes_by_errno_name(kernel):
    k = kernel(shared=[BASE + 3 * PAGE], busy={BASE: errno.EBUSY, BASE + PAGE: errno.EAGAIN,
                                               BASE + 2 * PAGE: errno.ENOENT})
    res = mover.move(1, units(5), 0)
    assert res.errors == {"EBUSY": 1, "EAGAIN": 1, "ENOENT": 1}
    assert res.moved.tolist() == [3, 4] and res.busy.tolist() == [0, 1]
    assert res.gone.tolist() == [2]
    assert len(k.calls) == 1  # the shared page in the same call, with MPOL_MF_MOVE_ALL


def test_enomem_stops_the_move(kernel, monkeypatch):
    """ENOMEM ends the move: the batches after it are not sent and count as nomem; without
    the capability the shared page in the batch sent is counted as EACCES."""
    k = kernel(shared=[BASE], busy={BASE + PAGE: errno.ENOMEM})
    monkeypatch.setattr(mover, "_move_all", False)
    res = mover.move(1, units(4), 0, batch=2)
    assert res.stopped and res.nomem.tolist() == [1, 2, 3] and res.failed.tolist() == [0]
    assert len(k.calls) == 1 and res.errors == {"EACCES": 1, "ENOMEM": 1}


@pytest.mark.parametrize("capeff,want", [("0000003fffffffff", True), ("0000000000000000", False),
                                         ("0000000000800000", True)])
def test_can_move_all_reads_cap_sys_nice(tmp_path, monkeypatch, capeff, want):
    status = tmp_path / "status"
    status.write_text(f"Name:\tpagetier\nCapInh:\t0000000000000000\nCapEff:\t{capeff}\n")
    monkeypatch.setattr(mover, "PROC_STATUS", str(status))
    monkeypatch.setattr(mover, "_move_all", None)
    monkeypatch.setattr(mover, "_cap", None)
    assert mover.can_move_all() is want


def test_private_memory_never_asks_for_the_capability(kernel, monkeypatch, caplog, tmp_path):
    """Moving private pages says nothing of CAP_SYS_NICE, even without it."""
    (tmp_path / "status").write_text("CapEff:\t0000000000000000\n")
    monkeypatch.setattr(mover, "PROC_STATUS", str(tmp_path / "status"))
    monkeypatch.setattr(mover, "_move_all", None)
    monkeypatch.setattr(mover, "_cap", None)
    k = kernel()
    with caplog.at_level(logging.WARNING, logger="pagetier.mover"):
        res = mover.move(1, units(4), 0)
    assert res.moved.tolist() == [0, 1, 2, 3] and not caplog.text
    assert mover._move_all is None and [f for _, f in k.calls] == [mover.MPOL_MF_MOVE]
