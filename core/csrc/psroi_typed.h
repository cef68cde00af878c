/* Position-sensitive RoI pooling for element type T; psroi.c includes this once per dtype
 * with T, SFX, VT and LANES defined.  Two bin formulas, R-FCN's (MXNet, Paddle) and
 * torchvision's, fill the same bin tables; one kernel pools and one adds the gradient.
 *
 * Both passes run one group cell g = (gh, gw) per task.  The D input channels of a cell,
 * d*GH*GW + g, share every bin's rows and columns, so the task first gathers them into a
 * (pixel, d) slab with rows of S = round_up(D, 8) (it stays in L2 for R-FCN's maps) and then
 * pools each bin for all D channels at once with vector adds.  Each channel's sum still
 * runs from 0 in the frameworks' (h, w) order, and each channel's gradient receives its
 * additions in their serial (box, ph, pw, h, w) order, so results are bit-identical and
 * independent of the thread count.  Both passes work on whole vectors of S lanes: the
 * forward fills the S - D padding lanes with copies of channel D - 1 and pools them too,
 * the backward adds zeros to them; padding is never written out.  The forward stages its
 * means as (cell, box, bin of the cell, lane), contiguous for the task, and moves them to
 * the output afterwards in runs of consecutive boxes; boxes go in chunks whose staging
 * fits STAGE_BYTES.  The threads share tasks through counters (common.h), so that no
 * thread sleeps at a barrier between the phases. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define PLAN TYPED(ps_plan)

/* R-FCN bins: round *before* scaling, +1 before scaling, at least 0.1 wide, the start
 * offset added before floor/ceil, then clamped to [0, size]. */
static void TYPED(float_roi_bins)(T lo, T hi, T scale, int64_t P, int64_t size, int64_t *start,
                                  int64_t *end) {
    const T s = (T)round(lo) * scale;
    const T e = (T)(round(hi) + 1.) * scale;
    T r = e - s;
    if (r < (T)0.1) r = (T)0.1;
    const T bin = r / (T)P;
    for (int64_t p = 0; p < P; ++p) {
        start[p] = roicore_clamp64((int64_t)floor((T)p * bin + s), 0, size);
        end[p] = roicore_clamp64((int64_t)ceil((T)(p + 1) * bin + s), 0, size);
    }
}

/* torchvision's bins: RoI max pooling's integer bins without its +1.  The box is
 * round(x*s) .. round(x2*s), at least one pixel, and bin p spans floor(p*bin) ..
 * ceil((p+1)*bin) from the rounded start.  The forward clamps bins to [0, size - 1], so it
 * never reads the last row or column; the backward clamps them to [0, size] and rounds the
 * scaled coordinates in float32 (C roundf), so its bins can differ from the forward's. */
static void TYPED(torchvision_bins)(T lo, T hi, T scale, int64_t P, int64_t size, int backward,
                                    int64_t *start, int64_t *end) {
    const int64_t a = backward ? (int64_t)roundf((float)(lo * scale)) : (int64_t)round(lo * scale);
    const int64_t b = backward ? (int64_t)roundf((float)(hi * scale)) : (int64_t)round(hi * scale);
    const int64_t last = backward ? size : size - 1;
    const T bin = (T)roicore_max64(b - a, 1) / (T)P;
    for (int64_t p = 0; p < P; ++p) {
        start[p] = roicore_clamp64((int64_t)floor((T)p * bin) + a, 0, last);
        end[p] = roicore_clamp64((int64_t)ceil((T)(p + 1) * bin) + a, 0, last);
    }
}

/* For each group cell g the pooled cells p with floor(p * G / P) == g (clamped to the
 * groups; in the feature dtype, as MXNet computes it): [first[g], stop[g]). */
static void TYPED(group_ranges)(int64_t G, int64_t P, int64_t *first, int64_t *stop) {
    for (int64_t g = 0; g < G; ++g) {
        first[g] = P;
        stop[g] = 0;
    }
    for (int64_t p = 0; p < P; ++p) {
        int64_t g = (int64_t)floor((T)p * (T)G / (T)P);
        g = roicore_clamp64(g, 0, G - 1);
        first[g] = roicore_min64(first[g], p);
        stop[g] = roicore_max64(stop[g], p + 1);
    }
}

typedef struct {
    int64_t K, PH, PW, GH, GW, D, S, M, H, W;
    int bins;  /* PS_BINS_RFCN, or torchvision's for the forward or the backward */
    const int64_t *batch;
    int64_t *hs, *he, *ws, *we;  /* each box's bin edges: rows (K, PH), columns (K, PW) */
    int64_t *r0, *r1;            /* group row gh: pooled rows [r0[gh], r1[gh]) */
    int64_t *q0, *q1;            /* group column gw: pooled columns [q0[gw], q1[gw]) */
} PLAN;

static void TYPED(init_plan)(PLAN *c, const plan_sizes *ps, const roicore_tensor *map,
                             const int64_t *batch) {
    c->bins = ps->bins;
    c->K = ps->K;
    c->PH = ps->PH;
    c->PW = ps->PW;
    c->GH = ps->GH;
    c->GW = ps->GW;
    c->D = ps->D;
    c->S = ps->S;
    c->H = map->h;
    c->W = map->w;
    c->batch = batch;
    c->hs = ps->tables;
    c->he = c->hs + c->K * c->PH;
    c->ws = c->he + c->K * c->PH;
    c->we = c->ws + c->K * c->PW;
    c->r0 = c->we + c->K * c->PW;
    c->r1 = c->r0 + c->GH;
    c->q0 = c->r1 + c->GH;
    c->q1 = c->q0 + c->GW;
    TYPED(group_ranges)(c->GH, c->PH, c->r0, c->r1);
    TYPED(group_ranges)(c->GW, c->PW, c->q0, c->q1);
    int64_t rows = 0, cols = 0;
    for (int64_t i = 0; i < c->GH; ++i) rows = roicore_max64(rows, c->r1[i] - c->r0[i]);
    for (int64_t i = 0; i < c->GW; ++i) cols = roicore_max64(cols, c->q1[i] - c->q0[i]);
    c->M = rows * cols;  /* pooled cells per group cell, at most */
}

/* The mean of one bin over G vectors from q0 of a slab (rows of S values), summed from 0 in
 * (h, w) order and divided by the integer area; 0 for an empty bin.  The sums run in
 * vector registers. */
ROICORE_INLINE void TYPED(bin_mean)(const T *img, int64_t W, int64_t S, int64_t h0, int64_t h1,
                                    int64_t w0, int64_t w1, int64_t q0, int G, T *restrict out) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    VTu *o = (VTu *)out + q0;
    if (h1 <= h0 || w1 <= w0) {
        for (int q = 0; q < G; ++q) o[q] = (VT){0};
        return;
    }
    const T area = (T)((h1 - h0) * (w1 - w0));
    VT acc[ROICORE_BLOCK_VECTORS];
    for (int q = 0; q < G; ++q) acc[q] = (VT){0};
    for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) {
            const VTu *r = (const VTu *)(img + (h * W + w) * S) + q0;
            for (int q = 0; q < G; ++q) acc[q] = acc[q] + r[q];
        }
    for (int q = 0; q < G; ++q) o[q] = acc[q] / area;
}

/* Its adjoint: diff (the bin's upstream gradient per lane, zero in the padding lanes)
 * divided by the integer area, added to every pixel of the bin in (h, w) order, the G
 * vectors from q0 held in registers. */
ROICORE_INLINE void TYPED(bin_add)(T *img, int64_t W, int64_t S, int64_t h0, int64_t h1,
                                   int64_t w0, int64_t w1, int64_t q0, int G,
                                   const T *restrict diff) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    if (h1 <= h0 || w1 <= w0) return;
    const T area = (T)((h1 - h0) * (w1 - w0));
    VT d[ROICORE_BLOCK_VECTORS];
    for (int q = 0; q < G; ++q) d[q] = ((const VTu *)diff)[q0 + q] / area;
    for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) {
            VTu *r = (VTu *)(img + (h * W + w) * S) + q0;
            for (int q = 0; q < G; ++q) r[q] = r[q] + d[q];
        }
}

/* One bin's means into out: rows [h0, h1), columns [w0, w1) of img (a slab, rows of S). */
ROICORE_INLINE void TYPED(slab_bin_mean)(const T *img, int64_t W, int64_t S, int64_t h0,
                                         int64_t h1, int64_t w0, int64_t w1, T *out, int NV) {
    if (NV > 0) {
        TYPED(bin_mean)(img, W, S, h0, h1, w0, w1, 0, NV, out);
        return;
    }
    int64_t q0 = 0;  /* other vector counts: groups of 4, then the rest one at a time */
    for (; q0 + 4 <= S / LANES; q0 += 4) TYPED(bin_mean)(img, W, S, h0, h1, w0, w1, q0, 4, out);
    for (; q0 < S / LANES; ++q0) TYPED(bin_mean)(img, W, S, h0, h1, w0, w1, q0, 1, out);
}

/* Box k's bin (ph, pw) from the slab into out.  An empty bin (a masked box's among them)
 * reads no image, so its box's batch index is not used. */
ROICORE_INLINE void TYPED(box_bin_mean)(const PLAN *p, int64_t k, int64_t ph, int64_t pw,
                                        const T *slab, int64_t img_size, T *out, int NV) {
    const int64_t h0 = p->hs[k * p->PH + ph], h1 = p->he[k * p->PH + ph];
    const int64_t w0 = p->ws[k * p->PW + pw], w1 = p->we[k * p->PW + pw];
    const T *img = h1 > h0 && w1 > w0 ? slab + p->batch[k] * img_size : slab;
    TYPED(slab_bin_mean)(img, p->W, p->S, h0, h1, w0, w1, out, NV);
}

/* Every box's bins of cell `cell`, boxes [k0, k1), staged from dst (box k's bins at
 * dst + (k - k0)*M*S, row-major in the cell).  The loop works on a local copy of the plan,
 * whose fields then stay in registers; NV > 0 fixes the vector count at compile time (the
 * counts PS-RoI meets most), and a cell of one bin (R-FCN's, Paddle's) has a loop of its
 * own. */
ROICORE_INLINE void TYPED(cell_mean_nv)(const PLAN *c, int64_t cell, int64_t k0, int64_t k1,
                                        const T *slab, int64_t img_size, T *dst,
                                        roicore_run *run, int NV) {
    const PLAN p = *c;
    const int64_t ph0 = p.r0[cell / p.GW], ph1 = p.r1[cell / p.GW];
    const int64_t pw0 = p.q0[cell % p.GW], pw1 = p.q1[cell % p.GW], box_stride = p.M * p.S;
    for (int64_t kb = k0; kb < k1; kb += 64) {
        if (roicore_stopping(run)) return;
        const int64_t kend = roicore_min64(kb + 64, k1);
        T *out = dst + (kb - k0) * box_stride;
        if (ph1 - ph0 == 1 && pw1 - pw0 == 1) {
            for (int64_t k = kb; k < kend; ++k, out += box_stride)
                TYPED(box_bin_mean)(&p, k, ph0, pw0, slab, img_size, out, NV);
            continue;
        }
        for (int64_t k = kb; k < kend; ++k, out += box_stride) {
            T *bin_out = out;
            for (int64_t ph = ph0; ph < ph1; ++ph)
                for (int64_t pw = pw0; pw < pw1; ++pw, bin_out += p.S)
                    TYPED(box_bin_mean)(&p, k, ph, pw, slab, img_size, bin_out, NV);
        }
    }
}

ROICORE_CLONES static void TYPED(cell_mean)(const PLAN *c, int64_t cell, int64_t k0, int64_t k1,
                                            const T *slab, int64_t img_size, T *dst,
                                            roicore_run *run) {
    switch (c->S / LANES) {
    case 1: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 1); break;
    case 2: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 2); break;
    case 3: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 3); break;
    case 4: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 4); break;
    case 6: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 6); break;
    default: TYPED(cell_mean_nv)(c, cell, k0, k1, slab, img_size, dst, run, 0); break;
    }
}

/* The backward's bins of cell `cell` over every box, added into the slab.  g holds the
 * upstream gradient: box k, channel d, bin p at g[k*g_box + d*g_d + p*g_bin]. */
ROICORE_INLINE void TYPED(cell_add_nv)(const PLAN *c, int64_t cell, T *slab, int64_t img_size,
                                       const T *g, int64_t g_box, int64_t g_d, int64_t g_bin,
                                       T *diff, roicore_run *run, int NV) {
    const int64_t ph0 = c->r0[cell / c->GW], ph1 = c->r1[cell / c->GW];
    const int64_t pw0 = c->q0[cell % c->GW], pw1 = c->q1[cell % c->GW];
    for (int64_t k = 0; k < c->K; ++k) {
        if ((k & 63) == 0 && roicore_stopping(run)) return;
        for (int64_t ph = ph0; ph < ph1; ++ph)
            for (int64_t pw = pw0; pw < pw1; ++pw) {
                const int64_t h0 = c->hs[k * c->PH + ph], h1 = c->he[k * c->PH + ph];
                const int64_t w0 = c->ws[k * c->PW + pw], w1 = c->we[k * c->PW + pw];
                if (h1 <= h0 || w1 <= w0) continue;
                const T *gk = g + k * g_box + (ph * c->PW + pw) * g_bin;
                for (int64_t i = 0; i < c->D; ++i) diff[i] = gk[i * g_d];
                T *img = slab + c->batch[k] * img_size;
                if (NV > 0) {
                    TYPED(bin_add)(img, c->W, c->S, h0, h1, w0, w1, 0, NV, diff);
                    continue;
                }
                int64_t q0 = 0;
                for (; q0 + 4 <= c->S / LANES; q0 += 4)
                    TYPED(bin_add)(img, c->W, c->S, h0, h1, w0, w1, q0, 4, diff);
                for (; q0 < c->S / LANES; ++q0) TYPED(bin_add)(img, c->W, c->S, h0, h1, w0, w1, q0, 1, diff);
            }
    }
}

ROICORE_CLONES static void TYPED(cell_add)(const PLAN *c, int64_t cell, T *slab, int64_t img_size,
                                           const T *g, int64_t g_box, int64_t g_d, int64_t g_bin,
                                           T *diff, roicore_run *run) {
    switch (c->S / LANES) {
    case 1: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 1); break;
    case 2: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 2); break;
    case 3: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 3); break;
    case 4: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 4); break;
    case 6: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 6); break;
    default: TYPED(cell_add_nv)(c, cell, slab, img_size, g, g_box, g_d, g_bin, diff, run, 0); break;
    }
}

/* The plan's box tables, filled by every thread of the region in runs of TABLE_RUN boxes,
 * then waited for: the first thread fills most of them while the others wake up. */
#define TABLE_RUN 64
static int TYPED(fill_tables)(PLAN *c, const roicore_boxes *boxes, T scale, int64_t *next,
                              int64_t *done, roicore_run *run) {
    const T *co = (const T *)boxes->coords;
    const int64_t K = c->K;
    for (int64_t k0 = roicore_take(next) * TABLE_RUN; k0 < K; k0 = roicore_take(next) * TABLE_RUN) {
        for (int64_t k = k0; k < roicore_min64(k0 + TABLE_RUN, K); ++k) {
            if (boxes->masked && c->batch[k] < 0) {  /* empty bins: 0, no gradient */
                for (int64_t p = 0; p < c->PH; ++p) c->hs[k * c->PH + p] = c->he[k * c->PH + p] = 0;
                for (int64_t p = 0; p < c->PW; ++p) c->ws[k * c->PW + p] = c->we[k * c->PW + p] = 0;
                continue;
            }
            if (c->bins == PS_BINS_RFCN) {
                TYPED(float_roi_bins)(co[4 * k + 1], co[4 * k + 3], scale, c->PH, c->H,
                                      c->hs + k * c->PH, c->he + k * c->PH);
                TYPED(float_roi_bins)(co[4 * k + 0], co[4 * k + 2], scale, c->PW, c->W,
                                      c->ws + k * c->PW, c->we + k * c->PW);
            } else {
                const int backward = c->bins == PS_BINS_TORCHVISION_BACKWARD;
                TYPED(torchvision_bins)(co[4 * k + 1], co[4 * k + 3], scale, c->PH, c->H, backward,
                                        c->hs + k * c->PH, c->he + k * c->PH);
                TYPED(torchvision_bins)(co[4 * k + 0], co[4 * k + 2], scale, c->PW, c->W, backward,
                                        c->ws + k * c->PW, c->we + k * c->PW);
            }
        }
        roicore_done(done);
    }
    return roicore_await(done, (K + TABLE_RUN - 1) / TABLE_RUN, run);
}

/* Image n's D channels of cell g (d*G + g) of an NCHW map as a (pixel, S) slab, padding
 * lanes repeating channel D - 1. */
static void TYPED(gather_slab)(const roicore_tensor *x, int64_t n, int64_t g, int64_t G,
                               int64_t D, int64_t S, T *slab) {
    const int64_t HW = x->h * x->w, C = x->c;
    ROICORE_CAT(roicore_transpose, SFX)((const T *)x->data + (n * C + g) * HW, G * HW, D, HW,
                                        slab, S, ROICORE_PAD_ROWS);
}

/* One box's pooled values, cell g's bins from src + g*cell_stride (rows of S), to out. */
static void TYPED(unstage_box)(const PLAN *c, const T *src, int64_t cell_stride, T *out,
                               int nhwc) {
    const int64_t G = c->GH * c->GW, D = c->D, PH = c->PH, PW = c->PW;
    if (c->GH == PH && c->GW == PW) {  /* a cell is a bin: one transpose (or row copy) */
        if (nhwc)
            roicore_copy_rows(src, cell_stride, G, D, out, D, D, sizeof(T));
        else  /* rows of S >= round_up(D, 8): wide rows */
            ROICORE_CAT(roicore_transpose, SFX)(src, cell_stride, G, D, out, G, ROICORE_WIDE_ROWS);
        return;
    }
    for (int64_t g = 0; g < G; ++g) {
        int64_t j = 0;
        for (int64_t ph = c->r0[g / c->GW]; ph < c->r1[g / c->GW]; ++ph)
            for (int64_t pw = c->q0[g % c->GW]; pw < c->q1[g % c->GW]; ++pw, ++j) {
                const T *row = src + g * cell_stride + j * c->S;
                for (int64_t d = 0; d < D; ++d) {
                    if (nhwc) out[(ph * PW + pw) * D + d] = row[d];
                    else out[(d * PH + ph) * PW + pw] = row[d];
                }
            }
    }
}

#define UNSTAGE_RUN 16     /* boxes per task when the staged values move out */
#define STAGE_BYTES (16 << 20)

static int TYPED(psroi_forward)(PLAN *c, const roicore_tensor *x, const roicore_boxes *boxes,
                                T scale, const roicore_tensor *out, roicore_run *run,
                                roicore_error *err) {
    const int64_t K = c->K, N = x->n, HW = x->h * x->w, G = c->GH * c->GW, S = c->S, M = c->M;
    const int nt = run->n_threads, nhwc = out->layout == ROICORE_NHWC;
    const int64_t box_bytes = G * M * S * (int64_t)sizeof(T);
    const int64_t KB = roicore_clamp64(STAGE_BYTES / box_bytes, 1, K);  /* boxes per chunk */
    const int64_t n_chunks = (K + KB - 1) / KB;
    const int64_t slab = roicore_round_up(N * HW * S, ROICORE_LINE / (int64_t)sizeof(T));
    const int64_t n_counters = 3 + 4 * n_chunks;  /* tables, per chunk 4, then `left` */
    char *mem = (char *)roicore_scratch(
        roicore_mul(nt, slab * (int64_t)sizeof(T)) + KB * box_bytes + n_counters * ROICORE_LINE,
        "PS-RoI slabs and staging", err);
    if (!mem) return err ? err->code : ROICORE_ERR_MEMORY;
    T *staged = (T *)(mem + nt * slab * (int64_t)sizeof(T));
    int64_t *counters = (int64_t *)((char *)staged + KB * box_bytes);
    memset(counters, 0, (size_t)(n_counters * ROICORE_LINE));
#define COUNTER(i) (counters + (i) * ROICORE_COUNTER_STRIDE)
    T *data = (T *)ROICORE_WRITABLE(out);
#pragma omp parallel num_threads(nt)
    {
        T *mine = (T *)mem + omp_get_thread_num() * slab;
        if (!TYPED(fill_tables)(c, boxes, scale, COUNTER(0), COUNTER(1), run)) {
            for (int64_t j = 0; j < n_chunks; ++j) {
                int64_t *next_g = COUNTER(2 + 4 * j), *done_g = COUNTER(3 + 4 * j);
                int64_t *next_k = COUNTER(4 + 4 * j), *done_k = COUNTER(5 + 4 * j);
                const int64_t k0 = j * KB, k1 = roicore_min64(K, k0 + KB);
                for (int64_t g = roicore_take(next_g); g < G; g = roicore_take(next_g)) {
                    if (roicore_stopping(run)) break;
                    for (int64_t n = 0; n < N; ++n)
                        TYPED(gather_slab)(x, n, g, G, c->D, S, mine + n * HW * S);
                    TYPED(cell_mean)(c, g, k0, k1, mine, HW * S, staged + g * KB * M * S, run);
                    roicore_done(done_g);
                }
                if (roicore_await(done_g, G, run)) break;
                for (int64_t r = roicore_take(next_k) * UNSTAGE_RUN; r < k1 - k0;
                     r = roicore_take(next_k) * UNSTAGE_RUN) {
                    for (int64_t k = k0 + r; k < roicore_min64(k0 + r + UNSTAGE_RUN, k1); ++k)
                        TYPED(unstage_box)(c, staged + (k - k0) * M * S, KB * M * S,
                                           data + k * c->D * c->PH * c->PW, nhwc);
                    roicore_done(done_k);
                }
                /* the next chunk reuses the staging buffer */
                if (j + 1 < n_chunks && roicore_await(done_k, (k1 - k0 + UNSTAGE_RUN - 1) / UNSTAGE_RUN, run))
                    break;
            }
        }
        roicore_leave(COUNTER(2 + 4 * n_chunks), run);
    }
#undef COUNTER
    roicore_scratch_free(mem);
    return roicore_run_status(run, err);
}

static int TYPED(psroi_backward)(PLAN *c, const roicore_tensor *g, const roicore_boxes *boxes,
                                 T scale, const roicore_tensor *dx, roicore_run *run,
                                 roicore_error *err) {
    const int64_t N = dx->n, HW = dx->h * dx->w, C = dx->c, G = c->GH * c->GW, S = c->S;
    const int64_t D = c->D, P = c->PH * c->PW;
    const int nt = run->n_threads, nchw_g = g->layout == ROICORE_NCHW;
    const int64_t g_d = nchw_g ? P : 1, g_bin = nchw_g ? 1 : D;
    const int64_t slab = roicore_round_up(N * HW * S + S, ROICORE_LINE / (int64_t)sizeof(T));
    char *mem = (char *)roicore_scratch(roicore_mul(nt, slab * (int64_t)sizeof(T)) + 4 * ROICORE_LINE,
                                        "PS-RoI gradient slabs", err);
    if (!mem) return err ? err->code : ROICORE_ERR_MEMORY;
    int64_t *counters = (int64_t *)(mem + nt * slab * (int64_t)sizeof(T));
    memset(counters, 0, 4 * ROICORE_LINE);
    int64_t *next_box = counters, *done_box = counters + ROICORE_COUNTER_STRIDE;
    int64_t *next_g = counters + 2 * ROICORE_COUNTER_STRIDE, *left = counters + 3 * ROICORE_COUNTER_STRIDE;
    T *dxd = (T *)ROICORE_WRITABLE(dx);
    const T *gd = (const T *)g->data;
#pragma omp parallel num_threads(nt)
    {
        T *mine = (T *)mem + omp_get_thread_num() * slab, *diff = mine + N * HW * S;
        if (!TYPED(fill_tables)(c, boxes, scale, next_box, done_box, run)) {
            for (int64_t i = D; i < S; ++i) diff[i] = 0;  /* padding lanes add zeros */
            for (int64_t cell = roicore_take(next_g); cell < G; cell = roicore_take(next_g)) {
                if (roicore_stopping(run)) break;
                memset(mine, 0, (size_t)(N * HW * S) * sizeof(T));
                TYPED(cell_add)(c, cell, mine, HW * S, gd, D * P, g_d, g_bin, diff, run);
                for (int64_t n = 0; n < N; ++n)  /* dx is NCHW (psroi.c) */
                    ROICORE_CAT(roicore_transpose, SFX)(mine + n * HW * S, S, HW, D,
                                                        dxd + (n * C + cell) * HW, G * HW,
                                                        0);
            }
        }
        roicore_leave(left, run);
    }
    roicore_scratch_free(mem);
    return roicore_run_status(run, err);
}

#undef TABLE_RUN
#undef UNSTAGE_RUN
#undef STAGE_BYTES
#undef TYPED
#undef PLAN
