"""Tests in tests/guest/ run inside the two-node test VM (tests/test_vm.py boots it once per
kernel and runs them all); on the host they are skipped."""
import os
import platform

import pytest

from pagetier.checkout import in_guest


def pytest_collection_modifyitems(config, items):
    if in_guest():
        return
    skip = pytest.mark.skip(reason="runs inside the test VM (see tests/test_vm.py)")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.path).startswith(here + os.sep):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def kernel_series() -> str:
    """'6.1' or '6.12'."""
    return ".".join(platform.release().split(".")[:2])


@pytest.fixture(autouse=True)
def _numa_balancing_off():
    """Placement tests measure pagetier, not the kernel: NUMA balancing off unless a test says."""
    path = "/proc/sys/kernel/numa_balancing"
    if os.path.exists(path) and in_guest():
        with open(path, "w") as f:
            f.write("0")
    yield
