"""scripts/bench_scale.py's host-side pieces: the daemon's view of the hot set (what its state
ranks hottest, as address ranges), how each view is scored against the workload's ticks, and
the end-to-end table."""
from __future__ import annotations

import errno
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pagetier.core.sample import Sample
from pagetier.core.state import PageState
from pagetier.profiler.kmod import KmodError

BASE = 0x7F0000000000
PAGE = 4096
H = 2 << 20


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_scale", Path(__file__).parent.parent / "scripts" / "bench_scale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_runs_of_merges_adjacent_units(bench):
    addr = np.array([BASE + 3 * PAGE, BASE, BASE + PAGE, BASE + H], np.uint64)
    npages = np.array([1, 1, 1, 512], np.uint16)
    assert bench.runs_of(addr, npages) == [[BASE, BASE + 2 * PAGE], [BASE + 3 * PAGE,
                                                                     BASE + 4 * PAGE],
                                           [BASE + H, BASE + 2 * H]]
    assert bench.runs_of(np.zeros(0, np.uint64), np.zeros(0, np.uint16)) == []


def _state_with(pid: int, rates: list[tuple[int, float]], intervals: int = 1) -> PageState:
    """A state of 16 regions of ``pid`` from BASE; ``rates``: (region index, freq) of each
    interval's accessed regions, merged ``intervals`` times."""
    st = PageState()
    addr = BASE + np.arange(16, dtype=np.uint64) * np.uint64(H)
    for _ in range(intervals):
        st.begin_interval()
        freq = np.zeros(16, np.float32)
        for i, f in rates:
            freq[i] = f
        st.update(Sample(pid=pid, addr=addr, count=(freq > 0).astype(np.uint32),
                         node=np.ones(16, np.int16), npages=np.full(16, 512, np.uint16),
                         freq=freq, region=np.ones(16, bool)))
    return st


def test_daemon_view_ranks_the_target_by_heat_and_rate(bench):
    """Regions 4-5 are hot in both signals; only this target's units inside the buffer count."""
    st = _state_with(7, [(4, 1e5), (5, 1e5), (9, 3.0)], intervals=2)
    other = Sample(pid=8, addr=np.array([BASE + 4 * H], np.uint64), count=np.ones(1, np.uint32),
                   node=np.ones(1, np.int16), npages=np.full(1, 512, np.uint16),
                   freq=np.full(1, 1e7, np.float32), region=np.ones(1, bool))
    st.update(other)
    rng = np.random.default_rng(0)
    v = bench.daemon_view(st, 7, BASE, BASE + 16 * H, 2 * 512, rng)
    assert v["heat"] == [[BASE + 4 * H, BASE + 6 * H]]
    assert v["rate"] == [[BASE + 4 * H, BASE + 6 * H]]
    assert v["units"] == 16
    # a target the state does not know: an empty view
    assert bench.daemon_view(st, 99, BASE, BASE + 16 * H, 1024, rng)["heat"] == []


def test_score_views_uses_the_window_of_each_intervals_middle(bench):
    """The ticks' own clock is mapped onto ours through the promptest tick; a view is scored
    against the window of the first tick at or after its interval's middle."""
    hot_size = 2 * H
    ready = {"hot_size": hot_size}
    a, b = BASE, BASE + 8 * H
    # ticks at workload times 1..6 s, read 0.01-0.5 s late: our clock = theirs + 100.01
    log = [(100 + t + late, {"t": float(t), "hot_addr": a if t <= 3 else b})
           for t, late in ((1, 0.3), (2, 0.01), (3, 0.5), (4, 0.2), (5, 0.1), (6, 0.4))]
    clock = bench.tick_clock(log)
    assert clock[0] == (pytest.approx(101.01), a)
    views = [
        {"t": 102.5, "heat": [[a, a + hot_size]], "rate": [[a, a + H]]},  # window a
        {"t": 103.5, "heat": [[a, a + hot_size]], "rate": [[b, b + hot_size]]},  # middle 103.0
        {"t": 104.5, "heat": [[a, a + H], [b, b + H]], "rate": [[b, b + hot_size]]},  # b
        {"t": 107.5, "heat": [[b, b + hot_size]], "rate": []},  # middle 106.0: the last tick
        {"t": 110.0, "heat": [[b, b + hot_size]], "rate": []},  # no tick after 108.75: left out
    ]
    got = bench.score_views(views, log, ready)
    assert got["scored"] == 4
    heat, rate = got["heat_pr"], got["rate_pr"]
    assert heat["p_min"] == 0.5 and heat["r_min"] == 0.5 and heat["p_med"] == 1.0
    # rate: 1.0/0.5, 0/0 (b in window a), 1/1, and an empty view 0/0
    assert rate["p_min"] == 0.0 and rate["r_med"] == 0.25 and rate["intervals"] == 4


def _daemon(process_cpu=0.05, module=0.2):
    return {"intervals": 8, "cpu_s_med": 0.04, "cpu_s_max": 0.09, "cpu_s_mean": 0.045,
            "process_cpu": process_cpu, "module_cpu": module, "ran": "abit", "units_med": 600,
            "heat_pr": {"p_med": 1.0, "p_min": 0.9, "r_med": 1.0, "r_min": 0.8, "intervals": 8},
            "rate_pr": {"p_med": 1.0, "p_min": 1.0, "r_med": 1.0, "r_min": 1.0, "intervals": 8}}


def _doc(cells):
    return {"kernel": "6.12.117", "date": "2026-12-03 06:00 UTC", "before": "x",
            "args": {"after": "tree"}, "modules": {}, "cells": cells}


def test_render_shows_the_end_to_end_table(bench):
    damon = {"cpu": 0.25, "regions": 40, "p_med": 1.0, "p_min": 0.0, "r_med": 0.99, "r_min": 0.0}
    cells = [{"size_mb": mb, "thp": False, "motion": motion, "module": {}, "damon": damon,
              "daemon": {"auto": _daemon()}} for mb in (1024, 8192)
             for motion in ("still", "moving")]
    cells[3]["daemon"]["auto"] = {"error": "the daemon gave 1 intervals"}
    doc = _doc(cells)
    text = bench.render(doc)
    assert "| daemon auto: the target's mode | still | abit | abit |" in text
    assert "| module + daemon | still | 25.0% | 25.0% |" in text
    assert "| (module + daemon) / kdamond | still | 1.00x | 1.00x |" in text
    assert "| P/R daemon's view (heat) | still | 1.00/0.90 1.00/0.80 |" in text
    assert "| daemon auto: the target's mode | moving | abit | the daemon gave 1 intervals |" \
        in text
    assert "| daemon auto view by heat | moving | 1.00/0.90 1.00/0.80 | - |" in text
    # an older run's record without the process's CPU: the step's, marked
    cells[0]["daemon"]["auto"] = dict(_daemon(), process_cpu=None)
    assert "| daemon | still | 4.5%* (40/90) | 5.0% (40/90) |" in bench.render(doc)


def test_render_sets_the_daemon_beside_the_one_of_a_revision(bench):
    """--daemon-before: the revision's daemon gets rows of its own, and the tree's own daemon
    and module + daemon are given as ratios to it."""
    cells = [{"size_mb": 8192, "thp": False, "motion": "still", "module": {},
              "daemon": {"abit": _daemon(0.05, 0.2), "abit@1234567": _daemon(0.1, 0.2)}}]
    text = bench.render(_doc(cells))
    assert "| daemon abit@1234567: the target's mode | still | abit |" in text
    assert "| daemon: this tree / git 1234567 | still | 0.50x |" in text
    assert "| module + daemon: this tree / git 1234567 | still | 0.83x |" in text
    assert text.count("this tree / git") == 2  # not under the tree's own rows


def test_median_run_counts_a_failed_run_as_the_costliest(bench):
    runs = [_daemon(0.3), {"error": "the daemon gave 1 intervals"}, _daemon(0.1)]
    assert bench.median_run(runs)["process_cpu"] == 0.3
    assert bench.median_run(runs[:1])["process_cpu"] == 0.3


def test_daemon_before_names_a_bad_revision(bench):
    with pytest.raises(SystemExit, match="--daemon-before no-such-rev: not a git revision"):
        bench.daemon_tree("no-such-rev")
    assert bench.daemon_tree("HEAD").name.startswith("daemon-rev-")
    with pytest.raises(SystemExit):
        bench.parse(["--daemon-before", "HEAD"])  # needs --daemon


def test_render_shows_the_attach_transient(bench):
    """A mode's cell says how long its passes took to fit in one period after the attach."""
    trail = [(1, 10, 1.0, 1.0, 0), (1, 10, 1.0, 1.0, 0)]
    mod = {"ms_per_pass": 100.0, "pass_per_s": 1.0, "cpu": 0.1, "entries_per_pass": 1e3,
           "scan_ms_per_pass": 80.0, "probe_ms_per_pass": 20.0, "wall_ms_per_pass": 900.0,
           "no_pass_intervals": 1, "trail": trail, "resumes": 1, "p_med": 1.0, "p_min": 1.0,
           "r_med": 1.0, "r_min": 1.0, "freq_pr": {},
           "settle": {"s": 9.25, "passes": 6, "resumes": 12}}
    cells = [{"size_mb": 8192, "thp": False, "motion": motion,
              "module": {"after/fault": dict(mod)}} for motion in ("still", "moving")]
    cells[1]["module"]["after/fault"]["settle"] = {"s": 120.0, "passes": 40, "resumes": 80,
                                                   "timed_out": True}
    doc = {"kernel": "6.12.117", "date": "2026-12-03 06:00 UTC", "before": "x",
           "args": {"after": "tree"}, "modules": {}, "cells": cells}
    text = bench.render(doc)
    assert "| after/fault | 1 of 2 / 1 of 2 |" in text
    assert "| after/fault | 9.2 s (6, 12 cut); 1 cut / timed out (40, 80 cut); 1 cut |" in text


class _Stats:
    """A Device stand-in whose STATS go through ``seq`` (None: the pid is not attached)."""

    def __init__(self, seq):
        self.seq = list(seq)

    def stats(self, pid):
        st = self.seq.pop(0)
        if st is None:
            raise KmodError("stats", errno.ESRCH)
        return {"scans": st[0], "scan_resumes": st[1]}

    def close(self):
        pass


def test_settling_waits_for_passes_in_one_period(bench):
    """Passes cut by the budget (resumes growing) are not settled; an attach again (scans back
    to 0) starts over; passes that ended with no cut since the last look are."""
    seq = [None, (0, 0), (1, 3), (2, 5), (0, 0), (1, 2), (1, 2), (3, 2), (9, 9)]
    s = bench.Settling(7, dev=_Stats(seq))
    got = [s.look() for _ in range(8)]
    assert got == [False] * 7 + [True]
    assert s.look() is True  # settled stays settled, without another look at the stats
