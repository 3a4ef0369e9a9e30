"""A region unit (2 MiB of separately mapped 4 KiB pages) of a real process moved by the daemon's
executor, page by page, to node 1 and back, in the two-node VM."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pagetier.core import mover
from pagetier.core.sample import Sample
from pagetier.core.state import PageState
from pagetier.daemon.executor import Executor, new_tally

pytestmark = pytest.mark.vm
HUGE, PAGE = 2 << 20, 4096

# 2 MiB of 4 KiB pages (THP off for it), every other page touched, on node 0: its address, then
# it waits for stdin to close
CHILD = textwrap.dedent("""
    import ctypes, mmap, sys
    buf = mmap.mmap(-1, 4 << 20)
    buf.madvise(mmap.MADV_NOHUGEPAGE)
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    off = -start % (2 << 20)
    for p in range(0, 2 << 20, 8192):
        buf[off + p] = 0x5a
    print(start + off, flush=True)
    sys.stdin.read()
    assert all(buf[off + p] == 0x5a for p in range(0, 2 << 20, 8192))
""")


def test_region_unit_of_a_process_moves_to_node_1_and_back():
    """The executor moves a region unit's present pages (half of its 512: the others were never
    touched, -ENOENT, which is no gone unit) to node 1 and back; the state records each move,
    and the process's data survives."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        base = int(child.stdout.readline())
        pages = np.uint64(base) + np.arange(512, dtype=np.uint64) * np.uint64(PAGE)
        assert (mover.query_nodes(child.pid, pages[::2]) == 0).all()
        st = PageState()
        st.begin_interval()
        st.update(Sample(pid=child.pid, addr=np.array([base], np.uint64),
                         count=np.array([256], np.uint32), node=np.array([0], np.int16),
                         npages=np.array([512], np.uint16), region=np.array([True])))
        ex = Executor(st, object(), mover, lambda pid: True)
        for node in (1, 0):
            acc, forget = new_tally(), []
            for _ in range(3):  # a page the kernel finds busy is tried again, as the daemon does
                assert ex.move(np.array([0]), node, acc, forget, set(), 8)
                if st.node[0] == node:
                    break
            assert st.node[0] == node, acc
            assert not sum(len(f) for f in forget) and acc["gone"] == 0
            assert acc["failed"] == 0 and acc["moved_pages"] >= 256
            q = mover.query_nodes(child.pid, pages)
            assert (q[::2] == node).all(), np.unique(q[::2], return_counts=True)
            assert (q[1::2] < 0).all()  # the holes stay holes
    finally:
        child.stdin.close()
        assert child.wait(timeout=60) == 0
