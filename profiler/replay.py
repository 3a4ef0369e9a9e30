"""The replay backend: plays a recorded trace back, for simulation and tests.

``create("replay", path="run.parquet")``. Each ``read(pid)`` returns the trace's next interval for
that pid (the pids are the trace's: ``pids()`` lists them; ``attach`` accepts only those, or any
pid when ``pid_map`` maps it to one). After the last interval, reads return empty samples, or
start over with ``loop=True``. ``finished`` tells when every attached pid has been played out.

Each Sample carries the trace's ``freq`` column (the recording backend's estimate of accesses
per second). A trace without estimates (older traces, or backends that gave none) replays
with ``freq`` empty, so that ``Sample.rates`` derives it from the count and the interval.
"""
from __future__ import annotations

import numpy as np

from pagetier.errors import ConfigError
from pagetier.profiler.base import Profiler, Sample, register
from pagetier.profiler.trace import Trace, read_trace


@register("replay")
class ReplayProfiler(Profiler):
    def __init__(self, path: str | None = None, trace: Trace | None = None, loop: bool = False,
                 pid_map: dict[int, int] | None = None):
        if trace is None:
            if not path:
                raise ConfigError("replay: give path=TRACE")
            trace = read_trace(path)
        self.trace = trace
        self.loop = bool(loop)
        self.pid_map = {int(k): int(v) for k, v in (pid_map or {}).items()}
        # per trace pid: list of (interval, t, Sample)
        self.frames: dict[int, list[tuple[int, float, Sample]]] = {}
        for interval, t, group in trace.intervals():
            for pid, s in group.items():
                self.frames.setdefault(pid, []).append((interval, t, s))
        self.pos: dict[int, int] = {}

    def pids(self) -> list[int]:
        return sorted(set(self.frames) | {int(p) for p in self.trace.meta.get("pids", [])})

    def _src(self, pid: int) -> int:
        return self.pid_map.get(pid, pid)

    def attach(self, pid: int) -> None:
        if self._src(pid) not in self.pids():
            raise ProcessLookupError(f"replay: pid {pid} is not in the trace "
                                     f"(it has {', '.join(map(str, self.pids())) or 'none'})")
        self.pos.setdefault(pid, 0)

    def detach(self, pid: int) -> None:
        self.pos.pop(pid, None)

    @property
    def finished(self) -> bool:
        return all(self.pos[p] >= len(self.frames.get(self._src(p), [])) for p in self.pos)

    def read(self, pid: int, reset: bool = True, accessed_only: bool = False) -> Sample:
        if pid not in self.pos:
            raise ProcessLookupError(f"replay: pid {pid} is not attached")
        frames = self.frames.get(self._src(pid), [])
        i = self.pos[pid]
        if i >= len(frames) and self.loop and frames:
            i = 0
        if i >= len(frames):
            return Sample(pid=pid, complete=False)
        if reset:
            self.pos[pid] = i + 1
        s = frames[i][2]
        keep = s.count > 0 if accessed_only else np.ones(len(s), bool)
        return s.take(keep, pid=pid, complete=s.complete and not accessed_only, span=None)

    def stats(self, pid: int) -> dict:
        return {"position": self.pos.get(pid, 0),
                "intervals": len(self.frames.get(self._src(pid), []))}

    def close(self) -> None:
        self.pos.clear()
