"""GluonCV's FPN RoI pooling (``_pyramid_roi_feats`` of its R-CNN models, ``roi_mode='align'``)
on ``mx.nd``, in one call of :func:`roicore.core.pyramid_roi_align`;
:mod:`roicore.adapters.mxnet` exports it.

GluonCV assigns each proposal a level, then loops over the levels: ``contrib.ROIAlign`` with
the other levels' rows replaced by -1, and ``ElementWiseSum`` of the results.  Here the
levels are computed in C and each proposal is pooled once, from its own level's map; its
gradient goes to that map only.  Levels, outputs and gradients are bit-identical to
GluonCV's formula on MXNet's operators for float32 and float64, with the rows GluonCV marks
-1 giving 0 as MXNet's GPU ROIAlign writes them (its CPU kernel leaves them unwritten).
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

import roicore.core as core

from .mxnet import _as_ndarray, _on_host, _relay, _threads, _truncate_batch, mx

__all__ = ["pyramid_roi_feats"]

# GluonCV's names of roicore.core's arguments, for messages
_NAMES = {"maps": "features", "boxes": "rpn_rois", "grad_output": "out_grad",
          "output_size": "roi_size"}
# the epsilons roicore's level rule holds, by GluonCV's value of ``eps``
_EPSILONS = {1e-6: "1e-6", 1e-8: "1e-8"}
# GluonCV's canonical level: ``floor(4 + log2(sqrt(w * h) / roi_canonical_scale + eps))``
_CANONICAL_LEVEL = 4
# GluonCV's R-CNN heads never pool from a level above P5 ("do not use p6 for RCNN")
_TOP_RCNN_LEVEL = 5


def _stages(features, strides):
    """GluonCV's ``min_stage`` and the number of levels its R-CNN head pools from.

    GluonCV's models take ``min_stage``/``max_stage`` with one stride and one map per stage
    (``min_stage=2`` for strides from 4), and drop the top stage when ``max_stage > 5``.
    """
    if isinstance(strides, (str, bytes)) or not hasattr(strides, "__len__"):
        raise TypeError(f"strides must be a sequence of numbers, one per feature map, got "
                        f"{type(strides).__name__}")
    if len(strides) != len(features):
        raise ValueError(f"strides must have one stride per feature map: {len(features)} "
                         f"features, got {len(strides)} strides")
    strides = [core.args.positive_scale(s, f"strides[{i}]") for i, s in enumerate(strides)]
    min_stage = math.log2(strides[0])
    if not min_stage.is_integer():
        raise ValueError(f"strides[0] must be a power of two (4, 8, ...): GluonCV's min_stage "
                         f"is its log2, got {strides[0]!r}")
    min_stage = int(min_stage)
    max_stage = min_stage + len(strides) - 1
    if max_stage > _TOP_RCNN_LEVEL:
        max_stage -= 1
    if max_stage < min_stage:
        raise ValueError(f"strides {strides} leave no level to pool from: GluonCV drops the "
                         f"top stage above level {_TOP_RCNN_LEVEL}")
    return strides, min_stage, max_stage - min_stage + 1


def _level_rules(eps):
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps must be a real number, got {type(eps).__name__}")
    if float(eps) not in _EPSILONS:
        raise ValueError(f"eps must be 1e-6 (GluonCV's default) or 1e-8, the epsilons "
                         f"roicore's level rule holds, got {eps!r}")
    return dataclasses.replace(core.conventions.LEVELS["gluoncv"],
                               epsilon=_EPSILONS[float(eps)])


def _in_graph(a):
    """Whether autograd recorded ``a`` (a variable or a recorded op's output)."""
    try:
        mx.autograd.get_symbol(a)
    except mx.base.MXNetError:
        return False
    return True


class _Function(mx.autograd.Function):
    """One recorded call: the fused forward and backward of the core, a zero rois gradient.

    MXNet's Function stops writing input gradients at the first input that needs none, so
    the inputs come in the order ``order`` gives (those autograd recorded first)."""

    def __init__(self, size, params, order):
        super().__init__()
        self._size = size
        self._params = params
        self._order = order  # input position -> map index, -1 for rpn_rois

    def forward(self, *inputs):
        maps = [None] * (len(inputs) - 1)
        for a, i in zip(inputs, self._order):
            if i < 0:
                rois = a
            else:
                maps[i] = a
        self._shapes = [m.shape for m in maps]
        self.save_for_backward(rois)
        return _forward(self._size, self._params, maps, rois)

    def backward(self, dy):
        with _relay.capture("kCustomFunctionBackward"):
            rois, = self.saved_tensors
            grads = core.pyramid_roi_align_backward(
                _on_host(dy, "out_grad"), _truncate_batch(_on_host(rois, "rpn_rois")),
                self._shapes, **self._params)
            return tuple(mx.nd.zeros_like(rois) if i < 0 else _as_ndarray(grads[i], dy.context)
                         for i in self._order)


def _forward(size, params, maps, rois):
    arrays = [_on_host(m, f"features[{i}]") for i, m in enumerate(maps)]
    y = core.pyramid_roi_align(arrays, _truncate_batch(_on_host(rois, "rpn_rois")), size,
                               **params)
    return _as_ndarray(y, maps[0].context)


def _graph(features, rpn_rois, size, strides, min_stage, levels, canonical_scale,
           sampling_ratio, eps, n_threads):
    """In an ``mx.sym`` graph (a hybridized block, ``export``): GluonCV's formula itself on
    ``mx.sym``, each level's rows pooled by roicore's ROIAlign operator with the other
    levels' rows set to -1 (which it pools to 0), and the levels summed."""
    from .mxnet import ROIAlign
    F = mx.sym
    _, x1, y1, x2, y2 = F.split(rpn_rois, axis=-1, num_outputs=5)
    h = y2 - y1 + 1
    w = x2 - x1 + 1
    roi_level = F.floor(_CANONICAL_LEVEL + F.log2(F.sqrt(w * h) / canonical_scale + eps))
    roi_level = F.squeeze(F.clip(roi_level, min_stage, min_stage + levels - 1))
    pooled = [ROIAlign(features[i], F.where(roi_level == min_stage + i, rpn_rois,
                                            F.ones_like(rpn_rois) * -1.),
                       size, 1.0 / strides[i], sample_ratio=sampling_ratio, n_threads=n_threads)
              for i in range(levels)]
    return F.ElementWiseSum(*pooled)


def pyramid_roi_feats(features, rpn_rois, roi_size, strides, roi_mode="align",
                      roi_canonical_scale=224.0, sampling_ratio=2, eps=1e-6, *,
                      n_threads=None):
    """RoIAlign of each proposal from its FPN level, as GluonCV's R-CNN ``_pyramid_roi_feats``
    (``roi_mode='align'``) computes it with ``F=mx.nd``.

    A proposal's level is ``floor(4 + log2(sqrt(w * h) / roi_canonical_scale + eps))`` with
    ``w = x2 - x1 + 1`` and ``h = y2 - y1 + 1``, clipped to GluonCV's stages; it is pooled
    with ``contrib.ROIAlign(features[i], ..., roi_size, 1 / strides[i], sample_ratio=
    sampling_ratio)`` from that level's map.  A reversed box whose area is negative has no
    level (NaN) and gives 0, as in GluonCV.

    Parameters
    ----------
    features : list of NDArray
        The FPN maps, (N, C, H_i, W_i), finest first, one per stride, of one dtype.
    rpn_rois : NDArray
        (K, 5) rows ``[batch_index, x1, y1, x2, y2]`` in image pixels.  A negative batch
        index (GluonCV's -1 padding) masks the row: output 0, no gradient.  Fractional
        indices are truncated toward zero, as MXNet's ROIAlign reads them.
    roi_size : int or (int, int)
        Output height and width.
    strides : sequence of numbers
        Each map's stride (4, 8, 16, 32[, 64]).  The first level is ``log2(strides[0])``
        (GluonCV's ``min_stage``); with ``max_stage = min_stage + len(strides) - 1`` above 5,
        the top map (P6) is not pooled from, as in GluonCV.
    roi_mode : str
        Only ``'align'`` is supported.
    roi_canonical_scale : float
        The level rule's canonical size (224 in the FPN paper).
    sampling_ratio : int
        Samples per bin and axis; -1 or 0 for ``ceil(bin size)``.
    eps : float
        1e-6 (GluonCV's) or 1e-8.
    n_threads : int, optional
        roicore's OpenMP threads; None for ``OMP_NUM_THREADS``, else every CPU.

    Returns
    -------
    NDArray
        (K, C, roi_size[0], roi_size[1]), the features' dtype and context.  Under
        ``mx.autograd.record()`` the gradient reaches each map pooled from.

    Examples
    --------
    Maps filled with their stride show the level each proposal is pooled from:

    >>> feats = [mx.nd.ones((1, 1, 512 // s, 512 // s)) * s for s in (4, 8, 16, 32)]
    >>> rois = mx.nd.array([[0, 0, 0, 15, 15], [0, 0, 0, 149, 149], [0, 0, 0, 299, 299],
    ...                     [0, 0, 0, 499, 499], [-1, -1, -1, -1, -1]])
    >>> pyramid_roi_feats(feats, rois, (1, 1), (4, 8, 16, 32))[:, 0, 0, 0].asnumpy()
    array([ 4.,  8., 16., 32.,  0.], dtype=float32)
    >>> for f in feats:
    ...     f.attach_grad()
    >>> with mx.autograd.record():
    ...     y = pyramid_roi_feats(feats, rois, (1, 1), (4, 8, 16, 32))
    >>> y.backward()
    >>> [f.grad.sum().asscalar() for f in feats]
    [1.0, 1.0, 1.0, 1.0]

    With ``mx.sym`` inputs (a hybridized block, ``export``) it builds GluonCV's formula
    itself, with roicore's ROIAlign operator on each level, the same numbers.

    Differences from GluonCV
    ------------------------
    Rows with a negative batch index give 0 on the CPU too; a batch index >= N or a
    non-finite one or coordinate raises ValueError; ``rpn_rois``
    of another dtype than the features are cast to theirs (MXNet raises); float16 is
    computed in float32; ``roi_mode='pool'`` raises NotImplementedError.
    """
    if roi_mode == "pool":
        raise NotImplementedError("pyramid_roi_feats(roi_mode='pool') is not implemented: "
                                  "roicore.core has no pyramid RoI max pooling")
    if roi_mode != "align":
        raise ValueError(f"Invalid roi mode: {roi_mode!r} (GluonCV's modes: 'align', 'pool')")
    if isinstance(features, (mx.nd.NDArray, mx.sym.Symbol)) or \
            not isinstance(features, (list, tuple)):
        raise TypeError(f"features must be a list of mx.nd.NDArray (N, C, H, W), one per "
                        f"stride, got {type(features).__name__}")
    if not features:
        raise ValueError("features must hold at least one map")
    if isinstance(rpn_rois, mx.sym.Symbol) and all(isinstance(f, mx.sym.Symbol)
                                                   for f in features):
        scales, min_stage, levels = _stages(features, strides)
        _level_rules(eps)
        return _graph(features, rpn_rois, core.args.pair(roi_size, "roi_size"), scales,
                      min_stage, levels,
                      core.args.positive_scale(roi_canonical_scale, "roi_canonical_scale"),
                      core.args.sampling_ratio(sampling_ratio, "sampling_ratio"), eps,
                      n_threads)
    for i, f in enumerate(features):
        if not isinstance(f, mx.nd.NDArray):
            raise TypeError(f"features[{i}] must be an mx.nd.NDArray, got {type(f).__name__}")
        if f.ndim != 4:
            raise ValueError(f"features[{i}] must be 4-D (N, C, H, W), got shape {f.shape}")
    if not isinstance(rpn_rois, mx.nd.NDArray):
        raise TypeError(f"rpn_rois must be an mx.nd.NDArray, got {type(rpn_rois).__name__}")
    if rpn_rois.ndim != 2 or rpn_rois.shape[1] != 5:
        raise ValueError(f"rpn_rois must have shape (K, 5) [batch, x1, y1, x2, y2], got shape "
                         f"{rpn_rois.shape}")
    scales, min_stage, levels = _stages(features, strides)
    size = core.args.pair(roi_size, "roi_size")
    params = dict(
        spatial_scales=[1.0 / s for s in scales[:levels]],
        sampling_ratio=core.args.sampling_ratio(sampling_ratio, "sampling_ratio"),
        aligned=False, first_level=min_stage, canonical_level=_CANONICAL_LEVEL,
        canonical_size=core.args.positive_scale(roi_canonical_scale, "roi_canonical_scale"),
        levels=_level_rules(eps), convention="mxnet", masked=True, n_threads=_threads(n_threads),
        names=_NAMES)
    maps = list(features[:levels])
    if not mx.autograd.is_recording():
        return _forward(size, params, maps, rpn_rois)
    inputs = maps + [rpn_rois]
    order = sorted(range(len(inputs)), key=lambda i: not _in_graph(inputs[i]))
    return _Function(size, params, [i if i < levels else -1 for i in order])(
        *[inputs[i] for i in order])
