"""Inputs and roicore.core calls shared by the TensorFlow adapter tests: each op's case
(NCHW images, TF boxes, box indices), how the adapter is called, and the core calls its
results must equal bit for bit."""
import numpy as np
import tensorflow as tf

from roicore import core
from roicore.adapters import tf as rtf

OPS = ("roi_pool_max", "roi_pool_bilinear", "psroi_pool", "roi_align")
FORMATS = ("NHWC", "NCHW")
DTYPES = (np.float16, np.float32, np.float64)


# ---------------------------------------------------------------------------------------
# Inputs and the core calls they are compared with

def make_case(op, seed=0, dtype=np.float32, N=2, C=None, H=9, W=11, K=7, scale=0.5):
    """NCHW images, [y1, x1, y2, x2] boxes (incl. out-of-range, flipped and zero-size ones)
    and box indices.  Bilinear boxes are normalised; the others absolute."""
    rng = np.random.default_rng(seed)
    C = C if C is not None else (2 * 3 * 3 if op == "psroi_pool" else 3)
    # distinct values so max pooling has no ties (finite differences stay valid)
    x = (rng.permutation(N * C * H * W).reshape(N, C, H, W) * 0.01 - 1).astype(dtype)
    if op == "roi_pool_bilinear":
        yx = rng.uniform(-0.3, 1.3, (K, 4))
    else:
        yx = rng.uniform(-3, [H / scale + 3, W / scale + 3] * 2, (K, 4))
    yx[0] = yx[0, [2, 3, 0, 1]] if yx[0, 0] < yx[0, 2] else yx[0]  # flipped box
    yx[1, 2:] = yx[1, :2]                                           # zero-size box
    boxes = yx.astype(np.float32)
    idx = rng.integers(0, N, K).astype(np.int32)
    return x, boxes, idx


def params(op):
    return {"roi_pool_max": dict(output_size=(3, 2), spatial_scale=0.5),
            "roi_pool_bilinear": dict(output_size=(3, 4)),
            "psroi_pool": dict(output_size=3, spatial_scale=0.5),
            "roi_align": dict(output_size=(2, 3), spatial_scale=0.5, sampling_ratio=2)}[op]


def call_adapter(op, images, boxes, idx, data_format="NHWC", **kw):
    kw = {**params(op), **kw}
    if op.startswith("roi_pool"):
        return rtf.roi_pool(images, boxes, idx, method=op.split("_")[-1], data_format=data_format,
                            **kw)
    return getattr(rtf, op)(images, boxes, idx, data_format=data_format, **kw)


def to_format(x_nchw, data_format):
    return x_nchw if data_format == "NCHW" else np.transpose(x_nchw, (0, 2, 3, 1))


def from_format(a, data_format):
    return a if data_format == "NCHW" else np.transpose(a, (0, 3, 1, 2))


def core_forward(op, x, boxes, idx):
    xyxy = boxes[:, [1, 0, 3, 2]]
    kw = params(op)
    if op == "roi_pool_max":
        return core.roi_pool(x, xyxy, batch_indices=idx, method="max", convention="mxnet", **kw)
    if op == "roi_pool_bilinear":
        return core.roi_pool(x, xyxy, batch_indices=idx, method="bilinear",
                             convention="tensorflow", **kw)
    return getattr(core, op)(x, xyxy, batch_indices=idx, convention="mxnet", **kw)


def core_backward(op, dy, x, boxes, idx):
    xyxy = boxes[:, [1, 0, 3, 2]]
    kw = params(op)
    kw.pop("output_size")
    if op == "roi_pool_max":
        _, argmax = core.roi_pool(x, xyxy, batch_indices=idx, method="max", convention="mxnet",
                                  return_argmax=True, **params(op))
        return core.roi_pool_backward(dy, xyxy, x.shape, batch_indices=idx, method="max",
                                      convention="mxnet", argmax=argmax, **kw)
    if op == "roi_pool_bilinear":
        return core.roi_pool_backward(dy, xyxy, x.shape, batch_indices=idx, method="bilinear",
                                      convention="tensorflow", **kw)
    return getattr(core, op + "_backward")(dy, xyxy, x.shape, batch_indices=idx,
                                           convention="mxnet", **kw)


def forward_and_grad(op, images, boxes, idx, dy, data_format, **kw):
    images = tf.convert_to_tensor(images)
    with tf.GradientTape() as tape:
        tape.watch(images)
        y = call_adapter(op, images, boxes, idx, data_format, **kw)
        loss = tf.reduce_sum(y * tf.cast(dy, y.dtype))
    return y, tape.gradient(loss, images)
