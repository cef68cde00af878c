/* roicore.h: the C API of roicore's RoI pooling kernels.
 *
 * Operators, forward and backward, float32 and float64:
 *   roi_pool max       RoI max pooling (Fast R-CNN), every framework's convention
 *   roi_pool bilinear  bilinear RoI pooling (OpenVINO ROIPooling "bilinear", TF crop_and_resize)
 *   psroi_pool         position-sensitive RoI average pooling (R-FCN, torchvision)
 *   roi_align          RoIAlign (Mask R-CNN)
 *   ps_roi_align       position-sensitive RoIAlign (Light-Head R-CNN, torchvision)
 *
 * Every entry point checks all of its arguments before it touches an array: shapes, sizes
 * whose products would overflow int64, batch indices, argmax values, coordinates that
 * would reach a float-to-int conversion out of range, rules fields.  It returns ROICORE_OK,
 * or an error code with a message in `err` (which may be NULL), and then has written
 * nothing.  So no caller, however careless, makes a kernel read or write out of bounds.
 *
 * Results are bit-identical to the framework the rules describe, for every thread count.
 * The rules structs mirror the frozen dataclasses of roicore.core.conventions field for
 * field; each enum value is named after the Python literal it stands for.
 *
 * Arrays are dense and C-contiguous in their layout; float arrays need only their
 * element's alignment.  Outputs must not overlap inputs.  On Linux, the whole 2 MiB pages
 * inside an output of 4 MiB or more are advised for transparent huge pages (madvise
 * MADV_HUGEPAGE) before it is written, so a freshly mapped output faults once per huge
 * page.  This header needs only C99.
 */
#ifndef ROICORE_H
#define ROICORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ROICORE_API_VERSION 1

/* ------------------------------------------------------------------------ status */

typedef enum {
    ROICORE_OK = 0,
    ROICORE_ERR_ARGUMENT = 1,    /* a shape, size, scalar or rules field is invalid */
    ROICORE_ERR_VALUE = 2,       /* data in an array is invalid: batch index, coordinate, argmax */
    ROICORE_ERR_MEMORY = 3,      /* the call needs more memory than the limit, or malloc failed */
    ROICORE_ERR_INTERRUPTED = 4, /* the exec's poll callback asked the call to stop */
    ROICORE_ERR_UNSUPPORTED = 5  /* a combination this build does not implement */
} roicore_status;

#define ROICORE_MESSAGE_SIZE 480

typedef struct {
    int code;                            /* a roicore_status */
    char message[ROICORE_MESSAGE_SIZE];  /* what was wrong, naming the argument */
} roicore_error;

/* ------------------------------------------------------------------------ arrays */

typedef enum { ROICORE_FLOAT32 = 0, ROICORE_FLOAT64 = 1 } roicore_dtype;
typedef enum { ROICORE_INT32 = 0, ROICORE_INT64 = 1 } roicore_index_type;
typedef enum { ROICORE_NCHW = 0, ROICORE_NHWC = 1 } roicore_layout;

/* A 4-D feature map, gradient or pooled output.  n, c, h, w name the dimensions whatever
 * the layout: a pooled output is (K, C, PH, PW), or (K, PH, PW, C) in memory with
 * ROICORE_NHWC.  `data` is read-only for inputs. */
typedef struct {
    void *data;
    roicore_dtype dtype;
    roicore_layout layout;
    int64_t n, c, h, w;
} roicore_tensor;

/* Boxes: k rows [x1, y1, x2, y2] (x the column, y the row) in the feature map's dtype, and
 * the image of each box, 0 <= batch[k] < N.  With `masked` set, a negative batch index
 * marks a box to skip (GluonCV masks padded proposals with -1): its output is 0, its
 * argmax -1, and it adds nothing to any gradient. */
typedef struct {
    const void *coords;
    const int64_t *batch;
    int64_t k;
    int masked;
} roicore_boxes;

/* How a call runs.  n_threads: as roicore_resolve_threads takes it (0: the default).
 * poll, when not NULL, is called from the calling thread between pieces of work, at most
 * every few tens of milliseconds; a nonzero return stops every thread at its next piece
 * and the call returns ROICORE_ERR_INTERRUPTED (outputs then hold partial results).  A
 * NULL exec means the defaults. */
typedef struct {
    int n_threads;
    int (*poll)(void *arg);
    void *poll_arg;
} roicore_exec;

/* ------------------------------------------------------------------------ rules */

typedef enum {
    ROICORE_PRECISION_INPUT = 0,    /* "input": in the input dtype */
    ROICORE_PRECISION_FLOAT32 = 1,  /* "float32": a C float, whatever the input */
    ROICORE_PRECISION_FLOAT64 = 2   /* "float64": in double */
} roicore_precision;

typedef enum {
    ROICORE_BIN_ARITHMETIC_INPUT = 0,    /* "input" */
    ROICORE_BIN_ARITHMETIC_FLOAT32 = 1,  /* "float32" */
    ROICORE_BIN_ARITHMETIC_EXACT = 2     /* "exact": integers */
} roicore_bin_arithmetic;

typedef enum {
    ROICORE_INITIAL_NEG_FLT_MAX = 0,  /* "-FLT_MAX" */
    ROICORE_INITIAL_LOWEST = 1,       /* "lowest": -max of the input dtype */
    ROICORE_INITIAL_FIRST = 2,        /* "first": the bin's first element */
    ROICORE_INITIAL_NAN = 3           /* "nan" */
} roicore_initial;

typedef enum {
    ROICORE_COMPARE_GREATER = 0,  /* "greater": v > m */
    ROICORE_COMPARE_STD_MAX = 1,  /* "std_max": m = (v < m) ? m : v */
    ROICORE_COMPARE_FMAX = 2      /* "fmax": C fmax, NaN ignored */
} roicore_compare;

typedef enum {
    ROICORE_ARGMAX_PLANE = 0,  /* "plane": h*W + w */
    ROICORE_ARGMAX_GLOBAL = 1  /* "global": flat index into the whole input */
} roicore_argmax_encoding;

typedef enum { ROICORE_SAMPLER_CAFFE2 = 0, ROICORE_SAMPLER_PADDLE = 1 } roicore_sampler;
typedef enum {
    ROICORE_PSROI_FORMULA_RFCN = 0,        /* "rfcn" */
    ROICORE_PSROI_FORMULA_TORCHVISION = 1  /* "torchvision" */
} roicore_psroi_formula;
typedef enum { ROICORE_EMPTY_GRID_ZERO = 0, ROICORE_EMPTY_GRID_NAN = 1 } roicore_empty_grid;

/* MaxPoolRules */
typedef struct {
    roicore_bin_arithmetic bin_arithmetic;
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_initial initial;
    roicore_compare compare;
    roicore_argmax_encoding argmax;
    roicore_index_type argmax_dtype;
    roicore_precision scale_product;    /* INPUT or FLOAT64 */
} roicore_max_pool_rules;

/* BilinearPoolRules */
typedef struct {
    int pin_last;
    int fused_lerp;
} roicore_bilinear_pool_rules;

/* PSRoIPoolRules */
typedef struct {
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_psroi_formula formula;
} roicore_psroi_pool_rules;

/* RoIAlignRules */
typedef struct {
    roicore_sampler sampler;
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_empty_grid empty_grid;
    int backward_min_size_always;
} roicore_roi_align_rules;

/* PSRoIAlignRules */
typedef struct {
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
} roicore_ps_roi_align_rules;

/* Rules from an array of their fields' values in declaration order (for native ops, which
 * receive the rules as an integer-list attribute); each value is range-checked. */
int roicore_max_pool_rules_from_array(const int64_t *fields, int64_t n,
                                      roicore_max_pool_rules *rules, roicore_error *err);
int roicore_bilinear_pool_rules_from_array(const int64_t *fields, int64_t n,
                                           roicore_bilinear_pool_rules *rules,
                                           roicore_error *err);
int roicore_psroi_pool_rules_from_array(const int64_t *fields, int64_t n,
                                        roicore_psroi_pool_rules *rules, roicore_error *err);
int roicore_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                       roicore_roi_align_rules *rules, roicore_error *err);
int roicore_ps_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                          roicore_ps_roi_align_rules *rules, roicore_error *err);

/* ------------------------------------------------------------------------ boxes */

/* Batch indices for `k` boxes from the frameworks' forms, checked to lie in [0, n_images)
 * (or, with `masked`, to be negative for masked boxes).  Each fills batch[k].
 *   column:  a float batch column (MXNet's and torchvision's (K, 5) rois), `stride` values
 *            apart in `dtype`; every value must be an integer.
 *   indices: int32 or int64 image indices (TF's box_indices).
 *   counts:  per-image box counts, boxes grouped by image in image order (Paddle's
 *            boxes_num); they must be non-negative and sum to k. */
int roicore_batch_from_column(const void *column, roicore_dtype dtype, int64_t stride,
                              int64_t k, int64_t n_images, int masked, int64_t *batch,
                              roicore_error *err);
int roicore_batch_from_indices(const void *indices, roicore_index_type type, int64_t k,
                               int64_t n_images, int64_t *batch, roicore_error *err);
int roicore_batch_from_counts(const void *counts, roicore_index_type type, int64_t n_images,
                              int64_t k, int64_t *batch, roicore_error *err);

/* Every coordinate of k rows [x1, y1, x2, y2] finite and, times the scale of its axis
 * (0: only finiteness), within 2**24 feature-map pixels of the origin, as every operator
 * requires of the boxes it reads (scaled by spatial_scale; bilinear pooling's normalised
 * boxes by max(size - 1, 1)). */
int roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k, double scale_x,
                         double scale_y, roicore_error *err);

/* Box coordinates from rows of `stride` values whose first coordinate is at `first` (so
 * (K, 5) rois are stride 5, first 1), in `src` dtype, into (k, 4) [x1, y1, x2, y2] rows of
 * `dst` dtype; `yx` reads rows [y1, x1, y2, x2] (TF's order).  A plain conversion: the
 * operators check the values. */
int roicore_convert_coords(const void *src, roicore_dtype src_dtype, int64_t stride,
                           int64_t first, int yx, int64_t k, void *dst, roicore_dtype dst_dtype,
                           roicore_error *err);

/* ------------------------------------------------------------------------ operators */

/* The argmax type a max-pool forward writes for input `x`: the rules' argmax_dtype,
 * widened to int64 when the encoded indices would not fit int32. */
roicore_index_type roicore_max_pool_argmax_type(const roicore_max_pool_rules *rules,
                                                const roicore_tensor *x);

/* RoI max pooling.  out is (K, C, PH, PW); argmax, when not NULL, is an array of out's
 * shape and layout of `argmax_type` (as roicore_max_pool_argmax_type gives, or int64)
 * holding the selected element in the rules' encoding, -1 for an empty bin.  Empty bins
 * give 0. */
int roicore_roi_pool_max_forward(const roicore_max_pool_rules *rules, const roicore_tensor *x,
                                 const roicore_boxes *boxes, double spatial_scale,
                                 const roicore_tensor *out, void *argmax,
                                 roicore_index_type argmax_type, const roicore_exec *exec,
                                 roicore_error *err);

/* Its gradient: each element of grad_output added to grad_input at its argmax, in (box,
 * channel, ph, pw) order.  Writes every element of grad_input.  Only the batch indices of
 * `boxes` are read.  An argmax value that is neither -1 nor a pixel of its own (box,
 * channel) plane is an error (ROICORE_ERR_VALUE). */
int roicore_roi_pool_max_backward(const roicore_max_pool_rules *rules,
                                  const roicore_tensor *grad_output, const void *argmax,
                                  roicore_index_type argmax_type, const roicore_boxes *boxes,
                                  const roicore_tensor *grad_input, const roicore_exec *exec,
                                  roicore_error *err);

/* Bilinear RoI pooling (crop_and_resize sampling).  Boxes are normalised: x * (W - 1) is
 * the column.  Samples outside the map give extrapolation_value. */
int roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                      const roicore_tensor *x, const roicore_boxes *boxes,
                                      double extrapolation_value, const roicore_tensor *out,
                                      const roicore_exec *exec, roicore_error *err);

/* Its gradient with respect to x (TF CropAndResizeGradImage).  Writes every element of
 * grad_input. */
int roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                       const roicore_tensor *grad_output,
                                       const roicore_boxes *boxes,
                                       const roicore_tensor *grad_input,
                                       const roicore_exec *exec, roicore_error *err);

/* Nearest-neighbour RoI pooling (crop_and_resize method "nearest"): each output cell takes
 * the pixel nearest its bilinear sample position (C round, halves away from zero).  Samples
 * outside the map give extrapolation_value. */
int roicore_roi_pool_nearest_forward(const roicore_bilinear_pool_rules *rules,
                                     const roicore_tensor *x, const roicore_boxes *boxes,
                                     double extrapolation_value, const roicore_tensor *out,
                                     const roicore_exec *exec, roicore_error *err);

/* Its gradient with respect to x (TF CropAndResizeGradImage, method "nearest").  Writes
 * every element of grad_input. */
int roicore_roi_pool_nearest_backward(const roicore_bilinear_pool_rules *rules,
                                      const roicore_tensor *grad_output,
                                      const roicore_boxes *boxes,
                                      const roicore_tensor *grad_input,
                                      const roicore_exec *exec, roicore_error *err);

/* The gradient of bilinear RoI pooling with respect to the box coordinates, in the
 * arithmetic of TF's CropAndResizeGradBoxes (rules->pin_last and rules->fused_lerp must be
 * 0: no framework defines it otherwise).  grad_boxes is (k, 4) [x1, y1, x2, y2] in x's
 * dtype; every element is written. */
int roicore_roi_pool_bilinear_boxes_backward(const roicore_bilinear_pool_rules *rules,
                                             const roicore_tensor *grad_output,
                                             const roicore_tensor *x,
                                             const roicore_boxes *boxes, void *grad_boxes,
                                             const roicore_exec *exec, roicore_error *err);

/* Position-sensitive RoI average pooling.  x has C = D * group_h * group_w channels, out
 * is (K, D, PH, PW).  With rules->formula TORCHVISION (torchvision's bins) the group size
 * must be the pooled size. */
int roicore_psroi_pool_forward(const roicore_psroi_pool_rules *rules, const roicore_tensor *x,
                               const roicore_boxes *boxes, double spatial_scale,
                               int64_t group_h, int64_t group_w, const roicore_tensor *out,
                               const roicore_exec *exec, roicore_error *err);

/* Its gradient.  Writes every element of grad_input. */
int roicore_psroi_pool_backward(const roicore_psroi_pool_rules *rules,
                                const roicore_tensor *grad_output, const roicore_boxes *boxes,
                                double spatial_scale, int64_t group_h, int64_t group_w,
                                const roicore_tensor *grad_input, const roicore_exec *exec,
                                roicore_error *err);

/* RoIAlign.  sampling_ratio <= 0: ceil(bin size) samples per bin and axis. */
int roicore_roi_align_forward(const roicore_roi_align_rules *rules, const roicore_tensor *x,
                              const roicore_boxes *boxes, double spatial_scale,
                              int64_t sampling_ratio, int aligned, const roicore_tensor *out,
                              const roicore_exec *exec, roicore_error *err);

/* Its gradient (the Caffe2 backward of every framework).  Writes every element of
 * grad_input. */
int roicore_roi_align_backward(const roicore_roi_align_rules *rules,
                               const roicore_tensor *grad_output, const roicore_boxes *boxes,
                               double spatial_scale, int64_t sampling_ratio, int aligned,
                               const roicore_tensor *grad_input, const roicore_exec *exec,
                               roicore_error *err);

/* Position-sensitive RoIAlign (torchvision ps_roi_align): x has C = D * PH * PW channels,
 * out is (K, D, PH, PW).  Always aligned; sampling_ratio <= 0: ceil(bin size) samples per
 * bin and axis. */
int roicore_ps_roi_align_forward(const roicore_ps_roi_align_rules *rules,
                                 const roicore_tensor *x, const roicore_boxes *boxes,
                                 double spatial_scale, int64_t sampling_ratio,
                                 const roicore_tensor *out, const roicore_exec *exec,
                                 roicore_error *err);

/* Its gradient.  Writes every element of grad_input. */
int roicore_ps_roi_align_backward(const roicore_ps_roi_align_rules *rules,
                                  const roicore_tensor *grad_output, const roicore_boxes *boxes,
                                  double spatial_scale, int64_t sampling_ratio,
                                  const roicore_tensor *grad_input, const roicore_exec *exec,
                                  roicore_error *err);

/* ------------------------------------------------------------------------ runtime */

/* ROICORE_API_VERSION of the library (a binding compiled against another header may
 * refuse to run). */
int roicore_api_version(void);

/* 1 when the library was built with OpenMP, else 0 (every call then runs on one thread). */
int roicore_openmp_enabled(void);

/* The thread count a call asked for `requested` threads uses: 0 means the default
 * (OMP_NUM_THREADS as OpenMP reads it, at most the CPUs this process may run on), a
 * negative n all those CPUs but |n| - 1, a positive n that many, capped at
 * ROICORE_MAX_THREADS and at what the process can start.  1 in a build without OpenMP and
 * in a process forked after roicore ran threads (libgomp cannot run a team there). */
#define ROICORE_MAX_THREADS 1024
int roicore_resolve_threads(int requested);

/* The most bytes one allocation of a call may take (0: no limit), its outputs included:
 * bindings check the outputs they allocate against it, the kernels their scratch.  The
 * default is the machine's physical memory.  A call whose scratch would pass it returns
 * ROICORE_ERR_MEMORY before allocating anything. */
int64_t roicore_get_memory_limit(void);
void roicore_set_memory_limit(int64_t bytes);

/* Scratch blocks of 1 MiB or more are kept when a call ends, for the next call that needs
 * about as much: a fresh block from the system costs a page fault and a zeroed page for
 * every 4 KiB that the call touches.  At most this many bytes stay kept (the oldest blocks
 * go first); the default is 256 MiB, and 0 keeps none.  Setting a lower limit releases
 * the oldest blocks down to it; roicore_release_scratch releases every kept block and
 * returns their bytes.  Each copy of the library (a binding, a native op library) keeps
 * its own. */
int64_t roicore_get_scratch_keep_limit(void);
void roicore_set_scratch_keep_limit(int64_t bytes);
int64_t roicore_release_scratch(void);

#ifdef __cplusplus
}
#endif
#endif /* ROICORE_H */
