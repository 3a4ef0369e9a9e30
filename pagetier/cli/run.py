"""``pagetier run``, and the daemon options and set-up it shares with ``pagetier attach``."""
from __future__ import annotations

import logging
import os
import subprocess
import sys

import click

from pagetier.cli import stop_child
from pagetier.daemon import cgroups
from pagetier.daemon import config as config_mod
from pagetier.daemon.status import remove_stale_status
from pagetier.errors import ConfigError, PagetierError

log = logging.getLogger("pagetier.daemon")


def _kv(pairs, opt: str) -> dict | None:
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise ConfigError(f"{opt} takes KEY=VALUE, got {p!r}")
        out[key.strip().replace("-", "_")] = config_mod.parse_value(value.strip())
    return out or None


def daemon_options(f):
    """The options run and attach share (each overrides the config file's key of that name)."""
    opts = [
        click.option("--config", "-c", "config_path", type=click.Path(dir_okay=False),
                     help="TOML config file (see scripts/pagetier.toml); options override it"),
        click.option("--policy", help="placement policy (default heuristic)"),
        click.option("--policy-option", "policy_option", multiple=True, metavar="KEY=VALUE",
                     help="a policy option (repeatable)"),
        click.option("--fast-node", type=int, help="the fast NUMA node (default 0)"),
        click.option("--slow-node", type=int, help="the slow NUMA node (default 1)"),
        click.option("--fast-budget", metavar="SIZE",
                     help="bytes the targets may keep on the fast node, e.g. 96M, 2G"),
        click.option("--fast-free-watermark", metavar="SIZE",
                     help="instead of a budget: keep this much of the fast node free"),
        click.option("--rate", type=float, help="migration limit in MB/s (default 512; 0: none)"),
        click.option("--interval", "-i", type=float, help="seconds per interval (default 1)"),
        click.option("--profiler", help="profiler backend (default kmod; stub for tests)"),
        click.option("--profiler-option", "profiler_option", multiple=True, metavar="KEY=VALUE",
                     help="a profiler option (repeatable), e.g. mode=abit"),
        click.option("--dry-run", is_flag=True, default=None, help="decide and report, move nothing"),
        click.option("--json", "-j", "json_", is_flag=True, default=None,
                     help="one JSON stats line per interval"),
        click.option("--log-file", type=click.Path(dir_okay=False), help="also log to this file"),
        click.option("--metrics", metavar="[ADDR:]PORT",
                     help="serve Prometheus metrics on http://ADDR:PORT/metrics; PORT alone "
                          "listens on all IPv4 addresses (like node_exporter), [::]:PORT on IPv6 "
                          "too, 127.0.0.1:PORT on this machine only"),
        click.option("--duration", "-d", type=float, help="stop after this many seconds"),
        click.option("--verbose", "-v", is_flag=True, help="debug logging"),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _load(kw) -> config_mod.Config:
    overrides = {
        "policy": kw["policy"], "policy_options": _kv(kw["policy_option"], "--policy-option"),
        "fast_node": kw["fast_node"], "slow_node": kw["slow_node"],
        "fast_budget": kw["fast_budget"], "fast_free_watermark": kw["fast_free_watermark"],
        "rate": kw["rate"], "interval": kw["interval"], "profiler": kw["profiler"],
        "profiler_options": _kv(kw["profiler_option"], "--profiler-option"),
        "dry_run": kw["dry_run"], "json": kw["json_"], "log_file": kw["log_file"],
        "metrics": kw["metrics"],
    }
    kw["_overrides"] = overrides
    cfg = config_mod.load(kw["config_path"], overrides)
    # what the user named is checked before the machine: an unknown policy or option is
    # reported as such on a host with one NUMA node too
    from pagetier.cli import check_profiler_options
    from pagetier.daemon.loop import create_policy

    create_policy(cfg)
    check_profiler_options(cfg.profiler, cfg.profiler_options, cfg.source)
    if not (cfg.profiler == "stub" and cfg.dry_run):  # a stub dry run touches no node
        config_mod.check_nodes(cfg)
    return cfg


def setup_logging(verbose: bool = False, log_file: str | None = None) -> None:
    """The pagetier loggers to stderr (and ``log_file``), INFO or with ``verbose`` DEBUG."""
    root = logging.getLogger("pagetier")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(logging.Formatter("pagetier: %(message)s"))
    root.addHandler(err)
    if log_file:
        try:
            fh = logging.FileHandler(log_file)
        except OSError as e:
            raise ConfigError(f"log_file {log_file}: {e.strerror}")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(fh)
    root.propagate = False


def _daemon(cfg, kw, **targets):
    from pagetier.daemon.loop import Daemon, create_policy, create_profiler
    from pagetier.daemon.numab import NumaBalancing

    remove_stale_status()
    metrics = None
    if cfg.metrics:  # listening first: a port in use ends the start before anything is attached
        from pagetier.daemon.metrics import Metrics

        metrics = Metrics(cfg.metrics)
        metrics.start()
    try:
        profiler = create_profiler(cfg)
    except BaseException:
        if metrics is not None:
            metrics.close()
        raise
    try:
        policy = create_policy(cfg)
    except BaseException:
        profiler.close()
        if metrics is not None:
            metrics.close()
        raise
    numab = NumaBalancing(dry_run=cfg.dry_run)
    cfg.duration = kw["duration"]
    daemon = Daemon(cfg, profiler=profiler, policy=policy, numab=numab, **targets)
    daemon.metrics = metrics
    return daemon


EPILOG_RUN = """\b
Examples:
  pagetier run --fast-budget 96M -- ./myapp --threads 4
  pagetier run --fast-budget 96M --interval 1 --json -- pagetier workload --size 256 --hot 64
  pagetier run --profiler-option mode=abit --dry-run -- ./myapp
  pagetier run -c /etc/pagetier/pagetier.toml --duration 60 -- ./myapp

The command's exit status is passed through. SIGTERM/SIGINT (and --duration) stop managing,
pass the signal on to the command and wait for it. SIGHUP reloads the config file.
"""


@click.command("run", epilog=EPILOG_RUN)
@daemon_options
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def command(cmd, **kw):
    """Start CMD and manage the placement of its pages until it exits."""
    cfg = _load(kw)
    setup_logging(kw["verbose"], cfg.log_file)
    daemon = _daemon(cfg, kw)
    cg = None  # the command's own cgroup
    # numa_balancing off before the command first touches its memory
    try:
        daemon.numab.disable()
        daemon.open_control()  # before the command starts: it may annotate itself at once
        env = dict(os.environ)
        if daemon.control is not None:
            env["PAGETIER_SOCKET"] = str(daemon.control.path)  # pagetier.annotate finds it
        # the command's whole process tree is managed: in a cgroup of its own when one can be
        # made (root, cgroup v2), else by following its /proc descendants (daemon/targets.py)
        cg = cgroups.make_run_cgroup(cfg.profiler)
        try:
            child = subprocess.Popen(list(cmd), env=env,
                                     preexec_fn=cgroups.enter(cg) if cg else None)
        except OSError as e:
            raise PagetierError(f"cannot start {cmd[0]}: {e.strerror}")
        except subprocess.SubprocessError as e:  # could not enter the cgroup: start it without
            log.info("cannot start the command in cgroup %s (%s): following its descendants",
                     cg, e)
            cgroups.remove_run_cgroup(cg)
            cg = None
            child = subprocess.Popen(list(cmd), env=env)
        daemon.adopt(child)
        if cg is not None:
            daemon.tracker.add_cgroup(cg)
        else:
            daemon.tracker.tree = True
        rc = daemon.run()
    except BaseException:
        stop_child(daemon.child)
        daemon.profiler.close()
        daemon.numab.restore()
        daemon.close_control()
        raise
    finally:
        cgroups.remove_run_cgroup(cg)
    sys.exit(rc)
