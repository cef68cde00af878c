/* Data movement shared by the kernels: layout changes (2-D transposes) and the streamed
 * write-out of large outputs.  Copies are exact, so every CPU path gives the same bits. */
#ifndef ROICORE_SIMD_H
#define ROICORE_SIMD_H

#include "common.h"

/* out[j*out_stride + i] = in[i*in_stride + j] for i < R, j < Cc: (pixel or bin, channel)
 * rows -> channel planes with R = pixels, Cc = channels, and back with them swapped.
 * `flags` may hold:
 *   ROICORE_PAD_ROWS: R is rounded up to a multiple of 8, the missing rows repeating row
 *     R - 1, so out rows get round_up(R, 8) values (padding the caller owns);
 *   ROICORE_WIDE_ROWS: every in row may be read up to column round_up(Cc, 8), so the last
 *     Cc % 8 columns go through a whole tile too;
 *   ROICORE_IN_CACHE: `in` is scratch that sits in cache (a task's accumulator), so the
 *     tiles go column block by column block and each out row is written whole, in order.
 *     Without it the tiles go row block by row block, reading `in` in order, which suits a
 *     large input in memory. */
enum { ROICORE_PAD_ROWS = 1, ROICORE_WIDE_ROWS = 2, ROICORE_IN_CACHE = 4 };
void roicore_transpose_f32(const float *in, int64_t in_stride, int64_t R, int64_t Cc,
                           float *out, int64_t out_stride, int flags);
void roicore_transpose_f64(const double *in, int64_t in_stride, int64_t R, int64_t Cc,
                           double *out, int64_t out_stride, int flags);
void roicore_transpose_i32(const int32_t *in, int64_t in_stride, int64_t R, int64_t Cc,
                           int32_t *out, int64_t out_stride, int flags);
void roicore_transpose_i64(const int64_t *in, int64_t in_stride, int64_t R, int64_t Cc,
                           int64_t *out, int64_t out_stride, int flags);
/* The same for int32 in, int64 out (a widening copy). */
void roicore_transpose_i32_i64(const int32_t *in, int64_t in_stride, int64_t R, int64_t Cc,
                               int64_t *out, int64_t out_stride);

/* A whole tensor's data into `dst` in the other layout (NHWC -> NCHW, NCHW -> NHWC), the
 * threads taking blocks of 64 channels of an image: whole cache lines of each NHWC row. */
void roicore_relayout(const roicore_tensor *src, void *dst, int n_threads);

/* rows of n values, `in_stride` apart -> rows `out_stride` apart (a strided copy), with
 * element size `size`; rows of `pad` > n values get the row's last value repeated. */
void roicore_copy_rows(const void *in, int64_t in_stride, int64_t rows, int64_t n,
                       void *out, int64_t out_stride, int64_t pad, size_t size);

/* Argmax planes to flat indices into x: `rows` planes of n indices, `stride` apart, plane
 * r shifted by base + r * step; -1 (no pixel) stays. */
void roicore_offset_indices_i32(int32_t *a, int64_t rows, int64_t n, int64_t stride,
                                int64_t base, int64_t step);
void roicore_offset_indices_i64(int64_t *a, int64_t rows, int64_t n, int64_t stride,
                                int64_t base, int64_t step);

/* Output write-out.  RoI outputs are far larger than the caches (200 MB for 2000 boxes x
 * 512 channels x 7 x 7), so a kernel that stores them normally first reads every line it
 * writes (read-for-ownership) and fills the caches with data nobody reads soon.  Large
 * outputs are therefore staged per task in a small buffer and copied out with
 * non-temporal stores, which go straight to memory in whole lines; roicore_stream_fence
 * orders them before the results are handed back. */
#define ROICORE_STREAM_BYTES (8 << 20)  /* outputs at least this large are streamed */

/* A write-out spread over later work: copied in one go after its task, a block of output
 * stalls the core on memory bandwidth for the length of the copy.  The thread's next task
 * instead streams it in chunks as it goes (a chunk per row of bins), hiding most of it
 * behind computation.  A write-out is `rows` rows of row_bytes, dst_stride and src_stride
 * bytes apart (one row when contiguous). */
typedef struct {
    char *dst;
    const char *src;
    int64_t rows, row_bytes, dst_stride, src_stride;
    int64_t row, offset;  /* progress */
    int64_t chunk;        /* bytes per step */
} roicore_pending;

#if defined(__SSE2__)
#include <emmintrin.h>
static inline void roicore_stream_copy(void *dst, const void *src, int64_t nbytes) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    int64_t head = (int64_t)(-(uintptr_t)d & 15);
    if (head > nbytes) head = nbytes;
    memcpy(d, s, (size_t)head);
    d += head;
    s += head;
    nbytes -= head;
    for (; nbytes >= 64; nbytes -= 64, d += 64, s += 64) {
        __m128i v0 = _mm_loadu_si128((const __m128i *)s);
        __m128i v1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i v2 = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i v3 = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, v0);
        _mm_stream_si128((__m128i *)(d + 16), v1);
        _mm_stream_si128((__m128i *)(d + 32), v2);
        _mm_stream_si128((__m128i *)(d + 48), v3);
    }
    for (; nbytes >= 16; nbytes -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, (size_t)nbytes);
}
static inline void roicore_stream_fence(void) { _mm_sfence(); }
#else
static inline void roicore_stream_copy(void *dst, const void *src, int64_t nbytes) {
    memcpy(dst, src, (size_t)nbytes);
}
static inline void roicore_stream_fence(void) {}
#endif

static inline void roicore_pending_set(roicore_pending *p, void *dst, int64_t dst_stride,
                                       const void *src, int64_t src_stride, int64_t rows,
                                       int64_t row_bytes, int64_t steps) {
    if (rows > 1 && dst_stride == row_bytes && src_stride == row_bytes) {
        row_bytes *= rows;  /* contiguous: one row */
        rows = 1;
    }
    p->dst = (char *)dst;
    p->src = (const char *)src;
    p->rows = rows;
    p->row_bytes = row_bytes;
    p->dst_stride = dst_stride;
    p->src_stride = src_stride;
    p->row = 0;
    p->offset = 0;
    if (steps < 1) steps = 1;
    /* whole lines, so that an aligned destination stays aligned chunk after chunk */
    p->chunk = roicore_max64(64, roicore_round_up((rows * row_bytes + steps - 1) / steps, 64));
}

static inline void roicore_pending_copy(roicore_pending *p, int64_t budget) {
    while (budget > 0 && p->row < p->rows) {
        int64_t n = roicore_min64(budget, p->row_bytes - p->offset);
        roicore_stream_copy(p->dst + p->row * p->dst_stride + p->offset,
                            p->src + p->row * p->src_stride + p->offset, n);
        budget -= n;
        p->offset += n;
        if (p->offset == p->row_bytes) {
            p->offset = 0;
            ++p->row;
        }
    }
}

static inline void roicore_pending_step(roicore_pending *p) { roicore_pending_copy(p, p->chunk); }

static inline void roicore_pending_finish(roicore_pending *p) { roicore_pending_copy(p, INT64_MAX); }

static inline void roicore_pending_step_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_step(&p[i]);
}
static inline void roicore_pending_finish_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_finish(&p[i]);
}

#endif
