"""The C entry points of torchvision's position-sensitive operators check their own
arguments: a caller that skips the NumPy API's checks gets an exception naming the
problem, never an out-of-bounds access or a silently wrong number.  Called here through
the binding directly; masked boxes (a negative batch index, for bindings that pad
proposals) pool to zero and add nothing."""
from __future__ import annotations

import numpy as np
import pytest

from roicore.core import _binding
from roicore.core.conventions import PSROI_ALIGN, PSROI_POOL

N, C, H, W, P, K = 2, 8, 6, 7, 2, 2   # C = D * P * P with D = 2
OPS = ["ps_roi_align", "psroi_pool_torchvision"]


def _inputs(dtype=np.float32):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    boxes = np.array([[0.5, 1.0, 4.2, 5.1], [1.0, 0.5, 6.0, 3.0]], dtype)
    batch = np.array([0, 1], np.int64)
    return x, boxes, batch


def _forward(op, x, boxes, batch, out, scale=1.0, sampling_ratio=-1, group=None, masked=False,
             rules=None):
    if op == "ps_roi_align":
        return _binding.ps_roi_align_forward(rules or PSROI_ALIGN["torchvision"], x, boxes, batch,
                                             scale, sampling_ratio, out, 1, masked)
    gh, gw = group or out.shape[2:]
    return _binding.ps_roi_pool_forward(rules or PSROI_POOL["torchvision"], x, boxes, batch, scale,
                                       gh, gw, out, 1, masked)


def _backward(op, g, boxes, batch, dx, scale=1.0, sampling_ratio=-1, masked=False):
    if op == "ps_roi_align":
        return _binding.ps_roi_align_backward(PSROI_ALIGN["torchvision"], g, boxes, batch, scale,
                                              sampling_ratio, dx, 1, masked)
    return _binding.ps_roi_pool_backward(PSROI_POOL["torchvision"], g, boxes, batch, scale,
                                        *g.shape[2:], dx, 1, masked)


def _pooled(k=K, dtype=np.float32):
    return np.full((k, C // (P * P), P, P), np.nan, dtype)


@pytest.mark.parametrize("op", OPS)
def test_valid_call_writes_every_output(op):
    x, boxes, batch = _inputs()
    out = _pooled()
    _forward(op, x, boxes, batch, out)
    assert np.isfinite(out).all()
    dx = np.full(x.shape, np.nan, np.float32)
    _backward(op, np.ones_like(out), boxes, batch, dx)
    assert np.isfinite(dx).all() and dx.any()
    _backward(op, out[:0], boxes[:0], batch[:0], dx)   # no boxes: still all of it, zeros
    assert not dx.any()


@pytest.mark.parametrize("op", OPS)
def test_masked_boxes_pool_to_zero_and_add_nothing(op):
    x, boxes, batch = _inputs()
    want = _pooled(1)
    _forward(op, x, boxes[1:], batch[1:], want)
    out = _pooled()
    _forward(op, x, boxes, np.array([-1, 1]), out, masked=True)
    assert not out[0].any() and np.array_equal(out[1:], want)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    want_dx, dx = np.empty_like(x), np.empty_like(x)
    _backward(op, g[1:], boxes[1:], batch[1:], want_dx)
    _backward(op, g, boxes, np.array([-1, 1]), dx, masked=True)
    assert np.array_equal(dx, want_dx)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("index", [2, -1, 2**40])
def test_batch_index_out_of_range(op, direction, index):
    x, boxes, batch = _inputs()
    batch[1] = index
    with pytest.raises(ValueError, match=rf"batch\[1\] = {index} is out of range for a "
                                         r"feature map with N=2 images"):
        if direction == "forward":
            _forward(op, x, boxes, batch, _pooled())
        else:
            _backward(op, np.zeros((K, 2, P, P), np.float32), boxes, batch, np.zeros_like(x))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("value, message", [
    (np.nan, r"boxes coordinates must be finite, got nan in box 1"),
    (np.inf, r"boxes coordinates must be finite, got inf in box 1"),
    (3e7, r"boxes\[1\] coordinate 3e\+07 lies 3e\+07 feature-map pixels from the origin"),
])
def test_coordinates_not_finite_or_too_far(op, value, message):
    x, boxes, batch = _inputs()
    boxes[1, 2] = value
    with pytest.raises(ValueError, match=message):
        _forward(op, x, boxes, batch, _pooled())
    with pytest.raises(ValueError, match=message):
        _backward(op, np.zeros((K, 2, P, P), np.float32), boxes, batch, np.zeros_like(x))


@pytest.mark.parametrize("op", OPS)
def test_shapes_that_do_not_fit(op):
    x, boxes, batch = _inputs()
    with pytest.raises(ValueError, match=r"the feature map must have output_channels \* 2 \* 2 = "
                                         r"12 channels \(output_channels=3, group 2x2\), got C=8"):
        _forward(op, x, boxes, batch, np.zeros((K, 3, P, P), np.float32))
    with pytest.raises(ValueError, match=r"out must have shape \(2, 2, 2, 2\), got \(3, 2, 2, 2\)"):
        _forward(op, x, boxes, batch, np.zeros((3, 2, P, P), np.float32))
    with pytest.raises(ValueError, match=r"got C=9"):
        _backward(op, np.zeros((K, 2, P, P), np.float32), boxes, batch,
                  np.zeros((N, 9, H, W), np.float32))


def test_torchvision_psroi_takes_no_other_group_size():
    x, boxes, batch = _inputs()
    with pytest.raises(ValueError, match=r"torchvision's PS-RoI formula takes the pooled size "
                                         r"2 x 2 as its group size, got 1 x 2"):
        _forward("psroi_pool_torchvision", x, boxes, batch, _pooled(), group=(1, 2))


@pytest.mark.parametrize("op", OPS)
def test_output_overlapping_an_input(op):
    x, boxes, batch = _inputs()
    out = x.reshape(-1)[:K * 2 * P * P].reshape(K, 2, P, P)
    with pytest.raises(ValueError, match=r"out must not share memory with x"):
        _forward(op, x, boxes, batch, out)
    dx = np.zeros(N * C * H * W, np.float32)
    with pytest.raises(ValueError, match=r"grad_input must not share memory with boxes"):
        _backward(op, np.zeros((K, 2, P, P), np.float32), dx[:8].reshape(2, 4), batch,
                  dx.reshape(N, C, H, W))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("scale", [0.0, -1.0, np.nan, np.inf])
def test_spatial_scale(op, scale):
    x, boxes, batch = _inputs()
    with pytest.raises(ValueError, match=r"spatial_scale must be positive and finite"):
        _forward(op, x, boxes, batch, _pooled(), scale=scale)


@pytest.mark.parametrize("op", OPS)
def test_spatial_scale_that_float32_cannot_hold(op):
    x, boxes, batch = _inputs()   # float32 input: torchvision holds the scale as a float32
    with pytest.raises(ValueError, match=r"spatial_scale=1e\+39 becomes inf when held as a float32"):
        _forward(op, x, boxes, batch, _pooled(), scale=1e39)


def test_sampling_grid_limits():
    x, boxes, batch = _inputs()
    out = _pooled()
    with pytest.raises(ValueError, match=r"sampling_ratio must be <= 1024"):
        _forward("ps_roi_align", x, boxes, batch, out, sampling_ratio=1025)
    boxes[0] = [0, 0, 1e6, 1e6]
    with pytest.raises(ValueError, match=r"boxes\[0\] would take 500000 x 500000 samples per bin"):
        _forward("ps_roi_align", x, boxes, batch, out)
    with pytest.raises(ValueError, match=r"boxes\[0\] would take"):
        _backward("ps_roi_align", out, boxes, batch, np.zeros_like(x))
    _forward("ps_roi_align", x, boxes, batch, out, sampling_ratio=2)  # a fixed grid is fine
    assert np.isfinite(out).all()


@pytest.mark.parametrize("op", OPS)
def test_the_binding_checks_the_arrays_it_describes(op):
    """The binding took the box count from ``batch`` and the dtype from the item size: boxes
    with fewer rows than batch indices were read past their end, and an int32 map was read
    as float32."""
    x, boxes, batch = _inputs()
    out = np.zeros((K, C // (P * P), P, P), np.float32)
    bad = [
        (dict(boxes=boxes[:1]), ValueError, r"coords must be \(2, 4\) in the map's dtype, got "
                                            r"float32 of shape \(1, 4\)"),
        (dict(boxes=boxes.astype(np.float64)), ValueError, "coords must be"),
        (dict(batch=batch.astype(np.int32)), TypeError, "batch must be a 1-D int64 array"),
        (dict(x=x.view(np.int32)), TypeError, "x must be a native float32 or float64 array, "
                                              "got int32"),
        (dict(x=x.astype(">f4")), TypeError, "x must be a native float32 or float64"),
        (dict(x=x[0]), ValueError, r"x must be a 4-D array, got shape \(8, 6, 7\)"),
        (dict(out=out.view(np.int32)), TypeError, "out must be a native float32"),
    ]
    for changed, error, message in bad:
        args = dict(x=x, boxes=boxes, batch=batch, out=out)
        args.update(changed)
        with pytest.raises(error, match=message):
            _forward(op, args["x"], args["boxes"], args["batch"], args["out"])


def test_the_binding_checks_argmax_arrays():
    from roicore.core.conventions import MAX_POOL
    x, boxes, batch = _inputs()
    out = np.zeros((K, C, 2, 2), np.float32)
    with pytest.raises(ValueError, match=r"argmax must be int32 or int64 of shape \(2, 8, 2, 2\), "
                                         r"got int32 of shape \(1, 8, 2, 2\)"):
        _binding.roi_pool_max_forward(MAX_POOL["mxnet"], x, boxes, batch, 1.0, out,
                                      np.zeros((1, C, 2, 2), np.int32), 1)
    with pytest.raises(ValueError, match="argmax must be int32 or int64"):
        _binding.roi_pool_max_backward(MAX_POOL["mxnet"], out, np.zeros(out.shape, np.float32),
                                       batch, np.zeros(x.shape, np.float32), 1)
