"""Many cgroups on one daemon, and process trees: host tests with fake cgroup directories in
tmp (a cgroup.procs file each) and the stub profiler. No real cgroup is created here; the
real hierarchy is tested in the VM (tests/guest/test_cgroup_hierarchy.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from pagetier.core import mover
from pagetier.core.shares import fair_shares
from pagetier.daemon import cgroups, control, report
from pagetier.daemon import config as config_mod
from pagetier.daemon.cgroups import Cgroup
from pagetier.daemon.clock import FakeClock
from pagetier.daemon.control import Peer, RequestError, Requests
from pagetier.daemon.loop import Daemon
from pagetier.errors import ConfigError
from pagetier.policies.base import Decision, Policy
from pagetier.profiler.stub import StubProfiler

REPO = Path(__file__).resolve().parent.parent
PAGETIER = [sys.executable, "-m", "pagetier.cli"]
MIB = 1 << 20
BASE = 0x7f0000000000


class PromoteAll(Policy):
    """Asks to promote every unit off the fast node, hottest first."""
    name = "promote-all"

    def decide(self, state, ctx):
        idx = np.flatnonzero(state.node != ctx.fast_node)
        return Decision(promote=idx[np.argsort(-state.heat[idx], kind="stable")])


class Exchange(Policy):
    """Demotes every fast unit to promote every slow one: left alone it evicts one cgroup's
    pages for another's."""
    name = "exchange"

    def decide(self, state, ctx):
        return Decision(promote=np.flatnonzero(state.node == ctx.slow_node),
                        demote=np.flatnonzero(state.node == ctx.fast_node))


class StubMover:
    """Moves every page it is asked to and tells the stub profiler, so its nodes follow."""

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []

    def move(self, pid, addrs, node):
        self.calls.append((pid, len(addrs), node))
        r = mover.MoveResult(**mover.classify(np.full(len(addrs), node, np.int32), node))
        r.stopped = False
        return r


def fake_cgroup(root: Path, name: str, pids) -> Path:
    d = root / "cg" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return d


def fake_node(tmp_path: Path, free_mib: int) -> tuple[Path, Path]:
    """A fast node 0 with ``free_mib`` MiB free above nothing: its meminfo and a zoneinfo
    whose high watermark is 0 (the room is free - ROOM_MARGIN)."""
    node0 = tmp_path / "node" / "node0"
    node0.mkdir(parents=True, exist_ok=True)
    node0.joinpath("meminfo").write_text(f"Node 0 MemTotal: 4194304 kB\n"
                                         f"Node 0 MemFree: {free_mib * 1024} kB\n")
    zi = tmp_path / "zoneinfo"
    zi.write_text("Node 0, zone   Normal\n  pages free 10\n        min      0\n"
                  "        low      0\n        high     0\n"
                  "Node 1, zone   Normal\n        high     0\n")
    return tmp_path / "node", zi


def make(tmp_path, groups: dict, *, policy=None, budget="1G", free_mib=4096, layout=None,
         units=1024, socket=None, **kw):
    """A daemon over fake cgroups ``groups`` (name -> (pids, budget bytes or None)) of fake
    pids, each pid ``units`` hot units on the slow node (or ``layout[pid]``: (units, node))."""
    layout = layout or {}

    def source(pid, interval):
        n, node = layout.get(pid, (units, 1))
        return (BASE + np.arange(n, dtype=np.uint64) * 4096, 10, node)

    prof = StubProfiler(source=source, track_moves=True)
    cfg = config_mod.load(None, {"profiler": "stub", "fast_budget": budget, "rate": 0.0,
                                 "interval": 0.01})
    cfg.handle_signals, cfg.status_file = False, str(tmp_path / "status.json")
    cfg.node_root, cfg.zoneinfo = fake_node(tmp_path, free_mib)
    cfg.control_socket = None if socket is None else str(socket)
    cgs = [(fake_cgroup(tmp_path, name, pids), b) for name, (pids, b) in groups.items()]
    d = Daemon(cfg, cgroups=cgs, profiler=prof, policy=policy or PromoteAll(), mover=StubMover(),
               numab=False, out=open(os.devnull, "w"), clock=FakeClock(), **kw)
    d.tracker.alive = lambda pid: True  # fake pids
    d.refresh_targets()
    return d


def _doc(d) -> dict:
    """The status document, as the status file has it."""
    return json.loads(json.dumps(report.status_doc(d), default=report.jsonable))


def by_path(d) -> dict:
    """The status's "cgroups" entries by the cgroup's name."""
    return {Path(c["path"]).name: c for c in _doc(d)["cgroups"]}


# ------------------------------------------------------------------------- budgets and shares
def test_budgets_fixed_and_equal_shares_of_the_rest():
    gs = [Cgroup(Path("a"), 2 * MIB), Cgroup(Path("b")), Cgroup(Path("c"))]
    assert cgroups.budgets(gs, 2048) == [512, 768, 768]
    assert cgroups.budgets(gs, 100) == [512, 0, 0]  # nothing left to share


def test_fair_shares_are_max_min():
    assert fair_shares([10, 100, 100], 120) == [10, 55, 55]
    assert fair_shares([10, 20], 100) == [10, 20]
    assert fair_shares([50, 50], 0) == [0, 0]


def test_each_cgroup_holds_its_own_budget(tmp_path):
    d = make(tmp_path, {"a": ([101], 2 * MIB), "b": ([202], 1 * MIB)})
    assert d.targets == {101, 202}
    for _ in range(3):
        d.step()
    cg = by_path(d)
    assert cg["a"]["fast_bytes"] == 2 * MIB and cg["b"]["fast_bytes"] == 1 * MIB
    assert cg["a"]["pids"] == [101] and cg["a"]["fast_budget"] == 2 * MIB
    assert cg["b"]["slow_bytes"] == 3 * MIB
    targets = {t["pid"]: t["cgroup"] for t in _doc(d)["targets"]}
    assert Path(targets[101]).name == "a" and Path(targets[202]).name == "b"


def test_a_cgroup_without_budget_gets_what_is_left(tmp_path):
    d = make(tmp_path, {"a": ([101], 1 * MIB), "b": ([202], None), "c": ([303], None)},
             budget="5M")
    for _ in range(3):
        d.step()
    cg = by_path(d)
    assert cg["a"]["fast_bytes"] == 1 * MIB
    assert cg["b"]["fast_bytes"] == cg["c"]["fast_bytes"] == 2 * MIB


def test_the_nodes_free_room_is_shared_fairly(tmp_path):
    # 7 MiB free less the 1 MiB margin: 6 MiB of room for two cgroups without budgets
    d = make(tmp_path, {"a": ([101], None), "b": ([202], None)}, free_mib=7)
    d.step()
    cg = by_path(d)
    assert cg["a"]["fast_bytes"] == cg["b"]["fast_bytes"] == 3 * MIB


def test_one_cgroup_never_evicts_anothers_pages(tmp_path):
    """The node is full: a policy that would exchange a's fast pages for b's slow ones moves
    nothing, since b may only make room from its own pages; the same policy on the same
    targets without cgroups does exchange them (the test can fail)."""
    layout = {101: (512, 0), 202: (512, 1)}
    d = make(tmp_path, {"a": ([101], 2 * MIB), "b": ([202], 2 * MIB)}, policy=Exchange(),
             layout=layout, free_mib=1)
    for _ in range(3):
        d.step()
    cg = by_path(d)
    assert cg["a"]["fast_bytes"] == 2 * MIB and cg["b"]["fast_bytes"] == 0
    assert not d.mover.calls
    # the control: one cgroup, no budgets of its own, the same policy and node
    d2 = make(tmp_path / "plain", {"all": ([101, 202], None)}, policy=Exchange(),
              layout=layout, free_mib=1)
    d2.step()
    assert {c[0] for c in d2.mover.calls} == {101, 202}


def test_a_cgroup_over_its_budget_demotes_its_own_coldest(tmp_path):
    d = make(tmp_path, {"a": ([101], 2 * MIB), "b": ([202], 2 * MIB)})
    d.step()
    assert by_path(d)["a"]["fast_bytes"] == 2 * MIB
    d.tracker.add_cgroup(d.tracker.cgroup, 1 * MIB)  # a's budget lowered
    d.step()
    cg = by_path(d)
    assert cg["a"]["fast_bytes"] == 1 * MIB and cg["b"]["fast_bytes"] == 2 * MIB
    assert all(pid == 101 for pid, _, node in d.mover.calls if node == 1)


# ------------------------------------------------------------------------- joining and leaving
def test_processes_join_and_leave_each_cgroup(tmp_path):
    d = make(tmp_path, {"a": ([101], None), "b": ([202], None)})
    fake_cgroup(tmp_path, "a", [101, 102])
    fake_cgroup(tmp_path, "b", [])
    d.refresh_targets()
    assert d.targets == {101, 102}
    assert by_path(d)["a"]["pids"] == [101, 102] and by_path(d)["b"]["pids"] == []
    assert 202 in d.profiler.detached
    assert d.stop_reason is None  # b is empty, not gone


def test_a_process_in_a_nested_cgroup_belongs_to_the_deeper_one(tmp_path):
    d = make(tmp_path, {"pod": ([], 1 * MIB)})
    inner = fake_cgroup(tmp_path, "pod/ctr", [505])
    d.refresh_targets()
    assert d.targets == {505}  # a pod's processes sit in its containers' cgroups
    d.tracker.add_cgroup(inner, 2 * MIB)
    d.refresh_targets()
    assert by_path(d)["ctr"]["pids"] == [505] and by_path(d)["pod"]["pids"] == []


def test_a_removed_cgroup_is_let_go_and_the_others_kept(tmp_path):
    d = make(tmp_path, {"a": ([101], 1 * MIB), "b": ([202], 1 * MIB)})
    d.step()
    calls = len(d.mover.calls)
    a = tmp_path / "cg" / "a"
    (a / "cgroup.procs").unlink()
    a.rmdir()
    d.refresh_targets()
    assert d.targets == {202} and 101 in d.profiler.detached
    assert [Path(c["path"]).name for c in _doc(d)["cgroups"]] == ["b"]
    assert d.stop_reason is None
    d.step()
    assert all(pid == 202 for pid, _, _ in d.mover.calls[calls:])  # a's pages left in place
    b = tmp_path / "cg" / "b"
    (b / "cgroup.procs").unlink()
    b.rmdir()
    d.refresh_targets()
    assert d.stop_reason == "every managed cgroup is gone"


# ------------------------------------------------------------------------- the control socket
def _ask(d, req):
    out = []
    t = threading.Thread(target=lambda: out.append(control.request(d.control.path, req)))
    t.start()
    while t.is_alive():
        d.control.poll(0.02)
    t.join()
    return out[0]


def test_add_and_remove_cgroups_through_the_control_socket(tmp_path):
    d = make(tmp_path, {"a": ([101], 1 * MIB)}, socket=tmp_path / "ctl.sock")
    d.open_control()
    try:
        c = fake_cgroup(tmp_path, "c", [303])
        r = _ask(d, {"op": "add_cgroup", "path": str(c), "fast_budget": "2M"})
        assert r["ok"] and r["fast_budget"] == 2 * MIB
        d.refresh_targets()
        assert d.targets == {101, 303}
        d.step()
        assert by_path(d)["c"]["fast_bytes"] == 2 * MIB
        bad = _ask(d, {"op": "add_cgroup", "path": "/no/such/cgroup"})
        assert not bad["ok"] and "/no/such/cgroup" in bad["error"]
        r = _ask(d, {"op": "remove_cgroup", "path": str(c)})
        assert r["ok"]
        assert d.targets == {101} and 303 in d.profiler.detached
        assert "c" not in by_path(d)
        bad = _ask(d, {"op": "remove_cgroup", "path": str(c)})
        assert not bad["ok"] and "not managed" in bad["error"]
        r = _ask(d, {"op": "remove_cgroup", "path": str(tmp_path / "cg" / "a")})
        assert r["ok"] and d.targets == set()
    finally:
        d.close_control()


def test_only_root_adds_cgroups(tmp_path):
    d = make(tmp_path, {"a": ([101], None)})
    with pytest.raises(RequestError, match="only root"):
        Requests(d)(Peer(pid=1, uid=1000, gid=1000), {"op": "add_cgroup", "path": "/x"})


# ------------------------------------------------------------------------- configuration
def _cfg(tmp_path, text):
    p = tmp_path / "pagetier.toml"
    p.write_text(text)
    return p


def test_cgroup_tables_in_the_config_file(tmp_path):
    a = fake_cgroup(tmp_path, "a", [])
    p = _cfg(tmp_path, f'[[cgroup]]\npath = "{a}"\nfast_budget = "2G"\n\n'
                       f'[[cgroup]]\npath = "{a.parent}"\n')
    cfg = config_mod.load(p)
    assert cfg.cgroup == [{"path": str(a), "fast_budget": 2 << 30},
                          {"path": str(a.parent), "fast_budget": None}]


@pytest.mark.parametrize("text,msg", [
    ('[[cgroup]]\nfast_budget = "2G"\n', "path must be a string"),
    ('[[cgroup]]\npath = "x"\nfast_budget = "lots"\n', "fast_budget must be a size"),
    ('[[cgroup]]\npath = "x"\nbudget = "2G"\n', "unknown key 'budget'"),
    ('cgroup = "x"\n', "array of tables"),
])
def test_bad_cgroup_tables_are_one_line_errors(tmp_path, text, msg):
    with pytest.raises(ConfigError, match=msg):
        config_mod.load(_cfg(tmp_path, text))
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    r = subprocess.run([*PAGETIER, "attach", "-c", str(tmp_path / "pagetier.toml")],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert r.returncode == 1 and msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_a_config_cgroup_that_is_not_one_is_named(tmp_path):
    p = _cfg(tmp_path, '[[cgroup]]\npath = "no/such/group"\n')
    cfg = config_mod.load(p)
    with pytest.raises(ConfigError, match="no/such/group"):
        Daemon(cfg, profiler=StubProfiler(), policy=PromoteAll(), numab=False,
               out=open(os.devnull, "w"))


def test_cgroup_option_with_a_budget(tmp_path):
    assert cgroups.parse_spec("system.slice/app.service:2G") == ("system.slice/app.service",
                                                                2 << 30)
    assert cgroups.parse_spec("a.slice") == ("a.slice", None)
    with pytest.raises(ConfigError, match="BUDGET"):
        cgroups.parse_spec("a.slice:lots")


# ------------------------------------------------------------------------- process trees
def test_run_follows_the_commands_process_tree(tmp_path):
    """Without a cgroup of its own (host tests never make one), `run` follows the command's
    /proc descendants: a shell's two background children are managed."""
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    r = subprocess.run([*PAGETIER, "run", "--profiler", "stub", "--dry-run", "--interval", "0.2",
                        "--fast-budget", "1M", "--profiler-option", "units=64", "--",
                        "sh", "-c", "sleep 1.5 & sleep 1.5 & wait"],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("(sleep)") == 2 and "(sh)" in r.stderr, r.stderr


def test_the_tree_is_followed_as_it_forks(tmp_path):
    child = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"])
    try:
        cfg = config_mod.load(None, {"profiler": "stub", "interval": 0.01})
        cfg.handle_signals, cfg.status_file = False, str(tmp_path / "status.json")
        d = Daemon(cfg, child=child, tree=True, profiler=StubProfiler(units=8),
                   policy=PromoteAll(), numab=False, out=open(os.devnull, "w"), clock=FakeClock())
        d.tracker.attach(child.pid)
        deadline = time.monotonic() + 10
        while len(d.targets) < 3 and time.monotonic() < deadline:
            d.refresh_targets()
            time.sleep(0.05)
        assert len(d.targets) == 3 and child.pid in d.targets
    finally:
        for p in psutil.Process(child.pid).children(recursive=True):
            p.kill()
        child.kill()
        child.wait()


def test_record_traces_the_whole_tree_with_a_pid_each(tmp_path):
    import pyarrow.parquet as pq

    out = tmp_path / "t.parquet"
    r = subprocess.run([*PAGETIER, "record", "--backend", "stub", "-O", "units=16", "-O", "hot=4",
                        "--interval", "100", "--quiet", "-o", str(out), "--",
                        # the children outlive several intervals even when the host is loaded
                        "sh", "-c", "sleep 3 & sleep 3 & wait"],
                       capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    pids = set(pq.read_table(out, columns=["pid"]).column("pid").to_pylist())
    assert len(pids) == 3, pids


def test_runs_own_cgroup_is_made_and_removed(tmp_path, monkeypatch, caplog):
    """In a fake unified hierarchy in tmp: the command's cgroup is made next to the daemon's
    own, removed at the end, and kept (with a warning) while processes are left in it; none
    with the stub profiler unless asked, none when turned off."""
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    monkeypatch.setattr(cgroups, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(cgroups, "own_cgroup", lambda: tmp_path / "system.slice" / "me")
    (tmp_path / "system.slice" / "me").mkdir(parents=True)
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 0)
    monkeypatch.delenv(cgroups.ENV_RUN_CGROUP, raising=False)
    assert cgroups.make_run_cgroup("stub") is None
    monkeypatch.setenv(cgroups.ENV_RUN_CGROUP, "0")
    assert cgroups.make_run_cgroup("kmod") is None
    monkeypatch.setenv(cgroups.ENV_RUN_CGROUP, "1")
    cg = cgroups.make_run_cgroup("stub")
    assert cg == tmp_path / "system.slice" / f"pagetier-run-{os.getpid()}" and cg.is_dir()
    cgroups.remove_run_cgroup(cg)
    assert not cg.exists()
    cg = cgroups.make_run_cgroup("kmod")
    (cg / "cgroup.procs").write_text("12345\n")  # an orphan of the command: a plain dir here
    with caplog.at_level("WARNING", logger="pagetier.daemon"):
        cgroups.remove_run_cgroup(cg)
    assert cg.exists() and "processes of the command are still in it" in caplog.text


def test_status_text_lists_each_cgroup_against_its_budget():
    """`pagetier status` (text) shows each managed cgroup: processes, fast memory against its
    own budget or a fair share, slow memory; and where the metrics are served."""
    from pagetier.daemon.status import format_status

    mib = 1 << 20
    doc = {"pid": 1, "alive": True, "started": 0, "updated": 0, "config": {}, "totals": {},
           "targets": [], "metrics": "0.0.0.0:9464",
           "cgroups": [{"path": "/sys/fs/cgroup/a.slice", "fast_budget": 48 * mib, "pids": [5, 6],
                        "fast_bytes": 40 * mib, "slow_bytes": 8 * mib},
                       {"path": "/sys/fs/cgroup/b.slice", "fast_budget": None, "pids": [7],
                        "fast_bytes": 0, "slow_bytes": 24 * mib}]}
    text = format_status(doc)
    assert ("cgroup /sys/fs/cgroup/a.slice: 2 processes, fast 40 MiB (budget 48 MiB), slow 8 MiB"
            in text)
    assert ("cgroup /sys/fs/cgroup/b.slice: 1 process, fast 0 MiB (a fair share), slow 24 MiB"
            in text)
    assert "metrics on 0.0.0.0:9464" in text


def test_stale_run_cgroups_of_dead_daemons_are_removed(tmp_path, caplog):
    """`pagetier run` removes the empty pagetier-run-PID cgroups of daemons that died (SIGKILL);
    a live daemon's, one still holding processes and other names stay."""
    import subprocess

    from pagetier.daemon.cgroups import remove_stale_run_cgroups

    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = tmp_path / f"pagetier-run-{dead.pid}"
    live = tmp_path / f"pagetier-run-{os.getpid()}"
    busy = tmp_path / f"pagetier-run-{dead.pid + 100000}"  # no such pid, but not empty
    other = tmp_path / "pagetier-run-x"
    for d in (gone, live, busy, other):
        d.mkdir()
    (busy / "cgroup.procs").write_text("123\n")
    with caplog.at_level("WARNING"):
        remove_stale_run_cgroups(tmp_path)
    assert not gone.exists() and live.exists() and busy.exists() and other.exists()
    assert f"removed cgroup {gone}: pagetier pid {dead.pid} died" in caplog.text
