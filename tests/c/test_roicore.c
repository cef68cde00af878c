/* The C API on its own, without Python: every operator on the frameworks' documented worked
 * examples (golden numbers), results independent of the thread count, and bad input
 * answered with the documented error codes.  Built and run by .ci/run, once plainly and
 * once under AddressSanitizer and UndefinedBehaviorSanitizer (make -C tests/c). */
#define _POSIX_C_SOURCE 200809L  /* pthreads, nanosleep */
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "roicore.h"

static int passed, failed;

#define CHECK(cond, ...)                                                           \
    do {                                                                           \
        if (cond) {                                                                \
            ++passed;                                                              \
        } else {                                                                   \
            ++failed;                                                              \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                            \
            printf(__VA_ARGS__);                                                   \
            printf("\n");                                                          \
        }                                                                          \
    } while (0)

/* every value of got within rtol of want (0: exactly) */
static void check_values(const char *what, const double *got, const double *want, int n,
                         double rtol) {
    for (int i = 0; i < n; ++i) {
        double tol = rtol * fabs(want[i]);
        CHECK(fabs(got[i] - want[i]) <= tol, "%s[%d] = %.9g, want %.9g", what, i, got[i], want[i]);
    }
}

/* ------------------------------------------------------------------------ arrays */

typedef struct {
    roicore_dtype dtype;
    void *data;
    int64_t n;
} array;

static array new_array(roicore_dtype dtype, int64_t n) {
    array a = {dtype, calloc((size_t)(n > 0 ? n : 1), dtype == ROICORE_FLOAT32 ? 4 : 8), n};
    return a;
}
static void set(array a, int64_t i, double v) {
    if (a.dtype == ROICORE_FLOAT32) ((float *)a.data)[i] = (float)v;
    else ((double *)a.data)[i] = v;
}
static double get(array a, int64_t i) {
    return a.dtype == ROICORE_FLOAT32 ? (double)((float *)a.data)[i] : ((double *)a.data)[i];
}
static void to_doubles(array a, double *out) {
    for (int64_t i = 0; i < a.n; ++i) out[i] = get(a, i);
}
static roicore_tensor tensor(array a, int64_t n, int64_t c, int64_t h, int64_t w) {
    roicore_tensor t = {.data = a.data, .dtype = a.dtype, .layout = ROICORE_NCHW,
                        .n = n, .c = c, .h = h, .w = w};
    return t;
}
/* struct literals of an input and an output tensor, every other field zero */
#define IN(data_, dt_, L_, n_, c_, h_, w_)                                                      \
    ((roicore_tensor){.data = (data_), .dtype = (dt_), .layout = (L_), .n = (n_), .c = (c_),    \
                      .h = (h_), .w = (w_)})
#define OUT(data_, dt_, L_, n_, c_, h_, w_)                                                     \
    ((roicore_out_tensor){.data = (data_), .dtype = (dt_), .layout = (L_), .n = (n_), .c = (c_), \
                          .h = (h_), .w = (w_)})
/* the same array as an output */
static roicore_out_tensor out_tensor(array a, int64_t n, int64_t c, int64_t h, int64_t w) {
    roicore_out_tensor t = {.data = a.data, .dtype = a.dtype, .layout = ROICORE_NCHW,
                            .n = n, .c = c, .h = h, .w = w};
    return t;
}
/* k boxes from rows {x1, y1, x2, y2} and their images */
static roicore_boxes boxes_of(array coords, const int64_t *batch, int64_t k) {
    roicore_boxes b = {.coords = coords.data, .batch = batch, .k = k};
    return b;
}
static array coords_of(roicore_dtype dtype, const double *rows, int64_t k) {
    array a = new_array(dtype, 4 * k);
    for (int64_t i = 0; i < 4 * k; ++i) set(a, i, rows[i]);
    return a;
}
static array arange(roicore_dtype dtype, int64_t n, double start, double step) {
    array a = new_array(dtype, n);
    for (int64_t i = 0; i < n; ++i) set(a, i, start + (double)i * step);
    return a;
}

static const roicore_exec one_thread = {.n_threads = 1};
static const roicore_exec three_threads = {.n_threads = 3};

/* the conventions of roicore.core.conventions, by name */
#define MAX_RULES(bins, scale, initial_, compare_, argmax_, argmax_dtype_, product)          \
    {.bin_arithmetic = ROICORE_BIN_ARITHMETIC_##bins, .scale_precision = ROICORE_PRECISION_##scale, \
     .initial = ROICORE_INITIAL_##initial_, .compare = ROICORE_COMPARE_##compare_,           \
     .argmax = ROICORE_ARGMAX_##argmax_, .argmax_dtype = ROICORE_##argmax_dtype_,            \
     .scale_product = ROICORE_PRECISION_##product}
static const roicore_max_pool_rules MXNET_MAX =
    MAX_RULES(INPUT, FLOAT32, NEG_FLT_MAX, GREATER, GLOBAL, INT32, INPUT);
static const roicore_max_pool_rules PADDLE_MAX =
    MAX_RULES(FLOAT32, FLOAT32, LOWEST, GREATER, PLANE, INT64, INPUT);
static const roicore_max_pool_rules TORCHVISION_MAX =
    MAX_RULES(INPUT, INPUT, NEG_FLT_MAX, GREATER, PLANE, INT32, INPUT);
static const roicore_max_pool_rules OPENVINO_MAX =
    MAX_RULES(INPUT, FLOAT32, LOWEST, STD_MAX, PLANE, INT32, INPUT);
static const roicore_max_pool_rules OPENVINO_CPU_MAX =
    MAX_RULES(EXACT, FLOAT32, FIRST, GREATER, PLANE, INT32, FLOAT64);
static const roicore_max_pool_rules *ALL_MAX[] = {&MXNET_MAX, &PADDLE_MAX, &TORCHVISION_MAX,
                                                  &OPENVINO_MAX, &OPENVINO_CPU_MAX};
static const char *ALL_MAX_NAMES[] = {"mxnet", "paddle", "torchvision", "openvino", "openvino_cpu"};
static const roicore_bilinear_pool_rules OPENVINO_BILINEAR = {.pin_last = 1};
static const roicore_bilinear_pool_rules TF_BILINEAR = {.pin_last = 0};
static const roicore_ps_roi_pool_rules MXNET_PSROI = {
    .scale_precision = ROICORE_PRECISION_FLOAT32, .formula = ROICORE_PS_ROI_POOL_FORMULA_RFCN};
static const roicore_ps_roi_pool_rules TORCHVISION_PSROI = {
    .scale_precision = ROICORE_PRECISION_INPUT, .formula = ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION};
static const roicore_ps_roi_align_rules TORCHVISION_PS_ALIGN = {
    .scale_precision = ROICORE_PRECISION_INPUT};
static const roicore_ps_roi_align_rules MXNET_PS_ALIGN = {
    .scale_precision = ROICORE_PRECISION_FLOAT32, .box = ROICORE_PS_ALIGN_BOX_UNALIGNED,
    .outside = ROICORE_OUTSIDE_FIRST, .empty_grid = ROICORE_PS_EMPTY_GRID_ZERO};
static const roicore_roi_align_rules MXNET_ALIGN = {
    .sampler = ROICORE_SAMPLER_CAFFE2, .scale_precision = ROICORE_PRECISION_FLOAT32,
    .empty_grid = ROICORE_EMPTY_GRID_ZERO, .backward_min_size_always = 0};
static const roicore_roi_align_rules PADDLE_ALIGN = {
    .sampler = ROICORE_SAMPLER_PADDLE, .scale_precision = ROICORE_PRECISION_FLOAT32,
    .empty_grid = ROICORE_EMPTY_GRID_NAN, .backward_min_size_always = 1};

static const roicore_dtype DTYPES[] = {ROICORE_FLOAT32, ROICORE_FLOAT64};

/* ------------------------------------------------------------------------ golden examples */

/* MXNet ROIPooling docstring: arange(48) as 8 x 6, box [0, 0, 4, 4], 2 x 2 bins; the same
 * numbers for every convention, and the argmax (value == position) too. */
static void mxnet_docstring(void) {
    static const double box[] = {0, 0, 4, 4};
    static const double want1[] = {14, 16, 26, 28}, want07[] = {7, 9, 19, 21};
    const int64_t batch[] = {0};
    for (int d = 0; d < 2; ++d)
        for (int r = 0; r < 5; ++r)
            for (int s = 0; s < 2; ++s) {
                array x = arange(DTYPES[d], 48, 0, 1), c = coords_of(DTYPES[d], box, 1);
                array out = new_array(DTYPES[d], 4);
                int64_t argmax[4];
                roicore_tensor tx = tensor(x, 1, 1, 8, 6);
                roicore_out_tensor to = out_tensor(out, 1, 1, 2, 2);
                roicore_boxes b = boxes_of(c, batch, 1);
                roicore_error err;
                int rc = roicore_roi_pool_max_forward(ALL_MAX[r], &tx, &b, s ? 0.7 : 1.0, &to,
                                                      argmax, ROICORE_INT64, &one_thread, &err);
                CHECK(rc == ROICORE_OK, "%s: %s", ALL_MAX_NAMES[r], err.message);
                double got[4], arg[4];
                to_doubles(out, got);
                for (int i = 0; i < 4; ++i) arg[i] = (double)argmax[i];
                check_values(ALL_MAX_NAMES[r], got, s ? want07 : want1, 4, 0);
                check_values("argmax", arg, s ? want07 : want1, 4, 0);
                free(x.data); free(c.data); free(out.data);
            }
}

/* ... and its gradient: weights 1, 2, 3, 4 land on (2, 2), (2, 4), (4, 2), (4, 4). */
static void mxnet_backward_routing(void) {
    const int32_t argmax[] = {14, 16, 26, 28};
    const int64_t batch[] = {0};
    array g = arange(ROICORE_FLOAT32, 4, 1, 1), dx = new_array(ROICORE_FLOAT32, 48);
    set(dx, 0, 99);  /* every element is written */
    roicore_tensor tg = tensor(g, 1, 1, 2, 2);
    roicore_out_tensor tdx = out_tensor(dx, 1, 1, 8, 6);
    roicore_boxes b = {.batch = batch, .k = 1};
    roicore_error err;
    int rc = roicore_roi_pool_max_backward(&MXNET_MAX, &tg, argmax, ROICORE_INT32, &b, &tdx,
                                           &one_thread, &err);
    CHECK(rc == ROICORE_OK, "%s", err.message);
    for (int i = 0; i < 48; ++i) {
        double want = i == 14 ? 1 : i == 16 ? 2 : i == 26 ? 3 : i == 28 ? 4 : 0;
        CHECK(get(dx, i) == want, "dx[%d] = %g, want %g", i, get(dx, i), want);
    }
    free(g.data); free(dx.data);
}

/* Paddle roi_pool docstring: 1..16 as 4 x 4, boxes [1, 1, 2, 2] and [1.5, 1.5, 3, 3], 1 x 1
 * bins: 11 and 16, plane argmax 10 and 15.  And deepsense-ai's notebook example. */
static void paddle_and_deepsense(void) {
    static const double boxes[] = {1, 1, 2, 2, 1.5, 1.5, 3, 3}, want[] = {11, 16}, want_arg[] = {10, 15};
    const int64_t batch[] = {0, 0, 0};
    for (int r = 0; r < 5; ++r) {
        array x = arange(ROICORE_FLOAT32, 16, 1, 1), c = coords_of(ROICORE_FLOAT32, boxes, 2);
        array out = new_array(ROICORE_FLOAT32, 2);
        int64_t argmax[2];
        roicore_tensor tx = tensor(x, 1, 1, 4, 4);
        roicore_out_tensor to = out_tensor(out, 2, 1, 1, 1);
        roicore_boxes b = boxes_of(c, batch, 2);
        roicore_error err;
        CHECK(roicore_roi_pool_max_forward(ALL_MAX[r], &tx, &b, 1.0, &to, argmax, ROICORE_INT64,
                                           &one_thread, &err) == ROICORE_OK, "%s", err.message);
        double got[2], arg[2] = {(double)argmax[0], (double)argmax[1]};
        to_doubles(out, got);
        check_values("paddle docstring", got, want, 2, 0);
        check_values("paddle argmax", arg, want_arg, 2, 0);
        free(x.data); free(c.data); free(out.data);
    }
    static const double map[] = {1, 2, 4, 4, 3, 4, 1, 2, 6, 2, 1, 7, 1, 3, 2, 8};
    static const double rois[] = {0, 0, 1, 3, 2, 2, 3, 3, 1, 0, 3, 2};
    static const double want_ds[] = {3, 4, 6, 3, 1, 7, 2, 8, 4, 4, 4, 7};
    array x = coords_of(ROICORE_FLOAT32, map, 4), c = coords_of(ROICORE_FLOAT32, rois, 3);
    array out = new_array(ROICORE_FLOAT32, 12);
    roicore_tensor tx = tensor(x, 1, 1, 4, 4);
    roicore_out_tensor to = out_tensor(out, 3, 1, 2, 2);
    roicore_boxes b = boxes_of(c, batch, 3);
    roicore_error err;
    CHECK(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &to, NULL, ROICORE_INT32,
                                       &three_threads, &err) == ROICORE_OK, "%s", err.message);
    double got[12];
    to_doubles(out, got);
    check_values("deepsense notebook", got, want_ds, 12, 0);
    free(x.data); free(c.data); free(out.data);
}

/* OpenVINO's test vectors: features i/10, 2 x 2 max pooling of three boxes, and bilinear
 * pooling of a normalised box to one bin. */
static void openvino_vectors(void) {
    static const double boxes[] = {1, 1, 3, 3, 1, 2, 2, 4, 0, 1, 4, 5};
    static const double want[] = {1.4, 1.5, 2.0, 2.1, 1.9, 2.0, 2.5, 2.6, 2.0, 2.2, 3.2, 3.4};
    const int64_t batch[] = {0, 0, 0};
    for (int r = 0; r < 5; ++r) {
        array x = new_array(ROICORE_FLOAT32, 36), c = coords_of(ROICORE_FLOAT32, boxes, 3);
        for (int i = 0; i < 36; ++i) set(x, i, (float)(i / 10.0));
        array out = new_array(ROICORE_FLOAT32, 12);
        roicore_tensor tx = tensor(x, 1, 1, 6, 6);
        roicore_out_tensor to = out_tensor(out, 3, 1, 2, 2);
        roicore_boxes b = boxes_of(c, batch, 3);
        roicore_error err;
        CHECK(roicore_roi_pool_max_forward(ALL_MAX[r], &tx, &b, 1.0, &to, NULL, ROICORE_INT32,
                                           &one_thread, &err) == ROICORE_OK, "%s", err.message);
        double got[12];
        to_doubles(out, got);
        check_values(ALL_MAX_NAMES[r], got, want, 12, 1e-6);
        free(x.data); free(c.data); free(out.data);
    }
    static const double nbox[] = {0.2, 0.2, 0.4, 0.4}, want_b[] = {1.05};
    for (int d = 0; d < 2; ++d) {
        array x = new_array(DTYPES[d], 36), c = coords_of(DTYPES[d], nbox, 1);
        for (int i = 0; i < 36; ++i) set(x, i, i / 10.0);
        array out = new_array(DTYPES[d], 1);
        roicore_tensor tx = tensor(x, 1, 1, 6, 6);
        roicore_out_tensor to = out_tensor(out, 1, 1, 1, 1);
        roicore_boxes b = boxes_of(c, batch, 1);
        roicore_error err;
        CHECK(roicore_roi_pool_bilinear_forward(&OPENVINO_BILINEAR, &tx, &b, 0.0, &to, &one_thread,
                                                &err) == ROICORE_OK, "%s", err.message);
        double got[1] = {get(out, 0)};
        check_values("bilinear 1x1", got, want_b, 1, 1e-6);
        free(x.data); free(c.data); free(out.data);
    }
}

/* TensorFlow's crop_and_resize on arange(9) as a 3 x 3 map: nearest sampling rounds halves
 * away from zero (samples at 0.5 and 1.5 take rows 1 and 2), its gradient adds to the same
 * pixels, and CropAndResizeGradBoxes' numbers for the map squared (crops of 2 x 2 and 1 x 1,
 * the latter through its double-precision centre term), all as TensorFlow 2.21 computes
 * them. */
static void tensorflow_crops(void) {
    const int64_t batch[] = {0};
    for (int d = 0; d < 2; ++d) {
        array x = arange(DTYPES[d], 9, 0, 1), sq = new_array(DTYPES[d], 9);
        for (int i = 0; i < 9; ++i) set(sq, i, (double)(i * i));
        roicore_tensor tx = tensor(x, 1, 1, 3, 3), tsq = tensor(sq, 1, 1, 3, 3);
        roicore_error err;
        static const double quarter[] = {0.25, 0.25, 0.75, 0.75}, want_n[] = {4, 4, 5, 7, 7, 8};
        array c = coords_of(DTYPES[d], quarter, 1), out = new_array(DTYPES[d], 6);
        roicore_out_tensor to = out_tensor(out, 1, 1, 2, 3);
        roicore_boxes b = boxes_of(c, batch, 1);
        CHECK(roicore_roi_pool_nearest_forward(&TF_BILINEAR, &tx, &b, 0.0, &to, &one_thread,
                                               &err) == ROICORE_OK, "%s", err.message);
        double got[9];
        to_doubles(out, got);
        check_values("nearest forward", got, want_n, 6, 0);
        /* box [y 0.25..0.75, x 0..1] as [x1, y1, x2, y2]: samples at rows 1, 2, columns 0, 2 */
        static const double wide[] = {0, 0.25, 1, 0.75}, want_dx[] = {0, 0, 0, 1, 0, 2, 3, 0, 4};
        array wc = coords_of(DTYPES[d], wide, 1), g = arange(DTYPES[d], 4, 1, 1);
        array dx = new_array(DTYPES[d], 9);
        roicore_tensor tg = tensor(g, 1, 1, 2, 2);
        roicore_out_tensor tdx = out_tensor(dx, 1, 1, 3, 3);
        roicore_boxes wb = boxes_of(wc, batch, 1);
        CHECK(roicore_roi_pool_nearest_backward(&TF_BILINEAR, &tg, &wb, &tdx, &three_threads,
                                                &err) == ROICORE_OK, "%s", err.message);
        to_doubles(dx, got);
        check_values("nearest backward", got, want_dx, 9, 0);
        /* the box gradient, float32 only: it is TF's arithmetic (in float64 the 1 x 1 crop's
         * centre, 0.1f + 0.9f, no longer falls on row 1) */
        static const double box[] = {0.2f, 0.1f, 0.7f, 0.9f};
        static const double want_b[] = {75.20000457763672, 92.39999389648438, 127.19999694824219,
                                        459.60003662109375};
        static const double want_c[] = {7, 0, 7, 0};
        array bc = coords_of(DTYPES[d], box, 1), gb = new_array(DTYPES[d], 4);
        roicore_boxes bb = boxes_of(bc, batch, 1);
        CHECK(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tsq, &bb, gb.data,
                                                       &one_thread, &err) == ROICORE_OK,
              "%s", err.message);
        to_doubles(gb, got);
        if (d == 0) check_values("box gradient 2x2", got, want_b, 4, 0);
        array one = arange(DTYPES[d], 1, 1, 0);
        roicore_tensor t1 = tensor(one, 1, 1, 1, 1);
        CHECK(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &t1, &tsq, &bb, gb.data,
                                                       &one_thread, &err) == ROICORE_OK,
              "%s", err.message);
        to_doubles(gb, got);
        if (d == 0) check_values("box gradient 1x1", got, want_c, 4, 0);
        free(x.data); free(sq.data); free(c.data); free(out.data); free(wc.data); free(g.data);
        free(dx.data); free(bc.data); free(gb.data); free(one.data);
    }
}

/* MXNet PSROIPooling: arange(288) as 8 x 6 x 6, output_dim 2, pooled and group size 2. */
static void mxnet_psroi(void) {
    static const double boxes[] = {0, 0, 3, 3, 1, 1, 5, 4};
    static const double want[] = {3.5, 41.5, 87.5, 125.5, 147.5, 185.5, 231.5, 269.5,
                                  11, 49, 95, 133, 155, 193, 239, 277};
    const int64_t batch[] = {0, 0};
    for (int d = 0; d < 2; ++d) {
        array x = arange(DTYPES[d], 288, 0, 1), c = coords_of(DTYPES[d], boxes, 2);
        array out = new_array(DTYPES[d], 16);
        roicore_tensor tx = tensor(x, 1, 8, 6, 6);
        roicore_out_tensor to = out_tensor(out, 2, 2, 2, 2);
        roicore_boxes b = boxes_of(c, batch, 2);
        roicore_error err;
        CHECK(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 2, 2, &to, &one_thread,
                                         &err) == ROICORE_OK, "%s", err.message);
        double got[16];
        to_doubles(out, got);
        check_values("psroi", got, want, 16, 0);
        free(x.data); free(c.data); free(out.data);
    }
}

/* torchvision's position-sensitive operators, hand-worked: ps_roi_pool on arange(256) as
 * 4 x 8 x 8 (integer bins, no +1, clamped to row and column 7); ps_roi_align on channels
 * 100*c + 4*h + w, one sample at the centre of each aligned bin, and MXNet's unaligned one
 * at (1 + ph, 1 + pw). */
static void torchvision_ps(void) {
    static const double boxes[] = {0, 0, 4, 4, 2, 2, 7, 7}, align_box[] = {0.5, 0.5, 2.5, 2.5};
    static const double want[] = {4.5, 70.5, 148.5, 214.5, 27, 93, 171, 237};
    static const double want_align[] = {2.5, 103.5, 206.5, 307.5};
    static const double want_unaligned[] = {5, 106, 209, 310};
    const int64_t batch[] = {0, 0};
    for (int d = 0; d < 2; ++d) {
        array x = arange(DTYPES[d], 256, 0, 1), c = coords_of(DTYPES[d], boxes, 2);
        array out = new_array(DTYPES[d], 8);
        roicore_tensor tx = tensor(x, 1, 4, 8, 8);
        roicore_out_tensor to = out_tensor(out, 2, 1, 2, 2);
        roicore_boxes b = boxes_of(c, batch, 2);
        roicore_error err;
        CHECK(roicore_ps_roi_pool_forward(&TORCHVISION_PSROI, &tx, &b, 1.0, 2, 2, &to, &one_thread,
                                         &err) == ROICORE_OK, "%s", err.message);
        double got[8];
        to_doubles(out, got);
        check_values("torchvision psroi", got, want, 8, 0);
        array lin = new_array(DTYPES[d], 64), ca = coords_of(DTYPES[d], align_box, 1);
        for (int i = 0; i < 64; ++i) set(lin, i, 100 * (i / 16) + i % 16);
        roicore_tensor tl = tensor(lin, 1, 4, 4, 4);
        roicore_out_tensor ta = out_tensor(out, 1, 1, 2, 2);
        roicore_boxes ba = boxes_of(ca, batch, 1);
        CHECK(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tl, &ba, 1.0, -1, &ta,
                                           &one_thread, &err) == ROICORE_OK, "%s", err.message);
        to_doubles(out, got);
        check_values("ps_roi_align", got, want_align, 4, 0);
        CHECK(roicore_ps_roi_align_forward(&MXNET_PS_ALIGN, &tl, &ba, 1.0, -1, &ta, &one_thread,
                                           &err) == ROICORE_OK, "%s", err.message);
        to_doubles(out, got);
        check_values("mxnet ps_roi_align", got, want_unaligned, 4, 0);
        free(x.data); free(c.data); free(out.data); free(lin.data); free(ca.data);
    }
}

/* MXNet ROIAlign (sample_ratio 2) on arange(48) as 8 x 6, plain and aligned; Paddle's
 * roi_align test vector (aligned, adaptive) on 1..16 as 4 x 4. */
static void roi_align_vectors(void) {
    static const double boxes[] = {0, 0, 4, 4, 0.5, 1.5, 3.7, 6.2};
    static const double want[] = {7, 9, 19, 21, 17.35, 18.95, 31.45, 33.05};
    static const double want_aligned[] = {3.5, 5.5, 15.5, 17.5, 13.85, 15.45, 27.95, 29.55};
    const int64_t batch[] = {0, 0};
    for (int d = 0; d < 2; ++d)
        for (int aligned = 0; aligned < 2; ++aligned) {
            array x = arange(DTYPES[d], 48, 0, 1), c = coords_of(DTYPES[d], boxes, 2);
            array out = new_array(DTYPES[d], 8);
            roicore_tensor tx = tensor(x, 1, 1, 8, 6);
            roicore_out_tensor to = out_tensor(out, 2, 1, 2, 2);
            roicore_boxes b = boxes_of(c, batch, 2);
            roicore_error err;
            CHECK(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, aligned, &to,
                                            &one_thread, &err) == ROICORE_OK, "%s", err.message);
            double got[8];
            to_doubles(out, got);
            check_values(aligned ? "roi_align aligned" : "roi_align", got,
                         aligned ? want_aligned : want, 8, d == 0 ? 1e-6 : 1e-12);
            free(x.data); free(c.data); free(out.data);
        }
    static const double pboxes[] = {1, 1, 2, 2, 1.5, 1.5, 3, 3}, pwant[] = {6, 9.75};
    array x = arange(ROICORE_FLOAT32, 16, 1, 1), c = coords_of(ROICORE_FLOAT32, pboxes, 2);
    array out = new_array(ROICORE_FLOAT32, 2);
    roicore_tensor tx = tensor(x, 1, 1, 4, 4);
    roicore_out_tensor to = out_tensor(out, 2, 1, 1, 1);
    roicore_boxes b = boxes_of(c, batch, 2);
    roicore_error err;
    CHECK(roicore_roi_align_forward(&PADDLE_ALIGN, &tx, &b, 1.0, -1, 1, &to, &one_thread, &err)
              == ROICORE_OK, "%s", err.message);
    double got[2];
    to_doubles(out, got);
    check_values("paddle roi_align", got, pwant, 2, 0);
    free(x.data); free(c.data); free(out.data);
}

/* ------------------------------------------------------------------------ thread counts */

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Every operator and direction, on a random map with 70 channels (a whole block and a
 * padded one) and boxes of every shape, gives the same bits at 1 and 3 threads. */
static void thread_invariance(void) {
    enum { N = 2, C = 70, H = 13, W = 11, K = 9, P = 3 };
    uint64_t seed = 1;
    for (int d = 0; d < 2; ++d) {
        roicore_dtype dt = DTYPES[d];
        array x = new_array(dt, N * C * H * W), c = new_array(dt, 4 * K);
        array nc = new_array(dt, 4 * K), g = new_array(dt, K * C * P * P);
        int64_t batch[K];
        for (int64_t i = 0; i < x.n; ++i) set(x, i, (double)lcg(&seed) / 2e9 - 1);
        for (int64_t i = 0; i < g.n; ++i) set(g, i, (double)lcg(&seed) / 2e9 - 1);
        for (int k = 0; k < K; ++k) {
            batch[k] = k % N;
            for (int j = 0; j < 4; ++j) {
                set(c, 4 * k + j, (double)(lcg(&seed) % 1400) / 100.0 - 1);
                set(nc, 4 * k + j, (double)(lcg(&seed) % 120) / 100.0 - 0.1);
            }
        }
        roicore_tensor tx = tensor(x, N, C, H, W), tg = tensor(g, K, C, P, P);
        roicore_boxes b = boxes_of(c, batch, K), nb = boxes_of(nc, batch, K);
        array out[2], dx[2];
        int64_t *arg[2];
        const char *what[] = {"max forward", "max backward", "bilinear forward",
                              "bilinear backward", "align forward", "align backward",
                              "psroi forward", "psroi backward", "nearest forward",
                              "nearest backward", "box gradient", "torchvision psroi forward",
                              "torchvision psroi backward", "ps_roi_align forward",
                              "ps_roi_align backward"};
        for (int op = 0; op < 15; ++op) {
            for (int t = 0; t < 2; ++t) {
                const roicore_exec *ex = t ? &three_threads : &one_thread;
                out[t] = new_array(dt, K * C * P * P);
                dx[t] = new_array(dt, N * C * H * W);
                arg[t] = calloc(K * C * P * P, sizeof(int64_t));
                roicore_out_tensor to = out_tensor(out[t], K, C, P, P);
                roicore_out_tensor tdx = out_tensor(dx[t], N, C, H, W);
                roicore_out_tensor tps = out_tensor(out[t], K, C / 2, 1, 1);  /* D = 35, group 1 x 2 */
                roicore_tensor tgps = tensor(g, K, C / 2, 1, 1);
                roicore_out_tensor ttv = out_tensor(out[t], K, C / 2, 1, 2);  /* D = 35, pooled 1 x 2 */
                roicore_tensor tgtv = tensor(g, K, C / 2, 1, 2);
                roicore_error err;
                int rc = ROICORE_OK;
                switch (op) {
                case 0: case 1:
                    rc = roicore_roi_pool_max_forward(&PADDLE_MAX, &tx, &b, 0.9, &to, arg[t],
                                                      ROICORE_INT64, ex, &err);
                    if (op == 1 && rc == ROICORE_OK)
                        rc = roicore_roi_pool_max_backward(&PADDLE_MAX, &tg, arg[t], ROICORE_INT64,
                                                           &b, &tdx, ex, &err);
                    break;
                case 2: rc = roicore_roi_pool_bilinear_forward(&TF_BILINEAR, &tx, &nb, 0.5, &to, ex, &err); break;
                case 3: rc = roicore_roi_pool_bilinear_backward(&TF_BILINEAR, &tg, &nb, &tdx, ex, &err); break;
                case 4: rc = roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 0.9, -1, 0, &to, ex, &err); break;
                case 5: rc = roicore_roi_align_backward(&MXNET_ALIGN, &tg, &b, 0.9, 2, 1, &tdx, ex, &err); break;
                case 6: rc = roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 0.9, 1, 2, &tps, ex, &err); break;
                case 7: rc = roicore_ps_roi_pool_backward(&MXNET_PSROI, &tgps, &b, 0.9, 1, 2, &tdx, ex, &err); break;
                case 8: rc = roicore_roi_pool_nearest_forward(&TF_BILINEAR, &tx, &nb, 0.5, &to, ex, &err); break;
                case 9: rc = roicore_roi_pool_nearest_backward(&TF_BILINEAR, &tg, &nb, &tdx, ex, &err); break;
                case 10: rc = roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nb, out[t].data, ex, &err); break;
                case 11: rc = roicore_ps_roi_pool_forward(&TORCHVISION_PSROI, &tx, &b, 0.9, 1, 2, &ttv, ex, &err); break;
                case 12: rc = roicore_ps_roi_pool_backward(&TORCHVISION_PSROI, &tgtv, &b, 0.9, 1, 2, &tdx, ex, &err); break;
                case 13: rc = roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 0.9, -1, &ttv, ex, &err); break;
                case 14: rc = roicore_ps_roi_align_backward(&TORCHVISION_PS_ALIGN, &tgtv, &b, 0.9, 2, &tdx, ex, &err); break;
                }
                CHECK(rc == ROICORE_OK, "%s: %s", what[op], err.message);
            }
            /* (the box gradient writes into out) */
            int backward = strstr(what[op], "backward") != NULL;
            size_t bytes = (size_t)(backward ? dx[0].n : out[0].n) * (dt == ROICORE_FLOAT32 ? 4 : 8);
            CHECK(memcmp(backward ? dx[0].data : out[0].data, backward ? dx[1].data : out[1].data,
                         bytes) == 0, "%s %s differs between 1 and 3 threads", what[op],
                  dt == ROICORE_FLOAT32 ? "float32" : "float64");
            for (int t = 0; t < 2; ++t) {
                free(out[t].data); free(dx[t].data); free(arg[t]);
            }
        }
        free(x.data); free(c.data); free(nc.data); free(g.data);
    }
}

/* ------------------------------------------------------------------------ layouts */

/* (n, c, h, w) NCHW values -> the same array in NHWC order */
static array to_nhwc(array a, int64_t n, int64_t c, int64_t h, int64_t w) {
    array out = new_array(a.dtype, a.n);
    for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < c; ++j)
            for (int64_t p = 0; p < h * w; ++p) set(out, (i * h * w + p) * c + j, get(a, (i * c + j) * h * w + p));
    return out;
}

/* Every operator and direction reading and writing NHWC gives, element for element, the
 * bits it gives in NCHW (70 channels: a whole block and a padded one; 64: bilinear pooling
 * reads an NHWC map in place; global and plane argmax, int32 and int64). */
static void nhwc_layouts(int64_t C) {
    enum { N = 2, H = 9, W = 12, K = 7, P = 3 };
    uint64_t seed = 7;
    for (int d = 0; d < 2; ++d) {
        roicore_dtype dt = DTYPES[d];
        array x = new_array(dt, N * C * H * W), c = new_array(dt, 4 * K), nc = new_array(dt, 4 * K);
        array g = new_array(dt, K * C * P * P), gps = new_array(dt, K * (C / 2));
        int64_t batch[K];
        for (int64_t i = 0; i < x.n; ++i) set(x, i, (double)lcg(&seed) / 2e9 - 1);
        for (int64_t i = 0; i < g.n; ++i) set(g, i, (double)lcg(&seed) / 2e9 - 1);
        for (int64_t i = 0; i < gps.n; ++i) set(gps, i, (double)lcg(&seed) / 2e9 - 1);
        for (int k = 0; k < K; ++k) {
            batch[k] = (k * 5) % N;
            for (int j = 0; j < 4; ++j) {
                set(c, 4 * k + j, (double)(lcg(&seed) % 1300) / 100.0 - 1);
                set(nc, 4 * k + j, (double)(lcg(&seed) % 120) / 100.0 - 0.1);
            }
        }
        array xh = to_nhwc(x, N, C, H, W), gh = to_nhwc(g, K, C, P, P);
        array gtvh = to_nhwc(g, K, C / 2, 1, 2);  /* torchvision's PS operators: pooled 1 x 2 */
        roicore_tensor tx = tensor(x, N, C, H, W), tg = tensor(g, K, C, P, P);
        roicore_tensor txh = IN(xh.data, dt, ROICORE_NHWC, N, C, H, W);
        roicore_tensor tgh = IN(gh.data, dt, ROICORE_NHWC, K, C, P, P);
        roicore_tensor tgps = tensor(gps, K, C / 2, 1, 1), tgpsh = tgps;
        tgpsh.layout = ROICORE_NHWC;  /* (K, 1, 1, D): the same memory in either layout */
        roicore_boxes b = boxes_of(c, batch, K), nb = boxes_of(nc, batch, K);
        const char *what[] = {"max forward", "max backward", "bilinear forward", "bilinear backward",
                              "align forward", "align backward", "psroi forward", "psroi backward",
                              "torchvision psroi forward", "torchvision psroi backward",
                              "ps_roi_align forward", "ps_roi_align backward"};
        for (int op = 0; op < 12; ++op) {
            const int backward = op % 2 == 1;
            const int64_t on = op >= 8 ? K * C : op >= 6 ? K * (C / 2) : K * C * P * P;
            const int64_t dn = N * C * H * W;
            array out[2] = {new_array(dt, on), new_array(dt, on)};
            array dx[2] = {new_array(dt, dn), new_array(dt, dn)};
            int64_t *arg[2] = {calloc((size_t)on, 8), calloc((size_t)on, 8)};
            for (int layout = 0; layout < 2; ++layout) {
                roicore_layout L = layout ? ROICORE_NHWC : ROICORE_NCHW;
                const roicore_tensor *xin = layout ? &txh : &tx, *gin = layout ? &tgh : &tg;
                roicore_out_tensor to = OUT(out[layout].data, dt, L, K, C, P, P);
                roicore_out_tensor tps = OUT(out[layout].data, dt, L, K, C / 2, 1, 1);
                roicore_out_tensor ttv = OUT(out[layout].data, dt, L, K, C / 2, 1, 2);
                roicore_tensor tgtv = IN(layout ? gtvh.data : g.data, dt, L, K, C / 2, 1, 2);
                roicore_out_tensor tdx = OUT(dx[layout].data, dt, L, N, C, H, W);
                const roicore_max_pool_rules *rules = d ? &PADDLE_MAX : &MXNET_MAX;
                roicore_index_type at = d ? ROICORE_INT64 : ROICORE_INT32;
                roicore_error err;
                int rc = ROICORE_OK;
                switch (op) {
                case 0: case 1:
                    rc = roicore_roi_pool_max_forward(rules, xin, &b, 0.9, &to, arg[layout], at, &three_threads, &err);
                    if (op == 1 && rc == ROICORE_OK)
                        rc = roicore_roi_pool_max_backward(rules, gin, arg[layout], at, &b, &tdx, &three_threads, &err);
                    break;
                case 2: rc = roicore_roi_pool_bilinear_forward(&TF_BILINEAR, xin, &nb, 0.25, &to, &three_threads, &err); break;
                case 3: rc = roicore_roi_pool_bilinear_backward(&TF_BILINEAR, gin, &nb, &tdx, &three_threads, &err); break;
                case 4: rc = roicore_roi_align_forward(&PADDLE_ALIGN, xin, &b, 0.9, -1, 1, &to, &three_threads, &err); break;
                case 5: rc = roicore_roi_align_backward(&MXNET_ALIGN, gin, &b, 0.9, 2, 0, &tdx, &three_threads, &err); break;
                case 6: rc = roicore_ps_roi_pool_forward(&MXNET_PSROI, xin, &b, 0.9, 1, 2, &tps, &three_threads, &err); break;
                case 7: rc = roicore_ps_roi_pool_backward(&MXNET_PSROI, layout ? &tgpsh : &tgps, &b, 0.9, 1, 2, &tdx, &three_threads, &err); break;
                case 8: rc = roicore_ps_roi_pool_forward(&TORCHVISION_PSROI, xin, &b, 0.9, 1, 2, &ttv, &three_threads, &err); break;
                case 9: rc = roicore_ps_roi_pool_backward(&TORCHVISION_PSROI, &tgtv, &b, 0.9, 1, 2, &tdx, &three_threads, &err); break;
                case 10: rc = roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, xin, &b, 0.9, -1, &ttv, &three_threads, &err); break;
                case 11: rc = roicore_ps_roi_align_backward(&TORCHVISION_PS_ALIGN, &tgtv, &b, 0.9, 2, &tdx, &three_threads, &err); break;
                }
                CHECK(rc == ROICORE_OK, "%s NHWC=%d: %s", what[op], layout, err.message);
            }
            /* NCHW results in NHWC order must equal the NHWC results */
            array want = backward ? to_nhwc(dx[0], N, C, H, W)
                                  : op >= 8 ? to_nhwc(out[0], K, C / 2, 1, 2)
                                  : op >= 6 ? out[0] : to_nhwc(out[0], K, C, P, P);
            array got = backward ? dx[1] : out[1];
            CHECK(memcmp(want.data, got.data, (size_t)got.n * (dt == ROICORE_FLOAT32 ? 4 : 8)) == 0,
                  "%s %s: NHWC differs from NCHW", what[op], d ? "float64" : "float32");
            if (op == 0) {  /* the argmax, in out's layout, encodes NCHW positions either way */
                int same = 1;
                for (int64_t k = 0; k < K; ++k)
                    for (int64_t ch = 0; ch < C; ++ch)
                        for (int64_t p = 0; p < P * P; ++p) {
                            int64_t a0 = d ? arg[0][(k * C + ch) * P * P + p]
                                           : ((int32_t *)arg[0])[(k * C + ch) * P * P + p];
                            int64_t a1 = d ? arg[1][(k * P * P + p) * C + ch]
                                           : ((int32_t *)arg[1])[(k * P * P + p) * C + ch];
                            same &= a0 == a1;
                        }
                CHECK(same, "max forward %s: NHWC argmax differs", d ? "float64" : "float32");
            }
            if (want.data != out[0].data && want.data != dx[0].data) free(want.data);
            for (int t = 0; t < 2; ++t) {
                free(out[t].data); free(dx[t].data); free(arg[t]);
            }
        }
        free(x.data); free(c.data); free(nc.data); free(g.data); free(gps.data); free(xh.data); free(gh.data);
        free(gtvh.data);
    }
}

/* PS-RoI with group cells equal to the pooled cells (a transpose per box) in both layouts. */
static void nhwc_psroi_cells(void) {
    enum { N = 1, D = 18, G = 2, C = D * G * G, H = 10, W = 9, K = 5 };
    uint64_t seed = 11;
    array x = new_array(ROICORE_FLOAT32, N * C * H * W), c = new_array(ROICORE_FLOAT32, 4 * K);
    array g = new_array(ROICORE_FLOAT32, K * D * G * G);
    int64_t batch[K] = {0};
    for (int64_t i = 0; i < x.n; ++i) set(x, i, (double)lcg(&seed) / 2e9 - 1);
    for (int64_t i = 0; i < g.n; ++i) set(g, i, (double)lcg(&seed) / 2e9 - 1);
    for (int64_t i = 0; i < 4 * K; ++i) set(c, i, (double)(lcg(&seed) % 1000) / 100.0 - 0.5);
    array xh = to_nhwc(x, N, C, H, W), gh = to_nhwc(g, K, D, G, G);
    roicore_boxes b = boxes_of(c, batch, K);
    array out[2] = {new_array(ROICORE_FLOAT32, K * D * G * G), new_array(ROICORE_FLOAT32, K * D * G * G)};
    array dx[2] = {new_array(ROICORE_FLOAT32, x.n), new_array(ROICORE_FLOAT32, x.n)};
    for (int layout = 0; layout < 2; ++layout) {
        roicore_layout L = layout ? ROICORE_NHWC : ROICORE_NCHW;
        roicore_tensor tx = IN(layout ? xh.data : x.data, ROICORE_FLOAT32, L, N, C, H, W);
        roicore_tensor tg = IN(layout ? gh.data : g.data, ROICORE_FLOAT32, L, K, D, G, G);
        roicore_out_tensor to = OUT(out[layout].data, ROICORE_FLOAT32, L, K, D, G, G);
        roicore_out_tensor tdx = OUT(dx[layout].data, ROICORE_FLOAT32, L, N, C, H, W);
        roicore_error err;
        CHECK(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, G, G, &to, &three_threads, &err) == ROICORE_OK, "%s", err.message);
        CHECK(roicore_ps_roi_pool_backward(&MXNET_PSROI, &tg, &b, 1.0, G, G, &tdx, &three_threads, &err) == ROICORE_OK, "%s", err.message);
    }
    array want_out = to_nhwc(out[0], K, D, G, G), want_dx = to_nhwc(dx[0], N, C, H, W);
    CHECK(memcmp(want_out.data, out[1].data, (size_t)out[1].n * 4) == 0, "psroi cells forward: NHWC differs");
    CHECK(memcmp(want_dx.data, dx[1].data, (size_t)dx[1].n * 4) == 0, "psroi cells backward: NHWC differs");
    free(x.data); free(c.data); free(g.data); free(xh.data); free(gh.data); free(want_out.data); free(want_dx.data);
    for (int t = 0; t < 2; ++t) { free(out[t].data); free(dx[t].data); }
}

/* ------------------------------------------------------------------------ bad input */

/* `call` (filling a local `err`) returns `want`, and err holds that code and a message */
#define EXPECT(call, want)                                                                      \
    do {                                                                                        \
        memset(&err, 0, sizeof err);                                                            \
        int rc_ = (call);                                                                       \
        CHECK(rc_ == (want) && err.code == (want) && err.message[0], "%s: got %d (%s), want %d", \
              #call, rc_, err.message, (want));                                                 \
    } while (0)

/* RoIAlign over a whole 256 x 256 map with sampling ratio 1024: about an hour unless
 * something stops it (a poll callback in `ex`, or Ctrl-C). */
static roicore_status long_align_call(int64_t channels, const roicore_exec *ex, roicore_error *err) {
    array big = new_array(ROICORE_FLOAT32, channels * 256 * 256), out = new_array(ROICORE_FLOAT32, channels * 32 * 32);
    static const double whole[] = {0, 0, 255, 255};
    array c = coords_of(ROICORE_FLOAT32, whole, 1);
    int64_t b0[] = {0};
    roicore_tensor t = tensor(big, 1, channels, 256, 256);
    roicore_out_tensor to = out_tensor(out, 1, channels, 32, 32);
    roicore_boxes b = boxes_of(c, b0, 1);
    roicore_status status = roicore_roi_align_forward(&MXNET_ALIGN, &t, &b, 1.0, 1024, 0, &to, ex, err);
    free(big.data); free(out.data); free(c.data);
    return status;
}

static int stop_now(void *arg) {
    ++*(int *)arg;
    return 1;
}

static void bad_input(void) {
    array x = arange(ROICORE_FLOAT32, 2 * 3 * 8 * 8, 0, 1), out = new_array(ROICORE_FLOAT32, 2 * 3 * 4);
    static const double rows[] = {0, 0, 5, 5, 1, 1, 7, 6};
    array c = coords_of(ROICORE_FLOAT32, rows, 2);
    int64_t batch[] = {0, 1}, arg[24];
    roicore_tensor tx = tensor(x, 2, 3, 8, 8);
    roicore_out_tensor to = out_tensor(out, 2, 3, 2, 2);
    roicore_boxes b = boxes_of(c, batch, 2);
    roicore_error err;
    /* batch indices */
    batch[1] = 2;
    EXPECT(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &to, NULL, ROICORE_INT32, NULL, &err), ROICORE_ERR_VALUE);
    batch[1] = -1;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, NULL, &err), ROICORE_ERR_VALUE);
    b.masked = 1;  /* masked: zeros, no error */
    for (int i = 0; i < 24; ++i) set(out, i, 99);
    CHECK(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, NULL, &err) == ROICORE_OK, "%s", err.message);
    for (int i = 12; i < 24; ++i) CHECK(get(out, i) == 0, "masked box output[%d] = %g", i, get(out, i));
    CHECK(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &to, arg, ROICORE_INT64, NULL, &err) == ROICORE_OK, "%s", err.message);
    for (int i = 12; i < 24; ++i) CHECK(arg[i] == -1, "masked box argmax[%d] = %lld", i, (long long)arg[i]);
    b.masked = 0;
    batch[1] = 1;
    /* coordinates */
    set(c, 2, NAN);
    EXPECT(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &to, NULL, ROICORE_INT32, NULL, &err), ROICORE_ERR_VALUE);
    set(c, 2, 1e30);
    EXPECT(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 1, 3, &OUT(out.data, ROICORE_FLOAT32, ROICORE_NCHW, 2, 1, 2, 2), NULL, &err), ROICORE_ERR_VALUE);
    set(c, 2, 5);
    /* a bilinear box on a 1 x 1 map: the range check scales by max(size - 1, 1) */
    array one = arange(ROICORE_FLOAT32, 2 * 3, 0, 1);
    roicore_tensor t1 = tensor(one, 2, 3, 1, 1);
    set(c, 0, -3e38);
    EXPECT(roicore_roi_pool_bilinear_forward(&TF_BILINEAR, &t1, &b, 0.0, &to, NULL, &err), ROICORE_ERR_VALUE);
    set(c, 0, 0);
    /* shapes, sizes, pointers, alignment */
    roicore_out_tensor wrong = out_tensor(out, 2, 2, 2, 2);  /* C = 2, x has 3 */
    EXPECT(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &wrong, NULL, ROICORE_INT32, NULL, &err), ROICORE_ERR_ARGUMENT);
    wrong = out_tensor(out, 3, 3, 2, 1);  /* K = 3 for 2 boxes */
    EXPECT(roicore_roi_pool_max_forward(&MXNET_MAX, &tx, &b, 1.0, &wrong, NULL, ROICORE_INT32, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_tensor huge = tensor(x, (int64_t)1 << 40, (int64_t)1 << 40, 8, 8);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &huge, &b, 1.0, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_tensor null_x = tensor(x, 2, 3, 8, 8);
    null_x.data = NULL;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &null_x, &b, 1.0, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_tensor odd = tensor(x, 2, 3, 8, 7);
    odd.data = (char *)x.data + 1;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &odd, &b, 1.0, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_out_tensor overlap = out_tensor(x, 2, 3, 2, 2);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &overlap, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_out_tensor over_boxes = OUT(c.data, ROICORE_FLOAT32, ROICORE_NCHW, 2, 1, 2, 1);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &over_boxes, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 2, 2, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    /* scalars and rules */
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 0.0, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, NAN, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1e-50, 2, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 5000, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    set(c, 2, 1e6);
    set(c, 3, 1e6);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, -1, 0, &to, NULL, &err), ROICORE_ERR_VALUE);
    set(c, 2, 5);
    set(c, 3, 5);
    /* torchvision's PS operators: the group is the pooled size, C = D * PH * PW, the grid */
    roicore_out_tensor tv_out = out_tensor(out, 2, 3, 1, 1);
    EXPECT(roicore_ps_roi_pool_forward(&TORCHVISION_PSROI, &tx, &b, 1.0, 1, 2, &tv_out, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_out_tensor ps_wrong = out_tensor(out, 2, 2, 1, 1);  /* 2 * 1 * 1 channels, x has 3 */
    EXPECT(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 1.0, -1, &ps_wrong, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 1.0, 5000, &tv_out, NULL, &err), ROICORE_ERR_ARGUMENT);
    batch[1] = 2;
    EXPECT(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 1.0, -1, &tv_out, NULL, &err), ROICORE_ERR_VALUE);
    batch[1] = 1;
    set(c, 2, 1e6);
    set(c, 3, 1e6);
    EXPECT(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 1.0, -1, &tv_out, NULL, &err), ROICORE_ERR_VALUE);
    set(c, 2, 5);
    set(c, 3, 5);
    /* a masked box is never scaled, however far its coordinates reach */
    batch[1] = -1;
    b.masked = 1;
    set(c, 6, 1e30);
    CHECK(roicore_ps_roi_pool_forward(&TORCHVISION_PSROI, &tx, &b, 1.0, 1, 1, &tv_out, NULL, &err) == ROICORE_OK, "%s", err.message);
    CHECK(roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &tx, &b, 1.0, -1, &tv_out, NULL, &err) == ROICORE_OK, "%s", err.message);
    for (int i = 3; i < 6; ++i) CHECK(get(out, i) == 0, "masked box output[%d] = %g", i, get(out, i));
    set(c, 6, 7);
    b.masked = 0;
    batch[1] = 1;
    roicore_ps_roi_pool_rules bogus_ps = TORCHVISION_PSROI;
    bogus_ps.formula = (roicore_ps_roi_pool_formula)2;
    EXPECT(roicore_ps_roi_pool_forward(&bogus_ps, &tx, &b, 1.0, 1, 1, &tv_out, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_ps_roi_align_rules bogus_align = {.scale_precision = (roicore_precision)2};
    EXPECT(roicore_ps_roi_align_forward(&bogus_align, &tx, &b, 1.0, -1, &tv_out, NULL, &err), ROICORE_ERR_ARGUMENT);
    const int64_t ps_fields[] = {1, 2};
    roicore_ps_roi_pool_rules ps_from;
    EXPECT(roicore_ps_roi_pool_rules_from_array(ps_fields, 2, &ps_from, &err), ROICORE_ERR_ARGUMENT);
    roicore_ps_roi_align_rules align_from;
    EXPECT(roicore_ps_roi_align_rules_from_array(ps_fields, 2, &align_from, &err), ROICORE_ERR_ARGUMENT);
    roicore_max_pool_rules bogus = MXNET_MAX;
    bogus.compare = (roicore_compare)7;
    EXPECT(roicore_roi_pool_max_forward(&bogus, &tx, &b, 1.0, &to, NULL, ROICORE_INT32, NULL, &err), ROICORE_ERR_ARGUMENT);
    const int64_t fields[] = {0, 1, 0, 0, 1, 0, (int64_t)1 << 40};
    roicore_max_pool_rules from;
    EXPECT(roicore_max_pool_rules_from_array(fields, 7, &from, &err), ROICORE_ERR_ARGUMENT);
    /* an argmax that points outside its own plane is refused, not followed */
    array g = arange(ROICORE_FLOAT32, 24, 1, 0), dx = new_array(ROICORE_FLOAT32, 2 * 3 * 64);
    roicore_tensor tg = tensor(g, 2, 3, 2, 2);
    roicore_out_tensor tdx = out_tensor(dx, 2, 3, 8, 8);
    int32_t forged[24];
    for (int i = 0; i < 24; ++i) forged[i] = -1;
    forged[5] = 64;
    EXPECT(roicore_roi_pool_max_backward(&PADDLE_MAX, &tg, forged, ROICORE_INT32, &b, &tdx, NULL, &err), ROICORE_ERR_VALUE);
    forged[5] = 2 * 3 * 64 + 7;
    EXPECT(roicore_roi_pool_max_backward(&MXNET_MAX, &tg, forged, ROICORE_INT32, &b, &tdx, NULL, &err), ROICORE_ERR_VALUE);
    /* batch index conversions */
    const float column[] = {0, 9, 9, 9, 9, 1.5f, 9, 9, 9, 9};
    int64_t out_batch[2];
    EXPECT(roicore_batch_from_column(column, ROICORE_FLOAT32, 5, 2, 2, 0, "rois[:, 0]", out_batch, &err), ROICORE_ERR_VALUE);
    const int32_t counts[] = {1, 2};
    EXPECT(roicore_batch_from_counts(counts, ROICORE_INT32, 2, 2, "boxes_num", out_batch, &err), ROICORE_ERR_VALUE);
    const int32_t indices[] = {0, 3};
    EXPECT(roicore_batch_from_indices(indices, ROICORE_INT32, 2, 2, 0, "box_indices", out_batch, &err), ROICORE_ERR_VALUE);
    /* the box gradient: TensorFlow's rules only, an output, apart from the inputs */
    array gb = new_array(ROICORE_FLOAT32, 8), nrm = coords_of(ROICORE_FLOAT32, (const double[]){0.1, 0.1, 0.6, 0.7, 0.2, 0.3, 0.9, 0.8}, 2);
    roicore_boxes nbx = boxes_of(nrm, batch, 2);
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&OPENVINO_BILINEAR, &tg, &tx, &nbx, gb.data, NULL, &err), ROICORE_ERR_UNSUPPORTED);
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nbx, NULL, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nbx, x.data, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nbx, (char *)gb.data + 2, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_tensor narrow = tensor(g, 2, 2, 2, 3);  /* C = 2 for a map of 3 */
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &narrow, &tx, &nbx, gb.data, NULL, &err), ROICORE_ERR_ARGUMENT);
    batch[1] = 2;
    EXPECT(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nbx, gb.data, NULL, &err), ROICORE_ERR_VALUE);
    EXPECT(roicore_roi_pool_nearest_forward(&TF_BILINEAR, &tx, &nbx, 0.0, &to, NULL, &err), ROICORE_ERR_VALUE);
    batch[1] = -1;
    nbx.masked = 1;  /* masked: a zero gradient, no error */
    for (int i = 0; i < 8; ++i) set(gb, i, 99);
    CHECK(roicore_roi_pool_bilinear_boxes_backward(&TF_BILINEAR, &tg, &tx, &nbx, gb.data, NULL, &err) == ROICORE_OK, "%s", err.message);
    for (int i = 4; i < 8; ++i) CHECK(get(gb, i) == 0, "masked box gradient[%d] = %g", i, get(gb, i));
    batch[1] = 1;
    set(nrm, 1, INFINITY);
    EXPECT(roicore_roi_pool_nearest_backward(&TF_BILINEAR, &tg, &nbx, &tdx, NULL, &err), ROICORE_ERR_VALUE);
    free(gb.data); free(nrm.data);
    /* memory limit and a stop request */
    int64_t limit = roicore_get_memory_limit();
    roicore_set_memory_limit(1024);
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, NULL, &err), ROICORE_ERR_MEMORY);
    roicore_set_memory_limit(limit);
    int polls = 0;
    roicore_exec stopping = {.n_threads = 1, .poll = stop_now, .poll_arg = &polls};
    EXPECT(long_align_call(64, &stopping, &err), ROICORE_ERR_INTERRUPTED);
    CHECK(polls >= 1, "the poll callback was not called");
    free(x.data); free(out.data); free(c.data); free(one.data); free(g.data); free(dx.data);
}

/* Rules arrays from older and newer versions, reserved fields, and the public functions'
 * own promises about their pointers and codes. */
static void contract(void) {
    roicore_error err;
    /* an array that ends before the fields with defaults gets the defaults */
    const int64_t max_fields[] = {1, 1, 1, 0, 0, 1, 2, 0};
    roicore_max_pool_rules mp;
    memset(&mp, 0x5a, sizeof mp);
    CHECK(roicore_max_pool_rules_from_array(max_fields, 6, &mp, &err) == ROICORE_OK &&
              mp.scale_product == ROICORE_PRECISION_INPUT && mp.argmax_dtype == ROICORE_INT64 &&
              mp.reserved[8] == 0,
          "a 6-field MaxPoolRules array: %s", err.message);
    CHECK(roicore_max_pool_rules_from_array(max_fields, 7, &mp, &err) == ROICORE_OK &&
              mp.scale_product == ROICORE_PRECISION_FLOAT64, "%s", err.message);
    roicore_bilinear_pool_rules bp;
    CHECK(roicore_bilinear_pool_rules_from_array(max_fields, 1, &bp, &err) == ROICORE_OK &&
              bp.pin_last == 1 && bp.fused_lerp == 0, "%s", err.message);
    roicore_ps_roi_pool_rules pp;
    CHECK(roicore_ps_roi_pool_rules_from_array(max_fields, 1, &pp, &err) == ROICORE_OK &&
              pp.formula == ROICORE_PS_ROI_POOL_FORMULA_RFCN, "%s", err.message);
    /* too few fields, or more than this version knows (a newer roicore's saved graph) */
    EXPECT(roicore_max_pool_rules_from_array(max_fields, 5, &mp, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_max_pool_rules_from_array(max_fields, 8, &mp, &err), ROICORE_ERR_ARGUMENT);
    CHECK(strstr(err.message, "newer roicore") != NULL, "%s", err.message);
    roicore_roi_align_rules ar;
    EXPECT(roicore_roi_align_rules_from_array(max_fields, 3, &ar, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_roi_align_rules_from_array(max_fields, 6, &ar, &err), ROICORE_ERR_ARGUMENT);
    /* reduction: stored by 0.2.0 and later; a 4-field array (before it) means the mean */
    memset(&ar, 0x5a, sizeof ar);
    CHECK(roicore_roi_align_rules_from_array(max_fields, 4, &ar, &err) == ROICORE_OK &&
              ar.reduction == ROICORE_REDUCTION_MEAN && ar.reserved[10] == 0, "%s", err.message);
    const int64_t align_sum[] = {0, 0, 0, 0, 1};
    CHECK(roicore_roi_align_rules_from_array(align_sum, 5, &ar, &err) == ROICORE_OK &&
              ar.reduction == ROICORE_REDUCTION_SUM, "%s", err.message);
    const int64_t align_bad[] = {0, 0, 0, 0, 2};
    EXPECT(roicore_roi_align_rules_from_array(align_bad, 5, &ar, &err), ROICORE_ERR_ARGUMENT);
    /* PSRoIAlignRules box, outside, empty_grid: a 1-field array (before them) is torchvision's */
    roicore_ps_roi_align_rules pa;
    memset(&pa, 0x5a, sizeof pa);
    const int64_t ps_align_mxnet[] = {1, 1, 1, 1, 0};
    CHECK(roicore_ps_roi_align_rules_from_array(ps_align_mxnet, 1, &pa, &err) == ROICORE_OK &&
              pa.box == ROICORE_PS_ALIGN_BOX_ALIGNED && pa.outside == ROICORE_OUTSIDE_ZERO &&
              pa.empty_grid == ROICORE_PS_EMPTY_GRID_DIVIDE && pa.reserved[11] == 0,
          "%s", err.message);
    CHECK(roicore_ps_roi_align_rules_from_array(ps_align_mxnet, 4, &pa, &err) == ROICORE_OK &&
              pa.box == ROICORE_PS_ALIGN_BOX_UNALIGNED && pa.outside == ROICORE_OUTSIDE_FIRST &&
              pa.empty_grid == ROICORE_PS_EMPTY_GRID_ZERO, "%s", err.message);
    EXPECT(roicore_ps_roi_align_rules_from_array(ps_align_mxnet, 5, &pa, &err),
           ROICORE_ERR_ARGUMENT);
    /* NULL arrays and outputs, out-of-range codes */
    EXPECT(roicore_max_pool_rules_from_array(NULL, 7, &mp, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_max_pool_rules_from_array(max_fields, 7, NULL, &err), ROICORE_ERR_ARGUMENT);
    const int64_t scale_product_1[] = {0, 0, 0, 0, 0, 0, 1};
    EXPECT(roicore_max_pool_rules_from_array(scale_product_1, 7, &mp, &err), ROICORE_ERR_ARGUMENT);
    roicore_index_type type;
    EXPECT(roicore_max_pool_argmax_type(NULL, NULL, &type, &err), ROICORE_ERR_ARGUMENT);
    array x = arange(ROICORE_FLOAT32, 64, 0, 1), out = new_array(ROICORE_FLOAT32, 4);
    roicore_tensor tx = tensor(x, 1, 1, 8, 8);
    EXPECT(roicore_max_pool_argmax_type(&MXNET_MAX, &tx, NULL, &err), ROICORE_ERR_ARGUMENT);
    CHECK(roicore_max_pool_argmax_type(&MXNET_MAX, &tx, &type, &err) == ROICORE_OK &&
              type == ROICORE_INT32, "%s", err.message);
    /* nonzero reserved fields are refused everywhere */
    static const double rows[] = {0, 0, 5, 5};
    array c = coords_of(ROICORE_FLOAT32, rows, 1);
    const int64_t batch[] = {0};
    roicore_boxes b = boxes_of(c, batch, 1);
    roicore_out_tensor to = out_tensor(out, 1, 1, 2, 2);
    CHECK(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err) ==
              ROICORE_OK, "%s", err.message);
    tx.reserved[3] = 1;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err), ROICORE_ERR_ARGUMENT);
    tx.reserved[3] = 0;
    to.reserved[0] = 1;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err), ROICORE_ERR_ARGUMENT);
    to.reserved[0] = 0;
    b.reserved[2] = 1;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err), ROICORE_ERR_ARGUMENT);
    b.reserved[2] = 0;
    b.masked = 2;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err), ROICORE_ERR_ARGUMENT);
    b.masked = 0;
    roicore_exec ex = {.n_threads = 1};
    ex.reserved[1] = &ex;
    EXPECT(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, &ex, &err), ROICORE_ERR_ARGUMENT);
    roicore_roi_align_rules reserved_rules = MXNET_ALIGN;
    reserved_rules.reserved[10] = 1;
    EXPECT(roicore_roi_align_forward(&reserved_rules, &tx, &b, 1.0, 2, 0, &to, &one_thread, &err), ROICORE_ERR_ARGUMENT);
    /* converters: codes, counts and strides that would overflow */
    int64_t out_batch[2];
    const float column[] = {0, 1};
    EXPECT(roicore_batch_from_column(column, (roicore_dtype)5, 1, 2, 2, 0, "rois", out_batch, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_batch_from_column(column, ROICORE_FLOAT32, INT64_MAX, 2, 2, 0, "rois", out_batch, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_batch_from_column(column, ROICORE_FLOAT32, INT64_MIN, 2, 2, 0, "rois", out_batch, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_batch_from_indices(column, (roicore_index_type)7, 2, 2, 0, "idx", out_batch, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_check_coords(c.data, (roicore_dtype)9, 1, 0, 0, "boxes", &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_check_coords(c.data, ROICORE_FLOAT32, -1, 0, 0, "boxes", &err), ROICORE_ERR_ARGUMENT);
    float dst[4];
    EXPECT(roicore_convert_coords(c.data, ROICORE_FLOAT32, 4, INT64_MAX - 1, 0, 1, dst, ROICORE_FLOAT32, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_convert_coords(c.data, ROICORE_FLOAT32, INT64_MAX, 0, 0, 2, dst, ROICORE_FLOAT32, &err), ROICORE_ERR_ARGUMENT);
    /* an error names the argument and the element it found at fault */
    const int32_t counts[] = {1, -2};
    EXPECT(roicore_batch_from_counts(counts, ROICORE_INT32, 2, 1, "lod", out_batch, &err), ROICORE_ERR_VALUE);
    CHECK(strcmp(err.argument, "lod") == 0 && err.index == 1 && strstr(err.message, "lod[1] = -2"),
          "argument '%s' index %lld: %s", err.argument, (long long)err.index, err.message);
    const float wrong_column[] = {0, 9, 9, 9, 9, 3, 9, 9, 9, 9};
    EXPECT(roicore_batch_from_column(wrong_column, ROICORE_FLOAT32, 5, 2, 2, 0, "rois[:, 0]", out_batch, &err), ROICORE_ERR_VALUE);
    CHECK(strcmp(err.message, "rois[:, 0][1] = 3 is out of range for a feature map with N=2 images "
                              "(expected 0 <= index < 2)") == 0, "%s", err.message);
    /* channel counts whose product overflows int64 are said so, not wrapped (UBSan) */
    {
        roicore_tensor big_c = tx;
        big_c.c = 3;
        roicore_out_tensor many_c = to;  /* never written: the call fails first */
        many_c.data = (void *)(uintptr_t)4096;  /* 4 GiB from there: clear of the heap's x */
        many_c.c = (int64_t)1 << 30;
        many_c.h = many_c.w = 1;
        EXPECT(roicore_ps_roi_pool_forward(&MXNET_PSROI, &big_c, &b, 1.0, 1 << 20, 1 << 20, &many_c,
                                           &one_thread, &err), ROICORE_ERR_ARGUMENT);
        CHECK(strstr(err.message, "output_channels * 1048576 * 1048576 = more than 2**63") != NULL,
              "%s", err.message);
    }
    /* runtime settings refuse negative limits */
    const int64_t limit = roicore_get_memory_limit();
    CHECK(roicore_set_memory_limit(-5) == ROICORE_ERR_ARGUMENT && roicore_get_memory_limit() == limit,
          "a negative memory limit was taken");
    CHECK(roicore_set_scratch_keep_limit(-1) == ROICORE_ERR_ARGUMENT, "a negative keep limit was taken");
    /* the library is the header's */
    CHECK(roicore_abi_version() == ROICORE_ABI_VERSION && roicore_version_number() == ROICORE_VERSION_NUMBER &&
              strcmp(roicore_version_string(), ROICORE_VERSION_STRING) == 0,
          "library %s (ABI %d) against header %s (ABI %d)", roicore_version_string(),
          roicore_abi_version(), ROICORE_VERSION_STRING, ROICORE_ABI_VERSION);
    free(x.data); free(out.data); free(c.data);
}

/* Scratch blocks of 1 MiB or more are kept for the next call, and a kept block gives the
 * same bits as a fresh one.  A PS-RoI pass over an NHWC map takes an NCHW copy of it as
 * scratch: 1029 x 16 x 16 float32, just over 1 MiB. */
static void scratch_keeping(void) {
    const int64_t C = 21 * 49, H = 16, W = 16, copy_bytes = C * H * W * 4;
    array x = new_array(ROICORE_FLOAT32, C * H * W);
    for (int64_t i = 0; i < x.n; ++i) set(x, i, (double)((i * 7919) % 1000) / 100.0);
    static const double rows[] = {0, 0, 15, 15, 3, 2, 11, 14};
    array c = coords_of(ROICORE_FLOAT32, rows, 2);
    int64_t batch[] = {0, 0};
    roicore_boxes b = boxes_of(c, batch, 2);
    roicore_tensor tx = IN(x.data, ROICORE_FLOAT32, ROICORE_NHWC, 1, C, H, W);
    array out[3];
    roicore_error err;
    const int64_t limit = roicore_get_scratch_keep_limit();
    CHECK(limit == 256 << 20, "default keep limit %lld", (long long)limit);
    roicore_release_scratch();
    for (int r = 0; r < 3; ++r) {
        out[r] = new_array(ROICORE_FLOAT32, 2 * 21 * 49);
        roicore_out_tensor to = OUT(out[r].data, ROICORE_FLOAT32, ROICORE_NHWC, 2, 21, 7, 7);
        if (r == 2) roicore_set_scratch_keep_limit(0);
        CHECK(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 7, 7, &to, &three_threads,
                                         &err) == ROICORE_OK, "psroi NHWC: %s", err.message);
        const int64_t kept = roicore_release_scratch();
        if (r == 0)  /* the first call's blocks are kept */
            CHECK(kept >= copy_bytes, "kept %lld bytes, want >= %lld", (long long)kept,
                  (long long)copy_bytes);
        if (r == 2)
            CHECK(kept == 0, "kept %lld bytes with a limit of 0", (long long)kept);
        if (r == 0) {  /* again, the second call taking the first call's blocks */
            CHECK(roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 7, 7, &to, &three_threads,
                                             &err) == ROICORE_OK, "psroi NHWC: %s", err.message);
            const int64_t again = roicore_ps_roi_pool_forward(&MXNET_PSROI, &tx, &b, 1.0, 7, 7, &to,
                                                             &three_threads, &err);
            CHECK(again == ROICORE_OK && roicore_release_scratch() == kept,
                  "a call after the first took fresh blocks instead of the kept ones");
        }
    }
    roicore_set_scratch_keep_limit(limit);
    CHECK(roicore_get_scratch_keep_limit() == limit, "keep limit not restored");
    CHECK(memcmp(out[0].data, out[1].data, (size_t)out[0].n * 4) == 0 &&
              memcmp(out[0].data, out[2].data, (size_t)out[0].n * 4) == 0,
          "results out of kept scratch differ from results out of fresh scratch");
    for (int r = 0; r < 3; ++r) free(out[r].data);
    free(x.data); free(c.data);
}

/* Zero-size calls with NULL data (no elements, so no array is needed): every operator
 * returns OK without touching memory (memset(NULL, 0, 0) was undefined behaviour). */
static void zero_sizes(void) {
    roicore_error err;
    const int64_t batch[1] = {0};
    static const float coords[4] = {0, 0, 2, 2};
    for (int layout = 0; layout < 2; ++layout) {
        const roicore_layout L = layout ? ROICORE_NHWC : ROICORE_NCHW;
        /* no channels: x (1, 0, 4, 4) with one box; no boxes: (1, 4, 4, 4) with none */
        for (int no_boxes = 0; no_boxes < 2; ++no_boxes) {
            const int64_t C = no_boxes ? 4 : 0, K = no_boxes ? 0 : 1;
            float x_data[64] = {0};
            roicore_tensor x = IN(C ? x_data : NULL, ROICORE_FLOAT32, L, 1, C, 4, 4);
            roicore_tensor g = IN(NULL, ROICORE_FLOAT32, L, K, C, 2, 2);
            roicore_out_tensor y = OUT(NULL, ROICORE_FLOAT32, L, K, C, 2, 2);
            float dx_data[64];
            roicore_out_tensor dx = OUT(C ? dx_data : NULL, ROICORE_FLOAT32, L, 1, C, 4, 4);
            roicore_boxes b = {.coords = K ? coords : NULL, .batch = K ? batch : NULL, .k = K};
            roicore_tensor gp = IN(NULL, ROICORE_FLOAT32, L, K, C / 4, 2, 2);
            roicore_out_tensor yp = OUT(NULL, ROICORE_FLOAT32, L, K, C / 4, 2, 2);
            const roicore_status got[] = {
                roicore_roi_pool_max_forward(&MXNET_MAX, &x, &b, 1.0, &y, NULL, ROICORE_INT32, NULL, &err),
                roicore_roi_pool_max_backward(&MXNET_MAX, &g, NULL, ROICORE_INT32, &b, &dx, NULL, &err),
                roicore_roi_pool_bilinear_forward(&TF_BILINEAR, &x, &b, 0.0, &y, NULL, &err),
                roicore_roi_pool_bilinear_backward(&TF_BILINEAR, &g, &b, &dx, NULL, &err),
                roicore_roi_align_forward(&MXNET_ALIGN, &x, &b, 1.0, 2, 0, &y, NULL, &err),
                roicore_roi_align_backward(&MXNET_ALIGN, &g, &b, 1.0, 2, 0, &dx, NULL, &err),
                roicore_ps_roi_pool_forward(&MXNET_PSROI, &x, &b, 1.0, 2, 2, &yp, NULL, &err),
                roicore_ps_roi_pool_backward(&MXNET_PSROI, &gp, &b, 1.0, 2, 2, &dx, NULL, &err),
                roicore_ps_roi_align_forward(&TORCHVISION_PS_ALIGN, &x, &b, 1.0, 2, &yp, NULL, &err),
                roicore_ps_roi_align_backward(&TORCHVISION_PS_ALIGN, &gp, &b, 1.0, 2, &dx, NULL, &err),
            };
            for (size_t i = 0; i < sizeof got / sizeof got[0]; ++i)
                CHECK(got[i] == ROICORE_OK, "zero-size call %zu (layout %d, %s): %d %s", i, layout,
                      no_boxes ? "no boxes" : "no channels", got[i], err.message);
            if (C) {  /* no boxes: the gradient is zeroed */
                int zero = 1;
                for (int i = 0; i < 64; ++i) zero &= dx_data[i] == 0;
                CHECK(zero, "a backward without boxes left a nonzero gradient");
            }
        }
    }
}

/* ------------------------------------------------------------------------ feature pyramids */

/* torchvision's level rule (LevelMapper: floor(k0 + log2(s / s0) + 1e-6), a negative area's
 * NaN not pooled), and the same with the two other answers to a reversed or empty box */
static const roicore_level_rules TORCHVISION_LEVELS = {
    .pixel_offset = 0, .epsilon = ROICORE_LEVEL_EPSILON_1E6, .epsilon_inside = 0,
    .invalid = ROICORE_LEVEL_INVALID_NAN};
static const roicore_level_rules ZERO_LEVELS = {
    .pixel_offset = 0, .epsilon = ROICORE_LEVEL_EPSILON_1E6, .epsilon_inside = 0,
    .invalid = ROICORE_LEVEL_INVALID_ZERO};
static const roicore_level_rules SKIP_LEVELS = {
    .pixel_offset = 0, .epsilon = ROICORE_LEVEL_EPSILON_1E6, .epsilon_inside = 0,
    .invalid = ROICORE_LEVEL_INVALID_SKIP};
static const roicore_roi_align_rules TORCHVISION_ALIGN = {
    .sampler = ROICORE_SAMPLER_CAFFE2, .scale_precision = ROICORE_PRECISION_INPUT,
    .empty_grid = ROICORE_EMPTY_GRID_ZERO, .backward_min_size_always = 0};

/* levels first_level, first_level + 1, ... with torchvision's k0 = 4 and s0 = 224 */
static roicore_pyramid pyramid_of(int64_t n_levels, int64_t first_level, const double *scales) {
    roicore_pyramid p = {.n_levels = n_levels, .first_level = first_level, .canonical_level = 4,
                         .canonical_size = 224, .spatial_scales = scales};
    return p;
}

/* Each box's map index worked by hand: s = sqrt(w * h), level floor(4 + log2(s / 224) + eps)
 * clamped to maps 0 .. 3 (levels 2 to 5). */
static void pyramid_levels_rules(void) {
    enum { K = 12 };
    static const double rows[4 * K] = {
        0, 0, 224, 224,                   /* s = 224: level 4 */
        10, 20, 122, 132,                 /* 112: level 3 */
        0, 0, 10, 10,                     /* 10: level -0.49, below the first map */
        0, 0, 2000, 2000,                 /* level 7, the last map */
        50, 0, 40, 30,                    /* x2 < x1: area -300 */
        300, 300, 76, 76,                 /* reversed both ways: area 224**2 */
        5, 5, 5, 20,                      /* area 0: log2(0) = -inf */
        0, 0, 448, 448,                   /* level 5 exactly */
        0, 0, 447, 447,                   /* 4.997 */
        0, 0, 223, 223,                   /* 3.994 (224 with pixel_offset) */
        0, 0, 223.99989, 223.99989,       /* 7e-7 short of level 4: eps 1e-6 lifts it */
        0, 0, 15, 15,                     /* masked below */
    };
    static const int64_t want_nan[K] = {2, 1, 0, 3, -1, 2, 0, 3, 2, 1, 2, -1};
    static const int64_t want_zero[K] = {2, 1, 0, 3, 0, 0, 0, 3, 2, 1, 2, -1};
    static const int64_t want_skip[K] = {2, 1, 0, 3, -1, 2, -1, 3, 2, 1, 2, -1};
    /* pixel_offset: every side one longer (the reversed box's area still negative) */
    static const int64_t want_offset[K] = {2, 1, 0, 3, -1, 1, 0, 3, 3, 2, 2, -1};
    /* eps 1e-8 inside the log: too small to lift the box 7e-7 short of level 4 */
    static const int64_t want_inside[K] = {2, 1, 0, 3, -1, 2, 0, 3, 2, 1, 1, -1};
    /* one map: every box from it, except what SKIP refuses (areas -300 and 0) */
    static const int64_t want_one[K] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1};
    static const int64_t want_one_skip[K] = {0, 0, 0, 0, -1, 0, -1, 0, 0, 0, 0, -1};
    /* one map with one_map RULE (GluonCV): the rule still drops the NaN level */
    static const int64_t want_one_rule[K] = {0, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, -1};
    /* the Model Garden's: no epsilon (the box 7e-7 short of level 4 stays below), and a NaN
       or -inf level the first map */
    static const int64_t want_garden[K] = {2, 1, 0, 3, 0, 2, 0, 3, 2, 1, 1, -1};
    const roicore_level_rules garden = {.formula = ROICORE_LEVEL_FORMULA_MODEL_GARDEN};
    const roicore_level_rules by_rule = {.one_map = ROICORE_LEVEL_ONE_MAP_RULE};
    const roicore_level_rules offset = {.pixel_offset = 1, .invalid = ROICORE_LEVEL_INVALID_NAN};
    const roicore_level_rules inside = {.epsilon = ROICORE_LEVEL_EPSILON_1E8, .epsilon_inside = 1};
    const double scales[4] = {0.25, 0.125, 0.0625, 0.03125};
    const roicore_pyramid four = pyramid_of(4, 2, scales), one = pyramid_of(1, 2, scales);
    const struct {
        const roicore_level_rules *rules;
        const roicore_pyramid *pyramid;
        const int64_t *want;
        const char *name;
    } cases[] = {{&TORCHVISION_LEVELS, &four, want_nan, "nan"},
                 {&ZERO_LEVELS, &four, want_zero, "zero"},
                 {&SKIP_LEVELS, &four, want_skip, "skip"},
                 {&offset, &four, want_offset, "pixel_offset"},
                 {&inside, &four, want_inside, "epsilon_inside 1e-8"},
                 {&TORCHVISION_LEVELS, &one, want_one, "one map, nan"},
                 {&ZERO_LEVELS, &one, want_one, "one map, zero"},
                 {&SKIP_LEVELS, &one, want_one_skip, "one map, skip"},
                 {&by_rule, &one, want_one_rule, "one map by the rule, nan"},
                 {&by_rule, &four, want_nan, "one_map RULE, four maps"},
                 {&garden, &four, want_garden, "model garden"}};
    int64_t batch[K] = {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, -1};
    for (int d = 0; d < 2; ++d) {
        array c = coords_of(DTYPES[d], rows, K);
        roicore_boxes b = boxes_of(c, batch, K);
        b.masked = 1;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
            int64_t levels[K];
            memset(levels, 0x5a, sizeof levels);
            roicore_error err;
            CHECK(roicore_pyramid_levels(cases[i].rules, cases[i].pyramid, DTYPES[d], &b, levels,
                                         &err) == ROICORE_OK, "%s: %s", cases[i].name, err.message);
            for (int k = 0; k < K; ++k)
                CHECK(levels[k] == cases[i].want[k], "%s %s: box %d at map %lld, want %lld",
                      cases[i].name, d ? "float64" : "float32", k, (long long)levels[k],
                      (long long)cases[i].want[k]);
        }
        /* no boxes: nothing read, nothing written */
        roicore_boxes none = {.k = 0};
        roicore_error err;
        CHECK(roicore_pyramid_levels(&TORCHVISION_LEVELS, &four, DTYPES[d], &none, NULL, &err) ==
                  ROICORE_OK, "no boxes: %s", err.message);
        free(c.data);
    }
}

/* The pyramid of the operator tests: five maps of a 320 x 288 image, 1/4 to 1/64 (levels 2
 * to 6), of two images; boxes of maps 0 to 3 (s from 34 to 559), none of map 4 (s >= 896),
 * one reversed (not pooled) and one masked. */
enum { PYR_N = 2, PYR_L = 5, PYR_K = 11, PYR_PH = 3, PYR_PW = 4 };
static const double PYR_SCALES[PYR_L] = {0.25, 0.125, 0.0625, 0.03125, 0.015625};
static const int64_t PYR_H[PYR_L] = {72, 36, 18, 9, 5}, PYR_W[PYR_L] = {80, 40, 20, 10, 5};
static const double PYR_BOXES[4 * PYR_K] = {
    10, 12, 40, 50,  100, 80, 210, 200,  0, 0, 319, 287,  -50, -60, 400, 390,
    30.5, 40.25, 90.75, 70.5,  60, 50, 20, 90,  5, 5, 200, 250,  150, 100, 300, 280,
    20, 30, 270, 260,  -100, -100, 500, 420,  10, 10, 250, 250};
static const int64_t PYR_BATCH[PYR_K] = {0, 1, 1, 0, 1, 0, 0, 1, 1, 0, -1};
static const int64_t PYR_LEVELS[PYR_K] = {0, 1, 2, 3, 0, -1, 1, 1, 2, 3, -1};

/* RoIAlign conventions a pyramid pools with: torchvision's MultiScaleRoIAlign (sampling 2,
 * not aligned), Paddle's (adaptive, aligned), and MXNet's scale held as a float32 */
static const struct {
    const roicore_roi_align_rules *rules;
    int64_t sampling_ratio;
    int aligned;
    const char *name;
} PYR_ALIGN[] = {{&TORCHVISION_ALIGN, 2, 0, "torchvision"},
                 {&PADDLE_ALIGN, -1, 1, "paddle"},
                 {&MXNET_ALIGN, 2, 1, "mxnet"}};

/* PYR's maps with C channels of random values, NCHW */
static void pyramid_maps(roicore_dtype dt, int64_t C, uint64_t seed, array maps[PYR_L]) {
    for (int l = 0; l < PYR_L; ++l) {
        maps[l] = new_array(dt, PYR_N * C * PYR_H[l] * PYR_W[l]);
        for (int64_t i = 0; i < maps[l].n; ++i) set(maps[l], i, (double)lcg(&seed) / 2e9 - 1);
    }
}
/* their tensors in `layout` (1 NHWC, 0 NCHW, -1 NHWC for even levels only), NHWC ones
 * transposed copies held in nhwc[l] */
static void pyramid_tensors(array maps[PYR_L], array nhwc[PYR_L], int64_t C, int layout,
                            roicore_tensor t[PYR_L]) {
    for (int l = 0; l < PYR_L; ++l) {
        const int h = layout == 1 || (layout == -1 && l % 2 == 0);
        nhwc[l] = h ? to_nhwc(maps[l], PYR_N, C, PYR_H[l], PYR_W[l]) : new_array(maps[l].dtype, 0);
        t[l] = IN(h ? nhwc[l].data : maps[l].data, maps[l].dtype, h ? ROICORE_NHWC : ROICORE_NCHW,
                  PYR_N, C, PYR_H[l], PYR_W[l]);
    }
}

/* Each box's row equals RoIAlign of that box alone on its level's map at that level's scale,
 * bit for bit; unpooled rows are 0 over a garbage-filled output; the same bits at 1, 2 and 3
 * threads, and from NHWC maps or into an NHWC output.  C = 5 (a padded block) and 72 (whole
 * blocks, and NHWC maps read in place). */
static void pyramid_forward(void) {
    const int64_t channels[] = {5, 72};
    for (int d = 0; d < 2; ++d)
        for (int ci = 0; ci < 2; ++ci) {
            const roicore_dtype dt = DTYPES[d];
            const int64_t C = channels[ci], bsz = dt == ROICORE_FLOAT32 ? 4 : 8;
            const int64_t row = C * PYR_PH * PYR_PW, bytes = PYR_K * row * bsz;
            array maps[PYR_L], nhwc[PYR_L], mixed[PYR_L];
            roicore_tensor t[PYR_L], th[PYR_L], tm[PYR_L];
            pyramid_maps(dt, C, 3 + (uint64_t)ci, maps);
            pyramid_tensors(maps, nhwc, C, 1, th);
            pyramid_tensors(maps, mixed, C, -1, tm);
            array none[PYR_L];
            pyramid_tensors(maps, none, C, 0, t);
            array c = coords_of(dt, PYR_BOXES, PYR_K);
            int64_t batch[PYR_K];
            memcpy(batch, PYR_BATCH, sizeof batch);
            roicore_boxes b = boxes_of(c, batch, PYR_K);
            b.masked = 1;
            const roicore_pyramid p = pyramid_of(PYR_L, 2, PYR_SCALES);
            roicore_error err;
            int64_t levels[PYR_K];
            CHECK(roicore_pyramid_levels(&TORCHVISION_LEVELS, &p, dt, &b, levels, &err) == ROICORE_OK,
                  "%s", err.message);
            CHECK(memcmp(levels, PYR_LEVELS, sizeof levels) == 0, "the test boxes' levels moved");
            for (size_t a = 0; a < sizeof PYR_ALIGN / sizeof PYR_ALIGN[0]; ++a) {
                const roicore_roi_align_rules *rules = PYR_ALIGN[a].rules;
                const int64_t sr = PYR_ALIGN[a].sampling_ratio;
                const int aligned = PYR_ALIGN[a].aligned;
                array out[3];
                for (int n = 0; n < 3; ++n) {
                    out[n] = new_array(dt, PYR_K * row);
                    memset(out[n].data, 0xa5, (size_t)bytes);
                    const roicore_exec ex = {.n_threads = n + 1};
                    roicore_out_tensor to = OUT(out[n].data, dt, ROICORE_NCHW, PYR_K, C, PYR_PH, PYR_PW);
                    CHECK(roicore_pyramid_roi_align_forward(rules, &TORCHVISION_LEVELS, &p, t, &b, sr,
                                                            aligned, &to, &ex, &err) == ROICORE_OK,
                          "%s forward: %s", PYR_ALIGN[a].name, err.message);
                }
                CHECK(memcmp(out[0].data, out[1].data, (size_t)bytes) == 0 &&
                          memcmp(out[0].data, out[2].data, (size_t)bytes) == 0,
                      "%s %s C=%lld: pyramid forward differs between 1, 2 and 3 threads",
                      PYR_ALIGN[a].name, d ? "float64" : "float32", (long long)C);
                array want = new_array(dt, row);  /* zeros, for the unpooled rows */
                for (int64_t k = 0; k < PYR_K; ++k) {
                    const int64_t l = PYR_LEVELS[k];
                    if (l >= 0) {
                        roicore_boxes one = {.coords = (const char *)c.data + 4 * k * bsz,
                                             .batch = batch + k, .k = 1};
                        roicore_out_tensor tw = OUT(want.data, dt, ROICORE_NCHW, 1, C, PYR_PH, PYR_PW);
                        CHECK(roicore_roi_align_forward(rules, &t[l], &one, PYR_SCALES[l], sr, aligned,
                                                        &tw, &one_thread, &err) == ROICORE_OK,
                              "%s", err.message);
                    } else {
                        memset(want.data, 0, (size_t)(row * bsz));
                    }
                    CHECK(memcmp((char *)out[0].data + k * row * bsz, want.data, (size_t)(row * bsz)) == 0,
                          "%s %s C=%lld: box %lld (map %lld) differs from RoIAlign on its map",
                          PYR_ALIGN[a].name, d ? "float64" : "float32", (long long)C, (long long)k,
                          (long long)l);
                }
                /* NHWC maps into an NHWC output: the transposed rows; NHWC maps of some levels
                 * only, into an NCHW output: the same rows */
                array got_h = new_array(dt, PYR_K * row), got_m = new_array(dt, PYR_K * row);
                memset(got_h.data, 0xa5, (size_t)bytes);
                memset(got_m.data, 0xa5, (size_t)bytes);
                roicore_out_tensor toh = OUT(got_h.data, dt, ROICORE_NHWC, PYR_K, C, PYR_PH, PYR_PW);
                roicore_out_tensor tom = OUT(got_m.data, dt, ROICORE_NCHW, PYR_K, C, PYR_PH, PYR_PW);
                CHECK(roicore_pyramid_roi_align_forward(rules, &TORCHVISION_LEVELS, &p, th, &b, sr,
                                                        aligned, &toh, &three_threads, &err) == ROICORE_OK,
                      "NHWC: %s", err.message);
                CHECK(roicore_pyramid_roi_align_forward(rules, &TORCHVISION_LEVELS, &p, tm, &b, sr,
                                                        aligned, &tom, &three_threads, &err) == ROICORE_OK,
                      "mixed layouts: %s", err.message);
                array want_h = to_nhwc(out[0], PYR_K, C, PYR_PH, PYR_PW);
                CHECK(memcmp(want_h.data, got_h.data, (size_t)bytes) == 0,
                      "%s %s C=%lld: NHWC pyramid forward differs from NCHW", PYR_ALIGN[a].name,
                      d ? "float64" : "float32", (long long)C);
                CHECK(memcmp(out[0].data, got_m.data, (size_t)bytes) == 0,
                      "%s %s C=%lld: pyramid forward from maps of mixed layouts differs",
                      PYR_ALIGN[a].name, d ? "float64" : "float32", (long long)C);
                free(want.data); free(want_h.data); free(got_h.data); free(got_m.data);
                for (int n = 0; n < 3; ++n) free(out[n].data);
            }
            for (int l = 0; l < PYR_L; ++l) {
                free(maps[l].data); free(nhwc[l].data); free(mixed[l].data); free(none[l].data);
            }
            free(c.data);
        }
}

/* Each grad map equals RoIAlign's backward over only its level's boxes (their coordinates,
 * images and upstream rows gathered by hand), bit for bit, every element written over a
 * NaN fill; map 4, which no box reaches, all zeros; 1 and 3 threads and NHWC alike. */
static void pyramid_backward(void) {
    const int64_t channels[] = {5, 72};
    for (int d = 0; d < 2; ++d)
        for (int ci = 0; ci < 2; ++ci) {
            const roicore_dtype dt = DTYPES[d];
            const int64_t C = channels[ci], bsz = dt == ROICORE_FLOAT32 ? 4 : 8;
            const int64_t row = C * PYR_PH * PYR_PW;
            uint64_t seed = 17 + (uint64_t)ci;
            array g = new_array(dt, PYR_K * row);
            for (int64_t i = 0; i < g.n; ++i) set(g, i, (double)lcg(&seed) / 2e9 - 1);
            array gh = to_nhwc(g, PYR_K, C, PYR_PH, PYR_PW);
            roicore_tensor tg = IN(g.data, dt, ROICORE_NCHW, PYR_K, C, PYR_PH, PYR_PW);
            roicore_tensor tgh = IN(gh.data, dt, ROICORE_NHWC, PYR_K, C, PYR_PH, PYR_PW);
            array c = coords_of(dt, PYR_BOXES, PYR_K);
            int64_t batch[PYR_K];
            memcpy(batch, PYR_BATCH, sizeof batch);
            roicore_boxes b = boxes_of(c, batch, PYR_K);
            b.masked = 1;
            const roicore_pyramid p = pyramid_of(PYR_L, 2, PYR_SCALES);
            for (size_t a = 0; a < sizeof PYR_ALIGN / sizeof PYR_ALIGN[0]; ++a) {
                const roicore_roi_align_rules *rules = PYR_ALIGN[a].rules;
                const int64_t sr = PYR_ALIGN[a].sampling_ratio;
                const int aligned = PYR_ALIGN[a].aligned;
                array dx[3][PYR_L];  /* 1 thread, 3 threads, NHWC */
                roicore_out_tensor tdx[3][PYR_L];
                roicore_error err;
                for (int v = 0; v < 3; ++v) {
                    for (int l = 0; l < PYR_L; ++l) {
                        dx[v][l] = new_array(dt, PYR_N * C * PYR_H[l] * PYR_W[l]);
                        for (int64_t i = 0; i < dx[v][l].n; ++i) set(dx[v][l], i, NAN);
                        tdx[v][l] = OUT(dx[v][l].data, dt, v == 2 ? ROICORE_NHWC : ROICORE_NCHW,
                                        PYR_N, C, PYR_H[l], PYR_W[l]);
                    }
                    CHECK(roicore_pyramid_roi_align_backward(rules, &TORCHVISION_LEVELS, &p,
                                                             v == 2 ? &tgh : &tg, &b, sr, aligned,
                                                             tdx[v], v ? &three_threads : &one_thread,
                                                             &err) == ROICORE_OK,
                          "%s backward: %s", PYR_ALIGN[a].name, err.message);
                }
                for (int l = 0; l < PYR_L; ++l) {
                    /* level l's boxes, images and upstream rows, in box order */
                    array lc = new_array(dt, 4 * PYR_K), lg = new_array(dt, PYR_K * row);
                    int64_t lb[PYR_K], lk = 0;
                    for (int64_t k = 0; k < PYR_K; ++k) {
                        if (PYR_LEVELS[k] != l) continue;
                        memcpy((char *)lc.data + 4 * lk * bsz, (char *)c.data + 4 * k * bsz, (size_t)(4 * bsz));
                        memcpy((char *)lg.data + lk * row * bsz, (char *)g.data + k * row * bsz, (size_t)(row * bsz));
                        lb[lk++] = batch[k];
                    }
                    array want = new_array(dt, dx[0][l].n);
                    for (int64_t i = 0; i < want.n; ++i) set(want, i, 7);
                    roicore_boxes sub = boxes_of(lc, lb, lk);
                    roicore_tensor tlg = IN(lg.data, dt, ROICORE_NCHW, lk, C, PYR_PH, PYR_PW);
                    roicore_out_tensor tw = OUT(want.data, dt, ROICORE_NCHW, PYR_N, C, PYR_H[l], PYR_W[l]);
                    CHECK(roicore_roi_align_backward(rules, &tlg, &sub, PYR_SCALES[l], sr, aligned, &tw,
                                                     &one_thread, &err) == ROICORE_OK, "%s", err.message);
                    const size_t n_bytes = (size_t)(want.n * bsz);
                    CHECK(memcmp(want.data, dx[0][l].data, n_bytes) == 0,
                          "%s %s C=%lld: grad map %d differs from RoIAlign's backward over its %lld boxes",
                          PYR_ALIGN[a].name, d ? "float64" : "float32", (long long)C, l, (long long)lk);
                    CHECK(memcmp(dx[0][l].data, dx[1][l].data, n_bytes) == 0,
                          "%s %s C=%lld: grad map %d differs between 1 and 3 threads",
                          PYR_ALIGN[a].name, d ? "float64" : "float32", (long long)C, l);
                    array want_h = to_nhwc(dx[0][l], PYR_N, C, PYR_H[l], PYR_W[l]);
                    CHECK(memcmp(want_h.data, dx[2][l].data, n_bytes) == 0,
                          "%s %s C=%lld: NHWC grad map %d differs from NCHW", PYR_ALIGN[a].name,
                          d ? "float64" : "float32", (long long)C, l);
                    if (l == PYR_L - 1) {
                        int zero = lk == 0;
                        for (int64_t i = 0; i < dx[0][l].n; ++i) zero &= get(dx[0][l], i) == 0;
                        CHECK(zero, "the grad map no box reaches is not all zeros");
                    }
                    free(lc.data); free(lg.data); free(want.data); free(want_h.data);
                }
                for (int v = 0; v < 3; ++v)
                    for (int l = 0; l < PYR_L; ++l) free(dx[v][l].data);
            }
            free(g.data); free(gh.data); free(c.data);
        }
    /* no boxes at all: every grad map zeroed, and a forward with nothing to write */
    float dx0[2 * 3 * 16], dx1[2 * 3 * 4];
    for (int i = 0; i < 96; ++i) dx0[i] = NAN;
    for (int i = 0; i < 24; ++i) dx1[i] = NAN;
    const double scales[2] = {0.25, 0.125};
    const roicore_pyramid p = pyramid_of(2, 2, scales);
    roicore_out_tensor tdx[2] = {OUT(dx0, ROICORE_FLOAT32, ROICORE_NCHW, 2, 3, 4, 4),
                                 OUT(dx1, ROICORE_FLOAT32, ROICORE_NHWC, 2, 3, 2, 2)};
    roicore_tensor maps[2] = {IN(dx0, ROICORE_FLOAT32, ROICORE_NCHW, 2, 3, 4, 4),
                              IN(dx1, ROICORE_FLOAT32, ROICORE_NHWC, 2, 3, 2, 2)};
    roicore_tensor g = IN(NULL, ROICORE_FLOAT32, ROICORE_NCHW, 0, 3, 2, 2);
    roicore_out_tensor y = OUT(NULL, ROICORE_FLOAT32, ROICORE_NCHW, 0, 3, 2, 2);
    roicore_boxes none = {.k = 0};
    roicore_error err;
    CHECK(roicore_pyramid_roi_align_forward(&TORCHVISION_ALIGN, &TORCHVISION_LEVELS, &p, maps, &none,
                                            2, 0, &y, NULL, &err) == ROICORE_OK, "%s", err.message);
    CHECK(roicore_pyramid_roi_align_backward(&TORCHVISION_ALIGN, &TORCHVISION_LEVELS, &p, &g, &none,
                                             2, 0, tdx, NULL, &err) == ROICORE_OK, "%s", err.message);
    int zero = 1;
    for (int i = 0; i < 96; ++i) zero &= dx0[i] == 0;
    for (int i = 0; i < 24; ++i) zero &= dx1[i] == 0;
    CHECK(zero, "a pyramid backward without boxes left a grad map nonzero");
}

/* `call` fails with `want` and a message holding `text` */
#define EXPECT_SAYS(call, want, text)                                                       \
    do {                                                                                    \
        EXPECT(call, want);                                                                 \
        CHECK(strstr(err.message, text) != NULL, "%s: '%s' does not say '%s'", #call,       \
              err.message, text);                                                           \
    } while (0)

/* The Model Garden's sampler on v = 4y + x: outside the map the weights extrapolate
 * linearly (samples at -1 and 1 of a box from -2 to 2); beyond the last pixel both
 * neighbours clamp to it (samples at 0.5 and 3.5 of a box from -1 to 5) */
static void model_garden_sampler(void) {
    const int64_t batch[] = {0, 0};
    roicore_error err;
    static const double gboxes[] = {-2, -2, 2, 2, -1, -1, 5, 5};
    static const double gwant[] = {-5, -3, 3, 5, 2.5, 5, 12.5, 15};
    const roicore_roi_align_rules garden = {.sampler = ROICORE_SAMPLER_MODEL_GARDEN};
    for (int d = 0; d < 2; ++d) {
        array gx = arange(DTYPES[d], 16, 0, 1), gc = coords_of(DTYPES[d], gboxes, 2);
        array gout = new_array(DTYPES[d], 8);
        roicore_tensor gtx = tensor(gx, 1, 1, 4, 4);
        roicore_out_tensor gto = out_tensor(gout, 2, 1, 2, 2);
        roicore_boxes gb = boxes_of(gc, batch, 2);
        CHECK(roicore_roi_align_forward(&garden, &gtx, &gb, 1.0, 1, 0, &gto, &one_thread, &err)
                  == ROICORE_OK, "%s", err.message);
        double ggot[8];
        to_doubles(gout, ggot);
        check_values("model garden roi_align", ggot, gwant, 8, 0);
        EXPECT_SAYS(roicore_roi_align_forward(&garden, &gtx, &gb, 1.0, 2, 0, &gto, &one_thread,
                                              &err), ROICORE_ERR_ARGUMENT, "sampling_ratio must be 1");
        EXPECT_SAYS(roicore_roi_align_forward(&garden, &gtx, &gb, 1.0, 1, 1, &gto, &one_thread,
                                              &err), ROICORE_ERR_ARGUMENT, "Model Garden");
        free(gx.data); free(gc.data); free(gout.data);
    }
}

/* Every argument of the pyramid's functions checked, with a message naming it, before any
 * output is written. */
static void pyramid_bad_input(void) {
    enum { N = 2, C = 3, K = 2 };
    const double scales_0[3] = {0.25, 0.125, 0.0625};
    double scales[3] = {0.25, 0.125, 0.0625};
    const int64_t side[3] = {16, 8, 4};
    array m[3], dx[3];
    roicore_tensor maps[3];
    roicore_out_tensor gmaps[3];
    for (int l = 0; l < 3; ++l) {
        m[l] = arange(ROICORE_FLOAT32, N * C * side[l] * side[l], 0, 1);
        dx[l] = new_array(ROICORE_FLOAT32, m[l].n);
        for (int64_t i = 0; i < dx[l].n; ++i) set(dx[l], i, 7);
        maps[l] = tensor(m[l], N, C, side[l], side[l]);
        gmaps[l] = out_tensor(dx[l], N, C, side[l], side[l]);
    }
    static const double rows[] = {0, 0, 30, 30, 8, 4, 60, 50};
    array c = coords_of(ROICORE_FLOAT32, rows, K);
    int64_t batch[K] = {0, 1}, levels[K] = {5, 5};
    array out = new_array(ROICORE_FLOAT32, K * C * 4), g = arange(ROICORE_FLOAT32, K * C * 4, 1, 0);
    for (int64_t i = 0; i < out.n; ++i) set(out, i, 99);
    roicore_out_tensor to = out_tensor(out, K, C, 2, 2);
    roicore_tensor tg = tensor(g, K, C, 2, 2);
    roicore_boxes b = boxes_of(c, batch, K);
    roicore_pyramid p = pyramid_of(3, 2, scales);
    roicore_level_rules lr = TORCHVISION_LEVELS;
    const roicore_roi_align_rules *ar = &TORCHVISION_ALIGN;
    roicore_error err;
#define FWD(rules_, lr_, p_, maps_) \
    roicore_pyramid_roi_align_forward(rules_, lr_, p_, maps_, &b, 2, 0, &to, &one_thread, &err)
#define BWD(rules_, lr_, p_, gmaps_) \
    roicore_pyramid_roi_align_backward(rules_, lr_, p_, &tg, &b, 2, 0, gmaps_, &one_thread, &err)
#define LEVELS(lr_, p_) roicore_pyramid_levels(lr_, p_, ROICORE_FLOAT32, &b, levels, &err)
    /* missing pointers */
    EXPECT_SAYS(FWD(NULL, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "RoIAlign rules");
    EXPECT_SAYS(BWD(NULL, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "RoIAlign rules");
    EXPECT_SAYS(FWD(ar, NULL, &p, maps), ROICORE_ERR_ARGUMENT, "level rules");
    EXPECT_SAYS(BWD(ar, NULL, &p, gmaps), ROICORE_ERR_ARGUMENT, "level rules");
    EXPECT_SAYS(LEVELS(NULL, &p), ROICORE_ERR_ARGUMENT, "level rules");
    EXPECT_SAYS(FWD(ar, &lr, NULL, maps), ROICORE_ERR_ARGUMENT, "pyramid");
    EXPECT_SAYS(BWD(ar, &lr, NULL, gmaps), ROICORE_ERR_ARGUMENT, "pyramid");
    EXPECT_SAYS(LEVELS(&lr, NULL), ROICORE_ERR_ARGUMENT, "pyramid");
    EXPECT_SAYS(FWD(ar, &lr, &p, NULL), ROICORE_ERR_ARGUMENT, "maps");
    EXPECT_SAYS(BWD(ar, &lr, &p, NULL), ROICORE_ERR_ARGUMENT, "grad_maps");
    EXPECT_SAYS(roicore_pyramid_levels(&lr, &p, ROICORE_FLOAT32, &b, NULL, &err), ROICORE_ERR_ARGUMENT, "levels");
    p.spatial_scales = NULL;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "spatial_scales");
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "spatial_scales");
    p.spatial_scales = scales;
    /* the pyramid's fields */
    const int64_t bad_levels[] = {0, -1, ROICORE_MAX_LEVELS + 1};
    for (int i = 0; i < 3; ++i) {
        p.n_levels = bad_levels[i];
        EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "levels");
        EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "levels");
        EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "levels");
    }
    p.n_levels = 3;
    const double bad_sizes[] = {0, -224, NAN, INFINITY};
    for (int i = 0; i < 4; ++i) {
        p.canonical_size = bad_sizes[i];
        EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "canonical_size");
        EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "canonical_size");
        EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "canonical_size");
    }
    p.canonical_size = 224;
    p.first_level = 1025;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "first_level");
    p.first_level = 2;
    p.canonical_level = -1025;
    EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "canonical_level");
    p.canonical_level = 4;
    for (int i = 0; i < 4; ++i) {
        p.reserved[i] = 1;
        EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "reserved");
        EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "reserved");
        EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "reserved");
        p.reserved[i] = 0;
    }
    /* the level rules' codes and reserved fields */
    lr.invalid = (roicore_level_invalid)3;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "LevelRules.invalid");
    EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "LevelRules.invalid");
    lr = TORCHVISION_LEVELS;
    lr.epsilon = (roicore_level_epsilon)2;
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "LevelRules.epsilon");
    lr = TORCHVISION_LEVELS;
    lr.pixel_offset = 2;
    EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "LevelRules.pixel_offset");
    lr = TORCHVISION_LEVELS;
    lr.epsilon_inside = -1;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "LevelRules.epsilon_inside");
    lr = TORCHVISION_LEVELS;
    lr.one_map = (roicore_level_one_map)2;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "LevelRules.one_map");
    lr = TORCHVISION_LEVELS;
    lr.formula = (roicore_level_formula)2;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "LevelRules.formula");
    lr = TORCHVISION_LEVELS;
    lr.reserved[9] = 1;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "reserved");
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "reserved");
    EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_ARGUMENT, "reserved");
    lr = TORCHVISION_LEVELS;
    EXPECT_SAYS(roicore_pyramid_levels(&lr, &p, (roicore_dtype)7, &b, levels, &err), ROICORE_ERR_ARGUMENT, "dtype");
    /* maps that disagree with maps[0] in N, C or dtype, and a map of no rows */
    maps[1].n = 3;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "maps[1]");
    maps[1].n = N;
    maps[2].c = 2;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "maps[2]");
    maps[2].c = C;
    maps[1].dtype = ROICORE_FLOAT64;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "maps[1]");
    maps[1].dtype = ROICORE_FLOAT32;
    maps[2].h = 0;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "maps[2]");
    maps[2].h = 4;
    maps[2].reserved[0] = 1;
    EXPECT(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT);
    maps[2].reserved[0] = 0;
    gmaps[2].c = 4;
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "grad_maps[2]");
    gmaps[2].c = C;
    gmaps[1].dtype = ROICORE_FLOAT64;
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "grad_maps[1]");
    gmaps[1].dtype = ROICORE_FLOAT32;
    /* spatial scales: negative, NaN, and one a float32 holds as 0 */
    const double bad_scales[] = {-0.125, NAN, INFINITY, 1e-50};
    for (int i = 0; i < 4; ++i) {
        scales[1] = bad_scales[i];
        EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "spatial_scale");
        EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "spatial_scale");
    }
    scales[1] = scales_0[1];
    /* outputs of the wrong shape or dtype, upstream gradients of the wrong shape */
    to.n = 3;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "out");
    to.n = K;
    to.c = 2;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "out");
    to.c = C;
    to.dtype = ROICORE_FLOAT64;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "out");
    to.dtype = ROICORE_FLOAT32;
    to.h = 0;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "out");
    to.h = 2;
    tg.n = 1;
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "grad_output");
    tg.n = K;
    /* outputs sharing memory: with a map, with each other, with the boxes */
    to.data = m[2].data;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_ARGUMENT, "share memory");
    to.data = out.data;
    gmaps[2].data = (float *)dx[0].data + 8;
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "grad_maps");
    gmaps[2].data = dx[2].data;
    gmaps[1] = OUT(g.data, ROICORE_FLOAT32, ROICORE_NCHW, N, C, 2, 2);  /* g's bytes exactly */
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_ARGUMENT, "grad_output");
    gmaps[1] = out_tensor(dx[1], N, C, 8, 8);
    EXPECT_SAYS(roicore_pyramid_levels(&lr, &p, ROICORE_FLOAT32, &b, (int64_t *)c.data, &err), ROICORE_ERR_ARGUMENT, "levels");
    /* sampling ratio, aligned, exec */
    EXPECT(roicore_pyramid_roi_align_forward(ar, &lr, &p, maps, &b, 5000, 0, &to, NULL, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_pyramid_roi_align_backward(ar, &lr, &p, &tg, &b, 2, 2, gmaps, NULL, &err), ROICORE_ERR_ARGUMENT);
    roicore_exec ex = {.n_threads = 1};
    ex.reserved[0] = &ex;
    EXPECT(roicore_pyramid_roi_align_forward(ar, &lr, &p, maps, &b, 2, 0, &to, &ex, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_pyramid_roi_align_backward(ar, &lr, &p, &tg, &b, 2, 0, gmaps, &ex, &err), ROICORE_ERR_ARGUMENT);
    /* box data: an image out of range, a non-finite coordinate, a coordinate beyond 2**24
     * pixels at its own level's scale */
    batch[1] = 2;
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_VALUE, "batch[1] = 2");
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_VALUE, "batch[1] = 2");
    CHECK(strcmp(err.argument, "batch") == 0 && err.index == 1, "argument '%s' index %lld",
          err.argument, (long long)err.index);
    batch[1] = -1;
    EXPECT(LEVELS(&lr, &p), ROICORE_ERR_VALUE);
    batch[1] = 1;
    set(c, 6, NAN);
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_VALUE, "finite");
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_VALUE, "finite");
    EXPECT_SAYS(LEVELS(&lr, &p), ROICORE_ERR_VALUE, "finite");
    CHECK(strcmp(err.argument, "boxes") == 0 && err.index == 1, "argument '%s' index %lld",
          err.argument, (long long)err.index);
    set(c, 6, -INFINITY);
    EXPECT(FWD(ar, &lr, &p, maps), ROICORE_ERR_VALUE);
    set(c, 6, 60);
    /* 24 x 24 at x = 7e7: map 0, where 7e7 / 4 pixels is beyond 2**24 */
    set(c, 4, 7e7);
    set(c, 6, 7e7 + 24);
    EXPECT_SAYS(FWD(ar, &lr, &p, maps), ROICORE_ERR_VALUE, "map 0");
    EXPECT_SAYS(BWD(ar, &lr, &p, gmaps), ROICORE_ERR_VALUE, "map 0");
    CHECK(strcmp(err.argument, "boxes") == 0 && err.index == 1, "argument '%s' index %lld",
          err.argument, (long long)err.index);
    set(c, 4, 8);
    set(c, 6, 60);
    /* nothing was written */
    int untouched = 1;
    for (int64_t i = 0; i < out.n; ++i) untouched &= get(out, i) == 99;
    for (int l = 0; l < 3; ++l)
        for (int64_t i = 0; i < dx[l].n; ++i) untouched &= get(dx[l], i) == 7;
    untouched &= levels[0] == 5 && levels[1] == 5;
    CHECK(untouched, "a refused pyramid call wrote to its outputs");
    /* and the arguments, restored, are good */
    CHECK(FWD(ar, &lr, &p, maps) == ROICORE_OK, "%s", err.message);
    CHECK(BWD(ar, &lr, &p, gmaps) == ROICORE_OK, "%s", err.message);
    CHECK(LEVELS(&lr, &p) == ROICORE_OK && levels[0] == 0 && levels[1] == 0, "%s", err.message);
    /* a far box the size of the last map's boxes is in range there */
    set(c, 4, 7e7);
    set(c, 6, 7e7 + 2000);
    set(c, 7, 2004);
    CHECK(FWD(ar, &lr, &p, maps) == ROICORE_OK, "%s", err.message);
    CHECK(LEVELS(&lr, &p) == ROICORE_OK && levels[1] == 2, "%s", err.message);
#undef FWD
#undef BWD
#undef LEVELS
    /* rules from arrays: the four required fields (one_map and formula default to ALL and
       LOG2), five, all six, too many (a newer roicore's), too few, bad codes */
    const int64_t fields[] = {1, 1, 1, 2, 1, 1, 0};
    roicore_level_rules from;
    memset(&from, 0x5a, sizeof from);
    CHECK(roicore_level_rules_from_array(fields, 4, &from, &err) == ROICORE_OK &&
              from.pixel_offset == 1 && from.epsilon == ROICORE_LEVEL_EPSILON_1E8 &&
              from.epsilon_inside == 1 && from.invalid == ROICORE_LEVEL_INVALID_SKIP &&
              from.one_map == ROICORE_LEVEL_ONE_MAP_ALL &&
              from.formula == ROICORE_LEVEL_FORMULA_LOG2 && from.reserved[0] == 0 &&
              from.reserved[9] == 0,
          "a 4-field LevelRules array: %s", err.message);
    CHECK(roicore_level_rules_from_array(fields, 5, &from, &err) == ROICORE_OK &&
              from.one_map == ROICORE_LEVEL_ONE_MAP_RULE &&
              from.formula == ROICORE_LEVEL_FORMULA_LOG2,
          "a 5-field LevelRules array: %s", err.message);
    CHECK(roicore_level_rules_from_array(fields, 6, &from, &err) == ROICORE_OK &&
              from.formula == ROICORE_LEVEL_FORMULA_MODEL_GARDEN,
          "a 6-field LevelRules array: %s", err.message);
    EXPECT_SAYS(roicore_level_rules_from_array(fields, 7, &from, &err), ROICORE_ERR_ARGUMENT, "newer roicore");
    EXPECT_SAYS(roicore_level_rules_from_array(fields, 3, &from, &err), ROICORE_ERR_ARGUMENT, "LevelRules");
    EXPECT(roicore_level_rules_from_array(NULL, 4, &from, &err), ROICORE_ERR_ARGUMENT);
    EXPECT(roicore_level_rules_from_array(fields, 4, NULL, &err), ROICORE_ERR_ARGUMENT);
    const int64_t bad_invalid[] = {0, 0, 0, 3}, bad_epsilon[] = {0, -1, 0, 0},
                  bad_offset[] = {(int64_t)1 << 32, 0, 0, 0};
    EXPECT_SAYS(roicore_level_rules_from_array(bad_invalid, 4, &from, &err), ROICORE_ERR_ARGUMENT, "LevelRules.invalid");
    EXPECT_SAYS(roicore_level_rules_from_array(bad_epsilon, 4, &from, &err), ROICORE_ERR_ARGUMENT, "LevelRules.epsilon");
    EXPECT_SAYS(roicore_level_rules_from_array(bad_offset, 4, &from, &err), ROICORE_ERR_ARGUMENT, "LevelRules.pixel_offset");
    CHECK(from.invalid == ROICORE_LEVEL_INVALID_SKIP, "a refused array changed the rules");
    for (int l = 0; l < 3; ++l) {
        free(m[l].data); free(dx[l].data);
    }
    free(c.data); free(out.data); free(g.data);
}

/* A box whose adaptive grid passes the limit is refused by its own index before any level
 * writes: the boxes before it, on finer levels, leave the outputs untouched too. */
static void pyramid_grid_refused_before_writing(void) {
    const double scales[4] = {0.25, 0.125, 0.0625, 0.03125};
    const int64_t side[4] = {64, 32, 16, 8};
    array m[4], dx[4];
    roicore_tensor maps[4];
    roicore_out_tensor gmaps[4];
    for (int l = 0; l < 4; ++l) {
        m[l] = arange(ROICORE_FLOAT64, side[l] * side[l], 0, 1);
        dx[l] = new_array(ROICORE_FLOAT64, m[l].n);
        for (int64_t i = 0; i < dx[l].n; ++i) set(dx[l], i, 99);
        maps[l] = tensor(m[l], 1, 1, side[l], side[l]);
        gmaps[l] = out_tensor(dx[l], 1, 1, side[l], side[l]);
    }
    static const double rows[] = {0, 0, 30, 30, 0, 0, 100, 100, 0, 0, 3e6, 3e6};
    array c = coords_of(ROICORE_FLOAT64, rows, 3);
    int64_t batch[3] = {0, 0, 0};
    array out = new_array(ROICORE_FLOAT64, 3), g = arange(ROICORE_FLOAT64, 3, 1, 0);
    for (int64_t i = 0; i < 3; ++i) set(out, i, 99);
    roicore_out_tensor to = out_tensor(out, 3, 1, 1, 1);
    roicore_tensor tg = tensor(g, 3, 1, 1, 1);
    roicore_boxes b = boxes_of(c, batch, 3);
    roicore_pyramid p = pyramid_of(4, 2, scales);
    roicore_error err;
    CHECK(roicore_pyramid_roi_align_forward(&TORCHVISION_ALIGN, &TORCHVISION_LEVELS, &p, maps, &b,
                                            -1, 0, &to, &one_thread, &err) == ROICORE_ERR_VALUE &&
              err.index == 2 && strstr(err.message, "boxes[2]"),
          "forward: %s (index %lld)", err.message, (long long)err.index);
    for (int64_t i = 0; i < 3; ++i) CHECK(get(out, i) == 99, "out[%lld] was written", (long long)i);
    CHECK(roicore_pyramid_roi_align_backward(&TORCHVISION_ALIGN, &TORCHVISION_LEVELS, &p, &tg, &b,
                                             -1, 0, gmaps, &one_thread, &err) == ROICORE_ERR_VALUE &&
              err.index == 2,
          "backward: %s (index %lld)", err.message, (long long)err.index);
    for (int l = 0; l < 4; ++l) {
        CHECK(get(dx[l], 0) == 99, "grad_maps[%d] was written", l);
        free(m[l].data); free(dx[l].data);
    }
    free(c.data); free(out.data); free(g.data);
}

/* A poll that asks to stop ends a pyramid forward that would otherwise run on and on:
 * RoIAlign with 1024 x 1024 samples per bin over a 256 x 256 map. */
static void pyramid_interrupt(void) {
    const int64_t C = 64;
    array m0 = new_array(ROICORE_FLOAT32, C * 256 * 256), m1 = new_array(ROICORE_FLOAT32, C * 128 * 128);
    array out = new_array(ROICORE_FLOAT32, C * 32 * 32);
    static const double whole[] = {0, 0, 255, 255};  /* s = 255: level 4, map 0 */
    array c = coords_of(ROICORE_FLOAT32, whole, 1);
    int64_t b0[] = {0};
    const double scales[2] = {1.0, 0.5};
    const roicore_pyramid p = pyramid_of(2, 4, scales);
    roicore_tensor maps[2] = {tensor(m0, 1, C, 256, 256), tensor(m1, 1, C, 128, 128)};
    roicore_out_tensor to = out_tensor(out, 1, C, 32, 32);
    roicore_boxes b = boxes_of(c, b0, 1);
    int polls = 0;
    roicore_exec stopping = {.n_threads = 2, .poll = stop_now, .poll_arg = &polls};
    roicore_error err;
    EXPECT(roicore_pyramid_roi_align_forward(&MXNET_ALIGN, &TORCHVISION_LEVELS, &p, maps, &b, 1024,
                                             0, &to, &stopping, &err), ROICORE_ERR_INTERRUPTED);
    CHECK(polls >= 1, "the poll callback was not called");
    free(m0.data); free(m1.data); free(out.data); free(c.data);
}

/* ------------------------------------------------------------------------ the runtime */

static void allocation_limits(void) {
    roicore_error err;
    const int64_t limit = roicore_get_memory_limit();
    CHECK(roicore_set_memory_limit(1000) == ROICORE_OK, "set_memory_limit(1000)");
    CHECK(roicore_check_allocation(1000, "x", &err) == ROICORE_OK, "1000 bytes under 1000");
    EXPECT(roicore_check_allocation(1001, "the output of shape [7]", &err), ROICORE_ERR_MEMORY);
    CHECK(strstr(err.message, "the output of shape [7] would take 1001 bytes") != NULL, "%s",
          err.message);
    EXPECT(roicore_check_allocation(roicore_mul(INT64_MAX, 2), NULL, &err), ROICORE_ERR_MEMORY);
    CHECK(strstr(err.message, "an allocation would take more than 2**63 bytes") != NULL, "%s",
          err.message);
    CHECK(roicore_set_memory_limit(0) == ROICORE_OK, "set_memory_limit(0)");
    CHECK(roicore_check_allocation(INT64_MAX, "x", &err) == ROICORE_OK, "no limit");
    EXPECT(roicore_check_allocation(-1, "x", &err), ROICORE_ERR_MEMORY);
    CHECK(roicore_set_memory_limit(-5) == ROICORE_ERR_ARGUMENT, "a negative limit is refused");
    CHECK(roicore_get_memory_limit() == 0, "a refused limit changes nothing");
    roicore_set_memory_limit(limit);
    CHECK(roicore_mul(3, 4) == 12 && roicore_mul(-1, 4) == -1 && roicore_mul(INT64_MAX, 2) == -1,
          "roicore_mul");
}

static void runtime_sharing(void) {
    roicore_error err;
    roicore_runtime *mine = roicore_runtime_current();
    CHECK(mine != NULL, "roicore_runtime_current");
    EXPECT(roicore_runtime_share(NULL, &err), ROICORE_ERR_ARGUMENT);
    static int64_t foreign[512];  /* what another version's runtime would look like: not ours */
    EXPECT(roicore_runtime_share((roicore_runtime *)foreign, &err), ROICORE_ERR_ARGUMENT);
    CHECK(strstr(err.message, "runtime comes from a roicore whose runtime differs") != NULL, "%s",
          err.message);
    CHECK(roicore_runtime_current() == mine, "a refused share changes nothing");
    CHECK(roicore_runtime_share(mine, &err) == ROICORE_OK, "sharing one's own runtime: %s",
          err.message);
    CHECK(roicore_runtime_current() == mine, "still the same runtime");
}

/* Ctrl-C: a long call on another thread, and a SIGINT. */
static volatile sig_atomic_t earlier_calls, later_calls;
static void earlier_handler(int sig) { (void)sig; ++earlier_calls; }
static void later_handler(int sig) { (void)sig; ++later_calls; }

typedef struct {
    roicore_status status;
    roicore_error err;
} call_result;

static void *long_call(void *arg) {
    call_result *res = (call_result *)arg;
    roicore_exec two = {.n_threads = 2};  /* no poll: only Ctrl-C can stop it */
    res->status = long_align_call(16, &two, &res->err);
    return NULL;
}

static roicore_status interrupted_call(call_result *res) {
    pthread_t thread;
    memset(res, 0, sizeof *res);
    pthread_create(&thread, NULL, long_call, res);
    struct timespec pause = {0, 200 * 1000 * 1000};
    nanosleep(&pause, NULL);
    raise(SIGINT);
    pthread_join(thread, NULL);
    return res->status;
}

static void ctrl_c(void) {
    roicore_error err;
    call_result res;
    signal(SIGINT, earlier_handler);
    CHECK(roicore_watch_interrupts(&err) == ROICORE_OK, "watch_interrupts: %s", err.message);
    CHECK(interrupted_call(&res) == ROICORE_ERR_INTERRUPTED, "a SIGINT did not stop the "
          "call: %d %s", res.status, res.err.message);
    CHECK(strstr(res.err.message, "Ctrl-C") != NULL, "%s", res.err.message);
    CHECK(earlier_calls == 1, "the earlier handler ran %d times, want 1", (int)earlier_calls);
    /* a call after the signal runs as usual */
    array x = arange(ROICORE_FLOAT32, 64, 0, 1), out = new_array(ROICORE_FLOAT32, 4);
    static const double rows[] = {0, 0, 7, 7};
    array c = coords_of(ROICORE_FLOAT32, rows, 1);
    int64_t b0[] = {0};
    roicore_tensor tx = tensor(x, 1, 1, 8, 8);
    roicore_out_tensor to = out_tensor(out, 1, 1, 2, 2);
    roicore_boxes b = boxes_of(c, b0, 1);
    CHECK(roicore_roi_align_forward(&MXNET_ALIGN, &tx, &b, 1.0, 2, 0, &to, NULL, &err) == ROICORE_OK,
          "a call after the SIGINT: %s", err.message);
    /* a handler installed later (as Python's signal.signal does) is watched again from the
     * next call on */
    signal(SIGINT, later_handler);
    CHECK(interrupted_call(&res) == ROICORE_ERR_INTERRUPTED, "after a new "
          "handler, a SIGINT did not stop the call: %d %s", res.status, res.err.message);
    CHECK(later_calls == 1 && earlier_calls == 1, "handlers ran %d and %d times, want 1 and 1",
          (int)earlier_calls, (int)later_calls);
    signal(SIGINT, SIG_DFL);
    free(x.data); free(out.data); free(c.data);
}

int main(void) {
    mxnet_docstring();
    mxnet_backward_routing();
    paddle_and_deepsense();
    openvino_vectors();
    tensorflow_crops();
    mxnet_psroi();
    torchvision_ps();
    roi_align_vectors();
    model_garden_sampler();
    thread_invariance();
    nhwc_layouts(70);
    nhwc_layouts(64);
    nhwc_psroi_cells();
    bad_input();
    contract();
    scratch_keeping();
    zero_sizes();
    pyramid_levels_rules();
    pyramid_forward();
    pyramid_backward();
    pyramid_bad_input();
    pyramid_grid_refused_before_writing();
    pyramid_interrupt();
    allocation_limits();
    runtime_sharing();
    ctrl_c();
    printf("roicore %s (ABI %d), OpenMP %s\n", roicore_version_string(), roicore_abi_version(),
           roicore_openmp_enabled() ? "on" : "off");
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
