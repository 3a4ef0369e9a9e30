"""The Kubernetes deployment (deploy/) and kube-sync (daemon/kube.py, pagetier kube-sync).

- The manifests validate offline against the Kubernetes 1.30 API schema (kubernetes-validate,
  strict: an unknown field is an error), and hold together: the ports, names, mounts and image
  that one file names are the ones the others name.
- The Prometheus scrape job passes promtool and its relabeling picks the annotated port.
- A pod's annotations resolve to its cgroup under both kubelet cgroup drivers and every QoS class.
- kube-sync against a fake API server (HTTP, in a thread) and a fake control socket sends the
  add_cgroup / remove_cgroup requests a daemon needs as pods come and go.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

import pagetier
from pagetier.cli import main
from pagetier.daemon import config, control, kube
from pagetier.errors import PagetierError

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.30.0"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "prometheus-scrape.yaml")
DAEMONSETS = ("daemonset.yaml", "daemonset-build-module.yaml")
PROMTOOL = Path("/usr/bin/promtool")


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def one(name: str, kind: str) -> dict:
    found = [d for d in docs(name) if d["kind"] == kind]
    assert len(found) == 1, (name, kind)
    return found[0]


def container(ds: dict, name: str) -> dict:
    return next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# ------------------------------------------------------------------------------ manifests
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path):
    found = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert found, f"{path.name} holds no manifest"
    for doc in found:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_the_validator_rejects_a_misspelt_field():
    ds = one("daemonset.yaml", "DaemonSet")
    ds["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="hostPid"):
        kubernetes_validate.validate(ds, K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", DAEMONSETS)
def test_daemonset_has_what_the_daemon_needs(name):
    ds = one(name, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    daemon = container(ds, "daemon")
    caps = set(daemon["securityContext"]["capabilities"]["add"])
    assert {"SYS_ADMIN", "SYS_NICE", "SYS_PTRACE"} <= caps
    host = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m["mountPath"] for m in daemon["volumeMounts"]}
    for path in ("/dev/pagetier", "/sys/fs/cgroup", "/sys/kernel/pagetier",
                 "/sys/devices/system/node", "/run/pagetier"):
        vol = next((n for n, p in host.items() if p == path), None)
        assert vol is not None and mounts.get(vol) == path, f"{name}: host {path} not mounted"
    # the metrics port: the daemon's --metrics, the container port and the scrape annotation
    cmd = daemon["command"]
    port = int(cmd[cmd.index("--metrics") + 1].rpartition(":")[2])
    assert daemon["ports"][0]["containerPort"] == port
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true" and int(ann["prometheus.io/port"]) == port
    # kube-sync: the node's name, the daemon's run dir (control socket) and the cgroup root
    sync = container(ds, "kube-sync")
    assert sync["command"][:2] == ["pagetier", "kube-sync"]
    env = {e["name"]: e for e in sync["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    sync_mounts = {m["name"]: m["mountPath"] for m in sync["volumeMounts"]}
    assert sync_mounts[next(n for n, p in host.items() if p == "/run/pagetier")] == "/run/pagetier"
    assert sync_mounts[next(n for n, p in host.items() if p == "/sys/fs/cgroup")] == "/sys/fs/cgroup"
    # one image, of this version
    images = {c["image"] for c in [*spec["containers"], *spec.get("initContainers", [])]}
    assert images == {f"pagetier:{pagetier.__version__}"}


@pytest.mark.parametrize("name", DAEMONSETS)
def test_daemonset_names_the_rbac_and_config_objects(name):
    ds = one(name, "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    sa = one("rbac.yaml", "ServiceAccount")["metadata"]
    ns = one("rbac.yaml", "Namespace")["metadata"]["name"]
    assert ds["metadata"]["namespace"] == ns == sa["namespace"]
    assert spec["serviceAccountName"] == sa["name"]
    binding = one("rbac.yaml", "ClusterRoleBinding")
    assert {"kind": "ServiceAccount", "name": sa["name"], "namespace": ns} in binding["subjects"]
    role = one("rbac.yaml", "ClusterRole")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert any("pods" in r["resources"] and "list" in r["verbs"] for r in role["rules"])
    cm = one("config.yaml", "ConfigMap")
    vol = next(v for v in spec["volumes"] if "configMap" in v)
    assert vol["configMap"]["name"] == cm["metadata"]["name"]
    mount = next(m for m in container(ds, "daemon")["volumeMounts"] if m["name"] == vol["name"])
    cmd = container(ds, "daemon")["command"]
    key = Path(cmd[cmd.index("--config") + 1])
    assert key.parent == Path(mount["mountPath"]) and key.name in cm["data"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_the_configmap_is_a_valid_daemon_config(tmp_path):
    cm = one("config.yaml", "ConfigMap")
    (tmp_path / "pagetier.toml").write_text(cm["data"]["pagetier.toml"])
    cfg = config.load(tmp_path / "pagetier.toml")
    assert cfg.control_socket == "/run/pagetier/control.sock"


def test_the_build_variant_builds_and_loads_the_module_the_image_carries():
    ds = one("daemonset-build-module.yaml", "DaemonSet")
    spec = ds["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    script = init["command"][-1]
    m = re.search(r"make -C (\S+) KERNEL_DIR=/lib/modules/\$\(uname -r\)/build", script)
    assert m, script
    assert "pagetier kmod load --ko" in script
    assert "SYS_MODULE" in init["securityContext"]["capabilities"]["add"]
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"/tmp/src/kmod {m.group(1)}" in dockerfile  # the image puts kmod/ where it builds
    mounts = {m["mountPath"] for m in init["volumeMounts"]}
    assert {"/lib/modules", "/usr/src"} <= mounts
    # the DKMS variant's device check would stop the pod before the init container loads it
    dev = next(v for v in spec["volumes"] if v.get("hostPath", {}).get("path") == "/dev/pagetier")
    assert dev["hostPath"].get("type", "") == ""


def test_the_init_container_compares_the_version_the_module_reports():
    """build-module skips the build when the loaded module's sysfs version is the one in the
    image's dkms.conf: the two must be written alike ("0.5.0")."""
    ds = one("daemonset-build-module.yaml", "DaemonSet")
    script = ds["spec"]["template"]["spec"]["initContainers"][0]["command"][-1]
    want = next(ln for ln in script.splitlines() if ln.startswith("want="))
    want = want.replace("/opt/pagetier/kmod", str(REPO / "kmod"))
    r = subprocess.run(["sh", "-c", f'{want}; echo "$want"'], capture_output=True, text=True)
    assert r.stdout.strip() == pagetier.__version__
    sh = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
    assert sh.returncode == 0, sh.stderr


def test_the_dockerfile_installs_this_package():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM debian:12", text, re.M)
    assert "pip install" in text and "python3" in text
    # what setup.py's build needs: a C compiler and libnuma for the workloads
    assert "build-essential" in text and "libnuma-dev" in text
    setup = (REPO / "setup.py").read_text()
    assert 'python_requires=">=3.11"' in setup  # Debian 12's python3 is 3.11
    assert f"docker build -f deploy/Dockerfile -t pagetier:{pagetier.__version__} ." in text


# ------------------------------------------------------------------------------ Prometheus
def scrape_job() -> dict:
    doc = yaml.safe_load((DEPLOY / "prometheus-scrape.yaml").read_text())
    (job,) = doc["scrape_configs"]
    return job


def test_the_scrape_job_keeps_the_daemonset_pods_and_their_port():
    job = scrape_job()
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["pagetier"]}}]
    ds = one("daemonset.yaml", "DaemonSet")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    ann = ds["spec"]["template"]["metadata"]["annotations"]
    kept = {}
    for r in job["relabel_configs"]:
        if r.get("action") == "keep":
            (src,) = r["source_labels"]
            kept[src] = r["regex"]
    assert re.fullmatch(kept["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                        labels["app.kubernetes.io/name"])
    assert re.fullmatch(kept["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                        ann["prometheus.io/scrape"])
    # the address rewrite, as Prometheus applies it (an anchored regex over "a;b")
    addr = next(r for r in job["relabel_configs"] if r.get("target_label") == "__address__")
    m = re.fullmatch(addr["regex"], f"10.1.2.3:8080;{ann['prometheus.io/port']}")
    assert m and m.expand(addr["replacement"].replace("$", "\\")) == \
        f"10.1.2.3:{ann['prometheus.io/port']}"


def promtool_check(tmp_path, job: dict) -> subprocess.CompletedProcess:
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}, "scrape_configs": [job]}))
    return subprocess.run([str(PROMTOOL), "check", "config", str(cfg)], capture_output=True,
                          text=True, timeout=60)


@pytest.mark.skipif(not PROMTOOL.exists(), reason="promtool is not installed (Debian: prometheus)")
def test_promtool_accepts_the_scrape_job(tmp_path):
    job = scrape_job()
    r = promtool_check(tmp_path, job)
    if r.returncode and "field kubernetes_sd_configs not found" in r.stdout + r.stderr:
        # Debian's Prometheus is built without Kubernetes discovery: check the rest of the job
        # (its relabeling) with a static target in its place
        del job["kubernetes_sd_configs"]
        job["static_configs"] = [{"targets": ["127.0.0.1:9750"]}]
        r = promtool_check(tmp_path, job)
    assert r.returncode == 0, r.stdout + r.stderr
    # promtool fails a broken job: a relabel regex that does not compile
    job["relabel_configs"][0]["regex"] = "pagetier("
    assert promtool_check(tmp_path, job).returncode != 0


# ------------------------------------------------------------------ annotations -> cgroups
UID = "5f2b6c1e-8d3a-4c7e-9a10-1b2c3d4e5f60"
U_ = UID.replace("-", "_")
EXPECTED = {
    ("systemd", "Guaranteed"): f"kubepods.slice/kubepods-pod{U_}.slice",
    ("systemd", "Burstable"):
        f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice",
    ("systemd", "BestEffort"):
        f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice",
    ("cgroupfs", "Guaranteed"): f"kubepods/pod{UID}",
    ("cgroupfs", "Burstable"): f"kubepods/burstable/pod{UID}",
    ("cgroupfs", "BestEffort"): f"kubepods/besteffort/pod{UID}",
}


def pod(name="app", uid=UID, node="node-1", qos="Burstable", ns="default", phase="Running",
        **annotations) -> dict:
    md = {"name": name, "namespace": ns, "uid": uid}
    if annotations:
        md["annotations"] = annotations
    status = {"phase": phase}
    if qos:
        status["qosClass"] = qos
    return {"metadata": md, "spec": {"nodeName": node}, "status": status}


def budget(value):
    return {"pagetier.io/fast-budget": value}


def make_cgroup(root: Path, rel: str) -> Path:
    d = root / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup.procs").write_text("")
    return d


@pytest.mark.parametrize("driver,qos", sorted(EXPECTED))
def test_pod_resolves_to_its_cgroup_under_each_driver_and_qos(tmp_path, driver, qos):
    make_cgroup(tmp_path, EXPECTED[(driver, qos)])
    pods, warnings = kube.resolve({"items": [pod(qos=qos, **budget("2G"))]}, "node-1", tmp_path)
    assert warnings == []
    assert pods == [kube.Pod("default/app", UID, str(tmp_path / EXPECTED[(driver, qos)]), 2 << 30)]


def test_pod_without_a_qos_class_yet_is_found_in_any_class(tmp_path):
    make_cgroup(tmp_path, EXPECTED[("cgroupfs", "BestEffort")])
    pods, _ = kube.resolve({"items": [pod(qos=None, **budget("1G"))]}, "node-1", tmp_path)
    assert [p.path for p in pods] == [str(tmp_path / EXPECTED[("cgroupfs", "BestEffort")])]


def test_static_pod_is_found_by_its_mirror_hash(tmp_path):
    hash_ = "0a1b2c3d4e5f67890a1b2c3d4e5f6789"
    make_cgroup(tmp_path, f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{hash_}.slice")
    p = pod(**{"kubernetes.io/config.mirror": hash_, "pagetier.io/manage": "true"})
    pods, _ = kube.resolve({"items": [p]}, "node-1", tmp_path)
    assert len(pods) == 1 and pods[0].uid == hash_ and pods[0].fast_budget is None


@pytest.mark.parametrize("annotations,want", [
    (budget("2G"), 2 << 30),
    (budget("512Mi"), 512 << 20),  # a Kubernetes quantity
    (budget(" 1.5G "), 3 << 29),
    ({"pagetier.io/manage": "true"}, None),  # managed, sharing the daemon's budget
    ({"pagetier.io/manage": "True", **budget("64M")}, 64 << 20),
])
def test_annotations_give_the_budget(tmp_path, annotations, want):
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    pods, warnings = kube.resolve({"items": [pod(**annotations)]}, "node-1", tmp_path)
    assert warnings == [] and [p.fast_budget for p in pods] == [want]


@pytest.mark.parametrize("p", [
    pod(),  # no annotation
    pod(**{"pagetier.io/manage": "false", **budget("2G")}),  # turned off
    pod(node="node-2", **budget("2G")),  # another node's pod (its cgroup name exists here)
    pod(phase="Succeeded", **budget("2G")),  # ended
    pod(uid="aaaaaaaa-0000-0000-0000-000000000000", **budget("2G")),  # no cgroup yet
], ids=["plain", "manage-false", "other-node", "succeeded", "starting"])
def test_pods_not_to_manage_are_left_out_quietly(tmp_path, p):
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    assert kube.resolve({"items": [p]}, "node-1", tmp_path) == ([], [])


@pytest.mark.parametrize("annotations,value", [
    (budget("lots"), "lots"),
    (budget("-1G"), "-1G"),
    (budget("0"), "0"),
    (budget("2GB/s"), "2GB/s"),
    ({"pagetier.io/manage": "yes"}, "yes"),
])
def test_bad_annotation_is_a_warning_naming_pod_and_value(tmp_path, annotations, value):
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    other = "0f0f0f0f-1111-2222-3333-444455556666"
    make_cgroup(tmp_path, f"kubepods/burstable/pod{other}")
    items = [pod(name="bad", ns="team-a", **annotations), pod(name="good", uid=other, **budget("1G"))]
    pods, warnings = kube.resolve({"items": items}, "node-1", tmp_path)
    assert [p.name for p in pods] == ["default/good"]
    assert len(warnings) == 1 and "team-a/bad" in warnings[0] and repr(value) in warnings[0]


def test_malformed_pod_list_entries_do_not_crash(tmp_path):
    items = [None, "x", {}, {"metadata": None, "spec": None, "status": None},
             {"metadata": {"annotations": budget("1G")}, "spec": {"nodeName": "node-1"}}]
    pods, warnings = kube.resolve({"items": items}, "node-1", tmp_path)
    assert pods == [] and len(warnings) == 1 and "cannot name a cgroup" in warnings[0]


# ------------------------------------------------------------------------------ Sync
class FakeDaemon:
    """A control socket that records each request and answers ok (status: this daemon's
    pid and start time), or refuses the ops in ``refuse``."""

    def __init__(self, path: Path):
        self.path, self.requests, self.refuse = path, [], set()
        self.ident = {"pid": 4242, "started": 1.0}
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                for line in self.rfile:
                    req = json.loads(line)
                    if req["op"] == "status":
                        reply = {"ok": True, "status": dict(fake.ident)}
                    elif req["op"] in fake.refuse:
                        fake.requests.append(("refused", req))
                        reply = {"ok": False, "error": f"{req['op']}: refused by the test"}
                    else:
                        fake.requests.append(req)
                        reply = {"ok": True, "path": req.get("path")}
                    self.wfile.write((json.dumps(reply) + "\n").encode())

        self.server = socketserver.ThreadingUnixStreamServer(str(path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def ops(self):
        return [(r["op"], Path(r["path"]).name, r.get("fast_budget"))
                for r in self.requests if isinstance(r, dict)]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_daemon():
    d = Path(tempfile.mkdtemp(prefix="pt-kube-", dir="/tmp"))  # short: a socket path's limit
    daemon = FakeDaemon(d / "control.sock")
    yield daemon
    daemon.close()
    shutil.rmtree(d)


def sync_for(daemon: FakeDaemon) -> kube.Sync:
    return kube.Sync(lambda req: control.request(daemon.path, req, timeout=5))


def test_sync_adds_changes_and_removes(tmp_path, fake_daemon):
    a = make_cgroup(tmp_path, "kubepods/burstable/podaaa")
    b = make_cgroup(tmp_path, "kubepods/burstable/podbbb")
    s = sync_for(fake_daemon)
    s.step([kube.Pod("ns/a", "aaa", str(a), 1 << 30), kube.Pod("ns/b", "bbb", str(b), None)])
    s.step([kube.Pod("ns/a", "aaa", str(a), 1 << 30), kube.Pod("ns/b", "bbb", str(b), None)])
    s.step([kube.Pod("ns/a", "aaa", str(a), 2 << 30)])  # a's budget changed, b gone
    assert fake_daemon.ops() == [
        ("add_cgroup", "podaaa", 1 << 30), ("add_cgroup", "podbbb", None),
        ("remove_cgroup", "podbbb", None),
        ("remove_cgroup", "podaaa", None), ("add_cgroup", "podaaa", 2 << 30),
    ]


def test_sync_retries_a_refused_request_and_readds_after_a_daemon_restart(tmp_path, fake_daemon):
    a = make_cgroup(tmp_path, "kubepods/poda")
    pods = [kube.Pod("ns/a", "a", str(a), None)]
    s = sync_for(fake_daemon)
    fake_daemon.refuse = {"add_cgroup"}
    s.step(pods)
    fake_daemon.refuse = set()
    s.step(pods)  # tried again
    s.step(pods)  # nothing to do
    fake_daemon.ident = {"pid": 4343, "started": 2.0}  # a new daemon knows no cgroup
    s.step(pods)
    assert fake_daemon.ops() == [("add_cgroup", "poda", None)] * 2
    assert [r[0] for r in fake_daemon.requests if isinstance(r, tuple)] == ["refused"]


def test_sync_does_not_ask_to_remove_a_cgroup_that_is_gone(tmp_path, fake_daemon):
    a = make_cgroup(tmp_path, "kubepods/poda")
    s = sync_for(fake_daemon)
    s.step([kube.Pod("ns/a", "a", str(a), None)])
    shutil.rmtree(a)  # the pod was deleted: the kubelet removed its cgroup
    s.step([])
    assert fake_daemon.ops() == [("add_cgroup", "poda", None)] and s.managed == {}


# ------------------------------------------------------------------------ kube-sync end to end
class FakeAPIServer:
    """GET /api/v1/pods: the pod list in ``self.pods``; records each request's path and token."""

    def __init__(self):
        self.pods, self.seen = [], []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                fake.seen.append((self.path, self.headers.get("Authorization")))
                body = json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "items": fake.pods}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api():
    server = FakeAPIServer()
    yield server
    server.close()


def test_kube_sync_follows_pods_appearing_and_disappearing(tmp_path, api, fake_daemon):
    uid2 = "11111111-2222-3333-4444-555555555555"
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    make_cgroup(tmp_path, f"kubepods.slice/kubepods-pod{uid2.replace('-', '_')}.slice")
    token = tmp_path / "token"
    token.write_text("sekret\n")
    first = pod(name="web", **budget("2G"))
    second = pod(name="db", uid=uid2, qos="Guaranteed", **{"pagetier.io/manage": "true"})
    # each round's world: the second pod appears, then the first goes away
    worlds = iter([[first, second], [second]])
    api.pods = [first]

    def sleep(_):
        api.pods = next(worlds)

    kube.run(lambda: kube.list_pods(api.url, "node-1", token, None), sync_for(fake_daemon),
             "node-1", tmp_path, 10.0, sleep, rounds=3)
    assert fake_daemon.ops() == [
        ("add_cgroup", f"kubepods-burstable-pod{U_}.slice", 2 << 30),
        ("add_cgroup", f"kubepods-pod{uid2.replace('-', '_')}.slice", None),
        ("remove_cgroup", f"kubepods-burstable-pod{U_}.slice", None),
    ]
    path, auth = api.seen[0]
    assert path == "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1"
    assert auth == "Bearer sekret"


def test_kube_sync_command_once_warns_about_a_bad_annotation(tmp_path, api, fake_daemon, capsys):
    make_cgroup(tmp_path, EXPECTED[("cgroupfs", "BestEffort")])
    api.pods = [pod(qos="BestEffort", **budget("1G")),
                pod(name="oops", ns="team-b", uid="99999999-0000-0000-0000-000000000000",
                    **budget("two gigs"))]
    with pytest.raises(SystemExit) as e:
        main(["kube-sync", "--node", "node-1", "--api-server", api.url,
              "--socket", str(fake_daemon.path), "--cgroup-root", str(tmp_path),
              "--token-file", str(tmp_path / "none"), "--once"])
    assert e.value.code == 0
    err = capsys.readouterr().err
    assert "team-b/oops" in err and "'two gigs'" in err and "Traceback" not in err
    assert fake_daemon.ops() == [("add_cgroup", f"pod{UID}", 1 << 30)]


def test_kube_sync_command_errors_are_one_line(tmp_path, fake_daemon, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cases = [
        (["kube-sync", "--once"], "--node"),
        (["kube-sync", "--node", "n", "--once"], "--api-server"),
        # nothing listens there: the API server cannot be asked
        (["kube-sync", "--node", "n", "--api-server", "http://127.0.0.1:9", "--once",
          "--socket", str(fake_daemon.path)], "API server http://127.0.0.1:9"),
    ]
    for argv, words in cases:
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 1 and words in err, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_kube_sync_without_a_daemon_says_so(tmp_path, api, capsys):
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    api.pods = [pod(**budget("1G"))]
    with pytest.raises(SystemExit) as e:
        main(["kube-sync", "--node", "node-1", "--api-server", api.url, "--once",
              "--socket", str(tmp_path / "no.sock"), "--cgroup-root", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 1 and "no such file (is a pagetier daemon running?)" in err


def test_a_lasting_failure_is_logged_once_and_the_loop_goes_on(tmp_path, fake_daemon, caplog):
    make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    answers = iter([None, None, None, {"items": [pod(**budget("1G"))]}])

    def get_pods():
        doc = next(answers)
        if doc is None:
            raise PagetierError("API server https://10.96.0.1:443: connection refused")
        return doc

    with caplog.at_level("INFO", logger="pagetier.kube"):
        kube.run(get_pods, sync_for(fake_daemon), "node-1", tmp_path, 10.0, lambda _: None,
                 rounds=4)
    assert sum("connection refused" in r.message for r in caplog.records) == 1
    assert fake_daemon.ops() == [("add_cgroup", f"kubepods-burstable-pod{U_}.slice", 1 << 30)]


def test_kube_sync_drives_a_real_daemon(tmp_path, api):
    """kube-sync's requests as the daemon takes them: `pagetier attach --serve` (stub profiler,
    dry run, as the DaemonSet starts it: nothing to manage yet) manages a pod's cgroup with the
    annotated budget, lets it go when the pod is gone, and keeps serving."""
    run = Path(tempfile.mkdtemp(prefix="pt-kd-", dir="/tmp"))  # short: a socket path's limit
    pod_cg = make_cgroup(tmp_path, EXPECTED[("systemd", "Burstable")])
    env = {**os.environ, "PAGETIER_RUN_DIR": str(run)}
    d = subprocess.Popen([sys.executable, "-m", "pagetier.cli", "attach", "--serve",
                          "--profiler", "stub", "--dry-run", "--json", "--interval", "0.5"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=REPO)
    sock = run / "control.sock"

    def cgroups():
        doc = control.request(sock, {"op": "status"}, timeout=10)["status"]
        return {c["path"]: c["fast_budget"] for c in doc["cgroups"]}

    def serving():
        assert d.poll() is None, d.communicate()[1]
        try:
            return cgroups() == {}
        except (OSError, PagetierError):  # not listening yet
            return False

    try:
        deadline = time.monotonic() + 120
        while not serving():  # the daemon starts with no target and waits for requests
            assert time.monotonic() < deadline, "the daemon never answered on its socket"
            time.sleep(0.2)
        api.pods = [pod(**budget("64Mi"))]
        seen = []

        def sleep(_):
            seen.append(cgroups())
            api.pods = []

        sync = kube.Sync(lambda req: control.request(sock, req, timeout=10))
        kube.run(lambda: kube.list_pods(api.url, "node-1"), sync, "node-1", tmp_path, 1.0,
                 sleep, rounds=2)
        assert seen == [{str(pod_cg): 64 << 20}]
        assert cgroups() == {}
        time.sleep(1.5)  # three intervals with nothing to manage
        assert d.poll() is None, "the daemon ended when its last cgroup went"
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            _, err = d.communicate(timeout=20)
        finally:
            if d.poll() is None:
                d.kill()
                d.wait()
            shutil.rmtree(run, ignore_errors=True)
    assert d.returncode == 0, err


def test_api_server_url_from_the_pod_environment(monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert kube.api_server() == "https://[fd00::1]:6443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    assert kube.api_server() == "https://10.96.0.1:443"


def test_docs_name_every_capability_and_mount():
    text = (REPO / "docs" / "deploy.md").read_text()
    for word in ("SYS_ADMIN", "SYS_NICE", "SYS_PTRACE", "privileged", "/dev/pagetier",
                 "/sys/fs/cgroup", "/sys/kernel/pagetier", "/sys/devices/system/node",
                 "/run/pagetier", "numa_balancing", "dkms", "pagetier.io/fast-budget"):
        assert word in text, word
    assert os.path.exists(DEPLOY / "prometheus-scrape.yaml")
