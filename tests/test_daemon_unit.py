"""Daemon unit tests: no root needed (except where the host kernel is asked), no VM.

The mover tests use the host kernel on the test process itself: the host has one NUMA node, so
moving our own pages to node 0 works and moving them to node 1 fails with a clear error.
"""
from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pagetier.daemon import config as config_mod
from pagetier.core import mover, planner
from pagetier.core.state import PageState
from pagetier.daemon.clock import FakeClock
from pagetier.daemon import loop
from pagetier.daemon.loop import Daemon
from pagetier.daemon.numab import NumaBalancing
from pagetier.daemon.report import human_line
from pagetier.errors import ConfigError, Unavailable
from pagetier.policies.base import Decision, Policy, register
from pagetier.profiler.stub import StubProfiler

REPO = Path(__file__).resolve().parent.parent
PAGETIER = [sys.executable, "-m", "pagetier.cli"]
MIB = 1 << 20


# --------------------------------------------------------------------------- test policies
@register("test-greedy")
class Greedy(Policy):
    """Misbehaves on purpose: asks to promote every unit not on the fast node, hottest first."""

    def decide(self, state, ctx):
        idx = np.flatnonzero(state.node != ctx.fast_node)
        idx = idx[np.argsort(-state.heat[idx], kind="stable")]
        return Decision(promote=idx, stats={"asked": len(idx)})


@register("test-flip")
class Flip(Policy):
    """Moves every unit to the other node each interval: all ping-pong."""

    def decide(self, state, ctx):
        fast = np.flatnonzero(state.node == ctx.fast_node)
        slow = np.flatnonzero(state.node == ctx.slow_node)
        return Decision(promote=slow, demote=fast)


@register("test-idle")
class Idle(Policy):
    def decide(self, state, ctx):
        return Decision()


class StubMover:
    """Moves nothing in the kernel: reports each page as ``outcome(pid, addrs, node)`` says
    (default: all moved) and tells the stub profiler, so its nodes follow."""

    def __init__(self, profiler=None, outcome=None):
        self.profiler, self.outcome = profiler, outcome
        self.calls: list[tuple[int, int, int]] = []

    def move(self, pid, addrs, node):
        self.calls.append((pid, len(addrs), node))
        status = np.full(len(addrs), node, np.int32)
        if self.outcome:
            status = np.asarray(self.outcome(pid, addrs, node), np.int32)
        r = mover.MoveResult(**mover.classify(status, node))
        r.stopped = bool(len(r.nomem))
        return r


def daemon_config(tmp_path, path=None, **values):
    """A config for a daemon under test (the file's alone, or the stub profiler and
    ``values``): no signal handlers, the status file in tmp_path."""
    cfg = config_mod.load(path, None if path else {"profiler": "stub", **values})
    cfg.handle_signals, cfg.status_file = False, str(tmp_path / "status.json")
    return cfg


def make_daemon(tmp_path, policy="test-greedy", units=4096, hot=1024, node=1, budget="8M",
                rate=0.0, dry_run=False, pids=(4242,), outcome=None, prof=None, config_path=None,
                node_root=None, control_socket=None, clock=None, **kw):
    cfg = daemon_config(tmp_path, config_path, policy=policy, fast_budget=budget, rate=rate,
                        dry_run=dry_run, json=True, interval=0.01)
    if node_root is not None:
        cfg.node_root = node_root
    cfg.control_socket = None if control_socket is None else str(control_socket)
    if prof is None:
        prof = StubProfiler(units=units, hot=hot, node=node, track_moves=True)
    from pagetier import policies

    d = Daemon(cfg, pids=pids, profiler=prof, policy=policies.create(policy),
               mover=StubMover(prof, outcome), numab=False, out=open(os.devnull, "w"),
               clock=clock if clock is not None else FakeClock(), **kw)
    d.tracker.alive = lambda pid: True  # fake pids
    for p in pids:
        d.tracker.attach(p)
    return d


# --------------------------------------------------------------------------- config
def write(tmp_path, text):
    p = tmp_path / "pagetier.toml"
    p.write_text(textwrap.dedent(text))
    return p


def test_config_defaults_and_file(tmp_path):
    p = write(tmp_path, """
        policy = "heuristic"
        fast_budget = "96M"
        rate = 100
        interval = 2
        [policy_options]
        min_heat = 2.0
        [profiler_options]
        mode = "abit"
    """)
    cfg = config_mod.load(p)
    assert cfg.fast_budget == 96 * MIB and cfg.rate == 100.0 and cfg.interval == 2.0
    assert cfg.policy_options == {"min_heat": 2.0} and cfg.profiler_options == {"mode": "abit"}
    assert config_mod.load(None).profiler == "kmod"


@pytest.mark.parametrize("text,words", [
    ('intervall = 1\n', ["unknown key 'intervall'", "pagetier.toml"]),
    ('interval = "1"\n', ["'interval'", "must be a number", "pagetier.toml"]),
    ('fast_node = 1.5\n', ["'fast_node'", "integer"]),
    ('dry_run = 1\n', ["'dry_run'", "true or false"]),
    ('fast_budget = "96 bananas"\n', ["fast_budget", "96 bananas"]),
    ('fast_budget = -5\n', ["fast_budget", "negative"]),
    ('fast_budget = "1G"\nfast_free_watermark = "1G"\n', ["not both"]),
    ('fast_node = 1\n', ["both 1"]),
    ('interval = 0\n', ["interval must be > 0"]),
    ('policy_options = 3\n', ["'policy_options'", "table"]),
    ('interval = \n', ["not valid TOML"]),
])
def test_config_errors_name_key_and_file(tmp_path, text, words):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        config_mod.load(p)
    for w in words:
        assert w in str(e.value)


def test_config_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        config_mod.load(tmp_path / "nope.toml")


@pytest.mark.parametrize("text,size", [
    ("96M", 96 * MIB), ("2G", 2 << 30), ("512k", 512 << 10), ("4096", 4096), (4096, 4096),
    ("1.5G", 3 << 29), ("96MiB", 96 * MIB), ("1T", 1 << 40),
])
def test_parse_size(text, size):
    assert config_mod.parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "M", "-1M", "1X", True, 1.5, "1 G B"])
def test_parse_size_bad(bad):
    with pytest.raises(ConfigError):
        config_mod.parse_size(bad, "fast_budget")


def test_cli_overrides_file(tmp_path):
    p = write(tmp_path, 'fast_free_watermark = "1G"\nrate = 10\n[profiler_options]\nmode = "fault"\n'
                        'scan_period_ms = 100\n')
    cfg = config_mod.load(p, {"fast_budget": "96M", "rate": None, "interval": 0.5,
                              "profiler_options": {"mode": "abit"}})
    assert cfg.fast_budget == 96 * MIB and cfg.fast_free_watermark is None
    assert cfg.rate == 10.0 and cfg.interval == 0.5
    assert cfg.profiler_options == {"mode": "abit", "scan_period_ms": 100}
    with pytest.raises(ConfigError, match="command line: key 'rate'"):
        config_mod.load(p, {"rate": "fast"})


def test_kmod_scan_period_defaults_to_a_quarter_of_the_interval(tmp_path):
    """Without a scan_period_ms of their own, kmod's options get a quarter of the interval,
    within the module's bounds; a configured one (0 too: the module's own default) is kept,
    and other profilers get their options as configured."""
    from pagetier import uapi
    from pagetier.daemon.loop import profiler_options

    def opts(interval, **profiler_opts):
        cfg = config_mod.load(None, {"interval": interval, "profiler_options": profiler_opts})
        return profiler_options(cfg)

    assert opts(1.0) == {"scan_period_ms": 250}
    assert opts(2.0, mode="abit") == {"mode": "abit", "scan_period_ms": 500}
    assert opts(0.01)["scan_period_ms"] == uapi.SCAN_PERIOD_MIN_MS
    assert opts(600.0)["scan_period_ms"] == uapi.SCAN_PERIOD_MAX_MS
    assert opts(1.0, scan_period_ms=100) == {"scan_period_ms": 100}
    assert opts(1.0, scan_period_ms=0) == {"scan_period_ms": 0}
    cfg = config_mod.load(None, {"profiler": "stub", "profiler_options": {}})
    assert profiler_options(cfg) == {}


def test_missing_node(tmp_path):
    root = tmp_path / "node"
    (root / "node0").mkdir(parents=True)
    (root / "has_memory").write_text("0\n")
    cfg = config_mod.load(None)
    with pytest.raises(Unavailable) as e:
        config_mod.check_nodes(cfg, root)
    assert "slow_node 1" in str(e.value) and "nodes with memory: 0" in str(e.value)
    assert "numactl -H" in str(e.value)
    (root / "has_memory").write_text("0-1\n")
    config_mod.check_nodes(cfg, root)
    assert config_mod.nodes_with_memory(root) == [0, 1]


def test_node_meminfo(tmp_path):
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / "meminfo").write_text(
        "Node 0 MemTotal:        2048000 kB\nNode 0 MemFree:          1024000 kB\n")
    assert config_mod.node_meminfo(0, tmp_path)["MemFree"] == 1024000 * 1024
    assert config_mod.node_memfree(0, tmp_path) == 1024000 * 1024
    (tmp_path / "node0" / "meminfo").write_text("Node 0 MemTotal:  2048000 kB\n"
                                                "Node 0 MemFree:   77 kB")  # the last line
    assert config_mod.node_memfree(0, tmp_path) == 77 * 1024
    (tmp_path / "node0" / "meminfo").write_text("Node 0 MemTotal:  2048000 kB\n")
    with pytest.raises(KeyError):
        config_mod.node_memfree(0, tmp_path)


# --------------------------------------------------------------------------- the loop
def test_budget_enforced_against_greedy_policy(tmp_path):
    d = make_daemon(tmp_path, units=4096, hot=4096, budget="8M")  # wants 16 MiB on fast
    for _ in range(5):
        s = d.step()
        assert s["fast_used"] <= 8 * MIB
    assert s["fast_used"] == 8 * MIB and d.state.pages_on(0) == 2048
    assert d.totals["promoted"] == 2048 and d.totals["clipped"] > 0


def test_dry_run_moves_nothing(tmp_path):
    d = make_daemon(tmp_path, dry_run=True, units=4096, hot=1024, budget="2M")
    s = d.step()
    assert d.mover.calls == []
    assert s["promoted"] == 512 and s["bytes_moved"] == 0 and s["dry_run"]
    assert s["fast_used"] == 0 and s["resident"] == {"1": 16 * MIB}


def test_rate_limit_clips_moves(tmp_path):
    d = make_daemon(tmp_path, units=4096, hot=4096, budget="64M", rate=4.0)  # 4 MB/s, 0.01 s
    limit = planner.rate_pages(4.0, 0.01)
    for _ in range(3):
        s = d.step()
        assert 0 < s["promoted"] <= limit
    assert s["rate_pages"] == limit


def test_forced_demotion_when_over_budget(tmp_path):
    d = make_daemon(tmp_path, policy="test-idle", units=4096, hot=1024, node=0, budget="4M")
    s = d.step()  # everything starts on the fast node: 16 MiB over a 4 MiB budget
    assert s["forced_demotions"] == 3072 and s["demoted"] == 3072
    assert s["fast_used"] == 4 * MIB
    # the hot units (the first 1024) stay on the fast node
    assert (d.state.node[:1024] == 0).all() and (d.state.node[1024:] == 1).all()


def test_ping_pong_counted(tmp_path):
    d = make_daemon(tmp_path, policy="test-flip", units=64, hot=64, budget="1G")
    first = d.step()
    assert first["promoted"] == 64 and first["ping_pongs"] == 0
    second = d.step()
    assert second["demoted"] == 64 and second["ping_pongs"] == 64
    d.step()
    assert d.totals["ping_pongs"] == 128
    # a move back after more than ping_pong_window intervals is not a ping-pong
    d.cfg.ping_pong_window, d.policy = 2, Idle()
    d.step(), d.step()
    d.policy = Flip()
    assert d.step()["ping_pongs"] == 0


def test_moves_and_ping_pongs_per_target_in_the_status(tmp_path):
    """Each target's status entry (and so its metrics) carries the bytes moved to each node
    and its ping-pongs over the run, its own and not another target's."""
    d = make_daemon(tmp_path, policy="test-flip", units=64, hot=64, budget="1G", pids=(11, 12))
    d.step(), d.step()  # promote all, then demote all: every demotion a ping-pong
    d.write_status()
    doc = json.loads(Path(d.cfg.status_file).read_text())
    by_pid = {t["pid"]: t for t in doc["targets"]}
    assert set(by_pid) == {11, 12}
    total_promoted = sum(t["promoted_bytes"] for t in by_pid.values())
    assert total_promoted == d.totals["promoted"] * 4096 > 0
    assert sum(t["demoted_bytes"] for t in by_pid.values()) == d.totals["demoted"] * 4096
    assert sum(t["ping_pongs"] for t in by_pid.values()) == d.totals["ping_pongs"] > 0
    assert all(t["promoted_bytes"] > 0 for t in by_pid.values())  # each its own pages


def test_busy_pages_are_errno_counts_tried_once_an_interval(tmp_path, monkeypatch):
    """Pages the kernel keeps answering -EBUSY or -EAGAIN (shmem and page-cache folios locked
    or under writeback), through the real mover against a stand-in move_pages: each
    interval's stats count them by errno name, the run's totals add them up, and each is sent
    to move_pages once an interval, never again within it."""
    busy: dict[int, int] = {}
    tries: dict[int, int] = {}

    def raw(pid, addrs, nodes, status, flags):
        if not busy:  # the first 12 pages asked for stay busy
            busy.update({int(a): errno.EBUSY for a in addrs[:8]})
            busy.update({int(a): errno.EAGAIN for a in addrs[8:12]})
        for i, a in enumerate(addrs.tolist()):
            status[i] = -busy[a] if a in busy else int(nodes[i])
            if a in busy:
                tries[a] = tries.get(a, 0) + 1
        return 0

    monkeypatch.setattr(mover, "_raw", raw)
    monkeypatch.setattr(mover, "_move_all", True)
    monkeypatch.setattr(mover, "_cap", True)

    class RealMover(StubMover):
        def move(self, pid, addrs, node):
            return mover.move(pid, addrs, node)

    d = make_daemon(tmp_path, units=100, hot=100, budget="1G")
    d.executor.mover = RealMover()
    for n in range(1, 4):
        s = d.step()
        assert s["errors"] == {"EBUSY": 8, "EAGAIN": 4} and s["busy"] == 12
        assert set(tries.values()) == {n}  # once an interval each
    assert d.move_errors == {"EBUSY": 24, "EAGAIN": 12}
    assert d.state.pages_on(0) == 88


def test_mover_outcomes_busy_gone_nomem(tmp_path):
    def outcome(pid, addrs, node):
        st = np.full(len(addrs), node, np.int32)
        st[0], st[1], st[2] = -errno.EBUSY, -errno.ENOENT, -errno.EFAULT
        if node == 1:
            st[3] = -errno.ENOMEM
        return st

    d = make_daemon(tmp_path, units=100, hot=100, budget="1G", outcome=outcome)
    s = d.step()
    assert s["busy"] == 1 and s["gone"] == 2 and s["promoted"] == 97
    assert len(d.state) == 98  # the gone units are forgotten
    # ENOMEM on a demotion stops the interval: no promotion after it
    d2 = make_daemon(tmp_path, policy="test-flip", units=10, hot=10, node=0, budget="1G",
                     outcome=outcome)
    s2 = d2.step()
    assert s2["nomem"] == 1 and s2["promoted"] == 0


def test_target_exit_is_dropped(tmp_path):
    d = make_daemon(tmp_path, pids=(11, 12))
    d.step()
    alive = {11: True, 12: False}
    d.tracker.alive = lambda pid: alive[pid]
    d.refresh_targets()
    assert d.targets == {11} and d.profiler.detached == [12]
    assert set(d.state.pid_of(np.arange(len(d.state))).tolist()) == {11}


def test_run_returns_child_status_and_writes_status(tmp_path):
    """The loop on a fake clock: the command exits (status 7) when the test closes its stdin,
    after the third interval."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); raise SystemExit(7)"],
                             stdin=subprocess.PIPE)
    cfg = daemon_config(tmp_path, policy="test-greedy", interval=0.1, fast_budget="4M",
                        control_socket=str(tmp_path / "c.sock"))
    prof = StubProfiler(units=256, hot=16)
    seen = []
    clock = FakeClock()
    d = Daemon(cfg, child=child, profiler=prof, policy=Greedy(), mover=StubMover(prof),
               numab=False, out=open(os.devnull, "w"), clock=clock)
    orig = d.write_status

    def spy():
        orig()
        seen.append(json.loads((tmp_path / "status.json").read_text()))
        if (seen[-1]["last"] or {}).get("interval") == 3:
            child.stdin.close()
            child.wait(timeout=60)

    d.write_status = spy
    assert d.run() == 7
    assert prof.closed and not (tmp_path / "status.json").exists()
    assert seen and seen[-1]["targets"][0]["pid"] == child.pid
    assert seen[-1]["last"]["interval"] == 3 and d.stop_reason == "all targets exited"
    assert seen[-1]["last"]["t"] == pytest.approx(0.3)  # three intervals of the fake clock
    from pagetier.daemon.status import format_status

    text = format_status({**seen[-1], "alive": True})
    assert f"pid {os.getpid()}" in text and "targets:" in text


def run_for(tmp_path, *, interval: float, duration: float, prof):
    """A greedy daemon on one fake pid for ``duration`` seconds of a FakeClock."""
    cfg = daemon_config(tmp_path, policy="test-greedy", interval=interval, fast_budget="4M",
                        json=True, control_socket=str(tmp_path / "c.sock"))
    cfg.duration = duration
    clock = FakeClock()
    d = Daemon(cfg, pids=(4242,), profiler=prof, policy=Greedy(), mover=StubMover(prof),
               numab=False, out=open(os.devnull, "w"), clock=clock)
    d.tracker.alive = lambda pid: True
    return d, clock


def step_times(d, clock) -> list:
    """The times (since the start) at which ``d``'s steps begin, filled in as it runs."""
    steps = []
    orig = d.step

    def step(boundary=False):
        steps.append(clock.monotonic() - d._t0)
        return orig(boundary)

    d.step = step
    return steps


def run_with_periods(tmp_path, prof, *, duration: float, stalled: bool = False):
    """run_for at a 1 s interval with a profiler whose 500 ms periods end at ``ends`` (times
    after the start; none ever ends when ``stalled``). Returns (daemon, clock, ends)."""
    prof.period_s = 0.5
    d, clock = run_for(tmp_path, interval=1.0, duration=duration, prof=prof)
    ends = 0.13 + 0.5 * np.arange(int(duration / 0.5) + 10)
    prof.periods = lambda pid: 0 if stalled else int((ends <= clock.monotonic() - d._t0).sum())
    return d, clock, ends


def test_first_interval_after_one_interval_of_counts(tmp_path):
    """The first decision comes one interval after the start, not on a read made right after
    attach (no counts yet); the status file exists from the start."""
    d, clock = run_for(tmp_path, interval=0.3, duration=0.5, prof=StubProfiler(units=256, hot=16))
    steps = []
    orig = d.step

    def step(boundary=False):
        steps.append(((tmp_path / "status.json").exists(), clock.monotonic() - d._t0))
        return orig(boundary)

    d.step = step
    assert d.run() == 0
    # steps at 0.3 s and at the 0.5 s deadline, none right after attach
    assert [round(t, 6) for _, t in steps] == [0.3, 0.5] and steps[0][0]
    assert d.stop_reason == "--duration 0.5 s reached"


@pytest.mark.parametrize("stalled", [False, True])
def test_reads_follow_the_profilers_periods(tmp_path, stalled):
    """With a profiler whose estimates come at the end of each sampling period (pagetier.ko's
    scans), each interval after the first ends just after a period ends, within half a period
    of when it was due; when no period ends (a stalled profiler), half a period late."""
    prof = StubProfiler(units=256, hot=16)
    d, clock, ends = run_with_periods(tmp_path, prof, duration=6.0, stalled=stalled)
    steps = step_times(d, clock)
    assert d.run() == 0
    later = np.array(steps[1:-1])  # the last: the deadline
    assert len(later) >= 3
    assert np.all(np.diff(steps[:-1]) >= 0.75 - 1e-9) and np.all(np.diff(steps[:-1]) <= 1.25 + 1e-9)
    if stalled:
        assert np.allclose(np.diff(steps[:-1]), 1.25)
    else:
        since = later - ends[np.searchsorted(ends, later + 1e-9) - 1]
        assert np.all(since <= 0.02 + 1e-9), since


def test_the_wait_for_a_period_end_asks_from_shortly_before_a_period_after_the_last(tmp_path):
    """The wait for the profiler's period ends asks the profiler (an ioctl a target under
    pagetier.ko) every PERIOD_POLL_S only from PERIOD_LEAD_S before a period after the last end
    it saw, not all period long; the reads still follow the period ends."""
    prof = StubProfiler(units=256, hot=16)
    d, clock, ends = run_with_periods(tmp_path, prof, duration=6.0)
    count = prof.periods
    asked = []
    prof.periods = lambda pid: asked.append(clock.monotonic() - d._t0) or count(pid)
    steps = step_times(d, clock)
    assert d.run() == 0
    later = np.array(steps[1:-1])
    since = later - ends[np.searchsorted(ends, later + 1e-9) - 1]
    assert len(later) >= 3 and np.all(since <= loop.PERIOD_POLL_S + 1e-9), since
    # after the first read: about PERIOD_LEAD_S / PERIOD_POLL_S asks a period (the wait until
    # the interval is nearly due asks nothing; from then on it asks from shortly before the
    # end expected), not every PERIOD_POLL_S from half a period on
    asked = np.array(asked)
    asked = asked[asked > steps[1]]
    per_period = len(asked) / ((asked[-1] - steps[1]) / prof.period_s)
    assert per_period <= loop.PERIOD_LEAD_S / loop.PERIOD_POLL_S + 1, per_period


def test_periods_closer_than_a_period_are_still_seen_as_they_end(tmp_path):
    """Periods that end closer together than a period (pagetier.ko: a period the scan budget
    cut is followed after a quarter period's rest) are asked for from half a period after the
    last end again once one was found already ended at the first ask, and seen within
    PERIOD_POLL_S of their ends after a few; when they are a period apart again, the asks start
    PERIOD_LEAD_S before the end expected again."""
    prof = StubProfiler(units=256, hot=16)
    d, clock, _ = run_with_periods(tmp_path, prof, duration=9.0)
    # a period (0.5 s) apart, 0.3 s apart from 2.13 s to 4.83 s, then a period apart again
    ends = np.concatenate([0.13 + 0.5 * np.arange(5), 2.43 + 0.3 * np.arange(10),
                           5.33 + 0.5 * np.arange(10)])
    asked, seen = [], []
    prof.periods = lambda pid: (asked.append(clock.monotonic() - d._t0)
                                or int((ends <= clock.monotonic() - d._t0).sum()))
    d.policy.looks_between_reads = True  # every end between reads is looked at
    d.policy.read_now = lambda state, samples: seen.append(clock.monotonic() - d._t0) and False
    steps = step_times(d, clock)
    assert d.run() == 0
    seen = np.sort(np.concatenate([seen, steps[1:-1]]))  # looks and reads
    first = np.searchsorted(ends, steps[1]) + 1
    late = {}
    for e in ends[first:]:
        if e >= seen[-1]:
            break
        late[e] = seen[np.searchsorted(seen, e - 1e-9)] - e
    short = [late[e] for e in late if 2.43 <= e < 5.0]
    assert len(short) >= 6 and max(short[4:]) <= loop.PERIOD_POLL_S + 1e-9, short
    again = [late[e] for e in late if e > 5.5]
    assert len(again) >= 4 and max(again) <= loop.PERIOD_POLL_S + 1e-9, again
    # two ends seen as they came a period apart (6.33 s): in each interval from the next read
    # on, PERIOD_LEAD_S / PERIOD_POLL_S + 1 asks for each of its two period ends, and one for
    # the count at the start of each of its two waits (the looks' and the read's)
    asked, reads = np.array(asked), np.array([t for t in steps if t > 6.5])
    per_read = [np.count_nonzero((asked >= a) & (asked < b)) for a, b in zip(reads, reads[1:])]
    assert len(per_read) >= 2
    assert max(per_read) <= 2 * (loop.PERIOD_LEAD_S / loop.PERIOD_POLL_S + 2), per_read


def test_an_idle_read_is_followed_by_one_at_the_next_period_end(tmp_path):
    """A read with no access rate (the target has not started its accesses) is followed by one
    at the next end of a profiler period, not a whole interval later: the accesses that end an
    idle stretch are promoted a period after they start. Once reads find accesses, intervals
    are an interval long again."""
    start = 2.6  # the target starts its accesses here
    addr = 0x7f0000000000 + np.arange(256, dtype=np.uint64) * np.uint64(4096)

    def source(pid, i):
        busy = clock.monotonic() - d._t0 >= start
        return addr, np.where(np.arange(256) < 16, 10 if busy else 0, 0), 1, 1

    prof = StubProfiler(source=source)
    d, clock, ends = run_with_periods(tmp_path, prof, duration=7.0)
    steps, early = [], []
    orig = d.step

    def step(boundary=False):
        steps.append(clock.monotonic() - d._t0)
        s = orig(boundary)
        early.append(s["early"])
        return s

    d.step = step
    assert d.run() == 0
    first = next(k for k, t in enumerate(steps) if t >= start)
    # idle until then: every read after the first came at the next period end
    assert all(early[1:first + 1]) and not early[0]
    idle = np.array(steps[1:first + 1])
    ended = ends[np.searchsorted(ends, idle + 1e-9) - 1]
    assert np.all(idle - ended <= 0.02 + 1e-9) and len(set(ended)) == len(ended), steps
    assert np.all(np.diff(steps[:first + 1]) <= 0.5 + 0.02), steps
    # the first read of the accesses: at the first period end after they start
    assert steps[first] == pytest.approx(ends[np.searchsorted(ends, start)], abs=0.03)
    gaps = np.diff(steps[first:-1])  # busy from then on: an interval apart (the last: deadline)
    assert len(gaps) >= 2 and np.all(gaps >= 0.75 - 1e-9), gaps
    assert not any(early[first + 1:])


@pytest.mark.parametrize("looks", [False, True])
def test_a_look_between_reads_brings_the_read_forward(tmp_path, looks):
    """A policy that looks between reads (Policy.looks_between_reads) is shown, at each period
    end between two reads, what the profiler has counted, without taking it (read with
    reset=False); when it answers True (Policy.read_now) the read comes right then, early
    (sharing the interval's rate limit) and flagged ``looked``, and the intervals go on from
    it. A policy that does not look is never shown anything, and its reads stay an interval
    apart."""
    prof = StubProfiler(units=256, hot=16)
    d, clock, ends = run_with_periods(tmp_path, prof, duration=6.0)
    shown, resets = [], []
    read = prof.read

    def spy(pid, reset=True, accessed_only=False):
        resets.append(reset)
        return read(pid, reset=reset, accessed_only=accessed_only)

    prof.read = spy
    d.policy.looks_between_reads = looks

    def read_now(state, samples):
        t = clock.monotonic() - d._t0
        shown.append((t, sorted(samples)))
        return len(shown) == 3  # the third look asks for a read

    d.policy.read_now = read_now
    steps = []
    orig = d.step

    def step(boundary=False):
        s = orig(boundary)
        steps.append((round(s["t"], 2), s["early"], s["looked"]))
        return s

    d.step = step
    assert d.run() == 0
    if not looks:
        assert not shown and all(resets), resets
        assert not any(e or lk for _, e, lk in steps) and len(steps) >= 5, steps
        return
    # looks at the period ends between reads, each on the target, none taken
    assert len(shown) >= 4 and all(pids == [4242] for _, pids in shown), shown
    assert resets.count(False) == len(shown)
    assert all(np.isclose(ends, t, atol=0.021).any() for t, _ in shown), shown
    looked = [k for k, (_, _, lk) in enumerate(steps) if lk]
    assert len(looked) == 1, steps
    t, early, _ = steps[looked[0]]
    assert early and t == pytest.approx(shown[2][0], abs=0.021), (steps, shown)
    assert steps[looked[0] + 1][0] - t >= 0.75, steps  # an interval on from it


def record_early(d) -> list[bool]:
    """Wrap ``d.step``: the returned list gets each step's ``early`` flag."""
    early, orig = [], d.step

    def step(boundary=False):
        s = orig(boundary)
        early.append(s["early"])
        return s

    d.step = step
    return early


def test_a_partial_read_is_read_again_at_the_next_period_end(tmp_path):
    """A read that finds under half as many units with an access rate as the last full one (a
    read that missed most units) is followed by one at the next period end; a re-read that is
    partial again is taken as it is (the program accesses fewer units now): the intervals are
    an interval long again."""
    addr = 0x7f0000000000 + np.arange(256, dtype=np.uint64) * np.uint64(4096)
    reads = []

    def source(pid, i):
        t = clock.monotonic() - d._t0
        reads.append(t)
        # 64 units accessed; the read at 3-3.5 s misses most; from 5 s on 16 units only
        n = 16 if t >= 5.0 or 3.0 <= t < 3.5 else 64
        return addr, np.where(np.arange(256) < n, 10, 0), 1, 1

    prof = StubProfiler(source=source)
    d, clock, ends = run_with_periods(tmp_path, prof, duration=9.0)
    early = record_early(d)
    assert d.run() == 0
    gaps = np.diff(reads)
    partial = next(k for k, t in enumerate(reads) if 3.0 <= t < 3.5)
    assert early[partial + 1] and gaps[partial] <= 0.5 + 0.02, reads
    fewer = next(k for k, t in enumerate(reads) if t >= 5.0)
    assert early[fewer + 1] and not any(early[fewer + 2:]), (reads, early)
    assert sum(early) == 2 and np.all(gaps[fewer + 1:-1] >= 0.75 - 1e-9), (reads, early)


def test_a_policy_can_ask_for_the_next_read_at_the_next_period_end(tmp_path):
    """A decision with ``read_soon`` (the policy cannot judge the read yet) is followed by a
    read at the next period end, and is honoured for two early reads in a row at most: a
    policy that asks every time gets every third read an interval after the last."""
    addr = 0x7f0000000000 + np.arange(256, dtype=np.uint64) * np.uint64(4096)
    prof = StubProfiler(source=lambda pid, i: (addr, np.where(np.arange(256) < 64, 10, 0), 1, 1))
    d, clock, ends = run_with_periods(tmp_path, prof, duration=9.0)
    decide = d.policy.decide
    reads = []

    def ask(st, ctx):
        t = clock.monotonic() - d._t0
        reads.append(t)
        dec = decide(st, ctx)
        dec.read_soon = t >= 3.0
        return dec

    d.policy.decide = ask
    early = record_early(d)
    assert d.run() == 0
    first = next(k for k, t in enumerate(reads) if t >= 3.0)
    assert not any(early[:first + 1]), (reads, early)
    # from then on: two early reads, a period apart, then one an interval later, and again
    after = early[first + 1:]
    assert len(after) >= 5 and after[:5] == [True, True, False, True, True], (reads, early)
    gaps = np.diff(reads[first:])
    assert np.all(gaps[[0, 1, 3, 4]] <= 0.5 + 0.02) and gaps[2] >= 0.75 - 1e-9, (reads, early)


def test_the_first_promoting_steps_import_no_module(tmp_path):
    """A module imported by a first call is paid for in the first decision after attach: numpy's
    median imported numpy.ma, 12 ms natively and 0.3-0.5 s in the test VM, before the first
    promotions. Once the daemon is set up, steps that promote, exchange and report import
    nothing (run in a fresh interpreter: this one has imported everything already)."""
    script = textwrap.dedent(f"""
        import io, pathlib, sys
        sys.path.insert(0, {str(REPO / "tests")!r})
        import test_daemon_unit as t
        d = t.make_daemon(pathlib.Path({str(tmp_path)!r}), policy="heuristic", units=512,
                          hot=64, budget="128K")
        d.report.out = io.StringIO()
        before = set(sys.modules)
        stats = [d.step() for _ in range(4)]
        for s in stats:
            d.report.emit(s, d.cfg)
        print(sum(s["promoted"] for s in stats), sorted(set(sys.modules) - before))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    promoted, new = out.stdout.split(" ", 1)
    assert int(promoted) > 0
    assert new.strip() == "[]", f"imported during the steps: {new.strip()}"


def test_first_decision_when_the_profiler_has_its_estimate(tmp_path):
    """With a profiler that says when its first frequency estimate is in (pagetier.ko), the
    first decision comes once it is, not a fixed interval after the start: here the interval
    is 5 s and the run 1.5 s, so a fixed wait would put it at the end of the run."""
    prof = StubProfiler(units=256, hot=16)
    asked = []
    prof.first_estimate_ready = lambda pid: (asked.append(pid) or len(asked) >= 3)
    d, _ = run_for(tmp_path, interval=5.0, duration=1.5, prof=prof)
    first = []
    orig = d.step

    def step(boundary=False):
        if not first:
            first.append(len(asked))
        return orig(boundary)

    d.step = step
    assert d.run() == 0
    assert first, "no decision"
    assert first[0] == 3  # asked until ready, then decided at once
    assert d.totals["promoted"] > 0


def _esrch(what):
    return OSError(errno.ESRCH, f"{what}: no such process")


def test_a_target_that_exits_between_reads_is_let_go_without_a_warning(tmp_path, caplog):
    """A target whose memory is being torn down is not yet a zombie: the module says ESRCH to
    the read and to the attach that follows. The daemon lets it go at INFO level; a target
    detached behind the daemon's back (the attach works) is attached again with a warning."""
    d = make_daemon(tmp_path)
    prof = d.profiler

    def gone(*a, **kw):
        raise _esrch("read pid 4242")

    prof.read, attach = gone, prof.attach
    prof.attach = lambda pid: (_ for _ in ()).throw(_esrch("attach pid 4242"))
    with caplog.at_level("INFO", logger="pagetier.daemon"):
        assert d._read(4242) is None
    assert 4242 not in d.tracker.pids
    assert "pid 4242 is exiting: not attached again" in caplog.text
    assert not [r for r in caplog.records if r.levelname == "WARNING"]

    caplog.clear()
    prof.attach = attach
    d.tracker.attach(4242)
    with caplog.at_level("INFO", logger="pagetier.daemon"):
        assert d._read(4242) is None
    assert 4242 in d.tracker.pids
    assert "profiler read failed" in caplog.text and "attached again" in caplog.text


def test_cgroup_followed(tmp_path):
    cg = tmp_path / "cg"
    cg.mkdir()
    procs = cg / "cgroup.procs"
    a = subprocess.Popen(["sleep", "30"])
    b = subprocess.Popen(["sleep", "30"])
    try:
        procs.write_text(f"{a.pid}\n")
        cfg = daemon_config(tmp_path, policy="test-idle", interval=0.05)
        prof = StubProfiler(units=8)
        d = Daemon(cfg, cgroup=str(cg), profiler=prof, policy=Idle(), mover=StubMover(prof),
                   numab=False, out=open(os.devnull, "w"), clock=FakeClock())
        d.refresh_targets()
        assert d.targets == {a.pid}
        procs.write_text(f"{b.pid}\n")
        d.refresh_targets()
        assert d.targets == {b.pid} and prof.detached == [a.pid]
        b.kill()
        b.wait()
        d.refresh_targets()
        assert d.targets == set()
        procs.unlink()
        cg.rmdir()
        d.refresh_targets()
        assert "gone" in d.stop_reason
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_sighup_reload(tmp_path):
    p = write(tmp_path, 'policy = "test-idle"\nrate = 10\nprofiler = "stub"\n')
    d = make_daemon(tmp_path, policy="test-idle", config_path=p)
    p.write_text('policy = "test-greedy"\nrate = 20\nprofiler = "other"\n')
    d._on_signal(signal.SIGHUP, None)
    d.reload()
    assert d.cfg.rate == 20 and d.policy.name == "test-greedy"
    assert d.cfg.profiler == "stub"  # takes a restart
    p.write_text('rate = "x"\n')
    d.reload()  # a bad file keeps the old config
    assert d.cfg.rate == 20


def test_sighup_new_sentinel_options_keep_the_annotations(tmp_path):
    """A reload that changes sentinel's options builds a new policy; what the application
    registered (it registers once) must survive it."""
    from pagetier.policies.base import Annotation

    p = write(tmp_path, 'policy = "sentinel"\nprofiler = "stub"\n')
    d = make_daemon(tmp_path, policy="sentinel", config_path=p)
    d.policy.annotate(Annotation(4242, "register", name="weights", addr=1 << 30, size=1 << 20))
    p.write_text('policy = "sentinel"\nprofiler = "stub"\n[policy_options]\nlookahead = 3\n')
    d.reload()
    assert d.policy.config.lookahead == 3
    assert "weights" in d.policy.targets[4242].objects


def test_human_line_fits_80_columns():
    s = {"interval": 12345, "promoted": 262144, "demoted": 262144, "dry_run": True,
         "fast_used": 96 * MIB, "budget": 96 * MIB, "resident": {"0": 96 * MIB, "1": 4096 * MIB},
         "busy": 12, "failed": 3, "ping_pongs": 7, "cpu_s": 0.0123}
    line = human_line(s, 0, 1)
    assert len(line) < 80, line


# --------------------------------------------------------------------------- numa_balancing
@pytest.fixture
def numab_files(tmp_path):
    proc = tmp_path / "numa_balancing"
    proc.write_text("1\n")
    return proc, tmp_path / "run" / "numa_balancing.json"


def test_numab_disable_restore(numab_files):
    proc, state = numab_files
    with NumaBalancing(proc, state) as nb:
        assert proc.read_text() == "0" and json.loads(state.read_text())["value"] == "1"
        assert nb.previous == "1"
    assert proc.read_text() == "1" and not state.exists()


def test_numab_restored_on_exception(numab_files):
    proc, state = numab_files
    with pytest.raises(RuntimeError):
        with NumaBalancing(proc, state):
            raise RuntimeError("boom")
    assert proc.read_text() == "1" and not state.exists()


def test_numab_dead_owner_restored_by_next_start(numab_files):
    proc, state = numab_files
    dead = subprocess.Popen(["true"])
    dead.wait()
    proc.write_text("0")
    state.parent.mkdir()
    state.write_text(json.dumps({"value": "2", "pid": dead.pid, "start_time": 1.0}))
    nb = NumaBalancing(proc, state)
    nb.disable()
    assert nb.previous == "2"  # what the dead daemon found is what we restore
    nb.restore()
    assert proc.read_text() == "2"


def test_numab_live_owner_left_alone(numab_files):
    proc, state = numab_files
    import psutil

    owner = os.getppid()
    proc.write_text("0")
    state.parent.mkdir()
    state.write_text(json.dumps({"value": "1", "pid": owner,
                                 "start_time": psutil.Process(owner).create_time()}))
    nb = NumaBalancing(proc, state)
    nb.disable()
    assert nb.previous is None and state.exists()
    nb.restore()
    assert proc.read_text() == "0"


def test_numab_dry_run_writes_nothing(numab_files):
    proc, state = numab_files
    with NumaBalancing(proc, state, dry_run=True):
        assert proc.read_text() == "1\n"
    assert not state.exists()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_numab_signals(numab_files, how):
    proc, state = numab_files
    code = textwrap.dedent(f"""
        import sys, time
        from pagetier.daemon.numab import NumaBalancing
        with NumaBalancing({str(proc)!r}, {str(state)!r}):
            print("in", flush=True)
            time.sleep(30)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "in\n"
    assert proc.read_text() == "0"
    p.send_signal(getattr(signal, how))
    p.wait(timeout=10)
    if how == "SIGTERM":
        assert proc.read_text() == "1" and not state.exists()
    else:
        assert proc.read_text() == "0" and state.exists()  # nobody could restore it...
        NumaBalancing(proc, state).recover()  # ...until the next start
        assert proc.read_text() == "1" and not state.exists()


# --------------------------------------------------------------------------- mover (host kernel)
@pytest.fixture
def own_pages():
    size = 8 * MIB
    buf = mmap.mmap(-1, size)
    buf.write(b"\x5a" * size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    addrs = np.arange(base, base + size, mover.PAGE_SIZE, dtype=np.uint64)
    yield buf, addrs


def test_mover_own_pages_to_node0(own_pages):
    buf, addrs = own_pages
    r = mover.move(0, addrs, 0, batch=1000)
    assert len(r.moved) == len(addrs) and r.calls == 3 and not r.errors
    assert (mover.query_nodes(os.getpid(), addrs) == 0).all()
    assert buf[:4] == b"\x5a" * 4


def test_mover_node1_is_a_clear_error(own_pages):
    _, addrs = own_pages
    if 1 in config_mod.nodes_with_memory():
        pytest.skip("this host has a node 1")
    with pytest.raises(mover.MoveError) as e:
        mover.move(0, addrs[:16], 1)
    assert e.value.errno == errno.ENODEV
    assert "node 1" in str(e.value) and "numactl -H" in str(e.value)


def test_mover_unmapped_and_untouched_are_gone():
    untouched = mmap.mmap(-1, 2 * mover.PAGE_SIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(untouched))
    addrs = np.array([base, base + mover.PAGE_SIZE, mover.PAGE_SIZE], np.uint64)  # last: unmapped
    r = mover.move(0, addrs, 0)
    assert r.gone.tolist() == [0, 1, 2] and set(r.errors) <= {"ENOENT", "EFAULT"}
    q = mover.query_nodes(0, addrs)
    assert (q < 0).all()


def test_mover_no_such_process():
    with pytest.raises(mover.MoveError) as e:
        mover.query_nodes(2 ** 22 + 12345, np.zeros(1, np.uint64))
    assert e.value.errno == errno.ESRCH and "no such process" in str(e.value)


def test_classify_not_reached_is_busy():
    st = np.array([0, -errno.EBUSY, mover._NOT_REACHED, -errno.EACCES, -errno.ENOMEM], np.int32)
    c = mover.classify(st, 0)
    assert c["moved"].tolist() == [0] and c["busy"].tolist() == [1, 2]
    assert c["failed"].tolist() == [3] and c["nomem"].tolist() == [4]


# --------------------------------------------------------------------------- the CLI
def cli(tmp_path, *args, timeout=60):
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    return subprocess.run([*PAGETIER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def test_cli_run_passes_exit_status(tmp_path):
    r = cli(tmp_path, "run", "--profiler", "stub", "--dry-run", "--json", "--interval", "0.2",
            "--policy", "heuristic", "--profiler-option", "units=512",
            "--profiler-option", "hot=64", "--fast-budget", "1M", "--",
            sys.executable, "-c", "import time; time.sleep(1); raise SystemExit(5)")
    assert r.returncode == 5, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines and all(x["fast_used"] <= x["budget"] for x in lines)
    assert "all targets exited" in r.stderr


def test_cli_bad_config_exit_1(tmp_path):
    p = write(tmp_path, "rate = \"fast\"\n")
    r = cli(tmp_path, "run", "-c", str(p), "--", "true")
    assert r.returncode == 1
    assert r.stderr.startswith("pagetier: config ") and "'rate'" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_missing_node_exit_1(tmp_path):
    r = cli(tmp_path, "run", "--fast-node", "0", "--slow-node", "7", "--", "true")
    assert r.returncode == 1 and "slow_node 7" in r.stderr and "numactl -H" in r.stderr


def test_cli_bad_profiler_option(tmp_path):
    r = cli(tmp_path, "run", "--profiler", "stub", "--dry-run", "--profiler-option", "bogus=1",
            "--", "true")
    assert r.returncode == 1 and "bogus" in r.stderr and "Traceback" not in r.stderr


def test_cli_status_none_running(tmp_path):
    r = cli(tmp_path, "status")
    assert r.returncode == 1 and "no pagetier daemon is running" in r.stderr
    r = cli(tmp_path, "status", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_cli_attach_sigterm_and_status(tmp_path):
    target = subprocess.Popen(["sleep", "60"])
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    d = subprocess.Popen([*PAGETIER, "attach", str(target.pid), "--profiler", "stub", "--dry-run",
                          "--interval", "0.2", "--profiler-option", "units=64"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
    try:
        assert d.stdout.readline().startswith("#1 ")
        r = cli(tmp_path, "status")
        assert r.returncode == 0 and f"{target.pid} (sleep)" in r.stdout, r.stderr
        d.send_signal(signal.SIGTERM)
        out, err = d.communicate(timeout=20)
        assert d.returncode == 0 and "stopping: signal SIGTERM" in err
        assert target.poll() is None  # attach leaves its targets running
        assert not list((tmp_path / "run").glob("daemon-*.json"))
    finally:
        target.kill()
        target.wait()
        if d.poll() is None:
            d.kill()


def test_cli_help_has_examples(tmp_path):
    for cmd in ("run", "attach", "status"):
        r = cli(tmp_path, cmd, "--help")
        assert r.returncode == 0 and "Example" in r.stdout


def test_sample_config_loads():
    cfg = config_mod.load(REPO / "scripts" / "pagetier.toml")
    assert cfg.fast_budget == 2 << 30 and cfg.profiler_options == {"mode": "fault"}
    unit = (REPO / "scripts" / "pagetier.service").read_text()
    assert "--config /etc/pagetier/pagetier.toml" in unit and "ExecReload=/bin/kill -HUP" in unit


@pytest.mark.parametrize("err,alive,dropped,raises", [
    (errno.ESRCH, True, True, False), (errno.EINVAL, False, True, False),
    (errno.EINVAL, True, False, False), (errno.EPERM, True, False, True),
])
def test_move_call_errors(tmp_path, err, alive, dropped, raises):
    """A target that exits while its pages move (ESRCH, or EINVAL once its mm is gone) is
    dropped, not fatal; EPERM and the like stop the daemon with their message."""
    d = make_daemon(tmp_path, units=16, hot=16, budget="1G")

    def move(pid, addrs, node):
        raise mover.MoveError(f"move_pages: {os.strerror(err)}", err)

    d.mover.move = move
    d.tracker.alive = lambda pid: alive
    if raises:
        with pytest.raises(mover.MoveError):
            d.step()
        return
    s = d.step()
    assert s["promoted"] == 0
    assert (d.targets == set()) == dropped


# --------------------------------------------------------------------------- hardening
def test_failed_units_left_alone_for_a_while(tmp_path):
    """Units whose move fails for good (EACCES: shared pages) are not asked for again every
    interval, but are tried again after STUCK_RETRY intervals."""
    from pagetier.daemon.loop import STUCK_RETRY

    d = make_daemon(tmp_path, units=64, hot=64, budget="1G",
                    outcome=lambda pid, addrs, node: np.full(len(addrs), -errno.EACCES))
    failed = [d.step()["failed"] for _ in range(STUCK_RETRY + 2)]
    assert failed[0] == 64 and sum(1 for f in failed if f) == 2, failed
    assert failed.index(64, 1) == STUCK_RETRY - 1  # the interval that clears the flags


def test_unmovable_fast_pages_outside_the_budget(tmp_path):
    """Fast pages the kernel refuses to move (EACCES: shared with another process) cannot be
    demoted: they are reported as fast_unmovable, and the budget holds for the rest."""
    base = 0x7f0000000000  # the stub profiler's first address
    shared = {base + 4096 * i for i in range(256)}  # the first 1 MiB: shared, on the fast node

    def outcome(pid, addrs, node):
        return np.array([-errno.EACCES if int(a) in shared else node for a in addrs])

    d = make_daemon(tmp_path, policy="test-idle", units=1024, hot=1024, node=0, budget="2M",
                    outcome=outcome)
    stats = [d.step() for _ in range(4)]
    last = stats[-1]
    assert last["fast_unmovable"] == 1 * MIB and last["fast_used"] == 2 * MIB, last
    assert last["resident"]["0"] == 3 * MIB
    assert all(s["fast_used"] <= s["budget"] for s in stats[1:]), stats
    # a unit that moves once after all counts against the budget again
    d.state.mark_stuck(np.arange(2))
    d.state.record_moves(np.arange(2), 0)
    assert d.state.unmovable_on(0) == 254


def test_promotion_watermark_from_zoneinfo():
    text = ("Node 0, zone    DMA32\n  pages free 5\n        min      8520\n        high     12780\n"
            "        promo    14910\nNode 0, zone  Movable\n        high 32\n        promo    32\n"
            "Node 1, zone    DMA32\n        promo    99999\n")
    assert config_mod.zone_watermark(0, "promo", text) == (14910 + 32) * 4096
    assert config_mod.zone_watermark(1, "promo", text) == 99999 * 4096
    old = "Node 0, zone    DMA32\n        high     100\n"  # 6.1: no promo line
    assert config_mod.zone_watermark(0, "promo", old) == 100 * 4096


def test_per_cpu_free_pages_from_zoneinfo():
    """The pagesets' counts of one node's zones; their "high:" lines are not the watermark."""
    text = ("Node 0, zone   Normal\n  per-node stats\n        high     256\n  pagesets\n    cpu: 0\n"
            "              count: 2048\n              high:  4000\n              batch: 63\n"
            "    cpu: 1\n              count: 7\n              high:  4000\n"
            "Node 1, zone   Normal\n  pagesets\n    cpu: 0\n              count: 99\n")
    assert config_mod.zone_pcp_pages(0, text) == 2048 + 7
    assert config_mod.zone_pcp_pages(1, text) == 99
    assert config_mod.zone_watermark(0, "high", text) == 256 * 4096
    zones = config_mod.zone_sums(0, text)  # one walk, both read from it
    assert config_mod.zone_pcp_pages(0, sums=zones) == 2048 + 7
    assert config_mod.zone_watermark(0, "high", sums=zones) == 256 * 4096
    # the walk for some names only finds the same sums of those (not "high:" for "high")
    assert config_mod.zone_sums(0, text, ("high", "count:")) == {"high": 256, "count:": 2055}
    assert config_mod.zone_sums(1, text, ("high", "count:")) == {"count:": 99}
    assert config_mod.zone_sums(0, text, ("batch:",)) == {"batch:": 63}


def test_promotions_stop_at_the_fast_nodes_high_watermark(tmp_path, caplog):
    """move_pages into a node below its high watermark reclaims and retries page by page: the
    daemon promotes only what fits above it, says the node is full, and resumes when it has room."""
    node0 = tmp_path / "node" / "node0"
    node0.mkdir(parents=True)
    zoneinfo = tmp_path / "zoneinfo"
    zoneinfo.write_text("Node 0, zone   Normal\n  pages free 10\n        min      100\n"
                        "        low      200\n        high     256\n"
                        "Node 1, zone   Normal\n        high     999999\n")

    def free(mib):
        node0.joinpath("meminfo").write_text(f"Node 0 MemTotal: 4194304 kB\n"
                                             f"Node 0 MemFree: {mib * 1024} kB\n")

    d = make_daemon(tmp_path, units=4096, hot=4096, budget="1G", node_root=tmp_path / "node")
    d.cfg.zoneinfo = zoneinfo
    assert config_mod.zone_watermark(0, "high", zoneinfo.read_text()) == 1 * MIB
    free(4)  # 4 MiB free - 1 MiB watermark - 1 MiB margin: room for 2 MiB
    with caplog.at_level("INFO", logger="pagetier.daemon"):
        assert d.step()["promoted"] == 512
        free(2)
        assert d.step()["promoted"] == 0
        assert "node 0 is full (free memory at its high watermark)" in caplog.text
        free(100)
        assert d.step()["promoted"] == 4096 - 512
        assert "node 0 has free memory again" in caplog.text


def test_enomem_for_the_whole_call_is_a_full_node(monkeypatch):
    """move_pages may fail as a whole with ENOMEM when it cannot allocate the copies: that
    is a full node (stop this interval), not an error that ends the daemon."""
    def raw(pid, addrs, nodes, status, flags):
        raise mover.MoveError("move_pages: Cannot allocate memory", errno.ENOMEM)

    monkeypatch.setattr(mover, "_raw", raw)
    r = mover.move(1, np.arange(10, dtype=np.uint64) * 4096, 0, batch=4)
    assert r.stopped and len(r.nomem) == 10 and len(r.moved) == 0


def test_target_slots_reused():
    """Target indices are uint16: slots of forgotten targets are reused, so a daemon following
    a cgroup through many short-lived processes never runs out of them."""
    from pagetier.profiler.base import Sample

    st = PageState()
    for pid in range(100_000, 100_000 + 70_000, 7):
        st.begin_interval()
        st.update(Sample(pid=pid, addr=np.array([4096], np.uint64), npages=np.ones(1, np.uint16),
                         count=np.ones(1, np.uint32), node=np.zeros(1, np.int8), complete=True))
        st.forget_target(pid)
    assert len(st.pids) == 1 and len(st) == 0


def test_stale_status_removed_by_next_start(tmp_path):
    """The status file of a daemon killed with SIGKILL is removed by the next start."""
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (run / f"daemon-{dead.pid}.json").write_text(json.dumps(
        {"pid": dead.pid, "started": time.time(), "updated": time.time(), "config": {},
         "targets": [], "totals": {}, "last": None}))
    r = cli(tmp_path, "status")
    assert "dead: stale status" in r.stdout
    r = cli(tmp_path, "run", "--profiler", "stub", "--dry-run", "--interval", "0.1", "--", "true")
    assert r.returncode == 0, r.stderr
    assert f"removed the status file of pagetier pid {dead.pid}" in r.stderr
    assert not list(run.glob("daemon-*.json"))


@pytest.mark.parametrize("content", [b"[[[ not toml", b"\x00\xff\xfe garbage \x81",
                                     b"fast_budget = \"-5M\"\n", b"interval = -1\n"])
def test_cli_corrupt_config_one_line(tmp_path, content):
    p = tmp_path / "bad.toml"
    p.write_bytes(content)
    r = cli(tmp_path, "run", "-c", str(p), "--profiler", "stub", "--dry-run", "--", "true")
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert str(p) in r.stderr


def test_cli_corrupt_trace_one_line(tmp_path):
    """A corrupt trace given to the replay profiler or to the simulator."""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + os.urandom(3000) + b"PAR1")
    from pagetier.profiler.base import create

    with pytest.raises(ConfigError, match=str(bad)):
        create("replay", path=str(bad))  # the daemon's CLI run: tests/guest/test_daemon_faults.py
    for args in (["bench", "sim", str(bad), "--policies", "lru", "--capacity", "50%"],):
        r = cli(tmp_path, *args)
        assert r.returncode == 1, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert str(bad) in r.stderr, r.stderr


def test_ping_pong_policy_flips_every_unit(tmp_path):
    """The stress policy moves every unit each interval, within the budget."""
    d = make_daemon(tmp_path, policy="ping-pong", units=64, hot=8, budget="1G")
    moved = [d.step() for _ in range(3)]
    assert [s["promoted"] for s in moved] == [64, 0, 64]
    assert [s["demoted"] for s in moved] == [0, 64, 0]
    d = make_daemon(tmp_path, policy="ping-pong", units=64, hot=8, budget="64K")
    assert d.step()["promoted"] == 16  # the budget still holds


@pytest.mark.parametrize("freed_to,edge", [("buddy", False), ("per-CPU list", False),
                                            ("buddy", True)])
def test_exchange_when_the_node_not_the_budget_is_the_limit(tmp_path, freed_to, edge):
    """The fast node has room for a little more than one of two alternating hot regions; the
    budget would hold both. When the hot region changes, the daemon demotes the old one to make
    room for the new (an exchange), the promotions fit the room freed, and the stats say the
    node was the limit. Free memory follows the daemon's moves, as on a real node; with
    "per-CPU list" the demoted pages wait on the freeing CPU's list, outside MemFree (as the
    test VM's kernels often leave them), and the promotions' allocations take them first.
    With ``edge`` another tenant takes the node down to 50 pages under the daemon's margin
    above the high watermark before the change: the exchange still brings the whole new
    region in (a step that demoted may promote into the margin, by up to what it demoted),
    and free memory never goes under the watermark."""
    node0 = tmp_path / "node" / "node0"
    node0.mkdir(parents=True)
    zoneinfo = tmp_path / "zoneinfo"
    pcp = {"count": 40}  # other CPUs' cached pages: never counted as room

    def write_zoneinfo():
        zoneinfo.write_text("Node 0, zone   Normal\n        high     256\n"  # 1 MiB
                            f"  pagesets\n    cpu: 0\n              count: {pcp['count']}\n"
                            "              high:  5000\n")

    write_zoneinfo()
    region = 512  # units of 4 KiB per region
    base = 0x7f0000000000
    addr = base + np.arange(2 * region, dtype=np.uint64) * np.uint64(4096)
    phase = {"b": False}

    def source(pid, i):
        hot = np.zeros(2 * region, np.float32)
        sl = slice(region, None) if phase["b"] else slice(0, region)
        hot[sl] = 1000.0
        from pagetier.profiler.base import Sample
        return Sample(pid=pid, addr=addr, count=(hot > 0).astype(np.uint32),
                      node=np.ones(2 * region, np.int16), npages=np.ones(2 * region, np.uint16),
                      freq=hot)

    prof = StubProfiler(source=source, track_moves=True)
    d = make_daemon(tmp_path, policy="heuristic", budget="1G", node_root=tmp_path / "node",
                    prof=prof)
    d.cfg.zoneinfo = zoneinfo
    room = region + 100  # pages the node has above its high watermark + margin for the target

    def free():
        on_fast = d.state.pages_on(0) if len(d.state) else 0
        mib = 2 + (room - on_fast) * 4096 / MIB  # high watermark 1 MiB + ROOM_MARGIN 1 MiB
        node0.joinpath("meminfo").write_text(f"Node 0 MemTotal: 4194304 kB\n"
                                             f"Node 0 MemFree: {int(mib * 1024)} kB\n")

    orig_move = d.mover.move

    def move(pid, addrs, node):  # free memory follows each move, as the kernel's would
        r = orig_move(pid, addrs, node)
        pages = len(r.moved)
        if freed_to == "per-CPU list":
            if node == 1:  # freed to the list
                pcp["count"] += pages
                pages = 0
            else:  # allocated from it first
                taken = min(pages, pcp["count"] - 40)
                pcp["count"] -= taken
                pages -= taken
            write_zoneinfo()
        sign = -1 if node == 0 else 1
        text = node0.joinpath("meminfo").read_text().split("MemFree: ")
        kb = int(text[1].split()[0]) + sign * pages * 4
        lowest[0] = min(lowest[0], kb)
        node0.joinpath("meminfo").write_text(f"{text[0]}MemFree: {kb} kB\n")
        return r

    lowest = [1 << 40]  # the lowest MemFree the moves left, kB
    d.mover.move = move
    free()
    stats = [d.step() for _ in range(6)]
    assert d.state.pages_on(0) == region  # region A on the fast node
    if edge:  # another tenant takes the room left and 50 pages of the margin
        room = region - 50
        free()
    phase["b"] = True
    stats = [d.step() for _ in range(6)]
    ex = [s for s in stats if s["promoted"] and s["demoted"]]
    assert ex, [(s["promoted"], s["demoted"], s["limit"]) for s in stats]
    assert ex[0]["policy"]["exchange"] and ex[0]["promoted"] == region
    fast = np.asarray(d.state.node) == 0
    assert fast[region:].all(), "region B not all on the fast node"
    assert all(s["fast_capacity"] <= max(room + 1, region) * 4096 for s in stats)
    assert sum(s["ping_pongs"] for s in stats) == 0
    assert lowest[0] >= 1024, f"MemFree {lowest[0]} kB: under the high watermark (1 MiB)"
    print([(s["promoted"], s["demoted"], s["limit"], s["policy"]["ranked_by"]) for s in stats])


def test_room_counts_demoted_pages_on_the_per_cpu_lists(tmp_path):
    """Pages the daemon demoted that wait on the fast node's per-CPU lists (outside MemFree)
    count as room until the lists drain or are taken from, never more than were demoted, and
    never pages other CPUs cached on their own."""
    node0 = tmp_path / "node" / "node0"
    node0.mkdir(parents=True)
    zoneinfo = tmp_path / "zoneinfo"
    d = make_daemon(tmp_path, node_root=tmp_path / "node")
    d.cfg.zoneinfo = zoneinfo

    def node(free_pages, pcp):
        node0.joinpath("meminfo").write_text(f"Node 0 MemFree: {free_pages * 4} kB\n")
        zoneinfo.write_text("Node 0, zone   Normal\n        high     256\n  pagesets\n"
                            f"    cpu: 0\n              count: {pcp}\n")

    margin = 256 + 256  # the high watermark and ROOM_MARGIN, in pages
    node(10_000, 300)
    assert d.fastnode.room_pages() == 10_000 - margin  # another CPU's 300 cached pages: not room
    d.fastnode.demoted(2048)
    node(10_000, 300 + 2048)  # the demoted pages went to the list
    assert d.fastnode.room_pages() == 10_000 - margin + 2048
    assert d.fastnode.room_pages() == 10_000 - margin + 2048  # a later interval: still there
    node(11_000, 300 + 1048)  # half drained back to the buddy allocator
    assert d.fastnode.room_pages() == 11_000 - margin + 1048
    node(11_000, 300 + 5000)  # the list grew by others' frees: not the daemon's room
    assert d.fastnode.room_pages() == 11_000 - margin + 1048
    node(11_000, 100)  # taken
    assert d.fastnode.room_pages() == 11_000 - margin
    node(11_000, 3000)
    assert d.fastnode.room_pages() == 11_000 - margin  # nothing demoted since


def test_moves_capped_at_the_measured_throughput(tmp_path):
    """A mover that moves 1,000 pages a second, a 1 s interval and --rate allowing 2,000 pages
    an interval: the first interval moves 2,000 (nothing measured yet); then an interval moves
    what the measured throughput moves in 1.6 intervals (1,600 pages: THROUGHPUT_HEADROOM)
    and the stats say the throughput is the limit. When the mover gets 4x faster the cap
    grows past --rate, and --rate is the limit again."""
    clock = FakeClock()
    rate_mb_s = 2000 * 4096 / (1 << 20)
    d = make_daemon(tmp_path, units=20000, hot=20000, budget="100M", rate=rate_mb_s, clock=clock)
    d.cfg.interval = 1.0
    pps = [1000.0]
    move = d.executor.mover.move

    def slow(pid, addrs, node):
        clock.advance(len(addrs) / pps[0])
        return move(pid, addrs, node)

    d.executor.mover.move = slow
    first = d.step()
    assert first["promoted"] == 2000 and first["throughput_mb_s"] == round(1000 * 4096 / (1 << 20), 1)
    capped = d.step()
    assert capped["promoted"] == 1600 and capped["limit"] == "throughput", capped["limit"]
    pps[0] = 4000.0
    d.step()  # 1,600 pages at 4,000/s: the estimate rises to 2,500/s, a cap of 4,000 > 2,000
    after = d.step()
    assert after["promoted"] == 2000 and after["limit"] == "rate"
    # a dry run moves nothing and measures nothing: --rate alone
    d2 = make_daemon(tmp_path, units=20000, hot=20000, budget="100M", rate=rate_mb_s,
                     dry_run=True, clock=FakeClock())
    assert d2.step()["throughput_mb_s"] is None


def test_throughput_cap_follows_steps_longer_than_the_interval(tmp_path):
    """Steps 2.5 s apart besides their moves, with a 1 s interval (a slow decision over many
    4 KiB units): the cap
    is what the measured throughput moves in 1.6 step periods, not in 1.6 intervals, so the
    moves keep up with the throughput; 10 s apart, it stops at STEP_PERIOD_MAX intervals."""
    from pagetier.daemon.loop import STEP_PERIOD_MAX

    clock = FakeClock()
    rate_mb_s = 100_000 * 4096 / (1 << 20)
    d = make_daemon(tmp_path, units=60000, hot=60000, budget="1G", rate=rate_mb_s, clock=clock)
    d.cfg.interval = 1.0
    move = d.executor.mover.move

    def slow(pid, addrs, node):
        clock.advance(len(addrs) / 1000.0)
        return move(pid, addrs, node)

    d.executor.mover.move = slow
    d.step()  # measures 1,000 pages a second
    assert d.step_period() == 1.0
    clock.advance(2.5)  # the decision, the read: the moves' own time is not counted
    capped = d.step()
    assert d.step_period() == 2.5
    # 1.6 x 2.5 s at 1,000 pages a second, give or take the clock's rounding
    assert capped["limit"] == "throughput" and 3999 <= capped["promoted"] <= 4000, capped
    clock.advance(10.0)
    d.step()
    assert d.step_period() == STEP_PERIOD_MAX


def test_moves_stop_at_the_interval_deadline(tmp_path):
    """Before any throughput is measured, a mover at 1,000 pages a second and a plan of 20,000
    pages (no --rate): the first interval's moves stop after the first chunk (it alone took
    more than the two intervals the moves may take) and the rest is deferred, with "throughput" as the limit; the next interval
    moves what the measured throughput allows, nothing deferred. Every page gets there."""
    from pagetier.daemon.executor import CHUNK_PAGES

    clock = FakeClock()
    d = make_daemon(tmp_path, units=20000, hot=20000, budget="100M", clock=clock)
    d.cfg.interval = 1.0
    move = d.executor.mover.move
    calls = []

    def slow(pid, addrs, node):
        calls.append(len(addrs))
        clock.advance(len(addrs) / 1000.0)
        return move(pid, addrs, node)

    d.executor.mover.move = slow
    first = d.step()
    assert calls == [CHUNK_PAGES]
    assert first["promoted"] == CHUNK_PAGES and first["deferred"] == 20000 - CHUNK_PAGES
    assert first["limit"] == "throughput" and first["clipped"] == 0
    second = d.step()
    # the throughput cap: 1,600 pages (1.6 s of moves), give or take the clock's rounding
    assert 1599 <= second["promoted"] <= 1600 and second["deferred"] == 0
    while d.state.pages_on(0) < 20000:
        assert d.step()["promoted"] > 0
    assert d.totals["deferred"] == first["deferred"]


def test_moves_start_no_chunk_after_the_deadline(tmp_path):
    """The executor cuts a move into chunks; none but the first starts after the deadline, and
    the pages of those not tried are counted as deferred."""
    from pagetier.daemon.executor import CHUNK_PAGES, new_tally

    clock = FakeClock()
    d = make_daemon(tmp_path, policy="test-idle", units=3 * CHUNK_PAGES, hot=CHUNK_PAGES,
                    budget="100M", clock=clock)
    d.step()  # the units read into the state, none moved
    ex = d.executor
    move = ex.mover.move

    def slow(pid, addrs, node):
        clock.advance(1.0)
        return move(pid, addrs, node)

    ex.mover.move = slow
    idx = np.arange(3 * CHUNK_PAGES)
    acc, forget, gone = new_tally(), [], set()
    assert ex.move(idx, 0, acc, forget, gone, 4, deadline=clock.monotonic() + 1.5)
    # two chunks started (the second before the deadline), the third deferred
    assert acc["moved_pages"] == 2 * CHUNK_PAGES and acc["deferred"] == CHUNK_PAGES
    assert (np.asarray(d.state.node)[:2 * CHUNK_PAGES] == 0).all()
    acc = new_tally()
    assert ex.move(idx[2 * CHUNK_PAGES:], 0, acc, forget, gone, 4, deadline=clock.monotonic() - 1)
    assert acc["moved_pages"] == CHUNK_PAGES and acc["deferred"] == 0  # the first chunk goes


def test_a_late_demotion_defers_the_promotions(tmp_path):
    """An exchange whose demotions use up the interval's time: the promotions they were to
    make room for wait (deferred, not clipped), so the fast node never goes over the budget."""
    from pagetier.daemon.executor import CHUNK_PAGES
    from pagetier.daemon.loop import MOVE_TIME_SHARE

    clock = FakeClock()
    budget = f"{2 * CHUNK_PAGES * 4096 >> 20}M"
    d = make_daemon(tmp_path, policy="test-flip", units=3 * CHUNK_PAGES, hot=3 * CHUNK_PAGES,
                    budget=budget, clock=clock)
    d.cfg.interval = 1.0
    first = d.step()  # two chunks' worth promoted, the budget
    assert first["promoted"] == 2 * CHUNK_PAGES
    move = d.executor.mover.move

    def slow(pid, addrs, node):
        clock.advance(MOVE_TIME_SHARE * d.cfg.interval + 0.5)  # past the interval's deadline
        return move(pid, addrs, node)

    d.executor.mover.move = slow
    second = d.step()  # flip: demote the two chunks, promote the third
    assert second["demoted"] == CHUNK_PAGES and second["promoted"] == 0
    assert second["deferred"] == 2 * CHUNK_PAGES and second["clipped"] == 0
    assert second["limit"] == "throughput"
    assert d.state.pages_on(0) == CHUNK_PAGES


def test_throughput_ignores_small_moves():
    from pagetier.daemon.executor import THROUGHPUT_MIN_PAGES, Executor

    ex = Executor(None, None, None, lambda pid: True)
    ex.measure(THROUGHPUT_MIN_PAGES - 1, 0.001)  # the call's fixed costs, not the copying
    assert ex.throughput is None
    ex.measure(1000, 1.0)  # the first measurement is the estimate
    assert ex.throughput == 1000.0
    ex.measure(5000, 0.0)  # no time measured (a clock that stood still)
    assert ex.throughput == 1000.0


def test_throughput_weighs_a_move_by_its_pages():
    """A move slower than the estimate weighs THROUGHPUT_SMOOTHING in it when of
    THROUGHPUT_FULL_PAGES or more, a smaller one in proportion to its pages: one slow exchange
    of a few hot pages does not halve the estimate that caps the next phase's exchange. A
    faster move weighs in full, however small."""
    from pagetier.daemon.executor import THROUGHPUT_FULL_PAGES, THROUGHPUT_SMOOTHING, Executor

    ex = Executor(None, None, None, lambda pid: True)
    full = THROUGHPUT_FULL_PAGES
    ex.measure(full, 0.5)  # 2 * full pages/s
    ex.measure(full // 8, 0.5)  # an eighth of the pages, at a quarter of the rate
    a = THROUGHPUT_SMOOTHING / 8
    assert ex.throughput == pytest.approx((1 - a) * 2 * full + a * full / 4)
    s = THROUGHPUT_SMOOTHING
    before = ex.throughput
    ex.measure(2 * full, 2.0)  # slower, of more than full pages: in full (full pages/s)
    assert ex.throughput == pytest.approx((1 - s) * before + s * full)
    before = ex.throughput
    ex.measure(1000, 1000 / (8.0 * full))  # small but faster: in full (8 * full pages/s)
    assert ex.throughput == pytest.approx((1 - s) * before + s * 8 * full)


def test_command_exiting_between_the_checks_is_not_let_go():
    """`pagetier run -- sh -c "sleep 2; exit 3"`: sh exits while a refresh looks at it (running
    at the first question, exited from then on): it is dropped, never "let go" (seen in the 6.12
    guest: "its 1 remaining processes are let go" with none left), and the refresh after says
    every target has exited."""
    from pagetier.daemon.targets import Targets

    class Command:
        pid = 4242
        answers = [None]  # running when first asked, exited (3) from then on

        def poll(self):
            return self.answers.pop(0) if self.answers else 3

    prof = StubProfiler()
    tr = Targets(prof, PageState(), child=Command())
    assert tr.attach(Command.pid)
    assert tr.refresh() in (None, "all targets exited")
    assert not tr.pids
    assert tr.refresh() == "all targets exited"
