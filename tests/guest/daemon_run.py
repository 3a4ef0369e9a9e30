"""Driving `pagetier run`/`attach` from guest tests: start it, follow its JSON stats lines as they
come, and read its status file (shared by the integrity, soak and fault tests)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from pagetier.daemon.loop import TOTALS

PAGETIER = [sys.executable, "-m", "pagetier.cli"]
NUMAB = Path("/proc/sys/kernel/numa_balancing")
COUNTERS = TOTALS  # the daemon's: what its status file sums


class DaemonRun:
    """A `pagetier ARGS` process whose stdout lines are collected by a thread: ``stats`` (the
    daemon's JSON lines) and ``events`` (the workload's, when it shares stdout)."""

    def __init__(self, args: list[str], env: dict, prefix: tuple[str, ...] = (), **popen):
        """``prefix``: a command that runs the daemon (e.g. setpriv dropping a capability)."""
        self.env = env
        self.proc = subprocess.Popen([*prefix, *PAGETIER, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, **popen)
        self.stats: list[dict] = []
        self.events: list[dict] = []
        self.err: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._e = threading.Thread(target=self._read_err, daemon=True)
        self._t.start()
        self._e.start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            (self.events if "event" in d else self.stats).append(d)

    def _read_err(self):
        for line in self.proc.stderr:
            self.err.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self.err)

    def moved(self) -> int:
        """4 KiB pages promoted plus demoted so far."""
        return sum(s["promoted"] + s["demoted"] for s in list(self.stats))

    def wait_for(self, cond, timeout: float, what: str) -> None:
        t0 = time.monotonic()
        while not cond():
            if self.proc.poll() is not None:
                self.finish(5)
                raise AssertionError(f"daemon exited ({self.proc.returncode}) before {what}:\n"
                                     f"{self.stderr[-3000:]}")
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"no {what} in {timeout:.0f} s; moved {self.moved()} pages "
                                     f"in {len(self.stats)} intervals; {self.diagnosis()}\n"
                                     f"stderr:\n{self.stderr[-3000:]}")
            time.sleep(0.2)

    def diagnosis(self) -> str:
        """What a stalled run looks like: its last stats line, the per-page move errors of the
        whole run, where the daemon and its children wait in the kernel, the children's large
        mappings (numa_maps: which node holds their pages) and the module's targets."""
        last = self.stats[-1] if self.stats else None
        errors: dict[str, int] = {}
        for s in list(self.stats):
            for k, v in (s.get("errors") or {}).items():
                errors[k] = errors.get(k, 0) + v
        waits = []
        children = _children(self.proc.pid)
        for pid in [self.proc.pid, *children]:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = Path(f"/proc/{pid}/wchan").read_text()
                stack = Path(f"/proc/{pid}/stack").read_text().replace("\n", " | ")
            except OSError:
                continue
            waits.append(f"pid {pid} state {stat} wchan {wchan} stack {stack}")
        for pid in children:
            waits.append(f"pid {pid} numa_maps (mappings of 1 MiB or more): {_large_mappings(pid)}")
        try:
            targets = Path("/sys/kernel/pagetier/targets").read_text().strip().replace("\n", " | ")
        except OSError as e:
            targets = f"unreadable ({e.strerror})"
        return (f"last stats: {last}; move errors of the run: {errors}; " + "; ".join(waits)
                + f"; module targets: {targets}")

    def status(self) -> dict | None:
        """This daemon's status file (None before the first interval or after it ends)."""
        path = Path(self.env["PAGETIER_RUN_DIR"]) / f"daemon-{self.proc.pid}.json"
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return None

    def stop(self, sig=signal.SIGTERM, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.finish(timeout)

    def finish(self, timeout: float = 120) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._t.join(10)
            self._e.join(10)
        return self.proc.returncode


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _large_mappings(pid: int) -> str:
    """The numa_maps lines of ``pid``'s mappings of at least 1 MiB (their start address, policy
    and per-node page counts), " | "-joined; why not, when they cannot be read."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        numa = Path(f"/proc/{pid}/numa_maps").read_text().splitlines()
    except OSError as e:
        return f"unreadable ({e.strerror})"
    large = set()
    for line in maps:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if hi - lo >= 1 << 20:
            large.add(lo)
    return " | ".join(n for n in numa if int(n.split()[0], 16) in large) or "none"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def meminfo_kib(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k == key:
                return int(v.split()[0])
    raise KeyError(key)


def run_env(tmp_path) -> dict:
    return {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
