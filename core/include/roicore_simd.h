/* Channel-vectorised inner loops (channels last), shared by the Cython kernels.
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
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define ROICORE_X86_DISPATCH 1
#define ROICORE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define ROICORE_CLONES
#endif

/* For a helper that a cloned kernel calls per bin: inlined into each clone, so it is
 * compiled for that clone's target (a call would go to a baseline copy). */
#if defined(__GNUC__)
#define ROICORE_INLINE static inline __attribute__((always_inline))
#else
#define ROICORE_INLINE static inline
#endif

#define ROICORE_FOR_BOTH_TYPES(DEFINE) DEFINE(f32, float) DEFINE(f64, double)

/* Output write-out.  RoI outputs are far larger than the caches (200 MB for 2000 boxes x
 * 512 channels x 7 x 7), so a kernel that stores them normally first reads every line
 * it writes (read-for-ownership) and fills the caches with data nobody reads soon: at
 * C = 512 that doubled the memory traffic and cost 40 % of a RoIAlign forward.  Large
 * outputs are therefore staged per task in a small buffer and copied out with
 * non-temporal stores (SSE2, baseline on x86-64; a plain copy elsewhere), which go
 * straight to memory in whole lines.  roicore_stream_fence orders them before the
 * results are handed back. */
#if defined(__SSE2__)
#include <emmintrin.h>
static inline void roicore_stream_copy(void *dst, const void *src, int64_t nbytes) {
    char *d = (char *)dst;
    const char *s = (const char *)src;
    int64_t head = (int64_t)(-(uintptr_t)d & 15);
    if (head > nbytes) head = nbytes;
    memcpy(d, s, (size_t)head);
    d += head; s += head; nbytes -= head;
    for (; nbytes >= 64; nbytes -= 64, d += 64, s += 64) {
        __m128i v0 = _mm_loadu_si128((const __m128i *)s), v1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i v2 = _mm_loadu_si128((const __m128i *)(s + 32)), v3 = _mm_loadu_si128((const __m128i *)(s + 48));
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

/* A write-out spread over later work.  Copied out in one go after its task, a block of
 * output stalls the core on memory bandwidth for the length of the copy, and two threads
 * copying at once share it: the streaming stores of one core reached 21 GB/s here, of
 * both cores together 22 GB/s.  At c4_14x14 the max-pool forward took 135 ms at 1 thread
 * with its 803 MB written and 97 ms without; at 2 threads 84 and 52 ms.  The next task
 * instead streams the block in `steps` chunks as it goes (a row of bins each, in the max
 * pool: per bin, 256-byte chunks, measured slower), which took that forward at 2 threads
 * from 81-89 to 67-71 ms. */
typedef struct {
    char *dst;
    const char *src;
    int64_t left, chunk;
} roicore_pending;

static inline void roicore_pending_set(roicore_pending *p, void *dst, const void *src,
                                       int64_t nbytes, int64_t steps) {
    p->dst = (char *)dst;
    p->src = (const char *)src;
    p->left = nbytes;
    if (steps < 1) steps = 1;
    /* whole lines, so that an aligned destination stays aligned chunk after chunk */
    p->chunk = ((nbytes + steps - 1) / steps + 63) / 64 * 64;
    if (p->chunk < 64) p->chunk = 64;
}

static inline void roicore_pending_step(roicore_pending *p) {
    if (p->left <= 0) return;
    int64_t n = p->left < p->chunk ? p->left : p->chunk;
    roicore_stream_copy(p->dst, p->src, n);
    p->dst += n;
    p->src += n;
    p->left -= n;
}

static inline void roicore_pending_step_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_step(&p[i]);
}

static inline void roicore_pending_finish(roicore_pending *p) {
    if (p->left > 0) roicore_stream_copy(p->dst, p->src, p->left);
    p->left = 0;
}

static inline void roicore_pending_finish_all(roicore_pending *p, int n) {
    for (int i = 0; i < n; ++i) roicore_pending_finish(&p[i]);
}

/* Max pooling of one bin over the C channels of a channels-last image (W pixels per row
 * of C values: a 64-channel block of x), for the "greater" rule: each
 * channel's running maximum starts at `initial` and takes a pixel only when strictly
 * greater, scanning rows then columns (NaN is never taken); `arg` gets h*W + w of the
 * pixel taken plus abase + c * astep for channel c (the plane's offset into x, for a
 * global index: 0 and 0 for h*W + w), -1 if none, unless arg is NULL.  Adding the offset
 * as the bin is stored spares a pass over the indices: MXNet's at c4_14x14 are 200 M.
 *
 * float32 works on groups of 64 channels (8 vectors of 8 lanes; 32 channels when indices
 * are kept too, whose vectors take the other registers) held in vector registers (GCC/Clang
 * vector extensions: AVX2 registers in the AVX2 copy, pairs of SSE registers otherwise)
 * for the whole bin, so a pixel costs one load per vector and no stores; then single
 * vectors.  Selects are bitwise, so every channel follows exactly the scalar rule.  float64
 * and the last C % 8 channels use a plain per-pixel loop over the row.
 *
 * The running maximum v > m ? v : m is exactly x86's MAXPS(v, m), which returns its second
 * operand when the two compare equal (+0 against -0) or either is NaN: one instruction
 * where the compare-and-select is two, and the select's operand a second load of the
 * pixel.  C has no vector ?:, and GCC keeps the select as written, so on x86-64 the float32
 * kernel has a copy for AVX2 that takes MAXPS from its intrinsic, picked per call
 * (roicore_max_box_f32); the index, when kept, still follows the compare's mask. */
typedef float roicore_v8f __attribute__((vector_size(32)));
typedef int32_t roicore_v8i __attribute__((vector_size(32)));
typedef double roicore_v8d __attribute__((vector_size(64)));
typedef double roicore_v4d __attribute__((vector_size(32)));
typedef int64_t roicore_v8l __attribute__((vector_size(64)));  /* shuffle masks for v8d */

static inline roicore_v8f roicore_load8(const float *p) { roicore_v8f v; memcpy(&v, p, 32); return v; }
static inline void roicore_store8f(float *p, roicore_v8f v) { memcpy(p, &v, 32); }
static inline void roicore_store8i(int32_t *p, roicore_v8i v) { memcpy(p, &v, 32); }
static inline roicore_v8f roicore_select8(roicore_v8i mask, roicore_v8f a, roicore_v8f b) {
    return (roicore_v8f)(((roicore_v8i)a & mask) | ((roicore_v8i)b & ~mask));
}

#define ROICORE_MAX_TAIL(SUFFIX, T)                                                            \
    ROICORE_INLINE void roicore_max_tail_##SUFFIX(const T *img, int64_t W, int64_t C,          \
                                                  int64_t c0, int64_t h0, int64_t h1,          \
                                                  int64_t w0, int64_t w1, T initial,           \
                                                  T *restrict acc, int32_t *restrict arg,      \
                                                  int32_t abase, int32_t astep) {              \
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
        if (arg)                                                                               \
            for (int64_t c = c0; c < C; ++c)                                                   \
                if (arg[c] >= 0) arg[c] += abase + (int32_t)c * astep;                         \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_MAX_TAIL)

/* v > m ? v : m in each lane, for any target */
#define ROICORE_VMAX_SELECT(v, m) roicore_select8((v) > (m), (v), (m))

/* Channels c0 .. in groups of NV vectors while whole groups fit; VMAX(v, m) is the
 * running maximum's update. */
#define ROICORE_MAX_GROUPS(NV, VMAX)                                                           \
    for (; c0 + 8 * (NV) <= C; c0 += 8 * (NV)) {                                               \
        roicore_v8f m[NV];                                                                     \
        roicore_v8i a[NV];                                                                     \
        for (int q = 0; q < (NV); ++q) {                                                       \
            m[q] = init;                                                                       \
            a[q] = (roicore_v8i){-1, -1, -1, -1, -1, -1, -1, -1};                              \
        }                                                                                      \
        for (int64_t h = h0; h < h1; ++h)                                                      \
            for (int64_t w = w0; w < w1; ++w) {                                                \
                const float *r = img + (h * W + w) * C + c0;                                   \
                int32_t idx = (int32_t)(h * W + w);                                            \
                roicore_v8i vi = {idx, idx, idx, idx, idx, idx, idx, idx};                     \
                _Pragma("GCC unroll 8")                                                        \
                for (int q = 0; q < (NV); ++q) {                                               \
                    roicore_v8f v = roicore_load8(r + 8 * q);                                  \
                    if (arg) {                                                                 \
                        roicore_v8i g = v > m[q];                                              \
                        a[q] = (vi & g) | (a[q] & ~g);                                         \
                    }                                                                          \
                    m[q] = VMAX(v, m[q]);                                                      \
                }                                                                              \
            }                                                                                  \
        for (int q = 0; q < (NV); ++q) {                                                       \
            roicore_store8f(acc + c0 + 8 * q, m[q]);                                           \
            if (arg) {                                                                         \
                roicore_v8i off = lanes + (abase + (int32_t)(c0 + 8 * q) * astep);             \
                roicore_store8i(arg + c0 + 8 * q, a[q] + (off & (a[q] >= 0)));                 \
            }                                                                                  \
        }                                                                                      \
    }

#define ROICORE_MAX_BIN_F32(NAME, ATTR, VMAX)                                                  \
    ATTR ROICORE_INLINE void NAME(const float *img, int64_t W, int64_t C, int64_t h0,          \
                                  int64_t h1, int64_t w0, int64_t w1, float initial,           \
                                  float *restrict acc, int32_t *restrict arg, int32_t abase,   \
                                  int32_t astep) {                                             \
        const roicore_v8f init = {initial, initial, initial, initial,                          \
                                  initial, initial, initial, initial};                         \
        const roicore_v8i lanes = {0, astep, 2 * astep, 3 * astep,                             \
                                   4 * astep, 5 * astep, 6 * astep, 7 * astep};                \
        int64_t c0 = 0;                                                                        \
        if (arg) {                                                                             \
            ROICORE_MAX_GROUPS(4, VMAX)                                                        \
        } else {                                                                               \
            ROICORE_MAX_GROUPS(8, VMAX)                                                        \
        }                                                                                      \
        ROICORE_MAX_GROUPS(1, VMAX)                                                            \
        roicore_max_tail_f32(img, W, C, c0, h0, h1, w0, w1, initial, acc, arg, abase, astep); \
    }

ROICORE_INLINE void roicore_max_bin_f64(const double *img, int64_t W, int64_t C,
                                        int64_t h0, int64_t h1, int64_t w0, int64_t w1,
                                        double initial, double *restrict acc,
                                        int32_t *restrict arg, int32_t abase, int32_t astep) {
    roicore_max_tail_f64(img, W, C, 0, h0, h1, w0, w1, initial, acc, arg, abase, astep);
}

/* One box: the PH x PW bins with row ranges [hs, he) and column ranges [ws, we), C
 * channels each, into acc's (bin, channel) rows of C values (and arg's, unless NULL); an
 * empty bin gets 0 and -1.  One call per box and channel block: per-bin calls into the
 * cloned function cost an indirect call each (1.6 M of them at c4_14x14).
 *
 * `pend` holds up to `npend` earlier write-outs (the previous task's staged output, see
 * roicore_pending) that the box streams a chunk of before each row of bins and finishes
 * before it returns. */
#define ROICORE_MAX_BOX(NAME, T, BIN, TARGET, ATTR)                                            \
    TARGET ROICORE_INLINE void NAME##_bins(                                                \
        const T *img, int64_t W, int64_t C, int64_t PH, int64_t PW,                            \
        const int64_t *hs, const int64_t *he, const int64_t *ws, const int64_t *we, T initial, \
        T *restrict acc, int32_t *restrict arg, int32_t abase, int32_t astep,                  \
        roicore_pending *pend, int npend) {                                                    \
        for (int64_t ph = 0; ph < PH; ++ph) {                                                  \
            roicore_pending_step_all(pend, npend);                                             \
            for (int64_t pw = 0; pw < PW; ++pw) {                                              \
                T *acc_p = acc + (ph * PW + pw) * C;                                           \
                int32_t *arg_p = arg ? arg + (ph * PW + pw) * C : NULL;                        \
                if (he[ph] <= hs[ph] || we[pw] <= ws[pw]) {                                    \
                    for (int64_t c = 0; c < C; ++c) acc_p[c] = 0;                              \
                    if (arg_p) for (int64_t c = 0; c < C; ++c) arg_p[c] = -1;                  \
                    continue;                                                                  \
                }                                                                              \
                BIN(img, W, C, hs[ph], he[ph], ws[pw], we[pw], initial, acc_p, arg_p, abase,   \
                    astep);                                                                    \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
    ATTR static void NAME(                                                                     \
        const T *img, int64_t W, int64_t C, int64_t PH, int64_t PW,                            \
        const int64_t *hs, const int64_t *he, const int64_t *ws, const int64_t *we, T initial, \
        T *restrict acc, int32_t *restrict arg, int32_t abase, int32_t astep,                  \
        roicore_pending *pend, int npend) {                                                    \
        /* two inlined copies, so that the one without indices has no trace of them */     \
        if (arg)                                                                               \
            NAME##_bins(img, W, C, PH, PW, hs, he, ws, we, initial, acc, arg, abase, astep,    \
                        pend, npend);                                                          \
        else                                                                                   \
            NAME##_bins(img, W, C, PH, PW, hs, he, ws, we, initial, acc, NULL, 0, 0, pend,     \
                        npend);                                                                \
        roicore_pending_finish_all(pend, npend);                                               \
    }
ROICORE_MAX_BOX(roicore_max_box_f64, double, roicore_max_bin_f64, , ROICORE_CLONES)
ROICORE_MAX_BIN_F32(roicore_max_bin_f32_any, , ROICORE_VMAX_SELECT)
ROICORE_MAX_BOX(roicore_max_box_f32_any, float, roicore_max_bin_f32_any, , )
#ifdef ROICORE_X86_DISPATCH
#include <immintrin.h>
#define ROICORE_AVX2 __attribute__((target("avx2")))
#define ROICORE_VMAX_AVX2(v, m) ((roicore_v8f)_mm256_max_ps((__m256)(v), (__m256)(m)))
ROICORE_MAX_BIN_F32(roicore_max_bin_f32_avx2, ROICORE_AVX2, ROICORE_VMAX_AVX2)
ROICORE_MAX_BOX(roicore_max_box_f32_avx2, float, roicore_max_bin_f32_avx2, ROICORE_AVX2,
                ROICORE_AVX2)
#endif

static void roicore_max_box_f32(const float *img, int64_t W, int64_t C, int64_t PH, int64_t PW,
                                const int64_t *hs, const int64_t *he, const int64_t *ws,
                                const int64_t *we, float initial, float *restrict acc,
                                int32_t *restrict arg, int32_t abase, int32_t astep,
                                roicore_pending *pend, int npend) {
#ifdef ROICORE_X86_DISPATCH
    if (__builtin_cpu_supports("avx2")) {
        roicore_max_box_f32_avx2(img, W, C, PH, PW, hs, he, ws, we, initial, acc, arg, abase,
                                 astep, pend, npend);
        return;
    }
#endif
    roicore_max_box_f32_any(img, W, C, PH, PW, hs, he, ws, we, initial, acc, arg, abase, astep,
                            pend, npend);
}

/* RoIAlign forward, one bin for all C channels of an NHWC image (rows of C): the bin's
 * gy x gx samples, row sample iy at rows ylo/yhi with weights ylw/yhw and column sample ix
 * likewise (index -1: outside the map, counted as 0 * v[0] as the frameworks do), summed
 * per channel from 0 in (iy, ix) order as ((w1*a + w2*b) + w3*c) + w4*d, then divided by
 * `norm` (Caffe2) or multiplied by it (Paddle's reciprocal).
 *
 * Samples outer, channels inner: each sample streams four whole pixel rows.  Two
 * alternatives measured no better at C = 512: holding 16 channels in registers across the
 * samples was 2x slower (64-byte pieces of 16 rows per block defeat the prefetchers), and
 * fusing four samples per pass over the sum, to save its loads and stores, gained nothing. */
#define ROICORE_ALIGN_BIN(SUFFIX, T)                                                           \
    ROICORE_CLONES static void roicore_align_bin_##SUFFIX(                                     \
        const T *img, int64_t W, int64_t C, int64_t gy, const int64_t *ylo, const int64_t *yhi, \
        const T *ylw, const T *yhw, int64_t gx, const int64_t *xlo, const int64_t *xhi,        \
        const T *xlw, const T *xhw, T norm, int divide, T *restrict out) {                     \
        for (int64_t i = 0; i < C; ++i) out[i] = 0;                                            \
        for (int64_t iy = 0; iy < gy; ++iy)                                                    \
            for (int64_t ix = 0; ix < gx; ++ix) {                                              \
                int64_t o1 = 0, o2 = 0, o3 = 0, o4 = 0;                                        \
                T w1 = 0, w2 = 0, w3 = 0, w4 = 0;                                              \
                if (ylo[iy] >= 0 && xlo[ix] >= 0) {                                            \
                    o1 = (ylo[iy] * W + xlo[ix]) * C;                                          \
                    o2 = (ylo[iy] * W + xhi[ix]) * C;                                          \
                    o3 = (yhi[iy] * W + xlo[ix]) * C;                                          \
                    o4 = (yhi[iy] * W + xhi[ix]) * C;                                          \
                    w1 = ylw[iy] * xlw[ix];                                                    \
                    w2 = ylw[iy] * xhw[ix];                                                    \
                    w3 = yhw[iy] * xlw[ix];                                                    \
                    w4 = yhw[iy] * xhw[ix];                                                    \
                }                                                                              \
                const T *a = img + o1, *b = img + o2, *c = img + o3, *d = img + o4;            \
                for (int64_t i = 0; i < C; ++i)                                                \
                    out[i] = out[i] + (((w1 * a[i] + w2 * b[i]) + w3 * c[i]) + w4 * d[i]);     \
            }                                                                                  \
        if (divide)                                                                            \
            for (int64_t i = 0; i < C; ++i) out[i] = out[i] / norm;                            \
        else                                                                                   \
            for (int64_t i = 0; i < C; ++i) out[i] = out[i] * norm;                            \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_ALIGN_BIN)

/* RoIAlign forward, one whole box on one channel block: img is an (H, W, L) block of the
 * map (L = 8 vectors of VT: 64 floats or 32 doubles, 256 bytes per pixel), the tables are
 * the box's PH*gy row and PW*gx column samples, and out gets its (bin, L) sums, each
 * channel summed from 0 in (iy, ix) order exactly as roicore_align_bin does.  The sums
 * live in 8 vector registers for a whole bin, so a sample costs its corner loads and
 * arithmetic only; a bin row touches a few rows x the box width x 256 bytes, which stays
 * in L1 where the full-width (2 KiB per pixel at C = 512) rows did not. */
#define ROICORE_ALIGN_BOX(SUFFIX, T, VT)                                                       \
    ROICORE_CLONES static void roicore_align_box_##SUFFIX(                                     \
        const T *img, int64_t W, int64_t PH, int64_t PW, int64_t gy, const int64_t *ylo,       \
        const int64_t *yhi, const T *ylw, const T *yhw, int64_t gx, const int64_t *xlo,        \
        const int64_t *xhi, const T *xlw, const T *xhw, T norm, int divide, T *restrict out,   \
        roicore_pending *pend, int npend) {                                                    \
        enum { LANES = sizeof(VT) / sizeof(T), L = 8 * LANES };                                \
        typedef VT VTu __attribute__((aligned(sizeof(T))));                                    \
        for (int64_t ph = 0; ph < PH; ++ph) {                                                  \
            roicore_pending_step_all(pend, npend);                                             \
            for (int64_t pw = 0; pw < PW; ++pw) {                                              \
                VT acc[8];                                                                     \
                for (int q = 0; q < 8; ++q) acc[q] = (VT){0};                                  \
                for (int64_t iy = ph * gy; iy < (ph + 1) * gy; ++iy)                           \
                    for (int64_t ix = pw * gx; ix < (pw + 1) * gx; ++ix) {                     \
                        const T *a = img, *b = img, *c = img, *d = img;                        \
                        T w1 = 0, w2 = 0, w3 = 0, w4 = 0;                                      \
                        if (ylo[iy] >= 0 && xlo[ix] >= 0) {                                    \
                            a = img + (ylo[iy] * W + xlo[ix]) * L;                             \
                            b = img + (ylo[iy] * W + xhi[ix]) * L;                             \
                            c = img + (yhi[iy] * W + xlo[ix]) * L;                             \
                            d = img + (yhi[iy] * W + xhi[ix]) * L;                             \
                            w1 = ylw[iy] * xlw[ix];                                            \
                            w2 = ylw[iy] * xhw[ix];                                            \
                            w3 = yhw[iy] * xlw[ix];                                            \
                            w4 = yhw[iy] * xhw[ix];                                            \
                        }                                                                      \
                        /* keep the four corner pointers as bases: otherwise GCC makes    \
                           32 induction variables of a[q] .. d[q] and spills them */       \
                        __asm__("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));                      \
                        _Pragma("GCC unroll 8")                                                \
                        for (int q = 0; q < 8; ++q)                                            \
                            acc[q] = acc[q] + (((w1 * ((const VTu *)a)[q] + w2 * ((const VTu *)b)[q]) \
                                                + w3 * ((const VTu *)c)[q]) + w4 * ((const VTu *)d)[q]); \
                    }                                                                          \
                VTu *o = (VTu *)(out + (ph * PW + pw) * L);                                    \
                _Pragma("GCC unroll 8")                                                        \
                for (int q = 0; q < 8; ++q) o[q] = divide ? acc[q] / norm : acc[q] * norm;     \
            }                                                                                  \
        }                                                                                      \
        roicore_pending_finish_all(pend, npend);                                               \
    }
ROICORE_ALIGN_BOX(f32, float, roicore_v8f)
ROICORE_ALIGN_BOX(f64, double, roicore_v4d)

/* Shared by both RoIAlign backward kernels.  ROICORE_SAMPLE_CORNERS declares, for an
 * in-map sample (iy, ix), its four corner pixels in `img` (rows of `stride` values, W
 * pixels per image row) and their weights, in the frameworks' corner order.
 * ROICORE_GRADIENT_SCALE declares `pow2` and `inv` for the division by `count` (see
 * roicore_align_bin_grad). */
#define ROICORE_SAMPLE_CORNERS(T, stride)                                                     \
    T *const corner[4] = {img + (ylo[iy] * W + xlo[ix]) * (stride),                            \
                          img + (ylo[iy] * W + xhi[ix]) * (stride),                            \
                          img + (yhi[iy] * W + xlo[ix]) * (stride),                            \
                          img + (yhi[iy] * W + xhi[ix]) * (stride)};                           \
    const T weight[4] = {ylw[iy] * xlw[ix], ylw[iy] * xhw[ix], yhw[iy] * xlw[ix],              \
                         yhw[iy] * xhw[ix]};
#define ROICORE_GRADIENT_SCALE(T)                                                              \
    const int64_t whole = (int64_t)count;                                                      \
    const int pow2 = (T)whole == count && whole > 0 && (whole & (whole - 1)) == 0;             \
    const T inv = (T)1 / count;

/* RoIAlign backward, one bin: for each of its samples inside the map (tables as in
 * roicore_align_bin), channels i < n of the four corner pixels receive, in corner order,
 * (g[i] * w) / count, Caffe2's "grad * w / count"; img rows are C apart.  The division
 * bounds this loop.  When count is a power of two (sampling_ratio 2: count 4), x / count
 * and x * (1 / count) are the same correctly rounded real, so it multiplies instead. */
#define ROICORE_ALIGN_BIN_GRAD(SUFFIX, T)                                                      \
    ROICORE_CLONES static void roicore_align_bin_grad_##SUFFIX(                                \
        T *img, int64_t W, int64_t C, int64_t n, int64_t gy, const int64_t *ylo,               \
        const int64_t *yhi, const T *ylw, const T *yhw, int64_t gx, const int64_t *xlo,        \
        const int64_t *xhi, const T *xlw, const T *xhw, const T *restrict g, T count) {        \
        ROICORE_GRADIENT_SCALE(T)                                                              \
        for (int64_t iy = 0; iy < gy; ++iy) {                                                  \
            if (ylo[iy] < 0) continue;                                                         \
            for (int64_t ix = 0; ix < gx; ++ix) {                                              \
                if (xlo[ix] < 0) continue;                                                     \
                ROICORE_SAMPLE_CORNERS(T, C)                                                   \
                for (int q = 0; q < 4; ++q) {  /* corners may coincide: one at a time */       \
                    T *restrict dst = corner[q];                                               \
                    const T w = weight[q];                                                     \
                    if (pow2)                                                                  \
                        for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + (g[i] * w) * inv;    \
                    else                                                                       \
                        for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + (g[i] * w) / count;  \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_ALIGN_BIN_GRAD)

/* Its whole-box form on one channel block (layout as in roicore_align_box): g holds the
 * box's upstream gradient as (bin, L) rows, and each in-map sample adds, corner by corner
 * and in (ph, pw, iy, ix) order, (g * w) / count to the four corner pixels; the same
 * per-channel expressions and order as roicore_align_bin_grad.  A bin's gradient stays in
 * 8 vector registers for all its samples. */
#define ROICORE_ALIGN_BOX_GRAD(SUFFIX, T, VT)                                                  \
    ROICORE_CLONES static void roicore_align_box_grad_##SUFFIX(                                \
        T *img, int64_t W, int64_t PH, int64_t PW, int64_t gy, const int64_t *ylo,             \
        const int64_t *yhi, const T *ylw, const T *yhw, int64_t gx, const int64_t *xlo,        \
        const int64_t *xhi, const T *xlw, const T *xhw, const T *restrict g, T count) {        \
        enum { LANES = sizeof(VT) / sizeof(T), L = 8 * LANES };                                \
        typedef VT VTu __attribute__((aligned(sizeof(T))));                                    \
        ROICORE_GRADIENT_SCALE(T)                                                              \
        for (int64_t ph = 0; ph < PH; ++ph)                                                    \
            for (int64_t pw = 0; pw < PW; ++pw) {                                              \
                VT gv[8];                                                                      \
                const VTu *gp = (const VTu *)(g + (ph * PW + pw) * L);                         \
                for (int q = 0; q < 8; ++q) gv[q] = gp[q];                                     \
                for (int64_t iy = ph * gy; iy < (ph + 1) * gy; ++iy) {                         \
                    if (ylo[iy] < 0) continue;                                                 \
                    for (int64_t ix = pw * gx; ix < (pw + 1) * gx; ++ix) {                     \
                        if (xlo[ix] < 0) continue;                                             \
                        ROICORE_SAMPLE_CORNERS(T, L)                                           \
                        for (int c = 0; c < 4; ++c) { /* corners may coincide: in turn */      \
                            VTu *dst = (VTu *)corner[c];                                       \
                            const T w = weight[c];                                             \
                            __asm__("" : "+r"(dst));                                           \
                            if (pow2) {                                                        \
                                _Pragma("GCC unroll 8")                                        \
                                for (int q = 0; q < 8; ++q) dst[q] = dst[q] + (gv[q] * w) * inv; \
                            } else {                                                           \
                                _Pragma("GCC unroll 8")                                        \
                                for (int q = 0; q < 8; ++q) dst[q] = dst[q] + (gv[q] * w) / count; \
                            }                                                                  \
                        }                                                                      \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
    }
ROICORE_ALIGN_BOX_GRAD(f32, float, roicore_v8f)
ROICORE_ALIGN_BOX_GRAD(f64, double, roicore_v4d)

/* Layout changes for the channel-vectorised kernels, all one strided 2-D transpose:
 * out[j*out_stride + i] = in[i*in_stride + j] for i < R, j < Cc.  (pixel or bin, channel)
 * rows -> channel planes is R = pixels, Cc = channels, and the reverse swaps them.
 * Full 8 x 8 tiles are loaded as eight row vectors, transposed in registers with three
 * rounds of shuffles and stored as eight row vectors, so both sides move whole cache-line
 * pieces; edges fall back to scalar copies.  Copies are exact, so every clone agrees. */
#if defined(__GNUC__) && !defined(__clang__)
#define ROICORE_SHUFFLE(MT, a, b, ...) __builtin_shuffle(a, b, (MT){__VA_ARGS__})
#define ROICORE_TRANSPOSE_TILE(VT, MT, NCOLS)                                                 \
    {                                                                                          \
        VT r[8], t[8], u[8];                                                                   \
        /* unaligned vector loads: memcpy into r[] here went through the stack, and the \
           split 16-byte stores stalled the 32-byte reloads */                             \
        typedef VT VT##_u __attribute__((aligned(4)));                                     \
        for (int q = 0; q < 8; ++q) r[q] = *(const VT##_u *)(in + ROICORE_ROW(i + q) * in_stride + j); \
        for (int q = 0; q < 8; q += 2) {                                                       \
            t[q] = ROICORE_SHUFFLE(MT, r[q], r[q + 1], 0, 8, 1, 9, 4, 12, 5, 13);                  \
            t[q + 1] = ROICORE_SHUFFLE(MT, r[q], r[q + 1], 2, 10, 3, 11, 6, 14, 7, 15);            \
        }                                                                                      \
        for (int q = 0; q < 8; q += 4)                                                         \
            for (int e = 0; e < 2; ++e) {                                                      \
                u[q + 2 * e] = ROICORE_SHUFFLE(MT, t[q + e], t[q + e + 2], 0, 1, 8, 9, 4, 5, 12, 13); \
                u[q + 2 * e + 1] = ROICORE_SHUFFLE(MT, t[q + e], t[q + e + 2], 2, 3, 10, 11, 6, 7, 14, 15); \
            }                                                                                  \
        for (int q = 0; q < 4; ++q) {                                                          \
            VT lo = ROICORE_SHUFFLE(MT, u[q], u[q + 4], 0, 1, 2, 3, 8, 9, 10, 11);                 \
            VT hi = ROICORE_SHUFFLE(MT, u[q], u[q + 4], 4, 5, 6, 7, 12, 13, 14, 15);               \
            if (q < (NCOLS)) *(VT##_u *)(out + (j + q) * out_stride + i) = lo;                 \
            if (q + 4 < (NCOLS)) *(VT##_u *)(out + (j + q + 4) * out_stride + i) = hi;         \
        }                                                                                      \
    }
#else
#define ROICORE_TRANSPOSE_TILE(VT, MT, NCOLS)                                                 \
    for (int64_t a = i; a < i + 8; ++a)                                                        \
        for (int64_t b = j; b < j + (NCOLS); ++b) out[b * out_stride + a] = in[ROICORE_ROW(a) * in_stride + b];
#endif


/* `flags` may hold:
 * ROICORE_PAD_ROWS: R is rounded up to a multiple of 8 and the missing rows repeat row
 *   R - 1: out rows then get round_up(R, 8) values, the extra ones in padding the caller
 *   owns, and no row is left to the scalar edge loop (PS-RoI's D = 21: 5 of 21 rows
 *   otherwise).
 * ROICORE_WIDE_ROWS: every in row may be read up to column round_up(Cc, 8), so the last
 *   Cc % 8 columns go through a whole tile that stores only their out rows (PS-RoI's
 *   staged bins, rows of S = round_up(D, 8): scalar copies were 10 % of a forward). */
enum { ROICORE_PAD_ROWS = 1, ROICORE_WIDE_ROWS = 2 };
#define ROICORE_ROW(r) ((r) < R ? (r) : R - 1)
#define ROICORE_TRANSPOSE(SUFFIX, T, VT, MT)                                                    \
    ROICORE_CLONES static void roicore_transpose_##SUFFIX(const T *restrict in, int64_t in_stride, \
                                                           int64_t R, int64_t Cc, T *restrict out, \
                                                           int64_t out_stride, int flags) {    \
        const int64_t rows = flags & ROICORE_PAD_ROWS ? (R + 7) / 8 * 8 : R;                   \
        int64_t i = 0, j;                                                                      \
        if (flags & ROICORE_PAD_ROWS && rows <= 32) {                                          \
            /* Few padded rows (PS-RoI's slabs: 24 channels): blocks of 8 columns outermost, \
               so each out row is written whole at once instead of 8 values per pass over \
               the columns (rows reads at a time; building the slabs got 12 % faster). */  \
            for (j = 0; j + 8 <= Cc; j += 8)                                                   \
                for (i = 0; i < rows; i += 8) ROICORE_TRANSPOSE_TILE(VT, MT, 8)                \
            for (; j < Cc; ++j)                                                                \
                for (int64_t a = 0; a < rows; ++a)                                             \
                    out[j * out_stride + a] = in[ROICORE_ROW(a) * in_stride + j];              \
            return;                                                                            \
        }                                                                                      \
        for (; i + 8 <= rows; i += 8) {                                                        \
            for (j = 0; j + 8 <= Cc; j += 8) ROICORE_TRANSPOSE_TILE(VT, MT, 8)                 \
            if (j < Cc && flags & ROICORE_WIDE_ROWS) {                                         \
                ROICORE_TRANSPOSE_TILE(VT, MT, Cc - j)                                         \
                j = Cc;                                                                        \
            }                                                                                  \
            for (; j < Cc; ++j)                                                                \
                for (int64_t a = i; a < i + 8; ++a)                                            \
                    out[j * out_stride + a] = in[ROICORE_ROW(a) * in_stride + j];              \
        }                                                                                      \
        for (; i < R; ++i)                                                                     \
            for (j = 0; j < Cc; ++j) out[j * out_stride + i] = in[i * in_stride + j];          \
    }
ROICORE_TRANSPOSE(f32, float, roicore_v8f, roicore_v8i)
ROICORE_TRANSPOSE(f64, double, roicore_v8d, roicore_v8l)
ROICORE_TRANSPOSE(i32, int32_t, roicore_v8i, roicore_v8i)


/* Argmax planes to flat indices into x: `rows` planes of n indices, plane r shifted by
 * base + r * step; -1 (no pixel) stays.  A select, so it vectorises.  For the per-plane
 * max pool and for int64 indices; the channel-blocked kernel adds int32 offsets as it
 * stores each bin (roicore_max_box_f32). */
#define ROICORE_OFFSET_INDICES(SUFFIX, T)                                                      \
    ROICORE_CLONES static void roicore_offset_indices_##SUFFIX(T *a, int64_t rows, int64_t n,  \
                                                               int64_t base, int64_t step) {   \
        for (int64_t r = 0; r < rows; ++r) {                                                   \
            const T off = (T)(base + r * step);                                                \
            T *p = a + r * n;                                                                  \
            for (int64_t i = 0; i < n; ++i) p[i] = p[i] >= 0 ? p[i] + off : p[i];              \
        }                                                                                      \
    }
ROICORE_OFFSET_INDICES(i32, int32_t)
ROICORE_OFFSET_INDICES(i64, int64_t)

/* The argmax in int64 (Paddle): a widening copy, no tiles. */
static void roicore_transpose_i32_i64(const int32_t *restrict in, int64_t in_stride, int64_t R,
                                      int64_t Cc, int64_t *restrict out, int64_t out_stride) {
    int64_t j0 = 0;
    for (; j0 + 8 <= Cc; j0 += 8)  /* eight output planes at a time, each written in order */
        for (int64_t i = 0; i < R; ++i)
            for (int q = 0; q < 8; ++q) out[(j0 + q) * out_stride + i] = in[i * in_stride + j0 + q];
    for (; j0 < Cc; ++j0)
        for (int64_t i = 0; i < R; ++i) out[j0 * out_stride + i] = in[i * in_stride + j0];
}

/* PS-RoI pooling on a (pixel, channel) image with rows of S channels: the mean of rows
 * [h0, h1) x columns [w0, w1) for channels i < n, each summed from 0 in (h, w) order and
 * divided by the integer area, as the frameworks do per channel; 0 for an empty bin. */
#define ROICORE_REGION_SUM(VT, VTu, NV)                                                        \
    {                                                                                          \
        VT acc[NV];                                                                            \
        for (int q = 0; q < NV; ++q) acc[q] = (VT){0};                                         \
        for (int64_t h = h0; h < h1; ++h)                                                      \
            for (int64_t w = w0; w < w1; ++w) {                                                \
                const VTu *r = (const VTu *)(img + (h * W + w) * S + i);                       \
                for (int q = 0; q < NV; ++q) acc[q] = acc[q] + r[q];                           \
            }                                                                                  \
        for (int q = 0; q < NV; ++q) ((VTu *)(out + i))[q] = acc[q] / area;                    \
    }
/* The sums run in vector registers, 4 vectors of channels per pass over the region and
 * then the 1-3 vectors left in one more pass: a running sum in `out` made every pixel
 * wait on the store of the previous one, and a pass per vector left one chain of
 * dependent adds (R-FCN's D = 21 is 3 vectors of f32). */
#define ROICORE_REGION_MEAN(SUFFIX, T, VT)                                                     \
    ROICORE_INLINE void roicore_region_mean_##SUFFIX(const T *img, int64_t W, int64_t S,       \
                                                     int64_t h0, int64_t h1, int64_t w0,       \
                                                     int64_t w1, int64_t n, T *restrict out) { \
        enum { LANES = sizeof(VT) / sizeof(T) };                                               \
        typedef VT VTu __attribute__((aligned(sizeof(T))));                                    \
        if (h1 <= h0 || w1 <= w0) {                                                            \
            for (int64_t i = 0; i < n; ++i) out[i] = 0;                                        \
            return;                                                                            \
        }                                                                                      \
        const T area = (T)((h1 - h0) * (w1 - w0));                                             \
        int64_t i = 0;                                                                         \
        for (; i + 4 * LANES <= n; i += 4 * LANES) ROICORE_REGION_SUM(VT, VTu, 4)              \
        switch ((n - i) / LANES) {                                                             \
        case 3: ROICORE_REGION_SUM(VT, VTu, 3) i += 3 * LANES; break;                          \
        case 2: ROICORE_REGION_SUM(VT, VTu, 2) i += 2 * LANES; break;                          \
        case 1: ROICORE_REGION_SUM(VT, VTu, 1) i += LANES; break;                              \
        }                                                                                      \
        for (; i < n; ++i) {                                                                   \
            T sum = 0;                                                                         \
            for (int64_t h = h0; h < h1; ++h)                                                  \
                for (int64_t w = w0; w < w1; ++w) sum = sum + img[(h * W + w) * S + i];        \
            out[i] = sum / area;                                                               \
        }                                                                                      \
    }
ROICORE_REGION_MEAN(f32, float, roicore_v8f)
ROICORE_REGION_MEAN(f64, double, roicore_v4d)

/* Its adjoint: with diff[i] = g[i*gstride] / area for i < n (the upstream gradient of
 * channel i, divided by the integer area as the frameworks do) and 0 for n <= i < lanes,
 * img[(h, w), i] += diff[i] over the region in (h, w) order, for i < lanes: the padding
 * lanes receive zeros, so whole vectors need no scalar tail.  `diff` holds `lanes`
 * values.  An empty region adds nothing. */
#define ROICORE_REGION_ADD(SUFFIX, T)                                                          \
    ROICORE_INLINE void roicore_region_add_##SUFFIX(T *restrict img, int64_t W, int64_t S,     \
                                                    int64_t h0, int64_t h1, int64_t w0,        \
                                                    int64_t w1, int64_t n, int64_t lanes,      \
                                                    const T *g, int64_t gstride,               \
                                                    T *restrict diff) {                        \
        if (h1 <= h0 || w1 <= w0) return;                                                      \
        const T area = (T)((h1 - h0) * (w1 - w0));                                             \
        for (int64_t i = 0; i < n; ++i) diff[i] = g[i * gstride];                              \
        for (int64_t i = n; i < lanes; ++i) diff[i] = 0;                                       \
        for (int64_t i = 0; i < lanes; ++i) diff[i] = diff[i] / area;                          \
        for (int64_t h = h0; h < h1; ++h)                                                      \
            for (int64_t w = w0; w < w1; ++w) {                                                \
                T *r = img + (h * W + w) * S;                                                  \
                for (int64_t i = 0; i < lanes; ++i) r[i] = r[i] + diff[i];                     \
            }                                                                                  \
    }
ROICORE_FOR_BOTH_TYPES(ROICORE_REGION_ADD)

/* One group cell's work over every box, in C.  The plan holds each box's bin edges,
 * hs/he (K, PH) and ws/we (K, PW), and for group cell g = gh * GW + gw its pooled rows
 * [r0[gh], r1[gh]) and columns [q0[gw], q1[gw]).  Box k's bins read (or add to) the slab
 * of image batch[k], `img_size` values apart.  A Cython loop calling the per-bin functions
 * through their clone dispatch cost 100 us of a 0.9 ms R-FCN forward (300 boxes x 49
 * cells) in loop bookkeeping alone.  The forward writes box k's means (S values per bin,
 * bins row-major in the cell) from dst + k*M*S; the backward reads box k's gradient from
 * g + k*gbox + ph*PW + pw, channels PH*PW apart. */
typedef struct {
    int64_t K, PH, PW, GW;
    const int64_t *batch, *hs, *he, *ws, *we, *r0, *r1, *q0, *q1;
} roicore_ps_plan;

/* Box k's bin (ph, pw): rows [h0, h1), columns [w0, w1). */
#define ROICORE_PS_BIN_EDGES                                                                   \
    const int64_t h0 = c->hs[k * c->PH + ph], h1 = c->he[k * c->PH + ph];                      \
    const int64_t w0 = c->ws[k * c->PW + pw], w1 = c->we[k * c->PW + pw];

#define ROICORE_PS_CELL_LOOP(BODY)                                                             \
    const int64_t ph0 = c->r0[cell / c->GW], ph1 = c->r1[cell / c->GW];                        \
    const int64_t pw0 = c->q0[cell % c->GW], pw1 = c->q1[cell % c->GW];                        \
    for (int64_t k = 0; k < c->K; ++k)                                                         \
        for (int64_t ph = ph0; ph < ph1; ++ph)                                                 \
            for (int64_t pw = pw0; pw < pw1; ++pw) {                                           \
                ROICORE_PS_BIN_EDGES                                                           \
                BODY                                                                           \
            }

/* The same with a loop of its own for cells of one bin per box (the group is the pooled
 * size, as in R-FCN and always in Paddle).  The forward's bins took 224 us this way
 * against 284 us in the nested loops (300 x 49 bins, 1 thread); the backward's slab adds
 * were 4 % slower, so they keep the nested loops. */
#define ROICORE_PS_CELL_LOOP_SPLIT(BODY)                                                       \
    if (c->r1[cell / c->GW] - c->r0[cell / c->GW] == 1 &&                                      \
        c->q1[cell % c->GW] - c->q0[cell % c->GW] == 1) {                                      \
        const int64_t ph0 = c->r0[cell / c->GW], pw0 = c->q0[cell % c->GW];                    \
        const int64_t ph = ph0, pw = pw0, pw1 = pw0 + 1;                                       \
        for (int64_t k = 0; k < c->K; ++k) {                                                   \
            ROICORE_PS_BIN_EDGES                                                               \
            BODY                                                                               \
        }                                                                                      \
    } else {                                                                                   \
        ROICORE_PS_CELL_LOOP(BODY)                                                             \
    }

/* The forward's bins with S = NV vectors of channels, NV fixed at compile time: one pass
 * of NV sums per bin and nothing else.  Through roicore_region_mean, whose vector count is
 * chosen per bin, R-FCN's 300 x 49 bins took 284 us at 1 thread; this way, 203 us. */
#define ROICORE_PS_BIN_MEAN(T, VT, NV)                                                         \
    {                                                                                          \
        typedef VT VTu __attribute__((aligned(sizeof(T))));                                    \
        const T *img = slab + c->batch[k] * img_size;                                          \
        T *out = dst + (k * M + (ph - ph0) * (pw1 - pw0) + (pw - pw0)) * S;                    \
        const int64_t i = 0;                                                                   \
        if (h1 <= h0 || w1 <= w0) {                                                            \
            for (int q = 0; q < NV; ++q) ((VTu *)out)[q] = (VT){0};                            \
        } else {                                                                               \
            const T area = (T)((h1 - h0) * (w1 - w0));                                         \
            ROICORE_REGION_SUM(VT, VTu, NV)                                                    \
        }                                                                                      \
    }

/* LOOP(BIN(T, VT, NV)) with NV = S / lanes fixed at compile time, then return, for the
 * vector counts PS-RoI meets most (D up to 32 in f32, 24 in f64); other counts fall
 * through to the caller's generic loop. */
#define ROICORE_PS_BY_VECTOR_COUNT(LOOP, BIN, T, VT)                                           \
    switch (S / (int64_t)(sizeof(VT) / sizeof(T))) {                                           \
    case 1: { LOOP(BIN(T, VT, 1)) return; }                                                    \
    case 2: { LOOP(BIN(T, VT, 2)) return; }                                                    \
    case 3: { LOOP(BIN(T, VT, 3)) return; }                                                    \
    case 4: { LOOP(BIN(T, VT, 4)) return; }                                                    \
    case 6: { LOOP(BIN(T, VT, 6)) return; }                                                    \
    }

#define ROICORE_PS_CELL_MEAN(SUFFIX, T, VT)                                                    \
    ROICORE_CLONES static void roicore_ps_cell_mean_##SUFFIX(const roicore_ps_plan *c,         \
                                                              int64_t cell, const T *slab,     \
                                                              int64_t img_size, int64_t W,     \
                                                              int64_t S, int64_t M,            \
                                                              T *restrict dst) {               \
        ROICORE_PS_BY_VECTOR_COUNT(ROICORE_PS_CELL_LOOP_SPLIT, ROICORE_PS_BIN_MEAN, T, VT)     \
        ROICORE_PS_CELL_LOOP_SPLIT(                                                            \
            T *o = dst + (k * M + (ph - ph0) * (pw1 - pw0) + (pw - pw0)) * S;                  \
            roicore_region_mean_##SUFFIX(slab + c->batch[k] * img_size, W, S, h0, h1, w0, w1,  \
                                         S, o);)                                               \
    }
ROICORE_PS_CELL_MEAN(f32, float, roicore_v8f)
ROICORE_PS_CELL_MEAN(f64, double, roicore_v4d)

/* The backward's bins likewise, NV vectors of channels kept in registers for all the
 * bin's pixels (roicore_region_add reloads its `lanes` differences for every pixel). */
#define ROICORE_PS_BIN_ADD(T, VT, NV)                                                          \
    if (h1 > h0 && w1 > w0) {                                                                  \
        typedef VT VTu __attribute__((aligned(sizeof(T))));                                    \
        enum { LANES = sizeof(VT) / sizeof(T) };                                               \
        const T area = (T)((h1 - h0) * (w1 - w0));                                             \
        const T *gk = g + k * gbox + ph * c->PW + pw;                                          \
        T *img = slab + c->batch[k] * img_size;                                                \
        for (int64_t i = 0; i < D; ++i) diff[i] = gk[i * c->PH * c->PW];                       \
        for (int64_t i = D; i < NV * LANES; ++i) diff[i] = 0;                                  \
        VT d[NV];                                                                              \
        for (int q = 0; q < NV; ++q) d[q] = ((const VTu *)diff)[q] / area;                     \
        for (int64_t h = h0; h < h1; ++h)                                                      \
            for (int64_t w = w0; w < w1; ++w) {                                                \
                VTu *r = (VTu *)(img + (h * W + w) * S);                                       \
                for (int q = 0; q < NV; ++q) r[q] = r[q] + d[q];                               \
            }                                                                                  \
    }

#define ROICORE_PS_CELL_ADD(SUFFIX, T, VT)                                                     \
    ROICORE_CLONES static void roicore_ps_cell_add_##SUFFIX(const roicore_ps_plan *c,          \
                                                             int64_t cell, T *restrict slab,   \
                                                             int64_t img_size, int64_t W,      \
                                                             int64_t S, int64_t D, const T *g, \
                                                             int64_t gbox, T *restrict diff) { \
        ROICORE_PS_BY_VECTOR_COUNT(ROICORE_PS_CELL_LOOP, ROICORE_PS_BIN_ADD, T, VT)            \
        ROICORE_PS_CELL_LOOP(                                                                  \
            roicore_region_add_##SUFFIX(slab + c->batch[k] * img_size, W, S, h0, h1, w0, w1,   \
                                        D, S, g + k * gbox + ph * c->PW + pw, c->PH * c->PW,   \
                                        diff);)                                                \
    }
ROICORE_PS_CELL_ADD(f32, float, roicore_v8f)
ROICORE_PS_CELL_ADD(f64, double, roicore_v4d)

#endif
