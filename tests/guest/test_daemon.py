"""The daemon end to end in the two-node VM (root, node 0 fast with the CPUs, node 1 slow).

    scripts/vm -k 6.12 -- .venv/bin/python -m pytest -x -q tests/guest/test_daemon.py

The built-in workload (hotcold) first-touches its buffer on node 1 and reports, once a second,
the fraction of its hot pages on node 0 (a move_pages query of its own): that is the truth the
placement tests check, with the daemon's JSON stats lines for the budget.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pagetier.core import mover
from pagetier.workload import Workload, binary

from daemon_run import NUMAB, PAGETIER
from helpers import split_json_lines

# inside the VM the module must load: a failure to load is an error of every test here
pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_loaded")]
MIB = 1 << 20


def run_daemon(env, daemon_args, workload_args, timeout=240):
    cmd = [*PAGETIER, "run", "--json", *daemon_args, "--", str(binary()), *workload_args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    stats, events = split_json_lines(r.stdout)
    return r, stats, events


def summary(r, stats, events) -> str:
    fr = [e["fast_fraction"] for e in events if e["event"] == "tick"]
    moves = [(s["interval"], s["t"], s["promoted"], s["demoted"], s["fast_used"] >> 20,
              s["wall_s"], s["cpu_s"]) for s in stats]
    return (f"fast_fraction per tick: {fr}\n(interval, t, promoted, demoted, fast MiB, wall_s, "
            f"cpu_s): {moves}\n"
            f"stderr: {r.stderr[-2000:]}")


def check_budget(stats, budget):
    assert stats, "no stats lines"
    for s in stats:
        assert s["budget"] == budget
        assert s["fast_used"] <= budget, f"interval {s['interval']}: {s['fast_used']} > {budget}"


def test_hot_set_promoted_within_budget(env, numab_on):
    r, stats, events = run_daemon(
        env, ["--fast-budget", "96M", "--interval", "1", "--profiler", "kmod"],
        ["--size", "256", "--hot", "64", "--start-node", "1", "--duration", "30"])
    assert r.returncode == 0, summary(r, stats, events)
    ticks = [e for e in events if e["event"] == "tick"]
    done = [e for e in events if e["event"] == "done"]
    assert done and done[0]["pages_corrupt"] == 0
    check_budget(stats, 96 * MIB)
    good = [t for t in ticks if t["fast_fraction"] >= 0.95]
    assert good, "hot pages never reached node 0: " + summary(r, stats, events)
    # within a few intervals of the first tick, and it stays there
    assert good[0]["t"] <= ticks[0]["t"] + 12, summary(r, stats, events)
    assert all(t["fast_fraction"] >= 0.95 for t in ticks[-5:]), summary(r, stats, events)
    assert sum(s["promoted"] for s in stats) >= 64 * 256
    assert NUMAB.read_text().strip() == "1", "numa_balancing not restored"
    assert "numa_balancing 1 -> 0" in r.stderr


@pytest.mark.one_kernel
def test_phased_workload_followed(env, numab_off):
    r, stats, events = run_daemon(
        env, ["--fast-budget", "96M", "--interval", "1", "--profiler", "kmod"],
        ["--size", "256", "--hot", "64", "--hot-offset", "32", "--start-node", "1",
         "--phase", "15", "--duration", "50"])
    assert r.returncode == 0, summary(r, stats, events)
    check_budget(stats, 96 * MIB)
    ticks = [e for e in events if e["event"] == "tick"]
    phases = sorted({t["phase"] for t in ticks})
    assert len(phases) >= 3, phases
    for p in phases[1:-1]:  # the first starts cold, the last may be cut short
        fr = [t["fast_fraction"] for t in ticks if t["phase"] == p]
        assert max(fr) >= 0.9, f"phase {p} not followed: " + summary(r, stats, events)
    assert sum(s["demoted"] for s in stats) > 0, "old hot windows were never demoted"
    assert NUMAB.read_text().strip() == "0"


def test_attach_moves_hot_pages(env, numab_off, tmp_path):
    # --duration 0: it runs until stopped (a fixed one could end first in a slow guest)
    with Workload("--size", "128", "--hot", "32", "--start-node", "1", "--duration", "0",
                  "--quiet") as w:
        rd = w.ready
        cmd = [*PAGETIER, "attach", str(w.pid), "--fast-budget", "48M", "--interval", "1",
               "--duration", "15", "--json"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        stats, _ = split_json_lines(r.stdout)
        check_budget(stats, 48 * MIB)
        hot = np.arange(rd["hot_addr"], rd["hot_addr"] + rd["hot_size"], 4096, dtype=np.uint64)
        nodes = mover.query_nodes(w.pid, hot)
        assert (nodes == 0).mean() >= 0.95, np.unique(nodes, return_counts=True)
        assert w.stop() == 0  # attach leaves the target running; its memory is intact
    assert NUMAB.read_text().strip() == "0"


def scrape_matches_status(env) -> None:
    """One scrape of the daemon's --metrics endpoint agrees with `pagetier status --json` of
    the same interval: the target's bytes on the fast and the slow node, the nodes' totals,
    and pagetier.ko's scan time (STATS) is there."""
    from prometheus_client.parser import text_string_to_metric_families

    for _ in range(5):  # a scrape and a status read that straddle an interval's end: again
        doc = json.loads(subprocess.run([*PAGETIER, "status", "--json"], capture_output=True,
                                        text=True, env=env, check=True).stdout)[0]
        with urllib.request.urlopen(f"http://{doc['metrics']}/metrics", timeout=30) as r:
            text = r.read().decode()
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(text) for s in fam.samples}
        if got.get(("pagetier_interval", ())) == doc["last"]["interval"]:
            break
    else:
        raise AssertionError(f"no scrape at the status file's interval: {doc['last']}")
    t = doc["targets"][0]
    assert t["fast_bytes"] + t["slow_bytes"] >= 32 * MIB, t  # its 64 MiB buffer, tracked
    for tier, node in (("fast", "0"), ("slow", "1")):
        key = ("pagetier_target_resident_bytes",
               (("cgroup", t.get("cgroup") or ""), ("node", node), ("pid", str(t["pid"])),
                ("tier", tier)))
        assert got[key] == t[f"{tier}_bytes"], (key, got.get(key), t)
        assert got[("pagetier_resident_bytes", (("node", node),))] == \
            doc["last"]["resident"].get(node, 0)
    assert got[("pagetier_promoted_bytes_total", ())] == doc["totals"]["promoted"] * 4096
    assert got[("pagetier_profiler_scan_seconds_total", (("pid", str(t["pid"])),))] > 0


def test_sigterm_stops_cleanly(env, numab_on, tmp_path):
    cmd = [*PAGETIER, "run", "--json", "--fast-budget", "96M", "--interval", "1",
           "--metrics", "127.0.0.1:0", "--",
           str(binary()), "--size", "64", "--hot", "16", "--start-node", "1", "--duration", "0"]
    d = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        n = 0
        t0 = time.monotonic()
        while n < 3 and time.monotonic() - t0 < 90:
            line = d.stdout.readline()
            if not line:
                break
            n += '"interval"' in line
        assert n == 3, d.stderr.read() if d.poll() is not None else "no stats"
        assert NUMAB.read_text().strip() == "0"
        assert list((tmp_path / "run").glob("daemon-*.json"))
        st = subprocess.run([*PAGETIER, "status"], capture_output=True, text=True, env=env)
        assert st.returncode == 0 and "hotcold" in st.stdout, st.stderr
        scrape_matches_status(env)
        d.send_signal(signal.SIGTERM)
        out, err = d.communicate(timeout=60)
    finally:
        if d.poll() is None:
            d.kill()
            d.wait()
    assert d.returncode == 0, err[-3000:]  # the workload got SIGTERM too and checked its pages
    assert "stopping: signal SIGTERM" in err and '"pages_corrupt":0' in out
    assert NUMAB.read_text().strip() == "1"
    assert not list((tmp_path / "run").glob("daemon-*.json"))


def test_sigkill_then_next_start_restores(env, numab_on):
    """SIGKILL `pagetier run`: numa_balancing stays as it set it and its command's cgroup stays;
    the next `pagetier run` restores the one and removes the other."""
    cmd = [*PAGETIER, "run", "--interval", "1", "--", "sleep", "60"]
    d = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env=env, start_new_session=True)
    try:
        assert d.stdout.readline().startswith("#")
        d.send_signal(signal.SIGKILL)
        d.wait()
        assert NUMAB.read_text().strip() == "0"  # nobody restored it...
    finally:
        os.killpg(d.pid, signal.SIGKILL)  # the orphaned sleep
    (left,) = Path("/sys/fs/cgroup").rglob(f"pagetier-run-{d.pid}")  # next to the daemon's own
    for _ in range(100):  # the sleep's exit ends a moment after its SIGKILL
        if not (left / "cgroup.procs").exists() or not (left / "cgroup.procs").read_text().strip():
            break
        time.sleep(0.1)
    r = subprocess.run([*PAGETIER, "run", "--interval", "1", "--", "true"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "died without restoring it" in r.stderr
    assert NUMAB.read_text().strip() == "1"  # ...until the next start
    assert not left.exists(), r.stderr
    assert f"removed cgroup {left}" in r.stderr


def test_target_exit_status_passed_through(env, numab_on):
    r = subprocess.run([*PAGETIER, "run", "--interval", "0.5", "--", "sh", "-c", "sleep 2; exit 3"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 3, r.stderr
    assert "all targets exited" in r.stderr
    assert NUMAB.read_text().strip() == "1"


def test_bad_config_clear_message(env, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('fast_budget = "96M"\nintervall = 1\n')
    r = subprocess.run([*PAGETIER, "run", "-c", str(bad), "--", "true"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert f"config {bad}: unknown key 'intervall'" in r.stderr and "Traceback" not in r.stderr


def test_missing_node_clear_message(env):
    r = subprocess.run([*PAGETIER, "run", "--slow-node", "5", "--", "true"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 1
    assert "slow_node 5" in r.stderr and "nodes with memory: 0, 1" in r.stderr
    assert "Traceback" not in r.stderr


def test_mover_between_nodes():
    """Our own pages to node 1 and back, and a batched raw loop for comparison."""
    import ctypes
    import mmap

    size = 16 * MIB
    buf = mmap.mmap(-1, size)
    buf.write(b"\xa5" * size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    addrs = np.arange(base, base + size, 4096, dtype=np.uint64)
    for node in (1, 0):
        r = mover.move(0, addrs, node)
        assert len(r.moved) + len(r.busy) == len(addrs), r.errors
        q = mover.query_nodes(0, addrs)
        assert (q == node).mean() >= 0.99
    assert buf[:16] == b"\xa5" * 16


@pytest.mark.parametrize("mode", ["fault", "abit"])
def test_region_granularity_promotes_the_hot_regions(env, numab_on, mode):
    """With region records (the default for targets over 1 GiB, asked for here on a small one),
    the daemon moves 2 MiB regions of 4 KiB pages page by page: the hot set reaches the fast
    node within the budget, and no page is corrupted."""
    r, stats, events = run_daemon(
        env, ["--fast-budget", "96M", "--interval", "1", "--profiler", "kmod",
              "--profiler-option", f"mode={mode}", "--profiler-option", "granularity=region",
              "--profiler-option", "kinds=off"],  # 4 KiB pages: kinds auto would choose abit
        ["--size", "256", "--hot", "32", "--hot-offset", "64", "--start-node", "1", "--no-thp",
         "--duration", "30"])
    assert r.returncode == 0, summary(r, stats, events)
    done = [e for e in events if e["event"] == "done"]
    assert done and done[0]["pages_corrupt"] == 0
    check_budget(stats, 96 * MIB)
    ticks = [e for e in events if e["event"] == "tick"]
    assert any(t["fast_fraction"] >= 0.95 for t in ticks), summary(r, stats, events)
    assert all(t["fast_fraction"] >= 0.95 for t in ticks[-5:]), summary(r, stats, events)
    assert sum(s["promoted"] for s in stats) >= 32 * 256
