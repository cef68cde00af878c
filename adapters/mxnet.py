"""MXNet front end: ``ROIPooling``, ``PSROIPooling`` and ``ROIAlign`` as drop-in replacements
for ``mx.nd.ROIPooling``, ``mx.nd.contrib.PSROIPooling`` and ``mx.nd.contrib.ROIAlign``
(and their ``mx.sym`` twins).

Swap a call by changing the import alone::

    import roicore.adapters.mxnet as mxa    # before ``import mxnet`` (see Import order)
    import mxnet as mx

    y = mxa.ROIPooling(data, rois, pooled_size=(7, 7), spatial_scale=1 / 16)

Positional order and keyword names are MXNet's; ``n_threads`` (OpenMP threads of the core,
see :func:`roicore.core.effective_n_threads`; results never depend on it) comes last and is
keyword-only.  ``rois`` are ``(R, 5)`` rows ``[batch, x1, y1, x2, y2]`` in image pixels.
The numbers are roicore.core's with ``convention="mxnet"``: bit-identical to MXNet 1.9.1's
CPU kernels for float32 and float64, forward and gradient; float16 is computed in float32
(MXNet computes in half).

Where a model puts it
---------------------
* NDArray inputs (imperative Gluon, ``mx.nd``): an ``mx.autograd.Function`` under
  ``mx.autograd.record()``, a direct call otherwise.
* Symbol inputs (``mx.sym`` graphs, hybridized ``HybridBlock``\\ s, also with
  ``static_alloc``/``static_shape``, ``export`` / ``SymbolBlock.imports``): a registered
  ``mx.operator.CustomOp`` (op types ``roicore_ROIPooling``, ``roicore_PSROIPooling``,
  ``roicore_ROIAlign``).  A graph exported with it loads in a process that has imported
  this module.
* oneDNN (the stock mxnet wheel): a convolution's output is an NDArray in oneDNN's blocked
  layout, which MXNet does not export.  Imperatively the op reads a copy in the default
  layout.  In a graph, MXNet's CustomOp makes its own copy of an input in that layout, and
  that copy sometimes holds wrong values (a race inside MXNet, which a plain identity
  CustomOp shows too), so the graph built here passes ``data`` and ``rois`` through
  ``reshape`` (whose oneDNN kernel writes the default layout) and the output through
  ``slice_axis`` (whose gradient MXNet computes into a fresh default-layout buffer): no
  input of the CustomOp, forward or backward, is in oneDNN layout.

Batch indices and masked RoIs
-----------------------------
A fractional batch index is truncated toward zero, as MXNet does (its kernels read
``static_cast<int>(rois[i, 0])``, and its own numeric gradient checks perturb that column
too): 0.9 and -0.5 are image 0, 1.5 is image 1, -1.5 is -1.  ``roicore.core`` (any
convention) and roicore's other adapters refuse it.  A non-finite batch index raises
ValueError (MXNet's cast of it is undefined).

A RoI whose batch index is negative (after truncation) is masked, as GluonCV's FPN marks
padded proposals (``F.where(..., F.ones_like(rois) * -1)``): its output row is 0 and it
adds nothing to the gradient, in all three operators.  MXNet's ROIPooling does the same;
its ROIAlign leaves such a row unwritten and PSROIPooling reads out of bounds.  Any other
batch index outside ``[0, N)`` raises ValueError.

Errors
------
Arguments are checked when the operator is created (NDArray call or Symbol), shapes in
the graph's shape inference, values (batch indices, coordinates) when it runs.  In a
graph, MXNet runs the operator in its engine and reports a failure at the next wait as an
``MXNetError`` that only names the failed callback; this module registers a translation
(``mx.error.register``, for MXNet's own "MXNetError" messages) that raises instead the
original exception's type and message, as a class that derives from both it and
``MXNetError``.  Other MXNet errors are raised as before.  MXNet prints each failed
callback's exception to stdout; for these errors that print is one line, not a traceback.

Copies
------
On the CPU the core reads NDArrays through DLPack without copies, but for arrays in
oneDNN's layout (above); its results become NDArrays on ``cpu(0)`` the same way (on
another context, by a copy).  In a graph the CustomOp
writes its output and the gradient straight into the buffers MXNet bound (float32 and
float64 with ``req="write"``; otherwise one copy).  Outside ``mx.autograd.record()`` no
gradient can be asked for, so ROIPooling computes no argmax (MXNet's hidden ``maxidx``,
which only its backward reads).

Devices
-------
roicore computes on the CPU.  An NDArray on another device is copied to the host and the
result back, with a :class:`roicore.adapters.DeviceCopyWarning` once per device, or
refused (ValueError naming the device) under
``roicore.adapters.set_device_policy("error")``.  ``cpu_pinned`` memory is host memory and
is read without a warning.  Results are returned on the input's context.

Import order
------------
MXNet 1.9.1 reads NumPy names that NumPy 1.24 and 2.x removed (``np.bool``, ``np.PZERO``,
...), so ``import mxnet`` alone fails under them, before roicore is involved.  Import this
module first: it sets the missing names for the duration of ``import mxnet`` and removes
them again, leaving NumPy as it found it.  If an earlier ``import mxnet`` in the process
failed for that reason, importing this module discards its half-imported modules and
imports mxnet afresh.

Maintenance only: MXNet is retired.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import dataclasses
import math
import numbers
import re
import sys
import threading
import traceback

import numpy as np

import roicore.core as core

from ._common import off_host, require

__all__ = ["ROIPooling", "PSROIPooling", "ROIAlign", "pyramid_roi_feats"]
# MXNet's names of roicore.core's arguments, for messages
NAMES = {"x": "data", "boxes": "rois", "grad_output": "out_grad"}
# what every call of roicore.core passes: MXNet's arithmetic and names, and masked rows (a
# negative batch index: GluonCV's padded proposals)
_CORE = dict(convention="mxnet", names=NAMES, masked=True)


# ------------------------------------------------------------------------------ import
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
    # A failed ``import mxnet`` (the NumPy names above) leaves its finished submodules in
    # sys.modules; importing mxnet over them gives a package without its attributes.
    for name in [m for m in sys.modules if m.startswith("mxnet.")]:
        del sys.modules[name]
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
                f"({exc}); through this module MXNet 1.9.1 imports under NumPy 1.23 to 2.4: "
                "pip install 'numpy<2.5'"
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


# ------------------------------------------------------------------------------ errors
class _ErrorRelay:
    """roicore's exceptions from inside MXNet's engine, kept for the MXNetError that reports them.

    A CustomOp callback that raises makes MXNet print the traceback and raise, at the
    next wait, an MXNetError whose message only quotes the failed ``callbacks[kCustom...]``
    check.  ``capture`` keeps each exception under the name of that callback; ``take``
    hands out the oldest one kept for it (the engine reports failures in the order the
    callbacks ran).
    """

    _CALLBACK = re.compile(r"callbacks\[(kCustom\w+)\]")

    def __init__(self, size=64):
        self._lock = threading.Lock()
        self._kept = collections.deque(maxlen=size)

    @contextlib.contextmanager
    def capture(self, callback):
        try:
            yield
        except Exception as exc:
            with self._lock:
                self._kept.append((callback, exc))
            raise

    def take(self, message):
        match = self._CALLBACK.search(message)
        if match is None:
            return None
        with self._lock:
            for i, (callback, exc) in enumerate(self._kept):
                if callback == match.group(1):
                    del self._kept[i]
                    return exc
        return None


    def holds(self, exc):
        with self._lock:
            return any(kept is exc for _, kept in self._kept)


_relay = _ErrorRelay()


class _OneLineTracebacks:
    """Stands in for the ``traceback`` module inside ``mxnet.operator`` and
    ``mxnet.autograd``, whose callback wrappers print the whole traceback of an exception to
    stdout before MXNet raises its own error.  For an exception the relay keeps (the user's
    mistake, which reaches the caller in full) that print is one line; for any other
    exception, the traceback as before."""

    def __getattr__(self, name):
        return getattr(traceback, name)

    def format_exc(self, *args, **kwargs):
        exc = sys.exc_info()[1]
        if exc is not None and _relay.holds(exc):
            return f"{type(exc).__name__}: {exc}"
        return traceback.format_exc(*args, **kwargs)


mx.operator.traceback = mx.autograd.traceback = _OneLineTracebacks()
_RERAISED = {}


def _reraised_type(cls):
    """``cls`` that is also an MXNetError, so that code catching either catches it."""
    if cls not in _RERAISED:
        _RERAISED[cls] = type(cls.__name__, (cls, mx.base.MXNetError),
                              {"__module__": __name__, "__qualname__": cls.__name__})
    return _RERAISED[cls]


_MXNET_ERROR = mx.base.error_types.get("MXNetError", mx.base.MXNetError)


def _translate_mxnet_error(message):
    """MXNet's error translation for its "MXNetError" messages: the exception a roicore
    callback raised where the message reports one, else what it was before."""
    exc = _relay.take(message)
    if exc is None:
        return _MXNET_ERROR(message)
    try:
        return _reraised_type(type(exc))(*exc.args)
    except TypeError:  # an exception class with another constructor
        return _reraised_type(RuntimeError)(f"{type(exc).__name__}: {exc}")


mx.error.register("MXNetError", _translate_mxnet_error)


# ------------------------------------------------------------------------------ conversion
def _on_host(a, argument):
    """A read-only NumPy view of NDArray ``a`` on the host; a copy where it lives elsewhere."""
    device = a.context.device_type
    if device == "cpu" and a.stype == "default" and a.size:
        return np.from_dlpack(_DLPackReader(a))
    if device not in ("cpu", "cpu_pinned"):
        off_host("mxnet", argument, str(a.context))
    return a.asnumpy()


class _DLPackReader:
    """What np.from_dlpack expects (mxnet 1.9 NDArrays have no __dlpack__)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None):
        try:
            return mx.nd.to_dlpack_for_read(self.array)  # waits for pending writes
        except mx.base.MXNetError as exc:
            if "MKLDNN" not in str(exc):
                raise
        # oneDNN's blocked layout (a convolution's output), which MXNet does not export:
        # a copy comes in the default layout, and the user's array stays as it is for
        # the oneDNN layers that read it next
        self.array = self.array.copy()
        return mx.nd.to_dlpack_for_read(self.array)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU (MXNet's cpu(i) are all host memory)


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
    """An NDArray on ``ctx`` holding NumPy array ``a`` (shared, not copied, on cpu(0))."""
    if ctx == mx.cpu(0) and a.size and a.flags.c_contiguous and a.flags.writeable:
        return mx.nd.from_dlpack(a.__dlpack__())
    return mx.nd.array(a, ctx=ctx, dtype=a.dtype)


# ------------------------------------------------------------------------------ arguments
def _check_scale(spatial_scale):
    if isinstance(spatial_scale, (bool, np.bool_)) or not isinstance(spatial_scale, numbers.Real):
        raise TypeError(f"spatial_scale must be a real number, got "
                        f"{type(spatial_scale).__name__}")
    if not 0 <= spatial_scale <= 1:
        raise ValueError(f"spatial_scale={spatial_scale!r} exceeds bound [0, 1] (MXNet's range "
                         "for this parameter: feature-map size over image size)")
    return float(spatial_scale)


def _check_int(value, name, low):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def _pooled_size(pooled_size):
    """MXNet's pooled_size for ROIPooling and ROIAlign: (h, w), or one int for both."""
    if pooled_size is None:
        raise TypeError("pooled_size is required")
    return core.args.pair(pooled_size, "pooled_size")


def _check_rois_shape(shape):
    if len(shape) != 2 or shape[1] != 5:
        raise ValueError(f"rois must have shape (R, 5) [batch, x1, y1, x2, y2], got shape "
                         f"{tuple(shape)}")


def _check_data_shape(shape):
    if len(shape) != 4:
        raise ValueError(f"data must be a 4-D (N, C, H, W) tensor, got shape {tuple(shape)}")


def _check_ps_align_channels(channels, params):
    cells = params["pooled_size"][0] * params["pooled_size"][1]
    if channels % cells:
        raise ValueError(f"data must have a multiple of pooled_size[0] * pooled_size[1] = "
                         f"{cells} channels with position_sensitive=True, got {channels}")


def _check_psroi_channels(channels, params):
    group = params["group_size"] or params["pooled_size"]
    if channels != params["output_dim"] * group * group:
        raise ValueError(f"data must have output_dim * group_size**2 = "
                         f"{params['output_dim']} * {group}**2 = "
                         f"{params['output_dim'] * group * group} channels, got {channels}")


def _threads(n_threads):
    if n_threads is None:
        return _DEFAULT_N_THREADS
    core.effective_n_threads(n_threads)  # validate now, not at the first forward
    return n_threads


def _parse(value):
    """A CustomOpProp attribute (MXNet passes them as strings) back to a Python value."""
    return ast.literal_eval(value) if isinstance(value, str) else value


# ------------------------------------------------------------------------------ core calls
# Each op is (forward(params, x, rois, out, argmax) -> outputs,
#             backward(params, dy, rois, x_shape, outputs, out) -> dx).
# ``out``: None or the array to write into; ``argmax``: whether ROIPooling also returns its
# argmax (MXNet's maxidx, needed by its backward only).  Rows whose batch index is negative
# are masked (masked=True): output 0, maxidx -1, no gradient.
def _roi_pool_forward(p, x, rois, out=None, argmax=True):
    res = core.roi_pool(x, rois, p["pooled_size"], p["spatial_scale"], return_argmax=argmax,
                        n_threads=p["n_threads"], out=out, **_CORE)
    return res if argmax else (res,)


def _roi_pool_backward(p, dy, rois, x_shape, outputs, out=None):
    return core.roi_pool_backward(dy, rois, x_shape, p["spatial_scale"], argmax=outputs[1],
                                  n_threads=p["n_threads"], out=out, **_CORE)


def _psroi_forward(p, x, rois, out=None, argmax=True):
    return (core.psroi_pool(x, rois, p["pooled_size"], p["spatial_scale"],
                            output_channels=p["output_dim"], group_size=p["group_size"] or None,
                            n_threads=p["n_threads"], out=out, **_CORE),)


def _psroi_backward(p, dy, rois, x_shape, outputs, out=None):
    return core.psroi_pool_backward(dy, rois, x_shape, p["spatial_scale"],
                                    group_size=p["group_size"] or None, n_threads=p["n_threads"],
                                    out=out, **_CORE)


def _ps_align_rules(p):
    """MXNet's position-sensitive RoIAlign rules for ``aligned``."""
    rules = core.conventions.PSROI_ALIGN["mxnet"]
    return dataclasses.replace(rules, box="aligned") if p["aligned"] else rules


def _align_forward(p, x, rois, out=None, argmax=True):
    # graphs saved before position_sensitive existed lack the attribute
    if p.get("position_sensitive", False):
        return (core.ps_roi_align(x, rois, p["pooled_size"], p["spatial_scale"],
                                  p["sample_ratio"], n_threads=p["n_threads"], out=out,
                                  **dict(_CORE, convention=_ps_align_rules(p))),)
    return (core.roi_align(x, rois, p["pooled_size"], p["spatial_scale"], p["sample_ratio"],
                           p["aligned"], n_threads=p["n_threads"], out=out, **_CORE),)


def _align_backward(p, dy, rois, x_shape, outputs, out=None):
    if p.get("position_sensitive", False):
        return core.ps_roi_align_backward(dy, rois, x_shape, p["spatial_scale"],
                                          p["sample_ratio"], n_threads=p["n_threads"], out=out,
                                          **dict(_CORE, convention=_ps_align_rules(p)))
    return core.roi_align_backward(dy, rois, x_shape, p["spatial_scale"], p["sample_ratio"],
                                   p["aligned"], n_threads=p["n_threads"], out=out, **_CORE)


_OPS = {
    "ROIPooling": (_roi_pool_forward, _roi_pool_backward),
    "PSROIPooling": (_psroi_forward, _psroi_backward),
    "ROIAlign": (_align_forward, _align_backward),
}


def _truncate_batch(rois):
    """``rois`` with each fractional batch index truncated toward zero, as MXNet's kernels
    read it (``static_cast<int>``): a copy where one is fractional, else ``rois`` itself.

    MXNet's own gradient checks perturb every input, the batch column too.  Non-finite
    indices stay as they are, for roicore.core to refuse (MXNet's cast of them is undefined).
    """
    if rois.ndim != 2 or not rois.shape[0] or rois.dtype.kind != "f":
        return rois
    column = rois[:, 0]
    if not (np.isfinite(column) & (column != np.trunc(column))).any():
        return rois
    rois = rois.copy()
    rois[:, 0] = np.trunc(column)
    return rois


def _forward(op, params, x, rois, out=None, argmax=True):
    """The op's outputs; masked rows give 0 (ROIPooling's argmax -1, as MXNet's maxidx)."""
    return _OPS[op][0](params, x, _truncate_batch(rois), out=out, argmax=argmax)


def _backward(op, params, dy, rois, x_shape, outputs, out=None):
    """The gradient with respect to data; masked rows add nothing."""
    return _OPS[op][1](params, dy, _truncate_batch(rois), x_shape, outputs, out=out)


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
        self._op = op
        self._params = params

    def forward(self, data, rois):
        outputs = _forward(self._op, self._params, _on_host(data, "data"),
                           _on_host(rois, "rois"), argmax=True)
        self._outputs = outputs[1:]  # ROIPooling's argmax (NumPy, owned here)
        self._x_shape = data.shape
        # the input only where the backward may have to recompute an argmax
        self.save_for_backward(rois, *([data] if self._outputs else []))
        return _as_ndarray(outputs[0], data.context)

    def backward(self, dy):
        with _relay.capture("kCustomFunctionBackward"):
            rois, *data = self.saved_tensors
            r = _on_host(rois, "rois")
            outputs = self._outputs
            if outputs is None:  # released by an earlier backward (retain_graph=True)
                outputs = _forward(self._op, self._params, _on_host(data[0], "data"), r,
                                   argmax=True)[1:]
            if outputs:
                self._outputs = None
            dx = _backward(self._op, self._params, _on_host(dy, "out_grad"), r,
                           self._x_shape, (None,) + tuple(outputs))
            return _as_ndarray(dx, dy.context), mx.nd.zeros_like(rois)


def _check_inputs(data, rois, op):
    mod = mx.nd.NDArray
    if not isinstance(data, mod) or not isinstance(rois, mod):
        raise TypeError(f"{op} takes data and rois as both mx.nd.NDArray or as mx.sym.Symbol "
                        f"(an omitted Symbol input becomes a variable, as in MXNet), got "
                        f"{type(data).__name__} and {type(rois).__name__}")
    _check_data_shape(data.shape)
    _check_rois_shape(rois.shape)


def _write_out(out, op, params, data, rois):
    """Forward into MXNet-style ``out=``: an NDArray, or [output, maxidx] for ROIPooling."""
    if mx.autograd.is_recording():
        raise ValueError(f"{op}: out= is not supported under mx.autograd.record(); use the "
                         "returned NDArray")
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if not 1 <= len(outs) <= (2 if op == "ROIPooling" else 1):
        raise ValueError(f"{op}: out must be an NDArray"
                         + (" or a list [output, maxidx]" if op == "ROIPooling" else ""))
    x, r = _on_host(data, "data"), _on_host(rois, "rois")
    view = _output_view(outs[0], x.dtype) if isinstance(outs[0], mx.nd.NDArray) else None
    if view is not None and (np.shares_memory(view, x) or np.shares_memory(view, r)):
        view = None  # out aliases an input: compute first, then copy
    results = _forward(op, params, x, r, out=view, argmax=len(outs) > 1)
    for i, (dst, src) in enumerate(zip(outs, results)):
        if i or view is None:
            dst[:] = src
    return out


class _GivenNames(mx.name.NameManager):
    """Keeps a name given as it is (already resolved by ``outer``, prefix included) and
    leaves automatic names to ``outer``."""

    def __init__(self, outer):
        super().__init__()
        self._outer = outer

    def get(self, name, hint):
        return name if name else self._outer.get(name, hint)


def _current_names():
    """MXNet's current NameManager, as its generated operator functions read it."""
    if not hasattr(mx.name.NameManager._current, "value"):
        mx.name.NameManager._current.value = mx.name.NameManager()
    return mx.name.NameManager._current.value


def _symbol(op, data, rois, params, name):
    """The op in a graph: ``Custom`` between layout-normalising native ops (module doc).

    Named as MXNet names its op: ``name``, else an automatic ``roipooling0``,
    ``psroipooling0`` or ``roialign0`` (with the NameManager's prefix); the output is
    ``<name>_output`` and an omitted input is a variable ``<name>_data`` / ``<name>_rois``."""
    outer = _current_names()
    name = outer.get(name, op.lower())
    if data is None:
        data = mx.sym.var(f"{name}_data")
    if rois is None:
        rois = mx.sym.var(f"{name}_rois")
    attrs = {k: repr(v) for k, v in params.items()}
    with _GivenNames(outer):
        data = mx.sym.reshape(data, shape=(-2,))
        rois = mx.sym.reshape(rois, shape=(-2,))
        sym = mx.sym.Custom(data, rois, op_type=f"roicore_{op}", name=f"{name}_roicore",
                            **attrs)
        return mx.sym.slice_axis(sym[0] if op == "ROIPooling" else sym, axis=0, begin=0,
                                 end=None, name=name)


def _call(op, data, rois, params, out, name):
    # MXNet's Symbol form makes a variable of an omitted input; its NDArray form needs both
    if all(a is None or isinstance(a, mx.sym.Symbol) for a in (data, rois)):
        if out is not None:
            raise ValueError(f"{op}: out= applies to NDArray inputs only")
        return _symbol(op, data, rois, params, name)
    _check_inputs(data, rois, op)
    if op == "PSROIPooling":
        _check_psroi_channels(data.shape[1], params)
    if op == "ROIAlign" and params["position_sensitive"]:
        _check_ps_align_channels(data.shape[1], params)
    if out is not None:
        return _write_out(out, op, params, data, rois)
    if not mx.autograd.is_recording():  # no gradient can be asked for: no argmax either
        y = _forward(op, params, _on_host(data, "data"), _on_host(rois, "rois"),
                     argmax=False)[0]
        return _as_ndarray(y, data.context)
    return _Function(op, params)(data, rois)


# ------------------------------------------------------------------------------ public API
def ROIPooling(data=None, rois=None, pooled_size=None, spatial_scale=None, out=None, name=None,
               *, n_threads=None):
    """Region-of-interest max pooling (Fast R-CNN), as ``mx.nd.ROIPooling`` and
    ``mx.sym.ROIPooling``.

    Each RoI is scaled by ``spatial_scale``, rounded to feature-map pixels (halves away from
    zero), given an inclusive extent of at least one pixel and split into a
    ``pooled_size`` grid of bins; each output is the maximum of its bin.  An empty bin
    gives 0.  The gradient goes to the first maximum of each bin in row-major order.

    Parameters
    ----------
    data : NDArray or Symbol
        The feature map, (N, C, H, W), float16, float32 or float64.  Symbol form:
        omitted, a variable ``<name>_data``.
    rois : NDArray or Symbol
        (R, 5) rows ``[batch_index, x1, y1, x2, y2]`` in image coordinates.  The batch
        index is truncated toward zero, as MXNet does; a negative one masks the row
        (output 0, no gradient).  Symbol form: omitted, a variable ``<name>_rois``.
    pooled_size : tuple of (int, int) or int
        Output height and width, each >= 1.
    spatial_scale : float
        Ratio of feature-map size to image size, in (0, 1].
    out : NDArray or list of NDArray, optional
        NDArray input only: the array to write the output into, or
        ``[output, maxidx]`` to also get MXNet's hidden argmax output (int32, the flat index
        into ``data``, -1 for an empty bin).  Not under ``mx.autograd.record()``.
    name : str, optional
        Symbol form only: the name of the graph node, whose output is ``<name>_output``;
        by default MXNet's automatic name (``roipooling0``, ``roipooling1``, ...).
    n_threads : int, optional
        roicore's OpenMP threads; None for ``OMP_NUM_THREADS``, else every CPU.

    Returns
    -------
    NDArray or Symbol
        (R, C, pooled_size[0], pooled_size[1]), data's dtype and context.

    Examples
    --------
    >>> x = mx.nd.arange(48).reshape((1, 1, 8, 6))
    >>> ROIPooling(x, mx.nd.array([[0, 0, 0, 4, 4]]), pooled_size=(2, 2),
    ...            spatial_scale=0.7)[0, 0].asnumpy()
    array([[ 7.,  9.],
           [19., 21.]], dtype=float32)

    Differences from MXNet
    ----------------------
    A batch index >= N raises ValueError (MXNet writes 0), and so does a non-finite one
    (MXNet's conversion of it to int is undefined); ``spatial_scale=0`` raises
    (MXNet collapses every box to pixel (0, 0)); ``rois`` of another float dtype than
    ``data`` are cast to it (MXNet raises); float16 is computed in float32.
    """
    params = {"pooled_size": _pooled_size(pooled_size), "spatial_scale": _check_scale(spatial_scale),
              "n_threads": _threads(n_threads)}
    return _call("ROIPooling", data, rois, params, out, name)


def PSROIPooling(data=None, rois=None, spatial_scale=None, output_dim=None, pooled_size=None,
                 group_size=0, out=None, name=None, *, n_threads=None):
    """Position-sensitive RoI average pooling (R-FCN), as ``mx.nd.contrib.PSROIPooling``
    and ``mx.sym.contrib.PSROIPooling``.

    Each RoI is split into ``pooled_size`` x ``pooled_size`` bins; output channel ``d``
    of bin ``(i, j)`` is the average of the bin over the input channel of group cell
    ``(i, j)`` of ``d`` (cell ``(i * G // pooled_size, j * G // pooled_size)`` with
    G = ``group_size``).  An empty bin gives 0.

    Parameters
    ----------
    data : NDArray or Symbol
        The score maps, (N, output_dim * G * G, H, W), float16, float32 or float64.
        Symbol form: omitted, a variable ``<name>_data``.
    rois : NDArray or Symbol
        (R, 5) rows ``[batch_index, x1, y1, x2, y2]`` in image coordinates.  The batch
        index is truncated toward zero, as MXNet does; a negative one masks the row
        (output 0, no gradient).  Symbol form: omitted, a variable ``<name>_rois``.
    spatial_scale : float
        Ratio of feature-map size to image size, in (0, 1].
    output_dim : int
        Output channels, >= 1.
    pooled_size : int
        Output height and width (square), >= 1.
    group_size : int, optional
        G, the side of the grid of position-sensitive channel groups; 0 (default) means
        ``pooled_size``.
    out : NDArray, optional
        NDArray input only: the array to write the output into.  Not under
        ``mx.autograd.record()``.
    name : str, optional
        Symbol form only: the name of the graph node, whose output is ``<name>_output``;
        by default MXNet's automatic name (``psroipooling0``, ``psroipooling1``, ...).
    n_threads : int, optional
        roicore's OpenMP threads; None for ``OMP_NUM_THREADS``, else every CPU.

    Returns
    -------
    NDArray or Symbol
        (R, output_dim, pooled_size, pooled_size), data's dtype and context.

    Examples
    --------
    >>> x = mx.nd.arange(288).reshape((1, 8, 6, 6))
    >>> PSROIPooling(x, mx.nd.array([[0, 0, 0, 3, 3]]), spatial_scale=1.0, output_dim=2,
    ...              pooled_size=2)[0, 0].asnumpy()
    array([[  3.5,  41.5],
           [ 87.5, 125.5]], dtype=float32)

    Differences from MXNet
    ----------------------
    data must have exactly ``output_dim * G * G`` channels and every batch index must be
    finite and, after truncation, masked or in [0, N), else ValueError (MXNet reads out of
    bounds or ignores the extra channels); masked rows give 0; ``spatial_scale=0`` raises
    (MXNet collapses every box to a point); ``rois`` of another float dtype than ``data``
    are cast to it (MXNet raises); float16 is computed in float32.
    """
    params = {"spatial_scale": _check_scale(spatial_scale),
              "output_dim": _check_int(output_dim, "output_dim", 1),
              "pooled_size": _check_int(pooled_size, "pooled_size", 1),
              "group_size": _check_int(group_size, "group_size", 0),
              "n_threads": _threads(n_threads)}
    return _call("PSROIPooling", data, rois, params, out, name)


def ROIAlign(data=None, rois=None, pooled_size=None, spatial_scale=None, sample_ratio=-1,
             position_sensitive=False, aligned=False, out=None, name=None, *, n_threads=None):
    """RoIAlign (Mask R-CNN), as ``mx.nd.contrib.ROIAlign`` and ``mx.sym.contrib.ROIAlign``.

    Each RoI, scaled by ``spatial_scale`` (and shifted by half a pixel when ``aligned``),
    is split into a ``pooled_size`` grid of bins; each output is the average of bilinear
    samples on a regular grid in its bin.

    Parameters
    ----------
    data : NDArray or Symbol
        The feature map, (N, C, H, W), float16, float32 or float64.  Symbol form:
        omitted, a variable ``<name>_data``.
    rois : NDArray or Symbol
        (R, 5) rows ``[batch_index, x1, y1, x2, y2]`` in image coordinates.  The batch
        index is truncated toward zero, as MXNet does; a negative one masks the row
        (output 0, no gradient).  Symbol form: omitted, a variable ``<name>_rois``.
    pooled_size : tuple of (int, int) or int
        Output height and width, each >= 1.
    spatial_scale : float
        Ratio of feature-map size to image size, in (0, 1].
    sample_ratio : int, optional
        Samples per bin and axis; -1 (default) or 0 for ``ceil(bin size)``.
    position_sensitive : bool, optional
        Position-sensitive RoIAlign (Light-Head R-CNN): data has ``D * PH * PW`` channels and
        output channel d at cell (ph, pw) averages the samples of input channel
        ``(d*PH + ph)*PW + pw``.  Default False.
    aligned : bool, optional
        Shift boxes by half a pixel so that coordinates address pixel centres
        (Detectron2's ``aligned=True``).  Default False.
    out : NDArray, optional
        NDArray input only: the array to write the output into.  Not under
        ``mx.autograd.record()``.
    name : str, optional
        Symbol form only: the name of the graph node, whose output is ``<name>_output``;
        by default MXNet's automatic name (``roialign0``, ``roialign1``, ...).
    n_threads : int, optional
        roicore's OpenMP threads; None for ``OMP_NUM_THREADS``, else every CPU.

    Returns
    -------
    NDArray or Symbol
        (R, C, pooled_size[0], pooled_size[1]), data's dtype and context; with
        ``position_sensitive``, (R, C / (PH * PW), PH, PW).

    Examples
    --------
    >>> x = mx.nd.arange(48).reshape((1, 1, 8, 6))
    >>> ROIAlign(x, mx.nd.array([[0, 0, 0, 4, 4]]), pooled_size=(2, 2), spatial_scale=1.0,
    ...          sample_ratio=2)[0, 0].asnumpy()
    array([[ 7.,  9.],
           [19., 21.]], dtype=float32)

    Differences from MXNet
    ----------------------
    Masked rows give 0 (MXNet leaves them unwritten and writes 0 into another RoI's first
    element); a batch index >= N or non-finite raises ValueError (MXNet reads out of bounds,
    or casts it to int with undefined behaviour); with ``aligned=True`` a box of size <= 0
    (MXNet aborts the process) gives 0 with adaptive sampling, and with a fixed
    ``sample_ratio`` its samples taken as the frameworks' formula places them (a reversed box
    back to front); ``spatial_scale=0`` raises (MXNet collapses every
    box to a point); ``rois`` of another float dtype than ``data`` are cast to it (MXNet
    raises); with ``position_sensitive=True`` a channel count that ``PH * PW`` does not
    divide raises ValueError (MXNet: MXNetError); float16 is computed in float32.
    """
    if isinstance(sample_ratio, (bool, np.bool_)) or not isinstance(sample_ratio, numbers.Integral):
        raise TypeError(f"sample_ratio must be an int, got {type(sample_ratio).__name__}")
    params = {"pooled_size": _pooled_size(pooled_size), "spatial_scale": _check_scale(spatial_scale),
              "sample_ratio": int(sample_ratio), "aligned": bool(aligned),
              "position_sensitive": bool(position_sensitive),
              "n_threads": _threads(n_threads)}
    return _call("ROIAlign", data, rois, params, out, name)


# ------------------------------------------------------------------------------ symbolic
class _CustomOp(mx.operator.CustomOp):
    def __init__(self, op, params):
        super().__init__()
        self._op = op
        self._params = params

    def forward(self, is_train, req, in_data, out_data, aux):
        # maxidx is computed even when not is_train: under record(train_mode=False) MXNet
        # still runs the backward, and nothing here tells whether it will.
        with _relay.capture("kCustomOpForward"):
            x = _on_host(in_data[0], "data")
            view = _output_view(out_data[0], x.dtype) if req[0] == "write" else None
            results = _forward(self._op, self._params, x, _on_host(in_data[1], "rois"),
                               out=view, argmax=True)
            for i, (dst, r, src) in enumerate(zip(out_data, req, results)):
                if i or view is None:
                    self.assign(dst, r, _as_ndarray(src, dst.context))

    def backward(self, req, out_grad, in_data, out_data, in_grad, aux):
        with _relay.capture("kCustomOpBackward"):
            dy = _on_host(out_grad[0], "out_grad")
            view = _output_view(in_grad[0], dy.dtype) if req[0] == "write" else None
            outputs = (None,) + tuple(_on_host(o, "maxidx") for o in out_data[1:])
            dx = _backward(self._op, self._params, dy, _on_host(in_data[1], "rois"),
                           in_grad[0].shape, outputs, out=view)
            if view is None:
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
        return [rois_shape[0], data_shape[1], *self._params["pooled_size"]]

    def infer_shape(self, in_shape):
        with _relay.capture("kCustomOpPropInferShape"):
            data_shape, rois_shape = in_shape
            _check_data_shape(data_shape)
            _check_rois_shape(rois_shape)
            out = self._out_shape(data_shape, rois_shape)
            return [data_shape, rois_shape], [out] * len(self.list_outputs()), []

    def infer_type(self, in_type):
        dtype = in_type[0]
        return [dtype, dtype], [dtype] + [np.int32] * (len(self.list_outputs()) - 1), []

    def declare_backward_dependency(self, out_grad, in_data, out_data):
        # Everything, though the backward reads only out_grad[0], rois (and maxidx): MXNet
        # 1.9 decides which backward arrays are empty from the dependencies declared last
        # by *any* CustomOp in the process (a module-level set in mxnet/operator.py), and
        # an empty array it takes for a dependency fails with "unknown storage type: -1".
        # With no array left out, none is empty, whatever was declared last.
        return list(out_grad) + list(in_data) + list(out_data)

    def create_operator(self, ctx, shapes, dtypes):
        return _CustomOp(self.op, self._params)


@mx.operator.register("roicore_ROIPooling")
class _ROIPoolingProp(_Prop):
    op = "ROIPooling"

    def list_outputs(self):
        # MXNet's maxidx is int32 (without MXNET_USE_INT64_TENSOR_SIZE); so is this one,
        # which limits this path to data of fewer than 2**31 elements.
        return ["output", "maxidx"]


@mx.operator.register("roicore_PSROIPooling")
class _PSROIPoolingProp(_Prop):
    op = "PSROIPooling"

    def _out_shape(self, data_shape, rois_shape):
        _check_psroi_channels(data_shape[1], self._params)
        p = self._params["pooled_size"]
        return [rois_shape[0], self._params["output_dim"], p, p]


@mx.operator.register("roicore_ROIAlign")
class _ROIAlignProp(_Prop):
    op = "ROIAlign"

    def _out_shape(self, data_shape, rois_shape):
        if not self._params.get("position_sensitive", False):
            return super()._out_shape(data_shape, rois_shape)
        _check_ps_align_channels(data_shape[1], self._params)
        ph, pw = self._params["pooled_size"]
        return [rois_shape[0], data_shape[1] // (ph * pw), ph, pw]


from ._mxnet_pyramid import pyramid_roi_feats  # noqa: E402
