"""The default policy: rate-ranked placement with a noise floor, exchange under node pressure,
watermarks, hysteresis, a thrashing throttle and phase detection.

The signal is ``state.heat``: the decayed sum of each unit's estimated accesses per second
(pagetier/core/state.py). Each interval the policy

1. takes the reference heat: the heat of the coldest of the hottest units that carry
   ``ref_mass`` (90%) of all the heat. Units touched now and then carry a tiny share of the
   accesses, so the reference is a hot unit's heat however many of them there are. Units colder
   than ``noise_ratio`` times it (and than ``min_heat``) are noise: never promoted, so spare
   budget is not filled with units that cannot be told from noise;
2. ranks the rest by heat per page (``per_page``; by each unit's heat with it off) and takes
   the hottest that fit in the fast capacity it plans for: ``low_watermark * fast_budget``, or
   less when the fast node itself cannot hold that much (``Context.fast_capacity``: the
   targets' units on it plus its room above the high watermark). The budget is in pages, and
   a 2 MiB unit takes 512 of them: ranked by its own heat, a huge unit at 0.3 accesses per page
   came before 16 KiB units at 10 (bench sim: redis at 25% 5% slower, pagerank at 25% 22%).
   The heat of the coldest unit taken is this interval's hot threshold;
3. promotes the units of that set not on the fast node yet, hottest first, up to
   ``high_watermark * fast_budget`` or the node's capacity, whichever is smaller;
4. exchanges: when a promotion needs room (the budget or the node full), demotes the coldest
   fast units (per page too), those outside the hot set first, but only for a unit measurably
   hotter: promoted heat per page > victim heat per page * (1 + ``margin``), with at least
   ``gap_ratio`` times the reference heat above what its pages' worth of the victim carries
   (two noise units never swap; a 4 KiB unit needs that much over a 2 MiB victim's heat per
   page), and itself at least
   ``exchange_ratio`` times the median heat of the hot set's units of its size (with THP, 2
   MiB units are compared with 2 MiB units, 4 KiB ones with 4 KiB ones), both now and before
   this interval's read when it was warm already (``sustained_exchange``: one estimate that jumped
   is not a hot unit; a unit cold before is not held back, nor one whose heat now is at least
   ``one_read_ratio`` times that median: as hot as the hot set by one read, where a noise
   unit's jump reaches about a quarter of it, by the estimates below). Colder units are warm:
   they fill free room but never push a resident out (with noise on every huge page, the warm
   units' estimates jump from one interval to the next and they kept trading the spare budget among
   themselves; the reference heat falls among them when their share of all the heat is
   large, so the bar is taken from the hot set). Free room is filled on two reads as well
   (``sustained_fill``): a unit at the bar by one estimate that jumped waits for the next
   read, as for an exchange; a warm unit needs ``fill_ratio`` times the median heat of the hot
   set's units of its size (each at the better of its heat now and before the read) on each
   of its last estimates (this read's rate, its heat now and its heat before the read), and
   to have been above the noise floor before the read. A page of sparse noise is above the
   floor in the read after its one access and never again, and such pages filled the room
   every interval, pushed the node over the high watermark and were demoted again (bench live
   noise1000 without THP: 1.6-2.4 times the hot set moved). With THP, noise on every huge
   unit reads at 54 accesses/s most of the time, at 208 one read in five and at 700 one in
   fifty, against 1,500-1,700 for a hot unit (and a third of that in a read that finds the
   program slowed): one read's jump put noise units at the bar, two reads' at a fifth of the
   reference heat (which falls among them), and they filled the spare third of the budget
   (1.5-1.6 times the hot set moved); with the hot set's heat in one read as the scale, each
   slowed read let a few in, all run long (1.4 and 1.6 times in two runs). On a young read,
   when most of the hot set's pages have their first estimate in it, a unit moves only at
   ``young_ratio`` times that median (or, with units of more than one size, per page at
   ``young_ratio`` times the hot set's median heat per page, weighted by pages: a 16 KiB unit hotter per page than the hot 2 MiB
   units is not noise; compared with 16 KiB units only, 28 pages of them waited a read on
   bench sim hotcold-phased at 50%, 0.16% behind heat-classes), and in the read after it only
   at the bar by this read's
   rate as well: pagetier.ko's first estimates tell a hot unit from noise by a factor of 3-4
   only (hot units at 450-1,150, a fifth of the noise units at 125-130, above the bar), and in
   the next read, which the first promotions slow down and which finds little, a unit's heat
   is still mostly that first estimate. A unit the last decision promoted that is still off
   the fast node (the daemon deferred it at its move deadline, or a limit clipped it) fills
   free room on that decision's evidence: the read after a long move finds the program slowed
   and the next one the unit's estimate risen again, and the two-read tests held the last 8 MB
   of a clean hot set back two reads (bench live noise0). Demotions come first in the plan and
   the daemon moves them first, so the promotions find the room freed.
   The node limit never makes the policy demote by itself (the daemon does not give memory to
   other tenants); fast-node use above ``high_watermark * fast_budget`` is demoted down to
   ``low_watermark``, and in that interval warm units (under the exchange bar) are not
   promoted: only hot units refill the band. (Pages come onto and leave the fast node
   without the daemon's moves: in bench live noise1000, hundreds an interval while the
   kernel split huge pages it could not migrate whole, the units listed growing from 500 to
   6,000-10,000; refilling the band with warm units at once demoted and promoted 1-2k pages of
   noise every other interval.)
5. never moves a unit that moved in the last ``min_residency`` intervals (hysteresis; only an
   over-budget fast node may demote such units);
6. throttles. A move-back is a move of a unit moved within ``thrash_window`` intervals, except
   one that a young read (4.) moved (``young_corrections``): that move was a guess on first
   estimates, and moving the unit back corrects it (counted, the corrections of a first fill
   throttled bench sim redis at 10% for eight reads, 0.6% slower), nor the demotion of one
   this read found idle and outside the hot set: its accesses moved on (bench sim zstd at 10%,
   whose 2 MiB units are hot 3-4 reads each in turn: each retired unit counted, and the
   throttle held the next one back 1-3 reads, 0.12% behind heat-classes); when
   more than ``thrash_ratio`` of a plan's pages (or of their moving average) are move-backs,
   for the next ``thrash_window`` intervals an exchange needs ``thrash_margin`` instead of
   ``margin`` (the promoted unit more than four times the victim's heat by default, not 1.25
   times: pagetier.ko's probe windows are 4 times apart, so two units one window apart are
   not told apart by one estimate), judged on two reads: the candidate's lower estimate (now,
   and before this read) against the victim's higher one. Exchanges use ``throttle_scale`` of
   the rate limit. Units of about the same heat stop trading places (with noise on every huge
   unit, the coldest residents by one read are those whose estimate fell in it, and the
   hottest candidates those whose estimate jumped: bench live noise1000 moved a sixth of its
   MB in throttled exchanges); a unit clearly hotter than the one it would replace still
   moves, recent mover or not (freezing every recent mover at once kept a wrong placement for
   ``thrash_window`` intervals after the hot set moved, and after a wrong swap). When the
   plans made under the throttle still move back more than ``freeze_ratio`` of their pages
   (a moving average), units moved within ``thrash_window`` stay where they are for the next
   ``thrash_window`` intervals ("frozen" in the throttle's reasons). In the interval of a
   phase change (7.) neither applies and its moves do not count as move-backs: what the last
   phase brought goes back and the new hot set comes in, in one batch. When the hot set is larger
   than the fast capacity ("oversubscribed") exchanges are throttled the same way, except in
   the interval of a phase change and the ``thrash_window`` intervals after it, while the
   last phase's units cool, and on a read that sees a new hot set in part ("weak", 7.)
   (throttled there, the exchange that brings a new region in was cut to a quarter of the
   rate limit, and the region came in over 3-4 reads in bench live fuller and phases).
   In the intervals after a change, when the units at the exchange bar (4.) are more than
   twice the fast capacity, move-backs do not throttle either: the fast node then holds a
   small part of the new phase's units, chosen again as they warm, and what the change
   brought in on its rates partly goes out again.
   Promotions into free room are never throttled: they go in one large batch, up to the rate
   limit;
7. classifies the access pattern from the overlap (Jaccard) of successive hot sets
   (``warmup``, ``stable``, ``phased``, ``irregular``) and suggests an ``interval_scale`` (in
   stats only: the daemon keeps its ``--interval``). A
   phase change is acted on in the interval it is seen: when the units accessed in this
   interval (``state.rate``) form a hot set about as large and as hot (its reference at least
   half the last one's) as the last one and overlapping it by less than ``phase_jaccard`` after
   a regular run, and with under ``phase_mass`` of this interval's accesses on the last hot
   set, this interval ranks by its rates rather than by decayed heat (which would keep the
   old hot set for another interval or two). A read that probed only some of the hot units
   and ranks noise units next to them overlaps the last hot set little, but most of its
   accesses are still on it: not a phase change (bench live noise1000 took such reads for
   one and traded 1-5k pages of noise for noise each time, half of all it moved). On that
   read ``sustained_fill`` (4.) holds the new phase's warm units back as well: they come an
   interval later, on their heat; units at the exchange bar move at once. A read
   that finds under half as many pages accessed (in units with a rate) as the last one (a read
   that missed most of the program's accesses) is not taken as a phase change; counted in
   units, with THP, the hundred-odd 4 KiB units a program touches now and then next to its
   forty 2 MiB hot units made every other read in bench live fuller look like one that missed
   most of them, and a phase change seen there waited a period. Nor is a new hot set by decayed
   heat that is under half as hot (reference heat) or as large as the last one: a few
   lukewarm units left on top after missed reads, not a new phase. After an earlier phase
   change the run need not be regular: while the last phase's units cool and the new ones
   warm, the hot set by decayed heat (filled to the capacity from both) changes from read to
   read, and with a change every 4 reads (bench live phases) the overlaps made the history
   look irregular after two changes, and later changes were not acted on. There, a change by
   rates is taken once ``held_reads`` reads in a row since the last change had most of their
   accesses on the set it brought (or the last hot set), unless the read goes back to a hot
   set one of the last two changes left or brought within ``thrash_window + 2`` reads (a
   ping-pong: a program going through phases comes back to a set later, if ever). A read
   whose accesses are mostly off the last hot set but whose new set is too weak so far
   ("weak") asks for the next read at the profiler's next period end
   (``Decision.read_soon``): the first read after the program moves to new memory finds some
   of its units not yet probed, and waiting a whole interval to see the rest cost bench live
   fuller an interval per phase. Between reads, at the profiler's period ends, the daemon shows
   the policy what has been counted so far (``read_now``): when most of those rates are off the
   last hot set, in a history where a read's rates may show a change (as above), on a new set
   about as hot and as large as the last one, the policy asks for the read at once
   (``look_between_reads``): with reads every second period end, a change that began in the
   first period of an interval is acted on a period sooner.

Stats (``Decision.stats``, shown under "policy" in the daemon's JSON lines) include the
pattern, ``limit`` (what kept hot units off the fast node: "budget", "node", "rate", or None:
none did, or room was left and the policy's own rules held them, as warm units waiting for a
second read),
``exchange``, ``noise_floor``, ``reference_heat``, the throttle's reasons, ``move_back_pages``,
``warm_promote_pages`` (pages promoted under the exchange bar: warm units filling free room),
``young_read`` (a young read or the one after it, 4.) and ``phase_check``: which test (7.)
ruled out a phase change by this interval's rates.

Everything is vectorized numpy; the policy keeps only the previous hot set's keys (sorted
``(target << 48) | (addr >> 12)``, so it survives units appearing and disappearing) and a few
scalars between calls.

The helpers ``fill_budget`` and ``plan_moves`` are shared with the baselines (baselines.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from pagetier.core import state as core_state
from pagetier.core.state import NEVER, union, union_remap
from pagetier.errors import ConfigError
from pagetier.policies.base import Context, Decision, Policy, register

# Suggested interval_scale per access pattern, shown in stats (the daemon keeps its interval).
INTERVAL_SCALE = {
    "warmup": 1.0,  # too little history to say
    "stable": 2.0,  # the hot set hardly changes: sample less often
    "phased": 1.0,  # stable phases with sudden changes (0.5 on the interval of a change)
    "irregular": 1.5,  # the hot set keeps changing: longer intervals average more accesses
}
PHASE_CHANGE_SCALE = 0.5  # react quickly right after a phase change
THROTTLED_MIN_SCALE = 1.5  # when throttled, at least this


def unit_keys(state) -> np.ndarray:
    """Stable identity of each unit across calls: ``(target << 48) | (addr >> 12)``; the
    state's own sorted keys when it keeps them."""
    keys = getattr(state, "keys", None)
    if keys is not None:
        return keys()
    return core_state.unit_keys(state.target, state.addr)


def fill_budget(order: np.ndarray, npages: np.ndarray, cap: int) -> np.ndarray:
    """The units of ``order`` (best first) that fit in ``cap`` pages, greedily in order.

    A unit too big for the room left (a 2 MiB unit near the end) is skipped and smaller units
    after it still fill the room: the second pass takes, in order, the rest that fit.
    """
    cap = int(cap)
    if cap <= 0 or len(order) == 0:
        return order[:0]
    size = npages[order].astype(np.int64)
    cum = np.cumsum(size)
    k = int(np.searchsorted(cum, cap, "right"))
    room = cap - (int(cum[k - 1]) if k else 0)
    if k == len(order) or room <= 0:
        return order[:k]
    rest = order[k + 1 :]  # order[k] did not fit
    rest = rest[size[k + 1 :] <= room]
    cum2 = np.cumsum(npages[rest].astype(np.int64))
    k2 = int(np.searchsorted(cum2, room, "right"))
    return np.concatenate([order[:k], rest[:k2]])


def plan_moves(
    npages: np.ndarray,
    promo: np.ndarray,
    promo_rank: np.ndarray,
    victims: np.ndarray,
    victim_rank: np.ndarray,
    *,
    used: int,
    cap: int,
    must: int = 0,
    max_moves: int,
    margin: float = 0.0,
    gap: float | np.ndarray = 0.0,
    bar: float | np.ndarray = 0.0,
    bar_rank: np.ndarray | None = None,
    n_room: int | None = None,
    passes: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    """Choose promotions from ``promo`` and demotions from a prefix of ``victims``.

    promo: unit indices best first, promo_rank their rank values (non-increasing).
    victims: fast-node unit indices in eviction order, victim_rank their rank values.
    used: pages on the fast node now; cap: fast-node pages promotions may fill up to;
    must: pages to demote whatever the promotions (watermark or over budget);
    max_moves: pages that may move in all; n_room: how many leading victims may be evicted to
    make room for a promotion (default all; the rest serve only ``must``).
    A promotion that needs evictions is taken only if its rank exceeds every evicted victim's
    rank times ``1 + margin`` and by more than ``gap`` (a number, or one per unit of ``promo``),
    and is at least ``bar`` (a number, or one per unit of ``promo``; compared with
    ``bar_rank``, the candidates' values for that test, when given: promo_rank's order, not
    necessarily its values). Promotions are taken in order; a candidate that does not fit is
    skipped and the next ones are tried, up to ``passes`` times.

    Returns (promote, demote) unit indices. Guarantees: demoted + promoted pages <=
    max_moves, and used + promoted - demoted <= max(cap, used - demoted) (promotions never
    push the fast node over ``cap``).
    """
    max_moves = max(0, int(max_moves))
    pn = npages[promo].astype(np.int64)
    vn = npages[victims].astype(np.int64)
    nv = len(victims)
    dc = np.zeros(nv + 1, np.int64)
    np.cumsum(vn, out=dc[1:])
    n_room = nv if n_room is None else min(int(n_room), nv)
    # mandatory demotions: the shortest prefix freeing `must` pages, within the rate limit
    j0 = min(int(np.searchsorted(dc, max(0, int(must)), "left")), nv)
    j0 = min(j0, int(np.searchsorted(dc, max_moves, "right")) - 1)
    room_lim = max(j0, n_room)
    vr = victim_rank[j0:].astype(np.float64)
    vmax = np.maximum.accumulate(vr * (1.0 + margin))  # the evicted victims' highest, times it
    vtop = np.maximum.accumulate(vr)  # ...and plain, for the gap
    j = j0
    moved = int(dc[j0])
    fast = int(used) - moved
    taken = []
    start = 0
    for _ in range(passes):
        left = max_moves - moved
        if start >= len(promo) or left <= 0:
            break
        cand = np.arange(start, min(len(promo), start + left + 1))
        if start:  # after a skip, only candidates that could still fit the rate limit
            cand = cand[pn[cand] <= left]
        if len(cand) == 0:
            break
        pc = np.cumsum(pn[cand])
        # total victim pages needed so the fast node stays within cap
        need = dc[j] + np.maximum(0, fast + pc - int(cap))
        jk = np.searchsorted(dc, need, "left")
        jc = np.minimum(jk, nv)
        ok = (jk <= room_lim) & (moved + pc + dc[jc] - dc[j] <= max_moves)
        evicts = jc > j0
        if evicts.any():
            last = np.clip(jc - j0 - 1, 0, None)
            vm = vmax[last] if len(vmax) else np.full(len(jc), np.inf)
            vt = vtop[last] if len(vtop) else np.full(len(jc), np.inf)
            pr = promo_rank[cand].astype(np.float64)
            br = pr if bar_rank is None else bar_rank[cand].astype(np.float64)
            g = gap if np.ndim(gap) == 0 else gap[cand]
            ok &= ~evicts | ((pr > vm) & (pr > vt + g)
                             & (br >= (bar if np.ndim(bar) == 0 else bar[cand])))
        k = len(ok) if ok.all() else int(np.argmin(ok))
        if k:
            taken.append(promo[cand[:k]])
            jn = int(jk[k - 1])
            freed = int(dc[jn] - dc[j])
            moved += int(pc[k - 1]) + freed
            fast += int(pc[k - 1]) - freed
            j = jn
        if k == len(cand):
            break
        start = int(cand[k]) + 1  # skip the candidate that did not fit
    promote = np.concatenate(taken) if taken else np.zeros(0, np.int64)
    return promote.astype(np.int64), victims[:j].astype(np.int64)


def _median_by_size(values: np.ndarray, sizes: np.ndarray, npages: np.ndarray) -> np.ndarray:
    """For each unit of ``npages``, the median of ``values`` over the units of its size
    (``sizes``: theirs); the median of all of them for a size not among them (0.0 if none)."""
    present = np.flatnonzero(np.bincount(sizes)) if len(sizes) else sizes[:0]
    if len(present) == 1:  # one size (no THP, or all huge): one median serves every unit
        return np.full(len(npages), float(np.median(values)))
    out = np.full(len(npages), float(np.median(values)) if len(values) else 0.0)
    for size in present:
        out[npages == size] = float(np.median(values[sizes == size]))
    return out


def _sorted_unique(idx: np.ndarray, n: int) -> np.ndarray:
    """``np.sort(idx)`` for distinct indices in ``range(n)``: through a mask when ``idx`` is a
    large share of ``n`` (at 64 GiB, 5% accessed, 840,000 indices: a few ms instead of ~50)."""
    if len(idx) < n // 16:
        return np.sort(idx)
    mask = np.zeros(n, bool)
    mask[idx] = True
    return np.flatnonzero(mask)


def _member_sorted(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Which of ``a`` are in ``b`` (``b`` sorted)."""
    if not len(b):
        return np.zeros(len(a), bool)
    pos = np.minimum(np.searchsorted(b, a), len(b) - 1)
    return b[pos] == a


def _argsort_desc(x: np.ndarray) -> np.ndarray:
    """``np.argsort(-x, kind="stable")`` (largest first, ties in index order), several times
    faster for non-negative float64 ``x``.

    The bit patterns of such floats order as their values. Each value's pattern, with its low
    bits replaced by its index, makes one integer key, and a plain sort of those keys (no
    argsort) orders by value, then index. Values that differ only in the bits replaced (within
    2**b units in the last place, for b index bits) tie in the key: their runs are put in exact
    order afterwards (rare: only near-equal values)."""
    x = np.asarray(x, np.float64) + 0.0  # a copy, with -0.0 made +0.0
    n = len(x)
    if n and not bool((x >= 0).all()):  # negative or NaN
        return np.argsort(-x, kind="stable")
    b = max(1, (n - 1).bit_length())
    if n < 2 or b > 32:
        return np.argsort(~x.view(np.uint64), kind="stable")
    d = ~x.view(np.uint64)  # descending as unsigned
    low = np.uint64((1 << b) - 1)
    key = np.sort((d & ~low) | np.arange(n, dtype=np.uint64))
    order = (key & low).astype(np.int64)
    full = d[order]
    # adjacent keys that tie without their index bits but not in full value are out of order
    head = key >> np.uint64(b)
    bad = np.flatnonzero((head[1:] == head[:-1]) & (full[1:] != full[:-1]))
    if len(bad):
        # the runs of equal heads holding such a pair, sorted again by (run, value, index)
        run = np.cumsum(np.r_[0, head[1:] != head[:-1]])
        redo = np.zeros(int(run[-1]) + 1, bool)
        redo[run[bad]] = True
        pos = np.flatnonzero(redo[run])
        sub = order[pos]
        order[pos] = sub[np.lexsort((sub, full[pos], run[pos]))]
    return order


def _jaccard_sorted(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard index of two sorted arrays of unique keys (1.0 when both are empty)."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    if len(a) == 0 or len(b) == 0:
        return 0.0
    # a merge of the two sorted runs (a stable sort finds them): O(n), no binary search
    both = np.sort(np.concatenate([a, b.astype(a.dtype, copy=False)]), kind="stable")
    inter = int(np.count_nonzero(both[1:] == both[:-1]))
    return inter / (len(a) + len(b) - inter)


@register("heuristic")
class Heuristic(Policy):
    """Rate-ranked placement with a noise floor, exchange under node pressure, watermarks,
    hysteresis, a thrashing throttle and phase detection."""

    @dataclass
    class Config:
        min_heat: float = 1.0  # colder units are never promoted
        high_watermark: float = 1.0  # fraction of the budget: above it, demote...
        low_watermark: float = 0.95  # ...down to this; the hot set is sized to it
        min_residency: int = 2  # intervals a moved unit stays where it was moved
        margin: float = 0.25  # a swap needs promoted heat > victim heat * (1 + margin)...
        gap_ratio: float = 0.1  # ...and promoted - victim heat >= gap_ratio * reference heat
        exchange_ratio: float = 0.25  # ...and promoted heat >= exchange_ratio * hot set's median
        sustained_exchange: bool = True  # ...now and before this interval's read
        one_read_ratio: float = 0.75  # ...unless this read puts it at this * the median (0: off)
        sustained_fill: bool = True  # free room is filled on two reads too: a warm unit...
        fill_ratio: float = 0.15  # ...at least fill_ratio * the hot set's median heat
        young_ratio: float = 0.4  # on a young read a unit moves only at this * median heat
        noise_ratio: float = 0.05  # colder than noise_ratio * reference heat: noise, not promoted
        ref_mass: float = 0.9  # the reference heat: the coldest unit of those carrying this share
        thrash_window: int = 4  # a move within this many intervals of the last is a move-back
        thrash_ratio: float = 0.05  # move-backs / moves above which the policy throttles
        throttle_scale: float = 0.25  # fraction of max_moves exchanges use while throttled
        thrash_margin: float = 3.0  # while throttled, exchanges need this margin
        freeze_ratio: float = 0.5  # move-backs under the throttle above it: freeze recent movers
        history: int = 8  # intervals of hot-set overlap kept to classify the pattern
        regular_jaccard: float = 0.6  # mean overlap at or above it: a regular pattern
        phase_jaccard: float = 0.3  # overlap below it after a regular run: a phase change...
        phase_mass: float = 0.5  # ...with under this share of the read's accesses on the last set
        held_reads: int = 2  # after an irregular run: reads since the last change on its set (7.)
        look_between_reads: bool = True  # a phase change read at the period end that shows it (7.)
        young_corrections: bool = True  # moving back what a young read moved is no move-back (6.)
        per_page: bool = True  # rank units by heat per page (False: by each unit's heat)

        def check(self):
            def bad(key, why):
                value = getattr(self, key)
                raise ConfigError(f"policy heuristic: option {key!r} {why}, got {value!r}")

            if not self.min_heat >= 0:
                bad("min_heat", "must be >= 0")
            if not 0 < self.high_watermark <= 1:
                bad("high_watermark", "must be in (0, 1]")
            if not 0 < self.low_watermark <= self.high_watermark:
                bad("low_watermark", f"must be in (0, high_watermark={self.high_watermark}]")
            if self.min_residency < 0:
                bad("min_residency", "must be >= 0")
            if not self.margin >= 0:
                bad("margin", "must be >= 0")
            if not self.gap_ratio >= 0:
                bad("gap_ratio", "must be >= 0")
            if not 0 <= self.exchange_ratio <= 1:
                bad("exchange_ratio", "must be in [0, 1]")
            if not 0 <= self.noise_ratio < 1:
                bad("noise_ratio", "must be in [0, 1)")
            if not self.one_read_ratio >= 0:
                bad("one_read_ratio", "must be >= 0")
            if not 0 <= self.fill_ratio <= 1:
                bad("fill_ratio", "must be in [0, 1]")
            if not 0 <= self.young_ratio <= 1:
                bad("young_ratio", "must be in [0, 1]")
            if not 0 < self.ref_mass <= 1:
                bad("ref_mass", "must be in (0, 1]")
            if self.thrash_window < self.min_residency:
                bad("thrash_window", f"must be >= min_residency={self.min_residency}")
            if not 0 < self.thrash_ratio <= 1:
                bad("thrash_ratio", "must be in (0, 1]")
            if not 0 < self.throttle_scale <= 1:
                bad("throttle_scale", "must be in (0, 1]")
            if not self.thrash_margin >= self.margin:
                bad("thrash_margin", f"must be >= margin={self.margin}")
            if not 0 < self.freeze_ratio <= 1:
                bad("freeze_ratio", "must be in (0, 1]")
            if self.history < 2:
                bad("history", "must be >= 2")
            if not 0 <= self.regular_jaccard <= 1:
                bad("regular_jaccard", "must be in [0, 1]")
            if not 0 < self.phase_mass <= 1:
                bad("phase_mass", "must be in (0, 1]")
            if self.held_reads < 1:
                bad("held_reads", "must be >= 1")
            if not 0 <= self.phase_jaccard <= self.regular_jaccard:
                bad("phase_jaccard", f"must be in [0, regular_jaccard={self.regular_jaccard}]")

    def __init__(self, config=None):
        super().__init__(config)
        self._prev_hot: np.ndarray | None = None  # sorted keys of the last hot set
        self._phase_check = None  # which test ruled out a phase change by rates, in stats
        self._prev_hot_pages = 0
        self._prev_ref = 0.0  # the last reference heat
        self._prev_accessed = 0  # pages of the units with a rate in the last read
        self._overlap: deque[float] = deque(maxlen=self.config.history)
        self._since_change = None  # calls since the last phase change, None if none seen
        self._thrash = 0.0  # moving average of the move-back fraction
        self._throttle_until = None  # interval up to which the throttle holds
        self._freeze_until = None  # interval up to which recent movers stay put
        self._thrash_kept = 0.0  # moving average of the move-back fraction under the throttle
        # the last two phase changes: the hot sets each left and brought (sorted keys), and
        # the read it came at
        self._changed: deque[tuple[np.ndarray, np.ndarray, int]] = deque(maxlen=2)
        self._reads = 0  # reads with rates so far
        self._held = 0  # reads in a row since the last change on the last hot set
        self._young_at = None  # the read of the last young read (see decide)
        self._chosen: np.ndarray | None = None  # sorted keys of the last decision's promotions
        # the intervals of the last young reads (their moves are guesses, see decide)
        self._young_moves: deque[int] = deque(maxlen=self.config.thrash_window + 1)

    @property
    def looks_between_reads(self) -> bool:
        return self.config.look_between_reads

    def _hot_order(self, score, cand, fast, rest: float = 0.0, npages=None):
        """(units of ``cand`` above the noise floor, hottest first with ties to fast residents;
        reference heat; floor). Given the units' sizes ``npages``, when there is more than one
        among them: hottest per page first (the floor is a unit's heat all the same).
        ``rest``: the summed score of units left out of ``cand`` (all colder than
        ``min_heat``); when the reference falls among them it is ``min_heat``."""
        c = self.config
        s = score[cand] * (1.0 + 1e-9 * fast[cand])
        by = _argsort_desc(s)
        order = cand[by]
        ranked = score[order]
        ref = 0.0
        if len(ranked):
            cum = np.cumsum(ranked)
            k = int(np.searchsorted(cum, c.ref_mass * (cum[-1] + rest), "left"))
            ref = float(ranked[k]) if k < len(ranked) else (
                float(ranked[-1]) if rest <= 0 else min(float(ranked[-1]), c.min_heat))
        floor = max(c.min_heat, c.noise_ratio * ref)
        # ranked is non-increasing up to the 1e-9 tie-break: the hot units are a prefix
        n_hot = int(np.count_nonzero(ranked >= floor))
        order = order[:n_hot]
        if npages is not None and n_hot > 1:
            size = npages[order]
            if int(size.min()) != int(size.max()):  # one size: the same order
                order = order[_argsort_desc(s[by[:n_hot]] / size)]
        return order, ref, floor

    def _rate_phase_change(self, keys_of, decay, rate, known, fast, npages, cap):
        """Whether this interval's rates alone show a new hot set (a phase change seen now,
        before decayed heat catches up): a regular history, a set of units accessed now about
        as large as the last hot set, and little overlap with it. ``keys_of(idx)``: the units'
        keys. Sets ``self._phase_check`` to the test that ruled a change out (decide resets
        it)."""
        c = self.config

        def no(why):
            self._phase_check = why
            return False

        prev = self._prev_hot
        if prev is None or not len(prev) or not self._overlap:
            return False
        acc = np.flatnonzero(known & (rate > 0))
        akeys = keys_of(acc)
        if self._irregular(akeys, rate[acc]):
            return no("irregular")
        if not len(acc):
            return no("nothing accessed")
        if int(npages[acc].sum()) < 0.5 * self._prev_accessed:
            return no("few accessed")  # far fewer pages accessed than last time: no evidence
        if not self._change_possible(akeys, npages[acc], c.phase_jaccard):
            return no("overlap")
        # most of this read's accesses on the last hot set: the same phase, read in part. With
        # noise on every huge unit a read that probed few of the hot units ranks noise units
        # on top, and acting on it as a phase change traded noise units for noise units
        # (bench live noise1000: 1-5k pages a time, half the MB moved)
        if self._mostly_on(akeys, rate[acc], prev):
            return no("mass")
        order, now_ref, _ = self._hot_order(rate / (1.0 - decay), acc, fast)
        now_set = fill_budget(order, npages, cap)
        if not self._like_last(now_ref, int(npages[now_set].sum())):
            return no("weak")  # noise, or a short or partial read that missed the hot set
        keys = np.sort(keys_of(now_set))
        if _jaccard_sorted(keys, prev) >= c.phase_jaccard:
            return no("overlap")
        return True

    def _irregular(self, akeys: np.ndarray, arate: np.ndarray) -> bool:
        """Whether the history rules out a phase change by a read's rates (accessed units' keys
        and rates): an irregular run, and no phase change before it, or the hot set since the
        last one has not held, or the read goes back to a set of the last two (see 7.)."""
        c = self.config
        return float(np.mean(self._overlap)) < c.regular_jaccard and (
            not self._changed or self._held < c.held_reads or self._back(akeys, arate))

    def _mostly_on(self, akeys: np.ndarray, arate: np.ndarray, keys: np.ndarray) -> bool:
        """Whether ``phase_mass`` of the rates ``arate`` (of units ``akeys``) is on the units
        ``keys`` (sorted)."""
        on = float(arate[_member_sorted(akeys, keys)].sum())
        return on >= self.config.phase_mass * float(arate.sum())

    def read_now(self, state, samples: dict) -> bool:
        """A look between reads (7.): True when the units estimated since the last read hold
        at least half as many pages as the last read's (not a period that missed most of
        them), have most of their rates off the last hot set, in a history where a read's rates
        may show a phase change, and rank a new set about as hot and as large as the last one
        (not noise, nor a few units). The read then comes at once, a profiler period before
        the interval is due, and its decision judges the change as any other read's."""
        prev = self._prev_hot
        if prev is None or not len(prev) or not self._overlap:
            return False
        keys, rates, sizes = [], [], []
        for pid, s in samples.items():
            if pid not in state.pids or len(s.freq) != len(s.addr):
                continue  # a target not read yet, or counts without an estimate
            on = s.freq > 0
            keys.append(core_state.unit_keys(state.pids.index(pid), s.addr[on]))
            rates.append(s.freq[on].astype(np.float64))
            sizes.append(s.npages[on].astype(np.int64))
        akeys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        apages = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        if not len(akeys) or int(apages.sum()) < 0.5 * self._prev_accessed:
            return False
        arate = np.concatenate(rates)
        if self._irregular(akeys, arate) or self._mostly_on(akeys, arate, prev):
            return False
        # a new hot set about as hot and as large as the last one, not noise or a few units
        decay = float(getattr(state, "decay", 0.5))
        order, ref, _ = self._hot_order(arate / (1.0 - decay), np.arange(len(arate)),
                                        np.zeros(len(arate), bool))
        pages = min(int(apages[order].sum()), self._prev_hot_pages)
        return self._like_last(ref, pages)

    def _back(self, akeys: np.ndarray, arate: np.ndarray) -> bool:
        """Whether a read (accessed units' keys and rates) goes back to a hot set one of the
        last two phase changes left or brought, within ``thrash_window + 2`` reads of it: most
        of its accesses on it (a ping-pong; a program going through phases comes back to a
        set later, if ever)."""
        return any(self._mostly_on(akeys, arate, keys)
                   for left, brought, at in self._changed
                   if self._reads - at < self.config.thrash_window + 2
                   for keys in (left, brought))

    def _like_last(self, ref: float, pages: int) -> bool:
        """Whether a hot set of reference heat ``ref`` and ``pages`` pages is at least half as
        hot and half as large as the last one: only such a set can be a new phase."""
        return ref >= 0.5 * self._prev_ref and pages >= 0.5 * self._prev_hot_pages

    def _change_possible(self, akeys: np.ndarray, apages: np.ndarray, pj: float) -> bool:
        """A cheap bound before ranking by rate: whether a new hot set drawn from the units
        accessed now (sorted keys ``akeys``, pages ``apages``) could overlap the last one
        (``P`` units, ``prev_pages`` pages) by less than ``pj`` and still be at least half its
        pages. With ``D`` new units in it (at most ``X``, of ``Xp`` pages: those accessed now
        and not in the last set) and ``I`` kept ones of at most ``smax`` pages each, the
        overlap is I / (P + D) and the pages are at most Xp + I * smax: a change needs
        (prev_pages / 2 - Xp) / smax <= I < pj * (P + X). In a steady phase (almost every
        accessed unit in the last hot set) it cannot, and the ranking is skipped."""
        prev = self._prev_hot
        kept = _member_sorted(akeys, prev)
        new_pages = int(apages[~kept].sum(dtype=np.int64))
        need = 0.5 * self._prev_hot_pages - new_pages  # pages the kept units must bring
        if need <= 0:
            return True
        smax = int(apages[kept].max()) if kept.any() else 0
        if smax == 0:
            return False
        n_new = int(np.count_nonzero(~kept))
        return need / smax < pj * (len(prev) + n_new)

    @staticmethod
    def _gather(state, idx, full: bool):
        """Columns of units ``idx`` as local arrays (all units when ``full``)."""
        if full:
            heat = state.heat
            rate = state.rate if "rate" in state.a.dtype.names else None
            return (np.asarray(heat, np.float64), None if rate is None else rate.astype(np.float64),
                    state.node, state.npages.astype(np.int64), state.last_move.astype(np.int64))
        r = state.rows(idx)
        return (r["heat"].astype(np.float64), r["rate"].astype(np.float64), r["node"],
                r["npages"].astype(np.int64), r["last_move"].astype(np.int64))

    def decide(self, state, ctx: Context) -> Decision:
        """The decision looks at candidates, not at every unit, when the state keeps them
        (daemon/state.py: ``hotter_than``, ``touched``, ``coldest``): the units with heat at
        least ``min_heat`` (every unit that can be above the noise floor) and those accessed
        in this interval, plus as many of the fast node's coldest units as the exchanges can
        demote (the rate limit, or the promotions plus what the watermark demands). The result
        is the one ranking every unit would give; only the reference heat differs when more
        than ``1 - ref_mass`` of all heat is in units colder than ``min_heat`` (no hot set):
        it is then ``min_heat``."""
        c = self.config
        now = int(state.interval)
        decay = float(getattr(state, "decay", 0.5))
        incremental = c.min_heat > 0 and all(
            hasattr(state, m) for m in ("hotter_than", "in_candidates", "touched", "coldest",
                                        "rows", "keys"))
        if incremental:
            cand, rest = state.hotter_than(c.min_heat)
            touched = state.touched()
            U = union(cand, touched[~state.in_candidates(touched)])
        else:
            U, rest = np.arange(len(state)), 0.0
        keys_all = None

        def keys_of(local):
            nonlocal keys_all
            if incremental:
                return state.keys(U[local])
            if keys_all is None:
                keys_all = unit_keys(state)
            return keys_all[U[local]]

        heat, rate, node, npages, last_move = self._gather(state, U, not incremental)
        budget = max(0, int(ctx.fast_budget))
        cap_b_low = int(budget * c.low_watermark)
        cap_b_high = int(budget * c.high_watermark)
        node_cap = None if ctx.fast_capacity is None else max(0, int(ctx.fast_capacity))
        node_bound = node_cap is not None and node_cap < cap_b_high
        # the node limits promotions only: the policy never demotes to give other tenants room
        cap_low = cap_b_low if node_cap is None else min(cap_b_low, node_cap)
        cap_high = cap_b_high if node_cap is None else min(cap_b_high, node_cap)

        known = node >= 0
        fast = node == ctx.fast_node
        used = state.pages_on(ctx.fast_node) if incremental else int(npages[fast].sum())

        last_hot = self._prev_hot  # sorted keys of the last hot set (_classify replaces it)
        # 0. a phase change seen in this interval's rates: rank by them, not by decayed heat
        score = heat
        seen_now = False
        self._phase_check = None
        if rate is not None and self._rate_phase_change(keys_of, decay, rate, known, fast, npages,
                                                        cap_low):
            score = rate / (1.0 - decay) + 1e-6 * heat  # a steady rate's heat; heat breaks ties
            rest *= 1e-6
            seen_now = True

        # 1. the hot set: units above the noise floor, hottest first, fitting cap_low
        order, ref, floor = self._hot_order(score, np.flatnonzero(known & (score > 0)), fast, rest,
                                            npages if c.per_page else None)
        hot_pages = int(npages[order].sum())
        desired = fill_budget(order, npages, cap_low)
        desired_pages = hot_pages if len(desired) == len(order) else int(npages[desired].sum())
        by_index = _sorted_unique(desired, len(U))  # the hot set in U's order (keys ascending)
        must = used - cap_b_low if used > cap_b_high else 0
        max_moves = max(0, int(ctx.max_moves))

        if incremental:
            # the fast node's coldest units: enough that the exchanges never reach past them
            hs = U[by_index]
            promo_pages = int(npages[desired][~fast[desired]].sum())
            need = min(max_moves, must + promo_pages) + 1
            n = need + 64
            while True:
                pool, complete = state.coldest(ctx.fast_node, n)
                lm = state.last_move[pool].astype(np.int64)
                within_p = (lm != NEVER) & (now - lm <= c.thrash_window)
                free = ~within_p & ~_member_sorted(pool, hs)
                if seen_now:
                    free &= state.rate[pool] <= 0
                if complete or int(state.npages[pool][free].sum(dtype=np.int64)) >= need:
                    break
                n *= 4
            if len(pool):
                U, remap, added = union_remap(U, np.sort(pool))  # the pool comes coldest first
                order, desired, by_index = remap[order], remap[desired], remap[by_index]
                # the pool's new units gathered, the rest moved to their new places
                cols = []
                for was, got in zip((heat, rate, node, npages, last_move),
                                    self._gather(state, U[added], False)):
                    col = np.empty(len(U), was.dtype)
                    col[remap] = was
                    col[added] = got
                    cols.append(col)
                heat, rate, node, npages, last_move = cols
                known = node >= 0
                fast = node == ctx.fast_node
                score = heat if not seen_now else rate / (1.0 - decay) + 1e-6 * heat
            pool_local = np.searchsorted(U, pool)
            fast_idx = np.flatnonzero(fast) if complete else pool_local
        else:
            fast_idx = np.flatnonzero(fast)
        # coldest first, per page with per_page (as the pool is)
        per = npages if c.per_page else np.ones(len(U), np.int64)
        fast_idx = fast_idx[np.argsort(score[fast_idx] / per[fast_idx], kind="stable")]
        # stuck units (the kernel refused their last move: shared pages) neither go nor make
        # room: the planner drops their moves, and clips the promotions they were to make
        # room for. Looked up once, for the victims and the hot set's slow units
        fast_idx = fast_idx[~state.stuck(U[fast_idx])]

        moved_ever = last_move != NEVER
        recent = moved_ever & (now - last_move < c.min_residency)
        within = moved_ever & (now - last_move <= c.thrash_window)
        # the move-backs the throttle counts (6.): not those of units a young read moved, a
        # guess on first estimates that later reads correct
        counted = within
        if c.young_corrections and self._young_moves:
            counted = within & ~np.isin(last_move, np.fromiter(self._young_moves, np.int64))
        in_set = np.zeros(len(U), bool)
        in_set[desired] = True
        if rate is not None:
            # nor the demotion of a recent mover this read found idle and out of the hot set:
            # its accesses moved on (zstd's 2 MiB units, each hot for 3-4 reads in turn: each
            # retired one counted, the throttle held the next back 1-3 reads, bench sim zstd
            # at 10% 0.12% behind heat-classes). Units trading places are still accessed
            counted = counted & ~(fast & ~in_set & (rate <= 0))
        slow_wanted = desired[~fast[desired]]
        in_set[slow_wanted[state.stuck(U[slow_wanted])]] = False
        desired_score = score[desired]
        threshold = float(desired_score.min()) if len(desired) else None
        gap = c.gap_ratio * ref  # in a unit's heat (per page: over the candidate's pages)
        # a promotion that evicts a resident must be hot, not merely warm: at least
        # exchange_ratio times the median heat of the hot set's units of its size (a unit's
        # bar; the whole hot set's median for a size not in it). With THP on, a few dozen
        # 4 KiB units came up now and then, each accessed in no probe window; counted with the
        # 2 MiB units they put the median among the noise, and ten huge noise units at a time
        # traded places with ten others (bench live noise1000: 3-5k pages each way in 8 of 15
        # runs, each on a read with 4 KiB units among the 2 MiB ones; most of what it moved
        # after the first promotions)
        dsize = npages[desired]
        med = _median_by_size(desired_score, dsize, npages)
        bar = c.exchange_ratio * med
        # ...and a warm unit must have been before this interval's read: its heat then,
        # (heat - rate) / decay for a steady unit, at least the bar too. One estimate above the
        # bar is not a hot unit: with noise on every huge page a warm unit's estimate now and
        # then jumps 4-16x (a probe window hit by chance), and each jump exchanged it for a
        # resident (bench live noise1000: a 2 MiB exchange every interval or two). A unit cold
        # before (heat under min_heat) is not held back: a new hot unit evicts at once (holding
        # those back too cost bench sim 3 more losses, 4% on hotcold-phased); a phase change
        # ranks by rates instead. Nor is a unit whose heat now is at least ``one_read_ratio``
        # times that median: as hot as the hot set's units by one read, not a jump from the
        # noise (worked out from the live estimates in the docstring, 54 accesses/s jumping to
        # 700 against 1,500-1,700: a jumped noise unit's heat is about a quarter of the hot
        # units'); held back a read, a window sliding over memory (synth:scan) had each new
        # part promoted a read late, when the window had moved on
        steady = None
        # free room: a unit at the bar fills it; a unit under it (warm, not hot) only at
        # fill_ratio times the median heat of the hot set's units of its size. Worked out for
        # the units a promotion can take only (the hot set's, off the fast node)
        fc = np.flatnonzero(in_set & ~fast)
        fs, fbar = score[fc], bar[fc]
        fill_ok = np.zeros(len(U), bool)
        fill_ok[fc] = (fs >= fbar) | (fs >= c.fill_ratio * med[fc])
        young_test = False  # whether this read is young (in stats)
        if rate is not None and decay > 0:
            before = np.maximum(heat - rate, 0.0)  # the heat before this read, decayed
            prev = before / decay  # ...as the last read left it
            prev_d = prev[desired]
            if c.sustained_exchange and not seen_now:
                held = before >= c.min_heat
                if c.one_read_ratio > 0:
                    held &= score < c.one_read_ratio * med
                steady = np.where(held, np.minimum(score, prev), score)
            fnow = rate[fc] / (1.0 - decay)  # this read's rate as a steady unit's heat
            if c.sustained_fill:
                # free room on two reads too (4.): a unit at the bar by one estimate that
                # jumped waits a read; a warm unit is judged on the lowest of this read's rate,
                # its heat now and before, against the hot set's heat at the better of now and
                # before (a read that finds the hot units slowed lowers that, not the warm
                # unit's last estimates), and was above the noise floor before the read
                fb = prev[fc]
                hot_fill = (fs if steady is None else steady[fc]) >= fbar
                warm = np.minimum(fs, np.minimum(fnow, fb))
                fill_scale = _median_by_size(np.maximum(desired_score, prev_d), dsize, npages[fc])
                fill_ok[fc] = hot_fill | ((warm >= c.fill_ratio * fill_scale) & (fb >= floor))
            # young reads (4.): most of the hot set's pages estimated for the first time in
            # this read; in the read after it, a unit moves at the bar by this read's rate too
            first = int(dsize[prev_d < c.min_heat].sum())  # pages first estimated now
            young = bool(len(desired)) and 2 * first >= desired_pages
            after = self._young_at == self._reads - 1
            young_test = c.young_ratio > 0 and (young or after)
            if young_test:
                if young:
                    # at young_ratio times the median of its size or, with units of more than
                    # one size, per page at that share of the hot set's median heat per page
                    # (weighted by pages: the size that holds most of the hot set sets it)
                    ybar = med[fc]
                    if c.per_page and int(dsize.min()) != int(dsize.max()):
                        pp = desired_score / dsize
                        srt = np.argsort(pp, kind="stable")
                        cw = np.cumsum(dsize[srt])
                        wmed = float(pp[srt][np.searchsorted(cw, 0.5 * cw[-1])])
                        ybar = np.minimum(ybar, wmed * npages[fc])
                    fill_ok[fc] &= fs >= c.young_ratio * ybar
                else:
                    fill_ok[fc] &= np.minimum(fs, fnow) >= fbar
            if young:
                self._young_at = self._reads
                self._young_moves.append(now)
        # a unit the last decision promoted and still off the fast node (the daemon's move
        # deadline deferred it, or a limit clipped it) fills free room on that decision's
        # evidence: the read after a long move finds the program slowed and the next one the
        # unit's estimate risen again, and the two-read tests held the last 8 MB of a clean
        # hot set back two reads after its first move deferred them (bench live noise0: 88%
        # from the second to the fourth second; noise10: 75% from the third to the sixth, the
        # deferred 16 MB's move began 2.1 s after the cut one ended). With this rule, in five
        # deferrals of noise0 and noise100, the deferred units' move began at the next read,
        # 0.17-0.37 s after (a whole-run A/B of t95 says little: the runs that deferred are
        # those whose page copies were slow, docs/kernel-facts.md). Exchanges (a full node)
        # do not take this path: there a deferral waited 0-2 reads (fuller, phases)
        if self._chosen is not None and len(self._chosen) and len(fc):
            fill_ok[fc] |= _member_sorted(keys_of(fc), self._chosen)

        # 5. throttles: oversubscription limits exchanges, move-backs raise their margin
        # for a few intervals after a phase change the last phase's units are still warm: they
        # make the hot set look larger than the fast node, but they are on their way out, and
        # throttling the exchange that brings the new hot set in kept it at 55-93% for 10 s
        # (bench live fuller)
        after_change = self._since_change is not None and self._since_change < c.thrash_window
        holds = min(budget, node_cap if node_cap is not None else budget)
        # nor on a read whose accesses are mostly off the last hot set with the new one seen
        # in part ("weak", 7.): the set is moving (bench live fuller: that read's exchange cut
        # to a quarter, the new region in 4 intervals)
        oversubscribed = not after_change and hot_pages > holds and self._phase_check != "weak"
        # nor, there, the move-backs when the units at the exchange bar (hot, not warm) are
        # more than twice what the fast node holds: the units the change brought in on their
        # rates are then a small sample of the new phase's, and as its units warm the fast node
        # is chosen again among many; what came in goes out and some of what went out comes
        # back. Throttling that as thrashing kept 19-38% of the accesses on the fast node for 4
        # intervals where heat-classes had 37-100% (bench sim torch-mlp at 10%, 5% slower than
        # it; pagerank at 10% 3% slower). Twice the fast node or less (two sets taking turns)
        # stays throttled: a ping-pong. Warm units do not count: with THP and noise on every
        # huge unit all of them are above the noise floor, and counting them let the noise units
        # trade places after the first promotions (bench live noise1000: 2.0 times the hot set
        # moved, against 1.7)
        at_bar = order[score[order] >= bar[order]]
        resampled = after_change and int(npages[at_bar].sum()) > 2 * holds
        if self._throttle_until is not None and now > self._throttle_until:
            self._throttle_until = None
        if self._freeze_until is not None and now > self._freeze_until:
            self._freeze_until = None

        def plan(throttle: bool, max_moves: int, freeze: bool = False):
            # throttled: an exchange only for a clearly hotter unit (thrash_margin);
            # frozen: units moved within thrash_window stay where they are
            still = within if freeze else recent
            margin = c.thrash_margin if throttle else c.margin
            pmask = in_set & ~fast & ~still & fill_ok
            if must:
                pmask &= score >= bar  # warm units do not refill what the watermark demoted
            promo = order[pmask[order]]
            # victims: units free to move first, then those not in the hot set, coldest first
            group = (still[fast_idx].astype(np.int8) << 1) | in_set[fast_idx].astype(np.int8)
            fidx = fast_idx[np.argsort(group, kind="stable")]
            n_room = int(np.count_nonzero(~still[fidx]))
            if used <= budget:
                fidx = fidx[:n_room]  # hysteresis holds unless the budget is already exceeded
            # throttled: both sides judged on two reads, the candidate on the lower of its
            # estimates (now and before this read), the victim on the higher. With noise on
            # every huge unit the coldest residents by one read are those whose estimate fell
            # in it, and the hottest candidates those whose estimate jumped
            sure = throttle and steady is not None
            # (per page with per_page, as the hot set's order and the gap)
            p, d = plan_moves(
                npages, promo, (steady if sure else score)[promo] / per[promo], fidx,
                (np.maximum(score[fidx], prev[fidx]) if sure else score[fidx]) / per[fidx],
                used=used, cap=cap_high, must=must, max_moves=max_moves,
                margin=margin, gap=gap / per[promo], bar=bar[promo], n_room=n_room,
                bar_rank=(score if steady is None else steady)[promo],
            )
            # a move-back: a unit moved within thrash_window moved again
            back = np.concatenate([p[counted[p]], d[counted[d]]])
            pages = int(npages[p].sum()) + int(npages[d].sum())
            return p, d, promo, pages, int(npages[back].sum())

        free_room = max(0, cap_high - used)
        throttled_max = min(max_moves, max(int(max_moves * c.throttle_scale), free_room))
        reasons = []
        if oversubscribed:
            reasons.append("oversubscribed")
        # 6. access pattern from hot-set overlap (before the plan: a phase change is acted on)
        keys = keys_of(by_index) if incremental else np.sort(keys_of(desired))
        # a new hot set is a phase change only when it is about as hot and as large as the
        # last one: a read that missed most accesses (a loaded host) leaves a few lukewarm
        # units on top, and acting on them as a phase change would bypass the throttle
        pattern, jaccard, change = self._classify(
            keys, self._like_last(ref, desired_pages))
        if seen_now and not change:
            change = True
            pattern = "phased"
        p, d, promo, pages, backs = plan(False, max_moves)
        frac = backs / pages if pages else 0.0
        if change:
            # the hot set moved: moving back what the last phase brought is no thrashing,
            # and the new hot set comes in full, now
            frac = 0.0
            self._throttle_until = self._freeze_until = None
        self._thrash = 0.5 * self._thrash + 0.5 * frac
        was_throttled = self._throttle_until is not None
        thrashing = frac > c.thrash_ratio or self._thrash > c.thrash_ratio
        if not change and not resampled and thrashing:
            self._throttle_until = now + c.thrash_window
        if self._throttle_until is not None:
            reasons.append("move-backs")
        if change and reasons:
            # only "oversubscribed" (a change ends the move-back throttle and the freeze), and
            # in the interval of a phase change it does not cut the moves either (6.): the last
            # phase's units make the hot set look larger than the fast node, but they are on
            # their way out (bench live fuller and phases: the exchange cut to a quarter, the
            # new region in only 3-4 reads later). The throttle's record counts the plan
            reasons.remove("oversubscribed")
            self._thrash_kept = 0.5 * self._thrash_kept + 0.5 * (backs / pages if pages else 0.0)
        elif "move-backs" in reasons or (reasons and throttled_max < max_moves):
            freeze = self._freeze_until is not None
            p, d, promo, pages, backs = plan("move-backs" in reasons, throttled_max, freeze)
            # the move-backs of the plans made under the throttle (a moving average)
            self._thrash_kept = 0.5 * self._thrash_kept + 0.5 * (backs / pages if pages else 0.0)
            if not freeze and was_throttled and self._thrash_kept > c.freeze_ratio:
                # move-backs even with thrash_margin, throttled since an earlier interval:
                # the same units keep trading places; freeze recent movers for thrash_window
                self._freeze_until = now + c.thrash_window
                p, d, promo, pages, backs = plan(True, throttled_max, True)
        if self._freeze_until is not None:
            reasons.append("frozen")

        # which limit kept desired units off the fast node
        left = np.setdiff1d(promo, p, assume_unique=True)
        off = order[~fast[order]]  # hot units still off the fast node after this decision
        off = np.setdiff1d(off, p, assume_unique=True)
        limit = None
        if len(off):
            up, down = int(npages[p].sum()), int(npages[d].sum())
            moved, after = up + down, used + up - down
            cap_moves = throttled_max if reasons else max_moves
            if len(left) and moved + int(npages[left].min()) > cap_moves:
                limit = "rate"
            elif after + int(npages[off].min()) > cap_low:
                limit = "node" if node_bound else "budget"
            # else room was left: the policy's own rules held them (warm units waiting for a
            # second read, hysteresis), no limit

        self._prev_hot_pages = desired_pages
        self._prev_ref = ref
        if rate is not None:
            acc = np.flatnonzero(known & (rate > 0))
            self._prev_accessed = int(npages[acc].sum())
            self._reads += 1
            if change and last_hot is not None and len(last_hot):  # the sets it left and brought
                self._changed.append((last_hot, keys, self._reads))
                self._held = 0
            elif (self._changed and last_hot is not None and self._prev_accessed
                  and self._phase_check not in ("weak", "few accessed")):
                # reads in a row since the change with most of their accesses on the set it
                # brought or the last hot set (the hot set by decayed heat lags a change by a
                # read or two); a read that cannot tell (missed most units, or saw a new set
                # in part) does not count
                akeys, r = keys_of(acc), rate[acc]
                on_set = (_member_sorted(akeys, last_hot)
                          | _member_sorted(akeys, self._changed[-1][1]))
                on = float(r[on_set].sum())
                self._held = self._held + 1 if on >= c.phase_mass * float(r.sum()) else 0
        scale = PHASE_CHANGE_SCALE if change else INTERVAL_SCALE[pattern]
        if reasons:
            scale = max(scale, THROTTLED_MIN_SCALE)

        promoted = int(npages[p].sum())
        demoted = int(npages[d].sum())
        self._chosen = np.sort(keys_of(p)) if len(p) else None
        stats = {
            "pattern": pattern,
            "phase_change": change,
            "ranked_by": "rate" if seen_now else "heat",
            "phase_check": self._phase_check,
            "jaccard": jaccard,
            "interval_scale": scale,
            "throttled": bool(reasons),
            "throttle_reasons": reasons,
            "limit": limit,
            "hot_threshold": threshold,
            "reference_heat": round(ref, 3),
            "noise_floor": round(floor, 3),
            "hot_pages": hot_pages,
            "hot_set_pages": desired_pages,
            "fast_capacity": node_cap,
            "fast_used": used,
            "fast_after": used + promoted - demoted,
            "promote_pages": promoted,
            "demote_pages": demoted,
            "exchange": bool(promoted and demoted and not must),
            "move_back_pages": backs,
            # promoted pages under the exchange bar: warm units filling free room
            "warm_promote_pages": int(npages[p[score[p] < bar[p]]].sum()),
            "young_read": bool(young_test),
            "thrash": round(self._thrash, 4),
            "candidates": int(len(U)),
        }
        # a new hot set seen in part (its units' rates not all estimated yet): read again soon
        return Decision(promote=U[p].astype(np.int64), demote=U[d].astype(np.int64), stats=stats,
                        read_soon=self._phase_check == "weak")

    def _classify(self, keys: np.ndarray, credible: bool = True) -> tuple[str, float | None, bool]:
        """Update the overlap history with this hot set; return (pattern, jaccard, change).
        ``credible``: whether a low overlap may be taken as a phase change (the new hot set
        about as hot and as large as the last one)."""
        c = self.config
        prev, self._prev_hot = self._prev_hot, keys
        if prev is None:
            return "warmup", None, False
        j = _jaccard_sorted(keys, prev)
        hist = self._overlap
        change = (credible and bool(hist) and float(np.mean(hist)) >= c.regular_jaccard
                  and j < c.phase_jaccard)
        hist.append(j)
        if change:
            self._since_change = 0
        elif self._since_change is not None:
            self._since_change += 1
            if self._since_change >= c.history:
                self._since_change = None
        if change or self._since_change is not None:
            return "phased", j, change
        if len(hist) < 2:
            return "warmup", j, False
        if float(np.mean(hist)) >= c.regular_jaccard:
            return "stable", j, False
        return "irregular", j, False
