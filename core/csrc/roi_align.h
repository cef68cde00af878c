/* RoIAlign's kernels for the operators built on them (roi_align.c, pyramid.c).  Internal. */
#ifndef ROICORE_ROI_ALIGN_H
#define ROICORE_ROI_ALIGN_H

#include "common.h"

/* RoIAlign's forward (`map` x into `pooled` out) or backward (`pooled` the upstream gradient
 * into `map` dx, every element written) over checked arguments, `scale` as held.  With
 * `rows`, box k's output or upstream gradient is row rows[k] of `pooled` (a pyramid level's
 * boxes among all), else row k. */
int roicore_align_rows(int forward, const roicore_roi_align_rules *rules,
                       const roicore_tensor *map, const roicore_tensor *pooled,
                       const roicore_boxes *boxes, double scale, int64_t sampling_ratio,
                       int aligned, const int64_t *rows, roicore_run *run, roicore_error *err);

/* Whether a call widens boxes to at least one pixel: unaligned boxes always, and Paddle's
 * backward aligned ones too. */
static inline int roicore_align_min_size_one(int forward, const roicore_roi_align_rules *rules,
                                             int aligned) {
    if (rules->sampler == ROICORE_SAMPLER_MODEL_GARDEN) return 0;  /* boxes as they are */
    return !aligned || (!forward && rules->backward_min_size_always);
}

/* Every box's sampling grid within the limits (roicore_check_grid), for a call that pools
 * into PH x PW bins at `scale` as held: lets a caller that runs several calls refuse a box
 * before any of them writes.  Errors name box rows[k] (or k). */
int roicore_align_check_grids(int forward, const roicore_roi_align_rules *rules,
                              const roicore_boxes *boxes, roicore_dtype dtype, double scale,
                              int64_t sampling_ratio, int aligned, int64_t PH, int64_t PW,
                              const int64_t *rows, roicore_error *err);

/* sampling_ratio within the limit and aligned 0 or 1 (1 and 0 with the Model Garden's
 * sampler). */
int roicore_check_align_args(const roicore_roi_align_rules *rules, int64_t sampling_ratio,
                             int aligned, roicore_error *err);

#endif
