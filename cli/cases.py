"""The parity case suite, user inputs (``--inputs FILE.npz``) and the comparison rule.

A case is a dict of framework-neutral NumPy data:

    name, group        "golden" | "random" | "adversarial" | "inputs" | "training"
    op                 an operator variant of roicore.core.operators ("roi_pool",
                       "roi_pool_bilinear", "psroi_pool", ...)
    x                  (N, C, H, W) float64 (cast to the dtype under test)
    rois               (K, 5) float64 rows [batch, x1, y1, x2, y2], grouped by batch;
                       image pixels, except for the crop methods (bilinear, nearest):
                       normalised [0, 1] boxes
    output_size        (PH, PW)
    spatial_scale      float
    sampling_ratio     int (for the operators that take it)
    aligned            bool (for the operators that take it)
    seed               seeds the upstream gradient of the backward pass
    expected           golden cases only: the known forward output
    images, weight,    training cases only (``training_case``)
    target, steps, lr
    conventions        golden cases only, optional: the conventions it holds for (default:
                       every convention of the operator)

The pyramid operators (``PYRAMID_OPS``) take one map per level: their ``x`` is a list of
(N, C, H_l, W_l) maps, finest first, with ``spatial_scales`` (1/4, 1/8, ...) and the
``image_size`` (H, W) the maps were computed from; their boxes are in image pixels.  Model
cases (group "model", ``model_cases``) hold a detector's images and training targets.
"""
from __future__ import annotations

import zlib

import numpy as np

from roicore.core import operators

# Every operator variant of roicore.core (roicore.core.operators), in the table's order.
OPS = tuple(v.name for v in operators.variants())
# the operators whose input has output_channels * PH * PW channels
POSITION_SENSITIVE = tuple(v.name for v in operators.variants() if v.operator.position_sensitive)
# the operators that take boxes normalised to [0, 1] (the crop methods)
NORMALISED = tuple(v.name for v in operators.variants() if v.method.normalised_boxes)
# The conventions roicore.core can compute for each operator (roicore.core.conventions).
CONVENTIONS = {v.name: v.conventions for v in operators.variants()}
# what the command line takes for an operator's other methods: "bilinear", "nearest"
OP_ALIASES = {v.method.name: v.name for v in operators.variants() if v.name != v.operator.name}
# The operators over a feature pyramid (roicore.core.pyramid): each framework's own FPN pooler
# against roicore's adapter for it ("multi_scale_roi_align": torchvision's MultiScaleRoIAlign,
# PaddleDetection's RoIAlign extractor, GluonCV's _pyramid_roi_feats), and a native pooler
# against roicore.core's pyramid_roi_align ("pyramid_roi_align").  They take a list of maps,
# so they are not in the single-map operator table (OPS) that the benchmark runs; parity runs
# both lists.
PYRAMID_OPS = ("multi_scale_roi_align", "pyramid_roi_align")
PARITY_OPS = OPS + PYRAMID_OPS


def _seed(op):
    """A stable seed per operator (its name's CRC): adding an operator to the table
    leaves the other operators' cases as they were."""
    return zlib.crc32(op.encode())


def _case(name, group, op, x, rois, output_size, spatial_scale=1.0, sampling_ratio=-1,
          aligned=False, seed=0, expected=None, conventions=None):
    x = np.asarray(x, np.float64)
    rois = np.asarray(rois, np.float64).reshape(-1, 5)
    rois = rois[np.argsort(rois[:, 0], kind="stable")]  # grouped by image (Paddle's boxes_num)
    ph, pw = (output_size, output_size) if np.ndim(output_size) == 0 else output_size
    c = dict(name=name, group=group, op=op, x=x, rois=rois, output_size=(int(ph), int(pw)),
             spatial_scale=float(spatial_scale), sampling_ratio=int(sampling_ratio),
             aligned=bool(aligned), seed=int(seed))
    if expected is not None:
        c["expected"] = np.asarray(expected, np.float64)
    if conventions is not None:
        c["conventions"] = tuple(conventions)
    return c


# ----------------------------------------------------------------------------- golden
def golden_cases():
    """Published values (the oracle notes' 8x6 example and the R-FCN / RoIAlign examples),
    and hand-worked ones for torchvision's position-sensitive operators."""
    x86 = np.arange(48.0).reshape(1, 1, 8, 6)
    ps = np.arange(288.0).reshape(1, 8, 6, 6)
    rois_a = [[0, 0, 0, 4, 4], [0, .5, 1.5, 3.7, 6.2]]
    # a map linear in (h, w) per channel: an aligned 2 x 2 bin's one sample at its centre
    linear = 100 * np.arange(4.0)[:, None, None] + np.arange(16.0).reshape(4, 4)
    return [
        _case("8x6_scale1", "golden", "roi_pool", x86, [[0, 0, 0, 4, 4]], 2, 1.0,
              expected=[[[[14, 16], [26, 28]]]]),
        _case("8x6_scale0.7", "golden", "roi_pool", x86, [[0, 0, 0, 4, 4]], 2, 0.7,
              expected=[[[[7, 9], [19, 21]]]]),
        _case("rfcn_D2_P2", "golden", "psroi_pool", ps, [[0, 0, 0, 3, 3], [0, 1, 1, 5, 4]], 2, 1.0,
              expected=[[[[3.5, 41.5], [87.5, 125.5]], [[147.5, 185.5], [231.5, 269.5]]],
                        [[[11, 49], [95, 133]], [[155, 193], [239, 277]]]],
              conventions=("mxnet", "paddle")),
        _case("torchvision_bins_P2", "golden", "psroi_pool", np.arange(256.0).reshape(1, 4, 8, 8),
              [[0, 0, 0, 4, 4], [0, 2, 2, 7, 7]], 2, 1.0,
              expected=[[[[4.5, 70.5], [148.5, 214.5]]], [[[27, 93], [171, 237]]]],
              conventions=("torchvision",)),
        _case("linear_map_P2", "golden", "ps_roi_align", linear[None], [[0, .5, .5, 2.5, 2.5]], 2,
              expected=[[[[2.5, 103.5], [206.5, 307.5]]]], conventions=("torchvision",)),
        # unaligned (MXNet's default): the samples at (1 + ph, 1 + pw)
        _case("linear_map_P2_unaligned", "golden", "ps_roi_align", linear[None],
              [[0, .5, .5, 2.5, 2.5]], 2, expected=[[[[5, 106], [209, 310]]]],
              conventions=("mxnet",)),
        _case("8x6_sr2", "golden", "roi_align", x86, rois_a, 2, 1.0, 2, False,
              expected=[[[[7, 9], [19, 21]]], [[[17.35, 18.95], [31.45, 33.05]]]]),
        _case("8x6_sr2_aligned", "golden", "roi_align", x86, rois_a, 2, 1.0, 2, True,
              expected=[[[[3.5, 5.5], [15.5, 17.5]]], [[[13.85, 15.45], [27.95, 29.55]]]]),
        _case("8x6_corner_box", "golden", "roi_pool_bilinear", x86, [[0, 0, 0, 4 / 5, 4 / 7]], 2,
              expected=[[[[0, 4], [24, 28]]]]),
        _case("8x6_whole_map", "golden", "roi_pool_bilinear", x86, [[0, 0, 0, 1, 1]], 2,
              expected=[[[[0, 5], [42, 47]]]]),
    ]


# ----------------------------------------------------------------------------- adversarial
def _grids(op):
    """The (sampling_ratio, aligned) pairs a case of ``op`` runs with: every combination
    of the options it takes (sampling ratio -1 and 2, aligned False and True)."""
    options = operators.variant(op).operator.options
    ratios = (-1, 2) if "sampling_ratio" in options else (-1,)
    aligns = (False, True) if "aligned" in options else (False,)
    return [(sr, al) for al in aligns for sr in ratios]


def _grid_suffix(op, sr, aligned):
    options = operators.variant(op).operator.options
    return (f"_aligned{int(aligned)}" if "aligned" in options else "") + \
        (f"_sr{sr}" if "sampling_ratio" in options else "")


def adversarial_cases(op):
    rng = np.random.default_rng(57)
    out = []
    if op in NORMALISED:
        x = rng.standard_normal((2, 3, 9, 13))
        boxes = [[0, 0, 0, 1, 1], [1, 1, 1, 0, 0],             # whole map, flipped
                 [0, -0.4, -0.3, 0.5, 0.6],                     # partly outside
                 [1, 1.2, 1.1, 1.6, 1.5], [0, -0.9, -0.5, -0.2, -0.1],  # wholly outside
                 [0, 0.3, 0.4, 0.3, 0.4],                       # zero size
                 [1, 0.5, 0.5, 0.25, 0.75],                     # reversed in x
                 [0, 0.125, 0.375, 0.625, 0.875]]               # exact binary fractions
        for size in ((7, 7), (1, 1), (7, 5), (1, 4)):
            out.append(_case(f"edge_boxes_{size[0]}x{size[1]}", "adversarial", op, x, boxes, size,
                             seed=size[0] * 10 + size[1]))
        x1 = rng.standard_normal((2, 2, 1, 6))                  # H == 1: (H-1) == 0
        out.append(_case("height_1_map", "adversarial", op, x1, boxes, (3, 3), seed=3))
        return out
    ps = op in POSITION_SENSITIVE
    # P=7 with RoI heights 57 and 29: float32/float64 bins floor(p*rh/P) go off by one.
    x = rng.standard_normal((2, 2 * 49 if ps else 3, 64, 64))
    base = []
    base.append(("bins_P7_h57_h29", x, [[0, 0, 0, 56, 56], [0, 1, 1, 29, 29], [1, 3, 2, 30, 58],
                                        [1, 0, 0, 63, 63]], 7, 1.0))
    P = 2 if ps else 3
    x = rng.standard_normal((2, 2 * P * P if ps else 3, 12, 10))
    boxes = [[0, -5, -5, 3, 4],        # partly outside (top-left)
             [0, 8, 9, 15, 20],        # partly outside (bottom-right)
             [0, 20, 20, 30, 30],      # wholly outside
             [1, -9, -9, -2, -3],      # wholly outside, negative
             [1, 7, 8, 2, 3],          # reversed
             [1, 4, 4, 4, 4],          # zero size
             [1, 2.5, 3.5, 7.5, 9.5]]  # halves at scale 1
    base.append(("outside_reversed_zero", x, boxes, P, 1.0))
    for s, tag in ((0.7, "0.7"), (1 / 16, "1/16")):
        k = rng.integers(-2, 12, (8, 4)).astype(np.float64)
        halves = np.hstack([[[0]] * 5 + [[1]] * 3, (k + 0.5) / s])   # (k + .5) / s: exact halves
        base.append((f"halves_scale_{tag}", x, halves, P if ps else (P, P + 1), s))
    for i, (name, xx, b, size, s) in enumerate(base):
        for sr, aligned in _grids(op):
            out.append(_case(name + _grid_suffix(op, sr, aligned), "adversarial", op, xx, b, size,
                             s, sr, aligned, seed=100 + i))
    return out


# ----------------------------------------------------------------------------- random
def random_cases(op, n, seed):
    """``n`` seeded random cases: random shapes, scales, boxes of every kind."""
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, _seed(op), i])
        N = int(rng.integers(1, 4))
        H, W = (int(v) for v in rng.integers(1, 24, 2))
        K = int(rng.integers(1, 14))
        if op in NORMALISED:
            PH, PW = (int(v) for v in rng.integers(1, 8, 2))
            C = int(rng.integers(1, 5))
            b = rng.uniform(-0.4, 1.4, (K, 4))
            b[: K // 3] = rng.uniform(0, 1, (K // 3, 4))
            kind = rng.integers(0, 3, K)
            b[kind == 1, 2:] = b[kind == 1, :2]                   # zero size
            rois = np.hstack([rng.integers(0, N, (K, 1)), b])
            out.append(_case(f"random_{i}", "random", op, rng.standard_normal((N, C, H, W)), rois,
                             (PH, PW), seed=seed * 1000 + i))
            continue
        if op in POSITION_SENSITIVE:
            P = int(rng.integers(1, 5))
            PH = PW = P
            C = int(rng.integers(2, 4)) * P * P
        else:
            PH, PW = (int(v) for v in rng.integers(1, 8, 2))
            C = int(rng.integers(1, 5))
        s = float(rng.choice([1.0, 0.5, 0.7, 0.25, 1 / 16]))
        lo = np.array([W, H]) / s
        p1 = rng.uniform(-0.3, 1.1, (K, 2)) * lo
        p2 = p1 + rng.uniform(-0.2, 0.8, (K, 2)) * lo            # some reversed
        b = np.concatenate([p1, p2], 1)
        kind = rng.integers(0, 4, K)
        b[kind == 1] = np.round(b[kind == 1] * s * 2) / 2 / s   # exact halves of feature pixels
        b[kind == 2, 2:] = b[kind == 2, :2]                      # zero size
        b[kind == 3] = np.round(b[kind == 3])                    # integral
        rois = np.hstack([rng.integers(0, N, (K, 1)), b])
        options = operators.variant(op).operator.options
        sr = int(rng.choice([-1, 0, 1, 2, 3])) if "sampling_ratio" in options else -1
        aligned = bool(rng.integers(2)) if "aligned" in options else False
        out.append(_case(f"random_{i}", "random", op, rng.standard_normal((N, C, H, W)), rois,
                         (PH, PW), s, sr, aligned, seed=seed * 1000 + i))
    return out


def suite(ops, n_random, seed):
    cases = [c for c in golden_cases() if c["op"] in ops]
    for op in ops:
        if op in PYRAMID_OPS:
            cases += pyramid_adversarial_cases(op)
            cases += pyramid_random_cases(op, n_random, seed)
            continue
        cases += adversarial_cases(op)
        cases += random_cases(op, n_random, seed)
    return cases


# ----------------------------------------------------------------------------- pyramid
def _pyramid_case(name, group, op, rng, image_size, N, C, rois, output_size, sampling_ratio,
                  seed, levels=4):
    """A pyramid case: ``levels`` random maps of scales 1/4, 1/8, ... of an image of
    ``image_size`` (each ceil(H / 2**k) x ceil(W / 2**k), as an FPN computes them, so that
    torchvision infers the same scales from their sizes) and boxes in image pixels."""
    H, W = image_size
    ks = range(2, 2 + levels)
    maps = [rng.standard_normal((N, C, -(-H // 2 ** k), -(-W // 2 ** k))) for k in ks]
    c = _case(name, group, op, maps[0], rois, output_size, 1.0, sampling_ratio, False, seed)
    del c["spatial_scale"]
    c.update(x=maps, spatial_scales=[2.0 ** -k for k in ks], image_size=(int(H), int(W)))
    return c


def pyramid_adversarial_cases(op):
    """Boxes of every level, on and beside the level boundaries (sqrt(area) = 112, 224,
    448 and within the rule's 1e-6 of them), degenerate boxes (reversed, empty, outside the
    image, larger than it), an image with no boxes, and a pyramid of one level."""
    rng = np.random.default_rng([59, _seed(op)])
    out = []
    # square boxes of side s at integral corners: the level boundaries exactly, and sides
    # 2**-5e-7, 2**-1.2e-6 and 2**-2e-6 below 224: within the rule's 1e-6 of level 4 whether
    # it is added to the level or to s / 224, within it only when added to s / 224, and not
    sides = [4, 16, 56, 111.5, 112, 150, 224 * 2 ** -2e-6, 224 * 2 ** -1.2e-6, 224 * 2 ** -5e-7,
             224, 300, 447.5, 448, 520, 700]
    rois = []
    for i, s in enumerate(sides):
        x1, y1 = float(rng.integers(0, 96)), float(rng.integers(0, 96))
        rois.append([i % 2, x1, y1, x1 + s, y1 + s])
    for i in range(10):            # boxes of any aspect at fractional corners
        x1, y1 = rng.uniform(-20, 500, 2)
        w, h = np.exp(rng.uniform(np.log(2), np.log(700), 2))
        rois.append([i % 2, x1, y1, x1 + w, y1 + h])
    for sr in (-1, 2):
        out.append(_pyramid_case(f"levels_all_sr{sr}", "adversarial", op, rng, (512, 640), 2, 2,
                                 rois, 7, sr, seed=300 + sr))
    degenerate = [[0, 40, 30, 10, 90],          # reversed in x: a negative area
                  [0, 90, 80, 20, 10],          # reversed in x and y: a positive area
                  [2, 50, 60, 50, 60],          # zero size
                  [2, 30, 20, 30, 120],         # zero width
                  [0, 400, 300, 480, 380],      # wholly outside, beyond the image
                  [2, -90, -60, -10, -5],       # wholly outside, negative
                  [0, -30, -20, 60, 50],        # partly outside
                  [2, 200, 150, 900, 700],      # far larger than the image
                  [0, 10.25, 20.75, 10.75, 21],  # under a pixel
                  [2, 0, 0, 320, 256],          # the whole image
                  [0, 5, 5, 40.5, 60.25]]       # image 1 has no boxes
    for sr, size in ((-1, 5), (2, 2)):
        out.append(_pyramid_case(f"degenerate_sr{sr}", "adversarial", op, rng, (256, 320), 3, 3,
                                 degenerate, size, sr, seed=310 + sr))
    out.append(_pyramid_case("one_level", "adversarial", op, rng, (128, 160), 3, 2, degenerate,
                             3, 2, seed=320, levels=1))
    return out


def pyramid_random_cases(op, n, seed):
    """``n`` seeded random pyramid cases: 1 to 4 levels, boxes of log-uniform sizes from a
    pixel to beyond the image, some reversed, empty, integral or outside."""
    out = []
    for i in range(n):
        rng = np.random.default_rng([seed, _seed(op), i])
        N, C, K = int(rng.integers(1, 4)), int(rng.integers(1, 4)), int(rng.integers(1, 17))
        H, W = (int(v) for v in rng.integers(96, 400, 2))
        levels = int(rng.choice([1, 2, 3, 4, 4, 4]))
        p1 = rng.uniform(-0.2, 1.0, (K, 2)) * [W, H]
        size = np.exp(rng.uniform(0, np.log(800), (K, 2)))
        b = np.concatenate([p1, p1 + size], 1)
        kind = rng.integers(0, 5, K)
        b[kind == 1, 2] = b[kind == 1, 0] - size[kind == 1, 0]    # reversed in x
        b[kind == 2, 2:] = b[kind == 2, :2]                         # zero size
        b[kind == 3] = np.round(b[kind == 3])                       # integral
        rois = np.hstack([rng.integers(0, N, (K, 1)), b])
        PH, PW = (int(v) for v in rng.integers(1, 8, 2))
        if rng.integers(2):
            PW = PH                                                 # square (OpenVINO's)
        sr = int(rng.choice([-1, 0, 1, 2, 3]))
        out.append(_pyramid_case(f"random_{i}", "random", op, rng, (H, W), N, C, rois,
                                 (PH, PW), sr, seed=seed * 1000 + i, levels=levels))
    return out


def model_cases(ops):
    """The model rows' cases (``_pyramid_parity_models``): torchvision's FPN detectors with
    the RoI heads' poolers swapped for roicore's, for the adapter's operator."""
    from ._pyramid_parity_models import MODELS, model_case
    op = "multi_scale_roi_align"
    return [model_case(m, op) for m in MODELS] if op in ops else []


# ----------------------------------------------------------------------------- training
TRAIN_STEPS = 5
TRAIN_LR = 0.05


def training_case(op):
    """A small detection head's data for ``op``: a 3-channel image batch that a 3x3
    convolution (padding 1) turns into the feature map ``x`` has the shape of, the
    convolution's initial weight (C, 3, 3, 3), proposals inside the images (several
    overlapping, one per image on exact feature-pixel halves) and the target the loss
    mean((op(conv(images)) - target)**2) pulls towards.  ``x`` is zeros: the feature map is
    the convolution's output, step after step."""
    rng = np.random.default_rng([97, _seed(op)])
    N, H, W, K = 2, 14, 18, 10
    ps = op in POSITION_SENSITIVE
    P = 3 if ps else 4
    C = 2 * P * P if ps else 6
    if op in NORMALISED:
        y1, x1 = rng.uniform(0, 0.6, (2, K))
        b = np.stack([x1, y1, x1 + rng.uniform(0.15, 0.4, K), y1 + rng.uniform(0.15, 0.4, K)], 1)
        s, sr = 1.0, -1
    else:
        s, sr = 0.5, 2                                       # boxes in pixels of a 2x image
        p1 = rng.uniform(0, 0.6, (K, 2)) * [W / s, H / s]
        b = np.concatenate([p1, p1 + rng.uniform(4, 14, (K, 2)) / s], 1)
        b[[0, K // 2]] = np.round(b[[0, K // 2]] * s * 2) / 2 / s + 1 / (2 * s)
    rois = np.hstack([np.repeat(np.arange(N), K // N)[:, None], b])
    c = _case(f"training_{op}", "training", op, np.zeros((N, C, H, W)), rois, P, s, sr,
              seed=_seed(op) % 1000)
    c.update(images=rng.standard_normal((N, 3, H, W)),
             weight=rng.standard_normal((C, 3, 3, 3)) * 0.3,
             target=rng.standard_normal((K, C // (P * P) if ps else C, P, P)),
             steps=TRAIN_STEPS, lr=TRAIN_LR)
    return c


# ----------------------------------------------------------------------------- user input
def normalised(rois, spatial_scale, H, W):
    """Image-pixel ``rois`` as bilinear pooling takes them (crop_and_resize's normalised boxes):
    x * spatial_scale / (W - 1), y * spatial_scale / (H - 1)."""
    r = np.array(rois, np.float64)
    r[:, [1, 3]] *= spatial_scale / max(W - 1, 1)
    r[:, [2, 4]] *= spatial_scale / max(H - 1, 1)
    return r



INPUT_KEYS = """\
--inputs FILE.npz keys (np.savez(FILE, x=..., rois=..., ...)):
  x               (N, C, H, W) float32 or float64 feature map (required)
  rois            (K, 5) rows [batch, x1, y1, x2, y2] in image pixels, or
  boxes           (K, 4) rows [x1, y1, x2, y2] together with
  batch_indices   (K,) integer image index of each box
  spatial_scale   float, default 1.0 (feature size / image size)
  output_size     int or (PH, PW), default 7
  sampling_ratio  int, default -1 (roi_align, ps_roi_align; -1 or 0 = adaptive)
  aligned         bool, default False (roi_align)
  dy              optional upstream gradient for the backward pass, shape of the op's output
                  (default: seeded random)
The crop methods (bilinear and nearest: OpenVINO / TF crop_and_resize) get the same boxes
normalised to [0, 1]: x * spatial_scale / (W - 1), y * spatial_scale / (H - 1).  psroi_pool and ps_roi_align run
when C is a multiple of PH * PW (output channels C / (PH * PW))."""


def load_inputs(path, ops):
    """Cases (one per operator) from a user's saved feature map and boxes; notes for skips."""
    z = np.load(path, allow_pickle=False)
    keys = set(z.files)
    if "x" not in keys:
        raise ValueError(f"{path}: no 'x' array\n{INPUT_KEYS}")
    x = np.asarray(z["x"])
    if x.ndim != 4 or x.dtype.kind != "f":
        raise ValueError(f"{path}: x must be a 4-D float array (N, C, H, W), got {x.dtype} {x.shape}")
    if "rois" in keys:
        rois = np.asarray(z["rois"], np.float64)
        if rois.ndim != 2 or rois.shape[1] != 5:
            raise ValueError(f"{path}: rois must have shape (K, 5), got {rois.shape}")
    elif "boxes" in keys and "batch_indices" in keys:
        boxes = np.asarray(z["boxes"], np.float64)
        bi = np.asarray(z["batch_indices"]).reshape(-1)
        if boxes.ndim != 2 or boxes.shape[1] != 4 or bi.shape[0] != boxes.shape[0]:
            raise ValueError(f"{path}: boxes must be (K, 4) with batch_indices (K,), got "
                             f"{boxes.shape} and {bi.shape}")
        rois = np.hstack([bi.astype(np.float64)[:, None], boxes])
    else:
        raise ValueError(f"{path}: needs 'rois' (K, 5), or 'boxes' (K, 4) and 'batch_indices'\n"
                         f"{INPUT_KEYS}")

    def get(k, default):
        return z[k].tolist() if k in keys else default

    s = float(get("spatial_scale", 1.0))
    size = get("output_size", 7)
    size = (int(size), int(size)) if np.ndim(size) == 0 else (int(size[0]), int(size[1]))
    sr = int(get("sampling_ratio", -1))
    aligned = bool(get("aligned", False))
    dtype = np.float32 if x.dtype == np.float16 else x.dtype.type
    N, C, H, W = x.shape
    order = np.argsort(rois[:, 0], kind="stable")
    notes = []
    if np.any(order != np.arange(len(order))):
        notes.append("rois reordered by batch index (Paddle's boxes_num needs boxes grouped by image)")
    cases = []
    for op in ops:
        if op in PYRAMID_OPS:
            notes.append(f"{op} skipped: it pools from one map per pyramid level, and the "
                         "file holds one map")
            continue
        if op in POSITION_SENSITIVE and C % (size[0] * size[1]):
            notes.append(f"{op} skipped: C={C} is not a multiple of {size[0]}x{size[1]}")
            continue
        crop = op in NORMALISED
        c = _case("inputs", "inputs", op, x, normalised(rois, s, H, W) if crop else rois, size,
                  1.0 if crop else s, sr, aligned, seed=0)
        c["x"] = np.asarray(x, dtype)          # keep the user's dtype
        if "dy" in keys:
            c["dy"] = np.asarray(z["dy"])
        cases.append(c)
    meta = dict(file=str(path), x_shape=list(x.shape), dtype=np.dtype(dtype).name,
                boxes=int(rois.shape[0]), output_size=list(size), spatial_scale=s,
                sampling_ratio=sr, aligned=aligned, notes=notes)
    return cases, meta


# ----------------------------------------------------------------------------- comparison
def compare(a, b):
    """(elements, mismatching elements, max abs diff): bit-for-bit, NaN == NaN."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return max(a.size, b.size), max(a.size, b.size), float("inf")
    if a.size == 0:
        return 0, 0, 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    if a.dtype == b.dtype:
        same = (a.view(f"u{a.itemsize}") == b.view(f"u{b.itemsize}")) | both_nan
    else:
        same = (a64 == b64) | both_nan
    with np.errstate(invalid="ignore"):
        d = np.abs(a64 - b64)
    d[both_nan] = 0.0
    d[np.isnan(d)] = np.inf                     # NaN on one side only
    return int(a.size), int(np.count_nonzero(~same)), float(d.max())
