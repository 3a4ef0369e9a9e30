"""``pagetier attach``: manage running processes, or a cgroup v2's, until they are gone."""
from __future__ import annotations

import sys
from pathlib import Path

import click
import psutil

from pagetier.cli.run import _daemon, _load, daemon_options, setup_logging
from pagetier.daemon import cgroups
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


def _cgroup_spec(spec: str) -> tuple[Path, int | None]:
    """``--cgroup PATH[:BUDGET]`` -> (the cgroup's directory, budget bytes or None)."""
    path, budget = cgroups.parse_spec(spec)
    try:
        return cgroups.resolve(path), budget
    except ConfigError:
        raise ConfigError(f"--cgroup {path}: not a cgroup v2 directory (no cgroup.procs there or "
                          f"under {cgroups.CGROUP_ROOT})") from None


EPILOG_ATTACH = """\b
Examples:
  pagetier attach 1234 --fast-budget 2G
  pagetier attach 1234,1240 --json --log-file /var/log/pagetier.log
  pagetier attach --cgroup system.slice/myapp.service -c /etc/pagetier/pagetier.toml
  pagetier attach --cgroup app1.slice:2G --cgroup app2.slice:1G --cgroup batch.slice
  pagetier attach --serve --metrics 9464 -c /etc/pagetier/pagetier.toml

With PIDs it ends when they have all exited; with --cgroup (repeatable, each with its own
budget) it follows processes as they join and leave and ends when every cgroup is removed
(or on SIGTERM). With --serve it may start with nothing to manage and keeps running when the
last target goes: targets come through the control socket (attach, add_cgroup; this is how
`pagetier kube-sync` hands it a node's pods) until SIGTERM.
"""


@click.command("attach", epilog=EPILOG_ATTACH)
@daemon_options
@click.option("--cgroup", "cgroup", metavar="PATH[:BUDGET]", multiple=True,
              help="manage a cgroup v2's processes (and new ones), with a fast budget of its own "
                   "(e.g. :2G; default: a fair share); repeatable")
@click.option("--serve", is_flag=True,
              help="start with no target and keep running when the last one goes: targets "
                   "come through the control socket (attach, add_cgroup) until SIGTERM")
@click.argument("pids", required=False, metavar="[PID[,PID...]]")
def command(pids, cgroup, serve, **kw):
    """Manage the placement of running processes' pages."""
    pid_list = _parse_pids(pids)
    cgs = [_cgroup_spec(c) for c in cgroup]
    if not pid_list and not cgs and not kw["config_path"] and not serve:
        raise click.UsageError("give PID[,PID...], --cgroup PATH or --serve")
    cfg = _load(kw)
    if not pid_list and not cgs and not cfg.cgroup and not serve:
        raise click.UsageError("give PID[,PID...], --cgroup PATH, [[cgroup]] tables in the "
                               "config or --serve")
    setup_logging(kw["verbose"], cfg.log_file)
    daemon = _daemon(cfg, kw, pids=pid_list, cgroups=cgs, serve=serve)
    sys.exit(daemon.run())
