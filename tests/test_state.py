"""PageState: merging samples, and the daemon's own record of units it moved."""
import numpy as np

from pagetier.core.state import PageState
from pagetier.profiler.base import Sample


def sample(addrs, counts, nodes, pid=1, complete=True):
    return Sample(pid=pid, addr=np.array(addrs, np.uint64), count=np.array(counts, np.uint32),
                  node=np.array(nodes, np.int16), npages=np.ones(len(addrs), np.uint16),
                  complete=complete)


def test_merge_into_empty_state_and_forget_unmapped():
    st = PageState()
    st.begin_interval()
    st.update(sample([0x3000, 0x1000], [1, 0], [1, 1]))
    assert list(st.addr) == [0x1000, 0x3000] and st.pages_on(1) == 2
    st.begin_interval()
    st.update(sample([0x1000], [2], [1]))  # 0x3000 unmapped
    assert list(st.addr) == [0x1000] and st.heat[0] == 2


def test_moved_unit_keeps_the_daemons_node_until_the_profiler_catches_up():
    st = PageState()
    st.begin_interval()
    st.update(sample([0x1000, 0x2000], [1, 1], [1, 1]))
    st.record_moves(np.array([0]), 0)  # the daemon moved 0x1000 to node 0
    st.begin_interval()
    st.update(sample([0x1000, 0x2000], [1, 1], [1, 1]), trust_moves=2)  # a scan from before
    assert list(st.node) == [0, 1]
    st.begin_interval()
    st.begin_interval()
    st.update(sample([0x1000, 0x2000], [1, 1], [1, 1]), trust_moves=2)  # a later scan rules
    assert list(st.node) == [1, 1]


def test_heat_is_the_decayed_sum_of_rates():
    """Heat follows the rate signal: the profiler's frequency estimate where it has one (a hot
    unit and one touched now and then differ by orders of magnitude), else counts over the
    time, clipped to the scans that time covers."""
    st = PageState()
    st.begin_interval()
    s = sample([0x1000, 0x2000], [1, 1], [1, 1])
    s.freq = np.array([5000.0, 2.0], np.float32)
    st.update(s, interval_s=0.5)
    assert list(st.rate) == [5000.0, 2.0] and list(st.heat) == [5000.0, 2.0]
    st.begin_interval()
    st.update(s, interval_s=0.5)
    assert list(st.heat) == [7500.0, 3.0]
    # no estimate: count / elapsed; a second scan inside the window is not twice the heat
    st = PageState()
    st.begin_interval()
    st.update(sample([0x1000, 0x2000], [2, 1], [1, 1]), interval_s=0.5, max_count=1)
    assert list(st.rate) == [2.0, 2.0]
    # two reads in one interval (e.g. at layer boundaries) add up to the interval's rate
    st = PageState()
    st.begin_interval()
    st.update(sample([0x1000], [3], [1]), interval_s=1.0, elapsed_s=0.5)
    st.update(sample([0x1000], [1], [1]), interval_s=1.0, elapsed_s=0.5)
    assert st.rate[0] == 4.0 and st.count[0] == 4
