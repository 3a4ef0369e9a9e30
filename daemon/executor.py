"""The executor: carries out a plan's moves through the move_pages wrapper (pagetier.core.mover)
and records them in the PageState; asks the kernel for the nodes the profiler did not give.

Per-page outcomes (the table in pagetier/core/mover.py; a region unit is moved page by page,
its outcome made of its pages', and its busy and failed pages are counted as such): moved
units are recorded (a move back within ``ping_pong_window`` intervals counts as a ping-pong),
units whose pages are gone are collected to be forgotten, units that failed for good are
marked stuck, and ENOMEM marks the node full and ends this interval's moves to it. A
whole-call error of a target that exited is not fatal: the target is dropped.

The executor also measures the migration throughput it really gets: pages moved per second of
``move`` wall time, smoothed over the moves, a small move that was slow weighing less
(:attr:`Executor.throughput`). The daemon caps an
interval's moves at what that throughput moves in about one interval, so that a plan never
takes several intervals to carry out (under a slow tier, a busy machine or emulation, 64 MiB
in one call took 5-10 s: the daemon was a phase behind, and its exchanges landed on a hot set
that had already moved).

That cap needs a measurement, and the throughput can drop. So moves also go in chunks of
about CHUNK_PAGES pages, and a move given a ``deadline`` stops starting chunks once it has
passed: the units left are counted as ``deferred`` (the next interval plans again, on fresher
counts). The first chunk of a call always goes, so every interval makes progress. (The first
interval after attach in bench live's phases scenario moved 96 MiB in one call that took
6.1 s: the hot set had moved on before it ended.)
"""
from __future__ import annotations

import errno
import logging

import numpy as np

from pagetier.core import mover as mover_mod
from pagetier.core.arrays import unique
from pagetier.core.state import NEVER, PageState
from pagetier.core.units import PAGE_SIZE
from pagetier.daemon.clock import Clock

log = logging.getLogger("pagetier.daemon")

# a move of fewer pages times the call's fixed costs more than the copying: not measured
THROUGHPUT_MIN_PAGES = 512
THROUGHPUT_SMOOTHING = 0.5  # weight of the newest measurement
# ...but a move slower than the estimate weighs in proportion to its pages up to this many: a
# small move's time is more the call's costs and the contention of a few hot pages than the
# copying (bench live phases-nothp: an exchange of 8 MiB of pages being written ran at 20 MB/s
# between two of 190 MB/s, and at full weight the estimate it left cut the next phase's
# exchange to 70%). A faster one weighs in full, so that a cap never keeps the moves too small
# to raise it; a large slow move lowers it in full, and the moves' deadline stops a move that
# runs long whatever the estimate.
THROUGHPUT_FULL_PAGES = 16384  # 64 MiB
# pages per move_pages call, about (8 MiB: 4 huge pages); between calls a move checks its deadline
CHUNK_PAGES = 2048


def new_tally() -> dict:
    """What one interval's moves add up to."""
    return {"moved_pages": 0, "bytes_moved": 0, "ping_pongs": 0, "busy": 0, "failed": 0,
            "nomem": 0, "gone": 0, "deferred": 0, "errors": {}}


class Executor:
    """Moves units of ``state`` with ``mover`` (the pagetier.core.mover module, or a stand-in
    with its ``move`` and optionally ``query_nodes``); ``alive(pid)`` says whether a target
    still runs."""

    def __init__(self, state: PageState, profiler, mover, alive, clock: Clock | None = None):
        self.state, self.profiler, self.mover, self.alive = state, profiler, mover, alive
        self.clock = clock if clock is not None else Clock()
        self.full: set[int] = set()  # nodes found full (ENOMEM, or no room above the watermark)
        self.throughput: float | None = None  # pages/s moves achieved (smoothed); None: unknown
        # per target over the run: pid -> {"to": {node: pages moved there}, "ping_pongs": n}
        self.per_pid: dict[int, dict] = {}

    def measure(self, pages: int, seconds: float) -> None:
        """Fold one move's ``pages`` in ``seconds`` into :attr:`throughput`."""
        if pages < THROUGHPUT_MIN_PAGES or seconds <= 0:
            return
        r = pages / seconds
        a = THROUGHPUT_SMOOTHING
        if self.throughput is not None and r < self.throughput:
            a *= min(1.0, pages / THROUGHPUT_FULL_PAGES)
        self.throughput = r if self.throughput is None else (1 - a) * self.throughput + a * r

    def move(self, idx: np.ndarray, node: int, acc: dict, forget: list, gone_pids: set,
             ping_pong_window: int, deadline: float | None = None) -> bool:
        """Move units ``idx`` to ``node``; update the state and ``acc``. False after ENOMEM.

        ``deadline`` (a ``clock.monotonic()`` time): no chunk but the first starts after it;
        the pages of the units not tried are added to ``acc["deferred"]``."""
        st = self.state
        if not len(idx):
            return True
        pids = st.pid_of(idx)
        chunks = [(pid, *chunk) for pid in unique(pids).tolist()
                  for chunk in self._chunks(idx[pids == pid])]
        ok = True
        t0, before = self.clock.monotonic(), acc["moved_pages"]
        # the chunks' outcomes, recorded in the state and counted once at the end (that
        # bookkeeping costs per call, and a chunk of region units is only 4 of them)
        done: dict[int, list] = {}
        try:
            for k, (pid, *chunk) in enumerate(chunks):
                if pid in gone_pids:
                    continue
                if k and deadline is not None and self.clock.monotonic() >= deadline:
                    acc["deferred"] += sum(int(st.npages[c[1]].sum(dtype=np.int64))
                                           for c in chunks[k:] if c[0] not in gone_pids)
                    break
                res = self._move_chunk(int(pid), *chunk, node, acc, done.setdefault(int(pid), []))
                if res == "gone":
                    gone_pids.add(pid)
                elif res == "skip":  # skipped this interval: the pid's other chunks too
                    chunks[k + 1:] = [c for c in chunks[k + 1:] if c[0] != pid]
                elif res == "full":
                    self.node_full(node, True)
                    ok = False
                    break
        finally:
            self._record(done, node, acc, forget, ping_pong_window)
        if ok and acc["moved_pages"]:
            self.node_full(node, False)
        self.measure(acc["moved_pages"] - before, self.clock.monotonic() - t0)
        return ok

    def _chunks(self, sel: np.ndarray) -> list[tuple]:
        """``sel`` cut into runs of about CHUNK_PAGES pages, each as (its units, which are
        regions, their addresses, whether any is a region): a run ends with the unit that
        reaches the next multiple of CHUNK_PAGES. The columns are read once for every run (a
        run of region units is only 4 of them)."""
        st = self.state
        cum = np.cumsum(st.npages[sel].astype(np.int64))
        cuts = np.flatnonzero(np.diff(cum // CHUNK_PAGES, prepend=0) > 0)
        # a unit whose pages cross a multiple of CHUNK_PAGES closes its chunk
        bounds = [0] + [b for b in (cuts + 1).tolist() if b < len(sel)] + [len(sel)]
        region, addrs = st.is_region(sel), st.addresses(sel)
        # whether a run holds a region: the regions counted up to each bound
        nreg = np.concatenate([[0], np.cumsum(region, dtype=np.int64)])[bounds].tolist()
        return [(sel[a:b], region[a:b], addrs[a:b], nreg[i + 1] > nreg[i])
                for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])) if b > a]

    # the outcomes of a move, as codes per unit (see _record)
    _OUTCOMES = ("moved", "busy", "failed", "nomem", "gone")

    def _record(self, done: dict[int, list], node: int, acc: dict, forget: list,
                ping_pong_window: int) -> None:
        """Count and record the outcomes of each pid's chunks (``done``: pid -> [(units, their
        outcome codes, region pages per outcome)]): the moved units recorded on ``node`` (a
        move back within ``ping_pong_window`` intervals is a ping-pong), those failed for good
        marked stuck, those gone added to ``forget``; busy, failed and nomem counted in pages
        (a region's own pages of each outcome)."""
        st = self.state
        parts = [c for chunks in done.values() for c in chunks]
        if not parts:
            return
        sel = np.concatenate([c[0] for c in parts])
        code = np.concatenate([c[1] for c in parts])
        rp = {k: sum(c[2].get(k, 0) for c in parts) for k in self._OUTCOMES}
        region = st.is_region(sel)
        w = np.where(region, 0, st.npages[sel]).astype(np.int64)  # a region: rp's pages
        pages = np.bincount(code, weights=w, minlength=len(self._OUTCOMES)).astype(np.int64)
        moved = sel[code == 0]
        last = st.last_move[moved]
        back = (last != NEVER) & (st.interval - last <= ping_pong_window)  # ping-pongs
        acc["ping_pongs"] += int(back.sum())
        moved_pages = int(pages[0]) + rp["moved"]
        acc["moved_pages"] += moved_pages
        acc["bytes_moved"] += moved_pages * PAGE_SIZE
        acc["busy"] += int(pages[1]) + rp["busy"]
        acc["failed"] += int(pages[2]) + rp["failed"]
        acc["nomem"] += int(pages[3]) + rp["nomem"]
        gone = sel[code == 4]
        acc["gone"] += len(gone)
        forget.append(gone)
        self._count_per_pid(done, moved, w[code == 0], back, node)
        if len(moved):
            st.record_moves(moved, node)
        failed = sel[code == 2]
        if len(failed):
            st.mark_stuck(failed)
        if hasattr(self.profiler, "moved"):  # the stub profiler follows moves in tests
            for pid, chunks in done.items():
                m = np.concatenate([c[0][c[1] == 0] for c in chunks]) if chunks else moved[:0]
                if len(m):
                    self.profiler.moved(pid, st.addresses(m), node)

    def _count_per_pid(self, done: dict[int, list], moved: np.ndarray, pages: np.ndarray,
                       back: np.ndarray, node: int) -> None:
        """Add the moved units' pages (``pages``, 0 for a region: its own count is in
        ``done``) and ping-pongs (``back``) to their pids' :attr:`per_pid`, moved to ``node``."""
        pids = self.state.pid_of(moved)
        for pid, chunks in done.items():
            mine = pids == pid
            n = int(pages[mine].sum()) + sum(c[2].get("moved", 0) for c in chunks)
            rec = self.per_pid.setdefault(pid, {"to": {}, "ping_pongs": 0})
            rec["to"][node] = rec["to"].get(node, 0) + n
            rec["ping_pongs"] += int(back[mine].sum())

    def _move_chunk(self, pid: int, sel: np.ndarray, region: np.ndarray, addrs: np.ndarray,
                    regions: bool, node: int, acc: dict, done: list) -> str | None:
        """One move_pages call's worth: units ``sel`` at ``addrs``, ``region`` which of them
        are regions (``regions``: any). "gone" (the target exited), "skip" (not this
        interval), "full" (ENOMEM) or None. Its units' outcomes are appended to ``done`` for
        :meth:`_record`."""
        prepare = getattr(self.profiler, "prepare_move", None)
        if prepare is not None:  # e.g. kmod fault mode: marked pages made movable
            prepare(pid, mover_mod.page_addresses(addrs, region)[0] if regions else addrs)
        try:
            if regions:
                res = self.mover.move(pid, addrs, node, region=region)
            else:  # (stand-in movers of tests take no regions)
                res = self.mover.move(pid, addrs, node)
        except mover_mod.MoveError as e:
            gone = self.target_gone(pid, e)
            if gone is False:
                raise
            return "gone" if gone else "skip"
        rp = getattr(res, "region_pages", None) or {}
        if len(res.moved) == len(sel) and not any(len(getattr(res, name))
                                                  for name in self._OUTCOMES[1:]):
            done.append((sel, np.zeros(len(sel), np.int64), rp))  # all moved: the usual call
        else:
            code = np.full(len(sel), -1, np.int64)
            for c, name in enumerate(self._OUTCOMES):
                code[getattr(res, name)] = c
            tried = code >= 0  # every unit has an outcome; keep only those that do
            done.append((sel[tried], code[tried], rp))
        for k, v in res.errors.items():
            acc["errors"][k] = acc["errors"].get(k, 0) + v
        return "full" if res.stopped else None

    def node_full(self, node: int, full: bool, why: str = "move_pages: ENOMEM") -> None:
        """Log when ``node`` fills up (move_pages: ENOMEM, or no room above its high watermark)
        and when it has room again."""
        if full and node not in self.full:
            self.full.add(node)
            log.warning("node %d is full (%s): moves to it wait until it has free memory", node,
                        why)
        elif not full and node in self.full:
            self.full.discard(node)
            log.info("node %d has free memory again: moves to it resumed", node)

    def target_gone(self, pid: int, e: mover_mod.MoveError) -> bool | None:
        """A whole-call move_pages error: True when the target exited (ESRCH, or EINVAL once
        its mm is gone), None to skip it this interval (EINVAL while it still looks alive: it
        is exiting), False for a real error."""
        if e.errno == errno.ESRCH:
            return True
        if e.errno == errno.EINVAL:
            if not self.alive(pid):
                return True
            log.debug("%s: skipped this interval", e)
            return None
        return False

    def fill_nodes(self) -> None:
        """Ask the kernel for the node of units the profiler did not place."""
        query = getattr(self.mover, "query_nodes", None)
        st = self.state
        if query is None or not st.pages_on(-1):
            return
        unknown = np.flatnonzero(st.node < 0)
        pids = st.pid_of(unknown)
        for pid in unique(pids).tolist():
            sel = unknown[pids == pid]
            try:
                nodes = query(int(pid), st.addresses(sel))
            except mover_mod.MoveError as e:
                if self.target_gone(pid, e) is False:
                    raise
                continue  # refresh_targets drops it once it has exited
            st.set_nodes(sel, np.where(nodes >= 0, nodes, -1).astype(np.int8))
