"""Array helpers the core and its readers share."""
from __future__ import annotations

import numpy as np


def unique(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array: ``np.unique(a)``, by sorting.

    numpy 2.3 and later find them with a hash table when no index, inverse or count is asked
    for; numpy 2.4 took 17 ms for 10,000 integers and 380 ms for 100,000 on this project's test
    host, where sorting takes 0.2 ms and 7 ms. The daemon calls this every interval on up to a
    few hundred thousand unit indices.
    """
    a = np.sort(np.asarray(a).ravel())
    if len(a) < 2:
        return a
    keep = np.empty(len(a), bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]
