"""Tell the pagetier daemon about this process's structure (for the sentinel policy).

    from pagetier import annotate

    annotate.register("fc1.weight", addr, nbytes)   # an object: name, address, size in bytes
    annotate.start_profile()                         # around one training iteration:
    annotate.add_layer("fwd:fc1")                    #   a layer starts (a name or an index)
    ...
    annotate.end_profile()
    annotate.add_layer("fwd:fc1")                    # later iterations: boundaries only

Requests go over the daemon's control socket ($PAGETIER_SOCKET, which `pagetier run` sets for
the command it starts, else /run/pagetier/control.sock), in pagetier/protocol.py's format. The first call connects and says
hello; when no daemon is listening, this process is not one it manages, or its policy takes no
annotations, every call is a no-op from then on, after one warning: an application never
breaks for want of a daemon. ``add_layer`` and ``register`` do not wait for a reply (they are on
the application's hot path) except while a profile is being taken, when each ``add_layer``
waits until the daemon has read the counts of the layer that ended.
"""
from __future__ import annotations

import os
import socket
import threading
import warnings
from pathlib import Path

from pagetier import protocol
from pagetier.protocol import socket_path


class Annotator:
    """One connection to the daemon (module-level functions use a shared one)."""

    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 30.0):
        self.path = Path(path) if path else None
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.enabled: bool | None = None  # None: not tried yet
        self.profiling = False
        self.reason = ""
        self._buf = b""
        self._lock = threading.Lock()
        self._pid = os.getpid()

    # ------------------------------------------------------------------ plumbing
    def _disable(self, why: str) -> None:
        self.enabled, self.reason = False, why
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        warnings.warn(f"pagetier.annotate: {why}; annotations are ignored", RuntimeWarning,
                      stacklevel=4)

    def _connect(self) -> bool:
        path = self.path or socket_path()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        s.settimeout(self.timeout)
        try:
            s.connect(str(path))
        except OSError as e:
            s.close()
            self._disable(f"no pagetier daemon at {path} ({e.strerror or e})")
            return False
        self.sock = s
        try:
            reply = self._call({"op": "hello", "version": protocol.VERSION})
        except OSError as e:
            self._disable(f"daemon at {path}: {e}")
            return False
        if not reply.get("ok"):
            self._disable(f"daemon at {path}: {reply.get('error')}")
            return False
        if reply.get("version") != protocol.VERSION:
            self._disable(f"daemon at {path} speaks protocol version {reply.get('version')}, "
                          f"this process {protocol.VERSION}")
            return False
        if not reply.get("annotations"):
            self._disable(f"the daemon's policy {reply.get('policy')!r} takes no annotations")
            return False
        self.enabled = True
        return True

    def _call(self, req: dict, wait: bool = True) -> dict:
        if not wait:
            req = {**req, "reply": False}
        self.sock.sendall(protocol.encode(req))
        if not wait:
            return {"ok": True}
        while b"\n" not in self._buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionResetError("the daemon closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return protocol.decode(line)

    def send(self, req: dict, wait: bool = True) -> dict | None:
        """Send ``req``; its reply (None when disabled or not waiting). Never raises for the
        daemon's sake: a lost daemon disables this annotator with one warning."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: its own connection, its own hello
                if self.sock is not None:
                    self.sock.close()
                self.sock, self.enabled, self._buf, self._pid = None, None, b"", os.getpid()
            if self.enabled is False:
                return None
            if self.enabled is None and not self._connect():
                return None
            try:
                reply = self._call(req, wait)
            except (OSError, ValueError) as e:
                self._disable(f"lost the daemon: {e}")
                return None
        if wait and not reply.get("ok"):
            warnings.warn(f"pagetier.annotate: {req.get('op')}: {reply.get('error')}",
                          RuntimeWarning, stacklevel=3)
        return reply if wait else None

    def close(self) -> None:
        with self._lock:
            if self.sock is not None:
                self.sock.close()
                self.sock = None
            self.enabled = None

    # ------------------------------------------------------------------ the API
    def start_profile(self) -> None:
        """The next iteration is profiled: call at its start, ``end_profile`` at its end."""
        if self.send({"op": "start_profile"}) is not None:
            self.profiling = True

    def end_profile(self) -> None:
        self.send({"op": "end_profile"})
        self.profiling = False

    def add_layer(self, layer: int | str) -> None:
        """A layer starts now (the same names in the same order each iteration)."""
        if self.enabled is False:
            return
        self.send({"op": "add_layer", "layer": layer}, wait=self.profiling)

    def register(self, name: str, addr: int, size: int) -> None:
        """Object ``name`` occupies ``size`` bytes at ``addr`` (registering again moves it)."""
        if self.enabled is False:
            return
        self.send({"op": "register", "name": name, "addr": int(addr), "size": int(size)},
                  wait=False)

    def unregister(self, name: str) -> None:
        if self.enabled is False:
            return
        self.send({"op": "unregister", "name": name}, wait=False)


_default = Annotator()


def start_profile() -> None:
    _default.start_profile()


def end_profile() -> None:
    _default.end_profile()


def add_layer(layer: int | str) -> None:
    _default.add_layer(layer)


def register(name: str, addr: int, size: int) -> None:
    _default.register(name, addr, size)


def unregister(name: str) -> None:
    _default.unregister(name)


def enabled() -> bool:
    """True when annotations reach a daemon (connects on first use)."""
    if _default.enabled is None:
        _default.send({"op": "hello"})
    return bool(_default.enabled)
