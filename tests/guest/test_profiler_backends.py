"""Profiler backends in a real kernel: the same workload recorded by kmod (fault, abit), damon and
bpf; each trace's hot set against the truth, printed side by side and held to a floor.

Floors, from what the 6.12 guest measured under QEMU software emulation (issue #8 report):
- kmod, both modes: 0.95 precision and recall, as in test_kmod.
- bpf: counts page faults, here the hinting faults of kmod's fault-mode marks, so it sees what
  the module's marking makes trap; held to 0.90 (measured 0.98 / 1.00 and 0.99 / 1.00).
- damon (6.12; 6.1 has no DAMON sysfs): DAMON clears Accessed bits without a TLB flush
  (docs/kernel-facts.md); under TCG a bit is set again only when a context switch on the
  workload's CPU happens to flush, which with the CPUs shared happens often enough. Measured with
  the CPUs shared: precision 0.98, 0.76, 0.45 and recall 1.00, 1.00, 0.52 (issue #8); precision
  held to 0.30, and the hot range found hotter per page than the rest of the buffer. On a loaded
  host it has also counted nothing at all (0.00 / 0.00, branch tests' 6.12 run): such a run is
  reported XFAIL, never passed.
- damon-alone (workload alone on CPU 1, kdamond and the recorder on CPU 0): it depends on the
  host. On a loaded host it counted nothing (0.00 / 0.00: nothing flushed the workload CPU's
  cached translations); on a quiet one, 1.00 / 1.00 (CI, 2026-11-23). Held to the same rule as
  damon: a run that counts nothing is reported XFAIL, any count is held to the floor.
- Both damon cases: recall under TCG is the host's luck, not DAMON's or our reader's behaviour.
  A loaded host gave damon-alone 1.00 precision with 0.115 recall (942 of 8192 hot pages, all
  of them in the first read; CI of stop 58). So the test holds what does not depend on flushes:
  what DAMON counts lies in the hot range (precision), and recall is printed, not asserted;
  scripts/bench_profilers.py reports both for a quiet host.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from pagetier.errors import Unavailable
from pagetier.profiler import kmod
from pagetier.profiler.trace import read_trace
from pagetier.workload import Workload

from helpers import fresh_module

pytestmark = pytest.mark.vm

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_spec = importlib.util.spec_from_file_location("bench_profilers",
                                               os.path.join(REPO, "scripts", "bench_profilers.py"))
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

DAMON_ADMIN = "/sys/kernel/mm/damon/admin"
# config name -> (precision floor, recall floor)
FLOORS = {
    "kmod-fault": (0.95, 0.95),
    "kmod-abit": (0.95, 0.95),
    "damon": (0.30, None),
    "damon-alone": (0.30, None),
    "bpf+kmod-marks": (0.90, 0.90),
}
CASES = list(FLOORS)


def _no_damon_on_61(kernel_series) -> None:
    """6.1 has no DAMON sysfs interface: skip there; on 6.12 a missing one is a failure."""
    if not os.path.exists(DAMON_ADMIN):
        assert kernel_series == "6.1", f"kernel {kernel_series} has no DAMON sysfs ({DAMON_ADMIN})"
        pytest.skip(f"kernel {kernel_series} has no DAMON sysfs interface (CONFIG_DAMON_SYSFS)")
RESULTS: dict[str, dict] = {}


@pytest.fixture(scope="module", autouse=True)
def module_loaded():
    bench.ensure_tracefs()
    fresh_module()
    yield
    kmod.unload_module()


def _show(request, line: str) -> None:
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(line)
    print(line)


@pytest.mark.parametrize("name", CASES)
def test_backend_finds_hot_set(name, kernel_series, tmp_path, request):
    backend, options = bench.CONFIGS[name]
    if backend == "damon":
        _no_damon_on_61(kernel_series)
    try:
        res = bench.measure(name, backend, options, seconds=6, last=3, outdir=str(tmp_path))
    except Unavailable as e:
        if backend == "bpf":
            pytest.skip(f"bpf backend unavailable here: {e}")
        raise
    RESULTS[name] = res
    per = res["per_interval"]
    hot = np.mean([x["hot_freq"] for x in per]) if per else float("nan")
    cold = np.mean([x["cold_freq"] for x in per]) if per else float("nan")
    _show(request, f"[profilers] {name:<15} precision {res['precision']:.3f} "
                   f"recall {res['recall']:.3f} ({res['pages_counted']} pages counted, "
                   f"{res['hot_pages']} hot, {res['seconds']} s); per page hot {hot:.3f}/s, "
                   f"the rest {cold:.3f}/s")
    assert res["workload_exit"] == 0, "workload memory corrupted"
    tr = read_trace(res["trace"])
    assert tr.meta["backend"] == backend and tr.meta["pids"]
    assert tr.meta["processes"], "maps were not saved"
    # In fault mode under TCG the module's scans starve the recorder: one read in 6 s was
    # seen (with precision and recall 1.00), so only one read is required.
    assert res["intervals"] >= 1, "the recorder read nothing"
    if name.startswith("damon") and res["pages_counted"] == 0:
        # seen on 6.12 under TCG on a loaded host (0 of 8192 hot pages counted, CPUs shared):
        # reported as XFAIL, not passed; whenever DAMON counts anything it is held to the floors
        pytest.xfail("DAMON counted nothing: under TCG no TLB flush set the Accessed bits again")
    pmin, rmin = FLOORS[name]
    assert res["precision"] >= pmin, res
    if rmin is not None:
        assert res["recall"] >= rmin, res
    # what a user looks at in the trace: per page, the hot range hotter than the rest (over the
    # reads after the first; a starved recorder may have made only one)
    if per:
        if name.startswith("damon") and hot == cold == 0:
            # seen on 6.12 under TCG (CI of 2026-11-26): DAMON counted in the first read only,
            # nothing in the reads after it; like a run that counts nothing, an XFAIL
            pytest.xfail("DAMON counted nothing after its first read under TCG")
        assert hot > cold, f"{name}: hot range {hot:.3f}/s per page, the rest {cold:.3f}/s"


def test_side_by_side(request):
    """The benchmark table (scripts/bench_profilers.py prints the same): both kmod modes ran
    (they never skip), and each backend that ran has its row with the precision and recall
    that test_backend_finds_hot_set measured."""
    assert {"kmod-fault", "kmod-abit"} <= set(RESULTS), f"kmod did not run: {sorted(RESULTS)}"
    text = bench.table(list(RESULTS.values()))
    _show(request, "[profilers]\n" + text)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[1:]}
    assert set(rows) == set(RESULTS)
    for name, res in RESULTS.items():
        assert rows[name][1:3] == [f"{res['precision']:.3f}", f"{res['recall']:.3f}"], rows[name]


def test_damon_leaves_no_kdamond_behind(kernel_series):
    _no_damon_on_61(kernel_series)
    from pagetier.profiler.base import create

    nr = "/sys/kernel/mm/damon/admin/kdamonds/nr_kdamonds"
    before = open(nr).read().strip()
    with Workload("--size", "16", "--hot", "4", "--duration", "0", "--quiet") as w:
        prof = create("damon")
        prof.attach(w.pid)
        assert open(nr).read().strip() == str(int(before) + 1)
        assert open(f"/sys/kernel/mm/damon/admin/kdamonds/{prof.index}/state").read().strip() == "on"
        prof.close()
        w.stop()
    assert open(nr).read().strip() == before


def test_record_cli_errors_are_one_line(tmp_path):
    """No such pid and a backend the kernel cannot offer: one line, exit 1, no traceback."""
    exe = [sys.executable, "-m", "pagetier.cli"]
    out = str(tmp_path / "x.parquet")
    r = subprocess.run([*exe, "record", "--pid", "999999", "--duration", "1", "-o", out, "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "no such process 999999" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    if not os.path.exists("/sys/kernel/mm/damon/admin"):
        r = subprocess.run([*exe, "record", "-b", "damon", "--pid", str(os.getpid()), "-o", out],
                           capture_output=True, text=True)
        assert r.returncode == 1 and "no DAMON sysfs" in r.stderr and "Traceback" not in r.stderr


def test_record_cli_command(tmp_path):
    """`pagetier record -- CMD` records a child to its end and keeps its maps and symbols."""
    out = str(tmp_path / "cmd.parquet")
    from pagetier.workload import binary

    r = subprocess.run([sys.executable, "-m", "pagetier.cli", "record", "-O", "mode=abit",
                        "-O", "scan_period_ms=200",
                        "--interval", "500", "--duration", "5", "-o", out, "--", str(binary()),
                        "--size", "32", "--hot", "4", "--duration", "0", "--quiet"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    tr = read_trace(out)
    assert tr.meta["backend"] == "kmod" and len(tr) > 0
    (proc,) = tr.meta["processes"].values()
    assert any("hotcold" in m[3] for m in proc["maps"])
    counted = tr.column("node")[tr.column("count") > 0]
    assert np.all(counted >= 0), "nodes are known for counted pages"


NOISE_PPM = 100
FREQ_FLOOR = 3.0  # hot / cold mean freq per page, for kmod with its own estimate


@pytest.fixture(scope="module")
def thp_workload():
    """One hotcold with THP on and 100 ppm noise, recorded by each backend in turn."""
    thp = "/sys/kernel/mm/transparent_hugepage/enabled"
    if not os.path.exists(thp) or "[never]" in open(thp).read():
        pytest.skip("THP is off in this kernel")
    with Workload(*bench.workload_args(NOISE_PPM, thp=True)) as w:
        yield w
        assert w.stop() == 0, "workload memory corrupted"


@pytest.mark.parametrize("name", ["kmod-fault", "kmod-abit", "damon", "bpf+kmod-marks"])
def test_thp_units_and_freq_scale(name, thp_workload, kernel_series, tmp_path, request):
    backend, options = bench.CONFIGS[name]
    why = bench.available(backend)
    if why:
        pytest.skip(why)
    try:
        res = bench.measure(f"{name}-thp", backend, options, seconds=5, outdir=str(tmp_path),
                            running=thp_workload)
    except Unavailable as e:
        pytest.skip(f"{name} unavailable here: {e}")
    ready = thp_workload.ready
    tr = read_trace(res["trace"])
    # every read, the first too: in fault mode under emulation the module's scans can starve the
    # recorder to one read in the whole run (seen on 6.1 with THP on)
    scored = bench.interval_scores(tr, ready, "freq", res["intervals"], skip=0)
    hot = np.mean([x["hot_freq"] for x in scored]) if scored else 0.0
    cold = np.mean([x["cold_freq"] for x in scored]) if scored else 0.0
    _show(request, f"[profilers] THP, {NOISE_PPM} ppm: {name:<15} hot {hot:9.1f}/s  cold "
                   f"{cold:7.2f}/s  ratio {hot / cold if cold else float('inf'):7.1f}  "
                   f"estimate {'yes' if res['estimated'] else 'no (count/s)'}  per interval "
                   f"P {res['by_freq'].get('p_med', 0):.2f} R {res['by_freq'].get('r_med', 0):.2f}"
                   f"  CPU {res['cpu_pct_per_gib'] or 0:.1f}%/GiB")
    # the same units: the hot range, reported at all, is reported in 2 MiB units, and no 4 KiB
    # row lies inside a block that is also reported whole
    lo, hi = ready["hot_addr"], ready["hot_addr"] + ready["hot_size"]
    addr, npg = tr.column("addr"), tr.column("npages")
    in_hot = (addr >= lo) & (addr < hi)
    if backend == "damon" and not in_hot.any():
        pytest.skip("damon saw none of the hot range: under emulation its Accessed bits are set "
                    "again only when something flushes the TLB")
    assert in_hot.any(), f"{name} reported nothing of the hot range"
    huge_share = float((npg[in_hot] == 512).mean())
    assert huge_share >= 0.9, f"{name}: {huge_share:.0%} of the hot range's rows are 2 MiB units"
    assert np.all(addr[npg == 512] % (2 << 20) == 0)
    blocks = set((addr[npg == 512]).tolist())
    small = addr[npg == 1] & ~np.uint64((2 << 20) - 1)
    assert not blocks & set(small.tolist()), "4 KiB rows inside a block reported as 2 MiB"
    # one scale: accesses per second, the hot range above the rest
    assert res["intervals"] >= 1 and scored, "the recorder read nothing"
    if backend != "damon":  # every scan sees the hot units: at least one count a second
        assert hot >= 1.0, f"{name}: hot units at {hot:.2f}/s: not accesses per second"
    if backend == "damon":
        from pagetier.profiler.damon import poisson_rate

        st = next(iter(res["stats"].values()))
        f, c = tr.column("freq"), tr.column("count")
        assert tr.has_freq and np.all(f <= st["max_rate"] * 1.0001)
        small = npg == 1  # 2 MiB units hold a mean over their pages
        np.testing.assert_allclose(f[small], poisson_rate(c[small], st["sample_us"],
                                                          st["aggr_us"]), rtol=1e-5)
        assert np.all(f[small & (c > 0)]
                      >= poisson_rate([1], st["sample_us"], st["aggr_us"])[0] * 0.999)
    elif res["estimated"] and backend == "kmod":
        assert hot >= FREQ_FLOOR * cold, (hot, cold)
    else:
        assert hot > cold, (hot, cold)
