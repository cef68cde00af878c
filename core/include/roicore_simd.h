/* Channel-vectorised inner loops (NHWC), shared by the Cython kernels.
 *
 * Written as branch-free selects so the compiler vectorises them; with GCC on x86-64 each
 * function is also cloned for AVX2 and picked at load time (ifunc), while the baseline
 * clone keeps the wheel portable.  No floating-point contraction happens here (selects
 * and compares only), so every clone gives identical bits.
 */
#ifndef ROICORE_SIMD_H
#define ROICORE_SIMD_H
#include <stdint.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROICORE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ROICORE_CLONES
#endif

/* acc[i] = row[i] if row[i] > acc[i] (first maximum wins, NaN never taken); arg follows. */
ROICORE_CLONES static void roicore_max_update_f32(float *restrict acc, int32_t *restrict arg,
                                                  const float *restrict row, int64_t n, int32_t idx) {
    for (int64_t i = 0; i < n; ++i) {
        float v = row[i];
        int gt = v > acc[i];
        acc[i] = gt ? v : acc[i];
        arg[i] = gt ? idx : arg[i];
    }
}

ROICORE_CLONES static void roicore_max_update_f64(double *restrict acc, int32_t *restrict arg,
                                                  const double *restrict row, int64_t n, int32_t idx) {
    for (int64_t i = 0; i < n; ++i) {
        double v = row[i];
        int gt = v > acc[i];
        acc[i] = gt ? v : acc[i];
        arg[i] = gt ? idx : arg[i];
    }
}

/* Without argmax (inference). */
ROICORE_CLONES static void roicore_max_only_f32(float *restrict acc, const float *restrict row, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        float v = row[i];
        acc[i] = v > acc[i] ? v : acc[i];
    }
}

ROICORE_CLONES static void roicore_max_only_f64(double *restrict acc, const double *restrict row, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        double v = row[i];
        acc[i] = v > acc[i] ? v : acc[i];
    }
}
#endif
