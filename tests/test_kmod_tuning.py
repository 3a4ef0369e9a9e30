"""The kmod profiler's per-target mode (kinds "auto", the default): a target whose memory is
mostly in 4 KiB pages (shared memory, page cache, private copies, anonymous memory without THP)
is attached in abit mode, one mostly in THP anonymous memory in the configured mode; a program too small to tell at attach is decided again when it has grown. With a fake
/dev/pagetier: what the module is asked to attach, and what the daemon logs and reports."""
from __future__ import annotations

import logging

import pytest

from pagetier.errors import ConfigError
from pagetier.profiler import kmod

MIB = 1 << 20


class FakeDev:
    def __init__(self):
        self.attached: dict[int, str] = {}  # pid -> mode
        self.calls: list[tuple] = []
        self.kinds_pages = {}  # pid -> pages_shmem + pages_file
        self.file_pages = {}  # pid -> pages_file (of kinds_pages)

    def attach(self, pid, mode, period, ratio, budget, flags):
        self.calls.append(("attach", pid, mode, ratio))
        self.attached[pid] = mode

    def detach(self, pid):
        self.calls.append(("detach", pid))
        self.attached.pop(pid, None)

    def stats(self, pid):
        file = self.file_pages.get(pid, 0)
        return {"scans": 1, "pages_shmem": self.kinds_pages.get(pid, 0) - file,
                "pages_file": file}


def profiler(monkeypatch, anon: dict, copies: dict | None = None, huge: dict | None = None,
             **opts):
    """A KmodProfiler on FakeDev; ``anon``: pid -> bytes of anonymous memory (smaps), of them
    ``copies``: pid -> bytes in file mappings and ``huge``: pid -> bytes in transparent huge
    pages (by default all the anonymous memory outside file mappings)."""
    p = object.__new__(kmod.KmodProfiler)
    p.mode, p.scan_period_ms = opts.get("mode", "fault"), 250
    p.sample_ratio, p.page_budget = opts.get("sample_ratio", 0), opts.get("page_budget", 0)
    p.attach_flags, p.has_kinds, p.has_freq, p.has_regions = 0, True, True, True
    p.kinds = opts.get("kinds", "auto")
    p.tuning, p._regions, p.pids, p.dev = {}, {}, set(), FakeDev()
    copies = copies or {}
    monkeypatch.setattr(kmod, "memory_mix", lambda pid: {
        "anon": anon.get(pid, 0), "rss": 0, "anon_file": copies.get(pid, 0),
        "anon_huge": (huge or {}).get(pid, anon.get(pid, 0) - copies.get(pid, 0))})
    return p


def test_auto_is_the_default():
    import inspect

    assert inspect.signature(kmod.KmodProfiler).parameters["kinds"].default == "auto"


@pytest.mark.parametrize("kinds_mib, file_mib, anon_mib", [
    (256, 0, 2),    # MAP_SHARED|MAP_ANONYMOUS, memfd, /dev/shm
    (256, 256, 0),  # a shared file mapping: page cache
    (16, 8, 15),    # just enough of both, just more than the anonymous part
])
def test_mostly_4k_shared_memory_or_page_cache_runs_in_abit_and_says_why(
        monkeypatch, kinds_mib, file_mib, anon_mib):
    """Attached in the configured fault mode for its first scan, then again in abit; the
    tuning says which and why, and the configured sample ratio is left as it was."""
    p = profiler(monkeypatch, {1: anon_mib * MIB})
    p.dev.kinds_pages[1] = kinds_mib * MIB // 4096
    p.dev.file_pages[1] = file_mib * MIB // 4096
    p.attach(1)
    assert p.dev.calls == [("attach", 1, "fault", 0), ("detach", 1), ("attach", 1, "abit", 0)]
    assert p.dev.attached == {1: "abit"} and p.mode_of(1) == "abit"
    t = p.tuning[1]
    assert t["mode"] == "abit" and t["sample_ratio"] == 0 and t["settled"]
    assert f"{kinds_mib:.1f} MiB of 4 KiB shmem/file" in t["why"] and "abit mode" in t["why"]


def test_a_private_file_mappings_copies_run_in_abit(monkeypatch):
    """MAP_PRIVATE of a file, every page written: the module sees anonymous pages, smaps
    shows them in the file's mapping; they are 4 KiB copies of its pages, attached in abit."""
    p = profiler(monkeypatch, {1: 258 * MIB}, copies={1: 256 * MIB})
    p.attach(1)
    assert p.dev.attached == {1: "abit"}
    assert "0.0 MiB of 4 KiB shmem/file pages, 256.0 MiB private copies, 0.0 MiB 4 KiB " \
           "anonymous, 2.0 MiB in huge pages: abit mode" in p.tuning[1]["why"]


@pytest.mark.parametrize("small_mib, huge_mib, mode", [
    (256, 0, "abit"),     # THP off (MADV_NOHUGEPAGE, or THP "never" / "madvise" not asked)
    (200, 56, "abit"),    # mostly 4 KiB: a THP heap beside it
    (100, 156, "fault"),  # mostly in huge pages
    (12, 0, "fault"),     # too little to tell yet: decided again at a refresh
])
def test_4k_anonymous_memory_runs_in_abit_and_thp_in_fault_mode(
        monkeypatch, small_mib, huge_mib, mode):
    """Anonymous memory outside huge pages takes a hinting fault per 4 KiB page in fault
    mode: a target mostly of it is attached in abit, one mostly in THP stays in fault mode."""
    p = profiler(monkeypatch, {1: (small_mib + huge_mib) * MIB}, huge={1: huge_mib * MIB})
    p.attach(1)
    t = p.tuning[1]
    assert p.dev.attached == {1: mode} and t["mode"] == mode, t
    assert f"{small_mib:.1f} MiB 4 KiB anonymous, {huge_mib:.1f} MiB in huge pages: {mode} " \
           "mode" in t["why"], t
    assert t["small_bytes"] == small_mib * MIB and t["huge_bytes"] == huge_mib * MIB
    assert t["settled"] == (mode == "abit" or huge_mib > 16)


def test_memory_mix_counts_anonymous_pages_in_file_mappings_apart(tmp_path, monkeypatch):
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "55d0a000-55d0b000 rw-p 00001000 08:01 131 /usr/bin/x\n"
        "Rss:                   8 kB\nAnonymous:             4 kB\nAnonHugePages:         0 kB\n"
        "7f0000000000-7f0010000000 rw-p 00000000 08:01 77 /mnt/data (deleted)\n"
        "Rss:              262144 kB\nAnonymous:        262144 kB\nAnonHugePages:         0 kB\n"
        "7f1000000000-7f1000200000 rw-s 00000000 00:01 4242 /dev/zero (deleted)\n"
        "Rss:                2048 kB\nAnonymous:             0 kB\nAnonHugePages:         0 kB\n"
        "7f2000000000-7f2004000000 rw-p 00000000 00:00 0 \n"
        "Rss:               65536 kB\nAnonymous:         65536 kB\nAnonHugePages:     65536 kB\n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]\n"
        "Rss:                  16 kB\nAnonymous:            16 kB\nAnonHugePages:         0 kB\n")
    real = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: real(smaps if str(p).endswith(
        "/smaps") else p, *a, **k))
    kib = 1024
    assert kmod.memory_mix(1) == {"anon": (4 + 262144 + 65536 + 16) * kib,
                                  "anon_huge": 65536 * kib, "rss": (8 + 262144 + 2048 + 65536 + 16) * kib,
                                  "anon_file": (4 + 262144) * kib}
    assert kmod.memory_mix(2**31) is not None  # the fake file for any pid
    monkeypatch.setattr("builtins.open", real)
    assert kmod.memory_mix(2**31) is None  # no such process


@pytest.mark.parametrize("opts, anon_mib, kinds_mib, why", [
    ({}, 256, 1, "fault mode"),                 # THP anon: more anonymous memory than the rest
    ({}, 256, 255, "fault mode"),               # a little less shmem than anonymous memory
    ({"kinds": "off"}, 0, 256, ""),
    ({"sample_ratio": 2}, 0, 256, "sample_ratio or page_budget given"),
    ({"page_budget": 1000}, 0, 256, "sample_ratio or page_budget given"),
    ({"mode": "abit"}, 0, 256, "abit mode as configured"),
])
def test_anon_targets_and_configured_modes_are_attached_once_as_configured(
        monkeypatch, opts, anon_mib, kinds_mib, why):
    """Anonymous memory, kinds off, a ratio or page budget the configuration gives, abit
    configured: one attach, in the configured mode, with the configured ratio."""
    p = profiler(monkeypatch, {1: anon_mib * MIB}, **opts)
    p.dev.kinds_pages[1] = kinds_mib * MIB // 4096
    p.attach(1)
    mode = opts.get("mode", "fault")
    assert p.dev.calls == [("attach", 1, mode, opts.get("sample_ratio", 0))]
    assert p.tuning[1]["mode"] == mode == p.mode_of(1)
    assert p.tuning[1]["sample_ratio"] == opts.get("sample_ratio", 0)
    assert why in p.tuning[1]["why"] and (why or not p.tuning[1]["why"])


def test_the_chosen_mode_decides_first_estimate_and_unmark(monkeypatch):
    """A target in abit has its estimate after one scan and nothing to unmark before a move;
    an anonymous one beside it, in fault mode, waits for two scans and is unmarked."""
    import numpy as np

    p = profiler(monkeypatch, {1: 0, 2: 256 * MIB})
    p.dev.kinds_pages[1] = 256 * MIB // 4096
    unmarked = []
    p.dev.unmark = lambda pid, addrs: unmarked.append(pid) or len(addrs)
    monkeypatch.setattr(kmod.KmodProfiler, "_scanned", lambda self, pid: True)
    p.attach(1)
    p.attach(2)
    assert (p.mode_of(1), p.mode_of(2)) == ("abit", "fault")
    monkeypatch.setattr(kmod, "SYSFS", type("S", (), {"__truediv__": lambda self, n: type(
        "F", (), {"read_text": lambda self: "4"})()})())
    assert p.first_estimate_ready(1) is True and p.first_estimate_ready(2) is False
    for pid in (1, 2):
        p.prepare_move(pid, np.array([0x1000], np.uint64))
    assert unmarked == [2]


def test_a_program_that_grows_into_shared_memory_is_attached_again(monkeypatch, caplog):
    """`pagetier run`: the program has almost nothing mapped at attach, later maps a 128 MiB
    shmem segment: the daemon's refresh attaches it again in abit mode, once."""
    from pagetier.core.state import PageState
    from pagetier.daemon.targets import Targets

    p = profiler(monkeypatch, {7: 1 * MIB})
    tr = Targets(p, PageState())
    tr.alive = lambda pid: True
    with caplog.at_level(logging.INFO, "pagetier.daemon"):
        assert tr.attach(7)
        assert p.tuning[7]["settled"] is False and p.dev.attached == {7: "fault"}
        assert "too little to tell yet" in caplog.text
        tr.refresh()  # nothing new: left alone
        assert p.dev.calls == [("attach", 7, "fault", 0)]
        p.dev.kinds_pages[7] = 128 * MIB // 4096
        tr.refresh()
        assert p.dev.attached == {7: "abit"} and 7 in tr.pids
        n = len(p.dev.calls)
        tr.refresh()
        assert len(p.dev.calls) == n  # settled: not again
    assert "attaching it again" in caplog.text and "abit mode" in caplog.text


def test_a_small_program_that_grows_thp_memory_stays_in_fault_mode(monkeypatch):
    p = profiler(monkeypatch, {7: 1 * MIB})
    p.attach(7)
    assert p.retune(7) is False and not p.tuning[7]["settled"]
    p.dev.kinds_pages[7] = 8 * MIB // 4096
    monkeypatch.setattr(kmod, "memory_mix", lambda pid: {"anon": 64 * MIB, "anon_huge": 64 * MIB})
    assert p.retune(7) is False and p.tuning[7]["settled"] and p.tuning[7]["mode"] == "fault"
    assert p.dev.calls == [("attach", 7, "fault", 0)]


def test_a_small_program_that_grows_4k_anonymous_memory_is_attached_again_in_abit(monkeypatch):
    p = profiler(monkeypatch, {7: 1 * MIB})
    p.attach(7)
    assert not p.tuning[7]["settled"]
    monkeypatch.setattr(kmod, "memory_mix", lambda pid: {"anon": 64 * MIB, "anon_huge": 2 * MIB})
    assert p.retune(7) is True  # the caller (Targets.refresh) attaches it again


def test_bad_kinds_options_are_errors_before_anything_is_loaded(monkeypatch):
    monkeypatch.setattr(kmod, "load_module", lambda: pytest.fail("loaded the module"))
    with pytest.raises(ConfigError, match="unknown kinds 'on'"):
        kmod.KmodProfiler(kinds="on")
    with pytest.raises(TypeError):
        kmod.KmodProfiler(kinds_sample_ratio=4)  # gone: abit is the one way for these kinds


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
    assert p.dev.calls == [("attach", 3, "fault", 0)]
    [msg] = [r.getMessage() for r in caplog.records]
    assert msg.startswith("attached to pid 3 (") and msg.endswith(")")
