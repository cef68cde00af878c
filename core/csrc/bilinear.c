/* Bilinear and nearest RoI pooling (crop_and_resize sampling), forward and backward, and
 * the bilinear crop's gradient with respect to the boxes (bilinear_typed.h holds the
 * arithmetic, written once for both dtypes). */
#include "blocked.h"
#include "checks.h"

#define ROICORE_TYPED "bilinear_typed.h"
#include "dtypes.h"

/* Normalised coordinates times (size - 1) must stay within 2**24 (and on a map of one row
 * or column, the coordinates themselves: (y2 - y1) must not overflow). */
static int check_crop_range(const roicore_boxes *boxes, const roicore_tensor *map,
                            roicore_error *err) {
    return roicore_check_coord_range(boxes, map->dtype, (double)roicore_max64(map->w - 1, 1),
                                     (double)roicore_max64(map->h - 1, 1), err);
}

static roicore_status crop_forward(int nearest, const roicore_bilinear_pool_rules *rules,
                                   const roicore_tensor *x, const roicore_boxes *boxes,
                                   double extrapolation_value, const roicore_out_tensor *out_t,
                                   const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    if ((rc = roicore_check_bilinear_pool_rules(rules, err)) ||
        (rc = roicore_check_forward(exec, x, boxes, x ? x->c : 0, out, err)) ||
        (rc = check_crop_range(boxes, x, err)))
        return (roicore_status)rc;
    if (boxes->k == 0 || x->c == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(out), roicore_tensor_bytes(out));
    if (x->dtype == ROICORE_FLOAT32)
        return (roicore_status)crop_run_f32(1, nearest, rules, x, out, boxes, extrapolation_value,
                                            &run, err);
    return (roicore_status)crop_run_f64(1, nearest, rules, x, out, boxes, extrapolation_value,
                                        &run, err);
}

static roicore_status crop_backward(int nearest, const roicore_bilinear_pool_rules *rules,
                                    const roicore_tensor *grad_output, const roicore_boxes *boxes,
                                    const roicore_out_tensor *grad_input,
                                    const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *g = grad_output, *dx = roicore_out_view(grad_input, &view);
    int rc;
    if ((rc = roicore_check_bilinear_pool_rules(rules, err)) ||
        (rc = roicore_check_backward(exec, dx, boxes, 1, dx ? dx->c : 0, g, err)) ||
        (rc = check_crop_range(boxes, dx, err)))
        return (roicore_status)rc;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(dx), roicore_tensor_bytes(dx));
    if (dx->dtype == ROICORE_FLOAT32)
        return (roicore_status)crop_run_f32(0, nearest, rules, dx, g, boxes, 0.0, &run, err);
    return (roicore_status)crop_run_f64(0, nearest, rules, dx, g, boxes, 0.0, &run, err);
}

roicore_status roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                                 const roicore_tensor *x,
                                                 const roicore_boxes *boxes,
                                                 double extrapolation_value,
                                                 const roicore_out_tensor *out,
                                                 const roicore_exec *exec, roicore_error *err) {
    return crop_forward(0, rules, x, boxes, extrapolation_value, out, exec, err);
}

roicore_status roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                                  const roicore_tensor *grad_output,
                                                  const roicore_boxes *boxes,
                                                  const roicore_out_tensor *grad_input,
                                                  const roicore_exec *exec, roicore_error *err) {
    return crop_backward(0, rules, grad_output, boxes, grad_input, exec, err);
}

roicore_status roicore_roi_pool_nearest_forward(const roicore_bilinear_pool_rules *rules,
                                                const roicore_tensor *x,
                                                const roicore_boxes *boxes,
                                                double extrapolation_value,
                                                const roicore_out_tensor *out,
                                                const roicore_exec *exec, roicore_error *err) {
    return crop_forward(1, rules, x, boxes, extrapolation_value, out, exec, err);
}

roicore_status roicore_roi_pool_nearest_backward(const roicore_bilinear_pool_rules *rules,
                                                 const roicore_tensor *grad_output,
                                                 const roicore_boxes *boxes,
                                                 const roicore_out_tensor *grad_input,
                                                 const roicore_exec *exec, roicore_error *err) {
    return crop_backward(1, rules, grad_output, boxes, grad_input, exec, err);
}

roicore_status roicore_roi_pool_bilinear_boxes_backward(const roicore_bilinear_pool_rules *rules,
                                                        const roicore_tensor *grad_output,
                                                        const roicore_tensor *x,
                                                        const roicore_boxes *boxes,
                                                        void *grad_boxes,
                                                        const roicore_exec *exec,
                                                        roicore_error *err) {
    const roicore_tensor *g = grad_output;
    int rc;
    if ((rc = roicore_check_bilinear_pool_rules(rules, err)) ||
        (rc = roicore_check_exec(exec, err)) ||
        (rc = roicore_check_map(x, "x", err)) || (rc = roicore_check_boxes(boxes, x, 1, err)) ||
        (rc = roicore_check_output(g, "grad_output", boxes->k, x->c, g ? g->h : 0,
                                   g ? g->w : 0, x->dtype, err)) ||
        (rc = roicore_check_pooled(g, "grad_output", err)) ||
        (rc = check_crop_range(boxes, x, err)))
        return (roicore_status)rc;
    if (rules->pin_last || rules->fused_lerp)
        return roicore_fail(err, ROICORE_ERR_UNSUPPORTED,
                            "the box gradient is TensorFlow's (CropAndResizeGradBoxes): it needs "
                            "rules with pin_last=0 and fused_lerp=0, got pin_last=%d "
                            "fused_lerp=%d", (int)rules->pin_last, (int)rules->fused_lerp);
    const int64_t bsz = (int64_t)roicore_dtype_size(x->dtype), bytes = 4 * boxes->k * bsz;
    if (boxes->k > 0 && !grad_boxes)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "grad_boxes is missing (NULL)");
    if ((uintptr_t)grad_boxes % (uintptr_t)bsz)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "grad_boxes must be aligned to its elements (%lld bytes), got "
                            "address %p", (long long)bsz, grad_boxes);
    if ((rc = roicore_check_disjoint(grad_boxes, bytes, "grad_boxes", x->data,
                                     roicore_tensor_bytes(x), "x", err)) ||
        (rc = roicore_check_disjoint(grad_boxes, bytes, "grad_boxes", g->data,
                                     roicore_tensor_bytes(g), "grad_output", err)) ||
        (rc = roicore_check_disjoint(grad_boxes, bytes, "grad_boxes", boxes->coords, bytes,
                                     "boxes", err)) ||
        (rc = roicore_check_disjoint(grad_boxes, bytes, "grad_boxes", boxes->batch,
                                     8 * boxes->k, "batch indices", err)))
        return (roicore_status)rc;
    if (boxes->k == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    if (x->dtype == ROICORE_FLOAT32)
        return (roicore_status)crop_boxes_grad_f32(g, x, boxes, (float *)grad_boxes, &run, err);
    return (roicore_status)crop_boxes_grad_f64(g, x, boxes, (double *)grad_boxes, &run, err);
}
