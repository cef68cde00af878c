# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""roicore compiled kernels: RoI max / bilinear pooling, PS-RoI pooling and RoIAlign.

Contract (the Python layer in ``ops.py`` guarantees all of it; nothing here re-checks):

* Layout: feature maps and gradients are C-contiguous NCHW; boxes are C-contiguous (K, 4)
  ``x1, y1, x2, y2`` in the feature dtype; ``batch`` is int64 (K,) with ``0 <= b < N``;
  box coordinates are finite and, once scaled, within +-2**24, so every float-to-int
  conversion below is defined; outputs are preallocated, gradients zero-filled.
* Arithmetic: each expression is written in the operand dtype and order of the framework
  kernels it reproduces (see ``conventions.py`` and ../shared/spec/semantics.md), because
  that is what makes results bit-identical.  The build disables FMA contraction.
* Threads: forward passes parallelise over independent outputs; backward passes
  parallelise over input channels, each thread owning whole gradient planes and adding in
  the frameworks' serial (roi, channel, ph, pw, sample) order.  No atomics, no reductions
  across threads, so results are bit-identical for every thread count.
* All work runs without the GIL; the only shared state is the caller's arrays.
"""
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.math cimport floor, ceil, round, fma, fmaf, NAN
from libc.stdint cimport int32_t, int64_t

import numpy as np

cdef extern from "roicore_omp.h":
    int ROICORE_HAVE_OPENMP
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil

cdef extern from "roicore_simd.h":
    void roicore_max_bin_f32(const float* img, int64_t W, int64_t C, int64_t h0, int64_t h1,
                             int64_t w0, int64_t w1, float initial, float* acc,
                             int32_t* arg) noexcept nogil
    void roicore_max_bin_f64(const double* img, int64_t W, int64_t C, int64_t h0, int64_t h1,
                             int64_t w0, int64_t w1, double initial, double* acc,
                             int32_t* arg) noexcept nogil
    void roicore_bilinear_acc_f32(float* acc, const float* a, const float* b, const float* c,
                                  const float* d, float w1, float w2, float w3, float w4,
                                  int64_t n) noexcept nogil
    void roicore_bilinear_acc_f64(double* acc, const double* a, const double* b, const double* c,
                                  const double* d, double w1, double w2, double w3, double w4,
                                  int64_t n) noexcept nogil
    void roicore_scaled_add_f32(float* dst, const float* g, float w, float count,
                                int64_t n) noexcept nogil
    void roicore_scaled_add_f64(double* dst, const double* g, double w, double count,
                                int64_t n) noexcept nogil

ctypedef fused index_t:
    int32_t
    int64_t

# Bin arithmetic of the integer (Fast R-CNN) RoI.
cdef enum:
    BINS_FLOAT32 = 0
    BINS_FLOAT64 = 1
    BINS_EXACT = 2

# Running-max comparison.
cdef enum:
    CMP_GREATER = 0
    CMP_STD_MAX = 1
    CMP_FMAX = 2

# RoIAlign sampler.
cdef enum:
    SAMPLER_CAFFE2 = 0
    SAMPLER_PADDLE = 1


def openmp_enabled():
    """True when the extension was compiled with OpenMP."""
    return bool(ROICORE_HAVE_OPENMP)


def omp_max_threads():
    """``omp_get_max_threads()`` (1 without OpenMP): follows OMP_NUM_THREADS and threadpoolctl."""
    return omp_get_max_threads()


cdef inline object _dtype(floating witness):
    return np.float32 if floating is float else np.float64


cdef inline Py_ssize_t _padded(Py_ssize_t C) noexcept nogil:
    """Row length of (bin, channel) scratch buffers: C plus one cache line, so that rows
    are not a power of two apart (with C = 512 floats, 49 rows 2 KiB apart share two L1
    sets and evict each other during the transposed write-out)."""
    return C + 16


cdef inline int64_t _clamp(int64_t v, int64_t lo, int64_t hi) noexcept nogil:
    return lo if v < lo else (hi if v > hi else v)


# ---------------------------------------------------------------------------------------
# RoI max pooling (Fast R-CNN integer RoI)
# ---------------------------------------------------------------------------------------

cdef inline void _integer_roi_bins(floating lo, floating hi, floating scale, Py_ssize_t P,
                                   Py_ssize_t size, int mode, bint product_double,
                                   int64_t* start, int64_t* end) noexcept nogil:
    """Bin edges along one axis: round(x*s) (half away from zero; the product in the input
    dtype or in double), +1, at least 1 pixel, floor/ceil of p*rh/P in the requested
    arithmetic, then clamp to [0, size]."""
    cdef int64_t s, e
    if product_double:
        s = <int64_t>round(<double>lo * <double>scale)
        e = <int64_t>round(<double>hi * <double>scale)
    else:
        s = <int64_t>round(lo * scale)
        e = <int64_t>round(hi * scale)
    cdef int64_t r = e - s + 1
    cdef int64_t a, b
    cdef float bin32
    cdef double bin64
    cdef Py_ssize_t p
    if r < 1:
        r = 1  # malformed (reversed) boxes become one pixel
    bin32 = <float>r / <float>P
    bin64 = <double>r / <double>P
    for p in range(P):
        if mode == BINS_EXACT:
            a = (p * r) // P
            b = ((p + 1) * r + P - 1) // P
        elif mode == BINS_FLOAT32:
            a = <int64_t>floor(<float>p * bin32)
            b = <int64_t>ceil(<float>(p + 1) * bin32)
        else:
            a = <int64_t>floor(<double>p * bin64)
            b = <int64_t>ceil(<double>(p + 1) * bin64)
        start[p] = _clamp(a + s, 0, size)
        end[p] = _clamp(b + s, 0, size)


cdef inline void _max_pool_plane(const floating* plane, Py_ssize_t W,
                                 Py_ssize_t PH, Py_ssize_t PW,
                                 const int64_t* hs, const int64_t* he,
                                 const int64_t* ws, const int64_t* we,
                                 int compare, floating initial, bint start_first,
                                 floating* out, index_t* amax) noexcept nogil:
    cdef Py_ssize_t ph, pw, h, w
    cdef floating m, v
    cdef int64_t a
    for ph in range(PH):
        for pw in range(PW):
            if he[ph] <= hs[ph] or we[pw] <= ws[pw]:
                out[ph * PW + pw] = 0  # empty bin: 0, nothing to route a gradient to
                amax[ph * PW + pw] = -1
                continue
            if start_first:  # OpenVINO's JIT kernel: the running max starts at the bin's first element
                a = hs[ph] * W + ws[pw]
                m = plane[a]
            else:
                m = initial
                a = -1
            for h in range(hs[ph], he[ph]):
                for w in range(ws[pw], we[pw]):
                    v = plane[h * W + w]
                    if compare == CMP_GREATER:
                        if v > m:
                            m = v
                            a = h * W + w
                    elif compare == CMP_STD_MAX:
                        if not (v < m):  # m = std::max(v, m)
                            m = v
                            a = h * W + w
                    else:  # fmax from a NaN start: NaN ignored, first maximum kept
                        if v > m or (m != m and v == v):
                            m = v
                            a = h * W + w
            out[ph * PW + pw] = m
            amax[ph * PW + pw] = <index_t>a


def roi_pool_max_forward(const floating[:, :, :, ::1] x,      # IN  (N, C, H, W)
                         const floating[:, ::1] boxes,         # IN  (K, 4)
                         const int64_t[::1] batch,             # IN  (K,)
                         double spatial_scale, int bin_mode, bint product_double,
                         int compare, double initial, bint start_first,
                         floating[:, :, :, ::1] out,           # OUT (K, C, PH, PW)
                         index_t[:, :, :, ::1] argmax,         # OUT (K, C, PH, PW), or empty
                         bint global_index, int n_threads):
    """Max pooling.  ``argmax`` may have K = 0 rows: then it is not computed.  It holds
    ``h*W + w``, or with ``global_index`` the flat index into x (MXNet); -1 for no pixel.

    With the "greater" rule (no first-element start) the work is channel-vectorised on an
    NHWC copy of x: each bin's running maxima over all channels are one contiguous vector,
    updated with branch-free selects, which the compiler turns into SIMD.  The other rules
    (std::max, fmax, first-element start) keep the per-plane scalar loop.  Both visit the
    pixels of a bin in the same row-major order, so they give the same bits.
    """
    cdef Py_ssize_t K = boxes.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t k, kc, c
    cdef bint want_argmax = argmax.shape[0] == K
    cdef floating scale = <floating>spatial_scale
    cdef floating init = <floating>initial
    if K == 0 or C == 0:
        return
    cdef int64_t[:, ::1] hs = np.empty((K, PH), np.int64)
    cdef int64_t[:, ::1] he = np.empty((K, PH), np.int64)
    cdef int64_t[:, ::1] ws = np.empty((K, PW), np.int64)
    cdef int64_t[:, ::1] we = np.empty((K, PW), np.int64)
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            _integer_roi_bins(boxes[k, 1], boxes[k, 3], scale, PH, H, bin_mode, product_double,
                              &hs[k, 0], &he[k, 0])
            _integer_roi_bins(boxes[k, 0], boxes[k, 2], scale, PW, W, bin_mode, product_double,
                              &ws[k, 0], &we[k, 0])
    if compare == CMP_GREATER and not start_first and H * W < 2**31:
        _max_pool_channels_last(_to_nhwc(x, n_threads), batch, hs, he, ws, we, init, out,
                                argmax, want_argmax, n_threads)
    else:
        if not want_argmax:
            argmax = np.empty((K, C, PH, PW), np.int64 if index_t is int64_t else np.int32)
        with nogil:
            for kc in prange(K * C, num_threads=n_threads, schedule="guided"):
                k = kc // C
                c = kc % C
                _max_pool_plane(&x[batch[k], c, 0, 0], W, PH, PW,
                                &hs[k, 0], &he[k, 0], &ws[k, 0], &we[k, 0],
                                compare, init, start_first, &out[k, c, 0, 0], &argmax[k, c, 0, 0])
    if want_argmax and global_index:
        _plane_to_global(argmax, batch, C, H * W, n_threads)


cdef void _plane_to_global(index_t[:, :, :, ::1] argmax, const int64_t[::1] batch, Py_ssize_t C,
                           Py_ssize_t HW, int n_threads) noexcept:
    """h*W + w -> flat index into (N, C, H, W), in place; -1 stays -1."""
    cdef Py_ssize_t K = argmax.shape[0], P = argmax.shape[2] * argmax.shape[3], kc, k, c, p
    cdef index_t* a
    cdef int64_t base
    with nogil:
        for kc in prange(K * C, num_threads=n_threads, schedule="static"):
            k = kc // C
            c = kc % C
            base = (batch[k] * C + c) * HW
            a = &argmax[k, c, 0, 0]
            for p in range(P):
                if a[p] >= 0:
                    a[p] = <index_t>(a[p] + base)


def check_argmax(const index_t[:, :, :, ::1] argmax, const int64_t[::1] batch, Py_ssize_t HW,
                 bint global_index, int n_threads=1):
    """Validation, not computation: the first flat position whose value is neither -1 nor
    a pixel of its own (box, channel) plane, or -1 when all are valid.  The backward
    kernel writes through these indices, so ops.py refuses the call on any bad one.
    Counted in parallel; the first bad position is searched for only when there is one."""
    cdef Py_ssize_t K = argmax.shape[0], C = argmax.shape[1], P = argmax.shape[2] * argmax.shape[3]
    cdef Py_ssize_t kc, p
    cdef int64_t lo, v, n_bad = 0
    cdef const index_t* a
    with nogil:
        for kc in prange(K * C, num_threads=n_threads, schedule="static"):
            lo = (batch[kc // C] * C + kc % C) * HW if global_index else 0
            a = &argmax[kc // C, kc % C, 0, 0]
            for p in range(P):
                v = a[p]
                n_bad += (v != -1) and (v < lo or v >= lo + HW)
    if n_bad == 0:
        return -1
    for kc in range(K * C):
        lo = (batch[kc // C] * C + kc % C) * HW if global_index else 0
        a = &argmax[kc // C, kc % C, 0, 0]
        for p in range(P):
            v = a[p]
            if v != -1 and (v < lo or v >= lo + HW):
                return kc * P + p


cdef floating[:, :, :, ::1] _to_nhwc(const floating[:, :, :, ::1] x, int n_threads):
    """A C-contiguous (N, H, W, C) copy of x, written in parallel."""
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t nh, n, h, w, c
    cdef floating[:, :, :, ::1] xt = np.empty((N, H, W, C), _dtype(<floating>0))
    with nogil:
        for nh in prange(N * H, num_threads=n_threads, schedule="static"):
            n = nh // H
            h = nh % H
            for c in range(C):
                for w in range(W):
                    xt[n, h, w, c] = x[n, c, h, w]
    return xt


cdef void _max_pool_channels_last(const floating[:, :, :, ::1] xt, const int64_t[::1] batch,
                                  const int64_t[:, ::1] hs, const int64_t[:, ::1] he,
                                  const int64_t[:, ::1] ws, const int64_t[:, ::1] we,
                                  floating initial, floating[:, :, :, ::1] out,
                                  index_t[:, :, :, ::1] argmax, bint want_argmax, int n_threads):
    """One box per task: accumulate (bin, channel) maxima in a thread-local buffer, then
    write the box's (C, PH, PW) output block."""
    cdef Py_ssize_t K = out.shape[0], C = out.shape[1], PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t W = xt.shape[2], P = PH * PW, Cs = _padded(C)
    cdef Py_ssize_t k, ph, pw, p, h, w, c
    # one (bin, channel) accumulator per thread, indexed by the OpenMP thread number
    cdef floating[:, ::1] acc_buf = np.empty((n_threads, P * Cs), _dtype(<floating>0))
    cdef int32_t[:, ::1] arg_buf = np.empty((n_threads, P * Cs), np.int32)
    cdef floating* acc
    cdef int32_t* arg
    cdef floating* acc_p
    cdef int32_t* arg_p
    cdef floating* out_k
    cdef index_t* arg_k
    with nogil, parallel(num_threads=n_threads):
        acc = &acc_buf[omp_get_thread_num(), 0]
        arg = &arg_buf[omp_get_thread_num(), 0]
        for k in prange(K, schedule="guided"):
            for ph in range(PH):
                for pw in range(PW):
                    p = ph * PW + pw
                    acc_p = acc + p * Cs
                    arg_p = arg + p * Cs
                    if he[k, ph] <= hs[k, ph] or we[k, pw] <= ws[k, pw]:
                        for c in range(C):
                            acc_p[c] = 0  # empty bin: 0, argmax -1
                            arg_p[c] = -1
                        continue
                    if floating is float:
                        roicore_max_bin_f32(&xt[batch[k], 0, 0, 0], W, C, hs[k, ph], he[k, ph],
                                            ws[k, pw], we[k, pw], initial, acc_p,
                                            arg_p if want_argmax else NULL)
                    else:
                        roicore_max_bin_f64(&xt[batch[k], 0, 0, 0], W, C, hs[k, ph], he[k, ph],
                                            ws[k, pw], we[k, pw], initial, acc_p,
                                            arg_p if want_argmax else NULL)
            # (bin, channel) -> the box's (channel, bin) output block
            out_k = &out[k, 0, 0, 0]
            for c in range(C):
                for p in range(P):
                    out_k[c * P + p] = acc[p * Cs + c]
            if want_argmax:
                arg_k = &argmax[k, 0, 0, 0]
                for c in range(C):
                    for p in range(P):
                        arg_k[c * P + p] = <index_t>arg[p * Cs + c]


def roi_pool_max_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, C, PH, PW)
                          const index_t[:, :, :, ::1] argmax,        # IN  (K, C, PH, PW), checked
                          const int64_t[::1] batch,                  # IN  (K,)
                          bint global_index,
                          floating[:, :, :, ::1] grad_input,         # OUT (N, C, H, W), zeroed
                          int n_threads):
    """Scatter each output gradient to its argmax.  Each thread owns a contiguous block of
    channels and walks the boxes in order, reading each box's block of (channel, bin)
    gradients and indices as one contiguous run; per channel the additions keep the
    frameworks' (box, ph, pw) order, so no atomics are needed and every thread count gives
    the same bits."""
    cdef Py_ssize_t K = grad_output.shape[0], C = grad_output.shape[1]
    cdef Py_ssize_t P = grad_output.shape[2] * grad_output.shape[3]
    cdef Py_ssize_t HW = grad_input.shape[2] * grad_input.shape[3]
    cdef Py_ssize_t blk, c0, c1, c, k, p
    cdef int n_blocks = <int>min(n_threads, C)
    cdef floating* plane
    cdef const floating* g
    cdef const index_t* a
    if K == 0 or C == 0:
        return
    with nogil:
        for blk in prange(n_blocks, num_threads=n_threads, schedule="static"):
            c0 = blk * C // n_blocks
            c1 = (blk + 1) * C // n_blocks
            for k in range(K):
                for c in range(c0, c1):
                    plane = &grad_input[batch[k], c, 0, 0]
                    if global_index:  # make a flat index relative to this plane
                        plane = plane - (batch[k] * C + c) * HW
                    g = &grad_output[k, c, 0, 0]
                    a = &argmax[k, c, 0, 0]
                    for p in range(P):
                        if a[p] >= 0:
                            plane[a[p]] += g[p]


# ---------------------------------------------------------------------------------------
# Bilinear RoI pooling (OpenVINO ROIPooling "bilinear" = TF crop_and_resize sampling)
# ---------------------------------------------------------------------------------------

cdef inline floating _crop_coord(floating lo, floating hi, Py_ssize_t size, Py_ssize_t P,
                                 Py_ssize_t p, bint pin_last) noexcept nogil:
    """Sample position p of P on a normalised [lo, hi] box, corners included."""
    cdef floating step
    if P == 1:
        return <floating>(0.5 * (lo + hi) * <double>(size - 1))  # centre, in double
    if pin_last and p == P - 1:
        return <floating>(size - 1) * hi
    step = (hi - lo) * <floating>(size - 1) / <floating>(P - 1)
    return lo * <floating>(size - 1) + <floating>p * step


cdef inline void _crop_coords(floating x1, floating y1, floating x2, floating y2,
                              Py_ssize_t H, Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW,
                              bint pin_last, floating* ys, floating* xs) noexcept nogil:
    cdef Py_ssize_t p
    for p in range(PH):
        ys[p] = _crop_coord(y1, y2, H, PH, p, pin_last)
    for p in range(PW):
        xs[p] = _crop_coord(x1, x2, W, PW, p, pin_last)


cdef inline floating _lerp(floating a, floating b, floating t, bint fused) noexcept nogil:
    """a + (b - a) * t, rounded twice (TF, OpenVINO reference) or once (fused, OpenVINO CPU)."""
    if not fused:
        return a + (b - a) * t
    if floating is float:
        return fmaf(b - a, t, a)
    return fma(b - a, t, a)


def roi_pool_bilinear_forward(const floating[:, :, :, ::1] x,   # IN  (N, C, H, W)
                              const floating[:, ::1] boxes,      # IN  (K, 4), normalised
                              const int64_t[::1] batch,          # IN  (K,)
                              bint pin_last, bint fused_lerp, double extrapolation_value,
                              floating[:, :, :, ::1] out,        # OUT (K, C, PH, PW)
                              int n_threads):
    cdef Py_ssize_t K = boxes.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t k, kc, c, ph, pw, t, b, l, r
    cdef floating fill = <floating>extrapolation_value
    cdef floating y, xx, ly, lx, top, bottom
    cdef const floating* plane
    if K == 0 or C == 0:
        return
    cdef floating[:, ::1] ys = np.empty((K, PH), _dtype(<floating>0))
    cdef floating[:, ::1] xs = np.empty((K, PW), _dtype(<floating>0))
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            _crop_coords(boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3], H, W, PH, PW, pin_last,
                         &ys[k, 0], &xs[k, 0])
        for kc in prange(K * C, num_threads=n_threads, schedule="guided"):
            k = kc // C
            c = kc % C
            plane = &x[batch[k], c, 0, 0]
            for ph in range(PH):
                y = ys[k, ph]
                for pw in range(PW):
                    xx = xs[k, pw]
                    if y < 0 or y > <floating>(H - 1) or xx < 0 or xx > <floating>(W - 1):
                        out[k, c, ph, pw] = fill
                        continue
                    t = <Py_ssize_t>floor(y)
                    b = <Py_ssize_t>ceil(y)
                    l = <Py_ssize_t>floor(xx)
                    r = <Py_ssize_t>ceil(xx)
                    ly = y - <floating>t
                    lx = xx - <floating>l
                    top = _lerp(plane[t * W + l], plane[t * W + r], lx, fused_lerp)
                    bottom = _lerp(plane[b * W + l], plane[b * W + r], lx, fused_lerp)
                    out[k, c, ph, pw] = _lerp(top, bottom, ly, fused_lerp)


def roi_pool_bilinear_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, C, PH, PW)
                               const floating[:, ::1] boxes,              # IN  (K, 4), normalised
                               const int64_t[::1] batch,                  # IN  (K,)
                               bint pin_last,
                               floating[:, :, :, ::1] grad_input,         # OUT (N, C, H, W), zeroed
                               int n_threads):
    """Adjoint of the forward in TF CropAndResizeGradImage's arithmetic and order."""
    cdef Py_ssize_t K = grad_output.shape[0], C = grad_output.shape[1]
    cdef Py_ssize_t H = grad_input.shape[2], W = grad_input.shape[3]
    cdef Py_ssize_t PH = grad_output.shape[2], PW = grad_output.shape[3]
    cdef Py_ssize_t k, c, ph, pw, t, b, l, r
    cdef floating y, xx, ly, lx, g, dtop, dbottom
    cdef floating* plane
    if K == 0 or C == 0:
        return
    cdef floating[:, ::1] ys = np.empty((K, PH), _dtype(<floating>0))
    cdef floating[:, ::1] xs = np.empty((K, PW), _dtype(<floating>0))
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            _crop_coords(boxes[k, 0], boxes[k, 1], boxes[k, 2], boxes[k, 3], H, W, PH, PW, pin_last,
                         &ys[k, 0], &xs[k, 0])
        for c in prange(C, num_threads=n_threads, schedule="static"):
            for k in range(K):
                plane = &grad_input[batch[k], c, 0, 0]
                for ph in range(PH):
                    y = ys[k, ph]
                    if y < 0 or y > <floating>(H - 1):
                        continue
                    t = <Py_ssize_t>floor(y)
                    b = <Py_ssize_t>ceil(y)
                    ly = y - <floating>t
                    for pw in range(PW):
                        xx = xs[k, pw]
                        if xx < 0 or xx > <floating>(W - 1):
                            continue
                        l = <Py_ssize_t>floor(xx)
                        r = <Py_ssize_t>ceil(xx)
                        lx = xx - <floating>l
                        g = grad_output[k, c, ph, pw]
                        # <floating>1: a bare 1 would make Cython emit the double 1.0
                        dtop = (<floating>1 - ly) * g
                        plane[t * W + l] += (<floating>1 - lx) * dtop
                        plane[t * W + r] += lx * dtop
                        dbottom = ly * g
                        plane[b * W + l] += (<floating>1 - lx) * dbottom
                        plane[b * W + r] += lx * dbottom


# ---------------------------------------------------------------------------------------
# Position-sensitive RoI pooling (R-FCN float RoI, average)
# ---------------------------------------------------------------------------------------

cdef inline void _float_roi_bins(floating lo, floating hi, floating scale, Py_ssize_t P,
                                 Py_ssize_t size, int64_t* start, int64_t* end) noexcept nogil:
    """R-FCN bins: round *before* scaling, +1 before scaling, at least 0.1 wide, the
    start offset added before floor/ceil, then clamp to [0, size]."""
    cdef floating s = <floating>round(lo) * scale
    cdef floating e = <floating>(round(hi) + 1.) * scale
    cdef floating r = e - s
    cdef floating bin_size
    cdef Py_ssize_t p
    if r < <floating>0.1:
        r = <floating>0.1
    bin_size = r / <floating>P
    for p in range(P):
        start[p] = _clamp(<int64_t>floor(<floating>p * bin_size + s), 0, size)
        end[p] = _clamp(<int64_t>ceil(<floating>(p + 1) * bin_size + s), 0, size)


cdef inline Py_ssize_t _group_of(floating p, Py_ssize_t G, Py_ssize_t P) noexcept nogil:
    """MXNet's group cell of pooled cell p (given in the feature dtype): floor(p * G / P),
    clamped to [0, G-1].  With G == P this is p itself (Paddle's mapping)."""
    cdef Py_ssize_t g = <Py_ssize_t>floor(p * <floating>G / <floating>P)
    return 0 if g < 0 else (G - 1 if g > G - 1 else g)


cdef tuple _float_roi_bin_tables(const floating[:, ::1] boxes, floating scale, Py_ssize_t PH,
                                 Py_ssize_t PW, Py_ssize_t H, Py_ssize_t W, int n_threads):
    """(hs, he, ws, we): every box's R-FCN bin edges, rows (K, PH) and columns (K, PW)."""
    cdef Py_ssize_t K = boxes.shape[0], k
    cdef int64_t[:, ::1] hs = np.empty((K, PH), np.int64)
    cdef int64_t[:, ::1] he = np.empty((K, PH), np.int64)
    cdef int64_t[:, ::1] ws = np.empty((K, PW), np.int64)
    cdef int64_t[:, ::1] we = np.empty((K, PW), np.int64)
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            _float_roi_bins(boxes[k, 1], boxes[k, 3], scale, PH, H, &hs[k, 0], &he[k, 0])
            _float_roi_bins(boxes[k, 0], boxes[k, 2], scale, PW, W, &ws[k, 0], &we[k, 0])
    return hs.base, he.base, ws.base, we.base


cdef _group_ranges(Py_ssize_t G, Py_ssize_t P, floating witness):
    """For each group cell g, the pooled cells p with _group_of(p) == g: [first[g], stop[g]).
    The map is non-decreasing in p, so each group's cells are one contiguous range."""
    first = np.full(G, P, np.intp)
    stop = np.zeros(G, np.intp)
    cdef Py_ssize_t p, g
    for p in range(P):
        g = _group_of(<floating>p, G, P)
        first[g] = min(first[g], p)
        stop[g] = max(stop[g], p + 1)
    return first, stop


def psroi_pool_forward(const floating[:, :, :, ::1] x,   # IN  (N, C_in, H, W), C_in = D*GH*GW
                       const floating[:, ::1] boxes,      # IN  (K, 4)
                       const int64_t[::1] batch,          # IN  (K,)
                       double spatial_scale, Py_ssize_t GH, Py_ssize_t GW,
                       floating[:, :, :, ::1] out,        # OUT (K, D, PH, PW)
                       int n_threads):
    """One input channel per task: its plane stays in cache while every box pools the
    bins that read it (each output reads exactly one input channel, so tasks write
    disjoint outputs).  Sums run h-outer, w-inner from 0, as the frameworks'."""
    cdef Py_ssize_t K = boxes.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t D = out.shape[1], PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t k, cin, d, gh, gw, ph, pw, h, w
    cdef floating scale = <floating>spatial_scale
    cdef floating acc
    cdef const floating* plane
    if K == 0 or D == 0:
        return
    bins = _float_roi_bin_tables(boxes, scale, PH, PW, H, W, n_threads)
    cdef int64_t[:, ::1] hs = bins[0], he = bins[1], ws = bins[2], we = bins[3]
    row_first, row_stop = _group_ranges(GH, PH, scale)
    col_first, col_stop = _group_ranges(GW, PW, scale)
    cdef Py_ssize_t[::1] r0 = row_first, r1 = row_stop, q0 = col_first, q1 = col_stop
    with nogil:
        for cin in prange(C, num_threads=n_threads, schedule="static"):
            d = cin // (GH * GW)
            gh = (cin % (GH * GW)) // GW
            gw = cin % GW
            for k in range(K):
                plane = &x[batch[k], cin, 0, 0]
                for ph in range(r0[gh], r1[gh]):
                    for pw in range(q0[gw], q1[gw]):
                        if he[k, ph] <= hs[k, ph] or we[k, pw] <= ws[k, pw]:
                            out[k, d, ph, pw] = 0
                            continue
                        acc = 0
                        for h in range(hs[k, ph], he[k, ph]):
                            for w in range(ws[k, pw], we[k, pw]):
                                acc = acc + plane[h * W + w]
                        out[k, d, ph, pw] = acc / <floating>((he[k, ph] - hs[k, ph]) * (we[k, pw] - ws[k, pw]))


def psroi_pool_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, D, PH, PW)
                        const floating[:, ::1] boxes,              # IN  (K, 4)
                        const int64_t[::1] batch,                  # IN  (K,)
                        double spatial_scale, Py_ssize_t GH, Py_ssize_t GW,
                        floating[:, :, :, ::1] grad_input,         # OUT (N, C_in, H, W), zeroed
                        int n_threads):
    """One input channel per task, in the serial (box, ph, pw) order within it."""
    cdef Py_ssize_t K = grad_output.shape[0], D = grad_output.shape[1]
    cdef Py_ssize_t PH = grad_output.shape[2], PW = grad_output.shape[3]
    cdef Py_ssize_t C = grad_input.shape[1], H = grad_input.shape[2], W = grad_input.shape[3]
    cdef Py_ssize_t k, cin, d, gh, gw, ph, pw, h, w
    cdef floating scale = <floating>spatial_scale
    cdef floating diff
    cdef floating* plane
    if K == 0 or D == 0:
        return
    bins = _float_roi_bin_tables(boxes, scale, PH, PW, H, W, n_threads)
    cdef int64_t[:, ::1] hs = bins[0], he = bins[1], ws = bins[2], we = bins[3]
    row_first, row_stop = _group_ranges(GH, PH, scale)
    col_first, col_stop = _group_ranges(GW, PW, scale)
    cdef Py_ssize_t[::1] r0 = row_first, r1 = row_stop, q0 = col_first, q1 = col_stop
    with nogil:
        for cin in prange(C, num_threads=n_threads, schedule="static"):
            d = cin // (GH * GW)
            gh = (cin % (GH * GW)) // GW
            gw = cin % GW
            for k in range(K):
                plane = &grad_input[batch[k], cin, 0, 0]
                for ph in range(r0[gh], r1[gh]):
                    if he[k, ph] <= hs[k, ph]:
                        continue
                    for pw in range(q0[gw], q1[gw]):
                        if we[k, pw] <= ws[k, pw]:
                            continue
                        diff = grad_output[k, d, ph, pw] / <floating>(
                            (he[k, ph] - hs[k, ph]) * (we[k, pw] - ws[k, pw]))
                        for h in range(hs[k, ph], he[k, ph]):
                            for w in range(ws[k, pw], we[k, pw]):
                                plane[h * W + w] += diff


# ---------------------------------------------------------------------------------------
# RoIAlign
# ---------------------------------------------------------------------------------------
# Sample positions are separable: row samples depend on (ph, iy) only and column samples
# on (pw, ix) only.  Each box gets a table per axis of (low index, high index, weight of
# low, weight of high), built once and shared by every channel; index -1 marks a sample
# outside [-1, size], which the frameworks keep in the average as 0 * v[0].

cdef inline void _align_box(floating lo, floating hi, floating scale, floating offset,
                            Py_ssize_t P, int sampling_ratio, bint min_size_one,
                            floating* start, floating* bin_size, int64_t* grid) noexcept nogil:
    cdef floating a = lo * scale - offset
    cdef floating size = hi * scale - offset - a
    if min_size_one and size < 1:
        size = 1
    bin_size[0] = size / <floating>P
    if sampling_ratio > 0:
        grid[0] = sampling_ratio
    else:
        grid[0] = <int64_t>ceil(size / <floating>P)  # may be <= 0 for aligned empty boxes
    start[0] = a


cdef inline void _align_axis(floating start, floating bin_size, int64_t grid, Py_ssize_t P,
                             Py_ssize_t size, int sampler,
                             int64_t* lo_idx, int64_t* hi_idx,
                             floating* lo_w, floating* hi_w) noexcept nogil:
    """Fill the P*grid samples of one axis, in (p, i) order."""
    cdef Py_ssize_t p, i, j = 0
    cdef floating v, frac
    cdef int64_t low
    for p in range(P):
        for i in range(grid):
            if sampler == SAMPLER_CAFFE2:
                v = start + <floating>p * bin_size + <floating>(i + .5) * bin_size / <floating>grid
            else:
                v = start + bin_size * (<floating>p + <floating>(i + .5) / <floating>grid)
            if v < -1.0 or v > size:
                lo_idx[j] = -1
                hi_idx[j] = -1
                lo_w[j] = 0
                hi_w[j] = 0
                j = j + 1
                continue
            if v <= 0:
                v = 0
            low = <int64_t>v
            if low >= size - 1:
                low = size - 1
                hi_idx[j] = low
                v = <floating>low
            else:
                hi_idx[j] = low + 1
            lo_idx[j] = low
            if sampler == SAMPLER_CAFFE2:
                frac = v - <floating>low      # weights 1 - l and l
                lo_w[j] = <floating>(1. - frac)
                hi_w[j] = frac
            else:
                frac = <floating>hi_idx[j] - v  # Paddle: weights (high - v) and 1 - that
                lo_w[j] = frac
                hi_w[j] = <floating>1 - frac
            j = j + 1


cdef class _SampleTables:
    """Per-box RoIAlign sample tables (rows and columns), ragged over boxes: box k's row
    samples are entries yoff[k] .. yoff[k+1] in (ph, iy) order, its columns likewise."""
    cdef public object ygrid, xgrid, yoff, xoff, ylo, yhi, ylw, yhw, xlo, xhi, xlw, xhw


cdef _SampleTables _align_tables(const floating[:, ::1] boxes, double spatial_scale, Py_ssize_t H, Py_ssize_t W,
                  Py_ssize_t PH, Py_ssize_t PW, int sampling_ratio, bint aligned,
                  bint min_size_one, int sampler, int n_threads):
    cdef Py_ssize_t K = boxes.shape[0], k
    cdef size_t j
    cdef floating scale = <floating>spatial_scale
    cdef floating offset = <floating>0.5 if aligned else <floating>0
    dtype = _dtype(<floating>0)
    starts = np.empty((K, 2), dtype)
    bins = np.empty((K, 2), dtype)
    grids = np.empty((K, 2), np.int64)
    cdef floating[:, ::1] st = starts
    cdef floating[:, ::1] bs = bins
    cdef int64_t[:, ::1] gr = grids
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            _align_box(boxes[k, 1], boxes[k, 3], scale, offset, PH, sampling_ratio, min_size_one,
                       &st[k, 0], &bs[k, 0], &gr[k, 0])
            _align_box(boxes[k, 0], boxes[k, 2], scale, offset, PW, sampling_ratio, min_size_one,
                       &st[k, 1], &bs[k, 1], &gr[k, 1])
    t = _SampleTables()
    t.ygrid = grids[:, 0].copy()
    t.xgrid = grids[:, 1].copy()
    ny = np.maximum(t.ygrid, 0) * PH
    nx = np.maximum(t.xgrid, 0) * PW
    t.yoff = np.concatenate([[0], np.cumsum(ny)]).astype(np.int64)
    t.xoff = np.concatenate([[0], np.cumsum(nx)]).astype(np.int64)
    ny_total, nx_total = int(t.yoff[K]), int(t.xoff[K])
    t.ylo = np.empty(ny_total, np.int64); t.yhi = np.empty(ny_total, np.int64)
    t.ylw = np.empty(ny_total, dtype); t.yhw = np.empty(ny_total, dtype)
    t.xlo = np.empty(nx_total, np.int64); t.xhi = np.empty(nx_total, np.int64)
    t.xlw = np.empty(nx_total, dtype); t.xhw = np.empty(nx_total, dtype)
    cdef int64_t[::1] yoff = t.yoff, xoff = t.xoff, ylo = t.ylo, yhi = t.yhi, xlo = t.xlo, xhi = t.xhi
    cdef floating[::1] ylw = t.ylw, yhw = t.yhw, xlw = t.xlw, xhw = t.xhw
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            if gr[k, 0] > 0:
                j = <size_t>yoff[k]
                _align_axis(st[k, 0], bs[k, 0], gr[k, 0], PH, H, sampler,
                            &ylo[j], &yhi[j], &ylw[j], &yhw[j])
            if gr[k, 1] > 0:
                j = <size_t>xoff[k]
                _align_axis(st[k, 1], bs[k, 1], gr[k, 1], PW, W, sampler,
                            &xlo[j], &xhi[j], &xlw[j], &xhw[j])
    return t


cdef inline void _bilinear_acc(floating* acc, const floating* a, const floating* b,
                               const floating* c, const floating* d, floating w1, floating w2,
                               floating w3, floating w4, Py_ssize_t n) noexcept nogil:
    if floating is float:
        roicore_bilinear_acc_f32(acc, a, b, c, d, w1, w2, w3, w4, n)
    else:
        roicore_bilinear_acc_f64(acc, a, b, c, d, w1, w2, w3, w4, n)


def roi_align_forward(const floating[:, :, :, ::1] x,   # IN  (N, C, H, W)
                      const floating[:, ::1] boxes,      # IN  (K, 4)
                      const int64_t[::1] batch,          # IN  (K,)
                      double spatial_scale, int sampling_ratio, bint aligned,
                      int sampler, bint empty_nan,
                      floating[:, :, :, ::1] out,        # OUT (K, C, PH, PW)
                      int n_threads):
    """One box per task on an NHWC copy of x: each sample's four weights are computed once
    and applied to whole channel vectors, in the frameworks' per-channel order."""
    cdef Py_ssize_t K = boxes.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t PH = out.shape[2], PW = out.shape[3], P = PH * PW, Cs = _padded(C)
    cdef Py_ssize_t k, c, p, ph, pw, iy, ix, jy, jx
    cdef int64_t gy, gx, y0, y1, x0, x1
    cdef floating wy0, wy1, wx0, wx1, zero = 0
    cdef floating* acc
    cdef floating* acc_p
    cdef floating* out_k
    cdef const floating* img
    if K == 0 or C == 0:
        return
    t = _align_tables(boxes, spatial_scale, H, W, PH, PW, sampling_ratio, aligned,
                      not aligned, sampler, n_threads)
    cdef int64_t[::1] ygrid = t.ygrid, xgrid = t.xgrid, yoff = t.yoff, xoff = t.xoff
    cdef int64_t[::1] ylo = t.ylo, yhi = t.yhi, xlo = t.xlo, xhi = t.xhi
    cdef floating[::1] ylw = t.ylw, yhw = t.yhw, xlw = t.xlw, xhw = t.xhw
    cdef floating[:, :, :, ::1] xt = _to_nhwc(x, n_threads)
    cdef floating[:, ::1] acc_buf = np.empty((n_threads, P * Cs), _dtype(<floating>0))
    with nogil, parallel(num_threads=n_threads):
        acc = &acc_buf[omp_get_thread_num(), 0]
        for k in prange(K, schedule="guided"):
            img = &xt[batch[k], 0, 0, 0]
            gy = ygrid[k]
            gx = xgrid[k]
            for p in range(P * Cs):
                acc[p] = 0
            if gy > 0 and gx > 0:
                for ph in range(PH):
                    for pw in range(PW):
                        acc_p = acc + (ph * PW + pw) * Cs
                        for iy in range(gy):
                            jy = yoff[k] + ph * gy + iy
                            y0 = ylo[jy]
                            for ix in range(gx):
                                jx = xoff[k] + pw * gx + ix
                                x0 = xlo[jx]
                                if y0 < 0 or x0 < 0:
                                    # outside the map: weights 0 at pixel (0, 0), as the frameworks
                                    _bilinear_acc(acc_p, img, img, img, img, zero, zero, zero, zero, C)
                                    continue
                                y1 = yhi[jy]
                                x1 = xhi[jx]
                                wy0 = ylw[jy]
                                wy1 = yhw[jy]
                                wx0 = xlw[jx]
                                wx1 = xhw[jx]
                                _bilinear_acc(acc_p, img + (y0 * W + x0) * C, img + (y0 * W + x1) * C,
                                              img + (y1 * W + x0) * C, img + (y1 * W + x1) * C,
                                              wy0 * wx0, wy0 * wx1, wy1 * wx0, wy1 * wx1, C)
            out_k = &out[k, 0, 0, 0]
            for c in range(C):
                for p in range(P):
                    if gy > 0 and gx > 0:
                        if sampler == SAMPLER_CAFFE2:
                            out_k[c * P + p] = acc[p * Cs + c] / <floating>(gy * gx)
                        else:  # Paddle multiplies by the reciprocal, computed in double
                            out_k[c * P + p] = acc[p * Cs + c] * <floating>(1.0 / <double>(gy * gx))
                    elif empty_nan:
                        out_k[c * P + p] = NAN  # Paddle: an empty sum times 1/0
                    else:
                        out_k[c * P + p] = 0


cdef inline void _scaled_add(floating* dst, const floating* g, floating w, floating count,
                             Py_ssize_t n) noexcept nogil:
    if floating is float:
        roicore_scaled_add_f32(dst, g, w, count, n)
    else:
        roicore_scaled_add_f64(dst, g, w, count, n)


cdef floating[:, :, ::1] _to_pc(const floating[:, :, :, ::1] g, int n_threads):
    """(K, C, PH, PW) -> (K, PH*PW, C) with rows padded to _padded(C) (see there)."""
    cdef Py_ssize_t K = g.shape[0], C = g.shape[1], P = g.shape[2] * g.shape[3], k, c, p
    cdef Py_ssize_t Cs = _padded(C)
    cdef floating[:, :, ::1] gt = np.empty((K, P, Cs), _dtype(<floating>0))
    cdef const floating* src
    cdef floating* dst
    with nogil:
        for k in prange(K, num_threads=n_threads, schedule="static"):
            src = &g[k, 0, 0, 0]
            dst = &gt[k, 0, 0]
            for c in range(C):
                for p in range(P):
                    dst[p * Cs + c] = src[c * P + p]
    return gt


def roi_align_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, C, PH, PW)
                       const floating[:, ::1] boxes,              # IN  (K, 4)
                       const int64_t[::1] batch,                  # IN  (K,)
                       double spatial_scale, int sampling_ratio, bint aligned,
                       bint min_size_always,
                       floating[:, :, :, ::1] grad_input,         # OUT (N, C, H, W), zeroed
                       int n_threads):
    """Caffe2 backward (MXNet, torchvision, and Paddle's backward).

    The gradient accumulates in an NHWC buffer, whole channel vectors per sample.  Each
    thread owns a contiguous block of channels and walks every box in (box, ph, pw, iy, ix)
    order, so each channel receives its additions in the frameworks' serial order: no
    atomics, and the same bits for any thread count.
    """
    cdef Py_ssize_t K = grad_output.shape[0], C = grad_output.shape[1]
    cdef Py_ssize_t N = grad_input.shape[0], H = grad_input.shape[2], W = grad_input.shape[3]
    cdef Py_ssize_t PH = grad_output.shape[2], PW = grad_output.shape[3]
    cdef Py_ssize_t blk, c0, n_c, k, ph, pw, iy, ix, jy, jx, n, h, w, c
    cdef int n_blocks = <int>min(n_threads, C)
    cdef int64_t gy, gx, y0, y1, x0, x1
    cdef floating count, wy0, wy1, wx0, wx1
    cdef floating* img
    cdef const floating* g
    if K == 0 or C == 0:
        return
    t = _align_tables(boxes, spatial_scale, H, W, PH, PW, sampling_ratio, aligned,
                      (not aligned) or min_size_always, SAMPLER_CAFFE2, n_threads)
    cdef int64_t[::1] ygrid = t.ygrid, xgrid = t.xgrid, yoff = t.yoff, xoff = t.xoff
    cdef int64_t[::1] ylo = t.ylo, yhi = t.yhi, xlo = t.xlo, xhi = t.xhi
    cdef floating[::1] ylw = t.ylw, yhw = t.yhw, xlw = t.xlw, xhw = t.xhw
    cdef floating[:, :, ::1] gt = _to_pc(grad_output, n_threads)
    cdef floating[:, :, :, ::1] dxt = np.zeros((N, H, W, C), _dtype(<floating>0))
    with nogil:
        for blk in prange(n_blocks, num_threads=n_threads, schedule="static"):
            c0 = blk * C // n_blocks
            n_c = (blk + 1) * C // n_blocks - c0
            for k in range(K):
                gy = ygrid[k]
                gx = xgrid[k]
                if gy <= 0 or gx <= 0:
                    continue
                count = <floating>(gy * gx)
                img = &dxt[batch[k], 0, 0, 0]
                for ph in range(PH):
                    for pw in range(PW):
                        g = &gt[k, ph * PW + pw, c0]
                        for iy in range(gy):
                            jy = yoff[k] + ph * gy + iy
                            y0 = ylo[jy]
                            if y0 < 0:
                                continue
                            y1 = yhi[jy]
                            wy0 = ylw[jy]
                            wy1 = yhw[jy]
                            for ix in range(gx):
                                jx = xoff[k] + pw * gx + ix
                                x0 = xlo[jx]
                                if x0 < 0:
                                    continue
                                x1 = xhi[jx]
                                wx0 = xlw[jx]
                                wx1 = xhw[jx]
                                _scaled_add(img + (y0 * W + x0) * C + c0, g, wy0 * wx0, count, n_c)
                                _scaled_add(img + (y0 * W + x1) * C + c0, g, wy0 * wx1, count, n_c)
                                _scaled_add(img + (y1 * W + x0) * C + c0, g, wy1 * wx0, count, n_c)
                                _scaled_add(img + (y1 * W + x1) * C + c0, g, wy1 * wx1, count, n_c)
        for n in prange(N, num_threads=n_threads, schedule="static"):
            for c in range(C):
                for h in range(H):
                    for w in range(W):
                        grad_input[n, c, h, w] = dxt[n, h, w, c]
