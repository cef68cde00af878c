"""roicore's TensorFlow op library: built once per TensorFlow version, loaded by each process.

The library (``tf_ops.cc``) registers roicore's operators and their gradients as
TensorFlow ops with CPU kernels on roicore's C library.  It must be compiled against the
headers of the TensorFlow that loads it, so it is built the first time it is needed,
into the cache of :mod:`roicore.adapters.native.build`, keyed by TensorFlow's version and
compile and link flags (which carry its C++ ABI), roicore's version and the contents of
the sources, the C library and its header.  Importing ``roicore.adapters.tf`` calls
:func:`load`, so later processes load the cached file, and a SavedModel holding these ops
loads after that import.

``python -m roicore.adapters.native.tf`` builds it and prints its path, e.g. to build it
in a container image, or to find the file to ship beside a SavedModel for a serving
process without roicore (which loads it with ``tf.load_op_library``).

Environment:
  ROICORE_TF_OP_LIBRARY  load this library file instead of building one (a machine with
                         no compiler can use one built elsewhere for the same TensorFlow)
"""
from __future__ import annotations

import os
import pathlib
import threading

import tensorflow as tf
from tensorflow.python.framework import op_def_registry

from .._tf_common import may_record, on_host
from . import build

__all__ = ["library_path", "load", "call", "gradients", "SOURCE"]

SOURCE = pathlib.Path(__file__).with_name("tf_ops.cc")
PURPOSE = "roicore's TensorFlow op library"

_lock = threading.Lock()
_loaded = {}


def _c_library():
    """(include directory, link arguments, files the build reads) of roicore's C library."""
    from roicore import core
    include = pathlib.Path(core.get_include())
    library_dir = pathlib.Path(core.get_library_dir())
    return include, list(core.get_link_args()), [include / "roicore.h",
                                                  library_dir / "libroicore.a"]


def library_path() -> pathlib.Path:
    """The op library for the running TensorFlow: ``ROICORE_TF_OP_LIBRARY`` when set,
    else the cached build, compiled now if there is none (raises
    :class:`~roicore.adapters.native.build.NativeBuildError` when it cannot be)."""
    given = os.environ.get("ROICORE_TF_OP_LIBRARY")
    if given:
        return pathlib.Path(given)
    from roicore import core
    include, link_args, depends = _c_library()
    compile_flags = tf.sysconfig.get_compile_flags()
    link_flags = tf.sysconfig.get_link_flags()
    key = {"tensorflow": tf.__version__, "tensorflow_compile_flags": compile_flags,
           "tensorflow_link_flags": link_flags, "roicore": core.__version__}
    return build.build_shared_library(
        "roicore_tf_ops", [SOURCE], key=key,
        compile_args=[*compile_flags, f"-I{include}", "-DNDEBUG"],
        link_args=[*link_args, *link_flags], depends=depends, purpose=PURPOSE)


def load():
    """The loaded op library (``tf.load_op_library``'s module), built first if needed;
    every later call returns the same module."""
    with _lock:
        if "module" not in _loaded:
            path = str(library_path())
            _loaded["module"] = tf.load_op_library(path)
            _loaded["shared_runtime"] = build.share_runtime(path)
        return _loaded["module"]


# ---------------------------------------------------------------------------------------
# Gradients.  Each forward op's gradient is registered with tf.RegisterGradient, so the raw
# ops differentiate in any process that imported this module; call() also wraps the op in
# tf.custom_gradient, because a SavedModel keeps custom gradients (as functions of the
# gradient ops) and so differentiates in a process that has loaded only the op library.

# forward op -> (its function in the loaded module, its image gradient's function and the
# gradient's attributes besides rules, data_format and n_threads)
_OPS = {
    "RoicoreRoiPoolMax": ("roicore_roi_pool_max", "roicore_roi_pool_max_grad", ()),
    "RoicoreCropAndResize": ("roicore_crop_and_resize", "roicore_crop_and_resize_grad_image",
                             ("method",)),
    "RoicorePsroiPool": ("roicore_psroi_pool", "roicore_psroi_pool_grad",
                         ("group_height", "group_width", "spatial_scale")),
    "RoicoreRoiAlign": ("roicore_roi_align", "roicore_roi_align_grad",
                        ("spatial_scale", "sampling_ratio", "aligned")),
}
_COMMON_ATTRS = ("rules", "data_format", "n_threads")


def gradients(op_type, attrs, dy, images, boxes, box_indices, argmax=None, boxes_wanted=True):
    """(d images, d boxes) of forward op ``op_type`` with attributes ``attrs`` for the
    upstream gradient ``dy``; d boxes is None for the ops whose boxes get no gradient (and
    when not ``boxes_wanted``).  RoicoreRoiPoolMax takes its forward's ``argmax``, or
    recomputes it when None."""
    library = load()
    dy = on_host(dy, "the gradient")
    _, image_grad, names = _OPS[op_type]
    grad_attrs = {name: attrs[name] for name in (*names, *_COMMON_ATTRS)}
    size = tf.shape(images, out_type=tf.int32)
    if op_type == "RoicoreRoiPoolMax":
        if argmax is None:
            argmax = library.roicore_roi_pool_max(images, boxes, box_indices,
                                                  **{**attrs, "compute_argmax": True}).argmax
        return library.roicore_roi_pool_max_grad(dy, argmax, box_indices, size,
                                                 **grad_attrs), None
    dx = getattr(library, image_grad)(dy, boxes, box_indices, size, **grad_attrs)
    if op_type != "RoicoreCropAndResize" or not boxes_wanted:
        return dx, None
    return dx, library.roicore_crop_and_resize_grad_boxes(dy, images, boxes, box_indices,
                                                          **grad_attrs)


def _register_gradient(op_type):
    @tf.RegisterGradient(op_type)
    def _gradient(op, dy, *unused_argmax_gradient):
        attrs = {a.name: op.get_attr(a.name) for a in op_def_registry.get(op.type).attr
                 if a.type != "type"}
        argmax = op.outputs[1] if attrs.get("compute_argmax") else None
        skipped = getattr(op, "skip_input_indices", None) or ()  # eager: inputs not watched
        dx, db = gradients(op.type, attrs, dy, *op.inputs, argmax, boxes_wanted=1 not in skipped)
        return dx, db, None


for _op_type in _OPS:
    _register_gradient(_op_type)


def call(op_type, images, boxes, box_indices, attrs, boxes_differentiable=False):
    """Forward op ``op_type`` on the inputs, differentiable: with a gradient for the images,
    and for the boxes when ``boxes_differentiable``.  Eagerly, when no tape records the
    inputs, the op runs bare (and RoicoreRoiPoolMax computes no argmax)."""
    forward = getattr(load(), _OPS[op_type][0])
    max_pool = op_type == "RoicoreRoiPoolMax"
    eager = tf.executing_eagerly()
    boxes_wanted = boxes_differentiable and (not eager or may_record(boxes))
    if eager and not (boxes_wanted or may_record(images)):
        out = forward(images, boxes, box_indices,
                      **({**attrs, "compute_argmax": False} if max_pool else attrs))
        return out.output if max_pool else out

    @tf.custom_gradient
    def op(x, b, i):
        out = forward(x, b, i, **attrs)
        y, argmax = (out.output, out.argmax if attrs.get("compute_argmax", True) else None) \
            if max_pool else (out, None)

        def grad(dy):
            return (*gradients(op_type, attrs, dy, x, b, i, argmax, boxes_wanted), None)

        return y, grad

    return op(images, boxes, box_indices)


if __name__ == "__main__":
    print(library_path())
