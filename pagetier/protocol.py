"""The control socket's wire protocol, shared by the daemon's server (daemon/control.py) and its
clients (pagetier/annotate.py, pagetier/torch_hooks.py through it, ``control.request``).

- Transport: a Unix stream socket. Its path is ``control_socket`` in the daemon's config, else
  ``$PAGETIER_SOCKET`` (``pagetier run`` sets it for the command it starts), else
  ``control.sock`` in the run directory (``$PAGETIER_RUN_DIR``, else /run/pagetier).
- Framing: one JSON object per line (UTF-8, ``\\n``-terminated, at most MAX_LINE bytes), each
  request an object with ``op`` (one of OPS). Each reply is one line, ``{"ok": true, ...}`` or
  ``{"ok": false, "error": "..."}``; a request with ``"reply": false`` gets none.
- Versions: a client's ``hello`` carries ``version`` (VERSION); the daemon's reply to ``hello``
  carries its own. A client talks only to a daemon of its own version (a new field is added
  within a version only when old peers can ignore it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

VERSION = 1

ENV_SOCKET = "PAGETIER_SOCKET"
ENV_RUN_DIR = "PAGETIER_RUN_DIR"
DEFAULT_RUN_DIR = "/run/pagetier"
SOCKET_NAME = "control.sock"

# what an application says about itself (the sentinel policy's input)
ANNOTATION_OPS = ("hello", "start_profile", "end_profile", "add_layer", "register", "unregister")
# what users and tools ask of the daemon
# (add_cgroup / remove_cgroup: root only; {"path": P, "fast_budget": BYTES or null})
ADMIN_OPS = ("attach", "detach", "status", "add_cgroup", "remove_cgroup")
OPS = (*ANNOTATION_OPS, *ADMIN_OPS)
MAX_LINE = 64 << 10  # a longer request is an error and closes the connection


def run_dir() -> Path:
    """$PAGETIER_RUN_DIR, else /run/pagetier."""
    return Path(os.environ.get(ENV_RUN_DIR, DEFAULT_RUN_DIR))


def socket_path() -> Path:
    """The default control socket: $PAGETIER_SOCKET, else run_dir()/control.sock."""
    env = os.environ.get(ENV_SOCKET)
    return Path(env) if env else run_dir() / SOCKET_NAME


def encode(msg: dict) -> bytes:
    """One message as one line."""
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> object:
    """The JSON value of one line (ValueError if it is not JSON)."""
    return json.loads(line)
