/* Bilinear and nearest RoI pooling for element type T; bilinear.c includes this once per
 * dtype with T, SFX, VT and LANES defined.
 *
 * Boxes are normalised to [0, 1]: sample p of P lies at lo*(size-1) + p*step with
 * step = (hi-lo)*(size-1)/(P-1), corners included, and P == 1 samples the box centre (TF
 * crop_and_resize, OpenVINO ROIPooling "bilinear").  Each output is the bilinear
 * interpolation of its sample's four neighbours, per lane, or (nearest) the pixel at the
 * sample rounded to the nearest row and column. */

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
    int nearest;  /* the pixel at round() of the sample (crop_and_resize "nearest") */
    T fill;
} CROP_OP;

/* a + (b - a) * t, rounded twice (TF, OpenVINO's reference) or once (OpenVINO's CPU plugin,
 * with fused multiply-adds) */
ROICORE_INLINE VT TYPED(lerp)(VT a, VT b, T t, int fused) {
    if (!fused) return a + (b - a) * t;
    VT r, d = b - a;
    for (int i = 0; i < LANES; ++i)
        r[i] = sizeof(T) == 4 ? (T)__builtin_fmaf((float)d[i], (float)t, (float)a[i])
                              : (T)__builtin_fma((double)d[i], (double)t, (double)a[i]);
    return r;
}

/* Whether sample (y, x) lies on the map; NaN does not. */
ROICORE_INLINE int TYPED(inside)(T v, int64_t size) { return v >= 0 && v <= (T)(size - 1); }

/* One forward task; `fused` is a constant in each caller, so each compiles its own lerp. */
ROICORE_INLINE void TYPED(crop_rows)(const CROP_OP *op, FWD_TASK *t, const int fused) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
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
            if (op->nearest) {  /* C round: halves away from zero, as TF's roundf */
                const int64_t row = (int64_t)round(y), col = (int64_t)round(x);
                const VTu *a = (const VTu *)(t->img + (row * W + col) * lanes);
                for (int64_t q = 0; q < nv; ++q) out[q] = a[q];
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
                const VT upper = TYPED(lerp)(a[q], b[q], lx, fused);
                const VT lower = TYPED(lerp)(c[q], d[q], lx, fused);
                out[q] = TYPED(lerp)(upper, lower, ly, fused);
            }
        }
    }
    roicore_pending_finish_all(t->pend, t->npend);
}

ROICORE_CLONES static void TYPED(crop_task)(const void *op, FWD_TASK *t) {
    TYPED(crop_rows)((const CROP_OP *)op, t, 0);
}

/* OpenVINO's CPU plugin rounds each lerp once: the FMA copy keeps that in vectors. */
ROICORE_FMA_CLONES static void TYPED(crop_task_fused)(const void *op, FWD_TASK *t) {
    TYPED(crop_rows)((const CROP_OP *)op, t, 1);
}

/* The adjoint in TF CropAndResizeGradImage's arithmetic and order: per sample on the map,
 * (1-ly)*g to the top row and ly*g to the bottom one, each split (1-lx) / lx between the
 * left and right pixels, in that order; with nearest, all of g to the sample's pixel. */
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
            const VTu *g = (const VTu *)(t->g + (ph * PW + pw - t->p0) * lanes);
            if (op->nearest) {
                const int64_t row = (int64_t)round(y), col = (int64_t)round(x);
                VTu *a = (VTu *)(t->img + (row * W + col) * lanes);
                for (int64_t q = 0; q < nv; ++q) a[q] = a[q] + g[q];
                continue;
            }
            const int64_t left = (int64_t)floor(x), right = (int64_t)ceil(x);
            const T lx = x - (T)left;
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

static int TYPED(crop_run)(int forward, int nearest, const roicore_bilinear_pool_rules *rules,
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
    const CROP_OP op = {ys, xs, map->h, map->w, PH, PW, nearest, (T)fill};
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
                             regions ? region : NULL, &op,
                             rules->fused_lerp ? TYPED(crop_task_fused) : TYPED(crop_task), 1,
                             NULL, 0, NULL};
        rc = ROICORE_CAT(roicore_blocked_forward, SFX)(&job, run, err);
    } else {
        const BWD_JOB job = {pooled, map, boxes->batch, &op, TYPED(crop_grad_task), 0, NULL, 0};
        rc = ROICORE_CAT(roicore_blocked_backward, SFX)(&job, run, err);
    }
    roicore_scratch_free(tables);
    return rc;
}

/* Element (n, c, h, w) of a tensor in its layout. */
ROICORE_INLINE T TYPED(at)(const roicore_tensor *t, int64_t n, int64_t c, int64_t h, int64_t w) {
    const T *d = (const T *)t->data;
    return t->layout == ROICORE_NCHW ? d[((n * t->c + c) * t->h + h) * t->w + w]
                                     : d[((n * t->h + h) * t->w + w) * t->c + c];
}

/* d(box)/d(position) terms of one axis, added as TF adds them: for P > 1 sample p moves by
 * (size-1) - p*ratio per unit of lo and p*ratio per unit of hi, in T; for P == 1 (the box
 * centre) by half of (size-1) each, computed in double and the sum rounded to T. */
ROICORE_INLINE void TYPED(add_axis)(T grad, int64_t p, int64_t P, int64_t size, T ratio,
                                    T *d_lo, T *d_hi) {
    if (P > 1) {
        *d_lo = *d_lo + grad * ((T)(size - 1) - (T)p * ratio);
        *d_hi = *d_hi + grad * ((T)p * ratio);
    } else {
        const double half = (double)grad * 0.5 * (double)(size - 1);
        *d_lo = (T)((double)*d_lo + half);
        *d_hi = (T)((double)*d_hi + half);
    }
}

/* The gradient of box k's [x1, y1, x2, y2] in TF CropAndResizeGradBoxes' arithmetic and
 * order: over the samples on the map (ph, pw), then the channels, each adds
 * g * d(bilinear value)/d(row) to the y terms and .../d(column) to the x terms.  TF steps
 * its samples by (y2 - y1) * ((H-1)/(PH-1)), not by the forward's
 * ((y2 - y1)*(H-1))/(PH-1), so a sample can sit an ulp away from the forward's. */
static void TYPED(crop_boxes_grad_box)(const roicore_tensor *g, const roicore_tensor *x,
                                       const T *box, int64_t k, int64_t b, T *out) {
    const int64_t H = x->h, W = x->w, C = x->c, PH = g->h, PW = g->w;
    const T x1 = box[0], y1 = box[1], x2 = box[2], y2 = box[3];
    const T h_ratio = PH > 1 ? (T)(H - 1) / (T)(PH - 1) : 0;
    const T w_ratio = PW > 1 ? (T)(W - 1) / (T)(PW - 1) : 0;
    const T h_step = PH > 1 ? (y2 - y1) * h_ratio : 0, w_step = PW > 1 ? (x2 - x1) * w_ratio : 0;
    T d_x1 = 0, d_y1 = 0, d_x2 = 0, d_y2 = 0;
    for (int64_t ph = 0; ph < PH; ++ph) {
        const T y = PH > 1 ? y1 * (T)(H - 1) + (T)ph * h_step
                           : (T)(0.5 * (double)(y1 + y2) * (double)(H - 1));
        if (!TYPED(inside)(y, H)) continue;
        const int64_t top = (int64_t)floor(y), bottom = (int64_t)ceil(y);
        const T ly = y - (T)top;
        for (int64_t pw = 0; pw < PW; ++pw) {
            const T xs = PW > 1 ? x1 * (T)(W - 1) + (T)pw * w_step
                                : (T)(0.5 * (double)(x1 + x2) * (double)(W - 1));
            if (!TYPED(inside)(xs, W)) continue;
            const int64_t left = (int64_t)floor(xs), right = (int64_t)ceil(xs);
            const T lx = xs - (T)left;
            for (int64_t c = 0; c < C; ++c) {
                const T tl = TYPED(at)(x, b, c, top, left), tr = TYPED(at)(x, b, c, top, right);
                const T bl = TYPED(at)(x, b, c, bottom, left);
                const T br = TYPED(at)(x, b, c, bottom, right);
                const T up = TYPED(at)(g, k, c, ph, pw);
                const T grad_y = (((T)1 - lx) * (bl - tl) + lx * (br - tr)) * up;
                const T grad_x = (((T)1 - ly) * (tr - tl) + ly * (br - bl)) * up;
                TYPED(add_axis)(grad_y, ph, PH, H, h_ratio, &d_y1, &d_y2);
                TYPED(add_axis)(grad_x, pw, PW, W, w_ratio, &d_x1, &d_x2);
            }
        }
    }
    out[0] = d_x1, out[1] = d_y1, out[2] = d_x2, out[3] = d_y2;
}

/* Every box's gradient, boxes shared among the threads (each box is one serial sum). */
static int TYPED(crop_boxes_grad)(const roicore_tensor *g, const roicore_tensor *x,
                                  const roicore_boxes *boxes, T *grad_boxes, roicore_run *run,
                                  roicore_error *err) {
    const T *coords = (const T *)boxes->coords;
    int64_t next = 0;
#pragma omp parallel num_threads(run->n_threads)
    for (int64_t k = roicore_take(&next); k < boxes->k; k = roicore_take(&next)) {
        if (roicore_stopping(run)) break;
        if (boxes->batch[k] < 0) {  /* masked */
            memset(grad_boxes + 4 * k, 0, 4 * sizeof(T));
            continue;
        }
        TYPED(crop_boxes_grad_box)(g, x, coords + 4 * k, k, boxes->batch[k], grad_boxes + 4 * k);
    }
    return roicore_run_status(run, err);
}

#undef TYPED
#undef FWD_TASK
#undef FWD_JOB
#undef BWD_TASK
#undef BWD_JOB
#undef CROP_OP
