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

HERE = Path(__file__).resolve().parent
# a checkout builds into its build/bin (the test VM's guest sees the checkout read-only and uses
# what the host built there); an installed package into the package's own _bin, or, if that is
# not writable (a system-wide install), into the user's cache
_CHECKOUT = (HERE.parent / "setup.py").is_file() and (HERE.parent / "kmod").is_dir()


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagetier" / "bin"


def bin_dirs() -> list[Path]:
    """Where compiled workloads go, in order of preference."""
    if _CHECKOUT:
        return [HERE.parent / "build" / "bin"]
    return [HERE / "_bin", _cache_dir()]


def _fresh(exe: Path, source: Path) -> bool:
    return exe.exists() and exe.stat().st_mtime >= source.stat().st_mtime


def binary(name: str = "hotcold") -> Path:
    """A compiled C program of pagetier/ (hotcold, churn), built if needed (on the host: the
    guest sees the repository read-only)."""
    source = HERE / f"{name}.c"
    if not source.is_file():
        raise Unavailable(f"{source} is missing: the package is incomplete, reinstall pagetier")
    dirs = bin_dirs()
    for d in dirs:
        if _fresh(d / name, source):
            return d / name
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable(f"no C compiler to build the workload {name}: install gcc and libnuma-dev "
                          "(scripts/setup.sh installs them)")
    errors = []
    for d in dirs:
        exe = d / name
        try:
            d.mkdir(parents=True, exist_ok=True)
            if not os.access(d, os.W_OK):
                raise PermissionError(f"{d} is not writable")
        except OSError as e:
            errors.append(f"{d}: {e.strerror or e}")
            continue
        # compile to a temporary name and rename: two first uses at once both see a whole binary
        tmp = d / f".{name}.{os.getpid()}"
        try:
            subprocess.run([cc, "-O2", "-Wall", "-o", str(tmp), str(source), "-lnuma"], check=True,
                           capture_output=True, text=True)
            os.replace(tmp, exe)
        except subprocess.CalledProcessError as e:
            raise Unavailable(f"building {source.name} failed (is libnuma-dev installed?):\n{e.stderr}")
        except OSError as e:
            errors.append(f"{d}: {e.strerror or e}")
            continue
        finally:
            tmp.unlink(missing_ok=True)
        return exe
    raise Unavailable(f"cannot build {source.name} ({'; '.join(errors)}); "
                      "on the test VM's guest, build it on the host first")


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
