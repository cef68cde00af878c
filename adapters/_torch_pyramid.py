"""torchvision's ``MultiScaleRoIAlign`` on roicore's fused pyramid RoIAlign
(:func:`roicore.core.pyramid_roi_align`); :mod:`roicore.adapters.torch` exports it.

torchvision assigns each box a level (``LevelMapper``), then loops over the levels: a zeroed
output, ``roi_align`` per level and an index scatter.  Here one operator,
``torch.ops.roicore.multi_scale_roi_align``, computes the levels in C and pools each box
straight into its row; its backward sends each box's gradient to its own level's map.
Levels, outputs and gradients are bit-identical to torchvision's for float32 and float64.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from roicore import core
from .torch import (
    _NATIVE_LIBRARY, CONVENTION, NAMES, Tensor, _array, _check_input, _host, _on, _rois,
    _tensor, _threads, _warn_if_fallback, nn, torch,
)

__all__ = ["MultiScaleRoIAlign", "multi_scale_roi_align"]

LEVELS = "torchvision"
# torchvision's names of roicore.core's arguments, for messages
PYRAMID_NAMES = {**NAMES, "maps": "features"}


def _level_arguments(first_level: int, canonical_level: int, canonical_size: float):
    return dict(first_level=first_level, canonical_level=canonical_level,
                canonical_size=canonical_size, levels=LEVELS, convention=CONVENTION,
                names=PYRAMID_NAMES)


# --------------------------------------------------------------------------- the operator
#
# torch.ops.roicore.multi_scale_roi_align and its backward come from roicore's C++ op
# library when the adapter loaded it (TorchScript, AOTInductor), else from the Python
# custom ops below, with the same schemas; the fake implementations serve both.

def _pyramid_kernel(maps: List[Tensor], rois: Tensor, spatial_scales: List[float],
                    pooled_height: int, pooled_width: int, sampling_ratio: int, aligned: bool,
                    first_level: int, canonical_level: int, canonical_size: float,
                    n_threads: Optional[int]) -> Tensor:
    op = "multi_scale_roi_align"
    arrays = [_array(m, f"features[{i}]", op) for i, m in enumerate(maps)]
    y = core.pyramid_roi_align(
        arrays, _array(rois, "rois", op), (pooled_height, pooled_width), spatial_scales,
        sampling_ratio, aligned, n_threads=_threads(n_threads),
        **_level_arguments(first_level, canonical_level, canonical_size))
    return _tensor(y, maps[0])


def _pyramid_backward_kernel(grad: Tensor, rois: Tensor, spatial_scales: List[float],
                             input_shapes: List[int], sampling_ratio: int, aligned: bool,
                             first_level: int, canonical_level: int, canonical_size: float,
                             n_threads: Optional[int]) -> List[Tensor]:
    op = "multi_scale_roi_align_backward"
    shapes = [tuple(input_shapes[i:i + 4]) for i in range(0, len(input_shapes), 4)]
    grads = core.pyramid_roi_align_backward(
        _array(grad, "grad", op), _array(rois, "rois", op), shapes, spatial_scales,
        sampling_ratio, aligned, n_threads=_threads(n_threads),
        **_level_arguments(first_level, canonical_level, canonical_size))
    return [_tensor(d, grad) for d in grads]


def _pyramid_fake(maps, rois, spatial_scales, pooled_height, pooled_width, sampling_ratio,
                  aligned, first_level, canonical_level, canonical_size, n_threads):
    return maps[0].new_empty((rois.shape[0], maps[0].shape[1], pooled_height, pooled_width))


def _pyramid_backward_fake(grad, rois, spatial_scales, input_shapes, sampling_ratio, aligned,
                           first_level, canonical_level, canonical_size, n_threads):
    return [grad.new_empty(tuple(input_shapes[i:i + 4])) for i in range(0, len(input_shapes), 4)]


def _python_operators(namespace: str = "roicore"):
    """The two ops as Python custom ops named ``<namespace>::<op>``, with their fakes and
    autograd formula (the C++ library's); returns the forward's CustomOpDef."""
    forward = torch.library.custom_op(f"{namespace}::multi_scale_roi_align", _pyramid_kernel,
                                      mutates_args=(), device_types="cpu")
    backward = torch.library.custom_op(f"{namespace}::multi_scale_roi_align_backward",
                                       _pyramid_backward_kernel, mutates_args=(),
                                       device_types="cpu")
    forward.register_fake(_pyramid_fake)
    backward.register_fake(_pyramid_backward_fake)

    def setup_context(ctx, inputs, output):
        maps, rois, scales, _, _, sampling_ratio, aligned, first, k0, s0, n_threads = inputs
        ctx.save_for_backward(rois)
        ctx.shapes = [d for m in maps for d in m.shape]
        ctx.args = (scales, sampling_ratio, aligned, first, k0, s0, n_threads)

    def gradient(ctx, grad):
        rois, = ctx.saved_tensors
        scales, sampling_ratio, aligned, first, k0, s0, n_threads = ctx.args
        grads = backward(grad, rois, scales, ctx.shapes, sampling_ratio, aligned, first, k0, s0,
                         n_threads)
        return (list(grads),) + (None,) * 10

    forward.register_autograd(gradient, setup_context=setup_context)
    return forward


# the C++ ops' fakes, which roicore.adapters.torch registers (torch wants them registered
# from the module the library names)
FAKES = {"multi_scale_roi_align": _pyramid_fake,
         "multi_scale_roi_align_backward": _pyramid_backward_fake}
if _NATIVE_LIBRARY is None:
    _python_operators("roicore")


# --------------------------------------------------------------------------- torchvision's API

def _infer_scale(feature: Tensor, original_size: List[int]) -> float:
    """torchvision's: the power of two nearest the feature map's height over the image's."""
    approx_scale = float(feature.shape[-2]) / float(original_size[0])
    return 2 ** float(torch.tensor(approx_scale).log2().round())


def _setup_scales(features: List[Tensor], image_shapes: List[Tuple[int, int]]
                  ) -> Tuple[List[float], int]:
    """The maps' scales and the level of the first, inferred as torchvision infers them
    (TorchScript compiles this too)."""
    if len(image_shapes) == 0:
        raise ValueError("images list should not be empty")
    max_x = 0
    max_y = 0
    for shape in image_shapes:
        max_x = max(shape[0], max_x)
        max_y = max(shape[1], max_y)
    scales = [_infer_scale(f, [max_x, max_y]) for f in features]
    first = int(-torch.log2(torch.tensor(scales[0], dtype=torch.float32)).item())
    last = int(-torch.log2(torch.tensor(scales[-1], dtype=torch.float32)).item())
    if last - first + 1 != len(features):
        # torchvision would clamp levels to [first, last] and pool level i from map i, so
        # some boxes would come from a map of another scale and others from none
        raise ValueError("MultiScaleRoIAlign: the feature maps must be one per level from "
                         "level " + str(first) + " to " + str(last) + ", got " +
                         str(len(features)) + " maps of scales " + str(scales))
    return scales, first


def _scripted_rois(boxes: List[Tensor]) -> Tensor:
    """torchvision's (K, 5) rois from one Tensor[L, 4] per image, in TorchScript."""
    ids = [torch.full_like(b[:, :1], float(i)) for i, b in enumerate(boxes)]
    return torch.cat([torch.cat(ids, dim=0), torch.cat(boxes, dim=0)], dim=1)


def multi_scale_roi_align(features: List[Tensor], boxes: List[Tensor], output_size,
                          sampling_ratio: int, scales: List[float], *, canonical_scale: int = 224,
                          canonical_level: int = 4, n_threads: Optional[int] = None) -> Tensor:
    """RoIAlign of each box from the pyramid level torchvision's ``LevelMapper`` assigns it.

    Args:
        features (List[Tensor[N, C, H_i, W_i]]): the levels' maps, finest first, one per
            power-of-two scale.
        boxes (List[Tensor[L, 4]]): one per image, ``[x1, y1, x2, y2]`` in image pixels.
        output_size (int or Tuple[int, int]), sampling_ratio (int): as ``roi_align``.
        scales (List[float]): each map's scale (1/4, 1/8, ...), powers of two.
        canonical_scale, canonical_level: the level rule's ``s0`` and ``k0``.
        n_threads: as :func:`roicore.adapters.torch.roi_align`.

    Returns:
        Tensor[K, C, output_size[0], output_size[1]], the boxes of all images in order.
    """
    op = "multi_scale_roi_align"
    _warn_if_fallback()
    if not isinstance(features, (list, tuple)) or not features:
        raise ValueError(f"{op}: features must be a non-empty list of Tensor[N, C, H, W]")
    for f in features:
        _check_input(f, op)
    scales = [float(s) for s in scales]
    if len(scales) != len(features):
        raise ValueError(f"{op}: scales must have one scale per feature map: {len(features)} "
                         f"maps, got {len(scales)} scales")
    first = -math.log2(scales[0])
    if first != round(first):
        raise ValueError(f"{op}: scales must be powers of two, got {scales}")
    size = core.args.pair(output_size, "output_size")
    rois = _rois(list(boxes), features[0], op)
    if torch.onnx.is_in_onnx_export():
        return _onnx_composition(features, rois, scales, size, sampling_ratio,
                                 int(round(first)), canonical_level, float(canonical_scale))
    device = features[0].device
    maps = [_host(f, f"features[{i}]", op) for i, f in enumerate(features)]
    y = torch.ops.roicore.multi_scale_roi_align(maps, _host(rois, "boxes", op), scales, size[0], size[1], sampling_ratio,
                    False, int(round(first)), canonical_level, float(canonical_scale), n_threads)
    return _on(y, device)


def _onnx_composition(features: List[Tensor], rois: Tensor, scales: List[float], size,
                      sampling_ratio: int, first: int, canonical_level: int,
                      canonical_scale: float) -> Tensor:
    """What an ONNX export records: torchvision's own graph, its LevelMapper on tensors,
    ``roi_align`` per level (the ``RoiAlign`` node) and the rows scattered back as its
    ``_onnx_merge_levels`` does, so the file is what torchvision's module exports and runs
    on any ONNX runtime.  (ONNX has no fused pyramid operator.)"""
    from .torch import roi_align
    widths = rois[:, 3] - rois[:, 1]
    heights = rois[:, 4] - rois[:, 2]
    s = torch.sqrt(widths * heights)
    levels = torch.floor(canonical_level + torch.log2(s / canonical_scale)
                         + torch.tensor(1e-6, dtype=s.dtype))
    levels = torch.clamp(levels, min=first, max=first + len(features) - 1)
    levels = levels.to(torch.int64) - first
    pooled = []
    for level, (feature, scale) in enumerate(zip(features, scales)):
        rows = torch.where(levels == level)[0]
        pooled.append((rows, roi_align(feature, rois[rows], size, spatial_scale=scale,
                                       sampling_ratio=sampling_ratio)))
    first_pooled = pooled[0][1]
    out = torch.zeros((rois.shape[0], first_pooled.shape[1], size[0], size[1]),
                      dtype=first_pooled.dtype, device=first_pooled.device)
    for rows, result in pooled:
        index = rows.view(-1, 1, 1, 1).expand(rows.size(0), result.size(1), result.size(2),
                                              result.size(3))
        out = out.scatter(0, index, result)
    return out


class _LevelMap:
    """torchvision's ``LevelMapper`` call: each box's level index, computed by roicore's
    rule (-1 for a box no level pools, where torchvision's integer is undefined)."""

    def __init__(self, k_min: int, k_max: int, canonical_scale: int, canonical_level: int):
        self.k_min, self.k_max = k_min, k_max
        self.s0, self.lvl0 = canonical_scale, canonical_level

    def __call__(self, boxlists: List[Tensor]) -> Tensor:
        boxes = torch.cat([b.detach().cpu() for b in boxlists])
        dtype = np.float64 if boxes.dtype == torch.float64 else np.float32
        levels = core.pyramid_levels(
            boxes.to(torch.float64 if dtype == np.float64 else torch.float32).numpy(),
            [2.0 ** -k for k in range(self.k_min, self.k_max + 1)], first_level=self.k_min,
            canonical_level=self.lvl0, canonical_size=float(self.s0), levels=LEVELS, dtype=dtype)
        return torch.from_numpy(levels)


class MultiScaleRoIAlign(nn.Module):
    """``torchvision.ops.MultiScaleRoIAlign`` on one fused roicore operator.

    The constructor and ``forward(x, boxes, image_shapes)`` are torchvision's: ``x`` maps
    names to feature maps, of which those in ``featmap_names`` are pooled (in ``x``'s
    order); the scales and levels are inferred at the first call from the maps' and images'
    sizes and kept (``scales``, ``first_level``; ``map_levels`` gives each box's level), as
    torchvision does.  Outputs and gradients are bit-identical to torchvision's for float32
    and float64; float16 and bfloat16 are computed in float32 (torchvision, too, pools them
    in float32 under autocast).  ``torch.jit.script`` compiles it (a scripted model runs
    wherever roicore's op library is loaded), as do ``torch.compile`` and ``torch.export``.

    Differences: feature maps that are not one per power-of-two level raise ValueError
    (torchvision pools some boxes from a map of another scale); ``n_threads`` as in
    :func:`roicore.adapters.torch.roi_align`.  An ONNX export (either exporter) records
    torchvision's own graph for it, levels on tensors, ``RoiAlign`` per level and a scatter,
    since ONNX has no fused pyramid operator.
    """
    __annotations__ = {"scales": Optional[List[float]], "first_level": Optional[int],
                       "n_threads": Optional[int]}
    # a Python helper, not part of a scripted module
    __jit_ignored_attributes__ = ["map_levels"]

    def __init__(self, featmap_names: List[str], output_size, sampling_ratio: int, *,
                 canonical_scale: int = 224, canonical_level: int = 4,
                 n_threads: Optional[int] = None):
        super().__init__()
        if isinstance(output_size, int):
            output_size = (output_size, output_size)
        self.featmap_names = featmap_names
        self.sampling_ratio = sampling_ratio
        self.output_size = tuple(output_size)
        self.scales = None
        self.first_level = None
        self.map_levels = None
        self.canonical_scale = canonical_scale
        self.canonical_level = canonical_level
        self.n_threads = n_threads

    def forward(self, x: Dict[str, Tensor], boxes: List[Tensor],
                image_shapes: List[Tuple[int, int]]) -> Tensor:
        features: List[Tensor] = []
        for k, v in x.items():
            if k in self.featmap_names:
                features.append(v)
        scales = self.scales
        first = self.first_level
        if scales is None or first is None:
            scales, first = _setup_scales(features, image_shapes)
            self.scales = scales
            self.first_level = first
            if not torch.jit.is_scripting():
                self.map_levels = _LevelMap(first, first + len(scales) - 1,
                                            self.canonical_scale, self.canonical_level)
        if torch.jit.is_scripting():  # the op checks every value itself
            return torch.ops.roicore.multi_scale_roi_align(
                features, _scripted_rois(boxes), scales, self.output_size[0],
                self.output_size[1], self.sampling_ratio, False, first, self.canonical_level,
                float(self.canonical_scale), self.n_threads)
        return multi_scale_roi_align(features, boxes, self.output_size, self.sampling_ratio,
                                     scales, canonical_scale=self.canonical_scale,
                                     canonical_level=self.canonical_level,
                                     n_threads=self.n_threads)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(featmap_names={self.featmap_names}, "
                f"output_size={self.output_size}, sampling_ratio={self.sampling_ratio})")
