"""Many cgroups on one daemon, and a command's whole process tree, in the two-node VM (root,
node 0 fast with the CPUs, node 1 slow), with a real cgroup v2 hierarchy made here.

    scripts/vm --kernel 6.12 --hmat -- .venv/bin/python -m pytest -x -q tests/guest/test_cgroup_hierarchy.py

The workload (hotcold) first-touches its buffer on node 1 and reports, once a second, the
fraction of its hot part on node 0: the truth checked here, with each process's numa_maps for
the bytes on node 0 and the daemon's status file for its own accounting.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pagetier.daemon import control
from pagetier.workload import Workload, binary

from daemon_run import PAGETIER, DaemonRun
from helpers import split_json_lines

pytestmark = [pytest.mark.vm, pytest.mark.usefixtures("kmod_loaded")]
MIB = 1 << 20
CGROUP_ROOT = Path("/sys/fs/cgroup")


@pytest.fixture(scope="module")
def hierarchy():
    """A cgroup v2 directory of this module's own (the unified hierarchy mounted first when
    the guest has none), removed after its tests."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        subprocess.run(["mount", "-t", "cgroup2", "none", str(CGROUP_ROOT)], check=True)
    top = CGROUP_ROOT / f"pagetier-test-{os.getpid()}"
    top.mkdir()
    yield top
    for d in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
        if d.is_dir():
            _empty(d)
            d.rmdir()
    top.rmdir()


def _empty(cg: Path) -> None:
    for pid in (cg / "cgroup.procs").read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while (cg / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)


def _in(cg: Path) -> list[str]:
    """A prefix that runs a command in cgroup ``cg`` (the shell moves itself, then execs it),
    niced: two busy workloads on the VM's two CPUs would starve the daemon under emulation."""
    return ["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec nice -n 5 "$@"', "sh"]


class Ticks:
    """A hotcold Workload whose ticks a thread collects."""

    def __init__(self, w: Workload):
        self.w = w
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        while self.w.next_tick() is not None:
            pass

    def fraction(self) -> float:
        return self.w.ticks[-1]["fast_fraction"] if self.w.ticks else 0.0


def fast_bytes(pid: int, addr: int) -> int:
    """Bytes of the mapping at ``addr`` of ``pid`` on node 0 (its numa_maps N0, base pages)."""
    for line in Path(f"/proc/{pid}/numa_maps").read_text().splitlines():
        if int(line.split()[0], 16) == addr:
            for f in line.split():
                if f.startswith("N0="):
                    return int(f[3:]) * 4096
            return 0
    raise AssertionError(f"no mapping at {addr:#x} in pid {pid}'s numa_maps")


def by_name(status: dict | None) -> dict:
    return {Path(c["path"]).name: c for c in (status or {}).get("cgroups", [])}


def test_two_cgroups_hold_their_own_budgets_and_one_is_let_go(hierarchy, env):
    """Cgroups a (budget 48M) and b (24M) each run hotcold with a 32M hot part first touched
    on node 1: a's whole hot part reaches node 0, b holds what its budget allows, neither goes
    over. b removed through the control socket is let go (its pages stay) while a is still
    managed; a rmdir'd after its process exits ends the daemon (it had only cgroups)."""
    a, b = hierarchy / "a", hierarchy / "b"
    a.mkdir()
    b.mkdir()
    # --wait: the workloads touch their memory, then wait for SIGUSR1 to start their accesses,
    # once the daemon has attached to both
    # --no-verify: a start many times faster under emulation (memory integrity is tested
    # elsewhere)
    args = ["--size", "48", "--hot", "32", "--start-node", "1", "--duration", "60", "--wait",
            "--no-verify"]
    wa = Ticks(Workload(*args, cmd_prefix=_in(a)))
    wb = Ticks(Workload(*args, cmd_prefix=_in(b)))
    d = DaemonRun(["attach", "--json", "--interval", "1", "--profiler", "kmod",
                   "--cgroup", f"{a}:48M", "--cgroup", f"{b}:24M"], env)
    sock = Path(env["PAGETIER_RUN_DIR"]) / "control.sock"
    over = []

    def settled():
        cg = by_name(d.status())
        for name, budget in (("a", 48 * MIB), ("b", 24 * MIB)):
            if name in cg and cg[name]["fast_bytes"] - cg[name]["fast_unmovable_bytes"] > budget:
                over.append((name, cg[name]["fast_bytes"]))
        return (wa.fraction() >= 0.95 and "b" in cg and cg["b"]["fast_bytes"] >= 20 * MIB)

    try:
        d.wait_for(lambda: len((d.status() or {}).get("targets", [])) == 2, 90,
                   "both cgroups' processes attached")
        for w in (wa, wb):
            w.w.proc.send_signal(signal.SIGUSR1)
        d.wait_for(settled, 60, "a's hot part on node 0 and b at its budget")
        assert not over, f"over budget (daemon's count): {over}"
        fa = fast_bytes(wa.w.pid, wa.w.ready["addr"])
        fb = fast_bytes(wb.w.pid, wb.w.ready["addr"])
        assert 30 * MIB <= fa <= 48 * MIB, fa
        assert 16 * MIB <= fb <= 24 * MIB, fb  # b's own hot pages, within its budget
        st = d.status()
        assert {t["pid"]: Path(t["cgroup"]).name for t in st["targets"]} == {
            wa.w.pid: "a", wb.w.pid: "b"}

        r = control.request(sock, {"op": "remove_cgroup", "path": str(b)})
        assert r["ok"], r
        bad = control.request(sock, {"op": "add_cgroup", "path": str(hierarchy / "nosuch")})
        assert not bad["ok"] and "nosuch" in bad["error"]
        d.wait_for(lambda: set(by_name(d.status())) == {"a"}, 10, "b let go")
        n = len(d.stats)
        d.wait_for(lambda: len(d.stats) >= n + 2, 15, "two more intervals")
        st = d.status()
        assert [t["pid"] for t in st["targets"]] == [wa.w.pid]  # a still managed
        assert fast_bytes(wb.w.pid, wb.w.ready["addr"]) >= fb - 2 * MIB  # b's pages stay
        assert wa.fraction() >= 0.95
        assert d.proc.poll() is None

        assert wa.w.stop() == 0
        a.rmdir()
        assert d.finish(30) == 0
        assert "every managed cgroup is gone" in d.stderr
        assert wb.w.stop() == 0
    finally:
        if d.proc.poll() is None:
            d.stop()
        for w in (wa, wb):
            w.w.__exit__(None, None, None)


def test_run_manages_a_shells_two_programs(hierarchy, env, tmp_path):
    """`pagetier run -- sh -c 'hotcold & hotcold; wait'`: both programs' hot parts reach node
    0 (the shell is the only process pagetier starts), in a cgroup of the command's own that
    is removed at the end."""
    hc = binary()
    out = tmp_path / "w"
    out.mkdir()
    w = f"nice -n 5 {hc} --size 32 --hot 16 --start-node 1 --duration 20 --no-verify"
    sh = f"{w} > {out}/1.json & {w} > {out}/2.json; wait"
    r = subprocess.run([*PAGETIER, "run", "--json", "--interval", "1", "--profiler", "kmod",
                        "--fast-budget", "64M", "--", "sh", "-c", sh],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    stats, _ = split_json_lines(r.stdout)
    assert stats and all(s["fast_used"] <= 64 * MIB for s in stats)
    for name in ("1.json", "2.json"):
        _, events = split_json_lines((out / name).read_text())
        ticks = [e for e in events if e["event"] == "tick"]
        done = [e for e in events if e["event"] == "done"]
        assert done and done[0]["pages_corrupt"] == 0
        assert any(t["fast_fraction"] >= 0.95 for t in ticks), (name, ticks, r.stderr[-2000:])
    mine = re.search(r"managing cgroup (\S*pagetier-run-\d+)", r.stderr)
    assert mine, r.stderr[-1500:]
    assert not Path(mine[1]).exists(), f"the command's cgroup was left behind: {r.stderr[-1500:]}"
