/* Data movement: transposes, strided row copies, streamed write-outs (see simd.h). */
#include "simd.h"

typedef float roicore_v8f32 __attribute__((vector_size(32)));
typedef int32_t roicore_v8i32 __attribute__((vector_size(32)));
typedef double roicore_v8f64 __attribute__((vector_size(64)));
typedef int64_t roicore_v8i64 __attribute__((vector_size(64)));

#define T float
#define VT roicore_v8f32
#define MT roicore_v8i32
#define SFX f32
#include "transpose_typed.h"
#undef T
#undef VT
#undef MT
#undef SFX

#define T double
#define VT roicore_v8f64
#define MT roicore_v8i64
#define SFX f64
#include "transpose_typed.h"
#undef T
#undef VT
#undef MT
#undef SFX

#define T int32_t
#define VT roicore_v8i32
#define MT roicore_v8i32
#define SFX i32
#include "transpose_typed.h"
#undef T
#undef VT
#undef MT
#undef SFX

/* The argmax in int64 (Paddle): a widening copy, eight output planes at a time, each
 * written in order. */
void roicore_transpose_i32_i64(const int32_t *restrict in, int64_t in_stride, int64_t R,
                               int64_t Cc, int64_t *restrict out, int64_t out_stride) {
    int64_t j0 = 0;
    for (; j0 + 8 <= Cc; j0 += 8)
        for (int64_t i = 0; i < R; ++i)
            for (int q = 0; q < 8; ++q) out[(j0 + q) * out_stride + i] = in[i * in_stride + j0 + q];
    for (; j0 < Cc; ++j0)
        for (int64_t i = 0; i < R; ++i) out[j0 * out_stride + i] = in[i * in_stride + j0];
}

void roicore_copy_rows(const void *in, int64_t in_stride, int64_t rows, int64_t n, void *out,
                       int64_t out_stride, int64_t pad, size_t size) {
    const char *s = (const char *)in;
    char *d = (char *)out;
    for (int64_t r = 0; r < rows; ++r) {
        const char *src = s + r * in_stride * (int64_t)size;
        char *dst = d + r * out_stride * (int64_t)size;
        memcpy(dst, src, (size_t)n * size);
        for (int64_t i = n; i < pad; ++i) memcpy(dst + i * (int64_t)size, src + (n - 1) * (int64_t)size, size);
    }
}

#define OFFSET_INDICES(SFX, TI)                                                                \
    ROICORE_CLONES void roicore_offset_indices_##SFX(TI *a, int64_t rows, int64_t n,           \
                                                     int64_t stride, int64_t base,             \
                                                     int64_t step) {                           \
        for (int64_t r = 0; r < rows; ++r) {                                                   \
            const TI off = (TI)(base + r * step);                                              \
            TI *p = a + r * stride;                                                            \
            for (int64_t i = 0; i < n; ++i) p[i] = p[i] >= 0 ? p[i] + off : p[i];              \
        }                                                                                      \
    }
OFFSET_INDICES(i32, int32_t)
OFFSET_INDICES(i64, int64_t)

#if defined(__SSE2__)
#include <emmintrin.h>
void roicore_stream_copy(void *dst, const void *src, int64_t nbytes) {
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
void roicore_stream_fence(void) { _mm_sfence(); }
#else
void roicore_stream_copy(void *dst, const void *src, int64_t nbytes) {
    memcpy(dst, src, (size_t)nbytes);
}
void roicore_stream_fence(void) {}
#endif

void roicore_pending_set(roicore_pending *p, void *dst, int64_t dst_stride, const void *src,
                         int64_t src_stride, int64_t rows, int64_t row_bytes, int64_t steps) {
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

static void pending_copy(roicore_pending *p, int64_t budget) {
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

void roicore_pending_step(roicore_pending *p) { pending_copy(p, p->chunk); }

void roicore_pending_finish(roicore_pending *p) { pending_copy(p, INT64_MAX); }
