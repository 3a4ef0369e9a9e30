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

import numpy as np
import psutil

from pagetier.core.state import PageState
from pagetier.daemon.cgroups import Cgroup
from pagetier.errors import PagetierError

log = logging.getLogger("pagetier.daemon")


def shared_mappings(pid: int) -> list[tuple[int, int, tuple, int]]:
    """``pid``'s shared mappings of files and shared memory (a ``s`` in /proc/PID/maps'
    permissions, an inode): (start, end, (device, inode), file offset) each; [] when the file
    cannot be read."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 5 or parts[1][3:4] != "s" or parts[4] == "0":
                    continue
                lo, _, hi = parts[0].partition("-")
                out.append((int(lo, 16), int(hi, 16), (parts[3], parts[4]), int(parts[2], 16)))
    except (OSError, ValueError):
        return []
    return out


def fast_aliases(state: PageState, pids, fast: int) -> int:
    """4 KiB pages the state counts on ``fast`` more than once: a page of a file or of shared
    memory that several targets map is a unit in each of them (units are per process and
    address), and its copies beyond the first are these. The budget charges such a page once
    (daemon/loop.py adds these to it); 0 with under two targets."""
    pids = sorted(pids)
    if len(pids) < 2:
        return 0
    on = np.flatnonzero(state.a["node"] == fast)
    if not len(on):
        return 0
    pid_of, addr, npages = state.pid_of(on), state.a["addr"][on], state.a["npages"][on]
    files: dict[tuple, int] = {}
    idents, weights = [], []
    for pid in pids:
        mine = pid_of == pid
        if not mine.any():
            continue
        a, w = addr[mine], npages[mine]
        for lo, hi, key, off in shared_mappings(pid):
            inside = (a >= lo) & (a < hi)
            if not inside.any():
                continue
            fid = files.setdefault(key, len(files))
            page = (a[inside] - np.uint64(lo) + np.uint64(off)) >> np.uint64(12)
            idents.append((np.uint64(fid) << np.uint64(44)) | page)
            weights.append(w[inside].astype(np.int64))
    if len(idents) < 2:
        return 0
    ident, weight = np.concatenate(idents), np.concatenate(weights)
    _, first = np.unique(ident, return_index=True)
    return int(weight.sum() - weight[first].sum())


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
        tuning = getattr(self.profiler, "tuning", {}).get(pid)
        log.info("attached to pid %d (%s)%s", pid, self.name(pid),
                 f": {tuning['why']}" if tuning and tuning.get("why") else "")
        return True

    def retune(self) -> None:
        """Attach again the targets whose profiler parameters no longer fit their memory (kmod:
        a program that had too little memory to tell at attach, then mapped mostly 4 KiB
        shared memory or page cache; KmodProfiler.retune). Their units are forgotten."""
        retune = getattr(self.profiler, "retune", None)
        if retune is None:
            return
        for pid in sorted(self.pids):
            try:
                again = retune(pid)
            except (PagetierError, OSError):
                continue  # gone: the next refresh drops it
            if again:
                group = self.group_of(pid)
                self.drop(pid, "has other memory now: attaching it again")
                if self.attach(pid, strict=False) and group is not None:
                    group.pids.add(pid)

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
        # the command's exit status before the targets' liveness: read after, it could find the
        # command gone that the liveness test still saw running (sh -c "sleep 2; exit 3": the
        # sleep, then sh a moment later) and let go of a process that has exited
        exited = self.child is not None and self.child.poll() is not None
        for pid in list(self.pids):
            if not self.alive(pid):
                self.drop(pid)
        if exited:
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
        self.retune()
        return None
