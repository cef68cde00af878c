"""roicore.adapters.tf's fallback: roicore.core called through ``tf.numpy_function``.

Used when the native op library is not available (see roicore.adapters.tf).  Images are
NCHW here (the caller transposes), boxes TF's [y1, x1, y2, x2] rows.

* Eagerly, on CPU tensors: roicore.core is called directly, on NumPy views of the tensors
  (``np.asarray``, no copy), and the results become tensors through DLPack (no copy; TF
  needs them 64-byte aligned, so the gradient of ``images``, which roicore.core allocates,
  is copied once).  When no ``GradientTape`` records the images (or, for ops with a box
  gradient, the boxes), no gradient can be asked for, so ``roi_pool(method="max")``
  computes no argmax.
* In a graph (``tf.function``, Keras ``fit``/``predict``): through ``tf.numpy_function``,
  which hands the inputs over without a copy and keeps the outputs without a copy too, as
  the results are allocated 64-byte aligned.  ``roi_pool(method="max")`` computes its
  argmax here, as the same traced graph serves inference and, when a tape watches the
  call, training; a Keras layer called with ``training=False`` computes none, and a
  gradient asked for all the same recomputes it.

A SavedModel cannot hold the Python function a numpy_function calls, and XLA cannot
compile one: :func:`refuse_export` says so while tracing.
"""
from __future__ import annotations

import contextlib

import numpy as np

from roicore.core import args
from roicore.core.args import ALIGNMENT

from ._tf_common import may_record, on_host, tf

try:  # private TF module: used only to refuse an export with a clear message
    from tensorflow.python.saved_model.save_context import in_save_context as _in_save
except ImportError:  # pragma: no cover - older/newer TF layouts
    _in_save = None


def refuse_export(op):
    """Refuse a SavedModel export (tf.saved_model.save, Keras Model.export) while tracing."""
    if not tf.executing_eagerly() and _in_save is not None and _in_save():
        raise NotImplementedError(
            f"roicore.adapters.tf.{op} cannot be exported to a SavedModel (tf.saved_model.save, "
            "Keras Model.export) without its native op library: it runs roicore's kernels "
            "through tf.numpy_function, whose Python code a SavedModel cannot hold. Save Keras "
            "models as .keras files instead.")


def run(op, x, boxes, box_indices, out_shape, forward, backward, with_argmax=False,
        graph_argmax=True, boxes_backward=None):
    """The op on NCHW images ``x``, returning NCHW.

    ``forward(x, boxes, box_indices, argmax)`` runs on NumPy arrays and returns y, or
    (y, argmax) when asked for one (ops ``with_argmax``); ``backward(dy, boxes,
    box_indices, x_shape, *saved)`` returns dx; ``boxes_backward(dy, x, boxes,
    box_indices)``, for ops that have one, the gradient of the boxes.
    ``graph_argmax=False``: in a graph the forward pass computes no argmax, and a
    gradient, should one be asked for all the same, recomputes it.
    """
    if _eager_on_host(x, boxes, box_indices):
        # the core's result already has exactly the output's shape
        return _eager(op, x, boxes, box_indices, forward, backward, with_argmax, boxes_backward)
    y = _graph(op, x, boxes, box_indices, out_shape, forward, backward, with_argmax,
               graph_argmax, boxes_backward)
    y.set_shape(out_shape)
    return y


# ---------------------------------------------------------------------------------------
# Run-time checks and layout (inside tf.numpy_function, on NumPy arrays)

def xyxy(boxes, box_indices, n_images):
    """TF's boxes and box_indices as roicore.core takes them: [x1, y1, x2, y2] rows (in the
    boxes' dtype) and int64 batch indices, checked against the batch by the C API."""
    b = np.asarray(boxes)
    xyxy = args.boxes_from_yx(b, b.dtype if b.dtype in (np.float32, np.float64) else np.float64)
    return xyxy, args.batch_from_indices(box_indices, xyxy.shape[0], n_images, name="box_indices")


_HOST_DEVICE = []


def _host_device():
    """The device of tensors made from NumPy arrays through DLPack."""
    if not _HOST_DEVICE:
        _HOST_DEVICE.append(tf.experimental.dlpack.from_dlpack(
            np.zeros(1, np.float32).__dlpack__()).device)
    return _HOST_DEVICE[0]


def _eager_on_host(*tensors):
    return tf.executing_eagerly() and all(t.device == _host_device() for t in tensors)


def _to_tensor(a):
    """An eager tensor sharing NumPy array ``a``'s memory (DLPack) when it is 64-byte
    aligned, else a copy.  TF's from_dlpack accepts unaligned memory, but its kernels then
    abort the process (``Check failed: IsAligned()``).  roicore.core's outputs are aligned
    (its ALIGNMENT is TF's EIGEN_MAX_ALIGN_BYTES); float16 results may not be."""
    if (a.size and a.flags.c_contiguous and a.flags.writeable
            and a.__array_interface__["data"][0] % ALIGNMENT == 0):  # (.ctypes is slower)
        return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    return tf.convert_to_tensor(a)


@contextlib.contextmanager
def _op_errors():
    """roicore.core's complaints about the tensors' values as the InvalidArgumentError a TF
    op (and this op in a graph, through numpy_function) raises."""
    try:
        yield
    except ValueError as exc:
        raise tf.errors.InvalidArgumentError(None, None, str(exc)) from None


def _eager(op, x, boxes, box_indices, forward, backward, with_argmax, boxes_backward):
    """Eager, on the host: the core on zero-copy NumPy views of the tensors.  Without a tape
    recording x (or, for ops with a box gradient, the boxes) no gradient can be asked for:
    no custom gradient, no argmax.  Otherwise what the backward needs (the argmax) stays a
    NumPy array in the gradient's closure."""
    xa, ba, ia = np.asarray(x), np.asarray(boxes), np.asarray(box_indices)
    boxes_backward = boxes_backward if boxes_backward and may_record(boxes) else None
    if not (may_record(x) or boxes_backward):
        with _op_errors():
            return _to_tensor(forward(xa, ba, ia, False))

    @tf.custom_gradient
    def _op(x, boxes, box_indices):
        with _op_errors():
            res = forward(xa, ba, ia, with_argmax)
        y, *saved = res if with_argmax else (res,)
        shape = np.array(xa.shape, np.int64)

        def grad(dy):
            dy = on_host(dy, "the gradient")
            if not _eager_on_host(dy):  # pragma: no cover - a gradient taken outside eager mode
                return _graph_gradients(op, dy, x, boxes, box_indices, backward,
                                        boxes_backward, saved)
            g = np.asarray(dy)
            with _op_errors():
                dx = _to_tensor(backward(g, ba, ia, shape, *saved))
                db = None if boxes_backward is None else tf.cast(
                    _to_tensor(boxes_backward(g, xa, ba, ia)), boxes.dtype)
            return dx, db, None

        return _to_tensor(y), grad

    return _op(x, boxes, box_indices)


def _graph_gradients(op, dy, x, boxes, box_indices, backward, boxes_backward, saved):
    """The gradients of x and (when the op has one) of the boxes, as numpy_function ops:
    a graph runs only the one that something uses."""
    shape = tf.shape(x, out_type=tf.int64)
    dx = tf.numpy_function(backward, [dy, boxes, box_indices, shape, *saved], x.dtype,
                           stateful=False, name=op + "_grad")
    dx.set_shape(x.shape)
    if boxes_backward is None:
        return dx, None, None
    db = tf.numpy_function(boxes_backward, [dy, x, boxes, box_indices], x.dtype,
                           stateful=False, name=op + "_grad_boxes")
    db.set_shape(boxes.shape)
    return dx, tf.cast(db, boxes.dtype), None


def _graph(op, x, boxes, box_indices, out_shape, forward, backward, with_argmax,
           graph_argmax=True, boxes_backward=None):
    """In a graph (or off the host): tf.numpy_function.  The argmax is computed by the
    forward pass unless ``graph_argmax`` is False; then a gradient recomputes it."""
    saving = with_argmax and graph_argmax

    @tf.custom_gradient
    def _op(x, boxes, box_indices):
        def forward_saving(x, b, i):
            return forward(x, b, i, saving)  # 64-byte aligned: TF keeps it uncopied

        dtypes = [x.dtype, tf.int32] if saving else [x.dtype]
        y, *saved = tf.numpy_function(forward_saving, [x, boxes, box_indices], dtypes,
                                      stateful=False, name=op)
        y.set_shape(out_shape)

        def recompute_and_backward(dy, b, i, shape, x):
            return backward(dy, b, i, shape, forward(x, b, i, True)[1])

        def grad(dy):
            dy = on_host(dy, "the gradient")
            if with_argmax and not saving:
                shape = tf.shape(x, out_type=tf.int64)
                dx = tf.numpy_function(recompute_and_backward, [dy, boxes, box_indices, shape, x],
                                       x.dtype, stateful=False, name=op + "_grad")
                dx.set_shape(x.shape)
                return dx, None, None
            return _graph_gradients(op, dy, x, boxes, box_indices, backward, boxes_backward,
                                    saved)

        return y, grad

    return _op(x, boxes, box_indices)
