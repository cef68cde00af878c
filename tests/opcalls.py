"""Calls of every roicore.core operator with valid defaults, for the validation,
accepted-input and concurrency tests: override one argument and see what happens."""
from __future__ import annotations

import numpy as np

import roicore.core as rc
from roicore.core import operators

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


def _table():
    """{test name: (function, its fixed keyword arguments, the variant)} for every operator
    of roicore.core's table, forward and backward: ``<op>_<method>`` and
    ``<op>_backward_<method>`` for the methods of roi_pool, and torchvision's PS-RoI
    pooling, whose bins differ, as ``psroi_pool_torchvision`` (and its backward)."""
    forward, backward = {}, {}
    for v in operators.variants():
        suffix = f"_{v.method.name}" if v.method.name else ""
        fixed = {"method": v.method.name} if v.method.name else {}
        forward[v.operator.name + suffix] = (v.operator.forward, fixed, v)
        backward[v.operator.backward.__name__ + suffix] = (v.operator.backward, fixed, v)
    for table, name in ((forward, "psroi_pool"), (backward, "psroi_pool_backward")):
        fn, fixed, v = table[name]
        table[name + "_torchvision"] = (fn, {**fixed, "convention": "torchvision"}, v)
    return forward, backward


_FORWARD, _BACKWARD = _table()
_FN = {**_FORWARD, **_BACKWARD}
FORWARD, BACKWARD = list(_FORWARD), list(_BACKWARD)
ALL_OPS = FORWARD + BACKWARD
PSROI_OPS = [op for op in ALL_OPS if _FN[op][2].operator.name == "psroi_pool"]
ALIGN_OPS = [op for op in ALL_OPS if _FN[op][2].operator.name == "roi_align"]
PS_ALIGN_OPS = [op for op in ALL_OPS if _FN[op][2].operator.name == "ps_roi_align"]
# operators that take sampling_ratio
SAMPLING_OPS = [op for op in ALL_OPS if "sampling_ratio" in _FN[op][2].operator.options]
# operators that use the box coordinates (max-pool backward only needs argmax and batch)
COORD_OPS = [op for op in ALL_OPS if op != "roi_pool_backward_max"]

# the conventions table and rules type each operator takes
_RULES = {op: (v.method.conventions, v.method.rules_type.__name__) for op, (_, _, v) in _FN.items()}


def crop(op):
    """Whether op samples like crop_and_resize (normalised boxes)."""
    return _FN[op][2].method.normalised_boxes


def default_boxes(op):
    return NBOXES if crop(op) else BOXES


def position_sensitive(op):
    return _FN[op][2].operator.position_sensitive


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
    fn, extra, _ = _FN[op]
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

