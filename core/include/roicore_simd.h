/* Channel-vectorised inner loops (NHWC), shared by the Cython kernels.
 *
 * Written as plain loops and branch-free selects so the compiler vectorises them; with
 * GCC on x86-64 Linux each function is also cloned for AVX2 and picked at load time
 * (ifunc), while the baseline clone keeps the wheel portable.  Every loop computes, per
 * channel, exactly the expression the frameworks compute, in the same order; nothing is
 * contracted (-ffp-contract=off, and the AVX2 clone has no FMA), so all clones give the
 * same bits.
 */
#ifndef ROICORE_SIMD_H
#define ROICORE_SIMD_H
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROICORE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ROICORE_CLONES
#endif

#define ROICORE_FOR_BOTH_TYPES(DEFINE) DEFINE(f32, float) DEFINE(f64, double)

/* Max pooling of one bin over all channels of an NHWC image (row length C, W pixels per
 * row), for the "greater" rule: each channel's running maximum starts at `initial` and
 * takes a pixel only when strictly greater, scanning rows then columns (NaN is never
 * taken); `arg` gets h*W + w of the pixel taken, -1 if none, unless arg is NULL.
 *
 * float32 works on blocks of 16 channels held in two 8-lane vectors (GCC/Clang vector
 * extensions: AVX2 registers in the AVX2 clone, pairs of SSE registers otherwise) for the
 * whole bin, so a pixel costs one load per block and no stores.  Selects are bitwise, so
 * every channel follows exactly the scalar rule.  float64 and the last C % 16 channels use
 * a plain per-pixel loop over the row. */
#include <string.h>
typedef float roicore_v8f __attribute__((vector_size(32)));
typedef int32_t roicore_v8i __attribute__((vector_size(32)));

static inline roicore_v8f roicore_load8(const float *p) { roicore_v8f v; memcpy(&v, p, 32); return v; }
static inline void roicore_store8f(float *p, roicore_v8f v) { memcpy(p, &v, 32); }
static inline void roicore_store8i(int32_t *p, roicore_v8i v) { memcpy(p, &v, 32); }
static inline roicore_v8f roicore_select8(roicore_v8i mask, roicore_v8f a, roicore_v8f b) {
    return (roicore_v8f)(((roicore_v8i)a & mask) | ((roicore_v8i)b & ~mask));
}

#define ROICORE_MAX_TAIL(SUFFIX, T)                                                            \
    static inline void roicore_max_tail_##SUFFIX(const T *img, int64_t W, int64_t C, int64_t c0, \
                                                  int64_t h0, int64_t h1, int64_t w0, int64_t w1, \
                                                  T initial, T *restrict acc, int32_t *restrict arg) { \
        for (int64_t c = c0; c < C; ++c) { acc[c] = initial; if (arg) arg[c] = -1; }           \
        for (int64_t h = h0; h < h1; ++h)                                                      \
            for (int64_t w = w0; w < w1; ++w) {                                                \
                const T *r = img + (h * W + w) * C;                                            \
                int32_t idx = (int32_t)(h * W + w);                                            \
                if (arg) {                                                                     \
                    for (int64_t c = c0; c < C; ++c) {                                         \
                        int gt = r[c] > acc[c];                                                \
                        acc[c] = gt ? r[c] : acc[c];                                           \
                        arg[c] = gt ? idx : arg[c];                                            \
                    }                                                                          \
                } else {                                                                       \
                    for (int64_t c = c0; c < C; ++c) acc[c] = r[c] > acc[c] ? r[c] : acc[c];   \
                }                                                                              \
            }                                                                                  \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_MAX_TAIL)

ROICORE_CLONES static void roicore_max_bin_f32(const float *img, int64_t W, int64_t C, int64_t h0,
                                               int64_t h1, int64_t w0, int64_t w1, float initial,
                                               float *restrict acc, int32_t *restrict arg) {
    const roicore_v8f init = {initial, initial, initial, initial, initial, initial, initial, initial};
    int64_t c0 = 0;
    for (; c0 + 16 <= C; c0 += 16) {
        roicore_v8f m0 = init, m1 = init;
        roicore_v8i a0 = {-1, -1, -1, -1, -1, -1, -1, -1}, a1 = a0;
        for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
                const float *r = img + (h * W + w) * C + c0;
                roicore_v8f v0 = roicore_load8(r), v1 = roicore_load8(r + 8);
                roicore_v8i g0 = v0 > m0, g1 = v1 > m1;
                m0 = roicore_select8(g0, v0, m0);
                m1 = roicore_select8(g1, v1, m1);
                if (arg) {
                    int32_t idx = (int32_t)(h * W + w);
                    roicore_v8i vi = {idx, idx, idx, idx, idx, idx, idx, idx};
                    a0 = (vi & g0) | (a0 & ~g0);
                    a1 = (vi & g1) | (a1 & ~g1);
                }
            }
        roicore_store8f(acc + c0, m0);
        roicore_store8f(acc + c0 + 8, m1);
        if (arg) {
            roicore_store8i(arg + c0, a0);
            roicore_store8i(arg + c0 + 8, a1);
        }
    }
    roicore_max_tail_f32(img, W, C, c0, h0, h1, w0, w1, initial, acc, arg);
}

ROICORE_CLONES static void roicore_max_bin_f64(const double *img, int64_t W, int64_t C, int64_t h0,
                                               int64_t h1, int64_t w0, int64_t w1, double initial,
                                               double *restrict acc, int32_t *restrict arg) {
    roicore_max_tail_f64(img, W, C, 0, h0, h1, w0, w1, initial, acc, arg);
}

/* RoIAlign forward: acc[i] += ((w1*a[i] + w2*b[i]) + w3*c[i]) + w4*d[i]. */
#define ROICORE_BILINEAR_ACC(SUFFIX, T)                                                        \
    ROICORE_CLONES static void roicore_bilinear_acc_##SUFFIX(T *restrict acc, const T *a, const T *b, \
                                                              const T *c, const T *d, T w1, T w2, \
                                                              T w3, T w4, int64_t n) {         \
        for (int64_t i = 0; i < n; ++i)                                                        \
            acc[i] = acc[i] + (((w1 * a[i] + w2 * b[i]) + w3 * c[i]) + w4 * d[i]);             \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_BILINEAR_ACC)

/* RoIAlign backward: dst[i] += (g[i] * w) / count, Caffe2's "grad * w / count". */
#define ROICORE_SCALED_ADD(SUFFIX, T)                                                          \
    ROICORE_CLONES static void roicore_scaled_add_##SUFFIX(T *restrict dst, const T *restrict g, \
                                                            T w, T count, int64_t n) {         \
        for (int64_t i = 0; i < n; ++i)                                                        \
            dst[i] = dst[i] + (g[i] * w) / count;                                              \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_SCALED_ADD)

#endif
