"""The test VM itself: two NUMA nodes, node 1 CPU-less."""
import subprocess

import pytest

pytestmark = pytest.mark.vm


def test_two_nodes_node1_cpuless():
    out = subprocess.run(["numactl", "-H"], capture_output=True, text=True, check=True).stdout
    print(out)
    assert "available: 2 nodes (0-1)" in out
    cpus = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in out.splitlines() if " cpus:" in ln}
    assert cpus["node 0 cpus"] and not cpus["node 1 cpus"]
