"""roicore.adapters.mxnet against MXNet 1.9.1's own CPU operators, bit for bit.

Every parity case runs the adapter and the native op (``mx.nd.ROIPooling``,
``mx.nd.contrib.PSROIPooling``, ``mx.nd.contrib.ROIAlign``) on the same NDArrays and
requires identical outputs, identical gradients through ``mx.autograd`` for a random head
gradient (and a zero rois gradient in both), and for ROIPooling a native hidden ``maxidx``
equal to roicore's global argmax.  Inputs MXNet mishandles are never sent to it in-process:
ROIAlign with ``aligned=True`` and a box of size <= 0 aborts the process (CHECK failure),
and a negative batch index makes it write into another RoI's output; roicore's defined
behaviour for those is tested on the adapter alone.
"""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import weakref

import numpy as np
import pytest

from conftest import framework

try:
    import roicore.adapters.mxnet as mxa  # sets the NumPy aliases mxnet 1.9.1 needs
except ImportError:
    framework("mxnet", "MXNet 1.9.1 is not installed")  # skip locally, error in CI
    raise
mx = framework("mxnet", "MXNet 1.9.1 is not installed")

import roicore.core as core  # noqa: E402

DTYPES = [np.float32, np.float64]


# ------------------------------------------------------------------------------ cases
# A case: dict(op=, x=(N,C,H,W) array, rois=(R,5), and the op's keyword arguments).
def _roi(x, rois, pooled_size, spatial_scale):
    return dict(op="ROIPooling", x=x, rois=np.asarray(rois, np.float64),
                kw=dict(pooled_size=tuple(pooled_size), spatial_scale=spatial_scale))


def _ps(x, rois, spatial_scale, output_dim, pooled_size, group_size=0):
    return dict(op="PSROIPooling", x=x, rois=np.asarray(rois, np.float64),
                kw=dict(spatial_scale=spatial_scale, output_dim=output_dim,
                        pooled_size=pooled_size, group_size=group_size))


def _align(x, rois, pooled_size, spatial_scale, sample_ratio, aligned):
    return dict(op="ROIAlign", x=x, rois=np.asarray(rois, np.float64),
                kw=dict(pooled_size=tuple(pooled_size), spatial_scale=spatial_scale,
                        sample_ratio=sample_ratio, aligned=aligned))


def _arange(*shape):
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape)


def _random_boxes(rng, R, N, H, W, scale, outside=True):
    """Image-pixel boxes of many sizes; with ``outside`` some leave the map or are reversed."""
    img_h, img_w = H / scale, W / scale
    lo = -0.3 if outside else 0.0
    hi = 1.3 if outside else 1.0
    x1 = rng.uniform(lo * img_w, hi * img_w, R)
    y1 = rng.uniform(lo * img_h, hi * img_h, R)
    w = rng.uniform(-0.1 if outside else 0.05, 0.8, R) * img_w
    h = rng.uniform(-0.1 if outside else 0.05, 0.8, R) * img_h
    b = rng.integers(0, N, R)
    return np.stack([b, x1, y1, x1 + w, y1 + h], 1)


def _docstring_cases():
    x = _arange(1, 1, 8, 6)
    return [_roi(x, [[0, 0, 0, 4, 4]], (2, 2), 1.0), _roi(x, [[0, 0, 0, 4, 4]], (2, 2), 0.7)]


def _oracle_cases():
    x86 = _arange(1, 1, 8, 6)
    rois_a = [[0, 0, 0, 4, 4], [0, .5, 1.5, 3.7, 6.2]]
    rnd = np.random.RandomState(0).randn(2, 3, 10, 12)
    return [
        _ps(_arange(1, 8, 6, 6), [[0, 0, 0, 3, 3], [0, 1, 1, 5, 4]], 1.0, 2, 2, 2),
        _align(x86, rois_a, (2, 2), 1.0, 2, False),
        _align(x86, rois_a, (2, 2), 1.0, 2, True),
        _roi(rnd, [[0, 1.3, 2.2, 7.9, 8.4], [1, 0, 0, 11, 9], [1, 5.5, 3.1, 6.0, 3.2]],
             (3, 2), 0.8),
    ]


def _hard_cases():
    rng = np.random.default_rng(57)
    big = rng.standard_normal((2, 3, 60, 61))
    halves16 = [[0, 16 * 2.5, 16 * 0.5, 16 * 10.5, 16 * 7.5], [1, 16 * 1.5, 16 * 3.5, 16 * 4.5,
                                                                 16 * 12.5]]
    halves2 = [[0, 2 * 2.5, 2 * 0.5, 2 * 20.5, 2 * 17.5], [1, 2 * 3.5, 2 * 5.5, 2 * 6.5, 2 * 9.5]]
    outside = [[0, -10, -5, 20, 30], [1, 50, 40, 90, 95], [0, 100, 100, 120, 130],
               [1, -40, -40, -5, -3], [0, -3, -2, 200, 300]]
    reversed_ = [[0, 20, 20, 5, 5], [1, 30, 10, 30, 10], [0, 7.5, 3, 2.2, 40]]
    ps_x = rng.standard_normal((2, 2 * 9, 40, 44))       # D=2, G=3
    ps_x7 = rng.standard_normal((1, 3 * 49, 30, 30))     # D=3, G=7
    cases = [
        # P=7 with RoI heights 57 and 29: float bins floor(p*rh/P) go off by one in float32
        # (57) and float64 (29); MXNet bins in the input dtype.
        _roi(big, [[0, 0, 0, 56, 56], [0, 1, 1, 29, 29]], (7, 7), 1.0),
        _roi(big, outside, (7, 7), 1.0),
        _roi(big, reversed_, (3, 4), 1.0),
        _roi(big, halves16, (4, 3), 1 / 16),
        _roi(big, halves2, (5, 5), 0.5),
        _roi(big, (np.array(outside) * [1, 10, 10, 10, 10]).tolist(), (2, 3), 0.7),
        _ps(ps_x, [[0, 0, 0, 56, 56], [1, 1, 1, 29, 29]] + outside + reversed_, 1.0, 2, 3),
        _ps(ps_x, outside + halves2, 0.5, 2, 5, 3),     # group_size 3 != pooled_size 5
        _ps(ps_x, outside + halves16, 1 / 16, 2, 2, 3),  # group_size 3 != pooled_size 2
        _ps(ps_x7, [[0, 0, 0, 56, 56], [0, 1, 1, 29, 29], [0, 100, 50, 300, 400]], 0.7, 3, 7),
        _ps(ps_x7[:, :3 * 4], [[0, 3.5, 2.5, 20.5, 25.5]], 1.0, 3, 7, 2),
    ]
    for aligned in (False, True):
        for ratio in (-1, 2):
            boxes = outside + halves2 + [[0, 0, 0, 56, 56], [1, 1, 1, 29, 29]]
            if not aligned:
                boxes = boxes + reversed_ + [[0, 5, 5, 5, 5]]
            cases += [_align(big, boxes, (7, 7), 1.0, ratio, aligned),
                      _align(big, halves16 + [[0, 0, 0, 600, 700]], (3, 2), 1 / 16, ratio, aligned),
                      _align(big, boxes, (2, 3), 0.7, ratio, aligned)]
    return cases


def _random_cases(n=12):
    cases = []
    for seed in range(n):
        rng = np.random.default_rng(1000 + seed)
        N, H, W = int(rng.integers(1, 3)), int(rng.integers(1, 30)), int(rng.integers(1, 30))
        scale = float(rng.choice([1.0, 0.5, 0.7, 1 / 16, 0.0625 * 3]))
        PH, PW = int(rng.integers(1, 8)), int(rng.integers(1, 8))
        R = int(rng.integers(1, 9))
        op = ("ROIPooling", "PSROIPooling", "ROIAlign")[seed % 3]
        if op == "ROIPooling":
            x = rng.standard_normal((N, int(rng.integers(1, 5)), H, W))
            cases.append(_roi(x, _random_boxes(rng, R, N, H, W, scale), (PH, PW), scale))
        elif op == "PSROIPooling":
            G, D = int(rng.integers(1, 5)), int(rng.integers(1, 4))
            x = rng.standard_normal((N, D * G * G, H, W))
            cases.append(_ps(x, _random_boxes(rng, R, N, H, W, scale), scale, D, PH,
                             int(rng.choice([0, G])) if G == PH else G))
        else:
            aligned = bool(seed % 2)
            boxes = _random_boxes(rng, R, N, H, W, scale, outside=not aligned)
            x = rng.standard_normal((N, int(rng.integers(1, 5)), H, W))
            cases.append(_align(x, boxes, (PH, PW), scale, int(rng.choice([-1, 0, 1, 2, 3])),
                                aligned))
    return cases


GROUPS = {"docstring": _docstring_cases, "oracles": _oracle_cases, "hard": _hard_cases,
          "random": _random_cases}


def _all_cases():
    return [(g, i, c) for g, make in GROUPS.items() for i, c in enumerate(make())]


def _case_id(g, i, c):
    return f"{g}-{i}-{c['op']}"


CASES = _all_cases()


# ------------------------------------------------------------------------------ runners
NATIVE = {"ROIPooling": lambda: mx.nd.ROIPooling,
          "PSROIPooling": lambda: mx.nd.contrib.PSROIPooling,
          "ROIAlign": lambda: mx.nd.contrib.ROIAlign}


def _safe_for_native(case):
    """The MXNet-crashing inputs (see module docstring) must never reach the native op."""
    r, s = case["rois"], case["kw"]["spatial_scale"]
    assert np.all(r[:, 0] >= 0) and np.all(r[:, 0] < case["x"].shape[0])
    if case["op"] == "ROIAlign" and case["kw"]["aligned"]:
        assert np.all((r[:, 3] - r[:, 1]) * s > 0) and np.all((r[:, 4] - r[:, 2]) * s > 0)


def run(fn, case, dtype, dy=None, **extra):
    """Forward (and backward for head gradient ``dy``) through ``fn``; NumPy results."""
    x = mx.nd.array(case["x"], dtype=dtype)
    rois = mx.nd.array(case["rois"], dtype=dtype)
    if dy is None:
        return fn(x, rois, **case["kw"], **extra).asnumpy(), None, None
    x.attach_grad()
    rois.attach_grad()
    with mx.autograd.record():
        y = fn(x, rois, **case["kw"], **extra)
    y.backward(mx.nd.array(dy, dtype=dtype))
    return y.asnumpy(), x.grad.asnumpy(), rois.grad.asnumpy()


def native(case, dtype, dy=None):
    _safe_for_native(case)
    return run(NATIVE[case["op"]](), case, dtype, dy)


def adapter(case, dtype, dy=None, **extra):
    return run(getattr(mxa, case["op"]), case, dtype, dy, **extra)


def native_maxidx(case, dtype):
    _safe_for_native(case)
    x = mx.nd.array(case["x"], dtype=dtype)
    rois = mx.nd.array(case["rois"], dtype=dtype)
    shape = (len(case["rois"]), x.shape[1]) + case["kw"]["pooled_size"]
    y, idx = mx.nd.empty(shape, dtype=dtype), mx.nd.empty(shape, dtype="int32")
    mx.nd.ROIPooling(x, rois, **case["kw"], out=[y, idx])
    return idx.asnumpy()


def head_gradient(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_identical(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    mismatch = actual != expected
    assert not mismatch.any(), (f"{int(mismatch.sum())} of {mismatch.size} differ, max abs diff "
                                f"{np.abs(actual.astype(np.float64) - expected).max()}")


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("group,i,case", CASES, ids=[_case_id(*c) for c in CASES])
def test_forward_and_gradient_match_native(group, i, case, dtype):
    y_nat, _, _ = native(case, dtype)
    dy = head_gradient(y_nat.shape, dtype, seed=i)
    y_nat, dx_nat, drois_nat = native(case, dtype, dy)
    y, dx, drois = adapter(case, dtype, dy)
    assert_identical(y, y_nat)
    assert_identical(dx, dx_nat)
    assert_identical(drois, drois_nat)
    assert not drois.any()


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("group,i,case", [c for c in CASES if c[2]["op"] == "ROIPooling"],
                         ids=[_case_id(*c) for c in CASES if c[2]["op"] == "ROIPooling"])
def test_roi_pooling_argmax_is_native_maxidx(group, i, case, dtype):
    expected = native_maxidx(case, dtype)
    _, argmax = core.roi_pool(case["x"].astype(dtype), case["rois"].astype(dtype),
                              case["kw"]["pooled_size"], case["kw"]["spatial_scale"],
                              convention="mxnet", return_argmax=True)
    assert_identical(argmax, expected)
    # and the adapter's own hidden output, reached as in MXNet: out=[output, maxidx]
    shape = expected.shape
    y, idx = mx.nd.empty(shape, dtype=dtype), mx.nd.empty(shape, dtype="int32")
    mxa.ROIPooling(mx.nd.array(case["x"], dtype=dtype), mx.nd.array(case["rois"], dtype=dtype),
                   **case["kw"], out=[y, idx])
    assert_identical(idx.asnumpy(), expected)


def test_case_groups_cover_the_brief():
    ops = {(g, c["op"]) for g, _, c in CASES}
    assert {("hard", op) for op in NATIVE} <= ops and {("random", op) for op in NATIVE} <= ops
    align = {(c["kw"]["aligned"], c["kw"]["sample_ratio"]) for _, _, c in CASES
             if c["op"] == "ROIAlign"}
    assert {(False, -1), (False, 2), (True, -1), (True, 2)} <= align
    assert any(c["op"] == "PSROIPooling"
               and c["kw"]["group_size"] not in (0, c["kw"]["pooled_size"]) for _, _, c in CASES)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_documented_values(dtype):
    doc = _docstring_cases()
    assert adapter(doc[0], dtype)[0][0, 0].tolist() == [[14, 16], [26, 28]]
    assert adapter(doc[1], dtype)[0][0, 0].tolist() == [[7, 9], [19, 21]]
    ps, al, al_aligned, rnd = _oracle_cases()
    np.testing.assert_array_equal(adapter(ps, dtype)[0], [
        [[[3.5, 41.5], [87.5, 125.5]], [[147.5, 185.5], [231.5, 269.5]]],
        [[[11, 49], [95, 133]], [[155, 193], [239, 277]]]])
    tol = dict(rtol=1e-6 if dtype == np.float32 else 1e-12)
    y = adapter(al, dtype)[0]
    np.testing.assert_allclose(y[:, 0], [[[7, 9], [19, 21]], [[17.35, 18.95], [31.45, 33.05]]],
                               **tol)
    y = adapter(al_aligned, dtype)[0]
    np.testing.assert_allclose(y[:, 0], [[[3.5, 5.5], [15.5, 17.5]],
                                         [[13.85, 15.45], [27.95, 29.55]]], **tol)
    y = adapter(rnd, dtype)[0]
    assert y.shape == (3, 3, 3, 2)
    np.testing.assert_allclose(y.sum(), 57.645447, rtol=1e-6)


# ------------------------------------------------------------------------------ symbolic
def _sym_result(case, dtype, dy):
    data, rois = mx.sym.var("data"), mx.sym.var("rois")
    out = getattr(mxa, case["op"])(data, rois, **case["kw"])
    assert len(out.list_outputs()) == 1
    x = mx.nd.array(case["x"], dtype=dtype)
    r = mx.nd.array(case["rois"], dtype=dtype)
    grads = {"data": mx.nd.zeros(x.shape, dtype=dtype), "rois": mx.nd.ones(r.shape, dtype=dtype)}
    ex = out.bind(mx.cpu(), {"data": x, "rois": r}, args_grad=grads)
    y = ex.forward(is_train=True)[0].asnumpy()
    ex.backward([mx.nd.array(dy, dtype=dtype)])
    return y, grads["data"].asnumpy(), grads["rois"].asnumpy()


SYM_CASES = [c for c in CASES if c[0] in ("docstring", "hard")][::3]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("group,i,case", SYM_CASES, ids=[_case_id(*c) for c in SYM_CASES])
def test_symbol_graph_equals_imperative(group, i, case, dtype):
    y_imp, _, _ = adapter(case, dtype)
    dy = head_gradient(y_imp.shape, dtype, seed=i)
    y_imp, dx_imp, _ = adapter(case, dtype, dy)
    y, dx, drois = _sym_result(case, dtype, dy)
    assert_identical(y, y_imp)
    assert_identical(dx, dx_imp)
    assert not drois.any()


def test_symbol_grad_req_add_accumulates():
    case = _hard_cases()[0]
    data, rois = mx.sym.var("data"), mx.sym.var("rois")
    out = mxa.ROIPooling(data, rois, **case["kw"])
    x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
    g = mx.nd.ones(x.shape)
    ex = out.bind(mx.cpu(), {"data": x, "rois": r}, args_grad={"data": g},
                  grad_req={"data": "add", "rois": "null"})
    y = ex.forward(is_train=True)[0]
    dy = head_gradient(y.shape, np.float32)
    ex.backward([mx.nd.array(dy)])
    _, dx, _ = adapter(case, np.float32, dy)
    assert_identical(g.asnumpy(), (dx + np.float32(1)).astype(np.float32))


class _Head(mx.gluon.HybridBlock):
    """x*2 -> RoI op -> relu: the op between two native layers."""

    def __init__(self, op, kw):
        super().__init__()
        self._op, self._kw = op, kw

    def hybrid_forward(self, F, x, rois):
        return F.relu(getattr(mxa, self._op)(x * 2, rois, **self._kw))


HYBRID_CASES = [c for c in CASES if c[0] == "hard"][::4]


@pytest.mark.parametrize("group,i,case", HYBRID_CASES, ids=[_case_id(*c) for c in HYBRID_CASES])
def test_hybridized_block_equals_imperative(group, i, case):
    results = []
    for hybridize in (False, True):
        net = _Head(case["op"], case["kw"])
        if hybridize:
            net.hybridize()
        x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
        x.attach_grad()
        for _ in range(2):  # the second call runs the cached graph
            with mx.autograd.record():
                y = net(x, r)
            dy = head_gradient(y.shape, np.float32, seed=i)
            y.backward(mx.nd.array(dy))
        results.append((y.asnumpy(), x.grad.asnumpy()))
    (y0, dx0), (y1, dx1) = results
    assert_identical(y1, y0)
    assert_identical(dx1, dx0)
    assert dx0.any()


# ------------------------------------------------------------------------------ behaviour
def test_aligned_zero_size_box_is_zero_not_sent_to_native():
    """MXNet aborts the process here (CHECK_GT(roi_width, 0)); roicore defines 0 output and
    0 gradient.  Only the adapter runs."""
    case = _align(_arange(1, 2, 8, 6) + 1, [[0, 3, 3, 3, 3], [0, 4, 4, 2, 2], [0, 0, 0, 4, 4]],
                  (2, 2), 1.0, -1, True)
    dy = np.ones((3, 2, 2, 2), np.float32)
    y, dx, _ = adapter(case, np.float32, dy)
    assert not y[:2].any() and y[2].all()
    expected = core.roi_align_backward(dy[2:], case["rois"][2:], (1, 2, 8, 6), 1.0, -1, True)
    assert_identical(dx, expected)


def test_negative_batch_index_raises():
    """MXNet ROIAlign writes garbage for it (and ROIPooling returns 0); roicore raises."""
    x = mx.nd.array(_arange(2, 1, 8, 6))
    bad = mx.nd.array([[0, 0, 0, 4, 4], [-1, 0, 0, 4, 4]])
    for fn, kw in [(mxa.ROIAlign, dict(pooled_size=(2, 2), spatial_scale=1.0)),
                   (mxa.ROIPooling, dict(pooled_size=(2, 2), spatial_scale=1.0)),
                   (mxa.PSROIPooling, dict(spatial_scale=1.0, output_dim=1, pooled_size=1))]:
        with pytest.raises(ValueError, match=r"\[1\] = -1 is out of range"):
            fn(x, bad, **kw)
    with pytest.raises(ValueError, match="out of range"):
        mxa.ROIPooling(x, mx.nd.array([[2, 0, 0, 4, 4]]), (2, 2), 1.0)


@pytest.mark.parametrize("scale", [1.5, -0.1, 16.0])
def test_spatial_scale_above_mxnet_bound_raises(scale):
    x, r = mx.nd.ones((1, 1, 4, 4)), mx.nd.array([[0, 0, 0, 2, 2]])
    for call in (lambda: mxa.ROIPooling(x, r, (2, 2), scale),
                 lambda: mxa.PSROIPooling(x, r, scale, 1, 1),
                 lambda: mxa.ROIAlign(x, r, (2, 2), scale),
                 lambda: mxa.ROIAlign(mx.sym.var("x"), mx.sym.var("r"), (2, 2), scale)):
        with pytest.raises(ValueError, match=r"exceeds bound \[0, 1\]"):
            call()
    with pytest.raises(mx.base.MXNetError, match="exceed bound"):  # what is mirrored
        mx.nd.ROIPooling(x, r, (2, 2), scale)


def test_spatial_scale_zero_is_rejected():
    """MXNet accepts 0 (every box collapses to pixel (0, 0)); roicore.core requires > 0."""
    x, r = mx.nd.ones((1, 1, 4, 4)), mx.nd.array([[0, 0, 0, 2, 2]])
    with pytest.raises(ValueError, match="positive"):
        mxa.ROIPooling(x, r, (2, 2), 0.0)
    with pytest.raises(TypeError, match="real number"):
        mxa.ROIPooling(x, r, (2, 2), "0.5")


@pytest.mark.parametrize("shape", [(3, 4), (3, 6), (5,), (1, 3, 5)])
def test_rois_must_be_r_by_5(shape):
    x = mx.nd.ones((1, 1, 4, 4))
    with pytest.raises(ValueError, match=r"rois must have shape \(R, 5\)"):
        mxa.ROIPooling(x, mx.nd.zeros(shape), (2, 2), 1.0)
    with pytest.raises(mx.base.MXNetError):  # the native op refuses them too
        mx.nd.ROIPooling(x, mx.nd.zeros(shape), (2, 2), 1.0).wait_to_read()


def test_symbol_rois_shape_checked_at_bind():
    out = mxa.ROIAlign(mx.sym.var("data"), mx.sym.var("rois"), (2, 2), 1.0)
    with pytest.raises(mx.base.MXNetError):  # MXNet prints our ValueError, raises its own
        out.infer_shape(data=(1, 1, 4, 4), rois=(3, 4))


def test_position_sensitive_roi_align_is_not_implemented():
    x, r = mx.nd.ones((1, 4, 4, 4)), mx.nd.array([[0, 0, 0, 2, 2]])
    with pytest.raises(NotImplementedError, match="position_sensitive"):
        mxa.ROIAlign(x, r, (2, 2), 1.0, position_sensitive=True)


def test_psroi_channel_count_checked():
    x, r = mx.nd.ones((1, 7, 4, 4)), mx.nd.array([[0, 0, 0, 2, 2]])
    with pytest.raises(ValueError, match="channels"):
        mxa.PSROIPooling(x, r, 1.0, output_dim=2, pooled_size=2)


def test_inputs_must_be_ndarrays_or_symbols():
    with pytest.raises(TypeError, match="NDArray"):
        mxa.ROIPooling(np.ones((1, 1, 4, 4), np.float32), mx.nd.array([[0, 0, 0, 2, 2]]), (2, 2),
                       1.0)


def test_native_keywords_and_positional_order():
    """A call swaps by changing the import: same positional order, same keyword names."""
    case = _hard_cases()[0]
    x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
    pairs = [
        (mxa.ROIPooling(x, r, (7, 7), 0.5), mx.nd.ROIPooling(x, r, (7, 7), 0.5)),
        (mxa.ROIPooling(data=x, rois=r, pooled_size=(3, 2), spatial_scale=0.5, name="p"),
         mx.nd.ROIPooling(data=x, rois=r, pooled_size=(3, 2), spatial_scale=0.5, name="p")),
        (mxa.ROIAlign(x, r, (3, 2), 0.5, 2, False, True),
         mx.nd.contrib.ROIAlign(x, r, (3, 2), 0.5, 2, False, True)),
    ]
    xp = mx.nd.array(np.random.default_rng(3).standard_normal((2, 8, 9, 9)))
    rp = mx.nd.array([[0, 1, 2, 7, 8], [1, 0, 0, 5, 3]])
    pairs += [(mxa.PSROIPooling(xp, rp, 1.0, 2, 3, 2),
               mx.nd.contrib.PSROIPooling(xp, rp, 1.0, 2, 3, 2)),
              (mxa.PSROIPooling(data=xp, rois=rp, spatial_scale=1.0, output_dim=2, pooled_size=2),
               mx.nd.contrib.PSROIPooling(data=xp, rois=rp, spatial_scale=1.0, output_dim=2,
                                          pooled_size=2))]
    for ours, theirs in pairs:
        assert_identical(ours.asnumpy(), theirs.asnumpy())


def test_out_argument():
    case = _docstring_cases()[0]
    x, r = mx.nd.array(case["x"], dtype="float32"), mx.nd.array(case["rois"], dtype="float32")
    y = mx.nd.zeros((1, 1, 2, 2))
    assert mxa.ROIPooling(x, r, (2, 2), 1.0, out=y) is y
    assert y.asnumpy()[0, 0].tolist() == [[14, 16], [26, 28]]
    x.attach_grad()
    with mx.autograd.record(), pytest.raises(ValueError, match="out="):
        mxa.ROIPooling(x, r, (2, 2), 1.0, out=y)


_CORE_NAME = {"ROIPooling": "roi_pool", "PSROIPooling": "psroi_pool", "ROIAlign": "roi_align"}
_ONE_PER_OP = [next(c for c in CASES if c[0] == "hard" and c[2]["op"] == op) for op in NATIVE]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("group,i,case", _ONE_PER_OP, ids=[_case_id(*c) for c in _ONE_PER_OP])
def test_unrecorded_call_skips_argmax_and_matches_recorded(group, i, case, dtype, spy_core):
    """Outside autograd.record() the core is called directly, ROIPooling computes no argmax,
    and the output is the recorded path's (and MXNet's); a recorded call afterwards still
    gives MXNet's gradient."""
    calls = spy_core(_CORE_NAME[case["op"]])
    y, _, _ = adapter(case, dtype)
    assert len(calls) == 1 and not calls[0].kwargs.get("return_argmax", False)
    y_nat, _, _ = native(case, dtype)
    assert_identical(y, y_nat)
    dy = head_gradient(y.shape, dtype, seed=i)
    y_rec, dx, _ = adapter(case, dtype, dy)
    assert calls[1].kwargs.get("return_argmax", False) == (case["op"] == "ROIPooling")
    assert_identical(y_rec, y)
    assert_identical(dx, native(case, dtype, dy)[1])


@pytest.mark.parametrize("group,i,case", _ONE_PER_OP, ids=[_case_id(*c) for c in _ONE_PER_OP])
def test_out_is_written_in_place(group, i, case, spy_core):
    """out= of data's dtype on the CPU receives the core's result directly (its buffer is the
    core's out=); another dtype is filled by a copy, as before."""
    calls = spy_core(_CORE_NAME[case["op"]])
    x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
    expected = native(case, np.float32)[0]
    y = mx.nd.zeros(expected.shape)
    assert getattr(mxa, case["op"])(x, r, **case["kw"], out=y) is y
    given = calls[-1].kwargs["out"]
    assert given is not None and given.ctypes.data == mxa._as_numpy(y).ctypes.data
    assert_identical(y.asnumpy(), expected)
    y64 = mx.nd.zeros(expected.shape, dtype="float64")
    getattr(mxa, case["op"])(x, r, **case["kw"], out=y64)
    assert calls[-1].kwargs["out"] is None
    assert_identical(y64.asnumpy(), expected.astype(np.float64))


def test_symbol_forward_writes_into_the_executor_buffer(spy_core):
    """The CustomOp computes straight into the output buffer MXNet bound (req="write"),
    and still fills maxidx for the backward."""
    case = _hard_cases()[0]
    calls = spy_core("roi_pool")
    data, rois = mx.sym.var("data"), mx.sym.var("rois")
    out = mxa.ROIPooling(data, rois, **case["kw"])
    x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
    grads = {"data": mx.nd.zeros(x.shape), "rois": mx.nd.zeros(r.shape)}
    ex = out.bind(mx.cpu(), {"data": x, "rois": r}, args_grad=grads)
    for is_train in (False, True):
        y = ex.forward(is_train=is_train)[0]
        y_np = y.asnumpy()
        _, kw, res = calls[-1]
        assert kw["out"] is not None and kw["return_argmax"]
        assert_identical(y_np, native(case, np.float32)[0])
    dy = head_gradient(y_np.shape, np.float32)
    ex.backward([mx.nd.array(dy)])
    assert_identical(grads["data"].asnumpy(), native(case, np.float32, dy)[1])


@pytest.mark.parametrize("n_threads", [1, 2, None])
def test_n_threads_does_not_change_results(n_threads):
    case = _hard_cases()[-1]
    dy = head_gradient((len(case["rois"]), 3, 2, 3), np.float32)
    y, dx, _ = adapter(case, np.float32, dy, n_threads=n_threads)
    y_nat, dx_nat, _ = native(case, np.float32, dy)
    assert_identical(y, y_nat)
    assert_identical(dx, dx_nat)


def test_default_threads_are_not_mxnets_main_thread_setting():
    """Importing mxnet sets the main thread's OpenMP count to 1; n_threads=None keeps
    roicore's default as a fresh thread sees it (OMP_NUM_THREADS, else all CPUs)."""
    seen = []
    worker = threading.Thread(target=lambda: seen.append(core.effective_n_threads(None)))
    worker.start()
    worker.join()
    assert mxa._DEFAULT_N_THREADS == seen[0]
    with pytest.raises(ValueError, match="n_threads"):
        mxa.ROIPooling(mx.nd.ones((1, 1, 4, 4)), mx.nd.array([[0, 0, 0, 2, 2]]), (2, 2), 1.0,
                       n_threads=0)


def test_float16_is_computed_in_float32():
    case = _hard_cases()[0]
    y = adapter(case, np.float16)[0]
    assert y.dtype == np.float16
    expected = core.roi_pool(case["x"].astype(np.float16), case["rois"].astype(np.float16),
                             (7, 7), 1.0, convention="mxnet")
    assert_identical(y, expected)


def test_zero_copy_output_feeds_native_layers():
    """Outputs share the core's NumPy buffer (DLPack); MXNet/oneDNN layers must read them
    like any NDArray."""
    case = _hard_cases()[0]
    x, r = mx.nd.array(case["x"]), mx.nd.array(case["rois"])
    y = mxa.ROIPooling(x, r, (7, 7), 1.0)
    y_copy = y.copy()
    w = mx.nd.array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32))

    def conv(t):
        return mx.nd.Convolution(t, w, kernel=(3, 3), num_filter=4, no_bias=True)

    assert_identical(conv(y).asnumpy(), conv(y_copy).asnumpy())
    w_fc = mx.nd.array(np.random.default_rng(1).standard_normal((4, 3 * 7 * 7)).astype(np.float32))

    def fc(t):
        return mx.nd.FullyConnected(t, w_fc, num_hidden=4, no_bias=True)

    assert_identical(fc(y).asnumpy(), fc(y_copy).asnumpy())


def test_backward_releases_the_argmax_and_a_retained_graph_recomputes_it(monkeypatch):
    """MXNet keeps a recorded Function in a reference cycle until the cyclic collector
    runs; the argmax (as large as the output) must go with the backward, not with it, and
    a second backward through the retained graph must give the same gradient."""
    released = []
    forward = mxa._OPS["ROIPooling"][0]

    def spy(*args, **kwargs):
        outputs = forward(*args, **kwargs)
        if len(outputs) > 1:
            weakref.finalize(outputs[1], released.append, True)
        return outputs
    monkeypatch.setitem(mxa._OPS, "ROIPooling", (spy, mxa._OPS["ROIPooling"][1]))
    rng = np.random.default_rng(4)
    x = mx.nd.array(rng.standard_normal((1, 3, 12, 10)).astype(np.float32))
    x.attach_grad()
    rois = mx.nd.array([[0, 0, 0, 100, 90], [0, 20, 30, 60, 150]])
    dy = mx.nd.array(rng.standard_normal((2, 3, 2, 2)).astype(np.float32))
    gc.disable()
    try:
        with mx.autograd.record():
            y = mxa.ROIPooling(x, rois, pooled_size=(2, 2), spatial_scale=1 / 16)
        y.backward(dy, retain_graph=True)
        first = x.grad.asnumpy()
        mx.nd.waitall()
        assert released == [True]  # before any collection
        y.backward(dy)
        assert_identical(x.grad.asnumpy(), first)
    finally:
        gc.enable()
    ref = mx.nd.ROIPooling(x, rois, pooled_size=(2, 2), spatial_scale=1 / 16)
    assert_identical(y.asnumpy(), ref.asnumpy())


@pytest.mark.parametrize("op, kw", [
    ("PSROIPooling", dict(spatial_scale=1 / 16, output_dim=2, pooled_size=2)),
    ("ROIAlign", dict(pooled_size=(2, 2), spatial_scale=1 / 16))])
def test_ops_without_argmax_run_their_forward_once_for_a_retained_graph(monkeypatch, op, kw):
    """Only ROIPooling's backward has an argmax to release and recompute."""
    forwards = []
    forward, backward = mxa._OPS[op]

    def spy(*args, **kwargs):
        forwards.append(op)
        return forward(*args, **kwargs)
    monkeypatch.setitem(mxa._OPS, op, (spy, backward))
    x = mx.nd.array(np.random.default_rng(5).standard_normal((1, 8, 10, 10)).astype(np.float32))
    x.attach_grad()
    rois = mx.nd.array([[0, 0, 0, 100, 90]])
    with mx.autograd.record():
        y = getattr(mxa, op)(x, rois, **kw)
    y.backward(mx.nd.ones_like(y), retain_graph=True)
    first = x.grad.asnumpy()
    y.backward(mx.nd.ones_like(y))
    assert_identical(x.grad.asnumpy(), first)
    assert forwards == [op]


def test_input_views_survive_the_source_ndarray():
    """The NumPy view handed to the core keeps the NDArray's memory alive."""
    x = mx.nd.array(np.arange(48, dtype=np.float32).reshape(1, 1, 8, 6))
    view = mxa._as_numpy(x)
    del x
    mx.nd.waitall()
    assert view.sum() == sum(range(48)) and not view.flags.writeable


_IMPORT_CHECK = textwrap.dedent("""
    import sys, numpy as np
    before = dict(vars(np))
    import roicore.adapters.mxnet as a
    after = vars(np)
    assert "mxnet" in sys.modules
    changed = sorted(k for k in set(before) | set(after) if before.get(k, 0) is not after.get(k, 0)
                     and not isinstance(after.get(k), type(np)))  # submodules np imported
    assert not changed, changed
    try:
        np.bool
    except AttributeError:
        pass
    else:
        assert np.__version__ < "1.24", "np.bool left behind"
    print("ok")
""")


def test_import_leaves_numpy_as_found():
    p = subprocess.run([sys.executable, "-c", _IMPORT_CHECK], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_missing_mxnet_gives_install_hint():
    code = ("import sys; sys.modules['mxnet'] = None\n"
            "try:\n    import roicore.adapters.mxnet\n"
            "except ImportError as e:\n    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'roicore[mxnet]'" in p.stdout, p.stdout + p.stderr[-2000:]
