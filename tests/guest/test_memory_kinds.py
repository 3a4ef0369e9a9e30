"""Shared memory and file mappings under pagetier, in the two-node VM: the hot part of a file
mapped MAP_SHARED reaches the fast node and the file's contents are intact afterwards; a
segment two processes share is moved once and stays readable by both; bench live's
file-mapped form runs on an ext4 it mounts and checks the file.

    scripts/vm --kernel 6.12 --hmat --timeout 2400 -- \
        .venv/bin/python -m pytest -q tests/guest/test_memory_kinds.py

Behaviour, not timing: each test waits for what it checks with generous deadlines and reads
the built-in workload's own truth (the share of its hot pages on node 0, from move_pages).
Needs pagetier.ko 0.5 (it counts accesses to shmem and page-cache pages).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pagetier.bench.live import FileSystem, vmstat
from pagetier.workload import Workload, binary, check_file

from daemon_run import DaemonRun, _children

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_loaded")]
MIB = 1 << 20
WAIT = 900  # seconds: a daemon's start (imports) alone can take minutes on a loaded host
SIZE_MB, HOT_MB, BUDGET = 256, 32, "96M"
HOT_PAGES = HOT_MB * MIB // 4096


def _summary(stats, ticks, stderr="") -> str:
    fr = [(round(t["t"]), t["fast_fraction"]) for t in ticks]
    moves = [(s["interval"], s["promoted"] >> 8, s["demoted"] >> 8, s["fast_used"] >> 20,
              s.get("errors")) for s in stats]
    return (f"ticks (t, fast_fraction): {fr}\nintervals (n, promoted MiB, demoted MiB, fast "
            f"MiB, move errors): {moves}\nstderr: {stderr[-2000:]}")


@pytest.fixture
def ext4(tmp_path):
    """A directory on ext4 (an image on a loop device): page cache that is written back."""
    fs = FileSystem(SIZE_MB + 96, root=tmp_path / "fs")
    mnt = fs.__enter__()
    yield mnt
    fs.__exit__(None, None, None)


def test_a_file_mappings_hot_pages_reach_the_fast_node_and_the_file_is_intact(env, ext4):
    """A file on ext4 mapped MAP_SHARED, its hot pages dirtied all the time: they reach node 0
    and stay; after the run the file, read back from the disk (caches dropped), holds what the
    program wrote, page for page. With kinds=auto, the program (attached before it maps the
    file) is attached again in abit mode once the file's pages are most of it."""
    path = ext4 / "data"
    # 128 MiB: filling a file through ext4 takes most of a minute in an emulated guest; the
    # program runs until its hot part has been on node 0 for a few ticks, then is stopped
    cmd = ["run", "--json", "--fast-budget", BUDGET, "--interval", "1", "--profiler", "kmod",
           "--profiler-option", "kinds=auto", "--", str(binary()), "--memory", f"file:{path}", "--size", "128", "--hot",
           str(HOT_MB), "--start-node", "1", "--duration", "0"]
    d = DaemonRun(cmd, env)
    try:
        def ticks():
            return [e for e in list(d.events) if e["event"] == "tick"]

        d.wait_for(lambda: any(t["fast_fraction"] >= 0.95 for t in ticks()), WAIT,
                   "the hot part on node 0")
        n = len(ticks())
        d.wait_for(lambda: len(ticks()) >= n + 3, WAIT, "three more ticks")
        for pid in _children(d.proc.pid):
            os.kill(pid, signal.SIGTERM)  # the program checks its memory, syncs the file, ends
        rc = d.finish(WAIT)
    finally:
        if d.proc.poll() is None:
            d.stop()
    why = _summary(list(d.stats), ticks(), d.stderr)
    print(why)
    done = [e for e in d.events if e["event"] == "done"]
    assert rc == 0 and done and done[0]["pages_corrupt"] == 0, why
    assert all(s["fast_used"] <= 96 * MIB for s in d.stats), why
    assert min(t["fast_fraction"] for t in ticks()[n - 1:]) >= 0.9, "did not stay: " + why
    # kinds=auto: attached when it had mapped little, the program was attached again in abit
    # mode once its memory was mostly the file's 4 KiB pages
    assert "has other memory now: attaching it again" in d.stderr, why
    assert "abit mode (no hinting faults on 4 KiB pages)" in d.stderr, why
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")  # read from the disk, not the cache
    checked, bad = check_file(path, 128 * MIB)
    assert checked == 128 * 256 and bad == [], f"corrupt pages of the file: {bad[:20]}"


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs of its own: a file there is shmem."""
    d = tmp_path / "shm"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB + 32}M", "tmpfs", str(d)],
                   check=True)
    yield d
    subprocess.run(["umount", str(d)], check=False)


SHARED_HOT_MB = 64  # twice it is over the budget: the two processes' hot parts fit only once


def test_a_segment_shared_by_two_processes_moves_once_and_both_read_it(env, tmpfs):
    """Two processes map one shmem segment (a tmpfs file) and access its 64 MiB hot part:
    pagetier attached to both moves the hot pages to node 0 once (the guest migrates about the
    hot part, not twice it), charges each page once against the 96 MiB budget (twice would be
    128 MiB: the hot part would not fit), and both read the segment intact at the end."""
    seg = tmpfs / "segment"
    hot_pages = SHARED_HOT_MB * MIB // 4096
    args = ["--memory", f"file:{seg}", "--size", "128", "--hot", str(SHARED_HOT_MB),
            "--start-node", "1", "--duration", "0", "--wait"]
    a = Workload(*args)
    b = Workload(*args, "--reuse")
    d = None
    try:
        d = DaemonRun(["attach", f"{a.pid},{b.pid}", "--json", "--fast-budget", BUDGET,
                       "--interval", "1"], env)
        d.wait_for(lambda: len(d.stats) >= 1, WAIT, "a first interval")
        mig0 = vmstat("pgmigrate_success")
        a.proc.send_signal(signal.SIGUSR1)
        b.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            ta, tb = a.next_tick(), b.next_tick()
            assert ta is not None and tb is not None, "a workload ended early"
            if min(ta["fast_fraction"], tb["fast_fraction"]) >= 0.95 and len(a.ticks) >= 3:
                break
        for _ in range(5):  # a few more intervals: nothing moves twice afterwards either
            a.next_tick(), b.next_tick()
        migrated = vmstat("pgmigrate_success") - mig0
        stats = list(d.stats)
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop()
        rc_a, rc_b = a.stop(), b.stop()
    why = _summary(stats, a.ticks, d.stderr if d else "")
    print(why)
    print(f"migrated {migrated} pages for a hot part of {hot_pages}")
    assert a.ticks[-1]["fast_fraction"] >= 0.9 and b.ticks[-1]["fast_fraction"] >= 0.9, why
    assert migrated <= 1.5 * hot_pages, f"moved {migrated} pages: more than once? {why}"
    # the budget holds what is on the node once; the other process's units of it are aliases
    assert all(s["fast_used"] <= 96 * MIB for s in stats), why
    assert stats[-1]["fast_aliased"] >= 0.9 * SHARED_HOT_MB * MIB, why
    assert rc_a == 0 and rc_b == 0, "a process read the segment corrupted"
    assert a.done["pages_corrupt"] == 0 and b.done["pages_corrupt"] == 0
    assert check_file(seg, 128 * MIB)[1] == []


def test_bench_live_runs_a_file_mapped_scenario(tmp_path):
    """bench live's guest side on a file-mapped scenario: the file lives on the ext4 it
    mounts for the run (and unmounts after), and is read back and checked at the end."""
    from pagetier.bench import live as live_bench

    spec = live_bench.Spec("tiny-file", seconds=4, size_mb=32, hot_mb=8, budget_mb=16,
                           thp=False, memory="file")
    out = tmp_path / "live.json"
    assert live_bench.guest_main(["none"], [spec], out, log=lambda m: None) == 0
    [rec] = json.loads(out.read_text())["scenarios"][0]["records"]
    assert rec["runnable"], rec.get("reason")
    assert rec["memory"] == "file" and rec["memory_ok"] and rec["ticks"]
    assert rec["file_check"] == {"pages_checked": 32 * 256, "pages_corrupt": 0}
    mounts = Path("/proc/mounts").read_text()
    assert "pagetier-live" not in mounts
