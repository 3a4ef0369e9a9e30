"""A cost model measured on this machine: run a program with all its memory on the fast node,
then on the slow node, and derive the simulator's per-access times (differential tracing).

``measure`` runs the command under ``numactl --membind=NODE`` (CPUs on ``cpu_node`` both
times, so only the memory moves), alternating fast and slow ``repeat`` times and keeping each
node's fastest run. ``derive`` turns the two run times and a trace of the same program into
a ``CostModel``:

- the trace says how many counts the program makes per second of run time (its total count
  over its duration), so one count stands for ``fast_ns = duration / counts`` of run time
  with all memory on the fast node: the simulated all-fast time of the trace is then its
  recorded duration;
- all on the slow node the run took ``t_slow / t_fast`` times as long, so
  ``slow_ns = fast_ns * t_slow / t_fast`` (all the difference put on memory accesses);
- the migration cost (per page and bandwidth) is kept from the base preset: two runs do not
  measure it.

When the slow run was not slower (as in the test VM, whose two nodes are the same host
memory), slow_ns is clamped to fast_ns and ``clamped`` says so.

The result is a JSON file (``save``/``load``) that ``--cost-file`` of ``pagetier bench sim``
and ``pagetier train-rl`` read.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pagetier.core.units import MB, PAGE_SIZE
from pagetier.errors import ConfigError, PagetierError, Unavailable

FORMAT = 1


@dataclass
class CostModel:
    """Per-access time on each node and the cost of migrating one 4 KiB page."""

    fast_ns: float = 100.0  # one access served by the fast node
    slow_ns: float = 250.0  # one access served by the slow node
    migrate_us: float = 3.0  # fixed kernel cost per page migrated
    migrate_mb_s: float = 4000.0  # copy bandwidth of a migration (MB = 2**20 bytes)
    accesses_per_count: float = 1.0  # real accesses per recorded count
    name: str = "custom"

    def check(self) -> "CostModel":
        for key in ("fast_ns", "slow_ns", "migrate_mb_s", "accesses_per_count"):
            if not getattr(self, key) > 0:
                raise ConfigError(f"cost model: {key} must be > 0, got {getattr(self, key)!r}")
        if not self.migrate_us >= 0:
            raise ConfigError(f"cost model: migrate_us must be >= 0, got {self.migrate_us!r}")
        return self

    @property
    def fast_s(self) -> float:
        """Seconds per recorded count served by the fast node."""
        return self.fast_ns * 1e-9 * self.accesses_per_count

    @property
    def slow_s(self) -> float:
        return self.slow_ns * 1e-9 * self.accesses_per_count

    @property
    def page_move_s(self) -> float:
        """Seconds to migrate one 4 KiB page."""
        return self.migrate_us * 1e-6 + PAGE_SIZE / (self.migrate_mb_s * MB)


def run_time(cmd: list[str], mem_node: int, cpu_node: int | None) -> float:
    """Wall seconds of ``cmd`` with its memory bound to ``mem_node``; PagetierError on failure."""
    numactl = shutil.which("numactl")
    if numactl is None:
        raise Unavailable("numactl is missing (apt install numactl)")
    argv = [numactl, f"--membind={mem_node}"]
    if cpu_node is not None:
        argv.append(f"--cpunodebind={cpu_node}")
    t0 = time.monotonic()
    try:
        r = subprocess.run(argv + list(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True)
    except OSError as e:
        raise PagetierError(f"costmodel: cannot run {cmd[0]}: {e.strerror}") from None
    t = time.monotonic() - t0
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [""])[-1]
        raise PagetierError(f"costmodel: {shlex.join(cmd)} on node {mem_node} exited with "
                            f"{r.returncode}: {last}")
    return t


def measure(cmd: list[str], fast: int = 0, slow: int = 1, cpu_node: int | None = 0,
            repeat: int = 3, progress=None) -> dict:
    """Run ``cmd`` ``repeat`` times on each node, alternating; the times of every run."""
    if repeat < 1:
        raise ConfigError("costmodel: --repeat must be >= 1")
    if fast == slow:
        raise ConfigError(f"costmodel: the fast and slow node are both {fast}")
    runs = {"fast": [], "slow": []}
    for _ in range(repeat):
        for which, node in (("fast", fast), ("slow", slow)):
            runs[which].append(run_time(cmd, node, cpu_node))
            if progress:
                progress()
    return {"command": shlex.join(cmd), "fast_node": fast, "slow_node": slow,
            "cpu_node": cpu_node, "runs_fast_s": runs["fast"], "runs_slow_s": runs["slow"]}


def trace_rate(trace) -> tuple[int, float]:
    """(total count, seconds covered) of a recorded trace."""
    counts = int(np.asarray(trace.column("count"), np.int64).sum())
    t = np.asarray(trace.column("t"), np.float64)
    seconds = (float(t.max()) if len(t) else 0.0) + float(trace.interval_s or 0.0)
    if counts <= 0 or seconds <= 0:
        raise ConfigError(f"{trace.path}: the trace counts no accesses; record the program "
                          "while it runs")
    return counts, seconds


def derive(measured: dict, counts: int, seconds: float, base) -> tuple[object, bool]:
    """(CostModel, clamped) from the runs in ``measured`` and the trace's counts over seconds."""
    t_fast, t_slow = min(measured["runs_fast_s"]), min(measured["runs_slow_s"])
    fast_ns = seconds / counts * 1e9
    ratio = t_slow / t_fast
    clamped = ratio < 1.0
    cost = dataclasses.replace(base, fast_ns=fast_ns, slow_ns=fast_ns * max(ratio, 1.0),
                               accesses_per_count=1.0, name="measured")
    return cost.check(), clamped


def save(path, cost, measured: dict, extra: dict) -> None:
    doc = {"format": FORMAT, "cost": dataclasses.asdict(cost), "measured": {**measured, **extra}}
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


def load(path):
    """The CostModel in a file written by ``save``; ConfigError naming the file otherwise."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as e:
        raise ConfigError(f"{p}: cannot read the cost file ({e.strerror})") from None
    except ValueError as e:
        raise ConfigError(f"{p}: not a JSON cost file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("cost"), dict):
        raise ConfigError(f"{p}: not a cost file written by `pagetier bench costmodel`")
    fields = {f.name for f in dataclasses.fields(CostModel)}
    bad = set(doc["cost"]) - fields
    if bad:
        raise ConfigError(f"{p}: unknown cost field(s) {', '.join(sorted(bad))}")
    try:
        return CostModel(**doc["cost"]).check()
    except TypeError as e:
        raise ConfigError(f"{p}: bad cost model ({e})") from None
