"""Kubernetes: the pods on this node that ask for pagetier, resolved to their cgroups.

A pod asks through its annotations:

- ``pagetier.io/fast-budget: "2G"``: manage the pod's cgroup with that budget of fast memory
  (pagetier sizes, binary: "512M", "2G"; Kubernetes quantities "512Mi", "2Gi" mean the same);
- ``pagetier.io/manage: "true"``: manage it without a budget of its own (it shares the daemon's
  --fast-budget / the node's free fast memory); ``"false"`` turns management off even when a
  budget is given.

A pod's cgroup v2 directory follows from its uid and QoS class, under one of the kubelet's two
cgroup drivers (which one a node uses is seen from which directory exists)::

    QoS         systemd driver                                               cgroupfs driver
    Guaranteed  kubepods.slice/kubepods-pod<uid_>.slice                       kubepods/pod<uid>
    Burstable   kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice
                                                                              kubepods/burstable/pod<uid>
    BestEffort  kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice
                                                                              kubepods/besteffort/pod<uid>

(``<uid_>``: the uid with "-" replaced by "_", as systemd unit names need.) A static pod's
cgroup is named after the kubelet's hash of its manifest, which the API server's mirror pod
carries in the ``kubernetes.io/config.mirror`` annotation, not after the mirror pod's uid.

:func:`resolve` is pure: a pod list as the API server returns it and a cgroup root in, the
pods to manage out (with a warning for each bad annotation). :class:`Sync` turns successive
resolutions into the daemon's ``add_cgroup`` / ``remove_cgroup`` control requests, and
:func:`run` is the loop ``pagetier kube-sync`` runs; :func:`list_pods` asks the API server.
"""
from __future__ import annotations

import json
import logging
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pagetier.core.units import parse_size
from pagetier.errors import ConfigError, PagetierError

log = logging.getLogger("pagetier.kube")

BUDGET = "pagetier.io/fast-budget"
MANAGE = "pagetier.io/manage"
MIRROR = "kubernetes.io/config.mirror"
QOS_CLASSES = ("Guaranteed", "Burstable", "BestEffort")
# pods in these phases have no processes left (their cgroups are gone or going)
ENDED = ("Succeeded", "Failed")

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class Pod:
    """One pod that asks for pagetier, resolved: ``path`` is its cgroup directory under the
    cgroup root (the path the daemon is asked to add: the DaemonSet mounts the host's cgroup
    root at the same place in both containers)."""

    name: str  # namespace/name
    uid: str
    path: str
    fast_budget: int | None


def pod_name(pod: dict) -> str:
    md = pod.get("metadata") or {}
    return f"{md.get('namespace', 'default')}/{md.get('name', '?')}"


def parse_budget(value) -> int:
    """Bytes of a budget annotation: a pagetier size ("2G", "512M") or a Kubernetes binary
    quantity ("2Gi", "512Mi"); ConfigError unless it is a size above zero."""
    text = value.strip() if isinstance(value, str) else value
    if isinstance(text, str):
        text = re.sub(r"(?i)([KMGT])i$", r"\1", text)  # Kubernetes' Gi is pagetier's G
    n = parse_size(text, BUDGET)
    if n <= 0:
        raise ConfigError(f"{BUDGET} must be above zero, got {value!r}")
    return n


def wanted(pod: dict) -> tuple[bool, int | None]:
    """(manage?, budget in bytes or None) from a pod's annotations; ConfigError for a value
    that is neither a size nor true/false."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    manage = ann.get(MANAGE)
    if manage is not None:
        flag = str(manage).strip().lower()
        if flag not in ("true", "false"):
            raise ConfigError(f"{MANAGE} must be \"true\" or \"false\", got {manage!r}")
        if flag == "false":
            return False, None
    if BUDGET in ann:
        return True, parse_budget(ann[BUDGET])
    return manage is not None, None


def cgroup_uid(pod: dict) -> str:
    """The uid the kubelet names the pod's cgroup after: a static pod's manifest hash (its
    mirror pod's annotation), else metadata.uid."""
    md = pod.get("metadata") or {}
    return (md.get("annotations") or {}).get(MIRROR) or md.get("uid") or ""


def candidates(uid: str, qos: str | None) -> list[str]:
    """The pod's cgroup directory under each driver (systemd first), relative to the cgroup
    root; every QoS class's when ``qos`` is unknown (a pod whose status has none yet)."""
    out = []
    for q in (qos,) if qos in QOS_CLASSES else QOS_CLASSES:
        u = uid.replace("-", "_")
        if q == "Guaranteed":
            out += [f"kubepods.slice/kubepods-pod{u}.slice", f"kubepods/pod{uid}"]
        else:
            lq = q.lower()
            out += [f"kubepods.slice/kubepods-{lq}.slice/kubepods-{lq}-pod{u}.slice",
                    f"kubepods/{lq}/pod{uid}"]
    return out


def resolve(pod_list: dict, node: str, cgroup_root: str | os.PathLike
            ) -> tuple[list[Pod], list[str]]:
    """The pods of ``pod_list`` (a PodList from the API server) on ``node`` that ask for
    pagetier and whose cgroup exists under ``cgroup_root``; and one warning for each pod with
    a bad annotation (that pod is left out). A pod whose cgroup does not exist yet (still
    starting) is left out without a warning: the next round finds it."""
    root = Path(cgroup_root)
    pods, warnings = [], []
    for pod in pod_list.get("items") or []:
        if not isinstance(pod, dict):
            continue
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        status = pod.get("status") or {}
        if status.get("phase") in ENDED:
            continue
        try:
            manage, budget = wanted(pod)
        except ConfigError as e:
            warnings.append(f"pod {pod_name(pod)}: {e}; pod skipped")
            continue
        if not manage:
            continue
        uid = cgroup_uid(pod)
        if not re.fullmatch(r"[0-9A-Za-z_-]+", uid):
            warnings.append(f"pod {pod_name(pod)}: uid {uid!r} cannot name a cgroup; pod skipped")
            continue
        path = next((p for p in candidates(uid, status.get("qosClass"))
                     if (root / p / "cgroup.procs").is_file()), None)
        if path is None:
            log.debug("pod %s: no cgroup yet under %s", pod_name(pod), root)
            continue
        pods.append(Pod(pod_name(pod), uid, str(root / path), budget))
    return pods, warnings


class Sync:
    """What this node's daemon manages for kube-sync, kept in step with the pods.

    ``send(request) -> reply`` is one control request (control.request on the daemon's
    socket). Each :meth:`step` adds the cgroups of new pods, removes those of pods that are
    gone or no longer ask, and re-adds a cgroup whose budget changed. A request the daemon
    refuses is logged and tried again next step. When the daemon restarted (its status shows
    another pid or start time), everything is added again: a new daemon knows none of them.
    """

    def __init__(self, send: Callable[[dict], dict]):
        self.send = send
        self.managed: dict[str, int | None] = {}  # path -> budget, as the daemon has them
        self.names: dict[str, str] = {}  # path -> pod, for the log
        self.daemon: tuple | None = None
        self._refused: set[tuple[str, str]] = set()

    def _daemon_changed(self) -> None:
        reply = self.send({"op": "status"})
        st = (reply.get("status") or {}) if reply.get("ok") else {}
        ident = (st.get("pid"), st.get("started"))
        if self.daemon is not None and ident != self.daemon and self.managed:
            log.info("the daemon restarted (pid %s): adding %d cgroup(s) again",
                     ident[0], len(self.managed))
            self.managed.clear()
        self.daemon = ident

    def _ask(self, req: dict, pod: str) -> bool:
        reply = self.send(req)
        if reply.get("ok"):
            self._refused.discard((req["path"], req["op"]))
            return True
        key = (req["path"], req["op"])
        if key not in self._refused:  # once per refusal, not every step
            self._refused.add(key)
            log.warning("pod %s: %s %s refused by the daemon: %s", pod, req["op"], req["path"],
                        reply.get("error", reply))
        return False

    def step(self, pods: Iterable[Pod]) -> list[dict]:
        """Bring the daemon in line with ``pods``; the requests that succeeded, in order."""
        self._daemon_changed()
        want = {p.path: p for p in pods}
        done = []
        for path in sorted(set(self.managed) - set(want)):
            req = {"op": "remove_cgroup", "path": path}
            if not (Path(path) / "cgroup.procs").exists():
                # the pod's cgroup is gone: the daemon let it go on its own
                log.info("pod %s gone: %s removed", self.names.get(path, "?"), path)
                del self.managed[path]
                continue
            if self._ask(req, self.names.get(path, "?")):
                log.info("pod %s gone or no longer annotated: %s removed",
                         self.names.get(path, "?"), path)
                del self.managed[path]
                done.append(req)
        for path, p in sorted(want.items()):
            if path in self.managed and self.managed[path] == p.fast_budget:
                continue
            if path in self.managed:  # a new budget: the daemon takes it with a new add
                req = {"op": "remove_cgroup", "path": path}
                if not self._ask(req, p.name):
                    continue
                del self.managed[path]
                done.append(req)
            req = {"op": "add_cgroup", "path": path, "fast_budget": p.fast_budget}
            if self._ask(req, p.name):
                log.info("pod %s: %s added, fast budget %s", p.name, path,
                         "shared" if p.fast_budget is None else f"{p.fast_budget} bytes")
                self.managed[path] = p.fast_budget
                self.names[path] = p.name
                done.append(req)
        return done


# ------------------------------------------------------------------------ the API server
def api_server() -> str:
    """The in-cluster API server's URL, from the environment every pod gets."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise ConfigError("not in a Kubernetes pod (no KUBERNETES_SERVICE_HOST): "
                          "give the API server with --api-server URL")
    if ":" in host:
        host = f"[{host}]"
    return f"https://{host}:{port}"


def list_pods(url: str, node: str, token_file: str | os.PathLike | None = None,
              ca_file: str | os.PathLike | None = None, timeout: float = 10.0) -> dict:
    """The PodList of the pods on ``node``: GET /api/v1/pods with a field selector, the
    service account's bearer token (read again each time: bound tokens are rotated) and the
    cluster's CA. PagetierError naming the URL when the API server cannot be asked."""
    query = urllib.parse.urlencode({"fieldSelector": f"spec.nodeName={node}"})
    full = f"{url.rstrip('/')}/api/v1/pods?{query}"
    headers = {"Accept": "application/json"}
    if token_file and Path(token_file).is_file():
        headers["Authorization"] = f"Bearer {Path(token_file).read_text().strip()}"
    ctx = None
    if full.startswith("https:"):
        ctx = ssl.create_default_context(
            cafile=str(ca_file) if ca_file and Path(ca_file).is_file() else None)
    try:
        with urllib.request.urlopen(urllib.request.Request(full, headers=headers),
                                    timeout=timeout, context=ctx) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        hint = (" (the service account needs list on pods: deploy/rbac.yaml)"
                if e.code in (401, 403) else "")
        raise PagetierError(f"API server {url}: HTTP {e.code} {e.reason}{hint}") from None
    except (urllib.error.URLError, OSError) as e:
        raise PagetierError(f"API server {url}: {getattr(e, 'reason', e)}") from None
    except ValueError:
        raise PagetierError(f"API server {url}: the pod list is not JSON") from None
    if not isinstance(doc, dict) or doc.get("kind") not in (None, "PodList"):
        raise PagetierError(f"API server {url}: expected a PodList, got {str(doc)[:80]!r}")
    return doc


def run(get_pods: Callable[[], dict], sync: Sync, node: str, cgroup_root: str | os.PathLike,
        interval: float, sleep: Callable[[float], None], rounds: int | None = None) -> None:
    """Every ``interval`` seconds: the node's pods, resolved, then one :meth:`Sync.step`.
    A round that fails (API server or daemon unreachable) is logged, once while the same error
    lasts, and the next one tries again; with ``rounds`` (a count), the last round's failure is
    raised."""
    n = 0
    warned: set[str] = set()
    failed = None  # the last round's error: a daemon still starting is said once, not every round
    while rounds is None or n < rounds:
        if n:
            sleep(interval)
        n += 1
        try:
            pods, warnings = resolve(get_pods(), node, cgroup_root)
            for w in warnings:
                if w not in warned:  # a bad annotation stays bad: say it once
                    log.warning("%s", w)
            warned = set(warnings)
            sync.step(pods)
        except PagetierError as e:
            if rounds is not None and n == rounds:
                raise
            if str(e) != failed:
                log.warning("%s (trying again every %g s)", e, interval)
            failed = str(e)
            continue
        if failed is not None:
            log.info("the API server and the daemon answer again")
        failed = None
