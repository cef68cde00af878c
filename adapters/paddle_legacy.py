"""Legacy ``paddle.fluid.layers`` signatures (removed from Paddle in 2.5) on roicore.

* ``roi_pool(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0, rois_num=None,
  name=None)``
* ``psroi_pool(input, rois, output_channels, spatial_scale, pooled_height, pooled_width,
  name=None)``

Both compute exactly what :mod:`roicore.adapters.paddle` computes (``convention="paddle"``),
with gradients to ``input``.

Which image a RoI belongs to.  In fluid, ``rois`` was a LoDTensor of lod_level 1 whose LoD
grouped the boxes by image, or (roi_pool) ``rois_num`` gave the counts.  Paddle 3 has no
LoD tensors in dygraph, so the grouping is passed explicitly, keyword-only:

* ``rois_num=``: a 1-D int32/int64 tensor, boxes per image (also accepted by psroi_pool);
* ``lod=``: the LoD as *lengths* (``recursive_sequence_lengths``, what
  ``fluid.create_lod_tensor(data, [[3, 2]], place)`` took), e.g. ``[[3, 2]]`` or ``[3, 2]``:
  the first 3 boxes belong to image 0, the next 2 to image 1.  Offsets (``[[0, 3, 5]]``)
  are not accepted.

Give one of them (both only if they agree).  The counts must have one entry per image and
sum to the number of boxes.

Returns: the pooled tensor.  Fluid's dygraph ``roi_pool`` returned ``(out, argmax)``; pass
``return_argmax=True`` for that (argmax int64, ``h*W + w`` in each plane, -1 if empty).
"""
from __future__ import annotations

import numbers

import numpy as np

from ._common import require
from . import paddle as _modern

paddle = require("paddle", "paddle_legacy")

__all__ = ["roi_pool", "psroi_pool"]


def _counts(op, rois, rois_num, lod):
    """boxes-per-image tensor from rois_num and/or LoD lengths."""
    if lod is not None:
        levels = lod
        if isinstance(levels, (list, tuple)) and levels and isinstance(levels[0], (list, tuple)):
            if len(levels) != 1:
                raise ValueError(f"{op}: rois must have lod_level 1, got a LoD with "
                                 f"{len(levels)} levels: {lod!r}")
            levels = levels[0]
        try:
            lengths = np.asarray(levels)
        except Exception:  # ragged or odd input
            raise TypeError(f"{op}: lod must be a list of per-image lengths such as [[3, 2]], "
                            f"got {lod!r}") from None
        if lengths.ndim != 1 or (lengths.size and lengths.dtype.kind not in "iu"):
            raise TypeError(f"{op}: lod must be a list of per-image lengths (ints) such as "
                            f"[[3, 2]], got {lod!r}")
        lod_counts = paddle.to_tensor(lengths.astype(np.int64))
        if rois_num is not None:
            _modern._check_tensor(rois_num, "rois_num", op)
            _modern._check_places(op, rois_num=rois_num)
            given = _modern._to_numpy(rois_num)
            if given.shape != lengths.shape or not np.array_equal(given, lengths):
                raise ValueError(f"{op}: rois_num {given.tolist()} and the LoD lengths "
                                 f"{lengths.tolist()} must be the same")
        return lod_counts
    if rois_num is None:
        raise ValueError(f"{op}: rois needs its image mapping: pass rois_num= (boxes per "
                         "image) or lod= (LoD lengths such as [[3, 2]]); Paddle 3 dygraph "
                         "tensors carry no LoD")
    return rois_num


def _int(value, name, op):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name} must be int type, got {type(value).__name__}")
    return int(value)


def roi_pool(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0, rois_num=None,
             name=None, *, lod=None, return_argmax=False, n_threads=None):
    """RoI max pooling with fluid's signature; see the module docstring for rois_num / lod.

    input : Tensor [N, C, H, W] float32/float64; rois : Tensor [num_rois, 4] of
    [x1, y1, x2, y2], input's dtype.  Returns [num_rois, C, pooled_height, pooled_width]
    (and the int64 argmax with ``return_argmax=True``).
    """
    op = "roi_pool"
    ph = _int(pooled_height, "pooled_height", op)
    pw = _int(pooled_width, "pooled_width", op)
    counts = _counts(op, rois, rois_num, lod)
    return _modern._roi_pool(input, rois, counts, (ph, pw), spatial_scale, n_threads=n_threads,
                             op=op, return_argmax=bool(return_argmax))


def psroi_pool(input, rois, output_channels, spatial_scale, pooled_height, pooled_width,
               name=None, *, rois_num=None, lod=None, n_threads=None):
    """Position-sensitive RoI pooling with fluid's signature.

    input must have ``output_channels * pooled_height * pooled_width`` channels; returns
    [num_rois, output_channels, pooled_height, pooled_width].  ``output_channels == 1`` is
    allowed (Paddle's kernel refuses it, though the operator is well defined).
    """
    op = "psroi_pool"
    d = _int(output_channels, "output_channels", op)
    ph = _int(pooled_height, "pooled_height", op)
    pw = _int(pooled_width, "pooled_width", op)
    counts = _counts(op, rois, rois_num, lod)
    b, batch = _modern._check_inputs(op, input, rois, counts)
    return _modern._psroi_pool(input, b, batch, (ph, pw), spatial_scale, d, n_threads)
