"""``pagetier attach``: manage running processes, or a cgroup v2's, until they are gone."""
from __future__ import annotations

import sys
from pathlib import Path

import click
import psutil

from pagetier.cli.run import _daemon, _load, daemon_options, setup_logging
from pagetier.errors import ConfigError, Unavailable


def _parse_pids(spec: str | None) -> list[int]:
    pids = []
    for part in filter(None, (spec or "").replace(" ", ",").split(",")):
        try:
            pid = int(part)
        except ValueError:
            raise ConfigError(f"bad PID {part!r}: give PID[,PID...]")
        if not psutil.pid_exists(pid):
            raise Unavailable(f"no such process: {pid}")
        pids.append(pid)
    return pids


def _cgroup_path(path: str) -> Path:
    p = Path(path)
    for cand in (p, Path("/sys/fs/cgroup") / path.lstrip("/")):
        if (cand / "cgroup.procs").exists():
            return cand
    raise ConfigError(f"--cgroup {path}: not a cgroup v2 directory (no cgroup.procs there or "
                      "under /sys/fs/cgroup)")


EPILOG_ATTACH = """\b
Examples:
  pagetier attach 1234 --fast-budget 2G
  pagetier attach 1234,1240 --json --log-file /var/log/pagetier.log
  pagetier attach --cgroup system.slice/myapp.service -c /etc/pagetier/pagetier.toml

With PIDs it ends when they have all exited; with --cgroup it follows processes as they
join and leave and ends when the cgroup is removed (or on SIGTERM).
"""


@click.command("attach", epilog=EPILOG_ATTACH)
@daemon_options
@click.option("--cgroup", metavar="PATH", help="manage a cgroup v2's processes (and new ones)")
@click.argument("pids", required=False, metavar="[PID[,PID...]]")
def command(pids, cgroup, **kw):
    """Manage the placement of running processes' pages."""
    pid_list = _parse_pids(pids)
    cg = _cgroup_path(cgroup) if cgroup else None
    if not pid_list and cg is None:
        raise click.UsageError("give PID[,PID...] or --cgroup PATH")
    cfg = _load(kw)
    setup_logging(cfg, kw["verbose"])
    daemon = _daemon(cfg, kw, pids=pid_list, cgroup=str(cg) if cg else None)
    sys.exit(daemon.run())
