"""The daemon when things go wrong around it, in the two-node VM: a target killed while its pages
move, a full fast node, rmmod of the module under it, its target detached behind its back,
pages it may not move (shared), SIGKILL and a restart, and an unprivileged /dev/pagetier.

Each ends the same way for a user: a clear log line, no traceback, numa_balancing as it was,
nothing left attached in the module, the workloads' memory intact.
"""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import time

import pytest

from pagetier.core import mover
from pagetier.profiler import kmod
from pagetier.workload import Workload

from daemon_run import NUMAB, PAGETIER, DaemonRun
from helpers import faults_in, node_free, targets

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_loaded")]
MIB = 1 << 20
WAIT = 900  # seconds: a daemon's start (imports) alone can take minutes on a loaded host


def clean_exit(d: DaemonRun, rc: int = 0, numab: str = "0") -> None:
    assert d.proc.returncode == rc, d.stderr[-3000:]
    assert "Traceback" not in d.stderr, d.stderr[-3000:]
    assert NUMAB.read_text().strip() == numab, "numa_balancing not restored"
    assert targets() == "", f"left attached: {targets()}"


def test_target_killed_mid_migration(env, numab_off):
    """SIGKILL the target while the daemon promotes its pages (three times, at different
    moments): the daemon notices, detaches, ends with 'all targets exited'."""
    for delay in (0.0, 0.3, 1.0):
        w = Workload("--size", "128", "--hot", "96", "--start-node", "1", "--duration", "0",
                     "--quiet", "--no-thp")
        # fault mode (kinds off: 4 KiB pages would get abit), whose marks a kill must not strand
        d = DaemonRun(["attach", str(w.pid), "--json", "--fast-budget", "256M", "--interval",
                       "0.5", "--rate", "0", "--profiler-option", "kinds=off"], env)
        try:
            d.wait_for(lambda: d.stats and d.stats[-1]["interval"] >= 1, WAIT, "a first interval")
            time.sleep(delay)
            w.proc.kill()
            w.proc.wait()
            rc = d.finish(WAIT)
        finally:
            if d.proc.poll() is None:
                d.stop()
        print(f"killed after {delay} s: moved {d.moved()} pages in {len(d.stats)} intervals")
        assert rc == 0
        clean_exit(d)
        assert "all targets exited" in d.stderr


def test_fast_node_full(env, numab_off):
    """A hog fills node 0: the daemon stops promoting at node 0's high watermark (or on ENOMEM),
    logs that the node is full, keeps running, and resumes promoting once the hog is gone.

    numa_balancing stays 0 throughout: with it on, the kernel itself moved the target's hot
    part to node 0 before the daemon started, leaving the daemon nothing to promote."""
    w = Workload("--size", "224", "--hot", "192", "--start-node", "1", "--duration", "0",
                 "--quiet", "--no-thp")
    # more than node 0 has free, preferring node 0: node 0 fills to its watermark and the rest
    # falls back to node 1 (binding it to node 0 got it OOM-killed whatever the margin)
    hog_mb = node_free(0) // MIB + 64
    hog = Workload("--size", str(hog_mb), "--hot", "1", "--duration", "0", "--quiet", "--no-thp",
                   cmd_prefix=["numactl", "--preferred=0"])
    try:
        d = DaemonRun(["attach", str(w.pid), "--json", "--interval", "0.5", "--rate", "0"], env)
        try:
            d.wait_for(lambda: "node 0 is full" in d.stderr, WAIT, "the daemon finding node 0 full")
            n = len(d.stats)  # the hog exits within the next few intervals: watch from here
            assert hog.stop() == 0
            d.wait_for(lambda: "node 0 has free memory again" in d.stderr
                       and any(s["promoted"] for s in d.stats[n:]), WAIT,
                       "promotions after the node had room again")
        finally:
            d.stop()
    finally:
        if hog.proc.poll() is None:
            hog.stop()
    print(f"fast node full: hog {hog_mb} MiB; nomem pages per interval: "
          f"{[s['nomem'] for s in d.stats if s['nomem']][:10]}")
    clean_exit(d)
    assert "node 0 is full (" in d.stderr
    assert "node 0 has free memory again" in d.stderr
    assert w.stop() == 0


def test_rmmod_under_daemon(env, numab_off):
    """The module cannot go away under a daemon (it holds /dev/pagetier): rmmod is refused with
    a message saying it is in use, and the daemon goes on as if nothing happened."""
    w = Workload("--size", "32", "--hot", "8", "--start-node", "1", "--duration", "0", "--quiet")
    d = DaemonRun(["attach", str(w.pid), "--json", "--interval", "0.5"], env)
    try:
        d.wait_for(lambda: len(d.stats) >= 2, WAIT, "two intervals")
        with pytest.raises(kmod.PagetierError, match="in use"):
            kmod.unload_module()
        assert kmod.is_loaded()
        n = len(d.stats)
        d.wait_for(lambda: len(d.stats) >= n + 2, WAIT, "two more intervals")
    finally:
        d.stop()
    clean_exit(d)
    assert w.stop() == 0
    kmod.unload_module()  # with the daemon gone it unloads
    kmod.load_module()


def test_target_detached_behind_its_back(env, numab_off):
    """Someone else detaches the daemon's target (a profiler error on the next read): the daemon
    says so, attaches again and keeps managing it."""
    w = Workload("--size", "32", "--hot", "8", "--start-node", "1", "--duration", "0", "--quiet")
    d = DaemonRun(["attach", str(w.pid), "--json", "--interval", "0.5"], env)
    try:
        d.wait_for(lambda: len(d.stats) >= 2, WAIT, "two intervals")
        dev = kmod.Device()
        try:
            dev.detach(w.pid)
        finally:
            dev.close()
        d.wait_for(lambda: "attached again" in d.stderr, WAIT, "a re-attach")
        n = len(d.stats)
        d.wait_for(lambda: len(d.stats) >= n + 2 and str(w.pid) in targets(), WAIT,
                   "intervals after the re-attach")
    finally:
        d.stop()
    clean_exit(d)
    assert "profiler read failed" in d.stderr
    assert w.stop() == 0


SHARED = r"""
import mmap, os, sys, time
m = mmap.mmap(-1, 8 << 20, mmap.MAP_SHARED)
for i in range(0, 8 << 20, 4096):
    m[i] = 1
r, w = os.pipe()
if os.fork() == 0:  # the child maps every page too (fork copies no PTEs of shared memory)
    sum(m[i] for i in range(0, 8 << 20, 4096))
    os.write(w, b"x")
    time.sleep(1e6)  # stays, sharing the pages, until the test kills the group
assert os.read(r, 1) == b"x"  # the child has mapped them all
print("ready", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    for i in range(0, 8 << 20, 4096):
        m[i] = (m[i] + 1) & 0xFF
"""


# root without CAP_SYS_NICE: move_pages refuses MPOL_MF_MOVE_ALL
NO_SYS_NICE = ("setpriv", "--inh-caps=-sys_nice", "--bounding-set=-sys_nice")


def test_shared_pages_not_retried_every_interval(env, numab_off, tmp_path):
    """Pages shared with another process move only with MPOL_MF_MOVE_ALL, which needs
    CAP_SYS_NICE (tests/guest/test_memory_kinds.py moves them as root). A daemon without it
    says so once, counts them as failed once (EACCES), then leaves them alone for a while
    instead of failing on them every interval."""
    script = tmp_path / "shared.py"
    script.write_text(SHARED)
    p = subprocess.Popen(["python3", str(script), "600"], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        # budget 1M: the daemon wants the 8 MiB shared buffer off node 0
        d = DaemonRun(["attach", str(p.pid), "--json", "--fast-budget", "1M", "--interval",
                       "0.5", "--profiler-option", "mode=abit"], env, prefix=NO_SYS_NICE)
        try:
            d.wait_for(lambda: len(d.stats) >= 20, WAIT, "20 intervals")
        finally:
            d.stop()
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    failed = [s["failed"] for s in d.stats]
    errs = {k for s in d.stats for k in s["errors"]}
    print(f"shared pages: failed per interval {failed}; errors {errs}")
    print("first intervals:", [{k: s[k] for k in ("units", "demoted", "failed", "busy")}
                               for s in d.stats[:3]])
    clean_exit(d)
    assert d.stderr.count("no CAP_SYS_NICE, so no MPOL_MF_MOVE_ALL") == 1, d.stderr
    assert "EACCES" in errs, errs
    # the shared buffer (and shared library pages: abit mode counts file pages too) fail on the
    # first try; within STUCK_RETRY (32) intervals only units new since then are tried, and
    # units busy at the first try (EBUSY: tried again next interval)
    assert sum(failed[:2]) >= 2048 and sum(failed[2:]) <= 0.05 * sum(failed[:2]), failed
    # they stay on node 0 outside the budget; what the daemon can move is within it
    last = d.stats[-1]
    assert last["fast_unmovable"] >= 8 * MIB and last["fast_used"] <= last["budget"], last


def test_sigkill_restart_no_leftovers(env, numab_on, tmp_path):
    """SIGKILL the daemon mid-run: the module detaches with the closed descriptor, the next
    start restores numa_balancing, removes the dead daemon's status file, and attaches to the
    same target again; the target's memory is intact."""
    w = Workload("--size", "64", "--hot", "16", "--start-node", "1", "--duration", "0", "--quiet")
    d = DaemonRun(["attach", str(w.pid), "--json", "--interval", "0.5"], env)
    d.wait_for(lambda: len(d.stats) >= 3, WAIT, "three intervals")
    d.stop(signal.SIGKILL)
    assert NUMAB.read_text().strip() == "0"  # nobody restored it yet
    assert targets() == "", "the module kept a target of a dead daemon"
    stale = list((tmp_path / "run").glob("daemon-*.json"))
    assert stale, "expected the dead daemon's status file"
    # the module restored every page it made inaccessible (and any the kernel's balancing marked
    # before the daemon started): the target's steady loop takes no fault
    faults = faults_in([w.pid], 2)
    assert faults == 0, f"{faults} hinting faults in the target after the daemon died"
    st = subprocess.run([*PAGETIER, "status"], capture_output=True, text=True, env=env)
    assert "dead: stale status" in st.stdout, st.stdout
    d2 = DaemonRun(["attach", str(w.pid), "--json", "--interval", "0.5", "--duration", "3"], env)
    assert d2.finish(WAIT) == 0, d2.stderr
    clean_exit(d2, numab="1")
    assert "died without restoring it" in d2.stderr
    assert "removed the status file of pagetier pid" in d2.stderr
    assert not list((tmp_path / "run").glob("daemon-*.json"))
    assert len(d2.stats) >= 2
    assert w.stop() == 0


def test_unprivileged_user_cannot_open_device():
    """/dev/pagetier is root's (0600, and CAP_SYS_ADMIN at open even if the mode is opened up)."""
    code = ("import os, sys\nos.setgid(65534); os.setuid(65534)\n"
            "try:\n    os.open('/dev/pagetier', os.O_RDWR)\nexcept OSError as e:\n"
            "    print(e.errno); sys.exit(0)\nprint('opened'); sys.exit(1)\n")
    mode = os.stat("/dev/pagetier").st_mode & 0o777
    assert mode == 0o600, oct(mode)
    r = subprocess.run(["python3", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and int(r.stdout) == errno.EACCES, (r.stdout, r.stderr)
    os.chmod("/dev/pagetier", 0o666)
    try:
        r = subprocess.run(["python3", "-c", code], capture_output=True, text=True)
        assert r.returncode == 0 and int(r.stdout) == errno.EPERM, (r.stdout, r.stderr)
    finally:
        os.chmod("/dev/pagetier", 0o600)


def test_move_error_messages():
    """Whole-call move_pages errors name the process and what to do."""
    with pytest.raises(mover.MoveError, match="no such process"):
        mover.move(999_999, [0x10000], 1)


def test_corrupt_trace_and_config_one_line(env, tmp_path, numab_on):
    """The daemon given a corrupt trace (replay profiler) or a corrupt config: one line naming
    the file, exit 1, numa_balancing untouched."""
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1" + os.urandom(3000) + b"PAR1")
    conf = tmp_path / "bad.toml"
    conf.write_bytes(b"\x00\xff[[ fast_budget = ")
    for args, name in ((["--profiler", "replay", "--profiler-option", f"path={bad}"], bad),
                       (["-c", str(conf)], conf)):
        r = subprocess.run([*PAGETIER, "run", *args, "--", "true"], capture_output=True,
                           text=True, env=env, timeout=WAIT)
        assert r.returncode == 1, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and str(name) in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert NUMAB.read_text().strip() == "1"
