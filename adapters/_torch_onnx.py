"""ONNX export of the torch adapter's operators, with both of torch's exporters.

``roi_align`` becomes ONNX ``RoiAlign`` and ``roi_pool`` becomes ``MaxRoiPool``, the nodes
torchvision's operators export to; ONNX Runtime computes them with the same bits as the
adapter (float32; float64 where the scale is a float32, see :func:`_check_scale`).
``ps_roi_pool`` and ``ps_roi_align`` have no standard ONNX operator: they become
``PSRoIPool`` and ``PSRoIAlign`` nodes of the ``roicore`` domain (:data:`DOMAIN`), which
carry every argument of the call and the convention that defines them.

The TorchScript-based exporter (``dynamo=False``) records calls of ``torch.ops.roicore.*``
and translates them with the symbolic functions registered here.  The ``dynamo=True``
exporter traces the adapter's functions, which emit the ONNX node themselves through
``torch.onnx.ops.symbolic`` while :func:`exporting` is true.
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

__all__ = ["DOMAIN", "DOMAIN_VERSION", "register", "exporting", "roi_align", "roi_pool",
           "ps_roi_pool", "ps_roi_align", "OnnxExportWarning"]

DOMAIN = "roicore"
DOMAIN_VERSION = 1
CONVENTION = "torchvision"
# RoiAlign's coordinate_transformation_mode arrived in opset 16; before it, RoiAlign
# (opset 10) always computes aligned=False
_ALIGNED_OPSET = 16


class OnnxExportWarning(UserWarning):
    """An exported model computes something other than the adapter does (its numbers, or
    what runtimes can run it)."""


def _check_scale(op: str, spatial_scale: float, dtype) -> None:
    """ONNX holds spatial_scale as a float attribute: a float64 model whose scale is not
    a float32 computes with the rounded scale, so its last bits differ."""
    if dtype == torch.float64 and float(np.float32(spatial_scale)) != spatial_scale:
        warnings.warn(
            f"{op}: ONNX stores spatial_scale as a float32, so this float64 model computes "
            f"with {float(np.float32(spatial_scale))!r} instead of {spatial_scale!r} and its "
            f"results differ from PyTorch's in the last bits; a scale that is a float32 "
            f"(such as 1/16) keeps them bit-exact", OnnxExportWarning, stacklevel=4)


def _sampling(sampling_ratio: int) -> int:
    # torchvision samples ceil(bin size) points for any ratio <= 0; ONNX spells it 0
    return max(int(sampling_ratio), 0)


def _check_pool_dtype(dtype) -> None:
    if dtype == torch.float64:
        warnings.warn("roi_pool: ONNX Runtime has no float64 kernel for MaxRoiPool; the "
                      "exported model is valid ONNX but ONNX Runtime refuses to load it",
                      OnnxExportWarning, stacklevel=4)


# --------------------------------------------------------------------------- dynamo=True

def exporting() -> bool:
    """True while ``torch.onnx.export(..., dynamo=True)`` traces the model.  The
    TorchScript-based exporter traces with ``torch.jit.trace`` and translates the recorded
    ops instead (:func:`register`)."""
    return torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing()


def _coords_and_batch(rois):
    return rois[:, 1:5], rois[:, 0].to(torch.int64)


def roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int,
              sampling_ratio: int, aligned: bool):
    _check_scale("roi_align", spatial_scale, input.dtype)
    coords, batch = _coords_and_batch(rois)
    return torch.onnx.ops.symbolic(
        "RoiAlign", (input, coords, batch),
        dict(mode="avg", output_height=pooled_height, output_width=pooled_width,
             sampling_ratio=_sampling(sampling_ratio), spatial_scale=float(spatial_scale),
             coordinate_transformation_mode="half_pixel" if aligned else "output_half_pixel"),
        dtype=input.dtype, shape=(rois.shape[0], input.shape[1], pooled_height, pooled_width))


def roi_pool(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
    _check_pool_dtype(input.dtype)
    _check_scale("roi_pool", spatial_scale, input.dtype)
    return torch.onnx.ops.symbolic(
        "MaxRoiPool", (input, rois),
        dict(pooled_shape=[pooled_height, pooled_width], spatial_scale=float(spatial_scale)),
        dtype=input.dtype, shape=(rois.shape[0], input.shape[1], pooled_height, pooled_width))


def _position_sensitive(op_type, input, rois, attrs, pooled_height, pooled_width):
    channels = input.shape[1] // (pooled_height * pooled_width)
    return torch.onnx.ops.symbolic(
        f"{DOMAIN}::{op_type}", (input, rois), {**attrs, "convention": CONVENTION},
        dtype=input.dtype, shape=(rois.shape[0], channels, pooled_height, pooled_width),
        version=DOMAIN_VERSION)


def ps_roi_pool(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int):
    return _position_sensitive("PSRoIPool", input, rois, dict(
        spatial_scale=float(spatial_scale), pooled_height=pooled_height,
        pooled_width=pooled_width), pooled_height, pooled_width)


def ps_roi_align(input, rois, spatial_scale: float, pooled_height: int, pooled_width: int,
                 sampling_ratio: int):
    return _position_sensitive("PSRoIAlign", input, rois, dict(
        spatial_scale=float(spatial_scale), pooled_height=pooled_height,
        pooled_width=pooled_width, sampling_ratio=int(sampling_ratio)),
        pooled_height, pooled_width)


# --------------------------------------------------------------------------- dynamo=False

def _dtype(value):
    scalar = value.type().scalarType() if value.type().kind() == "TensorType" else None
    return {"Float": torch.float32, "Double": torch.float64}.get(scalar)


def _symbolics():
    from torch.onnx import errors, symbolic_helper
    from torch.onnx import symbolic_opset11 as opset11
    parse_args = symbolic_helper.parse_args

    def columns(g, rois, first, last):
        return opset11.select(g, rois, 1, g.op(
            "Constant", value_t=torch.tensor(list(range(first, last)), dtype=torch.long)))

    def coords_and_batch(g, rois):
        batch = opset11.squeeze(g, columns(g, rois, 0, 1), 1)
        return columns(g, rois, 1, 5), g.op("Cast", batch, to_i=torch.onnx.TensorProtoDataType.INT64)

    def align(opset):
        @parse_args("v", "v", "f", "i", "i", "i", "b", "v")
        def symbolic(g, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                     aligned, n_threads):
            _check_scale("roi_align", spatial_scale, _dtype(input))
            if aligned and opset < _ALIGNED_OPSET:
                raise errors.UnsupportedOperatorError(
                    "roicore::roi_align with aligned=True", g.opset, _ALIGNED_OPSET)
            coords, batch = coords_and_batch(g, rois)
            mode = {} if opset < _ALIGNED_OPSET else {"coordinate_transformation_mode_s":
                                                      "half_pixel" if aligned else "output_half_pixel"}
            return g.op("RoiAlign", input, coords, batch, spatial_scale_f=spatial_scale,
                        output_height_i=pooled_height, output_width_i=pooled_width,
                        sampling_ratio_i=_sampling(sampling_ratio), **mode)
        return symbolic

    @parse_args("v", "v", "f", "i", "i", "b", "v")
    def pool(g, input, rois, spatial_scale, pooled_height, pooled_width, need_argmax, n_threads):
        _check_pool_dtype(_dtype(input))
        _check_scale("roi_pool", spatial_scale, _dtype(input))
        return g.op("MaxRoiPool", input, rois, pooled_shape_i=(pooled_height, pooled_width),
                    spatial_scale_f=spatial_scale), None

    def typed(out, input, pooled_height, pooled_width):
        # a node of an unknown domain has no shape inference: its output type is set here
        sizes = symbolic_helper._get_tensor_sizes(input) or [None, None]
        channels = sizes[1] // (pooled_height * pooled_width) if sizes[1] else None
        out.setType(input.type().with_sizes([None, channels, pooled_height, pooled_width]))
        return out

    @parse_args("v", "v", "f", "i", "i", "v")
    def ps_pool(g, input, rois, spatial_scale, pooled_height, pooled_width, n_threads):
        return typed(g.op(f"{DOMAIN}::PSRoIPool", input, rois, spatial_scale_f=spatial_scale,
                          pooled_height_i=pooled_height, pooled_width_i=pooled_width,
                          convention_s=CONVENTION), input, pooled_height, pooled_width)

    @parse_args("v", "v", "f", "i", "i", "i", "v")
    def ps_align(g, input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                 n_threads):
        return typed(g.op(f"{DOMAIN}::PSRoIAlign", input, rois, spatial_scale_f=spatial_scale,
                          pooled_height_i=pooled_height, pooled_width_i=pooled_width,
                          sampling_ratio_i=sampling_ratio, convention_s=CONVENTION),
                     input, pooled_height, pooled_width)

    return [("roi_align", align(10), 10), ("roi_align", align(_ALIGNED_OPSET), _ALIGNED_OPSET),
            ("roi_pool", pool, 9), ("ps_roi_pool", ps_pool, 9), ("ps_roi_align", ps_align, 9)]


def register() -> None:
    """Register the symbolic functions of ``roicore::*`` with the TorchScript-based
    exporter (each for its first opset; the exporter picks the newest at or below the
    export's opset)."""
    for name, symbolic, opset in _symbolics():
        torch.onnx.register_custom_op_symbolic(f"roicore::{name}", symbolic, opset)
