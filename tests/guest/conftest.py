"""Tests in tests/guest/ run inside the two-node test VM (tests/test_vm.py boots it once per
kernel and runs them all); on the host they are skipped."""
import os
import platform

import pytest

from pagetier.checkout import in_guest

from daemon_run import NUMAB, run_env


def pytest_collection_modifyitems(config, items):
    if in_guest():
        # CI boots both kernels and its time is bounded: a test of pagetier's own behaviour
        # (the policy's placement, the CLI), with nothing in it that differs between kernels,
        # runs on one of them; the module, the moves and the kernel's interfaces run on both
        if ".".join(platform.release().split(".")[:2]) != "6.12":
            one = pytest.mark.skip(reason="nothing kernel-specific: runs on 6.12 only, for CI's time")
            for item in items:
                if item.get_closest_marker("one_kernel"):
                    item.add_marker(one)
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
def _no_cached_files():
    """The VM mounts the repository and Python's library with a page cache (scripts/testvm.py):
    its pages would stay on node 0 from one test to the next and lower the free memory the
    daemon and the tests go by. Each test starts without them (the cached names stay)."""
    path = "/proc/sys/vm/drop_caches"
    if in_guest() and os.path.exists(path):
        with open(path, "w") as f:
            f.write("1")
    yield


@pytest.fixture(autouse=True)
def _numa_balancing_off():
    """Placement tests measure pagetier, not the kernel: NUMA balancing off unless a test says."""
    path = "/proc/sys/kernel/numa_balancing"
    if os.path.exists(path) and in_guest():
        with open(path, "w") as f:
            f.write("0")
    yield


# Fixtures shared by the guest test files; a file asks for them by name or with
# ``pytestmark = pytest.mark.usefixtures(...)``. Inside the VM the module must load: a failure to
# load raises in the fixture, an error of every test that uses it, never a skip.

@pytest.fixture(scope="module")
def kmod_loaded():
    """pagetier.ko loaded for the tests of one file (left loaded after them)."""
    from pagetier.profiler import kmod

    kmod.load_module()
    yield


@pytest.fixture(scope="module")
def kmod_fresh():
    """pagetier.ko unloaded and loaded again before the tests of one file, unloaded after them."""
    from pagetier.profiler import kmod

    from helpers import fresh_module

    fresh_module()
    yield
    kmod.unload_module()


@pytest.fixture
def dev():
    """A descriptor on /dev/pagetier, closed after the test (closing detaches its targets)."""
    from pagetier.profiler import kmod

    d = kmod.Device()
    yield d
    d.close()


@pytest.fixture
def env(tmp_path):
    """The environment for a daemon: its status files in the test's own run directory."""
    return run_env(tmp_path)


@pytest.fixture
def numab_on():
    """numa_balancing 1 before the daemon starts, so that 'restored' means something. Only the
    tests of restoring it ask for this: each change between 0 and not 0 patches the kernel's
    code (the sched_numa_balancing static key, in task_numa_fault among others), and with it on
    the kernel marks every process's pages, so hinting faults run through that code as it is
    patched. Under emulation that once left a CPU on a stale int3 there ("Oops: int3" at
    task_numa_fault and the guest's panic, in a clean-clone CI run): most likely the software
    CPU's doing, as the same Oops came once in a boot before anything of ours ran."""
    NUMAB.write_text("1")
    yield
    NUMAB.write_text("0")


@pytest.fixture
def numab_off():
    """numa_balancing 0: the kernel's own balancing must not move the pages a test set up."""
    NUMAB.write_text("0")
