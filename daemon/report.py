"""Reporting: one line per interval (JSON with ``--json``, else a short human line), and the
status file that ``pagetier status`` reads."""
from __future__ import annotations

import json
import logging
import os
import tracemalloc
from pathlib import Path

import numpy as np

from pagetier.daemon import cgroups
from pagetier.daemon import config as config_mod

log = logging.getLogger("pagetier.daemon")

MIB = 1 << 20
PAGE_SIZE = 4096


def jsonable(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def memory(state) -> dict:
    """What the daemon's own memory holds: the unit state, and with PYTHONTRACEMALLOC set,
    everything Python and numpy allocated (traced_kib)."""
    m = {"state_kib": state.nbytes // 1024}
    if tracemalloc.is_tracing():
        m["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
    return m


def per_target_bytes(state, fast: int, slow: int) -> dict[int, tuple[int, int]]:
    """pid -> (bytes on ``fast``, bytes on ``slow``) of the units the daemon tracks (the state's
    per-target counters: no pass over the units)."""
    f, _ = state.target_pages(fast)
    s, _ = state.target_pages(slow)
    return {p: (int(f[i]) * PAGE_SIZE, int(s[i]) * PAGE_SIZE)
            for i, p in enumerate(state.pids) if p >= 0}


def log_top_allocations(n: int = 12) -> None:
    """With PYTHONTRACEMALLOC set, say at exit where the daemon's live memory was allocated."""
    if not tracemalloc.is_tracing():
        return
    top = tracemalloc.take_snapshot().statistics("lineno")[:n]
    log.info("largest live allocations (tracemalloc):\n%s",
             "\n".join(f"  {st.size / 1024:9.1f} KiB in {st.count:7d} blocks  {st.traceback}"
                       for st in top))


def _cgroup_of(daemon, pid: int) -> str | None:
    g = daemon.tracker.group_of(pid)
    return None if g is None else str(g.path)


def status_doc(daemon) -> dict:
    """The status file's document for ``daemon`` (a daemon.loop.Daemon)."""
    return {
        "pid": os.getpid(),
        "started": daemon.started,
        "updated": daemon.clock.time(),
        "config": daemon.report.config_doc(daemon.cfg),
        "config_source": daemon.cfg.source,
        "targets": [{"pid": p, "name": daemon.tracker.name(p), "cgroup": _cgroup_of(daemon, p)}
                    for p in sorted(daemon.targets)],
        "cgroup": str(daemon.tracker.cgroup) if daemon.tracker.cgroup else None,
        # each managed cgroup: path, fast_budget (bytes, None: a fair share), pids, and its
        # targets' fast_bytes and slow_bytes
        "cgroups": cgroups.status(daemon.tracker, daemon.state, daemon.cfg.fast_node,
                                  daemon.cfg.slow_node),
        "totals": daemon.totals,
        "last": daemon.last,
        "control_socket": str(daemon.control.path) if daemon.control else None,
        "memory": memory(daemon.state),
    }


class Reporter:
    """Writes the interval lines to ``out`` and the status document to ``status_path``."""

    def __init__(self, out, status_path: str | os.PathLike):
        self.out = out
        self.status_path = Path(status_path)
        self._warned = False
        self._config: tuple = (None, None)  # (the Config, its keys as a dict)

    def config_doc(self, cfg) -> dict:
        """``cfg``'s keys and values (config.as_dict), computed again only when the daemon has
        another Config (a SIGHUP reload replaces it): the status file is written every interval."""
        if self._config[0] is not cfg:
            self._config = (cfg, config_mod.as_dict(cfg))
        return self._config[1]

    def emit(self, stats: dict, cfg) -> None:
        if cfg.json:
            line = json.dumps(stats, default=jsonable, separators=(",", ":"))
        else:
            line = human_line(stats, cfg.fast_node, cfg.slow_node)
        self.out.write(line + "\n")
        self.out.flush()

    def write_status(self, doc: dict) -> None:
        tmp = self.status_path.with_suffix(".tmp")
        text = json.dumps(doc, default=jsonable)
        try:
            try:
                tmp.write_text(text)
            except FileNotFoundError:  # the first write, or its directory removed since
                self.status_path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(text)
            os.replace(tmp, self.status_path)
        except OSError as e:
            if not self._warned:
                log.warning("cannot write status file %s: %s", self.status_path, e)
                self._warned = True

    def remove_status(self) -> None:
        self.status_path.unlink(missing_ok=True)


def human_line(s: dict, fast: int, slow: int) -> str:
    """One interval in under 80 columns."""
    res = s.get("resident", {})
    f = res.get(str(fast), 0) / MIB
    w = res.get(str(slow), 0) / MIB
    dry = " dry" if s.get("dry_run") else ""
    budget = s["budget"] / MIB
    budget_s = f"{budget:.0f}" if budget < 1 << 30 else "-"
    mark = "b" if s.get("boundary") else " "  # a decision at a layer boundary
    line = (f"#{s['interval']:<3d}{mark}+{s['promoted'] * 4 // 1024:>4d}M -{s['demoted'] * 4 // 1024:>4d}M"
            f"{dry} fast {s['fast_used'] / MIB:.0f}/{budget_s}M n{fast} {f:.0f}M n{slow} {w:.0f}M")
    extra = []
    wanted = s.get("wanted_bytes")
    if wanted:  # the exchange: what was wanted, what moved, and what stopped it there
        moved = (s["promoted"] + s["demoted"]) * 4096 / MIB
        extra.append(f"want {wanted / MIB:.0f}M moved {moved:.0f}M: {s.get('limit')}")
    layer = s.get("policy", {}).get("layer")
    if layer is not None:
        extra.append(f"layer {layer}")
    if s.get("busy"):
        extra.append(f"busy {s['busy']}")
    if s.get("failed"):
        extra.append(f"fail {s['failed']}")
    if s.get("ping_pongs"):
        extra.append(f"pp {s['ping_pongs']}")
    extra.append(f"{s['cpu_s'] * 1000:.1f}ms")
    return line + " " + " ".join(extra)
