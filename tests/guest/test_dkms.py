"""DKMS, as README.md tells users to install the module: the sources copied to
/usr/src/pagetier-VERSION, `dkms add`, `dkms build`, `dkms install` for the running kernel, then
`pagetier kmod load` with no build in the checkout loads the module DKMS installed.

Inside the test VM /usr and /var are the guest's own overlays (discarded when it stops): nothing
here reaches the host. The test refuses to run where they are not.

Marked long: under emulation on a loaded 2-core host, 6.1 took 366 s for `dkms build` and 533 s
for `dkms install` (its depmod reads every module of the kernel), 1013 s in all; 6.12 1099 s. The default suite builds with DKMS on the host instead
(tests/test_dkms_build.py). Run it with
    scripts/vm --kernel 6.12 -- python -m pytest -p no:cacheprovider -m long tests/guest/test_dkms.py
"""
from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pagetier.profiler import kmod

REPO = Path(__file__).resolve().parents[2]
PAGETIER = [sys.executable, "-m", "pagetier.cli"]


def _version() -> str:
    m = re.search(r'^PACKAGE_VERSION="([^"]+)"', (REPO / "kmod/dkms.conf").read_text(), re.M)
    assert m, "kmod/dkms.conf has no PACKAGE_VERSION"
    return m.group(1)


def _overlay(path: str) -> bool:
    mounts = [ln.split() for ln in Path("/proc/mounts").read_text().splitlines()]
    return any(m[1] == path and m[2] == "overlay" for m in mounts)


def _run(*argv: str, timeout: float = 1800) -> str:
    t0 = time.monotonic()
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    print(f"[{time.monotonic() - t0:6.1f} s] {' '.join(argv[:4])}", flush=True)
    assert r.returncode == 0, f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.long
def test_dkms_install_then_kmod_load():
    if not (_overlay("/usr") and _overlay("/var")):
        pytest.fail("/usr and /var are not the VM's throwaway overlays: refusing to dkms install")
    dkms = shutil.which("dkms")
    assert dkms, "dkms is not installed (scripts/setup.sh installs it)"
    ver, release = _version(), platform.release()
    src = Path(f"/usr/src/pagetier-{ver}")
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(REPO / "kmod", src,
                    ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*.cmd", "Module.symvers",
                                                  "modules.order"))
    hidden = REPO / "build" / "kmod"
    kmod.unload_module()
    mounted = False
    try:
        _run(dkms, "add", f"pagetier/{ver}")
        _run(dkms, "build", f"pagetier/{ver}", "-k", release)
        _run(dkms, "install", f"pagetier/{ver}", "-k", release)
        status = _run(dkms, "status", f"pagetier/{ver}")
        assert f"pagetier/{ver}, {release}" in status and "installed" in status, status
        installed = kmod.installed_path()
        assert installed is not None and "/updates/dkms/" in str(installed), installed
        # what a user without a checkout has: no build/kmod
        subprocess.run(["mount", "-t", "tmpfs", "none", str(hidden)], check=True)
        mounted = True
        assert not kmod.module_path().exists()
        st = json.loads(_run(*PAGETIER, "kmod", "status", "--json"))
        assert st["built"] is None and st["installed"] == str(installed), st
        out = _run(*PAGETIER, "kmod", "load")
        assert f"loaded on {release}" in out, out
        assert kmod.is_loaded()
        # the loaded module is the one DKMS built and installed
        loaded = Path("/sys/module/pagetier/srcversion").read_text().strip()
        assert loaded == _run("modinfo", "-F", "srcversion", str(installed)).strip()
        assert (kmod.SYSFS / "version").read_text().strip() == ver
        dev = kmod.Device()
        try:
            assert dev.version()[:3] == tuple(int(x) for x in ver.split("."))
        finally:
            dev.close()
    finally:
        kmod.unload_module()
        if mounted:
            subprocess.run(["umount", str(hidden)], check=True)
        # left installed (its depmod costs minutes under emulation): /usr and /var are the
        # guest's throwaway overlays, and the tests after this one load the checkout's build
    assert kmod.module_path().exists()
    kmod.load_module()  # the checkout's build again, for the tests after this one
    kmod.unload_module()
