"""Target tracking: the processes whose pages the daemon manages.

Pids given at the start (and a started command, the *child*) are attached to the profiler;
with cgroups (daemon/cgroups.py), their processes are followed as they join and leave, each
cgroup with its own budget; with ``tree``, the child's descendants (children, grandchildren,
later forks) are followed through /proc each interval, and stay targets until they exit.
Targets that exit are detached and their units forgotten (their pages stay where they are).
"""
from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import psutil

from pagetier.core.state import PageState
from pagetier.daemon.cgroups import Cgroup
from pagetier.errors import PagetierError

log = logging.getLogger("pagetier.daemon")


class Targets:
    """The managed pids (``pids``), attached to ``profiler``; their units live in ``state``."""

    def __init__(self, profiler, state: PageState, *, pids=(), cgroup: str | Path | None = None,
                 child: subprocess.Popen | None = None, cgroups=(), tree: bool = False,
                 serve: bool = False):
        self.profiler, self.state = profiler, state
        self.serve = serve  # no reason to stop when every target and cgroup is gone
        # path -> Cgroup; ``cgroups``: (path, budget bytes or None) pairs, ``cgroup`` one path
        self.cgroups: dict[Path, Cgroup] = {}
        for path, budget in ([(cgroup, None)] if cgroup else []) + list(cgroups):
            self.add_cgroup(path, budget)
        self.had_cgroups = bool(self.cgroups)
        self.tree = tree  # follow the child's /proc descendants
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
        for g in self.cgroups.values():
            g.pids.discard(pid)
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

    @property
    def cgroup(self) -> Path | None:
        """The first managed cgroup (None: none)."""
        return next(iter(self.cgroups), None)

    def add_cgroup(self, path: str | Path, budget: int | None = None) -> Cgroup:
        """Manage ``path``'s processes (from the next refresh), with ``budget`` bytes (None: a
        fair share); a cgroup managed already gets the new budget."""
        path = Path(path)
        g = self.cgroups.get(path)
        if g is None:
            g = self.cgroups[path] = Cgroup(path, budget)
            log.info("managing cgroup %s (fast budget %s)", path,
                     "a fair share" if budget is None else f"{budget >> 20} MiB")
        g.fast_budget = budget
        self.had_cgroups = True
        return g

    def remove_cgroup(self, path: str | Path, why: str = "removed") -> bool:
        """Let cgroup ``path`` go: its processes are detached, their pages left where they are."""
        g = self.cgroups.pop(Path(path), None)
        if g is None:
            return False
        for pid in sorted(g.pids):
            self.drop(pid, f"let go with cgroup {g.path}")
        log.info("cgroup %s %s: let go", g.path, why)
        return True

    def group_of(self, pid: int) -> Cgroup | None:
        for g in self.cgroups.values():
            if pid in g.pids:
                return g
        return None

    def cgroup_pids(self) -> set[int] | None:
        """Processes in the first cgroup, or None when it is gone."""
        g = next(iter(self.cgroups.values()), None)
        return None if g is None else g.procs()

    def _follow_cgroups(self) -> None:
        owner: dict[int, Cgroup] = {}
        # deeper cgroups last: a process in a cgroup nested in another belongs to the deeper one
        for g in sorted(self.cgroups.values(), key=lambda g: len(g.path.parts)):
            procs = g.procs()
            if procs is None:
                self.remove_cgroup(g.path, "is gone")
                continue
            for pid in procs:
                owner[pid] = g
        for g in self.cgroups.values():
            for pid in sorted(g.pids):
                if owner.get(pid) is not g:
                    g.pids.discard(pid)
                    if pid not in owner:
                        self.drop(pid, f"left cgroup {g.path}")
        for pid, g in owner.items():
            if pid not in g.pids and self.alive(pid):
                if pid in self.pids or self.attach(pid, strict=False):
                    g.pids.add(pid)
        self._attach_failed &= set(owner)

    def _follow_tree(self) -> None:
        if self.child is None or self.child.poll() is not None:
            return
        try:
            kids = psutil.Process(self.child.pid).children(recursive=True)
        except psutil.Error:
            return
        for p in kids:
            if p.pid not in self.pids and p.pid not in self._attach_failed and self.alive(p.pid):
                self.attach(p.pid, strict=False)

    def refresh(self) -> str | None:
        """Drop the targets that exited, follow the cgroups and the child's tree; a reason to
        stop, or None."""
        for pid in list(self.pids):
            if not self.alive(pid):
                self.drop(pid)
        if self.child is not None and self.child.poll() is not None:
            if not self.pids:
                return "all targets exited"
            return (f"the command (pid {self.child.pid}) exited: its {len(self.pids)} "
                    "remaining processes are let go")
        if self.cgroups:
            self._follow_cgroups()
            if not self.cgroups and not self.pids and self.child is None and not self.serve:
                return "every managed cgroup is gone"
        if self.tree:
            self._follow_tree()
        return None
