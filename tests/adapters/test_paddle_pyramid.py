"""roicore.adapters.paddle.multilevel_roi_align against PaddleDetection's RoIAlign extractor
composed of Paddle's own ops (distribute_fpn_proposals, roi_align per level, concat, gather
by the restore index): bit-identical levels, outputs and feature-map gradients, float32 and
float64."""
import dataclasses

import numpy as np
import pytest

from conftest import framework

paddle = framework("paddle", "the Paddle adapter tests need paddlepaddle")
from paddle.vision import ops as native  # noqa: E402

from roicore import core  # noqa: E402
from roicore.adapters import paddle as rp  # noqa: E402
from roicore.adapters import _paddle_pyramid as pyramid  # noqa: E402
from roicore.core import conventions  # noqa: E402

DTYPES = ("float32", "float64")
IMAGE = (96, 128)                       # (H, W) of the input image
SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]  # levels 2..5
LEVELS = dict(min_level=2, max_level=5, refer_level=4, refer_scale=224)


# ----------------------------------------------------------------------------- helpers

def tensor(a, dtype=None, grad=False):
    t = paddle.to_tensor(np.asarray(a, dtype=dtype))
    t.stop_gradient = not grad
    return t


def assert_identical(actual, expected, what=""):
    """Same shape, dtype, NaN positions and bits everywhere else."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape and a.dtype == e.dtype, (what, a.shape, e.shape, a.dtype, e.dtype)
    nan = np.isnan(e)
    assert np.array_equal(np.isnan(a), nan), f"{what}: NaN positions differ"
    view = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    bad = a[~nan].view(view) != e[~nan].view(view)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {e.size} elements differ"


def feature_maps(dtype, N=2, C=3, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((N, C, IMAGE[0] >> level, IMAGE[1] >> level)).astype(dtype)
            for level in range(2, 6)]


def proposals(dtype, seed=1, per_image=(14, 12)):
    """Boxes of both images, sized for every level (some right at a level boundary), with
    reversed, empty and partly outside ones."""
    rng = np.random.default_rng(seed)
    out = []
    for k in per_image:
        xy = rng.uniform(-8, 100, (k, 2))
        wh = np.exp(rng.uniform(1, 6.5, (k, 2)))    # 3 to 660 pixels: levels 2 to 5
        b = np.concatenate([xy, xy + wh], 1)
        b[1] = [4, 6, 4 + 224, 6 + 224]             # sqrt(area) == 224: level 4 exactly
        b[2] = [0, 0, 112 * (1 - 2e-6), 112]        # just under level 3 (eps decides)
        b[3, 2] = b[3, 0] - 5                       # reversed: area 0, lowest level
        b[4, 2:] = b[4, :2]                         # empty
        b[5] = [10, 10, 160, 150]                   # level 3
        b[6] = [-20, 2, 480, 470]                   # level 5, mostly outside the image
        out.append(b)
    return np.concatenate(out).astype(dtype), np.asarray(per_image, np.int32)


def paddledet(feats, boxes, boxes_num, output_size, sampling_ratio, aligned, pixel_offset,
              spatial_scales=SCALES, min_level=2, max_level=5, refer_level=4, refer_scale=224):
    """PaddleDetection's RoIAlign.forward (ppdet/modeling/heads/roi_extractor.py) for
    several maps, with the arguments it passes."""
    rois_dist, restore_index, rois_num_dist = native.distribute_fpn_proposals(
        boxes, min_level, max_level, refer_level, refer_scale, pixel_offset=pixel_offset,
        rois_num=boxes_num)
    rois_feat_list = [
        native.roi_align(x=feats[lvl], boxes=rois_dist[lvl], boxes_num=rois_num_dist[lvl],
                         output_size=output_size, spatial_scale=spatial_scales[lvl],
                         sampling_ratio=sampling_ratio, aligned=aligned)
        for lvl in range(len(feats))]
    return paddle.gather(paddle.concat(rois_feat_list), restore_index)


def ours(feats, boxes, boxes_num, output_size, sampling_ratio, aligned, pixel_offset,
         spatial_scales=SCALES, **levels):
    return rp.multilevel_roi_align(feats, boxes, boxes_num, output_size, spatial_scales,
                                   sampling_ratio, aligned, pixel_offset=pixel_offset,
                                   **(levels or LEVELS))


def run(fn, maps, boxes, counts, seed=2, **kw):
    """Forward and backward (seeded random upstream gradient); numpy output and grads."""
    feats = [tensor(m, grad=True) for m in maps]
    y = fn(feats, tensor(boxes), tensor(counts, "int32"), **kw)
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(maps[0].dtype)
    y.backward(tensor(g))
    return y.numpy(), [f.grad.numpy() for f in feats]


def paddle_safe(boxes, counts, aligned, sampling_ratio):
    """The boxes Paddle's roi_align can run: with aligned=True and adaptive sampling a
    reversed box gives its kernel a negative grid size, and the process aborts."""
    if not aligned or sampling_ratio > 0:
        return boxes, counts
    keep = (boxes[:, 2] >= boxes[:, 0]) & (boxes[:, 3] >= boxes[:, 1])
    image = np.repeat(np.arange(len(counts)), counts)
    return boxes[keep], np.bincount(image[keep], minlength=len(counts)).astype(np.int32)


def paddle_levels(boxes, counts, pixel_offset, min_level=2, max_level=5, refer_level=4,
                  refer_scale=224):
    """Each box's level as distribute_fpn_proposals assigns it."""
    multi, restore, _ = native.distribute_fpn_proposals(
        tensor(boxes), min_level, max_level, refer_level, refer_scale,
        pixel_offset=pixel_offset, rois_num=tensor(counts, "int32"))
    per_level = np.repeat(np.arange(min_level, max_level + 1), [m.shape[0] for m in multi])
    return per_level[restore.numpy().ravel()]


def boundary_boxes(dtype, pixel_offset):
    """Boxes whose sqrt(area) / refer_scale sits within a few ulps to 1e-5 of a power of two
    (a level boundary), square and not, with tiny, huge, empty and reversed ones."""
    rows = []
    off = 1 if pixel_offset else 0
    for size in (28, 56, 112, 224, 448, 896):
        s = np.dtype(dtype).type(size)
        near = [s]
        for _ in range(4):
            near += [np.nextafter(near[-1], 0, dtype=dtype)]
        near += [s * np.dtype(dtype).type(1 + d) for d in
                 (-2e-5, -2e-6, -1e-6, -9e-7, -6e-7, -3e-7, -1e-7, -5e-8, -2e-8, -1e-8,
                  -5e-9, 1e-8, 1e-7)]
        for side in near:
            rows.append([3, 5, 3 + side - off, 5 + side - off])
            rows.append([0, 0, side * 2 - off, side / 2 - off])    # same area, not square
    rows += [[0, 0, 1e-3, 1e-3], [0, 0, 5e4, 5e4], [7, 7, 7, 7], [9, 4, 2, 8], [1, 9, 5, 3]]
    return np.asarray(rows, dtype)


# ----------------------------------------------------------------------------- levels

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pixel_offset", [False, True])
@pytest.mark.parametrize("levels", [(2, 5, 4, 224), (1, 4, 3, 112)])
def test_levels_match_distribute_fpn_proposals(dtype, pixel_offset, levels):
    boxes = np.concatenate([boundary_boxes(dtype, pixel_offset), proposals(dtype)[0]])
    counts = np.array([len(boxes) // 2, len(boxes) - len(boxes) // 2], np.int32)
    min_level, max_level, refer_level, refer_scale = levels
    expected = paddle_levels(boxes, counts, pixel_offset, *levels)
    got = core.pyramid_levels(boxes, [2.0 ** -k for k in range(min_level, max_level + 1)],
                              first_level=min_level, canonical_level=refer_level,
                              canonical_size=refer_scale,
                              levels=pyramid._LEVELS[pixel_offset], dtype=dtype) + min_level
    assert np.array_equal(got, expected), np.flatnonzero(got != expected)
    assert set(expected) == set(range(min_level, max_level + 1))  # every level is used


@pytest.mark.parametrize("dtype", DTYPES)
def test_level_table_entry_matches_paddles_cpu_kernel(dtype):
    boxes = boundary_boxes(dtype, False)
    counts = np.array([len(boxes)], np.int32)
    rules = dataclasses.replace(conventions.LEVELS["paddle"], pixel_offset=False)
    got = core.pyramid_levels(boxes, SCALES, first_level=2, levels=rules, dtype=dtype) + 2
    assert np.array_equal(got, paddle_levels(boxes, counts, False))


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("sampling_ratio", [-1, 2])
@pytest.mark.parametrize("pixel_offset", [False, True])
def test_matches_paddledetection(dtype, aligned, sampling_ratio, pixel_offset):
    maps = feature_maps(dtype)
    boxes, counts = paddle_safe(*proposals(dtype), aligned, sampling_ratio)
    kw = dict(output_size=(3, 2), sampling_ratio=sampling_ratio, aligned=aligned,
              pixel_offset=pixel_offset)
    y_ref, g_ref = run(paddledet, maps, boxes, counts, **kw)
    y, g = run(ours, maps, boxes, counts, **kw)
    assert_identical(y, y_ref, "output")
    for i, (a, e) in enumerate(zip(g, g_ref)):
        assert_identical(a, e, f"gradient of feats[{i}]")
    levels = paddle_levels(boxes, counts, pixel_offset)
    assert set(levels) == {2, 3, 4, 5}


def test_other_levels_and_sampling_ratio_zero():
    """PaddleDetection's defaults otherwise (sampling_ratio 0, aligned False) on levels 3-6."""
    dtype = "float64"
    maps = feature_maps(dtype, seed=3)
    boxes, counts = proposals(dtype, seed=4)
    scales = [1 / 8, 1 / 16, 1 / 32, 1 / 64]
    levels = dict(min_level=3, max_level=6, refer_level=5, refer_scale=112)
    kw = dict(output_size=4, sampling_ratio=0, aligned=False, pixel_offset=False,
              spatial_scales=scales, **levels)
    y_ref, g_ref = run(paddledet, maps, boxes, counts, **kw)
    y, g = run(ours, maps, boxes, counts, **kw)
    assert_identical(y, y_ref, "output")
    for i, (a, e) in enumerate(zip(g, g_ref)):
        assert_identical(a, e, f"gradient of feats[{i}]")


def test_reversed_box_aligned_adaptive_is_nan():
    """Where Paddle's roi_align aborts, the box's row is NaN; the other rows are Paddle's."""
    dtype = "float32"
    maps = feature_maps(dtype)
    boxes, counts = proposals(dtype)
    feats = [tensor(m) for m in maps]
    y = ours(feats, tensor(boxes), tensor(counts), 2, -1, True, False).numpy()
    reversed_ = (boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])
    assert reversed_.any() and np.isnan(y[reversed_]).all()
    kept, kept_counts = paddle_safe(boxes, counts, True, -1)
    expected = paddledet(feats, tensor(kept), tensor(kept_counts), 2, -1, True, False)
    assert_identical(y[~reversed_], expected.numpy(), "output")


def test_one_level_is_roi_align():
    """min_level == max_level pools every box from the one map (PaddleDetection calls
    roi_align directly for one map; distribute_fpn_proposals refuses one level)."""
    dtype = "float32"
    m = feature_maps(dtype)[1]
    boxes, counts = proposals(dtype)
    kw = dict(output_size=3, spatial_scale=1 / 8, sampling_ratio=2, aligned=False)
    y_ref, (g_ref,) = run(lambda f, b, n, **k: native.roi_align(f[0], b, n, **k), [m], boxes,
                          counts, **kw)
    y, (g,) = run(lambda f, b, n, **k: rp.multilevel_roi_align(
        f, b, n, k["output_size"], [k["spatial_scale"]], k["sampling_ratio"], k["aligned"],
        min_level=3, max_level=3), [m], boxes, counts, **kw)
    assert_identical(y, y_ref, "output")
    assert_identical(g, g_ref, "gradient")


# ----------------------------------------------------------------------------- autograd

def test_layer_no_grad_and_stop_gradient():
    dtype = "float32"
    maps = feature_maps(dtype)
    boxes, counts = proposals(dtype)
    layer = rp.MultiLevelRoIAlign((2, 3), SCALES, sampling_ratio=2, aligned=False)
    assert "spatial_scales" in repr(layer)
    y_fn, g_fn = run(ours, maps, boxes, counts, output_size=(2, 3), sampling_ratio=2,
                     aligned=False, pixel_offset=False)
    with paddle.no_grad():
        y = layer([tensor(m, grad=True) for m in maps], tensor(boxes), tensor(counts))
    assert y.stop_gradient
    assert_identical(y.numpy(), y_fn, "no_grad output")
    # only some maps ask for a gradient: the others get none, the rest as before
    feats = [tensor(m, grad=i % 2 == 0) for i, m in enumerate(maps)]
    b = tensor(boxes, grad=True)
    y = layer(feats, b, tensor(counts))
    y.backward(tensor(np.random.default_rng(2).standard_normal(y.shape).astype(dtype)))
    assert_identical(y.numpy(), y_fn, "output")
    for i, f in enumerate(feats):
        if i % 2:
            assert f.grad is None
        else:
            assert_identical(f.grad.numpy(), g_fn[i], f"gradient of feats[{i}]")
    assert b.grad is None


def test_no_boxes():
    maps = feature_maps("float64")
    y = rp.multilevel_roi_align([tensor(m) for m in maps], tensor(np.zeros((0, 4))),
                                tensor([0, 0], "int32"), 2, SCALES)
    assert list(y.shape) == [0, 3, 2, 2] and y.dtype == paddle.float64


# ----------------------------------------------------------------------------- training

class Detector(paddle.nn.Layer):
    """A small FPN detector head: one strided 3x3 convolution per level makes the maps from
    the image, ``pooler(feats, boxes, boxes_num)`` pools the boxes, a linear layer scores
    them."""

    def __init__(self, pooler, C=4, P=3, outputs=5):
        super().__init__()
        self.convs = paddle.nn.LayerList([
            paddle.nn.Conv2D(3, C, 3, stride=2 ** level, padding=1) for level in range(2, 6)])
        self.head = paddle.nn.Linear(C * P * P, outputs)
        self.pooler = pooler

    def forward(self, images, boxes, boxes_num):
        feats = [conv(images) for conv in self.convs]
        return self.head(self.pooler(feats, boxes, boxes_num).flatten(1))


def train(pooler, initial, images, boxes, counts, target, steps=3):
    """``steps`` SGD steps of a Detector with ``pooler`` from the ``initial`` weights (their
    dtype is the network's): the loss and every weight after each step, as NumPy."""
    net = Detector(pooler)
    net.to(dtype=next(iter(initial.values())).dtype.name)
    net.set_state_dict(initial)
    sgd = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    out = []
    for _ in range(steps):
        loss = ((net(tensor(images), tensor(boxes), tensor(counts)) - tensor(target)) ** 2).mean()
        loss.backward()
        sgd.step()
        sgd.clear_grad()
        out.append((loss.numpy(), {k: v.numpy() for k, v in net.state_dict().items()}))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_training_a_detector_is_bit_identical(dtype):
    """A detector trained with PaddleDetection's extractor (composed of Paddle's ops) and
    with MultiLevelRoIAlign in its place, from the same weights, with PaddleDetection's FPN
    settings (sampling_ratio 0, aligned True): the same loss and weights after every step."""
    P = 3
    rng = np.random.default_rng(6)
    images = rng.standard_normal((2, 3) + IMAGE).astype(dtype)
    boxes, counts = proposals(dtype, seed=7)
    # the proposals of positive size, as an RPN gives them (aligned=True with adaptive
    # sampling makes an empty box NaN in Paddle, and a reversed one aborts it)
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    counts = np.bincount(np.repeat([0, 1], counts)[keep], minlength=2).astype(np.int32)
    boxes = boxes[keep]
    target = rng.standard_normal((len(boxes), 5)).astype(dtype)
    assert set(paddle_levels(boxes, counts, False)) == {2, 3, 4, 5}   # every conv is trained
    kw = dict(output_size=P, sampling_ratio=0, aligned=True)
    initial = {k: rng.normal(0, 0.2, v.shape).astype(dtype)
               for k, v in Detector(None).state_dict().items()}

    def native_pooler(feats, b, n):
        return paddledet(feats, b, n, pixel_offset=False, **kw)
    ours_ = train(rp.MultiLevelRoIAlign(spatial_scales=SCALES, **kw), initial, images, boxes,
                  counts, target)
    theirs = train(native_pooler, initial, images, boxes, counts, target)
    for step, ((loss, weights), (loss_ref, weights_ref)) in enumerate(zip(ours_, theirs)):
        assert loss.dtype == dtype
        assert_identical(loss, loss_ref, f"loss after step {step + 1}")
        assert weights.keys() == weights_ref.keys() == initial.keys()
        for k in weights:
            assert_identical(weights[k], weights_ref[k], f"{k} after step {step + 1}")
            assert not np.array_equal(weights[k], initial[k]), k   # every weight is trained
    assert np.isfinite(ours_[-1][0]) and ours_[-1][0] < ours_[0][0]


# ----------------------------------------------------------------------------- errors

def test_errors():
    maps = feature_maps("float32")
    boxes, counts = proposals("float32")
    feats, b, n = [tensor(m) for m in maps], tensor(boxes), tensor(counts)

    def call(feats=feats, boxes=b, boxes_num=n, spatial_scales=SCALES, **kw):
        return rp.multilevel_roi_align(feats, boxes, boxes_num, 2, spatial_scales, **kw)

    cases = [
        (TypeError, "feats must be a non-empty list", dict(feats=feats[0])),
        (TypeError, "feats must be a non-empty list", dict(feats=[])),
        (ValueError, r"feats must have one map per level from min_level=2 to max_level=5 "
                     r"\(4\), got 3", dict(feats=feats[:3])),
        (ValueError, r"feats must have one map per level .* \(3\), got 4", dict(max_level=4)),
        (ValueError, "max_level must be >= min_level", dict(min_level=5, max_level=4)),
        (ValueError, r"spatial_scales must have one scale per map \(4\), got 3",
         dict(spatial_scales=SCALES[:3])),
        (TypeError, "spatial_scales must be a list", dict(spatial_scales=0.25)),
        (ValueError, r"spatial_scales\[1\] must be positive",
         dict(spatial_scales=[0.25, -0.125, 0.0625, 0.03125])),
        (TypeError, r"feats\[1\] must be a paddle.Tensor",
         dict(feats=[feats[0], maps[1]] + feats[2:])),
        (ValueError, r"feats\[1\] must be a 4-D",
         dict(feats=[feats[0], feats[1][0]] + feats[2:])),
        (TypeError, r"feats\[2\] must have the dtype of feats\[0\] \(float32\), got float64",
         dict(feats=feats[:2] + [tensor(maps[2], "float64")] + feats[3:])),
        (ValueError, r"feats\[3\] must have the batch size and channels of feats\[0\] "
                     r"\(\[2, 3\]\), got \[2, 2\]",
         dict(feats=feats[:3] + [feats[3][:, :2]])),
        (ValueError, r"feats\[1\] must have the batch size and channels",
         dict(feats=[feats[0], feats[1][:1]] + feats[2:])),
        (TypeError, r"boxes must have the dtype of feats\[0\] \(float32\), got float64",
         dict(boxes=tensor(boxes, "float64"))),
        (ValueError, r"boxes_num must sum to the number of boxes",
         dict(boxes_num=tensor([3, 4], "int32"))),
        (ValueError, r"boxes_num must have one count per image \(N=2\)",
         dict(boxes_num=tensor([len(boxes)], "int32"))),
        (ValueError, "boxes_num is required", dict(boxes_num=None)),
        (TypeError, "refer_scale must be an int", dict(refer_scale=224.0)),
        (TypeError, "min_level must be an int", dict(min_level=True)),
        (TypeError, "pixel_offset must be a bool", dict(pixel_offset=1)),
        (TypeError, "aligned must be a bool", dict(aligned="yes")),
        (ValueError, "sampling_ratio must be >= -1", dict(sampling_ratio=-2)),
    ]
    for error, message, kw in cases:
        with pytest.raises(error, match="^multilevel_roi_align: " + message):
            call(**kw)


@pytest.mark.parametrize("full_graph", [True, False], ids=["ast", "sot"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_to_static_and_jit_save_hold_the_composition(dtype, full_graph, tmp_path):
    """A static program holds distribute_fpn_proposals and roicore's roi_align operator per
    level: to_static and a reloaded paddle.jit.save model compute PaddleDetection's numbers,
    gradients included."""
    if rp._operators() is None:
        pytest.skip("roicore's Paddle operators are unavailable")
    maps = feature_maps(dtype)
    boxes, counts = proposals(dtype)
    kw = dict(output_size=5, sampling_ratio=2, aligned=False, pixel_offset=False)
    want, want_grads = run(paddledet, maps, boxes, counts, **kw)

    class Extractor(paddle.nn.Layer):   # a saved model's inputs are tensors, not lists
        def forward(self, p2, p3, p4, p5, boxes, boxes_num):
            return rp.multilevel_roi_align([p2, p3, p4, p5], boxes, boxes_num, 5, SCALES, 2,
                                           False)

    spec = [paddle.static.InputSpec([None, 3, None, None], dtype) for _ in range(4)] + [
        paddle.static.InputSpec([None, 4], dtype), paddle.static.InputSpec([None], "int32")]
    static = paddle.jit.to_static(Extractor(), input_spec=spec, full_graph=full_graph)
    got, got_grads = run(lambda f, b, n, **_: static(*f, b, n), maps, boxes, counts, **kw)
    assert_identical(got, want, "to_static")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert_identical(g, w, f"to_static feats[{i}].grad")
    paddle.jit.save(static, str(tmp_path / "extractor"))
    loaded = paddle.jit.load(str(tmp_path / "extractor"))
    loaded.train()
    got, got_grads = run(lambda f, b, n, **_: loaded(*f, b, n), maps, boxes, counts, **kw)
    assert_identical(got, want, "jit.load")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        assert_identical(g, w, f"jit.load feats[{i}].grad")


# ----------------------------------------------------------------------------- documentation

def test_exported_and_documented():
    """Exported by roicore.adapters.paddle, with Paddle's argument names, and the docstring
    examples run (test_paddle's documentation tests find only that module's own objects)."""
    import doctest
    import inspect

    for name in pyramid.__all__:
        assert name in rp.__all__ and getattr(rp, name) is getattr(pyramid, name)
    theirs = (list(inspect.signature(native.distribute_fpn_proposals).parameters)
              + list(inspect.signature(native.roi_align).parameters))
    assert set(inspect.signature(rp.multilevel_roi_align).parameters) - set(theirs) == {
        "feats", "spatial_scales", "n_threads"}
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in doctest.DocTestFinder().find(pyramid, pyramid.__name__):
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)
    assert results.attempted >= 10
