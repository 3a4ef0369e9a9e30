"""The kmod profiler's per-target sample ratio (kinds "auto"): a target whose memory is mostly
4 KiB shared memory or page cache is marked 1 page in kinds_sample_ratio each scan, others as
configured; a program too small to tell at attach is decided again when it has grown. With a
fake /dev/pagetier: what the module is asked to attach, and what the daemon logs and reports."""
from __future__ import annotations

import logging

import pytest

from pagetier.errors import ConfigError
from pagetier.profiler import kmod

MIB = 1 << 20


class FakeDev:
    def __init__(self):
        self.attached: dict[int, int] = {}  # pid -> sample ratio
        self.calls: list[tuple] = []
        self.kinds_pages = {}  # pid -> pages_shmem + pages_file

    def attach(self, pid, mode, period, ratio, budget, flags):
        self.calls.append(("attach", pid, ratio))
        self.attached[pid] = ratio

    def detach(self, pid):
        self.calls.append(("detach", pid))
        self.attached.pop(pid, None)

    def stats(self, pid):
        return {"scans": 1, "pages_shmem": self.kinds_pages.get(pid, 0), "pages_file": 0}


def profiler(monkeypatch, anon: dict, **opts):
    """A KmodProfiler on FakeDev; ``anon``: pid -> bytes of anonymous memory (smaps_rollup)."""
    p = object.__new__(kmod.KmodProfiler)
    p.mode, p.scan_period_ms = opts.get("mode", "fault"), 250
    p.sample_ratio, p.page_budget = opts.get("sample_ratio", 0), opts.get("page_budget", 0)
    p.attach_flags, p.has_kinds, p.has_freq, p.has_regions = 0, True, True, True
    p.kinds = opts.get("kinds", "auto")
    p.kinds_sample_ratio = opts.get("kinds_sample_ratio", kmod.KINDS_SAMPLE_RATIO)
    p.tuning, p._regions, p.pids, p.dev = {}, {}, set(), FakeDev()
    monkeypatch.setattr(kmod, "memory_mix", lambda pid: {"anon": anon.get(pid, 0),
                                                         "anon_huge": 0, "rss": 0})
    return p


def test_mostly_4k_shared_memory_is_sampled_and_says_why(monkeypatch):
    p = profiler(monkeypatch, {1: 2 * MIB})
    p.dev.kinds_pages[1] = 256 * MIB // 4096
    p.attach(1)
    assert p.dev.attached == {1: kmod.KINDS_SAMPLE_RATIO}
    t = p.tuning[1]
    assert t["sample_ratio"] == kmod.KINDS_SAMPLE_RATIO and t["settled"]
    assert "256.0 MiB of 4 KiB shmem/file" in t["why"] and f"1 page in {kmod.KINDS_SAMPLE_RATIO}" in t["why"]


@pytest.mark.parametrize("opts", [{}, {"kinds": "off"}, {"sample_ratio": 2},
                                  {"page_budget": 1000}, {"mode": "abit"}])
def test_anon_targets_and_configured_ratios_are_attached_once_as_configured(monkeypatch, opts):
    """THP anon (more anonymous memory than shmem/file), kinds off, a ratio or page budget the
    configuration gives, abit mode: one attach, with the configured ratio."""
    p = profiler(monkeypatch, {1: (0 if opts else 256) * MIB}, **opts)
    p.dev.kinds_pages[1] = (256 if opts else 1) * MIB // 4096
    p.attach(1)
    assert p.dev.calls == [("attach", 1, opts.get("sample_ratio", 0))]
    assert p.tuning[1]["sample_ratio"] == opts.get("sample_ratio", 0)


def test_a_program_that_grows_into_shared_memory_is_attached_again(monkeypatch, caplog):
    """`pagetier run`: the program has almost nothing mapped at attach, later maps a 128 MiB
    shmem segment: the daemon's refresh attaches it again with the kinds' ratio, once."""
    from pagetier.core.state import PageState
    from pagetier.daemon.targets import Targets

    p = profiler(monkeypatch, {7: 1 * MIB})
    tr = Targets(p, PageState())
    tr.alive = lambda pid: True
    with caplog.at_level(logging.INFO, "pagetier.daemon"):
        assert tr.attach(7)
        assert p.tuning[7]["settled"] is False and p.dev.attached == {7: 0}
        assert "too little to tell yet" in caplog.text
        tr.refresh()  # nothing new: left alone
        assert p.dev.calls == [("attach", 7, 0)]
        p.dev.kinds_pages[7] = 128 * MIB // 4096
        tr.refresh()
        assert p.dev.attached == {7: kmod.KINDS_SAMPLE_RATIO} and 7 in tr.pids
        n = len(p.dev.calls)
        tr.refresh()
        assert len(p.dev.calls) == n  # settled: not again
    assert "attaching it again" in caplog.text and "1 page in 4" in caplog.text


def test_bad_kinds_options_are_errors_before_anything_is_loaded(monkeypatch):
    monkeypatch.setattr(kmod, "load_module", lambda: pytest.fail("loaded the module"))
    with pytest.raises(ConfigError, match="unknown kinds 'on'"):
        kmod.KmodProfiler(kinds="on")
    with pytest.raises(ConfigError, match="kinds_sample_ratio must be in"):
        kmod.KmodProfiler(kinds_sample_ratio=0)
    with pytest.raises(ConfigError, match="kinds_sample_ratio must be in"):
        kmod.KmodProfiler(kinds_sample_ratio="x")


def test_a_page_two_targets_map_is_counted_once_on_the_fast_node(monkeypatch):
    """Two targets map one 8-page segment (at different addresses, the second from page 2 of
    the file on) and a private buffer each: the fast node's pages counted twice are the
    segment's pages both have there, and nothing with one target."""
    import numpy as np

    from pagetier.core.sample import Sample
    from pagetier.core.state import PageState
    from pagetier.daemon import targets

    st = PageState()
    seg = {1: 0x10000000, 2: 0x7f0000000000}
    maps = {1: [(seg[1], seg[1] + 8 * 4096, ("00:05", "77"), 0)],
            2: [(seg[2], seg[2] + 6 * 4096, ("00:05", "77"), 2 * 4096)]}
    monkeypatch.setattr(targets, "shared_mappings", lambda pid: maps[pid])
    for pid in (1, 2):
        n = 8 if pid == 1 else 6
        addr = np.concatenate([seg[pid] + 4096 * np.arange(n, dtype=np.uint64),
                               0x20000000 + 4096 * np.arange(4, dtype=np.uint64)])
        node = np.zeros(len(addr), np.int16)
        if pid == 2:
            node[:2] = 1  # its first two (the file's pages 2 and 3) on the slow node
        st.update(Sample(pid, addr=addr, count=np.ones(len(addr), np.uint32), node=node,
                         npages=np.ones(len(addr), np.uint16)))
    assert st.pages_on(0) == 8 + 4 + 4 + 4
    # pid 2's file pages 4-7 are on node 0 in both: 4 pages counted twice
    assert targets.fast_aliases(st, [1, 2], 0) == 4
    assert targets.fast_aliases(st, [1], 0) == 0
    assert targets.fast_aliases(st, [1, 2], 1) == 0


def test_shared_mappings_reads_only_shared_file_and_shmem_mappings(tmp_path, monkeypatch):
    from pagetier.daemon import targets

    maps = tmp_path / "maps"
    maps.write_text(
        "55d0a000-55d0b000 r-xp 00000000 08:01 131 /usr/bin/x\n"
        "7f0000000000-7f0000100000 rw-s 00002000 00:01 4242 /dev/zero (deleted)\n"
        "7f1000000000-7f1000010000 rw-s 00000000 00:00 0 [anon shared without inode]\n"
        "7f2000000000-7f2000010000 rw-p 00000000 00:00 0\n")
    real = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real(maps if str(p).endswith(
        "/maps") else p, *a, **k))
    assert targets.shared_mappings(1) == [(0x7f0000000000, 0x7f0000100000, ("00:01", "4242"),
                                           0x2000)]


def test_with_kinds_off_the_attach_log_says_nothing_more(monkeypatch, caplog):
    from pagetier.core.state import PageState
    from pagetier.daemon.targets import Targets

    p = profiler(monkeypatch, {3: 0}, kinds="off")
    p.dev.kinds_pages[3] = 256 * MIB // 4096
    tr = Targets(p, PageState())
    with caplog.at_level(logging.INFO, "pagetier.daemon"):
        assert tr.attach(3)
    assert p.dev.calls == [("attach", 3, 0)]
    [msg] = [r.getMessage() for r in caplog.records]
    assert msg.startswith("attached to pid 3 (") and msg.endswith(")")
