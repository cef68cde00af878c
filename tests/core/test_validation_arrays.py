"""Rejected arrays: feature maps, gradients, boxes, batch indices and argmax.

Every bad input raises TypeError or ValueError *before* any kernel runs (the
``no_kernels`` fixture replaces the compiled module inside ``ops`` with a stub that fails
the test if it is reached), or, for what only the C API checks (coordinates once scaled,
argmax values), from the kernel's entry point; the message names the argument, what was
expected and what came."""
from __future__ import annotations

import re

import numpy as np
import pytest

import roicore.core as rc
from roicore.core import _binding
from opcalls import (
    N, C, H, W, PS, X, BOXES, FORWARD, BACKWARD, ALL_OPS, SAMPLING_OPS, COORD_OPS,
    crop, default_boxes, out_channels, call, with_value,
)


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
                                       np.complex128, np.bool_, object, "U1", np.longdouble])
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
                                    "roi_pool_backward_nearest", "roi_align_backward"])
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


@pytest.mark.parametrize("op", FORWARD)
@pytest.mark.parametrize("dtype", [">f4", ">f8", ">f2"])
def test_big_endian_x_is_computed_as_native(op, dtype):
    """Big-endian maps were refused while big-endian boxes were converted: both are
    now read in native byte order, and the result is the native array's, in the
    native form of x's dtype."""
    native = call(op, x=X.astype(np.dtype(dtype).newbyteorder("=")))
    swapped = call(op, x=X.astype(dtype))
    swapped, native = ((r if isinstance(r, tuple) else (r,)) for r in (swapped, native))
    for got, want in zip(swapped, native):
        assert got.dtype == want.dtype and got.dtype.isnative
        np.testing.assert_array_equal(got, want)


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


class TestScaledCoordinates:
    """Coordinates in range once scaled: checked by the C entry points."""

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

    @pytest.mark.parametrize("op", [op for op in COORD_OPS if not crop(op)])
    def test_coordinates_beyond_range_after_scaling(self, op):
        """1e5 is fine at scale 1 but 1e8 feature pixels at spatial_scale 1000."""
        boxes = with_value(BOXES, (0, 3), 1e5)
        kw = {"sampling_ratio": 2} if op in SAMPLING_OPS else {}
        with pytest.raises(ValueError, match=r"boxes\[0\] coordinate 100000 lies 1e\+08 "
                                             r"feature-map pixels") as caught:
            call(op, boxes=boxes, spatial_scale=1000.0, **kw)
        assert (caught.value.argument, caught.value.index) == ("boxes", 0)




class TestConverters:
    """The C API's box conversions behind the checks, through the binding: they agree with
    NumPy on every position and name the argument and element at fault."""

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    @pytest.mark.parametrize("k", [0, 1, 7])
    def test_check_coords_finiteness(self, dtype, k):
        coords = np.random.default_rng(k).uniform(-1e6, 1e6, (k, 4)).astype(dtype)
        _binding.check_coords(coords, 0, 0, "rois")
        for i in range(coords.size):
            for value in (np.nan, np.inf, -np.inf):
                where = np.unravel_index(i, coords.shape)
                with pytest.raises(ValueError, match=r"rois coordinates must be finite") as caught:
                    _binding.check_coords(with_value(coords, where, value), 0, 0, "rois")
                assert (caught.value.argument, caught.value.index) == ("rois", where[0])

    @pytest.mark.parametrize("dtype", [np.float32, np.float64])
    def test_check_coords_range(self, dtype):
        """|x| * scale_x and |y| * scale_y within 2**24, each axis by its own scale."""
        coords = np.zeros((3, 4), dtype)
        for j in range(4):
            scale_x, scale_y = (1.0, 0.5) if j % 2 == 0 else (0.5, 1.0)
            _binding.check_coords(with_value(coords, (1, j), -(2.0**24)), scale_x, scale_y, "b")
            beyond = with_value(coords, (1, j), 2.0**24 + 4)
            with pytest.raises(ValueError, match=r"b\[1\] coordinate 1\.67772e\+07 lies"):
                _binding.check_coords(beyond, scale_x, scale_y, "b")
            _binding.check_coords(beyond, scale_y, scale_x, "b")  # the other axis's scale

    @pytest.mark.parametrize("dtype", [np.int32, np.int64])
    def test_batch_from_indices(self, dtype):
        batch = np.array([0, 2, 1, 2], dtype)
        assert _binding.batch_from_indices(batch, 3, False, "i").tolist() == [0, 2, 1, 2]
        assert _binding.batch_from_indices(batch[:0], 0, False, "i").shape == (0,)
        for i in range(batch.size):
            for value in (-1, 3, np.iinfo(dtype).min, np.iinfo(dtype).max):
                with pytest.raises(ValueError, match=rf"i\[{i}\] = {value} is out of range"):
                    _binding.batch_from_indices(with_value(batch, i, value), 3, False, "i")
        masked = _binding.batch_from_indices(with_value(batch, 1, -5), 3, True, "i")
        assert masked.tolist() == [0, -1, 1, 2]

    def test_batch_from_counts(self):
        counts = np.array([2, 0, 3], np.int32)
        assert _binding.batch_from_counts(counts, 5, "boxes_num").tolist() == [0, 0, 2, 2, 2]
        with pytest.raises(ValueError, match=r"lod must sum to the number of boxes \(4\), got "
                                             r"sum\(lod\) = 5"):
            _binding.batch_from_counts(counts, 4, "lod")
        with pytest.raises(ValueError, match=r"lod must be non-negative, got lod\[1\] = -1"):
            _binding.batch_from_counts(np.array([2, -1, 4], np.int64), 5, "lod")

    def test_convert_coords(self):
        yx = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.float64)
        assert _binding.convert_coords(yx, 0, True, np.float32).tolist() == \
            [[2, 1, 4, 3], [6, 5, 8, 7]]
        rois = np.hstack([np.zeros((2, 1)), yx])
        assert _binding.convert_coords(rois, 1, False, np.float64).tolist() == yx.tolist()


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
        with pytest.raises(ValueError, match=r"batch_indices must have shape \(2,\), one image "
                                             r"index per box, got " + re.escape(str(bi.shape))):
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
        with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[1\] \(a batch index\) must be an "
                                             r"integer, got " + re.escape(str(value))):
            call(op, boxes=boxes)

    @pytest.mark.parametrize("op", ALL_OPS)
    @pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
    def test_batch_column_not_finite(self, op, value):
        boxes = with_value(default_boxes(op), (1, 0), value)
        with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[1\] \(a batch index\) must be "
                                             r"finite, got " + re.escape(str(np.float32(value)))):
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
        """2**64 - 1 as uint64 must be reported as its value (as a float: the C API reads
        indices beyond int64 as floats), not as -1 after a cast to int64."""
        bi = np.array([0, 2**64 - 1], np.uint64)
        with pytest.raises(ValueError, match=r"batch_indices\[1\] = 1\.8446744073709552e\+19 is "
                                             r"out of range"):
            call(op, boxes=BOXES[:, 1:], batch_indices=bi)

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
        with pytest.raises(ValueError, match=re.escape(
                f"argmax and grad_output must both have the forward output's shape (K, C, PH, "
                f"PW), got {a.shape} and {self.SHAPE}")):
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
            with pytest.raises(ValueError, match=r"argmax holds indices outside their own \(box, "
                                                 r"channel\) plane for 'global' encoding .*"
                                                 r"\[\(n\*C \+ c\)\*H\*W, \(n\*C \+ c \+ 1\)\*H\*W\)"):
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

    @pytest.mark.parametrize("dtype, value", [(np.uint32, 2**32 - 1), (np.uint64, 2**64 - 1)])
    def test_unsigned_values_that_wrap_to_minus_one(self, dtype, value):
        """An unsigned argmax holding its maximum is not -1: casting it to a signed type
        must not turn it into "no selection" (the kernel refuses it)."""
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

def test_batch_columns_of_every_dtype():
    """(K, 5) boxes' batch column is converted by the C API in one pass, exactly: an index of
    2**24 is valid with 2**24 + 1 images, though float32(2**24 + 1) == 2**24, and a float16
    or integer column goes through float64."""
    rng = np.random.default_rng(5)
    for dt in (np.float32, np.float64, np.int64, np.uint8, np.float16):
        rois = np.hstack([rng.integers(0, 3, (50, 1)), rng.uniform(0, 9, (50, 4))]).astype(dt)
        coords, batch = rc.args.boxes_and_batch(rois, None, 3, np.float32)
        assert batch.dtype == np.int64 and np.array_equal(batch, rois[:, 0].astype(np.int64))
        assert np.array_equal(coords, rois[:, 1:].astype(np.float32))
    rois = np.array([[2**24, 0, 0, 1, 1]], np.float32)
    _, batch = rc.args.boxes_and_batch(rois, None, 2**24 + 1, np.float32)
    assert batch.tolist() == [2**24]
    rois = np.array([[2048, 0, 0, 1, 1]], np.float16)  # float16(2049) == 2048
    _, batch = rc.args.boxes_and_batch(rois, None, 2049, np.float32)
    assert batch.tolist() == [2048]
    for bad, match in [(np.nan, r" \(a batch index\) must be finite"),
                       (1.5, r" \(a batch index\) must be an integer"),
                       (3.0, r" = 3 is out of range"), (-1.0, r" = -1 is out of range")]:
        rois = np.array([[0, 0, 0, 1, 1], [bad, 0, 0, 1, 1]], np.float32)
        with pytest.raises(ValueError, match=r"rois\[:, 0\]\[1\]" + match) as caught:
            rc.args.boxes_and_batch(rois, None, 3, np.float32, name="rois")
        assert (caught.value.argument, caught.value.index) == ("rois[:, 0]", 1)


class TestBoxesBackward:
    """roi_pool_boxes_backward(grad_output, x, boxes): the arrays it takes, checked before
    the kernel runs; then the C entry point's own checks, called directly."""

    G = np.ones((2, C, PS, PS), np.float32)
    NB = default_boxes("roi_pool_bilinear")

    @pytest.mark.usefixtures("no_kernels")
    @pytest.mark.parametrize("kwargs, exc, message", [
        (dict(x=np.zeros((C, H, W), np.float32)), ValueError, r"x must be a 4-D \(N, C, H, W\)"),
        (dict(grad_output=np.ones((2, C, PS), np.float32)), ValueError,
         r"grad_output must be a 4-D \(K, C, PH, PW\)"),
        (dict(grad_output=np.ones((2, C, PS, PS), np.float64)), TypeError,
         r"grad_output must have the dtype of x \(float32\), got float64"),
        (dict(grad_output=np.ones((3, C, PS, PS), np.float32)), ValueError,
         r"grad_output must have shape \(2, 8, 2, 2\), got \(3, 8, 2, 2\)"),
        (dict(grad_output=np.ones((2, C - 1, PS, PS), np.float32)), ValueError,
         r"grad_output must have shape \(2, 8, 2, 2\)"),
        (dict(boxes=np.zeros((2, 3), np.float32)), ValueError, r"boxes must have shape \(K, 5\)"),
        (dict(boxes=with_value(NB, (1, 0), 2)), ValueError,
         r"boxes\[:, 0\]\[1\] = 2 is out of range"),
        (dict(boxes=with_value(NB, (0, 2), np.nan)), ValueError, "boxes"),
        (dict(out=np.zeros((2, 5), np.float32)), ValueError, r"out must be a float32 array of "
                                                             r"shape \(2, 4\)"),
        (dict(convention="mxnet"), ValueError, r"convention must be one of .*got 'mxnet'"),
    ])
    def test_rejected(self, kwargs, exc, message):
        args = {"grad_output": self.G, "x": X, "boxes": self.NB, **kwargs}
        with pytest.raises(exc, match=message):
            rc.roi_pool_boxes_backward(args.pop("grad_output"), args.pop("x"), args.pop("boxes"), **args)

    def test_out_is_written_and_returned(self):
        want = rc.roi_pool_boxes_backward(self.G, X, self.NB)
        out = np.full((2, 4), np.nan, np.float32)
        assert rc.roi_pool_boxes_backward(self.G, X, self.NB, out=out) is out
        assert np.array_equal(out, want) and want.shape == (2, 4) and np.any(want)

    def test_entry_point_checks(self):
        """The C entry point refuses what the Python layer would have refused, and a masked
        box (negative batch index) gets a zero gradient."""
        from roicore.core.conventions import BILINEAR_POOL
        rules = BILINEAR_POOL["tensorflow"]
        coords = np.ascontiguousarray(self.NB[:, 1:])
        batch = np.array([0, 1], np.int64)
        grad = np.zeros((2, 4), np.float32)
        _binding.roi_pool_bilinear_boxes_backward(rules, self.G, X, coords, batch, grad, 1)
        assert np.any(grad)
        masked = np.array([-1, 1], np.int64)
        _binding.roi_pool_bilinear_boxes_backward(rules, self.G, X, coords, masked, grad, 1,
                                                  masked=True)
        assert not np.any(grad[0]) and np.any(grad[1])
        with pytest.raises(ValueError, match=r"batch\[0\] = -1 is out of range"):
            _binding.roi_pool_bilinear_boxes_backward(rules, self.G, X, coords, masked, grad, 1)
        aliased = X.reshape(-1)[:8].reshape(2, 4)  # a view of x
        with pytest.raises(ValueError, match="grad_boxes must not share memory with x"):
            _binding.roi_pool_bilinear_boxes_backward(rules, self.G, X, coords, batch, aliased, 1)
        narrow = np.ones((2, C - 1, PS, PS), np.float32)
        with pytest.raises(ValueError, match=r"grad_output must have shape \(2, 8, 2, 2\), got "
                                             r"\(2, 7, 2, 2\)"):
            _binding.roi_pool_bilinear_boxes_backward(rules, narrow, X, coords, batch, grad, 1)
        with pytest.raises(ValueError, match="boxes coordinates must be finite, got inf in box 1"):
            bad = coords.copy()
            bad[1, 2] = np.inf
            _binding.roi_pool_bilinear_boxes_backward(rules, self.G, X, bad, batch, grad, 1)
