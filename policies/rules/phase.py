"""Rule 9, phase change, and the access pattern: when the hot set moves, act in the interval
it is seen.

Successive hot sets are compared by overlap (Jaccard) to classify the access pattern
(``warmup``, ``stable``, ``phased``, ``irregular``) and suggest an interval scale (in the
stats only: the daemon keeps its interval). A phase change is a new hot set overlapping the
last one by less than ``phase_jaccard`` after a regular run, about as hot (reference heat) and
as large as it; a few lukewarm units left on top after missed reads are not one.

A change is acted on in the interval it is seen: when the units accessed in this interval
form such a set by their rates alone, with under ``phase_mass`` of the read's accesses on the
last hot set, the interval ranks by rates rather than by decayed heat, which would keep the
old set an interval or two longer. A read that probed only some of the hot units overlaps the
last set little, but most of its accesses are still on it: not a change. Nor is a read that
found under half as many pages accessed as the last one (it missed most of the accesses), nor
one in which ``phase_stay`` of the last hot set's pages are in units still at their rate (not
:func:`leaving`): new units came on top of a set that is still read ("staying"), as a pass
over a data set a few reads long beside the parameters a training loop reads all along.
After an earlier change the run need not be regular: a change by rates is taken once
``held_reads`` reads in a row since the last change had most of their accesses on the set it
brought (or the last hot set), unless the read goes back to a set one of the last two changes
left or brought within ``thrash_window + 2`` reads (a ping-pong).

With ``phase_core`` the rate tests and their history follow the hot set's core: its units at
the exchange bar, however many the capacity holds (:func:`core_units`). Warm units filling the
rest of the capacity, and which half of a hot region twice the capacity's size a read ranks
first, change from read to read among units of about the same heat: counted, a steady phase
looked irregular and its end was acted on a read late, by decayed heat. When the core held but
the whole hot set did not, a change by rates is ruled out only after another change that has
not held (``held_reads``) or going back to a set of the last two (a ping-pong).

A change's exchange may take several reads when the rate limit or the measured throughput
binds. With ``follow_change``, for ``thrash_window`` reads after it, promoting a unit the change
brought or demoting one it left carries that exchange on and is no move-back for the throttle
(policies/rules/throttle.py): counted, the units of a phase that comes back, demoted a few
intervals before when it left, started the throttle at the read after the change and the rest
of the region waited. Moves the other way still count.

A read whose accesses are mostly off the last hot set but whose new set is too weak so far
("weak") asks for the next read at the profiler's next period end (``Decision.read_soon``);
between reads (``read_now``, with ``look_between_reads``) the policy asks for the read at once
when the rates counted so far show a change.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from pagetier.policies.rules.arrays import jaccard_sorted, member_sorted
from pagetier.policies.rules.noise import hot_order
from pagetier.policies.rules.planner import fill_budget
from pagetier.policies.rules.view import PageView

# Suggested interval_scale per access pattern, shown in stats (the daemon keeps its interval).
INTERVAL_SCALE = {
    "warmup": 1.0,  # too little history to say
    "stable": 2.0,  # the hot set hardly changes: sample less often
    "phased": 1.0,  # stable phases with sudden changes (0.5 on the interval of a change)
    "irregular": 1.5,  # the hot set keeps changing: longer intervals average more accesses
}
PHASE_CHANGE_SCALE = 0.5  # react quickly right after a phase change
THROTTLED_MIN_SCALE = 1.5  # when throttled, at least this


def interval_scale(pattern: str, change: bool, throttled: bool) -> float:
    """The interval scale suggested for an access pattern (in the stats)."""
    scale = PHASE_CHANGE_SCALE if change else INTERVAL_SCALE[pattern]
    if throttled:
        scale = max(scale, THROTTLED_MIN_SCALE)
    return scale


LEAVING = 0.5  # a unit whose rate fell under this share of what its heat stood for is leaving


def leaving(rate: np.ndarray, heat: np.ndarray, decay: float) -> np.ndarray:
    """Which units are leaving: this read's rate under ``LEAVING`` of the steady rate their
    heat after the last read stood for (heat is this read's rate plus ``decay`` times it)."""
    prev = np.maximum(heat - rate, 0.0) / decay
    return rate < LEAVING * prev * (1.0 - decay)


def core_units(order: np.ndarray, score: np.ndarray, bar: np.ndarray) -> np.ndarray:
    """The hot units whose pattern the phase detector follows (``phase_core``): those of
    ``order`` at the exchange bar, however many the capacity holds. Warm units filling the
    rest of the capacity, and a hot region larger than the capacity, change from read to read
    among units of about the same heat: counted, they make a steady phase look irregular.
    The test runs over the whole arrays in their order and ``order`` gathers its one byte a
    unit: cheaper than gathering both heats at ``order``'s scattered positions."""
    return order[(score >= bar)[order]]


class PhaseWatch:
    """The phase detector's memory, kept on the policy: the last hot set (sorted keys of
    ``(target << 48) | (addr >> 12)``, so it survives units appearing and disappearing), its
    size and reference heat, the overlap history, and the last two changes."""

    def _init_phase(self) -> None:
        c = self.config
        self._prev_hot: np.ndarray | None = None  # sorted keys of the last hot set's core
        self._prev_set: np.ndarray | None = None  # sorted keys of the last hot set
        self._phase_check = None  # which test ruled out a phase change by rates, in stats
        self._prev_hot_pages = 0
        self._prev_ref = 0.0  # the last reference heat
        self._prev_accessed = 0  # pages of the units with a rate in the last read
        self._overlap: deque[float] = deque(maxlen=c.history)
        self._core_overlap: deque[float] = deque(maxlen=c.history)  # of the cores (phase_core)
        self._history_means: dict = {}  # each history's last contents and mean (_history_mean)
        self._since_change = None  # calls since the last phase change, None if none seen
        # the last two phase changes: the hot sets each left and brought (sorted keys), and
        # the read it came at
        self._changed: deque[tuple[np.ndarray, np.ndarray, int]] = deque(maxlen=2)
        self._reads = 0  # reads with rates so far
        self._held = 0  # reads in a row since the last change on the last hot set

    @property
    def looks_between_reads(self) -> bool:
        return self.config.look_between_reads

    def _rate_phase_change(self, keys_of, decay, rate, known, fast, npages, cap, heat=None):
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
        kept = member_sorted(akeys, prev)  # asked once for both tests
        if not self._change_possible(kept, npages[acc], c.phase_jaccard):
            return no("overlap")
        # most of this read's accesses on the last hot set: the same phase, read in part. With
        # noise on every huge unit a read that probed few of the hot units ranks noise units
        # on top, and acting on it as a phase change would trade noise units for noise units
        if self._mostly_on(akeys, rate[acc], prev, self._prev_set, on_keys=kept):
            return no("mass")
        if self._staying(keys_of, known, rate, heat, npages, decay, prev):
            return no("staying")
        order, now_ref, _ = hot_order(rate / (1.0 - decay), acc, fast, c)
        now_set = fill_budget(order, npages, cap)
        if not self._like_last(now_ref, int(npages[now_set].sum())):
            return no("weak")  # noise, or a short or partial read that missed the hot set
        keys = np.sort(keys_of(now_set))
        if jaccard_sorted(keys, prev) >= c.phase_jaccard:
            return no("overlap")
        return True

    def _staying(self, keys_of, known, rate, heat, npages, decay, prev) -> bool:
        """Whether ``phase_stay`` of the last hot set's pages (sorted keys ``prev``) are in
        units still at their rate (not :func:`leaving`): the new units came on top of that set,
        and the read is no phase change (bench sim torch-mlp: a pass over the data set, a few
        reads long, took the place of the parameters, which were read all along)."""
        stay = self.config.phase_stay
        if stay <= 0 or heat is None or decay <= 0:
            return False
        allk = np.flatnonzero(known)
        mine = allk[member_sorted(keys_of(allk), prev)]
        if not len(mine):
            return False
        held = ~leaving(rate[mine], heat[mine], decay)
        return int(npages[mine[held]].sum()) >= stay * int(npages[mine].sum())

    def _irregular(self, akeys: np.ndarray, arate: np.ndarray) -> bool:
        """Whether the history rules out a phase change by a read's rates (accessed units' keys
        and rates): an irregular run, and no phase change before it, or the hot set since the
        last one has not held, or the read goes back to a set of the last two."""
        c = self.config
        unsettled = self._held < c.held_reads or self._back(akeys, arate)
        if self._history_mean("_core_overlap") < c.regular_jaccard:
            return not self._changed or unsettled
        # the hot units held (phase_core) while the hot set around them changed from read to
        # read (warm units filling the capacity, or a hot region larger than it): a change is
        # ruled out only after another one that has not held, or going back to it
        return self._history_mean("_overlap") < c.regular_jaccard and bool(self._changed) \
            and unsettled

    def _history_mean(self, name: str) -> float:
        """The mean of the overlap history ``name`` (``_overlap`` or ``_core_overlap``), taken
        again only when the history changed: the looks between reads ask for it at every period
        end, the history changes once a read."""
        hist = tuple(getattr(self, name))
        got = self._history_means.get(name)
        if got is None or got[0] != hist:
            got = self._history_means[name] = (hist, float(np.mean(hist)))
        return got[1]

    def _mostly_on(self, akeys: np.ndarray, arate: np.ndarray, keys: np.ndarray,
                   also: np.ndarray | None = None, on_keys: np.ndarray | None = None) -> bool:
        """Whether ``phase_mass`` of the rates ``arate`` (of units ``akeys``) is on the units
        ``keys`` (sorted), or on ``also`` (sorted; None: none). ``on_keys``: which of ``akeys``
        are in ``keys``, when the caller has asked already."""
        on_keys = member_sorted(akeys, keys) if on_keys is None else on_keys.copy()
        if also is not None and also is not keys:
            on_keys |= member_sorted(akeys, also)
        on = float(arate[on_keys].sum())
        return on >= self.config.phase_mass * float(arate.sum())

    def read_now(self, state, samples: dict) -> bool:
        """A look between reads: True when the units estimated since the last read hold
        at least half as many pages as the last read's (not a period that missed most of
        them), have most of their rates off the last hot set, in a history where a read's rates
        may show a phase change, and rank a new set about as hot and as large as the last one
        (not noise, nor a few units). The read then comes at once, a profiler period before
        the interval is due, and its decision judges the change as any other read's."""
        prev = self._prev_hot
        if prev is None or not len(prev) or not self._overlap:
            return False
        view = PageView(state, 0.0)
        keys, rates, sizes = [], [], []
        for pid, s in samples.items():
            if len(s.freq) != len(s.addr):
                continue  # counts without an estimate
            on = s.freq > 0
            k = view.sample_keys(pid, s.addr[on])
            if k is None:
                continue  # a target not read yet
            keys.append(k)
            rates.append(s.freq[on].astype(np.float64))
            sizes.append(s.npages[on].astype(np.int64))
        akeys = np.concatenate(keys) if keys else np.zeros(0, np.uint64)
        apages = np.concatenate(sizes) if sizes else np.zeros(0, np.int64)
        if not len(akeys) or int(apages.sum()) < 0.5 * self._prev_accessed:
            return False
        arate = np.concatenate(rates)
        if self._irregular(akeys, arate) or self._mostly_on(akeys, arate, prev, self._prev_set):
            return False
        # a new hot set about as hot and as large as the last one, not noise or a few units
        order, ref, _ = hot_order(arate / (1.0 - view.decay), np.arange(len(arate)),
                                  np.zeros(len(arate), bool), self.config)
        pages = min(int(apages[order].sum()), self._prev_hot_pages)
        return self._like_last(ref, pages)

    def _change_units(self, u, fast: np.ndarray) -> np.ndarray:
        """Which of the decision's units ``u`` (``fast``: on the fast node) would finish the
        last phase change's exchange, within ``thrash_window`` reads of it (``follow_change``):
        units it brought still off the fast node, and units it left still on it. Moving them is
        no move-back: the rate limit may spread that exchange over several reads, and counted,
        the units of a phase that comes back (demoted within ``thrash_window`` when it left)
        start the throttle in the read after the change while the rest of its region waits.
        Moves the other way (a ping-pong) still count."""
        if not self._changed or self._reads - self._changed[-1][2] >= self.config.thrash_window:
            return np.zeros(len(u), bool)
        left, brought, _ = self._changed[-1]
        keys = u.keys(np.arange(len(u)))
        return np.where(fast, member_sorted(keys, left), member_sorted(keys, brought))

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

    def _change_possible(self, kept: np.ndarray, apages: np.ndarray, pj: float) -> bool:
        """A cheap bound before ranking by rate: whether a new hot set drawn from the units
        accessed now (pages ``apages``; ``kept``: which are in the last hot set) could overlap
        the last one (``P`` units, ``prev_pages`` pages) by less than ``pj`` and still be at
        least half its pages. With ``D`` new units in it (at most ``X``, of ``Xp`` pages: those accessed now
        and not in the last set) and ``I`` kept ones of at most ``smax`` pages each, the
        overlap is I / (P + D) and the pages are at most Xp + I * smax: a change needs
        (prev_pages / 2 - Xp) / smax <= I < pj * (P + X). In a steady phase (almost every
        accessed unit in the last hot set) it cannot, and the ranking is skipped."""
        prev = self._prev_hot
        new_pages = int(apages[~kept].sum(dtype=np.int64))
        need = 0.5 * self._prev_hot_pages - new_pages  # pages the kept units must bring
        if need <= 0:
            return True
        smax = int(apages[kept].max()) if kept.any() else 0
        if smax == 0:
            return False
        n_new = int(np.count_nonzero(~kept))
        return need / smax < pj * (len(prev) + n_new)

    def _classify(self, keys: np.ndarray, credible: bool = True,
                  core: np.ndarray | None = None) -> tuple[str, float | None, bool]:
        """Update the overlap histories with this hot set (sorted keys ``keys``; ``core``: its
        hot units, :func:`core_units`, None: all of it); return (pattern, jaccard, change).
        ``credible``: whether a low overlap may be taken as a phase change (the new hot set
        about as hot and as large as the last one)."""
        c = self.config
        core = keys if core is None else core
        prev, self._prev_set = self._prev_set, keys
        prev_core, self._prev_hot = self._prev_hot, core
        if prev is None:
            return "warmup", None, False
        j = jaccard_sorted(keys, prev)
        hist = self._overlap
        change = (credible and bool(hist) and self._history_mean("_overlap") >= c.regular_jaccard
                  and j < c.phase_jaccard)
        hist.append(j)
        self._core_overlap.append(j if core is keys else jaccard_sorted(core, prev_core))
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
        if self._history_mean("_overlap") >= c.regular_jaccard:
            return "stable", j, False
        return "irregular", j, False

    def _note_read(self, u, known, change: bool, last_hot, keys, ref: float, pages: int,
                   last_set=None) -> None:
        """Remember this read for the next: the hot set's size and reference heat, the pages
        accessed, the change it brought, and whether it held the last change's set."""
        c = self.config
        self._prev_hot_pages = pages
        self._prev_ref = ref
        if u.rate is None:
            return
        acc = np.flatnonzero(known & (u.rate > 0))
        self._prev_accessed = int(u.npages[acc].sum())
        self._reads += 1
        if change and last_hot is not None and len(last_hot):  # the sets it left and brought
            self._changed.append((last_hot, keys, self._reads))
            self._held = 0
        elif (self._changed and last_hot is not None and self._prev_accessed
              and self._phase_check not in ("weak", "few accessed")):
            # reads in a row since the change with most of their accesses on the set it
            # brought or the last hot set (the hot set by decayed heat lags a change by a
            # read or two); a read that cannot tell (missed most units, or saw a new set in
            # part) does not count
            akeys, r = u.keys(acc), u.rate[acc]
            on_set = (member_sorted(akeys, last_hot if last_set is None else last_set)
                      | member_sorted(akeys, self._changed[-1][1]))
            on = float(r[on_set].sum())
            self._held = self._held + 1 if on >= c.phase_mass * float(r.sum()) else 0
