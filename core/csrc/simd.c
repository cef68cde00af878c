/* Data movement: transposes, strided row copies, streamed write-outs (see simd.h). */
#include "simd.h"

typedef float roicore_v8f32 __attribute__((vector_size(32)));
typedef int32_t roicore_v8i32 __attribute__((vector_size(32)));

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
#define VT4 roicore_vf64
#define MT4 roicore_vm64
#define TILE_4X4 1
#define SFX f64
#include "transpose_typed.h"
#undef T
#undef VT4
#undef MT4
#undef TILE_4X4
#undef SFX

#define T int64_t
#define VT4 roicore_vm64
#define MT4 roicore_vm64
#define TILE_4X4 1
#define SFX i64
#include "transpose_typed.h"
#undef T
#undef VT4
#undef MT4
#undef TILE_4X4
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

void roicore_relayout(const roicore_tensor *src, void *dst, int n_threads) {
    const int64_t N = src->n, C = src->c, HW = src->h * src->w, n_blocks = (C + 63) / 64;
    const int to_nchw = src->layout == ROICORE_NHWC;
    (void)n_threads;  /* without OpenMP */
#pragma omp parallel for num_threads(n_threads) schedule(static)
    for (int64_t t = 0; t < N * n_blocks; ++t) {
        const int64_t n = t / n_blocks, c0 = t % n_blocks * 64, nb = roicore_min64(64, C - c0);
        const int64_t planes = (n * C + c0) * HW, rows = n * HW * C + c0;  /* block starts */
        if (src->dtype == ROICORE_FLOAT32) {
            const float *s = (const float *)src->data;
            float *d = (float *)dst;
            if (to_nchw) roicore_transpose_f32(s + rows, C, HW, nb, d + planes, HW, 0);
            else roicore_transpose_f32(s + planes, HW, nb, HW, d + rows, C, 0);
        } else {
            const double *s = (const double *)src->data;
            double *d = (double *)dst;
            if (to_nchw) roicore_transpose_f64(s + rows, C, HW, nb, d + planes, HW, 0);
            else roicore_transpose_f64(s + planes, HW, nb, HW, d + rows, C, 0);
        }
    }
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
