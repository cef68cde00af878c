"""Standard RoI workloads: shapes of real detection heads, with random boxes of plausible sizes.

``scale`` shrinks boxes and channels (for quick runs); ``cases`` turns a workload into the
cases the bench workers run (the format of ``roicore.cli.cases``).
"""
import numpy as np

from roicore.core import operators

# name: (N, C, H, W, R, P, op, spatial_scale)
WORKLOADS = {
    "fastrcnn_vgg16":  (1, 512, 38, 50, 2000, 7, "roi", 1 / 16),   # test-time proposals
    "train_b2":        (2, 512, 38, 50, 512, 7, "roi", 1 / 16),    # training minibatch
    "rfcn_psroi":      (1, 21 * 49, 38, 50, 300, 7, "ps", 1 / 16), # R-FCN position-sensitive
    "c4_14x14":        (1, 1024, 64, 64, 1000, 14, "roi", 1 / 16), # ResNet C4 head
}

# The operators timed on each kind of workload: the position-sensitive ones on "ps"
# workloads (their maps have D * P * P channels), the others on "roi" workloads.
OPS_FOR = {"roi": tuple(v.name for v in operators.variants() if not v.operator.position_sensitive),
           "ps": tuple(v.name for v in operators.variants() if v.operator.position_sensitive)}


def shape(name, scale=1.0):
    """(N, C, H, W, R, P, op, spatial_scale), channels and boxes multiplied by ``scale``."""
    N, C, H, W, R, P, op, s = WORKLOADS[name]
    if scale != 1.0:
        if op == "ps":
            C = max(2, round(C // (P * P) * scale)) * P * P
        else:
            C = max(1, round(C * scale))
        R = max(N, round(R * scale) // N * N)
    return N, C, H, W, R, P, op, s


def describe(name, scale=1.0):
    if name in PYRAMID_WORKLOADS:
        return describe_pyramid(name, scale)
    N, C, H, W, R, P, op, s = shape(name, scale)
    return f"x {N}x{C}x{H}x{W}, {R} boxes, {P}x{P}, scale 1/{round(1 / s)}"


def make(name, seed=0, scale=1.0):
    N, C, H, W, R, P, op, s = shape(name, scale)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, C, H, W)).astype("float32")
    img_h, img_w = H / s, W / s
    x1 = rng.uniform(0, img_w * 0.9, R); y1 = rng.uniform(0, img_h * 0.9, R)
    w = rng.uniform(16, img_w * 0.5, R); h = rng.uniform(16, img_h * 0.5, R)
    boxes = np.stack([x1, y1, np.minimum(x1 + w, img_w - 1), np.minimum(y1 + h, img_h - 1)], 1).astype("float32")
    batch = np.repeat(np.arange(N), R // N).astype("int32")
    return x, boxes, batch, P, s, op


# roi_align's arguments on every workload: two samples per bin side, half-pixel aligned
# (ps_roi_align takes the sampling ratio; it is always aligned).
ALIGN_ARGS = dict(sampling_ratio=2, aligned=True)


def cases(name, ops, seed=0, scale=1.0):
    """``{op: (case, dy)}``: workload ``name`` as a case of each operator in ``ops`` (one
    feature map and one set of boxes for all; bilinear pooling gets the boxes normalised as
    it takes them), and an upstream gradient of the output's shape (one array for all the
    operators whose outputs have the same shape).
    """
    from .cases import NORMALISED, POSITION_SENSITIVE, normalised
    x, boxes, batch, P, s, _ = make(name, seed=seed, scale=scale)
    rois = np.hstack([batch[:, None], boxes]).astype(np.float64)
    out, gradients = {}, {}
    for op in ops:
        case = dict(name=name, group="workload", op=op, x=x, rois=rois, output_size=(P, P),
                    spatial_scale=s, seed=seed, **ALIGN_ARGS)
        if op in NORMALISED:
            case.update(rois=normalised(rois, s, *x.shape[2:]), spatial_scale=1.0)
        shape = (len(rois), x.shape[1] // (P * P) if op in POSITION_SENSITIVE else x.shape[1], P,
                 P)
        if shape not in gradients:
            gradients[shape] = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        out[op] = (case, gradients[shape])
    return out


# ----------------------------------------------------------------------------- pyramids
# Feature-pyramid (FPN) workloads: one map per stride of an image, the boxes pooled by
# roicore.core.pyramid_roi_align from the level each box's size assigns.  They are not in
# WORKLOADS (whose entries are one map each) and run only when asked for by name or by
# their operator (``cli/_pyramid_bench.py``).
# name: (N, C, image (H, W), strides, R, P)
PYRAMID_WORKLOADS = {
    "fpn_box":  (1, 256, (800, 1216), (4, 8, 16, 32), 1000, 7),   # Faster R-CNN FPN box head
    "fpn_mask": (1, 256, (800, 1216), (4, 8, 16, 32), 100, 14),   # Mask R-CNN mask head
}
PYRAMID_OPS = ("pyramid_roi_align",)
# torchvision's MultiScaleRoIAlign: two samples per bin side, not half-pixel aligned
PYRAMID_ARGS = dict(sampling_ratio=2, aligned=False)
# the boxes' sides: sqrt(w * h) log-uniform in this range (pixels), as RPN proposals of a
# COCO-sized image span every level; h / w log-uniform in [1/2, 2]
PYRAMID_BOX_SIDES = (16.0, 800.0)


def ops_for(name):
    """The operators timed on workload ``name``."""
    return PYRAMID_OPS if name in PYRAMID_WORKLOADS else OPS_FOR[WORKLOADS[name][6]]


def pyramid_shape(name, scale=1.0):
    """(N, C, (H, W), strides, R, P), channels and boxes multiplied by ``scale``."""
    N, C, image, strides, R, P = PYRAMID_WORKLOADS[name]
    if scale != 1.0:
        C = max(1, round(C * scale))
        R = max(N, round(R * scale) // N * N)
    return N, C, image, strides, R, P


def pyramid_map_shapes(name, scale=1.0):
    """The (N, C, H, W) of each level's map, finest first."""
    N, C, (H, W), strides, _, _ = pyramid_shape(name, scale)
    return [(N, C, -(-H // s), -(-W // s)) for s in strides]


def describe_pyramid(name, scale=1.0):
    N, C, (H, W), strides, R, P = pyramid_shape(name, scale)
    maps = ", ".join(f"{h}x{w}" for _, _, h, w in pyramid_map_shapes(name, scale))
    return (f"image {H}x{W}, x {N}x{C} at strides {', '.join(map(str, strides))} ({maps}), "
            f"{R} boxes, {P}x{P}")


def pyramid_case(name, seed=0, scale=1.0):
    """``(case, dy)``: workload ``name`` as the pyramid bench takes it (maps, boxes in image
    pixels grouped by image, their images, the maps' scales) and an upstream gradient of
    the output's shape."""
    N, C, (H, W), strides, R, P = pyramid_shape(name, scale)
    rng = np.random.default_rng(seed)
    maps = [rng.standard_normal(s).astype("float32") for s in pyramid_map_shapes(name, scale)]
    lo, hi = np.log(PYRAMID_BOX_SIDES)
    side = np.exp(rng.uniform(lo, hi, R))
    aspect = np.exp(rng.uniform(np.log(0.5), np.log(2.0), R))
    w, h = side / np.sqrt(aspect), side * np.sqrt(aspect)
    cx, cy = rng.uniform(0, W, R), rng.uniform(0, H, R)
    # clipped to the image, as torchvision's detectors clip their proposals
    boxes = np.stack([np.maximum(cx - w / 2, 0), np.maximum(cy - h / 2, 0),
                      np.minimum(cx + w / 2, W), np.minimum(cy + h / 2, H)], 1).astype("float32")
    batch = np.repeat(np.arange(N), R // N).astype("int32")
    case = dict(name=name, op=PYRAMID_OPS[0], maps=maps, boxes=boxes, batch=batch,
                image_size=(H, W), strides=tuple(strides), scales=[1.0 / s for s in strides],
                output_size=(P, P), seed=seed, **PYRAMID_ARGS)
    dy = np.random.default_rng(1).standard_normal((R, C, P, P)).astype(np.float32)
    return case, dy
