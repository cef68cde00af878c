"""TensorFlow front end: RoI pooling ops and Keras 3 layers in the style of ``tf.image.crop_and_resize``.

TensorFlow has no native RoI pooling, so these ops follow the TF op that is closest to it,
``tf.image.crop_and_resize(image, boxes, box_indices, crop_size, ...)``:

* ``images`` is a 4-D float16/float32/float64 tensor, **NHWC** by default (TF's layout);
  ``data_format="NCHW"`` takes and returns channels-first tensors.
* ``boxes`` is a ``(K, 4)`` float tensor with rows **[y1, x1, y2, x2]** (TF's column order),
  and ``box_indices`` a ``(K,)`` int32/int64 tensor giving the image of each box.  The
  Keras layers also take batched ``(B, R, 4)`` boxes without box indices.
* Coordinates are **absolute input-image pixels** (scaled onto the feature map by
  ``spatial_scale``) for ``roi_pool(method="max")``, ``psroi_pool`` and ``roi_align``; the
  crop methods, ``roi_pool(method="bilinear" | "nearest")``, take crop_and_resize's
  normalised boxes (and its ``crop_size`` argument).
* Outputs are ``(K, PH, PW, C)`` for NHWC and ``(K, C, PH, PW)`` for NCHW, in the dtype of
  ``images`` (float16 is computed in float32).

Arithmetic (the roicore convention each op reproduces bit for bit; see
:mod:`roicore.core.conventions`):

* ``roi_pool(method="max")``: ``"mxnet"`` (Fast R-CNN integer RoI, spatial_scale held as a
  C float, as a TF ``float`` attribute holds it).  The argmax kept for the gradient is
  stored per plane (``h*W + w``, int32) instead of MXNet's global index, which changes no
  output value and keeps int32 for any batch size.
* ``roi_pool(method="bilinear" | "nearest")``: ``"tensorflow"``, i.e.
  ``tf.image.crop_and_resize``'s sampling, ``CropAndResizeGradImage``'s gradient and
  ``CropAndResizeGradBoxes``' gradient of the boxes (equal bit for bit for float32).
* ``psroi_pool``: ``"mxnet"`` (identical numbers to ``"paddle"``).
* ``roi_align``: ``"mxnet"`` (the Caffe2 sampler, spatial_scale held as a C float).

Gradients flow to ``images`` and, for the crop methods, to ``boxes``; ``box_indices`` get
none.  This module does no arithmetic of its own.

``crop_and_resize(image, boxes, box_indices, crop_size, method, extrapolation_value, name)``
is a drop-in for ``tf.image.crop_and_resize``: its signature, the image dtypes it takes
(integers and float16/32/64), its float32 result, TF's own argument checks and errors, and
its numbers bit for bit (``roi_pool``'s crop methods on the image cast to float32, as TF's
kernel reads it); its docstring lists what still differs.

How the ops run
---------------
roicore's **TensorFlow op library** (``roicore.adapters.native``: registered ops with CPU
kernels on roicore's C library, for every op and its gradient) is loaded when this module
is imported, compiled first against the installed TensorFlow if the cache has none (once
per TensorFlow version; see :mod:`roicore.adapters.native.tf`).  It is used in every
mode: eagerly, in ``tf.function``, in Keras ``fit``/``predict``, and in SavedModels
(``tf.saved_model.save``, Keras ``Model.export``), which then hold only these ops and TF's
own.  The ops take either layout as it is (no transposes) and give static output shapes.
Their gradients are registered with ``tf.RegisterGradient`` and saved with a SavedModel
(as custom gradients), so a model reloaded where only the op library is loaded still
differentiates.  Eagerly, when no ``GradientTape`` records the inputs, the forward op
runs alone and ``roi_pool(method="max")`` computes no argmax; in a graph the argmax is
computed only when a gradient uses it, and a Keras :class:`RoIPool` called with
``training=False`` (``predict``/``evaluate``) asks for none.

Deploying a SavedModel: a process that has imported this module loads it as it stands
(the import registered the ops).  Where roicore is not installed, ship the library file
(``python -m roicore.adapters.native.tf`` prints its path) and load it before the model:
``tf.load_op_library(path)`` in Python, ``TF_LoadLibrary(path, status)`` from TensorFlow's
C API in C and C++ programs.  TF Serving links custom ops into its model server when the
server is built, from the op source (``roicore/adapters/native/tf_ops.cc``) and roicore's
static C library (``roicore.core.get_library_dir()``).

When the library cannot be built (no C++ compiler, a failed compile) or
``ROICORE_TF_NATIVE=0`` is set, the import still succeeds and the ops run through a
**tf.numpy_function fallback** (:mod:`roicore.adapters._tf_numpy`); a library that could
not be built or loaded is reported by a :class:`NativeOpsWarning` at the first op call.
Eager, ``tf.function`` and Keras work with the same numbers, SavedModel export raises a
clear ``NotImplementedError``.

Errors: arguments are checked when the op is built (``TypeError``/``ValueError``); values
inside the tensors (a box index outside the batch, a non-finite box) raise
``tf.errors.InvalidArgumentError`` with roicore's message, eagerly and in graphs alike.
``crop_and_resize`` raises TF's errors instead (see its docstring).
**XLA** (``tf.function(jit_compile=True)``, Keras ``jit_compile=True``) is refused with a
``NotImplementedError`` while tracing: the ops have no XLA lowering.  The Keras layers set
``supports_jit = False``, so Keras' default ``jit_compile="auto"`` leaves XLA off.

Tensors on an accelerator are copied to the host and the result back, with a
``DeviceCopyWarning`` once per device (``roicore.adapters.set_device_policy("error")``
refuses them instead).  ``tf.distribute`` strategies on CPU devices work.
"""
from __future__ import annotations

import contextlib
import dataclasses
import numbers
import warnings

import numpy as np

from roicore import core
from roicore.core import args, conventions

from . import _tf_common, _tf_numpy
from ._common import require, switched_off
from ._tf_common import back_to, on_host

tf = require("tensorflow", "tf")
keras = require("keras", "tf")  # Keras 3, a dependency of TF >= 2.16

try:  # private TF module: used only to refuse XLA with a clear message
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - older/newer TF layouts
    _in_xla = None

__all__ = ["roi_pool", "crop_and_resize", "psroi_pool", "roi_align", "RoIPool", "PSRoIPool",
           "RoIAlign", "multilevel_crop_and_resize", "CONVENTIONS", "native_ops",
           "NativeOpsWarning"]

# The roicore convention each op reproduces (see the module docstring).
_MAX_RULES = dataclasses.replace(conventions.MAX_POOL["mxnet"], argmax="plane")
CONVENTIONS = {
    "roi_pool/max": _MAX_RULES,
    "roi_pool/bilinear": conventions.BILINEAR_POOL["tensorflow"],
    "roi_pool/nearest": conventions.BILINEAR_POOL["tensorflow"],
    "psroi_pool": conventions.PSROI_POOL["mxnet"],
    "roi_align": conventions.ROI_ALIGN["mxnet"],
    "multilevel_crop_and_resize": conventions.MODEL_GARDEN_ALIGN,
}
# TensorFlow's names of roicore.core's arguments, for messages
NAMES = {"x": "images", "batch_indices": "box_indices"}
_FLOATS = (tf.float16, tf.float32, tf.float64)
_FORMATS = ("NHWC", "NCHW")


# ---------------------------------------------------------------------------------------
# Argument checks (trace time: static dtypes, ranks and shapes, in TF's vocabulary)

def _data_format(data_format):
    if data_format not in _FORMATS:
        raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got {data_format!r}")
    return data_format


def _images(images, data_format):
    t = tf.convert_to_tensor(images, name="images")
    if t.dtype not in _FLOATS:
        raise TypeError(f"images must be float16, float32 or float64, got {t.dtype.name}")
    if t.shape.rank is not None and t.shape.rank != 4:
        raise ValueError(f"images must be a 4-D {'(N, H, W, C)' if data_format == 'NHWC' else '(N, C, H, W)'} "
                         f"tensor ({data_format}), got shape {t.shape}")
    return t


def _boxes(boxes, box_indices):
    b = tf.convert_to_tensor(boxes, name="boxes")
    if not b.dtype.is_floating:
        raise TypeError(f"boxes must be a float tensor, got {b.dtype.name}")
    if b.shape.rank is not None and (b.shape.rank != 2 or b.shape[1] not in (None, 4)):
        raise ValueError(f"boxes must have shape (K, 4) [y1, x1, y2, x2], got {b.shape}")
    i = tf.convert_to_tensor(box_indices, name="box_indices")
    if i.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"box_indices must be int32 or int64, got {i.dtype.name}")
    if i.shape.rank is not None and i.shape.rank != 1:
        raise ValueError(f"box_indices must be 1-D (one image index per box), got shape {i.shape}")
    k_boxes = b.shape[0] if b.shape.rank else None
    k_index = i.shape[0] if i.shape.rank else None
    if k_boxes is not None and k_index is not None and k_boxes != k_index:
        raise ValueError(f"box_indices must have one entry per box: boxes has {k_boxes} rows, "
                         f"box_indices has {k_index}")
    return b, i


def _refuse_xla(op):
    if not tf.executing_eagerly() and _in_xla is not None and _in_xla(
            tf.compat.v1.get_default_graph()):
        raise NotImplementedError(
            f"roicore.adapters.tf.{op} cannot be compiled with XLA (tf.function(jit_compile=True) "
            "or Keras jit_compile=True): roicore's TensorFlow ops have CPU kernels and no XLA "
            "lowering. Call it from a function with jit_compile=False.")


# ---------------------------------------------------------------------------------------
# Running an op: the native op library, else the tf.numpy_function fallback

# AutoGraph would otherwise convert the adapter's own Python inside a tf.function (and the
# first-use build of the op library with it, which it cannot), and warn about each part
_not_converted = tf.autograph.experimental.do_not_convert


class NativeOpsWarning(RuntimeWarning):
    """roicore's TensorFlow op library is not available; the tf.numpy_function fallback runs."""


# "library": native_ops()'s answer, once asked; "error": why the load at import failed
_LIBRARY = {}


def _load_at_import():
    """Load the op library as this module is imported, so that TensorFlow knows roicore's
    ops before the user loads a SavedModel holding them.  A failure must not fail the
    import: it is kept for the first op call, which warns and falls back as it would have
    had the load failed then."""
    if switched_off("ROICORE_TF_NATIVE"):
        return
    try:
        from .native import tf as native_tf
        native_tf.load()
    except Exception as exc:  # no compiler, a failed build or load: native_ops() says why
        _LIBRARY["error"] = exc


@_not_converted
def native_ops():
    """roicore's TensorFlow op library (the module ``tf.load_op_library`` returns), loaded
    when this module was imported (built first if the cache had none); None when the ops
    run through the ``tf.numpy_function`` fallback instead, because ``ROICORE_TF_NATIVE=0``
    asks for it or the library could not be built or loaded (a :class:`NativeOpsWarning`
    then says why, once, at the first call)."""
    if "library" not in _LIBRARY:
        library = None
        if not switched_off("ROICORE_TF_NATIVE"):
            try:
                if "error" in _LIBRARY:  # the load at import failed: report it, build no more
                    raise _LIBRARY["error"]
                from .native import tf as native_tf
                library = native_tf.load()
            except Exception as exc:  # no compiler, a failed build or load: say why, go on
                warnings.warn(
                    "roicore.adapters.tf runs its ops through tf.numpy_function: its TensorFlow "
                    f"op library is not available ({type(exc).__name__}: {exc}). Eager mode, "
                    "tf.function and Keras work; SavedModel export does not.",
                    NativeOpsWarning, stacklevel=3)
        _LIBRARY["library"] = library
    return _LIBRARY["library"]


_load_at_import()


@dataclasses.dataclass(frozen=True)
class _Native:
    """An op as the native library runs it: its op type and attributes (besides
    data_format and n_threads), and whether the boxes get a gradient."""
    op_type: str
    attrs: dict
    boxes_differentiable: bool = False


def _apply(op, name, images, boxes, box_indices, data_format, n_threads, out_hw, out_channels,
           native, **fallback):
    """Check the arguments, bring tensors to the host, run ``native`` (a :class:`_Native`)
    on the op library, or the fallback (``_tf_numpy.run``'s arguments) when there is none,
    and bring the result back to the images' device."""
    _refuse_xla(op)
    data_format = _data_format(data_format)
    # eager ops carry no names, so eager calls skip the scope and its cost
    with tf.name_scope(name or op) if not tf.executing_eagerly() else contextlib.nullcontext():
        images = _images(images, data_format)
        boxes, box_indices = _boxes(boxes, box_indices)
        home = _tf_common.device_of(images)
        images, boxes, box_indices = (on_host(t, arg) for t, arg in (
            (images, "images"), (boxes, "boxes"), (box_indices, "box_indices")))
        channels = out_channels(images.shape[1 if data_format == "NCHW" else 3]
                                if images.shape.rank else None)
        k = boxes.shape[0] if boxes.shape.rank else None
        shape = [k, channels, *out_hw] if data_format == "NCHW" else [k, *out_hw, channels]
        if native_ops() is not None:
            y = _run_native(native, images, boxes, box_indices, data_format, n_threads)
            if channels is not None and y.shape[-1 if data_format == "NHWC" else 1] is None:
                y = tf.ensure_shape(y, shape)  # output_channels given, images' C unknown
        else:
            _tf_numpy.refuse_export(op)
            x = images if data_format == "NCHW" else tf.transpose(images, [0, 3, 1, 2])
            y = _tf_numpy.run(op, x, boxes, box_indices, [k, channels, *out_hw], **fallback)
            y = y if data_format == "NCHW" else tf.transpose(y, [0, 2, 3, 1])
        return back_to(y, home)


def _run_native(native, images, boxes, box_indices, data_format, n_threads):
    from .native import tf as native_tf
    attrs = {**native.attrs, "data_format": data_format, "n_threads": n_threads or 0}
    half = images.dtype == tf.float16  # computed in float32, as roicore.core does
    x = tf.cast(images, tf.float32) if half else images
    y = native_tf.call(native.op_type, x, boxes, box_indices, attrs, native.boxes_differentiable)
    return tf.cast(y, tf.float16) if half else y


def _same_channels(c):
    return c


# ---------------------------------------------------------------------------------------
# Ops

@_not_converted
def roi_pool(images, boxes, box_indices, output_size=None, spatial_scale=1.0, method="max",
             extrapolation_value=0.0, data_format="NHWC", name=None, *, crop_size=None,
             n_threads=None):
    """RoI pooling of ``images`` (NHWC by default) over ``boxes`` [y1, x1, y2, x2] with ``box_indices``.

    method="max" takes ABSOLUTE input-image coordinates (feature pixel = coordinate *
    ``spatial_scale``).  method="bilinear" and method="nearest" are
    ``tf.image.crop_and_resize`` with the same method: boxes normalised as its
    (``y * (H - 1)`` is the feature row), equal to it bit for bit for float32, forward and
    gradients (of the images and of the boxes).  Columns are [y1, x1, y2, x2] as in TF;
    the result is ``(K, PH, PW, C)`` (NHWC) or ``(K, C, PH, PW)`` (NCHW) in the images'
    dtype.

    The output size is ``output_size``, or ``crop_size`` (crop_and_resize's name for it,
    for the crop methods), so ``crop_and_resize(image, boxes, box_indices, crop_size,
    method=..., extrapolation_value=...)`` becomes ``roi_pool(image, boxes, box_indices,
    crop_size, method=..., extrapolation_value=...)`` with its arguments unchanged,
    positional or by keyword.  Either may be a tensor (as crop_and_resize's crop_size is)
    whose value is known when the op is built, such as a constant.

    Args:
      images: 4-D float16/32/64 tensor, (N, H, W, C) or (N, C, H, W) per ``data_format``.
      boxes: (K, 4) float tensor of [y1, x1, y2, x2] rows.
      box_indices: (K,) int32/int64 tensor, the image of each box, in [0, N).
      output_size: int or (PH, PW), the pooled size.
      spatial_scale: feature-map size over image size (1/16 for a stride-16 backbone).
        Must stay 1.0 for the crop methods, whose boxes are already normalised.
      method: "max" (Fast R-CNN RoI max pooling, roicore convention "mxnet"), "bilinear"
        or "nearest" (crop_and_resize's sampling, roicore convention "tensorflow").
      extrapolation_value: value of crop samples outside the map (crop_and_resize's).
      data_format: "NHWC" (default; costs a transpose copy of the input and of the output,
        and of the gradients) or "NCHW" (no copy).
      name: name scope.
      crop_size: the output size under crop_and_resize's name; pass it or output_size,
        not both, and only with method "bilinear" or "nearest".
      n_threads: OpenMP threads for roicore (None: its default); results do not depend on it.

    Returns:
      The pooled tensor.  Gradients flow to ``images`` and, for the crop methods, to
      ``boxes``; method="max" gives boxes none.

    Notes:
      max: each box is snapped to feature pixels with ``round(x * spatial_scale)``, given an
      inclusive +1 extent and split into floor/ceil bins; an empty bin gives 0.
      bilinear, nearest: a flipped box (y2 < y1) gives a flipped crop; samples outside the
      map give ``extrapolation_value``; nearest takes the pixel at ``round()`` of the
      sample position (halves away from zero).  As in TF, the boxes' gradient of
      method="nearest" is the bilinear crop's (the nearest crop is piecewise constant in
      the boxes).  Unlike crop_and_resize, the output keeps the images' dtype and float64
      images are computed in float64 (crop_and_resize always computes and returns
      float32); :func:`crop_and_resize` is the drop-in that does as TF does.
    """
    return _roi_pool(images, boxes, box_indices, _output_size(output_size, crop_size, method),
                     spatial_scale, method, extrapolation_value, data_format, name, n_threads)


_METHODS = ("max", "bilinear", "nearest")
_CROP_METHODS = ("bilinear", "nearest")


def _method(method):
    if method not in _METHODS:
        raise ValueError(f"method must be 'max', 'bilinear' or 'nearest', got {method!r}")
    return method


def _output_size(output_size, crop_size, method):
    """roi_pool's (PH, PW), from ``output_size`` or crop_and_resize's ``crop_size``."""
    _method(method)
    if crop_size is None:
        if output_size is None:
            raise TypeError("roi_pool() needs the output size: pass output_size (or crop_size "
                            "for method='bilinear' or 'nearest')")
        return _size(output_size, "output_size")
    if output_size is not None:
        raise TypeError("pass output_size or crop_size (crop_and_resize's name for it), not both")
    if method not in _CROP_METHODS:
        raise ValueError("crop_size is crop_and_resize's name for the output size of "
                         f"method='bilinear' or 'nearest'; method={method!r} takes output_size")
    return _size(crop_size, "crop_size")


def _size(value, name):
    """An int or (height, width) pair, given as Python ints or a tensor, as (h, w)."""
    return args.pair(_static(value, name), name)


def _static(value, name):
    """A size given as a tensor or array, as Python ints (its value must be known now)."""
    if not (tf.is_tensor(value) or isinstance(value, np.ndarray)):
        return value
    known = tf.get_static_value(value)
    if known is None:
        raise ValueError(f"{name} must be known when the op is built (a Python int or pair, or "
                         f"a constant tensor), got a tensor whose value is computed at run time")
    if known.dtype.kind not in "iu" or known.shape not in ((), (2,)):
        raise TypeError(f"{name} must be an int or a pair of ints (height, width), got a "
                        f"{known.dtype} tensor of shape {known.shape}")
    return tuple(known.tolist()) if known.shape else int(known)


def _float_attr(value, name):
    """A positive scale as a TF float attribute holds it: a C float, as the "mxnet"
    conventions of these ops hold it too (checked not to underflow or overflow there)."""
    return args.float32_scale(value, name)


def _rules(name):
    """The op's convention as the op library's ``rules`` attribute."""
    return list(args.rules_codes(CONVENTIONS[name]))


def _roi_pool(images, boxes, box_indices, out_hw, spatial_scale, method,
              extrapolation_value, data_format, name, n_threads, graph_argmax=True,
              op="roi_pool"):
    """roi_pool's work; ``op`` is the public function that called it, for messages and
    default names."""
    core.effective_n_threads(n_threads)
    if method in _CROP_METHODS:
        if spatial_scale != 1.0:
            raise ValueError(f"spatial_scale must be 1.0 for method={method!r}: its boxes are "
                             "normalised as tf.image.crop_and_resize's, got "
                             f"spatial_scale={spatial_scale!r}")
        rules = CONVENTIONS["roi_pool/" + method]

        def forward(x, b, i, argmax):
            xyxy, i = _tf_numpy.xyxy(b, i, x.shape[0])
            return core.roi_pool(x, xyxy, out_hw, batch_indices=i, method=method, convention=rules,
                                 names=NAMES, extrapolation_value=extrapolation_value,
                                 n_threads=n_threads)

        def backward(dy, b, i, shape):
            xyxy, i = _tf_numpy.xyxy(b, i, shape[0])
            return core.roi_pool_backward(dy, xyxy, tuple(shape), batch_indices=i,
                                          method=method, convention=rules, names=NAMES,
                                          n_threads=n_threads)

        def boxes_backward(dy, x, b, i):
            xyxy, i = _tf_numpy.xyxy(b, i, x.shape[0])
            d = core.roi_pool_boxes_backward(dy, x, xyxy, batch_indices=i,
                                             convention=CONVENTIONS["roi_pool/bilinear"],
                                             names=NAMES, n_threads=n_threads)
            return d[:, [1, 0, 3, 2]]

        native = _Native("RoicoreCropAndResize", dict(
            crop_height=out_hw[0], crop_width=out_hw[1], method=method,
            extrapolation_value=args.real(extrapolation_value, "extrapolation_value"),
            rules=_rules("roi_pool/" + method)), boxes_differentiable=True)
        return _apply(op, name, images, boxes, box_indices, data_format, n_threads,
                      out_hw, _same_channels, native, forward=forward, backward=backward,
                      boxes_backward=boxes_backward)

    def forward(x, b, i, with_argmax):
        xyxy, i = _tf_numpy.xyxy(b, i, x.shape[0])
        res = core.roi_pool(x, xyxy, out_hw, spatial_scale, batch_indices=i, method="max",
                            convention=_MAX_RULES, names=NAMES, return_argmax=with_argmax,
                            n_threads=n_threads)
        if not with_argmax:
            return res
        y, argmax = res
        if argmax.dtype != np.int32:
            raise ValueError(f"feature maps of {x.shape[2]}x{x.shape[3]} >= 2**31 pixels per "
                             "plane are not supported by roicore.adapters.tf.roi_pool")
        return y, argmax

    def backward(dy, b, i, shape, argmax):
        xyxy, i = _tf_numpy.xyxy(b, i, shape[0])
        return core.roi_pool_backward(dy, xyxy, tuple(shape), spatial_scale, batch_indices=i,
                                      method="max", convention=_MAX_RULES, names=NAMES,
                                      argmax=argmax, n_threads=n_threads)

    native = _Native("RoicoreRoiPoolMax", dict(
        pooled_height=out_hw[0], pooled_width=out_hw[1],
        spatial_scale=_float_attr(spatial_scale, "spatial_scale"), rules=_rules("roi_pool/max"),
        compute_argmax=graph_argmax))
    return _apply(op, name, images, boxes, box_indices, data_format, n_threads, out_hw,
                  _same_channels, native, forward=forward, backward=backward, with_argmax=True,
                  graph_argmax=graph_argmax)


@_not_converted
def crop_and_resize(image, boxes, box_indices, crop_size, method="bilinear",
                    extrapolation_value=0.0, name=None):
    """``tf.image.crop_and_resize``, computed by roicore: same signature, arguments, errors
    and float32 result, equal to it bit for bit: the crops of every image dtype, the
    boxes' gradient, and the image's gradient of float32 images.

    It is :func:`roi_pool` with method "bilinear" or "nearest" on the image cast to
    float32, which is what TF's kernel reads (``static_cast<float>`` of each pixel), so
    every image dtype TF accepts (uint8, uint16, int8, int16, int32, int64, float16,
    float32, float64) gives TF's float32 crops.  Gradients are TF's: the image's (as
    ``CropAndResizeGradImage``; none for integer images) and the boxes' (as
    ``CropAndResizeGradBoxes``, for either method); ``box_indices`` and ``crop_size`` get
    none.

    The arguments are checked by TF itself, so errors have TF's types and messages in
    eager mode and in graphs alike (``InvalidArgumentError("input image must be 4-D...")``,
    ``OutOfRangeError("box_index has values outside [0, batch_size)")``, ...): TF's
    crop_and_resize runs first on a tensor of the image's dtype, batch, height and width
    with no channels, where it has nothing to crop (and a 1 x 1 crop when ``crop_size`` is
    valid).  A graph that calls this function, and its SavedModel, hold that op besides
    roicore's.

    Args:
      image: 4-D (N, H, W, C) tensor of one of the dtypes above.
      boxes: (K, 4) float32 [y1, x1, y2, x2] rows, normalised (``y * (H - 1)`` is the
        image row).
      box_indices: (K,) int32, the image of each box, in [0, N).
      crop_size: (crop_height, crop_width), positive int32s: a list, an array or a tensor
        whose value is known when the op is built.
      method: "bilinear" or "nearest".
      extrapolation_value: value of the samples outside the image.
      name: name scope of the ops, in a graph.

    Returns:
      The (K, crop_height, crop_width, C) float32 crops.

    Differences from tf.image.crop_and_resize:
      * float16 and float64 images: the image's gradient is summed in float32 and then
        cast to the image's dtype; TF adds each contribution in the image's dtype, so the
        last bits may differ where samples overlap (the forward and the boxes' gradient
        are equal bit for bit).
      * ``crop_size`` must be known when the op is built (the crop size is an attribute
        of roicore's op); TF also takes one computed in the graph.  In a graph, a crop
        size that TF refuses only when the graph runs (zero or negative) is refused while
        tracing, with a ValueError.
      * A box whose corners lie more than 2**24 pixels from the image's origin
        (``|y1 * (H - 1)| > 2**24``, ...) raises InvalidArgumentError (roicore's limit:
        float32 has no exact sample positions there); TF crops it.
      * No XLA (``jit_compile=True`` raises NotImplementedError while tracing) and images
        on accelerators are copied to the host (see the module docstring).
      * ``name`` names a scope of several ops rather than a single op, and in a graph
        the errors of TF's shape function (raised while tracing) list the image's shape
        with 0 channels: the shape of the tensor TF checks.
    """
    method = "bilinear" if method is None else method  # TF's op takes None as its default
    graph = not tf.executing_eagerly()
    with tf.name_scope(name or "crop_and_resize") if graph else contextlib.nullcontext() as scope:
        image = tf.convert_to_tensor(image, name="image")
        check = _tf_checks(image, boxes, box_indices, crop_size, method, extrapolation_value)
        # TF's conversions (e.g. float64 arrays to float32 boxes), after TF accepted them
        boxes = tf.convert_to_tensor(boxes, tf.float32, name="boxes")
        box_indices = tf.convert_to_tensor(box_indices, tf.int32, name="box_indices")
        if boxes.shape.num_elements() == 0 and box_indices.shape.num_elements() == 0:
            boxes = tf.zeros([0, 4])  # TF takes any empty boxes with empty box_indices
        x = tf.cast(image, tf.float32)  # the pixels as TF's kernel reads them
        if graph:
            # the crop runs after TF's checks; an Assert that always holds keeps them in the
            # graph, as Grappler turns an op that only a control edge uses into a NoOp
            with tf.control_dependencies([tf.raw_ops.Assert(condition=True, data=[check])]):
                x = tf.identity(x)
        extrapolation_value = 0.0 if extrapolation_value is None else float(extrapolation_value)
        return _roi_pool(x, boxes, box_indices, _size(crop_size, "crop_size"), 1.0, method,
                         extrapolation_value, "NHWC", scope, None, op="crop_and_resize")


def _tf_checks(image, boxes, box_indices, crop_size, method, extrapolation_value):
    """tf.image.crop_and_resize's checks of its arguments, made by TF's CropAndResize on an
    image of the same dtype, batch, height and width with no channels (a rank other than 4
    is refused before any pixel is read, so such an image goes as it is).  A valid
    ``crop_size`` becomes 1 x 1, which passes the same checks and leaves TF one sample per
    box.  Eagerly it raises TF's error; in a graph it returns the op to run first."""
    rank = image.shape.rank
    if rank is not None and rank != 4:
        probe = image
    elif image.shape.is_fully_defined():
        probe = tf.zeros([*image.shape[:3], 0], image.dtype)
    else:
        probe = tf.zeros(tf.concat([tf.shape(image)[:3], [0]], 0), image.dtype)
    return tf.image.crop_and_resize(probe, boxes, box_indices,
                                    [1, 1] if _valid_crop_size(crop_size) else crop_size,
                                    method, extrapolation_value)


def _valid_crop_size(crop_size):
    """Whether TF takes ``crop_size`` for certain: two positive int32 values, known now (an
    int32 tensor, or integers TF converts to int32 exactly)."""
    if tf.is_tensor(crop_size):
        if crop_size.dtype != tf.int32:
            return False
        crop_size = tf.get_static_value(crop_size)
    if isinstance(crop_size, (tuple, list)):
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                   for v in crop_size):
            return False
    elif not (isinstance(crop_size, np.ndarray) and crop_size.dtype.kind == "i"):
        return False
    a = np.asarray(crop_size)
    return a.shape == (2,) and bool(np.all((a > 0) & (a <= np.iinfo(np.int32).max)))


@_not_converted
def psroi_pool(images, boxes, box_indices, output_size, spatial_scale=1.0, output_channels=None,
               group_size=None, data_format="NHWC", name=None, *, n_threads=None):
    """Position-sensitive RoI average pooling (R-FCN) of ``images`` over ABSOLUTE ``boxes`` [y1, x1, y2, x2].

    ``images`` is NHWC by default with C = ``output_channels * GH * GW`` channels, ``boxes``
    are in input-image pixels (feature pixel = coordinate * ``spatial_scale``) with rows
    [y1, x1, y2, x2] as in TF, ``box_indices`` gives each box's image; the result is
    ``(K, PH, PW, D)`` (NHWC) or ``(K, D, PH, PW)`` (NCHW).  roicore convention "mxnet"
    (same numbers as Paddle's psroi_pool).

    Args:
      images: 4-D float16/32/64 tensor, (N, H, W, C) or (N, C, H, W) per ``data_format``.
      boxes: (K, 4) float tensor of [y1, x1, y2, x2] rows.
      box_indices: (K,) int32/int64 tensor in [0, N).
      output_size: int or (PH, PW).
      spatial_scale: feature-map size over image size.
      output_channels: D (inferred from C when None).
      group_size: int or (GH, GW), MXNet's group size; defaults to ``output_size``.
      data_format: "NHWC" (default; transpose copies of input, output and gradients) or
        "NCHW" (no copy).
      name: name scope.
      n_threads: OpenMP threads for roicore (None: its default).

    Returns:
      The pooled tensor.  Gradients flow to ``images`` only.

    Notes:
      Output channel d at cell (ph, pw) averages input channel ``(d*GH + gh)*GW + gw``.
      Coordinates are rounded before scaling and the end gets +1; empty bins give 0.
    """
    out_hw = _size(output_size, "output_size")
    gh, gw = out_hw if group_size is None else args.pair(group_size, "group_size")
    core.effective_n_threads(n_threads)
    rules = CONVENTIONS["psroi_pool"]

    def out_channels(c):
        """D; checked against the images' channels when they are known."""
        if c is None:
            return output_channels if isinstance(output_channels, numbers.Integral) else None
        return args.ps_channels(out_hw, (gh, gw), c, output_channels, "images")[4]

    def forward(x, b, i, argmax):
        xyxy, i = _tf_numpy.xyxy(b, i, x.shape[0])
        return core.psroi_pool(x, xyxy, out_hw, spatial_scale, output_channels=output_channels,
                               group_size=group_size, batch_indices=i, convention=rules,
                               names=NAMES, n_threads=n_threads)

    def backward(dy, b, i, shape):
        xyxy, i = _tf_numpy.xyxy(b, i, shape[0])
        return core.psroi_pool_backward(dy, xyxy, tuple(shape), spatial_scale,
                                        group_size=group_size, batch_indices=i,
                                        convention=rules, names=NAMES, n_threads=n_threads)

    native = _Native("RoicorePsroiPool", dict(
        pooled_height=out_hw[0], pooled_width=out_hw[1], group_height=gh, group_width=gw,
        spatial_scale=_float_attr(spatial_scale, "spatial_scale"), rules=_rules("psroi_pool")))
    return _apply("psroi_pool", name, images, boxes, box_indices, data_format, n_threads,
                  out_hw, out_channels, native, forward=forward, backward=backward)


@_not_converted
def roi_align(images, boxes, box_indices, output_size, spatial_scale=1.0, sampling_ratio=-1,
              aligned=False, data_format="NHWC", name=None, *, n_threads=None):
    """RoIAlign (Mask R-CNN) of ``images`` (NHWC by default) over ABSOLUTE ``boxes`` [y1, x1, y2, x2].

    ``boxes`` are in input-image pixels (feature pixel = coordinate * ``spatial_scale``)
    with rows [y1, x1, y2, x2] as in TF, ``box_indices`` gives each box's image; the result
    is ``(K, PH, PW, C)`` (NHWC) or ``(K, C, PH, PW)`` (NCHW).  roicore convention "mxnet"
    (Caffe2 sampler, as MXNet ROIAlign and torchvision roi_align for float32).

    Args:
      images: 4-D float16/32/64 tensor, (N, H, W, C) or (N, C, H, W) per ``data_format``.
      boxes: (K, 4) float tensor of [y1, x1, y2, x2] rows.
      box_indices: (K,) int32/int64 tensor in [0, N).
      output_size: int or (PH, PW).
      spatial_scale: feature-map size over image size.
      sampling_ratio: samples per bin and axis; -1 or 0 for ``ceil(bin size)``, which grows
        with the box (a 25 x 25 feature-pixel box pooled to 7 x 7 takes 4 x 4 samples per
        bin) and the cost with it; torchvision's Faster R-CNN passes 2.
      aligned: shift boxes by -0.5 pixel (pixel centres), as Detectron2's ROIAlignV2.
      data_format: "NHWC" (default; transpose copies of input, output and gradients) or
        "NCHW" (no copy).
      name: name scope.
      n_threads: OpenMP threads for roicore (None: its default).

    Returns:
      The pooled tensor.  Gradients flow to ``images`` only.
    """
    return _roi_align("roi_align", images, boxes, box_indices, _size(output_size, "output_size"),
                      spatial_scale, sampling_ratio, aligned, data_format, name, n_threads)


def _roi_align(op, images, boxes, box_indices, out_hw, spatial_scale, sampling_ratio, aligned,
               data_format, name, n_threads):
    """RoIAlign with the convention CONVENTIONS[op] (the Model Garden's pooler runs on it)."""
    core.effective_n_threads(n_threads)
    rules = CONVENTIONS[op]

    def forward(x, b, i, argmax):
        xyxy, i = _tf_numpy.xyxy(b, i, x.shape[0])
        return core.roi_align(x, xyxy, out_hw, spatial_scale, sampling_ratio, aligned,
                              batch_indices=i, convention=rules, names=NAMES, n_threads=n_threads)

    def backward(dy, b, i, shape):
        xyxy, i = _tf_numpy.xyxy(b, i, shape[0])
        return core.roi_align_backward(dy, xyxy, tuple(shape), spatial_scale, sampling_ratio,
                                       aligned, batch_indices=i, convention=rules, names=NAMES,
                                       n_threads=n_threads)

    native = _Native("RoicoreRoiAlign", dict(
        pooled_height=out_hw[0], pooled_width=out_hw[1],
        spatial_scale=_float_attr(spatial_scale, "spatial_scale"),
        sampling_ratio=args.sampling_ratio(sampling_ratio),
        aligned=args.flag(aligned, "aligned"), rules=_rules(op)))
    return _apply(op, name, images, boxes, box_indices, data_format, n_threads,
                  out_hw, _same_channels, native, forward=forward, backward=backward)


# ---------------------------------------------------------------------------------------
# Keras 3 layers

_KERAS_FORMATS = {"channels_last": "NHWC", "channels_first": "NCHW", "NHWC": "NHWC",
                  "NCHW": "NCHW"}


def _keras_data_format(data_format):
    if data_format is None:
        data_format = keras.config.image_data_format()
    if data_format not in _KERAS_FORMATS:
        raise ValueError("data_format must be 'channels_last', 'channels_first', 'NHWC', "
                         f"'NCHW' or None, got {data_format!r}")
    return "channels_last" if _KERAS_FORMATS[data_format] == "NHWC" else "channels_first"


def _batched_boxes(images, boxes):
    """Batched (B, R, 4) boxes as the ops take them: the (B*R, 4) rows, their images (b for
    the R boxes of image b) and a function that gives a (B*R, ...) result the shape
    (B, R, ...)."""
    boxes = tf.convert_to_tensor(boxes, name="boxes")
    rank = boxes.shape.rank
    if rank is not None and (rank != 3 or boxes.shape[2] not in (None, 4)):
        raise ValueError("boxes must be batched, (B, R, 4) [y1, x1, y2, x2], when no "
                         f"box_indices are given (or flat (K, 4) with box_indices), got shape "
                         f"{boxes.shape}")
    images = tf.convert_to_tensor(images, name="images")
    n = images.shape[0] if images.shape.rank else None
    b, r = (boxes.shape[0], boxes.shape[1]) if rank else (None, None)
    if n is not None and b is not None and n != b:
        raise ValueError(f"batched boxes must hold the boxes of each image: images have a "
                         f"batch of {n}, boxes of {b}")
    shape = tf.shape(boxes)
    checks = [] if n is not None and b is not None else [tf.debugging.assert_equal(
        tf.shape(images)[0], shape[0],
        message="batched boxes must hold the boxes of each image: the batch sizes of "
                "images and boxes differ")]
    with tf.control_dependencies(checks):
        indices = tf.repeat(tf.range(shape[0], dtype=tf.int32), shape[1])
    flat = tf.reshape(boxes, [-1, 4])

    def unflatten(y):
        out = tf.reshape(y, tf.concat([shape[:2], tf.shape(y)[1:]], 0))
        out.set_shape([b, r] + y.shape[1:].as_list())
        return out

    return flat, indices, unflatten


class _RoILayer(keras.layers.Layer):
    """Shared plumbing: data_format, get_config, and the two forms of boxes.

    ``layer(images, boxes, box_indices)`` takes flat (K, 4) boxes, each box's image in
    ``box_indices``, and returns (K, ...) as the function does.  ``layer(images, boxes)``
    takes batched (B, R, 4) boxes, row b holding the R boxes of image b, and returns
    (B, R, ...): every input and the output then have the batch dimension first, as
    Keras (``fit``, ``predict``, its input checks) expects.
    """

    _op = None
    _params = ()

    def __init__(self, data_format=None, n_threads=None, **kwargs):
        super().__init__(**kwargs)
        self.data_format = _keras_data_format(data_format)
        core.effective_n_threads(n_threads)
        self.n_threads = n_threads
        self.supports_jit = False  # Keras' jit_compile="auto" then stays off XLA

    def call(self, images, boxes, box_indices=None, training=None):
        if box_indices is not None:
            return self._pool(images, boxes, box_indices, training)
        flat, indices, unflatten = _batched_boxes(images, boxes)
        return unflatten(self._pool(images, flat, indices, training))

    def _pool(self, images, boxes, box_indices, training):
        kwargs = {p: getattr(self, p) for p in self._params}
        return type(self)._op(images, boxes, box_indices, **kwargs,
                              data_format=_KERAS_FORMATS[self.data_format],
                              n_threads=self.n_threads)

    def get_config(self):
        config = super().get_config()
        config.update({p: getattr(self, p) for p in self._params})
        config.update(data_format=self.data_format, n_threads=self.n_threads)
        return config


@keras.saving.register_keras_serializable(package="roicore")
class RoIPool(_RoILayer):
    """Keras layer for :func:`roi_pool`: ``RoIPool(output_size, ...)(images, boxes, [box_indices])``.

    Boxes are ABSOLUTE [y1, x1, y2, x2] for method="max" and normalised as crop_and_resize's
    for method="bilinear" and "nearest"; ``data_format`` is Keras' ("channels_last" by
    default, from ``keras.config.image_data_format()``) or "NHWC"/"NCHW".  Called with
    ``training=False`` in a graph, method="max" keeps no argmax for a gradient (see the
    module docstring).
    """

    _op = staticmethod(roi_pool)
    _params = ("output_size", "spatial_scale", "method", "extrapolation_value")

    def __init__(self, output_size, spatial_scale=1.0, method="max", extrapolation_value=0.0,
                 data_format=None, n_threads=None, **kwargs):
        super().__init__(data_format, n_threads, **kwargs)
        self.output_size = args.pair(output_size, "output_size")
        self.spatial_scale = float(spatial_scale)
        self.method = _method(method)
        self.extrapolation_value = float(extrapolation_value)

    def _pool(self, images, boxes, box_indices, training):
        # training=False (Keras predict / evaluate): in a graph the forward pass computes no
        # argmax; a gradient taken all the same recomputes it.
        return _roi_pool(images, boxes, box_indices, self.output_size, self.spatial_scale,
                         self.method, self.extrapolation_value,
                         _KERAS_FORMATS[self.data_format], None, self.n_threads,
                         graph_argmax=training is not False)


@keras.saving.register_keras_serializable(package="roicore")
class PSRoIPool(_RoILayer):
    """Keras layer for :func:`psroi_pool` (ABSOLUTE [y1, x1, y2, x2] boxes)."""

    _op = staticmethod(psroi_pool)
    _params = ("output_size", "spatial_scale", "output_channels", "group_size")

    def __init__(self, output_size, spatial_scale=1.0, output_channels=None, group_size=None,
                 data_format=None, n_threads=None, **kwargs):
        super().__init__(data_format, n_threads, **kwargs)
        self.output_size = args.pair(output_size, "output_size")
        self.spatial_scale = float(spatial_scale)
        self.output_channels = output_channels
        self.group_size = None if group_size is None else args.pair(group_size, "group_size")


@keras.saving.register_keras_serializable(package="roicore")
class RoIAlign(_RoILayer):
    """Keras layer for :func:`roi_align` (ABSOLUTE [y1, x1, y2, x2] boxes)."""

    _op = staticmethod(roi_align)
    _params = ("output_size", "spatial_scale", "sampling_ratio", "aligned")

    def __init__(self, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False,
                 data_format=None, n_threads=None, **kwargs):
        super().__init__(data_format, n_threads, **kwargs)
        self.output_size = args.pair(output_size, "output_size")
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = sampling_ratio
        self.aligned = aligned


from ._tf_pyramid import multilevel_crop_and_resize  # noqa: E402  (it builds on this module)
