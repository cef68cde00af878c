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
 * The forward runs one task per box and four output channels, whose sums run side by side.
 * The backward runs one task per block of input channels, which owns those channels'
 * planes in every image and adds into them box by box: torchvision's serial order
 * restricted to those planes (a box adds to a channel from one bin only), so results do
 * not depend on the thread count. */

#define TYPED(name) ROICORE_CAT(name, SFX)
/* Bin p along an axis: [floor(p*bin), ceil((p+1)*bin)) from the start, clamped to
 * [0, last]. */
static void TYPED(tv_bin)(int64_t p, T bin, int64_t start, int64_t last, int64_t *lo,
                          int64_t *hi) {
    *lo = roicore_clamp64((int64_t)floor((T)p * bin) + start, 0, last);
    *hi = roicore_clamp64((int64_t)ceil((T)(p + 1) * bin) + start, 0, last);
}

/* Every box's bins, computed once (the backward's tasks, one per channel, each visit every
 * box): box k's rows [h0, h1) of bin row ph are e[ph], e[PH + ph] and its columns [w0, w1)
 * of bin column pw e[2*PH + pw], e[2*PH + PW + pw], with e = edges + k * 2 * (PH + PW). */
static int64_t *TYPED(tv_edges)(const roicore_boxes *boxes, double scale, int64_t H, int64_t W,
                                int64_t PH, int64_t PW, int backward, roicore_error *err) {
    const int64_t per_box = 2 * (PH + PW), bytes = roicore_mul(boxes->k, per_box * 8);
    int64_t *edges = bytes < 0 ? NULL : (int64_t *)roicore_scratch(bytes, "PS-RoI bin edges", err);
    if (!edges) return NULL;
    const T s = (T)scale, *c = (const T *)boxes->coords;
    for (int64_t k = 0; k < boxes->k; ++k) {
        int64_t r[4], *e = edges + k * per_box;
        if (boxes->masked && boxes->batch[k] < 0) {  /* never scaled: empty bins */
            memset(e, 0, (size_t)per_box * 8);
            continue;
        }
        for (int j = 0; j < 4; ++j)
            r[j] = backward ? (int64_t)roundf((float)(c[4 * k + j] * s))
                            : (int64_t)round(c[4 * k + j] * s);
        const T ybin = (T)roicore_max64(r[3] - r[1], 1) / (T)PH;
        const T xbin = (T)roicore_max64(r[2] - r[0], 1) / (T)PW;
        for (int64_t ph = 0; ph < PH; ++ph)
            TYPED(tv_bin)(ph, ybin, r[1], backward ? H : H - 1, &e[ph], &e[PH + ph]);
        for (int64_t pw = 0; pw < PW; ++pw)
            TYPED(tv_bin)(pw, xbin, r[0], backward ? W : W - 1, &e[2 * PH + pw],
                          &e[2 * PH + PW + pw]);
    }
    return edges;
}

/* The sum of rows h0..h1 and columns w0..w1 of n planes (n = 1 or 4; rows sh, columns sw
 * elements apart), each from 0 in (h, w) order; four sums run side by side, so that one
 * sum's additions need not wait for the previous ones. */
static void TYPED(tv_sums)(const T *const plane[4], int n, int64_t h0, int64_t h1, int64_t w0,
                           int64_t w1, int64_t sh, int64_t sw, T sum[4]) {
    T s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    if (n == 4) {
        for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) {
                const int64_t o = h * sh + w * sw;
                s0 += plane[0][o];
                s1 += plane[1][o];
                s2 += plane[2][o];
                s3 += plane[3][o];
            }
    } else {
        for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s0 += plane[0][h * sh + w * sw];
    }
    sum[0] = s0, sum[1] = s1, sum[2] = s2, sum[3] = s3;
}

static int TYPED(tv_forward)(const roicore_tensor *x, const roicore_boxes *boxes, double scale,
                             const roicore_tensor *out, roicore_run *run, roicore_error *err) {
    const int64_t K = boxes->k, H = x->h, W = x->w, D = out->c, PH = out->h, PW = out->w;
    const roicore_strides sx = roicore_strides_of(x), so = roicore_strides_of(out);
    int64_t *edges = TYPED(tv_edges)(boxes, scale, H, W, PH, PW, 0, err);
    if (!edges) return err ? err->code : ROICORE_ERR_MEMORY;
    const T *xd = (const T *)x->data;
    T *od = (T *)out->data;
    const int64_t DB = (D + 3) / 4;  /* tasks: a box and four output channels */
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t task = 0; task < K * DB; ++task) {
        if (roicore_stopping(run)) continue;
        const int64_t k = task / DB, d0 = task % DB * 4, b = boxes->batch[k];
        const int64_t nd = roicore_min64(4, D - d0);
        const int64_t *e = edges + k * 2 * (PH + PW);
        T *o = od + k * so.n + d0 * so.c;  /* (k, d0 + i, ph, pw) is o[i*so.c + ph*so.h + pw*so.w] */
        for (int64_t ph = 0; ph < PH; ++ph) {
            const int64_t h0 = e[ph], h1 = e[PH + ph];
            for (int64_t pw = 0; pw < PW; ++pw) {
                const int64_t w0 = e[2 * PH + pw], w1 = e[2 * PH + PW + pw];
                T *cell = o + ph * so.h + pw * so.w;
                if (b < 0 || h1 <= h0 || w1 <= w0) {  /* a masked box, or an empty bin */
                    for (int64_t i = 0; i < nd; ++i) cell[i * so.c] = 0;
                    continue;
                }
                const T area = (T)((h1 - h0) * (w1 - w0));
                const T *plane = xd + b * sx.n + ((d0 * PH + ph) * PW + pw) * sx.c;
                const int64_t step = PH * PW * sx.c;  /* to the next output channel's plane */
                T sum[4];
                if (nd == 4) {
                    const T *planes[4] = {plane, plane + step, plane + 2 * step, plane + 3 * step};
                    TYPED(tv_sums)(planes, 4, h0, h1, w0, w1, sx.h, sx.w, sum);
                    for (int i = 0; i < 4; ++i) cell[i * so.c] = sum[i] / area;
                    continue;
                }
                for (int64_t i = 0; i < nd; ++i) {
                    const T *one[4] = {plane + i * step, NULL, NULL, NULL};
                    TYPED(tv_sums)(one, 1, h0, h1, w0, w1, sx.h, sx.w, sum);
                    cell[i * so.c] = sum[0] / area;
                }
            }
        }
    }
    roicore_scratch_free(edges);
    return roicore_run_status(run, err);
}

static int TYPED(tv_backward)(const roicore_tensor *g_out, const roicore_boxes *boxes,
                              double scale, const roicore_tensor *dx, roicore_run *run,
                              roicore_error *err) {
    const int64_t K = boxes->k, C = dx->c, H = dx->h, W = dx->w, PH = g_out->h, PW = g_out->w;
    const roicore_strides sg = roicore_strides_of(g_out), sd = roicore_strides_of(dx);
    int64_t *edges = TYPED(tv_edges)(boxes, scale, H, W, PH, PW, 1, err);
    if (!edges) return err ? err->code : ROICORE_ERR_MEMORY;
    const T *gd = (const T *)g_out->data;
    T *dxd = (T *)dx->data;
    const int64_t CT = ROICORE_CHANNELS_PER_TASK;
#pragma omp parallel for num_threads(run->n_threads) schedule(dynamic, 1)
    for (int64_t c0 = 0; c0 < C; c0 += CT) {
        if (roicore_stopping(run)) continue;
        const int64_t c1 = roicore_min64(C, c0 + CT);
        for (int64_t c = c0; c < c1; ++c) roicore_zero_channel(dx, c);
        for (int64_t k = 0; k < K; ++k) {
            const int64_t *e = edges + k * 2 * (PH + PW), b = boxes->batch[k];
            if (b < 0) continue;
            for (int64_t c = c0; c < c1; ++c) {
                const int64_t d = c / (PH * PW), ph = c / PW % PH, pw = c % PW;
                const int64_t h0 = e[ph], h1 = e[PH + ph];
                const int64_t w0 = e[2 * PH + pw], w1 = e[2 * PH + PW + pw];
                if (h1 <= h0 || w1 <= w0) continue;
                const T gv = gd[k * sg.n + d * sg.c + ph * sg.h + pw * sg.w];
                const T diff = gv / (T)((h1 - h0) * (w1 - w0));
                T *plane = dxd + b * sd.n + c * sd.c;
                for (int64_t h = h0; h < h1; ++h)
                    for (int64_t w = w0; w < w1; ++w) plane[h * sd.h + w * sd.w] += diff;
            }
        }
    }
    roicore_scratch_free(edges);
    return roicore_run_status(run, err);
}

#undef TYPED
