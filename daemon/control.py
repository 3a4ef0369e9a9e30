"""The daemon's control socket: newline-delimited JSON requests from applications and users.

The daemon listens on a Unix stream socket (``control_socket`` in the config, else
$PAGETIER_SOCKET, else ``run_dir()/control.sock``), mode 0666 so that any local user may
connect; every request is authorized from the peer's kernel-reported credentials
(SO_PEERCRED), never from what the request claims:

- annotations (``hello``, ``start_profile``, ``end_profile``, ``add_layer``, ``register``,
  ``unregister``; see pagetier/annotate.py) apply only to the calling process itself, which must
  be one of the daemon's targets;
- ``attach`` / ``detach`` of a PID: only by root or by the user every uid of the process
  (real, effective, saved) is (ptrace's rule for unprivileged users: not a setuid program);
- ``add_cgroup`` (``path``, ``fast_budget``: bytes, a size string or null) / ``remove_cgroup``
  (``path``): root only; a removed cgroup's processes are detached, their pages left in place.
- ``status``: anyone, showing only the targets the caller owns (all of them to root).

One request per line, a JSON object with ``op``; one reply per line, ``{"ok": true, ...}`` or
``{"ok": false, "error": "..."}``, except for requests carrying ``"reply": false`` (the
fire-and-forget annotations an application sends on its hot path). Malformed input gets an
error reply; nothing a client sends can stop the daemon.

The server is polled from the daemon's loop (:meth:`ControlServer.poll`), so requests run on
the daemon's thread, between intervals, with no locking. :class:`Requests` answers them for the daemon:
annotations to its policy, status from its report, attach and detach to its targets.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import selectors
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pagetier import protocol
from pagetier.core.units import parse_size
from pagetier.daemon import cgroups, report
from pagetier.errors import ConfigError, PagetierError
from pagetier.policies.base import Annotation
from pagetier.protocol import ANNOTATION_OPS, MAX_LINE, OPS  # noqa: F401  (the wire protocol)

log = logging.getLogger("pagetier.daemon")

MAX_CLIENTS = 256
MAX_PER_USER = 16  # connections one unprivileged user may hold: one user cannot lock out others
_SUN_PATH_MAX = 107


@dataclass(frozen=True)
class Peer:
    """The connected process, as the kernel reported it when it connected."""

    pid: int
    uid: int
    gid: int


class RequestError(PagetierError):
    """A request that is refused: the message goes back to the client."""


def default_path() -> Path:
    """$PAGETIER_SOCKET, else run_dir()/control.sock."""
    return protocol.socket_path()


def peer_cred(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def uids(pid: int) -> tuple[int, ...] | None:
    """(real, effective, saved, filesystem) uids of ``pid``, None when there is no such process."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return tuple(int(x) for x in line.split()[1:5])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def owner(pid: int) -> int | None:
    """The real uid of ``pid``."""
    u = uids(pid)
    return u[0] if u else None


def may_manage(peer: Peer, pid: int) -> None:
    """Raise RequestError unless ``peer`` may have the daemon attach to or detach ``pid``: root
    may; another user only if every uid of the process is theirs (ptrace's rule: not a setuid
    program they started)."""
    u = uids(pid)
    if u is None:
        raise RequestError(f"no such process: {pid}")
    if peer.uid != 0 and any(x != peer.uid for x in u):
        raise RequestError(f"permission denied: pid {pid} belongs to uid {u[0]}, you are uid "
                           f"{peer.uid} (only root or the process's owner may attach or detach it)")


def _pid_arg(req: dict) -> int:
    pid = req.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise RequestError(f"{req.get('op')}: 'pid' must be a positive integer, got {pid!r}")
    return pid


def annotation(pid: int, req: dict):
    """The policies.Annotation an annotation request stands for (RequestError if malformed)."""
    op = req["op"]
    ev = Annotation(pid=pid, op=op)
    if op == "add_layer":
        layer = req.get("layer")
        if isinstance(layer, bool) or not isinstance(layer, (int, str)):
            raise RequestError(f"add_layer: 'layer' must be an integer or a string, got {layer!r}")
        ev.layer = str(layer)
    if op in ("register", "unregister"):
        name = req.get("name")
        if not isinstance(name, str) or not name:
            raise RequestError(f"{op}: 'name' must be a non-empty string, got {name!r}")
        ev.name = name
    if op == "register":
        for key in ("addr", "size"):
            v = req.get(key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0 or v >= 1 << 64:
                raise RequestError(f"register: {key!r} must be an integer >= 0, got {v!r}")
        if req["size"] == 0:
            raise RequestError("register: 'size' must be > 0")
        ev.addr, ev.size = req["addr"], req["size"]
    return ev


class _Conn:
    __slots__ = ("sock", "peer", "buf", "out")

    def __init__(self, sock: socket.socket, peer: Peer):
        self.sock, self.peer, self.buf, self.out = sock, peer, b"", b""


class ControlServer:
    """The listening socket and its connections; ``handler(peer, request) -> dict | None``
    answers one request (raise RequestError to refuse it)."""

    def __init__(self, path: str | os.PathLike, handler: Callable[[Peer, dict], dict | None]):
        self.path = Path(path)
        self.handler = handler
        if len(os.fsencode(str(self.path))) > _SUN_PATH_MAX:
            raise ConfigError(f"control socket {self.path}: path longer than {_SUN_PATH_MAX} bytes")
        self._claim_path()
        self.sel = selectors.DefaultSelector()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            old = os.umask(0o111)  # the socket file is created rw for everyone: 0666
            try:
                self.sock.bind(str(self.path))
            finally:
                os.umask(old)
            os.chmod(self.path, 0o666)
            self.sock.listen(64)
            self.sock.setblocking(False)
        except OSError as e:
            self.sock.close()
            raise ConfigError(f"control socket {self.path}: {e.strerror}") from None
        self._ino = os.stat(self.path).st_ino
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self.conns: dict[int, _Conn] = {}

    def _claim_path(self) -> None:
        """Create the directory; remove a stale socket; refuse a path another daemon serves."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"control socket {self.path}: {e.strerror}") from None
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise ConfigError(f"control socket {self.path}: exists and is not a socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(self.path))
        except OSError:
            self.path.unlink(missing_ok=True)  # stale: its daemon is gone
            return
        finally:
            probe.close()
        raise ConfigError(f"control socket {self.path}: another pagetier daemon is listening there "
                          "(set control_socket in the config or $PAGETIER_SOCKET)")

    # ------------------------------------------------------------------ polling
    def poll(self, timeout: float = 0.0) -> None:
        """Serve whatever is ready within ``timeout`` seconds."""
        for key, _ in self.sel.select(timeout):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def _accept(self) -> None:
        while True:
            try:
                s, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # EMFILE and the like: try again next poll
                log.warning("control socket: accept: %s", e.strerror)
                return
            if len(self.conns) >= MAX_CLIENTS:
                s.close()
                continue
            c = _Conn(s, peer_cred(s))
            if c.peer.uid != 0 and sum(o.peer.uid == c.peer.uid for o in self.conns.values()) \
                    >= MAX_PER_USER:
                log.info("control: uid %d already holds %d connections: refused", c.peer.uid,
                         MAX_PER_USER)
                self._send(c, {"ok": False, "error": f"too many connections from uid "
                                                     f"{c.peer.uid} (at most {MAX_PER_USER})"})
                s.close()
                continue
            s.setblocking(False)
            self.conns[s.fileno()] = c
            self.sel.register(s, selectors.EVENT_READ, c)

    def _close(self, c: _Conn) -> None:
        self.conns.pop(c.sock.fileno(), None)
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()

    def _read(self, c: _Conn) -> None:
        try:
            data = c.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(c)
            return
        c.buf += data
        while b"\n" in c.buf:
            line, c.buf = c.buf.split(b"\n", 1)
            if line.strip():
                self._answer(c, line)
            if c.sock.fileno() < 0:
                return
        if len(c.buf) > MAX_LINE:
            self._send(c, {"ok": False, "error": f"request longer than {MAX_LINE} bytes"})
            self._close(c)

    def _answer(self, c: _Conn, line: bytes) -> None:
        want_reply = True
        try:
            try:
                req = protocol.decode(line)
            except ValueError as e:
                raise RequestError(f"not a JSON request: {e}") from None
            if not isinstance(req, dict):
                raise RequestError("a request is a JSON object with an 'op'")
            want_reply = req.get("reply", True) is not False
            op = req.get("op")
            if op not in OPS:
                raise RequestError(f"unknown op {op!r} (known: {', '.join(OPS)})")
            reply = self.handler(c.peer, req) or {}
            reply = {"ok": True, **reply}
            if op == "hello":
                reply.setdefault("version", protocol.VERSION)
        except RequestError as e:
            reply = {"ok": False, "error": str(e)}
            if not want_reply:
                log.info("control: pid %d: %s", c.peer.pid, e)
        except Exception as e:  # a bug in a handler must not stop the daemon
            log.exception("control: request from pid %d failed", c.peer.pid)
            reply = {"ok": False, "error": f"internal error: {e}"}
        if want_reply:
            self._send(c, reply)

    def _send(self, c: _Conn, reply: dict) -> None:
        data = protocol.encode(reply)
        try:
            c.sock.setblocking(True)
            c.sock.settimeout(1.0)  # a client that never reads cannot stall the daemon long
            c.sock.sendall(data)
        except OSError as e:
            if e.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.info("control: pid %d: reply dropped: %s", c.peer.pid, e)
            self._close(c)
            return
        c.sock.setblocking(False)

    def close(self) -> None:
        for c in list(self.conns.values()):
            self._close(c)
        self.sel.unregister(self.sock)
        self.sock.close()
        self.sel.close()
        try:  # only our own socket: another daemon may have claimed the path since
            if os.stat(self.path).st_ino == self._ino:
                self.path.unlink()
        except FileNotFoundError:
            pass


class Requests:
    """Answers the control requests of ``daemon`` (daemon/loop.py), the ControlServer's
    handler: annotations go to its policy, status comes from its report, attach and detach
    go to its target tracking."""

    def __init__(self, daemon):
        self.daemon = daemon

    def __call__(self, peer: Peer, req: dict) -> dict | None:
        op = req["op"]
        if op in ANNOTATION_OPS:
            return self.annotate(peer, op, req)
        if op == "status":
            return self.status(peer)
        if op in ("add_cgroup", "remove_cgroup"):
            return self.cgroup(peer, op, req)
        return self.manage(peer, op, _pid_arg(req))

    def cgroup(self, peer: Peer, op: str, req: dict) -> dict:
        """Manage a cgroup from now on (with its budget), or let one go (root only)."""
        if peer.uid != 0:
            raise RequestError(f"{op}: only root may add or remove cgroups (uid {peer.uid})")
        path = req.get("path")
        if not isinstance(path, str) or not path:
            raise RequestError(f"{op}: give \"path\", a cgroup v2 directory")
        tracker = self.daemon.tracker
        if op == "remove_cgroup":
            known = {str(p): p for p in tracker.cgroups}
            p = known.get(path)
            if p is None:
                try:
                    p = cgroups.resolve(path)
                except ConfigError:
                    p = None
            if p is None or not tracker.remove_cgroup(p, f"removed at the request of pid {peer.pid}"):
                raise RequestError(f"remove_cgroup: cgroup {path} is not managed by this daemon")
            return {"path": str(p)}
        budget = req.get("fast_budget")
        try:
            p = cgroups.resolve(path)
            if budget is not None:
                budget = parse_size(budget, "fast_budget", f"add_cgroup {path}")
        except ConfigError as e:
            raise RequestError(str(e)) from None
        tracker.add_cgroup(p, budget)
        return {"path": str(p), "fast_budget": budget}

    def annotate(self, peer: Peer, op: str, req: dict) -> dict | None:
        """An application's annotation of itself, passed to the policy; a policy that asks for
        a decision now gets a boundary step."""
        d = self.daemon
        pid = req.get("pid", peer.pid)
        if pid != peer.pid:
            raise RequestError(f"{op}: annotations apply to the calling process only "
                               f"(pid {peer.pid}), not to pid {pid}")
        if pid not in d.targets:
            raise RequestError(f"pid {pid} is not managed by this pagetier daemon "
                               f"(start it with `pagetier run` or attach it first)")
        if op == "hello":
            return {"pid": pid, "policy": d.policy.name,
                    "annotations": bool(d.policy.accepts_annotations)}
        ev = annotation(pid, req)
        if op in ("add_layer", "end_profile") and d.policy.wants_samples(pid):
            d.read_target(pid)  # the counts of the layer that just ended
        if d.policy.annotate(ev):
            d.boundary()
        return None

    def status(self, peer: Peer) -> dict:
        """The status document; an unprivileged caller sees only the targets it owns."""
        doc = report.status_doc(self.daemon)
        if peer.uid != 0:
            doc["targets"] = [t for t in doc["targets"] if owner(t["pid"]) == peer.uid]
            doc.pop("config", None)
            doc.pop("last", None)
            doc.pop("totals", None)
        return {"status": json.loads(json.dumps(doc, default=report.jsonable))}

    def manage(self, peer: Peer, op: str, pid: int) -> dict:
        """Attach or detach ``pid``, for a peer allowed to manage it."""
        may_manage(peer, pid)
        d = self.daemon
        if op == "attach":
            try:
                d.tracker.attach(pid)
            except (PagetierError, OSError) as e:
                raise RequestError(f"attach {pid}: {e}") from None
            return {"pid": pid}
        if pid not in d.targets:
            raise RequestError(f"detach: pid {pid} is not managed by this daemon")
        d.tracker.drop(pid, f"detached at the request of pid {peer.pid}")
        return {"pid": pid}


def request(path: str | os.PathLike, req: dict, timeout: float = 10.0) -> dict:
    """One request on a fresh connection (the CLI's and tests' client); the reply."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        s.sendall(protocol.encode(req))
        buf = b""
        while b"\n" not in buf:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise PagetierError(f"control socket {path}: the daemon closed the connection")
            buf += chunk
    except FileNotFoundError:
        raise PagetierError(f"control socket {path}: no such file (is a pagetier daemon running?)") from None
    except ConnectionRefusedError:
        raise PagetierError(f"control socket {path}: nobody is listening (stale socket)") from None
    except PermissionError:
        raise PagetierError(f"control socket {path}: permission denied") from None
    except socket.timeout:
        raise PagetierError(f"control socket {path}: no reply in {timeout:g} s") from None
    finally:
        s.close()
    return protocol.decode(buf.split(b"\n", 1)[0])
