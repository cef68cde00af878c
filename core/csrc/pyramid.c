/* RoIAlign from a feature pyramid: each box is assigned a level (pyramid_typed.h), the boxes
 * of each level are pooled by the RoIAlign kernels straight into their rows of the one
 * output, and the backward sends each box's gradient to its own level's map. */
#include <stdio.h>

#include "roi_align.h"
#include "checks.h"

#define ROICORE_TYPED "pyramid_typed.h"
#include "dtypes.h"

static int check_pyramid(const roicore_pyramid *p, roicore_error *err) {
    if (!p) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "pyramid is missing (NULL)");
    if (p->reserved[0] || p->reserved[1] || p->reserved[2] || p->reserved[3])
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "pyramid has nonzero reserved fields: zero-initialise roicore_pyramid "
                            "and set only the fields you use");
    if (p->n_levels < 1 || p->n_levels > ROICORE_MAX_LEVELS)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "a pyramid must have 1 to %d levels, got %lld",
                            ROICORE_MAX_LEVELS, (long long)p->n_levels);
    if (p->first_level < -1024 || p->first_level > 1024)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "first_level must be in [-1024, 1024], got %lld",
                            (long long)p->first_level);
    if (p->canonical_level < -1024 || p->canonical_level > 1024)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "canonical_level must be in [-1024, 1024], got %lld",
                            (long long)p->canonical_level);
    if (!(p->canonical_size > 0 && isfinite(p->canonical_size)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "canonical_size must be positive and finite, got %g", p->canonical_size);
    if (!p->spatial_scales)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "pyramid spatial_scales are missing (NULL)");
    return ROICORE_OK;
}

/* Maps (or gradients) of one pyramid: each a feature map, all of map 0's N, C and dtype. */
static int check_maps(const roicore_tensor *maps, int64_t n, const char *what,
                      roicore_error *err) {
    char name[32];
    if (!maps) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s are missing (NULL)", what);
    for (int64_t i = 0; i < n; ++i) {
        const roicore_tensor *m = &maps[i];
        snprintf(name, sizeof name, "%s[%lld]", what, (long long)i);
        int rc = roicore_check_map(m, name, err);
        if (rc) return rc;
        if (m->n != maps[0].n || m->c != maps[0].c || m->dtype != maps[0].dtype)
            return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                                "every level must have %s[0]'s batch, channels and dtype "
                                "(N=%lld, C=%lld, %s), got N=%lld, C=%lld, %s in %s", what,
                                (long long)maps[0].n, (long long)maps[0].c,
                                maps[0].dtype == ROICORE_FLOAT32 ? "float32" : "float64",
                                (long long)m->n, (long long)m->c,
                                m->dtype == ROICORE_FLOAT32 ? "float32" : "float64", name);
    }
    return ROICORE_OK;
}

/* The boxes of each level, grouped: level l's are order[start[l] .. start[l + 1]), in box
 * order, with their coordinates and images gathered, and each level's scale as held. */
typedef struct {
    int64_t *order, *batch, start[ROICORE_MAX_LEVELS + 1];
    void *coords;
    double scale[ROICORE_MAX_LEVELS];
    void *owned;
} levels_plan;

/* Level l's spatial scale as the rules hold it in `dtype`; errors name spatial_scales[l]. */
static int level_scale(const roicore_roi_align_rules *rules, const roicore_pyramid *p, int64_t l,
                       roicore_dtype dtype, double *held, roicore_error *err) {
    roicore_error mine;
    const int rc = roicore_held_scale(p->spatial_scales[l], rules->scale_precision, dtype, held,
                                      &mine);
    if (rc)
        return roicore_fail(err, rc, "spatial_scales[%lld]: %s", (long long)l, mine.message);
    return ROICORE_OK;
}

/* The canonical size as the boxes' dtype holds it: positive and finite there too. */
static int check_canonical_size(const roicore_pyramid *p, roicore_dtype dtype,
                                roicore_error *err) {
    const double held = dtype == ROICORE_FLOAT32 ? (double)(float)p->canonical_size
                                                 : p->canonical_size;
    if (!(held > 0 && isfinite(held)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "canonical_size=%g becomes %g when held in the boxes' dtype; it must "
                            "stay positive and finite", p->canonical_size, held);
    return ROICORE_OK;
}

/* Level l's boxes as boxes of their own. */
static roicore_boxes level_boxes(const levels_plan *plan, int64_t l, roicore_dtype dtype) {
    roicore_boxes b;
    memset(&b, 0, sizeof b);
    const int64_t first = plan->start[l];
    b.coords = (const char *)plan->coords + first * 4 * (int64_t)roicore_dtype_size(dtype);
    b.batch = plan->batch + first;
    b.k = plan->start[l + 1] - first;
    return b;
}

/* Levels, grouped boxes and held scales for a forward (or backward) into PH x PW bins; every
 * box is checked at its level (coordinates, sampling grid) before the call writes. */
static int plan_levels(const roicore_roi_align_rules *rules, const roicore_level_rules *lr,
                       const roicore_pyramid *p, roicore_dtype dtype, const roicore_boxes *boxes,
                       int forward, int64_t PH, int64_t PW, int64_t sampling_ratio, int aligned,
                       levels_plan *plan, roicore_error *err) {
    const int64_t K = boxes->k, L = p->n_levels, bsz = (int64_t)roicore_dtype_size(dtype);
    int rc;
    memset(plan, 0, sizeof *plan);
    if ((rc = check_canonical_size(p, dtype, err))) return rc;
    for (int64_t l = 0; l < L; ++l)
        if ((rc = level_scale(rules, p, l, dtype, &plan->scale[l], err))) return rc;
    char *mem = (char *)roicore_scratch(roicore_mul(K, 24 + 4 * bsz) + 64, "the pyramid's levels", err);
    if (!mem) return err ? err->code : ROICORE_ERR_MEMORY;
    plan->owned = mem;
    int64_t *levels = (int64_t *)mem;
    plan->order = levels + K;
    plan->batch = plan->order + K;
    plan->coords = plan->batch + K;
    if (dtype == ROICORE_FLOAT32)
        assign_levels_f32(lr, p, boxes, levels);
    else
        assign_levels_f64(lr, p, boxes, levels);
    int64_t count[ROICORE_MAX_LEVELS] = {0};
    for (int64_t k = 0; k < K; ++k) {
        if (levels[k] < 0) continue;
        count[levels[k]] += 1;
        /* each box's coordinates within range at its own level's scale */
        const double s = plan->scale[levels[k]];
        for (int j = 0; j < 4; ++j) {
            const double c = dtype == ROICORE_FLOAT32 ? (double)((const float *)boxes->coords)[4 * k + j]
                                                      : ((const double *)boxes->coords)[4 * k + j];
            if (!(fabs(c) * s <= ROICORE_MAX_SCALED_COORD))
                return roicore_fail_at(err, ROICORE_ERR_VALUE, "boxes", k,
                                       "boxes[%lld] coordinate %g lies %.3g feature-map pixels from "
                                       "the origin at its level (map %lld); at most 2**24 is "
                                       "supported", (long long)k, c, fabs(c) * s,
                                       (long long)levels[k]);
        }
    }
    for (int64_t l = 0; l < L; ++l) plan->start[l + 1] = plan->start[l] + count[l];
    int64_t next[ROICORE_MAX_LEVELS];
    memcpy(next, plan->start, sizeof next);
    for (int64_t k = 0; k < K; ++k) {
        if (levels[k] < 0) continue;
        const int64_t i = next[levels[k]]++;
        plan->order[i] = k;
        plan->batch[i] = boxes->batch[k];
        memcpy((char *)plan->coords + i * 4 * bsz, (const char *)boxes->coords + k * 4 * bsz,
               (size_t)(4 * bsz));
    }
    for (int64_t l = 0; l < L; ++l) {
        const roicore_boxes b = level_boxes(plan, l, dtype);
        if ((rc = roicore_align_check_grids(forward, rules, &b, dtype, plan->scale[l],
                                            sampling_ratio, aligned, PH, PW,
                                            plan->order + plan->start[l], err)))
            return rc;
    }
    return ROICORE_OK;
}

static int check_common(const roicore_roi_align_rules *rules, const roicore_level_rules *lr,
                        const roicore_pyramid *p, int64_t sampling_ratio, int aligned,
                        roicore_error *err) {
    int rc;
    if ((rc = roicore_check_roi_align_rules(rules, err)) ||
        (rc = roicore_check_level_rules(lr, err)) || (rc = check_pyramid(p, err)) ||
        (rc = roicore_check_align_args(rules, sampling_ratio, aligned, err)))
        return rc;
    for (int64_t l = 0; l < p->n_levels; ++l) {
        double held;
        if ((rc = level_scale(rules, p, l, ROICORE_FLOAT64, &held, err))) return rc;
    }
    return ROICORE_OK;
}

roicore_status roicore_pyramid_levels(const roicore_level_rules *level_rules,
                                      const roicore_pyramid *pyramid, roicore_dtype dtype,
                                      const roicore_boxes *boxes, int64_t *levels,
                                      roicore_error *err) {
    int rc;
    if ((rc = roicore_check_level_rules(level_rules, err)) || (rc = check_pyramid(pyramid, err)))
        return (roicore_status)rc;
    if (dtype != ROICORE_FLOAT32 && dtype != ROICORE_FLOAT64)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "dtype must be float32 (0) or float64 (1), got %d", (int)dtype);
    /* boxes on a map of any batch: only their own consistency */
    roicore_tensor any;
    memset(&any, 0, sizeof any);
    any.dtype = dtype;
    any.n = INT64_MAX;
    if ((rc = roicore_check_boxes(boxes, &any, 1, err))) return (roicore_status)rc;
    if (boxes->k > 0 && !levels)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "levels is missing (NULL)");
    if ((uintptr_t)levels % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "levels must be aligned to 8 bytes, got address %p", (void *)levels);
    if ((rc = check_canonical_size(pyramid, dtype, err)) ||
        (rc = roicore_check_disjoint(levels, 8 * boxes->k, "levels", boxes->coords,
                                     4 * boxes->k * (int64_t)roicore_dtype_size(dtype), "boxes",
                                     err)) ||
        (rc = roicore_check_disjoint(levels, 8 * boxes->k, "levels", boxes->batch,
                                     8 * boxes->k, "batch indices", err)))
        return (roicore_status)rc;
    if (dtype == ROICORE_FLOAT32)
        assign_levels_f32(level_rules, pyramid, boxes, levels);
    else
        assign_levels_f64(level_rules, pyramid, boxes, levels);
    return ROICORE_OK;
}

roicore_status roicore_pyramid_roi_align_forward(const roicore_roi_align_rules *rules,
                                                 const roicore_level_rules *level_rules,
                                                 const roicore_pyramid *pyramid,
                                                 const roicore_tensor *maps,
                                                 const roicore_boxes *boxes,
                                                 int64_t sampling_ratio, int aligned,
                                                 const roicore_out_tensor *out_t,
                                                 const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    if ((rc = check_common(rules, level_rules, pyramid, sampling_ratio, aligned, err)) ||
        (rc = check_maps(maps, pyramid->n_levels, "maps", err)))
        return (roicore_status)rc;
    char name[32];
    for (int64_t l = 0; l < pyramid->n_levels; ++l) {
        snprintf(name, sizeof name, "maps[%lld]", (long long)l);
        if ((out && (rc = roicore_check_disjoint(out->data, roicore_tensor_bytes(out), "out",
                                                 maps[l].data, roicore_tensor_bytes(&maps[l]),
                                                 name, err))) ||
            (rc = roicore_check_forward(exec, &maps[l], boxes, maps[0].c, out, err)))
            return (roicore_status)rc;
    }
    const roicore_dtype dtype = maps[0].dtype;
    levels_plan plan;
    if ((rc = plan_levels(rules, level_rules, pyramid, dtype, boxes, 1, out->h, out->w,
                          sampling_ratio, aligned, &plan, err))) {
        roicore_scratch_free(plan.owned);
        return (roicore_status)rc;
    }
    /* the rows of boxes no level pools are 0; every other row is written by its level */
    const int64_t row_bytes = roicore_tensor_bytes(out) / roicore_max64(out->n, 1);
    int64_t *levels = (int64_t *)plan.owned;
    for (int64_t k = 0; k < boxes->k && row_bytes > 0; ++k)
        if (levels[k] < 0) memset((char *)ROICORE_WRITABLE(out) + k * row_bytes, 0, (size_t)row_bytes);
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(out), roicore_tensor_bytes(out));
    for (int64_t l = 0; l < pyramid->n_levels && !rc && maps[0].c > 0; ++l) {
        const roicore_boxes b = level_boxes(&plan, l, dtype);
        if (b.k > 0)
            rc = roicore_align_rows(1, rules, &maps[l], out, &b, plan.scale[l], sampling_ratio,
                                    aligned, plan.order + plan.start[l], &run, err);
    }
    roicore_scratch_free(plan.owned);
    return (roicore_status)rc;
}

roicore_status roicore_pyramid_roi_align_backward(const roicore_roi_align_rules *rules,
                                                  const roicore_level_rules *level_rules,
                                                  const roicore_pyramid *pyramid,
                                                  const roicore_tensor *grad_output,
                                                  const roicore_boxes *boxes,
                                                  int64_t sampling_ratio, int aligned,
                                                  const roicore_out_tensor *grad_maps,
                                                  const roicore_exec *exec, roicore_error *err) {
    int rc;
    if ((rc = check_common(rules, level_rules, pyramid, sampling_ratio, aligned, err)))
        return (roicore_status)rc;
    if (!grad_maps) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "grad_maps are missing (NULL)");
    const int64_t L = pyramid->n_levels;
    roicore_tensor dx[ROICORE_MAX_LEVELS];
    for (int64_t l = 0; l < L; ++l) roicore_out_view(&grad_maps[l], &dx[l]);
    if ((rc = check_maps(dx, L, "grad_maps", err))) return (roicore_status)rc;
    char name[32];
    for (int64_t l = 0; l < L; ++l) {
        snprintf(name, sizeof name, "grad_maps[%lld]", (long long)l);
        if ((grad_output &&
             (rc = roicore_check_disjoint(dx[l].data, roicore_tensor_bytes(&dx[l]), name,
                                          grad_output->data, roicore_tensor_bytes(grad_output),
                                          "grad_output", err))) ||
            (rc = roicore_check_backward(exec, &dx[l], boxes, 1, dx[0].c, grad_output, err)))
            return (roicore_status)rc;
        for (int64_t j = 0; j < l; ++j)
            if ((rc = roicore_check_disjoint(dx[l].data, roicore_tensor_bytes(&dx[l]), "grad_maps",
                                             dx[j].data, roicore_tensor_bytes(&dx[j]),
                                             "another of grad_maps", err)))
                return (roicore_status)rc;
    }
    const roicore_dtype dtype = dx[0].dtype;
    levels_plan plan;
    if ((rc = plan_levels(rules, level_rules, pyramid, dtype, boxes, 0, grad_output->h,
                          grad_output->w, sampling_ratio, aligned, &plan, err))) {
        roicore_scratch_free(plan.owned);
        return (roicore_status)rc;
    }
    roicore_run run;
    roicore_run_init(&run, exec);
    for (int64_t l = 0; l < L && !rc; ++l) {
        const roicore_boxes b = level_boxes(&plan, l, dtype);
        roicore_advise_output(ROICORE_WRITABLE(&dx[l]), roicore_tensor_bytes(&dx[l]));
        rc = roicore_align_rows(0, rules, &dx[l], grad_output, &b, plan.scale[l], sampling_ratio,
                                aligned, plan.order + plan.start[l], &run, err);
    }
    roicore_scratch_free(plan.owned);
    return (roicore_status)rc;
}
