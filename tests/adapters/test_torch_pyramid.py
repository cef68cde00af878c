"""roicore.adapters.torch.MultiScaleRoIAlign against torchvision.ops.MultiScaleRoIAlign:
bit-identical levels, outputs and feature-map gradients, then inside torchvision's own
Faster and Mask R-CNN (eval outputs, one training step's losses and every parameter's
gradient), and the PyTorch machinery (opcheck, torch.compile)."""
import copy

import numpy as np
import pytest

from conftest import framework

torch = framework("torch", "the PyTorch adapter tests need torch")
torchvision = framework("torchvision", "the PyTorch adapter tests need torchvision")
from torchvision.ops import MultiScaleRoIAlign as StockPooler  # noqa: E402
from torchvision.ops.poolers import LevelMapper  # noqa: E402

import roicore.core as rc  # noqa: E402
from roicore.adapters import torch as rt  # noqa: E402

NAMES = ["0", "1", "2", "3"]


def features(N=2, C=8, image=(256, 384), dtype=torch.float32, seed=0, extra=True):
    g = torch.Generator().manual_seed(seed)
    x = {n: torch.randn(N, C, image[0] >> (i + 2), image[1] >> (i + 2), generator=g, dtype=dtype)
         for i, n in enumerate(NAMES)}
    if extra:  # a map the pooler must ignore, as torchvision's FPN has ("pool")
        x["pool"] = torch.randn(N, C, 2, 3, generator=g, dtype=dtype)
    return x


def proposals(N=2, K=120, image=(256, 384), dtype=torch.float32, seed=1):
    """Boxes of every FPN size class, with reversed, empty and outside ones."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(N):
        xy = torch.rand(K, 2, generator=g) * torch.tensor([image[1], image[0]])
        wh = torch.exp(torch.rand(K, 2, generator=g) * 7) - 1
        b = torch.cat([xy, xy + wh], 1)
        b[::9, 2] = b[::9, 0] - 3   # reversed: torchvision pools these from no level
        b[::10, 2:] = b[::10, :2]   # empty
        b[::13] += 500              # outside the image
        out.append(b.to(dtype))
    return out


def grads_of(pooler, x, boxes, image_shapes, seed=2):
    x = {k: v.detach().clone().requires_grad_() for k, v in x.items()}
    y = pooler(x, boxes, image_shapes)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    y.backward(g)
    return y, {k: v.grad for k, v in x.items()}


def assert_identical(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.view(-1).view(torch.int32 if a.dtype == torch.float32 else torch.int64),
                       b.view(-1).view(torch.int32 if b.dtype == torch.float32 else torch.int64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("output_size, sampling_ratio", [((7, 7), 2), (14, 0), ((3, 5), -1)])
def test_matches_torchvision(dtype, output_size, sampling_ratio):
    image = (256, 384)
    x, boxes = features(dtype=dtype), proposals(dtype=dtype)
    shapes = [image, (240, 380)]
    stock, ours = StockPooler(NAMES, output_size, sampling_ratio), \
        rt.MultiScaleRoIAlign(NAMES, output_size, sampling_ratio)
    y_stock, g_stock = grads_of(stock, x, boxes, shapes)
    y_ours, g_ours = grads_of(ours, x, boxes, shapes)
    assert_identical(y_ours, y_stock)
    assert ours.scales == stock.scales
    for k in x:
        if k in NAMES:
            assert_identical(g_ours[k], g_stock[k])
        else:
            assert g_ours[k] is None and g_stock[k] is None


@pytest.mark.parametrize("n_maps", [1, 2, 3])
def test_fewer_levels_and_other_canonical_levels(n_maps):
    x, boxes = features(), proposals()
    names = NAMES[:n_maps]
    for kw in ({}, {"canonical_scale": 160, "canonical_level": 3}):
        stock, ours = StockPooler(names, 5, 2, **kw), rt.MultiScaleRoIAlign(names, 5, 2, **kw)
        y_stock, g_stock = grads_of(stock, x, boxes, [(256, 384)] * 2)
        y_ours, g_ours = grads_of(ours, x, boxes, [(256, 384)] * 2)
        assert_identical(y_ours, y_stock)
        for k in names:
            assert_identical(g_ours[k], g_stock[k])


def test_levels_match_torchvision_at_the_boundaries():
    """Sides a few float32 ulps around every level boundary 224 * 2**j."""
    base = torch.tensor([224 * 2.0 ** j for j in range(-3, 4)])
    steps = 1 + torch.arange(-60, 60) * torch.finfo(torch.float32).eps
    sides = (base[:, None] * steps[None, :]).reshape(-1)
    corner = torch.rand(sides.shape[0], 2) * 50
    boxes = torch.cat([corner, corner + torch.stack([sides, sides * 0.5], 1)], 1)
    stock = LevelMapper(2, 5)([boxes]).numpy()
    ours = rc.pyramid_levels(boxes.numpy(), [1 / 4, 1 / 8, 1 / 16, 1 / 32])
    np.testing.assert_array_equal(ours, stock)
    pooler = rt.MultiScaleRoIAlign(NAMES, 7, 2)
    pooler(features(), proposals(), [(256, 384)] * 2)
    np.testing.assert_array_equal(pooler.map_levels([boxes]).numpy(), stock)


def test_half_precision_is_pooled_in_float32_under_autocast():
    x, boxes = features(), proposals()
    shapes = [(256, 384)] * 2
    y32 = rt.MultiScaleRoIAlign(NAMES, 7, 2)(x, boxes, shapes)
    half = {k: v.bfloat16() for k, v in x.items()}
    y = rt.MultiScaleRoIAlign(NAMES, 7, 2)(half, [b.bfloat16() for b in boxes], shapes)
    assert y.dtype == torch.bfloat16
    want = rt.MultiScaleRoIAlign(NAMES, 7, 2)({k: v.float() for k, v in half.items()},
                                             [b.bfloat16().float() for b in boxes], shapes)
    assert torch.equal(y, want.bfloat16()) and y32.dtype == torch.float32


def swapped(model):
    """``model`` with its roi_heads' poolers replaced by roicore's."""
    heads = model.roi_heads
    for attr in ("box_roi_pool", "mask_roi_pool"):
        p = getattr(heads, attr, None)
        if p is not None:
            setattr(heads, attr, rt.MultiScaleRoIAlign(
                p.featmap_names, p.output_size, p.sampling_ratio,
                canonical_scale=p.canonical_scale, canonical_level=p.canonical_level))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("build", ["fasterrcnn_resnet50_fpn", "maskrcnn_resnet50_fpn"])
def test_detection_models_are_bit_identical_with_the_pooler_swapped(build):
    from torchvision.models import detection
    torch.manual_seed(0)
    stock = getattr(detection, build)(weights=None, weights_backbone=None, num_classes=5,
                                      min_size=160, max_size=224, box_score_thresh=0.0)
    ours = swapped(copy.deepcopy(stock))
    assert isinstance(ours.roi_heads.box_roi_pool, rt.MultiScaleRoIAlign)
    images = [torch.rand(3, 150, 200), torch.rand(3, 170, 190)]
    stock.eval(), ours.eval()
    with torch.no_grad():
        want, got = stock(images), ours(images)
    for w, g in zip(want, got):
        assert w.keys() == g.keys() and len(w["boxes"]) > 10
        for k in w:
            assert torch.equal(w[k], g[k]), k
    masks = [torch.zeros(2, 150, 200, dtype=torch.uint8), torch.zeros(1, 170, 190, dtype=torch.uint8)]
    masks[0][0, 20:100, 10:80] = masks[0][1, 40:140, 30:150] = masks[1][0, 5:90, 5:60] = 1
    targets = [{"boxes": torch.tensor([[10., 20., 80., 100.], [30., 40., 150., 140.]]),
                "labels": torch.tensor([1, 3]), "masks": masks[0]},
               {"boxes": torch.tensor([[5., 5., 60., 90.]]), "labels": torch.tensor([2]),
                "masks": masks[1]}]
    stock.train(), ours.train()
    torch.manual_seed(1)  # the samplers draw the same proposals for both
    losses_want = stock(images, targets)
    torch.manual_seed(1)
    losses_got = ours(images, targets)
    for k in losses_want:
        assert torch.equal(losses_want[k], losses_got[k]), k
    sum(losses_want.values()).backward()
    sum(losses_got.values()).backward()
    params = dict(ours.named_parameters())
    for name, p in stock.named_parameters():
        if p.grad is None:
            assert params[name].grad is None, name
        else:
            assert torch.equal(p.grad, params[name].grad), name


def test_the_operator_passes_opcheck_and_compiles():
    x, boxes = features(extra=False), proposals()
    maps = [x[n] for n in NAMES]
    rois = torch.cat([torch.cat([torch.full((len(b), 1), float(i)), b], 1)
                      for i, b in enumerate(boxes)])
    args = (maps, rois, [1 / 4, 1 / 8, 1 / 16, 1 / 32], 7, 7, 2, False, 2, 4, 224.0, None)
    torch.library.opcheck(torch.ops.roicore.multi_scale_roi_align.default, args)
    pooler = rt.MultiScaleRoIAlign(NAMES, 7, 2)
    eager = pooler(x, boxes, [(256, 384)] * 2)
    compiled = torch.compile(pooler, fullgraph=False)
    assert torch.equal(compiled(x, boxes, [(256, 384)] * 2), eager)


def test_bad_input_names_the_argument():
    x, boxes = features(), proposals()
    shapes = [(256, 384)] * 2
    with pytest.raises(ValueError, match="images list should not be empty"):
        rt.MultiScaleRoIAlign(NAMES, 7, 2)(x, boxes, [])
    with pytest.raises(ValueError, match="one per level"):  # strides 4 and 16: a level missing
        rt.MultiScaleRoIAlign(["0", "2"], 7, 2)(x, boxes, shapes)
    with pytest.raises(ValueError, match="empty list"):
        rt.MultiScaleRoIAlign(NAMES, 7, 2)(x, [], shapes)
    with pytest.raises(ValueError, match="one per image"):
        rt.MultiScaleRoIAlign(NAMES, 7, 2)(x, boxes * 2, shapes)
    bad = dict(x)
    bad["2"] = bad["2"][:, :3]
    with pytest.raises(ValueError, match=r"features\[2\].*channels"):
        rt.MultiScaleRoIAlign(NAMES, 7, 2)(bad, boxes, shapes)
    with pytest.raises(TypeError, match="dtype"):
        rt.MultiScaleRoIAlign(NAMES, 7, 2)(x, [b.double() for b in boxes], shapes)
    with pytest.raises(ValueError, match="powers of two"):
        rt.multi_scale_roi_align([x[n] for n in NAMES], boxes, 7, 2, [0.3, 0.15, 0.075, 0.0375])
    with pytest.raises(ValueError, match="one scale per feature map"):
        rt.multi_scale_roi_align([x[n] for n in NAMES], boxes, 7, 2, [0.25, 0.125])


@pytest.mark.skipif(rt.native_library() is None,
                    reason="TorchScript needs roicore's C++ op library (always built in CI)")
def test_torchscript_compiles_saves_and_loads_the_module():
    import io
    import warnings
    x, boxes = features(), proposals()
    shapes = [(256, 384)] * 2
    want = StockPooler(NAMES, 7, 2)(x, boxes, shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch deprecates TorchScript
        scripted = torch.jit.script(rt.MultiScaleRoIAlign(NAMES, 7, 2))
        assert torch.equal(scripted(x, boxes, shapes), want)
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer)
        buffer.seek(0)
        loaded = torch.jit.load(buffer)
    xs = {k: v.clone().requires_grad_() for k, v in x.items()}
    y = loaded(xs, boxes, shapes)
    assert torch.equal(y, want)
    _, stock_grads = grads_of(StockPooler(NAMES, 7, 2), x, boxes, shapes, seed=3)
    y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(3)))
    for n in NAMES:
        assert torch.equal(xs[n].grad, stock_grads[n])


@pytest.mark.slow
@pytest.mark.skipif(rt.native_library() is None,
                    reason="TorchScript needs roicore's C++ op library (always built in CI)")
def test_a_scripted_faster_rcnn_with_the_pooler_swapped_matches_the_stock_one():
    import warnings
    from torchvision.models import detection
    torch.manual_seed(0)
    stock = detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None,
                                              num_classes=3, min_size=128, max_size=160,
                                              box_score_thresh=0.0).eval()
    ours = swapped(copy.deepcopy(stock))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation, RCNN's tuple notice
        scripted = torch.jit.script(ours)
    images = [torch.rand(3, 120, 150)]
    with torch.no_grad():
        want = stock(images)[0]
        got = scripted(images)[1][0]
    for k in want:
        assert torch.equal(want[k], got[k]), k


@pytest.mark.slow
def test_the_python_operators_pass_this_file():
    """The fast tests of this file on the Python custom ops (the fallback without a C++
    compiler), in a process where ROICORE_TORCH_NATIVE=0 turns the op library off."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow",
         os.path.abspath(__file__)],
        cwd=root, env=dict(os.environ, ROICORE_TORCH_NATIVE="0"), capture_output=True,
        text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout.splitlines()[-1], proc.stdout[-3000:]
