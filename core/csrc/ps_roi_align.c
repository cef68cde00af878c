/* Position-sensitive RoIAlign (torchvision ps_roi_align, MXNet), forward and backward
 * (ps_roi_align_typed.h holds the arithmetic, written once for both dtypes). */
#include "checks.h"

#define ROICORE_TYPED "ps_roi_align_typed.h"
#include "dtypes.h"

static int check_args(const roicore_ps_roi_align_rules *rules, const roicore_tensor *map,
                      const roicore_tensor *pooled, const roicore_boxes *boxes,
                      double spatial_scale, int64_t sampling_ratio, double *scale,
                      roicore_error *err) {
    int rc;
    if (sampling_ratio > ROICORE_MAX_SAMPLING_RATIO)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "sampling_ratio must be <= %d (at most 2**20 samples per bin), got %lld",
                            ROICORE_MAX_SAMPLING_RATIO, (long long)sampling_ratio);
    if ((rc = roicore_check_ps_channels(map, pooled->c, pooled->h, pooled->w, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, map->dtype, scale, err)) ||
        (rc = roicore_check_coord_range(boxes, map->dtype, *scale, *scale, err)))
        return rc;
    return ROICORE_OK;
}

roicore_status roicore_ps_roi_align_forward(const roicore_ps_roi_align_rules *rules,
                                            const roicore_tensor *x, const roicore_boxes *boxes,
                                            double spatial_scale, int64_t sampling_ratio,
                                            const roicore_out_tensor *out_t,
                                            const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_ps_roi_align_rules(rules, err)) ||
        (rc = roicore_check_forward(exec, x, boxes, out ? out->c : 0, out, err)) ||
        (rc = check_args(rules, x, out, boxes, spatial_scale, sampling_ratio, &scale, err)))
        return (roicore_status)rc;
    if (boxes->k == 0 || out->c == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(out), roicore_tensor_bytes(out));
    if (x->dtype == ROICORE_FLOAT32)
        return (roicore_status)ps_align_forward_f32(rules, x, boxes, scale, sampling_ratio, out,
                                                    &run, err);
    return (roicore_status)ps_align_forward_f64(rules, x, boxes, scale, sampling_ratio, out, &run,
                                                err);
}

roicore_status roicore_ps_roi_align_backward(const roicore_ps_roi_align_rules *rules,
                                             const roicore_tensor *grad_output,
                                             const roicore_boxes *boxes, double spatial_scale,
                                             int64_t sampling_ratio,
                                             const roicore_out_tensor *grad_input,
                                             const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *g = grad_output, *dx = roicore_out_view(grad_input, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_ps_roi_align_rules(rules, err)) ||
        (rc = roicore_check_backward(exec, dx, boxes, 1, g ? g->c : 0, g, err)) ||
        (rc = check_args(rules, dx, g, boxes, spatial_scale, sampling_ratio, &scale, err)))
        return (roicore_status)rc;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(dx), roicore_tensor_bytes(dx));
    if (dx->dtype == ROICORE_FLOAT32)
        return (roicore_status)ps_align_backward_f32(rules, g, boxes, scale, sampling_ratio, dx,
                                                     &run, err);
    return (roicore_status)ps_align_backward_f64(rules, g, boxes, scale, sampling_ratio, dx, &run,
                                                 err);
}
