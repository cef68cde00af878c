/* RoIAlign for element type T; roi_align.c includes this once per dtype with T, SFX, VT and
 * LANES defined.
 *
 * Sample positions are separable: row samples depend on (ph, iy) only and column samples
 * on (pw, ix) only.  Each axis of a box gets a table of (low index, high index, weight of
 * low, weight of high) per sample, shared by every channel; index -1 marks a sample outside
 * [-1, size], which the frameworks keep in the average as 0 * v[0]. */

#define TYPED(name) ROICORE_CAT(name, SFX)
#define FWD_TASK ROICORE_CAT(roicore_fwd_task, SFX)
#define FWD_JOB ROICORE_CAT(roicore_fwd_job, SFX)
#define BWD_TASK ROICORE_CAT(roicore_bwd_task, SFX)
#define BWD_JOB ROICORE_CAT(roicore_bwd_job, SFX)
#define ALIGN_OP TYPED(align_op)

#include "align_samples_typed.h"

ROICORE_INLINE SAMPLES TYPED(samples_at)(SAMPLES s, int64_t j) {
    SAMPLES r = {s.lo + j, s.hi + j, s.lw + j, s.hw + j};
    return r;
}

/* Everything the sample tables of a call hold.  When the tables of every box fit within
 * the output's size (or 16 MiB), they are built once per box and shared by the tasks of
 * all channel blocks; otherwise (absurd boxes, few channels) each task builds the samples
 * of the bin it pools in per-thread scratch, so memory stays bounded by the output. */
typedef struct {
    int64_t K, N, H, W, PH, PW;
    int sampler, empty_nan, divide, sum;
    int64_t *region;                   /* per image, the rectangle the samples read */
    uint8_t *tiles;                    /* ... and its tiles they read, or NULL */
    T *ystart, *ybin, *xstart, *xbin;  /* per box */
    int64_t *ygrid, *xgrid;
    int64_t *yoff, *xoff;              /* per box, into the shared tables */
    SAMPLES y, x;                      /* shared tables, or lo == NULL */
    char *pieces;                      /* per-thread scratch without shared tables */
    int64_t piece_bytes, max_grid;
} ALIGN_OP;

/* Build the op's tables: per box axis parameters, then either shared sample tables or
 * per-thread pieces.  `limit_bytes` is what the shared tables may take. */
static int TYPED(align_tables)(ALIGN_OP *op, const roicore_boxes *boxes, double scale, int64_t sampling_ratio,
                               int aligned, int min_size_one, int64_t limit_bytes, int n_threads,
                               void **owned, roicore_error *err) {
    const int64_t K = boxes->k, PH = op->PH, PW = op->PW;
    const T s = (T)scale, offset = aligned ? (T)0.5 : (T)0;
    const T *c = (const T *)boxes->coords;
    char *box_mem = (char *)roicore_scratch(roicore_mul(K, 4 * (int64_t)sizeof(T) + 32) + 16 +
                                                32 * op->N, "RoIAlign box tables", err);
    if (!box_mem) return err ? err->code : ROICORE_ERR_MEMORY;
    owned[0] = box_mem;
    op->ystart = (T *)box_mem;
    op->ybin = op->ystart + K;
    op->xstart = op->ybin + K;
    op->xbin = op->xstart + K;
    op->ygrid = (int64_t *)(op->xbin + K);
    op->xgrid = op->ygrid + K;
    op->yoff = op->xgrid + K;
    op->xoff = op->yoff + K + 1;
    op->region = op->xoff + K + 1;
    int64_t ny = 0, nx = 0, max_grid = 1;
    for (int64_t k = 0; k < K; ++k) {
        TYPED(align_axis)(c[4 * k + 1], c[4 * k + 3], s, offset, PH, sampling_ratio, min_size_one,
                          op->sampler, &op->ystart[k], &op->ybin[k], &op->ygrid[k]);
        TYPED(align_axis)(c[4 * k + 0], c[4 * k + 2], s, offset, PW, sampling_ratio, min_size_one,
                          op->sampler, &op->xstart[k], &op->xbin[k], &op->xgrid[k]);
        const int64_t gy = op->ygrid[k], gx = op->xgrid[k];
        op->yoff[k] = ny;
        op->xoff[k] = nx;
        if (boxes->masked && boxes->batch[k] < 0) {  /* no samples: pools to 0, adds nothing */
            op->ygrid[k] = op->xgrid[k] = 0;
            continue;
        }
        const int rc = roicore_check_grid(k, gy, gx, err);
        if (rc) return rc;
        ny += roicore_max64(op->ygrid[k], 0) * PH;
        nx += roicore_max64(op->xgrid[k], 0) * PW;
        max_grid = roicore_max64(max_grid, roicore_max64(op->ygrid[k], op->xgrid[k]));
    }
    op->yoff[K] = ny;
    op->xoff[K] = nx;
    op->max_grid = max_grid;
    const int64_t shared = TYPED(samples_bytes)(ny + nx);
    if (shared <= limit_bytes) {
        char *mem = (char *)roicore_scratch(shared, "RoIAlign sample tables", err);
        if (!mem) return err ? err->code : ROICORE_ERR_MEMORY;
        owned[1] = mem;
        op->y = TYPED(carve)(mem, ny);
        op->x = TYPED(carve)(mem + TYPED(samples_bytes)(ny), nx);
        /* a few dozen operations per box: threads only for many boxes */
#pragma omp parallel for num_threads(K >= 8192 ? n_threads : 1) schedule(static)
        for (int64_t k = 0; k < K; ++k) {
            for (int64_t p = 0; p < PH && op->ygrid[k] > 0; ++p)
                TYPED(bin_samples)(op->ystart[k], op->ybin[k], op->ygrid[k], p, op->PH, op->H, op->sampler,
                                   TYPED(samples_at)(op->y, op->yoff[k] + p * op->ygrid[k]));
            for (int64_t p = 0; p < PW && op->xgrid[k] > 0; ++p)
                TYPED(bin_samples)(op->xstart[k], op->xbin[k], op->xgrid[k], p, op->PW, op->W, op->sampler,
                                   TYPED(samples_at)(op->x, op->xoff[k] + p * op->xgrid[k]));
        }
        if (K < 8192) {  /* the rectangle each image's samples read (index -1: none) */
            roicore_region_init(op->region, op->N, op->H, op->W);
            int64_t th, tw;
            roicore_tiles_shape(op->H, op->W, &th, &tw);
            const int64_t n_tiles = roicore_mul(roicore_mul(th, tw), op->N);
            if (n_tiles >= 0 && n_tiles <= ROICORE_MAX_TILES) {
                op->tiles = (uint8_t *)roicore_scratch(n_tiles, "RoIAlign tiles", err);
                if (!op->tiles) return err ? err->code : ROICORE_ERR_MEMORY;
                owned[2] = op->tiles;
                memset(op->tiles, 0, (size_t)n_tiles);
            }
            for (int64_t k = 0; k < K; ++k) {
                if (op->ygrid[k] <= 0 || op->xgrid[k] <= 0) continue;
                int64_t r0 = op->H, r1 = 0, c0 = op->W, c1 = 0;
                for (int64_t j = op->yoff[k]; j < op->yoff[k + 1]; ++j)
                    if (op->y.lo[j] >= 0) {
                        r0 = roicore_min64(r0, op->y.lo[j]);
                        r1 = roicore_max64(r1, op->y.hi[j] + 1);
                    }
                for (int64_t j = op->xoff[k]; j < op->xoff[k + 1]; ++j)
                    if (op->x.lo[j] >= 0) {
                        c0 = roicore_min64(c0, op->x.lo[j]);
                        c1 = roicore_max64(c1, op->x.hi[j] + 1);
                    }
                roicore_region_include(op->region, boxes->batch[k], r0, r1, c0, c1);
                if (op->tiles)
                    roicore_tiles_include(op->tiles, boxes->batch[k], op->H, op->W, r0, r1, c0,
                                          c1);
            }
        } else {
            op->region = NULL;
        }
    } else {
        op->y.lo = NULL;
        op->region = NULL;  /* samples built per bin: the whole map */
        op->piece_bytes = roicore_round_up(TYPED(samples_bytes)(2 * max_grid), ROICORE_LINE);
        op->pieces = (char *)roicore_scratch(n_threads * op->piece_bytes, "RoIAlign sample pieces", err);
        if (!op->pieces) return err ? err->code : ROICORE_ERR_MEMORY;
        owned[1] = op->pieces;
    }
    return ROICORE_OK;
}

/* The samples of bin row (column) p of box k built into the calling thread's piece, when
 * the tables are not shared. */
static SAMPLES TYPED(piece)(const ALIGN_OP *op, int64_t k, int64_t p, int column) {
    char *mine = op->pieces + omp_get_thread_num() * op->piece_bytes;
    SAMPLES s = TYPED(carve)(column ? mine + TYPED(samples_bytes)(op->max_grid) : mine, op->max_grid);
    if (column)
        TYPED(bin_samples)(op->xstart[k], op->xbin[k], op->xgrid[k], p, op->PW, op->W, op->sampler, s);
    else
        TYPED(bin_samples)(op->ystart[k], op->ybin[k], op->ygrid[k], p, op->PH, op->H, op->sampler, s);
    return s;
}

/* Box k's slice of one axis' shared table (lo == NULL when the tables are not shared). */
ROICORE_INLINE SAMPLES TYPED(box_samples)(SAMPLES table, const int64_t *offset, int64_t k) {
    return table.lo ? TYPED(samples_at)(table, offset[k]) : table;
}

/* The samples of bin row (or column) p of box k, `grid` per bin: from the box's slice of
 * the shared tables, or built now into the calling thread's piece. */
ROICORE_INLINE SAMPLES TYPED(axis_samples)(const ALIGN_OP *op, SAMPLES box, int64_t k, int64_t p,
                                           int64_t grid, int column) {
    if (box.lo) return TYPED(samples_at)(box, p * grid);
    return TYPED(piece)(op, k, p, column);
}

/* A bin's gy x gx samples summed per lane from 0 in (iy, ix) order as
 * ((w1*a + w2*b) + w3*c) + w4*d, then divided by `norm` (Caffe2) or multiplied by it
 * (Paddle's reciprocal), for G vectors from vector q0, kept in registers for the bin. */
ROICORE_INLINE void TYPED(align_bin)(const T *img, int64_t W, int64_t lanes, int64_t q0,
                                            int G, SAMPLES y, int64_t gy, SAMPLES x, int64_t gx,
                                            T norm, int divide, T *restrict out) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    VT acc[ROICORE_BLOCK_VECTORS];
    for (int q = 0; q < G; ++q) acc[q] = (VT){0};
    for (int64_t iy = 0; iy < gy; ++iy)
        for (int64_t ix = 0; ix < gx; ++ix) {
            const T *a = img, *b = img, *c = img, *d = img;
            T w1 = 0, w2 = 0, w3 = 0, w4 = 0;
            if (y.lo[iy] >= 0 && x.lo[ix] >= 0) {
                a = img + (y.lo[iy] * W + x.lo[ix]) * lanes;
                b = img + (y.lo[iy] * W + x.hi[ix]) * lanes;
                c = img + (y.hi[iy] * W + x.lo[ix]) * lanes;
                d = img + (y.hi[iy] * W + x.hi[ix]) * lanes;
                w1 = y.lw[iy] * x.lw[ix];
                w2 = y.lw[iy] * x.hw[ix];
                w3 = y.hw[iy] * x.lw[ix];
                w4 = y.hw[iy] * x.hw[ix];
            }
            /* keep the four corner pointers as bases: otherwise GCC makes an induction
               variable of each corner's every vector and spills them */
            __asm__("" : "+r"(a), "+r"(b), "+r"(c), "+r"(d));
            a += q0 * LANES;
            b += q0 * LANES;
            c += q0 * LANES;
            d += q0 * LANES;
            _Pragma("GCC unroll 8")
            for (int q = 0; q < G; ++q)
                acc[q] = acc[q] + (((w1 * ((const VTu *)a)[q] + w2 * ((const VTu *)b)[q]) +
                                    w3 * ((const VTu *)c)[q]) + w4 * ((const VTu *)d)[q]);
        }
    _Pragma("GCC unroll 8")
    for (int q = 0; q < G; ++q)
        ((VTu *)out)[q0 + q] = divide ? acc[q] / norm : acc[q] * norm;
}

/* The forward's task: bins [p0, p1) of box k over one block; whole blocks with all 8
 * vectors in registers, the padded last block a vector at a time. */
ROICORE_CLONES static void TYPED(align_task)(const void *opv, FWD_TASK *t) {
    const ALIGN_OP *op = (const ALIGN_OP *)opv;
    /* fields in locals: after a stop check, which may call out, the compiler would load
       every field it reads through op and t again */
    const int64_t k = t->k, p0 = t->p0, p1 = t->p1, lanes = t->lanes, PW = op->PW, W = op->W;
    const int64_t gy = op->ygrid[k], gx = op->xgrid[k];
    const int divide = op->divide, heavy = gy * gx >= ROICORE_HEAVY_BIN;
    const T *img = t->img;
    T *acc = t->acc;
    roicore_pending *pend = t->pend;
    const int npend = t->npend;
    roicore_run *run = t->run;
    T norm = 0;
    if (op->sum)  /* the sum divided, or multiplied, by 1: as it is */
        norm = 1;
    else if (gy > 0 && gx > 0)
        norm = divide ? (T)(gy * gx) : (T)(1.0 / (double)(gy * gx));  /* Paddle: in double */
    const SAMPLES ybox = TYPED(box_samples)(op->y, op->yoff, k);
    const SAMPLES xbox = TYPED(box_samples)(op->x, op->xoff, k);
    /* a whole block, shared tables, no stop checks inside a row */
    const int plain = lanes == ROICORE_BLOCK_LANES && xbox.lo && !heavy;
    for (int64_t ph = p0 / PW; ph <= (p1 - 1) / PW; ++ph) {
        roicore_pending_step_all(pend, npend);
        if (roicore_stopping(run)) break;
        int64_t pw0, pw1;
        roicore_task_row(p0, p1, PW, ph, &pw0, &pw1);
        T *row = acc + (ph * PW - p0) * lanes;  /* bin (ph, pw) at row + pw * lanes */
        if (gy <= 0 || gx <= 0) {  /* no samples: Paddle computes an empty sum times 1/0 */
            for (int64_t c = pw0 * lanes; c < pw1 * lanes; ++c) row[c] = op->empty_nan ? (T)NAN : 0;
            continue;
        }
        const SAMPLES ys = TYPED(axis_samples)(op, ybox, k, ph, gy, 0);
        if (plain) {  /* the common case, with nothing to decide per bin */
            for (int64_t pw = pw0; pw < pw1; ++pw)
                TYPED(align_bin)(img, W, ROICORE_BLOCK_LANES, 0, ROICORE_BLOCK_VECTORS, ys, gy,
                                 TYPED(samples_at)(xbox, pw * gx), gx, norm, divide,
                                 row + pw * ROICORE_BLOCK_LANES);
            continue;
        }
        for (int64_t pw = pw0; pw < pw1; ++pw) {
            if (heavy && roicore_stopping(run)) break;
            const SAMPLES xs = TYPED(axis_samples)(op, xbox, k, pw, gx, 1);
            if (lanes == ROICORE_BLOCK_LANES)
                TYPED(align_bin)(img, W, lanes, 0, ROICORE_BLOCK_VECTORS, ys, gy, xs, gx, norm,
                                 divide, row + pw * lanes);
            else
                for (int64_t q0 = 0; q0 < lanes / LANES; ++q0)
                    TYPED(align_bin)(img, W, lanes, q0, 1, ys, gy, xs, gx, norm, divide,
                                     row + pw * lanes);
        }
    }
    roicore_pending_finish_all(pend, npend);
}

/* The adjoint of one bin: each in-map sample adds, corner by corner (corners may
 * coincide), (g * w) / count to its four corner pixels, G vectors from q0 at a time, the
 * bin's gradient held in registers.  When count is a power of two, x / count and
 * x * (1 / count) are the same correctly rounded number, so it multiplies instead. */
ROICORE_INLINE void TYPED(align_bin_grad)(T *img, int64_t W, int64_t lanes, int64_t q0,
                                                 int G, SAMPLES y, int64_t gy, SAMPLES x,
                                                 int64_t gx, const T *g, T count, int pow2,
                                                 T inv) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    VT gv[ROICORE_BLOCK_VECTORS];
    for (int q = 0; q < G; ++q) gv[q] = ((const VTu *)g)[q0 + q];
    for (int64_t iy = 0; iy < gy; ++iy) {
        if (y.lo[iy] < 0) continue;
        for (int64_t ix = 0; ix < gx; ++ix) {
            if (x.lo[ix] < 0) continue;
            T *const corner[4] = {img + (y.lo[iy] * W + x.lo[ix]) * lanes,
                                  img + (y.lo[iy] * W + x.hi[ix]) * lanes,
                                  img + (y.hi[iy] * W + x.lo[ix]) * lanes,
                                  img + (y.hi[iy] * W + x.hi[ix]) * lanes};
            const T weight[4] = {y.lw[iy] * x.lw[ix], y.lw[iy] * x.hw[ix], y.hw[iy] * x.lw[ix],
                                 y.hw[iy] * x.hw[ix]};
            for (int c = 0; c < 4; ++c) {
                VTu *dst = (VTu *)corner[c] + q0;
                const T w = weight[c];
                __asm__("" : "+r"(dst));
                if (pow2) {
                    _Pragma("GCC unroll 8")
                    for (int q = 0; q < G; ++q) dst[q] = dst[q] + (gv[q] * w) * inv;
                } else {
                    _Pragma("GCC unroll 8")
                    for (int q = 0; q < G; ++q) dst[q] = dst[q] + (gv[q] * w) / count;
                }
            }
        }
    }
}

/* The adjoint of a bin over all `lanes`, in groups of 8, 4, 2 and 1 vectors of constant
 * width, each group's gradient in registers: a whole block is one group, and a narrower
 * one (the backward's blocks when blocks and images are fewer than the threads, or the
 * last block) walks the bin's samples at most four times rather than once per vector.
 * Lanes never mix, so the grouping does not change a bit. */
ROICORE_INLINE void TYPED(align_bin_grad_lanes)(T *img, int64_t W, int64_t lanes, SAMPLES y,
                                                int64_t gy, SAMPLES x, int64_t gx, const T *g,
                                                T count, int pow2, T inv) {
    const int64_t nv = lanes / LANES;
    if (nv == ROICORE_BLOCK_VECTORS) {
        TYPED(align_bin_grad)(img, W, lanes, 0, ROICORE_BLOCK_VECTORS, y, gy, x, gx, g, count, pow2,
                              inv);
        return;
    }
    int64_t q0 = 0;
    if (nv - q0 >= 4) {
        TYPED(align_bin_grad)(img, W, lanes, q0, 4, y, gy, x, gx, g, count, pow2, inv);
        q0 += 4;
    }
    if (nv - q0 >= 2) {
        TYPED(align_bin_grad)(img, W, lanes, q0, 2, y, gy, x, gx, g, count, pow2, inv);
        q0 += 2;
    }
    if (nv - q0 >= 1)
        TYPED(align_bin_grad)(img, W, lanes, q0, 1, y, gy, x, gx, g, count, pow2, inv);
}

/* The Model Garden's adjoint of box k's whole bin rows [p0, p1) (one sample per bin, so g *
 * w): TensorFlow's gather gradient adds the gathered pixels in the order it gathered them,
 * per bin row its low neighbour row across every bin (each bin's low, then high column),
 * then its high neighbour row. */
static void TYPED(garden_grad_rows)(const ALIGN_OP *op, BWD_TASK *t) {
    const int64_t k = t->k, lanes = t->lanes, PW = op->PW, W = op->W;
    const SAMPLES ybox = TYPED(box_samples)(op->y, op->yoff, k);
    const SAMPLES xbox = TYPED(box_samples)(op->x, op->xoff, k);
    for (int64_t ph = t->p0 / PW; ph < t->p1 / PW; ++ph) {
        if (roicore_stopping(t->run)) return;
        const SAMPLES ys = TYPED(axis_samples)(op, ybox, k, ph, 1, 0);
        for (int r = 0; r < 2; ++r) {
            const int64_t row = r ? ys.hi[0] : ys.lo[0];
            const T wy = r ? ys.hw[0] : ys.lw[0];
            for (int64_t pw = 0; pw < PW; ++pw) {
                const SAMPLES xs = TYPED(axis_samples)(op, xbox, k, pw, 1, 1);
                const T *g = t->g + (ph * PW + pw - t->p0) * lanes;
                for (int c = 0; c < 2; ++c) {
                    const T w = wy * (c ? xs.hw[0] : xs.lw[0]);
                    T *dst = t->img + (row * W + (c ? xs.hi[0] : xs.lo[0])) * lanes;
                    for (int64_t i = 0; i < lanes; ++i) dst[i] = dst[i] + g[i] * w;
                }
            }
        }
    }
}

/* The backward's task: box k's bins [p0, p1) added into one block's accumulator, in (ph,
 * pw, iy, ix) order. */
ROICORE_CLONES static void TYPED(align_grad_task)(const void *opv, BWD_TASK *t) {
    const ALIGN_OP *op = (const ALIGN_OP *)opv;
    /* fields in locals, as in align_task */
    const int64_t k = t->k, p0 = t->p0, p1 = t->p1, lanes = t->lanes, PW = op->PW, W = op->W;
    const int64_t gy = op->ygrid[k], gx = op->xgrid[k];
    if (gy <= 0 || gx <= 0) return;
    if (op->sampler == ROICORE_SAMPLER_MODEL_GARDEN) {
        TYPED(garden_grad_rows)(op, t);
        return;
    }
    const int heavy = gy * gx >= ROICORE_HEAVY_BIN;
    T *img = t->img;
    const T *grad = t->g;
    roicore_run *run = t->run;
    const T count = op->sum ? (T)1 : (T)(gy * gx);  /* the sum's adjoint: g * w */
    const int64_t whole = (int64_t)count;
    const int pow2 = (T)whole == count && whole > 0 && (whole & (whole - 1)) == 0;
    const T inv = (T)1 / count;
    const SAMPLES ybox = TYPED(box_samples)(op->y, op->yoff, k);
    const SAMPLES xbox = TYPED(box_samples)(op->x, op->xoff, k);
    const int plain = lanes == ROICORE_BLOCK_LANES && xbox.lo && !heavy;  /* as in align_task */
    for (int64_t ph = p0 / PW; ph <= (p1 - 1) / PW; ++ph) {
        int64_t pw0, pw1;
        roicore_task_row(p0, p1, PW, ph, &pw0, &pw1);
        const SAMPLES ys = TYPED(axis_samples)(op, ybox, k, ph, gy, 0);
        if (plain) {
            for (int64_t pw = pw0; pw < pw1; ++pw)
                TYPED(align_bin_grad)(img, W, ROICORE_BLOCK_LANES, 0, ROICORE_BLOCK_VECTORS, ys,
                                      gy, TYPED(samples_at)(xbox, pw * gx), gx,
                                      grad + (ph * PW + pw - p0) * ROICORE_BLOCK_LANES, count,
                                      pow2, inv);
            continue;
        }
        for (int64_t pw = pw0; pw < pw1; ++pw) {
            if (heavy && roicore_stopping(run)) return;
            const SAMPLES xs = TYPED(axis_samples)(op, xbox, k, pw, gx, 1);
            const T *g = grad + (ph * PW + pw - p0) * lanes;
            TYPED(align_bin_grad_lanes)(img, W, lanes, ys, gy, xs, gx, g, count, pow2, inv);
        }
    }
}

/* Every box's grid within the limits (see roicore_align_check_grids). */
static int TYPED(align_check_grids)(const roicore_boxes *boxes, double scale,
                                    int64_t sampling_ratio, int aligned, int min_size_one,
                                    int64_t PH, int64_t PW, const int64_t *rows,
                                    roicore_error *err) {
    const T s = (T)scale, offset = aligned ? (T)0.5 : (T)0;
    const T *c = (const T *)boxes->coords;
    for (int64_t k = 0; k < boxes->k; ++k) {
        if (boxes->masked && boxes->batch[k] < 0) continue;
        T start, bin;
        int64_t gy, gx;
        /* the grid is the same whatever the sampler */
        TYPED(align_axis)(c[4 * k + 1], c[4 * k + 3], s, offset, PH, sampling_ratio,
                          min_size_one, ROICORE_SAMPLER_CAFFE2, &start, &bin, &gy);
        TYPED(align_axis)(c[4 * k + 0], c[4 * k + 2], s, offset, PW, sampling_ratio,
                          min_size_one, ROICORE_SAMPLER_CAFFE2, &start, &bin, &gx);
        const int rc = roicore_check_grid(rows ? rows[k] : k, gy, gx, err);
        if (rc) return rc;
    }
    return ROICORE_OK;
}

/* Forward or backward over `boxes`; with `rows`, box k's output (upstream gradient) is row
 * rows[k] of `pooled`, else row k. */
static int TYPED(align_run)(int forward, const roicore_roi_align_rules *rules,
                            const roicore_tensor *map, const roicore_tensor *pooled,
                            const roicore_boxes *boxes, double scale, int64_t sampling_ratio,
                            int aligned, const int64_t *rows, roicore_run *run,
                            roicore_error *err) {
    ALIGN_OP op;
    memset(&op, 0, sizeof op);
    op.K = boxes->k;
    op.N = map->n;
    op.H = map->h;
    op.W = map->w;
    op.PH = pooled->h;
    op.PW = pooled->w;
    /* every framework's RoIAlign backward uses the Caffe2 samples; the Model Garden's is the
       adjoint of its own */
    op.sampler = forward || rules->sampler == ROICORE_SAMPLER_MODEL_GARDEN ? (int)rules->sampler
                                                                           : ROICORE_SAMPLER_CAFFE2;
    op.sum = rules->reduction == ROICORE_REDUCTION_SUM;
    op.empty_nan = rules->empty_grid == ROICORE_EMPTY_GRID_NAN && !op.sum;
    op.divide = op.sampler == ROICORE_SAMPLER_CAFFE2;
    const int min_size_one = roicore_align_min_size_one(forward, rules, aligned);
    const int64_t written = roicore_tensor_bytes(forward ? pooled : map);
    void *owned[3] = {NULL, NULL, NULL};
    int rc = TYPED(align_tables)(&op, boxes, scale, sampling_ratio, aligned, min_size_one,
                                 roicore_max64(written, 16 << 20), run->n_threads, owned, err);
    if (rc == ROICORE_OK) {
        if (forward) {
            const FWD_JOB job = {map, pooled, boxes->batch, NULL, ROICORE_INT32, 0, op.region,
                                 &op, TYPED(align_task), 0, op.tiles, boxes->k, rows};
            rc = ROICORE_CAT(roicore_blocked_forward, SFX)(&job, run, err);
        } else {
            const BWD_JOB job = {pooled, map, boxes->batch, &op, TYPED(align_grad_task),
                                 boxes->k, rows, op.sampler == ROICORE_SAMPLER_MODEL_GARDEN};
            rc = ROICORE_CAT(roicore_blocked_backward, SFX)(&job, run, err);
        }
    }
    for (int i = 0; i < 3; ++i) roicore_scratch_free(owned[i]);
    return rc;
}

#undef TYPED
#undef FWD_TASK
#undef FWD_JOB
#undef BWD_TASK
#undef BWD_JOB
#undef ALIGN_OP
#undef SAMPLES
