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

PAGETIER = [sys.executable, "-m", "pagetier.cli"]
NUMAB = Path("/proc/sys/kernel/numa_balancing")
COUNTERS = ("promoted", "demoted", "failed", "busy", "gone", "bytes_moved", "ping_pongs",
            "forced_demotions", "clipped")


class DaemonRun:
    """A `pagetier ARGS` process whose stdout lines are collected by a thread: ``stats`` (the
    daemon's JSON lines) and ``events`` (the workload's, when it shares stdout)."""

    def __init__(self, args: list[str], env: dict, **popen):
        self.env = env
        self.proc = subprocess.Popen([*PAGETIER, *args], stdout=subprocess.PIPE,
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
                raise AssertionError(f"no {what} in {timeout:.0f} s; moved {self.moved()} pages; "
                                     f"stderr:\n{self.stderr[-3000:]}")
            time.sleep(0.2)

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
