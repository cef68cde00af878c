/* Position-sensitive RoIAlign (torchvision ps_roi_align, MXNet ROIAlign with
 * position_sensitive) for element type T; ps_roi_align.c includes this once per dtype with T
 * and SFX defined.
 *
 * Output channel d at cell (ph, pw) is the mean of the samples of input channel
 * c = (d*PH + ph)*PW + pw, so a box reads each input channel in one bin only.  The samples
 * are RoIAlign's Caffe2 samples (align_samples_typed.h), of boxes aligned without a minimum
 * size (torchvision) or unaligned of at least 1 pixel (MXNet's aligned=False).  A sample
 * outside [-1, size] adds a plain 0 (torchvision) or 0 * v[0] per corner (MXNet, as its
 * RoIAlign); the sum is divided by the grid size as torchvision counts it (an empty grid
 * gives 0/0, a negative one a signed zero), or an empty grid gives 0.
 *
 * The forward runs one task per (box, pooled row), whose row samples serve the whole row,
 * with four output channels' sums side by side.  The backward runs one task per block of
 * input channels: it owns those channels' planes in every image and adds into them box by
 * box, which is torchvision's serial order restricted to those planes (a box adds to a
 * channel from one bin only), so results do not depend on the thread count. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define PS_BOX TYPED(ps_align_box)

#include "align_samples_typed.h"

/* A box's start, bin size and grid on each axis; grids <= 0 (and masked boxes) have no
 * samples. */
typedef struct {
    T ystart, ybin, xstart, xbin;
    int64_t ygrid, xgrid;
} PS_BOX;

/* Every box's record, checked against the grid limits; max_grid is the largest side of a
 * grid with samples. */
static int TYPED(ps_align_boxes)(const roicore_ps_roi_align_rules *rules,
                                 const roicore_boxes *boxes, double scale, int64_t sampling_ratio,
                                 int64_t PH, int64_t PW, PS_BOX *geo, int64_t *max_grid,
                                 roicore_error *err) {
    const T s = (T)scale, *c = (const T *)boxes->coords;
    const int unaligned = rules->box == ROICORE_PS_ALIGN_BOX_UNALIGNED;
    const T offset = unaligned ? (T)0 : (T)0.5;
    *max_grid = 1;
    for (int64_t k = 0; k < boxes->k; ++k) {
        PS_BOX *g = &geo[k];
        if (boxes->masked && boxes->batch[k] < 0) {
            g->ygrid = g->xgrid = 0;
            continue;
        }
        TYPED(align_axis)(c[4 * k + 1], c[4 * k + 3], s, offset, PH, sampling_ratio, unaligned,
                          ROICORE_SAMPLER_CAFFE2, &g->ystart, &g->ybin, &g->ygrid);
        TYPED(align_axis)(c[4 * k + 0], c[4 * k + 2], s, offset, PW, sampling_ratio, unaligned,
                          ROICORE_SAMPLER_CAFFE2, &g->xstart, &g->xbin, &g->xgrid);
        const int rc = roicore_check_grid(k, g->ygrid, g->xgrid, err);
        if (rc) return rc;
        if (g->ygrid > 0 && g->xgrid > 0)
            *max_grid = roicore_max64(*max_grid, roicore_max64(g->ygrid, g->xgrid));
    }
    return ROICORE_OK;
}

/* The box records and every thread's row and column samples in one scratch block. */
typedef struct {
    PS_BOX *geo;
    char *pieces;
    int64_t piece_bytes, max_grid;
} TYPED(ps_align_plan);

static int TYPED(ps_align_plan_make)(TYPED(ps_align_plan) *p,
                                     const roicore_ps_roi_align_rules *rules,
                                     const roicore_boxes *boxes, double scale,
                                     int64_t sampling_ratio, int64_t PH, int64_t PW,
                                     int n_threads, roicore_error *err) {
    const int64_t geo_bytes = roicore_round_up(roicore_mul(boxes->k, sizeof(PS_BOX)), ROICORE_LINE);
    PS_BOX *geo = geo_bytes < 0 ? NULL
        : (PS_BOX *)roicore_scratch(geo_bytes, "PS-RoIAlign box records", err);
    if (!geo) return err ? err->code : ROICORE_ERR_MEMORY;
    int rc = TYPED(ps_align_boxes)(rules, boxes, scale, sampling_ratio, PH, PW, geo,
                                   &p->max_grid, err);
    if (rc) {
        roicore_scratch_free(geo);
        return rc;
    }
    p->geo = geo;
    p->piece_bytes = roicore_round_up(TYPED(samples_bytes)(2 * p->max_grid), ROICORE_LINE);
    p->pieces = (char *)roicore_scratch(n_threads * p->piece_bytes, "PS-RoIAlign samples", err);
    if (!p->pieces) {
        roicore_scratch_free(geo);
        return err ? err->code : ROICORE_ERR_MEMORY;
    }
    return ROICORE_OK;
}

static void TYPED(ps_align_plan_free)(TYPED(ps_align_plan) *p) {
    roicore_scratch_free(p->geo);
    roicore_scratch_free(p->pieces);
}

/* The calling thread's row (column = 0) or column samples. */
static SAMPLES TYPED(ps_align_piece)(const TYPED(ps_align_plan) *p, int column) {
    char *mine = p->pieces + omp_get_thread_num() * p->piece_bytes;
    return TYPED(carve)(column ? mine + TYPED(samples_bytes)(p->max_grid) : mine, p->max_grid);
}

/* What a sample outside the map adds to a sum of `plane`: 0, or 0 * v[0] per corner with
 * `first` (NaN for a non-finite v[0]). */
ROICORE_INLINE T TYPED(ps_align_outside)(const T *plane, int first) {
    if (!first) return (T)0;
    const T z = (T)0 * plane[0];
    return ((z + z) + z) + z;
}

/* The mean of a bin's samples of one plane (rows sh, columns sw elements apart):
 * ((w1*a + w2*b) + w3*c) + w4*d per sample, summed from 0 in (iy, ix) order, divided by
 * count. */
static T TYPED(ps_align_mean)(const T *plane, int64_t sh, int64_t sw, SAMPLES y, int64_t gy,
                              SAMPLES x, int64_t gx, T count, int first) {
    T sum = 0;
    for (int64_t iy = 0; iy < gy; ++iy) {
        const T *lo = plane + y.lo[iy] * sh, *hi = plane + y.hi[iy] * sh;
        for (int64_t ix = 0; ix < gx; ++ix) {
            if (y.lo[iy] < 0 || x.lo[ix] < 0) {
                /* not skipped: adding 0 turns a sum of -0 into +0, as in torchvision */
                sum += TYPED(ps_align_outside)(plane, first);
                continue;
            }
            const int64_t a = x.lo[ix] * sw, b = x.hi[ix] * sw;
            const T w1 = y.lw[iy] * x.lw[ix], w2 = y.lw[iy] * x.hw[ix];
            const T w3 = y.hw[iy] * x.lw[ix], w4 = y.hw[iy] * x.hw[ix];
            sum += w1 * lo[a] + w2 * lo[b] + w3 * hi[a] + w4 * hi[b];
        }
    }
    return sum / count;
}

/* ps_align_mean of four planes at once: four independent sums side by side (each in
 * ps_align_mean's order), so that one sum's additions need not wait for the previous ones. */
static void TYPED(ps_align_mean4)(const T *const plane[4], int64_t sh, int64_t sw, SAMPLES y,
                                  int64_t gy, SAMPLES x, int64_t gx, T count, int first,
                                  T mean[4]) {
    T sum[4] = {0, 0, 0, 0};
    for (int64_t iy = 0; iy < gy; ++iy) {
        const int64_t lo = y.lo[iy] * sh, hi = y.hi[iy] * sh;
        for (int64_t ix = 0; ix < gx; ++ix) {
            if (y.lo[iy] < 0 || x.lo[ix] < 0) {
                for (int i = 0; i < 4; ++i) sum[i] += TYPED(ps_align_outside)(plane[i], first);
                continue;
            }
            const int64_t a = x.lo[ix] * sw, b = x.hi[ix] * sw;
            const T w1 = y.lw[iy] * x.lw[ix], w2 = y.lw[iy] * x.hw[ix];
            const T w3 = y.hw[iy] * x.lw[ix], w4 = y.hw[iy] * x.hw[ix];
            for (int i = 0; i < 4; ++i) {
                const T *p = plane[i];
                sum[i] += w1 * p[lo + a] + w2 * p[lo + b] + w3 * p[hi + a] + w4 * p[hi + b];
            }
        }
    }
    for (int i = 0; i < 4; ++i) mean[i] = sum[i] / count;
}

static int TYPED(ps_align_forward)(const roicore_ps_roi_align_rules *rules,
                                   const roicore_tensor *x, const roicore_boxes *boxes,
                                   double scale, int64_t sampling_ratio, const roicore_tensor *out,
                                   roicore_run *run, roicore_error *err) {
    const int64_t K = boxes->k, H = x->h, W = x->w, PH = out->h, PW = out->w;
    const roicore_strides sx = roicore_strides_of(x), so = roicore_strides_of(out);
    const int first = rules->outside == ROICORE_OUTSIDE_FIRST;
    const int empty_zero = rules->empty_grid == ROICORE_PS_EMPTY_GRID_ZERO;
    TYPED(ps_align_plan) p;
    int rc = TYPED(ps_align_plan_make)(&p, rules, boxes, scale, sampling_ratio, PH, PW,
                                       run->n_threads, err);
    if (rc) return rc;
    const T *xd = (const T *)x->data;
    T *od = (T *)ROICORE_WRITABLE(out);
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < K * PH; ++task) {
        if (roicore_stopping(run)) continue;
        const int64_t k = task / PH, ph = task % PH, b = boxes->batch[k];
        const PS_BOX *g = &p.geo[k];
        T *o = od + k * so.n + ph * so.h;  /* (k, d, ph, pw) is o[d*so.c + pw*so.w] */
        const int none = g->ygrid <= 0 || g->xgrid <= 0;
        const int64_t gy = none ? 0 : g->ygrid, gx = none ? 0 : g->xgrid;
        const T count = (T)(g->ygrid * g->xgrid);
        SAMPLES ys = TYPED(ps_align_piece)(&p, 0), xs = TYPED(ps_align_piece)(&p, 1);
        TYPED(bin_samples)(g->ystart, g->ybin, gy, ph, PH, H, ROICORE_SAMPLER_CAFFE2, ys);
        for (int64_t pw = 0; pw < PW; ++pw) {
            TYPED(bin_samples)(g->xstart, g->xbin, gx, pw, PW, W, ROICORE_SAMPLER_CAFFE2, xs);
            T *cell = o + pw * so.w;
            const T *plane = xd + b * sx.n + (ph * PW + pw) * sx.c;  /* channel d: + d*PH*PW */
            const int64_t step = PH * PW * sx.c;
            int64_t d = 0;
            if (b < 0 || (none && empty_zero)) {  /* a masked box, or no samples to average */
                for (; d < out->c; ++d) cell[d * so.c] = 0;
            }
            for (; d + 4 <= out->c; d += 4) {
                const T *planes[4] = {plane + d * step, plane + (d + 1) * step,
                                      plane + (d + 2) * step, plane + (d + 3) * step};
                T mean[4];
                TYPED(ps_align_mean4)(planes, sx.h, sx.w, ys, gy, xs, gx, count, first, mean);
                for (int i = 0; i < 4; ++i) cell[(d + i) * so.c] = mean[i];
            }
            for (; d < out->c; ++d)
                cell[d * so.c] = TYPED(ps_align_mean)(plane + d * step, sx.h, sx.w, ys, gy, xs,
                                                      gx, count, first);
        }
    }
    TYPED(ps_align_plan_free)(&p);
    return roicore_run_status(run, err);
}

/* The gradient of one bin into its plane (rows sh, columns sw elements apart):
 * g * w / count added to the four neighbours of every in-range sample, in order. */
static void TYPED(ps_align_add)(T *plane, int64_t sh, int64_t sw, SAMPLES y, int64_t gy,
                                SAMPLES x, int64_t gx, T g, T count) {
    for (int64_t iy = 0; iy < gy; ++iy) {
        if (y.lo[iy] < 0) continue;
        T *lo = plane + y.lo[iy] * sh, *hi = plane + y.hi[iy] * sh;
        for (int64_t ix = 0; ix < gx; ++ix) {
            if (x.lo[ix] < 0) continue;
            const int64_t a = x.lo[ix] * sw, b = x.hi[ix] * sw;
            const T w1 = y.lw[iy] * x.lw[ix], w2 = y.lw[iy] * x.hw[ix];
            const T w3 = y.hw[iy] * x.lw[ix], w4 = y.hw[iy] * x.hw[ix];
            lo[a] += g * w1 / count;
            lo[b] += g * w2 / count;
            hi[a] += g * w3 / count;
            hi[b] += g * w4 / count;
        }
    }
}

static int TYPED(ps_align_backward)(const roicore_ps_roi_align_rules *rules,
                                    const roicore_tensor *g_out, const roicore_boxes *boxes,
                                    double scale, int64_t sampling_ratio,
                                    const roicore_tensor *dx, roicore_run *run,
                                    roicore_error *err) {
    const int64_t K = boxes->k, C = dx->c, H = dx->h, W = dx->w, PH = g_out->h, PW = g_out->w;
    const roicore_strides sg = roicore_strides_of(g_out), sd = roicore_strides_of(dx);
    TYPED(ps_align_plan) p;
    int rc = TYPED(ps_align_plan_make)(&p, rules, boxes, scale, sampling_ratio, PH, PW,
                                       run->n_threads, err);
    if (rc) return rc;
    const T *gd = (const T *)g_out->data;
    T *dxd = (T *)ROICORE_WRITABLE(dx);
    const int64_t CT = ROICORE_CHANNELS_PER_TASK;
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t c0 = 0; c0 < C; c0 += CT) {
        if (roicore_stopping(run)) continue;
        const int64_t c1 = roicore_min64(C, c0 + CT);
        for (int64_t c = c0; c < c1; ++c) roicore_zero_channel(dx, c);
        SAMPLES ys = TYPED(ps_align_piece)(&p, 0), xs = TYPED(ps_align_piece)(&p, 1);
        for (int64_t k = 0; k < K; ++k) {
            const PS_BOX *g = &p.geo[k];
            const int64_t b = boxes->batch[k], gy = g->ygrid, gx = g->xgrid;
            if (b < 0 || gy <= 0 || gx <= 0) continue;
            const T count = (T)(gy * gx);
            for (int64_t c = c0; c < c1; ++c) {
                const int64_t d = c / (PH * PW), ph = c / PW % PH, pw = c % PW;
                const T gv = gd[k * sg.n + d * sg.c + ph * sg.h + pw * sg.w];
                TYPED(bin_samples)(g->ystart, g->ybin, gy, ph, PH, H, ROICORE_SAMPLER_CAFFE2, ys);
                TYPED(bin_samples)(g->xstart, g->xbin, gx, pw, PW, W, ROICORE_SAMPLER_CAFFE2, xs);
                TYPED(ps_align_add)(dxd + b * sd.n + c * sd.c, sd.h, sd.w, ys, gy, xs, gx,
                                    gv, count);
            }
        }
    }
    TYPED(ps_align_plan_free)(&p);
    return roicore_run_status(run, err);
}

#undef TYPED
#undef PS_BOX
#undef SAMPLES
