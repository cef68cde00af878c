/* RoI max pooling for element type T; roi_pool.c includes this once per dtype with T, SFX,
 * VT, MT, IT, UMT and LANES defined. */

#define FWD_TASK ROICORE_CAT(roicore_fwd_task, SFX)
#define FWD_JOB ROICORE_CAT(roicore_fwd_job, SFX)
#define MAX_OP ROICORE_CAT(max_op, SFX)
#define TYPED(name) ROICORE_CAT(name, SFX)

/* Bin edges along one axis of the Fast R-CNN integer RoI: round(x*s) (half away from zero;
 * the product in T or in double), +1, at least 1 pixel, floor/ceil of p*rh/P in the
 * requested arithmetic, then clamped to [0, size]. */
static void TYPED(integer_roi_bins)(T lo, T hi, T scale, int64_t P, int64_t size, int mode,
                                    int product_double, int64_t *start, int64_t *end) {
    int64_t s, e;
    if (product_double) {
        s = (int64_t)round((double)lo * (double)scale);
        e = (int64_t)round((double)hi * (double)scale);
    } else {
        s = (int64_t)round(lo * scale);
        e = (int64_t)round(hi * scale);
    }
    int64_t r = e - s + 1;
    if (r < 1) r = 1;  /* malformed (reversed) boxes become one pixel */
    const float bin32 = (float)r / (float)P;
    const double bin64 = (double)r / (double)P;
    for (int64_t p = 0; p < P; ++p) {
        int64_t a, b;
        if (mode == BINS_EXACT) {
            a = (p * r) / P;
            b = ((p + 1) * r + P - 1) / P;
        } else if (mode == BINS_FLOAT32) {
            a = (int64_t)floor((float)p * bin32);
            b = (int64_t)ceil((float)(p + 1) * bin32);
        } else {
            a = (int64_t)floor((double)p * bin64);
            b = (int64_t)ceil((double)(p + 1) * bin64);
        }
        start[p] = roicore_clamp64(a + s, 0, size);
        end[p] = roicore_clamp64(b + s, 0, size);
    }
}

typedef struct {
    const int64_t *hs, *he, *ws, *we;  /* bin edges: rows (K, PH), columns (K, PW) */
    int64_t W, PH, PW;
    int compare, first;
    T initial;
} MAX_OP;

#define VARIANT any
#define VARIANT_ATTR
#define VMAX(v, m) ((VT)((((MT)(v)) & ((v) > (m))) | (((MT)(m)) & ~((v) > (m)))))
#include "max_bins_typed.h"
#undef VARIANT
#undef VARIANT_ATTR
#undef VMAX

#ifdef ROICORE_X86_DISPATCH
#define VARIANT avx2
#define VARIANT_ATTR ROICORE_AVX2
#define VMAX(v, m) ((VT)AVX2_MAX((v), (m)))
#include "max_bins_typed.h"
#undef VARIANT
#undef VARIANT_ATTR
#undef VMAX
#endif

static void TYPED(max_task)(const void *op, FWD_TASK *t) {
#ifdef ROICORE_X86_DISPATCH
    if (roicore_has_avx2()) {
        ROICORE_CAT(TYPED(max_task), avx2)(op, t);
        return;
    }
#endif
    ROICORE_CAT(TYPED(max_task), any)(op, t);
}

static int TYPED(max_forward)(const roicore_max_pool_rules *rules, const roicore_tensor *x,
                              const roicore_boxes *boxes, double scale, const roicore_tensor *out,
                              void *argmax, roicore_index_type argmax_type, roicore_run *run,
                              roicore_error *err) {
    const int64_t K = boxes->k, PH = out->h, PW = out->w, H = x->h, W = x->w;
    int mode = rules->bin_arithmetic == ROICORE_BIN_ARITHMETIC_EXACT     ? BINS_EXACT
               : rules->bin_arithmetic == ROICORE_BIN_ARITHMETIC_FLOAT32 ? BINS_FLOAT32
               : sizeof(T) == 4                                          ? BINS_FLOAT32
                                                                         : BINS_FLOAT64;
    const int product_double = rules->scale_product == ROICORE_PRECISION_FLOAT64;
    int64_t *tables = (int64_t *)roicore_scratch(roicore_mul(K, 2 * (PH + PW) * 8) + 32 * x->n,
                                                 "bin tables", err);
    if (!tables) return err ? err->code : ROICORE_ERR_MEMORY;
    int64_t *hs = tables, *he = hs + K * PH, *ws = he + K * PH, *we = ws + K * PW;
    int64_t *region = we + K * PW;
    const T *c = (const T *)boxes->coords;
    const T s = (T)scale;
    /* a few dozen operations per box: threads only for many boxes (waking them costs more) */
#pragma omp parallel for num_threads(K >= 8192 ? run->n_threads : 1) schedule(static)
    for (int64_t k = 0; k < K; ++k) {
        TYPED(integer_roi_bins)(c[4 * k + 1], c[4 * k + 3], s, PH, H, mode, product_double,
                                hs + k * PH, he + k * PH);
        TYPED(integer_roi_bins)(c[4 * k + 0], c[4 * k + 2], s, PW, W, mode, product_double,
                                ws + k * PW, we + k * PW);
    }
    /* the rectangle each image's bins cover (bin edges are non-decreasing): below 8192
     * boxes, where one thread builds the tables, so that few boxes copy little of x */
    const int regions = K < 8192;
    if (regions) {
        roicore_region_init(region, x->n, H, W);
        for (int64_t k = 0; k < K; ++k)
            if (boxes->batch[k] >= 0)
                roicore_region_include(region, boxes->batch[k], hs[k * PH], he[k * PH + PH - 1],
                                       ws[k * PW], we[k * PW + PW - 1]);
    }
    T initial;
    switch (rules->initial) {
    case ROICORE_INITIAL_NEG_FLT_MAX: initial = (T)-FLT_MAX; break;
    case ROICORE_INITIAL_LOWEST: initial = sizeof(T) == 4 ? (T)-FLT_MAX : (T)-DBL_MAX; break;
    default: initial = (T)NAN; break;  /* "nan"; "first" starts from the bin's first pixel */
    }
    const MAX_OP op = {hs, he, ws, we, W, PH, PW, (int)rules->compare,
                       rules->initial == ROICORE_INITIAL_FIRST, initial};
    const FWD_JOB job = {x, out, boxes->batch, argmax, argmax_type,
                         rules->argmax == ROICORE_ARGMAX_GLOBAL, regions ? region : NULL, &op,
                         TYPED(max_task), 0, NULL, 0, NULL};
    int rc = ROICORE_CAT(roicore_blocked_forward, SFX)(&job, run, err);
    roicore_scratch_free(tables);
    return rc;
}

/* The scatter of each output gradient to its argmax.  A task owns a run of channels whose
 * gradient planes fill SCATTER_BYTES, so that the scattered additions stay in L2, zeroes
 * them, and walks the boxes in order, each box's (channel, bin) gradients and indices of
 * the run read as one contiguous piece; per channel the additions keep the frameworks'
 * (box, ph, pw) order, so no atomics are needed and every thread count gives the same
 * bits.  Threads take the tasks one at a time, so one that falls behind does not set the
 * pace.  An NHWC dx is scattered into NCHW scratch and transposed into place once at the
 * end: each run writing its slice of every NHWC row (or scattering with a stride of C)
 * moved the whole of dx through the caches once per run.  An NHWC grad_output and argmax
 * are read through a per-thread (channel, bin) copy of each box's slice, a chunk of bins
 * at a time: their rows lie C values apart, and a box's rows then share a few L1 sets.
 * An index that is neither -1 nor a pixel of its own (box, channel) plane
 * is skipped, never followed, and counted in *n_bad: validating in the same pass saves a
 * read of the whole argmax. */
#define SCATTER_BYTES (256 << 10)
static int TYPED(max_backward)(const roicore_tensor *g, const void *argmax,
                               roicore_index_type type, const int64_t *batch, int global,
                               const roicore_tensor *dx, roicore_run *run, int64_t *n_bad_out,
                               roicore_error *err) {
    const int64_t K = g->n, C = g->c, P = g->h * g->w, N = dx->n, HW = dx->h * dx->w;
    const int64_t part = roicore_max64(1, SCATTER_BYTES / (HW * (int64_t)sizeof(T)));
    const int64_t n_parts = (C + part - 1) / part;
    const int nchw_g = g->layout == ROICORE_NCHW, nchw_dx = dx->layout == ROICORE_NCHW;
    const int nt = run->n_threads;
    const int64_t isz = (int64_t)roicore_index_size(type);
    const int64_t bins = roicore_min64(P, 4096);  /* a chunk of an NHWC box's bins */
    const int64_t dx_bytes = nchw_dx ? 0 : roicore_round_up(roicore_tensor_bytes(dx), 64);
    const int64_t thread_bytes =
        nchw_g ? 0 : roicore_round_up(part * bins * ((int64_t)sizeof(T) + isz), 64);
    char *scratch = NULL;
    if (!nchw_dx || !nchw_g) {
        scratch = (char *)roicore_scratch(dx_bytes + nt * thread_bytes,
                                          "the gradient's NCHW copies", err);
        if (!scratch) return err ? err->code : ROICORE_ERR_MEMORY;
    }
    const T *gd = (const T *)g->data;
    T *dd = nchw_dx ? (T *)ROICORE_WRITABLE(dx) : (T *)scratch;  /* NCHW planes */
    int64_t n_bad = 0;
    int64_t next = 0;
#pragma omp parallel num_threads(nt) reduction(+ : n_bad)
    for (int64_t i = roicore_take(&next); i < n_parts; i = roicore_take(&next)) {
        const int64_t cs = i * part, ce = roicore_min64(cs + part, C);
        for (int64_t n = 0; n < N; ++n)
            memset(dd + (n * C + cs) * HW, 0, (size_t)((ce - cs) * HW) * sizeof(T));
        char *mine = nchw_g ? NULL : scratch + dx_bytes + omp_get_thread_num() * thread_bytes;
        T *g_run = (T *)mine;  /* NHWC: the slice, (channel, bin) */
        void *a_run = nchw_g ? NULL : mine + part * bins * (int64_t)sizeof(T);
        for (int64_t k = 0; k < K; ++k) {
            const int64_t b = batch[k];
            if (b < 0) continue;  /* masked */
            if (roicore_stopping(run)) break;
            for (int64_t p0 = 0; p0 < P; p0 += bins) {
                const int64_t nbins = nchw_g ? P : roicore_min64(bins, P - p0);
                if (!nchw_g) {
                    const int64_t first = (k * P + p0) * C + cs;
                    ROICORE_CAT(roicore_transpose, SFX)(gd + first, C, nbins, ce - cs, g_run, nbins, 0);
                    if (type == ROICORE_INT32)
                        roicore_transpose_i32((const int32_t *)argmax + first, C, nbins, ce - cs,
                                              (int32_t *)a_run, nbins, 0);
                    else
                        roicore_transpose_i64((const int64_t *)argmax + first, C, nbins, ce - cs,
                                              (int64_t *)a_run, nbins, 0);
                }
                for (int64_t c = cs; c < ce; ++c) {
                    T *plane = dd + (b * C + c) * HW;
                    const int64_t lo = global ? (b * C + c) * HW : 0;
                    const int64_t first = nchw_g ? (k * C + c) * P : (c - cs) * nbins;
                    const T *gk = (nchw_g ? gd : g_run) + first;
                    const void *ak = (const char *)(nchw_g ? argmax : a_run) + first * isz;
                    /* unsigned: an index far outside the plane cannot overflow the subtraction */
                    if (type == ROICORE_INT32) {
                        const int32_t *a = (const int32_t *)ak;
                        for (int64_t p = 0; p < nbins; ++p) {
                            const uint64_t v = (uint64_t)(int64_t)a[p] - (uint64_t)lo;
                            if (v < (uint64_t)HW) plane[v] += gk[p];
                            else if (a[p] != -1) ++n_bad;
                        }
                    } else {
                        const int64_t *a = (const int64_t *)ak;
                        for (int64_t p = 0; p < nbins; ++p) {
                            const uint64_t v = (uint64_t)a[p] - (uint64_t)lo;
                            if (v < (uint64_t)HW) plane[v] += gk[p];
                            else if (a[p] != -1) ++n_bad;
                        }
                    }
                }
            }
        }
    }
    if (!nchw_dx) {
        roicore_tensor planes = *dx;
        planes.data = dd;
        planes.layout = ROICORE_NCHW;
        roicore_relayout(&planes, ROICORE_WRITABLE(dx), nt);
    }
    roicore_scratch_free(scratch);
    *n_bad_out = n_bad;
    return roicore_run_status(run, err);
}
#undef SCATTER_BYTES

#undef FWD_TASK
#undef FWD_JOB
#undef MAX_OP
#undef TYPED
