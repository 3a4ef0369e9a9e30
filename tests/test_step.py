"""The interval step (pagetier/core/step.py): its stages, and the daemon and the simulator
running one trace through it to the same moves, interval by interval. No root, no VM."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pagetier import policies
from pagetier.core.sample import Sample
from pagetier.core.state import PageState
from pagetier.core.step import STUCK_RETRY, Limits, Read, RecordingMover, Step
from pagetier.core.units import PAGE_SIZE
from pagetier.daemon import config as config_mod
from pagetier.daemon.clock import FakeClock
from pagetier.daemon.loop import Daemon
from pagetier.policies import simulate as sim_mod
from pagetier.policies import synth
from pagetier.policies.base import Context, Decision, Policy
from pagetier.policies.builtin_traces import path as builtin_path

FAST, SLOW = 0, 1
BASE = 0x7F00_0000_0000


# --------------------------------------------------------------------------- helpers
def sample(pid, pages, counts, node=SLOW, complete=False):
    addr = (BASE + np.asarray(pages, np.uint64) * PAGE_SIZE).astype(np.uint64)
    return Sample(pid=pid, addr=addr, count=np.asarray(counts, np.uint32),
                  node=np.full(len(addr), node, np.int16), npages=np.ones(len(addr), np.uint16),
                  complete=complete)


class Scripted(Policy):
    """Returns the decisions it is given, one per call, and keeps what it was shown."""

    name = "scripted"

    def __init__(self, *decisions):
        super().__init__()
        self.decisions = list(decisions)
        self.contexts: list = []
        self.observed: list = []

    def observe(self, pid, s):
        self.observed.append((pid, len(s)))

    def decide(self, state, ctx):
        self.contexts.append(ctx)
        return self.decisions.pop(0) if self.decisions else Decision()


def make_step(policy, clock=None, **kw):
    st = PageState()
    clock = clock or FakeClock(start=100.0)
    return st, Step(st, policy, RecordingMover(FAST, SLOW), clock, Context, fast=FAST,
                    slow=SLOW, **kw)


def read(s, elapsed=1.0, interval=1.0, **kw):
    return Read(pid=s.pid, sample=s, elapsed_s=elapsed, interval_s=interval, **kw)


# --------------------------------------------------------------------------- the stages
def test_merge_weighs_a_read_by_the_time_it_covers():
    """A sample covering half an interval counts half; a rate per second is counts over the
    seconds; max_count clips what one scan per unit can show."""
    pol = Scripted()
    st, step = make_step(pol)
    step.begin()
    step.merge([read(sample(1, [0, 1], [10, 4]), elapsed=2.0, interval=2.0, max_count=3)])
    assert st.rate.tolist() == [1.5, 1.5]  # 3 (clipped) / 2 s
    step.begin()
    step.merge([read(sample(2, [0], [10]), elapsed=1.0, interval=2.0)])
    i = int(np.flatnonzero(st.pid_of(np.arange(len(st))) == 2)[0])
    assert st.rate[i] == pytest.approx(10 / 1.0 * 0.5)  # half an interval: weight 1/2
    assert pol.observed == [(1, 2), (2, 1)]


def test_merge_syncs_a_part_before_the_counts():
    """A read's part (a complete read of part of the address space) forgets the units it
    lacks before the counts are merged."""
    st, step = make_step(Scripted())
    step.begin()
    step.merge([read(sample(1, [0, 1, 2], [1, 1, 1]))])
    part = sample(1, [0, 2], [0, 0], complete=True)
    step.begin()
    step.merge([read(sample(1, [0], [5]), part=part)])
    assert len(st) == 2  # page 1 unmapped: forgotten


def test_merge_takes_each_read_after_the_last_is_merged():
    """Reads may come from a generator: the second is made when the first is in the state
    (the simulator places a target's new units by what the ones before it took)."""
    st, step = make_step(Scripted())
    seen = []

    def reads():
        yield read(sample(1, [0, 1], [1, 1]))
        seen.append(len(st))
        yield read(sample(2, [0], [1]))

    step.begin()
    step.merge(reads())
    assert seen == [2] and len(st) == 3


def test_act_tells_the_policy_its_limits_and_keeps_the_moves_within_them():
    """The Context has the budget (plus unmovable fast pages), the node's capacity (what the
    targets hold on it plus its room), the rate, the interval and the clock's time since the
    start; the planner cuts the promotions at the budget and counts the clipped units."""
    clock = FakeClock(start=100.0)
    pol = Scripted(Decision(promote=np.arange(6)))
    st, step = make_step(pol, clock=clock, interval_s=0.5)
    step.begin()
    step.merge([read(sample(1, range(6), [6, 5, 4, 3, 2, 1]))])
    clock.advance(3.0)
    out = step.act(lambda: Limits(budget=4, rate=100, room=10))
    ctx = pol.contexts[0]
    assert (ctx.fast_budget, ctx.fast_capacity, ctx.max_moves) == (4, 10, 100)
    assert (ctx.interval, ctx.now, ctx.interval_s) == (1, 3.0, 0.5)
    assert out.moved.promoted == 4 and st.pages_on(FAST) == 4
    assert out.moves.limit == "budget" and out.clipped == 2
    assert out.limits == Limits(budget=4, rate=100, room=10)


def test_act_limits_are_asked_after_the_mover_located_the_units():
    """The mover places units of unknown node before the limits are taken (a budget may
    depend on what the fast node holds)."""
    order = []

    class Locating(RecordingMover):
        def locate(self, state):
            order.append("locate")

    st = PageState()
    step = Step(st, Scripted(), Locating(), FakeClock(), Context)

    def limits():
        order.append("limits")
        return Limits(budget=0, rate=0)

    step(iter([read(sample(1, [0], [1]))]), limits)
    assert order == ["locate", "limits"]


def test_rate_and_room_cut_promotions_and_demotions_go_first():
    pol = Scripted(Decision(promote=np.arange(4)),
                   Decision(promote=np.array([4, 5]), demote=np.array([0, 1])))
    st, step = make_step(pol)
    out = step([read(sample(1, range(6), [1] * 6))], lambda: Limits(budget=100, rate=3))
    assert out.moved.promoted == 3 and out.moves.limit == "rate"
    out = step([], lambda: Limits(budget=100, rate=100, room=0))
    # the two demotions make room on the node for the two promotions
    assert (out.moved.demoted, out.moved.promoted) == (2, 2)
    assert st.node[:6].tolist() == [SLOW, SLOW, FAST, SLOW, FAST, FAST]


def test_recording_mover_counts_a_quick_move_back_as_a_ping_pong():
    pol = Scripted(Decision(promote=np.arange(2)), Decision(demote=np.arange(2)))
    st, step = make_step(pol)
    step([read(sample(1, [0, 1], [1, 1]))], lambda: Limits(budget=10, rate=10))
    out = step([], lambda: Limits(budget=10, rate=10))
    assert out.moved.demoted == 2 and out.moved.tally["ping_pongs"] == 2


def test_stuck_units_are_tried_again_every_stuck_retry_intervals():
    st, step = make_step(Scripted())
    step.begin()
    step.merge([read(sample(1, [0], [1]))])
    st.mark_stuck(np.array([0]))
    assert st.stuck(np.array([0])).all()
    while st.interval % STUCK_RETRY != STUCK_RETRY - 1:
        step.begin()
    assert st.stuck(np.array([0])).all()
    step.begin()
    assert not st.stuck(np.array([0])).any()


# --------------------------------------------------------------------------- daemon == simulator
class LoggingMover(RecordingMover):
    """The recording mover, keeping each interval's moves as (pid, address, node)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.log: list[list[tuple[int, int, int]]] = []
        self.pages = 0

    def move(self, state, moves, decision, limits):
        got = []
        for idx, node in ((moves.demotions, self.slow), (moves.promote, self.fast)):
            pids = state.pid_of(idx) if len(idx) else []
            got += [(int(p), int(a), node) for p, a in zip(pids, state.addresses(idx))]
            self.pages += int(state.npages[idx].sum(dtype=np.int64))
        self.log.append(sorted(got))
        return super().move(state, moves, decision, limits)


class ReplayProfiler:
    """A profiler that hands the daemon a trace's frames, one per read, each unit on the node
    the daemon's state has it (a new one on the slow node, as the simulator's ``slow``)."""

    def __init__(self, frames, capacity):
        self.frames, self.capacity, self.k = frames, capacity, 0
        self.state: PageState | None = None
        self.pending: dict = {}

    def attach(self, pid):
        pass

    def detach(self, pid):
        pass

    def next_frame(self):
        self.pending = dict(self.frames[self.k][2])
        self.k += 1

    def read(self, pid, reset=True, accessed_only=False):
        s = self.pending.pop(pid)
        return sim_mod._placed(self.state, s, "slow", self.capacity)

    def stats(self, pid):
        return {}

    def close(self):
        pass


def daemon_moves(tmp_path, frames, policy, capacity, rate_mb_s):
    """Each interval's moves of the daemon's step over ``frames``: the trace replayed by the
    profiler, the moves recorded by the mover, the clock a fake one, an interval of 1 s."""
    pids = sorted({int(p) for _, _, d in frames for p in d})
    cfg = config_mod.load(None, {"profiler": "stub", "policy": policy, "interval": 1.0,
                                 "fast_budget": capacity * PAGE_SIZE, "rate": rate_mb_s})
    cfg.handle_signals, cfg.status_file = False, str(tmp_path / "status.json")
    cfg.node_root = tmp_path / "no-nodes"  # the fast node's room: unknown, as in the simulator
    cfg.zoneinfo = tmp_path / "no-zoneinfo"
    prof = ReplayProfiler(frames, capacity)
    clock = FakeClock()
    d = Daemon(cfg, pids=pids, profiler=prof, policy=policies.create(policy), numab=False,
               out=open(os.devnull, "w"), clock=clock)
    prof.state = d.state
    mover = LoggingMover(cfg.fast_node, cfg.slow_node, cfg.ping_pong_window)
    d.stepper.mover = mover
    d.tracker.alive = lambda pid: True
    for p in pids:
        d.tracker.attach(p)
    for k in range(len(frames) - 1):  # after the last frame the simulator decides no more
        clock.advance(1.0)
        prof.next_frame()
        d.step()
    return mover.log


def simulator_moves(frames, policy, capacity, rate_mb_s, monkeypatch):
    movers = []

    class Logged(LoggingMover):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            movers.append(self)

    monkeypatch.setattr(sim_mod, "RecordingMover", Logged)
    cfg = sim_mod.SimConfig(capacity=capacity, rate_mb_s=rate_mb_s, interval_s=1.0)
    res = sim_mod.simulate(frames, policy, cfg)
    assert movers[0].pages == res.promoted_pages + res.demoted_pages
    return movers[0].log, res


def builtin(name):
    from pagetier.profiler.trace import read_trace

    return list(read_trace(builtin_path(name)).intervals())


TRACES = {
    "hotcold-phased": lambda: builtin("hotcold-phased"),
    "redis": lambda: builtin("redis"),
    "synth-phased": lambda: synth.from_spec("synth:phased:pages=2048,intervals=24,seed=3"),
}


@pytest.mark.parametrize("trace,policy,share,rate", [
    ("hotcold-phased", "heuristic", 0.25, 64.0),
    ("redis", "heuristic", 0.10, 512.0),
    ("synth-phased", "heuristic", 0.25, 2.0),
    ("hotcold-phased", "lru", 0.10, 64.0),
    ("synth-phased", "heat-classes", 0.25, 2.0),
])
def test_daemon_and_simulator_make_the_same_moves(tmp_path, monkeypatch, trace, policy,
                                                  share, rate):
    """One trace through the daemon's step (a replaying profiler, a recording mover, a fake
    clock) and through the simulator: the same units moved to the same nodes, every
    interval."""
    frames = TRACES[trace]()
    capacity = int(sim_mod.footprint(frames) * share)
    sim, res = simulator_moves(frames, policy, capacity, rate, monkeypatch)
    live = daemon_moves(tmp_path, frames, policy, capacity, rate)
    assert len(live) == len(sim) == len(frames) - 1
    assert sum(len(m) for m in sim) > 0, "the trace should make the policy move pages"
    for k, (a, b) in enumerate(zip(live, sim)):
        assert a == b, f"interval {k + 1}: the daemon and the simulator moved different units"
    assert res.promoted_pages + res.demoted_pages > 0


# --------------------------------------------------------------------------- why an exchange stopped
@pytest.mark.parametrize("limits,limit,moved", [
    (Limits(budget=100, rate=100), "candidates", 6),
    (Limits(budget=4, rate=100), "budget", 4),
    (Limits(budget=100, rate=100, room=3), "node", 3),
    (Limits(budget=100, rate=2), "rate", 2),
])
def test_the_limit_that_bound_an_exchange_and_what_it_wanted(limits, limit, moved):
    """Six units wanted on the fast node: what moved, what was wanted (all six) and which limit
    stopped the exchange there ("candidates": nothing did, all that was wanted moved)."""
    from pagetier.core.step import exchange_limit, wanted_pages

    st, step = make_step(Scripted(Decision(promote=np.arange(6))))
    out = step([read(sample(1, range(6), [1] * 6))], lambda: limits)
    assert out.moved.promoted == moved and wanted_pages(out.moves, out.decision) == 6
    assert exchange_limit(out.moved.limit) == limit


def test_a_policy_that_cut_its_own_ask_says_what_it_wanted():
    from pagetier.core.step import exchange_limit, wanted_pages

    dec = Decision(promote=np.arange(2), stats={"wanted_pages": 5, "limit": "rate"})
    st, step = make_step(Scripted(dec))
    out = step([read(sample(1, range(6), [1] * 6))], lambda: Limits(budget=100, rate=2))
    assert wanted_pages(out.moves, out.decision) == 5
    assert exchange_limit(out.moved.limit or dec.stats["limit"]) == "rate"
    assert exchange_limit(None) == "candidates" and exchange_limit("bogus") == "candidates"


@pytest.mark.parametrize("budget,rate,mb_s,limit", [
    ("100M", 0.0, None, "candidates"),
    ("2M", 0.0, None, "budget"),
    ("100M", 1.0, None, "rate"),
    ("100M", 32.0, 1.0, "throughput"),  # 1 MB/s measured moves less than --rate's 32 MB/s
])
def test_the_daemon_stats_say_what_stopped_the_exchange(tmp_path, budget, rate, mb_s, limit):
    """The daemon's interval stats (its JSON line, the status file's "last") carry the
    limit and the bytes wanted beside the bytes moved; the log line says both."""
    from test_daemon_unit import make_daemon

    from pagetier.daemon.report import human_line

    d = make_daemon(tmp_path, units=4096, hot=4096, budget=budget, rate=rate)
    d.cfg.interval = 1.0
    if mb_s is not None:
        d.executor.throughput = mb_s * (1 << 20) / PAGE_SIZE
    s = d.step()
    assert s["limit"] == limit, s["limit"]
    assert s["wanted_bytes"] == 4096 * PAGE_SIZE
    assert s["bytes_moved"] == s["promoted"] * PAGE_SIZE
    assert (s["bytes_moved"] == s["wanted_bytes"]) == (limit == "candidates")
    assert d.last["limit"] == limit and d.last["wanted_bytes"] == s["wanted_bytes"]
    assert f"want 16M moved {s['bytes_moved'] >> 20}M: {limit}" in human_line(s, 0, 1)


def test_pagetier_status_shows_the_last_exchange_and_its_limit():
    from pagetier.daemon.status import format_status

    last = {"interval": 7, "fast_used": 100 << 20, "budget": 128 << 20, "resident": {},
            "cpu_s": 0.01, "promoted": 18 * 256, "demoted": 0, "wanted_bytes": 64 << 20,
            "limit": "rate"}
    doc = {"pid": 1, "alive": True, "config": {}, "last": last, "totals": {}}
    assert "exchange 64 MiB wanted, 18 MiB moved: rate" in format_status(doc)
    assert "exchange" not in format_status({**doc, "last": {**last, "wanted_bytes": 0}})
