"""roicore.adapters.mxnet.pyramid_roi_feats against GluonCV's ``_pyramid_roi_feats``, bit for bit.

The oracle is GluonCV's 'align' branch written on ``mx.nd`` in roicore parity's MXNet harness
(GluonCV itself is not a dependency): levels from ``split``, ``log2``, ``sqrt``, ``floor`` and ``clip``, per level
``where`` to replace the other levels' rows by -1, ``contrib.ROIAlign``, and
``ElementWiseSum``.  Outputs and the maps' gradients through ``mx.autograd`` (random head
gradient) must be identical.  MXNet's CPU ROIAlign leaves a row whose batch index is negative
unwritten and writes 0 into element n of its output instead (its GPU kernel writes the row's
0s), so the oracle sends only the other rows to it and gives 0 for those.
"""
from __future__ import annotations

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
STRIDES = (4, 8, 16, 32)
IMAGE = (112, 96)  # (H, W): maps of 28x24, 14x12, 7x6 and 4x3


# ------------------------------------------------------------------------------ oracle
# GluonCV's formula on mx.nd, the one roicore parity compares with (cli/frameworks/mxnet.py)
from roicore.cli.frameworks.mxnet import gluoncv_pyramid_roi_feats as _gluoncv  # noqa: E402


def gluoncv_pyramid_roi_feats(F, features, rpn_rois, roi_size, strides, min_stage, max_stage,
                              roi_canonical_scale=224.0, sampling_ratio=2, eps=1e-6):
    """GluonCV's FasterRCNN._pyramid_roi_feats, roi_mode='align', with its defaults."""
    return _gluoncv(F, features, rpn_rois, roi_size, strides, min_stage, max_stage,
                    roi_canonical_scale, sampling_ratio, eps)


# ------------------------------------------------------------------------------ cases
def _maps(dtype, strides=STRIDES, N=2, C=3, seed=0, image=IMAGE):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((N, C, -(-image[0] // s), -(-image[1] // s))).astype(dtype)
            for s in strides]


def _square(batch, cx, cy, side):
    """A box of GluonCV width and height ``side`` (``x2 - x1 + 1``) centred at (cx, cy)."""
    half = (side - 1) / 2
    return [batch, cx - half, cy - half, cx + half, cy + half]


def _boxes(seed=1, n_random=24):
    """Boxes over all four levels, on their edges (sqrt(w*h) = 112, 224, 448; 223.9998 is
    pushed up by eps) and beyond (1000: level 6, clipped), -1-padded and masked rows,
    reversed and degenerate boxes."""
    rng = np.random.default_rng(seed)
    rows = [_square(b, 50, 40, s) for b, s in [(0, 8), (1, 111.9), (0, 112), (1, 150),
                                                 (0, 223.9998), (1, 224), (0, 300),
                                                 (1, 447.99), (0, 448), (1, 700),
                                                 (0, 1000)]]
    rows += [
        [-1, -1, -1, -1, -1], [-1, -1, -1, -1, -1],  # padded rows, masked
        [1, -1, -1, -1, -1],                        # a padded box of an image: pooled
        [-1, 10, 10, 80, 90],                       # a masked box
        [0, 60, 50, 20, 10],                        # reversed in both axes: positive area
        [1, 60, 10, 20, 70],                        # reversed in x: no level, 0
        [0, 30, 30, 28.5, 60],                      # w = -0.5: no level
        [1, 30, 30, 29, 60],                        # w = 0: lowest level
        [0.5, 5, 6, 70, 90], [-0.5, 3, 4, 40, 30],  # fractional batch: images 0 and 0
    ]
    side = np.exp(rng.uniform(np.log(4), np.log(900), n_random))
    aspect = np.exp(rng.uniform(-0.7, 0.7, n_random))
    cx, cy = rng.uniform(-10, IMAGE[1] + 10, n_random), rng.uniform(-10, IMAGE[0] + 10, n_random)
    w, h = side * aspect, side / aspect
    batch = rng.integers(0, 2, n_random)
    rows += np.stack([batch, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1).tolist()
    return np.array(rows, np.float64)


def head_gradient(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def assert_identical(actual, expected):
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    mismatch = actual != expected
    assert not mismatch.any(), (f"{int(mismatch.sum())} of {mismatch.size} differ, max abs diff "
                                f"{np.abs(actual.astype(np.float64) - expected).max()}")


def _run(fn, maps, rois, dy, grad=None):
    """fn(features, rpn_rois) under autograd: the output and each map's gradient (None for a
    map without one).  ``grad[i]`` False leaves map i without attach_grad."""
    xs = [mx.nd.array(m, dtype=m.dtype) for m in maps]
    for i, x in enumerate(xs):
        if grad is None or grad[i]:
            x.attach_grad()
    r = mx.nd.array(rois, dtype=maps[0].dtype)
    with mx.autograd.record():
        y = fn(xs, r)
    y.backward(mx.nd.array(dy, dtype=dy.dtype))
    return y.asnumpy(), [None if x.grad is None else x.grad.asnumpy() for x in xs]


def _compare(maps, rois, strides=STRIDES, roi_size=(3, 2), grad=None, **kw):
    first = int(np.log2(strides[0]))
    last = first + len(strides) - 1
    oracle = lambda xs, r: gluoncv_pyramid_roi_feats(  # noqa: E731
        mx.nd, xs, r, roi_size, strides, first, last, **kw)
    ours = lambda xs, r: mxa.pyramid_roi_feats(xs, r, roi_size, strides, **kw)  # noqa: E731
    dy = head_gradient((rois.shape[0], maps[0].shape[1]) + roi_size, maps[0].dtype, seed=3)
    y_ref, g_ref = _run(oracle, maps, rois, dy, grad)
    y, g = _run(ours, maps, rois, dy, grad)
    assert_identical(y, y_ref)
    for a, b in zip(g, g_ref):
        assert (a is None) == (b is None)
        if a is not None:
            assert_identical(a, b)
    return y, g


# ------------------------------------------------------------------------------ parity
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_matches_gluoncv_forward_and_gradient(dtype):
    rois = _boxes()
    y, g = _compare(_maps(dtype), rois)
    batch = np.trunc(rois[:, 0]).astype(np.int64)  # MXNet's reading of the batch column
    levels = core.pyramid_levels(rois[:, 1:], [1 / s for s in STRIDES], first_level=2,
                                 batch_indices=batch,
                                 levels="gluoncv", masked=True, dtype=dtype)
    assert set(levels[batch >= 0]) == {-1, 0, 1, 2, 3}  # every level, and none
    assert not y[levels < 0].any()
    assert all(gi.any() for gi in g)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_level_rule_is_gluoncv(dtype):
    """roicore's "gluoncv" level rule gives GluonCV's clipped levels (NaN: no level)."""
    rng = np.random.default_rng(5)
    side = np.concatenate([np.exp(rng.uniform(np.log(0.5), np.log(2000), 2000)),
                           [112, 224, 448, 223.9998, 223.99977, 447.9996, 111.99989]])
    aspect = np.exp(rng.uniform(-1, 1, side.size))
    aspect[-7:] = 1  # squares on the levels' edges
    w, h = side * aspect, side / aspect
    w[:20] *= -1  # reversed: no level
    x1 = rng.uniform(-50, 50, side.size)
    rois = np.stack([np.zeros(side.size), x1, x1, x1 + w - 1, x1 + h - 1], 1).astype(dtype)
    _, a1, b1, a2, b2 = mx.nd.split(mx.nd.array(rois, dtype=dtype), axis=-1, num_outputs=5)
    level = mx.nd.floor(4 + mx.nd.log2(mx.nd.sqrt((a2 - a1 + 1) * (b2 - b1 + 1)) / 224.0 + 1e-6))
    level = mx.nd.squeeze(mx.nd.clip(level, 2, 5)).asnumpy()
    ours = core.pyramid_levels(rois, [1 / s for s in STRIDES], first_level=2, levels="gluoncv",
                               dtype=dtype)
    expected = np.where(np.isnan(level), -1, level - 2)
    assert (ours == expected).all()
    assert set(ours) == {-1, 0, 1, 2, 3}


def test_p6_is_not_pooled_from():
    """Strides 4..64 (GluonCV's FPN: min_stage 2, max_stage 6): levels clip to 5, and the
    stride-64 map is never read and gets no gradient (maps large enough for the level-6 box
    to sample them)."""
    maps = _maps(np.float32, STRIDES + (64,), image=(640, 640))
    _, g = _compare(maps, _boxes(n_random=8), strides=STRIDES + (64,))
    assert not g[4].any()


def test_one_level_left_after_p6_is_dropped():
    """Strides (32, 64): GluonCV's _pyramid_roi_feats pools from level 5 alone, and a box of
    negative area has no level there (0), as with several levels."""
    maps = _maps(np.float32, (32, 64), image=(512, 512))
    rois = np.array([[0, 300, 40, 100, 400], [1, 10, 10, 300, 300]])
    y, _ = _compare(maps, rois, strides=(32, 64))
    assert not y[0].any()


@pytest.mark.parametrize("kw", [dict(sampling_ratio=-1), dict(sampling_ratio=0),
                                dict(roi_canonical_scale=200.0, sampling_ratio=1),
                                dict(eps=1e-8)], ids=["adaptive", "zero", "s0=200", "eps=1e-8"])
def test_other_arguments_match_gluoncv(kw):
    _compare(_maps(np.float32, seed=2), _boxes(seed=3, n_random=12), roi_size=(2, 2), **kw)


def test_map_without_gradient():
    """A map autograd does not track (first of the inputs) leaves the others' gradients
    intact (MXNet's Function stops at the first input that needs no gradient)."""
    _, g = _compare(_maps(np.float32), _boxes(n_random=8), grad=[False, True, False, True])
    assert g[0] is None and g[2] is None


def test_outside_record_and_int_roi_size():
    maps, rois = _maps(np.float32), _boxes(n_random=8)
    xs, r = [mx.nd.array(m) for m in maps], mx.nd.array(rois)
    y = mxa.pyramid_roi_feats(xs, r, 2, STRIDES)
    y_ref = gluoncv_pyramid_roi_feats(mx.nd, xs, r, (2, 2), STRIDES, 2, 5)
    assert isinstance(y, mx.nd.NDArray) and y.context == xs[0].context
    assert_identical(y.asnumpy(), y_ref.asnumpy())
    with mx.autograd.record():
        y_rec = mxa.pyramid_roi_feats(xs, r, 2, STRIDES)
    assert_identical(y_rec.asnumpy(), y.asnumpy())


def test_only_padded_rows():
    xs = [mx.nd.array(m) for m in _maps(np.float32)]
    y = mxa.pyramid_roi_feats(xs, -mx.nd.ones((3, 5)), (2, 2), STRIDES)
    assert y.shape == (3, 3, 2, 2) and not y.asnumpy().any()


def test_exported():
    assert "pyramid_roi_feats" in mxa.__all__
    from roicore.adapters._mxnet_pyramid import pyramid_roi_feats
    assert mxa.pyramid_roi_feats is pyramid_roi_feats


# ------------------------------------------------------------------------------ training
class Detector(mx.gluon.Block):
    """A small FPN detector head: one strided 3x3 convolution per level makes the maps from
    the image, ``pooler(features, rpn_rois)`` pools the proposals, a dense layer scores them."""

    def __init__(self, pooler, C=4, P=3, outputs=5):
        super().__init__()
        self.pooler = pooler
        with self.name_scope():
            self.convs = mx.gluon.nn.Sequential()
            for s in STRIDES:
                self.convs.add(mx.gluon.nn.Conv2D(C, 3, strides=s, padding=1, in_channels=3))
            self.head = mx.gluon.nn.Dense(outputs, in_units=C * P * P)

    def forward(self, images, rois):
        return self.head(self.pooler([conv(images) for conv in self.convs], rois))


def _train(pooler, initial, images, rois, target, steps=3):
    """``steps`` SGD steps of a Detector with ``pooler`` from the ``initial`` weights (in
    parameter order): the loss and every weight after each step, as NumPy."""
    net = Detector(pooler)
    net.cast(initial[0].dtype)
    params = list(net.collect_params().values())
    for p, w in zip(params, initial):
        p.initialize(mx.init.Constant(0), ctx=mx.cpu())
        p.set_data(mx.nd.array(w, dtype=w.dtype))
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    images, rois, target = (mx.nd.array(a, dtype=a.dtype) for a in (images, rois, target))
    out = []
    for _ in range(steps):
        with mx.autograd.record():
            loss = mx.nd.mean(mx.nd.square(net(images, rois) - target))
        loss.backward()
        trainer.step(1)
        out.append((loss.asnumpy(), [p.data().asnumpy() for p in params]))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_training_a_detector_is_bit_identical(dtype):
    """A detector trained with GluonCV's _pyramid_roi_feats (on MXNet's ops) and with
    pyramid_roi_feats in its place, from the same weights, proposals with -1 padded rows:
    the same loss and weights after every step."""
    P, kw = 3, dict(roi_canonical_scale=224.0, sampling_ratio=2, eps=1e-6)
    rng = np.random.default_rng(6)
    images = rng.standard_normal((2, 3) + IMAGE).astype(dtype)
    rois = _boxes(seed=7, n_random=12).astype(dtype)
    target = rng.standard_normal((len(rois), 5)).astype(dtype)
    initial = [rng.normal(0, np.prod(p.shape[1:]) ** -0.5 if len(p.shape) > 1 else 0.1,
                          p.shape).astype(dtype)
               for p in Detector(None).collect_params().values()]

    def native(features, r):
        return gluoncv_pyramid_roi_feats(mx.nd, features, r, (P, P), STRIDES, 2, 5, **kw)

    def ours(features, r):
        return mxa.pyramid_roi_feats(features, r, (P, P), STRIDES, **kw)
    got, expected = _train(ours, initial, images, rois, target), \
        _train(native, initial, images, rois, target)
    for step, ((loss, weights), (loss_ref, weights_ref)) in enumerate(zip(got, expected)):
        assert loss.dtype == dtype
        assert_identical(loss, loss_ref)
        assert len(weights) == len(weights_ref) == len(initial) == 2 * len(STRIDES) + 2
        for w, w_ref, w0 in zip(weights, weights_ref, initial):
            assert_identical(w, w_ref)
            assert not np.array_equal(w, w0)   # every weight is trained
    assert np.isfinite(got[-1][0]).all() and got[-1][0] < got[0][0]


# ------------------------------------------------------------------------------ errors
def _call(features=None, rpn_rois=None, roi_size=(2, 2), strides=STRIDES, **kw):
    features = [mx.nd.array(m) for m in _maps(np.float32)] if features is None else features
    rpn_rois = mx.nd.array([[0, 1, 1, 30, 30]]) if rpn_rois is None else rpn_rois
    return mxa.pyramid_roi_feats(features, rpn_rois, roi_size, strides, **kw)


@pytest.mark.parametrize("kw, error, message", [
    (dict(eps=1e-7), ValueError, r"eps must be 1e-6 .* or 1e-8.*got 1e-07"),
    (dict(eps="1e-6"), TypeError, r"eps must be a real number"),
    (dict(roi_mode="pool"), NotImplementedError, r"roi_mode='pool'"),
    (dict(roi_mode="nearest"), ValueError, r"Invalid roi mode: 'nearest'"),
    (dict(strides=(4, 8, 16)), ValueError, r"strides must have one stride per feature map: 4 "),
    (dict(strides=(6, 12, 24, 48)), ValueError, r"strides\[0\] must be a power of two"),
    (dict(strides=(4, 8, 0, 32)), ValueError, r"strides\[2\] must be positive"),
    (dict(strides=16), TypeError, r"strides must be a sequence of numbers"),
    (dict(features=mx.nd.zeros((2, 3, 8, 8))), TypeError, r"features must be a list"),
    (dict(features=[np.zeros((2, 3, 8, 8))] * 4), TypeError, r"features\[0\] must be an mx"),
    (dict(features=[mx.nd.zeros((2, 3, 8))] * 4), ValueError, r"features\[0\] must be 4-D"),
    (dict(features=[mx.nd.zeros((2, 3, 8, 8))] * 3 + [mx.nd.zeros((2, 4, 8, 8))]), ValueError,
     r"features\[3\] must have features\[0\]'s batch, channels and dtype"),
    (dict(rpn_rois=np.zeros((1, 5))), TypeError, r"rpn_rois must be an mx.nd.NDArray"),
    (dict(rpn_rois=mx.nd.zeros((1, 4))), ValueError, r"rpn_rois must have shape \(K, 5\)"),
    (dict(features=[], strides=()), ValueError, r"features must hold at least one map"),
    (dict(rpn_rois=mx.nd.array([[2, 1, 1, 30, 30]])), ValueError, r"rpn_rois\[:, 0\]"),
    (dict(rpn_rois=mx.nd.array([[0, 1, np.nan, 30, 30]])), ValueError, r"rpn_rois"),
    (dict(roi_size=0), ValueError, r"roi_size must be >= 1"),
    (dict(roi_size=None), TypeError, r"roi_size must be an int or a pair"),
    (dict(sampling_ratio=-2), ValueError, r"sampling_ratio must be >= -1"),
    (dict(roi_canonical_scale=0.0), ValueError, r"roi_canonical_scale must be positive"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_invalid_arguments(kw, error, message):
    with pytest.raises(error, match=message):
        _call(**kw)


# ------------------------------------------------------------------------------ graphs
class _Pooler(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, p2, p3, p4, p5, rois):
        return mxa.pyramid_roi_feats([p2, p3, p4, p5], rois, (3, 2), STRIDES)


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
def test_a_hybridized_block_and_its_export_match_gluoncv(dtype, tmp_path):
    """In an mx.sym graph the pooler is GluonCV's formula with roicore's ROIAlign operator:
    a hybridized block's outputs and map gradients, and its exported and reimported
    SymbolBlock's outputs, are GluonCV's."""
    maps, rois = _maps(dtype), _boxes()
    dy = head_gradient((rois.shape[0], maps[0].shape[1], 3, 2), maps[0].dtype, seed=3)
    oracle = lambda xs, r: gluoncv_pyramid_roi_feats(  # noqa: E731
        mx.nd, xs, r, (3, 2), STRIDES, 2, 5)
    y_ref, g_ref = _run(oracle, maps, rois, dy)
    block = _Pooler()
    block.hybridize()
    y, g = _run(lambda xs, r: block(*xs, r), maps, rois, dy)
    assert_identical(y, y_ref)
    for a, b in zip(g, g_ref):
        assert_identical(a, b)
    block.export(str(tmp_path / "pooler"))
    loaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "pooler-symbol.json"),
                                          ["data0", "data1", "data2", "data3", "data4"])
    y_loaded = loaded(*[mx.nd.array(m, dtype=m.dtype) for m in maps],
                      mx.nd.array(rois, dtype=maps[0].dtype))
    assert_identical(y_loaded.asnumpy(), y_ref)
