"""One interval step: read -> state -> decide -> plan -> move.

The daemon (daemon/loop.py) and the trace simulator (policies/simulate.py) run every interval
through one :class:`Step`, so what the bench measures is what the daemon decides:

1. :meth:`Step.begin`: a new interval in the PageState (heat decays; every STUCK_RETRY
   intervals the units whose move failed for good may be tried again);
2. :meth:`Step.merge`: each target's :class:`Read` merged into the PageState
   (``PageState.sync`` of a part's complete read, then ``PageState.update`` with the time the
   sample covers) and shown to the policy (``Policy.observe``);
3. :meth:`Step.act`: the mover looks up the units of unknown node (``locate``), the caller's
   :class:`Limits` are taken (budget, rate, the fast node's room), the policy decides on a
   Context, the planner (pagetier/core/planner.py) keeps the moves within the limits, and the
   mover carries them out (``move``), returning a :class:`Moved`.

What differs between the daemon and the simulator is plugged in: the reads (a profiler, or a
trace's frames), the mover (move_pages through daemon/executor.py, a dry run, or the
simulator's bookkeeping), the clock (the daemon's, or the frames' timestamps) and the limits
(the daemon's budget, rate, throughput and node room, or the simulated capacity and rate).
The Context class is passed in too: it is the policies' (pagetier.policies.base.Context), a
layer above this one.

Each :class:`Read` says how to weigh its sample. The daemon weighs a read by the seconds it
covers (its reads come at uneven times: early after an idle read, at the profiler's period
ends) and clips counts to the scans those seconds hold; the simulator replays a frame as one
interval (``elapsed_s = interval_s``: rates are counts per interval) with its counts as
recorded. The policies' thresholds are set on those simulated rates: with the builtin traces
(read every 0.5 s) weighed in seconds instead, a third of bench sim's runs decide otherwise.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Protocol

import numpy as np

from pagetier.core import planner, shares
from pagetier.core.sample import Sample
from pagetier.core.state import NEVER

# intervals before units whose move failed for good (EACCES: pages shared with other
# processes) are tried again: often enough to pick up a page that became private, rarely
# enough that a shared library's pages do not cost a failed move every interval
STUCK_RETRY = 32
# budgets at or above this are "no limit" (planner.NO_LIMIT and the like): nothing is added to them
UNLIMITED = 1 << 61


@dataclass(frozen=True)
class Read:
    """One target's sample for this interval and how to weigh it.

    ``elapsed_s``: the time the sample covers; ``interval_s``: the interval its rates are
    weighed against (``PageState.update``); ``max_count``: for a profiler counting one access
    per unit per scan, the scans the time covers (None: no clipping); ``part``: a complete
    read of part of the target's address space, synced before the sample (None: none);
    ``trust_moves``: intervals for which the daemon's node of a moved unit beats the sample's.
    """

    pid: int
    sample: Sample
    elapsed_s: float
    interval_s: float
    max_count: int | None = None
    part: Sample | None = None
    trust_moves: int = 0


@dataclass(frozen=True)
class Limits:
    """What one interval's moves must fit in, in 4 KiB pages: ``budget`` movable pages of the
    targets on the fast node, ``rate`` pages moved, and the fast node's ``room`` above its high
    watermark (None: unknown, no limit but the budget); ``groups``: targets with budgets of
    their own (pagetier.core.shares.Group: the daemon's cgroups), planned by
    pagetier/core/shares.py."""

    budget: int
    rate: int
    room: int | None = None
    groups: tuple = ()


# what stopped an interval's exchange where it did (exchange_limit): the candidates ran out
# (everything wanted was moved, or nothing was wanted), the fast budget, the fast node's room,
# the rate limit, or the migration throughput measured so far (the daemon's cap below --rate)
EXCHANGE_LIMITS = ("candidates", "budget", "node", "rate", "throughput")


def exchange_limit(limit: str | None) -> str:
    """The limit that bound an exchange, from the planner's, mover's or policy's (None: none
    did, so the candidates ran out): one of EXCHANGE_LIMITS."""
    return limit if limit in EXCHANGE_LIMITS else "candidates"


def wanted_pages(moves: planner.Moves, decision) -> int:
    """Pages the interval wanted moved: the planner's count of the policy's moves that had
    somewhere to go plus its forced demotions, or the policy's own ``wanted_pages`` (in its
    stats: what it would have asked without the limits it applies itself) when that is more."""
    own = getattr(decision, "stats", {}).get("wanted_pages")
    return max(int(moves.wanted), int(own or 0))


@dataclass
class Moved:
    """What the mover did with a plan: pages demoted and promoted (planned ones in a dry run),
    the promotions it carried out (unit indices; it may plan them again after the
    demotions), the limit that cut them (the planner's, or the mover's own: "node",
    "throughput"), promotions deferred whole (``waiting``: not clipped) and the mover's own
    counters (``tally``)."""

    demoted: int
    promoted: int
    promote: np.ndarray
    limit: str | None
    waiting: int = 0
    tally: dict = field(default_factory=dict)


class Mover(Protocol):
    """Where the moves go: ``locate(state)`` sets the nodes of units of unknown node;
    ``move(state, moves, decision, limits)`` carries out a plan and records it in the state."""

    def locate(self, state) -> None: ...

    def move(self, state, moves: planner.Moves, decision, limits: Limits) -> Moved: ...


@dataclass
class Outcome:
    """One act of a step: the policy's context and decision, the plan, what was moved, the
    capacity the policy was told (None: unknown), the seconds of CPU the decision took and the
    limits the moves were planned in."""

    context: object
    decision: object
    moves: planner.Moves
    moved: Moved
    capacity: int | None
    decide_s: float
    limits: Limits

    @property
    def clipped(self) -> int:
        """Units the policy asked to move that the limits kept in place."""
        m = self.moves
        return max(0, m.asked - len(m.demote) - len(self.moved.promote) - self.moved.waiting)


class Step:
    """The interval step over ``state`` for ``policy``, moving with ``mover``.

    ``clock.monotonic()`` minus ``t0`` is the Context's ``now``; ``context`` builds the
    Context (the policies' class); ``fast``/``slow`` are the nodes; ``interval_s`` is the
    interval the policy is told.
    """

    def __init__(self, state, policy, mover: Mover, clock, context: Callable, *, fast: int = 0,
                 slow: int = 1, interval_s: float = 1.0, t0: float | None = None):
        self.state, self.policy, self.mover, self.clock = state, policy, mover, clock
        self.context = context
        self.fast, self.slow, self.interval_s = fast, slow, interval_s
        self.t0 = clock.monotonic() if t0 is None else t0

    def begin(self) -> None:
        """A new interval: heat decays, and now and then stuck units are let go."""
        self.state.begin_interval()
        if self.state.interval % STUCK_RETRY == 0:
            self.state.unstick()

    def merge(self, reads: Iterable[Read]) -> float:
        """Merge each read into the state and show it to the policy, in order (``reads`` may
        be a generator: each read is taken after the one before it is merged); the CPU
        seconds of the merges."""
        st = self.state
        merge_s = 0.0
        for r in reads:
            t = time.process_time()
            if r.part is not None:
                st.sync(r.part, trust_moves=r.trust_moves)
            st.update(r.sample, trust_moves=r.trust_moves, interval_s=r.interval_s,
                      elapsed_s=r.elapsed_s, max_count=r.max_count)
            merge_s += time.process_time() - t
            self.policy.observe(r.pid, r.sample)
        return merge_s

    def act(self, limits: Callable[[], Limits]) -> Outcome:
        """Decide, plan and move: ``limits()`` is asked after the mover located the units of
        unknown node (the budget may depend on what the fast node holds)."""
        st = self.state
        self.mover.locate(st)
        lim = limits()
        # the budget is for pages that can be moved; a policy counts every unit on the fast
        # node, so it is shown the budget plus the fast pages the kernel refused to move
        shown = lim.budget + st.unmovable_on(self.fast) if lim.budget < UNLIMITED else lim.budget
        # what the fast node can hold for the targets: their units on it plus its room (never
        # less than they hold). Below the budget the node is the limit: the policy exchanges
        capacity = None if lim.room is None else st.pages_on(self.fast) + max(0, lim.room)
        ctx = self.context(fast_node=self.fast, slow_node=self.slow, fast_budget=shown,
                           fast_capacity=capacity, max_moves=lim.rate, interval=st.interval,
                           now=self.clock.monotonic() - self.t0, interval_s=self.interval_s)
        t = time.process_time()
        dec = self.policy.decide(st, ctx)
        decide_s = time.process_time() - t
        if lim.groups:
            moves = shares.plan(st, dec, list(lim.groups), lim.budget, lim.room, lim.rate,
                                fast=self.fast, slow=self.slow)
        else:
            moves = planner.plan(st, dec, lim.budget, lim.room, lim.rate, fast=self.fast,
                                 slow=self.slow)
        moved = self.mover.move(st, moves, dec, lim)
        return Outcome(ctx, dec, moves, moved, capacity, decide_s, lim)

    def __call__(self, reads: Iterable[Read], limits: Callable[[], Limits]) -> Outcome:
        """A whole interval: begin, merge ``reads``, act."""
        self.begin()
        self.merge(reads)
        return self.act(limits)


class RecordingMover:
    """A mover with no kernel: it carries out the whole plan by recording it in the state,
    counting ping-pongs (a unit moved again within ``ping_pong_window`` intervals of its last
    move) as the daemon's executor does. The simulator moves with it; tests run the daemon's
    step with it."""

    def __init__(self, fast: int = 0, slow: int = 1, ping_pong_window: int = 4):
        self.fast, self.slow, self.window = fast, slow, ping_pong_window

    def locate(self, state) -> None:
        """Every unit has a node here: nothing to look up."""

    def move(self, state, moves: planner.Moves, decision, limits: Limits) -> Moved:
        pages = {self.slow: 0, self.fast: 0}
        ping_pongs = 0
        for idx, node in ((moves.demotions, self.slow), (moves.promote, self.fast)):
            if not len(idx):
                continue
            last = state.last_move[idx]
            ping_pongs += int(((last != NEVER) & (state.interval - last <= self.window)).sum())
            pages[node] = int(state.npages[idx].sum(dtype=np.int64))
            state.record_moves(idx, node)
        return Moved(demoted=pages[self.slow], promoted=pages[self.fast], promote=moves.promote,
                     limit=moves.limit, tally={"ping_pongs": ping_pongs})
