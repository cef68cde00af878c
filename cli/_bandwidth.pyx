# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The memory-bandwidth probe of ``roicore bench --scaling``: how fast this machine's memory
takes the traffic that bandwidth-bound kernels make, at 1 and N threads, which bounds how far
such a kernel can scale.  It writes with the same non-temporal stores the kernels use for
large outputs (the C library's roicore_stream_copy)."""
from cython.parallel cimport prange
from libc.stdint cimport int64_t
from libc.string cimport memcpy

import numpy as np

cdef extern from "simd.h" nogil:
    void roicore_stream_copy(void *dst, const void *src, int64_t nbytes)
    void roicore_stream_fence()

cdef enum:
    PROBE_STREAM = 0
    PROBE_STORE = 1
    PROBE_READ = 2

# the modes by the names ``roicore bench --scaling`` prints, in its order
PROBE_MODES = {"streaming stores": PROBE_STREAM, "plain stores": PROBE_STORE,
               "reads": PROBE_READ}


def bandwidth_probe(unsigned char[::1] buf, int mode, int n_threads):
    """One pass over `buf`, each of n_threads threads over its contiguous share: mode 0
    writes it with non-temporal stores, 1 with plain stores, 2 reads it.  Returns a
    checksum of what a read saw (0 otherwise), so that the reads cannot be optimised
    away."""
    cdef Py_ssize_t n = buf.shape[0], t, lo, hi, i
    # random bytes: pages of zeros can be written faster than any pooled output would be
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
