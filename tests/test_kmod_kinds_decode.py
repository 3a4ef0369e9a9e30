"""Decoding the kinds of memory of pagetier.ko 0.5's records and regions into a Sample (no
module needed; tests/guest/test_kmod_kinds.py reads real ones)."""
import numpy as np

from pagetier import uapi
from pagetier.core.sample import KIND_ANON, KIND_FILE, KIND_NAMES, KIND_SHMEM
from pagetier.profiler.kmod import records_to_sample, regions_to_sample


def test_record_flags_give_kind_and_shared():
    rec = np.zeros(4, uapi.RECORD_T)
    rec["addr"] = [0x1000, 0x2000, 0x3000, 0x4000]
    rec["flags"] = [uapi.REC_PRESENT, uapi.REC_PRESENT | uapi.REC_SHMEM | uapi.REC_SHARED,
                    uapi.REC_PRESENT | uapi.REC_FILE, uapi.REC_PRESENT | uapi.REC_SHARED]
    s = records_to_sample(7, rec, complete=True)
    assert s.kind.dtype == np.uint8
    assert s.kind.tolist() == [KIND_ANON, KIND_SHMEM, KIND_FILE, KIND_ANON]
    assert s.shared.tolist() == [False, True, False, True]
    assert [KIND_NAMES[k] for k in s.kinds()] == ["anon", "shmem", "file", "anon"]


def test_region_flags_give_kind_file_first():
    rec = np.zeros(3, uapi.REGION_T)
    rec["addr"] = [0, uapi.REGION_SIZE, 2 * uapi.REGION_SIZE]
    rec["flags"] = [uapi.REGION_SHMEM, uapi.REGION_SHMEM | uapi.REGION_FILE,
                    uapi.REGION_HUGE | uapi.REGION_SHARED]
    s = regions_to_sample(7, rec, complete=True)
    assert s.kind.tolist() == [KIND_SHMEM, KIND_FILE, KIND_ANON]
    assert s.shared.tolist() == [False, False, True]


def test_an_older_module_gives_no_kinds():
    """Before 0.5 the bits were never set, and the module tracked anonymous memory only (fault
    mode): the kind is unknown, not anonymous by assertion, and kinds() says anon."""
    rec = np.zeros(2, uapi.RECORD_T)
    rec["flags"] = uapi.REC_PRESENT
    s = records_to_sample(7, rec, complete=True, kinds=False)
    assert len(s.kind) == 0 and len(s.shared) == 0
    assert s.kinds().tolist() == [KIND_ANON, KIND_ANON]
