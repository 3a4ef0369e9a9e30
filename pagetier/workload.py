"""The built-in workload (hotcold.c): a hot part touched constantly, a cold part touched once.

It reports the fraction of its accesses the fast node served, once a second, and checksums its
memory at the end. ``Workload`` starts it and reads its JSON lines. Its buffer is private
anonymous memory, shared memory, a shared file mapping or a private one whose pages it writes
(copies of the file's) (``--memory anon|shmem|file:PATH|private:PATH``, :data:`MEMORY_KINDS`);
:func:`check_file` reads a file it filled back and checks every page.
"""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import numpy as np

from pagetier.errors import ConfigError, Unavailable

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "workloads"  # hotcold.c, churn.c and the Makefile that builds them
# Built by the build, not on first use: in a checkout, scripts/setup.sh builds them into build/bin
# (the test VM's guest sees the checkout read-only and runs what the host built there); an
# installed package has them in pagetier/workloads/bin, built by setup.py's build step.
_CHECKOUT = (HERE.parent / "setup.py").is_file() and (HERE.parent / "kmod").is_dir()
CHECKOUT_BIN = HERE.parent / "build" / "bin"
PACKAGE_BIN = SOURCES / "bin"


# --memory of hotcold: the kinds of memory its buffer can be (file and private take a path:
# file:PATH, private:PATH)
MEMORY_KINDS = ("anon", "shmem", "file", "private")
_WITH_PATH = ("file", "private")
PAGE = 4096
WORDS = PAGE // 8


def memory_arg(kind: str) -> str:
    """``kind`` checked as hotcold's --memory value (anon, shmem, file:PATH or private:PATH);
    ConfigError naming the choices otherwise."""
    name, _, path = kind.partition(":")
    if name not in MEMORY_KINDS or (name in _WITH_PATH) != bool(path):
        raise ConfigError("memory kind must be anon, shmem, file:PATH or private:PATH, got "
                          f"{kind!r}")
    return kind


def pattern(first: int, n: int) -> np.ndarray:
    """What hotcold writes in pages ``[first, first + n)``: a (n, 512) uint64 array whose
    word k of page i is hotcold.c's pattern(i, k) (word 0, the page's access counter, too:
    callers leave it out)."""
    i = np.arange(first, first + n, dtype=np.uint64)[:, None]
    k = np.arange(WORDS, dtype=np.uint64)[None, :]
    x = (i << np.uint64(20)) ^ k ^ np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(31)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    return x


def check_file(path, size: int, chunk_pages: int = 4096) -> tuple[int, list[int]]:
    """Read ``path`` (a file hotcold --memory file:PATH filled, ``size`` bytes) back and check
    every page's pattern: (pages checked, the indices of the corrupt pages)."""
    npages = size // PAGE
    bad: list[int] = []
    with open(path, "rb") as f:
        for first in range(0, npages, chunk_pages):
            n = min(chunk_pages, npages - first)
            data = f.read(n * PAGE)
            got = np.frombuffer(data, np.uint64)
            if len(got) < n * WORDS:  # the file ends early: the rest is corrupt
                bad += range(first + len(got) // WORDS, npages)
                got = got[:len(got) // WORDS * WORDS]
                n = len(got) // WORDS
            ok = (got.reshape(n, WORDS)[:, 1:] == pattern(first, n)[:, 1:]).all(axis=1)
            bad += (first + np.flatnonzero(~ok)).tolist()
            if len(data) < chunk_pages * PAGE and first + n < npages:
                break
    return npages, sorted(bad)


def bin_dir() -> Path:
    """Where the built workloads are."""
    return CHECKOUT_BIN if _CHECKOUT else PACKAGE_BIN


def binary(name: str = "hotcold") -> Path:
    """The built C program of pagetier/workloads/ (hotcold, churn). Raises Unavailable, saying
    how to build it, when it is missing (or, in a checkout, older than its source)."""
    source = SOURCES / f"{name}.c"
    exe = bin_dir() / name
    if _CHECKOUT:
        how = f"build it with scripts/setup.sh (or make -C pagetier/workloads OUT={CHECKOUT_BIN})"
    else:
        how = ("it is built when pagetier is built: reinstall pagetier from a wheel, or build it "
               "with a C compiler and libnuma-dev installed")
    if not exe.is_file():
        raise Unavailable(f"the workload {name} is not built ({exe} is missing): {how}")
    if source.is_file() and exe.stat().st_mtime < source.stat().st_mtime:
        raise Unavailable(f"the workload {name} is older than {source}: {how}")
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
