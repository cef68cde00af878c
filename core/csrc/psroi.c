/* Position-sensitive RoI average pooling, forward and backward, with R-FCN's bins or
 * torchvision's (psroi_typed.h, written once for both dtypes). */
#include "checks.h"
#include "simd.h"

/* The bin formulas: R-FCN's, and torchvision's, whose backward bins differ from its
 * forward ones. */
enum { PS_BINS_RFCN, PS_BINS_TORCHVISION_FORWARD, PS_BINS_TORCHVISION_BACKWARD };

/* A plan's sizes and its tables (box bin edges, group ranges) in one allocation; the box
 * tables are filled by the kernel's threads. */
typedef struct {
    int64_t K, PH, PW, GH, GW, D, S;
    int bins;
    int64_t *tables;
} plan_sizes;

#define ROICORE_TYPED "psroi_typed.h"
#include "dtypes.h"

/* The kernels take NCHW tensors only (in NHWC a cell's channels lie G apart in every row):
 * *planes is t itself, or for an NHWC t an NCHW tensor of its shape in fresh scratch,
 * which the caller fills or empties with roicore_relayout and frees. */
static int nchw_planes(const roicore_tensor *t, const char *what, roicore_tensor *planes,
                       roicore_error *err) {
    *planes = *t;
    if (t->layout != ROICORE_NHWC) return ROICORE_OK;
    planes->layout = ROICORE_NCHW;
    planes->data = roicore_scratch(roicore_tensor_bytes(t), what, err);
    return planes->data ? ROICORE_OK : err ? err->code : ROICORE_ERR_MEMORY;
}

/* The plan for the rules' formula (torchvision's takes the pooled size as its group). */
static int make_plan(const roicore_ps_roi_pool_rules *rules, int backward,
                     const roicore_tensor *map, const roicore_tensor *pooled,
                     const roicore_boxes *boxes, int64_t GH, int64_t GW, plan_sizes *ps,
                     roicore_error *err) {
    const int64_t K = boxes->k, PH = pooled->h, PW = pooled->w, D = pooled->c;
    const int torchvision = rules->formula == ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION;
    if (torchvision && (GH != PH || GW != PW))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "torchvision's PS-RoI formula takes the pooled size %lld x %lld as its "
                            "group size, got %lld x %lld", (long long)PH, (long long)PW,
                            (long long)GH, (long long)GW);
    const int rc = roicore_check_ps_channels(map, D, GH, GW, err);
    if (rc) return rc;
    const int64_t n = roicore_mul(K, 2 * (PH + PW));
    ps->tables = n < 0 ? NULL : (int64_t *)roicore_scratch((n + 2 * (GH + GW)) * 8, "PS-RoI bin tables", err);
    if (!ps->tables) return err ? err->code : ROICORE_ERR_MEMORY;
    ps->bins = !torchvision ? PS_BINS_RFCN
               : backward   ? PS_BINS_TORCHVISION_BACKWARD
                            : PS_BINS_TORCHVISION_FORWARD;
    ps->K = K;
    ps->PH = PH;
    ps->PW = PW;
    ps->GH = GH;
    ps->GW = GW;
    ps->D = D;
    ps->S = roicore_round_up(D, 8);
    return ROICORE_OK;
}

roicore_status roicore_ps_roi_pool_forward(const roicore_ps_roi_pool_rules *rules,
                                           const roicore_tensor *x, const roicore_boxes *boxes,
                                           double spatial_scale, int64_t group_h,
                                           int64_t group_w, const roicore_out_tensor *out_t,
                                           const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *out = roicore_out_view(out_t, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_ps_roi_pool_rules(rules, err)) ||
        (rc = roicore_check_forward(exec, x, boxes, out ? out->c : 0, out, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, x->dtype, &scale, err)) ||
        (rc = roicore_check_coord_range(boxes, x->dtype, scale, scale, err)))
        return (roicore_status)rc;
    plan_sizes ps;
    if ((rc = make_plan(rules, 0, x, out, boxes, group_h, group_w, &ps, err)))
        return (roicore_status)rc;
    if (boxes->k > 0 && out->c > 0) {
        roicore_run run;
        roicore_run_init(&run, exec);
        roicore_advise_output(ROICORE_WRITABLE(out), roicore_tensor_bytes(out));
        roicore_tensor planes;  /* an NHWC map is pooled from an NCHW copy */
        if ((rc = nchw_planes(x, "the map's NCHW copy", &planes, err))) {
            roicore_scratch_free(ps.tables);
            return (roicore_status)rc;
        }
        const int copy = x->layout == ROICORE_NHWC;
        if (copy) roicore_relayout(x, ROICORE_WRITABLE(&planes), run.n_threads);
        if (x->dtype == ROICORE_FLOAT32) {
            ps_plan_f32 c;
            init_plan_f32(&c, &ps, x, boxes->batch);
            rc = psroi_forward_f32(&c, &planes, boxes, (float)scale, out, &run, err);
        } else {
            ps_plan_f64 c;
            init_plan_f64(&c, &ps, x, boxes->batch);
            rc = psroi_forward_f64(&c, &planes, boxes, scale, out, &run, err);
        }
        if (copy) roicore_scratch_free(ROICORE_WRITABLE(&planes));
    }
    roicore_scratch_free(ps.tables);
    return (roicore_status)rc;
}

roicore_status roicore_ps_roi_pool_backward(const roicore_ps_roi_pool_rules *rules,
                                            const roicore_tensor *grad_output,
                                            const roicore_boxes *boxes, double spatial_scale,
                                            int64_t group_h, int64_t group_w,
                                            const roicore_out_tensor *grad_input,
                                            const roicore_exec *exec, roicore_error *err) {
    roicore_tensor view;
    const roicore_tensor *g = grad_output, *dx = roicore_out_view(grad_input, &view);
    int rc;
    double scale;
    if ((rc = roicore_check_ps_roi_pool_rules(rules, err)) ||
        (rc = roicore_check_backward(exec, dx, boxes, 1, g ? g->c : 0, g, err)) ||
        (rc = roicore_held_scale(spatial_scale, rules->scale_precision, dx->dtype, &scale, err)) ||
        (rc = roicore_check_coord_range(boxes, dx->dtype, scale, scale, err)))
        return (roicore_status)rc;
    plan_sizes ps;
    if ((rc = make_plan(rules, 1, dx, g, boxes, group_h, group_w, &ps, err)))
        return (roicore_status)rc;
    const int64_t dx_bytes = roicore_tensor_bytes(dx);
    if (boxes->k == 0 || g->c == 0) {
        if (dx_bytes > 0) memset(ROICORE_WRITABLE(dx), 0, (size_t)dx_bytes);  /* nothing to add */
    } else {
        roicore_run run;
        roicore_run_init(&run, exec);
        roicore_advise_output(ROICORE_WRITABLE(dx), dx_bytes);
        roicore_tensor planes;  /* an NHWC gradient is added up in NCHW planes, then moved */
        if ((rc = nchw_planes(dx, "the gradient's NCHW planes", &planes, err))) {
            roicore_scratch_free(ps.tables);
            return (roicore_status)rc;
        }
        if (dx->dtype == ROICORE_FLOAT32) {
            ps_plan_f32 c;
            init_plan_f32(&c, &ps, dx, boxes->batch);
            rc = psroi_backward_f32(&c, g, boxes, (float)scale, &planes, &run, err);
        } else {
            ps_plan_f64 c;
            init_plan_f64(&c, &ps, dx, boxes->batch);
            rc = psroi_backward_f64(&c, g, boxes, scale, &planes, &run, err);
        }
        if (dx->layout == ROICORE_NHWC) {
            if (!rc) roicore_relayout(&planes, ROICORE_WRITABLE(dx), run.n_threads);
            roicore_scratch_free(ROICORE_WRITABLE(&planes));
        }
    }
    roicore_scratch_free(ps.tables);
    return (roicore_status)rc;
}
