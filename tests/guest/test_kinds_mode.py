"""The kmod profiler's mode per target (``kinds`` auto, the default), in the two-node VM: a
target whose memory is mostly in 4 KiB pages (shared memory, private copies of a MAP_PRIVATE
file mapping's pages, anonymous memory with THP off) is attached in abit mode, a THP
anonymous one in the configured fault mode, and the module's own stats say so; under the daemon, a shmem
target's hot part reaches the fast node in abit mode and stays there.

    scripts/vm --kernel 6.12 --hmat -- .venv/bin/python -m pytest -q tests/guest/test_kinds_mode.py

Behaviour, not timing: each test waits for what it checks with generous deadlines and reads
the built-in workload's own truth (the share of its hot pages on node 0, from move_pages).
Needs pagetier.ko 0.5 (it counts accesses to shmem and page-cache pages).
"""
from __future__ import annotations

import time

import pytest

from pagetier import uapi
from pagetier.bench.live import vmstat
from pagetier.profiler import kmod
from pagetier.workload import Workload

from daemon_run import DaemonRun

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_loaded")]
MIB = 1 << 20
WAIT = 900  # seconds: a daemon's start (imports) alone can take minutes on a loaded host
HOT_MB = 32


def test_shmem_target_is_attached_in_abit_and_anon_in_fault_mode():
    """One profiler with the defaults (fault mode, kinds auto), two targets: 64 MiB of shared
    memory and 64 MiB of THP anonymous memory. The tuning and the module's stats say abit for
    the first and fault for the second, and both are counted."""
    args = ("--size", "64", "--hot", "16", "--duration", "0", "--quiet")
    with Workload("--memory", "shmem", *args) as shm, Workload(*args) as anon:
        huge = kmod.memory_mix(anon.pid)["anon_huge"]
        assert huge >= 48 * MIB, f"the THP target got {huge >> 20} MiB of huge pages"
        prof = kmod.KmodProfiler(load=False)
        try:
            prof.attach(shm.pid)
            prof.attach(anon.pid)
            got = {pid: (prof.tuning[pid]["mode"], prof.stats(pid)["mode"])
                   for pid in (shm.pid, anon.pid)}
            why = {pid: prof.tuning[pid]["why"] for pid in got}
            assert got[shm.pid] == ("abit", uapi.MODES["abit"]), why
            assert got[anon.pid] == ("fault", uapi.MODES["fault"]), why
            assert "abit mode" in why[shm.pid] and "fault mode" in why[anon.pid], why
            deadline = time.monotonic() + 120
            counted = set()
            while counted != set(got) and time.monotonic() < deadline:
                time.sleep(1.0)
                counted |= {pid for pid in got if (prof.read(pid).count > 0).any()}
            assert counted == set(got), f"no counts for {set(got) - counted}: {why}"
        finally:
            prof.close()


def test_private_copies_of_a_file_mapping_are_attached_in_abit(tmp_path):
    """A 64 MiB file mapped MAP_PRIVATE, every page written once: the target's memory is its
    own 4 KiB anonymous copies in a file VMA, which the module counts as anonymous. Only
    /proc/PID/smaps tells them from other anonymous memory (memory_mix's anon_file): with the
    defaults the target is attached in abit, the choice names the copies, and it is counted.
    Beside it, a 64 MiB anonymous target with THP off (4 KiB anonymous pages) is attached in
    abit too, and its choice says so."""
    args = ("--size", "64", "--hot", "16", "--duration", "0", "--quiet")
    with Workload("--memory", f"private:{tmp_path / 'data'}", *args) as priv, \
            Workload("--no-thp", *args) as anon:
        mix = kmod.memory_mix(priv.pid)
        assert mix is not None and mix["anon_file"] >= 48 * MIB, mix
        assert kmod.memory_mix(anon.pid)["anon_file"] < 16 * MIB
        prof = kmod.KmodProfiler(load=False)
        try:
            prof.attach(priv.pid)
            prof.attach(anon.pid)
            t = prof.tuning
            why = {pid: t[pid]["why"] for pid in (priv.pid, anon.pid)}
            assert (t[priv.pid]["mode"], prof.stats(priv.pid)["mode"]) == \
                ("abit", uapi.MODES["abit"]), why
            assert "private copies" in why[priv.pid] and "abit mode" in why[priv.pid], why
            assert t[priv.pid]["small_bytes"] >= 48 * MIB, t[priv.pid]
            assert (t[anon.pid]["mode"], prof.stats(anon.pid)["mode"]) == \
                ("abit", uapi.MODES["abit"]), why
            assert "4 KiB anonymous" in why[anon.pid], why
            assert t[anon.pid]["small_bytes"] >= 48 * MIB > t[anon.pid]["huge_bytes"], t[anon.pid]
            deadline = time.monotonic() + 120
            while not (prof.read(priv.pid).count > 0).any():
                assert time.monotonic() < deadline, f"no counts for the copies: {why}"
                time.sleep(1.0)
        finally:
            prof.close()
        assert priv.stop() == 0, "the workload's memory check failed"


def test_shmem_hot_part_reaches_the_fast_node_in_abit_mode(env):
    """256 MiB of shared memory first touched on node 1, 32 MiB hot, a 96 MiB budget, `pagetier
    attach` with the default profiler options: the attach says abit, the hot part reaches node
    0 and stays, within the budget, with at most 1.5 times the hot part migrated."""
    with Workload("--memory", "shmem", "--size", "256", "--hot", str(HOT_MB), "--start-node",
                  "1", "--duration", "0") as w:
        mig0 = vmstat("pgmigrate_success")
        d = DaemonRun(["attach", str(w.pid), "--json", "--fast-budget", "96M", "--interval", "1",
                       "--profiler", "kmod"], env)
        try:
            shares = []
            deadline = time.monotonic() + WAIT
            while time.monotonic() < deadline:
                t = w.next_tick()
                assert t is not None, f"the workload ended: {w.done}; {d.stderr[-2000:]}"
                shares.append(t["fast_fraction"])
                if len(shares) > 3 and min(shares[-4:]) >= 0.95:
                    break
            moved = vmstat("pgmigrate_success") - mig0
            d.stop()
        finally:
            if d.proc.poll() is None:
                d.stop()
        why = (f"shares {[round(s, 2) for s in shares]}; {moved} pages migrated; "
               f"stderr: {d.stderr[-2000:]}")
        print(why)
        assert "abit mode (no hinting faults on 4 KiB pages)" in d.stderr, why
        assert shares and min(shares[-4:]) >= 0.95, "did not reach node 0 and stay: " + why
        assert all(s["fast_used"] <= 96 * MIB for s in d.stats), why
        assert moved <= 1.5 * HOT_MB * MIB // 4096, why
        assert w.stop() == 0, "the workload's memory check failed"
