/* RoIAlign's sample positions and bilinear neighbours for element type T, shared by
 * RoIAlign (roi_align_typed.h) and position-sensitive RoIAlign (ps_roi_align_typed.h); the
 * including typed header defines TYPED. */

#define SAMPLES TYPED(align_samples)

/* One axis of a box: where it starts, its bin size and its samples per bin (which may be
 * <= 0 for an aligned box of size <= 0 with adaptive sampling).  With the Model Garden's
 * sampler `bin_size` is the box's whole size, which that sampler divides per sample. */
static void TYPED(align_axis)(T lo, T hi, T scale, T offset, int64_t P, int64_t sampling_ratio,
                              int min_size_one, int sampler, T *start, T *bin_size,
                              int64_t *grid) {
    const T a = lo * scale - offset;
    T size = hi * scale - offset - a;
    if (min_size_one && size < 1) size = 1;
    *bin_size = sampler == ROICORE_SAMPLER_MODEL_GARDEN ? size : size / (T)P;
    *grid = sampling_ratio > 0 ? sampling_ratio : (int64_t)ceil(size / (T)P);
    *start = a;
}

/* The samples of one axis, lo/hi indices and weights, for the `grid` samples of bin p. */
typedef struct {
    int64_t *lo, *hi;
    T *lw, *hw;
} SAMPLES;

/* The Model Garden's one sample of bin p of P, for a box from `start` of size `extent`:
 * at start + ((p + .5) * extent) / P, its neighbours floor(v) and floor(v) + 1 clamped into
 * [0, size - 1] and its weights 1 - l and l of l = v - low, unclamped. */
static void TYPED(garden_sample)(T start, T extent, int64_t p, int64_t P, int64_t size,
                                 SAMPLES s) {
    const T v = start + ((T)((double)p + .5) * extent) / (T)P;
    T low = _Generic(v, float: floorf, default: floor)(v);
    if (low < 0) low = 0;
    if (low > (T)(size - 1)) low = (T)(size - 1);
    s.lo[0] = (int64_t)low;
    s.hi[0] = roicore_min64(s.lo[0] + 1, size - 1);
    const T l = v - low;
    s.lw[0] = (T)1 - l;
    s.hw[0] = l;
}

static void TYPED(bin_samples)(T start, T bin_size, int64_t grid, int64_t p, int64_t P,
                               int64_t size, int sampler, SAMPLES s) {
    if (sampler == ROICORE_SAMPLER_MODEL_GARDEN) {  /* grid is 1 */
        TYPED(garden_sample)(start, bin_size, p, P, size, s);
        return;
    }
    for (int64_t i = 0; i < grid; ++i) {
        T v;
        if (sampler == ROICORE_SAMPLER_CAFFE2)
            v = start + (T)p * bin_size + (T)(i + .5) * bin_size / (T)grid;
        else
            v = start + bin_size * ((T)p + (T)(i + .5) / (T)grid);
        if (v < -1.0 || v > (T)size) {
            s.lo[i] = s.hi[i] = -1;
            s.lw[i] = s.hw[i] = 0;
            continue;
        }
        if (v <= 0) v = 0;
        int64_t low = (int64_t)v;
        if (low >= size - 1) {
            low = size - 1;
            s.hi[i] = low;
            v = (T)low;
        } else {
            s.hi[i] = low + 1;
        }
        s.lo[i] = low;
        if (sampler == ROICORE_SAMPLER_CAFFE2) {
            const T frac = v - (T)low;  /* weights 1 - l and l */
            s.lw[i] = (T)(1. - frac);
            s.hw[i] = frac;
        } else {
            const T frac = (T)s.hi[i] - v;  /* Paddle: weights (high - v) and 1 - that */
            s.lw[i] = frac;
            s.hw[i] = (T)1 - frac;
        }
    }
}

static int64_t TYPED(samples_bytes)(int64_t n) { return n * (16 + 2 * (int64_t)sizeof(T)); }

static SAMPLES TYPED(carve)(char *mem, int64_t n) {
    SAMPLES s;
    s.lo = (int64_t *)mem;
    s.hi = s.lo + n;
    s.lw = (T *)(s.hi + n);
    s.hw = s.lw + n;
    return s;
}
