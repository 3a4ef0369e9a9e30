"""The built-in trace set: traces of real programs recorded by pagetier in the test VM.

They live in ``policies/traces/`` (package data): one zstd Parquet trace per program, coarsened
to 16 KiB units, and ``index.json`` saying for each what program ran, with which command, on
which kernel, recorded how, and what access pattern it shows. ``scripts/record_traces.py``
records them again (it boots the 6.12 VM) and rewrites the directory.

A trace spec ``builtin:NAME`` names one of them (``pagetier bench sim builtin:redis``);
``pagetier bench sim`` with no trace runs them all.
"""
from __future__ import annotations

import json
from pathlib import Path

from pagetier.errors import ConfigError

TRACE_DIR = Path(__file__).resolve().parent / "traces"


def index() -> dict:
    """name -> description (program, command, kernel, mode, shows, footprint_mib, ...)."""
    path = TRACE_DIR / "index.json"
    if not path.exists():
        raise ConfigError(f"no built-in traces in {TRACE_DIR} (run scripts/record_traces.py)")
    return json.loads(path.read_text())


def names() -> list[str]:
    return sorted(index())


def path(name: str) -> Path:
    """The trace file of built-in trace ``name``; ConfigError listing the names otherwise."""
    idx = index()
    if name not in idx:
        raise ConfigError(f"no built-in trace {name!r} (built-in: {', '.join(sorted(idx))})")
    return TRACE_DIR / f"{name}.parquet"


def table() -> str:
    """The index as a table, for ``pagetier bench traces``."""
    idx = index()
    out = [f"{'name':<15} {'program':<22} {'MiB':>6} {'ivals':>5}  shows"]
    for n in sorted(idx):
        d = idx[n]
        out.append(f"{n:<15} {d['program'][:22]:<22} {d.get('footprint_mib', 0):6.0f} "
                   f"{d.get('intervals', 0):5d}  {d['shows']}")
    first = idx[sorted(idx)[0]] if idx else {}
    out.append(f"recorded with pagetier record -b kmod -O mode={first.get('mode', '?')} "
               f"(scan {first.get('scan_period_ms', '?')} ms, read every "
               f"{first.get('interval_ms', '?')} ms) on {first.get('kernel', '?')}, "
               f"units coarsened to {first.get('unit_kb', '?')} KiB")
    return "\n".join(out)
