/* The channel-blocked skeleton (see blocked.h) for element type T; blocked.c includes this
 * once per dtype with T, SFX and LANES (values per vector) defined. */

#define FWD_TASK ROICORE_CAT(roicore_fwd_task, SFX)
#define FWD_JOB ROICORE_CAT(roicore_fwd_job, SFX)
#define BWD_TASK ROICORE_CAT(roicore_bwd_task, SFX)
#define BWD_JOB ROICORE_CAT(roicore_bwd_job, SFX)
#define TRANSPOSE ROICORE_CAT(roicore_transpose, SFX)
/* Bins per task: a box's (bin, lane) results take at most this much scratch, so a task's
 * buffers stay in L2 however large the pooled size. */
#define CHUNK_BYTES (64 << 10)

/* Lanes per pixel of a block of nb channels out of a block size of `block`: whole blocks as
 * they are, the last rounded up to whole 8 x 8 transpose tiles (and so whole vectors). */
static inline int64_t ROICORE_CAT(block_lanes, SFX)(int64_t nb, int64_t block) {
    return nb == block ? block : roicore_round_up(nb, 8);
}

/* Image n's channels c0 .. c0 + nb of x as an (H*W, lanes) array, padding lanes repeating
 * channel c0 + nb - 1: the pixels of rows [r0, r1) x columns [k0, k1) only. */
static void ROICORE_CAT(pack_rect, SFX)(const roicore_tensor *x, int64_t n, int64_t c0,
                                        int64_t nb, int64_t lanes, int64_t r0, int64_t r1,
                                        int64_t k0, int64_t k1, T *dst) {
    const int64_t C = x->c, W = x->w, HW = x->h * x->w;
    const T *data = (const T *)x->data;
    const int whole_rows = k0 == 0 && k1 == W;  /* one run of pixels */
    for (int64_t h = r0; h < r1; h = whole_rows ? r1 : h + 1) {
        const int64_t p = h * W + k0, count = whole_rows ? (r1 - r0) * W : k1 - k0;
        if (x->layout == ROICORE_NCHW)
            TRANSPOSE(data + (n * C + c0) * HW + p, HW, nb, count, dst + p * lanes, lanes,
                      lanes > nb ? ROICORE_PAD_ROWS : 0);
        else
            roicore_copy_rows(data + (n * HW + p) * C + c0, C, count, nb, dst + p * lanes, lanes,
                              lanes, sizeof(T));
    }
}

/* ... the rectangle the region gives for image n (only its marked tiles, with `tiles`), and
 * pixel (0, 0), which RoIAlign's samples outside the map read (with weight 0). */
static void ROICORE_CAT(pack_block, SFX)(const roicore_tensor *x, const int64_t *region,
                                         const uint8_t *tiles, int64_t n, int64_t c0,
                                         int64_t nb, int64_t lanes, T *dst) {
    const int64_t H = x->h, W = x->w;
    const int64_t *r = region ? region + 4 * n : NULL;
    const int64_t r0 = r ? r[0] : 0, r1 = r ? r[1] : H, k0 = r ? r[2] : 0, k1 = r ? r[3] : W;
    if (r1 > r0 && k1 > k0 && r && tiles) {  /* runs of marked tiles, a band of rows at a time */
        int64_t th, tw;
        roicore_tiles_shape(H, W, &th, &tw);
        const uint8_t *t = tiles + n * th * tw;
        const int64_t last = (k1 - 1) / ROICORE_TILE;
        for (int64_t ty = r0 / ROICORE_TILE; ty <= (r1 - 1) / ROICORE_TILE; ++ty)
            for (int64_t tx = k0 / ROICORE_TILE; tx <= last;) {
                if (!t[ty * tw + tx]) {
                    ++tx;
                    continue;
                }
                int64_t end = tx;
                while (end <= last && t[ty * tw + end]) ++end;
                ROICORE_CAT(pack_rect, SFX)(
                    x, n, c0, nb, lanes, roicore_max64(ty * ROICORE_TILE, r0),
                    roicore_min64((ty + 1) * ROICORE_TILE, r1),
                    roicore_max64(tx * ROICORE_TILE, k0), roicore_min64(end * ROICORE_TILE, k1),
                    dst);
                tx = end;
            }
    } else if (r1 > r0 && k1 > k0) {
        ROICORE_CAT(pack_rect, SFX)(x, n, c0, nb, lanes, r0, r1, k0, k1, dst);
    }
    if (!(r0 == 0 && k0 == 0 && r1 > 0 && k1 > 0))
        ROICORE_CAT(pack_rect, SFX)(x, n, c0, nb, lanes, 0, 1, 0, 1, dst);
}

/* int32 argmax rows (`lanes` apart) of nbins bins and nb channels, to `isz`-byte indices in
 * a compact (nbins, nb) array, the global offset added to int64 ones (int32 ones get it in
 * the kernel). */
static void ROICORE_CAT(argmax_rows, SFX)(const int32_t *arg, int64_t lanes, int64_t nbins,
                                          int64_t nb, void *dst, roicore_index_type type,
                                          int global64, int64_t base, int64_t step) {
    for (int64_t p = 0; p < nbins; ++p) {
        const int32_t *a = arg + p * lanes;
        if (type == ROICORE_INT32) {
            memcpy((int32_t *)dst + p * nb, a, (size_t)nb * sizeof(int32_t));
            continue;
        }
        int64_t *d = (int64_t *)dst + p * nb;
        for (int64_t c = 0; c < nb; ++c)
            d[c] = a[c] >= 0 && global64 ? a[c] + base + c * step : a[c];
    }
}

int ROICORE_CAT(roicore_blocked_forward, SFX)(const FWD_JOB *job, roicore_run *run,
                                              roicore_error *err) {
    const roicore_tensor *x = job->x, *out = job->out;
    const int64_t N = x->n, C = x->c, HW = x->h * x->w;
    const int64_t K = job->out_rows ? job->k : out->n, PW = out->w, P = out->h * out->w;
    if (K == 0 || C == 0) return ROICORE_OK;
    const int nhwc = out->layout == ROICORE_NHWC;
    const int rows = job->rows && nhwc && x->layout == ROICORE_NHWC;
    const int64_t B = rows ? roicore_round_up(C, 8) : ROICORE_BLOCK_LANES;
    const int64_t n_cb = (C + B - 1) / B, last_c0 = (n_cb - 1) * B;
    const int64_t Cp = last_c0 + ROICORE_CAT(block_lanes, SFX)(C - last_c0, B);
    const int in_place = rows && Cp == C;  /* the map's pixels are the block's: no copy */
    const int64_t chunk = roicore_clamp64(CHUNK_BYTES / (B * (int64_t)sizeof(T)), 1, P);
    const int64_t n_chunks = (P + chunk - 1) / chunk, per_box = n_chunks;
    const int64_t n_tasks = n_cb * K * n_chunks;
    const int64_t steps = (chunk + PW - 1) / PW;  /* rows of bins in a chunk */
    const int stream = roicore_tensor_bytes(out) >= ROICORE_STREAM_BYTES;
    const int want_arg = job->argmax != NULL;
    const roicore_index_type itype = job->argmax_type;
    const int64_t isz = (int64_t)roicore_index_size(itype);
    const int in_kernel = want_arg && job->global_argmax && itype == ROICORE_INT32;
    const int global64 = want_arg && job->global_argmax && itype == ROICORE_INT64;
    const int nt = run->n_threads;

    /* one allocation: x in blocks, then per thread two (bin, lane) buffers, the int32
     * argmax and its staged copy, and the pending write-outs; then the counters */
    const int64_t xb_size =
        in_place ? 0 : roicore_round_up(roicore_mul(roicore_mul(N, Cp), HW), 64 / sizeof(T));
    const int64_t thread_bytes = roicore_round_up(
        chunk * B * (2 * (int64_t)sizeof(T) + 4 + isz) + 2 * (int64_t)sizeof(roicore_pending),
        ROICORE_LINE);
    const int64_t n_counters = 2 + n_cb;
    if (xb_size < 0) return roicore_fail(err, ROICORE_ERR_MEMORY, "x is too large to copy");
    const int64_t total = xb_size * (int64_t)sizeof(T) + nt * thread_bytes + n_counters * ROICORE_LINE;
    char *scratch = (char *)roicore_scratch(total, "the blocked copy of x", err);
    if (!scratch) return err ? err->code : ROICORE_ERR_MEMORY;
    const T *xb = in_place ? (const T *)x->data : (const T *)scratch;
    char *threads = scratch + xb_size * (int64_t)sizeof(T);
    int64_t *counters = (int64_t *)(threads + nt * thread_bytes);
    memset(counters, 0, (size_t)(n_counters * ROICORE_LINE));
    int64_t *next_task = counters, *next_pack = counters + ROICORE_COUNTER_STRIDE;
    int64_t *packed = counters + 2 * ROICORE_COUNTER_STRIDE;

#pragma omp parallel num_threads(nt)
    {
        char *mine = threads + omp_get_thread_num() * thread_bytes;
        T *buf[2] = {(T *)mine, (T *)mine + chunk * B};
        int32_t *arg = (int32_t *)(buf[1] + chunk * B);
        void *arg_staged = arg + chunk * B;
        roicore_pending *pend = (roicore_pending *)((char *)arg_staged + chunk * B * isz);
        int npend = 0, cur = 0;

        for (int64_t t = roicore_take(next_pack); !in_place && t < N * n_cb;
             t = roicore_take(next_pack)) {
            if (roicore_stopping(run)) break;
            const int64_t cb = t / N, n = t % N, c0 = cb * B, nb = roicore_min64(B, C - c0);
            ROICORE_CAT(pack_block, SFX)(x, job->region, job->tiles, n, c0, nb,
                                         ROICORE_CAT(block_lanes, SFX)(nb, B),
                                         (T *)scratch + n * Cp * HW + c0 * HW);
            roicore_done(packed + cb * ROICORE_COUNTER_STRIDE);
        }

        int64_t ready = -1;
        for (int64_t task = roicore_take(next_task); task < n_tasks; task = roicore_take(next_task)) {
            const int64_t cb = task / (K * per_box), r = task % (K * per_box);
            const int64_t k = r / per_box, p0 = (r % per_box) * chunk, p1 = roicore_min64(P, p0 + chunk);
            const int64_t c0 = cb * B, nb = roicore_min64(B, C - c0), nbins = p1 - p0;
            const int64_t lanes = ROICORE_CAT(block_lanes, SFX)(nb, B), b = job->batch[k];
            if (cb != ready && !in_place) {
                if (roicore_await(packed + cb * ROICORE_COUNTER_STRIDE, N, run)) break;
                ready = cb;
            }
            if (roicore_stopping(run)) break;
            T *acc = buf[nhwc ? cur : 0];
            if (b < 0) {  /* masked box */
                roicore_pending_finish_all(pend, npend);
                memset(acc, 0, (size_t)(nbins * lanes) * sizeof(T));
                if (want_arg) for (int64_t i = 0; i < nbins * lanes; ++i) arg[i] = -1;
            } else {
                const int64_t base = (b * C + c0) * HW;  /* the block's first plane in x */
                FWD_TASK t = {k, p0, p1, c0, nb, lanes, xb + b * Cp * HW + c0 * HW, acc,
                              want_arg ? arg : NULL, in_kernel ? (int32_t)base : 0,
                              in_kernel ? (int32_t)HW : 0, pend, npend, run};
                job->pool(job->op, &t);  /* streams, then finishes, the previous write-outs */
            }
            npend = 0;
            const int64_t base = b < 0 ? 0 : (b * C + c0) * HW;
            const int64_t row = job->out_rows ? job->out_rows[k] : k;  /* box k's in out */
            T *data = (T *)ROICORE_WRITABLE(out);
            if (!nhwc) {
                T *dst = data + (row * C + c0) * P + p0;
                if (stream) {
                    TRANSPOSE(acc, lanes, nbins, nb, buf[1], nbins, 0);
                    roicore_pending_set(&pend[npend++], dst, P * (int64_t)sizeof(T), buf[1],
                                        nbins * (int64_t)sizeof(T), nb,
                                        nbins * (int64_t)sizeof(T), steps);
                } else {
                    TRANSPOSE(acc, lanes, nbins, nb, dst, P, 0);
                }
            } else {
                T *dst = data + (row * P + p0) * C + c0;
                if (stream)
                    roicore_pending_set(&pend[npend++], dst, C * (int64_t)sizeof(T), acc,
                                        lanes * (int64_t)sizeof(T), nbins,
                                        nb * (int64_t)sizeof(T), steps);
                else
                    roicore_copy_rows(acc, lanes, nbins, nb, dst, C, nb, sizeof(T));
                cur ^= 1;
            }
            if (want_arg) {
                char *am = (char *)job->argmax;
                if (!nhwc) {
                    char *dst = am + ((row * C + c0) * P + p0) * isz;
                    void *to = stream ? arg_staged : (void *)dst;
                    const int64_t stride = stream ? nbins : P;
                    if (itype == ROICORE_INT32)
                        roicore_transpose_i32(arg, lanes, nbins, nb, (int32_t *)to, stride, 0);
                    else
                        roicore_transpose_i32_i64(arg, lanes, nbins, nb, (int64_t *)to, stride);
                    if (global64 && b >= 0)
                        roicore_offset_indices_i64((int64_t *)to, nb, nbins, stride, base, HW);
                    if (stream)
                        roicore_pending_set(&pend[npend++], dst, P * isz, arg_staged, nbins * isz,
                                            nb, nbins * isz, steps);
                } else {
                    char *dst = am + ((row * P + p0) * C + c0) * isz;
                    ROICORE_CAT(argmax_rows, SFX)(arg, lanes, nbins, nb, arg_staged, itype,
                                                  global64 && b >= 0, base, HW);
                    if (stream)
                        roicore_pending_set(&pend[npend++], dst, C * isz, arg_staged, nb * isz,
                                            nbins, nb * isz, steps);
                    else
                        roicore_copy_rows(arg_staged, nb, nbins, nb, dst, C, nb, (size_t)isz);
                }
            }
        }
        roicore_pending_finish_all(pend, npend);
        roicore_stream_fence();
    }
    roicore_scratch_free(scratch);
    return roicore_run_status(run, err);
}

int ROICORE_CAT(roicore_blocked_backward, SFX)(const BWD_JOB *job, roicore_run *run,
                                               roicore_error *err) {
    const roicore_tensor *g = job->grad_output, *dx = job->grad_input;
    const int64_t N = dx->n, C = dx->c, HW = dx->h * dx->w;
    const int64_t K = job->g_rows ? job->k : g->n, P = g->h * g->w;
    T *dxdata = (T *)ROICORE_WRITABLE(dx);
    const T *gdata = (const T *)g->data;
    if (K == 0 || C == 0) {  /* nothing to add (and dx may hold no elements, and no data) */
        if (roicore_tensor_bytes(dx) > 0) memset(dxdata, 0, (size_t)roicore_tensor_bytes(dx));
        return ROICORE_OK;
    }
    const int nt = run->n_threads;
    /* a task per block and image; narrower blocks when that makes fewer tasks than threads,
       so each thread has one */
    int64_t B = ROICORE_BLOCK_LANES;
    if ((C + B - 1) / B * N < nt)
        B = roicore_clamp64(roicore_round_up((C * N + nt - 1) / nt, 8), 8, ROICORE_BLOCK_LANES);
    const int64_t n_cb = (C + B - 1) / B, n_tasks = n_cb * N;
    int64_t chunk = roicore_clamp64(CHUNK_BYTES / (B * (int64_t)sizeof(T)), 1, P);
    if (job->whole_rows && g->w > 0) chunk = roicore_max64(g->w, chunk - chunk % g->w);
    const int64_t thread_bytes = roicore_round_up(
        roicore_mul(HW + chunk, B * (int64_t)sizeof(T)), ROICORE_LINE);
    if (thread_bytes < 0) return roicore_fail(err, ROICORE_ERR_MEMORY, "grad_input is too large");
    char *scratch = (char *)roicore_scratch(nt * thread_bytes + ROICORE_LINE,
                                            "the gradient's per-thread blocks", err);
    if (!scratch) return err ? err->code : ROICORE_ERR_MEMORY;
    int64_t *next = (int64_t *)(scratch + nt * thread_bytes);
    *next = 0;
    const int nchw_g = g->layout == ROICORE_NCHW, nchw_dx = dx->layout == ROICORE_NCHW;

#pragma omp parallel num_threads(nt)
    {
        T *acc = (T *)(scratch + omp_get_thread_num() * thread_bytes);
        for (int64_t task = roicore_take(next); task < n_tasks; task = roicore_take(next)) {
            const int64_t cb = task / N, n = task % N;
            const int64_t c0 = cb * B, nb = roicore_min64(B, C - c0);
            const int64_t lanes = ROICORE_CAT(block_lanes, SFX)(nb, B);
            T *gb = acc + HW * lanes;
            memset(acc, 0, (size_t)((HW + chunk) * lanes) * sizeof(T));  /* gb's padding stays 0 */
            for (int64_t k = 0; k < K; ++k) {
                if (job->batch[k] != n) continue;  /* another image's, or masked (-1) */
                const int64_t row = job->g_rows ? job->g_rows[k] : k;  /* box k's in g */
                for (int64_t p0 = 0; p0 < P; p0 += chunk) {
                    if (roicore_stopping(run)) break;
                    const int64_t nbins = roicore_min64(chunk, P - p0);
                    if (nchw_g)
                        TRANSPOSE(gdata + (row * C + c0) * P + p0, P, nb, nbins, gb, lanes, 0);
                    else
                        roicore_copy_rows(gdata + (row * P + p0) * C + c0, C, nbins, nb, gb, lanes, nb,
                                          sizeof(T));
                    BWD_TASK t = {k, p0, p0 + nbins, c0, nb, lanes, gb, acc, run};
                    job->add(job->op, &t);
                }
            }
            if (nchw_dx)
                TRANSPOSE(acc, lanes, HW, nb, dxdata + (n * C + c0) * HW, HW, ROICORE_IN_CACHE);
            else
                roicore_copy_rows(acc, lanes, HW, nb, dxdata + n * HW * C + c0, C, nb, sizeof(T));
        }
    }
    roicore_scratch_free(scratch);
    return roicore_run_status(run, err);
}

#undef FWD_TASK
#undef FWD_JOB
#undef BWD_TASK
#undef BWD_JOB
#undef TRANSPOSE
#undef CHUNK_BYTES
