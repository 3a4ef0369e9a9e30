"""Synthetic access traces: a stand-in for recorded ones in tests and benchmarks.

A trace is a list of frames ``(interval, t, {pid: Sample})``, the same shape
``pagetier.profiler.trace`` reads and writes. Each frame lists the units accessed in that
interval (``complete=False``, like an accessed-only read) with their access counts; the node
is -1 (unknown): the simulator decides where pages live.

Patterns (every one touches all its pages in the first interval, as a program initializing
its memory does, unless ``touch_all=False``):

- ``hotcold``: a fixed ``hot`` fraction of the pages (one contiguous region at a random
  offset) gets ``hot_share`` of the accesses, the rest uniformly share what is left;
- ``phased``: like hotcold, but the hot region jumps to a new random place every ``phase``
  intervals;
- ``zipf``: page popularity follows Zipf's law with exponent ``a`` over a random permutation
  of the pages (popular pages scattered), constant over time;
- ``scan``: a window of ``window`` (fraction) pages gets ``hot_share`` of the accesses and moves
  ``step`` (fraction of the window) forward each interval, wrapping around (a streaming sweep).

``generate(pattern, **params)`` builds one trace; ``from_spec("zipf:pages=2048,seed=3")`` does
the same from a string, for the command line.
"""
from __future__ import annotations

import numpy as np

from pagetier.core.sample import Sample
from pagetier.core.units import PAGE_SIZE
from pagetier.errors import ConfigError
from pagetier.policies.base import Annotation

BASE = 0x7F0000000000
PATTERNS = ("hotcold", "phased", "zipf", "scan")

_DEFAULTS = {
    "pages": 4096,  # 4 KiB pages in the footprint
    "intervals": 60,
    "accesses": 200_000,  # accesses per interval
    "interval_s": 1.0,
    "seed": 0,
    "pid": 1000,
    "hot": 0.2,  # hotcold/phased: fraction of pages in the hot region
    "hot_share": 0.9,  # hotcold/phased/scan: fraction of accesses going to the hot region
    "phase": 15,  # phased: intervals per phase
    "a": 1.1,  # zipf exponent
    "window": 0.15,  # scan: fraction of pages in the window
    "step": 0.25,  # scan: the window moves this fraction of itself per interval
    "touch_all": True,
}


def _region(pages: int, start: int, size: int) -> np.ndarray:
    return (start + np.arange(size)) % pages


def _probs(pattern: str, p: dict, i: int, rng: np.random.Generator, memo: dict) -> np.ndarray:
    n = p["pages"]
    if pattern in ("hotcold", "phased"):
        size = max(1, int(n * p["hot"]))
        key = i // p["phase"] if pattern == "phased" else 0
        if memo.get("key") != key:
            memo["key"], memo["start"] = key, int(rng.integers(0, n))
        hot = _region(n, memo["start"], size)
        w = np.full(n, (1.0 - p["hot_share"]) / max(1, n - size))
        w[hot] = p["hot_share"] / size
        return w
    if pattern == "zipf":
        if "w" not in memo:
            ranks = rng.permutation(n) + 1
            w = 1.0 / ranks.astype(np.float64) ** p["a"]
            memo["w"] = w / w.sum()
        return memo["w"]
    if pattern == "scan":
        size = max(1, int(n * p["window"]))
        if "start" not in memo:
            memo["start"] = int(rng.integers(0, n))
        start = memo["start"] + int(i * size * p["step"])
        w = np.full(n, (1.0 - p["hot_share"]) / max(1, n - size))
        w[_region(n, start, size)] = p["hot_share"] / size
        return w
    raise ConfigError(f"unknown synthetic pattern {pattern!r} (known: {', '.join(PATTERNS)})")


def generate(pattern: str, **params) -> list:
    """One synthetic trace as a list of frames ``(interval, t, {pid: Sample})``."""
    unknown = set(params) - set(_DEFAULTS)
    if unknown:
        raise ConfigError(f"synthetic trace: unknown parameter(s) {', '.join(sorted(unknown))} "
                          f"(known: {', '.join(_DEFAULTS)})")
    if pattern not in PATTERNS:
        raise ConfigError(f"unknown synthetic pattern {pattern!r} (known: {', '.join(PATTERNS)})")
    p = {**_DEFAULTS, **params}
    if p["pages"] < 1 or p["intervals"] < 1:
        raise ConfigError("synthetic trace: pages and intervals must be >= 1")
    rng = np.random.default_rng(p["seed"])
    n, pid = int(p["pages"]), int(p["pid"])
    addr_all = (BASE + np.arange(n, dtype=np.uint64) * PAGE_SIZE).astype(np.uint64)
    memo: dict = {}
    frames = []
    for i in range(int(p["intervals"])):
        w = _probs(pattern, p, i, rng, memo)
        count = rng.multinomial(int(p["accesses"]), w / w.sum())
        if i == 0 and p["touch_all"]:
            count = count + 1
        sel = np.flatnonzero(count)
        sample = Sample(
            pid=pid,
            addr=addr_all[sel],
            count=count[sel].astype(np.uint32),
            node=np.full(len(sel), -1, np.int16),
            npages=np.ones(len(sel), np.uint16),
            complete=False,
        )
        frames.append((i, i * float(p["interval_s"]), {pid: sample}))
    return frames


def _value(text: str):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    raise ConfigError(f"synthetic trace: bad value {text!r}")


def parse_spec(spec: str) -> tuple[str, dict]:
    """``"zipf:pages=2048,seed=3"`` (the ``synth:`` prefix optional) -> ("zipf", {...})."""
    if spec.startswith("synth:"):
        spec = spec[len("synth:"):]
    pattern, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, eq, val = item.partition("=")
        if not eq:
            raise ConfigError(f"synthetic trace {spec!r}: expected key=value, got {item!r}")
        params[key.strip()] = _value(val.strip())
    return pattern, params


def from_spec(spec: str) -> list:
    pattern, params = parse_spec(spec)
    return generate(pattern, **params)


def layered(objects: int = 6, object_pages: int = 32, iterations: int = 5, profile: int = 1,
            runtime_pages: int = 8, count: int = 10, pid: int = 1000, interval_s: float = 0.1):
    """A training-like trace with its annotations, one frame per layer: ``(frames, events)``.

    Object i (``object_pages`` pages, the weights of layer i) is accessed in forward layer
    ``fwd:i`` and again in ``bwd:i``; an iteration runs fwd:0..n-1 then bwd:n-1..0. A small
    ``runtime_pages`` region (the interpreter's memory) is accessed in every layer. ``events``
    (frame index -> Annotations, as ``simulate(..., events=)`` takes them): every object
    registered after the first frame, ``add_layer`` at the end of each frame for the next
    layer, and iteration ``profile`` bracketed by ``start_profile`` / ``end_profile``.
    """
    n = objects
    per_iter = 2 * n
    names = [f"fwd:{i}" for i in range(n)] + [f"bwd:{i}" for i in reversed(range(n))]
    obj_base = BASE + runtime_pages * PAGE_SIZE
    runtime = BASE + np.arange(runtime_pages, dtype=np.uint64) * np.uint64(PAGE_SIZE)
    frames, events = [], {}
    for f in range(iterations * per_iter):
        p = f % per_iter
        i = p if p < n else per_iter - 1 - p
        lo = obj_base + i * object_pages * PAGE_SIZE
        addr = np.concatenate([runtime, lo + np.arange(object_pages, dtype=np.uint64) * np.uint64(PAGE_SIZE)])
        samp = Sample(pid=pid, addr=addr, count=np.full(len(addr), count, np.uint32),
                      node=np.full(len(addr), -1, np.int16), npages=np.ones(len(addr), np.uint16),
                      complete=False)
        frames.append((f, f * interval_s, {pid: samp}))
        ev = []
        if f == 0:
            ev += [Annotation(pid, "register", name=f"w{j}",
                              addr=obj_base + j * object_pages * PAGE_SIZE,
                              size=object_pages * PAGE_SIZE) for j in range(n)]
        nxt = f + 1
        if nxt % per_iter == 0 and nxt // per_iter == profile + 1:
            ev.append(Annotation(pid, "end_profile"))
        if nxt % per_iter == 0 and nxt // per_iter == profile:
            ev.append(Annotation(pid, "start_profile"))
        ev.append(Annotation(pid, "add_layer", layer=names[nxt % per_iter]))
        events[f] = ev
    return frames, events
