"""masked=True: a box whose batch index is negative is skipped (output 0, argmax -1, no
gradient), for every operator and direction, exactly as if the row were computed apart and
zeros put in its place; without it, or for indices >= N, the index still raises."""
import numpy as np
import pytest

import roicore.core as rc

RNG = np.random.default_rng(8)
X = RNG.standard_normal((2, 8, 9, 10)).astype(np.float32)
ROIS = np.float32([[0, 1, 1, 7, 8], [-1, -1, -1, -1, -1], [1, 0, 2, 9, 6], [-1, 3, 3, 4, 4]])
KEPT = [0, 2]


def _normalised(boxes):
    """Bilinear pooling's boxes: the coordinates (not a batch column) over 16."""
    out = boxes.copy()
    out[:, -4:] /= 16
    return out


def _forward(op, boxes, **kw):
    if op == "roi_pool":
        return rc.roi_pool(X, boxes, 2, **kw, return_argmax=True)
    if op == "bilinear":
        return (rc.roi_pool(X, _normalised(boxes), 2, method="bilinear", **kw),)
    if op == "psroi_pool":
        return (rc.psroi_pool(X, boxes, 2, **kw),)
    return (rc.roi_align(X, boxes, 2, 1.0, 2, **kw),)


def _backward(op, g, boxes, outputs, **kw):
    if op == "roi_pool":
        return rc.roi_pool_backward(g, boxes, X.shape, argmax=outputs[1], **kw)
    if op == "bilinear":
        return rc.roi_pool_backward(g, _normalised(boxes), X.shape, method="bilinear", **kw)
    if op == "psroi_pool":
        return rc.psroi_pool_backward(g, boxes, X.shape, **kw)
    return rc.roi_align_backward(g, boxes, X.shape, 1.0, 2, **kw)


@pytest.mark.parametrize("op", ["roi_pool", "bilinear", "psroi_pool", "roi_align"])
@pytest.mark.parametrize("as_indices", [False, True])
def test_masked_rows_are_skipped(op, as_indices):
    if as_indices:  # (K, 4) boxes with integer batch indices
        boxes, kw = ROIS[:, 1:], {"batch_indices": ROIS[:, 0].astype(np.int64)}
        kept_kw = {"batch_indices": ROIS[KEPT, 0].astype(np.int64)}
        kept_boxes = ROIS[KEPT, 1:]
    else:
        boxes, kw, kept_boxes, kept_kw = ROIS, {}, ROIS[KEPT], {}
    got = _forward(op, boxes, masked=True, **kw)
    want = _forward(op, kept_boxes, **kept_kw)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[KEPT], w)
        fill = -1 if g.dtype.kind == "i" else 0
        assert (g[[1, 3]] == fill).all()
    grad = RNG.standard_normal(got[0].shape).astype(np.float32)
    np.testing.assert_array_equal(
        _backward(op, grad, boxes, got, masked=True, **kw),
        _backward(op, grad[KEPT], kept_boxes, want, **kept_kw))


@pytest.mark.parametrize("op", ["roi_pool", "bilinear", "psroi_pool", "roi_align"])
def test_without_masked_a_negative_index_raises(op):
    with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[1\] = -1 is out of range .*expected "
                                         r"0 <= index < 2"):
        _forward(op, ROIS)


def test_masked_still_refuses_indices_past_the_batch_and_fractions():
    with pytest.raises(ValueError, match=r"= 2 is out of range .*expected index < 2, or "
                                         r"negative for a masked box"):
        _forward("roi_align", np.float32([[2, 0, 0, 1, 1]]), masked=True)
    with pytest.raises(ValueError, match=r"must be an integer, got -0.5"):
        _forward("roi_align", np.float32([[-0.5, 0, 0, 1, 1]]), masked=True)
    with pytest.raises(TypeError, match="masked must be a bool"):
        _forward("roi_align", ROIS, masked=1)


def test_a_masked_box_is_never_range_checked():
    """Its coordinates are never scaled or sampled: only finiteness is required."""
    boxes = ROIS.copy()
    boxes[1, 1:] = [1e30, -1e30, 1e30, 1e30]
    y = rc.roi_align(X, boxes, 2, 1.0, -1, masked=True)
    assert (y[1] == 0).all()
