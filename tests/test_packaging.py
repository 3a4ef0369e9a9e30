"""The package as users install it: sdist and wheel built by the standard build tool, the wheel
installed into a clean virtual environment (no system site-packages, dependencies from the
package index), and its commands run from a directory outside the checkout with a clean
environment. The UAPI header, the built-in traces and the C workloads (sources, and the programs
the build compiled from them) must come with it.

Takes a minute or two (the pip cache makes repeat runs faster). Skipped, with the reason, only
when pip cannot reach a package index and PyPI is unreachable.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEADER = REPO / "kmod/include/uapi/linux/pagetier.h"
TRACE = "redis"


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
        return True
    except OSError:
        return False


def _run_pip_step(argv: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    """A step that may need the package index: fail if it fails with PyPI reachable, skip (with
    pip's last words) if it is not."""
    r = subprocess.run(argv, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-15:])
        if not _pypi_reachable():
            pytest.skip(f"{what} failed and pypi.org:443 is unreachable (no network): {tail}")
        pytest.fail(f"{what} failed ({r.returncode}):\n{tail}")
    return r


def _host_env() -> dict:
    """This process's environment without what would point Python at the checkout or our venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel built by `python -m build` (the wheel from the sdist, so both are checked)."""
    out = tmp_path_factory.mktemp("dist")
    _run_pip_step([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)],
                  "python -m build", env=_host_env(), cwd=out)
    return out


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory):
    """A clean venv with the wheel installed; returns (run, venv, site-packages/pagetier)."""
    root = tmp_path_factory.mktemp("installed")
    venv = root / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    (wheel,) = dist.glob("pagetier-*.whl")
    _run_pip_step([str(venv / "bin/python"), "-m", "pip", "install", "-q", str(wheel)],
                  "pip install of the wheel and its dependencies", env=_host_env(), cwd=root)
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    clean = {"PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
             "LANG": "C.UTF-8", "TMPDIR": str(root), "PYTHONNOUSERSITE": "1"}

    def run(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), capture_output=True, text=True, env=clean, cwd=work,
                              timeout=timeout)

    r = run("python", "-c", "import pagetier, sys; print(pagetier.__file__)")
    assert r.returncode == 0, r.stderr
    pkg = Path(r.stdout.strip()).parent
    assert venv in pkg.parents, f"pagetier imported from {pkg}, not from the venv"
    return run, venv, pkg


def test_wheel_and_sdist_contents(dist):
    (wheel,) = dist.glob("pagetier-*.whl")
    (sdist,) = dist.glob("pagetier-*.tar.gz")
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in ("pagetier/include/linux/pagetier.h", "pagetier/workloads/hotcold.c",
                 "pagetier/workloads/churn.c", "pagetier/workloads/bin/hotcold",
                 "pagetier/workloads/bin/churn", "pagetier/cli/__init__.py", "pagetier/bench/sim.py",
                 "pagetier/policies/traces/index.json", f"pagetier/policies/traces/{TRACE}.parquet",
                 "pagetier/profiler/kmod.py", "pagetier/daemon/__init__.py",
                 "pagetier/core/native/sorted_find.c", "pagetier/core/native/lib/libsorted_find.so"):
        assert need in names, f"{need} is not in {wheel.name}"
    traces = json.loads((REPO / "policies/traces/index.json").read_text())
    for name in traces:
        assert f"pagetier/policies/traces/{name}.parquet" in names, name
    # the packaged header is the module's own
    assert zipfile.ZipFile(wheel).read("pagetier/include/linux/pagetier.h") == HEADER.read_bytes()
    assert not any(n.startswith(("kmod/", "tests/", "build/", "scripts/")) for n in names)
    assert not any(n.endswith("testvm.py") for n in names)  # the VM harness stays in the checkout
    import tarfile

    with tarfile.open(sdist) as t:
        top = t.getnames()[0].split("/")[0]
        members = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    for need in ("setup.py", "kmod/include/uapi/linux/pagetier.h", "kmod/dkms.conf",
                 "pagetier/workloads/hotcold.c", "pagetier/workloads/Makefile",
                 "pagetier/core/native/sorted_find.c", "pagetier/core/native/Makefile",
                 f"policies/traces/{TRACE}.parquet"):
        assert need in members, f"{need} is not in {sdist.name} ({top})"


def test_help_and_version(installed):
    run, _, _ = installed
    r = run("pagetier", "--help")
    assert r.returncode == 0, r.stderr
    for cmd in ("bench", "record", "report", "run", "kmod", "workload"):
        assert f"  {cmd} " in r.stdout, (cmd, r.stdout)
    from pagetier import __version__

    r = run("pagetier", "--version")
    assert r.returncode == 0 and __version__ in r.stdout, (r.stdout, r.stderr)


def test_uapi_from_packaged_header(installed):
    run, _, pkg = installed
    r = run("python", "-c", "from pagetier import uapi; print(uapi.HEADER); print(uapi.IOC_READ)")
    assert r.returncode == 0, r.stderr
    header, ioc_read = r.stdout.split()
    assert Path(header) == pkg / "include/linux/pagetier.h"
    from pagetier import uapi

    assert int(ioc_read) == uapi.IOC_READ


def test_bench_traces_sim_and_report(installed):
    run, _, pkg = installed
    r = run("pagetier", "bench", "traces")
    assert r.returncode == 0, r.stderr
    assert TRACE in r.stdout
    # with the ILP oracle (HiGHS, a dependency), on a small solve budget: stdout is only JSON
    r = run("pagetier", "bench", "sim", f"builtin:{TRACE}", "--json", "--oracle-budget", "5")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["runs"] and {run_["trace"] for run_ in doc["runs"]} == {TRACE}
    assert any(run_["policy"] == "oracle" for run_ in doc["runs"]), doc["runs"]
    r = run("python", "-c", f"from pagetier.policies.builtin_traces import path; print(path({TRACE!r}))")
    assert r.returncode == 0, r.stderr
    trace = Path(r.stdout.strip())
    assert trace.parent == pkg / "policies/traces" and trace.is_file()
    r = run("pagetier", "report", str(trace))
    assert r.returncode == 0, r.stderr
    assert "peak working set" in r.stdout and "hottest regions" in r.stdout, r.stdout
    r = run("pagetier", "report", str(trace), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)
    r = run("python", "-c", "import highspy")  # the oracle's solver comes with the package
    assert r.returncode == 0, r.stderr


def test_workload_built_by_the_build(installed):
    """The wheel carries the workloads compiled by the build: nothing is compiled on first use."""
    run, _, pkg = installed
    exe = pkg / "workloads" / "bin" / "hotcold"
    assert exe.is_file() and os.access(exe, os.X_OK)
    mtime = exe.stat().st_mtime
    r = run("pagetier", "workload", "--size", "8", "--hot", "2", "--duration", "1", "--quiet",
            timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert lines[0]["event"] == "ready" and lines[-1]["event"] == "done"
    assert lines[-1]["pages_corrupt"] == 0
    assert exe.stat().st_mtime == mtime


def test_missing_workload_says_how_to_build_it(installed):
    """An installed package without its workloads (built without them) names what is missing."""
    run, venv, pkg = installed
    r = run("python", "-c", "import pagetier.workload as w; w.PACKAGE_BIN = w.PACKAGE_BIN / 'none'; "
            "w.binary('churn')")
    assert r.returncode != 0
    assert "the workload churn is not built" in r.stderr and "reinstall pagetier" in r.stderr, \
        r.stderr


# --- where the workloads are found (unit tests beside the real ones above) -------------------
def test_workload_bin_dir_of_a_checkout(monkeypatch, tmp_path):
    from pagetier import workload
    from pagetier.errors import Unavailable

    assert workload.bin_dir() == REPO / "build" / "bin"  # a checkout: scripts/setup.sh builds there
    monkeypatch.setattr(workload, "CHECKOUT_BIN", tmp_path)
    with pytest.raises(Unavailable, match=r"not built .*scripts/setup.sh"):
        workload.binary("churn")
    (tmp_path / "churn").write_text("")
    os.utime(tmp_path / "churn", (1, 1))  # older than its source
    with pytest.raises(Unavailable, match=r"older than .*churn.c"):
        workload.binary("churn")
    os.utime(tmp_path / "churn")
    assert workload.binary("churn") == tmp_path / "churn"
    monkeypatch.setattr(workload, "_CHECKOUT", False)
    assert workload.bin_dir() == workload.HERE / "workloads" / "bin"


def test_dkms_conf_version_is_the_uapi_version():
    """DKMS installs from /usr/src/pagetier-VERSION: dkms.conf's version is the package's."""
    import re

    from pagetier import uapi

    conf = (REPO / "kmod/dkms.conf").read_text()
    assert re.search(r'^PACKAGE_VERSION="([^"]+)"', conf, re.M).group(1) == uapi.VERSION
    assert f"/usr/src/pagetier-{uapi.VERSION}" in (REPO / "README.md").read_text()
