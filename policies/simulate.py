"""The trace simulator: replay recorded (or synthetic) frames through a placement policy.

The simulator runs the same objects the daemon runs: a policy from ``policies.create``, the
daemon's PageState, a ``policies.base.Context`` per interval, and the daemon's own move planner
(``pagetier.core.planner.plan``: budget, rate and node room). Instead of ``move_pages`` it keeps
the placement in the PageState and charges a cost model.

One interval, through the daemon's own step (``pagetier.core.step.Step``, with a mover that
records the moves in the PageState and a clock that reads the frames' timestamps):

1. the frame's samples are merged into the PageState, each unit reported on the node where the
   simulator has it; a unit seen for the first time is placed by ``placement``: ``slow`` (first
   touch on the slow node, like a program started outside pagetier's budget) or
   ``fast-first`` (on the fast node while the capacity lasts, then on the slow node).
   A frame's rates are its counts per interval: the daemon weighs a read by the seconds it
   covers, since its reads come at uneven times; a replay's frames are one interval each;
2. the interval's accesses are charged where their pages were at the start of the interval:
   moves decided at the end of interval i take effect for interval i+1;
3. the policy decides, with ``fast_budget`` = the capacity and ``max_moves`` = the rate limit;
   the planner keeps the moves within both (the simulated fast node has no room limit but
   the capacity); the moves are recorded (PageState
   ``record_moves``) and charged as migration time; a unit moved again within
   ``ping_pong_window`` intervals of its last move counts as a ping-pong, as in the daemon.
   After the last frame the program has ended: the policy is not asked.

Estimated time = access time + migration time (migrations are charged as if they stalled the
program: a pessimistic but common choice, as in AutoTM's objective).

Cost-model presets (``PRESETS``). The numbers are rounded idle latencies from the cited
measurements, meant as sensible defaults: every one can be overridden. Migration cost is a
fixed per-page part (unmap, TLB shootdown, remap: Linux migrates 4 KiB pages at well under
1 GB/s per thread, see Yan et al., "Nimble Page Management for Tiered Memory Systems",
ASPLOS'19) plus the copy at ``migrate_mb_s``.

- ``dram-cxl``: local DDR5 ~100 ns, CXL-attached DRAM ~250 ns. Sun et al., "Demystifying CXL
  Memory with Genuine CXL-Ready Systems and Devices" (MICRO'23) measure CXL memory at roughly
  2-3x local DRAM latency; Li et al., "Pond" (ASPLOS'23) put directly attached CXL at about
  +70-90 ns over local DRAM and more behind a switch.
- ``dram-pmem``: DRAM ~81 ns, Optane DC PMem ~305 ns (random-read idle latency), PMem write
  bandwidth ~2 GB/s per DIMM. Izraelevitz et al., "Basic Performance Measurements of the Intel
  Optane DC Persistent Memory Module" (arXiv:1903.05714, 2019); Yang et al., "An Empirical Guide
  to the Behavior and Use of Scalable Persistent Memory" (FAST'20).
- ``hbm-ddr``: bandwidth-bound, so the per-access time is a 64-byte line at the tier's
  bandwidth: MCDRAM ~450 GB/s -> 0.14 ns, DDR4 ~90 GB/s -> 0.71 ns (Xeon Phi KNL STREAM figures;
  Ramos and Hoefler, "Capability Models for Manycore Memory Systems: A Case-Study with Xeon Phi
  KNL", IPDPS'17). HBM's latency is not lower than DDR's: this preset models throughput.
- ``local-remote``: two-socket Xeon, local ~90 ns, remote socket ~140 ns (Intel Memory Latency
  Checker idle latencies as commonly published for Xeon Scalable; Maruf et al., "TPP"
  (ASPLOS'23) describe CXL memory as behaving like such a CPU-less remote node).

A measured alternative to the presets: ``pagetier bench costmodel`` (policies/costmodel.py)
runs a program with all its memory on each node and derives the per-access times from the two
run times and a trace's counts, as differential tracing does.

``accesses_per_count`` says how many real accesses one recorded count stands for (the kmod
profiler samples; synthetic traces count every access): raise it to weigh accesses against
migrations for sampled traces. A recorded count is not an access (in abit mode it is one scan
that found the page accessed), so for recorded traces the bench and the trainer default to
``time_anchored``: the count is scaled so that the trace's all-fast time equals its recorded
duration (the program taken as memory-bound; the same anchor ``pagetier bench costmodel``
uses).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from pagetier.core.planner import rate_pages
from pagetier.core.sample import Sample
from pagetier.core.state import PageState, unit_keys
from pagetier.core.step import Limits, Read, RecordingMover, Step
from pagetier.core.units import PAGE_SIZE, parse_size
from pagetier.errors import ConfigError
from pagetier.policies.base import Context, Policy, create
from pagetier.policies.costmodel import CostModel, load

FAST, SLOW = 0, 1
PLACEMENTS = ("slow", "fast-first")


PRESETS = {
    "dram-cxl": CostModel(100.0, 250.0, 3.0, 4000.0, name="dram-cxl"),
    "dram-pmem": CostModel(81.0, 305.0, 3.0, 2000.0, name="dram-pmem"),
    "hbm-ddr": CostModel(0.14, 0.71, 3.0, 8000.0, name="hbm-ddr"),
    "local-remote": CostModel(90.0, 140.0, 3.0, 4000.0, name="local-remote"),
}


def time_anchored(cost: CostModel, frames, interval_s: float | None = None) -> CostModel:
    """``cost`` with ``accesses_per_count`` set so that the all-fast time of ``frames`` equals
    their duration (frames x interval)."""
    frames = list(frames)
    counts = sum(int(np.asarray(s.count, np.int64).sum()) for _, _, d in frames for s in d.values())
    seconds = len(frames) * (interval_s or frame_interval_s(frames))
    if counts <= 0 or seconds <= 0:
        return cost
    return dataclasses.replace(cost, accesses_per_count=seconds / (counts * cost.fast_ns * 1e-9))


def cost_model(preset: str = "dram-cxl", base_file=None, **overrides) -> CostModel:
    """A preset, or the model in ``base_file`` (written by ``pagetier bench costmodel``), with
    some numbers overridden (None values are ignored)."""
    if base_file is not None:
        base = load(base_file)
    elif preset not in PRESETS:
        raise ConfigError(f"unknown cost preset {preset!r} (known: {', '.join(PRESETS)})")
    else:
        base = PRESETS[preset]
    overrides = {k: v for k, v in overrides.items() if v is not None}
    fields = {f.name for f in dataclasses.fields(CostModel)}
    bad = set(overrides) - fields
    if bad:
        raise ConfigError(f"cost model: unknown field(s) {', '.join(sorted(bad))}")
    return dataclasses.replace(base, **overrides).check()


@dataclass
class SimConfig:
    capacity: int  # fast-tier pages the targets may use (the daemon's fast budget)
    cost: CostModel = field(default_factory=CostModel)
    rate_mb_s: float = 512.0  # migration rate limit, as the daemon's --rate (0: no limit)
    interval_s: float | None = None  # None: from the frames' timestamps (1 s if unknown)
    placement: str = "slow"  # first touch: "slow" or "fast-first"
    ping_pong_window: int = 4  # as the daemon's ping_pong_window
    decay: float = 0.5  # PageState heat decay, as the daemon's

    def check(self) -> "SimConfig":
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, "
                              f"got {self.placement!r}")
        if self.capacity < 0:
            raise ConfigError(f"capacity must be >= 0 pages, got {self.capacity}")
        if self.rate_mb_s < 0:
            raise ConfigError(f"rate must be >= 0 MB/s (0: no limit), got {self.rate_mb_s}")
        self.cost.check()
        return self


@dataclass
class SimResult:
    policy: str
    capacity: int  # pages
    intervals: int = 0
    accesses: int = 0  # recorded counts
    fast_accesses: int = 0
    access_s: float = 0.0
    migrate_s: float = 0.0
    all_fast_s: float = 0.0  # every access on the fast node, no migration
    all_slow_s: float = 0.0
    promoted_pages: int = 0
    demoted_pages: int = 0
    ping_pongs: int = 0
    clipped: int = 0  # units the policy asked to move that budget or rate kept in place
    footprint_pages: int = 0  # pages tracked at the end
    max_fast_pages: int = 0  # most pages on the fast node at any interval start
    timeline: list = field(default_factory=list)  # per interval: (hit ratio, est. seconds)
    policy_stats: dict = field(default_factory=dict)  # the last Decision's stats
    # per phase (phase_reach): its first interval, and intervals from it until 95% of each
    # interval's hot region was on the fast node at the interval's start (None: never)
    phase_starts: list = field(default_factory=list)
    phase_t95: list = field(default_factory=list)
    min_moved_pages: int = 0  # the moves the phases require at least (phase_reach)

    @property
    def est_time_s(self) -> float:
        return self.access_s + self.migrate_s

    @property
    def slowdown(self) -> float:
        """Estimated time over the all-fast time (1.0: as fast as all-fast)."""
        return self.est_time_s / self.all_fast_s if self.all_fast_s else 1.0

    @property
    def hit_ratio(self) -> float:
        return self.fast_accesses / self.accesses if self.accesses else 1.0

    @property
    def migrated_pages(self) -> int:
        return self.promoted_pages + self.demoted_pages

    @property
    def migrated_bytes(self) -> int:
        return self.migrated_pages * PAGE_SIZE

    @property
    def moved_ratio(self) -> float | None:
        """Pages migrated over the least the phases require (None: they require none)."""
        return self.migrated_pages / self.min_moved_pages if self.min_moved_pages else None

    def as_dict(self) -> dict:
        d = {k: v for k, v in dataclasses.asdict(self).items()
             if k not in ("timeline",)}
        d.update(est_time_s=self.est_time_s, slowdown=self.slowdown, hit_ratio=self.hit_ratio,
                 migrated_pages=self.migrated_pages, migrated_bytes=self.migrated_bytes,
                 moved_ratio=self.moved_ratio)
        return d


def parse_sample_rate(text: str) -> float:
    """A thinning rate: ``1/100`` or ``0.01``, in (0, 1]."""
    t = str(text).strip()
    try:
        if "/" in t:
            num, den = t.split("/", 1)
            r = float(num) / float(den)
        else:
            r = float(t)
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"--sample {text!r}: give a rate such as 1/1000 or 0.001") from None
    if not 0 < r <= 1:
        raise ConfigError(f"--sample {text!r}: a sampling rate is in (0, 1]")
    return r


def thin(frames, rate: float, seed: int = 0, per_count: float = 1.0) -> list:
    """``frames`` as a sampler taking each access with probability ``rate`` would see them
    (Bernoulli thinning, as PEBS-like hardware sampling): each unit's count becomes
    ``binomial(round(count * per_count), rate)``. ``per_count`` is how many real accesses one
    recorded count stands for (the cost model's ``accesses_per_count``): a recorded trace's
    count is a scan hit, not an access, so its accesses are thinned, not its counts. Units
    that get no sample stay in the frame with count 0 (the address space is still known), so
    first-touch placement and the footprint are the true trace's. Deterministic for a
    ``seed``; ``freq`` is dropped (the rates come from the thinned counts)."""
    rng = np.random.default_rng(seed)
    out = []
    for f in frames:
        samples = {}
        for pid in sorted(f[2]):
            s = f[2][pid]
            n = np.rint(np.asarray(s.count, np.float64) * per_count).astype(np.int64)
            c = rng.binomial(n, rate).astype(np.uint32)
            samples[pid] = s.take(slice(None), count=c, freq=np.zeros(0, np.float32))
        out.append((f[0], f[1], samples))
    return out


def frame_interval_s(frames) -> float:
    """The median spacing of the frames' timestamps, 1.0 when there are fewer than two."""
    ts = [float(f[1]) for f in frames]
    if len(ts) < 2:
        return 1.0
    d = np.diff(np.asarray(ts))
    d = d[d > 0]
    return float(np.median(d)) if len(d) else 1.0


def footprint(frames) -> int:
    """4 KiB pages touched over the whole trace (distinct units of every target)."""
    seen: dict[int, dict[int, int]] = {}
    for _, _, samples in frames:
        for pid, s in samples.items():
            d = seen.setdefault(int(pid), {})
            for a, n in zip(s.addr.tolist(), s.npages.tolist()):
                d[a] = n
    return int(sum(sum(d.values()) for d in seen.values()))


def capacity_pages(spec, frames_or_footprint) -> int:
    """``"25%"`` of the footprint, or a size (``"64M"``, ``"1G"``), or pages (an int)."""
    if isinstance(spec, (int, np.integer)):
        return int(spec)
    text = str(spec).strip()
    if text.endswith("%"):
        fp = frames_or_footprint if isinstance(frames_or_footprint, int) else footprint(frames_or_footprint)
        return int(fp * float(text[:-1]) / 100.0)
    return parse_size(text, "capacity") // PAGE_SIZE


def _placed(st: PageState, sample: Sample, placement: str, capacity: int) -> Sample:
    """``sample`` with each unit's node set to where the simulator has it."""
    t = st.target_index(int(sample.pid))
    addr = np.asarray(sample.addr, np.uint64)
    keys = unit_keys(t, addr)
    node = np.full(len(addr), SLOW, np.int16)
    found = np.zeros(len(addr), bool)
    if len(st):
        all_keys = st.keys()
        pos = np.minimum(np.searchsorted(all_keys, keys), len(all_keys) - 1)
        found = all_keys[pos] == keys
        node[found] = st.node[pos[found]]
    new = np.flatnonzero(~found)
    if placement == "fast-first" and len(new):
        new = new[np.argsort(addr[new], kind="stable")]
        room = capacity - st.pages_on(FAST)
        cum = np.cumsum(np.asarray(sample.npages, np.int64)[new])
        node[new[cum <= room]] = FAST
    return Sample(pid=sample.pid, addr=addr, count=np.asarray(sample.count, np.uint32), node=node,
                  npages=np.asarray(sample.npages, np.uint16), complete=sample.complete,
                  freq=np.asarray(sample.freq, np.float32))


class _FrameClock:
    """The simulator's clock: the timestamp of the frame being replayed."""

    def __init__(self, now: float):
        self.now = now

    def monotonic(self) -> float:
        return self.now


class _Charge:
    """One frame's recorded counts, by where their pages were at the start of the interval,
    and its units (keys, pages, counts, on the fast node or not) for :func:`phase_reach`."""

    def __init__(self):
        self.fast = self.slow = 0
        self.units: list[tuple] = []

    def count(self, s: Sample, true_count=None, keys=None) -> None:
        """Charge ``s``'s units where they are; ``true_count``: the accesses to charge when
        the policy saw a thinned ``s.count``."""
        c = np.asarray(s.count if true_count is None else true_count).astype(np.int64)
        on_fast = s.node == FAST
        self.fast += int(c[on_fast].sum())
        self.slow += int(c[~on_fast].sum())
        if keys is not None:
            self.units.append((keys, np.asarray(s.npages, np.int64), c, on_fast))

    def frame_units(self) -> tuple:
        """(keys, pages, counts, on fast) of every unit of the frame."""
        if not self.units:
            z = np.zeros(0, np.int64)
            return np.zeros(0, np.uint64), z, z, np.zeros(0, bool)
        return tuple(np.concatenate(x) for x in zip(*self.units))

    @property
    def hit_ratio(self) -> float:
        tot = self.fast + self.slow
        return self.fast / tot if tot else 1.0

    def add_to(self, res: SimResult, cost: CostModel) -> float:
        """Add the counts and their access time to ``res``; the access time."""
        acc_s = self.fast * cost.fast_s + self.slow * cost.slow_s
        res.accesses += self.fast + self.slow
        res.fast_accesses += self.fast
        res.access_s += acc_s
        res.all_fast_s += (self.fast + self.slow) * cost.fast_s
        res.all_slow_s += (self.fast + self.slow) * cost.slow_s
        return acc_s


def _reads(st: PageState, samples: dict, cfg: SimConfig, charge: _Charge, truth=None):
    """The frame's samples as the Step's reads, each placed where the simulator has its units
    when the one before it has been merged (first touch fills the capacity in order).

    A frame is one interval: its rates are counts per interval (``interval_s = elapsed_s =
    1``), and counts are taken as recorded (no ``max_count``). The daemon weighs its reads by
    the seconds they cover because its reads come at uneven times; a replay's frames are even
    by construction, and the policies' thresholds are set on these rates (the builtin traces,
    read every 0.5 s, give other decisions with rates per second).

    ``truth``: the true frame's samples when ``samples`` are thinned (:func:`thin`, the same
    units in the same order): the charge is on their counts."""
    for pid in sorted(samples):
        s = _placed(st, samples[pid], cfg.placement, cfg.capacity)
        charge.count(s, None if truth is None else truth[pid].count,
                     unit_keys(st.target_index(int(s.pid)), np.asarray(s.addr, np.uint64)))
        yield Read(pid=int(pid), sample=s, elapsed_s=1.0, interval_s=1.0)


def simulate(frames, policy, cfg: SimConfig, *, options: dict | None = None,
             name: str | None = None, events: dict | None = None, truth=None) -> SimResult:
    """Replay ``frames`` through ``policy`` (a Policy, or a name for ``policies.create``).

    ``truth``: the unthinned frames when ``frames`` are a sampled view of them (:func:`thin`):
    the policy sees ``frames``, the cost model charges ``truth``'s accesses.

    ``events``: frame index -> list of policies.Annotation, delivered (``policy.annotate``)
    after that frame's samples (which the policy ``observe``s, as in the daemon) and before its
    decision: an application's annotations at the end of that interval, e.g. the next layer's
    ``add_layer`` when each frame is one layer.
    """
    cfg.check()
    if not isinstance(policy, Policy):
        name = name or str(policy)
        policy = create(str(policy), options)
    if hasattr(frames, "intervals"):  # a profiler.trace.Trace
        frames = frames.intervals()
    frames = list(frames)
    if truth is not None:
        truth = list(truth)
        if len(truth) != len(frames):
            raise ConfigError("simulate: the true frames and the sampled ones differ in length")
    interval_s = cfg.interval_s or frame_interval_s(frames)
    limits = Limits(budget=int(cfg.capacity), rate=rate_pages(cfg.rate_mb_s, interval_s))
    res = SimResult(policy=name or getattr(policy, "name", "?"), capacity=int(cfg.capacity))
    st = PageState(decay=cfg.decay)
    clock = _FrameClock(float(frames[0][1]) if frames else 0.0)
    seen: list[tuple] = []  # each frame's units, for phase_reach
    step = Step(st, policy, RecordingMover(FAST, SLOW, cfg.ping_pong_window), clock, Context,
                fast=FAST, slow=SLOW, interval_s=interval_s, t0=clock.now)
    for k, (_, t, samples) in enumerate(frames):
        clock.now = float(t)
        step.begin()
        charge = _Charge()
        step.merge(_reads(st, samples, cfg, charge, None if truth is None else truth[k][2]))
        res.max_fast_pages = max(res.max_fast_pages, st.pages_on(FAST))
        acc_s = charge.add_to(res, cfg.cost)
        seen.append(charge.frame_units())
        res.intervals += 1
        if k == len(frames) - 1:  # the program has ended: moves now would serve nothing
            res.timeline.append((charge.hit_ratio, acc_s))
            break
        for ev in (events or {}).get(k, ()):
            policy.annotate(ev)
        out = step.act(lambda: limits)
        res.clipped += max(0, out.moves.clipped)
        res.ping_pongs += out.moved.tally["ping_pongs"]
        res.promoted_pages += out.moved.promoted
        res.demoted_pages += out.moved.demoted
        mig_s = (out.moved.promoted + out.moved.demoted) * cfg.cost.page_move_s
        res.migrate_s += mig_s
        res.timeline.append((charge.hit_ratio, acc_s + mig_s))
        res.policy_stats = dict(out.decision.stats)
    res.footprint_pages = int(st.npages.sum(dtype=np.int64)) if len(st) else 0
    res.phase_starts, res.phase_t95, res.min_moved_pages = phase_reach(seen, int(cfg.capacity))
    return res


HOT_SHARE = 0.25  # a frame's hot region: units at this times the access rate per page...
HOT_MASS = 0.5  # ...of the unit where the frame's accesses, hottest first, pass this share
PHASE_OVERLAP = 0.3  # a frame's hot region sharing less with the last one's: a new phase
REACH = 0.95  # the share of the hot region on the fast node that counts as reached


def frame_hot(npages, counts) -> np.ndarray:
    """A frame's hot region (positions of its units): those at ``HOT_SHARE`` times the
    accesses per page of the unit where the frame's accesses, hottest per page first, pass
    ``HOT_MASS`` of them."""
    per = counts / np.maximum(npages, 1)
    order = np.argsort(-per, kind="stable")
    order = order[counts[order] > 0]
    if not len(order):
        return order
    cum = np.cumsum(counts[order])
    mid = per[order[min(int(np.searchsorted(cum, HOT_MASS * cum[-1])), len(order) - 1)]]
    return order[per[order] >= HOT_SHARE * mid]


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """|a & b| / the smaller of the two (sorted unique keys): a read that saw part of a
    region still overlaps it."""
    if not len(a) or not len(b):
        return 0.0
    return float(np.count_nonzero(np.isin(a, b, assume_unique=True))) / min(len(a), len(b))


def phase_reach(frames_units, capacity: int) -> tuple[list, list, int]:
    """Per phase of a replay: (the first frames of the phases, intervals from each until
    ``REACH`` of each frame's hot region (:func:`frame_hot`; of the capacity when the region
    is larger) was on the fast node at the frame's start, None when it never was before the
    next phase; the least pages the phases require moved). ``frames_units``: each frame's
    (keys, pages, counts, on fast).

    A phase begins at the first frame and at each frame whose hot region shares under
    ``PHASE_OVERLAP`` of its units (or of the last frame's, when fewer) with the last frame's.
    Its region is the units hot in at least half of its frames; the least moves: each
    phase's region (at most the capacity) promoted where the last phase's did not hold it, and
    as much of the last one demoted as the capacity then requires."""
    hot, share = [], []
    for keys, npages, counts, on_fast in frames_units:
        h = frame_hot(npages, counts)
        pages = min(int(npages[h].sum()), capacity)
        share.append(min(1.0, float(npages[h][on_fast[h]].sum()) / pages) if pages > 0 else 1.0)
        hot.append((np.sort(keys[h]), dict(zip(keys[h].tolist(), npages[h].tolist()))))
    starts = [k for k in range(len(hot))
              if k == 0 or _overlap(hot[k][0], hot[k - 1][0]) < PHASE_OVERLAP]
    t95, least, last = [], 0, {}
    for i, k in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(hot)
        t95.append(next((d for d in range(end - k) if share[k + d] >= REACH), None))
        seen: dict = {}
        for f in range(k, end):
            for key in hot[f][1]:
                seen[key] = seen.get(key, 0) + 1
        region = {key: next(hot[f][1][key] for f in range(k, end) if key in hot[f][1])
                  for key, n in seen.items() if 2 * n >= end - k}
        size = sum(region.values())
        up = sum(n for key, n in region.items() if key not in last)
        # a region larger than the capacity: the capacity's worth of it, in proportion
        up = int(up * min(1.0, capacity / size)) if size else 0
        stay = min(sum(n for key, n in last.items() if key not in region),
                   max(0, capacity - min(size, capacity)))
        held = min(sum(last.values()), capacity)
        least += up + max(0, held + up - capacity) if last else up
        del stay
        last = region
    return starts, t95, least
