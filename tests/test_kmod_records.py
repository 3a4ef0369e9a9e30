"""Decoding pagetier.ko's records into a Sample (no module needed; the guest tests read real
records in tests/guest/test_kmod_freq.py)."""
import numpy as np

from pagetier import uapi
from pagetier.profiler.kmod import records_to_sample


def _records():
    rec = np.zeros(3, uapi.RECORD_T)
    rec["addr"] = [0x200000, 0x400000, 0x401000]
    rec["count"] = [1, 1, 0]
    rec["node"] = [0, uapi.NODE_NONE, 1]
    rec["flags"] = [uapi.REC_PRESENT | uapi.REC_HUGE, uapi.REC_PRESENT, uapi.REC_PRESENT]
    rec["freq"] = [4000, 15, 0]
    return rec


def test_freq_from_a_module_that_fills_it():
    s = records_to_sample(7, _records(), complete=True)
    assert s.freq.dtype == np.float32 and s.freq.tolist() == [4000, 15, 0]
    assert s.rates(1.0).tolist() == [4000, 15, 0]
    assert s.npages.tolist() == [512, 1, 1] and s.node.tolist() == [0, -1, 1]


def test_no_freq_from_an_older_module():
    """A 0.2 module leaves the field 0 (it was padding): rates fall back to counts."""
    s = records_to_sample(7, _records(), complete=True, freq=False)
    assert len(s.freq) == 0
    assert s.rates(2.0).tolist() == [0.5, 0.5, 0.0]
