#!/usr/bin/env python3
"""Record pagetier's built-in trace set in the 6.12 test VM and pack it into the package.

Each trace is ``pagetier record`` (kmod backend, abit mode: Accessed bits, every page of the
target scanned every ``--scan-ms``; a unit's count in an interval is the number of scans that
found it accessed) of one real program for ``--seconds``, read every ``--interval-ms``:

- ``hotcold-stable``: the built-in workload, 256 MiB with a fixed 32 MiB hot part;
- ``hotcold-phased``: the same with the hot part moving every 6 s;
- ``churn``: the built-in address-space churn program (map, unmap, mremap, fork);
- ``torch-mlp``: a PyTorch CPU training loop (an MLP over a 48 MiB in-memory data set); its
  recording takes about 12 minutes, most of it importing torch in the emulated guest;
- ``redis``: redis-server under redis-benchmark (SETs that fill ~60 MiB, then GETs);
- ``sqlite``: sqlite3 building an in-memory database of ~30 MiB with an index, then range
  queries on a hot id range and full scans;
- ``zstd``: ``zstd -19 --long=26`` compressing a tar of /usr/lib;
- ``pagerank``: networkx's pure-Python PageRank on a 40k-node Barabasi-Albert graph.

Then (on the host) each raw trace is packed: units coarsened to ``--unit-kb`` (counts summed),
written with zstd into policies/traces/NAME.parquet, and described in policies/traces/index.json.

    python scripts/record_traces.py                     # boot the VM, record all, pack
    python scripts/record_traces.py --only redis,sqlite --seconds 20
    python scripts/record_traces.py --pack-only build/vm/6.12-xxxx/traces   # re-pack raw traces

Inside the guest it is called with ``--in-guest --raw DIR`` and only records.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "policies" / "traces"

TORCH_SCRIPT = r"""
import sys, torch
torch.manual_seed(0); torch.set_num_threads(1)
X = torch.randn(48000, 256); Y = torch.randint(0, 10, (48000,))
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.Adam(model.parameters(), 1e-3)
print("ready", flush=True)
step = 0
while True:
    idx = torch.randint(0, len(X), (128,))
    loss = torch.nn.functional.cross_entropy(model(X[idx]), Y[idx])
    opt.zero_grad(); loss.backward(); opt.step(); step += 1
"""

PAGERANK_SCRIPT = r"""
import networkx as nx
from networkx.algorithms.link_analysis.pagerank_alg import _pagerank_python
G = nx.barabasi_albert_graph(40000, 4, seed=1).to_directed()
print("ready", flush=True)
while True:
    _pagerank_python(G, tol=1e-12, max_iter=30)
"""


def sqlite_script(seed: int = 1, queries: int = 40000) -> str:
    rng = np.random.default_rng(seed)
    rows = 200000
    lines = ["PRAGMA cache_size=-200000;",
             "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, v TEXT);",
             "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM c WHERE i < %d) "
             "INSERT INTO t SELECT i, abs(random()) %% 100000, hex(randomblob(64)) FROM c;" % rows,
             "CREATE INDEX t_k ON t(k);"]
    for q in range(queries):
        if q % 500 == 499:  # now and then a full scan
            lines.append("SELECT count(*) FROM t WHERE v LIKE '%ABCD%';")
        elif q % 3 == 0:  # a lookup through the index
            lines.append("SELECT sum(length(v)) FROM t WHERE k = %d;" % rng.integers(0, 100000))
        else:  # range queries on a hot 10% of the ids
            lo = int(rng.integers(rows // 2, rows // 2 + rows // 10))
            lines.append("SELECT sum(length(v)) FROM t WHERE id BETWEEN %d AND %d;" % (lo, lo + 200))
    return "\n".join(lines) + "\n"


class Run:
    """A program under test: ``pid`` to record, ``procs`` to stop at the end."""

    def __init__(self, pid: int, procs: list, command: str, shows: str, program: str):
        self.pid, self.procs, self.command, self.shows, self.program = pid, procs, command, shows, program

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait_line(proc, word: str, timeout: float = 300) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{proc.args} exited before printing {word!r}")
        if word in line:
            return
    raise RuntimeError(f"{proc.args}: no {word!r} in {timeout} s")


def start_hotcold(phase: int | None) -> Run:
    from pagetier.workload import Workload

    args = ["--size", "256", "--hot", "32", "--hot-offset", "64", "--duration", "0", "--quiet"]
    if phase:
        args += ["--phase", str(phase)]
    w = Workload(*args)
    shows = ("a fixed hot set (32 of 256 MiB)" if not phase else
             f"a 32 MiB hot set moving every {phase} s over 256 MiB")
    return Run(w.pid, [w.proc], "hotcold " + " ".join(args), shows, "pagetier hotcold.c")


def start_churn(seconds: float) -> Run:
    from pagetier.workload import binary

    p = subprocess.Popen([str(binary("churn")), str(int(seconds) + 30)], stdout=subprocess.DEVNULL)
    return Run(p.pid, [p], f"churn {int(seconds) + 30}", "an address space that keeps changing "
               "(mmap/munmap/mremap/madvise/fork)", "pagetier churn.c")


def start_python(name: str, script: str, shows: str, program: str) -> Run:
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        _wait_line(p, "ready", timeout=900)  # importing torch takes minutes in the emulated guest
    except RuntimeError:
        p.kill()
        p.wait()
        raise
    return Run(p.pid, [p], f"python -c <{name} script in scripts/record_traces.py>", shows, program)


def start_redis() -> Run:
    port = "6399"
    srv = subprocess.Popen(["redis-server", "--port", port, "--save", "", "--appendonly", "no",
                            "--daemonize", "no", "--loglevel", "warning"], stdout=subprocess.DEVNULL)
    for _ in range(300):
        r = subprocess.run(["redis-cli", "-p", port, "ping"], capture_output=True, text=True)
        if r.stdout.strip() == "PONG":
            break
        time.sleep(0.2)
    else:
        srv.kill()
        raise RuntimeError("redis-server did not answer")
    bench = ("redis-benchmark -p {p} -q -P 16 -t set -r 100000 -n 200000 -d 512 >/dev/null; "
             "redis-benchmark -p {p} -q -P 16 -t get -r 100000 -n 100000000 -d 512 >/dev/null"
             ).format(p=port)
    drv = subprocess.Popen(["sh", "-c", bench])
    return Run(srv.pid, [drv, srv], f"redis-server under: {bench}",
               "a key-value store filled by SETs (100k keys x 512 B), then uniform GETs",
               "redis-server (Debian)")


def start_sqlite(tmp: str) -> Run:
    path = os.path.join(tmp, "queries.sql")
    with open(path, "w") as f:
        f.write(sqlite_script())
    p = subprocess.Popen(["sqlite3", ":memory:"], stdin=open(path), stdout=subprocess.DEVNULL)
    return Run(p.pid, [p], "sqlite3 :memory: < queries.sql (scripts/record_traces.py sqlite_script)",
               "an in-memory database built (200k rows, ~30 MiB, an index), then index lookups, "
               "range queries on a hot 10% of ids and occasional full scans", "sqlite3 (Debian)")


def start_zstd() -> Run:
    tar = subprocess.Popen(["tar", "cf", "-", "/usr/lib/x86_64-linux-gnu"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    z = subprocess.Popen(["zstd", "-19", "--long=26", "-T1", "-c"], stdin=tar.stdout,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tar.stdout.close()
    return Run(z.pid, [z, tar], "tar cf - /usr/lib/x86_64-linux-gnu | zstd -19 --long=26 -T1 -c",
               "a compressor with a 64 MiB window and large match tables", "zstd (Debian)")


def workloads(seconds: float, tmp: str) -> dict:
    return {
        "hotcold-stable": lambda: start_hotcold(None),
        "hotcold-phased": lambda: start_hotcold(6),
        "churn": lambda: start_churn(seconds),
        "torch-mlp": lambda: start_python("torch", TORCH_SCRIPT, "a PyTorch CPU training loop: "
                                          "MLP (1.3M parameters, Adam) over a 48 MiB data set",
                                          "PyTorch (PyPI)"),
        "redis": start_redis,
        "sqlite": lambda: start_sqlite(tmp),
        "zstd": start_zstd,
        "pagerank": lambda: start_python("pagerank", PAGERANK_SCRIPT, "graph computation: "
                                         "pure-Python PageRank over 40k nodes, 320k edges",
                                         "networkx (PyPI)"),
    }


def _record_one(name, start, raw: Path, seconds, interval_ms, scan_ms):
    """(summary, Run) of one recording; (None, None) when the program would not start."""
    from pagetier.profiler.base import create
    from pagetier.profiler.record import record_trace

    print(f"[record_traces] {name}: starting", flush=True)
    try:
        run = start()
    except (OSError, RuntimeError) as e:
        print(f"[record_traces] {name}: FAILED to start: {e}", flush=True)
        return None, None
    prof = create("kmod", mode="abit", scan_period_ms=scan_ms)
    try:
        s = record_trace(prof, [run.pid], str(raw / f"{name}.parquet"),
                         interval_s=interval_ms / 1000, duration=seconds,
                         meta={"command": run.command, "mode": "abit"})
    finally:
        prof.close()
        run.stop()
    return s, run


def record_all(raw: Path, names: list[str], seconds: float, interval_ms: int, scan_ms: int) -> None:
    """In the guest: record each workload into raw/NAME.parquet and describe it in raw/runs.json."""
    raw.mkdir(parents=True, exist_ok=True)
    print(f"[record_traces] raw traces in {raw}", flush=True)
    tmp = tempfile.mkdtemp()
    table = workloads(seconds, tmp)
    runs = {}
    for name in names:
        for attempt in range(3):
            # the recorder can be starved of CPU in the emulated guest (one read in the whole
            # run was seen): such a recording is done again
            s, run = _record_one(name, table[name], raw, seconds, interval_ms, scan_ms)
            if s is None or s["intervals"] >= min(10, seconds * 500 / interval_ms):
                break
            print(f"[record_traces] {name}: only {s['intervals']} intervals (recorder starved), "
                  "again", flush=True)
        if s is None:
            continue
        runs[name] = {"program": run.program, "command": run.command, "shows": run.shows,
                      "kernel": platform.release(), "backend": "kmod", "mode": "abit",
                      "scan_period_ms": scan_ms, "interval_ms": interval_ms,
                      "intervals": s["intervals"], "raw_rows": s["rows"]}
        print(f"[record_traces] {name}: {s['intervals']} intervals, {s['rows']} rows", flush=True)
        (raw / "runs.json").write_text(json.dumps(runs, indent=1))


def pack(raw: Path, out: Path, unit_kb: int) -> None:
    """Coarsen raw traces to ``unit_kb`` units and write them and index.json into ``out``."""
    from pagetier.policies.simulate import footprint
    from pagetier.profiler.base import PAGE_SIZE, Sample
    from pagetier.profiler.trace import read_trace, write_trace

    runs = json.loads((raw / "runs.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else {}
    unit = unit_kb * 1024
    for name, info in runs.items():
        tr = read_trace(raw / f"{name}.parquet")
        frames = []
        for i, t, samples in tr.intervals():
            for pid, s in samples.items():
                addr = np.asarray(s.addr, np.uint64)
                big = np.asarray(s.npages, np.int64) * PAGE_SIZE >= unit  # huge pages stay as they are
                key = np.where(big, addr, addr - addr % np.uint64(unit))
                uk, inv = np.unique(key, return_inverse=True)
                cnt = np.zeros(len(uk), np.uint64)
                np.add.at(cnt, inv, np.asarray(s.count, np.uint64))
                npg = np.zeros(len(uk), np.int64)
                np.maximum.at(npg, inv, np.where(big, np.asarray(s.npages, np.int64), unit // PAGE_SIZE))
                node = np.full(len(uk), -1, np.int16)
                frames.append((i, t, Sample(pid=pid, addr=uk, count=np.minimum(cnt, 2**32 - 1).astype(np.uint32),
                                            node=node, npages=npg.astype(np.uint16), complete=False)))
        meta = {k: v for k, v in tr.meta.items() if k not in ("processes", "format")}
        meta.update(name=name, unit_kb=unit_kb, complete=False)
        dest = out / f"{name}.parquet"
        write_trace(dest, frames, meta)
        fr = read_trace(dest)
        index[name] = {**info, "unit_kb": unit_kb, "rows": len(fr),
                       "footprint_mib": round(footprint(list(fr.intervals())) * PAGE_SIZE / 2**20, 1),
                       "bytes": dest.stat().st_size}
        print(f"[record_traces] packed {name}: {len(fr)} rows, {dest.stat().st_size / 1024:.0f} KiB, "
              f"footprint {index[name]['footprint_mib']} MiB")
    index_path.write_text(json.dumps(dict(sorted(index.items())), indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", help="comma-separated trace names")
    ap.add_argument("--seconds", type=float, default=24)
    ap.add_argument("--interval-ms", type=int, default=500)
    ap.add_argument("--scan-ms", type=int, default=100)
    ap.add_argument("--unit-kb", type=int, default=16, help="unit size of the packed traces")
    ap.add_argument("--kernel", default="6.12")
    ap.add_argument("--in-guest", action="store_true", help="record only (inside the VM)")
    ap.add_argument("--raw", help="where raw traces go (in the guest) or come from (--pack-only)")
    ap.add_argument("--pack-only", metavar="RAWDIR", help="pack raw traces recorded earlier")
    ap.add_argument("--out", default=str(OUT), help="packed trace directory")
    a = ap.parse_args()
    names = a.only.split(",") if a.only else list(workloads(a.seconds, "/tmp"))
    bad = [n for n in names if n not in workloads(a.seconds, "/tmp")]
    if bad:
        ap.error(f"unknown trace name(s): {', '.join(bad)}")
    if a.in_guest:
        record_all(Path(a.raw), names, a.seconds, a.interval_ms, a.scan_ms)
        return 0
    if a.pack_only:
        pack(Path(a.pack_only), Path(a.out), a.unit_kb)
        return 0
    from pagetier.checkout import test_vm
    from pagetier.workload import binary

    vm = test_vm()
    binary("hotcold"), binary("churn")  # built on the host (scripts/setup.sh), or say how
    cmd = (f"python scripts/record_traces.py --in-guest --raw \"$PAGETIER_VM_OUT/traces\" "
           f"--only {','.join(names)} --seconds {a.seconds} --interval-ms {a.interval_ms} "
           f"--scan-ms {a.scan_ms}")
    res = vm.run(cmd, kernel=a.kernel, fast="2G", slow="2G", timeout=3600, echo=True)
    res.check()
    import re

    m = re.search(r"\[record_traces\] raw traces in (\S+)", res.output)
    raw = Path(m.group(1)) if m else None
    if raw is None or not (raw / "runs.json").exists():
        print("no raw traces found in the VM output", file=sys.stderr)
        return 1
    pack(raw, Path(a.out), a.unit_kb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
