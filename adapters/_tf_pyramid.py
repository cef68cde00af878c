"""The TF Model Garden's FPN pooler, ``multilevel_crop_and_resize``, on roicore's RoIAlign
with the Model Garden's sampler; :mod:`roicore.adapters.tf` exports it.

The Model Garden (``official/vision/ops/spatial_transform_ops.py``) assigns each box a
level, gathers the two neighbours of one sample per bin and axis from a flattened stack of
every level, weights them and averages 2 x 2 windows.  Here each level's boxes are pooled by
roicore's RoIAlign op (``conventions.MODEL_GARDEN_ALIGN``) straight from that level's map
and stitched back into box order; the gradient goes to the map of each box's level.

The levels are computed with TensorFlow's own ops, as the Model Garden writes them:
TensorFlow's vectorised ``log`` differs from the C library's by an ulp for some inputs (and
which inputs depends on where they fall in the tensor), so only TensorFlow computes the
level of a box at a boundary as TensorFlow does.
"""
from __future__ import annotations

import numbers

from .tf import _not_converted, _roi_align, tf

__all__ = ["multilevel_crop_and_resize"]

_OP = "multilevel_crop_and_resize"


def _levels(features):
    """min_level, max_level and the maps in level order, as the Model Garden reads them."""
    if not isinstance(features, dict) or not features:
        raise TypeError(f"{_OP}: features must be a non-empty dict of level -> "
                        f"[batch, height, width, channels] tensors, got "
                        f"{type(features).__name__}")
    keys = list(features.keys())
    min_level, max_level = int(min(keys)), int(max(keys))
    # a level missing between them raises the Model Garden's KeyError
    return min_level, max_level, [tf.convert_to_tensor(features[str(level)],
                                                       name=f"features_{level}")
                                  for level in range(min_level, max_level + 1)]


def _check(maps, boxes, min_level):
    first = maps[0]
    if first.dtype not in (tf.float32, tf.float64):
        raise TypeError(f"{_OP}: features must be float32 or float64 (the arithmetic is "
                        f"reproduced in those), got {first.dtype.name}")
    for i, m in enumerate(maps):
        level = min_level + i
        if m.dtype != first.dtype:
            raise TypeError(f"{_OP}: features['{level}'] must have the dtype of "
                            f"features['{min_level}'] ({first.dtype.name}), got {m.dtype.name}")
        if m.shape.rank is not None and m.shape.rank != 4:
            raise ValueError(f"{_OP}: features['{level}'] must be a 4-D [batch, height, width, "
                             f"channels] tensor, got shape {m.shape}")
        if m.shape.rank is None or first.shape.rank is None:
            continue
        for axis, what in ((0, "batch size"), (3, "channels")):
            a, b = m.shape[axis], first.shape[axis]
            if a is not None and b is not None and a != b:
                raise ValueError(f"{_OP}: features['{level}'] must have the {what} of "
                                 f"features['{min_level}'] ({b}), got {a}")
        for axis, what in ((1, "height"), (2, "width")):
            a, b = m.shape[axis], first.shape[axis]
            if a is not None and b is not None and a * 2 ** i != b:
                raise ValueError(
                    f"{_OP}: features['{level}'] must have 1/{2 ** i} of the {what} of "
                    f"features['{min_level}'] ({b}), as the Model Garden's pyramid of padded "
                    f"images has (its bounds come from the first level's size), got {a}")
    if boxes.dtype != first.dtype:
        raise TypeError(f"{_OP}: boxes must have the features' dtype ({first.dtype.name}), "
                        f"got {boxes.dtype.name}")
    if boxes.shape.rank is not None and (boxes.shape.rank != 3 or
                                         boxes.shape[2] not in (None, 4)):
        raise ValueError(f"{_OP}: boxes must have shape [batch, num_boxes, 4] "
                         f"([y1, x1, y2, x2] in image pixels), got {boxes.shape}")


def _box_levels(boxes, min_level, max_level):
    """Each box's level minus min_level, computed as the Model Garden computes it."""
    box_width = boxes[:, :, 3] - boxes[:, :, 1]
    box_height = boxes[:, :, 2] - boxes[:, :, 0]
    areas_sqrt = tf.sqrt(tf.cast(box_height, tf.float32) * tf.cast(box_width, tf.float32))
    levels = tf.cast(tf.math.floordiv(tf.math.log(tf.math.divide_no_nan(areas_sqrt, 224.0)),
                                      tf.math.log(2.0)) + 4.0, dtype=tf.int32)
    return tf.minimum(max_level, tf.maximum(levels, min_level)) - min_level


@_not_converted
def multilevel_crop_and_resize(features, boxes, output_size=7, sample_offset=0.5, *,
                               n_threads=None):
    """Crop and resize on a multilevel feature pyramid: the TF Model Garden's
    ``multilevel_crop_and_resize``, bit for bit.

    Args:
      features: a dict of level (``"2"`` .. ``"6"``, consecutive) to a
        ``[batch, height_l, width_l, channels]`` float32 or float64 tensor, each level half
        the height and width of the one before.
      boxes: a ``[batch, num_boxes, 4]`` tensor of ``[y1, x1, y2, x2]`` in image pixels, of
        the features' dtype.
      output_size: the crop's height and width.
      sample_offset: where the sample of each bin lies; only the Model Garden's default 0.5
        is supported.
      n_threads: OpenMP threads for roicore (None: its default).

    Returns:
      A ``[batch, num_boxes, output_size, output_size, channels]`` tensor.

    Each box's level is ``floor(log2(sqrt(area) / 224)) + 4`` clamped to the features'
    levels; the box is pooled from that level's map with one bilinear sample per bin at
    ``y1 + (i + 0.5) * h / output_size`` (in that level's pixels), whose neighbours are
    clamped into the map while its weights are not, so samples outside extrapolate.
    Gradients flow to the features and equal TensorFlow's through the Model Garden's
    function bit for bit; ``boxes`` get none (the Model Garden's would flow through the
    interpolation weights; its detection models stop them).  It runs in every mode the
    other ops do (eager, ``tf.function``, SavedModel) on their op library.
    """
    if isinstance(output_size, bool) or not isinstance(output_size, numbers.Integral) \
            or output_size < 1:
        raise ValueError(f"{_OP}: output_size must be a positive int, got {output_size!r}")
    if sample_offset != 0.5:
        raise NotImplementedError(f"{_OP}: only sample_offset=0.5 (the Model Garden's default) "
                                  f"is supported, got {sample_offset!r}")
    min_level, max_level, maps = _levels(features)
    boxes = tf.convert_to_tensor(boxes, name="boxes")
    _check(maps, boxes, min_level)
    with tf.name_scope(_OP):
        shape = tf.shape(boxes)
        batch_size, num_boxes = shape[0], shape[1]
        flat = tf.reshape(boxes, [-1, 4])
        images = tf.repeat(tf.range(batch_size), num_boxes)
        levels = tf.reshape(_box_levels(boxes, min_level, max_level), [-1])
        rows = tf.dynamic_partition(tf.range(tf.size(levels)), levels, len(maps))
        pooled = [_roi_align(_OP, m, tf.gather(flat, r), tf.gather(images, r),
                             (output_size, output_size), 0.5 ** (min_level + i), 1, False,
                             "NHWC", None, n_threads)
                  for i, (m, r) in enumerate(zip(maps, rows))]
        y = tf.dynamic_stitch(rows, pooled)
        channels = maps[0].shape[3] if maps[0].shape.rank else None
        return tf.reshape(y, [batch_size, num_boxes, output_size, output_size,
                              channels if channels is not None else tf.shape(maps[0])[3]])
