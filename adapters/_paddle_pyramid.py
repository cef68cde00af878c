"""PaddleDetection's FPN RoIAlign extractor in one call, on roicore's fused pyramid RoIAlign
(:func:`roicore.core.pyramid_roi_align`); :mod:`roicore.adapters.paddle` exports it.

PaddleDetection's ``RoIAlign`` head (``ppdet/modeling/heads/roi_extractor.py``) splits the
boxes over the levels with ``paddle.vision.ops.distribute_fpn_proposals``, runs
``roi_align`` on each level, concatenates the results and gathers the rows back into box
order.  Here each box's level is computed in C and the box is pooled straight into its row;
the gradient goes to the map of each box's level.  Levels, outputs and gradients are
bit-identical to that composition of Paddle's CPU kernels, for float32 and float64.  In
dygraph it runs on roicore.core through ``paddle.autograd.PyLayer``; a static program
(``to_static``, ``paddle.jit.save``) holds the composition itself, with roicore's
``roi_align`` operator on each level, since a PyLayer cannot be saved.
"""
from __future__ import annotations

import dataclasses
import numbers

from roicore import core
from roicore.core import args, conventions

from .paddle import (
    CONVENTION, PyLayer, _check_places, _check_tensor, _check_tensors, _dtype_name,
    _graph_ready, _in_callers_words, _needs_grad, _numpy_inputs, _roi_align, _size, _to_numpy,
    _to_paddle, paddle,
)

__all__ = ["multilevel_roi_align", "MultiLevelRoIAlign"]

# Paddle's rule with the call's pixel_offset
_LEVELS = {offset: dataclasses.replace(conventions.LEVELS[CONVENTION], pixel_offset=offset)
           for offset in (False, True)}
# roicore.core's argument names in this op's words, for the messages of its checks
_NAMES = {"x": "feats[0]", "maps": "feats", "first_level": "min_level",
          "canonical_level": "refer_level", "canonical_size": "refer_scale"}


def _level(value, name, op):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    return int(value)


def _check_feats(op, feats, min_level, max_level, spatial_scales):
    """The maps' checked scales: one map per level from min_level to max_level, each a 4-D
    tensor with the batch size, channels and dtype of feats[0]."""
    if not isinstance(feats, (list, tuple)) or not feats:
        raise TypeError(f"{op}: feats must be a non-empty list of paddle.Tensor [N, C, H, W], "
                        f"one per level, got {type(feats).__name__}")
    if max_level < min_level:
        raise ValueError(f"{op}: max_level must be >= min_level, got min_level={min_level}, "
                         f"max_level={max_level}")
    count = max_level - min_level + 1
    if len(feats) != count:
        raise ValueError(f"{op}: feats must have one map per level from min_level={min_level} "
                         f"to max_level={max_level} ({count}), got {len(feats)}")
    if isinstance(spatial_scales, (str, bytes)) or not hasattr(spatial_scales, "__len__"):
        raise TypeError(f"{op}: spatial_scales must be a list of floats, one per map, got "
                        f"{type(spatial_scales).__name__}")
    if len(spatial_scales) != count:
        raise ValueError(f"{op}: spatial_scales must have one scale per map ({count}), got "
                         f"{len(spatial_scales)}")
    scales = [args.float32_scale(s, f"spatial_scales[{i}]") for i, s in enumerate(spatial_scales)]
    first = feats[0]
    for i, f in enumerate(feats):
        _check_tensor(f, f"feats[{i}]", op)
        if len(f.shape) != 4:
            raise ValueError(f"{op}: feats[{i}] must be a 4-D [N, C, H, W] tensor, got shape "
                             f"{list(f.shape)}")
        if f.dtype != first.dtype:
            raise TypeError(f"{op}: feats[{i}] must have the dtype of feats[0] "
                            f"({_dtype_name(first)}), got {_dtype_name(f)}")
        if list(f.shape[:2]) != list(first.shape[:2]):
            raise ValueError(f"{op}: feats[{i}] must have the batch size and channels of "
                             f"feats[0] ({list(first.shape[:2])}), got {list(f.shape[:2])}")
    return scales


class _MultiLevelRoIAlignFn(PyLayer):
    @staticmethod
    def forward(ctx, boxes, batch, kw, n_threads, *feats):
        arrays = [_to_numpy(f) for f in feats]
        y = core.pyramid_roi_align(arrays, boxes, batch_indices=batch, n_threads=n_threads,
                                   **kw)
        ctx.saved = (boxes, batch, [a.shape for a in arrays], kw, n_threads, feats[0].place,
                     [not f.stop_gradient for f in feats])
        return _to_paddle(y, feats[0].place)

    @staticmethod
    def backward(ctx, grad):
        boxes, batch, shapes, kw, n_threads, place, wanted = ctx.saved
        kw = dict(kw)
        del kw["output_size"]
        grads = core.pyramid_roi_align_backward(_to_numpy(grad), boxes, shapes,
                                                batch_indices=batch, n_threads=n_threads, **kw)
        # Paddle wants None for an input that stops the gradient
        return tuple(_to_paddle(d, place) if w else None for d, w in zip(grads, wanted))


@_in_callers_words
def _multilevel_roi_align(feats, boxes, boxes_num, output_size, spatial_scales,
                          sampling_ratio, aligned, min_level, max_level, refer_level,
                          refer_scale, pixel_offset, *, n_threads=None,
                          op="multilevel_roi_align", names=None):
    n = args.Names(names)
    min_level = _level(min_level, "min_level", op)
    max_level = _level(max_level, "max_level", op)
    refer_level = _level(refer_level, "refer_level", op)
    refer_scale = _level(refer_scale, "refer_scale", op)
    scales = _check_feats(op, feats, min_level, max_level, spatial_scales)
    _check_tensors(op, feats[0], boxes, boxes_num, n)
    output_size = _size(output_size, op)
    sampling_ratio = args.sampling_ratio(sampling_ratio)
    aligned = args.flag(aligned, "aligned")
    pixel_offset = args.flag(pixel_offset, "pixel_offset")
    if n_threads is not None:
        core.effective_n_threads(n_threads)  # checks it
    if not paddle.in_dynamic_mode():
        return _composition(feats, boxes, boxes_num, output_size, scales, sampling_ratio,
                            aligned, min_level, max_level, refer_level, refer_scale,
                            pixel_offset, n_threads, op, names)
    _check_places(op, boxes=boxes, boxes_num=boxes_num,
                  **{f"feats[{i}]": f for i, f in enumerate(feats)})
    b, batch = _numpy_inputs(op, feats[0], boxes, boxes_num, n)
    kw = dict(output_size=output_size, spatial_scales=scales, sampling_ratio=sampling_ratio,
              aligned=aligned, first_level=min_level, canonical_level=refer_level,
              canonical_size=refer_scale, levels=_LEVELS[pixel_offset], convention=CONVENTION,
              names=_NAMES)
    if any(_needs_grad(f) for f in feats):
        return _MultiLevelRoIAlignFn.apply(b, batch, kw, n_threads, *feats)
    y = core.pyramid_roi_align([_to_numpy(f) for f in feats], b, batch_indices=batch,
                               n_threads=n_threads, **kw)
    return _to_paddle(y, feats[0].place)


def _composition(feats, boxes, boxes_num, output_size, scales, sampling_ratio, aligned,
                 min_level, max_level, refer_level, refer_scale, pixel_offset, n_threads, op,
                 names):
    """In a static program: PaddleDetection's composition itself, Paddle's
    ``distribute_fpn_proposals`` and roicore's ``roi_align`` operator per level (its graph
    ops), so that ``to_static`` and ``paddle.jit.save`` hold it.  One level pools every box
    from its map, as the fused path does."""
    def pool(x, rois, rois_num, scale):
        return _roi_align(x, rois, rois_num, output_size, scale, sampling_ratio, aligned,
                          n_threads=n_threads, op=op, names=names)
    if min_level == max_level:
        return pool(feats[0], boxes, boxes_num, scales[0])
    rois, restore, rois_num = paddle.vision.ops.distribute_fpn_proposals(
        boxes, min_level, max_level, refer_level, refer_scale, pixel_offset=pixel_offset,
        rois_num=boxes_num)
    pooled = [pool(f, r, k, s) for f, r, k, s in zip(feats, rois, rois_num, scales)]
    return paddle.gather(paddle.concat(pooled), restore)


@_graph_ready
def multilevel_roi_align(feats, boxes, boxes_num, output_size, spatial_scales,
                         sampling_ratio=-1, aligned=True, min_level=2, max_level=5,
                         refer_level=4, refer_scale=224, pixel_offset=False, name=None, *,
                         n_threads=None):
    """RoIAlign of each box from the FPN level Paddle's ``distribute_fpn_proposals`` assigns
    it: PaddleDetection's ``RoIAlign`` extractor in one call.

    The result equals ``distribute_fpn_proposals(boxes, min_level, max_level, refer_level,
    refer_scale, pixel_offset, rois_num=boxes_num)``, then ``roi_align`` of each level's boxes
    on its map with its scale, concatenated and gathered by the restore index, bit for bit
    (outputs and the gradients of ``feats``).  Box k's level is
    ``floor(log2(sqrt(area_k) / refer_scale + 1e-6) + refer_level)`` clamped to
    [min_level, max_level], where a reversed box has area 0.  ``boxes`` and ``boxes_num`` get
    no gradient, as in Paddle.  In dygraph one fused operator computes it; in a static
    program (``paddle.jit.to_static``, ``paddle.jit.save``) it is that composition itself,
    with roicore's ``roi_align`` operator on each level.

    Argument names and defaults follow ``paddle.vision.ops``: ``roi_align`` (sampling_ratio
    -1, aligned True) and ``distribute_fpn_proposals`` (pixel_offset False).  The levels'
    defaults are PaddleDetection's ``RoIAlign`` (levels 2 to 5, canonical level 4 and size
    224); its sampling_ratio 0 (adaptive, as -1) and aligned False must be passed.

    Args:
        feats (list[Tensor]): The maps of levels min_level to max_level, finest first, each
            a 4-D Tensor [N, C, H_i, W_i], all of one batch size, channel count and data
            type (float32 or float64).
        boxes (Tensor): Boxes to pool over, a 2-D Tensor [num_boxes, 4] of
            [x1, y1, x2, y2] rows in input-image coordinates, with the data type of
            ``feats``.  The boxes of image 0 come first, then those of image 1, and so on.
        boxes_num (Tensor): The number of boxes of each image, a 1-D Tensor [N], int32 or
            int64; the counts sum to num_boxes.
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scales (list[float]): Each map's spatial scale (its size over the input
            image's), one per map.
        sampling_ratio (int, optional): Sampling points per bin along each axis; -1 or 0:
            ``ceil(box size / output size)``.  Default: -1.
        aligned (bool, optional): If True, shift the scaled boxes by -0.5 pixel, as
            ``roi_align``.  Default: True.
        min_level (int, optional): The level of ``feats[0]``.  Default: 2.
        max_level (int, optional): The level of ``feats[-1]``.  Default: 5.
        refer_level (int, optional): The level of boxes of size refer_scale.  Default: 4.
        refer_scale (int, optional): The size (square root of the area) of boxes of level
            refer_level.  Default: 224.
        pixel_offset (bool, optional): If True, the level rule takes widths and heights
            ``x2 - x1 + 1`` (the pooling does not).  Default: False.
        name (str|None, optional): Accepted for signature compatibility with Paddle and
            unused.  Default: None.
        n_threads (int|None, optional): Keyword-only.  The number of OpenMP threads the
            computation may use, as in :func:`roicore.adapters.paddle.roi_align`; results
            never depend on it.  Default: None.

    Returns:
        Tensor: The pooled features, a 4-D Tensor [num_boxes, C, h, w] with the data type
        of ``feats``, the rows in the order of ``boxes``.

    Differences from the Paddle composition: ``boxes_num`` is checked (one count per image,
    non-negative, summing to num_boxes); one level (min_level == max_level) pools every box
    from its map, where ``distribute_fpn_proposals`` refuses a single level; a reversed box
    with aligned=True and adaptive sampling gives NaN, where Paddle's ``roi_align`` aborts.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import multilevel_roi_align

            >>> feats = [paddle.rand([2, 8, 64 // 2**i, 64 // 2**i]) for i in range(4)]
            >>> boxes = paddle.to_tensor([[0.0, 0.0, 40.0, 30.0], [8.0, 8.0, 250.0, 230.0],
            ...                           [16.0, 4.0, 120.0, 90.0]])
            >>> boxes_num = paddle.to_tensor([2, 1], dtype='int32')
            >>> out = multilevel_roi_align(feats, boxes, boxes_num, 7, [1/4, 1/8, 1/16, 1/32])
            >>> print(list(out.shape))
            [3, 8, 7, 7]

            >>> # two levels: the 4x4 box is pooled from level 2, the 8x8 box from level 3
            >>> x = paddle.arange(16, dtype='float32').reshape([1, 1, 4, 4])
            >>> boxes = paddle.to_tensor([[0.0, 0.0, 4.0, 4.0], [0.0, 0.0, 8.0, 8.0]])
            >>> out = multilevel_roi_align([x, x[:, :, ::2, ::2]], boxes,
            ...                            paddle.to_tensor([2], dtype='int32'), 1, [1.0, 0.5],
            ...                            min_level=2, max_level=3, refer_level=3,
            ...                            refer_scale=8)
            >>> print(out.numpy().ravel())
            [7.5  3.75]
    """
    return _multilevel_roi_align(feats, boxes, boxes_num, output_size, spatial_scales,
                                 sampling_ratio, aligned, min_level, max_level, refer_level,
                                 refer_scale, pixel_offset, n_threads=n_threads, names=_NAMES)


class MultiLevelRoIAlign(paddle.nn.Layer):
    """:func:`multilevel_roi_align` as a Layer, in the place of PaddleDetection's ``RoIAlign``
    extractor for an FPN.

    Calling the layer as ``layer(feats, boxes, boxes_num)`` returns
    ``multilevel_roi_align(feats, boxes, boxes_num, ...)`` with the arguments given here; see
    :func:`multilevel_roi_align` for them, the result and the differences from Paddle.  The
    layer has no parameters.

    Args:
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).
        spatial_scales (list[float]): Each map's spatial scale, one per level.
        sampling_ratio (int, optional): Sampling points per bin and axis; -1 or 0: adaptive.
            Default: -1.
        aligned (bool, optional): Shift the scaled boxes by -0.5 pixel.  Default: True.
        min_level (int, optional): The level of the first map.  Default: 2.
        max_level (int, optional): The level of the last map.  Default: 5.
        refer_level (int, optional): The level of boxes of size refer_scale.  Default: 4.
        refer_scale (int, optional): The size of boxes of level refer_level.  Default: 224.
        pixel_offset (bool, optional): Widths and heights ``x2 - x1 + 1`` in the level rule.
            Default: False.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads for each call, as in
            :func:`multilevel_roi_align`.  Default: None.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import MultiLevelRoIAlign

            >>> feats = [paddle.rand([1, 16, 64 // 2**i, 64 // 2**i]) for i in range(4)]
            >>> boxes = paddle.to_tensor([[4.0, 4.0, 60.0, 44.0], [0.0, 8.0, 240.0, 200.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> extractor = MultiLevelRoIAlign(14, [1/4, 1/8, 1/16, 1/32], sampling_ratio=0,
            ...                                aligned=False)
            >>> print(list(extractor(feats, boxes, boxes_num).shape))
            [2, 16, 14, 14]
    """

    def __init__(self, output_size, spatial_scales, sampling_ratio=-1, aligned=True,
                 min_level=2, max_level=5, refer_level=4, refer_scale=224, pixel_offset=False,
                 *, n_threads=None):
        super().__init__()
        self._args = dict(output_size=output_size, spatial_scales=spatial_scales,
                          sampling_ratio=sampling_ratio, aligned=aligned, min_level=min_level,
                          max_level=max_level, refer_level=refer_level,
                          refer_scale=refer_scale, pixel_offset=pixel_offset,
                          n_threads=n_threads)

    def forward(self, feats, boxes, boxes_num):
        """Pool ``feats`` over ``boxes``; see :func:`multilevel_roi_align`."""
        return multilevel_roi_align(feats, boxes, boxes_num, **self._args)

    def extra_repr(self):
        a = self._args
        return (f"output_size={a['output_size']}, spatial_scales={a['spatial_scales']}, "
                f"levels={a['min_level']}..{a['max_level']}")
