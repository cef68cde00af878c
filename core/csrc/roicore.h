/* roicore.h: the C API of roicore's RoI pooling kernels.
 *
 * Operators, forward and backward, float32 and float64:
 *   roi_pool max       RoI max pooling (Fast R-CNN), every framework's convention
 *   roi_pool bilinear  bilinear RoI pooling (OpenVINO ROIPooling "bilinear", TF crop_and_resize)
 *   ps_roi_pool        position-sensitive RoI average pooling (R-FCN, torchvision)
 *   roi_align          RoIAlign (Mask R-CNN)
 *   ps_roi_align       position-sensitive RoIAlign (Light-Head R-CNN, torchvision)
 *   pyramid_roi_align  RoIAlign from a feature pyramid (FPN): each box from the level its
 *                      size assigns it, every framework's level rule
 *
 * Results are bit-identical to the framework the rules describe, for every thread count.
 * The rules structs mirror the frozen dataclasses of roicore.core.conventions field for
 * field; each enum value is named after the Python literal it stands for.
 *
 * VERSIONS.  ROICORE_VERSION_* is the release (the Python package's version).
 * ROICORE_ABI_VERSION changes whenever a program compiled against an earlier header would
 * break: a function removed, renamed or given another signature, a struct's size or a
 * field's offset changed, an enum value given another meaning.  Adding functions, enum
 * values and limits does not change it, nor does giving a reserved field a meaning.
 * roicore_abi_version() is the library's, to compare with the header's.
 *
 * STRUCTS THAT GROW.  Every struct ends in reserved space.  Zero-initialise each struct
 * (`roicore_exec e = {0};`) and set the fields you use: the library refuses nonzero
 * reserved fields, because a later version may give them a meaning, and then their zero
 * value is always the behaviour from before they had one.
 *
 * ERRORS.  Each function that can fail returns a roicore_status; on an error it fills
 * `err` (which may be NULL) with the code, a message naming the argument, what was
 * expected and what came, and, for a bad value inside an array, the argument and the
 * element.  Every argument is checked before any output is written: shapes, sizes whose
 * products would overflow int64, pointers, batch indices, argmax values, coordinates that
 * would reach a float-to-int conversion out of range, rules fields, reserved fields.  So
 * no caller, however careless, makes a kernel read or write out of bounds.  An error
 * leaves every output untouched, except three, after which the outputs' contents are
 * unspecified: ROICORE_ERR_INTERRUPTED, ROICORE_ERR_MEMORY (scratch that ran out in the
 * middle of a call), and ROICORE_ERR_VALUE from roicore_roi_pool_max_backward (an argmax
 * that was not the forward's, found while scattering).
 *
 * THREADS.  Every function may be called from any thread, concurrently with any other,
 * as long as no call's outputs overlap another's arrays.  Calls share only the
 * process-wide settings (memory limit, scratch keep limit), which any thread may change
 * at any time; a call reads them as it allocates.  A call runs its kernels on up to
 * exec->n_threads OpenMP threads and calls exec->poll from the calling thread only.
 *
 * ARRAYS.  Dense and C-contiguous in their layout; float arrays need only their
 * element's alignment.  Outputs must not overlap inputs.  On Linux, the whole 2 MiB pages
 * inside an output of 4 MiB or more are advised for transparent huge pages (madvise
 * MADV_HUGEPAGE) before it is written, so a freshly mapped output faults once per huge
 * page.
 *
 * LINKING.  roicore is a static library: link libroicore.a (position-independent; with
 * -fopenmp when it was built with OpenMP) into your program or module.  Its symbols have
 * hidden visibility, so each shared object that links it keeps them to itself, with its
 * own copy of the process-wide settings: its runtime.  roicore_runtime_share makes copies
 * share one runtime (see below).  This header needs only C99.
 */
#ifndef ROICORE_H
#define ROICORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ROICORE_VERSION_MAJOR 0
#define ROICORE_VERSION_MINOR 2
#define ROICORE_VERSION_PATCH 0
#define ROICORE_VERSION_NUMBER \
    (ROICORE_VERSION_MAJOR * 10000 + ROICORE_VERSION_MINOR * 100 + ROICORE_VERSION_PATCH)
#define ROICORE_VERSION_STRING "0.2.0"
#define ROICORE_ABI_VERSION 2

/* ------------------------------------------------------------------------ limits */

/* Scaled box coordinates lie within +-2**24 feature-map pixels: float32 stops representing
 * every integer there, and beyond 2**31 the frameworks' float-to-int conversions are
 * undefined behaviour. */
#define ROICORE_MAX_SCALED_COORD 16777216.0
/* Feature maps have H and W below 2**31. */
#define ROICORE_MAX_MAP_SIDE 2147483646
/* RoIAlign's samples per bin: sampling_ratio**2, or ceil(bin size)**2 when adaptive.  A
 * runaway grid would otherwise look like a hang: 2**20 samples per bin is a 1024-pixel-wide
 * bin sampled at every pixel. */
#define ROICORE_MAX_SAMPLING_RATIO 1024
#define ROICORE_MAX_GRID 65536
#define ROICORE_MAX_SAMPLES_PER_BIN 1048576
/* Levels of a feature pyramid. */
#define ROICORE_MAX_LEVELS 64
/* Threads one call may ask for. */
#define ROICORE_MAX_THREADS 1024
/* Bytes of roicore_error's message and argument name, their terminating NUL included. */
#define ROICORE_MESSAGE_SIZE 480
#define ROICORE_ARGUMENT_SIZE 64

/* ------------------------------------------------------------------------ status */

typedef enum {
    ROICORE_OK = 0,
    ROICORE_ERR_ARGUMENT = 1,    /* a shape, size, pointer, scalar or rules field is invalid */
    ROICORE_ERR_VALUE = 2,       /* data in an array is invalid: batch index, coordinate, argmax */
    ROICORE_ERR_MEMORY = 3,      /* the call needs more memory than the limit, or malloc failed */
    ROICORE_ERR_INTERRUPTED = 4, /* the exec's poll asked the call to stop, or Ctrl-C did */
    ROICORE_ERR_UNSUPPORTED = 5  /* a combination this build does not implement */
} roicore_status;

typedef struct {
    roicore_status code;
    int32_t reserved0;
    /* For ROICORE_ERR_VALUE about one element of an array: the array as the caller named
     * it ("boxes", "batch_indices", ...) and the element's index (a box, an image);
     * otherwise "" and -1. */
    int64_t index;
    char argument[ROICORE_ARGUMENT_SIZE];
    char message[ROICORE_MESSAGE_SIZE];  /* what was wrong, naming the argument */
    int64_t reserved[4];
} roicore_error;

/* ------------------------------------------------------------------------ arrays */

typedef enum { ROICORE_FLOAT32 = 0, ROICORE_FLOAT64 = 1 } roicore_dtype;
typedef enum { ROICORE_INT32 = 0, ROICORE_INT64 = 1 } roicore_index_type;
typedef enum { ROICORE_NCHW = 0, ROICORE_NHWC = 1 } roicore_layout;

/* A 4-D feature map, gradient or pooled output that a call reads.  n, c, h, w name the
 * dimensions whatever the layout: a pooled output is (K, C, PH, PW), or (K, PH, PW, C) in
 * memory with ROICORE_NHWC. */
typedef struct {
    const void *data;
    roicore_dtype dtype;
    roicore_layout layout;
    int64_t n, c, h, w;
    int64_t reserved[4];
} roicore_tensor;

/* The same for an array a call writes. */
typedef struct {
    void *data;
    roicore_dtype dtype;
    roicore_layout layout;
    int64_t n, c, h, w;
    int64_t reserved[4];
} roicore_out_tensor;

/* Boxes: k rows [x1, y1, x2, y2] (x the column, y the row) in the feature map's dtype, and
 * the image of each box, 0 <= batch[k] < N.  With `masked` set, a negative batch index
 * marks a box to skip (GluonCV masks padded proposals with -1): its output is 0, its
 * argmax -1, and it adds nothing to any gradient. */
typedef struct {
    const void *coords;
    const int64_t *batch;
    int64_t k;
    int32_t masked;
    int32_t reserved0;
    int64_t reserved[3];
} roicore_boxes;

/* How a call runs.  n_threads: as roicore_resolve_threads takes it (0: the default).
 * poll, when not NULL, is called from the calling thread between pieces of work, at most
 * every few tens of milliseconds; a nonzero return stops every thread at its next piece
 * and the call returns ROICORE_ERR_INTERRUPTED.  A NULL exec means the defaults. */
typedef struct {
    int32_t n_threads;
    int32_t reserved0;
    int (*poll)(void *arg);
    void *poll_arg;
    void *reserved[4];
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

typedef enum {
    ROICORE_SAMPLER_CAFFE2 = 0,
    ROICORE_SAMPLER_PADDLE = 1,
    ROICORE_SAMPLER_MODEL_GARDEN = 2  /* the TF Model Garden's: sampling_ratio 1, unaligned */
} roicore_sampler;
typedef enum {
    ROICORE_PS_ROI_POOL_FORMULA_RFCN = 0,        /* "rfcn" */
    ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION = 1  /* "torchvision" */
} roicore_ps_roi_pool_formula;
typedef enum { ROICORE_EMPTY_GRID_ZERO = 0, ROICORE_EMPTY_GRID_NAN = 1 } roicore_empty_grid;
typedef enum {
    ROICORE_REDUCTION_MEAN = 0,  /* "mean": the bin's samples averaged (every framework) */
    ROICORE_REDUCTION_SUM = 1    /* "sum": summed, not divided; an empty grid sums to 0 */
} roicore_reduction;

/* MaxPoolRules */
typedef struct {
    roicore_bin_arithmetic bin_arithmetic;
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_initial initial;
    roicore_compare compare;
    roicore_argmax_encoding argmax;
    roicore_index_type argmax_dtype;
    roicore_precision scale_product;    /* INPUT (default) or FLOAT64 */
    int32_t reserved[9];
} roicore_max_pool_rules;

/* BilinearPoolRules */
typedef struct {
    int32_t pin_last;
    int32_t fused_lerp;  /* default 0 */
    int32_t reserved[14];
} roicore_bilinear_pool_rules;

/* PSRoIPoolRules */
typedef struct {
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_ps_roi_pool_formula formula;  /* default RFCN */
    int32_t reserved[14];
} roicore_ps_roi_pool_rules;

/* RoIAlignRules */
typedef struct {
    roicore_sampler sampler;
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_empty_grid empty_grid;
    int32_t backward_min_size_always;
    roicore_reduction reduction;        /* default MEAN */
    int32_t reserved[11];
} roicore_roi_align_rules;

typedef enum {
    ROICORE_PS_ALIGN_BOX_ALIGNED = 0,   /* "aligned": shifted by -0.5 pixel, no minimum size */
    ROICORE_PS_ALIGN_BOX_UNALIGNED = 1  /* "unaligned": unshifted, at least 1 x 1 pixel */
} roicore_ps_align_box;
typedef enum {
    ROICORE_OUTSIDE_ZERO = 0,  /* "zero": a sample outside the map adds a plain 0 */
    ROICORE_OUTSIDE_FIRST = 1  /* "first": ... adds 0 * v[0, 0] per corner (Caffe2, MXNet) */
} roicore_outside;
typedef enum {
    ROICORE_PS_EMPTY_GRID_DIVIDE = 0,  /* "divide": the sum divided by the grid (0/0 = NaN) */
    ROICORE_PS_EMPTY_GRID_ZERO = 1     /* "zero": a grid with no samples gives 0 */
} roicore_ps_empty_grid;

/* PSRoIAlignRules */
typedef struct {
    roicore_precision scale_precision;  /* INPUT or FLOAT32 */
    roicore_ps_align_box box;           /* default ALIGNED */
    roicore_outside outside;            /* default ZERO */
    roicore_ps_empty_grid empty_grid;   /* default DIVIDE */
    int32_t reserved[12];
} roicore_ps_roi_align_rules;

typedef enum {
    ROICORE_LEVEL_EPSILON_1E6 = 0,  /* "1e-6" */
    ROICORE_LEVEL_EPSILON_1E8 = 1   /* "1e-8" */
} roicore_level_epsilon;
typedef enum {
    ROICORE_LEVEL_INVALID_NAN = 0,   /* "nan": a negative area's sqrt is NaN: not pooled */
    ROICORE_LEVEL_INVALID_ZERO = 1,  /* "zero": a reversed box has area 0 (Paddle) */
    ROICORE_LEVEL_INVALID_SKIP = 2   /* "skip": area <= 0 is not pooled (OpenVINO) */
} roicore_level_invalid;
typedef enum {
    ROICORE_LEVEL_FORMULA_LOG2 = 0,         /* "log2": the formula below */
    ROICORE_LEVEL_FORMULA_MODEL_GARDEN = 1  /* "model_garden": the TF Model Garden's */
} roicore_level_formula;
typedef enum {
    ROICORE_LEVEL_ONE_MAP_ALL = 0,  /* "all": a lone map pools every box (no level rule) */
    ROICORE_LEVEL_ONE_MAP_RULE = 1  /* "rule": the rule still decides which boxes are pooled */
} roicore_level_one_map;

/* LevelRules: which pyramid level a box is pooled from.  With s = sqrt(w * h) in the boxes'
 * dtype (w = x2 - x1, plus 1 with pixel_offset), k0 the canonical level and s0 the
 * canonical size, a box's level is floor(log2(s / s0 + eps) + k0) with epsilon_inside, else
 * floor((k0 + log2(s / s0)) + eps), clamped to the pyramid's levels; a box whose level is
 * NaN (or skipped by `invalid`) is not pooled and gives 0.  With one map, one_map ALL pools
 * every box from it (torchvision, detectron2, mmdet, PaddleDetection call RoIAlign on a
 * lone map directly); RULE applies the rule all the same (GluonCV, OpenVINO).
 * formula MODEL_GARDEN is floor(ln(s / s0) / ln 2) + k0 with w, h, s and the logarithms in
 * float32, no epsilon, and a level that is not finite (a reversed box) the first; it reads
 * no other field. */
typedef struct {
    int32_t pixel_offset;
    roicore_level_epsilon epsilon;
    int32_t epsilon_inside;
    roicore_level_invalid invalid;
    roicore_level_one_map one_map;  /* default ALL */
    roicore_level_formula formula;  /* default LOG2 */
    int32_t reserved[10];
} roicore_level_rules;

/* A feature pyramid: n_levels maps, map i of level first_level + i pooled at
 * spatial_scales[i]; the level rule's k0 and s0. */
typedef struct {
    int64_t n_levels;              /* 1 .. ROICORE_MAX_LEVELS */
    int64_t first_level;           /* the level of map 0 (|first_level| <= 1024) */
    int64_t canonical_level;       /* k0 (|k0| <= 1024) */
    double canonical_size;         /* s0 > 0, finite */
    const double *spatial_scales;  /* n_levels of them, each > 0 */
    int64_t reserved[4];
} roicore_pyramid;

/* Rules from an array of their fields' codes in declaration order: how native ops store
 * the rules in a saved graph (an integer-list attribute).  Each value is range-checked.
 * An array may end early: the trailing fields it lacks take their defaults, the behaviour
 * from before each field existed, so a graph saved by an earlier roicore computes what it
 * computed then.  An array with more fields than this version knows comes from a newer
 * roicore and is refused.  *_FIELDS: the fields this version knows; *_REQUIRED: the
 * fields every array has (those without a default). */
#define ROICORE_MAX_POOL_RULES_FIELDS 7
#define ROICORE_MAX_POOL_RULES_REQUIRED 6
#define ROICORE_BILINEAR_POOL_RULES_FIELDS 2
#define ROICORE_BILINEAR_POOL_RULES_REQUIRED 1
#define ROICORE_PS_ROI_POOL_RULES_FIELDS 2
#define ROICORE_PS_ROI_POOL_RULES_REQUIRED 1
#define ROICORE_ROI_ALIGN_RULES_FIELDS 5
#define ROICORE_ROI_ALIGN_RULES_REQUIRED 4
#define ROICORE_PS_ROI_ALIGN_RULES_FIELDS 4
#define ROICORE_PS_ROI_ALIGN_RULES_REQUIRED 1
#define ROICORE_LEVEL_RULES_FIELDS 6
#define ROICORE_LEVEL_RULES_REQUIRED 4

roicore_status roicore_max_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                 roicore_max_pool_rules *rules,
                                                 roicore_error *err);
roicore_status roicore_bilinear_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                      roicore_bilinear_pool_rules *rules,
                                                      roicore_error *err);
roicore_status roicore_ps_roi_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                    roicore_ps_roi_pool_rules *rules,
                                                    roicore_error *err);
roicore_status roicore_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                                  roicore_roi_align_rules *rules,
                                                  roicore_error *err);
roicore_status roicore_ps_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                                     roicore_ps_roi_align_rules *rules,
                                                     roicore_error *err);
roicore_status roicore_level_rules_from_array(const int64_t *fields, int64_t n,
                                              roicore_level_rules *rules, roicore_error *err);

/* ------------------------------------------------------------------------ boxes */

/* Batch indices for `k` boxes from the frameworks' forms, checked to lie in [0, n_images)
 * (or, with `masked`, to be negative for masked boxes, which become -1).  Each fills
 * batch[k]; `name` is the argument as the caller's user knows it, for messages and
 * err->argument.
 *   column:  a float batch column (MXNet's and torchvision's (K, 5) rois), `stride` values
 *            apart in `dtype` (any sign; 0 repeats one value); every value must be an
 *            integer.
 *   indices: int32 or int64 image indices (TF's box_indices).
 *   counts:  per-image box counts, boxes grouped by image in image order (Paddle's
 *            boxes_num); they must be non-negative and sum to k. */
roicore_status roicore_batch_from_column(const void *column, roicore_dtype dtype,
                                         int64_t stride, int64_t k, int64_t n_images,
                                         int masked, const char *name, int64_t *batch,
                                         roicore_error *err);
roicore_status roicore_batch_from_indices(const void *indices, roicore_index_type type,
                                          int64_t k, int64_t n_images, int masked,
                                          const char *name, int64_t *batch,
                                          roicore_error *err);
roicore_status roicore_batch_from_counts(const void *counts, roicore_index_type type,
                                         int64_t n_images, int64_t k, const char *name,
                                         int64_t *batch, roicore_error *err);

/* Every coordinate of k rows [x1, y1, x2, y2] finite and, times the scale of its axis
 * (0: only finiteness), within ROICORE_MAX_SCALED_COORD feature-map pixels of the
 * origin, as every operator requires of the boxes it reads (scaled by spatial_scale;
 * bilinear pooling's normalised boxes by max(size - 1, 1)).  `name` names the boxes. */
roicore_status roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k,
                                    double scale_x, double scale_y, const char *name,
                                    roicore_error *err);

/* Box coordinates from rows of `stride` values whose first coordinate is at `first` (so
 * (K, 5) rois are stride 5, first 1), in `src` dtype, into (k, 4) [x1, y1, x2, y2] rows of
 * `dst` dtype; `yx` reads rows [y1, x1, y2, x2] (TF's order).  A plain conversion: the
 * operators check the values. */
roicore_status roicore_convert_coords(const void *src, roicore_dtype src_dtype, int64_t stride,
                                      int64_t first, int yx, int64_t k, void *dst,
                                      roicore_dtype dst_dtype, roicore_error *err);

/* ------------------------------------------------------------------------ operators */

/* The argmax type a max-pool forward writes for input `x`: the rules' argmax_dtype,
 * widened to int64 when the encoded indices would not fit int32. */
roicore_status roicore_max_pool_argmax_type(const roicore_max_pool_rules *rules,
                                            const roicore_tensor *x, roicore_index_type *type,
                                            roicore_error *err);

/* RoI max pooling.  out is (K, C, PH, PW); argmax, when not NULL, is an array of out's
 * shape and layout of `argmax_type` (as roicore_max_pool_argmax_type gives, or int64)
 * holding the selected element in the rules' encoding, -1 for an empty bin.  Empty bins
 * give 0. */
roicore_status roicore_roi_pool_max_forward(const roicore_max_pool_rules *rules,
                                            const roicore_tensor *x, const roicore_boxes *boxes,
                                            double spatial_scale, const roicore_out_tensor *out,
                                            void *argmax, roicore_index_type argmax_type,
                                            const roicore_exec *exec, roicore_error *err);

/* Its gradient: each element of grad_output added to grad_input at its argmax, in (box,
 * channel, ph, pw) order.  Writes every element of grad_input.  Only the batch indices of
 * `boxes` are read.  An argmax value that is neither -1 nor a pixel of its own (box,
 * channel) plane is an error (ROICORE_ERR_VALUE, found while scattering: see ERRORS). */
roicore_status roicore_roi_pool_max_backward(const roicore_max_pool_rules *rules,
                                             const roicore_tensor *grad_output,
                                             const void *argmax, roicore_index_type argmax_type,
                                             const roicore_boxes *boxes,
                                             const roicore_out_tensor *grad_input,
                                             const roicore_exec *exec, roicore_error *err);

/* Bilinear RoI pooling (crop_and_resize sampling).  Boxes are normalised: x * (W - 1) is
 * the column.  Samples outside the map give extrapolation_value. */
roicore_status roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                                 const roicore_tensor *x,
                                                 const roicore_boxes *boxes,
                                                 double extrapolation_value,
                                                 const roicore_out_tensor *out,
                                                 const roicore_exec *exec, roicore_error *err);

/* Its gradient with respect to x (TF CropAndResizeGradImage).  Writes every element of
 * grad_input. */
roicore_status roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                                  const roicore_tensor *grad_output,
                                                  const roicore_boxes *boxes,
                                                  const roicore_out_tensor *grad_input,
                                                  const roicore_exec *exec, roicore_error *err);

/* Nearest-neighbour RoI pooling (crop_and_resize method "nearest"): each output cell takes
 * the pixel nearest its bilinear sample position (C round, halves away from zero).  Samples
 * outside the map give extrapolation_value. */
roicore_status roicore_roi_pool_nearest_forward(const roicore_bilinear_pool_rules *rules,
                                                const roicore_tensor *x,
                                                const roicore_boxes *boxes,
                                                double extrapolation_value,
                                                const roicore_out_tensor *out,
                                                const roicore_exec *exec, roicore_error *err);

/* Its gradient with respect to x (TF CropAndResizeGradImage, method "nearest").  Writes
 * every element of grad_input. */
roicore_status roicore_roi_pool_nearest_backward(const roicore_bilinear_pool_rules *rules,
                                                 const roicore_tensor *grad_output,
                                                 const roicore_boxes *boxes,
                                                 const roicore_out_tensor *grad_input,
                                                 const roicore_exec *exec, roicore_error *err);

/* The gradient of bilinear RoI pooling with respect to the box coordinates, in the
 * arithmetic of TF's CropAndResizeGradBoxes (rules->pin_last and rules->fused_lerp must be
 * 0: no framework defines it otherwise).  grad_boxes is (k, 4) [x1, y1, x2, y2] in x's
 * dtype; every element is written. */
roicore_status roicore_roi_pool_bilinear_boxes_backward(const roicore_bilinear_pool_rules *rules,
                                                        const roicore_tensor *grad_output,
                                                        const roicore_tensor *x,
                                                        const roicore_boxes *boxes,
                                                        void *grad_boxes,
                                                        const roicore_exec *exec,
                                                        roicore_error *err);

/* Position-sensitive RoI average pooling.  x has C = D * group_h * group_w channels, out
 * is (K, D, PH, PW).  With rules->formula TORCHVISION (torchvision's bins) the group size
 * must be the pooled size. */
roicore_status roicore_ps_roi_pool_forward(const roicore_ps_roi_pool_rules *rules,
                                           const roicore_tensor *x, const roicore_boxes *boxes,
                                           double spatial_scale, int64_t group_h,
                                           int64_t group_w, const roicore_out_tensor *out,
                                           const roicore_exec *exec, roicore_error *err);

/* Its gradient.  Writes every element of grad_input. */
roicore_status roicore_ps_roi_pool_backward(const roicore_ps_roi_pool_rules *rules,
                                            const roicore_tensor *grad_output,
                                            const roicore_boxes *boxes, double spatial_scale,
                                            int64_t group_h, int64_t group_w,
                                            const roicore_out_tensor *grad_input,
                                            const roicore_exec *exec, roicore_error *err);

/* RoIAlign.  sampling_ratio <= 0: ceil(bin size) samples per bin and axis.  The Model
 * Garden's sampler takes one sample per bin, at y1 + ((ph + 0.5) * (y2 - y1)) / PH (in
 * feature pixels), its neighbours clamped into the map and its weights not, so samples
 * outside extrapolate; it needs sampling_ratio 1 and aligned 0. */
roicore_status roicore_roi_align_forward(const roicore_roi_align_rules *rules,
                                         const roicore_tensor *x, const roicore_boxes *boxes,
                                         double spatial_scale, int64_t sampling_ratio,
                                         int aligned, const roicore_out_tensor *out,
                                         const roicore_exec *exec, roicore_error *err);

/* Its gradient (the Caffe2 backward of every framework; the Model Garden's sampler adds each
 * box's bin rows neighbour row by neighbour row, as TensorFlow's gather gradient does).
 * Writes every element of grad_input. */
roicore_status roicore_roi_align_backward(const roicore_roi_align_rules *rules,
                                          const roicore_tensor *grad_output,
                                          const roicore_boxes *boxes, double spatial_scale,
                                          int64_t sampling_ratio, int aligned,
                                          const roicore_out_tensor *grad_input,
                                          const roicore_exec *exec, roicore_error *err);

/* Position-sensitive RoIAlign (torchvision ps_roi_align, MXNet ROIAlign with
 * position_sensitive): x has C = D * PH * PW channels, out is (K, D, PH, PW); the boxes
 * aligned or not as rules->box says; sampling_ratio <= 0: ceil(bin size) samples per bin and
 * axis. */
roicore_status roicore_ps_roi_align_forward(const roicore_ps_roi_align_rules *rules,
                                            const roicore_tensor *x, const roicore_boxes *boxes,
                                            double spatial_scale, int64_t sampling_ratio,
                                            const roicore_out_tensor *out,
                                            const roicore_exec *exec, roicore_error *err);

/* Its gradient.  Writes every element of grad_input. */
roicore_status roicore_ps_roi_align_backward(const roicore_ps_roi_align_rules *rules,
                                             const roicore_tensor *grad_output,
                                             const roicore_boxes *boxes, double spatial_scale,
                                             int64_t sampling_ratio,
                                             const roicore_out_tensor *grad_input,
                                             const roicore_exec *exec, roicore_error *err);

/* The pyramid level of each box, as map indices 0 .. n_levels - 1, or -1 for a box that is
 * not pooled; boxes->coords in `dtype`.  Masked boxes get -1. */
roicore_status roicore_pyramid_levels(const roicore_level_rules *level_rules,
                                      const roicore_pyramid *pyramid, roicore_dtype dtype,
                                      const roicore_boxes *boxes, int64_t *levels,
                                      roicore_error *err);

/* RoIAlign from a feature pyramid: maps[i] is level first_level + i, each (N, C, H_i, W_i)
 * of one dtype; out is (K, C, PH, PW), each box's row pooled from its level's map as
 * roicore_roi_align_forward pools it, or 0 for a box that is not pooled. */
roicore_status roicore_pyramid_roi_align_forward(const roicore_roi_align_rules *rules,
                                                 const roicore_level_rules *level_rules,
                                                 const roicore_pyramid *pyramid,
                                                 const roicore_tensor *maps,
                                                 const roicore_boxes *boxes,
                                                 int64_t sampling_ratio, int aligned,
                                                 const roicore_out_tensor *out,
                                                 const roicore_exec *exec, roicore_error *err);

/* Its gradient: grad_maps[i] receives the gradients of level i's boxes only, in box order.
 * Writes every element of every grad_maps[i]. */
roicore_status roicore_pyramid_roi_align_backward(const roicore_roi_align_rules *rules,
                                                  const roicore_level_rules *level_rules,
                                                  const roicore_pyramid *pyramid,
                                                  const roicore_tensor *grad_output,
                                                  const roicore_boxes *boxes,
                                                  int64_t sampling_ratio, int aligned,
                                                  const roicore_out_tensor *grad_maps,
                                                  const roicore_exec *exec, roicore_error *err);

/* ------------------------------------------------------------------------ runtime */

/* The library's ROICORE_ABI_VERSION and ROICORE_VERSION_NUMBER / _STRING (a module
 * compiled against another header may refuse to run). */
int roicore_abi_version(void);
int roicore_version_number(void);
const char *roicore_version_string(void);

/* 1 when the library was built with OpenMP, else 0 (every call then runs on one thread). */
int roicore_openmp_enabled(void);

/* The thread count a call asked for `requested` threads uses: 0 means the default
 * (OMP_NUM_THREADS as OpenMP reads it, at most the CPUs this process may run on), a
 * negative n all those CPUs but |n| - 1, a positive n that many, capped at
 * ROICORE_MAX_THREADS and at what the process can start.  1 in a build without OpenMP and
 * in a process forked after roicore ran threads (libgomp cannot run a team there). */
int roicore_resolve_threads(int requested);

/* The most bytes one allocation of a call may take (0: no limit), its outputs included:
 * bindings check the outputs they allocate against it, the kernels their scratch.  The
 * default is the machine's physical memory.  A call whose scratch would pass it returns
 * ROICORE_ERR_MEMORY before allocating anything.  A negative limit is refused
 * (ROICORE_ERR_ARGUMENT, the limit unchanged). */
int64_t roicore_get_memory_limit(void);
roicore_status roicore_set_memory_limit(int64_t bytes);

/* ROICORE_OK when one allocation of `bytes` is within the memory limit, else
 * ROICORE_ERR_MEMORY naming `what` (a phrase such as "the output of shape (2, 3)"; NULL:
 * "an allocation").  A negative `bytes` (roicore_mul's overflow) is over every limit.  For
 * callers that allocate outputs themselves, as the native operator libraries do. */
roicore_status roicore_check_allocation(int64_t bytes, const char *what, roicore_error *err);

/* The product of two non-negative sizes, or -1 when either is negative or it overflows
 * int64. */
int64_t roicore_mul(int64_t a, int64_t b);

/* Scratch blocks of 1 MiB or more are kept when a call ends, for the next call that needs
 * about as much: a fresh block from the system costs a page fault and a zeroed page for
 * every 4 KiB that the call touches.  At most this many bytes stay kept (the oldest blocks
 * go first); the default is 256 MiB, and 0 keeps none.  Setting a lower limit releases
 * the oldest blocks down to it (a negative one is refused); roicore_release_scratch
 * releases every kept block and returns their bytes. */
int64_t roicore_get_scratch_keep_limit(void);
roicore_status roicore_set_scratch_keep_limit(int64_t bytes);
int64_t roicore_release_scratch(void);

/* ------------------------------------------------------------------------ the runtime */

/* A process can hold several copies of this library (a Python binding, a TF op library,
 * Paddle's operators: each links its own).  Each copy has a runtime: the memory limit,
 * the kept scratch blocks and their limit, whether a team of threads ran (fork safety)
 * and the Ctrl-C watch.  roicore_runtime_share(roicore_runtime_current() of another copy)
 * makes this copy use that runtime from then on, so that a setting or a release made
 * through either acts on both; its own kept scratch is released.  Refused
 * (ROICORE_ERR_ARGUMENT, nothing changed) for NULL or a runtime of another layout (another
 * roicore version).  A module exports a function that calls it, as its symbols are
 * hidden; roicore's native operator libraries export roicore_native_share_runtime. */
typedef struct roicore_runtime roicore_runtime;
roicore_runtime *roicore_runtime_current(void);
roicore_status roicore_runtime_share(roicore_runtime *runtime, roicore_error *err);

/* Ctrl-C.  From this call on, a SIGINT to the process stops every call then running
 * under this runtime (ROICORE_ERR_INTERRUPTED, "interrupted by Ctrl-C"), in any thread and
 * whether or not its exec has a poll; calls started after the signal run as usual.  The
 * signal is then passed on to the handler installed before (ignored stays ignored, the
 * default still ends the process, Python's still raises KeyboardInterrupt); a handler
 * installed later is watched again at the next call.  The Python binding calls it at
 * import, for the runtime it shares with every operator library it loads. */
roicore_status roicore_watch_interrupts(roicore_error *err);

#ifdef __cplusplus
}
#endif
#endif /* ROICORE_H */
