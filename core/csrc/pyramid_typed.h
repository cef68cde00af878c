/* The pyramid level of a box for element type T; pyramid.c includes this once per dtype.
 * Every step is rounded to T, as the frameworks compute it on tensors of the boxes' dtype. */

#define TYPED(name) ROICORE_CAT(name, SFX)

/* The Model Garden's level of box b as a map index: w, h, s and the logarithms in float32
 * (the boxes cast as TensorFlow casts them), no epsilon; a level that is not finite (a
 * reversed or empty box) becomes the first, as casting it to int32 and clamping does. */
static int64_t TYPED(model_garden_level)(const T *b, double s0, int64_t k0, int64_t first,
                                         int64_t n_levels) {
    const float w = (float)(b[2] - b[0]), h = (float)(b[3] - b[1]);
    const float v = floorf(logf(sqrtf(h * w) / (float)s0) / logf(2.0f)) + (float)k0;
    if (!isfinite(v) || v <= (float)first) return 0;
    if (v >= (float)(first + n_levels - 1)) return n_levels - 1;
    return (int64_t)v - first;
}

/* Box b's map index (level - first), or -1 when it is not pooled. */
static int64_t TYPED(box_level)(const T *b, const roicore_level_rules *r, T s0, T k0, T eps,
                                int64_t first, int64_t n_levels) {
    T w = b[2] - b[0], h = b[3] - b[1], area;
    if (r->invalid == ROICORE_LEVEL_INVALID_ZERO && (b[2] < b[0] || b[3] < b[1])) {
        area = 0;  /* Paddle's BBoxArea of a reversed box */
    } else {
        if (r->pixel_offset) w = w + 1, h = h + 1;
        area = w * h;
    }
    if (r->invalid == ROICORE_LEVEL_INVALID_SKIP && !(area > 0)) return -1;
    if (n_levels == 1 && r->one_map == ROICORE_LEVEL_ONE_MAP_ALL) return 0;  /* no rule */
    const T s = _Generic(area, float: sqrtf, default: sqrt)(area);
    T v;
    if (r->epsilon_inside)
        v = _Generic(s, float: log2f, default: log2)(s / s0 + eps) + k0;
    else
        v = (k0 + _Generic(s, float: log2f, default: log2)(s / s0)) + eps;
    v = _Generic(v, float: floorf, default: floor)(v);
    if (isnan(v)) return -1;
    if (v <= (T)first) return 0;
    if (v >= (T)(first + n_levels - 1)) return n_levels - 1;
    return (int64_t)v - first;
}

/* Every box's level into levels[k]; masked boxes -1. */
static void TYPED(assign_levels)(const roicore_level_rules *r, const roicore_pyramid *p,
                                 const roicore_boxes *boxes, int64_t *levels) {
    const T s0 = (T)p->canonical_size, k0 = (T)p->canonical_level;
    const T eps = r->epsilon == ROICORE_LEVEL_EPSILON_1E8 ? (T)1e-8 : (T)1e-6;
    const T *c = (const T *)boxes->coords;
    const int garden = r->formula == ROICORE_LEVEL_FORMULA_MODEL_GARDEN;
    for (int64_t k = 0; k < boxes->k; ++k)
        levels[k] = boxes->masked && boxes->batch[k] < 0 ? -1
                    : garden ? TYPED(model_garden_level)(c + 4 * k, p->canonical_size,
                                                         p->canonical_level, p->first_level,
                                                         p->n_levels)
                             : TYPED(box_level)(c + 4 * k, r, s0, k0, eps, p->first_level,
                                                p->n_levels);
}

#undef TYPED
