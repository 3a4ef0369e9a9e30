import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def built():
    """Build what the guest needs on the host (the guest sees the repository read-only): the
    workloads into build/bin, as scripts/setup.sh does, and pagetier.ko for each kernel."""
    from pagetier.checkout import test_vm

    subprocess.run(["make", "-s", "-C", str(REPO / "pagetier/workloads"),
                    f"OUT={REPO / 'build/bin'}"], check=True, capture_output=True, text=True)
    kernels = test_vm().kernels
    for release in kernels().values():
        kd = f"/lib/modules/{release}/build"
        if os.path.isdir(kd):
            subprocess.run(["make", "-s", "-C", str(REPO / "kmod"), f"KERNEL_DIR={kd}"],
                           check=True, capture_output=True, text=True)
