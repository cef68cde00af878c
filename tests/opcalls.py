"""Calls of every roicore.core operator with valid defaults, for the validation,
accepted-input and concurrency tests: override one argument and see what happens."""
from __future__ import annotations

import numpy as np

import roicore.core as rc
from roicore.core.conventions import BILINEAR_POOL, MAX_POOL, PSROI_ALIGN, PSROI_POOL, ROI_ALIGN

# ---------------------------------------------------------------------------------------
# shared inputs and a uniform way to call every operator
# ---------------------------------------------------------------------------------------

N, C, H, W = 2, 8, 6, 7
PS = 2                       # pooled size; psroi: C = 8 = D * 2 * 2 -> D = 2
_rng = np.random.default_rng(1234)
X = _rng.standard_normal((N, C, H, W)).astype(np.float32)

# [batch, x1, y1, x2, y2] in pixels, and normalised boxes for the crop methods (bilinear,
# nearest)
BOXES = np.array([[0, 0.5, 1.0, 4.2, 5.1],
                  [1, 1.0, 0.5, 6.0, 3.0]], np.float32)
NBOXES = np.array([[0, 0.1, 0.2, 0.8, 0.9],
                   [1, 0.05, 0.3, 0.5, 0.95]], np.float32)

FORWARD = ["roi_pool_max", "roi_pool_bilinear", "roi_pool_nearest", "psroi_pool",
           "psroi_pool_torchvision", "roi_align", "ps_roi_align"]
BACKWARD = ["roi_pool_backward_max", "roi_pool_backward_bilinear", "roi_pool_backward_nearest",
            "psroi_pool_backward", "psroi_pool_backward_torchvision", "roi_align_backward",
            "ps_roi_align_backward"]
ALL_OPS = FORWARD + BACKWARD
PSROI_OPS = ["psroi_pool", "psroi_pool_backward", "psroi_pool_torchvision",
             "psroi_pool_backward_torchvision"]
ALIGN_OPS = ["roi_align", "roi_align_backward"]
PS_ALIGN_OPS = ["ps_roi_align", "ps_roi_align_backward"]
# operators that take sampling_ratio
SAMPLING_OPS = ALIGN_OPS + PS_ALIGN_OPS
# operators that use the box coordinates (max-pool backward only needs argmax and batch)
COORD_OPS = [op for op in ALL_OPS if op != "roi_pool_backward_max"]

_FN = {
    "roi_pool_max": (rc.roi_pool, {"method": "max"}),
    "roi_pool_bilinear": (rc.roi_pool, {"method": "bilinear"}),
    "roi_pool_nearest": (rc.roi_pool, {"method": "nearest"}),
    "psroi_pool": (rc.psroi_pool, {}),
    "psroi_pool_torchvision": (rc.psroi_pool, {"convention": "torchvision"}),
    "roi_align": (rc.roi_align, {}),
    "ps_roi_align": (rc.ps_roi_align, {}),
    "roi_pool_backward_max": (rc.roi_pool_backward, {"method": "max"}),
    "roi_pool_backward_bilinear": (rc.roi_pool_backward, {"method": "bilinear"}),
    "roi_pool_backward_nearest": (rc.roi_pool_backward, {"method": "nearest"}),
    "psroi_pool_backward": (rc.psroi_pool_backward, {}),
    "psroi_pool_backward_torchvision": (rc.psroi_pool_backward, {"convention": "torchvision"}),
    "roi_align_backward": (rc.roi_align_backward, {}),
    "ps_roi_align_backward": (rc.ps_roi_align_backward, {}),
}

# the conventions table and rules type each operator takes
_RULES = {
    "roi_pool_max": (MAX_POOL, "MaxPoolRules"),
    "roi_pool_backward_max": (MAX_POOL, "MaxPoolRules"),
    "roi_pool_bilinear": (BILINEAR_POOL, "BilinearPoolRules"),
    "roi_pool_backward_bilinear": (BILINEAR_POOL, "BilinearPoolRules"),
    "roi_pool_nearest": (BILINEAR_POOL, "BilinearPoolRules"),
    "roi_pool_backward_nearest": (BILINEAR_POOL, "BilinearPoolRules"),
    "psroi_pool": (PSROI_POOL, "PSRoIPoolRules"),
    "psroi_pool_backward": (PSROI_POOL, "PSRoIPoolRules"),
    "psroi_pool_torchvision": (PSROI_POOL, "PSRoIPoolRules"),
    "psroi_pool_backward_torchvision": (PSROI_POOL, "PSRoIPoolRules"),
    "roi_align": (ROI_ALIGN, "RoIAlignRules"),
    "roi_align_backward": (ROI_ALIGN, "RoIAlignRules"),
    "ps_roi_align": (PSROI_ALIGN, "PSRoIAlignRules"),
    "ps_roi_align_backward": (PSROI_ALIGN, "PSRoIAlignRules"),
}


def crop(op):
    """Whether op samples like crop_and_resize (normalised boxes)."""
    return op.endswith(("bilinear", "nearest"))


def default_boxes(op):
    return NBOXES if crop(op) else BOXES


def position_sensitive(op):
    return op.startswith(("psroi", "ps_roi"))


def out_channels(op):
    """Channels of the forward output (position-sensitive: D = C / (PS * PS))."""
    return C // (PS * PS) if position_sensitive(op) else C


def call(op, *, x=None, boxes=None, output_size=PS, spatial_scale=1.0, grad=None,
         input_shape=None, **kw):
    """Call operator ``op`` with valid defaults, overriding the given arguments.

    Forward operators take ``x`` and ``output_size``; backward operators take ``grad``
    (default: ones of the forward output's shape) and ``input_shape`` (default X.shape).
    roi_pool_backward(method='max') gets an all -1 argmax unless one is passed.
    """
    fn, extra = _FN[op]
    if boxes is None:
        boxes = default_boxes(op)
    kwargs = {**extra, **kw}
    if op in FORWARD:
        return fn(X if x is None else x, boxes, output_size, spatial_scale, **kwargs)
    shape = X.shape if input_shape is None else input_shape
    if grad is None:
        k = np.shape(boxes)[0] if np.ndim(boxes) >= 1 else 1
        grad = np.ones((k, out_channels(op), PS, PS), np.float32)
    if op == "roi_pool_backward_max" and "argmax" not in kwargs:
        kwargs["argmax"] = np.full(np.shape(grad), -1, np.int32)
    return fn(grad, boxes, shape, spatial_scale, **kwargs)


def with_value(a, index, value, dtype=None):
    a = np.array(a, dtype=dtype if dtype is not None else np.asarray(a).dtype)
    a[index] = value
    return a


def _argmax_for(boxes=BOXES, convention=None, x=X, **kw):
    _, a = rc.roi_pool(x, boxes, PS, return_argmax=True, convention=convention, **kw)
    return a


def _grad(op, k=2, seed=5):
    return np.random.default_rng(seed).standard_normal(
        (k, out_channels(op), PS, PS)).astype(np.float32)


def run(op, **kw):
    """Call with a meaningful gradient and argmax for backward ops."""
    if op in BACKWARD and "grad" not in kw:
        k = np.shape(kw.get("boxes", default_boxes(op)))[0]
        kw["grad"] = _grad(op, k)
    if op == "roi_pool_backward_max" and "argmax" not in kw:
        boxes = kw.get("boxes", BOXES)
        kw["argmax"] = _argmax_for(boxes, batch_indices=kw.get("batch_indices"))
    return call(op, **kw)

