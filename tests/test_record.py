"""profiler/record.py's reading step: pagetier.ko is read in full and filtered by record."""
import subprocess

import numpy as np

from pagetier.core.sample import KIND_ANON, KIND_FILE, KIND_SHMEM, Sample
from pagetier.profiler.base import Profiler
from pagetier.profiler.record import record_trace
from pagetier.profiler.trace import read_trace


class FullReads(Profiler):
    """A backend named like pagetier.ko: every read lists all four units, two of them idle."""

    name = "kmod"

    def __init__(self):
        self.asked = []

    def attach(self, pid):
        pass

    def detach(self, pid):
        pass

    def read(self, pid, reset=True, accessed_only=False):
        self.asked.append(accessed_only)
        return Sample(pid, np.arange(4, dtype=np.uint64) * 4096 + 0x10000,
                      np.array([0, 5, 0, 2], np.uint32), np.full(4, 1, np.int16),
                      np.ones(4, np.uint16),
                      kind=np.array([KIND_ANON, KIND_SHMEM, KIND_FILE, KIND_FILE], np.uint8))


def record_sleep(prof, out, **options):
    """``record_trace`` of a ``sleep`` (a harmless process of its own) for 0.1 s; the trace
    and the summary."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        summary = record_trace(prof, [proc.pid], str(out), interval_s=0.05, duration=0.1,
                               nodes=False, **options)
    finally:
        proc.kill()
        proc.wait()
    return read_trace(out), summary


def test_kmod_reads_keep_only_accessed_units_with_their_kind(tmp_path):
    prof = FullReads()
    tr, summary = record_sleep(prof, tmp_path / "k.parquet")
    assert prof.asked and not any(prof.asked)  # read in full...
    n = summary["intervals"]
    assert n >= 1 and len(tr) == 2 * n  # ...and only the accessed units written
    assert tr.column("count").tolist() == [5, 2] * n
    assert tr.column("kind").tolist() == [KIND_SHMEM, KIND_FILE] * n
    assert tr.meta["complete"] is False


def test_all_pages_keeps_idle_units(tmp_path):
    tr, summary = record_sleep(FullReads(), tmp_path / "k.parquet", all_pages=True)
    assert len(tr) == 4 * summary["intervals"] and tr.meta["complete"] is True


def test_stop_child_ends_and_reaps_a_command_even_one_that_ignores_sigterm():
    from pagetier.cli import stop_child

    plain = subprocess.Popen(["sleep", "30"])
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; echo ready; exec sleep 30"],
                                stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"  # SIGTERM ignored, across the exec too
    stop_child(plain)
    stop_child(stubborn, timeout=0.2)
    assert plain.returncode == -15 and stubborn.returncode == -9
    stop_child(plain)  # already ended: nothing to do
    stop_child(None)
