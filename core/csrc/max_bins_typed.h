/* Max pooling of a task's bins over one channel block; roi_pool_typed.h includes this once
 * per CPU variant with VARIANT (a name suffix), VARIANT_ATTR (its target attribute) and
 * VMAX(v, m) defined, besides the dtype's T, SFX, VT, MT (lane masks), IT (their element
 * type), UMT (unsigned masks), LANES, STORE_INDICES(int32 pointer, MT indices), and
 * MAX_OP (the operator's state) and FWD_TASK.
 *
 * Each bin's running maxima over the block's lanes are vectors held in registers for the
 * whole bin, updated per pixel with branch-free selects, so every lane follows exactly the
 * scalar rule of its convention:
 *   greater:  take v when v > m (first maximum wins, NaN never taken);
 *   std_max:  m = (v < m) ? m : v (a later equal value wins; NaN taken, then replaced);
 *   fmax:     take v when v > m, or when m is NaN and v is not (C fmax from NaN);
 * starting from the convention's initial value, or from the bin's first pixel.  Pixels are
 * visited row by row.  VMAX(v, m) is the max that `greater` computes (v > m ? v : m),
 * which is x86's MAXPS/MAXPD(v, m): one instruction where a compare and a select are two;
 * `std_max` is the same instruction with its operands swapped. */

#define VNAME(name) ROICORE_CAT(ROICORE_CAT(name, SFX), VARIANT)

/* lanes q0*LANES .. (q0+G)*LANES of one bin: rows [h0, h1), columns [w0, w1) */
VARIANT_ATTR ROICORE_INLINE void VNAME(max_group)(const T *img, int64_t W, int64_t lanes,
                                                  int64_t q0, int G, int64_t h0, int64_t h1,
                                                  int64_t w0, int64_t w1, int compare,
                                                  int first, VT init, T *restrict acc,
                                                  int32_t *restrict arg, UMT lane_step,
                                                  int32_t abase, int32_t astep) {
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    VT m[ROICORE_BLOCK_VECTORS];
    MT a[ROICORE_BLOCK_VECTORS];
    const T *start = img + (h0 * W + w0) * lanes + q0 * LANES;
    for (int q = 0; q < G; ++q) {
        m[q] = first ? *(const VTu *)(start + q * LANES) : init;
        a[q] = first ? (MT){0} + (IT)(h0 * W + w0) : (MT){0} - 1;
    }
    for (int64_t h = h0; h < h1; ++h)
        for (int64_t w = w0; w < w1; ++w) {
            const T *r = img + (h * W + w) * lanes + q0 * LANES;
            const MT vi = (MT){0} + (IT)(h * W + w);
            _Pragma("GCC unroll 8")
            for (int q = 0; q < G; ++q) {
                const VT v = *(const VTu *)(r + q * LANES);
                MT take;
                if (compare == ROICORE_COMPARE_GREATER) take = v > m[q];
                else if (compare == ROICORE_COMPARE_STD_MAX) take = ~(v < m[q]);
                else take = (v > m[q]) | ((m[q] != m[q]) & (v == v));
                if (arg) a[q] = (vi & take) | (a[q] & ~take);
                if (compare == ROICORE_COMPARE_GREATER) m[q] = VMAX(v, m[q]);
                else if (compare == ROICORE_COMPARE_STD_MAX) m[q] = VMAX(m[q], v);
                else m[q] = (VT)(((MT)v & take) | ((MT)m[q] & ~take));
            }
        }
    for (int q = 0; q < G; ++q) {
        *(VTu *)(acc + (q0 + q) * LANES) = m[q];
        if (arg) {  /* the plane's offset into x, for a global index (unsigned: padding
                       lanes may pass 2**31, and their indices are never written out) */
            const UMT off = lane_step + ((UIT)((q0 + q) * LANES) * (UIT)astep + (UIT)abase);
            const MT idx = (MT)((UMT)a[q] + (off & (UMT)(a[q] >= 0)));
            STORE_INDICES(arg + (q0 + q) * LANES, idx);
        }
    }
}

/* The task's bins [p0, p1) of box k: whole blocks (8 vectors) in groups held in registers
 * (all 8; 4 when indices take the other registers), the padded last block a vector at a
 * time.  Empty bins give 0 and -1.  The pending write-outs advance a step per row of bins. */
VARIANT_ATTR ROICORE_INLINE void VNAME(max_box)(const MAX_OP *op, FWD_TASK *t,
                                                int compare, int with_arg) {
    /* locals, not loads through op and t: the argmax stores (int32) may alias their int
     * fields as far as the compiler knows, which would reload them for every bin */
    const int64_t PW = op->PW, W = op->W, lanes = t->lanes;
    const int64_t *hs = op->hs + t->k * op->PH, *he = op->he + t->k * op->PH;
    const int64_t *ws = op->ws + t->k * PW, *we = op->we + t->k * PW;
    const VT init = (VT){0} + op->initial;
    const int first = op->first;
    const T *img = t->img;
    const int32_t abase = t->abase, astep = t->astep;
    UMT lane_step = {0};  /* lane i's offset step, i * astep */
    for (int i = 0; i < LANES; ++i) lane_step[i] = (UIT)i * (UIT)astep;
    const int G = with_arg ? ROICORE_BLOCK_VECTORS / 2 : ROICORE_BLOCK_VECTORS;
    for (int64_t ph = t->p0 / PW; ph <= (t->p1 - 1) / PW; ++ph) {
        roicore_pending_step_all(t->pend, t->npend);
        if (roicore_stopping(t->run)) break;
        int64_t pw0, pw1;
        roicore_task_row(t->p0, t->p1, PW, ph, &pw0, &pw1);
        for (int64_t pw = pw0; pw < pw1; ++pw) {
            T *acc = t->acc + (ph * PW + pw - t->p0) * lanes;
            int32_t *arg = with_arg ? t->arg + (ph * PW + pw - t->p0) * lanes : NULL;
            if ((he[ph] - hs[ph]) * (we[pw] - ws[pw]) >= ROICORE_HEAVY_BIN && roicore_stopping(t->run))
                break;
            if (he[ph] <= hs[ph] || we[pw] <= ws[pw]) {  /* empty bin: 0, nothing to route to */
                for (int64_t c = 0; c < lanes; ++c) acc[c] = 0;
                if (arg) for (int64_t c = 0; c < lanes; ++c) arg[c] = -1;
                continue;
            }
            if (lanes == ROICORE_BLOCK_LANES) {
                for (int q0 = 0; q0 < ROICORE_BLOCK_VECTORS; q0 += G)
                    VNAME(max_group)(img, W, lanes, q0, G, hs[ph], he[ph], ws[pw], we[pw],
                                     compare, first, init, acc, arg, lane_step, abase, astep);
            } else {
                for (int64_t q0 = 0; q0 < lanes / LANES; ++q0)
                    VNAME(max_group)(img, W, lanes, q0, 1, hs[ph], he[ph], ws[pw], we[pw],
                                     compare, first, init, acc, arg, lane_step, abase, astep);
            }
        }
    }
    roicore_pending_finish_all(t->pend, t->npend);
}

/* One copy of the box loop per rule and argmax-or-not, so that each inner loop holds only
 * its own rule. */
VARIANT_ATTR static void VNAME(max_task)(const void *opv, FWD_TASK *t) {
    const MAX_OP *op = (const MAX_OP *)opv;
    switch (op->compare * 2 + (t->arg != NULL)) {
    case 0: VNAME(max_box)(op, t, ROICORE_COMPARE_GREATER, 0); break;
    case 1: VNAME(max_box)(op, t, ROICORE_COMPARE_GREATER, 1); break;
    case 2: VNAME(max_box)(op, t, ROICORE_COMPARE_STD_MAX, 0); break;
    case 3: VNAME(max_box)(op, t, ROICORE_COMPARE_STD_MAX, 1); break;
    case 4: VNAME(max_box)(op, t, ROICORE_COMPARE_FMAX, 0); break;
    default: VNAME(max_box)(op, t, ROICORE_COMPARE_FMAX, 1); break;
    }
}

#undef VNAME
