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
 * The D input channels that the D outputs of one cell read lie PH*PW planes apart, so a bin
 * would touch a cache line per output channel.  Both directions therefore run one task per
 * (image, cell g = ph*PW + pw, run of up to PS_ALIGN_LANES of its channels), on a block that
 * holds those channels of a pixel side by side, over the rectangle of the image that its
 * boxes' samples can reach.  A sample then reads four runs of values and adds them into the
 * run's sums as one vector loop, each sum still in torchvision's order, so the bits are the
 * scalar formula's.  The forward packs the block from the map and pools every box of the
 * image from it while it is in cache; the backward adds every box's gradient into the zeroed
 * block in box order (torchvision's serial order restricted to those planes) and writes its
 * planes out, so results do not depend on the thread count. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define PS_BOX TYPED(ps_align_box)
#define PS_PLAN TYPED(ps_align_plan)

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

/* The pixels [lo, hi] of an axis of `size` that the samples of a box from `start` with P
 * bins of `bin` can read: the samples' span, widened by more than their rounding errors
 * and the neighbour pixel. */
static void TYPED(ps_align_span)(T start, T bin, int64_t P, int64_t size, int64_t *lo,
                                 int64_t *hi) {
    const double a = (double)start, b = (double)start + (double)P * (double)bin;
    const double slack = 2 + 1e-5 * fmax(fabs(a), fabs(b));
    double first = floor(fmin(a, b) - slack), last = ceil(fmax(a, b) + slack);
    first = first < 0 ? 0 : (first > (double)(size - 1) ? (double)(size - 1) : first);
    last = last < 0 ? 0 : (last > (double)(size - 1) ? (double)(size - 1) : last);
    *lo = (int64_t)first;
    *hi = (int64_t)last;
}

/* The box records, each image's rectangle and boxes, and every thread's samples and block,
 * for one call.  Image b's rectangle is rows [r0, r0 + rh) and columns [c0, c0 + rw)
 * (rh = 0: no box samples it); its boxes are order[start[b] .. start[b + 1]), in their
 * order.  A task's block holds, for one cell g = ph*PW + pw and a run of n <= LANES of its
 * D channels (d*PH + ph)*PW + pw, the rectangle's pixels with the n channels side by side:
 * pixel (h, w), channel d0 + d at ((h - r0)*rw + w - c0)*n + d. */
typedef struct {
    PS_BOX *geo;
    int64_t *rect;   /* per image: r0, rh, c0, rw */
    int64_t *order, *start;
    char *pieces;
    int64_t piece_bytes, lanes_at, max_grid, D, G, runs;  /* lanes_at: into a piece */
} PS_PLAN;

/* Channels per task: a run of one cell's D channels, the lanes of its sums. */
#define PS_ALIGN_LANES 32

static void TYPED(ps_align_plan_free)(PS_PLAN *p) {
    roicore_scratch_free(p->geo);
    roicore_scratch_free(p->pieces);
}

static int TYPED(ps_align_plan_make)(PS_PLAN *p, const roicore_ps_roi_align_rules *rules,
                                     const roicore_boxes *boxes, double scale,
                                     int64_t sampling_ratio, int64_t N, int64_t C, int64_t H,
                                     int64_t W, int64_t PH, int64_t PW, int n_threads,
                                     roicore_error *err) {
    memset(p, 0, sizeof *p);
    p->G = PH * PW;
    p->D = C / p->G;
    p->runs = (p->D + PS_ALIGN_LANES - 1) / PS_ALIGN_LANES;
    const int64_t K = boxes->k;
    const int64_t geo_bytes = roicore_round_up(roicore_mul(K, sizeof(PS_BOX)), ROICORE_LINE);
    const int64_t index_bytes = roicore_mul(roicore_mul(N, 5) + K + 1, sizeof(int64_t));
    char *mem = geo_bytes < 0 || index_bytes < 0 ? NULL
        : (char *)roicore_scratch(geo_bytes + index_bytes, "PS-RoIAlign box records", err);
    if (!mem) return geo_bytes < 0 || index_bytes < 0
        ? roicore_fail(err, ROICORE_ERR_MEMORY, "PS-RoIAlign box records would take more than "
                       "2**63 bytes")
        : (err ? err->code : ROICORE_ERR_MEMORY);
    p->geo = (PS_BOX *)mem;
    p->rect = (int64_t *)(mem + geo_bytes);
    p->start = p->rect + 4 * N;
    p->order = p->start + N + 1;
    int rc = TYPED(ps_align_boxes)(rules, boxes, scale, sampling_ratio, PH, PW, p->geo,
                                   &p->max_grid, err);
    if (rc) {
        TYPED(ps_align_plan_free)(p);
        return rc;
    }
    /* each image's boxes with samples, in order (a counting sort), and its rectangle: the
       union of their spans */
    for (int64_t b = 0; b <= N; ++b) p->start[b] = 0;
    for (int64_t b = 0; b < N; ++b) {
        int64_t *r = p->rect + 4 * b;
        r[0] = H;
        r[1] = -1;
        r[2] = W;
        r[3] = -1;
    }
    for (int64_t k = 0; k < K; ++k) {
        const PS_BOX *g = &p->geo[k];
        const int64_t b = boxes->batch[k];
        if (b < 0 || g->ygrid <= 0 || g->xgrid <= 0) continue;
        ++p->start[b + 1];
        int64_t lo, hi, *r = p->rect + 4 * b;
        TYPED(ps_align_span)(g->ystart, g->ybin, PH, H, &lo, &hi);
        r[0] = roicore_min64(r[0], lo);
        r[1] = roicore_max64(r[1], hi);
        TYPED(ps_align_span)(g->xstart, g->xbin, PW, W, &lo, &hi);
        r[2] = roicore_min64(r[2], lo);
        r[3] = roicore_max64(r[3], hi);
    }
    for (int64_t b = 0; b < N; ++b) p->start[b + 1] += p->start[b];
    int64_t max_pixels = 0;
    for (int64_t b = 0; b < N; ++b) {
        int64_t *r = p->rect + 4 * b;  /* first and last row and column to r0, rh, c0, rw */
        if (r[1] < r[0]) {             /* no box samples image b */
            r[0] = r[1] = r[2] = r[3] = 0;
        } else {
            r[1] = r[1] - r[0] + 1;
            r[3] = r[3] - r[2] + 1;
        }
        max_pixels = roicore_max64(max_pixels, r[1] * r[3]);
    }
    for (int64_t k = 0; k < K; ++k) {  /* start[b] runs to start[b + 1], then moves back */
        const PS_BOX *g = &p->geo[k];
        const int64_t b = boxes->batch[k];
        if (b < 0 || g->ygrid <= 0 || g->xgrid <= 0) continue;
        p->order[p->start[b]++] = k;
    }
    for (int64_t b = N; b > 0; --b) p->start[b] = p->start[b - 1];
    p->start[0] = 0;
    p->lanes_at = roicore_round_up(TYPED(samples_bytes)(2 * p->max_grid), ROICORE_LINE);
    const int64_t lanes = roicore_min64(p->D, PS_ALIGN_LANES);
    const int64_t block = roicore_mul(roicore_mul(max_pixels, lanes), sizeof(T));
    p->piece_bytes = block < 0 ? -1
        : roicore_round_up(p->lanes_at + PS_ALIGN_LANES * (int64_t)sizeof(T) + block,
                           ROICORE_LINE);
    p->pieces = (char *)roicore_scratch(roicore_mul(n_threads, p->piece_bytes),
                                        "PS-RoIAlign blocks", err);
    if (!p->pieces) {
        TYPED(ps_align_plan_free)(p);
        return err ? err->code : ROICORE_ERR_MEMORY;
    }
    return ROICORE_OK;
}

/* The calling thread's row and column samples, PS_ALIGN_LANES values of scratch and its
 * block. */
static void TYPED(ps_align_piece)(const PS_PLAN *p, SAMPLES *ys, SAMPLES *xs, T **lanes,
                                  T **block) {
    char *mine = p->pieces + omp_get_thread_num() * p->piece_bytes;
    *ys = TYPED(carve)(mine, p->max_grid);
    *xs = TYPED(carve)(mine + TYPED(samples_bytes)(p->max_grid), p->max_grid);
    *lanes = (T *)(mine + p->lanes_at);
    *block = *lanes + PS_ALIGN_LANES;
}

/* A task: image b, cell g, channels d0 .. d0 + n of the cell. */
typedef struct {
    int64_t b, g, ph, pw, d0, n, r0, rh, c0, rw;
} TYPED(ps_align_task);

static TYPED(ps_align_task) TYPED(ps_align_task_of)(const PS_PLAN *p, int64_t PW, int64_t task) {
    TYPED(ps_align_task) t;
    t.b = task / (p->G * p->runs);
    t.g = task / p->runs % p->G;
    t.ph = t.g / PW;
    t.pw = t.g % PW;
    t.d0 = task % p->runs * PS_ALIGN_LANES;
    t.n = roicore_min64(PS_ALIGN_LANES, p->D - t.d0);
    const int64_t *r = p->rect + 4 * t.b;
    t.r0 = r[0];
    t.rh = r[1];
    t.c0 = r[2];
    t.rw = r[3];
    return t;
}

/* The task's channels of the rectangle into its block. */
static void TYPED(ps_align_pack)(const PS_PLAN *p, const roicore_tensor *x,
                                 const TYPED(ps_align_task) *t, T *block) {
    const roicore_strides sx = roicore_strides_of(x);
    const T *xd = (const T *)x->data + t->b * sx.n;
    for (int64_t h = 0; h < t->rh; ++h)
        for (int64_t d = 0; d < t->n; ++d) {
            const T *row = xd + ((t->d0 + d) * p->G + t->g) * sx.c + (t->r0 + h) * sx.h +
                           t->c0 * sx.w;
            T *dst = block + h * t->rw * t->n + d;
            for (int64_t w = 0; w < t->rw; ++w) dst[w * t->n] = row[w * sx.w];
        }
}

/* sum[d] += ((w1*a[d] + w2*b[d]) + w3*c[d]) + w4*e[d]: one sample for n sums, each in the
 * scalar order. */
ROICORE_CLONES static void TYPED(ps_align_lanes)(T *restrict sum, const T *a, const T *b,
                                                 const T *c, const T *e, T w1, T w2, T w3, T w4,
                                                 int64_t n) {
    for (int64_t d = 0; d < n; ++d) sum[d] += ((w1 * a[d] + w2 * b[d]) + w3 * c[d]) + w4 * e[d];
}

/* What a sample outside the map adds to n sums: 0, or 0 * v[0] per corner with `first`
 * (NaN for a non-finite v[0]).  Adding 0 rather than skipping the sample keeps the scalar
 * order (it turns a sum of -0 into +0, as in torchvision). */
static void TYPED(ps_align_outside)(T *restrict sum, const T *const *planes, int first,
                                    int64_t n) {
    for (int64_t d = 0; d < n; ++d) {
        T add = 0;
        if (first) {
            const T z = (T)0 * planes[d][0];
            add = ((z + z) + z) + z;
        }
        sum[d] += add;
    }
}

static int TYPED(ps_align_forward)(const roicore_ps_roi_align_rules *rules,
                                   const roicore_tensor *x, const roicore_boxes *boxes,
                                   double scale, int64_t sampling_ratio, const roicore_tensor *out,
                                   roicore_run *run, roicore_error *err) {
    const int64_t K = boxes->k, N = x->n, H = x->h, W = x->w, PH = out->h, PW = out->w;
    const roicore_strides sx = roicore_strides_of(x), so = roicore_strides_of(out);
    const int first = rules->outside == ROICORE_OUTSIDE_FIRST;
    const int empty_zero = rules->empty_grid == ROICORE_PS_EMPTY_GRID_ZERO;
    PS_PLAN p;
    int rc = TYPED(ps_align_plan_make)(&p, rules, boxes, scale, sampling_ratio, N, x->c, H, W,
                                       PH, PW, run->n_threads, err);
    if (rc) return rc;
    T *od = (T *)ROICORE_WRITABLE(out);
    /* the boxes without samples: masked ones give 0, the others their empty mean */
    for (int64_t k = 0; k < K; ++k) {
        const PS_BOX *g = &p.geo[k];
        if (boxes->batch[k] >= 0 && g->ygrid > 0 && g->xgrid > 0) continue;
        const T count = (T)(g->ygrid * g->xgrid);
        const T v = boxes->batch[k] < 0 || empty_zero ? (T)0 : (T)0 / count;
        for (int64_t d = 0; d < out->c; ++d)
            for (int64_t ph = 0; ph < PH; ++ph)
                for (int64_t pw = 0; pw < PW; ++pw)
                    od[k * so.n + d * so.c + ph * so.h + pw * so.w] = v;
    }
    const T *xd = (const T *)x->data;
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < N * p.G * p.runs; ++task) {
        if (roicore_stopping(run)) continue;
        const TYPED(ps_align_task) t = TYPED(ps_align_task_of)(&p, PW, task);
        if (p.start[t.b] == p.start[t.b + 1]) continue;
        SAMPLES ys, xs;
        T *sum, *block;
        TYPED(ps_align_piece)(&p, &ys, &xs, &sum, &block);
        TYPED(ps_align_pack)(&p, x, &t, block);
        const T *planes[PS_ALIGN_LANES];  /* each channel's plane, for v[0] */
        for (int64_t d = 0; d < t.n; ++d)
            planes[d] = xd + t.b * sx.n + ((t.d0 + d) * p.G + t.g) * sx.c;
        const int64_t n = t.n, row = t.rw * n;
        for (int64_t i = p.start[t.b]; i < p.start[t.b + 1]; ++i) {
            const int64_t k = p.order[i];
            const PS_BOX *g = &p.geo[k];
            const int64_t gy = g->ygrid, gx = g->xgrid;
            const T count = (T)(gy * gx);
            TYPED(bin_samples)(g->ystart, g->ybin, gy, t.ph, PH, H, ROICORE_SAMPLER_CAFFE2, ys);
            TYPED(bin_samples)(g->xstart, g->xbin, gx, t.pw, PW, W, ROICORE_SAMPLER_CAFFE2, xs);
            for (int64_t d = 0; d < n; ++d) sum[d] = 0;
            for (int64_t iy = 0; iy < gy; ++iy) {
                const int in_map = ys.lo[iy] >= 0;  /* else no row is read */
                const T *lo = block + (in_map ? ys.lo[iy] - t.r0 : 0) * row;
                const T *hi = block + (in_map ? ys.hi[iy] - t.r0 : 0) * row;
                for (int64_t ix = 0; ix < gx; ++ix) {
                    if (!in_map || xs.lo[ix] < 0) {
                        TYPED(ps_align_outside)(sum, planes, first, n);
                        continue;
                    }
                    const int64_t a = (xs.lo[ix] - t.c0) * n, e = (xs.hi[ix] - t.c0) * n;
                    TYPED(ps_align_lanes)(sum, lo + a, lo + e, hi + a, hi + e,
                                          ys.lw[iy] * xs.lw[ix], ys.lw[iy] * xs.hw[ix],
                                          ys.hw[iy] * xs.lw[ix], ys.hw[iy] * xs.hw[ix], n);
                }
            }
            T *o = od + k * so.n + t.ph * so.h + t.pw * so.w;
            for (int64_t d = 0; d < n; ++d) o[(t.d0 + d) * so.c] = sum[d] / count;
        }
    }
    TYPED(ps_align_plan_free)(&p);
    return roicore_run_status(run, err);
}

/* dst[d] += (g[d] * w) / count for n gradients: one corner of one sample. */
ROICORE_CLONES static void TYPED(ps_align_scatter)(T *restrict dst, const T *restrict g, T w,
                                                   T count, int64_t n) {
    for (int64_t d = 0; d < n; ++d) dst[d] += g[d] * w / count;
}

static int TYPED(ps_align_backward)(const roicore_ps_roi_align_rules *rules,
                                    const roicore_tensor *g_out, const roicore_boxes *boxes,
                                    double scale, int64_t sampling_ratio,
                                    const roicore_tensor *dx, roicore_run *run,
                                    roicore_error *err) {
    const int64_t N = dx->n, H = dx->h, W = dx->w, PH = g_out->h, PW = g_out->w;
    const roicore_strides sg = roicore_strides_of(g_out), sd = roicore_strides_of(dx);
    PS_PLAN p;
    int rc = TYPED(ps_align_plan_make)(&p, rules, boxes, scale, sampling_ratio, N, dx->c, H, W,
                                       PH, PW, run->n_threads, err);
    if (rc) return rc;
    const T *gd = (const T *)g_out->data;
    T *dxd = (T *)ROICORE_WRITABLE(dx);
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < N * p.G * p.runs; ++task) {
        if (roicore_stopping(run)) continue;
        const TYPED(ps_align_task) t = TYPED(ps_align_task_of)(&p, PW, task);
        const int64_t n = t.n, row = t.rw * n;
        SAMPLES ys, xs;
        T *gv, *block;
        TYPED(ps_align_piece)(&p, &ys, &xs, &gv, &block);
        for (int64_t i = 0; i < t.rh * row; ++i) block[i] = 0;
        for (int64_t i = p.start[t.b]; i < p.start[t.b + 1]; ++i) {
            const int64_t k = p.order[i];
            const PS_BOX *g = &p.geo[k];
            const int64_t gy = g->ygrid, gx = g->xgrid;
            const T count = (T)(gy * gx);
            for (int64_t d = 0; d < n; ++d)
                gv[d] = gd[k * sg.n + (t.d0 + d) * sg.c + t.ph * sg.h + t.pw * sg.w];
            TYPED(bin_samples)(g->ystart, g->ybin, gy, t.ph, PH, H, ROICORE_SAMPLER_CAFFE2, ys);
            TYPED(bin_samples)(g->xstart, g->xbin, gx, t.pw, PW, W, ROICORE_SAMPLER_CAFFE2, xs);
            for (int64_t iy = 0; iy < gy; ++iy) {
                if (ys.lo[iy] < 0) continue;
                T *lo = block + (ys.lo[iy] - t.r0) * row, *hi = block + (ys.hi[iy] - t.r0) * row;
                for (int64_t ix = 0; ix < gx; ++ix) {
                    if (xs.lo[ix] < 0) continue;
                    const int64_t a = (xs.lo[ix] - t.c0) * n, e = (xs.hi[ix] - t.c0) * n;
                    /* corner by corner: where two corners coincide, each element still
                       takes its adds in torchvision's order */
                    TYPED(ps_align_scatter)(lo + a, gv, ys.lw[iy] * xs.lw[ix], count, n);
                    TYPED(ps_align_scatter)(lo + e, gv, ys.lw[iy] * xs.hw[ix], count, n);
                    TYPED(ps_align_scatter)(hi + a, gv, ys.hw[iy] * xs.lw[ix], count, n);
                    TYPED(ps_align_scatter)(hi + e, gv, ys.hw[iy] * xs.hw[ix], count, n);
                }
            }
        }
        /* the task's gradient planes: the block in the rectangle, zeros around it */
        for (int64_t d = 0; d < n; ++d) {
            T *plane = dxd + t.b * sd.n + ((t.d0 + d) * p.G + t.g) * sd.c;
            for (int64_t h = 0; h < H; ++h) {
                T *out = plane + h * sd.h;
                const int64_t y = h - t.r0;
                if (y < 0 || y >= t.rh) {
                    for (int64_t w = 0; w < W; ++w) out[w * sd.w] = 0;
                    continue;
                }
                const T *src = block + y * row + d;
                for (int64_t w = 0; w < W; ++w)
                    out[w * sd.w] = w < t.c0 || w >= t.c0 + t.rw ? (T)0 : src[(w - t.c0) * n];
            }
        }
    }
    TYPED(ps_align_plan_free)(&p);
    return roicore_run_status(run, err);
}

#undef TYPED
#undef PS_BOX
#undef PS_PLAN
#undef PS_ALIGN_LANES
#undef SAMPLES
