/* RoIAlign (Mask R-CNN), forward and backward (roi_align_typed.h holds the arithmetic,
 * written once for both dtypes). */
#include "roi_align.h"
#include "blocked.h"
#include "checks.h"

#define ROICORE_TYPED "roi_align_typed.h"
#include "dtypes.h"

int roicore_check_align_args(const roicore_roi_align_rules *rules, int64_t sampling_ratio,
                             int aligned, roicore_error *err) {
    if (rules->sampler == ROICORE_SAMPLER_MODEL_GARDEN && (sampling_ratio != 1 || aligned))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "the Model Garden's sampler takes one sample per bin of an unaligned "
                            "box: sampling_ratio must be 1 and aligned 0, got %lld and %d",
                            (long long)sampling_ratio, aligned);
    if (sampling_ratio > ROICORE_MAX_SAMPLING_RATIO)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "sampling_ratio must be <= %d (at most 2**20 samples per bin), got %lld",
                            ROICORE_MAX_SAMPLING_RATIO, (long long)sampling_ratio);
    if (aligned != 0 && aligned != 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "aligned must be 0 or 1, got %d", aligned);
    return ROICORE_OK;
}

roicore_status roicore_roi_align_forward(const roicore_roi_align_rules *rules,
                                         const roicore_tensor *x, const roicore_boxes *boxes,
                                         double spatial_scale, int64_t sampling_ratio,
                                         int aligned, const roicore_out_tensor *out_t,
                                         const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_roi_align_rules(rules, err)) ||
        (rc = roicore_check_forward(exec, x, boxes, x ? x->c : 0, out, err)) ||
        (rc = roicore_check_align_args(rules, sampling_ratio, aligned, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, x->dtype, &scale, err)) ||
        (rc = roicore_check_coord_range(boxes, x->dtype, scale, scale, err)))
        return (roicore_status)rc;
    if (boxes->k == 0 || x->c == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(out), roicore_tensor_bytes(out));
    return (roicore_status)roicore_align_rows(1, rules, x, out, boxes, scale, sampling_ratio,
                                              aligned, NULL, &run, err);
}

roicore_status roicore_roi_align_backward(const roicore_roi_align_rules *rules,
                                          const roicore_tensor *grad_output,
                                          const roicore_boxes *boxes, double spatial_scale,
                                          int64_t sampling_ratio, int aligned,
                                          const roicore_out_tensor *grad_input,
                                          const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *g = grad_output, *dx = roicore_out_view(grad_input, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_roi_align_rules(rules, err)) ||
        (rc = roicore_check_backward(exec, dx, boxes, 1, dx ? dx->c : 0, g, err)) ||
        (rc = roicore_check_align_args(rules, sampling_ratio, aligned, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, dx->dtype, &scale, err)) ||
        (rc = roicore_check_coord_range(boxes, dx->dtype, scale, scale, err)))
        return (roicore_status)rc;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(dx), roicore_tensor_bytes(dx));
    return (roicore_status)roicore_align_rows(0, rules, dx, g, boxes, scale, sampling_ratio,
                                              aligned, NULL, &run, err);
}

/* The one dtype dispatch of the RoIAlign kernels (roi_align.h). */
int roicore_align_rows(int forward, const roicore_roi_align_rules *rules,
                       const roicore_tensor *map, const roicore_tensor *pooled,
                       const roicore_boxes *boxes, double scale, int64_t sampling_ratio,
                       int aligned, const int64_t *rows, roicore_run *run, roicore_error *err) {
    if (map->dtype == ROICORE_FLOAT32)
        return align_run_f32(forward, rules, map, pooled, boxes, scale, sampling_ratio, aligned,
                             rows, run, err);
    return align_run_f64(forward, rules, map, pooled, boxes, scale, sampling_ratio, aligned, rows,
                         run, err);
}

int roicore_align_check_grids(int forward, const roicore_roi_align_rules *rules,
                              const roicore_boxes *boxes, roicore_dtype dtype, double scale,
                              int64_t sampling_ratio, int aligned, int64_t PH, int64_t PW,
                              const int64_t *rows, roicore_error *err) {
    const int min_size_one = roicore_align_min_size_one(forward, rules, aligned);
    if (dtype == ROICORE_FLOAT32)
        return align_check_grids_f32(boxes, scale, sampling_ratio, aligned, min_size_one, PH, PW,
                                     rows, err);
    return align_check_grids_f64(boxes, scale, sampling_ratio, aligned, min_size_one, PH, PW,
                                 rows, err);
}
