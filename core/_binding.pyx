# cython: language_level=3
"""The Cython binding of roicore's C API (core/csrc/roicore.h, declared in _roicore.pxd).

Arrays in, the C API's structs out, the call without the GIL, its status back as an
exception.  roicore.core.ops has checked and normalised the arguments (C-contiguous,
aligned, the right dtypes and shapes); every entry point of the C API checks everything
again, so nothing here is trusted either.  The C API owns the data checks and the box
conversions; the functions under "boxes" expose them, and the header's limits are
module constants.

While a call runs on the main thread, the C API polls this binding every few tens of
milliseconds; a pending signal then stops every thread at its next piece of work and the
call raises the signal's exception.  The C library watches SIGINT itself too (from this
module's import), which stops Ctrl-C'd calls on other threads and in the native operator
libraries: they raise KeyboardInterrupt.
"""
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset

import dataclasses
import threading

import numpy as np

from _roicore cimport *  # core/_roicore.pxd: roicore.h's declarations (setup.py puts core/ on the include path)

ABI_VERSION = roicore_abi_version()
if ABI_VERSION != ROICORE_ABI_VERSION:  # pragma: no cover - a mixed build
    raise ImportError(f"roicore's C library has ABI version {ABI_VERSION}, its binding was "
                      f"compiled for {ROICORE_ABI_VERSION}: rebuild roicore")
VERSION = roicore_version_string().decode()

# The C API's limits (roicore.h), for the messages and checks of the layers above.
MAX_SCALED_COORD = ROICORE_MAX_SCALED_COORD
MAX_SAMPLING_RATIO = ROICORE_MAX_SAMPLING_RATIO
MAX_GRID = ROICORE_MAX_GRID
MAX_SAMPLES_PER_BIN = ROICORE_MAX_SAMPLES_PER_BIN
MAX_MAP_SIDE = ROICORE_MAX_MAP_SIDE
MAX_THREADS = ROICORE_MAX_THREADS


# ---------------------------------------------------------------------------------------
# errors

cdef object _exception(roicore_status status, roicore_error *err):
    """The exception for a failed call: ValueError for bad arguments and values (with the
    argument and element the C API found at fault as ``argument`` and ``index``),
    MemoryError, NotImplementedError, KeyboardInterrupt."""
    message = err.message.decode("utf-8", "replace")
    if status == ROICORE_ERR_MEMORY:
        return MemoryError(message)
    if status == ROICORE_ERR_UNSUPPORTED:
        return NotImplementedError(message)
    if status == ROICORE_ERR_INTERRUPTED:
        return KeyboardInterrupt(message)
    exc = ValueError(message)
    exc.argument = err.argument.decode("utf-8", "replace") or None
    exc.index = err.index if err.index >= 0 else None
    return exc


# ---------------------------------------------------------------------------------------
# rules: each conventions dataclass field's value -> the C enum code of the same name

_CODES = {
    "MaxPoolRules": {
        "bin_arithmetic": {"input": ROICORE_BIN_ARITHMETIC_INPUT,
                           "float32": ROICORE_BIN_ARITHMETIC_FLOAT32,
                           "exact": ROICORE_BIN_ARITHMETIC_EXACT},
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
        "initial": {"-FLT_MAX": ROICORE_INITIAL_NEG_FLT_MAX, "lowest": ROICORE_INITIAL_LOWEST,
                    "first": ROICORE_INITIAL_FIRST, "nan": ROICORE_INITIAL_NAN},
        "compare": {"greater": ROICORE_COMPARE_GREATER, "std_max": ROICORE_COMPARE_STD_MAX,
                    "fmax": ROICORE_COMPARE_FMAX},
        "argmax": {"plane": ROICORE_ARGMAX_PLANE, "global": ROICORE_ARGMAX_GLOBAL},
        "argmax_dtype": {"int32": ROICORE_INT32, "int64": ROICORE_INT64},
        "scale_product": {"input": ROICORE_PRECISION_INPUT, "float64": ROICORE_PRECISION_FLOAT64},
    },
    "BilinearPoolRules": {
        "pin_last": {False: 0, True: 1},
        "fused_lerp": {False: 0, True: 1},
    },
    "PSRoIPoolRules": {
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
        "formula": {"rfcn": ROICORE_PS_ROI_POOL_FORMULA_RFCN,
                    "torchvision": ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION},
    },
    "RoIAlignRules": {
        "sampler": {"caffe2": ROICORE_SAMPLER_CAFFE2, "paddle": ROICORE_SAMPLER_PADDLE,
                    "model_garden": ROICORE_SAMPLER_MODEL_GARDEN},
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
        "empty_grid": {"zero": ROICORE_EMPTY_GRID_ZERO, "nan": ROICORE_EMPTY_GRID_NAN},
        "backward_min_size_always": {False: 0, True: 1},
        "reduction": {"mean": ROICORE_REDUCTION_MEAN, "sum": ROICORE_REDUCTION_SUM},
    },
    "PSRoIAlignRules": {
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
        "box": {"aligned": ROICORE_PS_ALIGN_BOX_ALIGNED, "unaligned": ROICORE_PS_ALIGN_BOX_UNALIGNED},
        "outside": {"zero": ROICORE_OUTSIDE_ZERO, "first": ROICORE_OUTSIDE_FIRST},
        "empty_grid": {"divide": ROICORE_PS_EMPTY_GRID_DIVIDE, "zero": ROICORE_PS_EMPTY_GRID_ZERO},
    },
    "LevelRules": {
        "pixel_offset": {False: 0, True: 1},
        "epsilon": {"1e-6": ROICORE_LEVEL_EPSILON_1E6, "1e-8": ROICORE_LEVEL_EPSILON_1E8},
        "epsilon_inside": {False: 0, True: 1},
        "invalid": {"nan": ROICORE_LEVEL_INVALID_NAN, "zero": ROICORE_LEVEL_INVALID_ZERO,
                    "skip": ROICORE_LEVEL_INVALID_SKIP},
        "one_map": {"all": ROICORE_LEVEL_ONE_MAP_ALL, "rule": ROICORE_LEVEL_ONE_MAP_RULE},
        "formula": {"log2": ROICORE_LEVEL_FORMULA_LOG2,
                    "model_garden": ROICORE_LEVEL_FORMULA_MODEL_GARDEN},
    },
}
# (fields the C API knows, fields every stored array has) per rules type
RULES_FIELDS = {
    "MaxPoolRules": (ROICORE_MAX_POOL_RULES_FIELDS, ROICORE_MAX_POOL_RULES_REQUIRED),
    "BilinearPoolRules": (ROICORE_BILINEAR_POOL_RULES_FIELDS, ROICORE_BILINEAR_POOL_RULES_REQUIRED),
    "PSRoIPoolRules": (ROICORE_PS_ROI_POOL_RULES_FIELDS, ROICORE_PS_ROI_POOL_RULES_REQUIRED),
    "RoIAlignRules": (ROICORE_ROI_ALIGN_RULES_FIELDS, ROICORE_ROI_ALIGN_RULES_REQUIRED),
    "PSRoIAlignRules": (ROICORE_PS_ROI_ALIGN_RULES_FIELDS, ROICORE_PS_ROI_ALIGN_RULES_REQUIRED),
    "LevelRules": (ROICORE_LEVEL_RULES_FIELDS, ROICORE_LEVEL_RULES_REQUIRED),
}
_code_cache = {}


def rules_codes(rules):
    """The C API codes of a conventions rules object's fields, in declaration order: what
    the C structs are built from (roicore_*_rules_from_array), and what native ops take as
    their rules attribute."""
    try:
        return _code_cache[rules]
    except (KeyError, TypeError):
        pass
    kind = type(rules).__name__
    if kind not in _CODES or not dataclasses.is_dataclass(rules):
        raise TypeError(f"rules must be one of roicore.core.conventions' rules classes, got "
                        f"{kind}")
    table = _CODES[kind]
    codes = []
    for field in dataclasses.fields(rules):
        value = getattr(rules, field.name)
        allowed = table[field.name]
        if isinstance(value, bool) != isinstance(next(iter(allowed)), bool) or value not in allowed:
            raise ValueError(f"{kind}.{field.name} must be one of {list(allowed)}, got {value!r}")
        codes.append(allowed[value])
    codes = tuple(codes)
    try:
        _code_cache[rules] = codes
    except TypeError:  # not hashable (a hand-made object): convert every time
        pass
    return codes


ctypedef union _Rules:
    roicore_max_pool_rules max_pool
    roicore_bilinear_pool_rules bilinear_pool
    roicore_ps_roi_pool_rules ps_roi_pool
    roicore_roi_align_rules roi_align
    roicore_ps_roi_align_rules ps_roi_align
    roicore_level_rules levels


cdef _Rules _rules(object rules) except *:
    """A conventions rules object as its C struct, decoded and checked by the C API."""
    cdef int64_t f[16]
    cdef _Rules r
    cdef roicore_error e
    cdef roicore_status status
    codes = rules_codes(rules)
    cdef int64_t n = len(codes), i
    for i in range(n):
        f[i] = codes[i]
    kind = type(rules).__name__
    if kind == "MaxPoolRules":
        status = roicore_max_pool_rules_from_array(f, n, &r.max_pool, &e)
    elif kind == "BilinearPoolRules":
        status = roicore_bilinear_pool_rules_from_array(f, n, &r.bilinear_pool, &e)
    elif kind == "PSRoIPoolRules":
        status = roicore_ps_roi_pool_rules_from_array(f, n, &r.ps_roi_pool, &e)
    elif kind == "RoIAlignRules":
        status = roicore_roi_align_rules_from_array(f, n, &r.roi_align, &e)
    elif kind == "LevelRules":
        status = roicore_level_rules_from_array(f, n, &r.levels, &e)
    else:
        status = roicore_ps_roi_align_rules_from_array(f, n, &r.ps_roi_align, &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return r


def rules_from_codes(kind, codes):
    """Decode a stored rules array of ``kind`` ("MaxPoolRules", ...) as the C API does for
    a saved graph (missing trailing fields take their defaults); returns the codes of every
    field."""
    cdef int64_t f[16]
    cdef _Rules r
    cdef roicore_error e
    cdef roicore_status status
    cdef int64_t n = len(codes), i
    if n > 16:
        raise ValueError(f"{kind} has {n} fields, more than any roicore stores")
    for i in range(n):
        f[i] = codes[i]
    if kind == "MaxPoolRules":
        status = roicore_max_pool_rules_from_array(f, n, &r.max_pool, &e)
    elif kind == "BilinearPoolRules":
        status = roicore_bilinear_pool_rules_from_array(f, n, &r.bilinear_pool, &e)
    elif kind == "PSRoIPoolRules":
        status = roicore_ps_roi_pool_rules_from_array(f, n, &r.ps_roi_pool, &e)
    elif kind == "RoIAlignRules":
        status = roicore_roi_align_rules_from_array(f, n, &r.roi_align, &e)
    elif kind == "PSRoIAlignRules":
        status = roicore_ps_roi_align_rules_from_array(f, n, &r.ps_roi_align, &e)
    elif kind == "LevelRules":
        status = roicore_level_rules_from_array(f, n, &r.levels, &e)
    else:
        raise ValueError(f"unknown rules type {kind!r}")
    if status != ROICORE_OK:
        raise _exception(status, &e)
    cdef const int32_t *words = <const int32_t *>&r  # every field is 4 bytes, in order
    return tuple(words[i] for i in range(RULES_FIELDS[kind][0]))


# ---------------------------------------------------------------------------------------
# arrays and calls

cdef const void *_data(object a) except? NULL:
    """The data pointer of a C-contiguous buffer (the caller keeps `a` alive)."""
    cdef Py_buffer view
    PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS)
    cdef const void *p = view.buf
    PyBuffer_Release(&view)
    return p


cdef void *_writable(object a) except? NULL:
    cdef Py_buffer view
    PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE)
    cdef void *p = view.buf
    PyBuffer_Release(&view)
    return p


# The callers (roicore.core.ops) pass checked arrays; these checks keep a caller that does
# not (a bug, or a user of this private module) from handing the C API sizes and dtypes
# that do not describe the memory behind the pointers.

cdef roicore_dtype _float_dtype(object a, str name) except *:
    dt = a.dtype
    if dt.kind != "f" or not dt.isnative or dt.itemsize not in (4, 8):
        raise TypeError(f"{name} must be a native float32 or float64 array, got {dt}")
    return ROICORE_FLOAT32 if dt.itemsize == 4 else ROICORE_FLOAT64


cdef roicore_tensor _tensor(object a, str name="x") except *:
    """A 4-D float32/float64 NCHW array as a tensor the call reads."""
    cdef roicore_tensor t
    memset(&t, 0, sizeof(t))
    if a.ndim != 4:
        raise ValueError(f"{name} must be a 4-D array, got shape {a.shape}")
    t.dtype = _float_dtype(a, name)
    t.data = _data(a)
    t.layout = ROICORE_NCHW
    t.n, t.c, t.h, t.w = a.shape
    return t


cdef roicore_out_tensor _out(object a, str name="out") except *:
    """... and one the call writes."""
    cdef roicore_out_tensor t
    memset(&t, 0, sizeof(t))
    if a.ndim != 4:
        raise ValueError(f"{name} must be a 4-D array, got shape {a.shape}")
    t.dtype = _float_dtype(a, name)
    t.data = _writable(a)
    t.layout = ROICORE_NCHW
    t.n, t.c, t.h, t.w = a.shape
    return t


cdef roicore_boxes _boxes(object coords, object batch, bint masked,
                          roicore_dtype dtype) except *:
    """Boxes: `batch` int64 (K,), `coords` None or (K, 4) in `dtype` (the map's)."""
    cdef roicore_boxes b
    memset(&b, 0, sizeof(b))
    if batch.ndim != 1 or batch.dtype != np.int64:
        raise TypeError(f"batch must be a 1-D int64 array, got {batch.dtype} of shape "
                        f"{batch.shape}")
    b.k = batch.shape[0]
    if coords is not None:
        if coords.shape != (b.k, 4) or _float_dtype(coords, "coords") != dtype:
            raise ValueError(f"coords must be ({b.k}, 4) in the map's dtype, got "
                             f"{coords.dtype} of shape {coords.shape}")
        b.coords = _data(coords)
    b.batch = <const int64_t *>_data(batch)
    b.masked = masked
    return b


cdef roicore_index_type _argmax_type(object argmax, tuple shape) except *:
    if argmax.shape != shape or argmax.dtype not in (np.int32, np.int64):
        raise ValueError(f"argmax must be int32 or int64 of shape {shape}, got "
                         f"{argmax.dtype} of shape {argmax.shape}")
    return ROICORE_INT32 if argmax.dtype == np.int32 else ROICORE_INT64


_MAIN_THREAD = threading.main_thread().ident
_get_ident = threading.get_ident


cdef int _poll(void *arg) noexcept with gil:
    """Between pieces of work: a pending signal's exception is stored and the call stops."""
    try:
        PyErr_CheckSignals()
    except BaseException as exc:
        (<list>arg).append(exc)
        return 1
    return 0


cdef class _Call:
    """One call's execution settings and what its poll saw."""
    cdef roicore_exec exec
    cdef roicore_error err
    cdef list raised

    def __cinit__(self, int n_threads):
        memset(&self.exec, 0, sizeof(self.exec))
        self.exec.n_threads = n_threads
        self.raised = []
        if _get_ident() == _MAIN_THREAD:  # only the main thread receives signals
            self.exec.poll = _poll
            self.exec.poll_arg = <void *>self.raised
        memset(&self.err, 0, sizeof(self.err))

    cdef int check(self, roicore_status status) except -1:
        if status == ROICORE_OK:
            return 0
        if status == ROICORE_ERR_INTERRUPTED:
            if self.raised:
                raise self.raised[0]
            if _get_ident() == _MAIN_THREAD:
                # stopped by the C library's Ctrl-C watch before this thread's poll saw the
                # signal: Python's own exception for it, once, rather than a second one
                PyErr_CheckSignals()
        raise _exception(status, &self.err)


def roi_pool_max_forward(rules, x, coords, batch, double spatial_scale, out, argmax,
                         int n_threads, bint masked=False):
    """Max pooling into `out` (and `argmax` unless None: int32 or int64, out's shape)."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tx = _tensor(x)
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef roicore_index_type at = ROICORE_INT32 if argmax is None else _argmax_type(argmax, out.shape)
    cdef void *am = _writable(argmax) if argmax is not None else NULL
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_roi_pool_max_forward(&r.max_pool, &tx, &b, spatial_scale, &to, am, at,
                                              &call.exec, &call.err)
    call.check(status)


def roi_pool_max_backward(rules, grad_output, argmax, batch, grad_input, int n_threads,
                          bint masked=False):
    """Scatter grad_output to its argmax into grad_input (all of it written)."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_out_tensor tdx = _out(grad_input, "grad_input")
    cdef roicore_boxes b = _boxes(None, batch, masked, tg.dtype)
    cdef roicore_index_type at = _argmax_type(argmax, grad_output.shape)
    cdef const void *am = _data(argmax)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_roi_pool_max_backward(&r.max_pool, &tg, am, at, &b, &tdx, &call.exec,
                                               &call.err)
    call.check(status)


def max_pool_argmax_dtype(rules, shape):
    """"int32" or "int64": the argmax a forward on an input of `shape` (N, C, H, W) writes."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor t
    cdef roicore_index_type type
    cdef roicore_error e
    memset(&t, 0, sizeof(t))
    t.dtype = ROICORE_FLOAT32
    t.data = <const void *>&t  # never read: only the shape matters
    t.n, t.c, t.h, t.w = shape
    cdef roicore_status status = roicore_max_pool_argmax_type(&r.max_pool, &t, &type, &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return "int32" if type == ROICORE_INT32 else "int64"


def roi_pool_bilinear_forward(rules, x, coords, batch, double extrapolation_value, out,
                              int n_threads, bint masked=False, bint nearest=False):
    """Bilinear (or, with nearest, nearest-neighbour) crops of x into `out`."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tx = _tensor(x)
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        if nearest:
            status = roicore_roi_pool_nearest_forward(&r.bilinear_pool, &tx, &b,
                                                      extrapolation_value, &to, &call.exec,
                                                      &call.err)
        else:
            status = roicore_roi_pool_bilinear_forward(&r.bilinear_pool, &tx, &b,
                                                       extrapolation_value, &to, &call.exec,
                                                       &call.err)
    call.check(status)


def roi_pool_bilinear_backward(rules, grad_output, coords, batch, grad_input, int n_threads,
                               bint masked=False, bint nearest=False):
    """The crops' gradient with respect to the map into `grad_input` (all of it written)."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_out_tensor tdx = _out(grad_input, "grad_input")
    cdef roicore_boxes b = _boxes(coords, batch, masked, tg.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        if nearest:
            status = roicore_roi_pool_nearest_backward(&r.bilinear_pool, &tg, &b, &tdx,
                                                       &call.exec, &call.err)
        else:
            status = roicore_roi_pool_bilinear_backward(&r.bilinear_pool, &tg, &b, &tdx,
                                                        &call.exec, &call.err)
    call.check(status)


def roi_pool_bilinear_boxes_backward(rules, grad_output, x, coords, batch, grad_boxes,
                                     int n_threads, bint masked=False):
    """The bilinear crops' gradient with respect to the boxes into `grad_boxes` (K, 4)."""
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output"), tx = _tensor(x)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef void *gb = _writable(grad_boxes)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_roi_pool_bilinear_boxes_backward(&r.bilinear_pool, &tg, &tx, &b, gb,
                                                          &call.exec, &call.err)
    call.check(status)


def ps_roi_pool_forward(rules, x, coords, batch, double spatial_scale, int64_t group_h,
                        int64_t group_w, out, int n_threads, bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tx = _tensor(x)
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_ps_roi_pool_forward(&r.ps_roi_pool, &tx, &b, spatial_scale, group_h,
                                             group_w, &to, &call.exec, &call.err)
    call.check(status)


def ps_roi_pool_backward(rules, grad_output, coords, batch, double spatial_scale,
                         int64_t group_h, int64_t group_w, grad_input, int n_threads,
                         bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_out_tensor tdx = _out(grad_input, "grad_input")
    cdef roicore_boxes b = _boxes(coords, batch, masked, tg.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_ps_roi_pool_backward(&r.ps_roi_pool, &tg, &b, spatial_scale, group_h,
                                              group_w, &tdx, &call.exec, &call.err)
    call.check(status)


def roi_align_forward(rules, x, coords, batch, double spatial_scale, int64_t sampling_ratio,
                      bint aligned, out, int n_threads, bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tx = _tensor(x)
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_roi_align_forward(&r.roi_align, &tx, &b, spatial_scale, sampling_ratio,
                                           aligned, &to, &call.exec, &call.err)
    call.check(status)


def roi_align_backward(rules, grad_output, coords, batch, double spatial_scale,
                       int64_t sampling_ratio, bint aligned, grad_input, int n_threads,
                       bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_out_tensor tdx = _out(grad_input, "grad_input")
    cdef roicore_boxes b = _boxes(coords, batch, masked, tg.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_roi_align_backward(&r.roi_align, &tg, &b, spatial_scale, sampling_ratio,
                                            aligned, &tdx, &call.exec, &call.err)
    call.check(status)


cdef roicore_pyramid _pyramid(object scales, int64_t first_level, int64_t canonical_level,
                              double canonical_size) except *:
    """A pyramid over `scales`, a float64 (L,) array the caller keeps alive."""
    cdef roicore_pyramid p
    memset(&p, 0, sizeof(p))
    if scales.ndim != 1 or scales.dtype != np.float64 or not scales.flags.c_contiguous:
        raise TypeError(f"spatial_scales must be a contiguous 1-D float64 array, got "
                        f"{scales.dtype} of shape {scales.shape}")
    p.n_levels = scales.shape[0]
    p.first_level = first_level
    p.canonical_level = canonical_level
    p.canonical_size = canonical_size
    p.spatial_scales = <const double *>_data(scales) if p.n_levels else NULL
    return p


def pyramid_levels(level_rules, scales, int64_t first_level, int64_t canonical_level,
                   double canonical_size, coords, batch, levels, bint masked=False):
    cdef _Rules lr = _rules(level_rules)
    cdef roicore_pyramid p = _pyramid(scales, first_level, canonical_level, canonical_size)
    cdef roicore_boxes b = _boxes(coords, batch, masked, _float_dtype(coords, "coords"))
    if levels.shape != (b.k,) or levels.dtype != np.int64:
        raise ValueError(f"levels must be int64 of shape ({b.k},), got {levels.dtype} of shape "
                         f"{levels.shape}")
    cdef int64_t *out = <int64_t *>_writable(levels)
    cdef roicore_error e
    cdef roicore_status status = roicore_pyramid_levels(&lr.levels, &p,
                                                        _float_dtype(coords, "coords"), &b, out,
                                                        &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)


def pyramid_roi_align_forward(rules, level_rules, scales, int64_t first_level,
                              int64_t canonical_level, double canonical_size, maps, coords, batch,
                              int64_t sampling_ratio, bint aligned, out, int n_threads,
                              bint masked=False):
    cdef _Rules r = _rules(rules), lr = _rules(level_rules)
    cdef roicore_pyramid p = _pyramid(scales, first_level, canonical_level, canonical_size)
    if len(maps) != p.n_levels or p.n_levels > 64 or p.n_levels < 1:
        raise ValueError(f"maps must number as the scales, 1 to 64, got {len(maps)} maps and "
                         f"{p.n_levels} scales")
    cdef roicore_tensor tm[64]
    cdef Py_ssize_t i
    for i in range(p.n_levels):
        tm[i] = _tensor(maps[i], f"maps[{i}]")
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tm[0].dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_pyramid_roi_align_forward(&r.roi_align, &lr.levels, &p, tm, &b,
                                                   sampling_ratio, aligned, &to, &call.exec,
                                                   &call.err)
    call.check(status)


def pyramid_roi_align_backward(rules, level_rules, scales, int64_t first_level,
                               int64_t canonical_level, double canonical_size, grad_output,
                               coords, batch, int64_t sampling_ratio, bint aligned, grad_maps,
                               int n_threads, bint masked=False):
    cdef _Rules r = _rules(rules), lr = _rules(level_rules)
    cdef roicore_pyramid p = _pyramid(scales, first_level, canonical_level, canonical_size)
    if len(grad_maps) != p.n_levels or p.n_levels > 64 or p.n_levels < 1:
        raise ValueError(f"grad_maps must number as the scales, 1 to 64, got {len(grad_maps)} "
                         f"and {p.n_levels} scales")
    cdef roicore_out_tensor td[64]
    cdef Py_ssize_t i
    for i in range(p.n_levels):
        td[i] = _out(grad_maps[i], f"grad_maps[{i}]")
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_boxes b = _boxes(coords, batch, masked, tg.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_pyramid_roi_align_backward(&r.roi_align, &lr.levels, &p, &tg, &b,
                                                    sampling_ratio, aligned, td, &call.exec,
                                                    &call.err)
    call.check(status)


def ps_roi_align_forward(rules, x, coords, batch, double spatial_scale, int64_t sampling_ratio,
                         out, int n_threads, bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tx = _tensor(x)
    cdef roicore_out_tensor to = _out(out)
    cdef roicore_boxes b = _boxes(coords, batch, masked, tx.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_ps_roi_align_forward(&r.ps_roi_align, &tx, &b, spatial_scale,
                                              sampling_ratio, &to, &call.exec, &call.err)
    call.check(status)


def ps_roi_align_backward(rules, grad_output, coords, batch, double spatial_scale,
                          int64_t sampling_ratio, grad_input, int n_threads, bint masked=False):
    cdef _Rules r = _rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, "grad_output")
    cdef roicore_out_tensor tdx = _out(grad_input, "grad_input")
    cdef roicore_boxes b = _boxes(coords, batch, masked, tg.dtype)
    cdef _Call call = _Call(n_threads)
    cdef roicore_status status
    with nogil:
        status = roicore_ps_roi_align_backward(&r.ps_roi_align, &tg, &b, spatial_scale,
                                               sampling_ratio, &tdx, &call.exec, &call.err)
    call.check(status)


# ---------------------------------------------------------------------------------------
# boxes: the C API's checks and conversions; `name` is the argument as the caller's user
# knows it, for the messages

ctypedef fused real:
    float
    double

ctypedef fused index:
    int32_t
    int64_t


def batch_from_column(const real[:] column, int64_t n_images, bint masked, str name):
    """A float batch column (any stride) as int64 batch indices, each an integer in
    [0, n_images) (or, with masked, negative: -1).  Raises ValueError naming ``name``."""
    cdef int64_t k = column.shape[0]
    batch = np.empty(k, np.int64)
    if k == 0:
        return batch
    cdef int64_t[::1] out = batch
    cdef roicore_error e
    cdef roicore_dtype dt = ROICORE_FLOAT32 if real is float else ROICORE_FLOAT64
    encoded = name.encode()
    cdef roicore_status status = roicore_batch_from_column(
        &column[0], dt, column.strides[0] // sizeof(real), k, n_images, masked, encoded, &out[0], &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return batch


def batch_from_indices(const index[::1] indices, int64_t n_images, bint masked, str name):
    """int32/int64 image indices as int64 batch indices, checked like batch_from_column's."""
    cdef int64_t k = indices.shape[0]
    batch = np.empty(k, np.int64)
    if k == 0:
        return batch
    cdef int64_t[::1] out = batch
    cdef roicore_error e
    cdef roicore_index_type it = ROICORE_INT32 if index is int32_t else ROICORE_INT64
    encoded = name.encode()
    cdef roicore_status status = roicore_batch_from_indices(&indices[0], it, k, n_images, masked,
                                                            encoded, &out[0], &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return batch


def batch_from_counts(const index[::1] counts, int64_t n_boxes, str name):
    """Per-image box counts (boxes grouped by image, in image order) as int64 batch indices
    of the ``n_boxes`` boxes; the counts must be non-negative and sum to n_boxes."""
    batch = np.empty(n_boxes, np.int64)
    cdef int64_t[::1] out = batch
    cdef roicore_error e
    cdef roicore_index_type it = ROICORE_INT32 if index is int32_t else ROICORE_INT64
    cdef int64_t n_images = counts.shape[0]
    encoded = name.encode()
    cdef roicore_status status = roicore_batch_from_counts(
        &counts[0] if n_images else NULL, it, n_images, n_boxes, encoded,
        &out[0] if n_boxes else NULL, &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return batch


def check_coords(coords, double scale_x, double scale_y, str name):
    """Raises ValueError unless every coordinate of C-contiguous (K, 4) float32/float64
    `coords` is finite and, times the scale of its axis (0: not checked), within
    MAX_SCALED_COORD feature-map pixels of the origin."""
    cdef roicore_error e
    cdef int64_t k = coords.shape[0]
    cdef roicore_dtype dt = ROICORE_FLOAT32 if coords.dtype.itemsize == 4 else ROICORE_FLOAT64
    cdef const void *p = _data(coords) if k else NULL
    encoded = name.encode()
    cdef roicore_status status = roicore_check_coords(p, dt, k, scale_x, scale_y, encoded, &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)


def convert_coords(const real[:, ::1] rows, int64_t first, bint yx, dtype):
    """(K, 4) [x1, y1, x2, y2] rows of `dtype` (float32 or float64) from the 4 values at
    `first` of each row (`yx`: rows [y1, x1, y2, x2])."""
    cdef int64_t k = rows.shape[0], stride = rows.shape[1]
    out = np.empty((k, 4), dtype)
    cdef roicore_error e
    cdef roicore_dtype src = ROICORE_FLOAT32 if real is float else ROICORE_FLOAT64
    cdef roicore_dtype dst = ROICORE_FLOAT32 if out.dtype.itemsize == 4 else ROICORE_FLOAT64
    cdef roicore_status status = roicore_convert_coords(
        &rows[0, 0] if k else NULL, src, stride, first, yx, k,
        _writable(out) if k else NULL, dst, &e)
    if status != ROICORE_OK:
        raise _exception(status, &e)
    return out


# ---------------------------------------------------------------------------------------
# runtime

def openmp_enabled():
    """True when the C library was compiled with OpenMP."""
    return bool(roicore_openmp_enabled())


def resolve_threads(int requested):
    """The thread count a call asking for `requested` threads runs on (0: the default)."""
    return roicore_resolve_threads(requested)


def get_memory_limit():
    return roicore_get_memory_limit()


def set_memory_limit(int64_t nbytes):
    if roicore_set_memory_limit(nbytes) != ROICORE_OK:
        raise ValueError(f"the memory limit must be >= 0 bytes, got {nbytes}")


def release_scratch():
    return roicore_release_scratch()


def runtime_address():
    """The address of this library's runtime (roicore_runtime_current), for the native
    operator libraries to share (roicore_native_share_runtime)."""
    return <size_t>roicore_runtime_current()


# Ctrl-C stops calls running in any thread, and in the native operator libraries that
# share this runtime (roicore.h: roicore_watch_interrupts).
roicore_watch_interrupts(NULL)
