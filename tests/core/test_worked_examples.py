"""The documents' worked examples, run on the slow reference and on the compiled core.

Every expected number here is worked out in docs/semantics.md (section 9 lists them), was
measured on a framework's native op, or is printed in a framework's own documentation or
tests: the MXNet and Paddle docstrings, the OpenVINO operator test vectors, the deepsense
blog and notebook.
Each test runs twice (the ``ref`` fixture): on tests/reference.py, which makes the reference
a trusted oracle for the property tests, and on the compiled core through
tests/core_shim.py.  The conventions module is loaded from its file path, so the reference
runs never import the compiled package.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

import reference  # tests/ is on sys.path (tests/conftest.py)

_REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(params=["reference", "core"])
def ref(request):
    """Each worked example runs on the slow reference and on the compiled core."""
    if request.param == "reference":
        return reference
    import core_shim  # imports the compiled roicore only for the "core" runs
    return core_shim


def _load_conventions():
    name = "_roicore_conventions_for_reference_tests"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _REPO / "core" / "conventions.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


conv = _load_conventions()
MAX_POOL, BILINEAR_POOL = conv.MAX_POOL, conv.BILINEAR_POOL
PSROI_POOL, ROI_ALIGN, PSROI_ALIGN = conv.PSROI_POOL, conv.ROI_ALIGN, conv.PSROI_ALIGN
RFCN = sorted(name for name, rules in PSROI_POOL.items() if rules.formula == "rfcn")

DTYPES = [np.float32, np.float64]


def split_rois(rois, dtype):
    """[b, x1, y1, x2, y2] rows -> (boxes (K,4) in dtype, batch (K,) int64)."""
    rois = np.asarray(rois, dtype=np.float64).reshape(-1, 5)
    return rois[:, 1:].astype(dtype), rois[:, 0].astype(np.int64)


def arange_map(shape, dtype, start=0):
    n = int(np.prod(shape))
    return np.arange(start, start + n, dtype=np.float64).reshape(shape).astype(dtype)


def openvino_features(shape, dtype=np.float32):
    """OpenVINO's "increasingly filled" features: value[i] = i/10 in T."""
    n = int(np.prod(shape))
    return np.array([dtype(i / 10) for i in range(n)], dtype=dtype).reshape(shape)


# =============================================================================================
# helpers: C round, bins, spatial scale
# =============================================================================================

@pytest.mark.parametrize("v, expected", [
    (2.5, 3), (-2.5, -3), (1.5, 2), (0.5, 1), (-0.5, -1), (2.4999999, 2), (-1.2, -1),
    (0.49999999999999994, 0),            # floor(v + 0.5) would give 1 here
    (np.float32(2.8000002), 3), (np.float32(3.5), 4), (4503599627370497.0, 4503599627370497),
])
def test_c_round_is_half_away_from_zero(ref, v, expected):
    assert ref.c_round(v) == expected


def test_c_round_rejects_non_finite(ref):
    with pytest.raises(ValueError):
        ref.c_round(float("nan"))


def test_caffe_bins_float32_wrong_for_rh57_p7(ref):
    """docs/semantics.md 2.3: ceil(7 * (57/7)f) = 58 instead of 57 (last bin end)."""
    exact = ref.caffe_bin_edges(57, 7, "exact")
    f32 = ref.caffe_bin_edges(57, 7, "float32")
    f64 = ref.caffe_bin_edges(57, 7, "input", np.float64)
    assert exact[6] == (48, 57)
    assert f32[6] == (48, 58)
    assert f64 == exact
    assert f32[:6] == exact[:6]


def test_caffe_bins_float64_wrong_for_rh29_p7(ref):
    exact = ref.caffe_bin_edges(29, 7, "exact")
    f64 = ref.caffe_bin_edges(29, 7, "input", np.float64)
    f32 = ref.caffe_bin_edges(29, 7, "float32")
    assert exact[6] == (24, 29)
    assert f64[6] == (24, 30)
    assert f32 == exact


def test_caffe_bins_p14_start_wrong_for_rh62_float32(ref):
    """docs/semantics.md 2.3: for P=14 a *start* is wrong too (rh=62, k=7)."""
    exact = ref.caffe_bin_edges(62, 14, "exact")
    f32 = ref.caffe_bin_edges(62, 14, "float32")
    assert exact[7][0] == 31 and f32[7][0] == 30


@pytest.mark.parametrize("P", [2, 3, 4, 5, 6, 8, 16])
def test_caffe_bins_exact_for_small_p(ref, P):
    """docs/semantics.md 2.3: P in {2,3,4,5,6,8,16} has no errors (checked for rh <= 128)."""
    for rh in range(1, 129):
        exact = ref.caffe_bin_edges(rh, P, "exact")
        assert ref.caffe_bin_edges(rh, P, "float32") == exact
        assert ref.caffe_bin_edges(rh, P, "input", np.float64) == exact


# =============================================================================================
# RoI max pooling
# =============================================================================================

MXNET_8x6_BOX = [[0, 0, 0, 4, 4]]


@pytest.mark.parametrize("name", sorted(MAX_POOL))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale, expected", [
    (1.0, [[14, 16], [26, 28]]),
    (0.7, [[7, 9], [19, 21]]),
])
def test_roi_pool_mxnet_docstring(ref, name, dtype, scale, expected):
    """MXNet ROIPooling docstring (docs/semantics.md 9.1), identical for every convention."""
    rules = MAX_POOL[name]
    x = arange_map((1, 1, 8, 6), dtype)
    boxes, batch = split_rois(MXNET_8x6_BOX, dtype)
    y, am = ref.roi_pool_max(x, boxes, batch, (2, 2), scale, rules)
    assert y.dtype == dtype and y.shape == (1, 1, 2, 2)
    np.testing.assert_array_equal(y[0, 0], np.array(expected, dtype))
    # the value equals its position (arange), so plane and global argmax equal the value here
    assert am.dtype == np.dtype(rules.argmax_dtype)
    np.testing.assert_array_equal(am[0, 0], np.array(expected))


def test_roi_pool_mxnet_docstring_float64_oracle(ref):
    """MXNet's float64 ROIPooling(arange/3) gives the true float64 values (semantics 9.1)."""
    x = np.arange(48, dtype=np.float64).reshape(1, 1, 8, 6) / 3
    boxes, batch = split_rois(MXNET_8x6_BOX, np.float64)
    y, _ = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, MAX_POOL["mxnet"])
    np.testing.assert_array_equal(
        y.ravel(), [4.666666666666667, 5.333333333333333, 8.666666666666666, 9.333333333333334])


def test_roi_pool_mxnet_backward_routes_to_argmax(ref):
    """MXNet: grad weights 1,2,3,4 land on (2,2),(2,4),(4,2),(4,4) (docs/semantics.md 9.1)."""
    rules = MAX_POOL["mxnet"]
    x = arange_map((1, 1, 8, 6), np.float32)
    boxes, batch = split_rois(MXNET_8x6_BOX, np.float32)
    _, am = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, rules)
    g = np.array([1, 2, 3, 4], np.float32).reshape(1, 1, 2, 2)
    dx = ref.roi_pool_max_backward(g, am, batch, x.shape, rules)
    assert dx.dtype == np.float32
    nz = [(int(h), int(w), float(dx[0, 0, h, w])) for h, w in zip(*np.nonzero(dx[0, 0]))]
    assert nz == [(2, 2, 1.0), (2, 4, 2.0), (4, 2, 3.0), (4, 4, 4.0)]


def test_roi_pool_oracle_random_example(ref):
    """docs/semantics.md 9.7 (MXNet = OpenVINO = ONNX Runtime): shape, sum, roi0 ch0."""
    x = np.random.RandomState(0).randn(2, 3, 10, 12).astype(np.float32)
    boxes, batch = split_rois(
        [[0, 1.3, 2.2, 7.9, 8.4], [1, 0, 0, 11, 9], [1, 5.5, 3.1, 6.0, 3.2]], np.float32)
    y, am = ref.roi_pool_max(x, boxes, batch, (3, 2), 0.8, MAX_POOL["mxnet"])
    assert y.shape == (3, 3, 3, 2)
    assert abs(float(y.sum(dtype=np.float64)) - 57.645447) < 2e-5
    np.testing.assert_allclose(
        y[0, 0], [[1.20238, 1.53278], [0.38690, 0.17743], [1.89589, 1.05445]], atol=6e-6)
    # every output was picked from the input at its (global) argmax
    np.testing.assert_array_equal(y.ravel(), x.ravel()[am.ravel()])


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_roi_pool_paddle_docstring(ref, name):
    """Paddle roi_pool docstring (docs/semantics.md 9.2): 11 and 16, plane argmax 10, 15."""
    rules = MAX_POOL[name]
    x = arange_map((1, 1, 4, 4), np.float32, start=1)
    boxes = np.array([[1, 1, 2, 2], [1.5, 1.5, 3, 3]], np.float32)
    y, am = ref.roi_pool_max(x, boxes, [0, 0], (1, 1), 1.0, rules)
    assert y.shape == (2, 1, 1, 1)
    np.testing.assert_array_equal(y.ravel(), [11, 16])
    np.testing.assert_array_equal(am.ravel(), [10, 15])        # N=C=1: plane == global
    if name == "paddle":
        assert am.dtype == np.int64


DEEPSENSE_MAP = [[1, 2, 4, 4], [3, 4, 1, 2], [6, 2, 1, 7], [1, 3, 2, 8]]


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_roi_pool_deepsense_notebook(ref, name):
    """deepsense-ai notebook (docs/semantics.md 9.3): integer rois [b,x1,y1,x2,y2], pool 2x2."""
    x = np.array(DEEPSENSE_MAP, np.float32).reshape(1, 1, 4, 4)
    boxes, batch = split_rois([[0, 0, 0, 1, 3], [0, 2, 2, 3, 3], [0, 1, 0, 3, 2]], np.float32)
    y, am = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, MAX_POOL[name])
    np.testing.assert_array_equal(y[:, 0], [[[3, 4], [6, 3]], [[1, 7], [2, 8]], [[4, 4], [4, 7]]])
    np.testing.assert_array_equal(y.ravel(), x.ravel()[am.ravel()])


BLOG_MAP = np.array([
    [0.88, 0.44, 0.14, 0.16, 0.37, 0.77, 0.96, 0.27],
    [0.19, 0.45, 0.57, 0.16, 0.63, 0.29, 0.71, 0.70],
    [0.66, 0.26, 0.82, 0.64, 0.54, 0.73, 0.59, 0.26],
    [0.85, 0.34, 0.76, 0.84, 0.29, 0.75, 0.62, 0.25],
    [0.32, 0.74, 0.21, 0.39, 0.34, 0.03, 0.33, 0.48],
    [0.20, 0.14, 0.16, 0.13, 0.73, 0.65, 0.96, 0.32],
    [0.19, 0.69, 0.09, 0.86, 0.88, 0.07, 0.01, 0.48],
    [0.83, 0.24, 0.97, 0.04, 0.24, 0.35, 0.50, 0.91]], np.float32)


def test_roi_pool_deepsense_blog_example(ref):
    """deepsense blog 8x8 example (docs/semantics.md 9.3).

    The blog's region "(0,3),(7,8)" with "our RoI is 7x5" is columns [0,7) x rows [3,8); its
    sections (per the blog and its comments) are floor-sized first: widths 3|4, heights 2|3,
    which gives [[0.85, 0.84], [0.97, 0.96]].  That partition is *not* the Caffe one: the
    Caffe formula on the same region (inclusive box x1=0, y1=3, x2=6, y2=7) uses overlapping
    bins rows [3,6)|[5,8) and columns [0,4)|[3,7), so the top-right bin also sees 0.96 at
    (row 5, col 6).  No Caffe box with y1=3 reproduces the blog numbers; among boxes with
    x1 >= 0 only [0,1,6,7], [0,1,6,8] and [0,2,6,7] do, by coincidence.
    """
    blog = np.array([[BLOG_MAP[3:5, 0:3].max(), BLOG_MAP[3:5, 3:7].max()],
                     [BLOG_MAP[5:8, 0:3].max(), BLOG_MAP[5:8, 3:7].max()]])
    np.testing.assert_array_equal(blog, np.array([[0.85, 0.84], [0.97, 0.96]], np.float32))

    x = BLOG_MAP.reshape(1, 1, 8, 8)
    rules = MAX_POOL["paddle"]                     # float32 bins, like the deepsense kernel
    y, _ = ref.roi_pool_max(x, [[0, 3, 6, 7]], [0], (2, 2), 1.0, rules)
    np.testing.assert_array_equal(y[0, 0], np.array([[0.85, 0.96], [0.97, 0.96]], np.float32))
    for box in ([0, 1, 6, 7], [0, 1, 6, 8], [0, 2, 6, 7]):
        y, _ = ref.roi_pool_max(x, [box], [0], (2, 2), 1.0, rules)
        np.testing.assert_array_equal(y[0, 0], blog)


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_roi_pool_openvino_1x1_max(ref, name):
    """OpenVINO op_reference: 1x3x6x6, rois [0,1,1,2,3] x3, 1x1 -> 2.0, 5.6, 9.2 per roi."""
    x = openvino_features((1, 3, 6, 6))
    boxes, batch = split_rois([[0, 1, 1, 2, 3]] * 3, np.float32)
    y, _ = ref.roi_pool_max(x, boxes, batch, (1, 1), 1.0, MAX_POOL[name])
    np.testing.assert_allclose(y.ravel(), [2.0, 5.6, 9.2] * 3, rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", sorted(MAX_POOL))
def test_roi_pool_openvino_2x2_max(ref, name):
    x = openvino_features((1, 1, 6, 6))
    boxes, batch = split_rois([[0, 1, 1, 3, 3], [0, 1, 2, 2, 4], [0, 0, 1, 4, 5]], np.float32)
    y, _ = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, MAX_POOL[name])
    np.testing.assert_allclose(
        y.ravel(), [1.4, 1.5, 2.0, 2.1, 1.9, 2.0, 2.5, 2.6, 2.0, 2.2, 3.2, 3.4],
        rtol=1e-6, atol=0)


def _bin_edge_map(H, big_row, dtype):
    x = np.arange(H, dtype=np.float64).reshape(1, 1, H, 1) / 8.0
    x[0, 0, big_row, 0] = 100.0
    return x.astype(dtype)


@pytest.mark.parametrize("dtype, name, expected_last", [
    # rh = 57, P = 7: the float32 last bin ends at 58, so it sees row 57
    (np.float32, "mxnet", 100.0), (np.float32, "torchvision", 100.0),
    (np.float32, "openvino", 100.0), (np.float32, "paddle", 100.0),
    (np.float32, "openvino_cpu", 56 / 8),        # exact integer bins
    (np.float64, "mxnet", 56 / 8), (np.float64, "torchvision", 56 / 8),
    (np.float64, "openvino", 56 / 8),
    (np.float64, "paddle", 100.0),               # Paddle bins stay float32 for double input
    (np.float64, "openvino_cpu", 56 / 8),
])
def test_roi_pool_bin_dtype_visible_rh57(ref, dtype, name, expected_last):
    x = _bin_edge_map(64, 57, dtype)
    y, am = ref.roi_pool_max(x, [[0, 0, 0, 56]], [0], (7, 1), 1.0, MAX_POOL[name])
    assert float(y[0, 0, 6, 0]) == expected_last
    assert int(am[0, 0, 6, 0]) == (57 if expected_last == 100.0 else 56)


@pytest.mark.parametrize("name, expected_last", [
    ("mxnet", 100.0), ("torchvision", 100.0), ("openvino", 100.0),   # float64 bins: ends at 30
    ("paddle", 28 / 8), ("openvino_cpu", 28 / 8),
])
def test_roi_pool_bin_dtype_visible_rh29_float64(ref, name, expected_last):
    x = _bin_edge_map(32, 29, np.float64)
    y, _ = ref.roi_pool_max(x, [[0, 0, 0, 28]], [0], (7, 1), 1.0, MAX_POOL[name])
    assert float(y[0, 0, 6, 0]) == expected_last


@pytest.mark.parametrize("dtype, name, expected_col", [
    (np.float32, "mxnet", 4), (np.float32, "paddle", 4), (np.float32, "openvino", 4),
    (np.float32, "torchvision", 4),                     # 5f * 0.7f = 3.5f -> 4
    (np.float64, "mxnet", 3), (np.float64, "paddle", 3), (np.float64, "openvino", 3),
    (np.float64, "openvino_cpu", 3),                    # 5.0 * double(0.7f) = 3.49999994 -> 3
    (np.float64, "torchvision", 4),                     # 5.0 * 0.7 = 3.5 -> 4
])
def test_roi_pool_spatial_scale_precision(ref, dtype, name, expected_col):
    """docs/semantics.md 2.4: the dtype of spatial_scale matters for double inputs."""
    x = np.arange(8, dtype=dtype).reshape(1, 1, 1, 8)
    y, am = ref.roi_pool_max(x, [[5, 0, 5, 0]], [0], (1, 1), 0.7, MAX_POOL[name])
    assert float(y[0, 0, 0, 0]) == expected_col
    assert int(am[0, 0, 0, 0]) == expected_col


@pytest.mark.parametrize("dtype", DTYPES)
def test_roi_pool_rounds_halves_away_from_zero(ref, dtype):
    """C round: x1 = x2 = 2.5 selects column 3 (Python/numpy round-half-even would give 2)."""
    x = np.arange(8, dtype=dtype).reshape(1, 1, 1, 8)
    for name in sorted(MAX_POOL):
        y, _ = ref.roi_pool_max(x, [[2.5, 0, 2.5, 0]], [0], (1, 1), 1.0, MAX_POOL[name])
        assert float(y[0, 0, 0, 0]) == 3.0


def test_roi_pool_global_argmax_encoding(ref):
    x = np.random.RandomState(3).rand(2, 3, 5, 4)
    boxes = np.array([[0, 0, 3, 4], [1, 1, 2, 3]], np.float64)
    batch = np.array([1, 0])
    y_g, am_g = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, MAX_POOL["mxnet"])
    y_p, am_p = ref.roi_pool_max(x, boxes, batch, (2, 2), 1.0, MAX_POOL["torchvision"])
    np.testing.assert_array_equal(y_g, y_p)
    assert am_g.dtype == np.int32 and am_p.dtype == np.int32
    for n in range(2):
        for c in range(3):
            np.testing.assert_array_equal(am_g[n, c], (batch[n] * 3 + c) * 20 + am_p[n, c])
            np.testing.assert_array_equal(y_p[n, c], x[batch[n], c].ravel()[am_p[n, c]])


def test_roi_pool_empty_bins_and_malformed_box(ref):
    x = arange_map((1, 1, 4, 4), np.float32, start=1)
    rules = MAX_POOL["torchvision"]
    # rh = rw = 11, bin 5.5: the second bin starts at 5 > H = 4 -> empty -> 0, argmax -1
    y, am = ref.roi_pool_max(x, [[0, 0, 10, 10]], [0], (2, 2), 1.0, rules)
    np.testing.assert_array_equal(y[0, 0], [[16, 0], [0, 0]])
    np.testing.assert_array_equal(am[0, 0], [[15, -1], [-1, -1]])
    # x2 < x1: a 1x1 box at (round(y1), round(x1)); every bin covers that pixel
    y, am = ref.roi_pool_max(x, [[2, 1, 0, 0]], [0], (2, 3), 1.0, rules)
    np.testing.assert_array_equal(y[0, 0], np.full((2, 3), x[0, 0, 1, 2]))
    np.testing.assert_array_equal(am[0, 0], np.full((2, 3), 1 * 4 + 2))


def _one_bin(ref, values, rules, dtype=np.float32):
    x = np.array(values, dtype).reshape(1, 1, 1, -1)
    y, am = ref.roi_pool_max(x, [[0, 0, len(values) - 1, 0]], [0], (1, 1), 1.0, rules)
    return y[0, 0, 0, 0], int(am[0, 0, 0, 0])


NAN = float("nan")


def test_roi_pool_compare_nan_and_signed_zero(ref):
    gt, std, jit = MAX_POOL["mxnet"], MAX_POOL["openvino"], MAX_POOL["openvino_cpu"]
    fm = dataclasses.replace(jit, initial="nan", compare="fmax")  # the plugin's non-JIT fallback
    # greater: NaN never taken, first maximum wins
    assert _one_bin(ref, [1, NAN, 3, 3, 2], gt) == (3, 2)
    # std_max: m = (v < m) ? m : v -- a later equal value wins, NaN sticks only if last
    assert _one_bin(ref, [1, NAN, 3, 3, 2], std) == (3, 3)
    v, a = _one_bin(ref, [1, 3, 2, NAN], std)
    assert math.isnan(v) and a == 3
    assert _one_bin(ref, [5, NAN, 2], std) == (2, 2)              # NaN replaced by the next value
    # fmax: NaN ignored, first maximum keeps the argmax
    assert _one_bin(ref, [NAN, 1, NAN, 3, 3, 2], fm) == (3, 3)
    # OpenVINO's JIT kernel: starts at the first element, takes v only if m < v
    assert _one_bin(ref, [1, NAN, 3, 3, 2], jit) == (3, 2)         # first maximum kept
    v, a = _one_bin(ref, [NAN, 1, 3], jit)
    assert math.isnan(v) and a == 0                               # a leading NaN sticks
    # signed zeros: greater keeps the first, std_max takes the later one
    v, a = _one_bin(ref, [0.0, -0.0], gt)
    assert a == 0 and not math.copysign(1, v) < 0
    v, a = _one_bin(ref, [0.0, -0.0], std)
    assert a == 1 and math.copysign(1, v) < 0


def test_roi_pool_initial_value_visible_on_all_nan_and_tiny_bins(ref):
    # all NaN: greater keeps the initial value, fmax/nan gives NaN; argmax -1 everywhere
    v, a = _one_bin(ref, [NAN, NAN], MAX_POOL["mxnet"])
    assert v == np.float32(-ref.FLT_MAX) and a == -1
    v, a = _one_bin(ref, [NAN, NAN], MAX_POOL["paddle"])
    assert v == np.float32(-ref.FLT_MAX) and a == -1
    v, a = _one_bin(ref, [NAN, NAN], dataclasses.replace(MAX_POOL["openvino_cpu"], initial="nan",
                                                         compare="fmax"))
    assert math.isnan(v) and a == -1
    v, a = _one_bin(ref, [NAN, NAN], MAX_POOL["openvino_cpu"])  # JIT: the first element
    assert math.isnan(v) and a == 0
    # all -inf: lowest<T> (OpenVINO reference), argmax -1
    v, a = _one_bin(ref, [-np.inf, -np.inf], MAX_POOL["openvino"])
    assert v == np.float32(-ref.FLT_MAX) and a == -1
    # float64 values below -FLT_MAX: -FLT_MAX initial never selects them; Paddle's -DBL_MAX does
    v, a = _one_bin(ref, [-1e300, -2e300], MAX_POOL["mxnet"], np.float64)
    assert v == -ref.FLT_MAX and a == -1
    v, a = _one_bin(ref, [-1e300, -2e300], MAX_POOL["paddle"], np.float64)
    assert v == -1e300 and a == 0
    v, a = _one_bin(ref, [-2e300, -1e300], MAX_POOL["openvino_cpu"], np.float64)
    assert v == -1e300 and a == 1


def test_roi_pool_invalid_batch_raises(ref):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError):
        ref.roi_pool_max(x, [[0, 0, 1, 1]], [1], (1, 1), 1.0, MAX_POOL["mxnet"])


def test_roi_pool_zero_boxes(ref):
    x = np.zeros((1, 2, 4, 4), np.float32)
    y, am = ref.roi_pool_max(x, np.zeros((0, 4), np.float32), np.zeros(0, np.int64), (2, 3),
                             1.0, MAX_POOL["paddle"])
    assert y.shape == (0, 2, 2, 3) and am.shape == (0, 2, 2, 3) and am.dtype == np.int64


@pytest.mark.parametrize("name", ["mxnet", "paddle"])
def test_roi_pool_max_grad_matches_finite_difference(ref, name):
    rules = MAX_POOL[name]
    rs = np.random.RandomState(7)
    x = rs.permutation(2 * 2 * 6 * 5).reshape(2, 2, 6, 5) / 10.0 + rs.uniform(0, 1e-3, (2, 2, 6, 5))
    boxes = np.array([[0, 0, 4, 5], [1.2, 0.6, 3.4, 2.7], [3, 3, 9, 9]], np.float64)
    batch = np.array([0, 1, 1])
    w = rs.randn(3, 2, 2, 3)
    _, am = ref.roi_pool_max(x, boxes, batch, (2, 3), 1.0, rules)
    dx = ref.roi_pool_max_backward(w, am, batch, x.shape, rules)
    num = ref.numeric_grad(
        lambda z: np.sum(ref.roi_pool_max(z, boxes, batch, (2, 3), 1.0, rules)[0] * w), x)
    np.testing.assert_allclose(dx, num, atol=1e-6)


# =============================================================================================
# Bilinear (OpenVINO ROIPooling bilinear / TF crop_and_resize)
# =============================================================================================

@pytest.mark.parametrize("name", sorted(BILINEAR_POOL))
def test_bilinear_openvino_1x1(ref, name):
    """OpenVINO: 1x3x6x6, rois [0,.2,.2,.4,.4],[0,.2,.2,.6,.6], 1x1 (pinning irrelevant)."""
    x = openvino_features((1, 3, 6, 6))
    boxes, batch = split_rois([[0, .2, .2, .4, .4], [0, .2, .2, .6, .6]], np.float32)
    y = ref.roi_pool_bilinear(x, boxes, batch, (1, 1), BILINEAR_POOL[name])
    np.testing.assert_allclose(y.ravel(), [1.05, 4.65, 8.25, 1.4, 5.0, 8.6], rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", sorted(BILINEAR_POOL))
def test_bilinear_openvino_2x2(ref, name):
    x = openvino_features((1, 1, 8, 8))
    boxes, batch = split_rois([[0, .15, .2, .75, .8]] * 3, np.float32)
    y = ref.roi_pool_bilinear(x, boxes, batch, (2, 2), BILINEAR_POOL[name])
    np.testing.assert_allclose(y.ravel(), [1.225, 1.645, 4.585, 5.005] * 3, rtol=1e-6, atol=0)


def test_bilinear_openvino_border_pinning(ref):
    """OpenVINO border case: pinning the last index to (H-1)*y2 keeps in_y = 49 inside; the
    accumulated TF position lands just above 49 and the last row becomes 0."""
    x = np.ones((1, 1, 50, 50), np.float32)
    boxes, batch = split_rois([[0, 0, 0.248046786, 0.471333951, 1]], np.float32)
    y_ov = ref.roi_pool_bilinear(x, boxes, batch, (4, 4), BILINEAR_POOL["openvino"])
    np.testing.assert_array_equal(y_ov, np.ones((1, 1, 4, 4), np.float32))
    y_tf = ref.roi_pool_bilinear(x, boxes, batch, (4, 4), BILINEAR_POOL["tensorflow"])
    np.testing.assert_array_equal(y_tf[0, 0, :3], 1)
    np.testing.assert_array_equal(y_tf[0, 0, 3], 0)
    y_tf = ref.roi_pool_bilinear(x, boxes, batch, (4, 4), BILINEAR_POOL["tensorflow"],
                                 extrapolation_value=-2.5)
    np.testing.assert_array_equal(y_tf[0, 0, 3], -2.5)


@pytest.mark.parametrize("box, expected", [
    ([0, 0, 4 / 5, 4 / 7], [[0, 4], [24, 28]]),      # normalised [0,0,4/(W-1),4/(H-1)]
    ([0, 0, 1, 1], [[0, 5], [42, 47]]),              # whole map: corners sampled
    ([0, 0, 4, 4], [[0, 0], [0, 0]]),                # absolute coordinates: out of range
])
def test_bilinear_openvino_oracle_8x6(ref, box, expected):
    """OpenVINO bilinear on arange(48).reshape(1,1,8,6) (docs/semantics.md 9.4)."""
    x = arange_map((1, 1, 8, 6), np.float32)
    y = ref.roi_pool_bilinear(x, np.array([box], np.float32), [0], (2, 2),
                              BILINEAR_POOL["openvino"])
    np.testing.assert_allclose(y[0, 0], expected, rtol=1e-6, atol=1e-5)


def test_bilinear_center_is_computed_in_double(ref):
    """P == 1: (y1+y2) in T, then 0.5*...*(H-1) in double, then cast to T."""
    x = arange_map((1, 1, 9, 9), np.float32)
    box = np.array([[0.1, 0.3, 0.7, 0.9]], np.float32)
    y = ref.roi_pool_bilinear(x, box, [0], (1, 1), BILINEAR_POOL["openvino"])
    cy = np.float32(0.5 * float(np.float32(0.3) + np.float32(0.9)) * 8)
    cx = np.float32(0.5 * float(np.float32(0.1) + np.float32(0.7)) * 8)
    t, l = math.floor(cy), math.floor(cx)
    v = x[0, 0]
    top = v[t, l] + (v[t, l + 1] - v[t, l]) * (cx - np.float32(l))
    bot = v[t + 1, l] + (v[t + 1, l + 1] - v[t + 1, l]) * (cx - np.float32(l))
    assert y[0, 0, 0, 0] == top + (bot - top) * (cy - np.float32(t))


def _random_bilinear_case(rs):
    x = rs.randn(2, 2, 5, 6)
    boxes = np.array([[0.1, 0.05, 0.8, 0.9], [0.7, 0.6, 0.2, 0.1], [-0.2, 0.3, 0.5, 1.3],
                      [0.25, 0.5, 0.25, 0.5]], np.float64)
    batch = np.array([0, 1, 1, 0])
    return x, boxes, batch


@pytest.mark.parametrize("name", sorted(BILINEAR_POOL))
@pytest.mark.parametrize("size", [(3, 4), (1, 2)])
def test_bilinear_adjoint_identity(ref, name, size):
    rs = np.random.RandomState(11)
    x, boxes, batch = _random_bilinear_case(rs)
    rules = BILINEAR_POOL[name]
    dy = rs.randn(4, 2, *size)
    lhs = np.sum(ref.roi_pool_bilinear(x, boxes, batch, size, rules) * dy)
    rhs = np.sum(x * ref.roi_pool_bilinear_backward(dy, boxes, batch, x.shape, rules))
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", sorted(BILINEAR_POOL))
def test_bilinear_grad_matches_finite_difference(ref, name):
    rs = np.random.RandomState(12)
    x, boxes, batch = _random_bilinear_case(rs)
    rules = BILINEAR_POOL[name]
    w = rs.randn(4, 2, 3, 3)
    dx = ref.roi_pool_bilinear_backward(w, boxes, batch, x.shape, rules)
    num = ref.numeric_grad(
        lambda z: np.sum(ref.roi_pool_bilinear(z, boxes, batch, (3, 3), rules) * w), x)
    np.testing.assert_allclose(dx, num, atol=1e-7)


# =============================================================================================
# PSROI pooling
# =============================================================================================

@pytest.mark.parametrize("name", RFCN)
@pytest.mark.parametrize("dtype", DTYPES)
def test_psroi_oracle_mxnet(ref, name, dtype):
    """MXNet PSROIPooling(output_dim=2, pooled_size=group_size=2) (docs/semantics.md 9.5)."""
    x = arange_map((1, 8, 6, 6), dtype)
    boxes, batch = split_rois([[0, 0, 0, 3, 3], [0, 1, 1, 5, 4]], dtype)
    y = ref.psroi_pool(x, boxes, batch, 2, (2, 2), 1.0, PSROI_POOL[name])
    expected = [[[[3.5, 41.5], [87.5, 125.5]], [[147.5, 185.5], [231.5, 269.5]]],
                [[[11, 49], [95, 133]], [[155, 193], [239, 277]]]]
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, np.array(expected, dtype))
    y2 = ref.psroi_pool(x, boxes, batch, 2, (2, 2), 1.0, PSROI_POOL[name], group_size=(2, 2))
    np.testing.assert_array_equal(y2, y)


@pytest.mark.parametrize("name", sorted(PSROI_POOL))
def test_psroi_semantics_example(ref, name):
    """docs/semantics.md 4.3 and 9.5: arange(256).reshape(1,4,8,8), P=2, out_dim=1;
    torchvision's integer bins (no +1, clamped to H-1) differ from R-FCN's."""
    x = arange_map((1, 4, 8, 8), np.float32)
    boxes, batch = split_rois([[0, 0, 0, 4, 4], [0, 2, 2, 7, 7]], np.float32)
    y = ref.psroi_pool(x, boxes, batch, 1, 2, 1.0, PSROI_POOL[name])
    if name == "torchvision":
        expected = [[[4.5, 70.5], [148.5, 214.5]], [[27, 93], [171, 237]]]
    else:
        expected = [[[9, 75], [153, 219]], [[27, 94], [179, 246]]]
    np.testing.assert_array_equal(y[:, 0], expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_psroi_torchvision_backward_rounds_in_float32(ref, dtype):
    """torchvision's backward rounds the scaled coordinates with roundf: for float64 input,
    2.4999999999 becomes the float 2.5 and rounds to 3, where the forward's round gives 2.
    The box then starts one row later in the backward than in the forward."""
    rules = PSROI_POOL["torchvision"]
    y1 = 2.4999999999 if dtype == np.float64 else 2.4999998   # float32: stays below 2.5
    boxes, batch = split_rois([[0, 0, y1, 4, 6]], dtype)
    g = np.ones((1, 1, 1, 1), dtype)
    dx = ref.psroi_pool_backward(g, boxes, batch, (1, 1, 8, 8), 1, 1.0, rules)
    first_row = 3 if dtype == np.float64 else 2
    assert np.flatnonzero(dx[0, 0].any(axis=1))[0] == first_row
    x = arange_map((1, 1, 8, 8), dtype)
    # the forward's box starts at row 2: rows 2..5 (clamped to H-1 = 7, no +1), columns 0..3
    y = ref.psroi_pool(x, boxes, batch, 1, 1, 1.0, rules)
    assert y[0, 0, 0, 0] == x[0, 0, 2:6, 0:4].mean()


def test_ps_roi_align_worked_example(ref):
    """Aligned boxes, one sample per bin at its centre: channel (ph*2 + pw) of a map that is
    linear in (h, w), sampled at (ph + 0.5, pw + 0.5), is 100*c + 4*(ph + .5) + (pw + .5)."""
    x = np.zeros((1, 4, 4, 4), np.float32)
    for c in range(4):
        x[0, c] = 100 * c + np.arange(16).reshape(4, 4)
    y = ref.ps_roi_align(x, [[0.5, 0.5, 2.5, 2.5]], [0], 2, 1.0, -1, PSROI_ALIGN["torchvision"])
    np.testing.assert_array_equal(y[0, 0], [[2.5, 103.5], [206.5, 307.5]])
    # 2 x 2 samples of a linear map average to its value at the bin centre; samples all
    # beyond -1 give 0
    x1 = arange_map((1, 1, 4, 4), np.float32)
    y = ref.ps_roi_align(x1, [[0.5, 0.5, 2.5, 2.5], [-3, -3, -1, -1]], [0, 0], 1, 1.0, -1,
                         PSROI_ALIGN["torchvision"])
    np.testing.assert_array_equal(y.ravel(), [5.0, 0.0])


def test_psroi_shape_paddle_doc(ref):
    """Paddle psroi_pool doc's shape rule (docs/semantics.md 9.5), scaled down: C = oc*PH*PW,
    out (K, oc, PH, PW)."""
    x = np.zeros((2, 10 * 3 * 2, 7, 7), np.float32)
    boxes = np.array([[1, 1, 4, 4]] * 5, np.float32)
    y = ref.psroi_pool(x, boxes, [0, 0, 0, 1, 1], 10, (3, 2), 1.0, PSROI_POOL["paddle"])
    assert y.shape == (5, 10, 3, 2)
    with pytest.raises(ValueError):
        ref.psroi_pool(x, boxes, [0, 0, 0, 1, 1], 11, (3, 2), 1.0, PSROI_POOL["paddle"])


def test_psroi_geometry_rounds_before_scaling_and_min_size(ref):
    """round(x)*s, (round(x2)+1)*s, minimum size 0.1, offset added before floor/ceil."""
    x = arange_map((1, 1, 10, 10), np.float64)
    # box [2.4, 2.6, 7.5, 7.5], s = 0.5: rs_w = 2*0.5 = 1, rs_h = 3*0.5 = 1.5,
    # re_w = (8+1)*0.5 = 4.5, re_h = 4.5 -> rw = 3.5, rh = 3.0, bins w [1,3)|[2,5) h [1,3)|[3,5)
    y = ref.psroi_pool(x, [[2.4, 2.6, 7.5, 7.5]], [0], 1, 2, 0.5, PSROI_POOL["mxnet"],
                       group_size=1)
    v = x[0, 0]
    np.testing.assert_array_equal(
        y[0, 0], [[v[1:3, 1:3].mean(), v[1:3, 2:5].mean()], [v[3:5, 1:3].mean(), v[3:5, 2:5].mean()]])
    # reversed box: size 0.1, each bin covers 1 pixel
    y = ref.psroi_pool(x, [[5, 5, 1, 1]], [0], 1, 2, 1.0, PSROI_POOL["mxnet"], group_size=1)
    np.testing.assert_array_equal(y[0, 0], np.full((2, 2), v[5, 5]))


def test_psroi_sums_h_outer_w_inner_in_T(ref):
    """The bin sum runs h-outer, w-inner, from 0, in T: for the float32 bin
    [[1e8, 1], [-1e8, 1]] that is ((1e8 + 1) - 1e8) + 1 = 1 -> mean 0.25 (the exact mean
    is 0.5, a w-outer order would also give 0.5)."""
    x = np.zeros((1, 1, 2, 2), np.float32)
    x[0, 0] = [[1e8, 1], [-1e8, 1]]
    y = ref.psroi_pool(x, [[0, 0, 1, 1]], [0], 1, 1, 1.0, PSROI_POOL["mxnet"])
    assert y.dtype == np.float32 and float(y[0, 0, 0, 0]) == 0.25
    y = ref.psroi_pool(x.astype(np.float64), [[0, 0, 1, 1]], [0], 1, 1, 1.0, PSROI_POOL["mxnet"])
    assert float(y[0, 0, 0, 0]) == 0.5
    # C round before scaling: x1 = 0.5 rounds to 1, so the box is columns [1, 2)
    x = arange_map((1, 1, 2, 3), np.float32)
    y = ref.psroi_pool(x, [[0.5, 0, 1, 0]], [0], 1, 1, 1.0, PSROI_POOL["paddle"])
    assert float(y[0, 0, 0, 0]) == 1.0


def test_psroi_group_size_channel_map(ref):
    """MXNet group_size != pooled_size: gh = clamp(floor(ph*G/P), 0, G-1)."""
    x = np.zeros((1, 2 * 2 * 2, 6, 6), np.float64)
    for c in range(8):
        x[0, c] = c
    y = ref.psroi_pool(x, [[0, 0, 5, 5]], [0], 2, (3, 3), 1.0, PSROI_POOL["mxnet"],
                       group_size=(2, 2))
    # g(p) = floor(p*2/3) = 0, 0, 1
    g = [0, 0, 1]
    expected = [[[(ct * 2 + g[ph]) * 2 + g[pw] for pw in range(3)] for ph in range(3)]
                for ct in range(2)]
    np.testing.assert_array_equal(y[0], expected)


def _random_psroi_case(rs, group_size=(3, 2)):
    x = rs.randn(2, 2 * group_size[0] * group_size[1], 7, 6)  # output_channels = 2
    boxes = np.array([[0.4, 1.2, 4.6, 5.1], [2, 3, 1, 1], [-3, -2, 9.7, 12.2], [1, 1, 1, 1]])
    batch = np.array([1, 0, 1, 0])
    return x, boxes, batch


@pytest.mark.parametrize("group_size", [None, (2, 1)])
def test_psroi_adjoint_identity(ref, group_size):
    rs = np.random.RandomState(21)
    x, boxes, batch = _random_psroi_case(rs, group_size or (3, 2))
    rules = PSROI_POOL["mxnet"]
    dy = rs.randn(4, 2, 3, 2)
    y = ref.psroi_pool(x, boxes, batch, 2, (3, 2), 0.75, rules, group_size=group_size)
    dx = ref.psroi_pool_backward(dy, boxes, batch, x.shape, (3, 2), 0.75, rules,
                                 group_size=group_size)
    assert np.sum(y * dy) == pytest.approx(np.sum(x * dx), rel=1e-12, abs=1e-12)


def test_psroi_grad_matches_finite_difference(ref):
    rs = np.random.RandomState(22)
    x, boxes, batch = _random_psroi_case(rs)
    rules = PSROI_POOL["paddle"]
    w = rs.randn(4, 2, 3, 2)
    dx = ref.psroi_pool_backward(w, boxes, batch, x.shape, (3, 2), 0.75, rules)
    num = ref.numeric_grad(
        lambda z: np.sum(ref.psroi_pool(z, boxes, batch, 2, (3, 2), 0.75, rules) * w), x)
    np.testing.assert_allclose(dx, num, atol=1e-7)


# =============================================================================================
# RoIAlign
# =============================================================================================

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ROI_ALIGN))
@pytest.mark.parametrize("aligned, expected", [
    (True, [6.0, 9.75]),
    (False, [8.5, 12.25]),
])
def test_roi_align_paddle_test_vector(ref, dtype, name, aligned, expected):
    """Paddle test_ops_roi_align::test_value (docs/semantics.md 9.2); exact for every sampler."""
    x = arange_map((1, 1, 4, 4), dtype, start=1)
    boxes = np.array([[1, 1, 2, 2], [1.5, 1.5, 3, 3]], dtype)
    y = ref.roi_align(x, boxes, [0, 0], (1, 1), 1.0, -1, aligned, ROI_ALIGN[name])
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.ravel(), expected)


MX_ALIGN_ROIS = [[0, 0, 0, 4, 4], [0, .5, 1.5, 3.7, 6.2]]


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-6), (np.float64, 1e-13)])
@pytest.mark.parametrize("name", sorted(ROI_ALIGN))
@pytest.mark.parametrize("aligned, expected", [
    (False, [[[7, 9], [19, 21]], [[17.35, 18.95], [31.45, 33.05]]]),
    (True, [[[3.5, 5.5], [15.5, 17.5]], [[13.85, 15.45], [27.95, 29.55]]]),
])
def test_roi_align_mxnet_oracle(ref, dtype, rtol, name, aligned, expected):
    """MXNet ROIAlign sample_ratio=2 on arange(48).reshape(1,1,8,6) (docs/semantics.md 9.6)."""
    x = arange_map((1, 1, 8, 6), dtype)
    boxes, batch = split_rois(MX_ALIGN_ROIS, dtype)
    y = ref.roi_align(x, boxes, batch, (2, 2), 1.0, 2, aligned, ROI_ALIGN[name])
    np.testing.assert_allclose(y[:, 0], np.array(expected), rtol=rtol, atol=0)


def test_roi_align_mxnet_oracle_backward_sum(ref):
    """MXNet ROIAlign backward grad sum 4.0 (4 outputs, weights summing to 1 each; 9.6)."""
    x_shape = (1, 1, 8, 6)
    boxes, batch = split_rois(MX_ALIGN_ROIS[:1], np.float32)
    dx = ref.roi_align_backward(np.ones((1, 1, 2, 2), np.float32), boxes, batch, x_shape,
                                (2, 2), 1.0, 2, False, ROI_ALIGN["mxnet"])
    assert dx.dtype == np.float32 and float(dx.sum()) == 4.0
    # samples at 0.5/1.5 and 2.5/3.5: every pixel of rows/cols 0..4 gets a share
    assert np.count_nonzero(dx) == 25


def test_roi_align_paddle_forward_differs_in_last_bit(ref):
    """docs/semantics.md 5.3: Paddle's forward association/weights/reciprocal differ from Caffe2 in
    the last bit for float32 (about 1e-6 relative), while agreeing closely."""
    rs = np.random.RandomState(5)
    x = rs.rand(1, 1, 16, 16).astype(np.float32)
    xy = rs.uniform(0, 16, (20, 2))
    wh = rs.uniform(0.5, 10, (20, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    batch = np.zeros(20, np.int64)
    args = (boxes, batch, (3, 3), 0.75, -1, False)
    y_c2 = ref.roi_align(x, *args, ROI_ALIGN["torchvision"])
    y_pd = ref.roi_align(x, *args, ROI_ALIGN["paddle"])
    assert np.any(y_c2 != y_pd)
    np.testing.assert_allclose(y_pd, y_c2, rtol=0, atol=1e-5)
    # ... and in float64 the two agree to rounding only
    y64_c2 = ref.roi_align(x.astype(np.float64), *args, ROI_ALIGN["torchvision"])
    y64_pd = ref.roi_align(x.astype(np.float64), *args, ROI_ALIGN["paddle"])
    np.testing.assert_allclose(y64_pd, y64_c2, rtol=0, atol=1e-13)


def test_roi_align_float32_intermediates_are_rounded(ref):
    """Every intermediate is binary32: the float32 result is not the float64 result rounded
    once (but within float32 accuracy of it)."""
    rs = np.random.RandomState(4)
    x = rs.rand(1, 2, 9, 9).astype(np.float32)
    boxes = np.array([[0.3, 1.7, 7.9, 6.1], [2.2, 0.1, 5.3, 8.7]], np.float32)
    args = ([0, 0], (3, 3), 0.9, -1, False, ROI_ALIGN["mxnet"])
    y32 = ref.roi_align(x, boxes, *args)
    y64 = ref.roi_align(x.astype(np.float64), boxes.astype(np.float64), *args)
    assert y32.dtype == np.float32
    assert np.any(y32 != y64.astype(np.float32))
    np.testing.assert_allclose(y32, y64, rtol=0, atol=2e-6)


def test_roi_align_sample_position_expressions_float32(ref):
    """Pin the two samplers' float32 expressions (docs/semantics.md 2.7 and 5.3) on a ramp
    v[0, w] = w with H = 1 and one sample per bin, where the output is a function of the
    sample position alone:

    caffe2: x = (sw + pw*bin) + (T)(0.5f)*bin/(T)1;  value = hx*xl + lx*xh,  lx = x - xl
    paddle: x = sw + bin*((T)pw + (T)(0.5f)/(T)1);   value = ((0 + 0) + r*xl) + (1-r)*xh,
            r = xh - x, times (T)(1.0/1)
    """
    f = np.float32
    W, PW = 64, 7
    x = np.arange(W, dtype=f).reshape(1, 1, 1, W)
    rs = np.random.RandomState(9)
    n_assoc_differs = 0
    for _ in range(40):
        x1 = f(rs.uniform(0, 20))
        x2 = f(x1 + f(rs.uniform(8, 40)))
        box = np.array([[x1, 0, x2, 0]], f)
        y_c2 = ref.roi_align(x, box, [0], (1, PW), 1.0, 1, False, ROI_ALIGN["mxnet"])[0, 0, 0]
        y_pd = ref.roi_align(x, box, [0], (1, PW), 1.0, 1, False, ROI_ALIGN["paddle"])[0, 0, 0]
        sw = x1 * f(1.0)
        bin_w = (x2 * f(1.0) - sw) / f(PW)
        for pw in range(PW):
            pos_c2 = (sw + f(pw) * bin_w) + (f(0.5) * bin_w) / f(1)
            pos_pd = sw + bin_w * (f(pw) + f(0.5) / f(1))
            xl = math.floor(pos_c2)
            lx = pos_c2 - f(xl)
            assert y_c2[pw] == (f(1) - lx) * f(xl) + lx * f(xl + 1)
            xl = math.floor(pos_pd)
            r = f(xl + 1) - pos_pd
            zero = f(0) * f(0)
            assert y_pd[pw] == (((zero + zero) + r * f(xl)) + (f(1) - r) * f(xl + 1)) * f(1.0)
            n_assoc_differs += pos_c2 != pos_pd
    assert n_assoc_differs > 0          # the two associations really differ on this data


def test_roi_align_scale_precision_float64(ref):
    """float64 input: MXNet multiplies by double(0.7f), torchvision by 0.7 -> last-bit diff."""
    x = np.random.RandomState(6).rand(1, 2, 10, 10)
    boxes = np.array([[1.3, 2.1, 9.7, 8.8], [3, 3, 11, 13]], np.float64)
    args = (boxes, [0, 0], (2, 3), 0.7, 2, False)
    y_mx = ref.roi_align(x, *args, ROI_ALIGN["mxnet"])
    y_tv = ref.roi_align(x, *args, ROI_ALIGN["torchvision"])
    assert np.any(y_mx != y_tv)
    np.testing.assert_allclose(y_mx, y_tv, rtol=1e-6)
    # float32 input: both use 0.7f -> bit-identical
    x32, b32 = x.astype(np.float32), boxes.astype(np.float32)
    args32 = (b32, [0, 0], (2, 3), 0.7, 2, False)
    np.testing.assert_array_equal(ref.roi_align(x32, *args32, ROI_ALIGN["mxnet"]),
                                  ref.roi_align(x32, *args32, ROI_ALIGN["torchvision"]))


def test_roi_align_empty_grid_zero_vs_nan(ref):
    """docs/semantics.md 5.3: aligned box [1,1,1,1] -> Paddle NaN, torchvision 0."""
    x = arange_map((1, 1, 4, 4), np.float32, start=1)
    box = np.array([[1, 1, 1, 1]], np.float32)
    y_pd = ref.roi_align(x, box, [0], (1, 1), 1.0, -1, True, ROI_ALIGN["paddle"])
    y_tv = ref.roi_align(x, box, [0], (1, 1), 1.0, -1, True, ROI_ALIGN["torchvision"])
    assert np.isnan(y_pd).all()
    np.testing.assert_array_equal(y_tv, np.zeros((1, 1, 1, 1), np.float32))
    # the backward of an empty grid adds nothing (torchvision); Paddle's backward clamps the
    # size to 1 and so does sample that box
    dx_tv = ref.roi_align_backward(np.ones((1, 1, 1, 1), np.float32), box, [0], x.shape, (1, 1),
                                   1.0, -1, True, ROI_ALIGN["torchvision"])
    assert not dx_tv.any()
    dx_pd = ref.roi_align_backward(np.ones((1, 1, 1, 1), np.float32), box, [0], x.shape, (1, 1),
                                   1.0, -1, True, ROI_ALIGN["paddle"])
    # size 1 from start 0.5: one sample at (1, 1)
    expected = np.zeros((1, 1, 4, 4), np.float32)
    expected[0, 0, 1, 1] = 1
    np.testing.assert_array_equal(dx_pd, expected)


@pytest.mark.parametrize("name", sorted(ROI_ALIGN))
def test_roi_align_out_of_range_samples_count_with_zero_times_v00(ref, name):
    x = arange_map((1, 1, 4, 4), np.float32, start=1)
    box = np.array([[20, 20, 22, 22]], np.float32)           # entirely outside
    y = ref.roi_align(x, box, [0], (1, 1), 1.0, 2, False, ROI_ALIGN[name])
    np.testing.assert_array_equal(y, 0)
    x[0, 0, 0, 0] = np.nan                                    # 0 * NaN = NaN
    y = ref.roi_align(x, box, [0], (1, 1), 1.0, 2, False, ROI_ALIGN[name])
    assert np.isnan(y).all()
    # a box half outside: in-range samples plus zero-weight samples in the count
    x = arange_map((1, 1, 4, 4), np.float32, start=1)
    box = np.array([[2.5, 0.5, 6.5, 1.5]], np.float32)       # x samples 3.5, 5.5 (out: > W)
    y = ref.roi_align(x, box, [0], (1, 1), 1.0, 2, False, ROI_ALIGN[name])
    # grid 2x2: y samples 0.75, 1.25; x samples 3.5 (clamped to col 3) and 5.5 (out of range)
    # -> (in-range sum + 0 + 0) / 4
    col3 = x[0, 0, :, 3].astype(np.float64)
    in_range_sum = (0.25 * col3[0] + 0.75 * col3[1]) + (0.75 * col3[1] + 0.25 * col3[2])
    assert float(y[0, 0, 0, 0]) == pytest.approx(in_range_sum / 4, rel=1e-6)


def test_roi_align_paddle_backward_uses_clamped_box(ref):
    """Paddle's backward clamps the size to >= 1 even when aligned, so for a narrow aligned
    box it is not the gradient of Paddle's forward (torchvision's is)."""
    rs = np.random.RandomState(8)
    x = rs.randn(1, 1, 5, 5)
    boxes = np.array([[1.0, 1.0, 1.5, 3.5]])                  # width 0.5 < 1
    w = rs.randn(1, 1, 2, 2)
    for name, consistent in (("torchvision", True), ("paddle", False)):
        rules = ROI_ALIGN[name]
        dx = ref.roi_align_backward(w, boxes, [0], x.shape, (2, 2), 1.0, 2, True, rules)
        num = ref.numeric_grad(
            lambda z: np.sum(ref.roi_align(z, boxes, [0], (2, 2), 1.0, 2, True, rules) * w), x)
        assert np.allclose(dx, num, atol=1e-7) == consistent


def _random_align_case(rs):
    x = rs.randn(2, 2, 6, 7)
    boxes = np.array([[0.3, 0.6, 5.2, 4.9], [6.5, 1.0, 2.0, 3.0], [-2.0, -1.5, 9.0, 8.5],
                      [2.2, 2.2, 3.9, 4.4]], np.float64)
    batch = np.array([1, 0, 0, 1])
    return x, boxes, batch


@pytest.mark.parametrize("name", sorted(ROI_ALIGN))
@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
def test_roi_align_adjoint_identity(ref, name, aligned, sampling_ratio):
    rs = np.random.RandomState(31)
    x, boxes, batch = _random_align_case(rs)
    if aligned:
        boxes = boxes[[0, 2, 3]]          # no reversed box: aligned sizes < 1 differ by design
        batch = batch[[0, 2, 3]]
    rules = ROI_ALIGN[name]
    dy = rs.randn(len(boxes), 2, 2, 3)
    y = ref.roi_align(x, boxes, batch, (2, 3), 0.8, sampling_ratio, aligned, rules)
    dx = ref.roi_align_backward(dy, boxes, batch, x.shape, (2, 3), 0.8, sampling_ratio,
                                aligned, rules)
    assert np.sum(y * dy) == pytest.approx(np.sum(x * dx), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", ["mxnet", "paddle"])
def test_roi_align_grad_matches_finite_difference(ref, name):
    rs = np.random.RandomState(32)
    x, boxes, batch = _random_align_case(rs)
    rules = ROI_ALIGN[name]
    w = rs.randn(4, 2, 2, 2)
    dx = ref.roi_align_backward(w, boxes, batch, x.shape, (2, 2), 0.8, -1, False, rules)
    num = ref.numeric_grad(
        lambda z: np.sum(ref.roi_align(z, boxes, batch, (2, 2), 0.8, -1, False, rules) * w), x)
    np.testing.assert_allclose(dx, num, atol=1e-7)


# =============================================================================================
# numeric_grad itself
# =============================================================================================

def test_numeric_grad_on_a_quadratic(ref):
    a = np.array([[1.0, -2.0], [0.5, 3.0]])
    x = np.array([[0.3, -0.1], [2.0, 1.5]], np.float32)
    g = ref.numeric_grad(lambda z: np.sum(a * z * z), x)
    assert g.dtype == np.float64
    np.testing.assert_allclose(g, 2 * a * x.astype(np.float64), atol=1e-8)
