"""The built-in workload (hotcold.c): a hot part touched constantly, a cold part touched once.

It reports the fraction of its accesses the fast node served, once a second, and checksums its
memory at the end. ``Workload`` starts it and reads its JSON lines.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import click

from pagetier.errors import Unavailable

BIN_DIR = Path(__file__).resolve().parent.parent / "build" / "bin"


def binary(name: str = "hotcold") -> Path:
    """A compiled C program of pagetier/ (hotcold, churn), built if needed (on the host: the
    guest sees the repository read-only)."""
    source = Path(__file__).with_name(f"{name}.c")
    exe = BIN_DIR / name
    if exe.exists() and exe.stat().st_mtime >= source.stat().st_mtime:
        return exe
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("no C compiler to build the workload: run scripts/setup.sh")
    exe.parent.mkdir(parents=True, exist_ok=True)
    try:
        subprocess.run([cc, "-O2", "-Wall", "-o", str(exe), str(source), "-lnuma"], check=True,
                       capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        raise Unavailable(f"building {source.name} failed (is libnuma-dev installed?):\n{e.stderr}")
    except OSError as e:
        raise Unavailable(f"cannot build {source.name} here ({e}); build it on the host first")
    return exe


class Workload:
    """A running hotcold process. ``ready`` holds its first line (pid, addr, size, hot range)."""

    def __init__(self, *args: str, cmd_prefix: list[str] | None = None):
        self.argv = [*(cmd_prefix or []), str(binary()), *args]
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            rc = self.proc.wait()
            raise RuntimeError(f"workload exited with {rc} before it was ready: {self.argv}")
        self.ready = json.loads(line)
        self.pid = self.proc.pid
        self.ticks: list[dict] = []
        self.done: dict | None = None

    def next_tick(self) -> dict | None:
        line = self.proc.stdout.readline()
        if not line:
            return None
        ev = json.loads(line)
        if ev["event"] == "done":
            self.done = ev
            return None
        self.ticks.append(ev)
        return ev

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM, read the rest of its output, return its exit status (0: memory intact)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        while self.next_tick() is not None:
            pass
        return self.proc.wait(timeout=timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@click.command("workload", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args):
    """Run the built-in hot/cold workload (hotcold --help lists its options).

    \b
    Example: pagetier workload --size 256 --hot 64 --start-node 1 --duration 20
    """
    exe = str(binary())
    sys.stdout.flush()
    os.execv(exe, [exe, *args])
