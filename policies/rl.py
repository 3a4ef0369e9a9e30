"""A learned placement policy: a gymnasium environment over traces, a small numpy network
trained with the cross-entropy method, and the ``rl`` policy that runs a saved model.

Chunks. Units are taken in address order (the PageState's order) and cut into ``n_chunks``
runs of equal pages: chunk c holds the units whose pages start in [c, c+1) * total / n_chunks.

Observation (per chunk, ``features``): the chunk's accesses in each of the last ``history``
intervals, as ``log1p(count / mean count per chunk)``, then the fraction of its pages on the
fast node and the capacity as a fraction of all pages. The environment flattens it to a
vector of ``n_chunks * (history + 2)``.

Action: one score per chunk. The chunks with the highest scores that fit in the capacity are
wanted on the fast node; promotions go in score order and make room by demoting the
lowest-scored unwanted chunks only when needed, all within the rate limit (the same rules as
``plan_moves`` in heuristic.py, which the live policy calls).

Reward: minus (the next interval's access time + the migration time), in units of the trace's
mean all-fast interval time. The environment is a chunk-level model of the simulator (pages
inside a chunk are taken as equally hot); the trained policy is evaluated in the simulator
itself, at unit level.

Model: score = x . w_lin + tanh(x W1 + b1) . w2 per chunk, the same weights for every chunk
(so it works for any number of chunks and any footprint). ``train`` fits it with the
cross-entropy method over whole episodes; ``Model.save``/``Model.load`` use one ``.npz``.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagetier.core.planner import rate_pages
from pagetier.errors import ConfigError
from pagetier.policies.base import Context, Decision, Policy, register
from pagetier.policies.heuristic import fill_budget, plan_moves, unit_keys
from pagetier.policies.simulate import CostModel, capacity_pages, footprint, frame_interval_s

MODEL_FORMAT = 1


def features(hist: np.ndarray, fast_frac: np.ndarray, cap_frac: float) -> np.ndarray:
    """(n_chunks, history + 2) features from per-interval chunk counts ``hist`` (history, K)."""
    hist = np.asarray(hist, np.float64)
    K = hist.shape[1]
    mean = hist.sum(axis=1, keepdims=True) / K
    heat = np.log1p(hist / np.maximum(mean, 1e-9)).T  # (K, history), oldest first
    return np.concatenate([heat, fast_frac[:, None], np.full((K, 1), float(cap_frac))], axis=1)


@dataclass
class Model:
    history: int
    n_chunks: int
    hidden: int
    params: np.ndarray  # flat: w_lin (F), W1 (F*H), b1 (H), w2 (H)

    @property
    def n_features(self) -> int:
        return self.history + 2

    @staticmethod
    def n_params(history: int, hidden: int) -> int:
        F = history + 2
        return F + F * hidden + 2 * hidden

    def scores(self, x: np.ndarray) -> np.ndarray:
        F, H, p = self.n_features, self.hidden, self.params
        w_lin = p[:F]
        W1 = p[F:F + F * H].reshape(F, H)
        b1 = p[F + F * H:F + F * H + H]
        w2 = p[F + F * H + H:]
        return x @ w_lin + np.tanh(x @ W1 + b1) @ w2

    def save(self, path) -> None:
        with open(path, "wb") as fh:  # np.savez would append .npz to a name without it
            np.savez(fh, format=MODEL_FORMAT, history=self.history, n_chunks=self.n_chunks,
                     hidden=self.hidden, params=self.params)

    @classmethod
    def load(cls, path) -> "Model":
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"{p}: no such model file (train one with `pagetier train-rl`)")
        try:
            with np.load(p, allow_pickle=False) as z:
                fmt = int(z["format"])
                m = cls(int(z["history"]), int(z["n_chunks"]), int(z["hidden"]),
                        np.asarray(z["params"], np.float64))
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"{p}: not a pagetier rl model ({e})") from None
        if fmt != MODEL_FORMAT:
            raise ConfigError(f"{p}: model format {fmt} is not supported (this pagetier reads "
                              f"{MODEL_FORMAT})")
        if len(m.params) != cls.n_params(m.history, m.hidden) or m.history < 1 or m.n_chunks < 1:
            raise ConfigError(f"{p}: model parameters do not match its shape")
        return m


def chunk_of(npages: np.ndarray, n_chunks: int) -> np.ndarray:
    """Chunk of each unit (units in address order): equal-page runs."""
    n = np.asarray(npages, np.int64)
    total = int(n.sum())
    if total == 0:
        return np.zeros(len(n), np.int64)
    before = np.cumsum(n) - n
    return np.minimum(before * n_chunks // total, n_chunks - 1)


# --------------------------------------------------------------------------- environment
@dataclass
class _Trace:
    counts: np.ndarray  # (intervals, K) accesses per chunk
    new_counts: np.ndarray  # (intervals, K) accesses of units first seen in that interval
    arrivals: np.ndarray  # (intervals, K) pages first seen in that interval
    pages: np.ndarray  # (K,) pages per chunk
    interval_s: float


def _prepare(frames, n_chunks: int) -> _Trace:
    frames = list(frames.intervals() if hasattr(frames, "intervals") else frames)
    units: dict[tuple[int, int], int] = {}
    for _, _, samples in frames:
        for pid, s in samples.items():
            for a, n in zip(s.addr.tolist(), s.npages.tolist()):
                units[(int(pid), a)] = n
    keys = sorted(units)
    index = {k: i for i, k in enumerate(keys)}
    npages = np.array([units[k] for k in keys], np.int64)
    chunk = chunk_of(npages, n_chunks)
    T = len(frames)
    counts = np.zeros((T, n_chunks))
    new_counts = np.zeros((T, n_chunks))
    arrivals = np.zeros((T, n_chunks))
    seen = np.zeros(len(keys), bool)
    for t, (_, _, samples) in enumerate(frames):
        for pid, s in samples.items():
            idx = np.array([index[(int(pid), a)] for a in s.addr.tolist()], np.int64)
            c = chunk[idx]
            cnt = np.asarray(s.count, np.float64)
            new = ~seen[idx]
            seen[idx] = True
            np.add.at(counts[t], c, cnt)
            np.add.at(new_counts[t], c[new], cnt[new])
            np.add.at(arrivals[t], c[new], npages[idx[new]].astype(np.float64))
    pages = np.bincount(chunk, weights=npages, minlength=n_chunks).astype(np.float64)
    return _Trace(counts, new_counts, arrivals, pages, frame_interval_s(frames))


def chunk_moves(scores, present, fast, capacity: float, max_moves: float):
    """Chunk-level placement step: (new fast pages per chunk, pages moved)."""
    order = np.argsort(-scores, kind="stable")
    desired = fill_budget(order, present, capacity) if capacity > 0 else order[:0]
    want = np.zeros(len(scores), bool)
    want[desired] = True
    f = fast.copy()
    left = float(max_moves)
    victims = [c for c in np.argsort(scores, kind="stable") if not want[c] and f[c] > 0]
    vi = 0

    def evict(amount):
        nonlocal vi, left
        freed = 0.0
        while amount - freed > 1e-9 and vi < len(victims) and left > 1e-9:
            c = victims[vi]
            take = min(f[c], amount - freed, left)
            f[c] -= take
            freed += take
            left -= take
            if f[c] <= 1e-9:
                vi += 1
        return freed

    evict(max(0.0, f.sum() - capacity))  # over capacity: must demote
    for c in desired:
        need = present[c] - f[c]
        if need <= 1e-9 or left <= 1e-9:
            continue
        room = max(0.0, capacity - f.sum())
        if need <= room:
            x = min(need, left)
        else:  # x pages need x - room evicted: x + (x - room) <= left
            target = min(need, (left + room) / 2.0)
            freed = evict(max(0.0, target - room))
            x = min(room + freed, left)
        f[c] += x
        left -= x
    moved = float(max_moves) - left
    return f, moved


class TraceEnv:
    """Placeholder replaced by the gymnasium class below when gymnasium is installed."""


try:
    import gymnasium as gym
    from gymnasium import spaces
except ImportError:  # the rl extra is optional; the policy itself needs only numpy
    gym = None

if gym is not None:

    class TraceEnv(gym.Env):  # noqa: F811
        """Episodes over traces: one step per interval (see the module docstring).

        traces: lists of frames (or Trace objects); capacities: fractions of the footprint
        (one is drawn per episode); cost: the simulator's CostModel (or a list, one per
        trace); rate_mb_s: the daemon's
        rate limit; placement: first touch "slow" or "fast-first".
        """

        metadata = {"render_modes": []}

        def __init__(self, traces, capacities=(0.25,), cost: CostModel | None = None,
                     n_chunks: int = 32, history: int = 4, rate_mb_s: float = 512.0,
                     placement: str = "slow"):
            super().__init__()
            if not traces:
                raise ConfigError("TraceEnv needs at least one trace")
            self.n_chunks, self.history = int(n_chunks), int(history)
            # one CostModel for all traces, or a list with one per trace
            costs = list(cost) if isinstance(cost, (list, tuple)) else [cost or CostModel()] * len(traces)
            if len(costs) != len(traces):
                raise ConfigError(f"TraceEnv: {len(costs)} cost models for {len(traces)} traces")
            self.costs = costs
            self.cost = costs[0]
            self.capacities = [float(c) for c in capacities]
            self.placement = placement
            self.traces = [t if isinstance(t, _Trace) else _prepare(t, self.n_chunks) for t in traces]
            self.rate_mb_s = rate_mb_s
            F = self.history + 2
            self.observation_space = spaces.Box(-np.inf, np.inf, (self.n_chunks * F,), np.float32)
            self.action_space = spaces.Box(-1.0, 1.0, (self.n_chunks,), np.float32)
            self._tr = None

        # episode set-up: trace and capacity fixed by options or drawn
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            options = options or {}
            ti = options.get("trace", int(self.np_random.integers(len(self.traces))))
            cap = options.get("capacity", self.capacities[int(self.np_random.integers(len(self.capacities)))])
            tr = self._tr = self.traces[ti]
            self.cost = self.costs[ti]
            self.cap = float(cap) * tr.pages.sum() if cap <= 1.0 else float(cap)
            self.max_moves = float(rate_pages(self.rate_mb_s, tr.interval_s))
            self.norm = max(tr.counts.sum() * self.cost.fast_s / len(tr.counts), 1e-30)
            self.present = np.zeros(self.n_chunks)
            self.fast = np.zeros(self.n_chunks)
            self.t = 0
            self.total_s = self.migrate_s = 0.0
            self.total_s += self._serve(0)
            return self._obs(), {}

        def _serve(self, t: int) -> float:
            """Arrivals, then the accesses of interval t; returns their time."""
            tr, c = self._tr, self.cost
            old = self.present.copy()
            self.present = self.present + tr.arrivals[t]
            if self.placement == "fast-first":
                room = max(0.0, self.cap - self.fast.sum())
                arr = tr.arrivals[t]
                take = np.minimum(arr, np.maximum(0.0, room - (np.cumsum(arr) - arr)))
                self.fast = self.fast + take
                frac = np.divide(self.fast, self.present, out=np.zeros_like(self.fast),
                                 where=self.present > 0)
                on_fast = tr.counts[t] * frac
            else:
                frac = np.divide(self.fast, old, out=np.zeros_like(self.fast), where=old > 0)
                on_fast = (tr.counts[t] - tr.new_counts[t]) * frac
            total = tr.counts[t].sum()
            return float(on_fast.sum() * c.fast_s + (total - on_fast.sum()) * c.slow_s)

        def _obs(self) -> np.ndarray:
            tr, k = self._tr, self.history
            lo = self.t + 1 - k
            hist = tr.counts[max(0, lo):self.t + 1]
            if lo < 0:
                hist = np.vstack([np.zeros((-lo, self.n_chunks)), hist])
            frac = np.divide(self.fast, self.present, out=np.zeros_like(self.fast),
                             where=self.present > 0)
            cap_frac = self.cap / max(tr.pages.sum(), 1.0)
            return features(hist, frac, cap_frac).astype(np.float32).ravel()

        def step(self, action):
            scores = np.asarray(action, np.float64).ravel()
            self.fast, moved = chunk_moves(scores, self.present, self.fast, self.cap, self.max_moves)
            mig = moved * self.cost.page_move_s
            self.t += 1
            acc = self._serve(self.t)
            self.total_s += acc + mig
            self.migrate_s += mig
            done = self.t >= len(self._tr.counts) - 1
            info = {"moved_pages": moved, "fast_pages": float(self.fast.sum())}
            return self._obs(), -(acc + mig) / self.norm, done, False, info

        def all_fast_s(self) -> float:
            return float(self._tr.counts.sum() * self.cost.fast_s)


def _episode(env, model: Model) -> float:
    """Slowdown vs all-fast of one deterministic episode (env already reset)."""
    obs = env._obs()
    F = model.n_features
    done = False
    while not done:
        obs, _, done, _, _ = env.step(model.scores(obs.reshape(-1, F).astype(np.float64)))
    return env.total_s / env.all_fast_s()


def evaluate(env, model: Model, episodes) -> float:
    """Mean slowdown over ``episodes`` = [(trace index, capacity), ...]."""
    out = []
    for ti, cap in episodes:
        env.reset(options={"trace": ti, "capacity": cap})
        out.append(_episode(env, model))
    return float(np.mean(out))


def train(traces, *, capacities=(0.1, 0.25, 0.5), cost: CostModel | None = None,
          epochs: int = 20, population: int = 24, elite: float = 0.25, n_chunks: int = 32,
          history: int = 4, hidden: int = 8, rate_mb_s: float = 512.0, placement: str = "slow",
          seed: int = 0, progress=None) -> tuple[Model, list[float]]:
    """Cross-entropy method over the model's parameters; fitness = mean episode slowdown over
    every (trace, capacity). Returns the best model seen and the best slowdown per epoch."""
    if gym is None:
        raise ConfigError("training needs gymnasium: pip install 'pagetier[rl]'")
    env = TraceEnv(traces, capacities, cost, n_chunks, history, rate_mb_s, placement)
    episodes = [(i, c) for i in range(len(env.traces)) for c in env.capacities]
    rng = np.random.default_rng(seed)
    n = Model.n_params(history, hidden)
    mean, std = np.zeros(n), np.full(n, 0.5)
    n_elite = max(2, int(round(population * elite)))
    best, best_fit, curve = None, math.inf, []
    for epoch in range(epochs):
        cand = mean + std * rng.standard_normal((population, n))
        if best is not None:
            cand[0] = best
        fit = np.array([evaluate(env, Model(history, n_chunks, hidden, p), episodes) for p in cand])
        order = np.argsort(fit)
        if fit[order[0]] < best_fit:
            best_fit, best = float(fit[order[0]]), cand[order[0]].copy()
        el = cand[order[:n_elite]]
        mean = el.mean(axis=0)
        std = el.std(axis=0) + 0.02 * (1 - epoch / max(1, epochs))
        curve.append(best_fit)
        if progress:
            progress(epoch, best_fit)
    return Model(history, n_chunks, hidden, best), curve


# --------------------------------------------------------------------------- the live policy
@register("rl")
class RLPolicy(Policy):
    """Runs a model trained by ``pagetier train-rl``: scores address chunks from their recent
    heat and keeps the best-scored chunks that fit on the fast node, within the budget and the
    rate limit (``plan_moves``). Option ``model``: path of the ``.npz`` model."""

    @dataclass
    class Config:
        model: str = ""

        def check(self):
            if not self.model:
                raise ConfigError("policy rl: option 'model' (path of a trained .npz) is required")
            Model.load(self.model)  # a bad file is a config error now, not at the first interval

    def __init__(self, config=None, model: Model | None = None):
        if model is not None and config is None:
            config = self.Config(model="<in memory>")
        super().__init__(config)
        self.model = model if model is not None else Model.load(self.config.model)
        self._hist: deque = deque(maxlen=self.model.history)  # (sorted keys, counts)

    def decide(self, state, ctx: Context) -> Decision:
        m = self.model
        K = m.n_chunks
        none = np.zeros(0, np.int64)
        keys = unit_keys(state)
        self._hist.append((keys.copy(), state.count.astype(np.float64)))
        if not len(state):
            return Decision(promote=none, demote=none, stats={"chunks": 0})
        npages = state.npages.astype(np.int64)
        chunk = chunk_of(npages, K)
        starts = np.full(K, np.iinfo(np.uint64).max, np.uint64)
        first = np.unique(chunk, return_index=True)
        starts[first[0]] = keys[first[1]]
        starts = np.minimum.accumulate(starts[::-1])[::-1]  # empty chunks take the next start
        hist = np.zeros((m.history, K))
        off = m.history - len(self._hist)
        for j, (k_old, c_old) in enumerate(self._hist):
            ch = np.clip(np.searchsorted(starts, k_old, "right") - 1, 0, K - 1)
            hist[off + j] = np.bincount(ch, weights=c_old, minlength=K)
        fast = state.node == ctx.fast_node
        pages = np.bincount(chunk, weights=npages, minlength=K)
        fpages = np.bincount(chunk, weights=npages * fast, minlength=K)
        frac = np.divide(fpages, pages, out=np.zeros(K), where=pages > 0)
        total = int(npages.sum())
        budget = max(0, int(ctx.fast_budget))
        scores = m.scores(features(hist, frac, budget / max(total, 1)))
        desired = fill_budget(np.argsort(-scores, kind="stable"), pages.astype(np.int64), budget)
        want = np.zeros(K, bool)
        want[desired] = True
        heat = state.heat.astype(np.float64)
        uscore = scores[chunk]
        promo = np.flatnonzero(want[chunk] & ~fast & (state.node >= 0))
        promo = promo[np.lexsort((-heat[promo], -uscore[promo]))]
        victims = np.flatnonzero(fast)
        victims = victims[np.lexsort((heat[victims], want[chunk[victims]], uscore[victims]))]
        used = int(npages[fast].sum())
        p, d = plan_moves(npages, promo, uscore[promo], victims, uscore[victims], used=used,
                          cap=budget, must=max(0, used - budget), max_moves=ctx.max_moves)
        return Decision(promote=p, demote=d, stats={
            "chunks": K, "wanted_chunks": int(want.sum()), "fast_used": used,
            "promote_pages": int(npages[p].sum()), "demote_pages": int(npages[d].sum())})


def capacity_fraction(spec, frames) -> float:
    """A capacity spec (``25%``, ``64M``) as a fraction of the trace's footprint."""
    fp = footprint(frames)
    return capacity_pages(spec, fp) / max(fp, 1)
