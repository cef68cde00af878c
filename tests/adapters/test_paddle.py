"""roicore.adapters.paddle / paddle_legacy against Paddle's own CPU kernels.

Parity means bit-identical outputs, argmax and input gradients (x.grad for a random upstream
gradient) to ``paddle.vision.ops`` on identical inputs, in float32 and float64.
"""
import re

import numpy as np
import pytest

from conftest import framework

paddle = framework("paddle", "the Paddle adapter tests need paddlepaddle")
from paddle.vision import ops as native  # noqa: E402

from roicore import core  # noqa: E402
from roicore.adapters import paddle as rp  # noqa: E402
from roicore.adapters import paddle_legacy as rl  # noqa: E402

DTYPES = ("float32", "float64")


# ----------------------------------------------------------------------------- helpers

def tensor(a, dtype=None, grad=False):
    t = paddle.to_tensor(np.asarray(a, dtype=dtype))
    t.stop_gradient = not grad
    return t


def _bits(a):
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def diff(actual, expected, equal_nan=False):
    """(mismatching elements, max abs diff) comparing bit patterns; with equal_nan, NaNs in
    the same places count as equal (their payloads are not compared)."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert a.dtype == e.dtype, (a.dtype, e.dtype)
    if a.dtype.kind != "f":
        bad = a != e
        return int(bad.sum()), (int(np.abs(a - e).max()) if a.size else 0)
    na, ne = np.isnan(a), np.isnan(e)
    if equal_nan:
        nan_bad = na != ne
        a, e = np.where(na & ne, 0, a), np.where(na & ne, 0, e)
    else:
        nan_bad = np.zeros(a.shape, bool)
    bad = (_bits(a) != _bits(e)) | nan_bad
    with np.errstate(invalid="ignore"):
        d = np.abs(a.astype(np.float64) - e.astype(np.float64))
    return int(bad.sum()), float(np.nanmax(d)) if d.size and not np.all(np.isnan(d)) else 0.0


def assert_same(actual, expected, what="", equal_nan=False):
    n, m = diff(actual, expected, equal_nan)
    assert n == 0, f"{what}: {n} of {np.size(expected)} elements differ (max abs diff {m:g})"


# ----------------------------------------------------------------------------- cases
# A case: dict(op, x, boxes, counts, kw, nan) with numpy inputs; kw are the op's keyword
# arguments (output_size, spatial_scale, [sampling_ratio, aligned]).

def _native(op):
    return {"roi_pool": native.roi_pool, "psroi_pool": native.psroi_pool,
            "roi_align": native.roi_align}[op]


def _adapter(op):
    return {"roi_pool": rp.roi_pool, "psroi_pool": rp.psroi_pool, "roi_align": rp.roi_align}[op]


def run(fn, case, seed=0):
    """Forward + backward (random upstream gradient) on fresh tensors; numpy results."""
    x = tensor(case["x"], grad=True)
    y = fn(x, tensor(case["boxes"]), tensor(case["counts"], "int32"), **case["kw"])
    g = np.random.default_rng(seed).standard_normal(y.shape).astype(case["x"].dtype)
    if y.size:
        y.backward(tensor(g))
        dx = x.grad.numpy()
    else:
        dx = np.zeros_like(case["x"])
    return y.numpy(), dx


def native_safe(case):
    """Drop what Paddle cannot run: with aligned=True and adaptive sampling, a reversed box
    makes its kernel pass a negative grid size to size_t (undefined behaviour; it aborts).
    roicore gives NaN there (test_reversed_aligned_adaptive_box)."""
    kw = case["kw"]
    if case["op"] != "roi_align" or not kw.get("aligned", True) or kw.get("sampling_ratio", -1) > 0:
        return case
    b = case["boxes"]
    keep = (b[:, 2] >= b[:, 0]) & (b[:, 3] >= b[:, 1])
    image = np.repeat(np.arange(len(case["counts"])), case["counts"])
    counts = np.bincount(image[keep], minlength=len(case["counts"])).astype(np.int32)
    return dict(case, boxes=b[keep], counts=counts)


def compare(case, seed=0):
    """[(what, mismatches, max abs diff)] for the output and the gradient."""
    case = native_safe(case)
    yn, gn = run(_native(case["op"]), case, seed)
    ya, ga = run(_adapter(case["op"]), case, seed)
    nan = case.get("nan", False)
    return [("out", *diff(ya, yn, nan)), ("grad", *diff(ga, gn))]


def make_case(op, x, boxes, counts, dtype, **kw):
    return dict(op=op, x=np.asarray(x, dtype), boxes=np.asarray(boxes, dtype),
                counts=np.asarray(counts, np.int32), kw=kw)


def random_case(op, dtype, seed):
    """Seeded random shapes and boxes: partly/wholly outside, reversed, zero-size, halves."""
    rng = np.random.default_rng([seed, ["roi_pool", "psroi_pool", "roi_align"].index(op)])
    N = int(rng.integers(1, 4))
    H, W = (int(v) for v in rng.integers(1, 24, 2))
    PH, PW = (int(v) for v in rng.integers(1, 5, 2))
    C = int(rng.integers(2, 4)) * PH * PW if op == "psroi_pool" else int(rng.integers(1, 5))
    s = float(rng.choice([1.0, 0.5, 0.7, 0.25, 1 / 16]))
    K = int(rng.integers(0, 14))
    lo = np.array([W, H]) / s
    p1 = rng.uniform(-0.3, 1.1, (K, 2)) * lo
    p2 = p1 + rng.uniform(-0.2, 0.8, (K, 2)) * lo  # some reversed
    boxes = np.concatenate([p1, p2], 1)
    kind = rng.integers(0, 4, K)
    boxes[kind == 1] = np.round(boxes[kind == 1] * s * 2) / 2 / s  # exact halves of x.5/s
    boxes[kind == 2, 2:] = boxes[kind == 2, :2]                    # zero-size
    boxes[kind == 3] = np.round(boxes[kind == 3])                  # integral
    counts = np.bincount(np.sort(rng.integers(0, N, K)), minlength=N)
    kw = dict(output_size=(PH, PW), spatial_scale=s)
    nan = False
    if op == "roi_align":
        kw.update(sampling_ratio=int(rng.choice([-1, 0, 1, 2, 3])), aligned=bool(rng.integers(2)))
        nan = kw["aligned"] and kw["sampling_ratio"] <= 0
    x = rng.standard_normal((N, C, H, W))
    c = make_case(op, x, boxes, counts, dtype, **kw)
    c["nan"] = nan
    return c


def hard_cases(op, dtype):
    """Named edge cases: float bins, outside/reversed boxes, halves, small scales."""
    rng = np.random.default_rng(7)
    out = {}
    ps = op == "psroi_pool"
    C = 2 * 49 if ps else 3
    # P=7 with RoI heights 57 and 29: floor/ceil of float32 (and float64) bins are off by one.
    x = rng.standard_normal((2, C, 64, 64))
    out["bins_57_29"] = make_case(op, x, [[0, 0, 56, 56], [1, 1, 29, 29], [2, 3, 30, 58],
                                          [0, 0, 63, 63]], [2, 2], dtype,
                                  output_size=7, spatial_scale=1.0)
    PS = 2 if ps else 3
    C = 2 * PS * PS if ps else 3
    x = rng.standard_normal((2, C, 12, 10))
    boxes = [[-5, -5, 3, 4],       # partly outside (top-left)
             [8, 9, 15, 20],       # partly outside (bottom-right)
             [20, 20, 30, 30],     # wholly outside
             [-9, -9, -2, -3],     # wholly outside, negative
             [7, 8, 2, 3],         # reversed
             [4, 4, 4, 4],         # zero size
             [2.5, 3.5, 7.5, 9.5]]  # halves at scale 1
    out["outside_reversed"] = make_case(op, x, boxes, [3, 4], dtype, output_size=PS,
                                        spatial_scale=1.0)
    for s in (0.7, 1 / 16):
        # coordinates at exact halves of feature pixels: (k + .5) / s
        k = rng.integers(-2, 12, (8, 4)).astype(np.float64)
        halves = (k + 0.5) / s
        out[f"halves_scale_{s:.4g}"] = make_case(op, x, halves, [5, 3], dtype,
                                                 output_size=(PS, PS + 1) if not ps else PS,
                                                 spatial_scale=s)
    if op == "roi_align":
        for name, c in list(out.items()):
            for aligned in (True, False):
                for sr in (-1, 2):
                    c2 = dict(c, kw=dict(c["kw"], sampling_ratio=sr, aligned=aligned))
                    c2["nan"] = aligned and sr <= 0
                    out[f"{name}-aligned{aligned}-sr{sr}"] = c2
            del out[name]
        # aligned zero-size box: Paddle gives NaN (0 * 1/0); roicore's convention too
        out["aligned_zero_size_nan"] = dict(
            make_case(op, rng.standard_normal((1, 2, 6, 6)), [[2, 2, 2, 2], [1, 1, 4, 4],
                                                              [3, 1, 3, 5]], [3], dtype,
                      output_size=2, spatial_scale=1.0, sampling_ratio=-1, aligned=True),
            nan=True)
    return out


def seed_cases(op, dtype):
    x = np.arange(1, 17).reshape(1, 1, 4, 4)
    boxes = [[1, 1, 2, 2], [1.5, 1.5, 3, 3]]
    if op == "roi_pool":
        return {"fluid_doc": make_case(op, x, boxes, [2], dtype, output_size=1)}
    if op == "roi_align":
        return {"test_value": make_case(op, x, boxes, [2], dtype, output_size=1),
                "test_value_unaligned": make_case(op, x, boxes, [2], dtype, output_size=1,
                                                  aligned=False)}
    rng = np.random.default_rng(4)
    b = rng.uniform(0, 27, (5, 4))
    b[:, 2:] = np.maximum(b[:, 2:], b[:, :2] + 1)
    return {"fluid_doc_490": make_case(op, rng.standard_normal((2, 490, 28, 28)), b, [3, 2],
                                       dtype, output_size=7, spatial_scale=1.0)}


OPS = ("roi_pool", "psroi_pool", "roi_align")


def all_cases():
    """(op, dtype, group, name, case) for every parity case (also used by the report script)."""
    for op in OPS:
        for dtype in DTYPES:
            for name, c in seed_cases(op, dtype).items():
                yield op, dtype, "seed", name, c
            for name, c in hard_cases(op, dtype).items():
                yield op, dtype, "hard", name, c
            for seed in range(12):
                yield op, dtype, "random", f"seed{seed}", random_case(op, dtype, seed)


CASES = list(all_cases())


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("op,dtype,group,name,case", CASES,
                         ids=[f"{o}-{d}-{g}-{n}" for o, d, g, n, _ in CASES])
def test_parity_with_native(op, dtype, group, name, case, paddle_path):
    for what, n, m in compare(case):
        assert n == 0, f"{what}: {n} elements differ from Paddle (max abs diff {m:g})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_seed_values(dtype, paddle_path):
    x = tensor(np.arange(1, 17).reshape(1, 1, 4, 4), dtype)
    b = tensor([[1, 1, 2, 2], [1.5, 1.5, 3, 3]], dtype)
    n = tensor([2], "int32")
    assert rp.roi_pool(x, b, n, 1).numpy().ravel().tolist() == [11, 16]
    assert rp.roi_align(x, b, n, 1).numpy().ravel().tolist() == [6, 9.75]
    assert rp.roi_align(x, b, n, 1, aligned=False).numpy().ravel().tolist() == [8.5, 12.25]
    assert rl.roi_pool(x, b, 1, 1, 1.0, rois_num=n).numpy().ravel().tolist() == [11, 16]


def test_aligned_zero_size_box_is_nan_like_paddle(paddle_path):
    x = tensor(np.random.default_rng(0).standard_normal((1, 1, 5, 5)), "float32")
    b, n = tensor([[2, 2, 2, 2]], "float32"), tensor([1], "int32")
    mine, theirs = rp.roi_align(x, b, n, 2).numpy(), native.roi_align(x, b, n, 2).numpy()
    assert np.isnan(mine).all() and np.isnan(theirs).all()


def test_reversed_aligned_adaptive_box(paddle_path):
    """Paddle's kernel aborts here (see native_safe); the adapter returns the core's NaN."""
    xa = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype("float32")
    ba = np.array([[4, 4, 1, 5], [1, 1, 4, 4]], "float32")
    y = rp.roi_align(tensor(xa), tensor(ba), tensor([2], "int32"), 2).numpy()
    want = core.roi_align(xa, ba, 2, 1.0, -1, True, batch_indices=[0, 0], convention="paddle")
    assert np.isnan(y[0]).all()
    assert_same(y, want, "reversed aligned box", equal_nan=True)


def _native_argmax(case):
    x, b = tensor(case["x"]), tensor(case["boxes"])
    ph, pw = core.ops.V.pair(case["kw"]["output_size"], "output_size")
    _, am = paddle._legacy_C_ops.roi_pool(x, b, tensor(case["counts"], "int32"),
                                          "pooled_height", ph, "pooled_width", pw,
                                          "spatial_scale", case["kw"].get("spatial_scale", 1.0))
    return am.numpy()


ROI_POOL_CASES = [c for c in CASES if c[0] == "roi_pool"]


@pytest.mark.parametrize("op,dtype,group,name,case", ROI_POOL_CASES,
                         ids=[f"{d}-{g}-{n}" for _, d, g, n, _ in ROI_POOL_CASES])
def test_argmax_parity(op, dtype, group, name, case, paddle_path):
    expected = _native_argmax(case)
    batch = np.repeat(np.arange(len(case["counts"])), case["counts"])
    y, am = core.roi_pool(case["x"], case["boxes"], case["kw"]["output_size"],
                          case["kw"].get("spatial_scale", 1.0), batch_indices=batch, convention="paddle",
                          return_argmax=True)
    assert am.dtype == np.int64
    assert_same(am, expected, "core argmax")
    _, legacy_am = rl.roi_pool(tensor(case["x"]), tensor(case["boxes"]),
                               *core.ops.V.pair(case["kw"]["output_size"], "output_size"),
                               case["kw"].get("spatial_scale", 1.0),
                               rois_num=tensor(case["counts"], "int32"), return_argmax=True)
    assert_same(legacy_am.numpy(), expected, "adapter argmax")


# ----------------------------------------------------------------------------- legacy API

@pytest.mark.parametrize("dtype", DTYPES)
def test_legacy_psroi_fluid_doc_example(dtype, paddle_path):
    case = seed_cases("psroi_pool", dtype)["fluid_doc_490"]
    x, b = tensor(case["x"], grad=True), tensor(case["boxes"])
    out = rl.psroi_pool(x, b, 10, 1.0, 7, 7, lod=[[3, 2]])
    assert out.shape == [5, 10, 7, 7]
    ref = native.psroi_pool(tensor(case["x"]), b, tensor([3, 2], "int32"), 7, 1.0)
    assert_same(out.numpy(), ref.numpy(), "legacy psroi vs native")
    modern = rp.psroi_pool(tensor(case["x"]), b, tensor([3, 2], "int32"), 7, 1.0)
    assert_same(out.numpy(), modern.numpy(), "legacy vs modern")
    out2 = rl.psroi_pool(tensor(case["x"]), b, 10, 1.0, 7, 7, rois_num=tensor([3, 2], "int32"))
    assert_same(out2.numpy(), out.numpy(), "rois_num vs lod")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(4))
def test_legacy_roi_pool_equals_modern(dtype, seed, paddle_path):
    case = random_case("roi_pool", dtype, seed)
    PH, PW = case["kw"]["output_size"]
    s = case["kw"]["spatial_scale"]
    modern_y, modern_g = run(rp.roi_pool, case, seed)
    for mapping in ({"rois_num": tensor(case["counts"], "int32")},
                    {"lod": [case["counts"].tolist()]},
                    {"lod": case["counts"].tolist()}):
        legacy = (lambda x, b, n, **kw: rl.roi_pool(x, b, PH, PW, s, **mapping))
        y, g = run(legacy, case, seed)
        assert_same(y, modern_y, f"legacy roi_pool {list(mapping)}")
        assert_same(g, modern_g, f"legacy roi_pool grad {list(mapping)}")


def test_legacy_psroi_gradient_equals_modern(paddle_path):
    case = random_case("psroi_pool", "float64", 3)
    PH, PW = case["kw"]["output_size"]
    D = case["x"].shape[1] // (PH * PW)
    s = case["kw"]["spatial_scale"]
    legacy = (lambda x, b, n, **kw: rl.psroi_pool(x, b, D, s, PH, PW,
                                                   lod=[case["counts"].tolist()]))
    for got, want in zip(run(legacy, case, 1), run(rp.psroi_pool, case, 1)):
        assert_same(got, want, "legacy psroi")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", range(2))
def test_legacy_roi_align_equals_modern(dtype, seed, paddle_path):
    """fluid's roi_align is the modern op with aligned=False (its default there)."""
    case = random_case("roi_align", dtype, seed)
    PH, PW = case["kw"]["output_size"]
    s, ratio = case["kw"]["spatial_scale"], case["kw"].get("sampling_ratio", -1)
    for aligned in (False, True):
        modern = (lambda x, b, n, **kw: rp.roi_align(x, b, n, (PH, PW), s, ratio, aligned))
        modern_y, modern_g = run(modern, case, seed)
        legacy = (lambda x, b, n, **kw: rl.roi_align(x, b, PH, PW, s, ratio, lod=[
            case["counts"].tolist()], **({"aligned": True} if aligned else {})))
        y, g = run(legacy, case, seed)
        assert_same(y, modern_y, f"legacy roi_align aligned={aligned}")
        assert_same(g, modern_g, f"legacy roi_align grad aligned={aligned}")


@pytest.mark.parametrize("op", ["roi_pool", "psroi_pool", "roi_align"])
def test_legacy_errors_use_fluids_names(op, paddle_path):
    """Messages say input, rois, rois_num and lod (fluid's arguments), never the modern API's
    x, boxes or boxes_num, whichever layer finds the mistake."""
    fn = {"roi_pool": lambda x, b, **kw: rl.roi_pool(x, b, 2, 2, **kw),
          "psroi_pool": lambda x, b, **kw: rl.psroi_pool(x, b, 2, 1.0, 2, 2, **kw),
          "roi_align": lambda x, b, **kw: rl.roi_align(x, b, 2, 2, **kw)}[op]
    x = tensor(np.zeros((2, 8, 4, 4)), "float32")
    b = tensor(np.tile([[0, 0, 2, 2]], (3, 1)), "float32")
    one = tensor(np.array([[0, 0, 2, 2]]), "float32")
    calls = [
        (TypeError, r"input must be float32 or float64, got int32",
         lambda: fn(tensor(np.zeros((2, 8, 4, 4)), "int32"), b, lod=[[1, 2]])),
        (ValueError, r"rois must be a 2-D",
         lambda: fn(x, tensor(np.zeros((3, 5)), "float32"), lod=[[1, 2]])),
        (TypeError, r"rois must have the dtype of input \(float32\), got float64",
         lambda: fn(x, tensor(np.zeros((3, 4)), "float64"), lod=[[1, 2]])),
        (ValueError, r"rois_num must sum to the number of boxes \(3\), got sum\(rois_num\) = 4",
         lambda: fn(x, b, rois_num=tensor([2, 2], "int32"))),
        (ValueError, r"lod must sum to the number of boxes \(1\), got sum\(lod\) = 2",
         lambda: fn(tensor(np.zeros((1, 8, 4, 4)), "float32"), one, lod=[[2]])),
        (ValueError, r"lod must have one count per image \(N=2\)",
         lambda: fn(x, b, lod=[[3]])),
        (ValueError, r"rois\[0\] .*finite|rois coordinates must be finite",
         lambda: fn(x, tensor(np.array([[0, 0, np.nan, 2]]), "float32"), lod=[[1, 0]])),
    ]
    for error, message, call in calls:
        with pytest.raises(error, match=message) as raised:
            call()
        # the modern names as arguments ("the number of boxes" is prose)
        assert not re.search(r"\b(x|boxes_num)\b|\bboxes( must|\[)", str(raised.value)), \
            raised.value


def test_legacy_mapping_errors(paddle_path):
    x, b = tensor(np.zeros((2, 1, 4, 4)), "float32"), tensor(np.zeros((5, 4)), "float32")
    with pytest.raises(ValueError, match="pass rois_num= .* or lod="):
        rl.roi_pool(x, b, 2, 2)
    with pytest.raises(ValueError, match="must be the same"):
        rl.roi_pool(x, b, 2, 2, rois_num=tensor([3, 2], "int32"), lod=[[2, 3]])
    with pytest.raises(ValueError, match="sum to the number of boxes"):
        rl.roi_pool(x, b, 2, 2, lod=[[3, 3]])
    with pytest.raises(ValueError, match="one count per image"):
        rl.roi_pool(x, b, 2, 2, lod=[[5]])
    with pytest.raises(ValueError, match="lod_level 1"):
        rl.roi_pool(x, b, 2, 2, lod=[[1, 1], [3, 2]])
    with pytest.raises(TypeError, match="per-image lengths"):
        rl.roi_pool(x, b, 2, 2, lod=[[3.0, 2.0]])
    x4 = tensor(np.zeros((2, 8, 4, 4)), "float32")
    with pytest.raises(TypeError, match="output_channels must be int type"):
        rl.psroi_pool(x4, b, 2.0, 1.0, 2, 2, lod=[[3, 2]])
    with pytest.raises(TypeError, match="pooled_height must be int type"):
        rl.psroi_pool(x4, b, 2, 1.0, "2", 2, lod=[[3, 2]])
    with pytest.raises(ValueError, match="output_channels \\* 2 \\* 2"):
        rl.psroi_pool(x4, b, 3, 1.0, 2, 2, lod=[[3, 2]])


# ----------------------------------------------------------------------------- layers

class Head(paddle.nn.Layer):
    def __init__(self, pool, channels):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, channels, 3, padding=1)
        self.pool = pool
        self.fc = paddle.nn.Linear(1, 2)

    def forward(self, img, boxes, boxes_num):
        y = self.pool(paddle.nn.functional.relu(self.conv(img)), boxes, boxes_num)
        return self.fc(y.reshape([-1, 1]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["RoIPool", "PSRoIPool", "RoIAlign"])
def test_layers_forward_backward_match_native(kind, dtype, paddle_path):
    paddle.set_default_dtype(dtype)
    try:
        channels = 12 if kind == "PSRoIPool" else 5
        theirs = Head(getattr(native, kind)((2, 3) if kind != "PSRoIPool" else 2, 0.5), channels)
        mine = Head(getattr(rp, kind)((2, 3) if kind != "PSRoIPool" else 2, 0.5, n_threads=2),
                    channels)
        mine.set_state_dict(theirs.state_dict())
    finally:
        paddle.set_default_dtype("float32")
    rng = np.random.default_rng(3)
    img = tensor(rng.standard_normal((2, 3, 16, 14)), dtype)
    boxes = tensor([[0, 0, 20, 26], [3, 5, 11, 9], [-4, 2, 30, 17], [6, 6, 6.5, 7]], dtype)
    num = tensor([1, 3], "int32")
    results = []
    for model in (theirs, mine):
        out = model(img, boxes, num)
        out.sum().backward()
        results.append([out.numpy(), model.conv.weight.grad.numpy(), model.fc.weight.grad.numpy()])
    for name, a, b in zip(("out", "conv.grad", "fc.grad"), results[1], results[0]):
        assert_same(a, b, f"{kind} {name}")
    assert "output_size" in repr(mine.pool)


# ----------------------------------------------------------------------------- tensors

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_place_dtype_and_stop_gradient(op, dtype, paddle_path):
    case = random_case(op, dtype, 1)
    x = tensor(case["x"], grad=True)
    y = _adapter(op)(x, tensor(case["boxes"]), tensor(case["counts"], "int32"), **case["kw"])
    assert isinstance(y, paddle.Tensor)
    assert y.dtype == x.dtype and str(y.place) == str(x.place)
    assert not y.stop_gradient
    y.sum().backward()
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape
    x2 = tensor(case["x"])  # no gradient wanted: output is a plain tensor
    y2 = _adapter(op)(x2, tensor(case["boxes"]), tensor(case["counts"], "int32"), **case["kw"])
    assert y2.stop_gradient


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", ["stop_gradient", "no_grad"])
def test_inference_path_matches_grad_path(op, dtype, mode, spy_core, numpy_path):
    """Without a possible gradient (stop_gradient, paddle.no_grad) the core is called
    directly and roi_pool computes no argmax; the output is bit-identical to the recorded
    path's and to Paddle's, and a gradient taken afterwards is still Paddle's."""
    case = native_safe(hard_cases(op, dtype)["outside_reversed" if op != "roi_align" else
                                              "outside_reversed-alignedFalse-sr2"])
    args = (tensor(case["boxes"]), tensor(case["counts"], "int32"))
    calls = spy_core(op)
    if mode == "stop_gradient":
        y = _adapter(op)(tensor(case["x"]), *args, **case["kw"])
    else:
        with paddle.no_grad():
            y = _adapter(op)(tensor(case["x"], grad=True), *args, **case["kw"])
    assert y.stop_gradient
    assert len(calls) == 1 and not calls[0].kwargs.get("return_argmax", False)
    want_y, want_g = run(_native(op), case, 2)
    assert_same(y.numpy(), want_y, f"{op} {mode} output")
    got_y, got_g = run(_adapter(op), case, 2)  # the recorded path, after the inference one
    assert len(calls) == 2
    assert_same(got_y, y.numpy(), f"{op} recorded vs {mode} output")
    assert_same(got_g, want_g, f"{op} gradient after {mode}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_roi_pool_keeps_an_int32_argmax_for_its_backward(dtype, spy_core, numpy_path):
    """The recorded roi_pool keeps Paddle's h*W + w argmax as int32 (half the memory of
    Paddle's int64) and still gives Paddle's gradient; the legacy return_argmax hands out
    Paddle's int64 argmax, recorded or not."""
    case = hard_cases("roi_pool", dtype)["bins_57_29"]
    calls = spy_core("roi_pool")
    got_y, got_g = run(rp.roi_pool, case, 3)
    (_, kw, (_, argmax)), = calls
    assert kw["return_argmax"] and argmax.dtype == np.int32
    want = _native_argmax(case)
    assert_same(argmax.astype(np.int64), want, "int32 argmax values")
    want_y, want_g = run(native.roi_pool, case, 3)
    assert_same(got_y, want_y, "output")
    assert_same(got_g, want_g, "gradient")
    for grad in (False, True):
        x = tensor(case["x"], grad=grad)
        y, am = rl.roi_pool(x, tensor(case["boxes"]), 7, 7, 1.0,
                            rois_num=tensor(case["counts"], "int32"), return_argmax=True)
        assert am.dtype == paddle.int64 and am.stop_gradient
        assert_same(am.numpy(), want, f"legacy argmax (grad={grad})")
        assert_same(y.numpy(), want_y, f"legacy output (grad={grad})")
        if grad:
            y.backward(tensor(np.random.default_rng(3).standard_normal(y.shape), dtype))
            assert_same(x.grad.numpy(), want_g, "legacy gradient")


def test_boxes_get_no_gradient(paddle_path):
    x = tensor(np.ones((1, 2, 6, 6)), "float32", grad=True)
    b = tensor([[0, 0, 4, 4]], "float32", grad=True)
    rp.roi_align(x, b, tensor([1], "int32"), 2).sum().backward()
    assert x.grad is not None and b.grad is None


@pytest.mark.parametrize("op", OPS)
def test_no_copies_on_cpu(op, spy_core, numpy_path):
    """x and boxes reach the core as views of the Paddle buffers, and the core's result
    becomes the output tensor without a copy."""
    case = random_case(op, "float32", 2)
    case["boxes"] = np.array([[1, 1, 9, 9], [0, 2, 5, 7]], np.float32)
    case["counts"] = np.array([2] + [0] * (case["x"].shape[0] - 1), np.int32)
    calls = spy_core(op)
    x, b = tensor(case["x"]), tensor(case["boxes"])
    y = _adapter(op)(x, b, tensor(case["counts"], "int32"), **case["kw"])
    ((x_in, boxes_in, *_), _, res), = calls
    assert x_in.ctypes.data == x.data_ptr() and boxes_in.ctypes.data == b.data_ptr()
    assert (res[0] if isinstance(res, tuple) else res).ctypes.data == y.data_ptr()


def test_strided_input(paddle_path):
    rng = np.random.default_rng(5)
    base = tensor(rng.standard_normal((1, 3, 9, 8)), "float32")
    x = base.transpose([0, 1, 3, 2])  # a non-contiguous view in Paddle 3
    b, n = tensor([[0, 0, 6, 7], [2, 1, 5, 8]], "float32"), tensor([2], "int32")
    assert_same(rp.roi_pool(x, b, n, 3).numpy(), native.roi_pool(x, b, n, 3).numpy(), "strided")


def test_n_threads_does_not_change_results(paddle_path):
    case = random_case("roi_align", "float32", 4)
    args = (tensor(case["x"]), tensor(case["boxes"]), tensor(case["counts"], "int32"))
    one = rp.roi_align(*args, **case["kw"], n_threads=1).numpy()
    two = rp.roi_align(*args, **case["kw"], n_threads=2).numpy()
    assert_same(two, one, "n_threads", equal_nan=True)
    with pytest.raises(ValueError, match="n_threads = 0"):
        rp.roi_pool(*args, 2, n_threads=0)


def test_empty_boxes(paddle_path):
    x = tensor(np.ones((2, 4, 5, 5)), "float32", grad=True)
    b, n = tensor(np.zeros((0, 4)), "float32"), tensor([0, 0], "int32")
    for op in OPS:
        y = _adapter(op)(x, b, n, 2)
        assert y.shape == [0, 1 if op == "psroi_pool" else 4, 2, 2]


def test_psroi_single_output_channel_is_allowed(paddle_path):
    """Paddle refuses C == PH*PW ("output channels must greater than 1"); that is not a
    rule of PSROI pooling, so the adapter computes it (equal to the core)."""
    rng = np.random.default_rng(0)
    xa, ba = rng.standard_normal((1, 4, 8, 8)).astype("float32"), np.array([[0, 0, 6, 5.]], "float32")
    x, b, n = tensor(xa), tensor(ba), tensor([1], "int32")
    with pytest.raises(ValueError, match="greater than 1"):
        native.psroi_pool(x, b, n, 2)
    assert_same(rp.psroi_pool(x, b, n, 2).numpy(),
                core.psroi_pool(xa, ba, 2, output_channels=1, batch_indices=[0]), "D=1")


# ----------------------------------------------------------------------------- errors

def _args(N=2, K=3, dtype="float32"):
    return (tensor(np.zeros((N, 8, 6, 6)), dtype), tensor(np.zeros((K, 4)), dtype),
            tensor([K - 1, 1], "int32"))


@pytest.mark.parametrize("op", OPS)
def test_errors(op, paddle_path):
    f = _adapter(op)
    x, b, n = _args()
    size = 2
    with pytest.raises(ValueError, match=r"boxes_num must sum to the number of boxes \(3\)"):
        f(x, b, tensor([1, 1], "int32"), size)
    with pytest.raises(ValueError, match=r"one count per image \(N=2\)"):
        f(x, b, tensor([3], "int32"), size)
    # (the operators see the overflowing first count before the negative second one)
    with pytest.raises(ValueError, match="boxes_num must (be non-negative|sum to the number "
                                         r"of boxes \(3\), got more)"):
        f(x, b, tensor([4, -1], "int32"), size)
    with pytest.raises(TypeError, match="boxes_num must be int32 or int64, got float32"):
        f(x, b, tensor([2, 1], "float32"), size)
    with pytest.raises(ValueError, match="1-D"):
        f(x, b, tensor([[2, 1]], "int32"), size)
    with pytest.raises(ValueError, match="boxes_num is required"):
        f(x, b, None, size)
    with pytest.raises(TypeError, match=r"boxes must have the dtype of x \(float32\), got float64"):
        f(x, tensor(np.zeros((3, 4)), "float64"), n, size)
    with pytest.raises(ValueError, match=r"boxes must be a 2-D \[num_boxes, 4\]"):
        f(x, tensor(np.zeros((3, 5)), "float32"), n, size)
    with pytest.raises(ValueError, match=r"boxes must be a 2-D \[num_boxes, 4\]"):
        f(x, tensor(np.zeros((1, 3, 4)), "float32"), n, size)
    with pytest.raises(ValueError, match=r"x must be a 4-D \[N, C, H, W\]"):
        f(tensor(np.zeros((8, 6, 6)), "float32"), b, n, size)
    with pytest.raises(TypeError, match="x must be float32 or float64, got int32"):
        f(tensor(np.zeros((2, 8, 6, 6)), "int32"), b, n, size)
    with pytest.raises(TypeError, match="x must be a paddle.Tensor"):
        f(np.zeros((2, 8, 6, 6), np.float32), b, n, size)
    with pytest.raises(TypeError, match="output_size"):
        f(x, b, n, "2")
    with pytest.raises(ValueError, match="output_size must be >= 1"):
        f(x, b, n, (0, 2))
    with pytest.raises(ValueError, match="spatial_scale must be positive"):
        f(x, b, n, size, -1.0)
    with pytest.raises(ValueError, match="coordinates must be finite, got nan in box 0"):
        f(x, tensor([[0, 0, np.nan, 1]] * 3, "float32"), n, size)


def test_psroi_channel_error(paddle_path):
    x, b, n = _args()
    with pytest.raises(ValueError, match="not a multiple of the group area 3x3"):
        rp.psroi_pool(x, b, n, 3)


def test_roi_align_argument_errors(paddle_path):
    x, b, n = _args()
    with pytest.raises(ValueError, match="sampling_ratio must be >= -1"):
        rp.roi_align(x, b, n, 2, sampling_ratio=-2)
    with pytest.raises(TypeError, match="aligned must be a bool"):
        rp.roi_align(x, b, n, 2, aligned=1)


def test_static_mode_needs_the_operators(numpy_path):
    """Without roicore's Paddle operators only dygraph works; a static program is refused
    with the reason (the operators' static and graph modes: test_paddle_native.py)."""
    paddle.enable_static()
    try:
        with paddle.static.program_guard(paddle.static.Program()):
            x = paddle.static.data("x", [None, 3, 8, 8], "float32")
            b = paddle.static.data("b", [None, 4], "float32")
            n = paddle.static.data("n", [None], "int32")
            with pytest.raises(RuntimeError, match="needs roicore's Paddle operators"):
                rp.roi_pool(x, b, n, 2)
    finally:
        paddle.disable_static()


@pytest.mark.parametrize("full_graph", [False, True], ids=["default", "full_graph"])
def test_to_static_needs_the_operators(full_graph, numpy_path):
    """Without the operators, paddle.jit.to_static (either translator) stops with the
    reason, not with a translator's internal error (the bytecode translator wraps the
    RuntimeError in its own exception type, keeping the message)."""
    class Net(paddle.nn.Layer):
        def forward(self, x, b, n):
            return rp.roi_align(x, b, n, 2)

    x = tensor(np.ones((1, 2, 6, 6)), "float32")
    b, n = tensor([[0, 0, 4, 4]], "float32"), tensor([1], "int32")
    with pytest.raises(Exception, match="needs roicore's Paddle operators"):
        paddle.jit.to_static(Net(), full_graph=full_graph)(x, b, n)


def test_signatures_match_paddle():
    import inspect

    for op in OPS:
        theirs = list(inspect.signature(getattr(native, op)).parameters)
        mine = list(inspect.signature(getattr(rp, op)).parameters)
        assert mine == theirs + ["n_threads"], op
        assert (inspect.signature(getattr(rp, op)).parameters["n_threads"].kind
                is inspect.Parameter.KEYWORD_ONLY)
    assert inspect.signature(rp.roi_align).parameters["aligned"].default is True
    for layer in ("RoIPool", "PSRoIPool", "RoIAlign"):
        assert issubclass(getattr(rp, layer), paddle.nn.Layer)
        assert (list(inspect.signature(getattr(rp, layer).forward).parameters)
                == list(inspect.signature(getattr(native, layer).forward).parameters))


# ----------------------------------------------------------------------------- documentation

def _public(module):
    return [getattr(module, name) for name in module.__all__]


@pytest.mark.parametrize("module", [rp, rl], ids=["paddle", "paddle_legacy"])
def test_docstrings_document_every_argument(module):
    """Paddle's docstring layout (Args / Returns / Examples), with every argument of each
    function, layer constructor and forward described in its own docstring."""
    import inspect

    for obj in _public(module):
        doc = inspect.getdoc(obj)
        signature = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
        params = [name for name in signature.parameters if name != "self"]
        sections = (["Args:"] if params else []) + ([] if inspect.isclass(obj) else
                                                    ["Returns:"]) + ["Examples:"]
        for section in sections:
            assert f"\n{section}\n" in doc, f"{obj.__name__} lacks {section}"
        for name in params:
            assert f"\n    {name} (" in doc, f"{obj.__name__} does not describe {name}"
        if inspect.isclass(obj):
            assert obj.__doc__ is not paddle.nn.Layer.__doc__ and obj.forward.__doc__


@pytest.mark.parametrize("module", [rp, rl], ids=["paddle", "paddle_legacy"])
def test_docstring_examples_run(module):
    import doctest

    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in doctest.DocTestFinder().find(module, module.__name__):
        runner.run(test, out=report.append)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, "".join(report)
    assert results.attempted >= 5 * len(module.__all__)
