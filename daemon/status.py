"""The daemons' status files: each running daemon writes run_dir()/daemon-PID.json every
interval (daemon/loop.py); ``pagetier status`` reads them, and a starting daemon removes those
of daemons that died without removing theirs."""
from __future__ import annotations

import glob
import json
import logging
import os
import time
from pathlib import Path

from pagetier.protocol import run_dir

log = logging.getLogger("pagetier.daemon")


def create_time(pid: int) -> float | None:
    """When process ``pid`` started (Unix time, as psutil's create_time), from /proc; None if
    there is no such process. Read directly: importing psutil would double the time
    ``pagetier status`` takes to answer."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
        btime = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                     if line.startswith("btime "))
    except (OSError, ValueError, StopIteration):
        return None
    start_ticks = int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, starttime
    return btime + start_ticks / os.sysconf("SC_CLK_TCK")


def _daemon_alive(doc: dict) -> bool:
    """The status file's daemon still runs (not a later process that got its pid)."""
    try:
        created = create_time(int(doc.get("pid", -1)))
    except (ValueError, TypeError):
        return False
    if created is None:
        return False
    return created <= float(doc.get("started", created)) + 1


def read_status(directory: Path | None = None) -> list[dict]:
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
    for c in doc.get("cgroups") or []:  # each managed cgroup against its own budget
        budget = (f"budget {c['fast_budget'] / mib:.0f} MiB" if c.get("fast_budget") is not None
                  else "a fair share")
        n = len(c.get("pids", []))
        lines.append(f"  cgroup {c['path']}: {n} process{'' if n == 1 else 'es'}, fast "
                     f"{c.get('fast_bytes', 0) / mib:.0f} MiB ({budget}), slow "
                     f"{c.get('slow_bytes', 0) / mib:.0f} MiB")
    if doc.get("metrics"):
        lines.append(f"  metrics on {doc['metrics']}")
    if doc.get("control_socket"):
        lines.append(f"  control socket {doc['control_socket']}")
    if last:
        res = " ".join(f"node{n} {b / mib:.0f}M" for n, b in sorted(last.get("resident", {}).items()))
        lines.append(f"  interval {last['interval']}: fast {last['fast_used'] / mib:.0f} of "
                     f"{last['budget'] / mib:.0f} MiB budget; {res}; cpu {last['cpu_s'] * 1000:.1f} ms")
        if last.get("wanted_bytes"):  # what its exchange wanted, moved, and what stopped it there
            moved = (last.get("promoted", 0) + last.get("demoted", 0)) * 4096
            lines.append(f"  exchange {last['wanted_bytes'] / mib:.0f} MiB wanted, "
                         f"{moved / mib:.0f} MiB moved: {last.get('limit')}")
    return "\n".join(lines)
