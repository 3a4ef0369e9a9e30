"""kernel.numa_balancing off while the daemon manages placement, and back on every exit path.

The kernel's NUMA balancing moves pages on its own (docs/kernel-facts.md): while pagetier decides
placement it writes 0 to /proc/sys/kernel/numa_balancing. The previous value goes to a state file
(``<run dir>/numa_balancing.json``) first, so that:

- a normal exit, an exception, SIGTERM/SIGINT (handlers) and interpreter exit (atexit) restore it;
- after a SIGKILL, numa_balancing is restored by the next start if the last one died: the next
  :meth:`NumaBalancing.disable` finds the state file of a dead owner and writes its value back.

Two daemons at once: the second finds a live owner's state file, leaves the file alone and does
not restore on exit; the owner restores when it ends.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import signal
from pathlib import Path

import psutil

from pagetier.errors import Unavailable
from pagetier.protocol import run_dir

log = logging.getLogger("pagetier.numab")

PROC_PATH = Path("/proc/sys/kernel/numa_balancing")


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


class NumaBalancing:
    """Context manager: ``with NumaBalancing(): ...`` runs with numa_balancing 0."""

    def __init__(self, proc_path: str | os.PathLike = PROC_PATH,
                 state_path: str | os.PathLike | None = None, dry_run: bool = False):
        self.proc_path = Path(proc_path)
        self.state_path = Path(state_path) if state_path else run_dir() / "numa_balancing.json"
        self.dry_run = dry_run  # log what would be written, write nothing
        self.previous: str | None = None  # value to restore; None: nothing to do
        self._atexit = False

    # --- kernel file I/O in one place
    def read(self) -> str:
        return self.proc_path.read_text().strip()

    def _write(self, value: str) -> None:
        if self.dry_run:
            log.info("dry run: would write %s to %s", value, self.proc_path)
            return
        try:
            self.proc_path.write_text(value)
        except PermissionError:
            raise Unavailable(f"cannot write {self.proc_path}: run pagetier as root")

    # --- the state file
    def _read_state(self) -> dict | None:
        try:
            return json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("ignoring unreadable %s: %s", self.state_path, e)
            return None

    def _owner_alive(self, st: dict) -> bool:
        pid = st.get("pid")
        if not isinstance(pid, int) or pid == os.getpid():
            return False
        t = _start_time(pid)
        return t is not None and abs(t - st.get("start_time", t)) < 1.0

    def recover(self) -> bool:
        """Restore the value a dead daemon left in the state file; True if it did."""
        st = self._read_state()
        if st is None or self._owner_alive(st):
            return False
        value = str(st.get("value", "")).strip()
        if value:
            self._write(value)
            log.warning("numa_balancing restored to %s: pagetier pid %s died without restoring it",
                        value, st.get("pid"))
        self.state_path.unlink(missing_ok=True)
        return bool(value)

    def disable(self) -> None:
        """Record the current value and write 0 (restore a dead daemon's value first)."""
        if self.previous is not None:
            return
        if not self.proc_path.exists():
            log.info("%s does not exist (kernel without NUMA balancing): nothing to disable",
                     self.proc_path)
            return
        self.recover()
        st = self._read_state()
        if st is not None and self._owner_alive(st):
            log.info("numa_balancing is managed by pagetier pid %s; leaving it to that one", st["pid"])
            return
        value = self.read()
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.state_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"value": value, "pid": os.getpid(),
                                       "start_time": _start_time(os.getpid())}))
            os.replace(tmp, self.state_path)
        except PermissionError:
            raise Unavailable(f"cannot write {self.state_path}: run pagetier as root "
                              "or set PAGETIER_RUN_DIR")
        self.previous = value
        if not self._atexit:
            atexit.register(self.restore)
            self._atexit = True
        if value != "0":
            self._write("0")
            log.info("numa_balancing %s -> 0 while pagetier manages placement", value)
        else:
            log.info("numa_balancing already 0")

    def restore(self) -> None:
        """Write the recorded value back and remove the state file; safe to call twice."""
        if self.previous is None:
            return
        value, self.previous = self.previous, None
        try:
            if value != "0":
                self._write(value)
                log.info("numa_balancing restored to %s", value)
        finally:
            self.state_path.unlink(missing_ok=True)

    def __enter__(self):
        self.disable()
        self._old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if signal.getsignal(sig) == signal.SIG_DFL:
                    # a default SIGTERM would skip atexit: turn it into SystemExit
                    self._old_handlers[sig] = signal.signal(sig, _exit_on_signal)
            except ValueError:  # not the main thread
                pass
        return self

    def __exit__(self, *exc):
        try:
            self.restore()
        finally:
            for sig, old in self._old_handlers.items():
                try:
                    signal.signal(sig, old)
                except ValueError:
                    pass


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)
