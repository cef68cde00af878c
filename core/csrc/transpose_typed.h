/* roicore_transpose_<SFX> for element type T; simd.c includes this once per type with
 * T, VT (a vector of 8 T), MT (its shuffle-mask type) and SFX defined, or for doubles
 * VT4 and MT4 (vectors of 4) and TILE_4X4.
 *
 * Full 8 x 8 tiles are loaded as eight row vectors, transposed in registers with three
 * rounds of shuffles and stored as eight row vectors, so both sides move whole
 * cache-line pieces; edges fall back to scalar copies.  Doubles take an 8 x 8 tile as four
 * 4 x 4 tiles of 32-byte vectors: eight doubles are a 64-byte vector, which AVX2 holds in
 * two registers and shuffles across at several times the cost. */

#define ROW(r) ((r) < R ? (r) : R - 1)

/* Rows i .. i+7 and columns j .. j+7 (only the first `ncols` out rows are stored). */
ROICORE_INLINE void ROICORE_CAT(transpose_tile, SFX)(const T *restrict in, int64_t in_stride,
                                                     int64_t R, T *restrict out,
                                                     int64_t out_stride, int64_t i, int64_t j,
                                                     int ncols) {
#if defined(__GNUC__) && !defined(__clang__) && defined(TILE_4X4)
    typedef VT4 VTu __attribute__((aligned(sizeof(T))));
    for (int bi = 0; bi < 8; bi += 4)
        for (int bj = 0; bj < 8; bj += 4) {
            if (bj >= ncols) continue;  /* these out rows are not stored */
            VT4 r[4], t[4];
            for (int q = 0; q < 4; ++q) r[q] = *(const VTu *)(in + ROW(i + bi + q) * in_stride + j + bj);
            t[0] = __builtin_shuffle(r[0], r[1], (MT4){0, 4, 2, 6});
            t[1] = __builtin_shuffle(r[0], r[1], (MT4){1, 5, 3, 7});
            t[2] = __builtin_shuffle(r[2], r[3], (MT4){0, 4, 2, 6});
            t[3] = __builtin_shuffle(r[2], r[3], (MT4){1, 5, 3, 7});
            const VT4 o[4] = {__builtin_shuffle(t[0], t[2], (MT4){0, 1, 4, 5}),
                              __builtin_shuffle(t[1], t[3], (MT4){0, 1, 4, 5}),
                              __builtin_shuffle(t[0], t[2], (MT4){2, 3, 6, 7}),
                              __builtin_shuffle(t[1], t[3], (MT4){2, 3, 6, 7})};
            for (int q = 0; q < 4; ++q)
                if (bj + q < ncols) *(VTu *)(out + (j + bj + q) * out_stride + i + bi) = o[q];
        }
#elif defined(__GNUC__) && !defined(__clang__)
    typedef VT VTu __attribute__((aligned(sizeof(T))));
    VT r[8], t[8], u[8];
    for (int q = 0; q < 8; ++q) r[q] = *(const VTu *)(in + ROW(i + q) * in_stride + j);
    for (int q = 0; q < 8; q += 2) {
        t[q] = __builtin_shuffle(r[q], r[q + 1], (MT){0, 8, 1, 9, 4, 12, 5, 13});
        t[q + 1] = __builtin_shuffle(r[q], r[q + 1], (MT){2, 10, 3, 11, 6, 14, 7, 15});
    }
    for (int q = 0; q < 8; q += 4)
        for (int e = 0; e < 2; ++e) {
            u[q + 2 * e] = __builtin_shuffle(t[q + e], t[q + e + 2], (MT){0, 1, 8, 9, 4, 5, 12, 13});
            u[q + 2 * e + 1] =
                __builtin_shuffle(t[q + e], t[q + e + 2], (MT){2, 3, 10, 11, 6, 7, 14, 15});
        }
    for (int q = 0; q < 4; ++q) {
        VT lo = __builtin_shuffle(u[q], u[q + 4], (MT){0, 1, 2, 3, 8, 9, 10, 11});
        VT hi = __builtin_shuffle(u[q], u[q + 4], (MT){4, 5, 6, 7, 12, 13, 14, 15});
        if (q < ncols) *(VTu *)(out + (j + q) * out_stride + i) = lo;
        if (q + 4 < ncols) *(VTu *)(out + (j + q + 4) * out_stride + i) = hi;
    }
#else
    for (int64_t a = i; a < i + 8; ++a)
        for (int64_t b = j; b < j + ncols; ++b) out[b * out_stride + a] = in[ROW(a) * in_stride + b];
#endif
}

/* Column block by column block: each out row is written whole, in order.  Rows from
 * `tiled` on are left to the caller. */
ROICORE_CLONES static void ROICORE_CAT(transpose_by_columns, SFX)(
    const T *restrict in, int64_t in_stride, int64_t R, int64_t tiled, int64_t Cc,
    T *restrict out, int64_t out_stride, int flags) {
    int64_t j = 0;
    for (; j + 8 <= Cc; j += 8)
        for (int64_t i = 0; i < tiled; i += 8)
            ROICORE_CAT(transpose_tile, SFX)(in, in_stride, R, out, out_stride, i, j, 8);
    if (j < Cc && flags & ROICORE_WIDE_ROWS) {
        for (int64_t i = 0; i < tiled; i += 8)
            ROICORE_CAT(transpose_tile, SFX)(in, in_stride, R, out, out_stride, i, j, (int)(Cc - j));
        j = Cc;
    }
    for (; j < Cc; ++j)
        for (int64_t a = 0; a < tiled; ++a) out[j * out_stride + a] = in[ROW(a) * in_stride + j];
}

ROICORE_CLONES void ROICORE_CAT(roicore_transpose, SFX)(const T *restrict in, int64_t in_stride,
                                                        int64_t R, int64_t Cc, T *restrict out,
                                                        int64_t out_stride, int flags) {
    const int64_t rows = flags & ROICORE_PAD_ROWS ? (R + 7) / 8 * 8 : R;
    int64_t i = 0, j;
    /* PS-RoI's slabs (few padded rows) go by columns too: each out row written whole at
     * once instead of 8 values per pass over the columns */
    if (flags & ROICORE_IN_CACHE || (flags & ROICORE_PAD_ROWS && rows <= 32)) {
        i = rows / 8 * 8;
        ROICORE_CAT(transpose_by_columns, SFX)(in, in_stride, R, i, Cc, out, out_stride, flags);
    } else {
        for (; i + 8 <= rows; i += 8) {
            for (j = 0; j + 8 <= Cc; j += 8)
                ROICORE_CAT(transpose_tile, SFX)(in, in_stride, R, out, out_stride, i, j, 8);
            if (j < Cc && flags & ROICORE_WIDE_ROWS) {
                ROICORE_CAT(transpose_tile, SFX)(in, in_stride, R, out, out_stride, i, j,
                                                 (int)(Cc - j));
                j = Cc;
            }
            for (; j < Cc; ++j)
                for (int64_t a = i; a < i + 8; ++a) out[j * out_stride + a] = in[ROW(a) * in_stride + j];
        }
    }
    for (; i < R; ++i)  /* the last R % 8 rows, unless padded */
        for (j = 0; j < Cc; ++j) out[j * out_stride + i] = in[i * in_stride + j];
}

#undef ROW
