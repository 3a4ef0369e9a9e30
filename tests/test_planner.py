"""The move planner (pagetier.core.planner): what of a policy's decision fits in the budget,
the rate and the fast node's room. The daemon and the simulator both call it."""
from __future__ import annotations

import numpy as np
import pytest

from pagetier.core import planner
from pagetier.core.sample import Sample
from pagetier.core.state import PageState

FAST, SLOW = 0, 1


def state(nodes, heat=None, npages=None) -> PageState:
    """Units 0..n-1 of one target, on ``nodes``, with ``heat`` (rates) and ``npages``."""
    n = len(nodes)
    st = PageState()
    st.begin_interval()
    rate = np.asarray(heat if heat is not None else np.zeros(n), np.float32)
    st.update(Sample(pid=7, addr=np.arange(n, dtype=np.uint64) * np.uint64(1 << 21),
                     count=(rate > 0).astype(np.uint32), node=np.asarray(nodes, np.int16),
                     npages=np.asarray(npages if npages is not None else np.ones(n), np.uint16),
                     freq=rate))
    return st


class D:
    def __init__(self, promote=(), demote=()):
        self.promote = np.asarray(promote, np.int64)
        self.demote = np.asarray(demote, np.int64)


def test_everything_fits():
    st = state([SLOW, SLOW, FAST, FAST])
    m = planner.plan(st, D(promote=[0, 1], demote=[2]), budget=10, node_room=None, rate=100)
    assert m.promote.tolist() == [0, 1] and m.demote.tolist() == [2] and m.forced.tolist() == []
    assert m.limit is None and m.clipped == 0 and m.asked == 3


@pytest.mark.parametrize("budget,rate,room,kept,limit", [
    (2, 100, None, [0, 1], "budget"),  # two pages of budget, none used
    (10, 3, None, [0, 1, 2], "rate"),
    (10, 100, 1, [0], "node"),
    (2, 100, 1, [0], "node"),  # the room cuts deeper than the budget
    (10, 100, 0, [], "node"),
    (0, 100, None, [], "budget"),
])
def test_promotions_clipped_in_order(budget, rate, room, kept, limit):
    st = state([SLOW] * 5)
    m = planner.plan(st, D(promote=[0, 1, 2, 3, 4]), budget, room, rate)
    assert m.promote.tolist() == kept and m.limit == limit
    assert m.clipped == 5 - len(kept)


def test_invalid_duplicate_and_misplaced_indices_dropped():
    st = state([SLOW, FAST, SLOW])
    m = planner.plan(st, D(promote=[2, 2, -1, 99, 1, 0], demote=[0, 5]), 10, None, 100)
    # 1 is on the fast node already; 0 is asked both ways: promoted, not demoted
    assert m.promote.tolist() == [2, 0] and m.demote.tolist() == [] and m.asked == 4


def test_demotions_free_budget_rate_and_room_for_promotions():
    """An exchange: demoting two fast units makes room (budget and node) for two promotions,
    and the demotions use up the rate first."""
    st = state([FAST, FAST, SLOW, SLOW])
    m = planner.plan(st, D(promote=[2, 3], demote=[0, 1]), budget=2, node_room=0, rate=4)
    assert m.demote.tolist() == [0, 1] and m.promote.tolist() == [2, 3] and m.limit is None
    m = planner.plan(st, D(promote=[2, 3], demote=[0, 1]), budget=2, node_room=0, rate=3)
    assert m.demote.tolist() == [0, 1] and m.promote.tolist() == [2] and m.limit == "rate"


def test_forced_demotions_coldest_first_within_rate():
    st = state([FAST] * 6, heat=[5, 1, 4, 0.5, 3, 2])
    m = planner.plan(st, D(), budget=3, node_room=None, rate=100)
    assert sorted(m.forced.tolist()) == [1, 3, 5] and m.demote.tolist() == []
    m = planner.plan(st, D(), budget=3, node_room=None, rate=2)
    assert m.forced.tolist() == [3, 1]  # the coldest two: the rate allows no more


def test_forced_demotions_spare_the_units_the_policy_promotes_or_demotes():
    st = state([FAST] * 4, heat=[0, 1, 2, 3])
    m = planner.plan(st, D(promote=[0], demote=[3]), budget=2, node_room=None, rate=100)
    assert m.demote.tolist() == [3] and m.forced.tolist() == [1]


def test_huge_units_count_their_pages():
    st = state([SLOW, SLOW, SLOW], npages=[512, 1, 1])
    m = planner.plan(st, D(promote=[0, 1, 2]), budget=100, node_room=None, rate=1 << 20)
    assert m.promote.tolist() == [] and m.limit == "budget"  # fit is a prefix, in the policy's order
    m = planner.plan(st, D(promote=[1, 2, 0]), budget=100, node_room=None, rate=1 << 20)
    assert m.promote.tolist() == [1, 2]


def test_stuck_and_unmovable_units():
    """Stuck units are not planned; fast pages the kernel refused to move are outside the
    budget (movable_on), so they neither block promotions nor force demotions."""
    st = state([FAST, FAST, SLOW, SLOW], heat=[1, 1, 1, 1])
    st.mark_stuck(np.array([0, 2]))  # 0 on the fast node: unmovable; 2: stuck on the slow node
    m = planner.plan(st, D(promote=[2, 3], demote=[0]), budget=2, node_room=None, rate=100)
    assert m.demote.tolist() == [] and m.forced.tolist() == [] and m.promote.tolist() == [3]
    assert st.pages_on(FAST) == 2 and st.movable_on(FAST) == 1


def test_plan_is_pure():
    st = state([FAST, SLOW, SLOW], heat=[0, 2, 1])
    before = st.a.copy()
    planner.plan(st, D(promote=[1, 2], demote=[0]), 1, 5, 100)
    assert (st.a == before).all()


def test_plan_promotions_after_a_refused_demotion():
    """The live daemon plans the promotions again once the demotions ran: a demotion the
    kernel refused leaves its unit on the fast node, and the budget it would have freed is
    not used."""
    st = state([FAST, SLOW])
    m = planner.plan(st, D(promote=[1], demote=[0]), budget=1, node_room=None, rate=100)
    assert m.promote.tolist() == [1]  # planned: the demotion frees the one page
    promote, limit = planner.plan_promotions(st, [1], 1, None, 100)  # it did not move
    assert promote.tolist() == [] and limit == "budget"


@pytest.mark.parametrize("rate,interval,pages", [
    (512, 1.0, 131072), (4, 1.0, 1024), (4, 0.5, 512), (0, 1.0, 1 << 62), (0.001, 1.0, 1),
])
def test_rate_pages(rate, interval, pages):
    assert planner.rate_pages(rate, interval) == pages


@pytest.mark.parametrize("budget,rate,room,promote,demote,limit,wanted", [
    (10, 100, None, [2, 3], [0], None, 3),  # everything fits: the candidates ran out
    (3, 100, None, [2, 3, 4], [], "budget", 3),  # 2 fast + 3 asked > 3
    (10, 100, 1, [2, 3, 4], [], "node", 3),
    (10, 2, None, [2, 3, 4], [], "rate", 3),
    (10, 1, None, [], [0, 1], "rate", 2),  # the rate cuts demotions alone too
    (10, 100, None, [0, 2], [2, 5], None, 1),  # 0 is on the fast node already, 2 is promoted
])
def test_each_limit_is_reported_when_it_binds(budget, rate, room, promote, demote, limit, wanted):
    """The limit that cut the moves (None: none did) and the pages the policy wanted moved:
    those with somewhere to go (promotions off the fast node, demotions off the slow one)."""
    st = state([FAST, FAST, SLOW, SLOW, SLOW, SLOW])
    m = planner.plan(st, D(promote=promote, demote=demote), budget=budget, node_room=room,
                     rate=rate)
    assert m.limit == limit and m.wanted == wanted


def test_wanted_counts_pages_and_forced_demotions():
    st = state([SLOW, FAST, FAST, FAST], heat=[1, 0, 2, 3], npages=[512, 1, 1, 1])
    m = planner.plan(st, D(promote=[0]), budget=1, node_room=None, rate=1 << 20)
    # 512 pages wanted up, and the two coldest fast units forced down to get under the budget
    assert m.forced.tolist() == [1, 2] and m.wanted == 512 + 2 and m.limit == "budget"
