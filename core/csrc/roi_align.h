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

/* sampling_ratio within the limit and aligned 0 or 1. */
int roicore_check_align_args(int64_t sampling_ratio, int aligned, roicore_error *err);

#endif
