"""Region units (2 MiB of separately mapped 4 KiB pages) and the complete read spread over
parts: the stub's region granularity and parts, the state's flag and span reads, the mover's
and the executor's page-by-page moves, and the daemon reading one part per interval. No root,
no VM (move_pages is replaced by a fake kernel)."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from pagetier.core import mover
from pagetier.core.sample import Sample
from pagetier.core.state import DTYPE, F_REGION, PageState
from pagetier.daemon import config as config_mod
from pagetier.daemon.clock import FakeClock
from pagetier.daemon.executor import Executor, new_tally
from pagetier.daemon.loop import FULL_READ_EVERY, Daemon
from pagetier.errors import ConfigError
from pagetier.policies.base import Decision, Policy, register
from pagetier.profiler.base import part_span, region_units
from pagetier.profiler.stub import StubProfiler

PAGE, HUGE = 4096, 2 << 20
BASE = 0x7F0000000000


def pages(first: int, n: int) -> np.ndarray:
    return np.uint64(BASE) + (np.uint64(first) + np.arange(n, dtype=np.uint64)) * np.uint64(PAGE)


# --------------------------------------------------------------------------- the profiler side
def test_region_units_fold_pages_per_2mib_block():
    """4 KiB rows become one region per 2 MiB block: counts summed, the node most pages are on,
    npages 512, region True; a huge mapping stays as it is."""
    addr = np.concatenate([pages(0, 3), pages(512 + 7, 2), [np.uint64(BASE + 4 * HUGE)]])
    s = Sample(pid=1, addr=addr, count=np.array([1, 2, 3, 4, 5, 6], np.uint32),
               node=np.array([0, 1, 1, 0, 0, 1], np.int16),
               npages=np.array([1, 1, 1, 1, 1, 512], np.uint16))
    r = region_units(s)
    assert r.addr.tolist() == [BASE, BASE + HUGE, BASE + 4 * HUGE]
    assert r.count.tolist() == [6, 9, 6]
    assert r.node.tolist() == [1, 0, 1]
    assert r.npages.tolist() == [512, 512, 512]
    assert r.region.tolist() == [True, True, False]


def test_stub_parts_cover_every_unit_once():
    """The parts of the stub's reads cover every unit exactly once, each read complete over its
    span, and reading them starts no new interval."""
    addr = np.concatenate([pages(0, 700), pages(5000, 3), pages(90000, 1)])
    prof = StubProfiler(intervals=[(addr, 1)], granularity="region")
    prof.attach(7)
    whole = prof.read(7, reset=False)
    got = []
    for k in range(16):
        p = prof.read_part(7, k, 16)
        assert p.complete and p.span is not None
        assert all(p.span[0] <= a < p.span[1] for a in p.addr.tolist())
        got += p.addr.tolist()
    assert sorted(got) == whole.addr.tolist() and len(got) == len(set(got))
    assert prof.stats(7)["reads"] == 0
    spans = [part_span(BASE, BASE + 100 * HUGE, k, 4) for k in range(4)]
    assert spans[0][0] == 0 and spans[-1][1] == 1 << 64
    assert all(a[1] == b[0] and a[1] % HUGE == 0 for a, b in zip(spans, spans[1:]))


def test_stub_granularity_is_checked():
    with pytest.raises(ConfigError, match="granularity 'huge'"):
        StubProfiler(granularity="huge")


# --------------------------------------------------------------------------- the state
def test_state_keeps_the_region_flag_in_its_36_byte_row():
    st = PageState()
    st.begin_interval()
    st.update(Sample(pid=1, addr=np.array([BASE, BASE + HUGE], np.uint64),
                     count=np.array([5, 0], np.uint32), node=np.array([1, 1], np.int16),
                     npages=np.array([512, 512], np.uint16), region=np.array([True, False])))
    assert DTYPE.itemsize == 36
    assert st.is_region(np.arange(2)).tolist() == [True, False]
    assert st.pages_on(1) == 1024
    # the same address later reported as one huge mapping, then as a 4 KiB page
    st.begin_interval()
    st.update(Sample(pid=1, addr=np.array([BASE], np.uint64), count=np.array([1], np.uint32),
                     node=np.array([1], np.int16), npages=np.array([512], np.uint16),
                     region=np.array([False]), complete=False))
    assert not st.is_region(np.array([0]))[0]
    st.begin_interval()
    st.update(Sample(pid=1, addr=np.array([BASE + HUGE], np.uint64), count=np.array([1], np.uint32),
                     node=np.array([1], np.int16), npages=np.array([1], np.uint16),
                     complete=False))
    assert st.npages.tolist() == [512, 1] and not st.is_region(np.arange(2)).any()


def test_sync_forgets_absent_units_in_its_span_only_and_takes_no_counts():
    """A part read forgets the target's units in its span that it lacks, adds its new units
    cold, takes nodes and sizes, and leaves units outside its span and other targets alone."""
    st = PageState()
    st.begin_interval()
    a = np.uint64(BASE) + np.arange(8, dtype=np.uint64) * np.uint64(HUGE)
    for pid in (1, 2):
        st.update(Sample(pid=pid, addr=a, count=np.full(8, 3, np.uint32),
                         node=np.ones(8, np.int16), npages=np.full(8, 512, np.uint16),
                         region=np.ones(8, bool)))
    heat = st.heat.copy()
    span = (BASE + 2 * HUGE, BASE + 5 * HUGE)  # units 2, 3, 4
    keep = np.array([a[2], a[4], a[4] + np.uint64(HUGE // 2)], np.uint64)  # 3 gone, one new
    st.sync(Sample(pid=1, addr=keep, count=np.full(3, 99, np.uint32),
                   node=np.array([0, 1, 1], np.int16), npages=np.array([512, 512, 1], np.uint16),
                   region=np.array([True, True, False]), span=span))
    mine = st.addr[st.target == 0]
    assert a[3] not in mine and len(mine) == 8
    assert (st.target == 1).sum() == 8  # the other target untouched
    i = int(np.flatnonzero((st.target == 0) & (st.addr == a[2]))[0])
    assert st.node[i] == 0 and st.heat[i] == heat[2]  # node taken, no counts
    new = int(np.flatnonzero(st.addr == keep[2])[0])
    assert st.heat[new] == 0 and st.count[new] == 0 and st.npages[new] == 1
    assert st.pages_on(1) == 512 * 6 + 1 + 512 * 8 and st.pages_on(0) == 512


# --------------------------------------------------------------------------- moves
class FakeKernel:
    """move_pages of a process: each page address gives ``status(addr)``; records the calls."""

    def __init__(self, status):
        self.status, self.calls = status, []

    def __call__(self, pid, addrs, nodes, status, flags):
        self.calls.append(np.array(addrs))
        for i, a in enumerate(addrs.tolist()):
            status[i] = self.status(a, int(nodes[i]))
        return 0


def test_mover_moves_a_region_page_by_page(monkeypatch):
    """A region is passed as its 512 pages: holes (-ENOENT/-EFAULT) are absent pages, not a gone
    unit; a region all holes is gone; a busy page keeps the region from counting as moved; a
    shared page (-EACCES) does not; pages are counted per outcome."""
    r0, r1, r2, r3 = (BASE + k * HUGE for k in range(4))

    def status(a, node):
        if r0 <= a < r0 + 100 * PAGE:
            return node
        if r0 <= a < r1:
            return -errno.ENOENT  # the rest of region 0: never touched
        if r1 <= a < r2:
            return -errno.EFAULT  # region 1: all unmapped
        if a == r2 + 5 * PAGE:
            return -errno.EBUSY
        if a == r3 + 7 * PAGE:
            return -errno.EACCES
        return node

    k = FakeKernel(status)
    monkeypatch.setattr(mover, "_raw", k)
    monkeypatch.setattr(mover, "_move_all", False)  # no CAP_SYS_NICE: the shared page stays
    addrs = np.array([r0, r1, r2, r3, r3 + HUGE], np.uint64)
    res = mover.move(1, addrs, 1, region=np.array([True, True, True, True, False]))
    assert res.moved.tolist() == [0, 3, 4]
    assert res.gone.tolist() == [1] and res.busy.tolist() == [2] and not len(res.failed)
    assert res.region_pages == {"moved": 100 + 511 + 511, "busy": 1, "absent": 412 + 512,
                                "nomem": 0, "failed": 1}
    sent = np.concatenate(k.calls)
    assert len(sent) == 4 * 512 + 1 and sent[:512].tolist() == [r0 + i * PAGE for i in range(512)]


def test_executor_records_a_region_as_moved_and_counts_its_pages(monkeypatch):
    """The executor moves a region unit page by page and records it on the node; busy and
    failed are counted in pages."""
    def status(a, node):
        off = (a - BASE) // PAGE
        if off < 512:
            return node if off % 2 else -errno.ENOENT  # half present
        if off == 512 + 3:
            return -errno.EAGAIN
        return node

    monkeypatch.setattr(mover, "_raw", FakeKernel(status))
    st = PageState()
    st.begin_interval()
    st.update(Sample(pid=5, addr=np.array([BASE, BASE + HUGE], np.uint64),
                     count=np.zeros(2, np.uint32), node=np.zeros(2, np.int16),
                     npages=np.full(2, 512, np.uint16), region=np.ones(2, bool)))
    ex = Executor(st, object(), mover, lambda pid: True, clock=FakeClock())
    acc, forget = new_tally(), []
    assert ex.move(np.arange(2), 1, acc, forget, set(), 8)
    assert st.node.tolist() == [1, 0] and st.last_move[0] == st.interval
    assert acc["moved_pages"] == 256 + 511 and acc["busy"] == 1 and acc["gone"] == 0
    assert st.pages_on(1) == 512 and st.pages_on(0) == 512


# --------------------------------------------------------------------------- the daemon
@register("test-regions-idle")
class _Idle(Policy):
    def decide(self, state, ctx):
        return Decision()


def test_daemon_reads_one_part_per_interval_and_forgets_unmapped_regions(tmp_path):
    """With a profiler that reads parts, the daemon reads everything only at the first read,
    then one part per interval: a region unmapped is forgotten within FULL_READ_EVERY
    intervals, and no interval merges a complete read of the whole target."""
    n = 64 * 512  # 64 regions
    unmapped_at = 3
    calls = []

    def source(pid, i):
        keep = np.ones(n, bool)
        if i >= unmapped_at:
            keep[10 * 512:11 * 512] = False  # region 10 unmapped
        a = pages(0, n)[keep]
        return a, np.where(np.arange(n)[keep] < 2048, 5, 0), 1, 1

    class Prof(StubProfiler):
        def read(self, pid, reset=True, accessed_only=False):
            calls.append(("read", accessed_only))
            return super().read(pid, reset, accessed_only)

        def read_part(self, pid, part, parts):
            calls.append(("part", part))
            return super().read_part(pid, part, parts)

    prof = Prof(source=source, granularity="region")
    cfg = config_mod.load(None, {"profiler": "stub", "policy": "test-regions-idle",
                                 "fast_budget": "1G", "rate": 0, "interval": 0.01, "json": True})
    cfg.handle_signals, cfg.status_file = False, str(tmp_path / "status.json")
    from pagetier import policies

    d = Daemon(cfg, pids=[9], profiler=prof, policy=policies.create("test-regions-idle"),
               numab=False, out=open(os.devnull, "w"), clock=FakeClock())
    d.tracker.alive = lambda pid: True
    d.tracker.attach(9)
    region10 = BASE + 10 * HUGE
    for i in range(unmapped_at + FULL_READ_EVERY + 1):
        d.step()
        if i == 0:
            assert len(d.state) == 64 and d.state.is_region(np.arange(64)).all()
    assert region10 not in d.state.addr.tolist() and len(d.state) == 63
    assert calls[0] == ("read", False)
    assert all(c != ("read", False) for c in calls[1:])
    assert {c[1] for c in calls if c[0] == "part"} == set(range(FULL_READ_EVERY))


def test_coldest_of_region_units_is_the_order_from_scratch():
    """PageState.coldest (its pool kept between calls, sorted on the heats' bits) gives the
    (heat per page, index) order of a sort from scratch, ties included, interval after
    interval, with region units accessed, moved in and out of the node."""
    rng = np.random.default_rng(3)
    n = 6000
    st = PageState()
    addr = np.uint64(BASE) + np.arange(n, dtype=np.uint64) * np.uint64(HUGE)
    st.begin_interval()
    st.update(Sample(pid=1, addr=addr, count=np.zeros(n, np.uint32),
                     node=np.where(rng.random(n) < 0.7, 0, 1).astype(np.int16),
                     npages=np.full(n, 512, np.uint16), region=np.ones(n, bool)))
    for i in range(12):
        st.begin_interval()
        acc = np.sort(rng.choice(n, 400, replace=False))
        cnt = rng.choice([1, 2, 3, 512], len(acc)).astype(np.uint32)  # ties among the heats
        st.update(Sample(pid=1, addr=addr[acc], count=cnt, node=st.node[acc].astype(np.int16),
                         npages=np.full(len(acc), 512, np.uint16), region=np.ones(len(acc), bool),
                         complete=False))
        got, whole = st.coldest(0, 5000)
        on = np.flatnonzero(st.node == 0)
        want = on[np.lexsort((on, st.heat[on].astype(np.float64) / 512))]
        assert whole and got.tolist() == want.tolist(), i
        mv = rng.choice(n, 50, replace=False)
        st.record_moves(mv, int(i % 2))


def test_mover_region_of_our_own_pages_on_this_kernel():
    """The real move_pages wrapper on this kernel (node 0, where our pages are): a region of
    which every other page was touched counts as moved, its untouched pages as absent."""
    import ctypes
    import mmap

    buf = mmap.mmap(-1, 2 * HUGE)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    off = -start % HUGE
    for p in range(0, HUGE, 2 * PAGE):
        buf[off + p] = 0x5A
    res = mover.move(0, np.array([start + off], np.uint64), 0, region=np.array([True]))
    assert res.moved.tolist() == [0] and not len(res.gone)
    assert res.region_pages["moved"] == 256 and res.region_pages["absent"] == 256
    assert res.errors == {"ENOENT": 256}
    del buf


def test_a_target_read_in_pages_then_in_regions_keeps_one_unit_per_2mib():
    """A target first read in 4 KiB units, then in regions (pagetier.ko's granularity auto
    switches a target that grows past 1 GiB): each region takes the place of the pages inside
    it at once, whether it is new or the page at its start becomes it; pages elsewhere stay."""
    st = PageState()
    st.begin_interval()
    a = pages(0, 3 * 512)  # three 2 MiB blocks of pages
    st.update(Sample(pid=1, addr=a, count=np.ones(len(a), np.uint32),
                     node=np.ones(len(a), np.int16), npages=np.ones(len(a), np.uint16)))
    st.update(Sample(pid=2, addr=a[:600], count=np.ones(600, np.uint32),
                     node=np.ones(600, np.int16), npages=np.ones(600, np.uint16)))
    assert st.pages_on(1) == 3 * 512 + 600
    st.begin_interval()
    # block 0 as a region (the page at its start becomes it), block 1 too; block 2 not read
    st.update(Sample(pid=1, addr=np.array([a[0], a[512]], np.uint64),
                     count=np.array([512, 3], np.uint32), node=np.ones(2, np.int16),
                     npages=np.full(2, 512, np.uint16), region=np.ones(2, bool), complete=False))
    mine = st.target == 0
    assert mine.sum() == 2 + 512 and st.is_region(np.flatnonzero(mine)).sum() == 2
    assert st.pages_on(1) == 3 * 512 + 600
    assert (st.target == 1).sum() == 600  # another target's pages are its own
    # a part read that brings block 2 as a new region (its first page was forgotten meanwhile)
    st.forget(np.flatnonzero((st.target == 0) & (st.addr == a[1024])))
    st.sync(Sample(pid=1, addr=np.array([a[1024]], np.uint64), count=np.zeros(1, np.uint32),
                   node=np.ones(1, np.int16), npages=np.full(1, 512, np.uint16),
                   region=np.ones(1, bool), span=(int(a[1024]), int(a[1024]) + HUGE)))
    assert (st.target == 0).sum() == 3 and st.pages_on(1) == 3 * 512 + 600


def test_folded_units_keep_kind_and_sharing():
    """huge_units and region_units: a folded unit is of its rows' highest kind and shared if
    any row is; a sample cut with take() keeps both."""
    from pagetier.core.sample import KIND_ANON, KIND_FILE, KIND_SHMEM
    from pagetier.profiler.base import huge_units, region_units

    base = 1 << 30
    addr = np.array([base, base + 4096, base + (2 << 20), base + (2 << 20) + 4096], np.uint64)
    s = Sample(pid=1, addr=addr, count=np.array([1, 2, 3, 4], np.uint32),
               node=np.zeros(4, np.int16), npages=np.ones(4, np.uint16),
               kind=np.array([KIND_ANON, KIND_SHMEM, KIND_FILE, KIND_FILE], np.uint8),
               shared=np.array([False, True, False, False]))
    r = region_units(s)
    assert r.kind.tolist() == [KIND_SHMEM, KIND_FILE]
    assert r.shared.tolist() == [True, False]
    h = huge_units(s, np.array([base + (2 << 20)], np.uint64))
    assert h.kind.tolist() == [KIND_ANON, KIND_SHMEM, KIND_FILE]
    assert h.shared.tolist() == [False, True, False]
    t = s.take(np.array([False, True, True, False]))
    assert t.kind.tolist() == [KIND_SHMEM, KIND_FILE] and t.shared.tolist() == [True, False]
    assert len(region_units(Sample(pid=1, addr=addr, count=s.count, node=s.node,
                                   npages=s.npages)).kind) == 0
