"""Placement that holds, in the two-node VM: the hot set stays on the fast node under sparse
noise, and when the fast node (not the budget) is the limit the daemon exchanges pages.

    scripts/vm -k 6.12 -- python -m pytest -p no:cacheprovider -x -v tests/guest/test_daemon_placement.py

Behaviour, not timing: each test waits for what it checks with generous deadlines, and reads
the built-in workload's own truth (the share of its hot pages on node 0, from move_pages).
numa_balancing stays 0 (tests/guest/conftest.py): the kernel's own balancing must not place
pages for the daemon.
"""
from __future__ import annotations

import signal
import subprocess
import time

import numpy as np
import pytest

from pagetier.core import mover
from pagetier.profiler import kmod
from pagetier.workload import Workload, binary

from daemon_run import PAGETIER, DaemonRun
from helpers import node_free, split_json_lines

pytestmark = pytest.mark.vm
MIB = 1 << 20
WAIT = 900  # seconds: a daemon's start (imports) alone can take minutes on a loaded host


pytestmark = pytest.mark.usefixtures("kmod_loaded")


def _summary(stats, ticks, stderr="") -> str:
    fr = [(round(t["t"]), t.get("phase"), t["fast_fraction"]) for t in ticks]
    moves = [(s["interval"], s["promoted"] >> 8, s["demoted"] >> 8, s["fast_used"] >> 20,
              (s.get("fast_capacity") or 0) >> 20, s.get("limit"), s.get("policy", {}).get("noise_floor"),
              s.get("policy", {}).get("throttle_reasons"), s["ping_pongs"]) for s in stats]
    return (f"ticks (t, phase, fast_fraction): {fr}\n"
            f"intervals (n, promoted MiB, demoted MiB, fast MiB, capacity MiB, limit, noise floor, throttle, "
            f"ping-pongs): {moves}\nstderr: {stderr[-2000:]}")


def _has_freq() -> bool:
    """Whether the kmod profiler gives a frequency estimate (Sample.freq): without one a unit
    touched now and then cannot be told from a hot one (one count per scan: yes or no)."""
    with Workload("--size", "8", "--hot", "8", "--duration", "0", "--quiet") as w:
        prof = kmod.KmodProfiler(load=False)
        try:
            prof.attach(w.pid)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                time.sleep(1.2)
                s = prof.read(w.pid)
                if len(s) and (s.count > 0).any():
                    if len(s.freq) != len(s):
                        return False  # this module or profiler does not estimate it
                    if (s.freq > 0).any():
                        return True
            return False
        finally:
            prof.close()


@pytest.mark.one_kernel
def test_hot_set_holds_under_noise(env):
    """512 MiB with THP, 64 MiB hot, 100 of every million accesses anywhere, first touched on
    node 1, a 96 MiB budget: the hot set reaches the fast node and is still there at the end
    (it drained to 0% before: a count per interval made touched-once units tie with hot ones)."""
    # the module's frequency probes are on by default: without an estimate, noise cannot be
    # told from the hot set, and that is a regression, not a reason to skip
    assert _has_freq(), "pagetier.ko gave no frequency estimate (Sample.freq) within 60 s"
    cmd = [*PAGETIER, "run", "--json", "--fast-budget", "96M", "--interval", "1",
           "--profiler", "kmod", "--", str(binary()), "--size", "512", "--hot", "64",
           "--noise-ppm", "100", "--start-node", "1", "--duration", "40"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT, env=env)
    stats, events = split_json_lines(r.stdout)
    ticks = [e for e in events if e["event"] == "tick"]
    done = [e for e in events if e["event"] == "done"]
    why = _summary(stats, ticks, r.stderr)
    print(why)
    assert r.returncode == 0, why
    assert done and done[0]["pages_corrupt"] == 0
    assert all(s["fast_used"] <= 96 * MIB for s in stats), why
    assert any(t["fast_fraction"] >= 0.9 for t in ticks), "the hot set never reached node 0: " + why
    last = [t["fast_fraction"] for t in ticks[-3:] if t["fast_fraction"] >= 0]
    assert last and min(last) >= 0.9, "the hot set did not hold: " + why
    moved = sum(s["promoted"] + s["demoted"] for s in stats) * 4096
    print(f"moved {moved / MIB:.0f} MiB for a 64 MiB hot set; "
          f"ping-pongs {sum(s['ping_pongs'] for s in stats)}")


@pytest.mark.one_kernel
def test_exchange_when_the_node_is_fuller_than_the_budget(env):
    """80 MiB of a program's cold memory sits on node 0, its 40 MiB hot part on node 1, and a
    hog leaves node 0 little free memory; the 128 MiB budget would hold it all. The node, not
    the budget, is the limit: the daemon demotes cold pages to make room for hot ones (before:
    it promoted what fit above the watermark and stopped, the cold pages still fast), and the
    hot part ends mostly on the fast node."""
    w = Workload("--size", "120", "--hot", "40", "--hot-offset", "80", "--start-node", "1",
                 "--duration", "0", "--no-thp", "--wait")
    hog = d = None
    try:
        cold = w.ready["addr"] + np.arange(80 * 256, dtype=np.uint64) * np.uint64(4096)
        r = mover.move(w.pid, cold, 0)
        assert len(r.moved) >= 0.95 * len(cold), f"cold part not placed on node 0: {r}"
        d = DaemonRun(["attach", str(w.pid), "--json", "--fast-budget", "128M",
                       "--interval", "1"], env)
        # the daemon's own memory is allocated by its first interval: size the hog after it
        d.wait_for(lambda: len(d.stats) >= 1, WAIT, "a first interval")
        hog_mb = node_free(0) // MIB - 40
        if hog_mb < 64:
            pytest.skip(f"node 0 has only {node_free(0) // MIB} MiB free")
        hog = Workload("--size", str(hog_mb), "--hot", "1", "--duration", "0", "--quiet",
                       "--no-thp", cmd_prefix=["numactl", "--preferred=0"])
        print(f"hog {hog_mb} MiB; node 0 free now {node_free(0) // MIB} MiB")
        n0 = len(d.stats)
        w.proc.send_signal(signal.SIGUSR1)  # the accesses start
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            t = w.next_tick()
            assert t is not None, "workload ended early"
            if t["fast_fraction"] >= 0.9 and len(w.ticks) >= 3:
                break
        ticks = list(w.ticks)
        stats = list(d.stats[n0:])
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop()
        rc = w.stop()
        if hog is not None:
            hog.stop()
    why = _summary(stats, ticks, d.stderr if d else "")
    print(why)
    assert rc == 0, "workload memory corrupted"
    exchanges = [s for s in stats if s["promoted"] and s["demoted"]]
    assert exchanges, "no exchange: " + why
    # the node, not the budget, bounded the capacity the exchanges planned for; "limit" names
    # it after a decision that left hot units off the node (none when one exchange brought the
    # whole hot part in), and never names the budget here
    budget = 128 * MIB
    assert any(0 < (s.get("fast_capacity") or budget) < budget for s in exchanges), (
        "the node was not the limit of any exchange: " + why)
    assert not any(s.get("limit") == "budget" for s in stats), "the budget named the limit: " + why
    assert ticks[-1]["fast_fraction"] >= 0.9, "the hot part did not get the fast node: " + why
    assert "Traceback" not in d.stderr



# the hot window moves once, after PHASE_S seconds: a generous bound for a region of HOT_MB
# (about 6 s of moves at the 5 MB/s 4 KiB moves reached on a loaded emulated host)
PHASE_S = 20
HOT_MB = 32


@pytest.mark.one_kernel
def test_phase_change_with_4k_pages_is_followed_by_an_exchange(env):
    """THP off (the workload's MADV_NOHUGEPAGE: 4 KiB pages), two regions of HOT_MB first
    touched on node 1, the hot window in the first for PHASE_S seconds, then in the second, and
    a budget that holds one region but not both: after the change the daemon exchanges (in one
    interval it demotes pages of the old region and promotes pages of the new one), and most
    (>= 80%) of the new region reaches the fast node before the window would move back. Each
    exchange's stats say what it wanted and what stopped it."""
    from pagetier.core.step import EXCHANGE_LIMITS

    budget = HOT_MB * 4 // 3
    w = Workload("--size", str(2 * HOT_MB), "--hot", str(HOT_MB), "--phase", str(PHASE_S),
                 "--start-node", "1", "--duration", str(2 * PHASE_S), "--no-thp", "--wait")
    d = None
    try:
        d = DaemonRun(["attach", str(w.pid), "--json", "--fast-budget", f"{budget}M",
                       "--interval", "1"], env)
        d.wait_for(lambda: len(d.stats) >= 1, WAIT, "a first interval")
        n0 = len(d.stats)
        w.proc.send_signal(signal.SIGUSR1)  # the accesses (and the phases' clock) start
        while (t := w.next_tick()) is not None:
            if t["phase"] == 1 and t["fast_fraction"] >= 0.8:
                break  # the new region is there: no need to wait for the window to move back
        ticks = list(w.ticks)
        # the daemon prints an interval's stats after its moves: its next line or two
        k = len(d.stats)
        d.wait_for(lambda: len(d.stats) >= k + 2 or d.proc.poll() is not None, WAIT,
                   "the daemon's next intervals")
        stats = list(d.stats[n0:])
        rc = w.stop()
    finally:
        if d is not None and d.proc.poll() is None:
            d.stop()
        if w.proc.poll() is None:
            w.stop()
    why = _summary(stats, ticks, d.stderr)
    print(why)
    assert rc == 0, "workload memory corrupted"
    assert "Traceback" not in d.stderr
    assert all(s["fast_used"] <= budget * MIB for s in stats), why
    old = max((t["fast_fraction"] for t in ticks if t["phase"] == 0), default=-1)
    assert old >= 0.8, f"the first region never had 80% on node 0 (at most {old:.0%}): " + why
    new = max((t["fast_fraction"] for t in ticks if t["phase"] == 1), default=-1)
    assert new >= 0.8, f"after the change, at most {new:.0%} of the new region on node 0: " + why
    exchanges = [s for s in stats if s["promoted"] and s["demoted"]]
    assert exchanges, "no interval both demoted and promoted: " + why
    for s in exchanges:
        assert s["limit"] in EXCHANGE_LIMITS, why
        assert s["wanted_bytes"] >= (s["promoted"] + s["demoted"]) * 4096 > 0, why
