"""The sentinel policy on hand-made cases, the control socket's protocol and permission checks,
and the annotation client, on the host (the live runs are in tests/guest/test_sentinel.py)."""
from __future__ import annotations

import json
import os
import socket
import stat
import threading
import time
import warnings

import numpy as np
import pytest

from pagetier import annotate, policies, protocol
from pagetier.core import planner
from pagetier.core.state import PageState
from pagetier.daemon import control
from pagetier.daemon.clock import Clock
from pagetier.errors import ConfigError
from pagetier.policies import simulate as sim
from pagetier.policies import synth
from pagetier.policies.base import Annotation, Context
from pagetier.policies.sentinel import accessed_objects
from pagetier.profiler.base import PAGE_SIZE, Sample

from polled import polled
from test_daemon_unit import make_daemon

PID = 1000
BASE = 0x7F0000000000
OBJ_PAGES = 4


def sample(addrs, count=5, node=1):
    addrs = np.asarray(addrs, np.uint64)
    return Sample(pid=PID, addr=addrs, count=np.full(len(addrs), count, np.uint32),
                  node=np.full(len(addrs), node, np.int16), npages=np.ones(len(addrs), np.uint16),
                  complete=False)


def obj_pages(i: int) -> np.ndarray:
    """Addresses of object i's pages (objects A, B, C, D = 0..3, four pages each)."""
    lo = BASE + i * OBJ_PAGES * PAGE_SIZE
    return lo + np.arange(OBJ_PAGES, dtype=np.uint64) * np.uint64(PAGE_SIZE)


def profiled(options=None, small=None):
    """Sentinel after profiling four layers L0..L3, object i live in layer i only."""
    pol = policies.create("sentinel", {"small_object_bytes": 0, **(options or {})})
    for i in range(4):
        pol.annotate(Annotation(PID, "register", name="ABCD"[i], addr=int(obj_pages(i)[0]),
                                size=OBJ_PAGES * PAGE_SIZE))
    if small is not None:
        pol.annotate(Annotation(PID, "register", name="s", addr=small, size=PAGE_SIZE))
    pol.annotate(Annotation(PID, "start_profile"))
    for i in range(4):
        assert pol.wants_samples(PID)
        assert pol.annotate(Annotation(PID, "add_layer", layer=f"L{i}")) is False
        pages = obj_pages(i)
        if small is not None and i == 0:
            pages = np.append(pages, np.uint64(small))
        pol.observe(PID, sample(pages))
    pol.annotate(Annotation(PID, "end_profile"))
    assert not pol.wants_samples(PID)
    return pol


def state_with(fast_objects=(), extra=()):
    """Every object's pages tracked (heat 0), on node 0 if in ``fast_objects`` else node 1."""
    st = PageState()
    st.begin_interval()
    addrs = np.concatenate([obj_pages(i) for i in range(4)] + [np.asarray(extra, np.uint64)])
    nodes = np.array([0 if i in fast_objects else 1 for i in range(4) for _ in range(OBJ_PAGES)]
                     + [1] * len(extra), np.int16)
    st.update(Sample(pid=PID, addr=addrs, count=np.zeros(len(addrs), np.uint32), node=nodes,
                     npages=np.ones(len(addrs), np.uint16), complete=True))
    return st


def objects_of(st, idx) -> set:
    """Which of A..D the units ``idx`` belong to."""
    out = set()
    for a in st.addr[np.asarray(idx, np.int64)]:
        out.add("ABCD"[int((int(a) - BASE) // (OBJ_PAGES * PAGE_SIZE))])
    return out


CTX = Context(fast_budget=2 * OBJ_PAGES, max_moves=1 << 30)
WM = {"high_watermark": 1.0, "low_watermark": 1.0}


# --------------------------------------------------------------------------- the policy
def test_profile_derives_live_layers():
    pol = profiled()
    t = pol.targets[PID]
    assert t.layers == ["L0", "L1", "L2", "L3"]
    assert {n: v.tolist() for n, v in t.live.items()} == {"A": [0], "B": [1], "C": [2], "D": [3]}


def test_accessed_objects_by_overlap():
    objs = {"a": (BASE, 2 * PAGE_SIZE), "b": (BASE + 2 * PAGE_SIZE, 100), "c": (BASE + 8 * PAGE_SIZE, 10)}
    s = sample([BASE + PAGE_SIZE, BASE + 2 * PAGE_SIZE])
    assert accessed_objects(objs, s) == {"a", "b"}
    s.count[:] = 0
    assert accessed_objects(objs, s) == set()


def test_boundary_prefetches_the_next_layers():
    pol = profiled({**WM, "lookahead": 2})
    st = state_with()
    assert pol.annotate(Annotation(PID, "add_layer", layer="L0")) is True  # a boundary
    dec = pol.decide(st, CTX)
    assert objects_of(st, dec.promote) == {"A", "B"} and len(dec.demote) == 0
    assert objects_of(st, dec.promote[:OBJ_PAGES]) == {"A"}  # the nearest first
    assert dec.stats["mode"] == "active" and dec.stats["layer"] == "L0"
    assert dec.stats["prefetch_pages"] == 2 * OBJ_PAGES and dec.stats["objects_moved"] == 2


def test_boundary_demotes_what_is_not_needed_for_room():
    pol = profiled({**WM, "lookahead": 2})
    st = state_with(fast_objects=(0, 1))
    pol.annotate(Annotation(PID, "add_layer", layer="L0"))
    pol.annotate(Annotation(PID, "add_layer", layer="L1"))
    dec = pol.decide(st, CTX)
    # B is used now, C next; A not for 3 layers: A makes room for C, D stays slow
    assert objects_of(st, dec.promote) == {"C"}
    assert objects_of(st, dec.demote) == {"A"}
    assert dec.stats["demote_pages"] == OBJ_PAGES and dec.stats["position"] == 1


def test_lookahead_one_and_wraparound():
    pol = profiled({**WM, "lookahead": 1})
    st = state_with(fast_objects=(3,))
    for layer in ("L0", "L1", "L2", "L3", "L0"):  # the next iteration starts again at L0
        pol.annotate(Annotation(PID, "add_layer", layer=layer))
    dec = pol.decide(st, CTX)
    assert objects_of(st, dec.promote) == {"A"} and len(dec.demote) == 0  # room for both
    assert pol.targets[PID].pos == 0 and pol.targets[PID].boundaries == 5


def test_no_demotion_without_need():
    pol = profiled({**WM, "lookahead": 1})
    st = state_with(fast_objects=(2,))
    pol.annotate(Annotation(PID, "add_layer", layer="L0"))
    dec = pol.decide(st, Context(fast_budget=100, max_moves=1 << 30))
    assert objects_of(st, dec.promote) == {"A"} and len(dec.demote) == 0


def test_stuck_units_neither_go_nor_make_room():
    """Pages the kernel refused to move (shared ones) stay on the fast node: the policy plans
    around them. Evicting them instead of a movable unit made room only on paper: the planner
    dropped the demotion and then clipped the promotion it was for (a PyTorch run in the guest
    moved nothing at any layer boundary)."""
    pol = profiled({**WM, "lookahead": 1})
    extra = BASE + 64 * PAGE_SIZE + np.arange(OBJ_PAGES, dtype=np.uint64) * np.uint64(PAGE_SIZE)
    st = state_with(fast_objects=(0,), extra=extra)
    shared = np.flatnonzero(np.isin(st.addr, extra))
    st.record_moves(shared, 0)  # on the fast node...
    st.mark_stuck(shared)  # ...and the kernel refused to move them
    pol.annotate(Annotation(PID, "add_layer", layer="L0"))
    pol.annotate(Annotation(PID, "add_layer", layer="L1"))  # B now; A not for 3 layers
    budget = OBJ_PAGES  # movable pages; the policy's budget adds the unmovable ones
    dec = pol.decide(st, Context(fast_budget=budget + OBJ_PAGES, max_moves=1 << 30))
    assert not np.isin(dec.demote, shared).any() and objects_of(st, dec.demote) == {"A"}
    moves = planner.plan(st, dec, budget, None, 1 << 30)
    assert objects_of(st, moves.demote) == {"A"} and objects_of(st, moves.promote) == {"B"}


def test_budget_and_rate_respected():
    pol = profiled({**WM, "lookahead": 4})
    st = state_with()
    pol.annotate(Annotation(PID, "add_layer", layer="L0"))
    dec = pol.decide(st, Context(fast_budget=6, max_moves=1 << 30))
    assert len(dec.promote) <= 6 and objects_of(st, dec.promote[:4]) == {"A"}
    dec = pol.decide(st, Context(fast_budget=100, max_moves=3))
    assert len(dec.promote) + len(dec.demote) <= 3


def test_small_short_lived_objects_grouped_and_kept_fast():
    small = BASE + 100 * PAGE_SIZE
    pol = profiled({**WM, "lookahead": 1, "small_object_bytes": PAGE_SIZE}, small=small)
    assert pol.targets[PID].grouped == {"s"}
    st = state_with(extra=[small])
    pol.annotate(Annotation(PID, "add_layer", layer="L0"))
    pol.annotate(Annotation(PID, "add_layer", layer="L2"))  # a skipped layer is followed too
    dec = pol.decide(st, CTX)
    promoted = set(st.addr[dec.promote].tolist())
    assert small in promoted  # live in L0 only, but kept fast with its group
    assert objects_of(st, [i for i in dec.promote if st.addr[i] != small]) == {"C"}


def test_unknown_layer_is_not_a_boundary():
    pol = profiled()
    assert pol.annotate(Annotation(PID, "add_layer", layer="nope")) is False


def test_no_annotations_is_the_heuristic():
    frames = synth.generate("phased", pages=1024, intervals=30, seed=2)
    cfg = sim.SimConfig(capacity=200)
    h = sim.simulate(frames, "heuristic", cfg)
    s = sim.simulate(frames, "sentinel", cfg)
    assert s.policy_stats["mode"] == "fallback"
    assert (s.fast_accesses, s.promoted_pages, s.demoted_pages) == \
        (h.fast_accesses, h.promoted_pages, h.demoted_pages)


def test_layered_trace_sentinel_beats_heuristic():
    frames, events = synth.layered(objects=6, object_pages=32, iterations=5)
    cfg = sim.SimConfig(capacity=8 + 3 * 32, rate_mb_s=0)
    h = sim.simulate(frames, "heuristic", cfg, events=events)
    s = sim.simulate(frames, policies.create("sentinel"), cfg, events=events)
    assert s.policy_stats["mode"] == "active" and s.policy_stats["period"] == 12
    assert s.max_fast_pages <= cfg.capacity
    hit_h, hit_s = h.fast_accesses / h.accesses, s.fast_accesses / s.accesses
    print(f"layered trace hit ratio: heuristic {hit_h:.3f}, sentinel {hit_s:.3f}")
    assert hit_s > hit_h + 0.1


def test_bad_options():
    with pytest.raises(ConfigError, match="lookahead"):
        policies.create("sentinel", {"lookahead": 0})
    with pytest.raises(ConfigError, match="unknown option 'k'"):
        policies.create("sentinel", {"k": 2})


# --------------------------------------------------------------------------- the socket
def connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(path))
    return s


def ask(s, data: bytes) -> dict:
    s.sendall(data)
    buf = b""
    while not buf.endswith(b"\n"):
        buf += s.recv(4096)
    return json.loads(buf)


@pytest.fixture
def echo_server(tmp_path):
    seen = []
    handled = {"add_layer": threading.Event()}  # set when the handler has answered that op

    def handler(peer, req):
        seen.append((peer, req))
        if req["op"] in handled:
            handled[req["op"]].set()
        if req["op"] == "detach":
            raise control.RequestError("no")
        return {"echo": req["op"]}

    srv = control.ControlServer(tmp_path / "c.sock", handler)
    with polled(srv.poll):
        yield srv, seen, handled
    srv.close()


def test_protocol(echo_server):
    srv, seen, handled = echo_server
    assert stat.S_IMODE(os.stat(srv.path).st_mode) == 0o666
    s = connect(srv.path)
    assert ask(s, b'{"op": "status"}\n') == {"ok": True, "echo": "status"}
    assert seen[-1][0] == control.Peer(os.getpid(), os.getuid(), os.getgid())
    r = ask(s, b"{nope\n")
    assert r["ok"] is False and "not a JSON request" in r["error"]
    assert "unknown op 'fly'" in ask(s, b'{"op": "fly"}\n')["error"]
    assert "JSON object" in ask(s, b"[1]\n")["error"]
    assert ask(s, b'{"op": "detach", "pid": 1}\n') == {"ok": False, "error": "no"}
    # no reply for reply:false; two requests in one packet, one split over two sends: the
    # second send goes only once the server has answered the first request of the packet, so
    # the start of the second request is waiting in the connection's buffer
    s.sendall(b'{"op": "add_layer", "reply": false}\n{"op": "hel')
    assert handled["add_layer"].wait(5), "the server did not read the first request"
    assert [c.buf for c in srv.conns.values()] == [b'{"op": "hel']
    assert ask(s, b'lo"}\n') == {"ok": True, "echo": "hello", "version": protocol.VERSION}
    assert [r["op"] for _, r in seen[-2:]] == ["add_layer", "hello"]
    s.close()
    s = connect(srv.path)  # the server survived all of it
    assert ask(s, b'{"op": "status"}\n')["ok"]
    s.close()


def test_connections_per_user_are_bounded(tmp_path, monkeypatch):
    """One unprivileged user cannot take every connection: past MAX_PER_USER the next one is
    refused with a reason, and another user (root here) still gets in."""
    uid = {"next": 1000}
    real = control.peer_cred
    monkeypatch.setattr(control, "peer_cred",
                        lambda s: control.Peer(real(s).pid, uid["next"], real(s).gid))
    srv = control.ControlServer(tmp_path / "c.sock", lambda peer, req: {"uid": peer.uid})
    try:
        with polled(srv.poll):
            held = [connect(srv.path) for _ in range(control.MAX_PER_USER)]
            for s in held:
                assert ask(s, b'{"op": "status"}\n') == {"ok": True, "uid": 1000}
            extra = connect(srv.path)
            r = json.loads(extra.makefile("rb").readline())  # said at once, then closed
            assert r["ok"] is False and "too many connections from uid 1000" in r["error"], r
            uid["next"] = 0
            root = connect(srv.path)
            assert ask(root, b'{"op": "status"}\n') == {"ok": True, "uid": 0}
            for s in [*held, extra, root]:
                s.close()
    finally:
        srv.close()


def test_socket_path_claims(tmp_path, echo_server):
    srv, _, _ = echo_server
    with pytest.raises(ConfigError, match="another pagetier daemon is listening"):
        control.ControlServer(srv.path, lambda p, r: None)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()  # bound, nobody listening: stale
    c = control.ControlServer(stale, lambda p, r: None)
    c.close()
    assert not stale.exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a socket"):
        control.ControlServer(tmp_path / "file", lambda p, r: None)


def test_may_manage_rules():
    me = os.getpid()
    uid = os.getuid()
    control.may_manage(control.Peer(1, 0, 0), me)  # root: anything
    control.may_manage(control.Peer(1, uid, 0), me)  # the owner
    with pytest.raises(control.RequestError, match="permission denied"):
        control.may_manage(control.Peer(1, uid + 12345, 0), me)
    with pytest.raises(control.RequestError, match="no such process"):
        control.may_manage(control.Peer(1, 0, 0), 1 << 30)


def test_annotation_request_validation():
    ev = control.annotation(7, {"op": "register", "name": "w", "addr": 4096, "size": 10})
    assert (ev.pid, ev.name, ev.addr, ev.size) == (7, "w", 4096, 10)
    assert control.annotation(7, {"op": "add_layer", "layer": 3}).layer == "3"
    for bad, why in (({"op": "register", "name": "w", "addr": -1, "size": 1},
                      r"register: 'addr' must be an integer >= 0, got -1"),
                     ({"op": "register", "name": "w", "addr": 0, "size": 0},
                      r"register: 'size' must be > 0"),
                     ({"op": "register", "name": "", "addr": 0, "size": 1},
                      r"register: 'name' must be a non-empty string, got ''"),
                     ({"op": "add_layer", "layer": [1]},
                      r"add_layer: 'layer' must be an integer or a string, got \[1\]")):
        with pytest.raises(control.RequestError, match=why):
            control.annotation(7, bad)


# --------------------------------------------------------------------------- daemon + client
@pytest.fixture
def daemon(tmp_path):
    # the real clock: a thread serves the socket and the test waits for its answers
    d = make_daemon(tmp_path, policy="sentinel", pids=(os.getpid(),), budget="64K",
                    control_socket=tmp_path / "ctl.sock", clock=Clock())
    d.open_control()
    assert d.control is not None
    with polled(d._serve):
        yield d
    d.close_control()


def test_daemon_annotations_reach_the_policy(daemon, tmp_path):
    a = annotate.Annotator(daemon.control.path)
    base = daemon.profiler.base
    for i in range(4):
        a.register(f"w{i}", base + i * 4 * PAGE_SIZE, 4 * PAGE_SIZE)
    a.start_profile()
    assert a.profiling and a.enabled
    for i in range(4):
        a.add_layer(i)  # waits: the daemon reads the counts at each boundary while profiling
    a.end_profile()
    reads = daemon.profiler.attached[os.getpid()]
    assert reads >= 4  # one profiler read per layer boundary
    t = daemon.policy.targets[os.getpid()]
    assert len(t.objects) == 4 and t.layers == ["0", "1", "2", "3"]
    # the stub's first 1024 units are hot in every read: all four objects live everywhere
    assert all(v.tolist() == [0, 1, 2, 3] for v in t.live.values())
    n = len(daemon.history)
    a.add_layer(0)  # active: a boundary step, no reply awaited
    deadline = time.monotonic() + 60
    while len(daemon.history) == n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(daemon.history) > n, "no boundary step in 60 s"
    last = daemon.history[-1]
    assert last["boundary"] is True and last["policy"]["mode"] == "active"
    assert last["policy"]["layer"] == "0" and last["fast_used"] <= last["budget"]
    # another process's pid is refused, and status answers
    r = control.request(daemon.control.path, {"op": "add_layer", "layer": 1, "pid": 1})
    assert r["ok"] is False and "calling process only" in r["error"]
    r = control.request(daemon.control.path, {"op": "status"})
    assert r["ok"] and r["status"]["targets"][0]["pid"] == os.getpid()
    a.close()


def test_client_not_managed(tmp_path):
    d = make_daemon(tmp_path, policy="sentinel", pids=(4242,), control_socket=tmp_path / "c.sock",
                    clock=Clock())
    d.open_control()
    try:
        with polled(d._serve):
            a = annotate.Annotator(d.control.path)
            with pytest.warns(RuntimeWarning, match="is not managed by this pagetier daemon"):
                a.add_layer(1)
            assert a.enabled is False
    finally:
        d.close_control()
    assert not (tmp_path / "c.sock").exists()


def test_client_without_daemon_is_a_noop(tmp_path):
    a = annotate.Annotator(tmp_path / "nobody.sock")
    with pytest.warns(RuntimeWarning, match="no pagetier daemon at"):
        a.start_profile()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, then silence
        a.add_layer("x")
        a.register("w", 4096, 4096)
        a.end_profile()
    assert a.enabled is False and not a.profiling


def test_object_count_is_bounded(monkeypatch):
    from pagetier.policies import sentinel

    monkeypatch.setattr(sentinel, "MAX_OBJECTS", 3)
    pol = policies.create("sentinel")
    for i in range(5):
        pol.annotate(Annotation(PID, "register", name=f"o{i}", addr=4096 * i, size=4096))
    pol.annotate(Annotation(PID, "register", name="o0", addr=0, size=8192))  # moving one: fine
    assert pol.targets[PID].objects == {"o0": (0, 8192), "o1": (4096, 4096), "o2": (8192, 4096)}


def test_setuid_process_is_not_the_users(monkeypatch):
    monkeypatch.setattr(control, "uids", lambda pid: (1000, 0, 0, 0))  # a setuid-root program
    with pytest.raises(control.RequestError, match="permission denied"):
        control.may_manage(control.Peer(1, 1000, 1000), 4242)
    control.may_manage(control.Peer(1, 0, 0), 4242)
