# cython: language_level=3
"""The Cython binding of roicore's C API (core/csrc/roicore.h).

Arrays in, the C API's structs out, the call without the GIL, its status back as an
exception.  roicore.core.ops has checked and normalised the arguments (C-contiguous,
aligned, the right dtypes and shapes) and raises its own friendlier errors; every entry
point of the C API checks everything again, so nothing here is trusted either.

While a call runs on the main thread, the C API polls this binding every few tens of
milliseconds; a pending signal (Ctrl-C) then stops every thread at its next piece of work
and the call raises the signal's exception (KeyboardInterrupt).
"""
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_WRITABLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.exc cimport PyErr_CheckSignals
from libc.stdint cimport int64_t

import dataclasses
import threading

cdef extern from "roicore.h" nogil:
    enum:
        ROICORE_API_VERSION
        ROICORE_MAX_THREADS
    ctypedef enum roicore_status:
        ROICORE_OK, ROICORE_ERR_ARGUMENT, ROICORE_ERR_VALUE, ROICORE_ERR_MEMORY,
        ROICORE_ERR_INTERRUPTED, ROICORE_ERR_UNSUPPORTED
    ctypedef struct roicore_error:
        int code
        char message[480]
    ctypedef enum roicore_dtype:
        ROICORE_FLOAT32, ROICORE_FLOAT64
    ctypedef enum roicore_index_type:
        ROICORE_INT32, ROICORE_INT64
    ctypedef enum roicore_layout:
        ROICORE_NCHW, ROICORE_NHWC
    ctypedef struct roicore_tensor:
        void *data
        roicore_dtype dtype
        roicore_layout layout
        int64_t n, c, h, w
    ctypedef struct roicore_boxes:
        const void *coords
        const int64_t *batch
        int64_t k
        int masked
    ctypedef struct roicore_exec:
        int n_threads
        int (*poll)(void *arg) noexcept
        void *poll_arg
    enum:  # rules field codes
        ROICORE_PRECISION_INPUT, ROICORE_PRECISION_FLOAT32, ROICORE_PRECISION_FLOAT64
        ROICORE_BIN_ARITHMETIC_INPUT, ROICORE_BIN_ARITHMETIC_FLOAT32, ROICORE_BIN_ARITHMETIC_EXACT
        ROICORE_INITIAL_NEG_FLT_MAX, ROICORE_INITIAL_LOWEST, ROICORE_INITIAL_FIRST, ROICORE_INITIAL_NAN
        ROICORE_COMPARE_GREATER, ROICORE_COMPARE_STD_MAX, ROICORE_COMPARE_FMAX
        ROICORE_ARGMAX_PLANE, ROICORE_ARGMAX_GLOBAL
        ROICORE_SAMPLER_CAFFE2, ROICORE_SAMPLER_PADDLE
        ROICORE_EMPTY_GRID_ZERO, ROICORE_EMPTY_GRID_NAN
        ROICORE_PSROI_FORMULA_RFCN, ROICORE_PSROI_FORMULA_TORCHVISION
    ctypedef struct roicore_max_pool_rules:
        pass
    ctypedef struct roicore_bilinear_pool_rules:
        pass
    ctypedef struct roicore_psroi_pool_rules:
        pass
    ctypedef struct roicore_roi_align_rules:
        pass
    ctypedef struct roicore_ps_roi_align_rules:
        pass

    int roicore_max_pool_rules_from_array(const int64_t *fields, int64_t n,
                                          roicore_max_pool_rules *rules, roicore_error *err)
    int roicore_bilinear_pool_rules_from_array(const int64_t *fields, int64_t n,
                                               roicore_bilinear_pool_rules *rules,
                                               roicore_error *err)
    int roicore_psroi_pool_rules_from_array(const int64_t *fields, int64_t n,
                                            roicore_psroi_pool_rules *rules, roicore_error *err)
    int roicore_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                           roicore_roi_align_rules *rules, roicore_error *err)
    int roicore_ps_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                              roicore_ps_roi_align_rules *rules,
                                              roicore_error *err)

    int roicore_batch_from_column(const void *column, roicore_dtype dtype, int64_t stride,
                                  int64_t k, int64_t n_images, int masked, int64_t *batch,
                                  roicore_error *err)
    int roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k, double scale_x,
                             double scale_y, roicore_error *err)

    roicore_index_type roicore_max_pool_argmax_type(const roicore_max_pool_rules *rules,
                                                    const roicore_tensor *x)
    int roicore_roi_pool_max_forward(const roicore_max_pool_rules *rules, const roicore_tensor *x,
                                     const roicore_boxes *boxes, double spatial_scale,
                                     const roicore_tensor *out, void *argmax,
                                     roicore_index_type argmax_type, const roicore_exec *exec,
                                     roicore_error *err)
    int roicore_roi_pool_max_backward(const roicore_max_pool_rules *rules,
                                      const roicore_tensor *grad_output, const void *argmax,
                                      roicore_index_type argmax_type, const roicore_boxes *boxes,
                                      const roicore_tensor *grad_input, const roicore_exec *exec,
                                      roicore_error *err)
    int roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                          const roicore_tensor *x, const roicore_boxes *boxes,
                                          double extrapolation_value, const roicore_tensor *out,
                                          const roicore_exec *exec, roicore_error *err)
    int roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                           const roicore_tensor *grad_output,
                                           const roicore_boxes *boxes,
                                           const roicore_tensor *grad_input,
                                           const roicore_exec *exec, roicore_error *err)
    int roicore_roi_pool_nearest_forward(const roicore_bilinear_pool_rules *rules,
                                         const roicore_tensor *x, const roicore_boxes *boxes,
                                         double extrapolation_value, const roicore_tensor *out,
                                         const roicore_exec *exec, roicore_error *err)
    int roicore_roi_pool_nearest_backward(const roicore_bilinear_pool_rules *rules,
                                          const roicore_tensor *grad_output,
                                          const roicore_boxes *boxes,
                                          const roicore_tensor *grad_input,
                                          const roicore_exec *exec, roicore_error *err)
    int roicore_roi_pool_bilinear_boxes_backward(const roicore_bilinear_pool_rules *rules,
                                                 const roicore_tensor *grad_output,
                                                 const roicore_tensor *x,
                                                 const roicore_boxes *boxes, void *grad_boxes,
                                                 const roicore_exec *exec, roicore_error *err)
    int roicore_psroi_pool_forward(const roicore_psroi_pool_rules *rules, const roicore_tensor *x,
                                   const roicore_boxes *boxes, double spatial_scale,
                                   int64_t group_h, int64_t group_w, const roicore_tensor *out,
                                   const roicore_exec *exec, roicore_error *err)
    int roicore_psroi_pool_backward(const roicore_psroi_pool_rules *rules,
                                    const roicore_tensor *grad_output, const roicore_boxes *boxes,
                                    double spatial_scale, int64_t group_h, int64_t group_w,
                                    const roicore_tensor *grad_input, const roicore_exec *exec,
                                    roicore_error *err)
    int roicore_roi_align_forward(const roicore_roi_align_rules *rules, const roicore_tensor *x,
                                  const roicore_boxes *boxes, double spatial_scale,
                                  int64_t sampling_ratio, int aligned, const roicore_tensor *out,
                                  const roicore_exec *exec, roicore_error *err)
    int roicore_roi_align_backward(const roicore_roi_align_rules *rules,
                                   const roicore_tensor *grad_output, const roicore_boxes *boxes,
                                   double spatial_scale, int64_t sampling_ratio, int aligned,
                                   const roicore_tensor *grad_input, const roicore_exec *exec,
                                   roicore_error *err)
    int roicore_ps_roi_align_forward(const roicore_ps_roi_align_rules *rules,
                                     const roicore_tensor *x, const roicore_boxes *boxes,
                                     double spatial_scale, int64_t sampling_ratio,
                                     const roicore_tensor *out, const roicore_exec *exec,
                                     roicore_error *err)
    int roicore_ps_roi_align_backward(const roicore_ps_roi_align_rules *rules,
                                      const roicore_tensor *grad_output,
                                      const roicore_boxes *boxes, double spatial_scale,
                                      int64_t sampling_ratio, const roicore_tensor *grad_input,
                                      const roicore_exec *exec, roicore_error *err)

    int roicore_api_version()
    int roicore_openmp_enabled()
    int roicore_resolve_threads(int requested)
    int64_t roicore_get_memory_limit()
    void roicore_set_memory_limit(int64_t nbytes)
    int64_t roicore_release_scratch()


API_VERSION = roicore_api_version()
if API_VERSION != ROICORE_API_VERSION:  # pragma: no cover - a mixed build
    raise ImportError(f"roicore's C library has API version {API_VERSION}, its binding was "
                      f"compiled for {ROICORE_API_VERSION}: rebuild roicore")
MAX_THREADS = ROICORE_MAX_THREADS


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
        "formula": {"rfcn": ROICORE_PSROI_FORMULA_RFCN,
                    "torchvision": ROICORE_PSROI_FORMULA_TORCHVISION},
    },
    "RoIAlignRules": {
        "sampler": {"caffe2": ROICORE_SAMPLER_CAFFE2, "paddle": ROICORE_SAMPLER_PADDLE},
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
        "empty_grid": {"zero": ROICORE_EMPTY_GRID_ZERO, "nan": ROICORE_EMPTY_GRID_NAN},
        "backward_min_size_always": {False: 0, True: 1},
    },
    "PSRoIAlignRules": {
        "scale_precision": {"input": ROICORE_PRECISION_INPUT, "float32": ROICORE_PRECISION_FLOAT32},
    },
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


cdef int _fields(object rules, int64_t *out, int capacity) except -1:
    codes = rules_codes(rules)
    cdef int i
    for i in range(len(codes)):
        out[i] = codes[i]
    return len(codes)


# ---------------------------------------------------------------------------------------
# arrays and calls

cdef void *_data(object a, bint writable) except? NULL:
    """The data pointer of a C-contiguous buffer (the caller keeps `a` alive)."""
    cdef Py_buffer view
    PyObject_GetBuffer(a, &view, PyBUF_C_CONTIGUOUS | (PyBUF_WRITABLE if writable else 0))
    cdef void *p = view.buf
    PyBuffer_Release(&view)
    return p


cdef roicore_tensor _tensor(object a, bint writable, bint nhwc=False) except *:
    """A 4-D float32/float64 array as a tensor; with nhwc its axes are (n, h, w, c)."""
    cdef roicore_tensor t
    shape = a.shape
    t.data = _data(a, writable)
    t.dtype = ROICORE_FLOAT32 if a.dtype.itemsize == 4 else ROICORE_FLOAT64
    if nhwc:
        t.layout = ROICORE_NHWC
        t.n, t.h, t.w, t.c = shape[0], shape[1], shape[2], shape[3]
    else:
        t.layout = ROICORE_NCHW
        t.n, t.c, t.h, t.w = shape[0], shape[1], shape[2], shape[3]
    return t


cdef roicore_boxes _boxes(object coords, object batch, bint masked) except *:
    cdef roicore_boxes b
    b.k = batch.shape[0]
    b.coords = _data(coords, False) if coords is not None else NULL
    b.batch = <const int64_t *>_data(batch, False)
    b.masked = masked
    return b


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
        self.exec.n_threads = n_threads
        self.raised = []
        if _get_ident() == _MAIN_THREAD:  # only the main thread receives signals
            self.exec.poll = _poll
            self.exec.poll_arg = <void *>self.raised
        else:
            self.exec.poll = NULL
            self.exec.poll_arg = NULL
        self.err.code = ROICORE_OK
        self.err.message[0] = 0

    cdef int check(self, int status) except -1:
        if status == ROICORE_OK:
            return 0
        message = self.err.message.decode("utf-8", "replace")
        if status == ROICORE_ERR_INTERRUPTED and self.raised:
            raise self.raised[0]
        if status == ROICORE_ERR_INTERRUPTED:
            raise KeyboardInterrupt(message)
        if status == ROICORE_ERR_MEMORY:
            raise MemoryError(message)
        if status == ROICORE_ERR_UNSUPPORTED:
            raise NotImplementedError(message)
        raise ValueError(message)


cdef _rules_error(roicore_error *err):
    raise ValueError(err.message.decode("utf-8", "replace"))


def roi_pool_max_forward(rules, x, coords, batch, double spatial_scale, out, argmax,
                         int n_threads, bint masked=False):
    """Max pooling into `out` (and `argmax` unless None: int32 or int64, out's shape)."""
    cdef int64_t f[8]
    cdef roicore_max_pool_rules r
    cdef roicore_error e
    if roicore_max_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tx = _tensor(x, False), to = _tensor(out, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef void *am = _data(argmax, True) if argmax is not None else NULL
    cdef roicore_index_type at = ROICORE_INT32 if argmax is None or argmax.dtype.itemsize == 4 else ROICORE_INT64
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_roi_pool_max_forward(&r, &tx, &b, spatial_scale, &to, am, at,
                                              &call.exec, &call.err)
    call.check(status)


def roi_pool_max_backward(rules, grad_output, argmax, batch, grad_input, int n_threads,
                          bint masked=False):
    """Scatter grad_output to its argmax into grad_input (all of it written)."""
    cdef int64_t f[8]
    cdef roicore_max_pool_rules r
    cdef roicore_error e
    if roicore_max_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tg = _tensor(grad_output, False), tdx = _tensor(grad_input, True)
    cdef roicore_boxes b = _boxes(None, batch, masked)
    cdef const void *am = _data(argmax, False)
    cdef roicore_index_type at = ROICORE_INT32 if argmax.dtype.itemsize == 4 else ROICORE_INT64
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_roi_pool_max_backward(&r, &tg, am, at, &b, &tdx, &call.exec, &call.err)
    call.check(status)


def max_pool_argmax_dtype(rules, shape):
    """"int32" or "int64": the argmax a forward on an input of `shape` (N, C, H, W) writes."""
    cdef int64_t f[8]
    cdef roicore_max_pool_rules r
    cdef roicore_error e
    if roicore_max_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor t
    t.n, t.c, t.h, t.w = shape
    return "int32" if roicore_max_pool_argmax_type(&r, &t) == ROICORE_INT32 else "int64"


cdef roicore_bilinear_pool_rules _bilinear_rules(object rules) except *:
    cdef int64_t f[8]
    cdef roicore_bilinear_pool_rules r
    cdef roicore_error e
    if roicore_bilinear_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    return r


def roi_pool_bilinear_forward(rules, x, coords, batch, double extrapolation_value, out,
                              int n_threads, bint masked=False, bint nearest=False):
    """Bilinear (or, with nearest, nearest-neighbour) crops of x into `out`."""
    cdef roicore_bilinear_pool_rules r = _bilinear_rules(rules)
    cdef roicore_tensor tx = _tensor(x, False), to = _tensor(out, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        if nearest:
            status = roicore_roi_pool_nearest_forward(&r, &tx, &b, extrapolation_value, &to,
                                                      &call.exec, &call.err)
        else:
            status = roicore_roi_pool_bilinear_forward(&r, &tx, &b, extrapolation_value, &to,
                                                       &call.exec, &call.err)
    call.check(status)


def roi_pool_bilinear_backward(rules, grad_output, coords, batch, grad_input, int n_threads,
                               bint masked=False, bint nearest=False):
    """The crops' gradient with respect to the map into `grad_input` (all of it written)."""
    cdef roicore_bilinear_pool_rules r = _bilinear_rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, False), tdx = _tensor(grad_input, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        if nearest:
            status = roicore_roi_pool_nearest_backward(&r, &tg, &b, &tdx, &call.exec, &call.err)
        else:
            status = roicore_roi_pool_bilinear_backward(&r, &tg, &b, &tdx, &call.exec, &call.err)
    call.check(status)


def roi_pool_bilinear_boxes_backward(rules, grad_output, x, coords, batch, grad_boxes,
                                     int n_threads, bint masked=False):
    """The bilinear crops' gradient with respect to the boxes into `grad_boxes` (K, 4)."""
    cdef roicore_bilinear_pool_rules r = _bilinear_rules(rules)
    cdef roicore_tensor tg = _tensor(grad_output, False), tx = _tensor(x, False)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef void *gb = _data(grad_boxes, True)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_roi_pool_bilinear_boxes_backward(&r, &tg, &tx, &b, gb, &call.exec,
                                                          &call.err)
    call.check(status)


def psroi_pool_forward(rules, x, coords, batch, double spatial_scale, int64_t group_h,
                       int64_t group_w, out, int n_threads, bint masked=False):
    cdef int64_t f[8]
    cdef roicore_psroi_pool_rules r
    cdef roicore_error e
    if roicore_psroi_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tx = _tensor(x, False), to = _tensor(out, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_psroi_pool_forward(&r, &tx, &b, spatial_scale, group_h, group_w, &to,
                                            &call.exec, &call.err)
    call.check(status)


def psroi_pool_backward(rules, grad_output, coords, batch, double spatial_scale,
                        int64_t group_h, int64_t group_w, grad_input, int n_threads,
                        bint masked=False):
    cdef int64_t f[8]
    cdef roicore_psroi_pool_rules r
    cdef roicore_error e
    if roicore_psroi_pool_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tg = _tensor(grad_output, False), tdx = _tensor(grad_input, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_psroi_pool_backward(&r, &tg, &b, spatial_scale, group_h, group_w, &tdx,
                                             &call.exec, &call.err)
    call.check(status)


def roi_align_forward(rules, x, coords, batch, double spatial_scale, int64_t sampling_ratio,
                      bint aligned, out, int n_threads, bint masked=False):
    cdef int64_t f[8]
    cdef roicore_roi_align_rules r
    cdef roicore_error e
    if roicore_roi_align_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tx = _tensor(x, False), to = _tensor(out, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_roi_align_forward(&r, &tx, &b, spatial_scale, sampling_ratio, aligned,
                                           &to, &call.exec, &call.err)
    call.check(status)


def roi_align_backward(rules, grad_output, coords, batch, double spatial_scale,
                       int64_t sampling_ratio, bint aligned, grad_input, int n_threads,
                       bint masked=False):
    cdef int64_t f[8]
    cdef roicore_roi_align_rules r
    cdef roicore_error e
    if roicore_roi_align_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tg = _tensor(grad_output, False), tdx = _tensor(grad_input, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_roi_align_backward(&r, &tg, &b, spatial_scale, sampling_ratio, aligned,
                                            &tdx, &call.exec, &call.err)
    call.check(status)


def ps_roi_align_forward(rules, x, coords, batch, double spatial_scale, int64_t sampling_ratio,
                         out, int n_threads, bint masked=False):
    cdef int64_t f[8]
    cdef roicore_ps_roi_align_rules r
    cdef roicore_error e
    if roicore_ps_roi_align_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tx = _tensor(x, False), to = _tensor(out, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_ps_roi_align_forward(&r, &tx, &b, spatial_scale, sampling_ratio, &to,
                                              &call.exec, &call.err)
    call.check(status)


def ps_roi_align_backward(rules, grad_output, coords, batch, double spatial_scale,
                          int64_t sampling_ratio, grad_input, int n_threads, bint masked=False):
    cdef int64_t f[8]
    cdef roicore_ps_roi_align_rules r
    cdef roicore_error e
    if roicore_ps_roi_align_rules_from_array(f, _fields(rules, f, 8), &r, &e):
        _rules_error(&e)
    cdef roicore_tensor tg = _tensor(grad_output, False), tdx = _tensor(grad_input, True)
    cdef roicore_boxes b = _boxes(coords, batch, masked)
    cdef _Call call = _Call(n_threads)
    cdef int status
    with nogil:
        status = roicore_ps_roi_align_backward(&r, &tg, &b, spatial_scale, sampling_ratio, &tdx,
                                               &call.exec, &call.err)
    call.check(status)


# ---------------------------------------------------------------------------------------
# boxes

ctypedef fused real:
    float
    double


def batch_from_column(const real[:] column, int64_t n_images, int64_t[::1] batch,
                      bint masked=False):
    """A (K, 5) box array's float batch column (any stride) into int64 `batch`; None when
    every value is an integer in [0, n_images) (or, with masked, negative), else the C
    API's message."""
    cdef roicore_error e
    cdef int64_t k = column.shape[0]
    if k != batch.shape[0]:
        raise ValueError(f"batch must have {k} entries, got {batch.shape[0]}")
    if k == 0:
        return None
    cdef roicore_dtype dt = ROICORE_FLOAT32 if real is float else ROICORE_FLOAT64
    if roicore_batch_from_column(&column[0], dt, column.strides[0] // sizeof(real), k, n_images,
                                 masked, &batch[0], &e):
        return e.message.decode("utf-8", "replace")
    return None


def batch_in_range(const int64_t[::1] batch, int64_t n_images):
    """True when every index is in [0, n_images)."""
    cdef int64_t k
    for k in range(batch.shape[0]):
        if batch[k] < 0 or batch[k] >= n_images:
            return False
    return True


def coords_ok(coords, double scale_x, double scale_y):
    """True when every coordinate of C-contiguous (K, 4) float32/float64 `coords` is finite
    and, times the scale of its axis (0: not checked), within 2**24 feature-map pixels."""
    cdef roicore_error e
    cdef int64_t k = coords.shape[0]
    cdef roicore_dtype dt = ROICORE_FLOAT32 if coords.dtype.itemsize == 4 else ROICORE_FLOAT64
    cdef const void *p = _data(coords, False) if k else NULL
    return roicore_check_coords(p, dt, k, scale_x, scale_y, &e) == ROICORE_OK


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
    roicore_set_memory_limit(nbytes)


def release_scratch():
    return roicore_release_scratch()
