"""pagetier.ko on the memory kinds it tracks besides private anonymous memory, under the hazards
their pages meet: a target (kmod_hazards.c ``kinds``) maps a memfd (shmem), a file on ext4
MAP_SHARED and another MAP_PRIVATE (written: partly copies), and for its life munmaps, remaps,
mremaps, mprotects, madvises (DONTNEED, REMOVE, PAGEOUT, COLD), truncates, punches holes,
pwrites beside its mappings, msyncs and forks, checking every page it touches against its
model of what each must hold. Meanwhile the test attaches it (fault, abit, or fault with
kinds auto, as the daemon does), reads and unmarks from other threads and moves its pages
between node 0 and node 1, and ends its life one of four ways: its own exit; a detach halfway;
attach/detach cycles through both modes; the descriptors closed mid-scan and rmmod at once.
After a detach or rmmod the target checks every mapped page while the system's hinting faults
are counted: none may come (no page left inaccessible). At the end the two files, read back
from the disk (caches dropped), must hold what the model says. The harness fails the run on any
kernel report.

Short lives run by default; ``test_kinds_hazards_long`` (marked ``long``) strings lives of every
kind together for PAGETIER_KINDS_S seconds (default 1800; scripts/hardening.sh runs it)."""
from __future__ import annotations

import errno
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from pagetier.bench.live import FileSystem
from pagetier.core import mover
from pagetier.profiler import kmod

from helpers import build_hazards, targets, vmstat

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_fresh")]

SCAN_MS = 20
SHORT_S = 20  # a short life: about a thousand hazards under emulation
LONG_LIFE_S = 45
CYCLES_END_S = 6  # the cycles stop this long before the target's end: its last pass must come
WAIT_S = 120  # for a line of the target's: generous, under emulation on a loaded host
HAZARDS = ("munmap", "remap", "mremap", "mprotect", "dontneed", "remove", "pageout", "cold",
           "truncate", "punch", "pwrite", "msync", "fork")
# errors of a move_pages call as a whole that a target's exit explains: counted, not failures
EXITING = (errno.ESRCH, errno.EINVAL)


def _exiting(pid: int) -> bool:
    """Whether ``pid`` is gone, a zombie, or has no address space left (exiting)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    state = re.search(r"^State:\s+(\S)", status, re.M)
    return (state is not None and state.group(1) in "ZX") or "VmSize:" not in status


@pytest.fixture(scope="module")
def helper(tmp_path_factory) -> str:
    """kmod_hazards.c, compiled for this guest."""
    return build_hazards(tmp_path_factory.mktemp("kinds"))


@pytest.fixture(scope="module")
def ext4(tmp_path_factory):
    """A directory on ext4 (an image on a loop device): page cache that is written back and
    that move_pages migrates dirty. Each life's files take 16 MiB and are removed after it."""
    fs = FileSystem(64, root=tmp_path_factory.mktemp("kinds-fs"))
    yield fs.__enter__()
    fs.__exit__(None, None, None)


class Target:
    """One ``kmod_hazards kinds`` process and the lines it prints."""

    def __init__(self, helper: str, directory: Path, seconds: float, seed: int):
        self.proc = subprocess.Popen([helper, "kinds", str(directory), str(seconds), str(seed)],
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid
        self.lines: queue.Queue = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self.line("ready")
        assert ready.startswith("ready"), ready

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.out.append(line.rstrip())
            self.lines.put(line.rstrip())
        self.lines.put(None)

    def line(self, prefix: str) -> str:
        """The next line starting with ``prefix``; fail naming what it printed otherwise."""
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                got = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                got = ""
            if got is None or time.monotonic() > deadline:
                self.proc.wait(timeout=WAIT_S)
                raise AssertionError(f"no {prefix!r} line from the target (exit "
                                     f"{self.proc.returncode}): {self.out[-5:]}")
            if got.startswith(prefix):
                return got

    def alive(self) -> bool:
        return self.proc.poll() is None

    def no_page_inaccessible(self) -> int:
        """Have the target check every mapped page while the system's hinting faults are
        counted (by the target, around its own pass: no child of its is alive then); assert
        none came. Returns the pages checked."""
        self.proc.send_signal(signal.SIGUSR1)
        _, pages, faults = self.line("pass ").split()
        assert int(pages) > 0, "the pass checked no page: the check could not fail"
        assert int(faults) == 0, f"{faults} hinting faults in a pass over {pages} pages " \
                                 "after the module let the target go"
        return int(pages)

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()


def _reader(pid: int, stop: threading.Event, counts: Counter, errors: list) -> None:
    """READs (with and without reset), UNMARKs of some of what was read and STATS, on a
    descriptor of its own; ESRCH (not attached at that moment, or gone) counted."""
    dev, rng = kmod.Device(), random.Random(pid)
    try:
        while not stop.is_set():
            try:
                rec = dev.read(pid, reset=rng.random() < 0.5)
                counts["reads"] += 1
                if len(rec):
                    pick = np.asarray(rec["addr"], np.uint64)[rng.randrange(len(rec))::7][:512]
                    dev.unmark(pid, pick)
                    counts["unmarks"] += 1
                st = dev.stats(pid)
                for kind in ("pages_shmem", "pages_file"):
                    counts[f"max {kind}"] = max(counts[f"max {kind}"], st.get(kind, 0))
            except kmod.KmodError as e:
                if e.errno != errno.ESRCH:
                    raise
                counts["reader ESRCH"] += 1
            time.sleep(0.02)
    except BaseException as e:  # noqa: BLE001 - handed to the test's thread
        errors.append(e)
    finally:
        dev.close()


def _mover(pid: int, fault, stop: threading.Event, counts: Counter, errors: list) -> None:
    """Moves up to 256 of the pages a READ lists to node 1, then to node 0, and so on, through
    pagetier.core.mover as the daemon does: in fault mode half the time after UNMARKing them
    (the daemon's prepare_move), and always UNMARKing their regions after (its ``moved``) so
    that the next pass reads them again. A move_pages call refused as a whole because the
    target is exiting (ESRCH, EINVAL, and the target gone or without its mm) is counted, as are
    the per-page errors; any other is a failure. ``fault()``: whether the target is
    attached in fault mode now."""
    dev, rng, node = kmod.Device(), np.random.default_rng(pid), 1
    try:
        while not stop.is_set():
            try:
                rec = dev.read(pid)
                if len(rec):
                    addrs = rng.choice(np.asarray(rec["addr"], np.uint64), min(256, len(rec)),
                                       replace=False)
                    if fault() and rng.random() < 0.5:
                        dev.unmark(pid, addrs)
                    try:
                        res = mover.move(pid, addrs, node)
                    except mover.MoveError as e:
                        if e.errno not in EXITING or not _exiting(pid):
                            raise
                        counts["moves refused: target exiting"] += 1
                    else:
                        counts["moves"] += 1
                        for name, n in res.errors.items():
                            counts[f"page {name}"] += n
                        dev.unmark(pid, np.unique(addrs & ~np.uint64((2 << 20) - 1)))
                    node ^= 1
            except kmod.KmodError as e:
                if e.errno != errno.ESRCH:
                    raise
                counts["mover ESRCH"] += 1
            time.sleep(0.05)
    except BaseException as e:  # noqa: BLE001
        errors.append(e)
    finally:
        dev.close()


class Attacher:
    """The target's attachment: a descriptor of its own in ``mode`` fault or abit, or
    (``auto``) KmodProfiler in fault mode with kinds auto, which attaches again in the mode the
    target's memory calls for (abit, for these kinds)."""

    def __init__(self, pid: int, mode: str):
        self.pid, self.want = pid, mode
        if mode == "auto":
            self.prof = kmod.KmodProfiler("fault", scan_period_ms=SCAN_MS, load=False,
                                          kinds="auto")
            self.dev = self.prof.dev
        else:
            self.prof, self.dev = None, kmod.Device()
        self.mode = ""

    def attach(self, mode: str | None = None) -> str:
        if self.prof:
            self.prof.attach(self.pid)
            self.mode = self.prof.mode_of(self.pid)
        else:
            self.mode = mode or self.want
            self.dev.attach(self.pid, self.mode, scan_period_ms=SCAN_MS)
        return self.mode

    def detach(self) -> None:
        """Detach; ESRCH if the target's exit was noticed first, which is fine."""
        try:
            if self.prof:
                self.prof.detach(self.pid)
            else:
                self.dev.detach(self.pid)
        except kmod.KmodError as e:
            if e.errno != errno.ESRCH:
                raise

    def close(self) -> None:
        """Close the descriptor (the module detaches what it attached), whatever is attached."""
        self.dev.close()


def _summary(line: str) -> dict[str, int]:
    """The hazard counts of the target's last line."""
    return {name: int(n) for name, n in
            re.findall(r"(\w+) (\d+)", line.split("(", 1)[1].split(";", 1)[0])}


def life(helper: str, ext4: Path, mode: str, ending: str, seconds: float, seed: int) -> dict:
    """One target's life attached in ``mode`` (fault, abit, auto) and ended by ``ending``:
    "exit" (its own, attached to the end), "detach" (halfway), "cycles" (attach/detach in both
    modes every second or two), "rmmod" (the descriptors closed mid-scan, the module removed,
    then loaded again). Checks everything the module docstring says; returns the figures."""
    directory = ext4 / f"life{seed}"
    directory.mkdir()
    counts: Counter = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()
    migrated0 = vmstat("pgmigrate_success")
    target = Target(helper, directory, seconds, seed)
    t0 = time.monotonic()
    att = Attacher(target.pid, mode)
    threads: list[threading.Thread] = []
    passes = []
    try:
        got = att.attach()
        threads = [threading.Thread(target=_reader, args=(target.pid, stop, counts, errors)),
                   threading.Thread(target=_mover, args=(target.pid, lambda: att.mode == "fault",
                                                         stop, counts, errors))]
        for th in threads:
            th.start()
        if ending == "cycles":
            rng, cycle = random.Random(seed), 0
            while target.alive() and time.monotonic() + 2 < t0 + seconds - CYCLES_END_S:
                time.sleep(rng.uniform(1, 2))
                was = att.mode
                att.detach()
                if was == "fault":
                    passes.append(target.no_page_inaccessible())
                att.attach(("abit", "fault")[cycle % 2])
                cycle += 1
            counts["attach/detach cycles"] = cycle
        else:
            while time.monotonic() < t0 + seconds / 2 and target.alive():
                time.sleep(0.1)
        if ending == "detach":
            att.detach()
            passes.append(target.no_page_inaccessible())
        elif ending == "rmmod":
            stop.set()  # the others' descriptors would hold the module
            for th in threads:
                th.join(WAIT_S)
            att.close()
            kmod.unload_module()
            try:
                passes.append(target.no_page_inaccessible())
            finally:
                kmod.load_module()
        summary = target.line("kinds:")
        rc = target.proc.wait(timeout=WAIT_S)
    finally:
        stop.set()
        for th in threads:
            th.join(WAIT_S)
        if att.dev.fd >= 0:
            att.detach()
            att.close()
        target.kill()
    assert not errors, errors
    assert rc == 0, target.out[-5:]
    left = targets()
    assert left == "", f"left attached: {left}"
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")  # the files from the disk, not the cache
    verify = subprocess.run([helper, "verify", str(directory)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    shutil.rmtree(directory)
    hazards = _summary(summary)
    done = {h: hazards.get(h, 0) for h in HAZARDS}
    moved = vmstat("pgmigrate_success") - migrated0
    print(f"kinds life: {mode} (attached {got}), ending {ending}, {seconds:.0f} s, seed {seed}; "
          f"target: {summary}; {verify.stdout.strip()}; {moved} pages migrated; no-fault "
          f"passes over {passes} pages; {dict(counts)}")
    assert all(done.values()), f"hazards never done: {[h for h, n in done.items() if not n]}"
    assert counts["moves"] > 0 and moved > 0, "no page moved: the moves were not tested"
    assert counts["max pages_shmem"] > 0 and counts["max pages_file"] > 0, \
        "the module tracked no shmem or file page of the target"
    if mode == "auto":
        assert got == kmod.KINDS_MODE, f"kinds auto attached it in {got}"
    return {"hazards": sum(done.values()), "moved": moved, "passes": len(passes),
            "refused": counts["moves refused: target exiting"]}


CASES = [("fault", "exit"), ("abit", "exit"), ("fault", "detach"), ("auto", "detach"),
         ("fault", "cycles"), ("fault", "rmmod")]


@pytest.mark.parametrize("mode,ending", CASES)
def test_kinds_hazards(helper, ext4, mode, ending):
    """One short life of each kind (module docstring): no corrupt page in memory or in the
    files, no page left inaccessible, nothing left attached."""
    life(helper, ext4, mode, ending, SHORT_S, seed=1 + CASES.index((mode, ending)))


@pytest.mark.long
def test_kinds_hazards_long(helper, ext4):
    """Lives of every case in turn, LONG_LIFE_S each, for PAGETIER_KINDS_S seconds (default
    1800), each with a seed of its own."""
    seconds = float(os.environ.get("PAGETIER_KINDS_S", "1800"))
    end = time.monotonic() + seconds
    total: Counter = Counter()
    lives = 0
    while time.monotonic() + SHORT_S < end:
        mode, ending = CASES[lives % len(CASES)]
        got = life(helper, ext4, mode, ending, min(LONG_LIFE_S, end - time.monotonic()),
                   seed=1000 + lives)
        total.update(got)
        lives += 1
    print(f"kinds hazards: {seconds:.0f} s, {lives} lives, {total['hazards']} hazards, "
          f"{total['moved']} pages moved, 0 corrupt pages, {total['passes']} no-fault passes, "
          f"{total['refused']} moves refused by exiting targets")
    assert lives >= len(CASES) or seconds < LONG_LIFE_S * len(CASES)
