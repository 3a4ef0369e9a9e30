"""The daemon loop: every interval read the profiler, ask the policy, move within budget and rate.

One interval (:meth:`Daemon.step`):

1. each target's counts (``profiler.read(pid, reset=True, accessed_only=...)``: the units
   accessed since the last read, and every tracked unit at a target's first read and every
   FULL_READ_EVERY intervals, which finds cold and unmapped units) merged into the PageState
   as rates (accesses/s over the time since the target's last read, or the profiler's own
   frequency estimate);
2. units of unknown node looked up with ``mover.query_nodes``;
3. the policy's Decision, given a Context with the fast budget, the rate limit in pages and
   the fast capacity: what the fast node can hold for the targets (their units on it plus its
   room above the high watermark). When that is below the budget the node is the limit, and
   the policy exchanges: it demotes colder units to make room for hotter ones;
4. demotions first (the policy's, then the daemon's own when the targets are over budget,
   coldest first), then the promotions that fit in the budget left and the rate left — the
   daemon enforces both whatever the policy returns;
5. the moves (``mover.move``; nothing in a dry run), recorded in the state; units whose pages
   are gone are forgotten, a full node (ENOMEM) ends this interval's moves, units whose move
   failed for good (EACCES: shared pages) are left alone for STUCK_RETRY intervals;
   promotions stop at the fast node's high watermark (move_pages into a node without room
   reclaims and retries page by page before it says ENOMEM);
   the fast budget counts the pages the daemon can move: fast pages the kernel refused to
   move (mapped by other processes too) are reported apart, as ``fast_unmovable``;
6. a stats dict (with ``limit``: the limit that kept wanted units off the fast node,
   "budget", "node", "rate" or None), printed as a JSON line (``--json``) or a short human line, and written to
   the status file that ``pagetier status`` reads.

The first interval ends one interval after the start: a decision needs counts to rest on.
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
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import psutil

from pagetier.daemon import config as config_mod
from pagetier.daemon import mover as mover_mod
from pagetier.daemon.numab import NumaBalancing, run_dir
from pagetier.daemon.state import NEVER, PageState
from pagetier.errors import ConfigError, PagetierError
from pagetier.profiler.base import PAGE_SIZE

log = logging.getLogger("pagetier.daemon")

MIB = 1 << 20
STUCK_RETRY = 32  # intervals before units whose move failed for good (EACCES...) are tried again
ROOM_MARGIN = 1 * MIB  # promotions leave this much above the fast node's high watermark
# A read lists only the units accessed since the last one (READ_ACCESSED_ONLY: the cost follows
# the accessed set); every FULL_READ_EVERY intervals, and at a target's first read, it lists
# every unit the profiler tracks: that read finds the units that appeared cold (their node
# counts against the budget) and those unmapped (absent from it: forgotten; a move that finds
# a page gone forgets it sooner).
FULL_READ_EVERY = 16


def _jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def create_profiler(cfg):
    from pagetier.profiler import base

    try:
        return base.create(cfg.profiler, **cfg.profiler_options)
    except TypeError as e:
        raise ConfigError(f"{cfg.source}: bad profiler_options for profiler {cfg.profiler!r}: {e}")


def create_policy(cfg):
    from pagetier import policies

    try:
        return policies.create(cfg.policy, cfg.policy_options)
    except ConfigError as e:
        raise ConfigError(f"{cfg.source}: {e}")


def _unique_in_order(idx: np.ndarray, n: int) -> np.ndarray:
    """Valid (0 <= i < n) indices of ``idx``, duplicates dropped, first occurrence order kept."""
    idx = np.asarray(idx, np.int64).ravel()
    idx = idx[(idx >= 0) & (idx < n)]
    _, first = np.unique(idx, return_index=True)
    return idx[np.sort(first)]


def _fit(idx: np.ndarray, npages: np.ndarray, limit: int) -> np.ndarray:
    """The longest prefix of ``idx`` whose pages add up to at most ``limit``."""
    if limit <= 0 or not len(idx):
        return idx[:0]
    c = np.cumsum(npages[idx].astype(np.int64))
    return idx[: int(np.searchsorted(c, limit, side="right"))]


class Daemon:
    """Manages the placement of the pages of ``pids`` (and of ``cgroup``'s processes, and of
    ``child``, a started command) until they all exit, ``duration`` passes, or it is stopped."""

    def __init__(self, cfg, *, pids=(), cgroup: str | None = None,
                 child: subprocess.Popen | None = None, profiler=None, policy=None, mover=None,
                 numab: NumaBalancing | bool | None = None, duration: float | None = None,
                 out=None, config_path=None, overrides: dict | None = None,
                 status_path: str | os.PathLike | None = None, handle_signals: bool = True,
                 node_root: Path = config_mod.NODE_ROOT, state: PageState | None = None,
                 control_path: str | os.PathLike | bool | None = None):
        self.cfg = cfg
        self.config_path, self.overrides = config_path, overrides
        self.profiler = profiler if profiler is not None else create_profiler(cfg)
        self.policy = policy if policy is not None else create_policy(cfg)
        self.mover = mover if mover is not None else mover_mod
        if numab is None or numab is True:
            numab = NumaBalancing(dry_run=cfg.dry_run)
        self.numab = numab or None
        self.state = state if state is not None else PageState()
        self.child = child
        self.cgroup = Path(cgroup) if cgroup else None
        self.duration = duration
        self.out = out if out is not None else sys.stdout
        self.status_path = Path(status_path) if status_path else run_dir() / f"daemon-{os.getpid()}.json"
        self.handle_signals = handle_signals
        self.node_root = node_root
        self.targets: set[int] = set()
        self._initial = [int(p) for p in pids] + ([child.pid] if child is not None else [])
        self._attach_failed: set[int] = set()
        self.stop_reason: str | None = None
        self._reload = False
        self._signal: int | None = None
        self.history: list[dict] = []  # kept short: the last few stats
        self.totals = {k: 0 for k in ("promoted", "demoted", "failed", "busy", "gone", "bytes_moved",
                                      "ping_pongs", "forced_demotions", "clipped")}
        self.started = time.time()
        self._t0 = time.monotonic()
        self.last: dict | None = None
        # control socket: None -> cfg.control_socket or the default; False -> none
        self.control_path = control_path
        self.control = None
        self._boundary = False  # the policy asked for a decision now
        self._interval_moved = 0  # pages moved since the last regular step (rate sharing)
        self._full: set[int] = set()  # nodes found full (ENOMEM, or no room above the watermark)
        self.zoneinfo = Path("/proc/zoneinfo")  # the fast node's watermarks
        self._last_read: dict[int, float] = {}  # pid -> time of its last profiler read

    # ------------------------------------------------------------------ targets
    def _alive(self, pid: int) -> bool:
        if self.child is not None and pid == self.child.pid:
            return self.child.poll() is None
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def attach(self, pid: int, strict: bool = True) -> bool:
        if pid in self.targets:
            return True
        try:
            self.profiler.attach(pid)
        except (PagetierError, OSError) as e:
            if strict:
                raise
            if pid not in self._attach_failed:
                log.warning("cannot attach to pid %d: %s", pid, e)
                self._attach_failed.add(pid)
            return False
        self.targets.add(pid)
        log.info("attached to pid %d (%s)", pid, self._name(pid))
        return True

    def drop(self, pid: int, why: str = "exited") -> None:
        if pid not in self.targets:
            return
        self.targets.discard(pid)
        try:
            self.profiler.detach(pid)
        except Exception as e:  # the process is gone; the profiler may say so
            log.debug("detach %d: %s", pid, e)
        self.state.forget_target(pid)
        self._last_read.pop(pid, None)
        log.info("pid %d %s: detached", pid, why)

    @staticmethod
    def _name(pid: int) -> str:
        try:
            return psutil.Process(pid).name()
        except psutil.Error:
            return "?"

    def cgroup_pids(self) -> set[int] | None:
        """Processes in the cgroup, or None when the cgroup is gone."""
        try:
            text = (self.cgroup / "cgroup.procs").read_text()
        except FileNotFoundError:
            return None
        return {int(x) for x in text.split()}

    def refresh_targets(self) -> None:
        for pid in list(self.targets):
            if not self._alive(pid):
                self.drop(pid)
        if self.cgroup is not None:
            procs = self.cgroup_pids()
            if procs is None:
                self.stop_reason = f"cgroup {self.cgroup} is gone"
                return
            for pid in procs - self.targets:
                if self._alive(pid):
                    self.attach(pid, strict=False)
            for pid in self.targets - procs:
                self.drop(pid, "left the cgroup")
            self._attach_failed &= procs

    # ------------------------------------------------------------------ budget and rate
    def budget_pages(self) -> int:
        cfg = self.cfg
        if cfg.fast_budget is not None:
            return cfg.fast_budget // PAGE_SIZE
        try:
            info = config_mod.node_meminfo(cfg.fast_node, self.node_root)
        except (OSError, ValueError):
            return 1 << 62
        if cfg.fast_free_watermark is not None:
            spare = max(0, info.get("MemFree", 0) - cfg.fast_free_watermark) // PAGE_SIZE
            return self.state.movable_on(cfg.fast_node) + spare
        total = info.get("MemTotal")
        return total // PAGE_SIZE if total else 1 << 62

    def fast_room_pages(self) -> int | None:
        """Pages the fast node can take before its free memory reaches its high watermark (plus
        ROOM_MARGIN); None when unknown. Below the watermark, move_pages reclaims and retries for
        every page before it answers ENOMEM: minutes under memory pressure, so the daemon does
        not promote into a node that has no room."""
        fast = self.cfg.fast_node
        try:
            free = config_mod.node_meminfo(fast, self.node_root)["MemFree"]
            high = config_mod.zone_watermark(fast, "high", self.zoneinfo.read_text(), PAGE_SIZE)
        except (OSError, KeyError, ValueError):
            return None
        return (free - high - ROOM_MARGIN) // PAGE_SIZE

    def rate_pages(self) -> int:
        return mover_mod.rate_pages(self.cfg.rate, self.cfg.interval)

    # ------------------------------------------------------------------ planning
    def plan_demotions(self, demote, promote, budget: int, limit: int):
        """(policy demotions, forced demotions) that fit in ``limit`` pages, as unit indices.

        Forced: when the fast node still holds more than ``budget`` pages of the targets, the
        coldest fast units (lowest heat, then least recently accessed) not being promoted.
        """
        st, fast, slow = self.state, self.cfg.fast_node, self.cfg.slow_node
        n = len(st)
        promote = _unique_in_order(promote, n)
        demote = _unique_in_order(demote, n)
        demote = demote[(st.node[demote] != slow) & (st.node[demote] >= 0) & ~st.stuck(demote)]
        demote = demote[~np.isin(demote, promote)]
        demote = _fit(demote, st.npages, limit)
        used = st.movable_on(fast) - int(st.npages[demote].sum(dtype=np.int64))
        forced = demote[:0]
        if used > budget:
            cand = np.flatnonzero(st.node == fast)
            cand = cand[~np.isin(cand, demote) & ~np.isin(cand, promote) & ~st.stuck(cand)]
            order = np.lexsort((st.last_access[cand], st.heat[cand]))
            cand = cand[order]
            c = np.cumsum(st.npages[cand].astype(np.int64))
            k = int(np.searchsorted(c, used - budget, side="left")) + 1
            left = limit - int(st.npages[demote].sum(dtype=np.int64))
            forced = _fit(cand[:k], st.npages, left)
        return demote, forced

    def _promotion_limit(self, asked, promote, budget: int, limit: int, fast_used: int):
        """Which of the daemon's limits cut the policy's promotions ``asked`` down to
        ``promote``: "rate" or "budget", None when none did."""
        st = self.state
        asked = _unique_in_order(asked, len(st))
        asked = asked[(st.node[asked] != self.cfg.fast_node) & ~st.stuck(asked)]
        if len(promote) >= len(asked):
            return None
        return "rate" if limit < budget - fast_used else "budget"

    def plan_promotions(self, promote, budget: int, limit: int, fast_used: int) -> np.ndarray:
        """The policy's promotions, in its order, that fit in the budget and in ``limit``."""
        st = self.state
        promote = _unique_in_order(promote, len(st))
        promote = promote[(st.node[promote] != self.cfg.fast_node) & ~st.stuck(promote)]
        return _fit(promote, st.npages, min(limit, budget - fast_used))

    # ------------------------------------------------------------------ moving
    def _move(self, idx: np.ndarray, node: int, acc: dict, forget: list, gone_pids: set) -> bool:
        """Move units ``idx`` to ``node``; update the state and ``acc``. False after ENOMEM."""
        st = self.state
        if not len(idx):
            return True
        pids = st.pid_of(idx)
        ok = True
        for pid in np.unique(pids).tolist():
            sel = idx[pids == pid]
            if pid in gone_pids:
                continue
            prepare = getattr(self.profiler, "prepare_move", None)
            if prepare is not None:  # e.g. kmod fault mode: marked pages made movable
                prepare(int(pid), st.addresses(sel))
            try:
                res = self.mover.move(int(pid), st.addresses(sel), node)
            except mover_mod.MoveError as e:
                gone = self._target_gone(pid, e)
                if gone is False:
                    raise
                if gone:
                    gone_pids.add(pid)
                continue
            moved = sel[res.moved]
            window = self.cfg.ping_pong_window
            last = st.last_move[moved]
            acc["ping_pongs"] += int(((last != NEVER) & (st.interval - last <= window)).sum())
            pages = int(st.npages[moved].sum(dtype=np.int64))
            acc["moved_pages"] += pages
            acc["bytes_moved"] += pages * PAGE_SIZE
            st.record_moves(moved, node)
            if hasattr(self.profiler, "moved"):  # the stub profiler follows moves in tests
                self.profiler.moved(int(pid), st.addresses(moved), node)
            acc["busy"] += int(st.npages[sel[res.busy]].sum(dtype=np.int64))
            acc["failed"] += int(st.npages[sel[res.failed]].sum(dtype=np.int64))
            acc["nomem"] += int(st.npages[sel[res.nomem]].sum(dtype=np.int64))
            st.mark_stuck(sel[res.failed])
            acc["gone"] += len(res.gone)
            forget.append(sel[res.gone])
            for k, v in res.errors.items():
                acc["errors"][k] = acc["errors"].get(k, 0) + v
            if res.stopped:
                self._node_full(node, True)
                ok = False
                break
        if ok and acc["moved_pages"]:
            self._node_full(node, False)
        return ok

    def _node_full(self, node: int, full: bool, why: str = "move_pages: ENOMEM") -> None:
        """Log when ``node`` fills up (move_pages: ENOMEM, or no room above its high watermark)
        and when it has room again."""
        if full and node not in self._full:
            self._full.add(node)
            log.warning("node %d is full (%s): moves to it wait until it has free memory", node,
                        why)
        elif not full and node in self._full:
            self._full.discard(node)
            log.info("node %d has free memory again: moves to it resumed", node)

    def _target_gone(self, pid: int, e: "mover_mod.MoveError") -> bool | None:
        """A whole-call move_pages error: True when the target exited (ESRCH, or EINVAL once
        its mm is gone), None to skip it this interval (EINVAL while it still looks alive: it
        is exiting), False for a real error."""
        if e.errno == errno.ESRCH:
            return True
        if e.errno == errno.EINVAL:
            if not self._alive(pid):
                return True
            log.debug("%s: skipped this interval", e)
            return None
        return False

    def trust_moves(self) -> int:
        """Intervals for which the profiler's node of a moved unit may predate the move."""
        lag = float(getattr(self.profiler, "node_lag_s", 0.0))
        return int(np.ceil(lag / max(self.cfg.interval, 1e-3))) + 1 if lag > 0 else 0

    def _fill_nodes(self) -> None:
        """Ask the kernel for the node of units the profiler did not place."""
        query = getattr(self.mover, "query_nodes", None)
        st = self.state
        if query is None or not st.pages_on(-1):
            return
        unknown = np.flatnonzero(st.node < 0)
        pids = st.pid_of(unknown)
        for pid in np.unique(pids).tolist():
            sel = unknown[pids == pid]
            try:
                nodes = query(int(pid), st.addresses(sel))
            except mover_mod.MoveError as e:
                if self._target_gone(pid, e) is False:
                    raise
                continue  # refresh_targets drops it once it has exited
            st.set_nodes(sel, np.where(nodes >= 0, nodes, -1).astype(np.int8))

    # ------------------------------------------------------------------ one interval
    def _max_count(self, elapsed: float) -> int | None:
        """The scans a read ``elapsed`` seconds after the last one can cover, for a profiler
        that counts one access per unit per scan (kmod: ``node_lag_s`` is its scan period);
        None when unknown. Without a frequency estimate counts are clipped to it."""
        period = float(getattr(self.profiler, "node_lag_s", 0.0))
        if period <= 0:
            return None
        return max(1, int(round(elapsed / period)))

    def read_target(self, pid: int) -> float:
        """Read ``pid``'s counts into the state and show them to the policy; the merge time."""
        full = pid not in self._last_read or self.state.interval % FULL_READ_EVERY == 0
        try:
            sample = self.profiler.read(pid, reset=True, accessed_only=not full)
        except (PagetierError, OSError) as e:
            if not self._alive(pid):
                self.drop(pid)
                return 0.0
            # e.g. detached behind our back, or exiting (not yet a zombie: the profiler says
            # ESRCH): start over with this target; an exiting one cannot be attached again
            log.warning("pid %d: profiler read failed (%s): attaching again", pid, e)
            self.drop(pid, "could not be read")
            self.attach(pid, strict=False)
            return 0.0
        t_read = time.monotonic()
        elapsed = t_read - self._last_read.get(pid, t_read - self.cfg.interval)
        self._last_read[pid] = t_read
        t_merge = time.process_time()
        self.state.update(sample, trust_moves=self.trust_moves(), interval_s=self.cfg.interval,
                          elapsed_s=max(elapsed, 1e-3), max_count=self._max_count(elapsed))
        merge_s = time.process_time() - t_merge
        self.policy.observe(pid, sample)
        return merge_s

    def step(self, boundary: bool = False) -> dict:
        """One interval; ``boundary``: a decision the policy asked for between intervals (no
        profiler read, the same interval number, what is left of the interval's rate limit)."""
        from pagetier.policies import Context

        cpu0, wall0 = time.process_time(), time.monotonic()
        cfg, st = self.cfg, self.state
        merge_s = 0.0
        if not boundary:
            st.begin_interval()
            if st.interval % STUCK_RETRY == 0:
                st.unstick()
            self._interval_moved = 0
            for pid in sorted(self.targets):
                merge_s += self.read_target(pid)
        self._fill_nodes()
        scan_s = self._profiler_scan_s()

        budget, limit = self.budget_pages(), max(0, self.rate_pages() - self._interval_moved)
        # the budget is for pages the daemon can move; a policy counts every unit on the fast
        # node, so it sees the budget plus the fast pages the kernel refused to move
        unmovable = st.unmovable_on(cfg.fast_node)
        # what the fast node can hold for the targets: their units on it plus its room above
        # the high watermark (never less than they hold: the daemon does not demote to make
        # room for other tenants). Below the budget, the node is the limit: the policy exchanges
        room0 = self.fast_room_pages()
        capacity = None if room0 is None else st.pages_on(cfg.fast_node) + max(0, room0)
        ctx = Context(fast_node=cfg.fast_node, slow_node=cfg.slow_node,
                      fast_budget=budget + unmovable if budget < 1 << 61 else budget,
                      fast_capacity=capacity,
                      max_moves=limit, interval=st.interval, now=time.monotonic() - self._t0,
                      interval_s=cfg.interval)
        t_dec = time.process_time()
        dec = self.policy.decide(st, ctx)
        decide_s = time.process_time() - t_dec

        acc = {"moved_pages": 0, "bytes_moved": 0, "ping_pongs": 0, "busy": 0, "failed": 0,
               "nomem": 0, "gone": 0, "errors": {}}
        forget: list[np.ndarray] = []
        gone_pids: set[int] = set()
        limit_hit = None  # which limit the daemon's own clipping hit
        demote, forced = self.plan_demotions(dec.demote, dec.promote, budget, limit)
        all_demote = np.concatenate([demote, forced])
        demoted_pages = int(st.npages[all_demote].sum(dtype=np.int64))
        asked = len(_unique_in_order(dec.promote, len(st))) + len(_unique_in_order(dec.demote, len(st)))
        if cfg.dry_run:
            fast_used = st.movable_on(cfg.fast_node) - demoted_pages
            promote = self.plan_promotions(dec.promote, budget, limit - demoted_pages, fast_used)
            limit_hit = self._promotion_limit(dec.promote, promote, budget, limit - demoted_pages,
                                              fast_used)
            promoted_pages = int(st.npages[promote].sum(dtype=np.int64))
        else:
            ok = self._move(all_demote, cfg.slow_node, acc, forget, gone_pids)
            demoted_pages = acc["moved_pages"]
            acc["moved_pages"] = 0
            promote = np.zeros(0, np.int64)
            if ok:  # not after ENOMEM
                fast_used = st.movable_on(cfg.fast_node)
                promote = self.plan_promotions(dec.promote, budget, limit - demoted_pages, fast_used)
                limit_hit = self._promotion_limit(dec.promote, promote, budget,
                                                  limit - demoted_pages, fast_used)
                n_planned = len(promote)
                # the room again, after the demotions (exchange: they made room for these)
                room = self.fast_room_pages() if len(promote) else None
                if room is not None:
                    if room <= 0:
                        self._node_full(cfg.fast_node, True, "free memory at its high watermark")
                    promote = _fit(promote, st.npages, room)
                    if len(promote) < n_planned:
                        limit_hit = "node"
                self._move(promote, cfg.fast_node, acc, forget, gone_pids)
            promoted_pages = acc["moved_pages"]
        clipped = asked - len(demote) - len(promote)
        if forget:
            st.forget(np.concatenate(forget))
        for pid in gone_pids:
            self.drop(pid)
        if not cfg.dry_run:
            self._interval_moved += demoted_pages + promoted_pages

        resident = {(str(n) if n >= 0 else "unknown"): p * PAGE_SIZE
                    for n, p in st.resident().items()}
        fast_used_b = st.movable_on(cfg.fast_node) * PAGE_SIZE
        stats = {
            "interval": st.interval,
            "boundary": boundary,
            "t": round(time.monotonic() - self._t0, 3),
            "targets": len(self.targets),
            "units": len(st),
            "promoted": promoted_pages,  # 4 KiB pages (planned ones in a dry run)
            "demoted": demoted_pages,
            "forced_demotions": int(len(forced)),
            "failed": acc["failed"],
            "busy": acc["busy"],
            "nomem": acc["nomem"],
            "gone": acc["gone"],
            "clipped": int(max(0, clipped)),
            "bytes_moved": acc["bytes_moved"],
            "ping_pongs": acc["ping_pongs"],
            "resident": resident,
            "fast_used": fast_used_b,  # what counts against the budget
            "fast_unmovable": st.unmovable_on(cfg.fast_node) * PAGE_SIZE,  # outside the budget
            "budget": int(min(budget, 1 << 50)) * PAGE_SIZE,
            # the fast memory the node can hold for the targets (None: unknown)
            "fast_capacity": None if capacity is None else int(capacity) * PAGE_SIZE,
            # the limit that kept wanted units off the fast node: "budget", "node" (the fast
            # node's free memory), "rate", or None
            "limit": limit_hit or dec.stats.get("limit"),
            "rate_pages": int(min(limit, 1 << 50)),
            "dry_run": cfg.dry_run,
            "errors": acc["errors"],
            "policy": dict(dec.stats),
            "merge_s": round(merge_s, 6),  # PageState bookkeeping of the samples
            "decide_s": round(decide_s, 6),
            "cpu_s": round(time.process_time() - cpu0, 6),
            "profiler_scan_s": scan_s,  # kernel-side scan time so far (kmod), summed over targets
            "wall_s": round(time.monotonic() - wall0, 6),
        }
        for k in ("promoted", "demoted", "failed", "busy", "gone", "bytes_moved", "ping_pongs",
                  "forced_demotions", "clipped"):
            self.totals[k] += stats[k]
        self.last = stats
        self.history = (self.history + [stats])[-16:]
        return stats

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

    # ------------------------------------------------------------------ output
    def emit(self, stats: dict) -> None:
        if self.cfg.json:
            line = json.dumps(stats, default=_jsonable, separators=(",", ":"))
        else:
            line = human_line(stats, self.cfg.fast_node, self.cfg.slow_node)
        self.out.write(line + "\n")
        self.out.flush()

    def status_doc(self) -> dict:
        return {
            "pid": os.getpid(),
            "started": self.started,
            "updated": time.time(),
            "config": config_mod.as_dict(self.cfg),
            "config_source": self.cfg.source,
            "targets": [{"pid": p, "name": self._name(p)} for p in sorted(self.targets)],
            "cgroup": str(self.cgroup) if self.cgroup else None,
            "totals": self.totals,
            "last": self.last,
            "control_socket": str(self.control.path) if self.control else None,
            "memory": self.memory(),
        }

    def memory(self) -> dict:
        """What the daemon's own memory holds: the unit state, and with PYTHONTRACEMALLOC set,
        everything Python and numpy allocated (traced_kib)."""
        m = {"state_kib": self.state.nbytes // 1024}
        if tracemalloc.is_tracing():
            m["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
        return m

    def log_top_allocations(self, n: int = 12) -> None:
        """With PYTHONTRACEMALLOC set, say at exit where the daemon's live memory was allocated."""
        if not tracemalloc.is_tracing():
            return
        top = tracemalloc.take_snapshot().statistics("lineno")[:n]
        log.info("largest live allocations (tracemalloc):\n%s",
                 "\n".join(f"  {st.size / 1024:9.1f} KiB in {st.count:7d} blocks  {st.traceback}"
                           for st in top))

    def write_status(self) -> None:
        doc = self.status_doc()
        try:
            self.status_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.status_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, default=_jsonable))
            os.replace(tmp, self.status_path)
        except OSError as e:
            if not getattr(self, "_status_warned", False):
                log.warning("cannot write status file %s: %s", self.status_path, e)
                self._status_warned = True

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
            new = config_mod.load(self.config_path, self.overrides)
            policy = self.policy
            if (new.policy, new.policy_options) != (self.cfg.policy, self.cfg.policy_options):
                policy = create_policy(new)
                policy.take_over(self.policy)
        except PagetierError as e:
            log.error("SIGHUP: config not reloaded, keeping the old one: %s", e)
            return
        for key in ("profiler", "profiler_options", "fast_node", "slow_node", "log_file"):
            if getattr(new, key) != getattr(self.cfg, key):
                log.warning("SIGHUP: %s changed; it takes a restart, keeping %r", key,
                            getattr(self.cfg, key))
                setattr(new, key, getattr(self.cfg, key))
        self.cfg, self.policy = new, policy
        log.info("SIGHUP: configuration reloaded from %s", new.source)

    def _install_signals(self) -> dict:
        old = {}
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return old
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            old[sig] = signal.signal(sig, self._on_signal)
        return old

    def _wait(self, until: float) -> None:
        """Serve the control socket until ``until`` (at least once, even when late)."""
        while self.stop_reason is None and self._signal is None:
            left = until - time.monotonic()
            self._serve(min(0.05, max(0.0, left)))
            if left <= 0:
                return
            if self.child is not None and self.child.poll() is not None:
                return

    # ------------------------------------------------------------------ control socket
    def open_control(self) -> None:
        """Listen on the control socket (a warning, not an error, when that is impossible)."""
        from pagetier.daemon import control

        if self.control is not None or self.control_path is False:
            return
        explicit = self.control_path or self.cfg.control_socket
        path = Path(explicit) if explicit else control.default_path()
        try:
            self.control = control.ControlServer(path, self._control_request)
        except ConfigError as e:
            if explicit or "another pagetier daemon" not in str(e):
                log.warning("%s: no annotations, attach or status requests", e)
                return
            alt = path.with_name(f"control-{os.getpid()}.sock")  # a second daemon
            try:
                self.control = control.ControlServer(alt, self._control_request)
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
            time.sleep(timeout)
            return
        self.control.poll(timeout)
        if self._boundary and self.targets:
            self._boundary = False
            stats = self.step(boundary=True)
            self.emit(stats)

    def _control_request(self, peer, req: dict) -> dict | None:
        """Answer one control request (daemon/control.py authenticated ``peer``)."""
        from pagetier.daemon import control

        op = req["op"]
        if op in control.ANNOTATION_OPS:
            pid = req.get("pid", peer.pid)
            if pid != peer.pid:
                raise control.RequestError(f"{op}: annotations apply to the calling process only "
                                           f"(pid {peer.pid}), not to pid {pid}")
            if pid not in self.targets:
                raise control.RequestError(f"pid {pid} is not managed by this pagetier daemon "
                                           f"(start it with `pagetier run` or attach it first)")
            if op == "hello":
                return {"pid": pid, "policy": self.policy.name,
                        "annotations": bool(self.policy.accepts_annotations)}
            ev = control.annotation(pid, req)
            if op in ("add_layer", "end_profile") and self.policy.wants_samples(pid):
                self.read_target(pid)  # the counts of the layer that just ended
            if self.policy.annotate(ev):
                self._boundary = True
            return None
        if op == "status":
            doc = self.status_doc()
            if peer.uid != 0:
                doc["targets"] = [t for t in doc["targets"] if control.owner(t["pid"]) == peer.uid]
                doc.pop("config", None)
                doc.pop("last", None)
                doc.pop("totals", None)
            return {"status": json.loads(json.dumps(doc, default=_jsonable))}
        pid = control._pid_arg(req)
        control.may_manage(peer, pid)
        if op == "attach":
            try:
                self.attach(pid)
            except (PagetierError, OSError) as e:
                raise control.RequestError(f"attach {pid}: {e}") from None
            return {"pid": pid}
        if pid not in self.targets:
            raise control.RequestError(f"detach: pid {pid} is not managed by this daemon")
        self.drop(pid, f"detached at the request of pid {peer.pid}")
        return {"pid": pid}

    # ------------------------------------------------------------------ main loop
    def run(self) -> int:
        """Manage until done; the exit status: the child's (128+signal if killed), else 0."""
        old = self._install_signals()
        try:
            self.open_control()
            if self.numab is not None:
                self.numab.disable()
            for pid in self._initial:
                try:
                    self.attach(pid)
                except (PagetierError, OSError):
                    if self._alive(pid):
                        raise
                    log.info("pid %d exited before it could be attached", pid)
            deadline = None if self.duration is None else self._t0 + self.duration
            # the first decision rests on one interval of counts: a read right after attach
            # has none (abit mode counts from its second scan), and a policy deciding on zero
            # heat would move pages blindly
            self.write_status()
            first = time.monotonic() + self.cfg.interval
            self._wait(first if deadline is None else min(first, deadline))
            while self.stop_reason is None and self._signal is None:
                if self._reload:
                    self.reload()
                self.refresh_targets()
                if self.stop_reason:
                    break
                if not self.targets and self.cgroup is None:
                    self.stop_reason = "all targets exited"
                    break
                t = time.monotonic()
                stats = self.step()
                self.emit(stats)
                self.write_status()
                if deadline is not None and time.monotonic() >= deadline:
                    self.stop_reason = f"--duration {self.duration:g} s reached"
                    break
                until = t + self.cfg.interval
                if deadline is not None:
                    until = min(until, deadline)
                self._wait(until)
            log.info("stopping: %s", self.stop_reason)
            self.log_top_allocations()
        finally:
            try:
                self.profiler.close()
            finally:
                try:
                    if self.numab is not None:
                        self.numab.restore()
                finally:
                    self.status_path.unlink(missing_ok=True)
                    self.close_control()
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


def human_line(s: dict, fast: int, slow: int) -> str:
    """One interval in under 80 columns."""
    res = s.get("resident", {})
    f = res.get(str(fast), 0) / MIB
    w = res.get(str(slow), 0) / MIB
    dry = " dry" if s.get("dry_run") else ""
    budget = s["budget"] / MIB
    budget_s = f"{budget:.0f}" if budget < 1 << 30 else "-"
    mark = "b" if s.get("boundary") else " "  # a decision at a layer boundary
    line = (f"#{s['interval']:<3d}{mark}+{s['promoted'] * 4 // 1024:>4d}M -{s['demoted'] * 4 // 1024:>4d}M"
            f"{dry} fast {s['fast_used'] / MIB:.0f}/{budget_s}M n{fast} {f:.0f}M n{slow} {w:.0f}M")
    extra = []
    layer = s.get("policy", {}).get("layer")
    if layer is not None:
        extra.append(f"layer {layer}")
    if s.get("busy"):
        extra.append(f"busy {s['busy']}")
    if s.get("failed"):
        extra.append(f"fail {s['failed']}")
    if s.get("ping_pongs"):
        extra.append(f"pp {s['ping_pongs']}")
    extra.append(f"{s['cpu_s'] * 1000:.1f}ms")
    return line + " " + " ".join(extra)
