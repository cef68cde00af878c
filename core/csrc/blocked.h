/* The parallel skeleton shared by the channel-blocked kernels (blocked_typed.h).
 *
 * Channels are split into blocks of 8 vectors (64 float32 or 32 float64 channels: 256 bytes
 * per pixel); the last block is padded to whole vectors.  An operator supplies only the
 * arithmetic of one task; the skeleton owns the threads, the blocked copies, the task
 * counters, per-thread scratch and the write-out.
 *
 * Forward (max pooling, bilinear pooling, RoIAlign): x is copied once into blocks, each an
 * (H, W, lanes) array per image, so a block's pixels are contiguous vectors (only the
 * rectangle of each image that its boxes read, when the operator says which); a task pools
 * bins [p0, p1) of one box over one block into a (bin, lane) buffer, which the skeleton
 * transposes into the output's (channel, bin) planes (NCHW) or copies into its rows (NHWC),
 * through non-temporal stores spread over the thread's next task when the output is large.
 * An operator that reads a single sample per bin (bilinear pooling) gains nothing from
 * blocks that stay in cache across samples, and asks for `rows`: with NHWC in and out, all
 * channels then form one block, a map whose channels fill whole vectors is read in place,
 * and each bin's results go out as one contiguous row, as crop_and_resize writes them.
 * Tasks run block-major, so a thread's consecutive tasks read the same block of the map;
 * threads take them one at a time from a shared counter, so a short last block leaves no
 * thread idle, and pack the blocks of x inside the same parallel region first.
 *
 * Backward (bilinear pooling, RoIAlign): one task owns one channel block of one image
 * (blocks narrower than 8 vectors when there are fewer blocks and images than threads),
 * zeroes a per-thread (H, W, lanes) accumulator, walks the image's boxes in order, adding
 * each box's bins (their upstream gradient packed (bin, lane), a chunk of bins at a time),
 * and finally writes its block of dx.
 * So each channel receives its additions in the frameworks' serial order: no atomics, and
 * the same bits for every thread count.
 *
 * A box whose batch index is negative (masked) gives 0 and -1 and adds nothing. */
#ifndef ROICORE_BLOCKED_H
#define ROICORE_BLOCKED_H

#include "common.h"
#include "simd.h"
#include "checks.h"

/* A forward task's bins [p0, p1) by rows: rows p0 / PW .. (p1 - 1) / PW, row ph holding
 * columns [*pw0, *pw1). */
static inline void roicore_task_row(int64_t p0, int64_t p1, int64_t PW, int64_t ph,
                                    int64_t *pw0, int64_t *pw1) {
    *pw0 = ph == p0 / PW ? p0 % PW : 0;
    *pw1 = ph == (p1 - 1) / PW ? (p1 - 1) % PW + 1 : PW;
}

/* A region may also mark the tiles of ROICORE_TILE x ROICORE_TILE pixels that the tasks
 * read, per image: tiles[n * th * tw + ty * tw + tx] with th, tw the tile rows and columns
 * (roicore_tiles_shape).  Boxes scattered over a large map (an FPN's mask head: a hundred
 * boxes on a 200 x 304 level) then have the pixels near them packed, not their whole
 * bounding rectangle.  Kept for maps of at most ROICORE_MAX_TILES tiles per call. */
#define ROICORE_TILE 16
#define ROICORE_MAX_TILES (1 << 20)

static inline void roicore_tiles_shape(int64_t H, int64_t W, int64_t *th, int64_t *tw) {
    *th = (H + ROICORE_TILE - 1) / ROICORE_TILE;
    *tw = (W + ROICORE_TILE - 1) / ROICORE_TILE;
}

/* Marks the tiles of image n's rows [r0, r1) x columns [c0, c1) as read. */
static inline void roicore_tiles_include(uint8_t *tiles, int64_t n, int64_t H, int64_t W,
                                         int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    int64_t th, tw;
    roicore_tiles_shape(H, W, &th, &tw);
    uint8_t *t = tiles + n * th * tw;
    for (int64_t ty = r0 / ROICORE_TILE; ty <= (r1 - 1) / ROICORE_TILE; ++ty)
        memset(t + ty * tw + c0 / ROICORE_TILE, 1,
               (size_t)((c1 - 1) / ROICORE_TILE - c0 / ROICORE_TILE + 1));
}

/* The regions of a forward: per image n, region[4n .. 4n+3] = r0, r1, c0, c1, at first
 * empty; each box widens its image's rectangle to take rows [r0, r1) and columns [c0, c1). */
static inline void roicore_region_init(int64_t *region, int64_t n_images, int64_t H, int64_t W) {
    for (int64_t n = 0; n < n_images; ++n) {
        region[4 * n] = H;
        region[4 * n + 1] = 0;
        region[4 * n + 2] = W;
        region[4 * n + 3] = 0;
    }
}
static inline void roicore_region_include(int64_t *region, int64_t n, int64_t r0, int64_t r1,
                                          int64_t c0, int64_t c1) {
    if (r1 <= r0 || c1 <= c0) return;
    int64_t *r = region + 4 * n;
    r[0] = roicore_min64(r[0], r0);
    r[1] = roicore_max64(r[1], r1);
    r[2] = roicore_min64(r[2], c0);
    r[3] = roicore_max64(r[3], c1);
}

#define ROICORE_DECLARE_BLOCKED(T, SFX)                                                        \
    typedef struct {                                                                           \
        int64_t k;                 /* the box */                                              \
        int64_t p0, p1;            /* its bins [p0, p1), row-major */                         \
        int64_t c0, nb, lanes;     /* the block's first channel, channels, lanes per pixel */ \
        const T *img;              /* the packed block of image batch[k]: (H, W, lanes) */    \
        T *acc;                    /* out: (p1 - p0) rows of `lanes` results */               \
        int32_t *arg;              /* out, or NULL: the same for the argmax */                \
        int32_t abase, astep;      /* added to lane c's argmax: abase + c * astep */          \
        roicore_pending *pend;     /* write-outs to stream, a step per row of bins, */        \
        int npend;                 /* all finished before the task returns */                 \
        roicore_run *run;                                                                      \
    } roicore_fwd_task_##SFX;                                                                  \
                                                                                               \
    typedef struct {                                                                           \
        const roicore_tensor *x, *out;                                                         \
        const int64_t *batch;                                                                  \
        void *argmax;                /* NULL, or an array of out's shape and layout */        \
        roicore_index_type argmax_type;                                                        \
        int global_argmax;           /* flat NCHW index into x rather than h*W + w */         \
        const int64_t *region;       /* per image rows [r0, r1), columns [c0, c1) the tasks */\
                                     /* read, besides pixel (0, 0); NULL: the whole map */    \
        const void *op;                                                                        \
        void (*pool)(const void *op, roicore_fwd_task_##SFX *task);                            \
        int rows;                    /* one sample per bin: NHWC in and out take all their */ \
                                     /* channels as one block, read x's pixel rows in place */\
        const uint8_t *tiles;        /* with region, or NULL: the tiles the tasks read */     \
        int64_t k;                   /* with out_rows: the boxes, box k writing out's row */  \
        const int64_t *out_rows;     /* out_rows[k] (a pyramid level's boxes); NULL: out->n */\
                                     /* boxes, box k writing row k */                         \
    } roicore_fwd_job_##SFX;                                                                   \
                                                                                               \
    typedef struct {                                                                           \
        int64_t k, p0, p1;         /* the box and its bins [p0, p1), row-major */             \
        int64_t c0, nb, lanes;                                                                 \
        const T *g;                /* their upstream gradient, (bin, lane), zero-padded */    \
        T *img;                    /* the accumulator of image batch[k]: (H, W, lanes) */     \
        roicore_run *run;                                                                      \
    } roicore_bwd_task_##SFX;                                                                  \
                                                                                               \
    typedef struct {                                                                           \
        const roicore_tensor *grad_output, *grad_input;                                        \
        const int64_t *batch;                                                                  \
        const void *op;                                                                        \
        void (*add)(const void *op, roicore_bwd_task_##SFX *task);                             \
        int64_t k;                   /* with g_rows: the boxes, box k's gradient in row */    \
        const int64_t *g_rows;       /* g_rows[k] of grad_output; NULL: row k of g->n */      \
        int whole_rows;              /* tasks take whole rows of bins: an adjoint that adds */\
                                     /* a row's bins together (the Model Garden's) */         \
    } roicore_bwd_job_##SFX;                                                                   \
                                                                                               \
    int roicore_blocked_forward_##SFX(const roicore_fwd_job_##SFX *job, roicore_run *run,      \
                                      roicore_error *err);                                     \
    int roicore_blocked_backward_##SFX(const roicore_bwd_job_##SFX *job, roicore_run *run,     \
                                       roicore_error *err);

ROICORE_DECLARE_BLOCKED(float, f32)
ROICORE_DECLARE_BLOCKED(double, f64)

#endif
