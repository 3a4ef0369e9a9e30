"""The control socket's wire protocol (pagetier/protocol.py): one definition for the daemon's
server and the annotation client. A real server (daemon/control.py) and a real client
(pagetier/annotate.py) over a real socket."""
import contextlib
from pathlib import Path
import warnings

from pagetier import annotate, protocol
from pagetier.daemon import control
from polled import polled


def test_socket_path_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("PAGETIER_SOCKET", raising=False)
    monkeypatch.delenv("PAGETIER_RUN_DIR", raising=False)
    assert protocol.socket_path() == Path("/run/pagetier/control.sock")
    monkeypatch.setenv("PAGETIER_RUN_DIR", str(tmp_path))
    assert protocol.socket_path() == tmp_path / "control.sock"
    assert control.default_path() == annotate.socket_path() == tmp_path / "control.sock"
    monkeypatch.setenv("PAGETIER_SOCKET", str(tmp_path / "s"))
    assert control.default_path() == annotate.socket_path() == tmp_path / "s"


def test_encode_decode_round_trip():
    msg = {"op": "register", "name": "fc1.weight", "addr": 1 << 40, "size": 4096}
    line = protocol.encode(msg)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode(line) == msg


@contextlib.contextmanager
def _serve(tmp_path, reply):
    """A control server answering every request with ``reply``, polled on a thread while the
    block runs; yields the server and the requests it has seen."""
    seen = []

    def handler(peer, req):
        seen.append(req)
        return dict(reply)

    srv = control.ControlServer(tmp_path / "c.sock", handler)
    try:
        with polled(srv.poll, 0.05):
            yield srv, seen
    finally:
        srv.close()


def test_hello_carries_versions_both_ways(tmp_path):
    with _serve(tmp_path, {"annotations": True, "policy": "sentinel"}) as (srv, seen):
        a = annotate.Annotator(srv.path, timeout=30)
        reply = a.send({"op": "hello", "version": protocol.VERSION})
        assert reply["version"] == protocol.VERSION and a.enabled is True
        assert seen[0] == {"op": "hello", "version": protocol.VERSION}  # the client's own hello
        a.close()


def test_client_refuses_a_daemon_of_another_version(tmp_path):
    with _serve(tmp_path, {"annotations": True, "version": protocol.VERSION + 1}) as (srv, _):
        a = annotate.Annotator(srv.path, timeout=30)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            assert a.send({"op": "add_layer", "layer": 1}) is None
        assert a.enabled is False and "protocol version" in a.reason, a.reason
        assert any("protocol version" in str(x.message) for x in w)
