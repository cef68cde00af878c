/* Bilinear RoI pooling (crop_and_resize sampling), forward and backward
 * (bilinear_typed.h holds the arithmetic, written once for both dtypes). */
#include "blocked.h"
#include "checks.h"

#define T float
#define SFX f32
#define VT roicore_vf32
#define LANES 8
#include "bilinear_typed.h"
#undef T
#undef SFX
#undef VT
#undef LANES

#define T double
#define SFX f64
#define VT roicore_vf64
#define LANES 4
#include "bilinear_typed.h"
#undef T
#undef SFX
#undef VT
#undef LANES

/* Normalised coordinates times (size - 1) must stay within 2**24 (and on a map of one row
 * or column, the coordinates themselves: (y2 - y1) must not overflow). */
static int check_crop_range(const roicore_boxes *boxes, const roicore_tensor *map,
                            roicore_error *err) {
    return roicore_check_coord_range(boxes, map->dtype, (double)roicore_max64(map->w - 1, 1),
                                     (double)roicore_max64(map->h - 1, 1), err);
}

int roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                      const roicore_tensor *x, const roicore_boxes *boxes,
                                      double extrapolation_value, const roicore_tensor *out,
                                      const roicore_exec *exec, roicore_error *err) {
    int rc;
    if ((rc = roicore_check_bilinear_pool_rules(rules, err)) ||
        (rc = roicore_check_forward(x, boxes, x ? x->c : 0, out, err)) ||
        (rc = check_crop_range(boxes, x, err)))
        return rc;
    if (boxes->k == 0 || x->c == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    if (x->dtype == ROICORE_FLOAT32)
        return crop_run_f32(1, rules, x, out, boxes, extrapolation_value, &run, err);
    return crop_run_f64(1, rules, x, out, boxes, extrapolation_value, &run, err);
}

int roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                       const roicore_tensor *grad_output,
                                       const roicore_boxes *boxes,
                                       const roicore_tensor *grad_input,
                                       const roicore_exec *exec, roicore_error *err) {
    const roicore_tensor *g = grad_output, *dx = grad_input;
    int rc;
    if ((rc = roicore_check_bilinear_pool_rules(rules, err)) ||
        (rc = roicore_check_backward(dx, boxes, 1, dx ? dx->c : 0, g, err)) ||
        (rc = check_crop_range(boxes, dx, err)))
        return rc;
    roicore_run run;
    roicore_run_init(&run, exec);
    if (dx->dtype == ROICORE_FLOAT32)
        return crop_run_f32(0, rules, dx, g, boxes, 0.0, &run, err);
    return crop_run_f64(0, rules, dx, g, boxes, 0.0, &run, err);
}
