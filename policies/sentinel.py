"""Tensor-aware placement after Sentinel (Ren et al., "Sentinel: Efficient Tensor Migration and
Allocation on Heterogeneous Memory Systems for Deep Learning", HPCA'21).

The application describes itself through pagetier/annotate.py (pagetier/torch_hooks.py does it
for a PyTorch model): its objects (``register(name, addr, size)``: parameters, gradients, large
activations) and its layer boundaries (``add_layer``), and it brackets one training iteration
with ``start_profile()`` / ``end_profile()``.

1. Profiling. While a profile is open the daemon reads the target's access counts at every
   ``add_layer`` (``wants_samples``) and hands them to ``observe``: the counts between two
   boundaries belong to the layer that just ran. An object is *live* in a layer when any of its
   pages was accessed within that layer's interval. The layer sequence of the profiled
   iteration (its *period*) is replayed cyclically afterwards.
2. Grouping. Small (``small_object_bytes``) short-lived (live in at most
   ``short_lived_layers`` layers) objects are grouped and kept on the fast node as one set:
   moving them layer by layer would cost more than they take (Sentinel gives them a fast-memory
   pool of their own).
3. At each layer boundary (each ``add_layer`` once the profile is done, ``annotate`` returns
   True and the daemon decides at once) every object's distance to its next use is known: the
   objects needed within the next ``lookahead`` layers are prefetched, nearest first, within
   the budget; objects not needed within them are the first to be demoted when room is needed
   (furthest next use first), then unannotated memory by heat. Memory no object covers is
   ranked by heat below the prefetched objects, as the heuristic would.
4. Fallback. Until a target has a profile (or when an application annotates nothing) the
   decision is the heuristic's (policies/heuristic.py), unchanged: no annotations, no change.

Stats (Decision.stats): ``mode`` (fallback / profiling / active), ``layer`` and ``position``
in the period, ``boundaries`` seen, ``objects`` registered and ``profiled``, ``grouped``,
``objects_moved``, ``prefetch_pages`` and ``demote_pages`` of annotated memory this decision.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from pagetier.policies.base import Annotation, Context, Decision, Policy, register
from pagetier.policies.heuristic import Heuristic, fill_budget, plan_moves
from pagetier.policies.rules.config import check_shared, option_error
from pagetier.core.units import PAGE_SIZE

log = logging.getLogger("pagetier.policies")

_INF = np.iinfo(np.int64).max // 4
MAX_OBJECTS = 1 << 16  # per process: more registrations are ignored (the daemon's memory)


@dataclass
class _Target:
    """One annotated process: its objects, the profile being taken and the one in use."""

    objects: dict = field(default_factory=dict)  # name -> (addr, size)
    profiling: bool = False
    seq: list = field(default_factory=list)  # profiling: layer ids in order
    seen: list = field(default_factory=list)  # profiling: per position, names accessed
    layers: list = field(default_factory=list)  # the profile: layer ids of one period
    live: dict = field(default_factory=dict)  # the profile: name -> np.array of positions
    grouped: set = field(default_factory=set)  # names kept fast as a group
    pos: int = -1  # current position in the period, -1: not started
    boundaries: int = 0  # add_layer events matched against the profile
    unknown_layers: set = field(default_factory=set)
    overflow: bool = False  # registrations past MAX_OBJECTS were ignored

    @property
    def active(self) -> bool:
        return bool(self.layers)


def accessed_objects(objects: dict, sample) -> set:
    """Names of ``objects`` (name -> (addr, size)) with a page accessed in ``sample``."""
    if not objects or sample is None or not len(sample.addr):
        return set()
    acc = np.asarray(sample.count) > 0
    start = np.asarray(sample.addr, np.uint64)[acc]
    if not len(start):
        return set()
    order = np.argsort(start, kind="stable")
    start = start[order]
    end = start + np.asarray(sample.npages, np.uint64)[acc][order] * np.uint64(PAGE_SIZE)
    names = list(objects)
    lo = np.array([objects[n][0] for n in names], np.uint64)
    hi = lo + np.array([objects[n][1] for n in names], np.uint64)
    i = np.searchsorted(end, lo, side="right")  # the first accessed unit ending after lo
    hit = (i < len(start)) & (start[np.minimum(i, len(start) - 1)] < hi)
    return {n for n, h in zip(names, hit) if h}


@register("sentinel")
class Sentinel(Policy):
    """Layer-aware prefetch and demotion of annotated objects; the heuristic otherwise."""

    accepts_annotations = True

    @dataclass
    class Config:
        lookahead: int = 2  # layers ahead whose objects are prefetched
        high_watermark: float = 1.0  # fraction of the budget: above it, demote...
        low_watermark: float = 0.95  # ...down to this; the wanted set is sized to it (as heuristic)
        small_object_bytes: int = 1 << 20  # objects at most this big and...
        short_lived_layers: int = 1  # ...live in at most this many layers are kept fast together
        min_heat: float = 1.0  # unannotated memory colder than this is not promoted

        def check(self):
            bad = option_error("sentinel", self)
            if self.lookahead < 1:
                bad("lookahead", "must be >= 1")
            check_shared(self, bad)
            if self.small_object_bytes < 0:
                bad("small_object_bytes", "must be >= 0")
            if self.short_lived_layers < 0:
                bad("short_lived_layers", "must be >= 0")

    def __init__(self, config=None):
        super().__init__(config)
        c = self.config
        self.fallback = Heuristic(Heuristic.Config(high_watermark=c.high_watermark,
                                                   low_watermark=c.low_watermark,
                                                   min_heat=c.min_heat))
        self.targets: dict[int, _Target] = {}

    def take_over(self, old: Policy) -> None:
        """A reload with new sentinel options keeps what the applications said (registered
        objects, profiled layers): they annotate once and would not say it again."""
        if isinstance(old, Sentinel):
            self.targets = old.targets

    # ------------------------------------------------------------------ events
    def annotate(self, ev: Annotation) -> bool:
        t = self.targets.setdefault(ev.pid, _Target())
        if ev.op == "register":
            if len(t.objects) >= MAX_OBJECTS and ev.name not in t.objects:
                if not t.overflow:
                    t.overflow = True
                    log.warning("sentinel: pid %d registered over %d objects: the rest are ignored",
                                ev.pid, MAX_OBJECTS)
                return False
            t.objects[ev.name] = (int(ev.addr), int(ev.size))
        elif ev.op == "unregister":
            t.objects.pop(ev.name, None)
        elif ev.op == "start_profile":
            t.profiling, t.seq, t.seen = True, [], [set()]
        elif ev.op == "end_profile":
            if t.profiling:
                self._finish_profile(ev.pid, t)
        elif ev.op == "add_layer":
            if t.profiling:
                if t.seq:  # the prologue (before the first layer) counts as the first layer
                    t.seen.append(set())
                t.seq.append(ev.layer)
                return False
            if t.active:
                return self._advance(t, ev.layer)
        return False

    def wants_samples(self, pid: int) -> bool:
        t = self.targets.get(pid)
        return t is not None and t.profiling

    def observe(self, pid: int, sample) -> None:
        t = self.targets.get(pid)
        if t is not None and t.profiling:
            t.seen[-1] |= accessed_objects(t.objects, sample)

    def _finish_profile(self, pid: int, t: _Target) -> None:
        c = self.config
        t.profiling = False
        if not t.seq:
            log.warning("sentinel: pid %d: profile without add_layer: ignored", pid)
            return
        live: dict[str, list[int]] = {}
        for p, names in enumerate(t.seen):
            for n in names:
                live.setdefault(n, []).append(p)
        t.layers, t.pos, t.boundaries = list(t.seq), len(t.seq) - 1, 0
        t.live = {n: np.array(ps, np.int64) for n, ps in live.items()}
        t.grouped = {n for n, ps in t.live.items()
                     if n in t.objects and t.objects[n][1] <= c.small_object_bytes
                     and len(ps) <= c.short_lived_layers}
        t.seq, t.seen = [], []
        log.info("sentinel: pid %d: profile of %d layers, %d of %d objects seen live, %d grouped",
                 pid, len(t.layers), len(t.live), len(t.objects), len(t.grouped))

    @staticmethod
    def _advance(t: _Target, layer) -> bool:
        """Follow the period to ``layer``: the next position naming it (normally the next one)."""
        n = len(t.layers)
        for step in range(1, n + 1):
            j = (t.pos + step) % n
            if t.layers[j] == layer:
                t.pos = j
                t.boundaries += 1
                return True
        if layer not in t.unknown_layers:
            t.unknown_layers.add(layer)
            log.info("sentinel: layer %r is not in the profile: ignored", layer)
        return False

    # ------------------------------------------------------------------ decisions
    def mode(self) -> str:
        if any(t.active for t in self.targets.values()):
            return "active"
        if any(t.profiling for t in self.targets.values()):
            return "profiling"
        return "fallback"

    def distances(self, state) -> tuple[np.ndarray, np.ndarray]:
        """Per unit: layers until an object covering it is next used (_INF: none profiled), and
        the index of such an object in ``self._names`` (-1: none)."""
        n = len(state)
        dist = np.full(n, _INF, np.int64)
        obj = np.full(n, -1, np.int64)
        self._names = []
        if not n:
            return dist, obj
        tgt = state.target
        start = state.addr
        end = start + state.npages.astype(np.uint64) * np.uint64(PAGE_SIZE)
        for pid, t in self.targets.items():
            if not t.active or pid not in state.pids or t.pos < 0:
                continue
            ti = state.pids.index(pid)
            a, b = np.searchsorted(tgt, ti, "left"), np.searchsorted(tgt, ti, "right")
            if a == b:
                continue
            period = len(t.layers)
            for name, (addr, size) in t.objects.items():
                ps = t.live.get(name)
                if ps is None:
                    continue
                d = 0 if name in t.grouped else int(((ps - t.pos) % period).min())
                lo = a + int(np.searchsorted(end[a:b], np.uint64(addr), "right"))
                hi = a + int(np.searchsorted(start[a:b], np.uint64(addr + size), "left"))
                if lo >= hi:
                    continue
                self._names.append(name)
                closer = d < dist[lo:hi]
                dist[lo:hi][closer] = d
                obj[lo:hi][closer] = len(self._names) - 1
        return dist, obj

    def decide(self, state, ctx: Context) -> Decision:
        mode = self.mode()
        base = {
            "mode": mode,
            "objects": sum(len(t.objects) for t in self.targets.values()),
            "profiled": sum(len(t.live) for t in self.targets.values()),
            "grouped": sum(len(t.grouped) for t in self.targets.values()),
            "boundaries": sum(t.boundaries for t in self.targets.values()),
        }
        if mode != "active":
            dec = self.fallback.decide(state, ctx)
            dec.stats = {**base, **dec.stats}
            return dec
        c = self.config
        k = c.lookahead
        npages = state.npages.astype(np.int64)
        heat = state.heat.astype(np.float64)
        node = state.node
        budget = max(0, int(ctx.fast_budget))
        cap_low, cap_high = int(budget * c.low_watermark), int(budget * c.high_watermark)
        fast = node == ctx.fast_node
        used = int(npages[fast].sum())
        dist, obj = self.distances(state)
        annotated = dist < _INF
        period = max(len(t.layers) for t in self.targets.values() if t.active)

        # how much each unit is wanted on the fast node: objects needed within the lookahead
        # (nearest first) > other memory by heat > objects not needed soon (nearest first)
        want = np.zeros(len(state))
        soon = annotated & (dist < k)
        want[soon] = 4.0 + (k - dist[soon]) / k
        other = ~annotated & (heat >= c.min_heat)
        want[other] = 2.0 + heat[other] / (1.0 + heat[other])
        later = annotated & ~soon
        want[later] = 1.0 - np.minimum(dist[later], period) / (period + 1.0)

        # stuck units (the kernel refused their last move: shared pages) neither go nor make
        # room: the planner drops their moves, and promotions planned into the room a stuck
        # victim was to free were all clipped by the budget (a PyTorch run in the guest moved
        # nothing at any layer boundary: its coldest fast units were shared pages)
        known = node >= 0
        movable = ~state.stuck(np.arange(len(state)))
        cand = np.flatnonzero(known & movable & (want >= 2.0))
        order = cand[np.lexsort((-heat[cand], -want[cand]))]
        # the stuck units on the fast node stay: the wanted set fills what is left
        desired = fill_budget(order, npages, cap_low - int(npages[fast & ~movable].sum()))
        in_set = np.zeros(len(state), bool)
        in_set[desired] = True
        promo = order[(in_set & ~fast)[order]]
        victims = np.flatnonzero(fast & ~in_set & movable)
        victims = victims[np.lexsort((heat[victims], want[victims]))]
        must = used - cap_low if used > cap_high else 0
        p, d = plan_moves(npages, promo, want[promo], victims, want[victims], used=used,
                          cap=cap_high, must=must, max_moves=ctx.max_moves, margin=0.0)

        moved_objs = np.unique(obj[np.concatenate([p, d])])
        cur = [t for t in self.targets.values() if t.active]
        t0 = cur[0]
        stats = {
            **base,
            "layer": t0.layers[t0.pos] if t0.pos >= 0 else None,
            "position": t0.pos,
            "period": len(t0.layers),
            "objects_moved": int((moved_objs >= 0).sum()),
            "prefetch_pages": int(npages[p[annotated[p]]].sum()),
            "demote_pages": int(npages[d[annotated[d]]].sum()),
            "soon_pages": int(npages[soon].sum()),
            "fast_used": used,
            "fast_after": used + int(npages[p].sum()) - int(npages[d].sum()),
        }
        return Decision(promote=p, demote=d, stats=stats)
