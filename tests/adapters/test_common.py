"""Framework-free glue shared by the adapters (roicore.adapters._common)."""
import numpy as np
import pytest


def test_batch_indices_from_counts():
    """The adapters' per-image box counts (Paddle's boxes_num, LoD lengths) to batch
    indices: framework-free, so tested here; the Paddle tests check the messages reach
    the user with the op's name."""
    from roicore.adapters._common import batch_indices_from_counts as counts_to_batch
    for counts, n_boxes, n_images, want in [
        ([2, 0, 1], 3, 3, [0, 0, 2]),
        (np.array([3], np.int32), 3, 1, [0, 0, 0]),
        (np.array([0, 0], np.uint8), 0, 2, []),
        (np.array([1, 2], np.uint64), 3, 2, [0, 1, 1]),
    ]:
        got = counts_to_batch(counts, n_boxes, n_images)
        assert got.dtype == np.int64 and got.tolist() == want
    with pytest.raises(ValueError, match=r"must be non-negative, got \[1, -1\]"):
        counts_to_batch(np.array([1, -1]), 0, 2)
    with pytest.raises(ValueError, match=r"must sum to the number of boxes \(3\), got "
                                         r"sum\(\[1, 1\]\) = 2"):
        counts_to_batch([1, 1], 3, 2)
    # counts whose sum leaves int64 are compared exactly, not after a wrap-around
    big = np.array([2**63, 2**63], np.uint64)
    with pytest.raises(ValueError, match=r"= 18446744073709551616"):
        counts_to_batch(big, 0, 2)
    with pytest.raises(ValueError, match="one count per image"):
        counts_to_batch([1], 1, 2)
    with pytest.raises(TypeError, match="integer dtype"):
        counts_to_batch(np.array([1.0]), 1, 1)
