"""PyTorch front end: ``torchvision.ops`` RoI operators on top of :mod:`roicore.core`.

Functions ``roi_pool``, ``roi_align``, ``ps_roi_pool``, ``ps_roi_align`` and modules
``RoIPool``, ``RoIAlign``, ``PSRoIPool``, ``PSRoIAlign`` take the arguments of
``torchvision.ops`` (and its defaults), plus a keyword-only ``n_threads``: the OpenMP
threads of the core (None: ``torch.get_num_threads()`` at the time of the call).  Every op
computes with ``convention="torchvision"``, so for float32 and float64 the outputs and the
gradients with respect to ``input`` are bit-identical to torchvision's CPU kernels, for
every thread count.  float16 and bfloat16 inputs are computed in float32 and the results
rounded once to the input's dtype (torchvision computes Half in Half arithmetic, so those
results can differ from its own in the last bits).

Boxes are a ``Tensor[K, 5]`` of ``[batch_index, x1, y1, x2, y2]`` rows or a list of
``Tensor[L, 4]`` (one per image), in ``input``'s dtype.  Boxes of the wrong shape raise
:class:`BoxesShapeError`, both a ValueError and the AssertionError torchvision raises.

As in torchvision: the pool modules trace with ``torch.fx``; under ``torch.autocast`` on
the CPU, ``roi_align`` computes float16, bfloat16 and float32 operands in float32 and
returns ``input``'s dtype (the other ops are not autocast, there as here); ``roi_align``
takes a quantized ``input`` (quint8, qint8, qint32, one image, quantized boxes) and returns
it quantized with ``input``'s scale and zero point.

Differences from torchvision, all but the last about inputs it does not define:

- A batch index that is not an integer in ``[0, N)`` and a coordinate that is not finite
  raise ValueError (torchvision truncates the index and reads out of bounds).
- Boxes in another dtype than ``input`` raise TypeError (torchvision: RuntimeError).
- float16 and bfloat16 are computed in float32 (see above), and ``roi_pool``,
  ``ps_roi_pool`` and ``ps_roi_align`` take bfloat16 on the CPU, where torchvision has no
  kernel for it.

Operators.  The functions call ``torch.ops.roicore.<name>`` (``roi_pool``, ``roi_align``,
``ps_roi_pool``, ``ps_roi_align``, each with ``<name>_backward``).  They come from
roicore's **C++ op library** (:mod:`roicore.adapters.native.torch`): ``TORCH_LIBRARY``
operators with CPU kernels on roicore's C library, their autograd formulas and
torchvision's CPU autocast rule for ``roi_align`` in C++, and fake (meta) implementations
registered here.  Importing this module loads it, compiled first against the installed
torch if the per-user cache has none (a line on stderr says so; later imports load the
cached file); :func:`native_library` gives its path.  The ops pass
``torch.library.opcheck``, run under ``torch.compile(fullgraph=True)`` forward and
backward, survive ``torch.export`` with ``torch.export.save``/``load``, and compile into
AOTInductor packages (``torch._inductor.aoti_compile_and_package``).  Where the library
cannot be built (no C++ compiler, a failed compile) or ``ROICORE_TORCH_NATIVE=0`` turns it
off, the same ops, with the same schemas and numbers, are Python custom ops
(``torch.library.custom_op``, kernels over roicore.core), and the first call warns why
(:class:`NativeOpsWarning`; not when turned off): eager mode, torch.compile and
torch.export work, deployments without Python do not.  A program exported through either
loads in a process that has the other.  Double backward is not supported (as in
torchvision).  An output past roicore's memory limit raises ``torch.OutOfMemoryError`` (a
RuntimeError, as torch's own failed CPU allocations are) from the C++ ops, MemoryError
from the Python ones.

TorchScript.  ``torch.jit.script`` compiles the modules, the functions and models that call
them (scripting a function compiles a typed twin of it, which calls the ops; ``n_threads``
is then positional too).  A scripted module saved with ``torch.jit.save``, like an
AOTInductor package, runs in any process that has loaded the op library, Python
(``torch.ops.load_library(path)``) or C++ (libtorch), without roicore: ``python -m
roicore.adapters.native.torch`` prints the library's path.  In TorchScript the ops check
the values (their errors), a quantized ``input`` is refused, and tensors on another
device are copied to the host and back (the device policy is Python state; it does not
apply).  ``torch.jit.trace`` records the same calls of ``torch.ops.roicore.*``.

Copies.  On the CPU the feature map and upstream gradient are read in place (a
non-contiguous input is made contiguous, as torchvision does; float16 and bfloat16 are
converted to float32), and the kernels write into the outputs handed back.  ``roi_pool``
computes its argmax only when a gradient can be asked for (under torch.compile, torch.export
and TorchScript, as decided when the call is traced or run: export under
``torch.no_grad()`` for inference).

Devices.  Tensors on another device follow :func:`roicore.adapters.set_device_policy`:
copied to the host and the result copied back (with a DeviceCopyWarning once per device),
or refused with ValueError; gradients flow back through the copies.
"""
from __future__ import annotations

import dataclasses
import numbers
import types
import warnings
from typing import List, Optional, Tuple, Union

import numpy as np

from roicore import core
from . import _torch_onnx as _onnx
from ._common import off_host, require, switched_off

torch = require("torch", "torch")
from torch import Tensor, nn  # noqa: E402
from torch.jit.annotations import BroadcastingList2  # noqa: E402

__all__ = ["roi_pool", "roi_align", "ps_roi_pool", "ps_roi_align", "multi_scale_roi_align",
           "RoIPool", "RoIAlign", "PSRoIPool", "PSRoIAlign", "MultiScaleRoIAlign",
           "BoxesShapeError",
           "NativeOpsWarning", "native_library"]

CONVENTION = "torchvision"
# RoIAlign's sums, undivided: the quantized roi_align divides after the zero point is out
_SUMMED = dataclasses.replace(core.conventions.ROI_ALIGN[CONVENTION], reduction="sum")
# torchvision's names of roicore.core's arguments, for messages
NAMES = {"x": "input"}
_COMPUTED = (torch.float32, torch.float64)
_ACCEPTED = _COMPUTED + (torch.float16, torch.bfloat16)


# --------------------------------------------------------------------------- conversion

def _computable(t: Tensor) -> Tensor:
    """t in a dtype the core computes in: float16 and bfloat16 go to float32."""
    return t if t.dtype in _COMPUTED else t.float()


def _floats(op: str, **tensors: Tensor) -> None:
    """The operators' own check of their tensors' dtypes, for callers of torch.ops.roicore.*
    (and of the fake implementations), which skip the functions' checks."""
    for name, t in tensors.items():
        if t.dtype not in _ACCEPTED:
            raise TypeError(f"roicore::{op}: {name} must be float32, float64, float16 or "
                            f"bfloat16, got {t.dtype}")


def _array(t: Tensor, name: str, op: str) -> np.ndarray:
    """A NumPy view of a CPU tensor (no copy), its dtype checked."""
    _floats(op, **{name: t})
    return _computable(t).detach().numpy()


def _tensor(a: np.ndarray, like: Tensor) -> Tensor:
    """A tensor sharing ``a``'s memory, in ``like``'s dtype (a copy only for float16 and
    bfloat16)."""
    t = torch.from_numpy(a)
    return t if t.dtype == like.dtype else t.to(like.dtype)


def _threads(n_threads: Optional[int]):
    return torch.get_num_threads() if n_threads is None else n_threads


# --------------------------------------------------------------------------- operators
#
# torch.ops.roicore.<op> and <op>_backward come from roicore's C++ op library when it can
# be had (roicore.adapters.native.torch: TORCH_LIBRARY, with the CPU kernels, autograd and
# autocast in C++), else from the Python custom ops below (torch.library.custom_op, kernels
# over roicore.core), with the same schemas.  The fake (meta) implementations below serve
# both.

_OP_NAMES = ("roi_pool", "roi_pool_backward", "roi_align", "roi_align_backward",
              "ps_roi_pool", "ps_roi_pool_backward", "ps_roi_align", "ps_roi_align_backward")


class NativeOpsWarning(RuntimeWarning):
    """roicore's PyTorch op library is not available; its operators run as Python custom
    ops over roicore.core (no TorchScript or AOTInductor deployments)."""


def _roi_pool_fake(input, rois, spatial_scale, pooled_height, pooled_width, need_argmax,
                   n_threads):
    _floats("roi_pool", input=input, rois=rois)
    shape = (rois.shape[0], input.shape[1], pooled_height, pooled_width)
    if not need_argmax:
        return input.new_empty(shape), input.new_empty(0, dtype=torch.int32)
    # the argmax is h*W + w, widened to int64 where a plane has 2**31 - 1 pixels or more
    index = torch.int32 if input.shape[2] * input.shape[3] < 2**31 - 1 else torch.int64
    return input.new_empty(shape), input.new_empty(shape, dtype=index)


def _roi_pool_backward_fake(grad, argmax, rois, batch_size, channels, height, width,
                            n_threads):
    _floats("roi_pool_backward", grad=grad, rois=rois)
    return grad.new_empty((batch_size, channels, height, width))


def _roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                    aligned, n_threads):
    _floats("roi_align", input=input, rois=rois)
    return input.new_empty((rois.shape[0], input.shape[1], pooled_height, pooled_width))


def _roi_align_backward_fake(grad, rois, spatial_scale, batch_size, channels, height, width,
                             sampling_ratio, aligned, n_threads):
    _floats("roi_align_backward", grad=grad, rois=rois)
    return grad.new_empty((batch_size, channels, height, width))


def _position_sensitive_shape(input, rois, pooled_height, pooled_width):
    cells = pooled_height * pooled_width
    torch._check(input.shape[1] % cells == 0, lambda: (
        f"input channels ({input.shape[1]}) must be a multiple of pooled height * pooled "
        f"width ({cells})"))
    return rois.shape[0], input.shape[1] // cells, pooled_height, pooled_width


def _ps_roi_pool_fake(input, rois, spatial_scale, pooled_height, pooled_width, n_threads):
    _floats("ps_roi_pool", input=input, rois=rois)
    return input.new_empty(_position_sensitive_shape(input, rois, pooled_height, pooled_width))


def _ps_roi_pool_backward_fake(grad, rois, spatial_scale, batch_size, channels, height, width,
                               n_threads):
    _floats("ps_roi_pool_backward", grad=grad, rois=rois)
    return grad.new_empty((batch_size, channels, height, width))


def _ps_roi_align_fake(input, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio,
                       n_threads):
    _floats("ps_roi_align", input=input, rois=rois)
    return input.new_empty(_position_sensitive_shape(input, rois, pooled_height, pooled_width))


def _ps_roi_align_backward_fake(grad, rois, spatial_scale, batch_size, channels, height, width,
                                sampling_ratio, n_threads):
    _floats("ps_roi_align_backward", grad=grad, rois=rois)
    return grad.new_empty((batch_size, channels, height, width))


_FAKES = {"roi_pool": _roi_pool_fake, "roi_pool_backward": _roi_pool_backward_fake,
          "roi_align": _roi_align_fake, "roi_align_backward": _roi_align_backward_fake,
          "ps_roi_pool": _ps_roi_pool_fake, "ps_roi_pool_backward": _ps_roi_pool_backward_fake,
          "ps_roi_align": _ps_roi_align_fake,
          "ps_roi_align_backward": _ps_roi_align_backward_fake}


# The Python kernels: roicore.core on NumPy views of the tensors.

def _roi_pool_kernel(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                     pooled_width: int, need_argmax: bool, n_threads: Optional[int]
                     ) -> Tuple[Tensor, Tensor]:
    """(output, argmax); argmax is empty unless ``need_argmax``."""
    op = "roi_pool"
    res = core.roi_pool(_array(input, "input", op), _array(rois, "rois", op),
                        (pooled_height, pooled_width), spatial_scale,
                        convention=CONVENTION, names=NAMES, return_argmax=need_argmax,
                        n_threads=_threads(n_threads))
    y, argmax = res if need_argmax else (res, np.empty(0, np.int32))
    return _tensor(y, input), torch.from_numpy(argmax)


def _roi_pool_backward_kernel(grad: Tensor, argmax: Tensor, rois: Tensor, batch_size: int,
                              channels: int, height: int, width: int, n_threads: Optional[int]
                              ) -> Tensor:
    op = "roi_pool_backward"
    dx = core.roi_pool_backward(_array(grad, "grad", op), _array(rois, "rois", op),
                                (batch_size, channels, height, width),
                                convention=CONVENTION, names=NAMES, argmax=argmax.numpy(),
                                n_threads=_threads(n_threads))
    return _tensor(dx, grad)


def _roi_align_kernel(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                      pooled_width: int, sampling_ratio: int, aligned: bool,
                      n_threads: Optional[int]) -> Tensor:
    op = "roi_align"
    y = core.roi_align(_array(input, "input", op), _array(rois, "rois", op),
                       (pooled_height, pooled_width), spatial_scale, sampling_ratio, aligned,
                       convention=CONVENTION, names=NAMES, n_threads=_threads(n_threads))
    return _tensor(y, input)


def _roi_align_backward_kernel(grad: Tensor, rois: Tensor, spatial_scale: float,
                               batch_size: int, channels: int, height: int, width: int,
                               sampling_ratio: int, aligned: bool, n_threads: Optional[int]
                               ) -> Tensor:
    op = "roi_align_backward"
    dx = core.roi_align_backward(_array(grad, "grad", op), _array(rois, "rois", op),
                                 (batch_size, channels, height, width), spatial_scale,
                                 sampling_ratio, aligned, convention=CONVENTION, names=NAMES,
                                 n_threads=_threads(n_threads))
    return _tensor(dx, grad)


def _ps_roi_pool_kernel(input: Tensor, rois: Tensor, spatial_scale: float, pooled_height: int,
                        pooled_width: int, n_threads: Optional[int]) -> Tensor:
    op = "ps_roi_pool"
    y = core.psroi_pool(_array(input, "input", op), _array(rois, "rois", op),
                        (pooled_height, pooled_width), spatial_scale,
                        convention=CONVENTION, names=NAMES, n_threads=_threads(n_threads))
    return _tensor(y, input)


def _ps_roi_pool_backward_kernel(grad: Tensor, rois: Tensor, spatial_scale: float,
                                 batch_size: int, channels: int, height: int, width: int,
                                 n_threads: Optional[int]) -> Tensor:
    op = "ps_roi_pool_backward"
    dx = core.psroi_pool_backward(_array(grad, "grad", op), _array(rois, "rois", op),
                                  (batch_size, channels, height, width), spatial_scale,
                                  convention=CONVENTION, names=NAMES, n_threads=_threads(n_threads))
    return _tensor(dx, grad)


def _ps_roi_align_kernel(input: Tensor, rois: Tensor, spatial_scale: float,
                         pooled_height: int, pooled_width: int, sampling_ratio: int,
                         n_threads: Optional[int]) -> Tensor:
    op = "ps_roi_align"
    y = core.ps_roi_align(_array(input, "input", op), _array(rois, "rois", op),
                          (pooled_height, pooled_width), spatial_scale, sampling_ratio,
                          convention=CONVENTION, names=NAMES, n_threads=_threads(n_threads))
    return _tensor(y, input)


def _ps_roi_align_backward_kernel(grad: Tensor, rois: Tensor, spatial_scale: float,
                                  batch_size: int, channels: int, height: int, width: int,
                                  sampling_ratio: int, n_threads: Optional[int]) -> Tensor:
    op = "ps_roi_align_backward"
    dx = core.ps_roi_align_backward(_array(grad, "grad", op), _array(rois, "rois", op),
                                    (batch_size, channels, height, width), spatial_scale,
                                    sampling_ratio, convention=CONVENTION, names=NAMES,
                                    n_threads=_threads(n_threads))
    return _tensor(dx, grad)


_KERNELS = {"roi_pool": _roi_pool_kernel, "roi_pool_backward": _roi_pool_backward_kernel,
            "roi_align": _roi_align_kernel, "roi_align_backward": _roi_align_backward_kernel,
            "ps_roi_pool": _ps_roi_pool_kernel,
            "ps_roi_pool_backward": _ps_roi_pool_backward_kernel,
            "ps_roi_align": _ps_roi_align_kernel,
            "ps_roi_align_backward": _ps_roi_align_backward_kernel}


def _python_operators(namespace: str = "roicore") -> types.SimpleNamespace:
    """Define roicore's operators as Python custom ops (torch.library.custom_op) named
    ``<namespace>::<op>``, with their fake implementations and autograd formulas (the
    formulas of the C++ library's).  Returns their CustomOpDefs by op name, and roi_pool's
    autograd functions (``roi_pool_context``, ``roi_pool_gradient``).  The adapter defines
    them as ``roicore`` when the op library cannot be had; another namespace puts them
    beside the library's, to compare the two in one process."""
    ops = types.SimpleNamespace()
    for name in _OP_NAMES:
        op = torch.library.custom_op(f"{namespace}::{name}", _KERNELS[name], mutates_args=(),
                                     device_types="cpu")
        op.register_fake(_FAKES[name])
        setattr(ops, name, op)

    def roi_pool_context(ctx, inputs, output):
        input, rois, spatial_scale, pooled_height, pooled_width, need_argmax, n_threads = inputs
        # a caller of the op that asked for no argmax and then for a gradient gets the argmax
        # recomputed from the input (the functions above never do this)
        ctx.save_for_backward(rois, output[1], None if need_argmax else input)
        ctx.mark_non_differentiable(output[1])
        # else autograd hands the backward a zero "gradient" of the argmax, as large as it is
        ctx.set_materialize_grads(False)
        ctx.need_argmax = need_argmax
        ctx.args = (spatial_scale, pooled_height, pooled_width)
        ctx.input_shape, ctx.n_threads = input.shape, n_threads

    def roi_pool_gradient(ctx, grad, _grad_argmax):
        if grad is None:  # the output itself received no gradient
            return None, None, None, None, None, None, None
        rois, argmax, input = ctx.saved_tensors
        if not ctx.need_argmax:
            argmax = ops.roi_pool(input, rois, *ctx.args, True, ctx.n_threads)[1]
        dx = ops.roi_pool_backward(grad, argmax, rois, *ctx.input_shape, ctx.n_threads)
        return dx, None, None, None, None, None, None

    def roi_align_context(ctx, inputs, output):
        input, rois, spatial_scale, _, _, sampling_ratio, aligned, n_threads = inputs
        ctx.save_for_backward(rois)
        ctx.args = (spatial_scale, *input.shape, sampling_ratio, aligned, n_threads)

    def roi_align_gradient(ctx, grad):
        rois, = ctx.saved_tensors
        return (ops.roi_align_backward(grad, rois, *ctx.args),) + (None,) * 7

    def ps_roi_pool_context(ctx, inputs, output):
        input, rois, spatial_scale, _, _, n_threads = inputs
        ctx.save_for_backward(rois)
        ctx.args = (spatial_scale, *input.shape, n_threads)

    def ps_roi_pool_gradient(ctx, grad):
        rois, = ctx.saved_tensors
        return (ops.ps_roi_pool_backward(grad, rois, *ctx.args),) + (None,) * 5

    def ps_roi_align_context(ctx, inputs, output):
        input, rois, spatial_scale, _, _, sampling_ratio, n_threads = inputs
        ctx.save_for_backward(rois)
        ctx.args = (spatial_scale, *input.shape, sampling_ratio, n_threads)

    def ps_roi_align_gradient(ctx, grad):
        rois, = ctx.saved_tensors
        return (ops.ps_roi_align_backward(grad, rois, *ctx.args),) + (None,) * 6

    ops.roi_pool.register_autograd(roi_pool_gradient, setup_context=roi_pool_context)
    ops.roi_align.register_autograd(roi_align_gradient, setup_context=roi_align_context)
    ops.ps_roi_pool.register_autograd(ps_roi_pool_gradient, setup_context=ps_roi_pool_context)
    ops.ps_roi_align.register_autograd(ps_roi_align_gradient, setup_context=ps_roi_align_context)
    ops.roi_pool_context, ops.roi_pool_gradient = roi_pool_context, roi_pool_gradient
    return ops


def _native_operators():
    """Load roicore's C++ op library (built first if the cache has none) and register the
    fake implementations of its ops; returns the library's path, or None when
    ``ROICORE_TORCH_NATIVE=0`` turns it off or it cannot be had (why is kept for the
    NativeOpsWarning of the first call: a failure must not fail the import)."""
    global _native_unavailable
    if switched_off("ROICORE_TORCH_NATIVE"):
        return None
    try:
        from .native import torch as native_torch
        path = native_torch.load()
    except Exception as exc:  # no compiler, a failed build or load: the first call says why
        _native_unavailable = f"{type(exc).__name__}: {exc}"
        return None
    for name in _OP_NAMES:
        # registered from this module, which the library names as its ops' Python module
        # (m.set_python_module): torch checks that, and a process that loaded the library
        # alone is told to import this module when torch.compile or torch.export needs them
        torch.library.register_fake(f"roicore::{name}", _FAKES[name])
    return path


_native_unavailable = None  # why the op library could not be had, until the first call
_NATIVE_LIBRARY = _native_operators()
# the Python custom ops, when they are the operators (else None)
_PYTHON_OPS = None if _NATIVE_LIBRARY is not None else _python_operators("roicore")
_roi_pool, _roi_align, _ps_roi_pool, _ps_roi_align = (
    getattr(torch.ops.roicore, name).default for name in
    ("roi_pool", "roi_align", "ps_roi_pool", "ps_roi_align"))


def native_library():
    """The path of roicore's C++ op library, which this module loaded (compiled first if
    the cache had none) and whose ops ``torch.ops.roicore.*`` are; None when they are the
    Python custom ops instead (``ROICORE_TORCH_NATIVE=0``, or no library could be built or
    loaded: a :class:`NativeOpsWarning` at the first call says why).  A TorchScript module
    or an AOTInductor package holding the ops runs wherever this file is loaded
    (``torch.ops.load_library``)."""
    return _NATIVE_LIBRARY


def _warn_if_fallback():
    """The NativeOpsWarning of the Python operators, once, at the first call."""
    global _native_unavailable
    if _native_unavailable is not None:
        why, _native_unavailable = _native_unavailable, None
        warnings.warn(
            "roicore.adapters.torch runs its operators as Python custom ops over roicore.core: "
            f"its C++ op library is not available ({why}). Eager mode, torch.compile and "
            "torch.export work, with the same numbers; TorchScript and AOTInductor "
            "deployments need the library.", NativeOpsWarning, stacklevel=4)


# --------------------------------------------------------------------------- autocast, quantized

def _autocasting(input) -> bool:
    return (isinstance(input, Tensor) and input.device.type in ("cpu", "cuda")
            and torch.is_autocast_enabled(input.device.type))


def _autocast_float(t):
    """float32 for what autocast casts (half, bfloat16 and float32 tensors), else ``t``."""
    if isinstance(t, Tensor) and t.dtype in (torch.float16, torch.bfloat16, torch.float32):
        return t.float()
    return t


def _autocast_boxes(boxes):
    if isinstance(boxes, (list, tuple)):
        return [_autocast_float(b) for b in boxes]
    return _autocast_float(boxes)


def _quantized_roi_align(input, boxes, output_size, spatial_scale, sampling_ratio, aligned,
                         n_threads):
    """roi_align of a quantized map in torchvision's qroi_align arithmetic: one image only
    (a quantized batch column cannot hold every index, so it is ignored), the boxes
    dequantized; per bin the sum of the samples of the raw integers S and of their weights
    Wsum, then ``scale * (S - zero_point * Wsum) / count`` quantized with the map's scale
    and zero point.  No gradient: quantized tensors have none."""
    op = "roi_align"
    quantized = (all(isinstance(b, Tensor) and b.is_quantized for b in boxes)
                 if isinstance(boxes, (list, tuple)) else
                 isinstance(boxes, Tensor) and boxes.is_quantized)
    if not quantized:
        raise ValueError("If input is quantized, rois must also be quantized.")
    if input.dim() != 4:
        raise ValueError(f"{op}: input must be a 4-D Tensor[N, C, H, W], got shape "
                         f"{tuple(input.shape)}")
    rois = boxes
    if isinstance(rois, (list, tuple)):
        # _rois reads only input's shape and dtype: a meta stand-in, not a dequantized copy
        rois = _rois([b.dequantize() for b in rois],
                     torch.empty(tuple(input.shape), device="meta"), op)
    else:
        if rois.dim() != 2 or rois.shape[1] != 5:
            raise BoxesShapeError(f"{op}: rois must have shape as Tensor[K, 5], got "
                                  f"{tuple(rois.shape)}")
        rois = rois.dequantize()
    if input.shape[0] != 1:
        raise RuntimeError("Only one image per batch is allowed in roi_align when quantized "
                           "tensors are passed.")
    if input.qscheme() != torch.per_tensor_affine:
        raise RuntimeError(f"{op}: quantized input must be quantized per tensor, got "
                           f"{input.qscheme()}")
    rois[:, 0] = 0
    r, integers = rois.numpy(), input.int_repr()
    ones = np.ones((1, 1) + tuple(input.shape[2:]), np.float32)
    args = (_output_size(output_size, op), _scale(spatial_scale, op), sampling_ratio, aligned)
    kw = dict(names=NAMES, n_threads=_threads(n_threads))
    total = core.roi_align(integers.numpy().astype(np.float32), r, *args,
                           convention=_SUMMED, **kw)
    weights = core.roi_align(ones, r, *args, convention=_SUMMED, **kw)
    # each bin's sample count, the sum of its weights over their mean (1 where no sample
    # weighs anything: the sums are 0 there, whatever the count)
    mean = core.roi_align(ones, r, *args, convention=CONVENTION, **kw)
    with np.errstate(divide="ignore", invalid="ignore"):
        count = np.where(weights > 0, np.rint(weights.astype(np.float64) / mean), 1)
    scale, zero_point = np.float32(input.q_scale()), input.q_zero_point()
    y = scale * (total - np.float32(zero_point) * weights) / count.astype(np.float32)
    info = np.iinfo(integers.numpy().dtype)
    q = np.clip(np.rint(y * (np.float32(1) / scale)).astype(np.int64) + zero_point,
                info.min, info.max)
    return torch._make_per_tensor_quantized_tensor(
        torch.from_numpy(q.astype(info.dtype)), input.q_scale(), zero_point)


# --------------------------------------------------------------------------- arguments

class BoxesShapeError(ValueError, AssertionError):
    """Boxes of the wrong shape: a ValueError, as roicore reports bad input, and an
    AssertionError, which torchvision raises for them (``check_roi_boxes_shape``)."""

def _check_input(input, op: str):
    if not isinstance(input, Tensor):
        raise TypeError(f"{op}: input must be a torch.Tensor, got {type(input).__name__}")
    if input.dim() != 4:
        raise ValueError(f"{op}: input must be a 4-D Tensor[N, C, H, W], got shape "
                         f"{tuple(input.shape)}")
    if input.dtype not in _ACCEPTED:
        raise TypeError(f"{op}: input must be float32, float64, float16 or bfloat16, got "
                        f"{input.dtype}")


def _rois(boxes, input: Tensor, op: str) -> Tensor:
    """Boxes as torchvision's Tensor[K, 5] rois.  A list of Tensor[L, 4] gets the batch
    column of its position as torchvision builds it, but in float32 for float16 and
    bfloat16 boxes (computed in float32 anyway), where torchvision's column would round
    the index of image 257 (bfloat16) or 2049 (float16) and on."""
    if isinstance(boxes, (list, tuple)):
        for i, b in enumerate(boxes):
            if not isinstance(b, Tensor) or b.dim() != 2 or b.shape[1] != 4:
                what = tuple(b.shape) if isinstance(b, Tensor) else type(b).__name__
                raise BoxesShapeError(f"{op}: boxes[{i}] must be a Tensor[L, 4] of [x1, y1, x2, "
                                      f"y2] rows for image {i}, got {what}")
        if not boxes:
            raise ValueError(f"{op}: boxes is an empty list; pass one Tensor[L, 4] per image")
        if isinstance(input, Tensor) and len(boxes) > input.shape[0]:
            raise ValueError(f"{op}: boxes is a list of {len(boxes)} Tensor[L, 4], one per image, "
                             f"but input holds {input.shape[0]} image(s)")
        for i, b in enumerate(boxes):
            if b.dtype != input.dtype:
                raise TypeError(f"{op}: boxes[{i}] must have input's dtype {input.dtype}, got "
                                f"{b.dtype}")
        # the batch column in the dtype the core computes in: float16 holds integers only
        # up to 2048 and bfloat16 up to 256, so image 257's boxes would pool image 256
        dtype = input.dtype if input.dtype in _COMPUTED else torch.float32
        ids = [torch.full((b.shape[0], 1), i, dtype=dtype, device=b.device)
               for i, b in enumerate(boxes)]
        return torch.cat([torch.cat(ids), torch.cat([b.to(dtype) for b in boxes])], dim=1)
    elif isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.shape[1] != 5:
            raise BoxesShapeError(f"{op}: boxes must be a Tensor[K, 5] of [batch_index, x1, y1, "
                                  f"x2, y2] rows or a list of Tensor[L, 4], got shape "
                                  f"{tuple(boxes.shape)}")
        rois = boxes
    else:
        raise TypeError(f"{op}: boxes must be a Tensor[K, 5] or a list of Tensor[L, 4], got "
                        f"{type(boxes).__name__}")
    if rois.dtype != input.dtype:
        raise TypeError(f"{op}: boxes must have input's dtype {input.dtype}, got {rois.dtype}")
    return rois


def _output_size(output_size, op: str) -> Tuple[int, int]:
    try:
        return core.args.pair(output_size, "output_size")
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{op}: {exc}") from None


def _scale(spatial_scale, op: str) -> float:
    if isinstance(spatial_scale, bool) or not isinstance(spatial_scale, numbers.Real):
        raise TypeError(f"{op}: spatial_scale must be a real number, got "
                        f"{type(spatial_scale).__name__}")
    return float(spatial_scale)


def _host(t: Tensor, name: str, op: str) -> Tensor:
    """``t`` on the CPU; a tensor elsewhere follows the device policy."""
    if t.device.type == "cpu":
        return t
    off_host("torch", f"{op}: {name}", str(t.device))
    return t.cpu()


def _on(y: Tensor, device) -> Tensor:
    return y if y.device == device else y.to(device)


def _prepare(input, boxes, output_size, spatial_scale, op):
    """Checked (input on the host, rois on the host, pooled size, spatial_scale).  Meta
    tensors carry shapes, not values: a meta ``input`` takes the op's fake (shape-only)
    implementation, as torchvision's meta kernels do."""
    _warn_if_fallback()
    _check_input(input, op)
    rois = _rois(boxes, input, op)
    size, scale = _output_size(output_size, op), _scale(spatial_scale, op)
    if input.device.type == "meta":
        return input, rois.to("meta"), size, scale
    if rois.device.type == "meta":
        raise ValueError(f"{op}: boxes is on the meta device, which holds no values, but input "
                         f"is on {input.device}; put both on one device")
    return _host(input, "input", op), _host(rois, "boxes", op), size, scale


# --------------------------------------------------------------------------- TorchScript
#
# torch.jit.script cannot compile the functions above: n_threads is a keyword-only argument
# with a default, which TorchScript refuses, and their checks are Python.  Each function's
# __prepare_scriptable__ (the hook torch.jit.script and recursive scripting consult) hands
# TorchScript a twin below instead, with the same arguments (n_threads positional too, so a
# call that passes it by keyword compiles) and the same numbers: plain typed code around
# torch.ops.roicore.*, as torchvision's functions are around torch.ops.torchvision.*.
# The ops check every value themselves (a bad one raises their error); quantized input is
# the Python functions' alone, and tensors off the CPU are copied to it and back (the
# device policy is Python state, which a scripted program does not carry).

def _script_inputs(input: Tensor, boxes: Union[Tensor, List[Tensor]], op: str
                   ) -> Tuple[Tensor, Tensor]:
    """(input, rois) on the host, rois as torchvision's Tensor[K, 5] (see _rois)."""
    if input.is_quantized:
        raise RuntimeError(op + ": quantized input is computed in Python only: call "
                                "roicore.adapters.torch's functions outside TorchScript")
    if isinstance(boxes, Tensor):
        if boxes.dim() != 2 or boxes.size(1) != 5:
            raise ValueError(op + ": boxes must be a Tensor[K, 5] of [batch_index, x1, y1, x2, "
                                  "y2] rows or a list of Tensor[L, 4], got shape "
                             + str(boxes.shape))
        if boxes.dtype != input.dtype:
            raise TypeError(op + ": boxes must have input's dtype " + str(input.dtype)
                            + ", got " + str(boxes.dtype))
        rois = boxes
    else:
        if len(boxes) == 0:
            raise ValueError(op + ": boxes is an empty list; pass one Tensor[L, 4] per image")
        dtype = input.dtype
        if dtype != torch.float32 and dtype != torch.float64:
            dtype = torch.float32
        ids: List[Tensor] = []
        coords: List[Tensor] = []
        for i, b in enumerate(boxes):
            if b.dim() != 2 or b.size(1) != 4:
                raise ValueError(op + ": boxes[" + str(i) + "] must be a Tensor[L, 4] of [x1, "
                                      "y1, x2, y2] rows for image " + str(i) + ", got "
                                 + str(b.shape))
            if b.dtype != input.dtype:
                raise TypeError(op + ": boxes[" + str(i) + "] must have input's dtype "
                                + str(input.dtype) + ", got " + str(b.dtype))
            ids.append(torch.full([b.size(0), 1], i, dtype=dtype, device=b.device))
            coords.append(b.to(dtype))
        rois = torch.cat([torch.cat(ids), torch.cat(coords)], dim=1)
    if input.device.type != "cpu" and input.device.type != "meta":
        input = input.cpu()
    if rois.device.type != "cpu" and rois.device.type != "meta":
        rois = rois.cpu()
    return input, rois


def _script_scale(spatial_scale: Union[float, int]) -> float:
    """spatial_scale as a float (a module built with an int scale holds an int)."""
    return float(spatial_scale)


def _scripted_roi_pool(input: Tensor, boxes: Union[Tensor, List[Tensor]],
                       output_size: BroadcastingList2[int],
                       spatial_scale: Union[float, int] = 1.0,
                       n_threads: Optional[int] = None) -> Tensor:
    """roi_pool as TorchScript compiles it."""
    x, rois = _script_inputs(input, boxes, "roi_pool")
    need_argmax = torch.is_grad_enabled() and input.requires_grad
    y, _ = torch.ops.roicore.roi_pool(x, rois, _script_scale(spatial_scale), output_size[0],
                                      output_size[1], need_argmax, n_threads)
    return y.to(input.device)


def _scripted_roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]],
                        output_size: BroadcastingList2[int],
                        spatial_scale: Union[float, int] = 1.0, sampling_ratio: int = -1,
                        aligned: bool = False, n_threads: Optional[int] = None) -> Tensor:
    """roi_align as TorchScript compiles it."""
    x, rois = _script_inputs(input, boxes, "roi_align")
    y = torch.ops.roicore.roi_align(x, rois, _script_scale(spatial_scale), output_size[0],
                                    output_size[1], sampling_ratio, aligned, n_threads)
    return y.to(input.device)


def _scripted_ps_roi_pool(input: Tensor, boxes: Union[Tensor, List[Tensor]],
                          output_size: BroadcastingList2[int],
                          spatial_scale: Union[float, int] = 1.0,
                          n_threads: Optional[int] = None) -> Tensor:
    """ps_roi_pool as TorchScript compiles it."""
    x, rois = _script_inputs(input, boxes, "ps_roi_pool")
    y = torch.ops.roicore.ps_roi_pool(x, rois, _script_scale(spatial_scale), output_size[0],
                                      output_size[1], n_threads)
    return y.to(input.device)


def _scripted_ps_roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]],
                           output_size: BroadcastingList2[int],
                           spatial_scale: Union[float, int] = 1.0, sampling_ratio: int = -1,
                           n_threads: Optional[int] = None) -> Tensor:
    """ps_roi_align as TorchScript compiles it."""
    x, rois = _script_inputs(input, boxes, "ps_roi_align")
    y = torch.ops.roicore.ps_roi_align(x, rois, _script_scale(spatial_scale), output_size[0],
                                       output_size[1], sampling_ratio, n_threads)
    return y.to(input.device)


def _scripted_as(twin):
    """Have torch.jit.script compile ``twin`` wherever it meets the decorated function."""
    def decorate(fn):
        fn.__prepare_scriptable__ = lambda: twin
        return fn
    return decorate


# --------------------------------------------------------------------------- functions

@torch.fx.wrap
@_scripted_as(_scripted_roi_pool)
def roi_pool(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size,
             spatial_scale: float = 1.0, *, n_threads: Optional[int] = None) -> Tensor:
    """RoI max pooling (Fast R-CNN), as ``torchvision.ops.roi_pool``.

    Args:
        input (Tensor[N, C, H, W]): the feature maps.
        boxes (Tensor[K, 5] or List[Tensor[L, 4]]): ``[batch_index, x1, y1, x2, y2]`` rows,
            or one ``[x1, y1, x2, y2]`` tensor per image; in input's dtype.
        output_size (int or Tuple[int, int]): pooled (height, width).
        spatial_scale (float): feature size over image size, e.g. 0.5 for a 112x112 map of
            a 224x224 image.
        n_threads (int, optional): OpenMP threads; None follows ``torch.get_num_threads()``.

    Returns:
        Tensor[K, C, output_size[0], output_size[1]]
    """
    op = "roi_pool"
    x, rois, (ph, pw), scale = _prepare(input, boxes, output_size, spatial_scale, op)
    need_argmax = torch.is_grad_enabled() and input.requires_grad
    if _onnx.exporting():
        return _onnx.roi_pool(x, rois, scale, ph, pw)
    y, _ = _roi_pool(x, rois, scale, ph, pw, need_argmax, n_threads)
    return _on(y, input.device)


@torch.fx.wrap
@_scripted_as(_scripted_roi_align)
def roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size,
              spatial_scale: float = 1.0, sampling_ratio: int = -1, aligned: bool = False, *,
              n_threads: Optional[int] = None) -> Tensor:
    """RoIAlign (Mask R-CNN), as ``torchvision.ops.roi_align``.

    Args:
        input, boxes, output_size, spatial_scale, n_threads: as :func:`roi_pool`.
        sampling_ratio (int): samples per bin and axis; <= 0 for ``ceil(bin size)``.
        aligned (bool): shift boxes by -0.5 pixel (Detectron2's pixel model).

    Returns:
        Tensor[K, C, output_size[0], output_size[1]]
    """
    op = "roi_align"
    if isinstance(input, Tensor) and input.is_quantized:
        return _quantized_roi_align(input, boxes, output_size, spatial_scale, sampling_ratio,
                                    aligned, n_threads)
    if _autocasting(input):
        # torchvision's autocast rule for roi_align: both in float32, the result in input's
        # dtype (float64 stays float64)
        with torch.autocast(input.device.type, enabled=False):
            return roi_align(_autocast_float(input), _autocast_boxes(boxes), output_size,
                             spatial_scale, sampling_ratio, aligned,
                             n_threads=n_threads).to(input.dtype)
    x, rois, (ph, pw), scale = _prepare(input, boxes, output_size, spatial_scale, op)
    if _onnx.exporting():
        return _onnx.roi_align(x, rois, scale, ph, pw, sampling_ratio, aligned)
    y = _roi_align(x, rois, scale, ph, pw, sampling_ratio, aligned, n_threads)
    return _on(y, input.device)


@torch.fx.wrap
@_scripted_as(_scripted_ps_roi_pool)
def ps_roi_pool(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size,
                spatial_scale: float = 1.0, *, n_threads: Optional[int] = None) -> Tensor:
    """Position-sensitive RoI average pooling (R-FCN), as ``torchvision.ops.ps_roi_pool``.

    input has ``D * output_size[0] * output_size[1]`` channels; output channel d at cell
    (i, j) averages input channel ``(d * output_size[0] + i) * output_size[1] + j``.  As in
    torchvision, the backward pass uses bins of its own (they reach the last row and column
    of the map, which the forward never reads).  Other arguments as :func:`roi_pool`.

    Returns:
        Tensor[K, D, output_size[0], output_size[1]]
    """
    op = "ps_roi_pool"
    x, rois, (ph, pw), scale = _prepare(input, boxes, output_size, spatial_scale, op)
    if _onnx.exporting():
        return _onnx.ps_roi_pool(x, rois, scale, ph, pw)
    y = _ps_roi_pool(x, rois, scale, ph, pw, n_threads)
    return _on(y, input.device)


@torch.fx.wrap
@_scripted_as(_scripted_ps_roi_align)
def ps_roi_align(input: Tensor, boxes: Union[Tensor, List[Tensor]], output_size,
                 spatial_scale: float = 1.0, sampling_ratio: int = -1, *,
                 n_threads: Optional[int] = None) -> Tensor:
    """Position-sensitive RoIAlign (Light-Head R-CNN), as ``torchvision.ops.ps_roi_align``.

    Channels map as in :func:`ps_roi_pool`; samples as in :func:`roi_align` with
    ``aligned=True``.  As in torchvision, a zero-size box with adaptive sampling gives NaN.
    Other arguments as :func:`roi_align`.

    Returns:
        Tensor[K, D, output_size[0], output_size[1]]
    """
    op = "ps_roi_align"
    x, rois, (ph, pw), scale = _prepare(input, boxes, output_size, spatial_scale, op)
    if _onnx.exporting():
        return _onnx.ps_roi_align(x, rois, scale, ph, pw, sampling_ratio)
    y = _ps_roi_align(x, rois, scale, ph, pw, sampling_ratio, n_threads)
    return _on(y, input.device)


# --------------------------------------------------------------------------- modules

class _PoolModule(nn.Module):
    """RoIPool and PSRoIPool: the module keeps the function's arguments.  Each forward
    calls its function by its module-level name, which torch.fx.wrap patches while fx
    traces (a reference kept on the class would bypass the patch)."""

    def __init__(self, output_size, spatial_scale: float, *, n_threads: Optional[int] = None):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.n_threads = n_threads

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"spatial_scale={self.spatial_scale})")


class RoIPool(_PoolModule):
    """See :func:`roi_pool`."""

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_pool(input, rois, self.output_size, self.spatial_scale,
                        n_threads=self.n_threads)


class PSRoIPool(_PoolModule):
    """See :func:`ps_roi_pool`."""

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return ps_roi_pool(input, rois, self.output_size, self.spatial_scale,
                           n_threads=self.n_threads)


class RoIAlign(nn.Module):
    """See :func:`roi_align`."""

    def __init__(self, output_size, spatial_scale: float, sampling_ratio: int,
                 aligned: bool = False, *, n_threads: Optional[int] = None):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned
        self.n_threads = n_threads

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                         self.aligned, n_threads=self.n_threads)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"spatial_scale={self.spatial_scale}, sampling_ratio={self.sampling_ratio}, "
                f"aligned={self.aligned})")


class PSRoIAlign(nn.Module):
    """See :func:`ps_roi_align`."""

    def __init__(self, output_size, spatial_scale: float, sampling_ratio: int, *,
                 n_threads: Optional[int] = None):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self.sampling_ratio = sampling_ratio
        self.n_threads = n_threads

    def forward(self, input: Tensor, rois: Union[Tensor, List[Tensor]]) -> Tensor:
        return ps_roi_align(input, rois, self.output_size, self.spatial_scale,
                            self.sampling_ratio, n_threads=self.n_threads)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output_size={self.output_size}, "
                f"spatial_scale={self.spatial_scale}, sampling_ratio={self.sampling_ratio})")


# ONNX export: the TorchScript-based exporter translates the ops recorded above
_onnx.register()

# MultiScaleRoIAlign: its module imports the helpers above
from . import _torch_pyramid  # noqa: E402
from ._torch_pyramid import MultiScaleRoIAlign, multi_scale_roi_align  # noqa: E402

if _NATIVE_LIBRARY is not None:
    for _name, _fake in _torch_pyramid.FAKES.items():
        torch.library.register_fake(f"roicore::{_name}", _fake)
