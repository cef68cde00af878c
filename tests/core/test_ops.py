"""The compiled core against the slow reference, bit for bit, for every operator,
convention and dtype; gradients against finite differences; linear operators against
their adjoints; results against the thread count."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

import reference as ref
import roicore.core as rc
from roicore.core.conventions import BILINEAR_POOL, MAX_POOL, PSROI_ALIGN, PSROI_POOL, ROI_ALIGN
from strategies import cases

RFCN = sorted(name for name, rules in PSROI_POOL.items() if rules.formula == "rfcn")


def assert_same(got, want):
    """Bit-identical (NaN equal to NaN, zeros of the same sign), with dtype and shape."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    same = got == want
    if got.dtype.kind == "f":
        same = (same & (np.signbit(got) == np.signbit(want))) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        bad = np.flatnonzero(~same)
        i = np.unravel_index(bad[0], got.shape)
        raise AssertionError(f"{bad.size} of {got.size} elements differ; first at {i}: "
                             f"got {got[i]!r}, want {want[i]!r}")


# --- RoI max pooling ------------------------------------------------------------------

@pytest.mark.parametrize("convention", sorted(MAX_POOL))
@given(case=cases(), ties=st.booleans())
def test_roi_pool_max_matches_reference(convention, case, ties):
    if ties:
        case.x = np.round(case.x)  # many equal values: first-maximum rules decide
    rules = MAX_POOL[convention]
    y, am = rc.roi_pool(case.x, case.rois, case.output_size, case.spatial_scale,
                        convention=convention, return_argmax=True)
    y_ref, am_ref = ref.roi_pool_max(case.x, case.boxes, case.batch, case.output_size,
                                     case.spatial_scale, rules)
    assert_same(y, y_ref)
    assert_same(am, am_ref)
    g = np.random.default_rng(1).standard_normal(y.shape).astype(y.dtype)
    dx = rc.roi_pool_backward(g, case.rois, case.x.shape, case.spatial_scale,
                              convention=convention, argmax=am)
    assert_same(dx, ref.roi_pool_max_backward(g, am_ref, case.batch, case.x.shape, rules))


@pytest.mark.parametrize("convention", sorted(MAX_POOL))
def test_roi_pool_max_nan_and_infinity_rules(convention):
    """NaN and -inf in the map follow each framework's comparison and initial value."""
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        x = rng.standard_normal((1, 4, 6, 6)).astype(dtype)
        x[0, 0, :3, :3] = np.nan
        x[0, 1] = -np.inf
        x[0, 2, ::2, ::2] = np.nan
        x[0, 3, 2, 2] = -1e300 if dtype == np.float64 else -3e38
        boxes = np.array([[0, 0, 0, 5, 5], [0, 0, 0, 2, 2], [0, 1, 1, 4, 3]], dtype)
        y, am = rc.roi_pool(x, boxes, (3, 2), 1.0, convention=convention, return_argmax=True)
        y_ref, am_ref = ref.roi_pool_max(x, boxes[:, 1:], np.zeros(3, np.int64), (3, 2), 1.0,
                                         MAX_POOL[convention])
        assert_same(y, y_ref)
        assert_same(am, am_ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", sorted(MAX_POOL))
def test_roi_pool_max_signed_zeros(dtype, convention):
    """Bins whose maximum is a zero keep the sign of the zero each rule takes: with "greater",
    the first (+0 > -0 is false).  72 channels: whole vector groups and a scalar tail."""
    rng = np.random.default_rng(7)
    x = rng.choice(np.array([-0.0, 0.0, -1.0], dtype), size=(2, 72, 6, 7))
    boxes = np.array([[0, 0, 0, 6, 5], [1, 1, 0, 3, 3], [0, 2, 3, 2, 3], [1, 0, 2, 5, 4]], dtype)
    y, am = rc.roi_pool(x, boxes, (3, 2), 1.0, convention=convention, return_argmax=True)
    y_ref, am_ref = ref.roi_pool_max(x, boxes[:, 1:], boxes[:, 0].astype(np.int64), (3, 2),
                                     1.0, MAX_POOL[convention])
    assert np.signbit(y_ref[y_ref == 0]).any() and not np.signbit(y_ref[y_ref == 0]).all()
    assert_same(y, y_ref)
    assert_same(am, am_ref)


def test_roi_pool_conventions_differ_where_the_spec_says():
    """P=7 with a 57-pixel box: float32 bins end one pixel late (docs/semantics.md 2.3)."""
    x = np.arange(60 * 60, dtype=np.float32).reshape(1, 1, 60, 60)
    box = np.array([[0, 0, 0, 56, 56]], np.float32)  # rh = 57
    by_name = {c: rc.roi_pool(x, box, 7, 1.0, convention=c) for c in MAX_POOL}
    assert np.array_equal(by_name["mxnet"], by_name["paddle"])
    assert not np.array_equal(by_name["mxnet"], by_name["openvino_cpu"])  # exact bins
    assert by_name["mxnet"][0, 0, 6, 6] == x[0, 0, 57, 57]       # last bin reaches row 57
    assert by_name["openvino_cpu"][0, 0, 6, 6] == x[0, 0, 56, 56]
    # float64 input: MXNet multiplies by float32(0.7), torchvision by double 0.7
    x64 = np.arange(100, dtype=np.float64).reshape(1, 1, 10, 10)
    b64 = np.array([[0, 5, 5, 5, 5]], np.float64)  # 5 * 0.7 -> 3.4999999 vs 3.5
    assert rc.roi_pool(x64, b64, 1, 0.7, convention="mxnet")[0, 0, 0, 0] == x64[0, 0, 3, 3]
    assert rc.roi_pool(x64, b64, 1, 0.7, convention="torchvision")[0, 0, 0, 0] == x64[0, 0, 4, 4]


def test_roi_pool_one_full_box_is_the_global_max():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 9, 13)).astype(np.float32)
    boxes = np.array([[1, 0, 0, 12, 8]], np.float32)
    y = rc.roi_pool(x, boxes, 1, 1.0)
    assert np.array_equal(y[0, :, 0, 0], x[1].max(axis=(1, 2)))


# --- bilinear RoI pooling -------------------------------------------------------------

@pytest.mark.parametrize("convention", sorted(BILINEAR_POOL))
@given(case=cases(normalised=True), fill=st.sampled_from([0.0, -1.5]))
def test_roi_pool_bilinear_matches_reference(convention, case, fill):
    rules = BILINEAR_POOL[convention]
    y = rc.roi_pool(case.x, case.rois, case.output_size, method="bilinear",
                    convention=convention, extrapolation_value=fill)
    assert_same(y, ref.roi_pool_bilinear(case.x, case.boxes, case.batch, case.output_size,
                                         rules, fill))
    g = np.random.default_rng(2).standard_normal(y.shape).astype(y.dtype)
    dx = rc.roi_pool_backward(g, case.rois, case.x.shape, method="bilinear",
                              convention=convention)
    assert_same(dx, ref.roi_pool_bilinear_backward(g, case.boxes, case.batch, case.x.shape,
                                                   rules))


@pytest.mark.parametrize("convention", sorted(BILINEAR_POOL))
@given(case=cases(normalised=True), fill=st.sampled_from([0.0, -1.5]), halves=st.booleans())
def test_roi_pool_nearest_matches_reference(convention, case, fill, halves):
    rules = BILINEAR_POOL[convention]
    rois = case.rois.copy()
    if halves:  # samples on pixel halves, where rounding goes away from zero
        rois[:, 1:] = np.round(rois[:, 1:] * 4) / 4
    boxes = rois[:, 1:]
    y = rc.roi_pool(case.x, rois, case.output_size, method="nearest", convention=convention,
                    extrapolation_value=fill)
    assert_same(y, ref.roi_pool_nearest(case.x, boxes, case.batch, case.output_size, rules, fill))
    g = np.random.default_rng(2).standard_normal(y.shape).astype(y.dtype)
    dx = rc.roi_pool_backward(g, rois, case.x.shape, method="nearest", convention=convention)
    assert_same(dx, ref.roi_pool_nearest_backward(g, boxes, case.batch, case.x.shape, rules))


@given(case=cases(normalised=True))
def test_roi_pool_boxes_backward_matches_reference(case):
    g = np.random.default_rng(3).standard_normal(
        (case.rois.shape[0], case.x.shape[1]) + tuple(case.output_size)).astype(case.x.dtype)
    got = rc.roi_pool_boxes_backward(g, case.x, case.rois)
    assert_same(got, ref.roi_pool_bilinear_boxes_backward(g, case.x, case.boxes, case.batch))
    # the same boxes as (K, 4) with batch indices, NHWC-free: the same gradient
    assert_same(rc.roi_pool_boxes_backward(g, case.x, case.boxes, batch_indices=case.batch), got)


@pytest.mark.parametrize("convention", ["openvino", "openvino_cpu"])
def test_roi_pool_boxes_backward_is_tensorflows_only(convention):
    x = np.ones((1, 2, 4, 4), np.float32)
    with pytest.raises(NotImplementedError, match=r"the box gradient is TensorFlow's "
                                                  r"\(CropAndResizeGradBoxes\): it needs rules "
                                                  r"with pin_last=0 and fused_lerp=0"):
        rc.roi_pool_boxes_backward(np.ones((1, 2, 2, 2), np.float32), x, [[0, 0, 0, 1, 1]],
                                   convention=convention)


# --- position-sensitive RoI pooling ---------------------------------------------------

@pytest.mark.parametrize("convention", RFCN)
@given(case=cases(channels=1, max_p=3), out_ch=st.integers(1, 3), data=st.data())
def test_psroi_pool_matches_reference(convention, case, out_ch, data):
    PH, PW = case.output_size
    group = data.draw(st.sampled_from([None, (PH, PW), (1, 1), (2, 3), (3, 2)]))
    GH, GW = group or (PH, PW)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(case.x.shape[:1] + (out_ch * GH * GW,) + case.x.shape[2:])
    x = x.astype(case.x.dtype)
    rules = PSROI_POOL[convention]
    y = rc.psroi_pool(x, case.rois, case.output_size, case.spatial_scale,
                      output_channels=out_ch, group_size=group, convention=convention)
    assert_same(y, ref.psroi_pool(x, case.boxes, case.batch, out_ch, case.output_size,
                                  case.spatial_scale, rules, group))
    g = rng.standard_normal(y.shape).astype(y.dtype)
    dx = rc.psroi_pool_backward(g, case.rois, x.shape, case.spatial_scale, group_size=group,
                                convention=convention)
    assert_same(dx, ref.psroi_pool_backward(g, case.boxes, case.batch, x.shape,
                                            case.output_size, case.spatial_scale, rules, group))


def _position_sensitive_map(case, out_ch, seed=7):
    """A map of out_ch * PH * PW channels for the case's size, in its dtype."""
    PH, PW = case.output_size
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(case.x.shape[:1] + (out_ch * PH * PW,) + case.x.shape[2:])
    return x.astype(case.x.dtype), rng


@given(case=cases(channels=1, max_p=3), out_ch=st.integers(1, 6),
       group=st.sampled_from([None, "pooled"]))
def test_psroi_pool_torchvision_matches_reference(case, out_ch, group):
    x, rng = _position_sensitive_map(case, out_ch)
    group = case.output_size if group else None
    rules = PSROI_POOL["torchvision"]
    y = rc.psroi_pool(x, case.rois, case.output_size, case.spatial_scale, group_size=group,
                      convention="torchvision")
    assert_same(y, ref.psroi_pool(x, case.boxes, case.batch, out_ch, case.output_size,
                                  case.spatial_scale, rules))
    g = rng.standard_normal(y.shape).astype(y.dtype)
    dx = rc.psroi_pool_backward(g, case.rois, x.shape, case.spatial_scale, group_size=group,
                                convention="torchvision")
    assert_same(dx, ref.psroi_pool_backward(g, case.boxes, case.batch, x.shape,
                                            case.output_size, case.spatial_scale, rules))


def test_psroi_pool_torchvision_backward_bins_differ_from_the_forward():
    """torchvision's forward clamps bins to H-1 (the last row is never read) and its
    backward to H (the last row gets gradient, over a larger area)."""
    x = np.arange(4 * 4 * 4, dtype=np.float32).reshape(1, 4, 4, 4)
    box = np.array([[0, 0, 0, 4, 4]], np.float32)   # bins [0, 2) and [2, 4)
    y = rc.psroi_pool(x, box, 2, convention="torchvision")
    assert y[0, 0, 1, 1] == x[0, 3, 2, 2]             # rows and columns [2, 3): one pixel
    dx = rc.psroi_pool_backward(np.ones_like(y), box, x.shape, convention="torchvision")
    assert np.array_equal(dx[0, 3], np.pad(np.full((2, 2), 0.25, np.float32), ((2, 0), (2, 0))))


# --- position-sensitive RoIAlign -------------------------------------------------------

# each convention, and every value of each rules field at least once
PS_ALIGN_RULES = dict(PSROI_ALIGN, **{
    "mxnet-aligned": dataclasses.replace(PSROI_ALIGN["mxnet"], box="aligned"),
    "torchvision-empty-zero": dataclasses.replace(PSROI_ALIGN["torchvision"], empty_grid="zero"),
})


@pytest.mark.parametrize("variant", sorted(PS_ALIGN_RULES))
@given(case=cases(channels=1, max_p=3), out_ch=st.integers(1, 6),
       sampling_ratio=st.sampled_from([-1, 0, 1, 2, 3]), nan_corner=st.booleans())
def test_ps_roi_align_matches_reference(variant, case, out_ch, sampling_ratio, nan_corner):
    x, rng = _position_sensitive_map(case, out_ch)
    if nan_corner:  # what a sample off the map adds: 0, or 0 * v[0, 0]
        x[:, ::2, 0, 0] = np.nan
    rules = convention = PS_ALIGN_RULES[variant]
    y = rc.ps_roi_align(x, case.rois, case.output_size, case.spatial_scale, sampling_ratio,
                        convention=convention)
    assert_same(y, ref.ps_roi_align(x, case.boxes, case.batch, case.output_size,
                                    case.spatial_scale, sampling_ratio, rules))
    g = rng.standard_normal(y.shape).astype(y.dtype)
    dx = rc.ps_roi_align_backward(g, case.rois, x.shape, case.spatial_scale, sampling_ratio,
                                  convention=convention)
    assert_same(dx, ref.ps_roi_align_backward(g, case.boxes, case.batch, x.shape,
                                              case.output_size, case.spatial_scale,
                                              sampling_ratio, rules))


def test_ps_roi_align_samples_outside_the_map_add_a_plain_zero():
    """Unlike roi_align, a NaN at pixel (0, 0) does not reach a box whose samples lie
    beyond the map; a box whose samples all lie outside gives 0."""
    x = np.ones((1, 4, 5, 5), np.float32)
    x[0, :, 0, 0] = np.nan
    half_outside = np.array([[0, 3, 3, 9, 9]], np.float32)
    y = rc.ps_roi_align(x, half_outside, 2, 1.0, 2)
    assert not np.isnan(y).any() and (y[0, 0, 1, 1] < 1)   # outside samples count as 0
    assert not rc.ps_roi_align(x, np.array([[0, 20, 20, 30, 30]], np.float32), 2, 1.0, 2).any()


def test_ps_roi_align_empty_and_negative_grids():
    """Adaptive grids as torchvision counts them: a zero-size box has a 0-sample grid and
    gives 0/0 = NaN; a box reversed in one axis a negative grid and -0; in both, +0."""
    x = np.ones((1, 4, 6, 6), np.float32)
    zero = rc.ps_roi_align(x, np.array([[0, 2, 2, 2, 2]], np.float32), 2)
    assert np.isnan(zero).all()
    one_axis = rc.ps_roi_align(x, np.array([[0, 4, 1, 1, 5]], np.float32), 2)  # x2 < x1
    assert (one_axis == 0).all() and np.signbit(one_axis).all()
    both = rc.ps_roi_align(x, np.array([[0, 4, 5, 1, 1]], np.float32), 2)
    assert (both == 0).all() and not np.signbit(both).any()


# --- RoIAlign -------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("convention", sorted(ROI_ALIGN))
@given(case=cases(max_hw=10, max_p=3), sampling_ratio=st.sampled_from([-1, 0, 1, 2, 3]),
       aligned=st.booleans())
def test_roi_align_matches_reference(convention, reduction, case, sampling_ratio, aligned):
    rules = dataclasses.replace(ROI_ALIGN[convention], reduction=reduction)
    y = rc.roi_align(case.x, case.rois, case.output_size, case.spatial_scale, sampling_ratio,
                     aligned, convention=rules)
    assert_same(y, ref.roi_align(case.x, case.boxes, case.batch, case.output_size,
                                 case.spatial_scale, sampling_ratio, aligned, rules))
    g = np.random.default_rng(4).standard_normal(y.shape).astype(y.dtype)
    dx = rc.roi_align_backward(g, case.rois, case.x.shape, case.spatial_scale, sampling_ratio,
                               aligned, convention=rules)
    assert_same(dx, ref.roi_align_backward(g, case.boxes, case.batch, case.x.shape,
                                           case.output_size, case.spatial_scale,
                                           sampling_ratio, aligned, rules))


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_scattered_boxes_read_only_packed_pixels(sampling_ratio):
    """Boxes scattered over a large map: the forward packs only the tiles near them (see
    blocked.h), so every pixel a sample reads must be among them.  A first call over a map
    of NaN leaves its packed copy in the kept scratch, where an unpacked pixel would show."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 120, 170)).astype(np.float32)
    rc.roi_align(np.full_like(x, np.nan), np.array([[0, 0, 0, 169, 119], [1, 0, 0, 169, 119]],
                                                   np.float32), 7, 1.0, 2)
    xy = rng.uniform(-10, 165, (12, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(0.5, 40, (12, 2))], 1).astype(np.float32)
    batch = rng.integers(0, 2, 12)
    rules = ROI_ALIGN["mxnet"]
    for aligned in (False, True):
        y = rc.roi_align(x, boxes, (3, 4), 1.0, sampling_ratio, aligned, batch_indices=batch)
        assert_same(y, ref.roi_align(x, boxes, batch, (3, 4), 1.0, sampling_ratio, aligned, rules))


def test_roi_align_nan_at_origin_propagates_through_out_of_range_samples():
    """Out-of-range samples count as 0 * v[0, 0], as in the frameworks (docs/semantics.md 2.7)."""
    x = np.ones((1, 1, 5, 5), np.float32)
    x[0, 0, 0, 0] = np.nan
    boxes = np.array([[0, 3, 3, 9, 9]], np.float32)  # half outside, nowhere near (0, 0)
    assert np.isnan(rc.roi_align(x, boxes, 1, 1.0, 4)).all()
    assert not np.isnan(rc.roi_align(x, np.array([[0, 2, 2, 4, 4]], np.float32), 1, 1.0, 2)).any()


# --- gradients: finite differences and adjoints ---------------------------------------

def _fd_check(forward, backward, x, eps=1e-6, rtol=1e-6, atol=1e-8):
    rng = np.random.default_rng(11)
    y = forward(x)
    g = rng.standard_normal(y.shape)
    num = ref.numeric_grad(lambda v: float(np.sum(forward(v) * g)), x, eps)
    np.testing.assert_allclose(backward(g), num, rtol=rtol, atol=atol)


def _jittered_map(shape, seed):
    """Distinct values at least 1e-3 apart: max pooling is differentiable at them."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.prod(shape)).reshape(shape) * 1e-2 + rng.uniform(0, 1e-3, shape)


@pytest.mark.parametrize("convention", sorted(MAX_POOL))
def test_roi_pool_max_gradient_matches_finite_differences(convention):
    x = _jittered_map((2, 2, 7, 8), 0)
    boxes = np.array([[0, 0, 0, 7, 6], [1, 1.4, 2.2, 5.9, 6.6], [1, -3, -3, 3, 2]])
    y, am = rc.roi_pool(x, boxes, (3, 2), 1.0, convention=convention, return_argmax=True)
    _fd_check(lambda v: rc.roi_pool(v, boxes, (3, 2), 1.0, convention=convention),
              lambda g: rc.roi_pool_backward(g, boxes, x.shape, convention=convention,
                                             argmax=am), x)


@pytest.mark.parametrize("convention", sorted(BILINEAR_POOL))
def test_roi_pool_bilinear_gradient_matches_finite_differences(convention):
    x = np.random.default_rng(1).standard_normal((2, 2, 6, 7))
    boxes = np.array([[0, 0.1, 0.05, 0.83, 0.9], [1, -0.2, 0.3, 0.6, 1.1], [1, 0.7, 0.6, 0.2, 0.1]])
    _fd_check(lambda v: rc.roi_pool(v, boxes, (3, 4), method="bilinear", convention=convention),
              lambda g: rc.roi_pool_backward(g, boxes, x.shape, method="bilinear",
                                             convention=convention), x)


def test_roi_pool_nearest_gradient_matches_finite_differences():
    """Nearest sampling is linear in x (a selection), so its gradient is exact."""
    x = np.random.default_rng(4).standard_normal((2, 2, 6, 7))
    boxes = np.array([[0, 0.1, 0.05, 0.83, 0.9], [1, -0.2, 0.3, 0.6, 1.1], [1, 0.7, 0.6, 0.2, 0.1]])
    _fd_check(lambda v: rc.roi_pool(v, boxes, (3, 4), method="nearest"),
              lambda g: rc.roi_pool_backward(g, boxes, x.shape, method="nearest"), x)


@pytest.mark.parametrize("output_size", [(3, 4), (1, 5), (4, 1)])
def test_roi_pool_boxes_backward_matches_finite_differences(output_size):
    """Away from pixel edges the bilinear crop is smooth in the boxes (float64)."""
    x = np.random.default_rng(5).standard_normal((2, 3, 6, 7))
    boxes = np.array([[0.13, 0.21, 0.71, 0.83], [0.9, 0.77, 0.31, 0.12], [0.05, 0.43, 0.6, 0.47]])
    batch = np.array([1, 0, 1])
    g = np.random.default_rng(6).standard_normal((3, 3) + output_size)
    analytic = rc.roi_pool_boxes_backward(g, x, boxes, batch_indices=batch)
    numeric = ref.numeric_grad(lambda b: float(np.sum(rc.roi_pool(
        x, b, output_size, batch_indices=batch, method="bilinear", convention="tensorflow") * g)),
        boxes, eps=1e-7)
    assert np.any(analytic)
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6)


def test_psroi_pool_gradient_matches_finite_differences():
    x = np.random.default_rng(2).standard_normal((2, 2 * 6, 7, 6))
    boxes = np.array([[0, 0, 0, 5, 6], [1, 1.6, 0.4, 4.2, 6.7], [0, 4, 4, 1, 1]])
    _fd_check(lambda v: rc.psroi_pool(v, boxes, (3, 2), 1.0),
              lambda g: rc.psroi_pool_backward(g, boxes, x.shape, 1.0), x)


def test_psroi_pool_torchvision_gradient_matches_finite_differences_inside_the_map():
    """torchvision's backward is the forward's gradient where their bins agree: boxes
    whose bins end before the last row and column, on integer coordinates."""
    x = np.random.default_rng(4).standard_normal((2, 3 * 6, 9, 8))
    boxes = np.array([[0, 0, 0, 5, 6], [1, 2, 1, 6, 7], [0, 4, 4, 1, 1], [1, 3, 2, 3, 2]])
    _fd_check(lambda v: rc.psroi_pool(v, boxes, (3, 2), 1.0, convention="torchvision"),
              lambda g: rc.psroi_pool_backward(g, boxes, x.shape, 1.0, convention="torchvision"),
              x)


@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_ps_roi_align_gradient_matches_finite_differences(sampling_ratio):
    x = np.random.default_rng(5).standard_normal((2, 2 * 6, 6, 7))
    # the reversed box: sampled back to front with a fixed ratio, -0 with an adaptive one
    boxes = np.array([[0, 0.3, 0.2, 5.1, 4.6], [1, -1.2, 2.5, 3.3, 7.5], [1, 4.5, 2.5, 0.3, 3.9]])
    _fd_check(lambda v: rc.ps_roi_align(v, boxes, (3, 2), 1.0, sampling_ratio),
              lambda g: rc.ps_roi_align_backward(g, boxes, x.shape, 1.0, sampling_ratio), x)


@pytest.mark.parametrize("convention", ["mxnet", "torchvision", "sum"])
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_gradient_matches_finite_differences(convention, aligned):
    if convention == "sum":
        convention = dataclasses.replace(ROI_ALIGN["torchvision"], reduction="sum")
    x = np.random.default_rng(3).standard_normal((2, 2, 6, 7))
    boxes = np.array([[0, 0.3, 0.2, 5.1, 4.6], [1, -1.2, 2.5, 3.3, 7.5], [1, 2.5, 2.5, 2.7, 3.9]])
    _fd_check(lambda v: rc.roi_align(v, boxes, (2, 3), 1.0, -1, aligned, convention=convention),
              lambda g: rc.roi_align_backward(g, boxes, x.shape, 1.0, -1, aligned,
                                              convention=convention), x)


def test_roi_align_sum_is_the_mean_times_the_count():
    """reduction="sum" keeps the mean's sums: divided by a power-of-two count they are the
    mean exactly."""
    x = np.random.default_rng(5).standard_normal((1, 3, 9, 9)).astype(np.float32)
    boxes = np.array([[0, 0.5, 1.25, 7.5, 6.0], [0, 3, 3, 3, 3]], np.float32)
    summed = dataclasses.replace(ROI_ALIGN["torchvision"], reduction="sum")
    for sampling_ratio in (1, 2, 4):
        mean = rc.roi_align(x, boxes, 2, 1.0, sampling_ratio, convention="torchvision")
        total = rc.roi_align(x, boxes, 2, 1.0, sampling_ratio, convention=summed)
        assert_same(total / np.float32(sampling_ratio ** 2), mean)


@given(case=cases(dtype=np.float64, max_hw=10, max_p=3), sampling_ratio=st.sampled_from([-1, 2]),
       aligned=st.booleans(), op=st.sampled_from(["bilinear", "nearest", "psroi", "align",
                                                   "ps_align"]))
def test_linear_operators_satisfy_the_adjoint_identity(case, sampling_ratio, aligned, op):
    """<forward(u), g> == <u, backward(g)> for the operators that are linear in x (not
    torchvision's PS-RoI pooling, whose backward has bins of its own)."""
    rng = np.random.default_rng(9)
    if op == "ps_align":
        u = rng.standard_normal((case.x.shape[0], 2 * np.prod(case.output_size)) + case.x.shape[2:])
        fwd = lambda v: rc.ps_roi_align(v, case.rois, case.output_size, case.spatial_scale,
                                        sampling_ratio)
        bwd = lambda g: rc.ps_roi_align_backward(g, case.rois, u.shape, case.spatial_scale,
                                                 sampling_ratio)
    elif op == "psroi":
        u = rng.standard_normal((case.x.shape[0], 2 * np.prod(case.output_size)) + case.x.shape[2:])
        fwd = lambda v: rc.psroi_pool(v, case.rois, case.output_size, case.spatial_scale)
        bwd = lambda g: rc.psroi_pool_backward(g, case.rois, u.shape, case.spatial_scale)
    elif op in ("bilinear", "nearest"):
        u = case.x
        rois = case.rois.copy()
        rois[:, 1:] = rng.uniform(-0.2, 1.2, rois[:, 1:].shape)
        fwd = lambda v: rc.roi_pool(v, rois, case.output_size, method=op)
        bwd = lambda g: rc.roi_pool_backward(g, rois, u.shape, method=op)
    else:
        u = case.x
        args = (case.spatial_scale, sampling_ratio, aligned)
        fwd = lambda v: rc.roi_align(v, case.rois, case.output_size, *args)
        bwd = lambda g: rc.roi_align_backward(g, case.rois, u.shape, *args)
    y = fwd(u)
    g = rng.standard_normal(y.shape)
    if op == "ps_align":  # NaN outputs (empty grids) have no adjoint
        g[np.isnan(y)] = 0
        y = np.nan_to_num(y)
    lhs, rhs = np.sum(y * g), np.sum(u * bwd(g))
    assert abs(lhs - rhs) <= 1e-9 * (1 + np.sum(np.abs(y * g)))


# --- threads, dtypes, layouts ---------------------------------------------------------

def _thread_cases():
    rng = np.random.default_rng(21)
    x = rng.standard_normal((2, 24, 19, 23)).astype(np.float32)
    xy = rng.uniform(-20, 300, (80, 2))
    rois = np.hstack([rng.integers(0, 2, (80, 1)), xy, xy + rng.uniform(-10, 200, (80, 2))])
    rois = rois.astype(np.float32)
    norm = rois.copy()
    norm[:, 1:] = rng.uniform(-0.2, 1.2, (80, 4))
    ps_x = rng.standard_normal((2, 2 * 49, 19, 23)).astype(np.float32)
    y7 = np.ones((80, 24, 7, 7), np.float32)
    yield "roi_pool max", lambda n: rc.roi_pool(x, rois, 7, 1 / 16, n_threads=n, return_argmax=True)
    yield "roi_pool max backward", lambda n: rc.roi_pool_backward(
        y7 * 0.5, rois, x.shape, argmax=rc.roi_pool(x, rois, 7, 1 / 16, return_argmax=True)[1],
        n_threads=n)
    yield "roi_pool bilinear", lambda n: rc.roi_pool(x, norm, 7, method="bilinear", n_threads=n)
    yield "roi_pool bilinear backward", lambda n: rc.roi_pool_backward(
        y7, norm, x.shape, method="bilinear", n_threads=n)
    yield "roi_pool nearest", lambda n: rc.roi_pool(x, norm, 7, method="nearest", n_threads=n)
    yield "roi_pool nearest backward", lambda n: rc.roi_pool_backward(
        y7, norm, x.shape, method="nearest", n_threads=n)
    g7 = rng.standard_normal((80, 24, 7, 7)).astype(np.float32)
    yield "roi_pool boxes backward", lambda n: rc.roi_pool_boxes_backward(g7, x, norm, n_threads=n)
    yield "psroi_pool", lambda n: rc.psroi_pool(ps_x, rois, 7, 1 / 16, n_threads=n)
    yield "psroi_pool backward", lambda n: rc.psroi_pool_backward(
        np.ones((80, 2, 7, 7), np.float32), rois, ps_x.shape, 1 / 16, n_threads=n)
    # 101 boxes: whole and partial runs of the box tables (64) and of the unstaging (16);
    # a 3 x 3 group under a 7 x 7 output: cells of 2 or 3 pooled rows and columns
    many = np.vstack([rois, rois[:21]])
    ps3 = rng.standard_normal((2, 5 * 9, 19, 23))
    g3 = rng.standard_normal((101, 5, 7, 7))
    yield "psroi_pool group 3", lambda n: rc.psroi_pool(
        ps3, many, 7, 1 / 16, group_size=3, convention="mxnet", n_threads=n)
    yield "psroi_pool backward group 3", lambda n: rc.psroi_pool_backward(
        g3, many, ps3.shape, 1 / 16, group_size=3, convention="mxnet", n_threads=n)
    # 7 output channels
    ps_box = rng.standard_normal((2, 7 * 49, 19, 23)).astype(np.float32)
    g_ps = rng.standard_normal((80, 7, 7, 7)).astype(np.float32)
    yield "psroi_pool torchvision", lambda n: rc.psroi_pool(
        ps_box, rois, 7, 1 / 16, convention="torchvision", n_threads=n)
    yield "psroi_pool backward torchvision", lambda n: rc.psroi_pool_backward(
        g_ps, rois, ps_box.shape, 1 / 16, convention="torchvision", n_threads=n)
    yield "ps_roi_align", lambda n: rc.ps_roi_align(ps_box, rois, 7, 1 / 16, -1, n_threads=n)
    yield "ps_roi_align backward", lambda n: rc.ps_roi_align_backward(
        g_ps, rois, ps_box.shape, 1 / 16, 2, n_threads=n)
    # PS-RoIAlign's tasks take a cell's channels in runs of 32 lanes: 40 is a run and a part
    ps40 = rng.standard_normal((2, 40 * 9, 19, 23))
    g40 = rng.standard_normal((80, 40, 3, 3))
    yield "ps_roi_align mxnet 40 channels", lambda n: rc.ps_roi_align(
        ps40, rois, 3, 1 / 16, -1, convention="mxnet", n_threads=n)
    yield "ps_roi_align backward mxnet 40 channels", lambda n: rc.ps_roi_align_backward(
        g40, rois, ps40.shape, 1 / 16, 2, convention="mxnet", n_threads=n)
    for conv in ("mxnet", "paddle"):
        yield f"roi_align {conv}", lambda n, c=conv: rc.roi_align(
            x, rois, 7, 1 / 16, -1, True, convention=c, n_threads=n)
        yield f"roi_align backward {conv}", lambda n, c=conv: rc.roi_align_backward(
            y7, rois, x.shape, 1 / 16, -1, True, convention=c, n_threads=n)
    # one image: whole blocks of 8 vectors and a tail (1 and 2 threads), then, in the
    # backwards, narrower blocks, since blocks x images are fewer than 3 or 4 threads;
    # RoIAlign's backward takes their lanes in groups of 4, 2 and 1 vectors (100 float32
    # channels: 64 + 40 lanes, then 40 + 40 + 24, then 32 x 3 + 8; 40 float64 channels:
    # 32 + 8, then 16 + 16 + 8)
    one = rois.copy()
    one[:, 0] = 0
    for dtype, C in ((np.float32, 100), (np.float64, 40)):
        wide = rng.standard_normal((1, C, 19, 23)).astype(dtype)
        g_wide = rng.standard_normal((80, C, 3, 3)).astype(dtype)
        name = f"{C} {np.dtype(dtype).name} channels"
        yield f"roi_align {name}", lambda n, w=wide: rc.roi_align(w, one, 3, 1 / 16, 2, n_threads=n)
        yield f"roi_align backward {name}", lambda n, g=g_wide, w=wide: rc.roi_align_backward(
            g, one, w.shape, 1 / 16, 2, n_threads=n)
        yield f"roi_pool bilinear backward {name}", lambda n, g=g_wide, w=wide: rc.roi_pool_backward(
            g, norm[:, 1:], w.shape, method="bilinear", batch_indices=np.zeros(80, np.int64),
            n_threads=n)


@pytest.mark.parametrize("name,run", list(_thread_cases()), ids=lambda v: v if isinstance(v, str) else "")
def test_results_are_bit_identical_for_every_thread_count(name, run):
    def outputs(n):
        result = run(n)
        return result if isinstance(result, tuple) else (result,)

    base = outputs(1)
    assert any(np.any(a != 0) for a in base), "degenerate case: all zeros"
    for n in (2, 3, 4, -1):
        for got, want in zip(outputs(n), base, strict=True):
            assert np.array_equal(got, want, equal_nan=True), f"{name} differs with {n} threads"


def test_float16_is_computed_in_float32():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 8, 10, 10)).astype(np.float16)
    rois = np.array([[0, 0.5, 1.5, 7.3, 8.1], [0, 3, 3, 9, 6]], np.float16)
    x32, r32 = x.astype(np.float32), rois.astype(np.float32)
    pairs = [
        (rc.roi_pool(x, rois, 3), rc.roi_pool(x32, r32, 3)),
        (rc.roi_align(x, rois, 3, 1.0, 2), rc.roi_align(x32, r32, 3, 1.0, 2)),
        (rc.psroi_pool(x, rois, 2), rc.psroi_pool(x32, r32, 2)),
        (rc.psroi_pool(x, rois, 2, convention="torchvision"),
         rc.psroi_pool(x32, r32, 2, convention="torchvision")),
        (rc.ps_roi_align(x, rois, 2, 1.0, 2), rc.ps_roi_align(x32, r32, 2, 1.0, 2)),
        (rc.roi_pool(x, rois / 10, 3, method="bilinear"),
         rc.roi_pool(x32, (rois / 10).astype(np.float32), 3, method="bilinear")),
    ]
    for got, want in pairs:
        assert got.dtype == np.float16
        assert np.array_equal(got, want.astype(np.float16))
    g = np.ones((2, 8, 3, 3), np.float16)
    dx = rc.roi_align_backward(g, rois, x.shape, 1.0, 2)
    assert dx.dtype == np.float16
    assert np.array_equal(dx, rc.roi_align_backward(g.astype(np.float32), r32, x.shape, 1.0, 2)
                          .astype(np.float16))


def test_box_formats_and_layouts_agree():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 4, 9, 11))
    rois = np.array([[2, 0.5, 1, 8, 7.5], [0, 3, 2, 10, 8], [1, 0, 0, 4, 4]])
    want = rc.roi_align(x, rois, 2, 1.0, 2)
    assert np.array_equal(want, rc.roi_align(x, rois[:, 1:], 2, 1.0, 2,
                                             batch_indices=rois[:, 0].astype(np.int32)))
    x_nc = np.asfortranarray(x)
    x_ro = x.copy()
    x_ro.flags.writeable = False
    for variant in (x_nc, x_ro, x.transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)):
        assert np.array_equal(want, rc.roi_align(variant, rois, 2, 1.0, 2))


# --- one larger case per operator and convention (hypothesis favours small ones) -------

def _large_case(dtype, seed, normalised=False, channels=5):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, channels, 23, 29)).astype(dtype)
    if normalised:
        boxes = rng.uniform(-0.3, 1.3, (40, 4))
    else:
        xy = rng.uniform(-60, 420, (40, 2))
        boxes = np.hstack([xy, xy + rng.uniform(-40, 300, (40, 2))])
    batch = rng.integers(0, 2, 40)
    return x, boxes.astype(dtype), batch


def _max_pool_case(dtype, kind):
    """(x, boxes, batch, output_size).  "boxes": 40 boxes of every kind on 5 channels.
    "channels": 69 channels, which the forward pools in blocks of 64 (float32) or 32
    (float64), the last one short, turning each block's argmax into the convention's
    encoding; NaNs in some blocks."""
    if kind == "boxes":
        return (*_large_case(dtype, 1), (7, 5))
    x, boxes, batch = _large_case(dtype, 10, channels=69)
    x[1, 40:, 3:9, 5:12] = np.nan
    return x, boxes[:12], batch[:12], (4, 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", sorted(MAX_POOL))
@pytest.mark.parametrize("kind", ["boxes", "channels"])
def test_roi_pool_max_large_cases(dtype, convention, kind):
    x, boxes, batch, size = _max_pool_case(dtype, kind)
    y, am = rc.roi_pool(x, boxes, size, 1 / 16, batch_indices=batch, convention=convention,
                        return_argmax=True)
    y_ref, am_ref = ref.roi_pool_max(x, boxes, batch, size, 1 / 16, MAX_POOL[convention])
    assert_same(y, y_ref)
    assert_same(am, am_ref)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", sorted(ROI_ALIGN))
@pytest.mark.parametrize("aligned", [False, True])
def test_roi_align_large_case(dtype, convention, aligned):
    x, boxes, batch = _large_case(dtype, 2, channels=2)
    args = ((3, 4), 1 / 16, -1, aligned)
    y = rc.roi_align(x, boxes, *args, batch_indices=batch, convention=convention)
    assert_same(y, ref.roi_align(x, boxes, batch, *args, ROI_ALIGN[convention]))
    g = np.ones_like(y)
    dx = rc.roi_align_backward(g, boxes, x.shape, *args[1:], batch_indices=batch,
                               convention=convention)
    assert_same(dx, ref.roi_align_backward(g, boxes, batch, x.shape, *args, ROI_ALIGN[convention]))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", sorted(ROI_ALIGN))
def test_roi_align_whole_channel_blocks_and_tail(dtype, convention):
    """69 channels: the kernels pool whole blocks of 64 (float32) or 32 (float64) channels
    with one code path and the rest with another; both against the reference."""
    x, boxes, batch = _large_case(dtype, 6, channels=69)
    x[1, :, 0, 0] = np.nan  # reaches outputs through out-of-map samples (0 * v[0, 0])
    boxes, batch = boxes[:6], batch[:6]
    boxes[0] = [-40, -40, 100, 90]  # samples outside the map
    boxes[1] = [30, 30, 31, 31]     # aligned: a box smaller than a bin
    batch[:2] = 1
    rules = ROI_ALIGN[convention]
    rng = np.random.default_rng(7)
    for aligned in (False, True):
        args = ((3, 2), 1 / 16, 2, aligned)
        y = rc.roi_align(x, boxes, *args, batch_indices=batch, convention=convention)
        assert_same(y, ref.roi_align(x, boxes, batch, *args, rules))
        g = rng.standard_normal(y.shape).astype(dtype)
        dx = rc.roi_align_backward(g, boxes, x.shape, *args[1:], batch_indices=batch,
                                   convention=convention)
        assert_same(dx, ref.roi_align_backward(g, boxes, batch, x.shape, *args, rules))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("convention", sorted(MAX_POOL))
def test_roi_pool_backward_in_several_passes_over_the_boxes(dtype, convention):
    """64 x 64 planes: the backward scatters into 256 KB of gradient planes per pass over
    the boxes (16 float32 or 8 float64 channels), so a thread's 37 or so channels take
    several passes, each in the serial order.  Boxes overlap heavily: many additions land
    on the same pixels, whose order shows in the bits."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 37, 64, 64)).astype(dtype)
    xy = rng.uniform(0, 300, (30, 2))
    boxes = np.hstack([xy, xy + rng.uniform(50, 700, (30, 2))]).astype(dtype)
    batch = rng.integers(0, 2, 30)
    rules = MAX_POOL[convention]
    y, am = rc.roi_pool(x, boxes, 7, 1 / 16, batch_indices=batch, convention=convention,
                        return_argmax=True)
    g = rng.standard_normal(y.shape).astype(dtype)
    want = ref.roi_pool_max_backward(g, am, batch, x.shape, rules)
    for n in (1, 2, 3):
        dx = rc.roi_pool_backward(g, boxes, x.shape, 1 / 16, batch_indices=batch, argmax=am,
                                  convention=convention, n_threads=n)
        assert_same(dx, want)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("group", [None, 1])
@pytest.mark.parametrize("D", [9, 21, 29, 37])
def test_psroi_pool_many_output_channels(dtype, group, D):
    """Channel counts beyond the hypothesis cases' 1-3: the forward's bins sum, and the
    backward's add, 2, 3, 4 or 6 vectors of channels in code compiled for that count
    (D = 9, 21, 29; 21 in float64), any other count (37; 29 in float64) in the generic
    loops; group 1 puts all 4 bins of a box in one group cell, group None one in each."""
    x, boxes, batch = _large_case(dtype, 8, channels=D * (1 if group else 4))
    boxes[0] = [-40, -40, 500, 480]   # bins clamped at the map's edges
    boxes[1] = [30, 30, 20, 20]       # a box with negative width
    rules = PSROI_POOL["mxnet"]
    y = rc.psroi_pool(x, boxes, 2, 1 / 16, batch_indices=batch, group_size=group,
                      convention="mxnet")
    assert_same(y, ref.psroi_pool(x, boxes, batch, D, 2, 1 / 16, rules, group))
    g = np.random.default_rng(3).standard_normal(y.shape).astype(dtype)
    dx = rc.psroi_pool_backward(g, boxes, x.shape, 1 / 16, batch_indices=batch,
                                group_size=group, convention="mxnet")
    assert_same(dx, ref.psroi_pool_backward(g, boxes, batch, x.shape, 2, 1 / 16, rules, group))


@pytest.mark.slow
def test_large_outputs_have_the_same_bits_as_small_ones():
    """Outputs of 8 MiB or more are written with non-temporal stores through a staging
    buffer, each task's block streamed out during the thread's next task (RoIAlign, and max
    pooling's values and argmax): a call whose output is that large must agree, element
    for element, with calls on 100 boxes at a time, whose outputs are written directly."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 130, 20, 24)).astype(np.float32)
    xy = rng.uniform(-20, 300, (400, 2))
    boxes = np.hstack([xy, xy + rng.uniform(-10, 200, (400, 2))]).astype(np.float32)
    batch = rng.integers(0, 2, 400)
    parts = [slice(i, i + 100) for i in range(0, 400, 100)]
    for conv in sorted(ROI_ALIGN):
        y = rc.roi_align(x, boxes, 7, 1 / 16, 2, True, batch_indices=batch, convention=conv)
        assert y.nbytes >= 8 << 20
        small = [rc.roi_align(x, boxes[p], 7, 1 / 16, 2, True, batch_indices=batch[p],
                              convention=conv) for p in parts]
        assert small[0].nbytes < 8 << 20
        assert_same(y, np.concatenate(small))
    for dtype, conv in itertools.product((np.float32, np.float64), sorted(MAX_POOL)):
        xd, bd = x.astype(dtype), boxes.astype(dtype)
        y, am = rc.roi_pool(xd, bd, 7, 1 / 16, batch_indices=batch, convention=conv,
                            return_argmax=True)
        assert y.nbytes >= 8 << 20
        small = [rc.roi_pool(xd, bd[p], 7, 1 / 16, batch_indices=batch[p], convention=conv,
                             return_argmax=True) for p in parts]
        assert small[0][0].nbytes < 8 << 20
        assert_same(y, np.concatenate([s[0] for s in small]))
        assert_same(am, np.concatenate([s[1] for s in small]))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_torchvision_position_sensitive_large_case(dtype, sampling_ratio):
    """40 boxes of every size, 3 x 4 bins, 5 output channels: both operators and their
    gradients against the reference."""
    x, boxes, batch = _large_case(dtype, 13, channels=5 * 12)
    g = np.random.default_rng(5).standard_normal((40, 5, 3, 4)).astype(dtype)
    y = rc.psroi_pool(x, boxes, (3, 4), 1 / 16, batch_indices=batch, convention="torchvision")
    rules = PSROI_POOL["torchvision"]
    assert_same(y, ref.psroi_pool(x, boxes, batch, 5, (3, 4), 1 / 16, rules))
    dx = rc.psroi_pool_backward(g, boxes, x.shape, 1 / 16, batch_indices=batch,
                                convention="torchvision")
    assert_same(dx, ref.psroi_pool_backward(g, boxes, batch, x.shape, (3, 4), 1 / 16, rules))
    rules = PSROI_ALIGN["torchvision"]
    y = rc.ps_roi_align(x, boxes, (3, 4), 1 / 16, sampling_ratio, batch_indices=batch)
    assert_same(y, ref.ps_roi_align(x, boxes, batch, (3, 4), 1 / 16, sampling_ratio, rules))
    dx = rc.ps_roi_align_backward(g, boxes, x.shape, 1 / 16, sampling_ratio, batch_indices=batch)
    assert_same(dx, ref.ps_roi_align_backward(g, boxes, batch, x.shape, (3, 4), 1 / 16,
                                              sampling_ratio, rules))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_psroi_and_bilinear_large_case(dtype):
    x, boxes, batch = _large_case(dtype, 3, channels=2 * 12)
    y = rc.psroi_pool(x, boxes, (4, 3), 1 / 16, batch_indices=batch)
    assert_same(y, ref.psroi_pool(x, boxes, batch, 2, (4, 3), 1 / 16, PSROI_POOL["paddle"]))
    x, boxes, batch = _large_case(dtype, 4, normalised=True)
    for name, rules in BILINEAR_POOL.items():
        y = rc.roi_pool(x, boxes, (5, 6), batch_indices=batch, method="bilinear", convention=name)
        assert_same(y, ref.roi_pool_bilinear(x, boxes, batch, (5, 6), rules))


@pytest.mark.parametrize("convention", sorted(MAX_POOL))
def test_roi_pool_max_output_does_not_depend_on_return_argmax(convention):
    """Inference skips the argmax; the pooled values must be the same bits."""
    x, boxes, batch = _large_case(np.float32, 5, channels=64)
    x[0, :3, :5, :5] = np.nan
    y_only = rc.roi_pool(x, boxes, 7, 1 / 16, batch_indices=batch, convention=convention)
    y, am = rc.roi_pool(x, boxes, 7, 1 / 16, batch_indices=batch, convention=convention,
                        return_argmax=True)
    assert_same(y_only, y)
    # the reference on the first 8 channels (it is slow); a global argmax encodes C, so it
    # is compared on a run of the core over those 8 channels alone
    x8 = np.ascontiguousarray(x[:, :8])
    y_ref, am_ref = ref.roi_pool_max(x8, boxes, batch, 7, 1 / 16, MAX_POOL[convention])
    assert_same(y[:, :8], y_ref)
    if MAX_POOL[convention].argmax == "plane":
        assert_same(am[:, :8], am_ref)
    assert_same(rc.roi_pool(x8, boxes, 7, 1 / 16, batch_indices=batch, convention=convention,
                            return_argmax=True)[1], am_ref)


def test_out_buffer_is_written_and_returned():
    rng = np.random.default_rng(31)
    x = rng.standard_normal((2, 6, 12, 13)).astype(np.float32)
    rois = np.array([[0, 1, 2, 9, 10], [1, 0, 0, 12, 11], [0, 5, 5, 6, 6]], np.float32)
    ps_x = rng.standard_normal((2, 2 * 9, 12, 13)).astype(np.float32)
    tv_psroi = lambda *a, **kw: rc.psroi_pool(*a, convention="torchvision", **kw)
    for fn, args, xin in [(rc.roi_pool, (3, 1.0), x), (rc.roi_align, (3, 1.0, 2), x),
                          (rc.psroi_pool, (3, 1.0), ps_x), (tv_psroi, (3, 1.0), ps_x),
                          (rc.ps_roi_align, (3, 1.0, 2), ps_x)]:
        want = fn(xin, rois, *args)
        buf = np.full_like(want, np.nan)
        assert fn(xin, rois, *args, out=buf) is buf
        assert_same(buf, want)
        with pytest.raises(ValueError, match="out must be a float32 array of shape"):
            fn(xin, rois, *args, out=np.empty(want.shape, np.float64))
        with pytest.raises(ValueError, match="C-contiguous, aligned and writeable"):
            fn(xin, rois, *args, out=np.empty(want.shape[::-1], np.float32).T)
    with pytest.raises(ValueError, match="share memory"):
        rc.roi_pool(x.reshape(-1)[:2 * 6 * 9].reshape(2, 6, 3, 3), rois[:2], 3, 1.0,
                    out=x.reshape(-1)[:2 * 6 * 9].reshape(2, 6, 3, 3))


def test_backward_out_buffer_is_zeroed_written_and_returned():
    """out= on the backward functions: a buffer full of garbage gives the same gradient as
    a fresh call, is returned, and is validated like the forward's."""
    rng = np.random.default_rng(32)
    x = rng.standard_normal((2, 6, 12, 13)).astype(np.float32)
    rois = np.array([[0, 1, 2, 9, 10], [1, 0, 0, 12, 11], [0, 5, 5, 6, 6]], np.float32)
    ps_shape = (2, 2 * 9, 12, 13)
    y, am = rc.roi_pool(x, rois, 3, 1.0, return_argmax=True)
    g = rng.standard_normal(y.shape).astype(np.float32)
    g_ps = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    calls = [
        (lambda **kw: rc.roi_pool_backward(g, rois, x.shape, 1.0, argmax=am, **kw), x.shape),
        (lambda **kw: rc.roi_pool_backward(g, rois, x.shape, 1.0, method="bilinear",
                                           **kw), x.shape),
        (lambda **kw: rc.roi_align_backward(g, rois, x.shape, 1.0, 2, **kw), x.shape),
        (lambda **kw: rc.psroi_pool_backward(g_ps, rois, ps_shape, 1.0, **kw), ps_shape),
        (lambda **kw: rc.psroi_pool_backward(g_ps, rois, ps_shape, 1.0,
                                             convention="torchvision", **kw), ps_shape),
        (lambda **kw: rc.ps_roi_align_backward(g_ps, rois, ps_shape, 1.0, 2, **kw), ps_shape),
    ]
    for call, shape in calls:
        want = call()
        buf = np.full(shape, np.nan, np.float32)
        assert call(out=buf) is buf
        assert_same(buf, want)
        assert call(out=buf) is buf  # reused: zeroed again, not accumulated
        assert_same(buf, want)
        with pytest.raises(ValueError, match="out must be a float32 array of shape"):
            call(out=np.empty(shape, np.float64))
        with pytest.raises(ValueError, match="C-contiguous, aligned and writeable"):
            call(out=np.empty(shape[::-1], np.float32).T)
    # no boxes: nothing to scatter (the kernels that zero or write dx themselves return
    # at once), so the buffer must still come back zeroed
    empties = [
        rc.psroi_pool_backward(g_ps[:0], rois[:0], ps_shape, 1.0,
                               out=np.full(ps_shape, np.nan, np.float32)),
        rc.roi_pool_backward(g[:0], rois[:0], x.shape, 1.0, argmax=am[:0],
                             out=np.full(x.shape, np.nan, np.float32)),
        rc.roi_align_backward(g[:0], rois[:0], x.shape, 1.0, 2,
                              out=np.full(x.shape, np.nan, np.float32)),
        rc.psroi_pool_backward(g_ps[:0], rois[:0], ps_shape, 1.0, convention="torchvision",
                               out=np.full(ps_shape, np.nan, np.float32)),
        rc.ps_roi_align_backward(g_ps[:0], rois[:0], ps_shape, 1.0, 2,
                                 out=np.full(ps_shape, np.nan, np.float32)),
    ]
    for empty in empties:
        assert not empty.any()
    with pytest.raises(ValueError, match="share memory"):
        rc.roi_pool_backward(g, rois, (3, 6, 3, 3), 1.0, argmax=np.zeros(g.shape, np.int32),
                             convention="torchvision", out=g)
    with pytest.raises(TypeError, match="float16"):
        rc.roi_align_backward(g.astype(np.float16), rois, x.shape, 1.0, 2,
                              out=np.empty(x.shape, np.float32))
