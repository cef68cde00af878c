"""Rejected scalar arguments: sizes, spatial_scale, PS-RoI and RoIAlign options, method,
convention and flags, n_threads; raised before any kernel runs, naming the argument.  What
only the C API checks (a scale as the framework holds it, the adaptive sampling grid) is
raised by its entry point, which writes nothing then (TestCAPIChecks)."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import roicore.core as rc
from roicore.core.conventions import BILINEAR_POOL, MAX_POOL, PSROI_POOL, ROI_ALIGN
from opcalls import (
    C, PS, X, BOXES, FORWARD, BACKWARD, ALL_OPS, PSROI_OPS, ALIGN_OPS, SAMPLING_OPS, _RULES,
    out_channels, call,
)


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


class TestCAPIChecks:
    """Checks the C API owns, raised by its entry points with every output untouched."""

    # These ops hold spatial_scale as a float32 (a C float, or in x's float32 for the
    # torchvision conventions), so a float64 scale that is finite and positive can still
    # become inf or 0 in the kernel.
    FLOAT_SCALE_OPS = ["roi_pool_max", "psroi_pool", "roi_align", "psroi_pool_backward",
                       "roi_align_backward", "psroi_pool_torchvision",
                       "psroi_pool_backward_torchvision", "ps_roi_align", "ps_roi_align_backward"]

    @pytest.mark.filterwarnings("ignore::RuntimeWarning")
    @pytest.mark.parametrize("op", FLOAT_SCALE_OPS)
    @pytest.mark.parametrize("boxes", [BOXES, np.array([[0, 0, 0, 3, 3]], np.float32)],
                             ids=["boxes", "box-with-zero-coordinates"])
    def test_scale_overflowing_float32(self, op, boxes):
        """float32(1e39) is inf: the kernel would get an infinite scale.  With a zero
        coordinate the range check computes 0 * inf = nan and lets the box through."""
        kw = {"grad": np.ones((len(boxes), out_channels(op), PS, PS), np.float32)} \
            if op in BACKWARD else {}
        out = np.full((len(boxes), out_channels(op), PS, PS), np.nan, np.float32)
        with pytest.raises(ValueError, match=r"spatial_scale=1e\+39 becomes inf when held as a "
                                             r"float32"):
            call(op, boxes=boxes, spatial_scale=1e39, **kw, **({} if op in BACKWARD else
                                                               {"out": out}))
        assert np.isnan(out).all()

    @pytest.mark.parametrize("op", FLOAT_SCALE_OPS)
    def test_scale_underflowing_float32(self, op):
        """float32(1e-46) is 0: the kernel would get a zero scale."""
        out = np.full((BOXES.shape[0], out_channels(op), PS, PS), np.nan, np.float32)
        with pytest.raises(ValueError, match=r"spatial_scale=1e-46 becomes 0 when held as a "
                                             r"float32"):
            call(op, spatial_scale=1e-46, **({} if op in BACKWARD else {"out": out}))
        assert np.isnan(out).all()

    @pytest.mark.parametrize("op, aligned", [(op, a) for op in ALIGN_OPS for a in (False, True)]
                             + [(op, None) for op in SAMPLING_OPS if op not in ALIGN_OPS])
    @pytest.mark.parametrize("sr", [-1, 0])
    def test_adaptive_grid_of_enormous_box(self, op, sr, aligned):
        boxes = np.array([[0, 0, 0, 1e6, 1e6]], np.float32)
        g = np.ones((1, out_channels(op), PS, PS), np.float32)
        kw = {"grad": g} if op in BACKWARD else {}
        if aligned is not None:
            kw["aligned"] = aligned
        out = np.full((1, out_channels(op), PS, PS), np.nan, np.float32)
        with pytest.raises(ValueError, match=r"boxes\[0\] would take 500000 x 500000 samples per "
                                             r"bin with adaptive sampling; at most 65536 per axis "
                                             r"and 1048576 per bin are supported: pass "
                                             r"sampling_ratio > 0") as caught:
            call(op, boxes=boxes, spatial_scale=1.0, sampling_ratio=sr,
                 **kw, **({} if op in BACKWARD else {"out": out}))
        assert (caught.value.argument, caught.value.index) == ("boxes", 0)
        assert np.isnan(out).all()

    @pytest.mark.parametrize("op", SAMPLING_OPS)
    def test_adaptive_grid_uses_the_spatial_scale(self, op):
        """A 2e4-pixel box needs 2e4 samples per axis at scale 1 (4e8 per bin: rejected)
        but 625 at scale 1/32 (390625 <= 2**20: accepted)."""
        boxes = np.array([[0, 0, 0, 2e4, 2e4]], np.float32)
        g = np.ones((1, C, 1, 1), np.float32)
        kw = {"grad": g} if op in BACKWARD else {"output_size": 1}
        with pytest.raises(ValueError, match=r"would take 20000 x 20000 samples per bin"):
            call(op, boxes=boxes, spatial_scale=1.0, **kw)
        assert np.isfinite(call(op, boxes=boxes, spatial_scale=1 / 32, **kw)).all()


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
    @pytest.mark.parametrize("op", SAMPLING_OPS)
    @pytest.mark.parametrize("sr", [-2, -3, -100])
    def test_sampling_ratio_below_minus_one(self, op, sr):
        with pytest.raises(ValueError, match=rf"sampling_ratio must be >= -1 \(-1 or 0: adaptive\), "
                                             rf"got {sr}"):
            call(op, sampling_ratio=sr)

    @pytest.mark.parametrize("op", SAMPLING_OPS)
    @pytest.mark.parametrize("sr, tname", [(2.0, "float"), ("2", "str"), (True, "bool"),
                                           (np.bool_(False), "bool"), (None, "NoneType")])
    def test_sampling_ratio_type(self, op, sr, tname):
        with pytest.raises(TypeError, match=rf"sampling_ratio must be an int, got {tname}"):
            call(op, sampling_ratio=sr)

    @pytest.mark.parametrize("op", SAMPLING_OPS)
    def test_sampling_ratio_too_large(self, op):
        with pytest.raises(ValueError, match=r"sampling_ratio must be <= 1024 \(at most 2\*\*20 samples per bin\), got 70000"):
            call(op, sampling_ratio=70000)

    @pytest.mark.parametrize("op", SAMPLING_OPS)
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


@pytest.mark.usefixtures("no_kernels")
class TestMethodConventionFlags:
    @pytest.mark.parametrize("fn", [rc.roi_pool, rc.roi_pool_backward])
    @pytest.mark.parametrize("method", ["avg", "MAX", "", None, "bilinear "])
    def test_unknown_method(self, fn, method):
        first = X if fn is rc.roi_pool else np.ones((2, C, PS, PS), np.float32)
        third = PS if fn is rc.roi_pool else X.shape
        with pytest.raises(ValueError, match=r"method must be one of \('max', 'bilinear', "
                                             r"'nearest'\), got "
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
        ("roi_pool_nearest", "mxnet"), ("roi_pool_backward_nearest", "torchvision"),
        ("psroi_pool", "openvino"), ("psroi_pool_backward", "openvino"),
        ("ps_roi_align", "paddle"), ("ps_roi_align_backward", "tensorflow"),
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

    @pytest.mark.parametrize("op", ["roi_pool_bilinear", "roi_pool_nearest"])
    def test_return_argmax_with_a_crop_method(self, op):
        with pytest.raises(ValueError, match=r"return_argmax=True needs method='max'"):
            call(op, return_argmax=True)

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
