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

/* Max pooling: acc[i] = row[i] if row[i] > acc[i] (first maximum wins, NaN never taken);
 * arg follows the value. */
#define ROICORE_MAX_UPDATE(SUFFIX, T)                                                          \
    ROICORE_CLONES static void roicore_max_update_##SUFFIX(T *restrict acc, int32_t *restrict arg, \
                                                            const T *restrict row, int64_t n,  \
                                                            int32_t idx) {                     \
        for (int64_t i = 0; i < n; ++i) {                                                      \
            T v = row[i];                                                                      \
            int gt = v > acc[i];                                                               \
            acc[i] = gt ? v : acc[i];                                                          \
            arg[i] = gt ? idx : arg[i];                                                        \
        }                                                                                      \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_MAX_UPDATE)

/* The same without argmax (inference). */
#define ROICORE_MAX_ONLY(SUFFIX, T)                                                            \
    ROICORE_CLONES static void roicore_max_only_##SUFFIX(T *restrict acc, const T *restrict row, \
                                                          int64_t n) {                         \
        for (int64_t i = 0; i < n; ++i) {                                                      \
            T v = row[i];                                                                      \
            acc[i] = v > acc[i] ? v : acc[i];                                                  \
        }                                                                                      \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_MAX_ONLY)

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
