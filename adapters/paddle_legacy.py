"""Legacy ``paddle.fluid.layers`` signatures (removed from Paddle in 2.5) on roicore.

* ``roi_pool(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0, rois_num=None,
  name=None)``
* ``psroi_pool(input, rois, output_channels, spatial_scale, pooled_height, pooled_width,
  name=None)``

Both compute exactly what :mod:`roicore.adapters.paddle` computes (``convention="paddle"``),
with gradients to ``input``, through the same Paddle operators, so they work in dygraph,
``paddle.jit.to_static``, static programs and saved models alike.

Which image a RoI belongs to.  In fluid, ``rois`` was a LoDTensor of lod_level 1 whose LoD
grouped the boxes by image, or (roi_pool) ``rois_num`` gave the counts.  Paddle 3 has no
LoD tensors in dygraph, so the grouping is passed explicitly, keyword-only:

* ``rois_num=``: a 1-D int32/int64 tensor, boxes per image (also accepted by psroi_pool);
* ``lod=``: the LoD as *lengths* (``recursive_sequence_lengths``, what
  ``fluid.create_lod_tensor(data, [[3, 2]], place)`` took), e.g. ``[[3, 2]]`` or ``[3, 2]``:
  the first 3 boxes belong to image 0, the next 2 to image 1.  Offsets (``[[0, 3, 5]]``)
  are not accepted.

Give one of them (both only if they agree; in a static program, only one, since their
values cannot be compared before it runs).  The counts must have one entry per image and
sum to the number of boxes.

Returns: the pooled tensor.  Fluid's dygraph ``roi_pool`` returned ``(out, argmax)``; pass
``return_argmax=True`` for that (argmax int64, ``h*W + w`` in each plane, -1 if empty).
"""
from __future__ import annotations

import numbers

import numpy as np

from roicore.core import args

from ._common import require
from . import paddle as _modern

paddle = require("paddle", "paddle_legacy")

__all__ = ["roi_pool", "psroi_pool", "roi_align"]


# fluid's names of the modern functions' arguments, for messages
_NAMES = {"x": "input", "boxes": "rois", "boxes_num": "rois_num"}


def _counts(op, input, rois, rois_num, lod):
    """``(boxes-per-image tensor, names)`` from rois_num and/or LoD lengths; LoD lengths are
    checked against the boxes and images here, in the LoD's own terms, and so are eager
    ``rois_num`` (the operators would name them ``boxes_num``)."""
    _modern._check_tensor(input, "input", op)
    _modern._check_tensor(rois, "rois", op)
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
        names = dict(_NAMES, boxes_num="lod")
        k = rois.shape[0] if len(rois.shape) == 2 else -1
        n_images = input.shape[0] if len(input.shape) == 4 else -1
        if k >= 0 and n_images >= 0:   # known: their sum and count checked in the LoD's terms
            try:
                args.batch_from_counts(lengths.astype(np.int64), k, n_images, name="lod")
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{op}: {exc}") from None
        lod_counts = paddle.to_tensor(lengths.astype(np.int64))
        if rois_num is not None:
            _modern._check_tensor(rois_num, "rois_num", op)
            if not paddle.in_dynamic_mode():
                raise ValueError(f"{op}: give rois_num or lod, not both, in a static program "
                                 "(their values cannot be compared before it runs)")
            _modern._check_places(op, rois_num=rois_num)
            given = _modern._to_numpy(rois_num)
            if given.shape != lengths.shape or not np.array_equal(given, lengths):
                raise ValueError(f"{op}: rois_num {given.tolist()} and the LoD lengths "
                                 f"{lengths.tolist()} must be the same")
        return lod_counts, names
    if rois_num is None:
        raise ValueError(f"{op}: rois needs its image mapping: pass rois_num= (boxes per "
                         "image) or lod= (LoD lengths such as [[3, 2]]); Paddle 3 dygraph "
                         "tensors carry no LoD")
    _modern._check_tensor(rois_num, "rois_num", op)
    if (paddle.in_dynamic_mode() and rois_num.dtype in _modern._COUNT_DTYPES
            and len(rois_num.shape) == 1 and len(rois.shape) == 2 and len(input.shape) == 4):
        _modern._check_places(op, rois_num=rois_num)
        try:
            args.batch_from_counts(_modern._to_numpy(rois_num), rois.shape[0], input.shape[0],
                                   name="rois_num")
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{op}: {exc}") from None
    return rois_num, _NAMES


def _int(value, name, op):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{op}: {name} must be int type, got {type(value).__name__}")
    return int(value)


@_modern._graph_ready
def roi_pool(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0, rois_num=None,
             name=None, *, lod=None, return_argmax=False, n_threads=None):
    """RoI max pooling with the signature of fluid's ``paddle.fluid.layers.roi_pool``.

    Computes what ``paddle.vision.ops.roi_pool`` computes, bit for bit, with the gradient
    to ``input``; see :func:`roicore.adapters.paddle.roi_pool`.

    Args:
        input (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W], float32 or
            float64.
        rois (Tensor): RoIs to pool over, a 2-D Tensor of shape [num_rois, 4] and the data
            type of ``input``, given as [[x1, y1, x2, y2], ...], grouped by image in image
            order.
        pooled_height (int, optional): The pooled output height.  Default: 1.
        pooled_width (int, optional): The pooled output width.  Default: 1.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps RoI
            coordinates to feature-map coordinates.  Default: 1.0.
        rois_num (Tensor|None, optional): The number of RoIs of each image, a 1-D int32 or
            int64 Tensor of shape [N] summing to num_rois.  Give ``rois_num`` or ``lod``
            (both only if they agree).  Default: None.
        name (str|None, optional): Accepted for signature compatibility and unused.
            Default: None.
        lod (list|None, optional): Keyword-only.  The LoD that fluid carried on ``rois``,
            as per-image lengths (``recursive_sequence_lengths``): ``[[3, 2]]`` or
            ``[3, 2]`` gives the first 3 RoIs to image 0 and the next 2 to image 1.  Offsets
            (``[[0, 3, 5]]``) are not accepted.  Default: None.
        return_argmax (bool, optional): Keyword-only.  Also return the argmax, as fluid's
            dygraph ``roi_pool`` did.  Default: False.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads of the computation,
            as in :func:`roicore.adapters.paddle.roi_pool`; results never depend on it.
            Default: None.

    Returns:
        Tensor: The pooled feature, [num_rois, C, pooled_height, pooled_width] with the data
        type of ``input``.  With ``return_argmax=True``, the tuple (out, argmax): argmax is
        int64 of out's shape, the index ``h * W + w`` of the maximum within its channel
        plane, -1 for an empty bin (Paddle's own encoding).

    Differences from fluid: Paddle 3 tensors carry no LoD in dygraph, so the image of each
    RoI comes from ``rois_num`` or ``lod``, and it is required; the counts are checked
    (one per image, non-negative, summing to num_rois).

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle_legacy import roi_pool

            >>> x = paddle.arange(32, dtype='float32').reshape([1, 2, 4, 4])
            >>> rois = paddle.to_tensor([[0.0, 0.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0]])
            >>> out = roi_pool(x, rois, pooled_height=2, pooled_width=2, lod=[[2]])
            >>> print(out[0, 0].numpy())
            [[ 5.  7.]
             [13. 15.]]
            >>> out, argmax = roi_pool(x, rois, 2, 2, 1.0, rois_num=paddle.to_tensor([2]),
            ...                        return_argmax=True)
            >>> print(argmax[0, 0].numpy())
            [[ 5  7]
             [13 15]]
    """
    op = "roi_pool"
    ph = _int(pooled_height, "pooled_height", op)
    pw = _int(pooled_width, "pooled_width", op)
    counts, names = _counts(op, input, rois, rois_num, lod)
    return _modern._roi_pool(input, rois, counts, (ph, pw), spatial_scale, n_threads=n_threads,
                             op=op, return_argmax=bool(return_argmax), names=names)


@_modern._graph_ready
def psroi_pool(input, rois, output_channels, spatial_scale, pooled_height, pooled_width,
               name=None, *, rois_num=None, lod=None, n_threads=None):
    """Position-sensitive RoI pooling with the signature of fluid's
    ``paddle.fluid.layers.psroi_pool``.

    Computes what ``paddle.vision.ops.psroi_pool`` computes, bit for bit, with the gradient
    to ``input``; see :func:`roicore.adapters.paddle.psroi_pool`.

    Args:
        input (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W] with
            ``C == output_channels * pooled_height * pooled_width``, float32 or float64.
        rois (Tensor): RoIs to pool over, a 2-D Tensor of shape [num_rois, 4] and the data
            type of ``input``, given as [[x1, y1, x2, y2], ...], grouped by image in image
            order.
        output_channels (int): The number of output channels.
        spatial_scale (float): Multiplicative spatial scale factor that maps RoI
            coordinates to feature-map coordinates.
        pooled_height (int): The pooled output height.
        pooled_width (int): The pooled output width.
        name (str|None, optional): Accepted for signature compatibility and unused.
            Default: None.
        rois_num (Tensor|None, optional): Keyword-only.  The number of RoIs of each image,
            a 1-D int32 or int64 Tensor of shape [N] summing to num_rois.  Give ``rois_num``
            or ``lod`` (both only if they agree).  Default: None.
        lod (list|None, optional): Keyword-only.  The LoD that fluid carried on ``rois``,
            as per-image lengths (``recursive_sequence_lengths``): ``[[3, 2]]`` or
            ``[3, 2]`` gives the first 3 RoIs to image 0 and the next 2 to image 1.  Offsets
            (``[[0, 3, 5]]``) are not accepted.  Default: None.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads of the computation,
            as in :func:`roicore.adapters.paddle.roi_pool`; results never depend on it.
            Default: None.

    Returns:
        Tensor: The pooled feature, [num_rois, output_channels, pooled_height,
        pooled_width] with the data type of ``input``.

    Differences from fluid: the image of each RoI comes from ``rois_num`` or ``lod`` (Paddle
    3 dygraph tensors carry no LoD), and it is required; ``output_channels == 1`` is
    computed (fluid's kernel refuses it, though the operator is well defined).  As in
    fluid, the integer arguments must be ints.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle_legacy import psroi_pool

            >>> x = paddle.rand([2, 490, 28, 28])
            >>> rois = paddle.to_tensor([[1.0, 5.0, 8.0, 10.0], [4.0, 2.0, 6.0, 7.0],
            ...                          [12.0, 12.0, 19.0, 21.0]])
            >>> out = psroi_pool(x, rois, 10, 1.0, 7, 7, lod=[[1, 2]])
            >>> print(list(out.shape))
            [3, 10, 7, 7]
    """
    op = "psroi_pool"
    d = _int(output_channels, "output_channels", op)
    ph = _int(pooled_height, "pooled_height", op)
    pw = _int(pooled_width, "pooled_width", op)
    counts, names = _counts(op, input, rois, rois_num, lod)
    return _modern._psroi_pool(input, rois, counts, (ph, pw), spatial_scale, d,
                               n_threads=n_threads, op=op, names=names)


@_modern._graph_ready
def roi_align(input, rois, pooled_height=1, pooled_width=1, spatial_scale=1.0, sampling_ratio=-1,
              rois_num=None, name=None, *, lod=None, aligned=False, n_threads=None):
    """RoIAlign with the signature of fluid's ``paddle.fluid.layers.roi_align``.

    Computes what ``paddle.vision.ops.roi_align`` computes with the same ``aligned``, bit
    for bit, with the gradient to ``input``; see :func:`roicore.adapters.paddle.roi_align`.

    Args:
        input (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W], float32 or
            float64.
        rois (Tensor): RoIs to pool over, a 2-D Tensor of shape [num_rois, 4] and the data
            type of ``input``, given as [[x1, y1, x2, y2], ...], grouped by image in image
            order.
        pooled_height (int, optional): The pooled output height.  Default: 1.
        pooled_width (int, optional): The pooled output width.  Default: 1.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps RoI
            coordinates to feature-map coordinates.  Default: 1.0.
        sampling_ratio (int, optional): Samples per bin and axis; -1 or 0 adapts to the bin
            size.  Default: -1.
        rois_num (Tensor|None, optional): The number of RoIs of each image, a 1-D int32 or
            int64 Tensor of shape [N] summing to num_rois.  Give ``rois_num`` or ``lod``.
            Default: None.
        name (str|None, optional): Accepted for signature compatibility and unused.
            Default: None.
        lod (list|None, optional): Keyword-only.  The LoD of ``rois`` as per-image lengths,
            as in :func:`roi_pool`.  Default: None.
        aligned (bool, optional): Keyword-only.  Shift the boxes by -0.5 pixel (no minimum
            size).  Default: False, as fluid's operator (``paddle.vision.ops.roi_align``
            defaults to True).
        n_threads (int|None, optional): Keyword-only.  OpenMP threads of the computation;
            results never depend on it.  Default: None.

    Returns:
        Tensor: The pooled feature, [num_rois, C, pooled_height, pooled_width] with the data
        type of ``input``.

    Differences from fluid: the image of each RoI comes from ``rois_num`` or ``lod`` (Paddle
    3 dygraph tensors carry no LoD), and it is required.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle_legacy import roi_align

            >>> x = paddle.arange(16, dtype='float32').reshape([1, 1, 4, 4])
            >>> rois = paddle.to_tensor([[0.0, 0.0, 2.0, 2.0]])
            >>> print(roi_align(x, rois, 1, 1, sampling_ratio=2, lod=[[1]]).numpy().ravel())
            [5.]
    """
    op = "roi_align"
    ph = _int(pooled_height, "pooled_height", op)
    pw = _int(pooled_width, "pooled_width", op)
    counts, names = _counts(op, input, rois, rois_num, lod)
    return _modern._roi_align(input, rois, counts, (ph, pw), spatial_scale, sampling_ratio,
                              aligned, n_threads=n_threads, op=op, names=names)

