"""Argument validation of the NumPy API (roicore.core).

Rejected inputs: every bad argument raises TypeError or ValueError *before* any kernel runs
(the ``no_kernels`` fixture replaces the compiled module inside ``ops`` with a stub that
fails the test if it is reached), and the message names the argument, what was expected
and what came.

Accepted inputs: unusual but legal layouts and values (non-contiguous, read-only,
broadcast, lists, int boxes, float16, K = 0, degenerate boxes) give defined results equal
to the plain contiguous call, and concurrent calls from Python threads match sequential
ones.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import roicore.core as rc
from roicore.core import _kernels, ops
from roicore.core.conventions import (
    BILINEAR_POOL, MAX_POOL, PSROI_POOL, ROI_ALIGN,
)

# ---------------------------------------------------------------------------------------
# shared inputs and a uniform way to call every operator
# ---------------------------------------------------------------------------------------

N, C, H, W = 2, 8, 6, 7
PS = 2                       # pooled size; psroi: C = 8 = D * 2 * 2 -> D = 2
_rng = np.random.default_rng(1234)
X = _rng.standard_normal((N, C, H, W)).astype(np.float32)

# [batch, x1, y1, x2, y2] in pixels, and normalised boxes for bilinear pooling
BOXES = np.array([[0, 0.5, 1.0, 4.2, 5.1],
                  [1, 1.0, 0.5, 6.0, 3.0]], np.float32)
NBOXES = np.array([[0, 0.1, 0.2, 0.8, 0.9],
                   [1, 0.05, 0.3, 0.5, 0.95]], np.float32)

FORWARD = ["roi_pool_max", "roi_pool_bilinear", "psroi_pool", "roi_align"]
BACKWARD = ["roi_pool_backward_max", "roi_pool_backward_bilinear", "psroi_pool_backward",
            "roi_align_backward"]
ALL_OPS = FORWARD + BACKWARD
PSROI_OPS = ["psroi_pool", "psroi_pool_backward"]
ALIGN_OPS = ["roi_align", "roi_align_backward"]
# operators that use the box coordinates (max-pool backward only needs argmax and batch)
COORD_OPS = [op for op in ALL_OPS if op != "roi_pool_backward_max"]

_FN = {
    "roi_pool_max": (rc.roi_pool, {"method": "max"}),
    "roi_pool_bilinear": (rc.roi_pool, {"method": "bilinear"}),
    "psroi_pool": (rc.psroi_pool, {}),
    "roi_align": (rc.roi_align, {}),
    "roi_pool_backward_max": (rc.roi_pool_backward, {"method": "max"}),
    "roi_pool_backward_bilinear": (rc.roi_pool_backward, {"method": "bilinear"}),
    "psroi_pool_backward": (rc.psroi_pool_backward, {}),
    "roi_align_backward": (rc.roi_align_backward, {}),
}

# the conventions table and rules type each operator takes
_RULES = {
    "roi_pool_max": (MAX_POOL, "MaxPoolRules"),
    "roi_pool_backward_max": (MAX_POOL, "MaxPoolRules"),
    "roi_pool_bilinear": (BILINEAR_POOL, "BilinearPoolRules"),
    "roi_pool_backward_bilinear": (BILINEAR_POOL, "BilinearPoolRules"),
    "psroi_pool": (PSROI_POOL, "PSRoIPoolRules"),
    "psroi_pool_backward": (PSROI_POOL, "PSRoIPoolRules"),
    "roi_align": (ROI_ALIGN, "RoIAlignRules"),
    "roi_align_backward": (ROI_ALIGN, "RoIAlignRules"),
}


def default_boxes(op):
    return NBOXES if "bilinear" in op else BOXES


def out_channels(op):
    """Channels of the forward output (psroi: D = C / (PS * PS))."""
    return C // (PS * PS) if op.startswith("psroi") else C


def call(op, *, x=None, boxes=None, output_size=PS, spatial_scale=1.0, grad=None,
         input_shape=None, **kw):
    """Call operator ``op`` with valid defaults, overriding the given arguments.

    Forward operators take ``x`` and ``output_size``; backward operators take ``grad``
    (default: ones of the forward output's shape) and ``input_shape`` (default X.shape).
    roi_pool_backward(method='max') gets an all -1 argmax unless one is passed.
    """
    fn, extra = _FN[op]
    if boxes is None:
        boxes = default_boxes(op)
    kwargs = {**extra, **kw}
    if op in FORWARD:
        return fn(X if x is None else x, boxes, output_size, spatial_scale, **kwargs)
    shape = X.shape if input_shape is None else input_shape
    if grad is None:
        k = np.shape(boxes)[0] if np.ndim(boxes) >= 1 else 1
        grad = np.ones((k, out_channels(op), PS, PS), np.float32)
    if op == "roi_pool_backward_max" and "argmax" not in kwargs:
        kwargs["argmax"] = np.full(np.shape(grad), -1, np.int32)
    return fn(grad, boxes, shape, spatial_scale, **kwargs)


def with_value(a, index, value, dtype=None):
    a = np.array(a, dtype=dtype if dtype is not None else np.asarray(a).dtype)
    a[index] = value
    return a


class _NoKernels:
    """Stands in for roicore.core._kernels inside ops: reaching a compute kernel fails the
    test."""

    def __getattr__(self, name):
        def kernel(*args, **kwargs):
            raise AssertionError(f"kernel {name!r} was reached: the input should have been "
                                 "rejected before any kernel runs")
        return kernel




@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(ops, "_kernels", _NoKernels())


def test_call_helper_is_valid_for_every_op():
    """The defaults used by the rejection tests are themselves accepted."""
    for op in ALL_OPS:
        out = call(op)
        expect = (BOXES.shape[0], out_channels(op), PS, PS) if op in FORWARD else X.shape
        assert out.shape == expect and out.dtype == np.float32, op
        assert np.all(np.isfinite(out)), op


def test_no_kernels_stub_catches_a_kernel_call(no_kernels):
    with pytest.raises(AssertionError, match="was reached"):
        call("roi_align")


# =======================================================================================
# rejected inputs
# =======================================================================================

@pytest.mark.usefixtures("no_kernels")
class TestFeatureMapAndGradient:
    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("shape", [(C, H, W), (1, N, C, H, W), (H * W,), (H, W)])
    def test_x_rank(self, op, shape):
        x = np.zeros(shape, np.float32)
        with pytest.raises(ValueError, match=r"x must be a 4-D \(N, C, H, W\) array, got shape "
                                             + re.escape(str(shape))):
            call(op, x=x)

    @pytest.mark.parametrize("op", FORWARD)
    def test_x_scalar(self, op):
        with pytest.raises(ValueError, match=r"x must be a 4-D .*got shape \(\)"):
            call(op, x=1.0)

    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("shape", [(N, C, 0, W), (N, C, H, 0)])
    def test_x_empty_plane(self, op, shape):
        with pytest.raises(ValueError, match=r"x must have H >= 1 and W >= 1, got shape "
                                             + re.escape(str(shape))):
            call(op, x=np.zeros(shape, np.float32))

    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.complex64,
                                       np.complex128, np.bool_, object, "U1", np.longdouble,
                                       ">f4", ">f8"])
    def test_x_dtype(self, op, dtype):
        if np.dtype(dtype) == np.float64:   # longdouble is float64 on some platforms
            pytest.skip("longdouble is float64 here")
        x = np.full(X.shape, "a") if dtype == "U1" else X.astype(dtype)
        with pytest.raises(TypeError, match=r"x must have dtype float16, float32 or float64, "
                                            r"got " + re.escape(str(x.dtype))):
            call(op, x=x)

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("shape", [(2, C, PS), (2, C, PS, PS, 1), (8,)])
    def test_grad_rank(self, op, shape):
        with pytest.raises(ValueError, match=r"grad_output must be a 4-D \(K, [CD], PH, PW\) "
                                             r"array, got shape " + re.escape(str(shape))):
            call(op, grad=np.ones(shape, np.float32))

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("dtype", [np.int64, np.complex64, np.bool_, object])
    def test_grad_dtype(self, op, dtype):
        g = np.ones((2, out_channels(op), PS, PS), dtype)
        with pytest.raises(TypeError, match=r"grad_output must have dtype float16, float32 "
                                            r"or float64, got " + re.escape(str(g.dtype))):
            call(op, grad=g)

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("pooled", [(0, PS), (PS, 0)])
    def test_grad_empty_pooled_size(self, op, pooled):
        g = np.ones((2, out_channels(op)) + pooled, np.float32)
        with pytest.raises(ValueError, match=r"grad_output must have PH >= 1 and PW >= 1, "
                                             r"got shape " + re.escape(str(g.shape))):
            call(op, grad=g)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_grad_wrong_box_count(self, op):
        c = out_channels(op)
        g = np.ones((3, c, PS, PS), np.float32)
        with pytest.raises(ValueError, match=re.escape(f"grad_output must have shape "
                                                       f"{(2, c, PS, PS)}, got {g.shape}")):
            call(op, grad=g)

    @pytest.mark.parametrize("op", ["roi_pool_backward_max", "roi_pool_backward_bilinear",
                                    "roi_align_backward"])
    def test_grad_wrong_channels(self, op):
        g = np.ones((2, C - 3, PS, PS), np.float32)
        with pytest.raises(ValueError, match=re.escape(f"grad_output must have shape "
                                                       f"{(2, C, PS, PS)}, got {g.shape}")):
            call(op, grad=g)

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("shape, exc, fragment", [
        ((N, C, H), ValueError, r"input_shape must be 4 non-negative ints \(N, C, H, W\), "
                                r"got \(2, 8, 6\)"),
        ((N, C, H, W, 1), ValueError, r"input_shape must be 4 non-negative ints"),
        ((-1, C, H, W), ValueError, r"input_shape must be 4 non-negative ints .*got \(-1, 8"),
        ((N, C, 0, W), ValueError, r"input_shape must have H >= 1 and W >= 1, got \(2, 8, 0, 7\)"),
        ((N, C, H, 7.0), TypeError, r"input_shape must be a sequence of 4 ints \(N, C, H, W\), "
                                    r"got \(2, 8, 6, 7\.0\)"),
        (5, TypeError, r"input_shape must be a sequence of 4 ints .*got 5"),
        ("abcd", TypeError, r"input_shape must be a sequence of 4 ints"),
    ])
    def test_input_shape(self, op, shape, exc, fragment):
        with pytest.raises(exc, match=fragment):
            call(op, input_shape=shape)


@pytest.mark.usefixtures("no_kernels")
class TestBoxes:
    BOX_SHAPE = (r"boxes must have shape \(K, 5\) \[batch, x1, y1, x2, y2\] or \(K, 4\) "
                 r"\[x1, y1, x2, y2\] with batch_indices, got shape ")

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("boxes", [np.zeros((2, 3)), np.zeros((2, 6)), np.zeros(5),
                                       np.zeros((1, 2, 5)), np.float64(0.0)],
                             ids=["K3", "K6", "1d", "3d", "0d"])
    def test_shape(self, op, boxes):
        with pytest.raises(ValueError, match=self.BOX_SHAPE + re.escape(str(boxes.shape))):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("boxes", [
        BOXES.astype(object),
        BOXES.astype(str),
        BOXES.astype(np.complex128),
        BOXES.astype(bool),
        np.array([[0, "a", 1, 2, 3], [0, 1, 1, 2, 3]], dtype=object),
    ], ids=["object", "str", "complex", "bool", "object-str"])
    def test_dtype(self, op, boxes):
        with pytest.raises(TypeError, match=r"boxes must be a real numeric array, got dtype "
                                            + re.escape(str(boxes.dtype))):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
    @pytest.mark.parametrize("column", [1, 2, 3, 4])
    def test_non_finite_coordinates(self, op, value, column):
        boxes = with_value(default_boxes(op), (1, column), value)
        with pytest.raises(ValueError, match=r"boxes coordinates must be finite, got "
                                             + re.escape(str(np.float32(value))) + r" in box 1"):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_non_finite_coordinates_with_batch_indices(self, op):
        boxes = with_value(default_boxes(op)[:, 1:], (0, 2), np.nan)
        with pytest.raises(ValueError, match=r"boxes coordinates must be finite, got nan in box 0"):
            call(op, boxes=boxes, batch_indices=np.array([0, 1]))

    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @pytest.mark.parametrize("op", ALL_OPS)
    def test_coordinates_overflowing_the_compute_dtype(self, op):
        """1e39 is finite in float64 boxes but inf once cast to x's float32."""
        boxes = with_value(default_boxes(op).astype(np.float64), (0, 3), 1e39)
        with pytest.raises(ValueError, match=r"boxes coordinates must be finite"):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", COORD_OPS)
    @pytest.mark.parametrize("value", [1e30, -1e30])
    @pytest.mark.parametrize("column", [1, 4])
    def test_huge_coordinates(self, op, value, column):
        boxes = with_value(default_boxes(op), (1, column), value)
        sign = "-" if value < 0 else ""
        # the coordinate is shown as cast to the compute dtype (float32(1e30) = 1.00000002e30)
        with pytest.raises(ValueError, match=rf"boxes\[1\] coordinate {sign}1(\.0*\d*)?e\+30 lies "
                                             r"[1-6]e\+30 feature-map pixels from the origin; at "
                                             r"most 2\*\*24 is supported"):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ["roi_pool_max", "psroi_pool", "roi_align",
                                    "psroi_pool_backward", "roi_align_backward"])
    def test_coordinates_beyond_range_after_scaling(self, op):
        """1e5 is fine at scale 1 but 1e8 feature pixels at spatial_scale 1000."""
        boxes = with_value(BOXES, (0, 3), 1e5)
        kw = {"sampling_ratio": 2} if op in ALIGN_OPS else {}
        with pytest.raises(ValueError, match=r"boxes\[0\] coordinate 100000\.0 lies 1e\+08 "
                                             r"feature-map pixels"):
            call(op, boxes=boxes, spatial_scale=1000.0, **kw)


@pytest.mark.usefixtures("no_kernels")
class TestScans:
    """The C scans behind the box checks' common case agree with NumPy on every position."""

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    @pytest.mark.parametrize("k", [0, 1, 7])
    def test_box_reach(self, dtype, k):
        coords = np.random.default_rng(k).uniform(-1e6, 1e6, (k, 4)).astype(dtype)
        assert _kernels.box_reach(coords) == (np.abs(coords).max() if k else 0)
        for i in range(coords.size):
            for value in (np.nan, np.inf, -np.inf):
                assert _kernels.box_reach(with_value(coords, np.unravel_index(i, coords.shape),
                                                     value)) == np.inf

    def test_batch_in_range(self):
        assert _kernels.batch_in_range(np.zeros(0, np.int64), 0)
        batch = np.array([0, 2, 1, 2], np.int64)
        assert _kernels.batch_in_range(batch, 3)
        assert not _kernels.batch_in_range(batch, 2)
        for i in range(batch.size):
            for value in (-1, 3, np.iinfo(np.int64).min, np.iinfo(np.int64).max):
                assert not _kernels.batch_in_range(with_value(batch, i, value), 3)


class TestBatch:
    @pytest.mark.parametrize("op", ALL_OPS)
    def test_batch_column_and_batch_indices(self, op):
        with pytest.raises(ValueError, match=r"boxes has a batch column \(shape \(2, 5\)\); "
                                             r"batch_indices must then be None"):
            call(op, batch_indices=np.array([0, 1]))

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_four_columns_without_batch_indices(self, op):
        with pytest.raises(ValueError, match=r"boxes has shape \(2, 4\) \(no batch column\): "
                                             r"pass batch_indices"):
            call(op, boxes=default_boxes(op)[:, 1:])

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("bi", [np.array([0.0, 1.0]), np.array([True, False]),
                                    np.array([0, 1], dtype=object), np.array(["0", "1"])],
                             ids=["float", "bool", "object", "str"])
    def test_batch_indices_dtype(self, op, bi):
        with pytest.raises(TypeError, match=r"batch_indices must have an integer dtype, got "
                                            + re.escape(str(bi.dtype))):
            call(op, boxes=default_boxes(op)[:, 1:], batch_indices=bi)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("bi", [np.array([[0], [1]]), np.array([0, 1, 1]), np.array(0),
                                    np.array([0])], ids=["2d", "K+1", "0d", "K-1"])
    def test_batch_indices_shape(self, op, bi):
        with pytest.raises(ValueError, match=r"batch_indices must have shape \(2,\) to match "
                                             r"boxes, got " + re.escape(str(bi.shape))):
            call(op, boxes=default_boxes(op)[:, 1:], batch_indices=bi)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [2, 3, 100, -1, -7])
    def test_batch_column_out_of_range(self, op, value):
        boxes = with_value(default_boxes(op), (1, 0), value)
        with pytest.raises(ValueError, match=rf"boxes\[:, 0\]\[1\] = {value} is out of range for "
                                             r"a feature map with N=2 images \(expected "
                                             r"0 <= index < 2\)"):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [2, -1])
    @pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int8])
    def test_batch_indices_out_of_range(self, op, value, dtype):
        bi = np.array([0, value], dtype)
        with pytest.raises(ValueError, match=rf"batch_indices\[1\] = {value} is out of range "
                                             r"for a feature map with N=2 images"):
            call(op, boxes=default_boxes(op)[:, 1:], batch_indices=bi)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_batch_out_of_range_of_input_shape(self, op):
        """Backward ops check the batch against input_shape's N."""
        with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[1\] = 1 is out of range for a "
                                             r"feature map with N=1 images"):
            call(op, input_shape=(1, C, H, W))

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [0.5, 1.25, -0.5, 1e-3])
    def test_batch_column_not_integral(self, op, value):
        boxes = with_value(default_boxes(op).astype(np.float64), (1, 0), value)
        with pytest.raises(ValueError, match=r"boxes\[1, 0\] \(batch index\) must be an integer, "
                                             r"got " + re.escape(str(value))):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
    def test_batch_column_not_finite(self, op, value):
        boxes = with_value(default_boxes(op), (1, 0), value)
        with pytest.raises(ValueError, match=r"boxes\[1, 0\] \(batch index\) must be finite, got "
                                             + re.escape(str(np.float32(value)))):
            call(op, boxes=boxes)

    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @pytest.mark.parametrize("op", ["roi_pool_max", "roi_align"])
    def test_huge_batch_column_reports_the_value_given(self, op):
        """1e20 is integral and finite but not an int64: the error must show 1e20, not the
        wrapped-around result of the cast."""
        boxes = with_value(BOXES.astype(np.float64), (1, 0), 1e20)
        with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[1\] = (1e\+20|100000000000000000000)"
                                             r"(\.0)? is out of range"):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ["roi_pool_max", "roi_align"])
    def test_huge_unsigned_batch_index_reports_the_value_given(self, op):
        """2**64 - 1 as uint64 must be reported as such, not as -1 after a cast to int64."""
        bi = np.array([0, 2**64 - 1], np.uint64)
        with pytest.raises(ValueError, match=r"batch_indices\[1\] = 18446744073709551615 is out "
                                             r"of range"):
            call(op, boxes=BOXES[:, 1:], batch_indices=bi)


@pytest.mark.usefixtures("no_kernels")
class TestSizes:
    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("size", [0, -1, -3, (2, 0), (0, 2), (-1, 2), [2, 0]])
    def test_output_size_below_one(self, op, size):
        with pytest.raises(ValueError, match=r"output_size must be >= 1, got "
                                             + re.escape(repr(size))):
            call(op, output_size=size)

    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("size", [2.0, 2.5, True, False, np.bool_(True), "2", None,
                                      (2, 2.0), (True, 2), (2, "2"), np.array([2, 2])],
                             ids=lambda v: repr(v))
    def test_output_size_type(self, op, size):
        with pytest.raises(TypeError, match=r"output_size must be an int or a pair of ints, got"):
            call(op, output_size=size)

    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("size", [(2,), (2, 2, 2), [], [2, 2, 2]])
    def test_output_size_length(self, op, size):
        with pytest.raises(ValueError, match=r"output_size must be an int or a pair \(h, w\), "
                                             r"got " + re.escape(repr(size))):
            call(op, output_size=size)


@pytest.mark.usefixtures("no_kernels")
class TestSpatialScale:
    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("scale", [0, 0.0, -0.0, -1.0, -0.0625, np.nan, np.inf, -np.inf,
                                       np.float32(0)])
    def test_value(self, op, scale):
        with pytest.raises(ValueError, match=r"spatial_scale must be positive and finite, got "
                                             + re.escape(repr(float(scale)))):
            call(op, spatial_scale=scale)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("scale, tname", [("1", "str"), (None, "NoneType"), (True, "bool"),
                                              (np.bool_(True), "bool"), (1j, "complex"),
                                              ([1.0], "list"), (np.array([1.0]), "ndarray")])
    def test_type(self, op, scale, tname):
        with pytest.raises(TypeError, match=rf"spatial_scale must be a real number, got {tname}"):
            call(op, spatial_scale=scale)

    # The ops below hold spatial_scale as a C float (every default convention does), so a
    # float64 scale that is finite and positive can still become inf or 0 in the kernel.
    FLOAT_SCALE_OPS = ["roi_pool_max", "psroi_pool", "roi_align", "psroi_pool_backward",
                       "roi_align_backward"]

    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @pytest.mark.parametrize("op", FLOAT_SCALE_OPS)
    @pytest.mark.parametrize("scale", [1e39])
    @pytest.mark.parametrize("boxes", [BOXES, np.array([[0, 0, 0, 3, 3]], np.float32)],
                             ids=["boxes", "box-with-zero-coordinates"])
    def test_scale_overflowing_float32(self, op, scale, boxes):
        """float32(1e39) is inf: the kernel would get an infinite scale.  With a zero
        coordinate the range check computes 0 * inf = nan and lets the box through."""
        kw = {"grad": np.ones((len(boxes), out_channels(op), PS, PS), np.float32)} \
            if op in BACKWARD else {}
        with pytest.raises(ValueError, match=r"spatial_scale"):
            call(op, boxes=boxes, spatial_scale=scale, **kw)

    @pytest.mark.parametrize("op", FLOAT_SCALE_OPS)
    @pytest.mark.parametrize("scale", [1e-46])
    def test_scale_underflowing_float32(self, op, scale):
        """float32(1e-46) is 0: the kernel would get a zero scale."""
        with pytest.raises(ValueError, match=r"spatial_scale"):
            call(op, spatial_scale=scale)


@pytest.mark.usefixtures("no_kernels")
class TestPSRoI:
    def test_channels_not_output_channels_times_area(self):
        with pytest.raises(ValueError, match=r"x must have output_channels \* 2 \* 2 = 12 channels "
                                             r"\(output_channels=3, group 2x2\), got C=8"):
            call("psroi_pool", output_channels=3)

    def test_channels_not_a_multiple_of_the_area(self):
        with pytest.raises(ValueError, match=r"x has C=8 channels, which is not a multiple of the "
                                             r"group area 3x3=9"):
            call("psroi_pool", output_size=3)

    def test_channels_not_a_multiple_of_the_group_area(self):
        with pytest.raises(ValueError, match=r"not a multiple of the group area 1x3=3"):
            call("psroi_pool", group_size=(1, 3))

    @pytest.mark.parametrize("oc", [0, -1, -2])
    def test_output_channels_below_one(self, oc):
        with pytest.raises(ValueError, match=rf"output_channels must be >= 1, got {oc}"):
            call("psroi_pool", output_channels=oc)

    @pytest.mark.parametrize("oc, tname", [(2.0, "float"), ("2", "str"), (True, "bool"),
                                           (np.bool_(True), "bool"), ([2], "list")])
    def test_output_channels_type(self, oc, tname):
        with pytest.raises(TypeError, match=rf"output_channels must be an int, got {tname}"):
            call("psroi_pool", output_channels=oc)

    def test_output_channels_numpy_int_passes_validation(self):
        # np.int64 passes every check: the stub is reached
        with pytest.raises(AssertionError, match="was reached"):
            call("psroi_pool", output_channels=np.int64(2))

    @pytest.mark.parametrize("op", PSROI_OPS)
    @pytest.mark.parametrize("gs, exc, fragment", [
        (0, ValueError, r"group_size must be >= 1, got 0"),
        (-1, ValueError, r"group_size must be >= 1, got -1"),
        ((2, 0), ValueError, r"group_size must be >= 1, got \(2, 0\)"),
        (2.5, TypeError, r"group_size must be an int or a pair of ints, got 2\.5"),
        (True, TypeError, r"group_size must be an int or a pair of ints, got True"),
        ("2", TypeError, r"group_size must be an int or a pair of ints, got '2'"),
        ((2,), ValueError, r"group_size must be an int or a pair \(h, w\), got \(2,\)"),
        ((2, 2, 2), ValueError, r"group_size must be an int or a pair \(h, w\), got \(2, 2, 2\)"),
    ])
    def test_group_size(self, op, gs, exc, fragment):
        with pytest.raises(exc, match=fragment):
            call(op, group_size=gs)

    def test_backward_grad_channels_not_d(self):
        g = np.ones((2, 3, PS, PS), np.float32)
        with pytest.raises(ValueError, match=r"grad_output must have shape \(2, 2, 2, 2\), "
                                             r"got \(2, 3, 2, 2\)"):
            call("psroi_pool_backward", grad=g)

    def test_backward_channel_error_names_an_argument_of_the_backward(self):
        """psroi_pool_backward has no ``x``: a channel count that does not fit the pooled
        size of grad_output must be blamed on input_shape / grad_output, not on "x"."""
        g = np.ones((2, 1, 3, 3), np.float32)
        with pytest.raises(ValueError, match=r"input_shape|grad_output") as info:
            call("psroi_pool_backward", grad=g)
        assert "C=8" in str(info.value) and "3x3=9" in str(info.value)


@pytest.mark.usefixtures("no_kernels")
class TestRoIAlign:
    @pytest.mark.parametrize("op", ALIGN_OPS)
    @pytest.mark.parametrize("sr", [-2, -3, -100])
    def test_sampling_ratio_below_minus_one(self, op, sr):
        with pytest.raises(ValueError, match=rf"sampling_ratio must be >= -1 \(-1 or 0: adaptive\), "
                                             rf"got {sr}"):
            call(op, sampling_ratio=sr)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    @pytest.mark.parametrize("sr, tname", [(2.0, "float"), ("2", "str"), (True, "bool"),
                                           (np.bool_(False), "bool"), (None, "NoneType")])
    def test_sampling_ratio_type(self, op, sr, tname):
        with pytest.raises(TypeError, match=rf"sampling_ratio must be an int, got {tname}"):
            call(op, sampling_ratio=sr)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    def test_sampling_ratio_too_large(self, op):
        with pytest.raises(ValueError, match=r"sampling_ratio must be <= 1024 \(at most 2\*\*20 samples per bin\), got 70000"):
            call(op, sampling_ratio=70000)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    def test_fixed_sampling_ratio_grid_limited_like_adaptive(self, op):
        """sampling_ratio=65536 means 2**32 samples per bin (4096x the adaptive cap of
        2**20): with output 7x7 that runs for hours, exactly the "hang" the adaptive
        limit exists to prevent.  It must be rejected too."""
        with pytest.raises(ValueError, match=r"sampling_ratio|samples per bin"):
            call(op, sampling_ratio=65536)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    @pytest.mark.parametrize("aligned, tname", [(1, "int"), (0, "int"), ("True", "str"),
                                                (None, "NoneType"), (1.0, "float")])
    def test_aligned_type(self, op, aligned, tname):
        with pytest.raises(TypeError, match=rf"aligned must be a bool, got {tname}"):
            call(op, aligned=aligned)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    @pytest.mark.parametrize("sr", [-1, 0])
    @pytest.mark.parametrize("aligned", [False, True])
    def test_adaptive_grid_of_enormous_box(self, op, sr, aligned):
        boxes = np.array([[0, 0, 0, 1e6, 1e6]], np.float32)
        g = np.ones((1, C, PS, PS), np.float32)
        kw = {"grad": g} if op in BACKWARD else {}
        with pytest.raises(ValueError, match=rf"boxes\[0\] would take 500000 x 500000 samples per "
                                             rf"bin with adaptive sampling \(sampling_ratio={sr}\); "
                                             r"at most 1048576 are supported: pass sampling_ratio > 0"):
            call(op, boxes=boxes, spatial_scale=1.0, sampling_ratio=sr, aligned=aligned, **kw)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    def test_adaptive_grid_uses_the_spatial_scale(self, op):
        """A 2e4-pixel box needs 2e4 samples per axis at scale 1 (4e8 per bin: rejected)
        but 625 at scale 1/32 (390625 <= 2**20: accepted, so the stub is reached)."""
        boxes = np.array([[0, 0, 0, 2e4, 2e4]], np.float32)
        g = np.ones((1, C, 1, 1), np.float32)
        kw = {"grad": g} if op in BACKWARD else {"output_size": 1}
        with pytest.raises(ValueError, match=r"would take 20000 x 20000 samples per bin"):
            call(op, boxes=boxes, spatial_scale=1.0, **kw)
        with pytest.raises(AssertionError, match="was reached"):
            call(op, boxes=boxes, spatial_scale=1 / 32, **kw)


@pytest.mark.usefixtures("no_kernels")
class TestMethodConventionFlags:
    @pytest.mark.parametrize("fn", [rc.roi_pool, rc.roi_pool_backward])
    @pytest.mark.parametrize("method", ["avg", "MAX", "", None, "bilinear "])
    def test_unknown_method(self, fn, method):
        first = X if fn is rc.roi_pool else np.ones((2, C, PS, PS), np.float32)
        third = PS if fn is rc.roi_pool else X.shape
        with pytest.raises(ValueError, match=r"method must be one of \('max', 'bilinear'\), got "
                                             + re.escape(repr(method))):
            fn(first, BOXES, third, method=method)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_unknown_convention(self, op):
        table, _ = _RULES[op]
        names = re.escape(str(sorted(table)))
        with pytest.raises(ValueError, match=rf"convention must be one of {names} for .*, "
                                             r"got 'caffe'"):
            call(op, convention="caffe")

    @pytest.mark.parametrize("op, other", [
        ("roi_pool_max", "tensorflow"), ("roi_pool_bilinear", "mxnet"),
        ("roi_pool_backward_max", "tensorflow"), ("roi_pool_backward_bilinear", "paddle"),
        ("psroi_pool", "torchvision"), ("psroi_pool_backward", "openvino"),
        ("roi_align", "openvino"), ("roi_align_backward", "tensorflow"),
    ])
    def test_convention_of_another_op(self, op, other):
        with pytest.raises(ValueError, match=rf"convention must be one of .*got '{other}'"):
            call(op, convention=other)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("conv, tname", [(3, "int"), (["mxnet"], "list"), (b"mxnet", "bytes")])
    def test_convention_type(self, op, conv, tname):
        _, rules_name = _RULES[op]
        with pytest.raises(TypeError, match=rf"convention must be a framework name \(str\) or a "
                                            rf"{rules_name}, got {tname}"):
            call(op, convention=conv)

    @pytest.mark.parametrize("op", ["psroi_pool", "psroi_pool_backward", "roi_align",
                                    "roi_align_backward"])
    def test_convention_none_where_there_is_no_method_default(self, op):
        _, rules_name = _RULES[op]
        with pytest.raises(TypeError, match=rf"or a {rules_name}, got NoneType"):
            call(op, convention=None)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_rules_object_of_another_op(self, op):
        _, rules_name = _RULES[op]
        for table in (MAX_POOL, BILINEAR_POOL, PSROI_POOL, ROI_ALIGN):
            wrong = next(iter(table.values()))
            if type(wrong).__name__ == rules_name:
                continue
            with pytest.raises(TypeError, match=rf"or a {rules_name}, got {type(wrong).__name__}"):
                call(op, convention=wrong)

    def test_return_argmax_with_bilinear(self):
        with pytest.raises(ValueError, match=r"return_argmax=True needs method='max'"):
            call("roi_pool_bilinear", return_argmax=True)

    @pytest.mark.parametrize("flag, tname", [(1, "int"), ("yes", "str"), (None, "NoneType")])
    def test_return_argmax_type(self, flag, tname):
        with pytest.raises(TypeError, match=rf"return_argmax must be a bool, got {tname}"):
            call("roi_pool_max", return_argmax=flag)

    @pytest.mark.parametrize("value", [None, [0.0], np.array(0.0), np.zeros(2)],
                             ids=["None", "list", "0d", "1d"])
    def test_extrapolation_value_type(self, value):
        with pytest.raises(TypeError, match=r"extrapolation_value must be a real number, got"):
            call("roi_pool_bilinear", extrapolation_value=value)

    @pytest.mark.parametrize("value", ["0.5", "a", 1j, True], ids=["str-num", "str", "complex",
                                                                  "bool"])
    def test_extrapolation_value_scalar_non_real(self, value):
        """np.isscalar accepts strings and complex numbers: "0.5" must not be silently
        converted, and "a" / 1j must give the documented message naming the argument."""
        with pytest.raises(TypeError, match=r"extrapolation_value must be a real number"):
            call("roi_pool_bilinear", extrapolation_value=value)


class TestArgmax:
    """Type, shape and unsigned-width problems are caught before any kernel runs; the
    values themselves are checked by the backward kernel in its one pass over the argmax
    (it follows only valid indices and counts the rest), so those tests run the real
    kernel and expect the same error instead of a gradient."""
    SHAPE = (2, C, PS, PS)

    @pytest.mark.usefixtures("no_kernels")
    def test_missing(self):
        with pytest.raises(TypeError, match=r"roi_pool_backward\(method='max'\) needs the argmax "
                                            r"returned by roi_pool\(\.\.\., return_argmax=True\)"):
            call("roi_pool_backward_max", argmax=None)

    @pytest.mark.usefixtures("no_kernels")
    @pytest.mark.parametrize("shape", [(2, C, PS, PS + 1), (1, C, PS, PS), (2, C, PS * PS),
                                       (2, C - 1, PS, PS), ()])
    def test_shape(self, shape):
        a = np.full(shape, -1, np.int32)
        with pytest.raises(ValueError, match=re.escape(f"argmax must have shape {self.SHAPE}, "
                                                       f"got {a.shape}")):
            call("roi_pool_backward_max", argmax=a)

    @pytest.mark.usefixtures("no_kernels")
    @pytest.mark.parametrize("dtype", [np.float32, np.float64, np.bool_, object, np.complex64])
    def test_dtype(self, dtype):
        a = np.zeros(self.SHAPE, dtype)
        with pytest.raises(TypeError, match=r"argmax must have an integer dtype, got "
                                            + re.escape(str(a.dtype))):
            call("roi_pool_backward_max", argmax=a)

    @pytest.mark.parametrize("n_threads", [1, 2])
    @pytest.mark.parametrize("convention", ["torchvision", "paddle", "openvino", "openvino_cpu"])
    @pytest.mark.parametrize("value", [H * W, H * W + 1, 10**6, 2**40, -2, -100, -2**40])
    def test_plane_values_out_of_range(self, convention, value, n_threads):
        dtype = np.int64 if abs(value) >= 2**31 else np.int32
        a = with_value(np.full(self.SHAPE, 3, dtype), (1, 5, 1, 0), value)
        with pytest.raises(ValueError, match=r"argmax holds indices outside \[-1, 42\) for 'plane' "
                                             r"encoding and input shape \(2, 8, 6, 7\)"):
            call("roi_pool_backward_max", argmax=a, convention=convention, n_threads=n_threads)

    def test_valid_values_pass_the_kernel_check(self):
        """The same call with every value in range returns the scattered gradient."""
        a = np.full(self.SHAPE, 3, np.int32)
        a[1, 5, 1, 0] = H * W - 1
        dx = call("roi_pool_backward_max", argmax=a, convention="torchvision")
        assert dx.shape == X.shape and dx.sum() == np.prod(self.SHAPE), dx.sum()
        # every (box, channel) plane got its gradient at pixel 3, one also at the last pixel
        assert np.count_nonzero(dx) == np.count_nonzero(dx[:, :, 0, 3]) + 1

    def test_global_values_out_of_range(self):
        """MXNet encoding: the flat index into x; box 1 (image 1), channel 5 owns
        [(1*8 + 5)*42, (1*8 + 5)*42 + 42)."""
        base = (1 * C + 5) * H * W
        for value in (base + H * W, base - 2, 0, N * C * H * W, 2**40):
            a = np.full(self.SHAPE, -1, np.int64)
            a[1, 5, 0, 1] = value
            with pytest.raises(ValueError, match=r"argmax holds indices outside \[-1, 42\) for "
                                                 r"'global' encoding"):
                call("roi_pool_backward_max", argmax=a, convention="mxnet")

    def test_global_value_just_before_the_plane(self):
        """The last pixel of the previous plane (base - 1) is not in this box's plane; it
        must not be mistaken for "no selection" (-1) and silently dropped."""
        base = (1 * C + 5) * H * W
        a = np.full(self.SHAPE, -1, np.int64)
        a[1, 5, 0, 1] = base - 1
        with pytest.raises(ValueError, match=r"argmax holds indices outside"):
            call("roi_pool_backward_max", argmax=a, convention="mxnet")

    @pytest.mark.parametrize("value", [-2, -5, -2**40])
    def test_global_negative_values_below_minus_one(self, value):
        """Only -1 means "no selection"; the 'plane' encoding rejects -2, so must 'global'."""
        a = np.full(self.SHAPE, -1, np.int64)
        a[0, 0, 1, 1] = value
        with pytest.raises(ValueError, match=r"argmax holds indices outside"):
            call("roi_pool_backward_max", argmax=a, convention="mxnet")

    @pytest.mark.usefixtures("no_kernels")
    @pytest.mark.parametrize("dtype, value", [(np.uint32, 2**32 - 1), (np.uint64, 2**64 - 1)])
    def test_unsigned_values_that_wrap_to_minus_one(self, dtype, value):
        """An unsigned argmax holding its maximum is not -1: casting it to a signed type
        must not turn it into "no selection"."""
        a = np.zeros(self.SHAPE, dtype)
        a[0, 0, 0, 0] = value
        with pytest.raises(ValueError, match=r"argmax holds indices outside"):
            call("roi_pool_backward_max", argmax=a, convention="torchvision")

    @pytest.mark.usefixtures("no_kernels")
    def test_argmax_with_bilinear_is_rejected(self):
        """roi_pool rejects return_argmax with bilinear; the backward must not silently
        ignore an argmax either (the caller most likely meant method='max')."""
        with pytest.raises((ValueError, TypeError), match=r"argmax"):
            call("roi_pool_backward_bilinear", argmax=np.zeros(self.SHAPE, np.int32))


@pytest.mark.usefixtures("no_kernels")
class TestNThreads:
    @pytest.mark.parametrize("op", ALL_OPS)
    def test_zero(self, op):
        with pytest.raises(ValueError, match=r"n_threads = 0 is invalid"):
            call(op, n_threads=0)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("n, tname", [("2", "str"), (True, "bool"), (False, "bool"),
                                          (2.0, "float"), ([2], "list")])
    def test_type(self, op, n, tname):
        with pytest.raises(TypeError, match=rf"n_threads must be an int or None, got {tname}"):
            call(op, n_threads=n)


@pytest.mark.parametrize("n", [100_000, 2**31])
def test_absurd_n_threads_does_not_crash(n):
    """n_threads=100000 passes validation and libgomp then segfaults; n_threads=2**31
    reaches the kernel signature and fails there with "value too large to convert to int".
    Either must be rejected with a message naming n_threads (or be capped to a count the
    runtime can honour and give the usual result)."""
    code = textwrap.dedent(f"""
        import numpy as np, roicore.core as rc
        x = np.ones((1, 64, 8, 8), np.float32)
        b = np.tile(np.array([[0, 0, 0, 3, 3]], np.float32), (64, 1))
        ref = rc.roi_align(x, b, 2)
        try:
            y = rc.roi_align(x, b, 2, n_threads={n})
        except Exception as e:
            print("RAISED", type(e).__name__, e)
        else:
            print("RESULT", np.array_equal(y, ref))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, (f"process died with return code {proc.returncode} "
                                  f"(signal {-proc.returncode if proc.returncode < 0 else '-'})"
                                  f"\n{proc.stderr[-2000:]}")
    out = proc.stdout.strip()
    assert (re.match(r"RAISED (ValueError|TypeError) .*n_threads", out)
            or out == "RESULT True"), out


# =======================================================================================
# accepted inputs
# =======================================================================================

def _argmax_for(boxes=BOXES, convention=None, x=X, **kw):
    _, a = rc.roi_pool(x, boxes, PS, return_argmax=True, convention=convention, **kw)
    return a


def _grad(op, k=2, seed=5):
    return np.random.default_rng(seed).standard_normal(
        (k, out_channels(op), PS, PS)).astype(np.float32)


def run(op, **kw):
    """Call with a meaningful gradient and argmax for backward ops."""
    if op in BACKWARD and "grad" not in kw:
        k = np.shape(kw.get("boxes", default_boxes(op)))[0]
        kw["grad"] = _grad(op, k)
    if op == "roi_pool_backward_max" and "argmax" not in kw:
        boxes = kw.get("boxes", BOXES)
        kw["argmax"] = _argmax_for(boxes, batch_indices=kw.get("batch_indices"))
    return call(op, **kw)


class TestAcceptedLayouts:
    @pytest.mark.parametrize("op", FORWARD)
    def test_non_contiguous_x(self, op):
        big = np.random.default_rng(7).standard_normal((N, C, H, 2 * W)).astype(np.float32)
        views = {
            "strided": big[:, :, :, ::2],
            "transposed": np.ascontiguousarray(big[:, :, :, :W].transpose(0, 1, 3, 2))
            .transpose(0, 1, 3, 2),
            "fortran": np.asfortranarray(big[:, :, :, :W]),
            "reversed-channels": big[:, ::-1, :, :W],
        }
        for name, v in views.items():
            assert not v.flags.c_contiguous, name
            ref = call(op, x=np.ascontiguousarray(v))
            got = call(op, x=v)
            assert got.dtype == ref.dtype and np.array_equal(got, ref), (op, name)

    def test_non_contiguous_x_argmax(self):
        big = np.random.default_rng(8).standard_normal((N, C, H, 2 * W)).astype(np.float32)
        v = big[:, :, :, 1::2]
        y0, a0 = rc.roi_pool(np.ascontiguousarray(v), BOXES, PS, return_argmax=True)
        y1, a1 = rc.roi_pool(v, BOXES, PS, return_argmax=True)
        assert np.array_equal(y0, y1) and np.array_equal(a0, a1)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_non_contiguous_grad_and_boxes(self, op):
        g = _grad(op)
        g_nc = np.repeat(g, 2, axis=3)[:, :, :, ::2]
        boxes = default_boxes(op)
        boxes_nc = np.asfortranarray(boxes)
        assert not g_nc.flags.c_contiguous and np.array_equal(g_nc, g)
        ref = run(op, grad=g)
        got = run(op, grad=g_nc, boxes=boxes_nc)
        assert np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_read_only_inputs(self, op):
        ref = run(op)
        x = X.copy()
        boxes = default_boxes(op).copy()
        kw = {"boxes": boxes}
        arrays = [x, boxes]
        if op in FORWARD:
            kw["x"] = x
        else:
            kw["grad"] = _grad(op)
            arrays.append(kw["grad"])
        if op == "roi_pool_backward_max":
            kw["argmax"] = _argmax_for().copy()
            arrays.append(kw["argmax"])
        for a in arrays:
            a.flags.writeable = False
        got = run(op, **kw)
        assert np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_read_only_four_column_boxes_and_batch_indices(self, op):
        boxes = np.ascontiguousarray(default_boxes(op)[:, 1:])
        bi = np.array([0, 1])
        ref = run(op)
        boxes.flags.writeable = False
        bi.flags.writeable = False
        assert np.array_equal(run(op, boxes=boxes, batch_indices=bi), ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_broadcast_inputs(self, op):
        row = default_boxes(op)[1]
        boxes_b = np.broadcast_to(row, (3, 5))
        coords_b = np.broadcast_to(row[1:], (3, 4))
        bi_b = np.broadcast_to(np.int64(1), (3,))
        x_b = np.broadcast_to(X[1:], (N, C, H, W))
        assert not boxes_b.flags.writeable and not x_b.flags.writeable
        if op in FORWARD:
            kw = {"x": x_b}
        else:
            kw = {"grad": np.broadcast_to(_grad(op, 1), (3, out_channels(op), PS, PS))}
        kw_ref = {key: np.ascontiguousarray(v) for key, v in kw.items()}
        if op == "roi_pool_backward_max":
            a = np.broadcast_to(_argmax_for(np.ascontiguousarray(boxes_b))[:1], (3, C, PS, PS))
            kw["argmax"] = a
            kw_ref["argmax"] = np.ascontiguousarray(a)
        ref = run(op, boxes=np.ascontiguousarray(boxes_b), **kw_ref)
        assert np.array_equal(run(op, boxes=boxes_b, **kw), ref)
        assert np.array_equal(run(op, boxes=coords_b, batch_indices=bi_b, **kw), ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    def test_python_lists(self, op):
        boxes = default_boxes(op)
        ref = run(op)
        assert np.array_equal(run(op, boxes=boxes.tolist()), ref)
        assert np.array_equal(run(op, boxes=boxes[:, 1:].tolist(), batch_indices=[0, 1]), ref)

    @pytest.mark.parametrize("op", [o for o in ALL_OPS if "bilinear" not in o])
    @pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint16, np.int8])
    def test_int_boxes(self, op, dtype):
        boxes = np.array([[0, 1, 0, 5, 4], [1, 0, 2, 6, 5]], dtype)
        ref = run(op, boxes=boxes.astype(np.float32))
        got = run(op, boxes=boxes)
        assert got.dtype == np.float32 and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.uint32, np.uint64])
    def test_batch_indices_integer_dtypes(self, op, dtype):
        boxes = np.ascontiguousarray(default_boxes(op)[:, 1:])
        ref = run(op)
        assert np.array_equal(run(op, boxes=boxes, batch_indices=np.array([0, 1], dtype)), ref)

    @pytest.mark.parametrize("op", FORWARD)
    def test_float16_x(self, op):
        x16 = X.astype(np.float16)
        got = call(op, x=x16)
        ref = call(op, x=x16.astype(np.float32)).astype(np.float16)
        assert got.dtype == np.float16 and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_float16_grad(self, op):
        g16 = _grad(op).astype(np.float16)
        got = run(op, grad=g16)
        ref = run(op, grad=g16.astype(np.float32)).astype(np.float16)
        assert got.dtype == np.float16 and got.shape == X.shape and np.array_equal(got, ref)

    @pytest.mark.parametrize("op", FORWARD)
    def test_float64_x(self, op):
        got = call(op, x=X.astype(np.float64))
        assert got.dtype == np.float64 and got.shape == (2, out_channels(op), PS, PS)
        assert np.allclose(got, call(op), atol=1e-5)


class TestEmptyAndDegenerate:
    @pytest.mark.parametrize("op", FORWARD)
    @pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
    def test_no_boxes_forward(self, op, dtype):
        x = X.astype(dtype)
        for boxes, bi in [(np.zeros((0, 5), np.float32), None),
                          (np.zeros((0, 4)), np.zeros(0, np.int64)),
                          (np.zeros((0, 5), np.int32), None)]:
            out = call(op, x=x, boxes=boxes, batch_indices=bi, output_size=(3, 2)
                       if not op.startswith("psroi") else PS)
            ph, pw = (3, 2) if not op.startswith("psroi") else (PS, PS)
            assert out.shape == (0, out_channels(op), ph, pw) and out.dtype == dtype

    def test_no_boxes_argmax(self):
        for conv in MAX_POOL:
            y, a = rc.roi_pool(X, np.zeros((0, 5)), (3, 2), return_argmax=True, convention=conv)
            assert y.shape == a.shape == (0, C, 3, 2) and a.dtype.kind == "i"

    @pytest.mark.parametrize("op", FORWARD)
    def test_no_boxes_no_images(self, op):
        x = np.zeros((0, C, H, W), np.float32)
        out = call(op, x=x, boxes=np.zeros((0, 5)))
        assert out.shape == (0, out_channels(op), PS, PS)

    @pytest.mark.parametrize("op", BACKWARD)
    @pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
    def test_no_boxes_backward(self, op, dtype):
        g = np.zeros((0, out_channels(op), PS, PS), dtype)
        kw = {"argmax": np.zeros((0, C, PS, PS), np.int32)} if op.endswith("max") else {}
        dx = call(op, grad=g, boxes=np.zeros((0, 5)), **kw)
        assert dx.shape == X.shape and dx.dtype == dtype and not np.any(dx)
        dx = call(op, grad=g, boxes=np.zeros((0, 4)), batch_indices=np.zeros(0, int), **kw)
        assert dx.shape == X.shape and dx.dtype == dtype and not np.any(dx)

    DEGENERATE = {
        "larger": [0, -10, -20, 100, 200],
        "outside": [1, 50, 60, 70, 80],
        "outside-negative": [0, -80, -70, -60, -50],
        "reversed": [1, 5, 4, 1, 1],
        "zero-size": [0, 2, 3, 2, 3],
    }
    NDEGENERATE = {
        "larger": [0, -1, -2, 2, 3],
        "outside": [1, 3, 3, 4, 5],
        "outside-negative": [0, -4, -4, -3, -2],
        "reversed": [1, 0.9, 0.8, 0.1, 0.2],
        "zero-size": [0, 0.5, 0.5, 0.5, 0.5],
    }

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("kind", list(DEGENERATE))
    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_degenerate_boxes_defined(self, op, kind, dtype):
        table = self.NDEGENERATE if "bilinear" in op else self.DEGENERATE
        boxes = np.array([table[kind], default_boxes(op)[0]], np.float64)
        kw = {}
        if op in FORWARD:
            kw["x"] = X.astype(dtype)
        else:
            kw["grad"] = _grad(op).astype(dtype)
            if op.endswith("max"):
                kw["argmax"] = _argmax_for(boxes)
        for extra in ([{}, {"aligned": True}, {"sampling_ratio": 2}] if "align" in op else [{}]):
            out = run(op, boxes=boxes, **kw, **extra)
            expect = (2, out_channels(op), PS, PS) if op in FORWARD else X.shape
            assert out.shape == expect and out.dtype == dtype
            assert np.all(np.isfinite(out)), (op, kind, extra)

    def test_max_pool_outside_box_is_zero_with_argmax_minus_one(self):
        for conv in MAX_POOL:
            y, a = rc.roi_pool(X, [self.DEGENERATE["outside"]], PS, return_argmax=True,
                               convention=conv)
            assert not np.any(y) and np.all(a == -1), conv

    @pytest.mark.parametrize("kind, pixel", [("reversed", (4, 5)), ("zero-size", (3, 2))])
    def test_max_pool_reversed_and_zero_boxes_are_one_pixel(self, kind, pixel):
        box = self.DEGENERATE[kind]
        y = rc.roi_pool(X, [box], PS)
        expect = X[box[0], :, pixel[0], pixel[1]]
        assert np.array_equal(y[0], np.broadcast_to(expect[:, None, None], (C, PS, PS)))

    def test_max_pool_box_larger_than_map_is_clamped(self):
        y = rc.roi_pool(X, [self.DEGENERATE["larger"]], 1)
        assert np.array_equal(y[0, :, 0, 0], X[0].max(axis=(1, 2)))

    def test_psroi_and_align_outside_box_is_zero(self):
        box = [self.DEGENERATE["outside"]]
        assert not np.any(rc.psroi_pool(X, box, PS))
        for conv in ROI_ALIGN:
            assert not np.any(rc.roi_align(X, box, PS, convention=conv)), conv

    def test_bilinear_outside_box_is_extrapolation_value(self):
        y = rc.roi_pool(X, [self.NDEGENERATE["outside"]], PS, method="bilinear",
                        extrapolation_value=7.5)
        assert np.all(y == 7.5)

    @pytest.mark.parametrize("op", BACKWARD)
    def test_backward_of_outside_box_is_zero(self, op):
        table = self.NDEGENERATE if "bilinear" in op else self.DEGENERATE
        boxes = np.array([table["outside"]], np.float32)
        kw = {"argmax": _argmax_for(boxes)} if op.endswith("max") else {}
        dx = run(op, boxes=boxes, grad=_grad(op, 1), **kw)
        assert dx.shape == X.shape and not np.any(dx)

    @pytest.mark.parametrize("op", ALIGN_OPS)
    def test_enormous_box_with_fixed_sampling_ratio_is_fast(self, op):
        boxes = np.array([[0, 0, 0, 1e6, 1e6]], np.float32)
        kw = {"grad": _grad(op, 1)} if op in BACKWARD else {}
        out = call(op, boxes=boxes, sampling_ratio=2, **kw)
        assert np.all(np.isfinite(out))


# =======================================================================================
# concurrency
# =======================================================================================

def test_python_threads_give_sequential_results():
    rng = np.random.default_rng(99)
    xs = [rng.standard_normal((2, 64, 32, 32)).astype(np.float32) for _ in range(2)]

    def make_boxes(seed):
        r = np.random.default_rng(seed)
        xy1 = r.uniform(0, 400, (200, 2))
        wh = r.uniform(16, 256, (200, 2))
        b = r.integers(0, 2, (200, 1))
        return np.hstack([b, xy1, xy1 + wh]).astype(np.float32)

    bs = [make_boxes(1), make_boxes(2)]
    jobs = [
        lambda: rc.roi_align(xs[0], bs[0], 7, 1 / 16, 2),
        lambda: rc.roi_pool(xs[1], bs[1], 7, 1 / 16),
        lambda: rc.roi_align(xs[1], bs[1], 7, 1 / 16, -1, True, convention="paddle"),
        lambda: rc.roi_pool(xs[0], bs[0], 7, 1 / 16, convention="torchvision"),
    ]
    expected = [job() for job in jobs]
    assert all(np.any(e) for e in expected)

    for _ in range(5):
        for pair in ((0, 1), (2, 3), (0, 2)):
            results = {}
            barrier = threading.Barrier(2)

            def worker(i):
                barrier.wait()
                results[i] = jobs[i]()

            threads = [threading.Thread(target=worker, args=(i,)) for i in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            for i in pair:
                assert np.array_equal(results[i], expected[i]), i


def test_python_threads_backward_give_sequential_results():
    rng = np.random.default_rng(3)
    shape = (2, 64, 32, 32)
    boxes = np.hstack([rng.integers(0, 2, (200, 1)), rng.uniform(0, 200, (200, 2)),
                       rng.uniform(250, 500, (200, 2))]).astype(np.float32)
    g = rng.standard_normal((200, 64, 7, 7)).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    _, am = rc.roi_pool(x, boxes, 7, 1 / 16, return_argmax=True)
    jobs = [
        lambda: rc.roi_align_backward(g, boxes, shape, 1 / 16, 2),
        lambda: rc.roi_pool_backward(g, boxes, shape, 1 / 16, argmax=am),
    ]
    expected = [job() for job in jobs]
    for _ in range(5):
        results = {}
        barrier = threading.Barrier(2)

        def worker(i):
            barrier.wait()
            results[i] = jobs[i]()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for i in range(2):
            assert np.array_equal(results[i], expected[i]), i


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


def test_batch_column_fast_path_and_its_fallback():
    """(K, 5) boxes' float batch column is converted in one C pass; anything that pass
    refuses goes through the NumPy checks, which name the culprit.  Both compare exactly:
    an index of 2**24 is valid with 2**24 + 1 images, though float32(2**24 + 1) == 2**24
    (NumPy 2 compared a float32 column's maximum with n_images in float32 and refused it;
    the float16 column below takes the NumPy path)."""
    from roicore.core import _validate
    rng = np.random.default_rng(5)
    for dt in (np.float32, np.float64):
        rois = np.hstack([rng.integers(0, 3, (50, 1)), rng.uniform(0, 9, (50, 4))]).astype(dt)
        coords, batch = _validate.boxes_and_batch(rois, None, 3, np.float32)
        assert batch.dtype == np.int64 and np.array_equal(batch, rois[:, 0].astype(np.int64))
        assert np.array_equal(coords, rois[:, 1:].astype(np.float32))
    rois = np.array([[2**24, 0, 0, 1, 1]], np.float32)
    _, batch = _validate.boxes_and_batch(rois, None, 2**24 + 1, np.float32)
    assert batch.tolist() == [2**24]
    rois = np.array([[2048, 0, 0, 1, 1]], np.float16)  # float16(2049) == 2048
    _, batch = _validate.boxes_and_batch(rois, None, 2049, np.float32)
    assert batch.tolist() == [2048]
    for bad, match in [(np.nan, "must be finite"), (1.5, "must be an integer"),
                       (3.0, "out of range"), (-1.0, "out of range")]:
        rois = np.array([[0, 0, 0, 1, 1], [bad, 0, 0, 1, 1]], np.float32)
        with pytest.raises(ValueError, match=r"boxes\[1, 0\] \(batch index\) " + match
                           if "range" not in match else r"boxes\[:, 0\]\[1\] = .* " + match):
            _validate.boxes_and_batch(rois, None, 3, np.float32)
