"""Managed cgroups: the cgroup v2 directories whose processes the daemon follows, each with its
own fast budget, and the cgroup ``pagetier run`` starts its command in.

A managed cgroup is a directory of the unified hierarchy (absolute, or relative to
CGROUP_ROOT). Its processes are those in its ``cgroup.procs`` and in those of the cgroups below
it (a Kubernetes pod's processes sit in its containers' cgroups); a process in two managed
cgroups (one nested in the other) belongs to the deeper one. Its budget is a size, or None:
an equal share of what the node's fast memory (or ``fast_budget``) leaves after the cgroups
that have one (:func:`budgets`).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from pagetier.core.units import PAGE_SIZE, parse_size
from pagetier.errors import ConfigError

log = logging.getLogger("pagetier.daemon")

CGROUP_ROOT = Path("/sys/fs/cgroup")
# "0": `pagetier run` never starts its command in a cgroup of its own (it follows the command's
# /proc descendants); "1": it does whenever it can, even with the stub profiler
ENV_RUN_CGROUP = "PAGETIER_RUN_CGROUP"


@dataclass
class Cgroup:
    """A managed cgroup: its directory, its budget in bytes (None: a fair share) and the pids
    of its processes the daemon manages."""

    path: Path
    fast_budget: int | None = None
    pids: set = field(default_factory=set)

    def procs(self) -> set[int] | None:
        """The processes in the cgroup and below it; None when the cgroup is gone."""
        if not (self.path / "cgroup.procs").exists():
            return None
        out: set[int] = set()
        for d, _dirs, files in os.walk(self.path):
            if "cgroup.procs" not in files:
                continue
            try:
                out.update(int(x) for x in (Path(d) / "cgroup.procs").read_text().split())
            except (FileNotFoundError, ValueError):  # removed meanwhile, or being written
                continue
        return out


def resolve(path: str | os.PathLike, root: Path = CGROUP_ROOT) -> Path:
    """The cgroup directory ``path`` names (as given, or under ``root``); ConfigError if there is
    no cgroup v2 directory there."""
    p = Path(path)
    for cand in (p, root / str(path).lstrip("/")):
        if (cand / "cgroup.procs").exists():
            return cand
    raise ConfigError(f"cgroup {path}: not a cgroup v2 directory (no cgroup.procs there or "
                      f"under {root})")


def parse_spec(spec: str) -> tuple[str, int | None]:
    """``PATH[:BUDGET]`` (the --cgroup option) -> (path, budget bytes or None)."""
    path, sep, budget = spec.rpartition(":")
    if not sep or "/" in budget or not budget.strip():
        return spec, None
    return path, parse_size(budget, f"--cgroup {spec}: BUDGET")


def parse_tables(value, where: str) -> list[dict]:
    """The config file's ``[[cgroup]]`` tables -> [{"path": str, "fast_budget": bytes|None}]."""
    out = []
    for i, t in enumerate(value):
        at = f"{where}: [[cgroup]] #{i + 1}"
        if not isinstance(t, dict):
            raise ConfigError(f"{at}: must be a table with path and fast_budget")
        unknown = set(t) - {"path", "fast_budget"}
        if unknown:
            raise ConfigError(f"{at}: unknown key {sorted(unknown)[0]!r} (known: path, fast_budget)")
        if not isinstance(t.get("path"), str) or not t["path"]:
            raise ConfigError(f"{at}: path must be a string (a cgroup v2 directory)")
        budget = t.get("fast_budget")
        out.append({"path": t["path"],
                    "fast_budget": None if budget is None else parse_size(budget, "fast_budget", at)})
    return out


def budgets(groups: list[Cgroup], total_pages: int) -> list[int]:
    """Each group's budget in pages: its own, else an equal share of what ``total_pages`` (the
    fast memory the targets may hold) leaves after the budgets given."""
    fixed = sum(g.fast_budget // PAGE_SIZE for g in groups if g.fast_budget is not None)
    shared = [g for g in groups if g.fast_budget is None]
    share = max(0, total_pages - fixed) // len(shared) if shared else 0
    return [g.fast_budget // PAGE_SIZE if g.fast_budget is not None else share for g in groups]


# ---------------------------------------------------------------------- pagetier run's own cgroup
def own_cgroup() -> Path | None:
    """This process's cgroup v2 directory (None: no unified hierarchy)."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return CGROUP_ROOT / line[3:].lstrip("/")
    except OSError:
        return None
    return None


def make_run_cgroup(profiler: str) -> Path | None:
    """A new cgroup for the command ``pagetier run`` starts (next to the daemon's own cgroup, or
    under the root when the daemon is in the root cgroup); None when it cannot make one (not
    root, no writable cgroup v2) or should not (the stub profiler manages no real memory, so
    it gets none unless $PAGETIER_RUN_CGROUP=1; "0" turns cgroups off)."""
    env = os.environ.get(ENV_RUN_CGROUP, "")
    if env == "0" or (profiler == "stub" and env != "1") or os.geteuid() != 0:
        return None
    own = own_cgroup()
    if own is None:
        return None
    parent = own.parent if own != CGROUP_ROOT else CGROUP_ROOT
    remove_stale_run_cgroups(parent)
    path = parent / f"pagetier-run-{os.getpid()}"
    try:
        path.mkdir()
    except OSError as e:
        log.info("no cgroup of its own for the command (%s): following its /proc descendants",
                 e.strerror)
        return None
    return path


def remove_stale_run_cgroups(parent: Path) -> None:
    """Remove the empty cgroups that ``pagetier run`` daemons left in ``parent`` when they died
    without removing them (SIGKILL): ``pagetier-run-PID`` where no process PID runs. One that
    still holds processes (the dead daemon's command, its orphans) is left as it is."""
    for path in parent.glob("pagetier-run-*"):
        try:
            pid = int(path.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        try:
            os.kill(pid, 0)
            continue  # its daemon (or a process that took its pid) runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        try:
            path.rmdir()
        except OSError:  # processes still in it (EBUSY), or gone meanwhile
            continue
        log.warning("removed cgroup %s: pagetier pid %d died without removing it", path, pid)


def enter(path: Path):
    """A preexec_fn: move the forked child into ``path`` before it execs the command."""
    procs = str(path / "cgroup.procs")

    def _enter():
        with open(procs, "w") as f:
            f.write("0")
    return _enter


def remove_run_cgroup(path: Path | None) -> None:
    """Remove the command's cgroup; processes left in it (the command's orphans) keep it, with
    a warning: nothing is moved or killed."""
    if path is None:
        return
    # an exited process stays in the cgroup until its teardown ends: under emulation and a
    # loaded host that took more than 2 s once
    deadline = time.monotonic() + 10
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            # EBUSY for a moment after the last process was reaped (its exit is still being
            # torn down); for good while processes remain in it
            try:
                empty = not (path / "cgroup.procs").read_text().strip()
            except OSError:
                empty = False
            if not empty or time.monotonic() > deadline:
                log.warning("cgroup %s not removed (%s): processes of the command are still "
                            "in it", path, e.strerror)
                return
            time.sleep(0.05)


# ---------------------------------------------------------------------- the planner's groups
def plan_groups(tracker, state, budget_pages: int, room_pages: int | None, fast: int) -> tuple:
    """The step's groups (pagetier.core.shares.Group) for ``tracker``'s cgroups: none (every
    target under the daemon's one budget) unless there are two cgroups or one with a budget of
    its own. The targets in no managed cgroup form one more group, with a fair share. The
    shares divide the smaller of ``budget_pages`` and what the fast node can hold for the
    targets (their pages on it plus its room)."""
    from pagetier.core.shares import Group

    cgs = list(tracker.cgroups.values())
    if not cgs or (len(cgs) == 1 and cgs[0].fast_budget is None):
        return ()
    grouped = set().union(*(g.pids for g in cgs))
    rest = set(tracker.pids) - grouped
    items = cgs + ([Cgroup(Path("(pids)"), None, rest)] if rest else [])
    total = budget_pages
    if room_pages is not None:
        total = min(total, state.movable_on(fast) + max(0, room_pages))
    return tuple(Group(str(g.path), frozenset(g.pids), b)
                 for g, b in zip(items, budgets(items, total)))


def status(tracker, state, fast: int, slow: int) -> list[dict]:
    """The status file's "cgroups" list."""
    from pagetier.core.shares import Group, usage

    cgs = list(tracker.cgroups.values())
    use = usage(state, [Group(str(g.path), frozenset(g.pids), 0) for g in cgs], fast, slow)
    # fast_unmovable_bytes: of fast_bytes, the pages the kernel refused to move (shared with
    # other processes), outside the budget as for the daemon's fast_used
    return [{"path": str(g.path), "fast_budget": g.fast_budget, "pids": sorted(g.pids),
             "fast_bytes": f * PAGE_SIZE, "fast_unmovable_bytes": u * PAGE_SIZE,
             "slow_bytes": s * PAGE_SIZE}
            for g, (f, u, s) in zip(cgs, use)]
