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
 *     Cc % 8 columns go through a whole tile too. */
enum { ROICORE_PAD_ROWS = 1, ROICORE_WIDE_ROWS = 2 };
void roicore_transpose_f32(const float *in, int64_t in_stride, int64_t R, int64_t Cc,
                           float *out, int64_t out_stride, int flags);
void roicore_transpose_f64(const double *in, int64_t in_stride, int64_t R, int64_t Cc,
                           double *out, int64_t out_stride, int flags);
void roicore_transpose_i32(const int32_t *in, int64_t in_stride, int64_t R, int64_t Cc,
                           int32_t *out, int64_t out_stride, int flags);
/* The same for int32 in, int64 out (a widening copy). */
void roicore_transpose_i32_i64(const int32_t *in, int64_t in_stride, int64_t R, int64_t Cc,
                               int64_t *out, int64_t out_stride);

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
void roicore_stream_copy(void *dst, const void *src, int64_t nbytes);
void roicore_stream_fence(void);

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

void roicore_pending_set(roicore_pending *p, void *dst, int64_t dst_stride, const void *src,
                         int64_t src_stride, int64_t rows, int64_t row_bytes, int64_t steps);
void roicore_pending_step(roicore_pending *p);
void roicore_pending_finish(roicore_pending *p);

static inline void roicore_pending_step_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_step(&p[i]);
}
static inline void roicore_pending_finish_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_finish(&p[i]);
}

#endif
