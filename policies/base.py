"""The policy interface: which units belong on the fast node.

A policy sees the daemon's PageState (pagetier.core.state) and a Context, and returns unit
indices to promote to the fast node and to demote to the slow node. The same object runs in
the live daemon and in the trace simulator.

Policies register with ``@register("name")`` and declare their options as a dataclass
``Config``; ``create(name, options)`` validates the options strictly (an unknown key or a
wrong type is a ConfigError naming it).
"""
from __future__ import annotations

import dataclasses
import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from pagetier.core.registry import registrar
from pagetier.errors import ConfigError

POLICIES: dict[str, type["Policy"]] = {}
_POLICY_MODULES = {
    "heuristic": "pagetier.policies.heuristic",
    "first-touch": "pagetier.policies.baselines",
    "lru": "pagetier.policies.baselines",
    "heat-classes": "pagetier.policies.baselines",
    "ping-pong": "pagetier.policies.baselines",
    "rl": "pagetier.policies.rl",
    "sentinel": "pagetier.policies.sentinel",
}


register = registrar(POLICIES)  # @register("name") on a class


def known() -> list[str]:
    return sorted(set(POLICIES) | set(_POLICY_MODULES))


def create(name: str, options: dict | None = None) -> "Policy":
    if name not in POLICIES and name in _POLICY_MODULES:
        importlib.import_module(_POLICY_MODULES[name])
    if name not in POLICIES:
        raise ConfigError(f"unknown policy {name!r} (known: {', '.join(known())})")
    cls = POLICIES[name]
    return cls(validate_config(cls.Config, options or {}, f"policy {name}"))


def validate_config(cfg_cls, options: dict, where: str):
    """Build dataclass ``cfg_cls`` from ``options``: unknown keys and wrong types are errors."""
    fields = {f.name: f for f in dataclasses.fields(cfg_cls)}
    for key, value in options.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown option {key!r} (known: {', '.join(fields)})")
        typ = fields[key].type
        typ = {"int": int, "float": float, "bool": bool, "str": str}.get(typ, typ)
        ok = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise ConfigError(
                f"{where}: option {key!r} must be {typ.__name__}, got {type(value).__name__} {value!r}"
            )
        options = {**options, key: value}
    cfg = cfg_cls(**options)
    check = getattr(cfg, "check", None)
    if check:
        check()  # raises ConfigError for values out of range
    return cfg


@dataclass
class Context:
    """What a policy knows besides the pages. Sizes are in 4 KiB pages."""

    fast_node: int = 0
    slow_node: int = 1
    fast_budget: int = 0  # pages the targets may keep on the fast node
    # pages the fast node can hold for the targets: their units on it now plus its room above
    # the high watermark (None: unknown, no limit but the budget). Below fast_budget the node,
    # not the budget, is the limit: a policy then exchanges (demotes to make room) rather than
    # waits for room that will not come.
    fast_capacity: int | None = None
    max_moves: int = 1 << 62  # pages the rate limit allows to move this interval
    interval: int = 0  # interval number (PageState.interval)
    now: float = 0.0  # seconds since the daemon started
    interval_s: float = 1.0


@dataclass
class Annotation:
    """What an application told the daemon about itself (pagetier/annotate.py), one event.

    op: ``start_profile``, ``end_profile``, ``add_layer`` (``layer``: the layer starting now),
    ``register`` (``name``, ``addr``, ``size`` in bytes: an object, e.g. a tensor) or
    ``unregister`` (``name``).
    """

    pid: int
    op: str
    layer: str | None = None
    name: str | None = None
    addr: int = 0
    size: int = 0


@dataclass
class Decision:
    promote: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # unit indices
    demote: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stats: dict = field(default_factory=dict)  # policy's own counters (e.g. pattern class)
    # the next read is wanted at the profiler's next period end, not an interval later: the
    # policy saw the start of something it cannot judge yet on this read (the daemon honours
    # it for two reads in a row at most; a simulation replays fixed frames and ignores it)
    read_soon: bool = False


class Policy(ABC):
    name = "?"

    @dataclass
    class Config:
        pass

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    @abstractmethod
    def decide(self, state, ctx: Context) -> Decision: ...

    # Annotations. The daemon (and a simulation) calls these in the order things happen:
    # ``observe`` with every profiler sample it reads, ``annotate`` with every event.
    accepts_annotations = False  # False: applications need not send any

    def annotate(self, event: Annotation) -> bool:
        """An application's event; True asks for a decision now (e.g. at a layer boundary)."""
        return False

    def wants_samples(self, pid: int) -> bool:
        """True: read ``pid``'s counts at each of its ``add_layer`` events (and ``observe`` them)."""
        return False

    def observe(self, pid: int, sample) -> None:
        """A profiler sample of ``pid`` (counts since the previous one) the daemon just read."""

    # Looks between reads. A daemon whose profiler ends sampling periods between its reads
    # (pagetier.ko: a read every two or three scans) shows the policy what has been counted so
    # far at each such period end, without taking it (``read(reset=False)``)
    looks_between_reads = False  # False: the daemon does not look

    def read_now(self, state, samples: dict) -> bool:
        """``samples`` (pid -> Sample: the units accessed since the last read, not taken)
        show something to decide on before the interval is due (e.g. the accesses moved to
        new memory): True makes the daemon read now. Called only when
        ``looks_between_reads``."""
        return False

    def take_over(self, old: "Policy") -> None:
        """Carry over what ``old`` learned from the applications, when this policy replaces it
        on a configuration reload (SIGHUP with new options). Nothing by default."""
