"""pagetier.core.arrays: the same results as the numpy expressions they replace."""
import numpy as np
import pytest

from pagetier.core.arrays import unique


@pytest.mark.parametrize("values", [
    [], [7], [3, 3, 3], [5, 1, 5, 2, 1], list(range(100, 0, -1)) * 2,
])
def test_unique_is_numpys(values):
    for dtype in (np.int64, np.uint64, np.int32):
        a = np.array(values, dtype)
        got = unique(a)
        assert got.dtype == a.dtype
        assert np.array_equal(got, np.unique(a))


def test_unique_leaves_its_input_alone():
    a = np.array([4, 1, 4, 0], np.int64)
    unique(a)
    assert a.tolist() == [4, 1, 4, 0]


def test_unique_of_many_random_indices():
    a = np.random.default_rng(1).integers(0, 1 << 20, 200_000)
    assert np.array_equal(unique(a), np.unique(a))
