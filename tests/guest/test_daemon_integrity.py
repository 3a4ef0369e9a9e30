"""Data integrity under the daemon: the workload (hotcold) checks every word of its memory
after the daemon has migrated its pages back and forth many times, in both kmod modes, with
transparent huge pages on and off.

The daemon runs the ``ping-pong`` stress policy (every unit to the other node, every interval),
so the number of migrations does not depend on how fast the guest runs, while the profiler
keeps scanning (fault mode marks and unmarks the pages) and hotcold's hot window moves every
2 s. Migrations are counted from the daemon's own stats (4 KiB pages promoted + demoted) and
checked against the kernel's pgmigrate_success.
The default run moves a few thousand pages per case; the long one (-m long, run by
scripts/hardening.sh) at least 100,000.
"""
from __future__ import annotations

import pytest

from pagetier.workload import binary

from daemon_run import DaemonRun, run_env
from helpers import vmstat

pytestmark = pytest.mark.vm

CASES = [(mode, thp) for mode in ("fault", "abit") for thp in (True, False)]


pytestmark = pytest.mark.usefixtures("kmod_loaded")


def drive_migrations(tmp_path, mode: str, thp: bool, pages: int, timeout: float,
                     size: int = 64, hot: int = 24) -> dict:
    """hotcold of ``size`` MiB with a ``hot`` MiB window moving every 2 s, its pages moved back
    and forth until the daemon has moved ``pages`` pages; then hotcold checks its memory."""
    args = ["run", "--json", "--policy", "ping-pong", "--interval", "0.5", "--rate", "0",
            "--profiler-option", f"mode={mode}", "--profiler-option", "scan_period_ms=100",
            "--profiler-option", "kinds=off",  # the mode asked for, 4 KiB pages too
            "--", str(binary()), "--size", str(size), "--hot", str(hot), "--phase", "2",
            "--start-node", "1", "--duration", "0", "--quiet", *([] if thp else ["--no-thp"])]
    mig0 = vmstat("pgmigrate_success")
    d = DaemonRun(args, run_env(tmp_path))
    try:
        d.wait_for(lambda: d.moved() >= pages, timeout, f"{pages} page migrations")
    finally:
        rc = d.stop()  # SIGTERM: passed on to hotcold, which then checks its memory
    migrated = vmstat("pgmigrate_success") - mig0
    done = [e for e in d.events if e["event"] == "done"]
    moved = d.moved()
    res = {"mode": mode, "thp": thp, "moved_pages": moved, "pgmigrate_success": migrated,
           "intervals": len(d.stats), "pages_checked": done[0]["pages_checked"] if done else 0,
           "pages_corrupt": done[0]["pages_corrupt"] if done else None, "rc": rc}
    print(f"integrity: mode={mode} thp={'on' if thp else 'off'}: {moved} page migrations in "
          f"{len(d.stats)} intervals, {res['pages_checked'] * 4096} bytes checked, "
          f"{res['pages_corrupt']} pages corrupt (kernel pgmigrate_success +{migrated})")
    assert rc == 0, f"exit {rc}: {d.stderr[-3000:]}"
    assert done, f"hotcold did not report its memory check: {d.stderr[-2000:]}"
    assert res["pages_corrupt"] == 0 and res["pages_checked"] == size * 256
    assert moved >= pages
    # move_pages reports a page on the target node whether it migrated it or found it there,
    # so a page already there (most likely faulted in anew since the profiler's scan, on
    # another node than the daemon believed) counts as moved without a migration. CI on 6.12
    # (abit, THP) once counted 26,280 against pgmigrate_success 26,279; a daemon that counted
    # moves it never made would be off by far more
    slack = max(16, moved // 1000)
    assert migrated >= moved - slack, "the daemon counted moves the kernel did not make"
    return res


@pytest.mark.parametrize("mode,thp", CASES, ids=[f"{m}-thp{'on' if t else 'off'}" for m, t in CASES])
def test_memory_intact_after_migrations(tmp_path, mode, thp):
    drive_migrations(tmp_path, mode, thp, pages=20_000, timeout=600)


@pytest.mark.long
@pytest.mark.parametrize("mode,thp", CASES, ids=[f"{m}-thp{'on' if t else 'off'}" for m, t in CASES])
def test_memory_intact_after_100k_migrations(tmp_path, mode, thp):
    drive_migrations(tmp_path, mode, thp, pages=100_000, timeout=1200, size=128, hot=48)
