"""The daemon loop: every interval read the profiler, ask the policy, move within budget and rate.

One interval (:meth:`Daemon.step`) is the Step of pagetier/core/step.py, the one the trace
simulator runs too:

1. each target's counts (``profiler.read(pid, reset=True, accessed_only=...)``: the units
   accessed since the last read, and every tracked unit at a target's first read) merged into
   the PageState as rates (accesses/s over the time since the target's last read, or the
   profiler's own frequency estimate). Cold and unmapped units are found by a complete read
   spread over FULL_READ_EVERY intervals: each interval, before the counts, one part of the
   target's address space (``profiler.read_part``) tells the state which units exist there
   (or, with a profiler that cannot read parts, every tracked unit every FULL_READ_EVERY
   intervals);
2. units of unknown node looked up with ``mover.query_nodes``;
3. the policy's Decision, given a Context with the fast budget and the fast node's capacity
   (daemon/fastnode.py: what the node can hold for the targets, their units on it plus its
   room above the high watermark; below the budget the node is the limit, and the policy
   exchanges) and the rate limit in pages (the smaller of ``--rate`` and what the migration
   throughput measured so far moves in THROUGHPUT_HEADROOM intervals: daemon/executor.py);
4. the move planner (pagetier/core/planner.py): demotions first (the policy's, then the
   planner's own when the targets are over budget, coldest first), then the promotions that
   fit in the budget left, the rate left and the fast node's room: the daemon enforces all
   three whatever the policy returns;
5. the moves (daemon/moves.py over daemon/executor.py and ``mover.move``; nothing in a dry
   run), recorded in the state: demotions, then the promotions planned again on what the
   demotions left, with the room read again. Units whose pages are gone are forgotten, a
   full node (ENOMEM) ends this interval's moves, so does the interval's time (the rest is
   ``deferred``), units whose move failed for good (EACCES: shared pages) are left alone for
   STUCK_RETRY intervals; fast pages the kernel refused to move (mapped by other processes
   too) are outside the budget, reported as ``fast_unmovable``;
6. a stats dict (with ``limit``: what stopped the exchange where it did, "candidates" (all
   that was wanted moved), "budget", "node", "rate" or "throughput"; and ``wanted_bytes``, what
   the exchange wanted moved), printed as a JSON line (``--json``) or a short human line, and
   written to the status file that ``pagetier status`` reads.

The first interval ends as soon as the profiler has its first frequency estimate of every
target (pagetier.ko: the first scan whose probes measured the units accessed since attach; two
intervals at most), or one interval after the start with a profiler that gives none: a
decision needs counts to rest on. The next ones come an interval apart, each ending just after
the first end of one of the profiler's sampling periods (pagetier.ko: a scan and its probes)
within half a period of when it is due, so that every read carries the newest estimates.
After an idle read (no unit with an access rate: the targets have not started, or paused) or a
partial one (under half as many such units as the last full read: a read that missed most
units, or the first after the program moved to memory whose units are counted but not yet
probed) the next one comes at the first end of a period instead (pagetier.ko: about 0.6 s in
the test VM at a 500 ms scan period, against 1.1-1.2 s intervals), so a start, a resumption or
a new hot set is acted on a period after it is seen. A policy may ask for the same after its
decision (``Decision.read_soon``: the default policy does when a read shows accesses moving
off the hot set but the new set's rates are not estimated yet); two early reads in a row at
most. A policy that looks between reads (``Policy.looks_between_reads``: the default policy
does) is shown, at each end of a period for every target before the interval is due, what the
profiler has counted since the last read, without taking it (``read(reset=False)``); when it
answers that this is worth a decision now (``Policy.read_now``: the accesses moved off its hot
set onto a new one), the read comes right then, as an early read flagged ``looked``. With
pagetier.ko's periods about half an interval long, a phase change that began early in an
interval is acted on a period sooner. An *early* read shares the last interval's rate limit.
Between intervals the daemon serves its control socket (daemon/control.py): attach/detach and
status requests, and applications' annotations (pagetier/annotate.py), which it passes to the
policy (``Policy.annotate``); every profiler sample it reads goes to ``Policy.observe``. When
the policy asks (a layer boundary), the daemon decides and moves at once, without waiting for
the next interval: a *boundary step* (no profiler read; the interval's rate limit is shared).

Targets that exit are detached and dropped; a live target the profiler fails to read is
attached again (dropped if that fails too). SIGTERM/SIGINT stop the loop cleanly (the profiler
detached, numa_balancing restored); SIGHUP reloads the configuration.
"""
from __future__ import annotations

import errno
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
# numpy imports numpy.ma at the first call of np.unique or np.median: 12 ms natively, 0.3-0.5 s
# under QEMU's emulation, paid in the first decision after attach, before the first promotions
import numpy.ma  # noqa: F401

from pagetier import policies, uapi
from pagetier.core import mover as mover_mod
from pagetier.core import planner
from pagetier.core.state import PageState
from pagetier.core.step import STUCK_RETRY, Limits, Outcome, Read, Step  # noqa: F401
from pagetier.core.step import exchange_limit, wanted_pages
from pagetier.core.units import PAGE_SIZE
from pagetier.daemon import cgroups as cgroups_mod
from pagetier.daemon import config as config_mod
from pagetier.daemon import control
from pagetier.daemon import report
from pagetier.daemon.clock import Clock
from pagetier.daemon.executor import THROUGHPUT_MIN_PAGES, Executor, new_tally
from pagetier.daemon.fastnode import ROOM_MARGIN, FastNode  # noqa: F401
from pagetier.daemon.moves import MOVE_TIME_SHARE, DaemonMover  # noqa: F401
from pagetier.daemon.numab import NumaBalancing
from pagetier.daemon import targets as targets_mod
from pagetier.daemon.targets import Targets
from pagetier.errors import ConfigError, PagetierError
from pagetier.profiler import base as profiler_base
from pagetier.protocol import run_dir

log = logging.getLogger("pagetier.daemon")

MIB = 1 << 20
# an interval's moves are capped at what the measured migration throughput moves in this many
# intervals: a phase change's exchange (demote a region, promote the next) goes in one batch,
# with room to find out that the throughput has grown; MOVE_TIME_SHARE (daemon/moves.py) stops
# the moves when the throughput fell
THROUGHPUT_HEADROOM = 1.6
# Where steps take longer than the interval (a slow decision over many 4 KiB units, a busy
# machine), the throughput cap and the moves' deadline stand for the time steps really take,
# up to this many intervals: a step that moved one interval's worth would move at a fraction
# of the measured throughput
STEP_PERIOD_MAX = 3.0
# the stats counters summed over the run (the status file's "totals")
TOTALS = ("promoted", "demoted", "failed", "busy", "gone", "bytes_moved", "ping_pongs",
          "forced_demotions", "clipped", "deferred")
# A read lists only the units accessed since the last one (READ_ACCESSED_ONLY: the cost follows
# the accessed set); at a target's first read it lists every unit the profiler tracks. Every
# interval one part of FULL_READ_EVERY of the target's address space is read completely
# (Profiler.read_part): over FULL_READ_EVERY intervals that finds the units that appeared cold
# (their node counts against the budget) and those unmapped (absent from their part:
# forgotten; a move that finds a page gone forgets it sooner), at 1/FULL_READ_EVERY of the cost
# each interval instead of all of it in one. A profiler that cannot read parts lists every unit
# every FULL_READ_EVERY intervals instead.
FULL_READ_EVERY = 16
# a read with under this share of the units with an access rate of the last full read is
# partial: the next read comes at the profiler's next period end
PARTIAL_READ = 0.5
# early reads in a row at most: a policy's request for one (Decision.read_soon) after an early
# read is honoured once, so a partial read, then a policy's "not sure yet", are both read again
EARLY_RUN = 2
# pagetier.ko scan periods per interval when the configuration names no scan_period_ms. The
# daemon reads at period ends and looks at the counts at the ones between (read_now), so a
# program's move to new memory is seen a period after it, not an interval; shorter periods
# cost the module more scans (docs/placement-log.md has the measurements)
SCANS_PER_INTERVAL = 4
PERIOD_POLL_S = 0.02  # how often the wait for the profiler's period end looks (an ioctl a target)
# The wait for a period end asks the profiler from this long before a period after the last end
# it saw: pagetier.ko's abit periods start a period apart (kmod/target.c next_scan_delay), so
# their ends come a period apart, give or take the change in a pass's time between two periods
# and the PERIOD_POLL_S by which the last end was seen late. Where the last two ends came closer
# than a period less this (a period the scan budget cut, or one that overran: the next starts
# after a quarter period's rest) the wait asks from half a period after the last end instead.
PERIOD_LEAD_S = 2 * PERIOD_POLL_S
# The longest single wait between two looks at the daemon's own state (a signal's flag, the
# command's exit): the control socket's requests end a wait as they come, whatever its length
WAIT_STEP_S = 0.25


def profiler_options(cfg) -> dict:
    """The options the profiler backend gets: the configuration's ``profiler_options``, and for
    kmod, unless they name a ``scan_period_ms``, a scan period of 1/SCANS_PER_INTERVAL of the
    interval (see SCANS_PER_INTERVAL). ``scan_period_ms = 0`` still means the module's own
    default (its sysfs ``default_scan_period_ms``)."""
    opts = dict(cfg.profiler_options)
    if cfg.profiler == "kmod" and "scan_period_ms" not in opts:
        opts["scan_period_ms"] = default_scan_period_ms(cfg.interval)
    return opts


def default_scan_period_ms(interval_s: float) -> int:
    """pagetier.ko's scan period for a daemon reading every ``interval_s`` seconds when the
    configuration names none: SCANS_PER_INTERVAL periods an interval, within the module's
    bounds."""
    ms = round(interval_s * 1000 / SCANS_PER_INTERVAL)
    return max(uapi.SCAN_PERIOD_MIN_MS, min(uapi.SCAN_PERIOD_MAX_MS, ms))


def create_profiler(cfg):
    try:
        return profiler_base.create(cfg.profiler, **profiler_options(cfg))
    except TypeError as e:
        raise ConfigError(f"{cfg.source}: bad profiler_options for profiler {cfg.profiler!r}: {e}")


def create_policy(cfg):
    try:
        return policies.create(cfg.policy, cfg.policy_options)
    except ConfigError as e:
        raise ConfigError(f"{cfg.source}: {e}")


class Daemon:
    """Manages the placement of the pages of ``pids`` (and of ``cgroup``'s processes, and of
    ``child``, a started command) until they all exit, ``cfg.duration`` passes, or it is stopped.

    It is composed of the target tracking (``tracker``, daemon/targets.py), the executor of
    moves (``executor``, daemon/executor.py), the reporting (``report``, daemon/report.py) and
    the planner (pagetier.core.planner); it runs the interval step and the loop. ``profiler``,
    ``policy``, ``mover``, ``numab``, ``state``, ``clock`` and ``out`` replace the defaults
    (tests pass stand-ins; ``numab=False``: leave numa_balancing alone).
    """

    def __init__(self, cfg, *, pids=(), cgroup: str | None = None, cgroups=(), tree: bool = False,
                 child: subprocess.Popen | None = None, profiler=None, policy=None, mover=None,
                 numab: NumaBalancing | bool | None = None, state: PageState | None = None,
                 clock: Clock | None = None, out=None, serve: bool = False):
        self.cfg = cfg
        # serve: start with no target and keep running when the last one goes; targets come
        # and go through the control socket (attach, add_cgroup) until SIGTERM
        self.serve = serve
        self.clock = clock if clock is not None else Clock()
        self.profiler = profiler if profiler is not None else create_profiler(cfg)
        if numab is None or numab is True:
            numab = NumaBalancing(dry_run=cfg.dry_run)
        self.numab = numab or None
        self.state = state if state is not None else PageState()
        # cgroups: (path, budget bytes or None) pairs, besides cfg.cgroup's tables; tree: follow
        # the child's /proc descendants (daemon/targets.py)
        cgs = [(cgroups_mod.resolve(c["path"]), c["fast_budget"]) for c in cfg.cgroup]
        self.tracker = Targets(self.profiler, self.state, pids=pids, cgroup=cgroup, child=child,
                               cgroups=[*cgs, *cgroups], tree=tree, serve=serve)
        self.executor = Executor(self.state, self.profiler,
                                 mover if mover is not None else mover_mod,
                                 lambda pid: self.tracker.alive(pid), clock=self.clock)
        self.fastnode = FastNode(lambda: self.cfg, self.state)
        self.stepper = Step(self.state, policy if policy is not None else create_policy(cfg),
                            DaemonMover(lambda: self.cfg, self.executor, self.fastnode,
                                        self.tracker.drop, self.step_period),
                            self.clock, policies.Context, fast=cfg.fast_node, slow=cfg.slow_node,
                            interval_s=cfg.interval)
        status = cfg.status_file or run_dir() / f"daemon-{os.getpid()}.json"
        self.report = report.Reporter(out if out is not None else sys.stdout, status)
        self.stop_reason: str | None = None
        self._reload = False
        self._signal: int | None = None
        self.history: list[dict] = []  # kept short: the last few stats
        self.totals = {k: 0 for k in TOTALS}
        self.move_errors: dict[str, int] = {}  # errno name -> pages that failed so, over the run
        self.metrics = None  # a daemon.metrics.Metrics serving --metrics (set by the CLI)
        self.started = self.clock.time()
        self._t0 = self.stepper.t0
        self.last: dict | None = None
        self.control = None
        self._boundary = False  # the policy asked for a decision now
        self._interval_moved = 0  # pages moved since the last regular step (rate sharing)
        self._last_regular: float | None = None  # when the last regular step began
        self._period: float | None = None  # the time between the last two regular steps,
        # less what their moves took (a longer period must not let the moves grow it further)
        self._moving_s = 0.0  # seconds of moves since the last regular step began
        self._reread = False  # the last read was idle or partial: read again at a period's end
        self._accessed = 0  # units with an access rate in the last full read (see step)
        self._early_run = 0  # early reads in a row up to the last one
        self._looked = False  # this read comes early: a look between reads asked for it
        self._period_seen: float | None = None  # when the last profiler period end was seen
        self._period_gap: float | None = None  # the time between the last two ends seen
        self._by_throughput = False  # the measured throughput, not --rate, caps this step
        self._aliased = 0  # fast pages counted again as another target's (targets.fast_aliases)

    @property
    def policy(self):
        return self.stepper.policy

    @policy.setter
    def policy(self, policy) -> None:
        self.stepper.policy = policy

    @property
    def targets(self) -> set[int]:
        """The managed pids."""
        return self.tracker.pids

    @property
    def child(self) -> subprocess.Popen | None:
        return self.tracker.child

    @property
    def mover(self):
        return self.executor.mover

    def adopt(self, child: subprocess.Popen) -> None:
        """Manage ``child``, a command started for the daemon (attached when it runs)."""
        self.tracker.adopt(child)

    def refresh_targets(self) -> None:
        reason = self.tracker.refresh()
        if reason:
            self.stop_reason = reason

    # ------------------------------------------------------------------ budget and rate
    def rate_pages(self) -> int:
        return planner.rate_pages(self.cfg.rate, self.cfg.interval)

    def throughput_pages(self) -> int | None:
        """Pages the measured migration throughput moves in THROUGHPUT_HEADROOM step periods (a
        phase change's exchange in one batch, with room to find out that the throughput has
        grown); None until a move has been measured."""
        tp = self.executor.throughput
        if tp is None:
            return None
        return max(2 * THROUGHPUT_MIN_PAGES, int(tp * self.step_period() * THROUGHPUT_HEADROOM))

    def step_period(self) -> float:
        """The seconds a step's moves stand for: the interval, or the time between the last
        two regular steps less their moves' time where that is longer (at most
        STEP_PERIOD_MAX intervals)."""
        iv = self.cfg.interval
        return min(max(iv, self._period or iv), STEP_PERIOD_MAX * iv)

    def trust_moves(self) -> int:
        """Intervals for which the profiler's node of a moved unit may predate the move."""
        lag = float(getattr(self.profiler, "node_lag_s", 0.0))
        return int(np.ceil(lag / max(self.cfg.interval, 1e-3))) + 1 if lag > 0 else 0

    # ------------------------------------------------------------------ one interval
    def _max_count(self, elapsed: float) -> int | None:
        """The scans a read ``elapsed`` seconds after the last one can cover, for a profiler
        that counts one access per unit per scan (kmod: ``period_s`` is its scan period);
        None when unknown. Without a frequency estimate counts are clipped to it."""
        period = float(getattr(self.profiler, "period_s", 0.0))
        if period <= 0:
            return None
        return max(1, int(round(elapsed / period)))

    def read_target(self, pid: int) -> float:
        """Read ``pid``'s counts into the state and show them to the policy; the merge time."""
        return self.stepper.merge(self._reads([pid]))

    def _reads(self, pids):
        """The step's reads of ``pids``, one at a time (each taken after the one before it is
        merged): the counts, and one part of the complete read (see FULL_READ_EVERY). A target
        that exited is dropped; one the profiler fails to read is attached again."""
        for pid in pids:
            r = self._read(pid)
            if r is not None:
                yield r

    def _read(self, pid: int) -> Read | None:
        first = pid not in self.tracker.last_read
        full = first or self.state.interval % FULL_READ_EVERY == 0
        part = None
        read_part = getattr(self.profiler, "read_part", None)
        try:
            if not first and read_part is not None:  # one part of the complete read (None: the
                # profiler cannot)
                part = read_part(pid, self.state.interval % FULL_READ_EVERY, FULL_READ_EVERY)
            if part is not None:
                full = False
            sample = self.profiler.read(pid, reset=True, accessed_only=not full)
        except (PagetierError, OSError) as e:
            if not self.tracker.alive(pid):
                self.tracker.drop(pid)
                return None
            # detached behind our back (start over with this target), or exiting: its memory
            # is being torn down while it is not yet a zombie, and the module says ESRCH to a
            # read and to an attach alike; that is the normal end of a target, not a warning
            self.tracker.drop(pid, "could not be read")
            try:
                self.tracker.attach(pid)
            except (PagetierError, OSError) as again:
                if getattr(again, "errno", None) == errno.ESRCH or not self.tracker.alive(pid):
                    log.info("pid %d is exiting: not attached again", pid)
                else:
                    log.warning("pid %d: profiler read failed (%s), and attaching again failed "
                                "(%s)", pid, e, again)
                return None
            log.warning("pid %d: profiler read failed (%s): attached again", pid, e)
            return None
        t_read = self.clock.monotonic()
        last_read = self.tracker.last_read
        elapsed = t_read - last_read.get(pid, t_read - self.cfg.interval)
        last_read[pid] = t_read
        return Read(pid=pid, sample=sample, elapsed_s=max(elapsed, 1e-3),
                    interval_s=self.cfg.interval, max_count=self._max_count(elapsed), part=part,
                    trust_moves=self.trust_moves())

    def _read_again(self, st, early: bool) -> bool:
        """Whether the next read should come at the profiler's next period end: this read was
        idle (no unit with an access rate) or partial (under half as many as the last full
        read: pagetier.ko's reads miss most units now and then, and the first read after a
        program moves to new memory finds its units counted but not yet probed). A re-read that
        is partial again is taken as it is: the program accesses fewer units now."""
        n = st.rated()  # the touched units with a rate, counted in the merge
        partial = not early and n < PARTIAL_READ * self._accessed
        if not partial:
            self._accessed = n
        return n == 0 or partial

    def step(self, boundary: bool = False) -> dict:
        """One interval (the Step, pagetier/core/step.py); ``boundary``: a decision the policy
        asked for between intervals (no profiler read, the same interval number, what is left
        of the interval's rate limit)."""
        cpu0, wall0 = time.process_time(), time.monotonic()
        cfg, step = self.cfg, self.stepper
        step.fast, step.slow, step.interval_s = cfg.fast_node, cfg.slow_node, cfg.interval
        merge_s = 0.0
        early = not boundary and self._reread
        looked, self._looked = self._looked and not boundary, False
        if not boundary:
            step.begin()
            if not early:  # a read early after an idle or partial one shares its rate
                self._interval_moved = 0
                now = self.clock.monotonic()
                if self._last_regular is not None:
                    self._period = now - self._last_regular - self._moving_s
                self._last_regular, self._moving_s = now, 0.0
            merge_s = step.merge(self._reads(sorted(self.targets)))
            self._early_run = self._early_run + 1 if early else 0
            self._reread = self._read_again(self.state, early)
        scan_s = self._profiler_scan_s()
        out = step.act(self._limits)
        if not boundary and out.decision.read_soon and self._early_run < EARLY_RUN:
            self._reread = True  # the policy cannot judge this read yet: read again soon
        if not cfg.dry_run:
            self._interval_moved += out.moved.demoted + out.moved.promoted
            self._moving_s += out.moved.tally.get("move_s", 0.0)
        stats = {"interval": self.state.interval, "boundary": boundary,
                 # read at the end of the profiler's first period after an idle or partial
                 # read, not a whole interval later
                 "early": early,
                 # ...because a look at the profiler's counts at a period end between reads
                 # found what the policy wanted read at once (Policy.read_now)
                 "looked": looked,
                 "t": round(self.clock.monotonic() - self._t0, 3),
                 "targets": len(self.targets), "units": len(self.state)}
        tuning = getattr(self.profiler, "tuning", None)
        if tuning:  # kmod: each target's mode (kinds "auto" chooses it per target at attach)
            stats["modes"] = {str(pid): t["mode"] for pid, t in tuning.items()}
        stats.update(self._step_stats(out))
        stats.update(merge_s=round(merge_s, 6),  # PageState bookkeeping of the samples
                     decide_s=round(out.decide_s, 6),
                     move_s=round(out.moved.tally.get("move_s", 0.0), 6),  # wall time of the moves
                     cpu_s=round(time.process_time() - cpu0, 6),
                     profiler_scan_s=scan_s,  # kernel-side scan time so far (kmod)
                     wall_s=round(time.monotonic() - wall0, 6))
        for k in TOTALS:
            self.totals[k] += stats[k]
        for name, n in stats["errors"].items():
            self.move_errors[name] = self.move_errors.get(name, 0) + n
        self.last = stats
        self.history = (self.history + [stats])[-16:]
        return stats

    def _limits(self) -> Limits:
        """This step's budget, rate (the smaller of --rate and what the measured throughput
        moves, less what was moved since the last regular step) and the fast node's room."""
        rate = self.rate_pages()
        measured = None if self.cfg.dry_run else self.throughput_pages()
        self._by_throughput = measured is not None and measured < rate
        budget = self.fastnode.budget_pages()
        # a page several targets map (a shared segment, a file) is charged once: its units
        # beyond the first on the fast node are added to the budget (and taken off fast_used)
        self._aliased = targets_mod.fast_aliases(self.state, self.targets, self.cfg.fast_node)
        if budget < planner.NO_LIMIT:
            budget += self._aliased
        limit = max(0, (measured if self._by_throughput else rate) - self._interval_moved)
        self.fastnode.begin_step()
        room = self.fastnode.room_pages()
        # the managed cgroups' own budgets and fair shares (daemon/cgroups.py)
        groups = cgroups_mod.plan_groups(self.tracker, self.state, budget, room, self.cfg.fast_node)
        return Limits(budget=budget, rate=limit, room=room, groups=groups)

    def _step_stats(self, out: Outcome) -> dict:
        """The stats of a step's moves and of the fast node after them."""
        st, fast, moved, lim = self.state, self.cfg.fast_node, out.moved, out.limits
        acc = {**new_tally(), **moved.tally}  # a mover reports what it counts; the rest is 0
        resident = {(str(n) if n >= 0 else "unknown"): p * PAGE_SIZE
                    for n, p in st.resident().items()}
        bound = exchange_limit(moved.limit or out.decision.stats.get("limit"))
        if bound == "rate" and self._by_throughput:
            bound = "throughput"  # the measured throughput, not --rate, set the interval's cap
        tp = self.executor.throughput
        return {
            "promoted": moved.promoted,  # 4 KiB pages (planned ones in a dry run)
            "demoted": moved.demoted,
            "forced_demotions": int(len(out.moves.forced)),
            "failed": acc["failed"], "busy": acc["busy"], "nomem": acc["nomem"],
            "gone": acc["gone"],
            "clipped": out.clipped,
            # pages planned but not tried: the moves ran out of the interval's time
            "deferred": acc["deferred"],
            "bytes_moved": acc["bytes_moved"],
            "ping_pongs": acc["ping_pongs"],
            "resident": resident,
            # what counts against the budget: a page several targets map counted once
            "fast_used": (st.movable_on(fast) - self._aliased) * PAGE_SIZE,
            # pages on the fast node counted again as another target's units (not charged)
            "fast_aliased": self._aliased * PAGE_SIZE,
            "fast_unmovable": st.unmovable_on(fast) * PAGE_SIZE,  # outside the budget
            "budget": int(min(lim.budget - (self._aliased if lim.budget < planner.NO_LIMIT
                                            else 0), 1 << 50)) * PAGE_SIZE,
            # the fast memory the node can hold for the targets (None: unknown)
            "fast_capacity": None if out.capacity is None else int(out.capacity) * PAGE_SIZE,
            # each reading of the fast node's room in this step (before the decision, and again
            # after the demotions when there are promotions), in 4 KiB pages: MemFree, the high
            # watermark, the per-CPU lists' pages and the daemon's demoted pages counted there
            "fast_room": self.fastnode.detail,
            # what stopped the exchange where it did: "candidates" (everything wanted was
            # moved), "budget", "node" (the fast node's free memory), "rate", "throughput"
            "limit": bound,
            # bytes the interval wanted moved (the policy's moves that had somewhere to go
            # plus forced demotions), beside bytes_moved
            "wanted_bytes": wanted_pages(out.moves, out.decision) * PAGE_SIZE,
            "rate_pages": int(min(lim.rate, 1 << 50)),
            # the migration throughput measured so far (MB/s; None: nothing moved yet)
            "throughput_mb_s": None if tp is None else round(tp * PAGE_SIZE / MIB, 1),
            "dry_run": self.cfg.dry_run,
            "errors": acc["errors"],
            "policy": dict(out.decision.stats),
        }

    def _profiler_scan_s(self) -> float:
        """Seconds the profiler has spent scanning the current targets in the kernel (kmod's
        ``scan_ns`` plus its frequency probes' ``probe_ns``; 0 for backends that count neither)."""
        ns = 0
        for pid in self.targets:
            try:
                st = self.profiler.stats(pid)
                ns += int(st.get("scan_ns", 0)) + int(st.get("probe_ns", 0))
            except Exception:  # a target that just exited: no stats
                continue
        return round(ns / 1e9, 6)

    # ------------------------------------------------------------------ signals and reload
    def _on_signal(self, signum, frame):
        if signum == signal.SIGHUP:
            self._reload = True
            return
        self._signal = signum
        self.stop_reason = f"signal {signal.Signals(signum).name}"

    def reload(self) -> None:
        self._reload = False
        try:
            new = config_mod.load(self.cfg.config_path, self.cfg.overrides)
            for key in config_mod.RUNTIME_KEYS:  # not in the file: what the daemon started with
                setattr(new, key, getattr(self.cfg, key))
            policy = self.policy
            if (new.policy, new.policy_options) != (self.cfg.policy, self.cfg.policy_options):
                policy = create_policy(new)
                policy.take_over(self.policy)
        except PagetierError as e:
            log.error("SIGHUP: config not reloaded, keeping the old one: %s", e)
            return
        for key in ("profiler", "profiler_options", "fast_node", "slow_node", "log_file",
                    "metrics"):
            if getattr(new, key) != getattr(self.cfg, key):
                log.warning("SIGHUP: %s changed; it takes a restart, keeping %r", key,
                            getattr(self.cfg, key))
                setattr(new, key, getattr(self.cfg, key))
        self.cfg, self.policy = new, policy
        log.info("SIGHUP: configuration reloaded from %s", new.source)

    def write_status(self) -> None:
        doc = report.status_doc(self)
        # each target's bytes on the fast and slow node, the move errors over the run and the
        # metrics endpoint: what --metrics serves, from this same document
        tb = report.per_target_bytes(self.state, self.cfg.fast_node, self.cfg.slow_node)
        for t in doc["targets"]:
            t["fast_bytes"], t["slow_bytes"] = tb.get(t["pid"], (0, 0))
            # over the run: bytes moved to each node and moves back within ping_pong_window
            moved = self.executor.per_pid.get(t["pid"], {"to": {}, "ping_pongs": 0})
            t["promoted_bytes"] = moved["to"].get(self.cfg.fast_node, 0) * PAGE_SIZE
            t["demoted_bytes"] = moved["to"].get(self.cfg.slow_node, 0) * PAGE_SIZE
            t["ping_pongs"] = moved["ping_pongs"]
        targets = {t["pid"] for t in doc["targets"]}  # a target gone takes its counts along
        for pid in [p for p in self.executor.per_pid if p not in targets]:
            del self.executor.per_pid[pid]
        doc["move_errors"] = dict(self.move_errors)
        doc["metrics"] = self.metrics.address if self.metrics is not None else None
        self.report.write_status(doc)
        if self.metrics is not None:
            self.metrics.update(doc, self.profiler)

    def _install_signals(self) -> dict:
        old = {}
        if not self.cfg.handle_signals or threading.current_thread() is not threading.main_thread():
            return old
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old[sig] = signal.signal(sig, self._on_signal)
        return old

    def _wait(self, until: float) -> None:
        """Serve the control socket until ``until`` (at least once, even when late)."""
        while self.stop_reason is None and self._signal is None:
            left = until - self.clock.monotonic()
            self._serve(min(WAIT_STEP_S, max(0.0, left)))
            if left <= 0:
                return
            if self.child is not None and self.child.poll() is not None:
                return

    def _wait_next_read(self, t: float, deadline: float | None, soon: bool = False) -> None:
        """Wait for the next interval, due ``cfg.interval`` after ``t`` (this one's start).

        With a profiler whose estimates come at the end of each sampling period (pagetier.ko:
        a scan, then its frequency probes), the interval ends as soon as a period has ended for
        every target within half a period (half an interval, if shorter) of that time, and at
        the end of that window otherwise: reads follow the profiler's periods. At a random
        point of a period, a read would often come just before a scan's probes end, and its
        estimates would be a period old (a new hot set promoted one interval later).

        ``soon`` (the last read was idle or partial: :meth:`_read_again`): the interval ends at
        the first end of a period for every target, however soon, so that accesses after an
        idle stretch, or the units a partial read missed, are read a period later, not up to
        an interval later."""
        until = t + self.cfg.interval
        period = float(getattr(self.profiler, "period_s", 0.0))
        half = min(period, self.cfg.interval) / 2
        periods = getattr(self.profiler, "periods", None)
        pids = sorted(self.targets)
        if half <= 0 or periods is None or not pids:
            self._wait(until if deadline is None else min(until, deadline))
            return
        lo, hi = until - half, until + half
        if soon:
            lo = self.clock.monotonic()
        if deadline is not None:
            lo, hi = min(lo, deadline), min(hi, deadline)
        if not soon and self._look_until(lo, periods, pids):
            self._reread = self._looked = True  # read now, as an early read
            return
        self._wait(lo)
        base = {pid: periods(pid) for pid in pids}
        if None in base.values():  # no periods, or a target gone: read at the due time
            self._wait(min(until, hi))
            return
        next(self._period_ends(hi, periods, pids, base), None)  # the first, or hi

    def _period_ends(self, until: float, periods, pids: list[int], base: dict):
        """Yield (each target's period count) at each end of a profiler period for every
        target since ``base`` (the counts at the start; a target gone counts as ended), until
        ``until``, the daemon stopping or the child exiting."""
        waited = False  # the wait before the end expected came last: this ask is its first
        while self.stop_reason is None and self._signal is None:
            now = self.clock.monotonic()
            if now >= until or (self.child is not None and self.child.poll() is not None):
                return
            due = self._next_end_due(now)
            if due > now:
                self._wait(min(until, due))
                waited = True
                continue
            ended = {pid: periods(pid) for pid in pids}
            if all(ended[pid] != base[pid] for pid in pids):  # None: gone since
                seen = self.clock.monotonic()
                # an end already there at the first ask came sooner than expected, at a time
                # unknown: the next ones are asked for from half a period after (a gap of 0)
                # until two ends seen as they came are a period apart again
                self._period_gap = 0.0 if waited else (
                    None if self._period_seen is None else seen - self._period_seen)
                self._period_seen = seen
                yield ended
                base = ended
            else:
                self._wait(min(until, now + PERIOD_POLL_S))
            waited = False

    def _next_end_due(self, now: float) -> float:
        """When the wait for the profiler's next period end starts asking for it: PERIOD_LEAD_S
        before the end expected a whole number of periods after the last one seen (the nearest
        to ``now``: an end later than expected is still asked for until half a period past
        it), or half a period after the last end when the last two came closer than a period
        less PERIOD_LEAD_S or the last one was there already at the first ask (see
        PERIOD_LEAD_S); ``now`` when no end was seen yet."""
        seen, gap = self._period_seen, self._period_gap
        period = float(getattr(self.profiler, "period_s", 0.0))
        if seen is None or period <= 0:
            return now
        if gap is not None and gap < period - PERIOD_LEAD_S:
            return seen + period / 2
        n = max(1, int((now - seen) / period + 0.5))
        return seen + n * period - min(PERIOD_LEAD_S, period / 2)

    def _look_until(self, until: float, periods, pids: list[int]) -> bool:
        """Until ``until``, at each end of a profiler period for every target, show the policy
        what the profiler has counted since the last read, without taking it
        (``read(reset=False)``), when the policy looks between reads
        (``Policy.looks_between_reads``). True: it asked for a read now (``Policy.read_now``).

        With pagetier.ko's periods of about half an interval, a read comes every second period
        end: a phase change seen at the period end between two reads (bench live fuller and
        phases: the workload's accesses moved to another region) is read and acted on there,
        not a period later."""
        if not getattr(self.policy, "looks_between_reads", False):
            return False
        base = {pid: periods(pid) for pid in pids}
        if None in base.values():
            return False
        return any(None not in ended.values() and self._look(pids)
                   for ended in self._period_ends(until, periods, pids, base))

    def _look(self, pids: list[int]) -> bool:
        """One look between reads: the policy's answer on the units accessed since the last
        read (False when a target cannot be read: the read proper deals with that)."""
        samples = {}
        for pid in pids:
            try:
                samples[pid] = self.profiler.read(pid, reset=False, accessed_only=True)
            except (PagetierError, OSError):
                return False
        return bool(self.policy.read_now(self.state, samples))

    # ------------------------------------------------------------------ control socket
    def open_control(self) -> None:
        """Listen on the control socket (a warning, not an error, when that is impossible)."""
        if self.control is not None:
            return
        explicit = self.cfg.control_socket
        path = Path(explicit) if explicit else control.default_path()
        try:
            self.control = control.ControlServer(path, control.Requests(self))
        except ConfigError as e:
            if explicit or "another pagetier daemon" not in str(e):
                log.warning("%s: no annotations, attach or status requests", e)
                return
            alt = path.with_name(f"control-{os.getpid()}.sock")  # a second daemon
            try:
                self.control = control.ControlServer(alt, control.Requests(self))
            except ConfigError as e2:
                log.warning("%s: no annotations, attach or status requests", e2)
                return
        log.info("control socket %s", self.control.path)

    def close_control(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None

    def _serve(self, timeout: float) -> None:
        if self.control is None:
            self.clock.wait(timeout)
            return
        self.clock.wait(timeout, self.control.poll)
        if self._boundary and self.targets:
            self._boundary = False
            stats = self.step(boundary=True)
            self.report.emit(stats, self.cfg)

    def boundary(self) -> None:
        """The policy asked for a decision now (a layer boundary): a step comes as soon as the
        control socket's requests are served."""
        self._boundary = True

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Manage until done; the exit status: the child's (128+signal if killed), else 0."""
        old = self._install_signals()
        try:
            self.open_control()
            if self.numab is not None:
                self.numab.disable()
            for pid in self.tracker.initial:
                try:
                    self.tracker.attach(pid)
                except (PagetierError, OSError):
                    if self.tracker.alive(pid):
                        raise
                    log.info("pid %d exited before it could be attached", pid)
            duration = self.cfg.duration
            deadline = None if duration is None else self._t0 + duration
            # the first decision rests on counts: a read right after attach has none, and a
            # policy deciding on zero heat would move pages blindly. It comes as soon as the
            # profiler has its first frequency estimate of the targets (pagetier.ko: the first
            # scan whose probes measured them; fault mode's second scan ends a little more than
            # a scan period after attach, so this waits up to two intervals: a read before it
            # would bring no heat to decide on); with no estimate to wait for, one interval
            self.write_status()
            ready = getattr(self.profiler, "first_estimate_ready", None) if self.targets else None
            first = self.clock.monotonic() + self.cfg.interval * (1 if ready is None else 2)
            if deadline is not None:
                first = min(first, deadline)
            while ready is not None and self.targets and self.clock.monotonic() < first:
                got = [ready(pid) for pid in list(self.targets)]
                if None in got:  # no estimate to wait for: one interval of counts
                    ready = None
                    first -= self.cfg.interval
                    break
                if all(got):
                    break
                self._wait(min(first, self.clock.monotonic() + 0.02))
                if self.stop_reason is not None or self._signal is not None:
                    break
            self._wait(first if ready is None else self.clock.monotonic())
            while self.stop_reason is None and self._signal is None:
                if self._reload:
                    self.reload()
                self.refresh_targets()
                if self.stop_reason:
                    break
                if not self.targets and self.tracker.cgroup is None:
                    if not self.serve:
                        self.stop_reason = "all targets exited"
                        break
                    self.write_status()  # nothing to manage: serve requests until there is
                    self._wait(self.clock.monotonic() + self.cfg.interval)
                    continue
                t = self.clock.monotonic()
                stats = self.step()
                self.report.emit(stats, self.cfg)
                self.write_status()
                if deadline is not None and self.clock.monotonic() >= deadline:
                    self.stop_reason = f"--duration {duration:g} s reached"
                    break
                self._wait_next_read(t, deadline, soon=self._reread)
            log.info("stopping: %s", self.stop_reason)
            report.log_top_allocations()
        finally:
            try:
                self.profiler.close()
            finally:
                try:
                    if self.numab is not None:
                        self.numab.restore()
                finally:
                    self.report.remove_status()
                    self.close_control()
                    if self.metrics is not None:
                        self.metrics.close()
                    for sig, h in old.items():
                        signal.signal(sig, h)
        return self._finish_child()

    def _finish_child(self) -> int:
        child = self.child
        if child is None:
            return 0
        if child.poll() is None:
            # stopped by a signal or --duration: pass the stop on to the command, like timeout(1)
            sig = self._signal or signal.SIGTERM
            log.info("sending %s to pid %d", signal.Signals(sig).name, child.pid)
            child.send_signal(sig)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not exit in 30 s: killing it", child.pid)
                child.kill()
                child.wait()
        rc = child.returncode
        return 128 - rc if rc < 0 else rc


