"""The daemon's mover for the interval step (pagetier/core/step.py): a plan carried out with
move_pages (daemon/executor.py), or only counted in a dry run.

Demotions go first. A full node (ENOMEM) ends the interval's moves; so does the interval's
time (no move_pages call starts more than MOVE_TIME_SHARE intervals after the moves began:
the rest is ``deferred``, planned again at the next interval). After the demotions the kernel
may have refused some, so the promotions are planned again on the state they left, with the
fast node's room read again: an exchange's promotions may use the room its demotions made.
Units whose pages are gone are forgotten and targets that exited are dropped.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from pagetier.core import planner, shares
from pagetier.core.step import Limits, Moved
from pagetier.core.units import PAGE_SIZE
from pagetier.daemon.executor import Executor, new_tally
from pagetier.daemon.fastnode import ROOM_MARGIN, FastNode

# an interval's moves start no move_pages call after this many intervals (step periods, when
# steps take longer than the interval) from their start.
# The throughput cap (daemon/loop.py: THROUGHPUT_HEADROOM) plans more than one interval of
# moves so that a phase change's exchange goes in one batch; the deadline catches what it
# misses (no measurement yet, or a throughput that fell), without letting one plan's moves
# run so long that the hot set has moved on before they end
MOVE_TIME_SHARE = 2.0


def _pages(state, idx) -> int:
    return int(state.npages[idx].sum(dtype=np.int64))


class DaemonMover:
    """Carries out the step's plans with ``executor``; ``cfg()`` is the daemon's current
    configuration (``dry_run``: count the planned pages, move nothing), ``fastnode`` its fast
    node's room, ``drop(pid)`` drops a target found gone."""

    def __init__(self, cfg: Callable, executor: Executor, fastnode: FastNode,
                 drop: Callable[[int], None], period: Callable[[], float] | None = None):
        self.cfg, self.executor, self.fastnode, self.drop = cfg, executor, fastnode, drop
        # the seconds a step stands for (the daemon's step_period): the interval, or the time
        # steps really take when they take longer
        self.period = period or (lambda: self.cfg().interval)

    def locate(self, state) -> None:
        self.executor.fill_nodes()

    def move(self, state, moves: planner.Moves, decision, limits: Limits) -> Moved:
        cfg = self.cfg()
        if cfg.dry_run:
            return Moved(demoted=_pages(state, moves.demotions),
                         promoted=_pages(state, moves.promote), promote=moves.promote,
                         limit=moves.limit, tally=dict(new_tally(), move_s=0.0))
        clock = self.executor.clock
        acc, forget, gone = new_tally(), [], set()
        window = cfg.ping_pong_window
        t_moves = clock.monotonic()
        deadline = t_moves + self.period() * MOVE_TIME_SHARE
        ok = self.executor.move(moves.demotions, cfg.slow_node, acc, forget, gone, window,
                                deadline)
        demoted, acc["moved_pages"] = acc["moved_pages"], 0
        self.fastnode.demoted(demoted)
        promote, limit, waiting = moves.promote, moves.limit, 0
        if not ok:  # ENOMEM: no promotions after it
            promote, limit = promote[:0], None
        elif acc["deferred"]:  # out of time: the promotions wait for the rest of the room
            acc["deferred"] += _pages(state, promote)
            waiting = len(promote)
            promote, limit = promote[:0], limit or "throughput"
        else:
            promote, limit = self._promote(state, decision, limits, demoted, promote, limit,
                                           (acc, forget, gone, window, deadline))
        acc["move_s"] = clock.monotonic() - t_moves
        if forget:
            state.forget(np.concatenate(forget))
        for pid in gone:
            self.drop(pid)
        return Moved(demoted=demoted, promoted=acc["moved_pages"], promote=promote,
                     limit=limit, waiting=waiting, tally=acc)

    def _promote(self, state, decision, limits: Limits, demoted: int, planned: np.ndarray,
                 limit: str | None, moving: tuple):
        """Plan the promotions again on the state the demotions left (``planned``: the first
        plan's), with the room read again, and move them; (the promotions, the limit that cut
        them). ``moving``: the executor's arguments after the units and the node."""
        cfg = self.cfg()
        acc = moving[0]
        room = self.fastnode.room_pages() if len(planned) or limit == "node" else None
        if room is not None and demoted:
            # an exchange's promotions (after demotions in this step) may use the margin, down
            # to the high watermark itself, by no more than was demoted: ROOM_MARGIN is kept
            # for promotions into free room alone. Otherwise a node a few pages short (other
            # tenants, pages the kernel refused to demote) clips a 2 MiB unit off an exchange
            room += min(demoted, ROOM_MARGIN // PAGE_SIZE)
        # with groups, the first plan's promotions are the most each group may have
        asked = planned if limits.groups else decision.promote
        promote, limit = planner.plan_promotions(state, asked, limits.budget, room,
                                                 limits.rate - demoted, fast=cfg.fast_node)
        if limits.groups:
            promote = shares.refit(state, promote, list(limits.groups), fast=cfg.fast_node)
        if limit == "node" and room <= 0:
            self.executor.node_full(cfg.fast_node, True, "free memory at its high watermark")
        self.executor.move(promote, cfg.fast_node, *moving)
        if acc["deferred"]:  # a limit the plan hit comes first (e.g. the node's room)
            limit = limit or "throughput"
        return promote, limit
