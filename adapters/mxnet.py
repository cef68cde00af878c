"""MXNet front end: ``ROIPooling``, ``PSROIPooling`` and ``ROIAlign`` as drop-in replacements
for ``mx.nd.ROIPooling``, ``mx.nd.contrib.PSROIPooling`` and ``mx.nd.contrib.ROIAlign``.

Swap a call by changing the import alone::

    from roicore.adapters.mxnet import ROIPooling        # instead of mx.nd.ROIPooling
    y = ROIPooling(data, rois, pooled_size=(7, 7), spatial_scale=1 / 16)

Positional order and keyword names are MXNet's; ``n_threads`` (OpenMP threads of the core,
see :func:`roicore.core.effective_n_threads`; results never depend on it) comes last and is
keyword-only; ``None`` means ``OMP_NUM_THREADS``, else every CPU (mxnet's import sets the
importing thread's OpenMP thread count to 1, which the adapter does not follow: MXNet's own
operators run on its engine threads with all cores).  ``rois`` are ``(R, 5)`` rows
``[batch, x1, y1, x2, y2]`` in image pixels.  The numbers are roicore.core's with
``convention="mxnet"``: bit-identical to MXNet 1.9.1's CPU kernels for float32 and float64,
including the global-index argmax of ROIPooling's hidden ``maxidx`` output.
float16 is computed in float32 (MXNet computes in half).

Three ways in, one computation:

* NDArray inputs: an ``mx.autograd.Function``, so ``mx.autograd.record()`` /
  ``backward()`` give the gradient of ``data``; ``rois`` get a zero gradient, as in MXNet.
  Outside ``record()`` no gradient can be asked for: the core is called directly and
  ROIPooling computes no argmax (MXNet's hidden ``maxidx``, which only its backward reads).
* Symbol inputs (``mx.sym`` graphs, and a hybridized ``HybridBlock``, whose
  ``hybrid_forward`` receives Symbols): a registered ``mx.operator.CustomOp``
  (op types ``roicore_ROIPooling``, ``roicore_PSROIPooling``, ``roicore_ROIAlign``), used
  through ``mx.sym.Custom``.  ROIPooling's CustomOp has MXNet's hidden second output
  ``maxidx`` (int32) and the function returns the first output only, as MXNet does.
* ``out=``: as in MXNet, an NDArray to write the result into (written in place when it
  is a CPU NDArray of data's float32/float64 dtype, else copied);
  ``ROIPooling(..., out=[y, maxidx])`` also fills ``maxidx`` (a copy).  Not under autograd
  recording.

Validation beyond roicore.core's (which checks shapes, dtypes, batch indices and
coordinates, and raises ValueError/TypeError before any kernel runs):

* ``spatial_scale`` must lie in MXNet's declared range [0, 1]; above 1 raises ValueError
  ("exceeds bound [0, 1]", MXNet's "exceed bound" error).  0, which MXNet accepts and which
  collapses every box to pixel (0, 0), is rejected by the core ("must be positive").
* ``rois`` must be 2-D with 5 columns, as MXNet requires.
* Differences from MXNet, all on inputs MXNet mishandles: a batch index outside [0, N)
  raises ValueError (MXNet ROIPooling returns 0, ROIAlign writes into another RoI's output
  and leaves its own unwritten, PSROIPooling reads out of bounds); PSROIPooling checks that
  data has ``output_dim * group_size**2`` channels (MXNet reads out of bounds or ignores
  extra channels); ROIAlign with ``aligned=True`` and a box of size <= 0 returns 0 (MXNet
  aborts the process); ``rois`` of another float dtype than ``data`` are cast to it (MXNet
  raises).
* ``ROIAlign(position_sensitive=True)`` is not implemented (roicore.core has no
  position-sensitive RoIAlign) and raises NotImplementedError.

Copies: on CPU, NDArrays are handed to the core and results handed back through DLPack
(``mx.nd.to_dlpack_for_read`` / ``np.from_dlpack``, ``ndarray.__dlpack__`` /
``mx.nd.from_dlpack``) without copying; inputs on another device go through
``asnumpy()`` and ``mx.nd.array(..., ctx=...)``.  The CustomOp path writes the result
straight into the buffer MXNet allocated for it (float32/float64 with ``req="write"``;
otherwise, and for ROIPooling's ``maxidx``, one copy through ``CustomOp.assign``); the
gradient is copied once into MXNet's gradient buffer.

Importing this module imports mxnet.  MXNet 1.9.1 reads NumPy names that NumPy 1.24 and
2.x removed (``np.bool``, ``np.PZERO``, ...); the missing ones are set for the duration of
``import mxnet`` and removed again, so NumPy is left as it was found.

Maintenance only: MXNet is retired.
"""
from __future__ import annotations

import ast
import math
import numbers
import sys
import threading

import numpy as np

import roicore.core as core

from ._common import require

__all__ = ["ROIPooling", "PSROIPooling", "ROIAlign"]


def _numpy_stub(name):
    def stub(*args, **kwargs):
        raise NotImplementedError(f"numpy.{name} was removed from NumPy; this placeholder only "
                                  "lets mxnet 1.9.1 import")
    stub.__name__ = name
    return stub


def _numpy_aliases():
    """Names mxnet 1.9.1 reads from NumPy at import time, for NumPy versions that lack them."""
    aliases = {
        "bool": bool,  # removed in NumPy 1.24 (mxnet/numpy/utils.py)
        # removed in NumPy 2.0 (mxnet/numpy/utils.py, mxnet/numpy/fallback.py)
        "PZERO": 0.0, "NZERO": -0.0, "PINF": math.inf, "NINF": -math.inf,
        "NAN": math.nan, "NaN": math.nan, "Inf": math.inf,
        "alltrue": np.all, "sometrue": np.any, "product": np.prod, "round_": np.round,
        "msort": lambda a: np.sort(a, axis=0),
        "in1d": getattr(np, "isin"),
        "trapz": getattr(np, "trapezoid", None) or _numpy_stub("trapz"),
    }
    for name in ("mirr", "npv", "pmt", "ppmt", "pv", "rate"):  # gone since NumPy 1.20
        aliases[name] = _numpy_stub(name)
    return aliases


def _import_mxnet():
    """Import mxnet, adding the NumPy names it needs only while it imports."""
    if sys.modules.get("mxnet") is not None:
        return sys.modules["mxnet"]
    namespace = vars(np)
    added = {name: value for name, value in _numpy_aliases().items() if name not in namespace}
    for name, value in added.items():
        setattr(np, name, value)
    try:
        try:
            return require("mxnet", "mxnet")
        except AttributeError as exc:  # a NumPy name this list does not know yet
            raise ImportError(
                f"roicore.adapters.mxnet could not import mxnet under NumPy {np.__version__} "
                f"({exc}); MXNet 1.9.1 is known to work with NumPy 1.23-2.4"
            ) from exc
    finally:
        for name, value in added.items():
            if namespace.get(name) is value:
                delattr(np, name)


mx = _import_mxnet()


def _default_n_threads():
    """roicore's default thread count as a thread MXNet has not touched sees it.

    Importing mxnet (without OMP_NUM_THREADS) calls omp_set_num_threads(1) on the importing
    thread, which would make ``n_threads=None`` mean 1 thread in every imperative call;
    MXNet's own operators run on engine threads with all cores.  A new thread starts from
    the process-wide initial setting (OMP_NUM_THREADS, else the CPU count).
    """
    result = []
    worker = threading.Thread(target=lambda: result.append(core.effective_n_threads(None)))
    worker.start()
    worker.join()
    return result[0]


_DEFAULT_N_THREADS = _default_n_threads()


# ------------------------------------------------------------------------------ conversion
def _as_numpy(a):
    """A NumPy view of a CPU NDArray (read-only, no copy); a copy for other devices."""
    if a.context.device_type == "cpu" and a.stype == "default" and a.size:
        return np.from_dlpack(_DLPackReader(a))
    return a.asnumpy()


class _DLPackReader:
    """What np.from_dlpack expects (mxnet 1.9 NDArrays have no __dlpack__)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        return mx.nd.to_dlpack_for_read(self.array)  # waits for pending writes

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class _DLPackWriter(_DLPackReader):
    __slots__ = ()

    def __dlpack__(self, stream=None):
        return mx.nd.to_dlpack_for_write(self.array)  # waits for pending reads and writes


class _WritableView:
    """Exposes a read-only array's memory as writable (np.asarray(view)); keeps it alive."""

    __slots__ = ("__array_interface__", "_owner")

    def __init__(self, array):
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface
        self._owner = array


def _output_view(a, dtype):
    """A writable NumPy view of NDArray ``a`` for the core's ``out=``, or None when ``a``
    cannot be written in place (not a dense CPU array of ``dtype``, float32 or float64)."""
    if (a.context.device_type != "cpu" or a.stype != "default" or not a.size
            or a.dtype != dtype or a.dtype not in (np.float32, np.float64)):
        return None
    view = np.asarray(_WritableView(np.from_dlpack(_DLPackWriter(a))))
    return view if view.flags.c_contiguous else None


def _as_ndarray(a, ctx):
    """An NDArray on ``ctx`` holding NumPy array ``a`` (shared, not copied, on CPU)."""
    if ctx.device_type == "cpu" and a.size and a.flags.c_contiguous and a.flags.writeable:
        return mx.nd.from_dlpack(a.__dlpack__())
    return mx.nd.array(a, ctx=ctx, dtype=a.dtype)


# ------------------------------------------------------------------------------ validation
def _check_scale(spatial_scale):
    if isinstance(spatial_scale, (bool, np.bool_)) or not isinstance(spatial_scale, numbers.Real):
        raise TypeError(f"spatial_scale must be a real number, got "
                        f"{type(spatial_scale).__name__}")
    if not 0 <= spatial_scale <= 1:
        raise ValueError(f"spatial_scale={spatial_scale!r} exceeds bound [0, 1] (MXNet's range "
                         "for this parameter: feature-map size over image size)")
    return float(spatial_scale)


def _check_rois_shape(shape):
    if len(shape) != 2 or shape[1] != 5:
        raise ValueError(f"rois must have shape (R, 5) [batch, x1, y1, x2, y2], got shape "
                         f"{tuple(shape)}")


def _check_inputs(data, rois, op):
    mod = mx.nd.NDArray
    if not isinstance(data, mod) or not isinstance(rois, mod):
        raise TypeError(f"{op} takes data and rois as both mx.nd.NDArray or both mx.sym.Symbol, "
                        f"got {type(data).__name__} and {type(rois).__name__}")
    _check_rois_shape(rois.shape)


def _threads(n_threads):
    if n_threads is None:
        return _DEFAULT_N_THREADS
    core.effective_n_threads(n_threads)  # validate now, not at the first forward
    return n_threads


def _pair(pooled_size):
    if pooled_size is None:
        raise TypeError("pooled_size is required")
    return tuple(pooled_size) if isinstance(pooled_size, (tuple, list)) else (pooled_size,) * 2


def _parse(value):
    """A CustomOpProp attribute (MXNet passes them as strings) back to a Python value."""
    return ast.literal_eval(value) if isinstance(value, str) else value


def _write_out(out, op, params, data, rois):
    """Forward into MXNet-style ``out=``: an NDArray, or [output, maxidx] for ROIPooling."""
    if mx.autograd.is_recording():
        raise ValueError(f"{op}: out= is not supported under mx.autograd.record(); use the "
                         "returned NDArray")
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not 1 <= len(outs) <= (2 if op == "ROIPooling" else 1):
        raise ValueError(f"{op}: out must be an NDArray"
                         + (" or a list [output, maxidx]" if op == "ROIPooling" else ""))
    x, r = _as_numpy(data), _as_numpy(rois)
    view = _output_view(outs[0], x.dtype) if isinstance(outs[0], mx.nd.NDArray) else None
    if view is not None and (np.shares_memory(view, x) or np.shares_memory(view, r)):
        view = None  # out aliases an input: compute first, then copy
    results = _OPS[op][0](params, x, r, out=view, argmax=len(outs) > 1)
    for i, (dst, src) in enumerate(zip(outs, results)):
        if i or view is None:
            dst[:] = src
    return out


# ------------------------------------------------------------------------------ core calls
# Each op is (forward(params, x, rois, out, argmax) -> outputs,
#             backward(params, dy, rois, x_shape, outputs)).
# ``out``: None or the array to write the output into; ``argmax``: whether ROIPooling also
# returns its argmax (MXNet's maxidx, needed by its backward only).
def _roi_pool_forward(p, x, rois, out=None, argmax=True):
    res = core.roi_pool(x, rois, p["pooled_size"], p["spatial_scale"], convention="mxnet",
                        return_argmax=argmax, n_threads=p["n_threads"], out=out)
    return res if argmax else (res,)


def _roi_pool_backward(p, dy, rois, x_shape, outputs):
    return core.roi_pool_backward(dy, rois, x_shape, p["spatial_scale"], convention="mxnet",
                                  argmax=outputs[1], n_threads=p["n_threads"])


def _psroi_forward(p, x, rois, out=None, argmax=True):
    return (core.psroi_pool(x, rois, p["pooled_size"], p["spatial_scale"],
                            output_channels=p["output_dim"], group_size=p["group_size"] or None,
                            convention="mxnet", n_threads=p["n_threads"], out=out),)


def _psroi_backward(p, dy, rois, x_shape, outputs):
    return core.psroi_pool_backward(dy, rois, x_shape, p["spatial_scale"],
                                    group_size=p["group_size"] or None, convention="mxnet",
                                    n_threads=p["n_threads"])


def _align_forward(p, x, rois, out=None, argmax=True):
    return (core.roi_align(x, rois, p["pooled_size"], p["spatial_scale"], p["sample_ratio"],
                           p["aligned"], convention="mxnet", n_threads=p["n_threads"], out=out),)


def _align_backward(p, dy, rois, x_shape, outputs):
    return core.roi_align_backward(dy, rois, x_shape, p["spatial_scale"], p["sample_ratio"],
                                   p["aligned"], convention="mxnet", n_threads=p["n_threads"])


_OPS = {
    "ROIPooling": (_roi_pool_forward, _roi_pool_backward),
    "PSROIPooling": (_psroi_forward, _psroi_backward),
    "ROIAlign": (_align_forward, _align_backward),
}


# ------------------------------------------------------------------------------ imperative
class _Function(mx.autograd.Function):
    """One recorded call: forward in the core, backward in the core, zero rois gradient.

    MXNet's Function.__call__ leaves each recorded Function in a reference cycle (its
    ctypes callbacks close over it), so this object lives until Python's cyclic collector
    runs, which in a loop of large calls can be many iterations later.  ROIPooling's argmax
    is as large as its output (1.6 GB of output and argmax at c4_14x14), so the backward
    releases it; a second backward through a retained graph recomputes it from the saved
    input, bit for bit the forward's."""

    def __init__(self, op, params):
        super().__init__()
        self._forward, self._backward = _OPS[op]
        self._params = params

    def forward(self, data, rois):
        outputs = self._forward(self._params, _as_numpy(data), _as_numpy(rois), argmax=True)
        self._outputs = outputs[1:]  # ROIPooling's argmax (NumPy, owned here)
        self._x_shape = data.shape
        # the input only where the backward may have to recompute an argmax
        self.save_for_backward(rois, *([data] if self._outputs else []))
        return _as_ndarray(outputs[0], data.context)

    def backward(self, dy):
        rois, *data = self.saved_tensors
        outputs = self._outputs
        if outputs is None:  # released by an earlier backward (retain_graph=True)
            outputs = self._forward(self._params, _as_numpy(data[0]), _as_numpy(rois),
                                    argmax=True)[1:]
        if outputs:
            self._outputs = None
        dx = self._backward(self._params, _as_numpy(dy), _as_numpy(rois), self._x_shape,
                            (None,) + tuple(outputs))
        return _as_ndarray(dx, dy.context), mx.nd.zeros_like(rois)


def _call(op, data, rois, params, out, name):
    if isinstance(data, mx.sym.Symbol) or isinstance(rois, mx.sym.Symbol):
        if out is not None:
            raise ValueError(f"{op}: out= applies to NDArray inputs only")
        attrs = {k: repr(v) for k, v in params.items()}
        sym = mx.sym.Custom(data, rois, op_type=f"roicore_{op}", name=name, **attrs)
        return sym[0] if op == "ROIPooling" else sym
    _check_inputs(data, rois, op)
    if out is not None:
        return _write_out(out, op, params, data, rois)
    if not mx.autograd.is_recording():  # no gradient can be asked for: no argmax either
        y = _OPS[op][0](params, _as_numpy(data), _as_numpy(rois), argmax=False)[0]
        return _as_ndarray(y, data.context)
    return _Function(op, params)(data, rois)


# ------------------------------------------------------------------------------ public API
def ROIPooling(data=None, rois=None, pooled_size=None, spatial_scale=None, out=None, name=None,
               *, n_threads=None):
    """RoI max pooling, as ``mx.nd.ROIPooling`` / ``mx.sym.ROIPooling``.

    data : NDArray or Symbol (N, C, H, W); rois : (R, 5) [batch, x1, y1, x2, y2].
    pooled_size : (PH, PW); spatial_scale : float in (0, 1].
    Returns (R, C, PH, PW).  The gradient goes to the max of each bin (first maximum in
    row-major order); empty bins give 0 and no gradient.
    """
    params = {"pooled_size": _pair(pooled_size), "spatial_scale": _check_scale(spatial_scale),
              "n_threads": _threads(n_threads)}
    return _call("ROIPooling", data, rois, params, out, name)


def PSROIPooling(data=None, rois=None, spatial_scale=None, output_dim=None, pooled_size=None,
                 group_size=0, out=None, name=None, *, n_threads=None):
    """Position-sensitive RoI average pooling (R-FCN), as ``mx.nd.contrib.PSROIPooling``.

    data : (N, output_dim * G * G, H, W) with G = group_size, or pooled_size when 0.
    Returns (R, output_dim, pooled_size, pooled_size).
    """
    params = {"spatial_scale": _check_scale(spatial_scale), "output_dim": output_dim,
              "pooled_size": pooled_size, "group_size": group_size,
              "n_threads": _threads(n_threads)}
    return _call("PSROIPooling", data, rois, params, out, name)


def ROIAlign(data=None, rois=None, pooled_size=None, spatial_scale=None, sample_ratio=-1,
             position_sensitive=False, aligned=False, out=None, name=None, *, n_threads=None):
    """RoIAlign (Mask R-CNN), as ``mx.nd.contrib.ROIAlign``.

    sample_ratio : samples per bin axis, -1 or 0 for ``ceil(bin size)``.
    aligned : shift boxes by half a pixel (pixel centres), MXNet's ``aligned``.
    position_sensitive : only False is supported.
    Returns (R, C, PH, PW).
    """
    if position_sensitive:
        raise NotImplementedError("ROIAlign(position_sensitive=True) is not implemented: "
                                  "roicore.core has no position-sensitive RoIAlign")
    params = {"pooled_size": _pair(pooled_size), "spatial_scale": _check_scale(spatial_scale),
              "sample_ratio": sample_ratio, "aligned": aligned, "n_threads": _threads(n_threads)}
    return _call("ROIAlign", data, rois, params, out, name)


# ------------------------------------------------------------------------------ symbolic
class _CustomOp(mx.operator.CustomOp):
    def __init__(self, op, params):
        super().__init__()
        self._op = op
        self._forward, self._backward = _OPS[op]
        self._params = params

    def forward(self, is_train, req, in_data, out_data, aux):
        # maxidx is computed even when not is_train: under record(train_mode=False) MXNet
        # still runs the backward, and nothing here tells whether it will.
        x = _as_numpy(in_data[0])
        view = _output_view(out_data[0], x.dtype) if req[0] == "write" else None
        results = self._forward(self._params, x, _as_numpy(in_data[1]), out=view, argmax=True)
        for i, (dst, r, src) in enumerate(zip(out_data, req, results)):
            if i or view is None:
                self.assign(dst, r, _as_ndarray(src, dst.context))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        outputs = (None,) + tuple(_as_numpy(o) for o in out_data[1:])
        dx = self._backward(self._params, _as_numpy(out_grad[0]), _as_numpy(in_data[1]),
                            in_grad[0].shape, outputs)
        self.assign(in_grad[0], req[0], _as_ndarray(dx, in_grad[0].context))
        self.assign(in_grad[1], req[1], 0)


class _Prop(mx.operator.CustomOpProp):
    op = None

    def __init__(self, **attrs):
        super().__init__(need_top_grad=True)
        self._params = {k: _parse(v) for k, v in attrs.items()}

    def list_arguments(self):
        return ["data", "rois"]

    def list_outputs(self):
        return ["output"]

    def _out_shape(self, data_shape, rois_shape):
        raise NotImplementedError

    def infer_shape(self, in_shape):
        data_shape, rois_shape = in_shape
        if len(data_shape) != 4:
            raise ValueError(f"{self.op}: data must be a 4-D (N, C, H, W) tensor, got shape "
                             f"{tuple(data_shape)}")
        _check_rois_shape(rois_shape)
        out = self._out_shape(data_shape, rois_shape)
        return [data_shape, rois_shape], [out] * len(self.list_outputs()), []

    def infer_type(self, in_type):
        dtype = in_type[0]
        return [dtype, dtype], [dtype], []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0], in_data[1]]

    def create_operator(self, ctx, shapes, dtypes):
        return _CustomOp(self.op, self._params)


@mx.operator.register("roicore_ROIPooling")
class _ROIPoolingProp(_Prop):
    op = "ROIPooling"

    def list_outputs(self):
        return ["output", "maxidx"]

    def _out_shape(self, data_shape, rois_shape):
        return [rois_shape[0], data_shape[1], *self._params["pooled_size"]]

    def infer_type(self, in_type):
        # MXNet's maxidx is int32 (without MXNET_USE_INT64_TENSOR_SIZE); so is this one,
        # which limits this path to data of fewer than 2**31 elements.
        dtype = in_type[0]
        return [dtype, dtype], [dtype, np.int32], []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        return [out_grad[0], in_data[1], out_data[1]]


@mx.operator.register("roicore_PSROIPooling")
class _PSROIPoolingProp(_Prop):
    op = "PSROIPooling"

    def _out_shape(self, data_shape, rois_shape):
        p = self._params["pooled_size"]
        return [rois_shape[0], self._params["output_dim"], *_pair(p)]


@mx.operator.register("roicore_ROIAlign")
class _ROIAlignProp(_Prop):
    op = "ROIAlign"

    def _out_shape(self, data_shape, rois_shape):
        return [rois_shape[0], data_shape[1], *self._params["pooled_size"]]
