"""PaddlePaddle front end: ``paddle.vision.ops`` signatures on top of roicore's kernels.

Functions ``roi_pool``, ``psroi_pool``, ``roi_align`` take the arguments of Paddle 3.x
``paddle.vision.ops`` (and its defaults: ``roi_align(aligned=True)``), plus a keyword-only
``n_threads`` (OpenMP threads, see :func:`roicore.core.effective_n_threads`).  The layers
``RoIPool``, ``PSRoIPool`` and ``RoIAlign`` are ``paddle.nn.Layer`` subclasses with the
signatures of Paddle's own.  Every op computes with ``convention="paddle"``, so outputs,
argmax and gradients are bit-identical to Paddle's CPU kernels.

Boxes are ``[x1, y1, x2, y2]`` rows grouped by image in image order; ``boxes_num[i]`` is the
number of consecutive boxes of image i.  Unlike Paddle, ``boxes_num`` is checked (one
count per image, non-negative, summing to the number of boxes), and int64 counts are
accepted by every op.  One deliberate difference: Paddle's ``psroi_pool`` refuses inputs
with ``C == PH * PW`` (one output channel, "The pooled output channels must greater than
1"); that is not a rule of the operator (MXNet's PSROIPooling allows it), so here it is
computed like any other channel count.

Two ways to compute, one set of numbers:

* **Paddle operators** (``roicore_roi_pool``, ``roicore_psroi_pool``, ``roicore_roi_align``
  and their gradients): roicore's C library registered with Paddle as custom operators
  when this module is imported, compiled first against the installed Paddle with a C++
  compiler if the per-user cache has none (:mod:`roicore.adapters.native.paddle`).  They
  work wherever Paddle ops do: dygraph, ``paddle.jit.to_static`` (both modes), static
  programs, ``paddle.jit.save`` / ``paddle.jit.load`` and ``paddle.inference`` predictors;
  a process that has imported this module loads a saved model holding them as it stands.
* **The NumPy path** (``roicore.core`` through ``paddle.autograd.PyLayer``, dygraph only):
  for outputs of ``LARGE_OUTPUT_BYTES`` (8 MiB) or more (their memory is reused from call
  to call, by glibc's heap and from 32 MiB by roicore.core's output cache, where Paddle's
  allocator maps fresh memory for every call), for
  tensors off the host, and when the operators cannot be built (the import still succeeds,
  and a ``RuntimeWarning`` at the first op call says why, once) or
  ``ROICORE_NATIVE_OPS=0`` turns them off.

Gradients flow to ``x``; ``boxes`` and ``boxes_num`` get none, as in Paddle.  When no
gradient can be asked for (``x.stop_gradient`` or under ``paddle.no_grad()``),
``roi_pool`` computes no argmax (its backward recomputes it if a gradient is asked for
all the same).  Wrong input raises ValueError or TypeError naming the argument, in every
mode: in a static program or a reloaded model the operators check their inputs when they
run and raise Paddle's ValueError with roicore's message.

Copies: none for dense CPU tensors in either path (the operators read Paddle's buffers,
the NumPy path views them through DLPack).

Tensors on a GPU or another device: roicore computes on the CPU.  In dygraph they are
copied to the host and the results copied back to the input's place, with a
``roicore.adapters.DeviceCopyWarning`` the first time for each device;
``roicore.adapters.set_device_policy("error")`` (or ``ROICORE_DEVICE_POLICY=error``)
refuses them with a ValueError that names the argument and its device.  A static program
placed on a GPU raises a ValueError from the operator ("compute on the CPU").
"""
from __future__ import annotations

import dataclasses
import functools
import re
import warnings

import numpy as np

from roicore import core
from roicore.core import args, conventions

from ._common import off_host, require, switched_off

paddle = require("paddle", "paddle")
from paddle.autograd import PyLayer  # noqa: E402
from paddle.utils import dlpack as _dlpack  # noqa: E402

try:  # Paddle 3: neither to_static mode (SOT bytecode, AST) rewrites these functions
    from paddle.jit.marker import unified as _graph_ready  # noqa: E402
except ImportError:  # Paddle 2.6: only the AST mode rewrites functions
    _graph_ready = paddle.jit.not_to_static

__all__ = ["roi_pool", "psroi_pool", "roi_align", "RoIPool", "PSRoIPool", "RoIAlign",
           "multilevel_roi_align", "MultiLevelRoIAlign", "load_library"]

CONVENTION = "paddle"
# The argmax the NumPy path keeps for roi_pool's backward pass: Paddle's encoding (h*W + w
# per plane) stored as int32, which the core widens to int64 when a plane has >= 2**31
# pixels.  The operators, and the legacy ``return_argmax=True``, use Paddle's int64.
_GRAD_ARGMAX_RULES = dataclasses.replace(conventions.MAX_POOL[CONVENTION], argmax_dtype="int32")
# the operators' rules attributes
_RULES = {"roi_pool": list(args.rules_codes(conventions.MAX_POOL[CONVENTION])),
          "psroi_pool": list(args.rules_codes(conventions.PSROI_POOL[CONVENTION])),
          "roi_align": list(args.rules_codes(conventions.ROI_ALIGN[CONVENTION]))}
# The dygraph routing policy (see "Two ways to compute"): outputs of this many bytes or more
# take the NumPy path, whose output memory is reused from call to call; the operators are
# faster below it, the NumPy path from it on (docs/performance.md, "Output memory").
LARGE_OUTPUT_BYTES = 8 << 20
# dtype objects, compared directly (the names, str(t.dtype), cost a string per check).
# Variables of the old IR (paddle.pir_utils.OldIrGuard) carry VarType members, which do not
# equal PIR's DataType members, so both are listed.
_DTYPE_KINDS = (paddle.base.core.DataType, paddle.base.core.VarDesc.VarType)
_FLOAT_DTYPES = (_DTYPE_KINDS[0].FLOAT32, _DTYPE_KINDS[0].FLOAT64,
                 _DTYPE_KINDS[1].FP32, _DTYPE_KINDS[1].FP64)
_COUNT_DTYPES = (_DTYPE_KINDS[0].INT32, _DTYPE_KINDS[0].INT64,
                 _DTYPE_KINDS[1].INT32, _DTYPE_KINDS[1].INT64)
_TENSOR_TYPES = (paddle.Tensor, paddle.pir.Value, paddle.static.Variable)


# --------------------------------------------------------------------------- operators

_native = None           # roicore.adapters.native.paddle, once its library is registered
_native_unavailable = None  # why the operators cannot be used, once that is known
_import_error = None     # why registering them at import failed, for the first op call


def load_library():
    """Build (once per machine) and register roicore's Paddle operators in this process.

    Importing this module registers them already, so that ``paddle.jit.load`` and
    ``paddle.inference.create_predictor`` can load a model saved with roicore's operators
    (Paddle must know an operator before it can load a program that holds it).  Call it
    for the library's path, or to have the error raised when the import could not
    register them.

    Returns:
        str: The path of the operator library (compiled for the installed Paddle).

    Raises:
        roicore.adapters.native.build.NativeBuildError: No C++ compiler was found, or it
            failed; the message says which and quotes the compiler's output.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import load_library
            >>> path = load_library()
            >>> path.endswith('.so')
            True
    """
    global _native
    from .native import paddle as native
    path = native.load()
    _native = native
    return str(path)


def _operators():
    """roicore.adapters.native.paddle with its operators registered, or None when they
    cannot be had (a RuntimeWarning says why, once)."""
    global _native_unavailable
    if _native is not None:
        return _native
    if _native_unavailable is None:
        if switched_off("ROICORE_NATIVE_OPS"):
            _native_unavailable = "ROICORE_NATIVE_OPS=0 turns them off"
            return None
        from .native.build import NativeBuildError
        try:
            if _import_error is not None:  # registering at import failed: no second build
                raise _import_error
            load_library()
            return _native
        except (NativeBuildError, OSError, RuntimeError, ImportError) as exc:
            _native_unavailable = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                "roicore.adapters.paddle computes through roicore.core in dygraph mode only "
                f"(no static programs, to_static or saved models), because roicore's Paddle "
                f"operators are unavailable: {_native_unavailable}", RuntimeWarning,
                stacklevel=3)
    return None


def _register_at_import():
    """Register the operators as this module is imported, so that Paddle knows them before
    the user loads a saved model holding them.  A failure must not fail the import: it is
    kept for the first op call, which warns and falls back as it would have had the build
    failed then."""
    global _import_error
    if switched_off("ROICORE_NATIVE_OPS"):
        return
    try:
        from .native import paddle as native
        native.load()
    except Exception as exc:  # no compiler, a failed build or load: _operators() says why
        _import_error = exc


_register_at_import()


def _run(op, inputs, attrs, outputs=("Out",)):
    x = inputs["X"]
    if paddle.in_dynamic_mode() and not x.stop_gradient and not paddle.is_grad_enabled():
        # Paddle records a custom operator's gradient even under paddle.no_grad()
        inputs = dict(inputs, X=x.detach())
    return _native.run(f"roicore_{op}", inputs, attrs, outputs)


# --------------------------------------------------------------------------- conversion

def _dtype_name(t):
    return str(t.dtype).replace("paddle.", "")


def _to_numpy(t):
    """A NumPy view of a Paddle tensor (no copy on the CPU; read-only)."""
    if not t.place.is_cpu_place():
        t = t.cpu()  # the core runs on the host (the device policy allowed the copy)
    return np.from_dlpack(t.detach())


def _needs_grad(x):
    """Whether Paddle could ask for a gradient of ``x`` through this op's output."""
    return paddle.is_grad_enabled() and not x.stop_gradient


def _to_paddle(a, place):
    """A Paddle tensor sharing ``a``'s memory (no copy on the CPU)."""
    # the capsule, not the array: given an array, Paddle first asks it for a versioned
    # capsule, which NumPy 1.x refuses with a TypeError that Paddle catches and retries
    t = _dlpack.from_dlpack(np.ascontiguousarray(a).__dlpack__())
    if not place.is_cpu_place():
        t = t.to(place)  # back to the input's device (the device policy allowed the copy)
    return t


# --------------------------------------------------------------------------- checks

def _check_tensor(t, name, op):
    if not isinstance(t, _TENSOR_TYPES):
        raise TypeError(f"{op}: {name} must be a paddle.Tensor, got {type(t).__name__}")


def _check_places(op, **tensors):
    """Apply the device policy to tensors that are not on the CPU: roicore computes on the
    host, so they are copied there and back, or refused (roicore.adapters.set_device_policy).
    Returns whether every tensor is on the CPU."""
    on_host = True
    for name, t in tensors.items():
        place = t.place
        if not place.is_cpu_place():
            device = str(place)
            if device.startswith("Place(") and device.endswith(")"):
                device = device[len("Place("):-1]  # "gpu:0"
            off_host("paddle", f"{name} of {op}", device)
            on_host = False
    return on_host


def _check_tensors(op, x, boxes, boxes_num, n):
    """Checks of what every mode knows before running: types, ranks, dtypes (``n``: the
    caller's names of x, boxes and boxes_num)."""
    _check_tensor(x, n("x"), op)
    _check_tensor(boxes, n("boxes"), op)
    x_shape, boxes_shape, dtype = x.shape, boxes.shape, x.dtype
    if len(x_shape) != 4:
        raise ValueError(f"{op}: {n('x')} must be a 4-D [N, C, H, W] tensor, got shape "
                         f"{list(x_shape)}")
    if dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{op}: {n('x')} must be float32 or float64, got {_dtype_name(x)}")
    if len(boxes_shape) != 2 or boxes_shape[1] not in (4, -1):
        raise ValueError(f"{op}: {n('boxes')} must be a 2-D [num_boxes, 4] tensor of [x1, y1, "
                         f"x2, y2] rows, got shape {list(boxes_shape)}")
    if boxes.dtype != dtype:
        raise TypeError(f"{op}: {n('boxes')} must have the dtype of {n('x')} "
                        f"({_dtype_name(x)}), got {_dtype_name(boxes)}")
    if boxes_num is None:
        raise ValueError(f"{op}: {n('boxes_num')} is required (the number of boxes of each "
                         "image)")
    _check_tensor(boxes_num, n("boxes_num"), op)
    if boxes_num.dtype not in _COUNT_DTYPES:
        raise TypeError(f"{op}: {n('boxes_num')} must be int32 or int64, got "
                        f"{_dtype_name(boxes_num)}")
    if len(boxes_num.shape) != 1:
        raise ValueError(f"{op}: {n('boxes_num')} must be 1-D (one count per image), got shape "
                         f"{list(boxes_num.shape)}")


def _native_route(op, x, boxes, boxes_num, out_per_box, n):
    """Check the tensors; True to compute with the operators, False for the NumPy path.
    ``out_per_box``: output elements per box."""
    _check_tensors(op, x, boxes, boxes_num, n)
    if paddle.in_dynamic_mode():
        on_host = _check_places(op, x=x, boxes=boxes, boxes_num=boxes_num)
        # Large outputs take the NumPy path, whose freed outputs are reused, where Paddle's
        # CPU allocator maps (and the kernel zero-fills) fresh pages each call.
        large = boxes.shape[0] * out_per_box * x.element_size() >= LARGE_OUTPUT_BYTES
        return on_host and not large and _operators() is not None
    if _operators() is None:
        raise RuntimeError(f"roicore.adapters.paddle.{op} in a static program or to_static "
                           f"needs roicore's Paddle operators, which are unavailable: "
                           f"{_native_unavailable}")
    return True


def _numpy_inputs(op, x, boxes, boxes_num, n):
    """The NumPy path's boxes and batch indices (boxes_num checked here)."""
    try:
        # a copy of the few counts (numpy()) costs less than a DLPack view of them
        batch = args.batch_from_counts(boxes_num.numpy(), boxes.shape[0], x.shape[0],
                                       n("boxes_num"))
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{op}: {exc}") from None
    return _to_numpy(boxes), batch


def _size(output_size, op):
    if isinstance(output_size, bool) or not isinstance(output_size, (int, np.integer, tuple, list)):
        raise TypeError(f"{op}: output_size must be an int or a (height, width) tuple, got "
                        f"{type(output_size).__name__}")
    return args.pair(output_size, "output_size")


def _attrs(op, output_size, spatial_scale, n_threads):
    """Checked (pooled_height, pooled_width), spatial_scale and n_threads attributes."""
    ph, pw = _size(output_size, op)
    scale = args.float32_scale(spatial_scale)
    if n_threads is None:  # the operators' 0: OMP_NUM_THREADS or every CPU
        return ph, pw, scale, 0
    core.effective_n_threads(n_threads)  # checks it
    return ph, pw, scale, int(n_threads)


# --------------------------------------------------------------------------- messages

_PADDLE_MESSAGE = re.compile(r"(\(\w+\) )?(\w+: )?(.*)", re.DOTALL)


def _in_callers_words(fn):
    """``fn`` (one of the shared functions below, with ``op`` and ``names``) with every
    error it raises, from its own checks, roicore.core's or the operators', starting with
    ``op: `` and naming the caller's arguments (the legacy API's ``input``, ``rois``...).
    Paddle's own prefix of an operator's error, such as ``(InvalidArgument)``, stays."""
    @functools.wraps(fn)
    def worded(*a, op=fn.__name__.lstrip("_"), names=None, **kw):
        try:
            return fn(*a, op=op, names=names, **kw)
        except (TypeError, ValueError) as exc:
            kind, prefix, rest = _PADDLE_MESSAGE.match(str(exc)).groups()
            if prefix not in (None, f"{op}: "):   # another op's message: not ours to word
                raise
            message = f"{kind or ''}{op}: {args.Names(names).reword(rest)}"
            if message == str(exc):
                raise
            raise type(exc)(message) from None
    return worded


# --------------------------------------------------------------------------- autograd

class _RoIPoolFn(PyLayer):
    @staticmethod
    def forward(ctx, x, boxes, batch, output_size, spatial_scale, n_threads, return_argmax):
        xa = _to_numpy(x)
        rules = CONVENTION if return_argmax else _GRAD_ARGMAX_RULES
        y, argmax = core.roi_pool(xa, boxes, output_size, spatial_scale, batch_indices=batch,
                                  convention=rules, return_argmax=True, n_threads=n_threads)
        ctx.saved = (boxes, batch, xa.shape, spatial_scale, argmax, n_threads, x.place)
        if not return_argmax:
            return _to_paddle(y, x.place)
        am = _to_paddle(argmax, x.place)
        ctx.mark_non_differentiable(am)
        # else Paddle builds a zero int64 "gradient" of argmax's size for every backward
        ctx.set_materialize_grads(False)
        return _to_paddle(y, x.place), am

    @staticmethod
    def backward(ctx, grad, _grad_argmax=None):
        boxes, batch, shape, spatial_scale, argmax, n_threads, place = ctx.saved
        dx = core.roi_pool_backward(_to_numpy(grad), boxes, shape, spatial_scale,
                                    batch_indices=batch, convention=CONVENTION, argmax=argmax,
                                    n_threads=n_threads)
        return _to_paddle(dx, place)


class _PSRoIPoolFn(PyLayer):
    @staticmethod
    def forward(ctx, x, boxes, batch, output_size, spatial_scale, output_channels, n_threads):
        xa = _to_numpy(x)
        y = core.psroi_pool(xa, boxes, output_size, spatial_scale,
                            output_channels=output_channels, batch_indices=batch,
                            convention=CONVENTION, n_threads=n_threads)
        ctx.saved = (boxes, batch, xa.shape, spatial_scale, n_threads, x.place)
        return _to_paddle(y, x.place)

    @staticmethod
    def backward(ctx, grad):
        boxes, batch, shape, spatial_scale, n_threads, place = ctx.saved
        dx = core.psroi_pool_backward(_to_numpy(grad), boxes, shape, spatial_scale,
                                      batch_indices=batch, convention=CONVENTION,
                                      n_threads=n_threads)
        return _to_paddle(dx, place)


class _RoIAlignFn(PyLayer):
    @staticmethod
    def forward(ctx, x, boxes, batch, output_size, spatial_scale, sampling_ratio, aligned,
                n_threads):
        xa = _to_numpy(x)
        y = core.roi_align(xa, boxes, output_size, spatial_scale, sampling_ratio, aligned,
                           batch_indices=batch, convention=CONVENTION, n_threads=n_threads)
        ctx.saved = (boxes, batch, xa.shape, spatial_scale, sampling_ratio, aligned, n_threads,
                     x.place)
        return _to_paddle(y, x.place)

    @staticmethod
    def backward(ctx, grad):
        boxes, batch, shape, spatial_scale, sampling_ratio, aligned, n_threads, place = ctx.saved
        dx = core.roi_align_backward(_to_numpy(grad), boxes, shape, spatial_scale,
                                     sampling_ratio, aligned, batch_indices=batch,
                                     convention=CONVENTION, n_threads=n_threads)
        return _to_paddle(dx, place)


# --------------------------------------------------------------------------- computations
# Shared with the legacy API: checked tensors and arguments in, either path out.

@_in_callers_words
def _roi_pool(x, boxes, boxes_num, output_size, spatial_scale=1.0, *, n_threads=None,
              op="roi_pool", return_argmax=False, names=None):
    """out, or (out, argmax) with ``return_argmax``: argmax is int64 ``h*W + w`` per plane, -1
    for empty bins, as Paddle's ``Argmax`` output (used by the legacy fluid API).  ``names``:
    the caller's names of x, boxes and boxes_num (the legacy API's: input, rois, rois_num)."""
    n = args.Names(names)
    ph, pw, scale, threads = _attrs(op, output_size, spatial_scale, n_threads)
    if _native_route(op, x, boxes, boxes_num, x.shape[1] * ph * pw, n):
        with_argmax = return_argmax or _needs_grad(x)
        out, argmax = _run("roi_pool", {"X": x, "Boxes": boxes, "BoxesNum": boxes_num},
                           {"rules": _RULES["roi_pool"], "pooled_height": ph,
                            "pooled_width": pw, "spatial_scale": scale,
                            "with_argmax": with_argmax, "n_threads": threads},
                           ("Out", "Argmax"))
        return (out, argmax) if return_argmax else out
    b, batch = _numpy_inputs(op, x, boxes, boxes_num, n)
    if _needs_grad(x):
        return _RoIPoolFn.apply(x, b, batch, (ph, pw), scale, n_threads, return_argmax)
    res = core.roi_pool(_to_numpy(x), b, (ph, pw), scale, batch_indices=batch,
                        convention=CONVENTION, return_argmax=return_argmax, n_threads=n_threads)
    if return_argmax:
        return _to_paddle(res[0], x.place), _to_paddle(res[1], x.place)
    return _to_paddle(res, x.place)


@_in_callers_words
def _psroi_pool(x, boxes, boxes_num, output_size, spatial_scale=1.0, output_channels=None, *,
                n_threads=None, op="psroi_pool", names=None):
    """PS-RoI pooling; ``output_channels`` None takes C / (h * w)."""
    n = args.Names(names)
    ph, pw, scale, threads = _attrs(op, output_size, spatial_scale, n_threads)
    route = _native_route(op, x, boxes, boxes_num, x.shape[1], n)
    if x.shape[1] >= 0:  # known (always but in some static programs): checked in our names
        try:
            args.ps_channels((ph, pw), None, x.shape[1], output_channels, n("x"))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{op}: {exc}") from None
    if route:
        return _run("psroi_pool", {"X": x, "Boxes": boxes, "BoxesNum": boxes_num},
                    {"rules": _RULES["psroi_pool"], "pooled_height": ph, "pooled_width": pw,
                     "output_channels": -1 if output_channels is None else output_channels,
                     "spatial_scale": scale, "n_threads": threads})[0]
    b, batch = _numpy_inputs(op, x, boxes, boxes_num, n)
    if _needs_grad(x):
        return _PSRoIPoolFn.apply(x, b, batch, (ph, pw), scale, output_channels, n_threads)
    return _to_paddle(core.psroi_pool(_to_numpy(x), b, (ph, pw), scale,
                                      output_channels=output_channels, batch_indices=batch,
                                      convention=CONVENTION, n_threads=n_threads), x.place)


@_in_callers_words
def _roi_align(x, boxes, boxes_num, output_size, spatial_scale, sampling_ratio, aligned, *,
               n_threads=None, op="roi_align", names=None):
    n = args.Names(names)
    ph, pw, scale, threads = _attrs(op, output_size, spatial_scale, n_threads)
    sampling_ratio = args.sampling_ratio(sampling_ratio)
    aligned = args.flag(aligned, "aligned")
    if _native_route(op, x, boxes, boxes_num, x.shape[1] * ph * pw, n):
        return _run("roi_align", {"X": x, "Boxes": boxes, "BoxesNum": boxes_num},
                    {"rules": _RULES["roi_align"], "pooled_height": ph, "pooled_width": pw,
                     "spatial_scale": scale, "sampling_ratio": sampling_ratio,
                     "aligned": aligned, "n_threads": threads})[0]
    b, batch = _numpy_inputs(op, x, boxes, boxes_num, n)
    if _needs_grad(x):
        return _RoIAlignFn.apply(x, b, batch, (ph, pw), scale, sampling_ratio, aligned,
                                 n_threads)
    return _to_paddle(core.roi_align(_to_numpy(x), b, (ph, pw), scale, sampling_ratio, aligned,
                                     batch_indices=batch, convention=CONVENTION,
                                     n_threads=n_threads), x.place)


# --------------------------------------------------------------------------- functions

@_graph_ready
def roi_pool(x, boxes, boxes_num, output_size, spatial_scale=1.0, name=None, *, n_threads=None):
    """RoI max pooling (Fast R-CNN), a drop-in replacement for
    ``paddle.vision.ops.roi_pool``.

    Each box is scaled by ``spatial_scale`` and rounded to whole feature-map pixels,
    divided into output_size bins, and each bin takes the maximum of its pixels (0 for a
    bin that covers none).  Outputs and the gradient of ``x`` are bit-identical to Paddle's
    CPU kernel; ``boxes`` and ``boxes_num`` get no gradient, as in Paddle.

    Args:
        x (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W]: batch size, channels,
            height, width.  The data type is float32 or float64.
        boxes (Tensor): Boxes (RoIs, Regions of Interest) to pool over, a 2-D Tensor of
            shape [num_boxes, 4] and the data type of ``x``, given as [[x1, y1, x2, y2], ...]
            in input-image coordinates: (x1, y1) the top left corner, (x2, y2) the bottom
            right one.  The boxes of image 0 come first, then those of image 1, and so on.
        boxes_num (Tensor): The number of boxes of each image, a 1-D Tensor of shape [N],
            int32 or int64; the counts sum to num_boxes.
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates (the feature map's size over the input
            image's).  Default: 1.0.
        name (str|None, optional): Accepted for signature compatibility with Paddle and
            unused.  Default: None.
        n_threads (int|None, optional): Keyword-only.  The number of OpenMP threads the
            computation may use: None uses ``OMP_NUM_THREADS`` or every CPU, a negative n
            all CPUs but ``|n| - 1``.  Results never depend on it.  Default: None.

    Returns:
        Tensor: The pooled feature, a 4-D Tensor of shape [num_boxes, C, h, w] with the
        data type of ``x``.

    Differences from ``paddle.vision.ops.roi_pool``, all on input Paddle does not check:

    - ``boxes_num`` must have one count per image and sum to num_boxes (Paddle reads or
      writes out of bounds when the sum is wrong); negative counts are refused; int64
      counts are accepted.
    - Coordinates must be finite and, once scaled, within 2**24 pixels of the origin;
      otherwise a ValueError names ``boxes`` (Paddle converts them to integer pixel
      indices whatever they are).

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import roi_pool

            >>> x = paddle.arange(32, dtype='float32').reshape([1, 2, 4, 4])
            >>> boxes = paddle.to_tensor([[0.0, 0.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> pool_out = roi_pool(x, boxes, boxes_num, output_size=2)
            >>> print(list(pool_out.shape))
            [2, 2, 2, 2]
            >>> print(pool_out[0, 0].numpy())
            [[ 5.  7.]
             [13. 15.]]
    """
    return _roi_pool(x, boxes, boxes_num, output_size, spatial_scale, n_threads=n_threads)


@_graph_ready
def psroi_pool(x, boxes, boxes_num, output_size, spatial_scale=1.0, name=None, *,
               n_threads=None):
    """Position-sensitive RoI average pooling (R-FCN), a drop-in replacement for
    ``paddle.vision.ops.psroi_pool``.

    ``x`` holds ``D * h * w`` channels: output channel d of bin (i, j) averages input
    channel ``(d * h + i) * w + j`` over the bin (0 for a bin that covers no pixel).
    Outputs and the gradient of ``x`` are bit-identical to Paddle's CPU kernel; ``boxes``
    and ``boxes_num`` get no gradient, as in Paddle.

    Args:
        x (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W]: batch size, channels,
            height, width.  C must be a multiple of h * w; float32 or float64.
        boxes (Tensor): Boxes (RoIs, Regions of Interest) to pool over, a 2-D Tensor of
            shape [num_boxes, 4] and the data type of ``x``, given as [[x1, y1, x2, y2], ...]
            in input-image coordinates: (x1, y1) the top left corner, (x2, y2) the bottom
            right one.  The boxes of image 0 come first, then those of image 1, and so on.
        boxes_num (Tensor): The number of boxes of each image, a 1-D Tensor of shape [N],
            int32 or int64; the counts sum to num_boxes.
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates (the feature map's size over the input
            image's).  Default: 1.0.
        name (str|None, optional): Accepted for signature compatibility with Paddle and
            unused.  Default: None.
        n_threads (int|None, optional): Keyword-only.  The number of OpenMP threads the
            computation may use: None uses ``OMP_NUM_THREADS`` or every CPU, a negative n
            all CPUs but ``|n| - 1``.  Results never depend on it.  Default: None.

    Returns:
        Tensor: The pooled feature, a 4-D Tensor of shape [num_boxes, C / (h * w), h, w]
        with the data type of ``x``.

    Differences from ``paddle.vision.ops.psroi_pool``:

    - One output channel (``C == h * w``) is computed like any other count; Paddle
      refuses it ("The pooled output channels must greater than 1"), though the operator
      is well defined there.
    - int64 ``boxes_num`` is accepted.
    - Coordinates must be finite and, once scaled, within 2**24 pixels of the origin;
      otherwise a ValueError names ``boxes``.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import psroi_pool

            >>> x = paddle.arange(128, dtype='float32').reshape([1, 8, 4, 4])
            >>> boxes = paddle.to_tensor([[0.0, 0.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> pool_out = psroi_pool(x, boxes, boxes_num, output_size=2)
            >>> print(list(pool_out.shape))
            [2, 2, 2, 2]
            >>> print(pool_out[0, 0].numpy())
            [[ 2.5 20.5]
             [42.5 60.5]]
    """
    return _psroi_pool(x, boxes, boxes_num, output_size, spatial_scale, n_threads=n_threads)


@_graph_ready
def roi_align(x, boxes, boxes_num, output_size, spatial_scale=1.0, sampling_ratio=-1,
              aligned=True, name=None, *, n_threads=None):
    """RoIAlign (Mask R-CNN), a drop-in replacement for ``paddle.vision.ops.roi_align``.

    Each bin averages a regular grid of bilinearly interpolated samples of ``x``; box
    coordinates are not rounded.  Outputs and the gradient of ``x`` are bit-identical to
    Paddle's CPU kernels; ``boxes`` and ``boxes_num`` get no gradient, as in Paddle.

    Args:
        x (Tensor): Input feature, a 4-D Tensor of shape [N, C, H, W]: batch size, channels,
            height, width.  The data type is float32 or float64.
        boxes (Tensor): Boxes (RoIs, Regions of Interest) to pool over, a 2-D Tensor of
            shape [num_boxes, 4] and the data type of ``x``, given as [[x1, y1, x2, y2], ...]
            in input-image coordinates: (x1, y1) the top left corner, (x2, y2) the bottom
            right one.  The boxes of image 0 come first, then those of image 1, and so on.
        boxes_num (Tensor): The number of boxes of each image, a 1-D Tensor of shape [N],
            int32 or int64; the counts sum to num_boxes.
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates (the feature map's size over the input
            image's).  Default: 1.0.
        sampling_ratio (int, optional): The number of sampling points per bin along each
            axis.  If > 0, exactly ``sampling_ratio * sampling_ratio`` points are used; if
            -1 or 0, ``ceil(box size / output size)`` along each axis.  Default: -1.
        aligned (bool, optional): If True, shift the scaled box by -0.5 pixel so that
            pixel centres sit at half-integers (Detectron2).  If False, the legacy
            Mask R-CNN mapping.  Default: True, as in Paddle (other frameworks default to
            False).
        name (str|None, optional): Accepted for signature compatibility with Paddle and
            unused.  Default: None.
        n_threads (int|None, optional): Keyword-only.  The number of OpenMP threads the
            computation may use: None uses ``OMP_NUM_THREADS`` or every CPU, a negative n
            all CPUs but ``|n| - 1``.  Results never depend on it.  Default: None.

    Returns:
        Tensor: The pooled feature, a 4-D Tensor of shape [num_boxes, C, h, w] with the
        data type of ``x``.

    Differences from ``paddle.vision.ops.roi_align``:

    - ``boxes_num`` must have one count per image and sum to num_boxes (Paddle reads or
      writes out of bounds when the sum is wrong); negative counts are refused; int64
      counts are accepted in the forward and backward passes.
    - With ``aligned=True`` and adaptive sampling, a box of zero size gives NaN, as in
      Paddle; a reversed box (x2 < x1 or y2 < y1) gives NaN too, where Paddle's kernel
      aborts the process.
    - Coordinates must be finite and, once scaled, within 2**24 pixels of the origin;
      otherwise a ValueError names ``boxes``.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import roi_align

            >>> x = paddle.arange(32, dtype='float32').reshape([1, 2, 4, 4])
            >>> boxes = paddle.to_tensor([[0.0, 0.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> align_out = roi_align(x, boxes, boxes_num, output_size=2)
            >>> print(list(align_out.shape))
            [2, 2, 2, 2]
            >>> print(align_out[0, 0].numpy())
            [[1.5625 3.    ]
             [7.3125 8.75  ]]
            >>> unaligned = roi_align(x, boxes, boxes_num, 2, sampling_ratio=2, aligned=False)
            >>> print(unaligned[0, 0].numpy())
            [[ 3.75  5.25]
             [ 9.75 11.25]]
    """
    return _roi_align(x, boxes, boxes_num, output_size, spatial_scale, sampling_ratio, aligned,
                      n_threads=n_threads)


# --------------------------------------------------------------------------- layers

class RoIPool(paddle.nn.Layer):
    """RoI max pooling as a Layer, a drop-in replacement for ``paddle.vision.ops.RoIPool``.

    Calling the layer as ``layer(x, boxes, boxes_num)`` returns
    ``roi_pool(x, boxes, boxes_num, output_size, spatial_scale)``; see :func:`roi_pool`
    for the arguments, the result and the differences from Paddle.  The layer has no
    parameters.

    Args:
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates.  Default: 1.0.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads for each call, as in
            :func:`roi_pool`.  Default: None.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import RoIPool

            >>> x = paddle.rand([1, 256, 32, 32])
            >>> boxes = paddle.to_tensor([[4.0, 4.0, 60.0, 44.0], [0.0, 8.0, 24.0, 30.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> roi_pool = RoIPool(output_size=(4, 3), spatial_scale=0.5)
            >>> print(list(roi_pool(x, boxes, boxes_num).shape))
            [2, 256, 4, 3]
    """

    def __init__(self, output_size, spatial_scale=1.0, *, n_threads=None):
        super().__init__()
        self._output_size = output_size
        self._spatial_scale = spatial_scale
        self._n_threads = n_threads

    def forward(self, x, boxes, boxes_num):
        """Pool ``x`` over ``boxes``; see :func:`roi_pool`."""
        return roi_pool(x, boxes, boxes_num, self._output_size, self._spatial_scale,
                        n_threads=self._n_threads)

    def extra_repr(self):
        return f"output_size={self._output_size}, spatial_scale={self._spatial_scale}"


class PSRoIPool(paddle.nn.Layer):
    """Position-sensitive RoI pooling as a Layer, a drop-in replacement for
    ``paddle.vision.ops.PSRoIPool``.

    Calling the layer as ``layer(x, boxes, boxes_num)`` returns
    ``psroi_pool(x, boxes, boxes_num, output_size, spatial_scale)``; see
    :func:`psroi_pool` for the arguments, the result and the differences from Paddle.  The
    layer has no parameters.

    Args:
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates.  Default: 1.0.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads for each call, as in
            :func:`psroi_pool`.  Default: None.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import PSRoIPool

            >>> x = paddle.rand([2, 490, 28, 28])
            >>> boxes = paddle.to_tensor([[1.0, 5.0, 8.0, 10.0], [4.0, 2.0, 6.0, 7.0],
            ...                           [12.0, 12.0, 19.0, 21.0]])
            >>> boxes_num = paddle.to_tensor([1, 2], dtype='int32')
            >>> psroi_pool = PSRoIPool(output_size=7)
            >>> print(list(psroi_pool(x, boxes, boxes_num).shape))
            [3, 10, 7, 7]
    """

    def __init__(self, output_size, spatial_scale=1.0, *, n_threads=None):
        super().__init__()
        self.output_size = output_size
        self.spatial_scale = spatial_scale
        self._n_threads = n_threads

    def forward(self, x, boxes, boxes_num):
        """Pool ``x`` over ``boxes``; see :func:`psroi_pool`."""
        return psroi_pool(x, boxes, boxes_num, self.output_size, self.spatial_scale,
                          n_threads=self._n_threads)

    def extra_repr(self):
        return f"output_size={self.output_size}, spatial_scale={self.spatial_scale}"


class RoIAlign(paddle.nn.Layer):
    """RoIAlign as a Layer, a drop-in replacement for ``paddle.vision.ops.RoIAlign``.

    Calling the layer as ``layer(x, boxes, boxes_num, aligned=True)`` returns
    ``roi_align(x, boxes, boxes_num, output_size, spatial_scale, sampling_ratio=-1,
    aligned=aligned)``: as in Paddle, the layer always samples adaptively and takes
    ``aligned`` at call time.  See :func:`roi_align` for the arguments, the result and the
    differences from Paddle.  The layer has no parameters.

    Args:
        output_size (int|tuple[int, int]|list[int]): The pooled output size (h, w).  If
            int, h and w are both equal to output_size.
        spatial_scale (float, optional): Multiplicative spatial scale factor that maps box
            coordinates to feature-map coordinates.  Default: 1.0.
        n_threads (int|None, optional): Keyword-only.  OpenMP threads for each call, as in
            :func:`roi_align`.  Default: None.

    Examples:
        .. code-block:: pycon

            >>> import paddle
            >>> from roicore.adapters.paddle import RoIAlign

            >>> x = paddle.rand([1, 256, 32, 32])
            >>> boxes = paddle.to_tensor([[4.0, 4.0, 60.0, 44.0], [0.0, 8.0, 24.0, 30.0]])
            >>> boxes_num = paddle.to_tensor([2], dtype='int32')
            >>> roi_align = RoIAlign(output_size=(4, 3), spatial_scale=0.5)
            >>> print(list(roi_align(x, boxes, boxes_num).shape))
            [2, 256, 4, 3]
            >>> print(list(roi_align(x, boxes, boxes_num, aligned=False).shape))
            [2, 256, 4, 3]
    """

    def __init__(self, output_size, spatial_scale=1.0, *, n_threads=None):
        super().__init__()
        self._output_size = output_size
        self._spatial_scale = spatial_scale
        self._n_threads = n_threads

    def forward(self, x, boxes, boxes_num, aligned=True):
        """Pool ``x`` over ``boxes``; see :func:`roi_align`."""
        return roi_align(x, boxes, boxes_num, self._output_size, self._spatial_scale,
                         aligned=aligned, n_threads=self._n_threads)

    def extra_repr(self):
        return f"output_size={self._output_size}, spatial_scale={self._spatial_scale}"


from ._paddle_pyramid import MultiLevelRoIAlign, multilevel_roi_align  # noqa: E402,F401
