"""Target tracking: the processes whose pages the daemon manages.

Pids given at the start (and a started command, the *child*) are attached to the profiler;
with a cgroup, its processes are followed as they join and leave. Targets that exit are
detached and their units forgotten.
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import psutil

from pagetier.core.state import PageState
from pagetier.errors import PagetierError

log = logging.getLogger("pagetier.daemon")


class Targets:
    """The managed pids (``pids``), attached to ``profiler``; their units live in ``state``."""

    def __init__(self, profiler, state: PageState, *, pids=(), cgroup: str | Path | None = None,
                 child: subprocess.Popen | None = None):
        self.profiler, self.state = profiler, state
        self.cgroup = Path(cgroup) if cgroup else None
        self.child: subprocess.Popen | None = None
        self.initial = [int(p) for p in pids]  # attached when the daemon starts
        self.pids: set[int] = set()
        self.last_read: dict[int, float] = {}  # pid -> time of its last profiler read
        self._attach_failed: set[int] = set()
        if child is not None:
            self.adopt(child)

    def adopt(self, child: subprocess.Popen) -> None:
        """Manage a command the daemon started (attached at the start, like ``pids``)."""
        self.child = child
        self.initial.append(child.pid)

    def alive(self, pid: int) -> bool:
        if self.child is not None and pid == self.child.pid:
            return self.child.poll() is None
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def attach(self, pid: int, strict: bool = True) -> bool:
        if pid in self.pids:
            return True
        try:
            self.profiler.attach(pid)
        except (PagetierError, OSError) as e:
            if strict:
                raise
            if pid not in self._attach_failed:
                log.warning("cannot attach to pid %d: %s", pid, e)
                self._attach_failed.add(pid)
            return False
        self.pids.add(pid)
        log.info("attached to pid %d (%s)", pid, self.name(pid))
        return True

    def drop(self, pid: int, why: str = "exited") -> None:
        if pid not in self.pids:
            return
        self.pids.discard(pid)
        try:
            self.profiler.detach(pid)
        except Exception as e:  # the process is gone; the profiler may say so
            log.debug("detach %d: %s", pid, e)
        self.state.forget_target(pid)
        self.last_read.pop(pid, None)
        log.info("pid %d %s: detached", pid, why)

    @staticmethod
    def name(pid: int) -> str:
        try:
            return psutil.Process(pid).name()
        except psutil.Error:
            return "?"

    def cgroup_pids(self) -> set[int] | None:
        """Processes in the cgroup, or None when the cgroup is gone."""
        try:
            text = (self.cgroup / "cgroup.procs").read_text()
        except FileNotFoundError:
            return None
        return {int(x) for x in text.split()}

    def refresh(self) -> str | None:
        """Drop the targets that exited, follow the cgroup; a reason to stop, or None."""
        for pid in list(self.pids):
            if not self.alive(pid):
                self.drop(pid)
        if self.cgroup is not None:
            procs = self.cgroup_pids()
            if procs is None:
                return f"cgroup {self.cgroup} is gone"
            for pid in procs - self.pids:
                if self.alive(pid):
                    self.attach(pid, strict=False)
            for pid in self.pids - procs:
                self.drop(pid, "left the cgroup")
            self._attach_failed &= procs
        return None
