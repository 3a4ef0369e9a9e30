"""pagetier run / attach / status: the daemon's commands (pagetier/cli.py loads them lazily)."""
from __future__ import annotations

import glob
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import click
import psutil

from pagetier.daemon import config as config_mod
from pagetier.errors import ConfigError, PagetierError, Unavailable

log = logging.getLogger("pagetier.daemon")


def _parse_value(v: str):
    """A KEY=VALUE option's value: int, float, true/false, or a string."""
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _kv(pairs, opt: str) -> dict | None:
    out = {}
    for p in pairs:
        key, eq, value = p.partition("=")
        if not eq or not key:
            raise ConfigError(f"{opt} takes KEY=VALUE, got {p!r}")
        out[key.strip().replace("-", "_")] = _parse_value(value.strip())
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
    }
    kw["_overrides"] = overrides
    cfg = config_mod.load(kw["config_path"], overrides)
    if not (cfg.profiler == "stub" and cfg.dry_run):  # a stub dry run touches no node
        config_mod.check_nodes(cfg)
    return cfg


def setup_logging(cfg, verbose: bool = False) -> None:
    root = logging.getLogger("pagetier")
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for h in list(root.handlers):
        root.removeHandler(h)
    err = logging.StreamHandler(sys.stderr)
    err.setFormatter(logging.Formatter("pagetier: %(message)s"))
    root.addHandler(err)
    if cfg.log_file:
        try:
            fh = logging.FileHandler(cfg.log_file)
        except OSError as e:
            raise ConfigError(f"log_file {cfg.log_file}: {e.strerror}")
        fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(fh)
    root.propagate = False


def _daemon(cfg, kw, **targets):
    from pagetier.daemon.loop import Daemon, create_policy, create_profiler
    from pagetier.daemon.numab import NumaBalancing

    remove_stale_status()
    profiler = create_profiler(cfg)
    try:
        policy = create_policy(cfg)
    except BaseException:
        profiler.close()
        raise
    numab = NumaBalancing(dry_run=cfg.dry_run)
    return Daemon(cfg, profiler=profiler, policy=policy, numab=numab, duration=kw["duration"],
                  config_path=kw["config_path"], overrides=kw["_overrides"], **targets)


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
def run_cmd(cmd, **kw):
    """Start CMD and manage the placement of its pages until it exits."""
    cfg = _load(kw)
    setup_logging(cfg, kw["verbose"])
    daemon = _daemon(cfg, kw)
    # numa_balancing off before the command first touches its memory
    try:
        daemon.numab.disable()
        daemon.open_control()  # before the command starts: it may annotate itself at once
        env = dict(os.environ)
        if daemon.control is not None:
            env["PAGETIER_SOCKET"] = str(daemon.control.path)  # pagetier.annotate finds it
        try:
            child = subprocess.Popen(list(cmd), env=env)
        except OSError as e:
            raise PagetierError(f"cannot start {cmd[0]}: {e.strerror}")
        daemon.child = child
        daemon._initial.append(child.pid)
        rc = daemon.run()
    except BaseException:
        ch = daemon.child
        if ch is not None and ch.poll() is None:
            ch.terminate()
            try:
                ch.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ch.kill()
        daemon.profiler.close()
        daemon.numab.restore()
        daemon.close_control()
        raise
    sys.exit(rc)


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
def attach_cmd(pids, cgroup, **kw):
    """Manage the placement of running processes' pages."""
    pid_list = _parse_pids(pids)
    cg = _cgroup_path(cgroup) if cgroup else None
    if not pid_list and cg is None:
        raise click.UsageError("give PID[,PID...] or --cgroup PATH")
    cfg = _load(kw)
    setup_logging(cfg, kw["verbose"])
    daemon = _daemon(cfg, kw, pids=pid_list, cgroup=str(cg) if cg else None)
    sys.exit(daemon.run())


def _daemon_alive(doc: dict) -> bool:
    """The status file's daemon still runs (not a later process that got its pid)."""
    try:
        created = psutil.Process(int(doc.get("pid", -1))).create_time()
    except (psutil.Error, ValueError, TypeError):
        return False
    return created <= float(doc.get("started", created)) + 1


def read_status(directory: Path | None = None) -> list[dict]:
    from pagetier.daemon.numab import run_dir

    d = directory or run_dir()
    out = []
    for path in sorted(glob.glob(str(d / "daemon-*.json"))):
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        doc["alive"] = _daemon_alive(doc)
        doc["path"] = path
        out.append(doc)
    return out


def remove_stale_status(directory: Path | None = None) -> None:
    """Delete the status files of daemons that died without removing them (SIGKILL)."""
    for doc in read_status(directory):
        if not doc["alive"]:
            Path(doc["path"]).unlink(missing_ok=True)
            log.warning("removed the status file of pagetier pid %s: it died without removing it",
                        doc.get("pid"))


def format_status(doc: dict) -> str:
    cfg, last, tot = doc.get("config", {}), doc.get("last") or {}, doc.get("totals", {})
    mib = 1 << 20
    targets = ", ".join(f"{t['pid']} ({t['name']})" for t in doc.get("targets", [])) or "none"
    age = time.time() - doc.get("updated", 0)
    lines = [
        f"pagetier daemon pid {doc['pid']}{'' if doc['alive'] else ' (dead: stale status)'}, "
        f"up {time.time() - doc.get('started', time.time()):.0f} s, updated {age:.0f} s ago",
        f"  policy {cfg.get('policy')}, profiler {cfg.get('profiler')}, fast node "
        f"{cfg.get('fast_node')}, slow node {cfg.get('slow_node')}"
        f"{', dry run' if cfg.get('dry_run') else ''}",
        f"  targets: {targets}" + (f" (cgroup {doc['cgroup']})" if doc.get("cgroup") else ""),
        f"  moved {tot.get('bytes_moved', 0) / mib:.0f} MiB: promoted {tot.get('promoted', 0)} "
        f"demoted {tot.get('demoted', 0)} pages, busy {tot.get('busy', 0)}, failed "
        f"{tot.get('failed', 0)}, ping-pongs {tot.get('ping_pongs', 0)}",
    ]
    if doc.get("control_socket"):
        lines.append(f"  control socket {doc['control_socket']}")
    if last:
        res = " ".join(f"node{n} {b / mib:.0f}M" for n, b in sorted(last.get("resident", {}).items()))
        lines.append(f"  interval {last['interval']}: fast {last['fast_used'] / mib:.0f} of "
                     f"{last['budget'] / mib:.0f} MiB budget; {res}; cpu {last['cpu_s'] * 1000:.1f} ms")
    return "\n".join(lines)


@click.command("status")
@click.option("--json", "-j", "json_", is_flag=True, help="the status files as JSON")
def status_cmd(json_):
    """Show the running daemons: targets, counters, the last interval.

    \b
    Example: pagetier status --json
    """
    docs = read_status()
    if json_:
        click.echo(json.dumps(docs))
        return
    if not docs:
        from pagetier.daemon.numab import run_dir

        raise PagetierError(f"no pagetier daemon is running (no status files in {run_dir()})")
    click.echo("\n".join(format_status(d) for d in docs))


commands = {"run": run_cmd, "attach": attach_cmd, "status": status_cmd}
