"""DKMS builds pagetier.ko from kmod/ for every installed kernel (on the host, in a private DKMS
tree under a temporary directory: nothing is installed or loaded, and no system directory is
written). tests/guest/test_dkms.py (marked long: the build takes minutes under emulation) goes on
to `dkms install` and `pagetier kmod load` inside the VM.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pagetier import uapi
from pagetier.profiler import kmod

REPO = Path(__file__).resolve().parent.parent
KERNELS = sorted(p.parent.name for p in Path("/lib/modules").glob("*/build") if p.is_dir())


def _modinfo(ko: Path, field: str) -> str:
    return subprocess.run(["modinfo", "-F", field, str(ko)], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.skipif(not KERNELS, reason="no kernel headers in /lib/modules/*/build "
                                        "(scripts/setup.sh installs them)")
def test_dkms_builds_for_every_installed_kernel(tmp_path):
    dkms = shutil.which("dkms") or next((p for p in ("/usr/sbin/dkms", "/sbin/dkms")
                                         if os.access(p, os.X_OK)), None)
    assert dkms, "dkms is not installed (scripts/setup.sh installs it)"
    ver = re.search(r'^PACKAGE_VERSION="([^"]+)"', (REPO / "kmod/dkms.conf").read_text(),
                    re.M).group(1)
    src, tree, inst = tmp_path / "src", tmp_path / "dkms", tmp_path / "install"
    tree.mkdir()
    shutil.copytree(REPO / "kmod", src / f"pagetier-{ver}",
                    ignore=shutil.ignore_patterns("*.o", "*.ko", "*.mod*", ".*.cmd", "Module.symvers",
                                                  "modules.order"))
    trees = ["--sourcetree", str(src), "--dkmstree", str(tree), "--installtree", str(inst)]
    # DKMS signs what it builds: a key of its own here, not the system's /var/lib/dkms/mok.key
    env = {**os.environ, "mok_signing_key": str(tmp_path / "mok.key"),
           "mok_certificate": str(tmp_path / "mok.pub")}

    def run(*args):
        r = subprocess.run([dkms, *args, *trees], capture_output=True, text=True, env=env,
                           timeout=900)
        if r.returncode != 0:
            logs = "".join(f.read_text()[-3000:] for f in tree.glob("pagetier/*/build/make.log"))
            pytest.fail(f"dkms {' '.join(args)}: exit {r.returncode}\n{r.stdout[-2000:]}"
                        f"{r.stderr[-2000:]}\n{logs}")
        return r.stdout

    run("add", f"pagetier/{ver}")
    for release in KERNELS:
        run("build", f"pagetier/{ver}", "-k", release)
        (ko,) = (tree / "pagetier" / ver / release).glob("*/module/pagetier.ko*")
        if ko.suffix == ".ko":
            assert kmod.vermagic(ko).split()[0] == release
        assert _modinfo(ko, "version") == uapi.VERSION
        assert _modinfo(ko, "vermagic").split()[0] == release
    status = run("status", f"pagetier/{ver}")
    for release in KERNELS:
        assert f"pagetier/{ver}, {release}" in status and "built" in status, status
