/* RoI max pooling (Fast R-CNN integer RoI), every framework's convention, forward and
 * backward (roi_pool_typed.h and max_bins_typed.h hold the arithmetic, written once for
 * both dtypes). */
#include <float.h>

#include "blocked.h"
#include "checks.h"

enum { BINS_FLOAT32 = 0, BINS_FLOAT64 = 1, BINS_EXACT = 2 };

#define ROICORE_TYPED "roi_pool_typed.h"
#include "dtypes.h"

/* Whether every index the rules encode for input x fits int32. */
static int fits_int32(const roicore_max_pool_rules *rules, const roicore_tensor *x) {
    const int64_t n = rules->argmax == ROICORE_ARGMAX_GLOBAL
                          ? roicore_mul(roicore_mul(x->n, x->c), roicore_mul(x->h, x->w))
                          : roicore_mul(x->h, x->w);
    return n >= 0 && n < INT32_MAX;
}

roicore_status roicore_max_pool_argmax_type(const roicore_max_pool_rules *rules,
                                            const roicore_tensor *x, roicore_index_type *type,
                                            roicore_error *err) {
    int rc;
    if ((rc = roicore_check_max_pool_rules(rules, err)) ||
        (rc = roicore_check_map(x, "x", err)))
        return (roicore_status)rc;
    if (!type) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "type is missing (NULL)");
    *type = rules->argmax_dtype == ROICORE_INT32 && fits_int32(rules, x) ? ROICORE_INT32
                                                                        : ROICORE_INT64;
    return ROICORE_OK;
}

/* What both directions need of an argmax: its type and, for int32, room for every index. */
static int check_argmax_type(const roicore_max_pool_rules *rules, const roicore_tensor *x,
                             roicore_index_type type, roicore_error *err) {
    if (type != ROICORE_INT32 && type != ROICORE_INT64)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "argmax type must be int32 or int64, got code %d",
                            (int)type);
    if (type == ROICORE_INT32 && !fits_int32(rules, x))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "an int32 argmax cannot hold the indices of an input of shape (%lld, "
                            "%lld, %lld, %lld) in %s encoding: use int64",
                            (long long)x->n, (long long)x->c, (long long)x->h, (long long)x->w,
                            rules->argmax == ROICORE_ARGMAX_GLOBAL ? "'global'" : "'plane'");
    if (roicore_mul(x->h, x->w) >= INT32_MAX)
        return roicore_fail(err, ROICORE_ERR_UNSUPPORTED,
                            "max pooling supports planes of fewer than 2**31 pixels, got %lld x %lld",
                            (long long)x->h, (long long)x->w);
    return ROICORE_OK;
}

roicore_status roicore_roi_pool_max_forward(const roicore_max_pool_rules *rules,
                                            const roicore_tensor *x, const roicore_boxes *boxes,
                                            double spatial_scale, const roicore_out_tensor *out_t,
                                            void *argmax, roicore_index_type argmax_type,
                                            const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_max_pool_rules(rules, err)) ||
        (rc = roicore_check_forward(exec, x, boxes, x ? x->c : 0, out, err)) ||
        (rc = check_argmax_type(rules, x, argmax ? argmax_type : ROICORE_INT64, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, x->dtype, &scale, err)) ||
        (rc = roicore_check_coord_range(boxes, x->dtype, scale, scale, err)))
        return (roicore_status)rc;
    const int64_t out_bytes = roicore_tensor_bytes(out), bsz = (int64_t)roicore_dtype_size(x->dtype);
    const int64_t arg_bytes = argmax ? out_bytes / bsz * (int64_t)roicore_index_size(argmax_type) : 0;
    if ((rc = roicore_check_disjoint(argmax, arg_bytes, "argmax", x->data, roicore_tensor_bytes(x), "x", err)) ||
        (rc = roicore_check_disjoint(argmax, arg_bytes, "argmax", boxes->coords, 4 * boxes->k * bsz, "boxes", err)) ||
        (rc = roicore_check_disjoint(argmax, arg_bytes, "argmax", boxes->batch, 8 * boxes->k, "batch indices", err)) ||
        (rc = roicore_check_disjoint(argmax, arg_bytes, "argmax", out->data, out_bytes, "out", err)))
        return (roicore_status)rc;
    if (boxes->k == 0 || x->c == 0) return ROICORE_OK;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(out), out_bytes);
    roicore_advise_output(argmax, arg_bytes);
    if (x->dtype == ROICORE_FLOAT32)
        return (roicore_status)max_forward_f32(rules, x, boxes, scale, out, argmax, argmax_type,
                                               &run, err);
    return (roicore_status)max_forward_f64(rules, x, boxes, scale, out, argmax, argmax_type, &run,
                                           err);
}

roicore_status roicore_roi_pool_max_backward(const roicore_max_pool_rules *rules,
                                             const roicore_tensor *grad_output,
                                             const void *argmax, roicore_index_type argmax_type,
                                             const roicore_boxes *boxes,
                                             const roicore_out_tensor *grad_input,
                                             const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *g = grad_output, *dx = roicore_out_view(grad_input, &view);
    int rc;
    if ((rc = roicore_check_max_pool_rules(rules, err)) ||
        (rc = roicore_check_backward(exec, dx, boxes, 0, dx ? dx->c : 0, g, err)) ||
        (rc = check_argmax_type(rules, dx, argmax_type, err)))
        return (roicore_status)rc;
    const int64_t g_bytes = roicore_tensor_bytes(g), dx_bytes = roicore_tensor_bytes(dx);
    const int64_t arg_bytes = g_bytes / (int64_t)roicore_dtype_size(g->dtype) *
                              (int64_t)roicore_index_size(argmax_type);
    if (arg_bytes > 0 && !argmax)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "argmax is missing (NULL)");
    if ((rc = roicore_check_disjoint(dx->data, dx_bytes, "grad_input", argmax, arg_bytes, "argmax", err)))
        return (roicore_status)rc;
    roicore_run run;
    roicore_run_init(&run, exec);
    roicore_advise_output(ROICORE_WRITABLE(dx), dx_bytes);
    const int global = rules->argmax == ROICORE_ARGMAX_GLOBAL;
    int64_t bad = 0;
    rc = dx->dtype == ROICORE_FLOAT32
             ? max_backward_f32(g, argmax, argmax_type, boxes->batch, global, dx, &run, &bad, err)
             : max_backward_f64(g, argmax, argmax_type, boxes->batch, global, dx, &run, &bad, err);
    if (rc) return (roicore_status)rc;
    if (bad > 0) {
        if (global)
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "argmax holds indices outside their own (box, channel) plane for "
                                "'global' encoding (flat indices into the input: -1, or in "
                                "[(n*C + c)*H*W, (n*C + c + 1)*H*W) for box image n, channel c) "
                                "and input shape (%lld, %lld, %lld, %lld); pass the argmax "
                                "returned by roi_pool with the same boxes and convention",
                                (long long)dx->n, (long long)dx->c, (long long)dx->h,
                                (long long)dx->w);
        return roicore_fail(err, ROICORE_ERR_VALUE,
                            "argmax holds indices outside [-1, %lld) for 'plane' encoding and "
                            "input shape (%lld, %lld, %lld, %lld); pass the argmax returned by "
                            "roi_pool with the same boxes and convention",
                            (long long)(dx->h * dx->w), (long long)dx->n, (long long)dx->c,
                            (long long)dx->h, (long long)dx->w);
    }
    return ROICORE_OK;
}
