/* Bilinear RoI pooling for element type T; bilinear.c includes this once per dtype with T,
 * SFX, VT and LANES defined.
 *
 * Boxes are normalised to [0, 1]: sample p of P lies at lo*(size-1) + p*step with
 * step = (hi-lo)*(size-1)/(P-1), corners included, and P == 1 samples the box centre (TF
 * crop_and_resize, OpenVINO ROIPooling "bilinear").  Each output is the bilinear
 * interpolation of its sample's four neighbours, per lane. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define FWD_TASK ROICORE_CAT(roicore_fwd_task, SFX)
#define FWD_JOB ROICORE_CAT(roicore_fwd_job, SFX)
#define BWD_TASK ROICORE_CAT(roicore_bwd_task, SFX)
#define BWD_JOB ROICORE_CAT(roicore_bwd_job, SFX)
#define CROP_OP TYPED(crop_op)

/* Sample position p of P on the normalised [lo, hi] box. */
static T TYPED(crop_coord)(T lo, T hi, int64_t size, int64_t P, int64_t p, int pin_last) {
    if (P == 1) return (T)(0.5 * (double)(lo + hi) * (double)(size - 1));  /* centre, in double */
    if (pin_last && p == P - 1) return (T)(size - 1) * hi;  /* OpenVINO writes the last exactly */
    const T step = (hi - lo) * (T)(size - 1) / (T)(P - 1);
    return lo * (T)(size - 1) + (T)p * step;
}

typedef struct {
    const T *ys, *xs;  /* sample rows (K, PH) and columns (K, PW) */
    int64_t H, W, PH, PW;
    int fused;
    T fill;
} CROP_OP;

/* a + (b - a) * t, rounded twice (TF, OpenVINO's reference) or once (OpenVINO's CPU plugin,
 * with fused multiply-adds) */
ROICORE_INLINE VT TYPED(lerp)(VT a, VT b, T t, int fused) {
    if (!fused) return a + (b - a) * t;
    VT r, d = b - a;
    for (int i = 0; i < LANES; ++i) r[i] = sizeof(T) == 4 ? (T)fmaf((float)d[i], (float)t, (float)a[i])
                                                          : (T)fma((double)d[i], (double)t, (double)a[i]);
    return r;
}

/* Whether sample (y, x) lies on the map; NaN does not. */
ROICORE_INLINE int TYPED(inside)(T v, int64_t size) { return v >= 0 && v <= (T)(size - 1); }

ROICORE_CLONES static void TYPED(crop_task)(const void *opv, FWD_TASK *t) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    const CROP_OP *op = (const CROP_OP *)opv;
    const int64_t PW = op->PW, W = op->W, lanes = t->lanes, nv = lanes / LANES;
    for (int64_t ph = t->p0 / PW; ph <= (t->p1 - 1) / PW; ++ph) {
        roicore_pending_step_all(t->pend, t->npend);
        if (roicore_stopping(t->run)) break;
        int64_t pw0, pw1;
        roicore_task_row(t->p0, t->p1, PW, ph, &pw0, &pw1);
        const T y = op->ys[t->k * op->PH + ph];
        for (int64_t pw = pw0; pw < pw1; ++pw) {
            VTu *out = (VTu *)(t->acc + (ph * PW + pw - t->p0) * lanes);
            const T x = op->xs[t->k * PW + pw];
            if (!TYPED(inside)(y, op->H) || !TYPED(inside)(x, W)) {
                for (int64_t q = 0; q < nv; ++q) out[q] = (VT){0} + op->fill;
                continue;
            }
            const int64_t top = (int64_t)floor(y), bottom = (int64_t)ceil(y);
            const int64_t left = (int64_t)floor(x), right = (int64_t)ceil(x);
            const T ly = y - (T)top, lx = x - (T)left;
            const VTu *a = (const VTu *)(t->img + (top * W + left) * lanes);
            const VTu *b = (const VTu *)(t->img + (top * W + right) * lanes);
            const VTu *c = (const VTu *)(t->img + (bottom * W + left) * lanes);
            const VTu *d = (const VTu *)(t->img + (bottom * W + right) * lanes);
            for (int64_t q = 0; q < nv; ++q) {
                const VT upper = TYPED(lerp)(a[q], b[q], lx, op->fused);
                const VT lower = TYPED(lerp)(c[q], d[q], lx, op->fused);
                out[q] = TYPED(lerp)(upper, lower, ly, op->fused);
            }
        }
    }
    roicore_pending_finish_all(t->pend, t->npend);
}

/* The adjoint in TF CropAndResizeGradImage's arithmetic and order: per sample on the map,
 * (1-ly)*g to the top row and ly*g to the bottom one, each split (1-lx) / lx between the
 * left and right pixels, in that order. */
ROICORE_CLONES static void TYPED(crop_grad_task)(const void *opv, BWD_TASK *t) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    const CROP_OP *op = (const CROP_OP *)opv;
    const int64_t PW = op->PW, W = op->W, lanes = t->lanes, nv = lanes / LANES;
    for (int64_t ph = t->p0 / PW; ph <= (t->p1 - 1) / PW; ++ph) {
        const T y = op->ys[t->k * op->PH + ph];
        if (!TYPED(inside)(y, op->H)) continue;
        const int64_t top = (int64_t)floor(y), bottom = (int64_t)ceil(y);
        const T ly = y - (T)top;
        int64_t pw0, pw1;
        roicore_task_row(t->p0, t->p1, PW, ph, &pw0, &pw1);
        for (int64_t pw = pw0; pw < pw1; ++pw) {
            const T x = op->xs[t->k * PW + pw];
            if (!TYPED(inside)(x, W)) continue;
            const int64_t left = (int64_t)floor(x), right = (int64_t)ceil(x);
            const T lx = x - (T)left;
            const VTu *g = (const VTu *)(t->g + (ph * PW + pw - t->p0) * lanes);
            VTu *a = (VTu *)(t->img + (top * W + left) * lanes);
            VTu *b = (VTu *)(t->img + (top * W + right) * lanes);
            VTu *c = (VTu *)(t->img + (bottom * W + left) * lanes);
            VTu *d = (VTu *)(t->img + (bottom * W + right) * lanes);
            for (int64_t q = 0; q < nv; ++q) {  /* corners may coincide: one at a time */
                const VT dtop = ((T)1 - ly) * g[q];
                a[q] = a[q] + ((T)1 - lx) * dtop;
                b[q] = b[q] + lx * dtop;
                const VT dbottom = ly * g[q];
                c[q] = c[q] + ((T)1 - lx) * dbottom;
                d[q] = d[q] + lx * dbottom;
            }
        }
    }
}

static int TYPED(crop_run)(int forward, const roicore_bilinear_pool_rules *rules,
                           const roicore_tensor *map, const roicore_tensor *pooled,
                           const roicore_boxes *boxes, double fill, roicore_run *run,
                           roicore_error *err) {
    const int64_t K = boxes->k, PH = pooled->h, PW = pooled->w;
    T *tables = (T *)roicore_scratch(roicore_mul(K, (PH + PW) * (int64_t)sizeof(T)) + 8 + 32 * map->n,
                                     "bilinear sample tables", err);
    if (!tables) return err ? err->code : ROICORE_ERR_MEMORY;
    T *ys = tables, *xs = tables + K * PH;
    int64_t *region = (int64_t *)((char *)tables + roicore_round_up(K * (PH + PW) * (int64_t)sizeof(T), 8));
    const T *c = (const T *)boxes->coords;
#pragma omp parallel for num_threads(K >= 8192 ? run->n_threads : 1) schedule(static)
    for (int64_t k = 0; k < K; ++k) {
        for (int64_t p = 0; p < PH; ++p)
            ys[k * PH + p] = TYPED(crop_coord)(c[4 * k + 1], c[4 * k + 3], map->h, PH, p, rules->pin_last);
        for (int64_t p = 0; p < PW; ++p)
            xs[k * PW + p] = TYPED(crop_coord)(c[4 * k + 0], c[4 * k + 2], map->w, PW, p, rules->pin_last);
    }
    const CROP_OP op = {ys, xs, map->h, map->w, PH, PW, rules->fused_lerp, (T)fill};
    int rc;
    if (forward) {
        /* the rectangle each image's samples read: below 8192 boxes (one thread's tables) */
        const int regions = K < 8192;
        if (regions) {
            roicore_region_init(region, map->n, map->h, map->w);
            for (int64_t k = 0; k < K; ++k) {
                if (boxes->batch[k] < 0) continue;
                int64_t r0 = map->h, r1 = 0, c0 = map->w, c1 = 0;
                for (int64_t p = 0; p < PH; ++p)
                    if (TYPED(inside)(ys[k * PH + p], map->h)) {
                        r0 = roicore_min64(r0, (int64_t)floor(ys[k * PH + p]));
                        r1 = roicore_max64(r1, (int64_t)ceil(ys[k * PH + p]) + 1);
                    }
                for (int64_t p = 0; p < PW; ++p)
                    if (TYPED(inside)(xs[k * PW + p], map->w)) {
                        c0 = roicore_min64(c0, (int64_t)floor(xs[k * PW + p]));
                        c1 = roicore_max64(c1, (int64_t)ceil(xs[k * PW + p]) + 1);
                    }
                roicore_region_include(region, boxes->batch[k], r0, r1, c0, c1);
            }
        }
        const FWD_JOB job = {map, pooled, boxes->batch, NULL, ROICORE_INT32, 0,
                             regions ? region : NULL, &op, TYPED(crop_task)};
        rc = ROICORE_CAT(roicore_blocked_forward, SFX)(&job, run, err);
    } else {
        const BWD_JOB job = {pooled, map, boxes->batch, &op, TYPED(crop_grad_task)};
        rc = ROICORE_CAT(roicore_blocked_backward, SFX)(&job, run, err);
    }
    roicore_scratch_free(tables);
    return rc;
}

#undef TYPED
#undef FWD_TASK
#undef FWD_JOB
#undef BWD_TASK
#undef BWD_JOB
#undef CROP_OP
