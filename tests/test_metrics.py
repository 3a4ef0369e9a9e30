"""The daemon's Prometheus endpoint (daemon/metrics.py, ``--metrics``): the collector's series
from a status document and the kernel's counter files, the option's and the config key's
checks, and Debian's Prometheus server scraping a stub daemon, its series checked against
``pagetier status --json`` at the same interval."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from pagetier.daemon import config as config_mod
from pagetier.daemon.metrics import Collector, Metrics, per_target_bytes
from pagetier.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
PAGETIER = [sys.executable, "-m", "pagetier.cli"]
PROMETHEUS = Path("/usr/bin/prometheus")
MIB = 1 << 20


def samples(collector) -> dict[tuple, float]:
    """(name, sorted label pairs) -> value, from the text format prometheus_client writes."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def status_doc(**over) -> dict:
    doc = {
        "pid": 4242, "started": 1000.0, "updated": 1010.0,
        "config": {"policy": "heuristic", "profiler": "kmod", "fast_node": 0, "slow_node": 1,
                   "interval": 1.0, "dry_run": False},
        "targets": [{"pid": 7, "name": "a", "cgroup": "app.slice", "fast_bytes": 3 * MIB,
                     "slow_bytes": 5 * MIB, "promoted_bytes": 3 * MIB, "demoted_bytes": MIB,
                     "ping_pongs": 2},
                    {"pid": 8, "name": "b", "cgroup": None, "fast_bytes": 0, "slow_bytes": MIB}],
        "cgroup": None,
        "cgroups": [{"path": "app.slice", "fast_budget": 64 * MIB, "pids": [7],
                     "fast_bytes": 3 * MIB, "slow_bytes": 5 * MIB, "fast_unmovable_bytes": 4096}],
        "totals": {"promoted": 100, "demoted": 20, "bytes_moved": 120 * 4096, "ping_pongs": 3,
                   "busy": 4, "failed": 2},
        "move_errors": {"EBUSY": 4, "EACCES": 2},
        "last": {"interval": 9, "resident": {"0": 3 * MIB, "1": 6 * MIB, "unknown": 4096},
                 "fast_used": 3 * MIB, "fast_unmovable": 0, "budget": 64 * MIB,
                 "fast_capacity": None, "limit": "rate", "wall_s": 0.01, "cpu_s": 0.005,
                 "units": 99, "policy": {"hot_set_pages": 1024, "hot_pages": 2048,
                                           "hot_set_fast_pages": 256}},
    }
    doc.update(over)
    return doc


def test_collector_series_from_the_status_document(tmp_path):
    c = Collector(node_root=tmp_path / "none", vmstat=tmp_path / "none", cgroup_root=tmp_path)
    c.set(status_doc(), {7: {"scan_ns": 2_500_000_000, "probe_ns": 500_000_000, "scans": 12}},
          cpu_s=1.5)
    s = samples(c)
    assert s[("pagetier_interval", ())] == 9
    assert s[("pagetier_promoted_bytes_total", ())] == 100 * 4096
    assert s[("pagetier_demoted_bytes_total", ())] == 20 * 4096
    assert s[("pagetier_ping_pongs_total", ())] == 3
    assert s[("pagetier_cpu_seconds_total", ())] == 1.5
    assert s[("pagetier_resident_bytes", (("node", "1"),))] == 6 * MIB
    assert s[("pagetier_resident_bytes", (("node", "-1"),))] == 4096
    fast = ("pagetier_target_resident_bytes",
            (("cgroup", "app.slice"), ("node", "0"), ("pid", "7"), ("tier", "fast")))
    assert s[fast] == 3 * MIB
    assert s[("pagetier_target_resident_bytes",
              (("cgroup", ""), ("node", "1"), ("pid", "8"), ("tier", "slow")))] == MIB
    assert s[("pagetier_cgroup_resident_bytes",
              (("cgroup", "app.slice"), ("node", "1"), ("tier", "slow")))] == 5 * MIB
    assert s[("pagetier_cgroup_fast_budget_bytes", (("cgroup", "app.slice"),))] == 64 * MIB
    assert s[("pagetier_cgroup_fast_unmovable_bytes", (("cgroup", "app.slice"),))] == 4096
    # the binding limit: one of the known ones at 1, the others 0
    lim = {k[1][0][1]: v for k, v in s.items() if k[0] == "pagetier_limit"}
    assert lim["rate"] == 1 and sum(lim.values()) == 1 and {"budget", "node", "none"} <= set(lim)
    assert s[("pagetier_move_errors_pages_total", (("errno", "EBUSY"),))] == 4
    assert s[("pagetier_move_errors_pages_total", (("errno", "EACCES"),))] == 2
    assert s[("pagetier_hot_set_bytes", ())] == 1024 * 4096
    assert s[("pagetier_hot_set_fast_ratio", ())] == 0.25
    a = (("cgroup", "app.slice"), ("pid", "7"))
    assert s[("pagetier_target_promoted_bytes_total", a)] == 3 * MIB
    assert s[("pagetier_target_demoted_bytes_total", a)] == MIB
    assert s[("pagetier_target_ping_pongs_total", a)] == 2
    assert s[("pagetier_profiler_scan_seconds_total", (("pid", "7"),))] == 2.5
    assert s[("pagetier_profiler_probe_seconds_total", (("pid", "7"),))] == 0.5
    assert ("pagetier_fast_capacity_bytes", ()) not in s  # unknown: no series
    info = [k for k in s if k[0] == "pagetier_daemon_info"]
    assert info and ("profiler", "kmod") in info[0][1]


def test_collector_interval_duration(tmp_path):
    c = Collector(node_root=tmp_path / "none", vmstat=tmp_path / "none", cgroup_root=tmp_path)
    doc = status_doc()
    doc["last"] = {**doc["last"], "interval": 9, "t": 10.0}
    c.set(doc)
    assert ("pagetier_interval_duration_seconds", ()) not in samples(c)  # one interval seen
    doc = status_doc()
    doc["last"] = {**doc["last"], "interval": 11, "t": 12.5}  # two intervals in 2.5 s
    c.set(doc)
    assert samples(c)[("pagetier_interval_duration_seconds", ())] == 1.25
    c.set(doc)  # the same interval written again: the same duration
    assert samples(c)[("pagetier_interval_duration_seconds", ())] == 1.25


def test_collector_limit_none_and_before_the_first_interval(tmp_path):
    c = Collector(node_root=tmp_path / "none", vmstat=tmp_path / "none", cgroup_root=tmp_path)
    assert not [k for k in samples(c) if k[0].startswith("pagetier_") and "vmstat" not in k[0]]
    c.set(status_doc(last=None, cgroups=None, move_errors={}))
    s = samples(c)
    assert ("pagetier_interval", ()) not in s and s[("pagetier_targets", ())] == 2
    doc = status_doc()
    doc["last"]["limit"] = None
    c.set(doc)
    lim = {k[1][0][1]: v for k, v in samples(c).items() if k[0] == "pagetier_limit"}
    assert lim["none"] == 1 and sum(lim.values()) == 1


def test_collector_kernel_counters(tmp_path):
    """Per-node vmstat, /proc/vmstat and a cgroup's memory.stat: the promotion, demotion,
    migration and NUMA fields, whichever the kernel has (6.1 lacks some: absent series)."""
    for n, text in ((0, "nr_free_pages 5\npgpromote_success 11\nnuma_hit 7\n"),
                    (1, "pgdemote_kswapd 3\npgdemote_direct 4\n")):
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "vmstat").write_text(text)
    (tmp_path / "vmstat").write_text("pgpromote_success 11\npgmigrate_success 30\nnr_dirty 2\n")
    cg = tmp_path / "cg" / "app.slice"
    cg.mkdir(parents=True)
    (cg / "memory.stat").write_text("anon 4096\npgpromote_success 5\npgdemote_kswapd 1\n")
    c = Collector(node_root=tmp_path, vmstat=tmp_path / "vmstat", cgroup_root=tmp_path / "cg")
    c.set(status_doc())
    s = samples(c)
    assert s[("pagetier_node_vmstat_pgpromote_success_total", (("node", "0"),))] == 11
    assert s[("pagetier_node_vmstat_numa_hit_total", (("node", "0"),))] == 7
    assert s[("pagetier_node_vmstat_pgdemote_direct_total", (("node", "1"),))] == 4
    assert ("pagetier_node_vmstat_pgpromote_success_total", (("node", "1"),)) not in s
    assert s[("pagetier_vmstat_pgmigrate_success_total", ())] == 30
    assert s[("pagetier_cgroup_memory_stat_pgpromote_success_total",
              (("cgroup", "app.slice"),))] == 5
    assert not [k for k in s if "nr_free_pages" in k[0] or "nr_dirty" in k[0] or "anon" in k[0]]


def test_per_target_bytes():
    from pagetier.core.state import PageState
    from pagetier.profiler.stub import StubProfiler

    st = PageState()
    prof = StubProfiler(units=8, hot=2, node=1)
    for pid in (11, 12):
        prof.attach(pid)
        st.update(prof.read(pid))
    tb = per_target_bytes(st, 0, 1)
    assert tb == {11: (0, 8 * 4096), 12: (0, 8 * 4096)}
    idx = [i for i in range(len(st)) if st.pids[st.target[i]] == 12][:3]
    st.set_nodes(np.asarray(idx), 0)
    assert per_target_bytes(st, 0, 1) == {11: (0, 8 * 4096), 12: (3 * 4096, 5 * 4096)}


@pytest.mark.parametrize("value,want", [
    ("9464", ("0.0.0.0", 9464)), (9464, ("0.0.0.0", 9464)), (":9464", ("0.0.0.0", 9464)),
    ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::]:9464", ("::", 9464)),
    ("localhost:9464", ("localhost", 9464)),
])
def test_parse_listen(value, want):
    assert config_mod.parse_listen(value) == want


@pytest.mark.parametrize("value", ["", "x", "9464x", "127.0.0.1:", "1:70000", "a b:1", "-1"])
def test_bad_metrics_is_a_config_error(tmp_path, value):
    p = tmp_path / "c.toml"
    p.write_text(f"metrics = {json.dumps(value)}\n")
    with pytest.raises(ConfigError, match=r"config .*c.toml: metrics must be \"\[ADDR:\]PORT\""):
        config_mod.load(p)
    p.write_text("metrics = true\n")
    with pytest.raises(ConfigError, match="key 'metrics' must be"):
        config_mod.load(p)


def test_config_metrics_key_and_command_line():
    cfg = config_mod.load(REPO / "scripts" / "pagetier.toml", {"metrics": "127.0.0.1:9464"})
    assert cfg.metrics == "127.0.0.1:9464"
    assert config_mod.load(None, {"metrics": "9464"}).metrics == "0.0.0.0:9464"


def cli(tmp_path, *args, timeout=60):
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    return subprocess.run([*PAGETIER, *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def test_cli_metrics_errors_are_one_line(tmp_path):
    r = cli(tmp_path, "run", "--profiler", "stub", "--dry-run", "--metrics", "nine", "--", "true")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "metrics must be \"[ADDR:]PORT\"" in r.stderr and "Traceback" not in r.stderr
    with socket.socket() as s:  # a port in use: an error at the start, nothing run
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        marker = tmp_path / "ran"
        r = cli(tmp_path, "run", "--profiler", "stub", "--dry-run", "--metrics",
                f"127.0.0.1:{port}", "--", "touch", str(marker))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert f"metrics 127.0.0.1:{port}: cannot listen: the port is in use" in r.stderr
    assert not marker.exists()
    r = cli(tmp_path, "run", "--help")
    assert "--metrics" in r.stdout and "all IPv4 addresses" in r.stdout


def test_metrics_server_serves_and_closes():
    m = Metrics("127.0.0.1:0")
    m.start()
    try:
        m.update(status_doc())
        port = int(m.address.rsplit(":", 1)[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert "pagetier_interval 9.0" in text
    finally:
        m.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)


# --------------------------------------------------------------------------- Prometheus
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what: str, fn, timeout: float = 90.0, every: float = 0.25):
    """Poll ``fn`` until it returns a true value (returned), failing with ``what`` after
    ``timeout`` seconds: a bound on a hang, not a timing assertion."""
    end = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > end:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(every)


def get_json(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


@pytest.fixture
def stub_daemon(tmp_path):
    """A daemon with the stub profiler (dry run: the host has one NUMA node) managing a
    sleeping process, serving metrics on a free port; (its status, the run dir env)."""
    target = subprocess.Popen(["sleep", "300"])
    env = {**os.environ, "PAGETIER_RUN_DIR": str(tmp_path / "run")}
    # a long interval: Prometheus scrapes each interval's numbers several times
    d = subprocess.Popen([*PAGETIER, "attach", str(target.pid), "--profiler", "stub", "--dry-run",
                          "--interval", "2", "--policy", "heuristic", "--fast-budget", "1M",
                          "--profiler-option", "units=512", "--profiler-option", "hot=64",
                          "--metrics", "127.0.0.1:0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=REPO)
    try:
        def status():
            r = subprocess.run([*PAGETIER, "status", "--json"], capture_output=True, text=True,
                               env=env, cwd=REPO, timeout=60)
            docs = json.loads(r.stdout or "[]")
            return docs[0] if docs and docs[0].get("last") else None
        yield status, target.pid
    finally:
        d.send_signal(signal.SIGTERM)
        try:
            d.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            d.kill()
            d.wait()
        target.kill()
        target.wait()


@pytest.fixture
def prometheus(tmp_path):
    """Start Debian's prometheus on a free port: a function (scrape target -> base URL)."""
    if not PROMETHEUS.exists():
        pytest.skip("/usr/bin/prometheus is absent (Debian package prometheus)")
    procs = []

    def start(target: str) -> str:
        port = free_port()
        cfg = tmp_path / "prometheus.yml"
        cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                       "scrape_configs:\n  - job_name: pagetier\n    static_configs:\n"
                       f"      - targets: ['{target}']\n")
        log = open(tmp_path / "prometheus.log", "w")
        procs.append(subprocess.Popen(
            [str(PROMETHEUS), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


def test_prometheus_scrapes_the_daemon(stub_daemon, prometheus, tmp_path):
    status, pid = stub_daemon
    first = until("the daemon's first interval", status)
    addr = first["metrics"]
    assert addr.startswith("127.0.0.1:") and not addr.endswith(":0")
    base = prometheus(addr)

    def query(q):
        doc = get_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        if not doc or doc.get("status") != "success":
            return None
        skip = ("__name__", "job", "instance")
        return {(r["metric"]["__name__"],
                 tuple(sorted((k, v) for k, v in r["metric"].items() if k not in skip))):
                float(r["value"][1]) for r in doc["data"]["result"]}

    def ready():
        try:
            with urllib.request.urlopen(f"{base}/-/ready", timeout=10) as r:
                return r.status == 200
        except OSError:
            return False

    until("prometheus to be ready", ready)
    want = '{__name__=~"pagetier_(interval|promoted_bytes_total|resident_bytes|' \
           'target_resident_bytes|fast_budget_bytes|targets)"}'

    def same_interval():
        """Prometheus's latest scrape and the status file at the same interval (the daemon's
        interval is 2 s, the scrape interval 1 s: each interval is scraped about twice)."""
        before = status()
        got = query(want)
        after = status()
        if not got or not before or not after:
            return None
        n = got.get(("pagetier_interval", ()))
        if n is None or before["last"]["interval"] != n or after["last"]["interval"] != n:
            return None
        return got, after

    got, st = until("a scrape of the interval the status file shows", same_interval)
    last, tot = st["last"], st["totals"]
    assert got[("pagetier_targets", ())] == len(st["targets"]) == 1
    assert got[("pagetier_promoted_bytes_total", ())] == tot["promoted"] * 4096
    assert tot["promoted"] > 0  # a dry run counts the planned promotions of the hot units
    assert got[("pagetier_fast_budget_bytes", ())] == last["budget"] == MIB
    for node, b in last["resident"].items():
        assert got[("pagetier_resident_bytes", (("node", node),))] == b
    t = st["targets"][0]
    assert t["pid"] == pid and t["slow_bytes"] == 512 * 4096
    for tier, node in (("fast", "0"), ("slow", "1")):
        # (Prometheus stores no empty label: this target has no cgroup)
        key = ("pagetier_target_resident_bytes",
               (("node", node), ("pid", str(pid)), ("tier", tier)))
        assert got[key] == t[f"{tier}_bytes"]
    # the kernel's own counters come along (on the host, /proc/vmstat's migration counters)
    assert query('{__name__=~"pagetier_vmstat_.*"}')


def test_scrape_sees_the_interval_as_written():
    """The daemon changes its totals in place at the next step; a scrape meanwhile still gives
    the numbers of the interval the status file was written from."""
    m = Metrics("127.0.0.1:0")
    doc = status_doc()
    m.update(doc)
    doc["totals"]["promoted"] += 50
    assert samples(m.collector)[("pagetier_promoted_bytes_total", ())] == 100 * 4096
