# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""roicore compiled kernels: RoI max / bilinear pooling, PS-RoI pooling and RoIAlign.

Contract (the Python layer in ``ops.py`` guarantees all of it; nothing here re-checks,
except the max-pool backward, which follows an argmax value only when it lies in its own
(box, channel) plane and returns the count of those that do not, so that validating the
argmax costs no extra pass over it):

* Layout: feature maps and gradients are C-contiguous NCHW; boxes are C-contiguous (K, 4)
  ``x1, y1, x2, y2`` in the feature dtype; ``batch`` is int64 (K,) with ``0 <= b < N``;
  box coordinates are finite and, once scaled, within +-2**24, so every float-to-int
  conversion below is defined; outputs are preallocated; a gradient arrives zero-filled
  unless the kernel's docstring says it writes all of it.
* Arithmetic: each expression is written in the operand dtype and order of the framework
  kernels it reproduces (see ``conventions.py`` and ../shared/spec/semantics.md), because
  that is what makes results bit-identical.  The build disables FMA contraction.
* Threads: forward passes parallelise over independent outputs; backward passes
  parallelise over input channels, each thread owning whole gradient planes and adding in
  the frameworks' serial (roi, channel, ph, pw, sample) order.  No atomics, no reductions
  across threads, so results are bit-identical for every thread count.
* All work runs without the GIL; the only shared state is the caller's arrays and each
  call's own task counters (_line_rows).
"""
from cython cimport floating
from cython.parallel cimport parallel, prange
from libc.math cimport floor, ceil, round, fma, fmaf, fabs, NAN, INFINITY
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcpy, memset

import numpy as np

from roicore.core import _memory

cdef extern from "roicore_omp.h":
    int ROICORE_HAVE_OPENMP
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    int64_t roicore_take(int64_t* next) noexcept nogil
    void roicore_done(int64_t* count) noexcept nogil
    void roicore_await(int64_t* count, int64_t target) noexcept nogil
    void roicore_leave(int64_t* left) noexcept nogil

cdef extern from "roicore_simd.h":
    ctypedef struct roicore_pending:
        int64_t left
    void roicore_pending_set(roicore_pending* p, void* dst, const void* src, int64_t nbytes,
                             int64_t steps) noexcept nogil
    void roicore_pending_finish_all(roicore_pending* p, int n) noexcept nogil
    void roicore_max_box_f32(const float* img, int64_t W, int64_t C, int64_t PH, int64_t PW,
                             const int64_t* hs, const int64_t* he, const int64_t* ws,
                             const int64_t* we, float initial, float* acc, int32_t* arg,
                             int32_t abase, int32_t astep, roicore_pending* pend,
                             int npend) noexcept nogil
    void roicore_max_box_f64(const double* img, int64_t W, int64_t C, int64_t PH, int64_t PW,
                             const int64_t* hs, const int64_t* he, const int64_t* ws,
                             const int64_t* we, double initial, double* acc, int32_t* arg,
                             int32_t abase, int32_t astep, roicore_pending* pend,
                             int npend) noexcept nogil
    void roicore_align_bin_f32(const float* img, int64_t W, int64_t C, int64_t gy,
                               const int64_t* ylo, const int64_t* yhi, const float* ylw,
                               const float* yhw, int64_t gx, const int64_t* xlo,
                               const int64_t* xhi, const float* xlw, const float* xhw,
                               float norm, int divide, float* out) noexcept nogil
    void roicore_align_bin_f64(const double* img, int64_t W, int64_t C, int64_t gy,
                               const int64_t* ylo, const int64_t* yhi, const double* ylw,
                               const double* yhw, int64_t gx, const int64_t* xlo,
                               const int64_t* xhi, const double* xlw, const double* xhw,
                               double norm, int divide, double* out) noexcept nogil
    void roicore_align_box_f32(const float* img, int64_t W, int64_t PH, int64_t PW, int64_t gy,
                               const int64_t* ylo, const int64_t* yhi, const float* ylw,
                               const float* yhw, int64_t gx, const int64_t* xlo,
                               const int64_t* xhi, const float* xlw, const float* xhw,
                               float norm, int divide, float* out, roicore_pending* pend,
                               int npend) noexcept nogil
    void roicore_align_box_f64(const double* img, int64_t W, int64_t PH, int64_t PW, int64_t gy,
                               const int64_t* ylo, const int64_t* yhi, const double* ylw,
                               const double* yhw, int64_t gx, const int64_t* xlo,
                               const int64_t* xhi, const double* xlw, const double* xhw,
                               double norm, int divide, double* out, roicore_pending* pend,
                               int npend) noexcept nogil
    void roicore_align_box_grad_f32(float* img, int64_t W, int64_t PH, int64_t PW, int64_t gy,
                                    const int64_t* ylo, const int64_t* yhi, const float* ylw,
                                    const float* yhw, int64_t gx, const int64_t* xlo,
                                    const int64_t* xhi, const float* xlw, const float* xhw,
                                    const float* g, float count) noexcept nogil
    void roicore_align_box_grad_f64(double* img, int64_t W, int64_t PH, int64_t PW, int64_t gy,
                                    const int64_t* ylo, const int64_t* yhi, const double* ylw,
                                    const double* yhw, int64_t gx, const int64_t* xlo,
                                    const int64_t* xhi, const double* xlw, const double* xhw,
                                    const double* g, double count) noexcept nogil
    void roicore_align_bin_grad_f32(float* img, int64_t W, int64_t C, int64_t n, int64_t gy,
                                    const int64_t* ylo, const int64_t* yhi, const float* ylw,
                                    const float* yhw, int64_t gx, const int64_t* xlo,
                                    const int64_t* xhi, const float* xlw, const float* xhw,
                                    const float* g, float count) noexcept nogil
    void roicore_align_bin_grad_f64(double* img, int64_t W, int64_t C, int64_t n, int64_t gy,
                                    const int64_t* ylo, const int64_t* yhi, const double* ylw,
                                    const double* yhw, int64_t gx, const int64_t* xlo,
                                    const int64_t* xhi, const double* xlw, const double* xhw,
                                    const double* g, double count) noexcept nogil
    enum:
        ROICORE_PAD_ROWS
        ROICORE_WIDE_ROWS
    void roicore_transpose_f32(const float* src, int64_t in_stride, int64_t R, int64_t Cc,
                               float* dst, int64_t out_stride, int flags) noexcept nogil
    void roicore_transpose_f64(const double* src, int64_t in_stride, int64_t R, int64_t Cc,
                               double* dst, int64_t out_stride, int flags) noexcept nogil
    void roicore_transpose_i32(const int32_t* src, int64_t in_stride, int64_t R, int64_t Cc,
                               int32_t* dst, int64_t out_stride, int flags) noexcept nogil
    void roicore_stream_copy(void* dst, const void* src, int64_t nbytes) noexcept nogil
    void roicore_stream_fence() noexcept nogil
    void roicore_transpose_i32_i64(const int32_t* src, int64_t in_stride, int64_t R, int64_t Cc,
                                   int64_t* dst, int64_t out_stride) noexcept nogil
    void roicore_offset_indices_i32(int32_t* a, int64_t rows, int64_t n, int64_t base,
                                    int64_t step) noexcept nogil
    void roicore_offset_indices_i64(int64_t* a, int64_t rows, int64_t n, int64_t base,
                                    int64_t step) noexcept nogil
    ctypedef struct roicore_ps_plan:
        int64_t K, PH, PW, GW
        const int64_t* batch
        const int64_t* hs
        const int64_t* he
        const int64_t* ws
        const int64_t* we
        const int64_t* r0
        const int64_t* r1
        const int64_t* q0
        const int64_t* q1
    void roicore_ps_cell_mean_f32(const roicore_ps_plan* c, int64_t cell, const float* slab,
                                  int64_t img_size, int64_t W, int64_t S, int64_t M,
                                  float* dst) noexcept nogil
    void roicore_ps_cell_mean_f64(const roicore_ps_plan* c, int64_t cell, const double* slab,
                                  int64_t img_size, int64_t W, int64_t S, int64_t M,
                                  double* dst) noexcept nogil
    void roicore_ps_cell_add_f32(const roicore_ps_plan* c, int64_t cell, float* slab,
                                 int64_t img_size, int64_t W, int64_t S, int64_t D,
                                 const float* g, int64_t gbox, float* diff) noexcept nogil
    void roicore_ps_cell_add_f64(const roicore_ps_plan* c, int64_t cell, double* slab,
                                 int64_t img_size, int64_t W, int64_t S, int64_t D,
                                 const double* g, int64_t gbox, double* diff) noexcept nogil

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

# Outputs of this many bytes or more are written with non-temporal stores (roicore_simd.h).
cdef enum:
    STREAM_BYTES = 8 << 20

# The max-pool backward scatters into this many bytes of gradient planes at a time.
cdef enum:
    SCATTER_BYTES = 256 << 10

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


# The box checks' common case, one C pass each (_validate finds and reports a culprit):
# as NumPy reductions they took 10-25 us of a 0.5 ms PS-RoI call, once the kernel before
# had evicted the interpreter from the caches.

def box_reach(const floating[:, ::1] coords):
    """The largest |coordinate| in ``coords``, or inf when any is not finite."""
    cdef Py_ssize_t i, n = coords.shape[0] * coords.shape[1]
    cdef const floating* c = &coords[0, 0] if n else NULL
    cdef double reach = 0, v
    for i in range(n):
        v = fabs(c[i])
        if not v <= reach:  # larger, or NaN
            if not v < INFINITY:
                return INFINITY
            reach = v
    return reach


def batch_in_range(const int64_t[::1] batch, int64_t n_images):
    """True when every index is in [0, n_images)."""
    cdef Py_ssize_t k
    for k in range(batch.shape[0]):
        if batch[k] < 0 or batch[k] >= n_images:
            return False
    return True


def batch_column(const floating[:] column, int64_t n_images, int64_t[::1] batch):
    """The float batch column of (K, 5) boxes (MXNet's rois) as int64 indices in `batch`:
    True when every value is an integer in [0, n_images), else False (`batch` then partly
    written).  As NumPy checks (finite, integral, in range, then the cast) it took 25 us
    for 300 boxes, warm."""
    cdef Py_ssize_t k
    cdef floating v
    for k in range(column.shape[0]):
        v = column[k]
        if not (v >= 0 and <double>v < <double>n_images):  # NaN too; exact up to 2**53
            return False
        batch[k] = <int64_t>v
        if <floating>batch[k] != v:
            return False
    return True


cdef enum:
    PROBE_STREAM = 0  # bandwidth_probe modes
    PROBE_STORE = 1
    PROBE_READ = 2

# the modes by the names ``roicore bench --scaling`` prints, in its order
PROBE_MODES = {"streaming stores": PROBE_STREAM, "plain stores": PROBE_STORE,
               "reads": PROBE_READ}


def bandwidth_probe(unsigned char[::1] buf, int mode, int n_threads):
    """One pass over `buf`, each of n_threads threads over its contiguous share: mode 0
    writes it with non-temporal stores (as the forwards write large outputs, see
    roicore_stream_copy), 1 with plain stores, 2 reads it.  ``roicore bench --scaling``
    times it at 1 and N threads: the machine's memory bandwidth, which bounds how far a
    bandwidth-bound pass can scale.  Returns a checksum of what a read saw (0 otherwise),
    so that the reads cannot be optimised away."""
    cdef Py_ssize_t n = buf.shape[0], t, lo, hi, i
    # random bytes: on these VMs pages of zeros were written almost twice as fast (37 GB/s
    # from one core against 22), which no pooled output would see
    cdef unsigned char[:, ::1] src = np.random.default_rng(0).integers(
        1, 256, (max(n_threads, 1), 4096), np.uint8)
    cdef int64_t total = 0, part
    cdef const int64_t* words
    if n == 0:
        return 0
    with nogil:
        for t in prange(n_threads, num_threads=n_threads, schedule="static"):
            lo = n * t // n_threads // 64 * 64
            hi = n if t == n_threads - 1 else n * (t + 1) // n_threads // 64 * 64
            if mode == PROBE_STREAM or mode == PROBE_STORE:
                i = lo
                while i < hi:
                    if mode == PROBE_STREAM:
                        roicore_stream_copy(&buf[i], &src[t, 0], min(<Py_ssize_t>4096, hi - i))
                    else:
                        memcpy(&buf[i], &src[t, 0], min(<Py_ssize_t>4096, hi - i))
                    i = i + 4096
            else:
                words = <const int64_t*>&buf[lo]
                part = 0
                for i in range((hi - lo) // 8):
                    part = part + words[i]
                total += part
        roicore_stream_fence()
    return total


# Kernel scratch comes from _memory.empty, 64-byte aligned like the outputs: np.empty
# aligns to 16 bytes, and the kernels' buffers, read and written in 32-byte vectors, then
# split an access across cache lines every other time (PS-RoI's slabs took 276-282 us to
# build instead of 255-260: R-FCN, 1 thread, C harness).  Rows of per-thread buffers are
# whole lines.

cdef inline Py_ssize_t _lines(Py_ssize_t n, floating witness) noexcept nogil:
    """n rounded up to whole 64-byte lines of values, so that consecutive blocks of a
    scratch array stay aligned."""
    cdef Py_ssize_t per_line = 64 // sizeof(floating)
    return (n + per_line - 1) // per_line * per_line


cdef inline object _dtype(floating witness):
    return np.float32 if floating is float else np.float64


cdef inline void _zero(floating[:, :, :, ::1] a) noexcept nogil:
    """Every element of C-contiguous `a` to 0."""
    cdef Py_ssize_t n = a.shape[0] * a.shape[1] * a.shape[2] * a.shape[3]
    if n:
        memset(&a[0, 0, 0, 0], 0, n * sizeof(floating))


cdef enum:
    LINE_INT64 = 64 // sizeof(int64_t)  # int64 values per 64-byte cache line


cdef int64_t[:, ::1] _line_rows(Py_ssize_t rows, Py_ssize_t nbytes):
    """`rows` zeroed rows of at least `nbytes` each, every row on cache lines of its own:
    for per-thread state and the shared task counters.  Two cores writing to one line
    (false sharing) pass it back and forth on every write.  Rows of np.zeros (16-byte
    aligned) shared lines: RoIAlign's 32-byte pending write-outs always, the max pool's 64
    bytes whenever the array started off a line; and the counters, locals on the calling
    thread's stack, shared lines with each other and with that thread's variables."""
    cdef Py_ssize_t per_row = (nbytes + 63) // 64 * LINE_INT64
    a = _memory.empty((rows, per_row), np.int64)
    a.fill(0)
    return a


cdef inline int _table_threads(Py_ssize_t K, int n_threads) noexcept nogil:
    """Threads for a per-box table loop (a few dozen operations per box): one below 8192
    boxes.  Waking a sleeping thread team (OMP_WAIT_POLICY=PASSIVE) costs more than such a
    loop over a few hundred boxes; every parallel region saved counts on small workloads."""
    return n_threads if K >= 8192 else 1


cdef inline Py_ssize_t _align_block(floating witness) noexcept nogil:
    """Channels per block of the RoIAlign kernels' blocked layout: 256 bytes per pixel, the
    8 vector registers of roicore_align_box / roicore_align_box_grad."""
    return 64 if floating is float else 32


cdef inline int64_t _clamp(int64_t v, int64_t lo, int64_t hi) noexcept nogil:
    return lo if v < lo else (hi if v > hi else v)


cdef inline void _unpack(const floating* src, Py_ssize_t stride, Py_ssize_t P, Py_ssize_t C,
                         floating* dst, Py_ssize_t cstride, bint wide=False) noexcept nogil:
    """(pixel or bin, channel) rows `stride` apart -> channel planes `cstride` apart:
    dst[c*cstride + p] = src[p*stride + c].  With `wide`, each row may be read up to
    round_up(C, 8) values (faster channel tail)."""
    cdef int flags = ROICORE_WIDE_ROWS if wide else 0
    if floating is float:
        roicore_transpose_f32(src, stride, P, C, dst, cstride, flags)
    else:
        roicore_transpose_f64(src, stride, P, C, dst, cstride, flags)


cdef inline void _unpack_index(const int32_t* src, Py_ssize_t stride, Py_ssize_t P,
                               Py_ssize_t C, index_t* dst) noexcept nogil:
    if index_t is int32_t:
        roicore_transpose_i32(src, stride, P, C, dst, P, 0)
    else:
        roicore_transpose_i32_i64(src, stride, P, C, dst, P)


cdef inline void _pack(const floating* src, Py_ssize_t cstride, Py_ssize_t P, Py_ssize_t C,
                       floating* dst, Py_ssize_t stride, bint pad=False) noexcept nogil:
    """Channel planes `cstride` apart -> (pixel or bin, channel) rows `stride` apart:
    dst[p*stride + c] = src[c*cstride + p].  With `pad`, rows get round_up(C, 8) values,
    the last channel repeated (stride must allow it)."""
    cdef int flags = ROICORE_PAD_ROWS if pad else 0
    if floating is float:
        roicore_transpose_f32(src, cstride, C, P, dst, stride, flags)
    else:
        roicore_transpose_f64(src, cstride, C, P, dst, stride, flags)


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

    With the "greater" rule (no first-element start) the work is channel-vectorised on a
    channel-blocked copy of x (see _max_pool_blocked): each bin's running maxima over a
    block's channels are contiguous vectors, updated with branch-free selects, which the
    compiler turns into SIMD.  The other rules
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
        for k in prange(K, num_threads=_table_threads(K, n_threads), schedule="static"):
            _integer_roi_bins(boxes[k, 1], boxes[k, 3], scale, PH, H, bin_mode, product_double,
                              &hs[k, 0], &he[k, 0])
            _integer_roi_bins(boxes[k, 0], boxes[k, 2], scale, PW, W, bin_mode, product_double,
                              &ws[k, 0], &we[k, 0])
    if compare == CMP_GREATER and not start_first and H * W < 2**31:
        _max_pool_blocked(x, batch, hs, he, ws, we, init, out, argmax, want_argmax,
                          global_index, n_threads)
        return
    if not want_argmax:
        argmax = np.empty((K, C, PH, PW), np.int64 if index_t is int64_t else np.int32)
    with nogil:
        for kc in prange(K * C, num_threads=n_threads, schedule="guided"):
            k = kc // C
            c = kc % C
            _max_pool_plane(&x[batch[k], c, 0, 0], W, PH, PW,
                            &hs[k, 0], &he[k, 0], &ws[k, 0], &we[k, 0],
                            compare, init, start_first, &out[k, c, 0, 0], &argmax[k, c, 0, 0])
    if want_argmax and global_index:  # the channels-last path does this per box, above
        with nogil:
            for k in prange(K, num_threads=n_threads, schedule="static"):
                _to_global(&argmax[k, 0, 0, 0], C, PH * PW, batch[k] * C * H * W, H * W)


cdef inline void _to_global(index_t* a, Py_ssize_t planes, Py_ssize_t P, int64_t base,
                            Py_ssize_t HW) noexcept nogil:
    """`planes` consecutive argmax planes of P values, the first that of channel plane
    `base / HW` of x: h*W + w -> flat index into x, in place; -1 stays -1."""
    if index_t is int32_t:
        roicore_offset_indices_i32(a, planes, P, base, HW)
    else:
        roicore_offset_indices_i64(a, planes, P, base, HW)


cdef inline void _pack_blocks(const floating[:, :, :, ::1] x, floating* xb, Py_ssize_t B,
                              int64_t* next, int64_t* packed) noexcept nogil:
    """The channel-blocked copy of x into xb (x's size), made by the threads of the
    kernel's own region: image n's channels c0 .. c0+nb (nb = min(B, C - c0)) become an
    (H, W, nb) array at the same offset c0*H*W, so a block's pixels are nb contiguous
    values and its whole map is one contiguous run.  Threads take (block, image) tasks,
    block-major, from `next`; packed[cb * LINE_INT64] (one _line_rows row per block)
    counts block cb's images done (_await_block).  A region of its own cost a wake-up of
    the sleeping threads and split the copy statically: 0.59 ms at 2 threads against 0.36
    at 1 for the 3.9 MB map of fastrcnn_vgg16 (one box, warm caches)."""
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], HW = x.shape[2] * x.shape[3]
    cdef Py_ssize_t n_cb = (C + B - 1) // B, cb, n, c0, nb
    cdef int64_t task = roicore_take(next)
    while task < N * n_cb:
        cb = task // N
        n = task % N
        c0 = cb * B
        nb = min(B, C - c0)
        _pack(&x[n, c0, 0, 0], HW, HW, nb, xb + (n * C + c0) * HW, nb)
        roicore_done(packed + cb * LINE_INT64)
        task = roicore_take(next)


cdef inline void _await_block(const int64_t* packed, Py_ssize_t cb, Py_ssize_t N) noexcept nogil:
    """Wait until every image of block cb is packed (_pack_blocks)."""
    roicore_await(<int64_t*>packed + cb * LINE_INT64, N)


cdef void _max_pool_blocked(const floating[:, :, :, ::1] x, const int64_t[::1] batch,
                            const int64_t[:, ::1] hs, const int64_t[:, ::1] he,
                            const int64_t[:, ::1] ws, const int64_t[:, ::1] we,
                            floating initial, floating[:, :, :, ::1] out,
                            index_t[:, :, :, ::1] argmax, bint want_argmax,
                            bint global_index, int n_threads):
    """One (channel block, box) pair per task, on a channel-blocked copy of x (blocks of
    B = 64 floats or 32 doubles, as RoIAlign's): each bin's running maxima over the block
    are accumulated in a thread-local (bin, channel) buffer, which is then transposed into
    the output's contiguous (channel, bin) block, through a staging buffer and
    non-temporal stores when the output is large (see roicore_stream_copy), streamed during
    the thread's next task (roicore_pending); the argmax likewise.  Whole-box buffers over
    all channels were 1.6 MB at c4_14x14 (1024 channels x 14 x 14 bins, values and
    indices), so the transposes read them back from L3; a block's are 100 KB and stay in
    L2.  Tasks run block-major, so a thread's consecutive tasks read the same block of the
    map.  A global argmax in int32 (MXNet's) gets each plane's offset into x from the
    kernel as it stores a bin; an int64 one is offset after widening."""
    cdef Py_ssize_t K = out.shape[0], C = out.shape[1], PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t H = x.shape[2], W = x.shape[3], HW = H * W, P = PH * PW
    cdef Py_ssize_t B = _align_block(<floating>0)
    cdef Py_ssize_t n_cb = (C + B - 1) // B, task, cb, c0, nb, k
    cdef Py_ssize_t N = x.shape[0], ready, base
    cdef floating[::1] xb = _memory.empty((max(x.size, 1),), _dtype(<floating>0))
    # per thread: (bin, channel) maxima, then the staged (channel, bin) block
    cdef floating[:, ::1] acc_buf = _memory.empty((n_threads, 2 * P * B), _dtype(<floating>0))
    cdef int32_t[:, ::1] arg_buf = _memory.empty((n_threads, P * B), np.int32)
    cdef index_t[:, ::1] arg_staged_buf = _memory.empty(
        (n_threads, P * B), np.int64 if index_t is int64_t else np.int32)
    cdef bint stream = out.size * sizeof(floating) >= STREAM_BYTES
    cdef bint offset_in_kernel = global_index and index_t is int32_t
    cdef int32_t astep = HW if offset_in_kernel else 0, abase
    # per thread: the write-outs the next task streams (see roicore_pending): values, argmax
    cdef int64_t[:, ::1] pend_buf = _line_rows(n_threads, 2 * sizeof(roicore_pending))
    cdef roicore_pending* pend
    cdef int npend
    cdef const floating* img
    cdef floating* acc
    cdef floating* staged
    cdef int32_t* arg
    cdef index_t* arg_staged
    cdef floating* out_k
    cdef index_t* arg_k
    cdef index_t* arg_dst
    # Tasks come from a shared counter in block-major order (consecutive tasks read the same
    # block of the map), one at a time, so that a short last block leaves no thread idle;
    # locals then persist from task to task, which the pending write-out needs.
    # the next task, the next packing task, then per block its packed images
    cdef int64_t[:, ::1] counters = _line_rows(2 + n_cb, sizeof(int64_t))
    cdef int64_t* next_task = &counters[0, 0]
    cdef int64_t* next_pack = &counters[1, 0]
    cdef int64_t* packed = &counters[2, 0]
    with nogil, parallel(num_threads=n_threads):
        acc = &acc_buf[omp_get_thread_num(), 0]
        staged = acc + P * B
        arg = &arg_buf[omp_get_thread_num(), 0]
        arg_staged = &arg_staged_buf[omp_get_thread_num(), 0]
        pend = <roicore_pending*>&pend_buf[omp_get_thread_num(), 0]
        npend = 0
        _pack_blocks(x, &xb[0], B, next_pack, packed)
        ready = -1
        task = roicore_take(next_task)
        while task < n_cb * K:
            cb = task // K
            k = task % K
            c0 = cb * B
            nb = min(B, C - c0)
            if cb != ready:
                _await_block(packed, cb, N)
                ready = cb
            base = (batch[k] * C + c0) * HW  # the block's first plane, in xb and in x
            img = &xb[0] + base
            abase = <int32_t>base if offset_in_kernel else 0
            # streams out the previous task's staged blocks as it goes, and finishes them
            if floating is float:
                roicore_max_box_f32(img, W, nb, PH, PW, &hs[k, 0], &he[k, 0], &ws[k, 0],
                                    &we[k, 0], initial, acc, arg if want_argmax else NULL,
                                    abase, astep, pend, npend)
            else:
                roicore_max_box_f64(img, W, nb, PH, PW, &hs[k, 0], &he[k, 0], &ws[k, 0],
                                    &we[k, 0], initial, acc, arg if want_argmax else NULL,
                                    abase, astep, pend, npend)
            out_k = &out[k, c0, 0, 0]
            if stream:
                _unpack(acc, nb, P, nb, staged, P)
                roicore_pending_set(&pend[0], out_k, staged, nb * P * sizeof(floating), PH)
                npend = 1
            else:
                _unpack(acc, nb, P, nb, out_k, P)
            if want_argmax:
                arg_k = &argmax[k, c0, 0, 0]
                arg_dst = arg_staged if stream else arg_k
                _unpack_index(arg, nb, P, nb, arg_dst)
                if global_index and not offset_in_kernel:
                    _to_global(arg_dst, nb, P, base, HW)
                if stream:
                    roicore_pending_set(&pend[1], arg_k, arg_staged, nb * P * sizeof(index_t), PH)
                    npend = 2
            task = roicore_take(next_task)
        roicore_pending_finish_all(pend, npend)  # the last task's blocks
        roicore_stream_fence()


def roi_pool_max_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, C, PH, PW)
                          const index_t[:, :, :, ::1] argmax,        # IN  (K, C, PH, PW)
                          const int64_t[::1] batch,                  # IN  (K,)
                          bint global_index,
                          floating[:, :, :, ::1] grad_input,         # OUT (N, C, H, W)
                          int n_threads):
    """Scatter each output gradient to its argmax; returns the number of argmax values
    that are neither -1 nor a pixel of their own (box, channel) plane.  Writes every
    element of grad_input: each plane is zeroed here first, by the task that owns it.

    Such values are skipped, never followed, and ops.py raises when the count is not 0:
    validating here, in the same pass, saves a separate read of the whole argmax (as much
    data as the gradient itself).  A task owns a run of channels whose gradient planes
    fill SCATTER_BYTES, so that the scattered additions stay in L2 (512 planes of 64 x 64
    at c4_14x14 are 8 MB), and walks the boxes in order, reading each box's (channel, bin)
    gradients and indices of the run as one contiguous piece; per channel the additions
    keep the frameworks' (box, ph, pw) order, so no atomics are needed and every thread
    count gives the same bits.  Threads take the tasks one at a time (16 at
    fastrcnn_vgg16, 64 at c4_14x14): with half the channels fixed to each of 2 threads,
    the one that fell behind (these VMs lose CPU time to their neighbours) set the time,
    45.9-47.9 ms against 39.0-40.4 ms taking tasks at fastrcnn_vgg16, 167 against 138 ms
    at c4_14x14."""
    cdef Py_ssize_t K = grad_output.shape[0], C = grad_output.shape[1]
    cdef Py_ssize_t P = grad_output.shape[2] * grad_output.shape[3]
    cdef Py_ssize_t N = grad_input.shape[0], HW = grad_input.shape[2] * grad_input.shape[3]
    cdef Py_ssize_t part = max(1, SCATTER_BYTES // (HW * <Py_ssize_t>sizeof(floating)))
    cdef Py_ssize_t n_parts = (C + part - 1) // part, i, cs, ce, c, k, p, n
    cdef int64_t lo, v, n_bad = 0
    cdef floating* plane
    cdef const floating* g
    cdef const index_t* a
    if K == 0 or C == 0:
        _zero(grad_input)  # nothing to add: dx is all zeros
        return 0
    with nogil:
        for i in prange(n_parts, num_threads=n_threads, schedule="dynamic"):
            cs = i * part
            ce = min(cs + part, C)
            for n in range(N):  # the run's planes, in L2 for the additions that follow
                memset(&grad_input[n, cs, 0, 0], 0, (ce - cs) * HW * sizeof(floating))
            for k in range(K):
                for c in range(cs, ce):
                    plane = &grad_input[batch[k], c, 0, 0]
                    lo = (batch[k] * C + c) * HW if global_index else 0
                    g = &grad_output[k, c, 0, 0]
                    a = &argmax[k, c, 0, 0]
                    for p in range(P):
                        v = a[p] - lo
                        if 0 <= v < HW:
                            plane[v] += g[p]
                        elif a[p] != -1:
                            n_bad += 1
    return n_bad


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


cdef class _PSPlan:
    """Everything PS-RoI pooling needs besides the data: each box's R-FCN bin edges (rows
    hs/he (K, PH), columns ws/we (K, PW)), and for each group cell g the pooled cells p with
    _group_of(p) == g, rows [r0[g], r1[g]) and columns [q0[g], q1[g]) (the map is
    non-decreasing, so each is one range).  Input channel cin = (d*GH + gh)*GW + gw feeds
    exactly the pooled cells of its group: M at most, numbered row-major in the group.
    The box tables are only allocated here; the kernel's threads fill them (_ps_fill).
    All tables live in one int64 array; ``c`` points into it (and at the caller's batch,
    so a plan must not outlive the call that made it).  Separate arrays and memoryviews
    for each table cost 12 us per call, 3 % of an R-FCN forward."""
    cdef object tables
    cdef int64_t* hs  # c's box tables, writable, for _ps_fill
    cdef int64_t* he
    cdef int64_t* ws
    cdef int64_t* we
    cdef roicore_ps_plan c
    cdef Py_ssize_t M


cdef _PSPlan _ps_plan(Py_ssize_t K, Py_ssize_t PH, Py_ssize_t PW, Py_ssize_t GH, Py_ssize_t GW,
                      const int64_t[::1] batch, floating witness):
    cdef _PSPlan plan = _PSPlan.__new__(_PSPlan)
    plan.tables = np.empty(2 * K * (PH + PW) + 2 * (GH + GW), np.int64)
    cdef int64_t[::1] tables = plan.tables
    plan.hs = &tables[0]
    plan.he = plan.hs + K * PH
    plan.ws = plan.he + K * PH
    plan.we = plan.ws + K * PW
    cdef int64_t* r0 = plan.we + K * PW
    cdef int64_t* r1 = r0 + GH
    cdef int64_t* q0 = r1 + GH
    cdef int64_t* q1 = q0 + GW
    _group_ranges(GH, PH, r0, r1, witness)
    _group_ranges(GW, PW, q0, q1, witness)
    cdef Py_ssize_t g, rows = 0, cols = 0
    for g in range(GH):
        rows = max(rows, r1[g] - r0[g])
    for g in range(GW):
        cols = max(cols, q1[g] - q0[g])
    plan.M = rows * cols
    plan.c.K = K
    plan.c.PH = PH
    plan.c.PW = PW
    plan.c.GW = GW
    plan.c.batch = &batch[0]
    plan.c.hs = plan.hs
    plan.c.he = plan.he
    plan.c.ws = plan.ws
    plan.c.we = plan.we
    plan.c.r0 = r0
    plan.c.r1 = r1
    plan.c.q0 = q0
    plan.c.q1 = q1
    return plan


cdef inline void _ps_fill(const floating[:, ::1] boxes, floating scale, Py_ssize_t H,
                          Py_ssize_t W, Py_ssize_t PH, Py_ssize_t PW, int64_t* hs,
                          int64_t* he, int64_t* ws, int64_t* we, int64_t* next,
                          int64_t* done) noexcept nogil:
    """The plan's box tables, filled by every thread of the kernel's region in runs of
    TABLE_RUN boxes, then waited for: the first thread fills most of them while the
    others wake up (40-85 us on these VMs when OpenMP threads sleep between calls)."""
    cdef Py_ssize_t K = boxes.shape[0], k, k0
    k0 = roicore_take(next) * TABLE_RUN
    while k0 < K:
        for k in range(k0, min(k0 + TABLE_RUN, K)):
            _float_roi_bins(boxes[k, 1], boxes[k, 3], scale, PH, H, hs + k * PH, he + k * PH)
            _float_roi_bins(boxes[k, 0], boxes[k, 2], scale, PW, W, ws + k * PW, we + k * PW)
        roicore_done(done)
        k0 = roicore_take(next) * TABLE_RUN
    roicore_await(done, (K + TABLE_RUN - 1) // TABLE_RUN)


cdef void _group_ranges(Py_ssize_t G, Py_ssize_t P, int64_t* first, int64_t* stop,
                        floating witness) noexcept:
    """For each group cell g, the pooled cells p with _group_of(p) == g: [first[g], stop[g])."""
    cdef Py_ssize_t p, g
    for g in range(G):
        first[g] = P
        stop[g] = 0
    for p in range(P):
        g = _group_of(<floating>p, G, P)
        first[g] = min(first[g], p)
        stop[g] = max(stop[g], p + 1)


# Both passes run one group cell g = (gh, gw) per task.  The D input channels of a cell,
# d*GH*GW + g, share every bin's rows and columns, so the task first gathers them into a
# (pixel, d) slab with rows of S = round_up(D, 8) (about 180 KiB for R-FCN's 21 x 38 x 50
# map: it stays in L2) and then pools each bin for all D channels at once with vector adds.
# Each channel's sum still runs from 0 in the frameworks' (h, w) order, and each channel's
# gradient receives its additions in their serial (box, ph, pw, h, w) order, so results
# are bit-identical and independent of the thread count.  Both passes work on whole
# vectors of S lanes: the forward fills the S - D padding lanes with copies of channel
# D - 1 and pools them too, the backward adds zeros to them; padding is never written
# out.  Pooled values are staged as (g, K, M, S), contiguous for the task, and moved to
# (K, D, PH, PW) afterwards in runs of consecutive boxes.  A task's bins of every box are
# one C call (roicore_ps_cell_mean/add), and the threads share tasks through counters
# rather than OpenMP loops, so that no thread sleeps at a barrier (roicore_omp.h).

cdef enum:
    TABLE_RUN = 64   # boxes per task when PS-RoI fills its bin tables
    UNPACK_RUN = 16  # boxes per task when PS-RoI moves its staged values out


cdef inline void _cell_mean(const roicore_ps_plan* c, Py_ssize_t cell, const floating* slab,
                            Py_ssize_t img_size, Py_ssize_t W, Py_ssize_t S, Py_ssize_t M,
                            floating* dst) noexcept nogil:
    if floating is float:
        roicore_ps_cell_mean_f32(c, cell, slab, img_size, W, S, M, dst)
    else:
        roicore_ps_cell_mean_f64(c, cell, slab, img_size, W, S, M, dst)


cdef inline void _cell_add(const roicore_ps_plan* c, Py_ssize_t cell, floating* slab,
                           Py_ssize_t img_size, Py_ssize_t W, Py_ssize_t S, Py_ssize_t D,
                           const floating* g, Py_ssize_t gbox, floating* diff) noexcept nogil:
    if floating is float:
        roicore_ps_cell_add_f32(c, cell, slab, img_size, W, S, D, g, gbox, diff)
    else:
        roicore_ps_cell_add_f64(c, cell, slab, img_size, W, S, D, g, gbox, diff)


cdef inline void _unstage_box(const roicore_ps_plan* c, const floating* src,
                              Py_ssize_t cell_stride, Py_ssize_t G, bint by_cell, Py_ssize_t S,
                              Py_ssize_t D, floating* dst) noexcept nogil:
    """One box's pooled values: cell g's bins from src + g*cell_stride (rows of S values,
    numbered row-major in the cell, the cell's rows and columns from the plan c) to dst
    (D, PH, PW).  Pointers, not memoryviews: a memoryview argument costs shared
    reference-count updates that both threads contend."""
    cdef Py_ssize_t g, j, ph, pw, d, PH = c.PH, PW = c.PW, GW = c.GW
    cdef const floating* row
    if by_cell:  # g is the pooled cell: one transpose (S >= round_up(D, 8): wide rows)
        _unpack(src, cell_stride, G, D, dst, G, True)
        return
    for g in range(G):
        j = 0
        for ph in range(c.r0[g // GW], c.r1[g // GW]):
            for pw in range(c.q0[g % GW], c.q1[g % GW]):
                row = src + g * cell_stride + j * S
                for d in range(D):
                    dst[(d * PH + ph) * PW + pw] = row[d]
                j = j + 1


def psroi_pool_forward(const floating[:, :, :, ::1] x,   # IN  (N, C_in, H, W), C_in = D*GH*GW
                       const floating[:, ::1] boxes,      # IN  (K, 4)
                       const int64_t[::1] batch,          # IN  (K,)
                       double spatial_scale, Py_ssize_t GH, Py_ssize_t GW,
                       floating[:, :, :, ::1] out,        # OUT (K, D, PH, PW)
                       int n_threads):
    """Average of each bin, one group cell per task (see above)."""
    cdef Py_ssize_t K = boxes.shape[0], N = x.shape[0], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t D = out.shape[1], PH = out.shape[2], PW = out.shape[3]
    cdef Py_ssize_t G = GH * GW, HW = H * W, S = (D + 7) // 8 * 8, k, k0, n, g
    cdef floating* slab
    if K == 0 or D == 0:
        return
    cdef _PSPlan plan = _ps_plan(K, PH, PW, GH, GW, batch, <floating>0)
    cdef Py_ssize_t M = plan.M, slab_size = _lines(N * HW * S, <floating>0)
    cdef roicore_ps_plan* view = &plan.c
    cdef int64_t* hs = plan.hs
    cdef int64_t* he = plan.he
    cdef int64_t* ws = plan.ws
    cdef int64_t* we = plan.we
    # each thread's slab, then the staged means (G, K, M, S)
    cdef floating[::1] scratch = _memory.empty((n_threads * slab_size + G * K * M * S,),
                                               _dtype(<floating>0))
    cdef floating* staged = &scratch[n_threads * slab_size]
    # Counters for roicore_take/done/await/leave (roicore_omp.h): no OpenMP barrier inside.
    # each on a line of its own (_line_rows)
    cdef int64_t[:, ::1] counters = _line_rows(6, sizeof(int64_t))
    cdef int64_t* next_box = &counters[0, 0]
    cdef int64_t* done_box = &counters[1, 0]
    cdef int64_t* next_g = &counters[2, 0]
    cdef int64_t* done_g = &counters[3, 0]
    cdef int64_t* next_k = &counters[4, 0]
    cdef int64_t* left = &counters[5, 0]
    with nogil, parallel(num_threads=n_threads):
        slab = &scratch[omp_get_thread_num() * slab_size]
        _ps_fill(boxes, <floating>spatial_scale, H, W, PH, PW, hs, he, ws, we, next_box,
                 done_box)
        g = roicore_take(next_g)
        while g < G:
            for n in range(N):
                _pack(&x[n, g, 0, 0], G * HW, HW, D, slab + n * HW * S, S, True)
            _cell_mean(view, g, slab, HW * S, W, S, M, staged + g * K * M * S)
            roicore_done(done_g)
            g = roicore_take(next_g)
        # then the same threads move the staged values out, in runs of consecutive boxes,
        # whose staged rows share cache lines
        roicore_await(done_g, G)
        k0 = roicore_take(next_k) * UNPACK_RUN
        while k0 < K:
            for k in range(k0, min(k0 + UNPACK_RUN, K)):
                _unstage_box(view, staged + k * M * S, K * M * S, G, GH == PH and GW == PW,
                             S, D, &out[k, 0, 0, 0])
            k0 = roicore_take(next_k) * UNPACK_RUN
        roicore_leave(left)


def psroi_pool_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, D, PH, PW)
                        const floating[:, ::1] boxes,              # IN  (K, 4)
                        const int64_t[::1] batch,                  # IN  (K,)
                        double spatial_scale, Py_ssize_t GH, Py_ssize_t GW,
                        floating[:, :, :, ::1] grad_input,         # OUT (N, C_in, H, W)
                        int n_threads):
    """The adjoint, one group cell per task, accumulating in the task's zeroed slab.  Writes
    every element of grad_input (each task unpacks its whole slab to its D channels of
    every image)."""
    cdef Py_ssize_t K = grad_output.shape[0], D = grad_output.shape[1]
    cdef Py_ssize_t PH = grad_output.shape[2], PW = grad_output.shape[3]
    cdef Py_ssize_t N = grad_input.shape[0], H = grad_input.shape[2], W = grad_input.shape[3]
    cdef Py_ssize_t G = GH * GW, HW = H * W, S = (D + 7) // 8 * 8, k, n, g, gh, gw, ph, pw, i
    cdef floating* slab
    cdef floating* diff
    if K == 0 or D == 0:
        _zero(grad_input)  # nothing to add: dx is all zeros
        return
    cdef _PSPlan plan = _ps_plan(K, PH, PW, GH, GW, batch, <floating>0)
    # each thread's slab, then a bin's S differences
    cdef Py_ssize_t slab_size = _lines(N * HW * S + S, <floating>0)
    cdef roicore_ps_plan* view = &plan.c
    cdef int64_t* hs = plan.hs
    cdef int64_t* he = plan.he
    cdef int64_t* ws = plan.ws
    cdef int64_t* we = plan.we
    cdef floating[::1] scratch = _memory.empty((n_threads * slab_size,), _dtype(<floating>0))
    cdef int64_t[:, ::1] counters = _line_rows(4, sizeof(int64_t))  # as in the forward
    cdef int64_t* next_box = &counters[0, 0]
    cdef int64_t* done_box = &counters[1, 0]
    cdef int64_t* next_g = &counters[2, 0]
    cdef int64_t* left = &counters[3, 0]
    with nogil, parallel(num_threads=n_threads):
        slab = &scratch[omp_get_thread_num() * slab_size]
        diff = slab + N * HW * S
        _ps_fill(boxes, <floating>spatial_scale, H, W, PH, PW, hs, he, ws, we, next_box,
                 done_box)
        g = roicore_take(next_g)
        while g < G:
            memset(slab, 0, N * HW * S * sizeof(floating))
            _cell_add(view, g, slab, HW * S, W, S, D, &grad_output[0, 0, 0, 0], D * PH * PW, diff)
            for n in range(N):
                _unpack(slab + n * HW * S, S, HW, D, &grad_input[n, g, 0, 0], G * HW)
            g = roicore_take(next_g)
        roicore_leave(left)


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
        for k in prange(K, num_threads=_table_threads(K, n_threads), schedule="static"):
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
        for k in prange(K, num_threads=_table_threads(K, n_threads), schedule="static"):
            if gr[k, 0] > 0:
                j = <size_t>yoff[k]
                _align_axis(st[k, 0], bs[k, 0], gr[k, 0], PH, H, sampler,
                            &ylo[j], &yhi[j], &ylw[j], &yhw[j])
            if gr[k, 1] > 0:
                j = <size_t>xoff[k]
                _align_axis(st[k, 1], bs[k, 1], gr[k, 1], PW, W, sampler,
                            &xlo[j], &xhi[j], &xlw[j], &xhw[j])
    return t


cdef inline void _align_bin(const floating* img, Py_ssize_t W, Py_ssize_t C, int64_t gy,
                            const int64_t* ylo, const int64_t* yhi, const floating* ylw,
                            const floating* yhw, int64_t gx, const int64_t* xlo,
                            const int64_t* xhi, const floating* xlw, const floating* xhw,
                            floating norm, bint divide, floating* out) noexcept nogil:
    if floating is float:
        roicore_align_bin_f32(img, W, C, gy, ylo, yhi, ylw, yhw, gx, xlo, xhi, xlw, xhw,
                              norm, divide, out)
    else:
        roicore_align_bin_f64(img, W, C, gy, ylo, yhi, ylw, yhw, gx, xlo, xhi, xlw, xhw,
                              norm, divide, out)


def roi_align_forward(const floating[:, :, :, ::1] x,   # IN  (N, C, H, W)
                      const floating[:, ::1] boxes,      # IN  (K, 4)
                      const int64_t[::1] batch,          # IN  (K,)
                      double spatial_scale, int sampling_ratio, bint aligned,
                      int sampler, bint empty_nan,
                      floating[:, :, :, ::1] out,        # OUT (K, C, PH, PW)
                      int n_threads):
    """One (channel block, box) pair per task, on a channel-blocked copy of x.

    Blocks hold B = 64 channels (32 in float64: 256 bytes per pixel either way).  For a
    whole block, roicore_align_box keeps each bin's B sums in registers across its samples,
    and the corner pixels of a bin row (a few rows x the box width x 256 bytes) stay in L1;
    on full-width NHWC rows (2 KiB per pixel at C = 512) every sample streamed its corners
    from L2 and loaded and stored the sums.  Tasks run block-major, so a thread's
    consecutive tasks read the same block of the map (486 KB at 38 x 50, about L2).  The
    channels after the last whole block are pooled with roicore_align_bin.  The (bin,
    channel) sums are transposed into the output, through a staging buffer and
    non-temporal stores when the output is large (see roicore_stream_copy), streamed during
    the thread's next task (roicore_pending).
    fastrcnn_vgg16 at 1 thread: 67 ms with NHWC rows, 36 ms blocked without the write-out,
    48 ms blocked with streamed stores, 64 ms with plain ones.  c4_14x14 at 2 threads,
    streamed after each task or during the next: 95-121 ms or 77-110 ms."""
    cdef Py_ssize_t K = boxes.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3]
    cdef Py_ssize_t PH = out.shape[2], PW = out.shape[3], P = PH * PW
    cdef Py_ssize_t k, p, ph, pw, jy, jx
    cdef int64_t gy, gx
    cdef floating norm
    cdef bint divide = sampler == SAMPLER_CAFFE2
    cdef floating* acc
    cdef floating* out_k
    if K == 0 or C == 0:
        return
    t = _align_tables(boxes, spatial_scale, H, W, PH, PW, sampling_ratio, aligned,
                      not aligned, sampler, n_threads)
    cdef int64_t[::1] ygrid = t.ygrid, xgrid = t.xgrid, yoff = t.yoff, xoff = t.xoff
    cdef int64_t[::1] ylo = t.ylo, yhi = t.yhi, xlo = t.xlo, xhi = t.xhi
    cdef floating[::1] ylw = t.ylw, yhw = t.yhw, xlw = t.xlw, xhw = t.xhw
    cdef Py_ssize_t B = _align_block(<floating>0)
    cdef Py_ssize_t n_cb = (C + B - 1) // B, HW = H * W, task, cb, c0, nb
    cdef Py_ssize_t N = x.shape[0], ready
    cdef floating[::1] xb = _memory.empty((max(x.size, 1),), _dtype(<floating>0))
    cdef floating[:, ::1] acc_buf = _memory.empty((n_threads, 2 * P * B), _dtype(<floating>0))
    cdef const floating* img
    cdef floating* staged
    cdef bint stream = out.size * sizeof(floating) >= STREAM_BYTES
    # per thread: the write-out the next task streams (see roicore_pending)
    cdef int64_t[:, ::1] pend_buf = _line_rows(n_threads, sizeof(roicore_pending))
    cdef roicore_pending* pend
    cdef int npend
    cdef int64_t[:, ::1] counters = _line_rows(2 + n_cb, sizeof(int64_t))  # as the max pool's
    cdef int64_t* next_task = &counters[0, 0]
    cdef int64_t* next_pack = &counters[1, 0]
    cdef int64_t* packed = &counters[2, 0]
    with nogil, parallel(num_threads=n_threads):
        acc = &acc_buf[omp_get_thread_num(), 0]
        staged = acc + P * B
        pend = <roicore_pending*>&pend_buf[omp_get_thread_num(), 0]
        npend = 0
        _pack_blocks(x, &xb[0], B, next_pack, packed)
        ready = -1
        # block-major, one task at a time from a shared counter (as in _max_pool_blocked)
        task = roicore_take(next_task)
        while task < n_cb * K:
            cb = task // K
            k = task % K
            c0 = cb * B
            nb = min(B, C - c0)
            if cb != ready:
                _await_block(packed, cb, N)
                ready = cb
            gy = ygrid[k]
            gx = xgrid[k]
            out_k = &out[k, c0, 0, 0]
            if gy <= 0 or gx <= 0:
                for p in range(nb * P):
                    out_k[p] = NAN if empty_nan else 0  # Paddle: an empty sum times 1/0
            else:
                if divide:
                    norm = <floating>(gy * gx)
                else:  # Paddle multiplies by the reciprocal, computed in double
                    norm = <floating>(1.0 / <double>(gy * gx))
                img = &xb[0] + (batch[k] * C + c0) * HW
                if nb == B:
                    # streams out the previous task's staged block as it goes, and finishes it
                    jy = yoff[k]
                    jx = xoff[k]
                    if floating is float:
                        roicore_align_box_f32(img, W, PH, PW, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                              &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx], &xhw[jx],
                                              norm, divide, acc, pend, npend)
                    else:
                        roicore_align_box_f64(img, W, PH, PW, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                              &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx], &xhw[jx],
                                              norm, divide, acc, pend, npend)
                else:  # the pending block leaves before its staging buffer is reused
                    roicore_pending_finish_all(pend, npend)
                    for ph in range(PH):
                        jy = yoff[k] + ph * gy
                        for pw in range(PW):
                            jx = xoff[k] + pw * gx
                            _align_bin(img, W, nb, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                       &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx], &xhw[jx],
                                       norm, divide, acc + (ph * PW + pw) * nb)
                if stream:
                    _unpack(acc, nb, P, nb, staged, P)
                    roicore_pending_set(pend, out_k, staged, nb * P * sizeof(floating), PH)
                    npend = 1
                else:
                    _unpack(acc, nb, P, nb, out_k, P)
            task = roicore_take(next_task)
        roicore_pending_finish_all(pend, npend)  # the last task's block
        roicore_stream_fence()


cdef inline void _align_bin_grad(floating* img, Py_ssize_t W, Py_ssize_t C, Py_ssize_t n,
                                 int64_t gy, const int64_t* ylo, const int64_t* yhi,
                                 const floating* ylw, const floating* yhw, int64_t gx,
                                 const int64_t* xlo, const int64_t* xhi, const floating* xlw,
                                 const floating* xhw, const floating* g,
                                 floating count) noexcept nogil:
    if floating is float:
        roicore_align_bin_grad_f32(img, W, C, n, gy, ylo, yhi, ylw, yhw, gx, xlo, xhi, xlw, xhw,
                                   g, count)
    else:
        roicore_align_bin_grad_f64(img, W, C, n, gy, ylo, yhi, ylw, yhw, gx, xlo, xhi, xlw, xhw,
                                   g, count)


def roi_align_backward(const floating[:, :, :, ::1] grad_output,  # IN  (K, C, PH, PW)
                       const floating[:, ::1] boxes,              # IN  (K, 4)
                       const int64_t[::1] batch,                  # IN  (K,)
                       double spatial_scale, int sampling_ratio, bint aligned,
                       bint min_size_always,
                       floating[:, :, :, ::1] grad_input,         # OUT (N, C, H, W)
                       int n_threads):
    """Caffe2 backward (MXNet, torchvision, and Paddle's backward).  Writes every element
    of grad_input.

    The gradient accumulates in a channel-blocked buffer laid out as the forward's copy of
    x (blocks of B channels, each an (H, W, B) array per image).  One task owns one block
    in every image and walks every box in (box, ph, pw, iy, ix) order, so each channel
    receives its additions in the frameworks' serial order: no atomics, and the same bits
    for any thread count.  The block's gradient map (486 KB at 38 x 50) stays in L2 while
    the task walks the boxes, and a bin's B upstream gradients stay in registers
    (roicore_align_box_grad).  Each box's upstream gradient for the block is repacked
    (bin, channel) into a small per-thread buffer.  Channels after the last whole block
    use roicore_align_bin_grad.  Finally the buffer is transposed into grad_input.
    """
    cdef Py_ssize_t K = grad_output.shape[0], C = grad_output.shape[1]
    cdef Py_ssize_t N = grad_input.shape[0], H = grad_input.shape[2], W = grad_input.shape[3]
    cdef Py_ssize_t PH = grad_output.shape[2], PW = grad_output.shape[3]
    cdef Py_ssize_t P = PH * PW, HW = H * W, k, ph, pw, jy, jx, n, cb, c0, nb, task
    cdef Py_ssize_t B = _align_block(<floating>0)
    if C < B * n_threads:  # narrower blocks (generic kernel), so that every thread has one
        B = max(8, ((C + n_threads - 1) // n_threads + 7) // 8 * 8)
    cdef Py_ssize_t n_cb = (C + B - 1) // B
    cdef int64_t gy, gx
    cdef floating count
    cdef floating* img
    cdef floating* gb
    if K == 0 or C == 0:
        _zero(grad_input)  # nothing to add: dx is all zeros
        return
    t = _align_tables(boxes, spatial_scale, H, W, PH, PW, sampling_ratio, aligned,
                      (not aligned) or min_size_always, SAMPLER_CAFFE2, n_threads)
    cdef int64_t[::1] ygrid = t.ygrid, xgrid = t.xgrid, yoff = t.yoff, xoff = t.xoff
    cdef int64_t[::1] ylo = t.ylo, yhi = t.yhi, xlo = t.xlo, xhi = t.xhi
    cdef floating[::1] ylw = t.ylw, yhw = t.yhw, xlw = t.xlw, xhw = t.xhw
    cdef floating[:, ::1] g_buf = _memory.empty((n_threads, P * B), _dtype(<floating>0))
    cdef floating[:, :, :, ::1] dxb = _memory.empty((N, C, H, W), _dtype(<floating>0))
    with nogil, parallel(num_threads=n_threads):
        gb = &g_buf[omp_get_thread_num(), 0]
        for cb in prange(n_cb, schedule="dynamic"):
            c0 = cb * B
            nb = min(B, C - c0)
            for n in range(N):
                memset(&dxb[n, c0, 0, 0], 0, nb * HW * sizeof(floating))
            for k in range(K):
                gy = ygrid[k]
                gx = xgrid[k]
                if gy <= 0 or gx <= 0:
                    continue
                count = <floating>(gy * gx)
                img = &dxb[batch[k], 0, 0, 0] + c0 * HW
                _pack(&grad_output[k, c0, 0, 0], P, P, nb, gb, nb)
                if nb == _align_block(<floating>0):
                    jy = yoff[k]
                    jx = xoff[k]
                    if floating is float:
                        roicore_align_box_grad_f32(img, W, PH, PW, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                                   &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx],
                                                   &xhw[jx], gb, count)
                    else:
                        roicore_align_box_grad_f64(img, W, PH, PW, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                                   &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx],
                                                   &xhw[jx], gb, count)
                    continue
                for ph in range(PH):
                    jy = yoff[k] + ph * gy
                    for pw in range(PW):
                        jx = xoff[k] + pw * gx
                        _align_bin_grad(img, W, nb, nb, gy, &ylo[jy], &yhi[jy], &ylw[jy],
                                        &yhw[jy], gx, &xlo[jx], &xhi[jx], &xlw[jx], &xhw[jx],
                                        gb + (ph * PW + pw) * nb, count)
        # blocked -> NCHW
        for task in prange(N * n_cb, schedule="static"):
            n = task // n_cb
            c0 = (task % n_cb) * B
            nb = min(B, C - c0)
            _unpack(&dxb[n, c0, 0, 0], nb, HW, nb, &grad_input[n, c0, 0, 0], HW)
