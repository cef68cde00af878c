/* Position-sensitive RoI pooling with torchvision's bins (ps_roi_pool) for element type T;
 * psroi.c includes this once per dtype with T and SFX defined.
 *
 * torchvision's bins are RoI max pooling's integer bins without its +1: the box is
 * round(x*s) .. round(x2*s), at least one pixel, and bin p spans floor(p*bin) ..
 * ceil((p+1)*bin) from the rounded start.  The forward clamps bins to [0, size - 1], so it
 * never reads the last row or column; the backward clamps them to [0, size] and rounds the
 * scaled coordinates in float32 (C roundf), so its bins can differ from the forward's.
 * Output channel d at cell (ph, pw) averages input channel (d*PH + ph)*PW + pw.
 *
 * The forward runs one task per (box, output channel).  The backward runs one task per
 * input channel, which owns that channel's planes in every image and adds into them box
 * by box: torchvision's serial order restricted to those planes (a box adds to a channel
 * from one bin only), so results do not depend on the thread count. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define TV_BOX TYPED(tv_box)

/* A box's rounded start and bin size on each axis. */
typedef struct {
    int64_t ystart, xstart;
    T ybin, xbin;
} TV_BOX;

static TV_BOX *TYPED(tv_boxes)(const roicore_boxes *boxes, double scale, int64_t PH,
                               int64_t PW, int backward, roicore_error *err) {
    const int64_t bytes = roicore_mul(boxes->k, sizeof(TV_BOX));
    TV_BOX *geo = bytes < 0 ? NULL : (TV_BOX *)roicore_scratch(bytes, "PS-RoI box records", err);
    if (!geo) return NULL;
    const T s = (T)scale, *c = (const T *)boxes->coords;
    for (int64_t k = 0; k < boxes->k; ++k) {
        int64_t r[4];
        for (int j = 0; j < 4; ++j)
            r[j] = backward ? (int64_t)roundf((float)(c[4 * k + j] * s))
                            : (int64_t)round(c[4 * k + j] * s);
        geo[k].xstart = r[0];
        geo[k].ystart = r[1];
        geo[k].xbin = (T)roicore_max64(r[2] - r[0], 1) / (T)PW;
        geo[k].ybin = (T)roicore_max64(r[3] - r[1], 1) / (T)PH;
    }
    return geo;
}

/* Bin p along an axis: [floor(p*bin), ceil((p+1)*bin)) from the start, clamped to
 * [0, last]. */
static void TYPED(tv_bin)(int64_t p, T bin, int64_t start, int64_t last, int64_t *lo,
                          int64_t *hi) {
    *lo = roicore_clamp64((int64_t)floor((T)p * bin) + start, 0, last);
    *hi = roicore_clamp64((int64_t)ceil((T)(p + 1) * bin) + start, 0, last);
}

static int TYPED(tv_forward)(const roicore_tensor *x, const roicore_boxes *boxes, double scale,
                             const roicore_tensor *out, roicore_run *run, roicore_error *err) {
    const int64_t K = boxes->k, H = x->h, W = x->w, D = out->c, PH = out->h, PW = out->w;
    const roicore_strides sx = roicore_strides_of(x), so = roicore_strides_of(out);
    TV_BOX *geo = TYPED(tv_boxes)(boxes, scale, PH, PW, 0, err);
    if (!geo) return err ? err->code : ROICORE_ERR_MEMORY;
    const T *xd = (const T *)x->data;
    T *od = (T *)out->data;
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < K * D; ++task) {
        if (roicore_stopping(run)) continue;
        const int64_t k = task / D, d = task % D, b = boxes->batch[k];
        const TV_BOX *g = &geo[k];
        T *o = od + k * so.n + d * so.c;  /* (k, d, ph, pw) is o[ph*so.h + pw*so.w] */
        for (int64_t ph = 0; ph < PH; ++ph) {
            int64_t h0, h1;
            TYPED(tv_bin)(ph, g->ybin, g->ystart, H - 1, &h0, &h1);
            for (int64_t pw = 0; pw < PW; ++pw) {
                int64_t w0, w1;
                TYPED(tv_bin)(pw, g->xbin, g->xstart, W - 1, &w0, &w1);
                T *cell = o + ph * so.h + pw * so.w;
                if (b < 0 || h1 <= h0 || w1 <= w0) {  /* a masked box, or an empty bin */
                    *cell = 0;
                    continue;
                }
                const T *plane = xd + b * sx.n + ((d * PH + ph) * PW + pw) * sx.c;
                T sum = 0;
                for (int64_t h = h0; h < h1; ++h)
                    for (int64_t w = w0; w < w1; ++w) sum += plane[h * sx.h + w * sx.w];
                *cell = sum / (T)((h1 - h0) * (w1 - w0));
            }
        }
    }
    roicore_scratch_free(geo);
    return roicore_run_status(run, err);
}

static int TYPED(tv_backward)(const roicore_tensor *g_out, const roicore_boxes *boxes,
                              double scale, const roicore_tensor *dx, roicore_run *run,
                              roicore_error *err) {
    const int64_t K = boxes->k, C = dx->c, H = dx->h, W = dx->w, PH = g_out->h, PW = g_out->w;
    const roicore_strides sg = roicore_strides_of(g_out), sd = roicore_strides_of(dx);
    TV_BOX *geo = TYPED(tv_boxes)(boxes, scale, PH, PW, 1, err);
    if (!geo) return err ? err->code : ROICORE_ERR_MEMORY;
    const T *gd = (const T *)g_out->data;
    T *dxd = (T *)dx->data;
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t c = 0; c < C; ++c) {
        if (roicore_stopping(run)) continue;
        roicore_zero_channel(dx, c);
        const int64_t d = c / (PH * PW), ph = c / PW % PH, pw = c % PW;
        for (int64_t k = 0; k < K; ++k) {
            const TV_BOX *g = &geo[k];
            const int64_t b = boxes->batch[k];
            int64_t h0, h1, w0, w1;
            TYPED(tv_bin)(ph, g->ybin, g->ystart, H, &h0, &h1);
            TYPED(tv_bin)(pw, g->xbin, g->xstart, W, &w0, &w1);
            if (b < 0 || h1 <= h0 || w1 <= w0) continue;
            const T gv = gd[k * sg.n + d * sg.c + ph * sg.h + pw * sg.w];
            const T diff = gv / (T)((h1 - h0) * (w1 - w0));
            T *plane = dxd + b * sd.n + c * sd.c;
            for (int64_t h = h0; h < h1; ++h)
                for (int64_t w = w0; w < w1; ++w) plane[h * sd.h + w * sd.w] += diff;
        }
    }
    roicore_scratch_free(geo);
    return roicore_run_status(run, err);
}

#undef TYPED
#undef TV_BOX
