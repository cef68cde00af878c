"""RoIAlign from a feature pyramid (FPN): each box pooled from the level its size assigns.

Two-stage detectors with an FPN assign each box to one level of the pyramid by its size and
pool it with RoIAlign from that level's map (torchvision ``MultiScaleRoIAlign``, detectron2
``ROIPooler``, mmdet ``SingleRoIExtractor``, PaddleDetection ``distribute_fpn_proposals`` +
``roi_align``, GluonCV ``_pyramid_roi_feats``, OpenVINO
``ExperimentalDetectronROIFeatureExtractor``).  :func:`pyramid_roi_align` does it in one
call: every box's level is computed in C, and each level's boxes are pooled straight into
their rows of one output, with no zero fill and no scatter.

The level rule is a :class:`~roicore.core.conventions.LevelRules` (``levels=``, a framework
name from ``conventions.LEVELS``), with the canonical level ``k0`` and size ``s0`` as
arguments; the frameworks' usual values are in :data:`CANONICAL`.  The pooling itself is
:func:`roicore.core.roi_align` with its ``convention``.

This operator takes a list of maps, so it is not in the single-map operator table
(:mod:`roicore.core.operators`).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from . import _binding
from . import args as V
from ._threads import effective_n_threads
from .conventions import LEVELS, ROI_ALIGN, LevelRules, RoIAlignRules, resolve

__all__ = ["pyramid_levels", "pyramid_roi_align", "pyramid_roi_align_backward", "CANONICAL",
           "MAX_LEVELS"]

MAX_LEVELS = 64

# (canonical level k0, canonical size s0) each framework uses by default
CANONICAL = {
    "torchvision": (4, 224.0), "detectron2": (4, 224.0), "paddle": (4, 224.0),
    "gluoncv": (4, 224.0), "mmdet": (0, 56.0), "openvino": (2, 224.0),
    "tf_model_garden": (4, 224.0),
}


def _int(value, name, lo=-1024, hi=1024):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def _scales(spatial_scales, name):
    """The levels' spatial scales as a float64 array, each positive and finite."""
    if isinstance(spatial_scales, (str, bytes)) or not hasattr(spatial_scales, "__len__"):
        raise TypeError(f"{name} must be a sequence of floats, one per level, got "
                        f"{type(spatial_scales).__name__}")
    if not 1 <= len(spatial_scales) <= MAX_LEVELS:
        raise ValueError(f"{name} must have 1 to {MAX_LEVELS} levels, got {len(spatial_scales)}")
    return np.array([V.positive_scale(s, f"{name}[{i}]") for i, s in enumerate(spatial_scales)],
                    dtype=np.float64)


def _first_level(first_level, scales, name):
    """The level of map 0: given, or ``-log2(spatial_scales[0])``, which must then be a
    power of two, as torchvision and detectron2 infer it."""
    if first_level is not None:
        return _int(first_level, "first_level")
    level = -math.log2(scales[0])
    if level != round(level):
        raise ValueError(f"{name}[0] must be a power of two (1/4, 1/8, ...) to infer the "
                         f"level of the first map, got {scales[0]!r}; pass first_level")
    return _int(int(round(level)), "first_level")


def _setup(spatial_scales, first_level, canonical_level, canonical_size, levels, n):
    scales = _scales(spatial_scales, n("spatial_scales"))
    return (resolve(levels, LEVELS, LevelRules, "pyramid_roi_align"), scales,
            _first_level(first_level, scales, n("spatial_scales")),
            _int(canonical_level, n("canonical_level")),
            V.positive_scale(canonical_size, n("canonical_size")))


def _maps(maps, name):
    """The maps as arrays to compute on, all of one dtype, and the dtype to return."""
    if isinstance(maps, np.ndarray) or not isinstance(maps, (list, tuple)):
        raise TypeError(f"{name} must be a list of (N, C, H, W) arrays, one per level, got "
                        f"{type(maps).__name__}")
    if not 1 <= len(maps) <= MAX_LEVELS:
        raise ValueError(f"{name} must have 1 to {MAX_LEVELS} levels, got {len(maps)}")
    arrays, dtypes = zip(*(V.nchw_float(m, f"{name}[{i}]") for i, m in enumerate(maps)))
    for i, (a, dt) in enumerate(zip(arrays, dtypes)):
        if dt != dtypes[0] or a.shape[:2] != arrays[0].shape[:2]:
            raise ValueError(f"{name}[{i}] must have {name}[0]'s batch, channels and dtype "
                             f"(N, C = {arrays[0].shape[:2]}, {dtypes[0]}): every level "
                             f"must, got {a.shape[:2]}, {dt}")
    return list(arrays), dtypes[0]


@V.Names.renaming
def pyramid_levels(boxes, spatial_scales, *, first_level=None, canonical_level=4,
                   canonical_size=224.0, levels="torchvision", batch_indices=None, masked=False,
                   dtype=np.float32, names=None):
    """The map each box is pooled from: an int64 (K,) array of indices into the pyramid's
    maps, -1 for a box that no level pools (its output is 0).  ``boxes`` may be (K, 4)
    without ``batch_indices`` (only masked boxes need their image).  ``dtype`` is the maps'
    (float32 or float64), in which the level is computed.  Arguments as in
    :func:`pyramid_roi_align`."""
    n = V.Names(names)
    rules, scales, first, k0, s0 = _setup(spatial_scales, first_level, canonical_level,
                                          canonical_size, levels, n)
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dtype}")
    arr = np.asarray(boxes)
    if batch_indices is None and arr.ndim == 2 and arr.shape[1] == 4:  # no images needed
        batch_indices = np.zeros(arr.shape[0], np.int64)
    coords, batch = V.boxes_and_batch(arr, batch_indices, np.iinfo(np.int64).max, dtype,
                                      masked, n("boxes"), n("batch_indices"))
    out = np.empty(coords.shape[0], np.int64)
    _binding.pyramid_levels(rules, scales, first, k0, s0, coords, batch, out, masked)
    return out


@V.Names.renaming
def pyramid_roi_align(maps, boxes, output_size, spatial_scales, sampling_ratio=-1,
                      aligned=False, *, first_level=None, canonical_level=4,
                      canonical_size=224.0, levels="torchvision", convention="torchvision",
                      batch_indices=None, masked=False, n_threads=None, out=None, names=None):
    """RoIAlign from a feature pyramid: box k pooled from the map its level rule assigns.

    maps : list of (N, C, H_i, W_i) arrays, one per level, finest first, of one dtype
    spatial_scales : the maps' scales (1/4, 1/8, ...), one per map
    first_level : the level of ``maps[0]``; by default ``-log2(spatial_scales[0])`` (which
        must then be a power of two), as torchvision and detectron2 infer it
    canonical_level, canonical_size : the rule's ``k0`` and ``s0``; :data:`CANONICAL` has
        each framework's usual values (mmdet: 0 and 56; OpenVINO: 2 and 224)
    levels : the level rule, a name from ``conventions.LEVELS`` or a ``LevelRules``
    convention : the RoIAlign arithmetic, as in :func:`roicore.core.roi_align`

    Box k's level is clamped to the pyramid's (``first_level`` .. ``first_level + L - 1``),
    and its row is what :func:`roicore.core.roi_align` gives for it on that map at that
    scale.  With one map every box is pooled from it (as the frameworks do).  Other
    arguments as in :func:`roicore.core.roi_align`.  Returns a (K, C, PH, PW) array.
    """
    n = V.Names(names)
    level_rules, scales, first, k0, s0 = _setup(spatial_scales, first_level, canonical_level,
                                                canonical_size, levels, n)
    rules = resolve(convention, ROI_ALIGN, RoIAlignRules, "pyramid_roi_align")
    sampling_ratio = V.sampling_ratio(sampling_ratio, n("sampling_ratio"))
    aligned = V.flag(aligned, n("aligned"))
    arrays, out_dtype = _maps(maps, n("maps"))
    if len(arrays) != len(scales):
        raise ValueError(f"{n('spatial_scales')} must have one scale per map: {len(arrays)} "
                         f"maps, got {len(scales)} scales")
    N, C = arrays[0].shape[:2]
    PH, PW = V.pair(output_size, n("output_size"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, arrays[0].dtype, masked,
                                      n("boxes"), n("batch_indices"))
    threads = effective_n_threads(n_threads)
    if out is not None and out_dtype == np.float16:
        raise TypeError("out= is not supported for float16 input, which is computed in float32")
    out = V.out_buffer(out, (coords.shape[0], C, PH, PW), arrays[0].dtype,
                       tuple(arrays) + (boxes, batch_indices))
    _binding.pyramid_roi_align_forward(rules, level_rules, scales, first, k0, s0, arrays, coords,
                                       batch, sampling_ratio, aligned, out, threads, masked)
    return out.astype(out_dtype, copy=False)


@V.Names.renaming
def pyramid_roi_align_backward(grad_output, boxes, input_shapes, spatial_scales,
                               sampling_ratio=-1, aligned=False, *, first_level=None,
                               canonical_level=4, canonical_size=224.0, levels="torchvision",
                               convention="torchvision", batch_indices=None, masked=False,
                               n_threads=None, names=None):
    """Gradient of :func:`pyramid_roi_align`: a list with one array per map, of the shapes
    ``input_shapes``, each holding the gradients of its own level's boxes (added in box
    order, as :func:`roicore.core.roi_align_backward` adds them)."""
    n = V.Names(names)
    level_rules, scales, first, k0, s0 = _setup(spatial_scales, first_level, canonical_level,
                                                canonical_size, levels, n)
    rules = resolve(convention, ROI_ALIGN, RoIAlignRules, "pyramid_roi_align_backward")
    sampling_ratio = V.sampling_ratio(sampling_ratio, n("sampling_ratio"))
    aligned = V.flag(aligned, n("aligned"))
    if isinstance(input_shapes, (str, bytes)) or not hasattr(input_shapes, "__len__"):
        raise TypeError(f"{n('input_shapes')} must be a sequence of (N, C, H, W) shapes")
    shapes = [V.input_shape(s, f"{n('input_shapes')}[{i}]") for i, s in enumerate(input_shapes)]
    if len(shapes) != len(scales):
        raise ValueError(f"{n('spatial_scales')} must have one scale per map: {len(shapes)} "
                         f"input_shapes, got {len(scales)} scales")
    if any(s[:2] != shapes[0][:2] for s in shapes):
        raise ValueError(f"every level must have the batch and channels of the first, got "
                         f"{[s[:2] for s in shapes]}")
    g, out_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, C, PH, PW)")
    N, C = shapes[0][:2]
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, g.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], C) + g.shape[2:], n("grad_output"))
    threads = effective_n_threads(n_threads)
    grads = [V.out_buffer(None, s, g.dtype, (), name=f"the gradient of map {i}")
             for i, s in enumerate(shapes)]
    _binding.pyramid_roi_align_backward(rules, level_rules, scales, first, k0, s0, g, coords,
                                        batch, sampling_ratio, aligned, grads, threads, masked)
    return [d.astype(out_dtype, copy=False) for d in grads]
