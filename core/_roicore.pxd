# The declarations of roicore.h (core/csrc) that the Cython binding uses.
from libc.stdint cimport int32_t, int64_t

cdef extern from "roicore.h" nogil:
    enum:
        ROICORE_ABI_VERSION
        ROICORE_VERSION_NUMBER
        ROICORE_MAX_THREADS
        ROICORE_MAX_SAMPLING_RATIO
        ROICORE_MAX_GRID
        ROICORE_MAX_SAMPLES_PER_BIN
        ROICORE_MAX_MAP_SIDE
        ROICORE_MESSAGE_SIZE
        ROICORE_ARGUMENT_SIZE
        ROICORE_MAX_POOL_RULES_FIELDS
        ROICORE_MAX_POOL_RULES_REQUIRED
        ROICORE_BILINEAR_POOL_RULES_FIELDS
        ROICORE_BILINEAR_POOL_RULES_REQUIRED
        ROICORE_PS_ROI_POOL_RULES_FIELDS
        ROICORE_PS_ROI_POOL_RULES_REQUIRED
        ROICORE_ROI_ALIGN_RULES_FIELDS
        ROICORE_ROI_ALIGN_RULES_REQUIRED
        ROICORE_PS_ROI_ALIGN_RULES_FIELDS
        ROICORE_PS_ROI_ALIGN_RULES_REQUIRED
        ROICORE_LEVEL_RULES_FIELDS
        ROICORE_LEVEL_RULES_REQUIRED
    const char *ROICORE_VERSION_STRING
    double ROICORE_MAX_SCALED_COORD

    ctypedef enum roicore_status:
        ROICORE_OK, ROICORE_ERR_ARGUMENT, ROICORE_ERR_VALUE, ROICORE_ERR_MEMORY,
        ROICORE_ERR_INTERRUPTED, ROICORE_ERR_UNSUPPORTED
    ctypedef struct roicore_error:
        roicore_status code
        int64_t index
        char argument[ROICORE_ARGUMENT_SIZE]
        char message[ROICORE_MESSAGE_SIZE]
    ctypedef enum roicore_dtype:
        ROICORE_FLOAT32, ROICORE_FLOAT64
    ctypedef enum roicore_index_type:
        ROICORE_INT32, ROICORE_INT64
    ctypedef enum roicore_layout:
        ROICORE_NCHW, ROICORE_NHWC
    ctypedef struct roicore_tensor:
        const void *data
        roicore_dtype dtype
        roicore_layout layout
        int64_t n, c, h, w
    ctypedef struct roicore_out_tensor:
        void *data
        roicore_dtype dtype
        roicore_layout layout
        int64_t n, c, h, w
    ctypedef struct roicore_boxes:
        const void *coords
        const int64_t *batch
        int64_t k
        int32_t masked
    ctypedef struct roicore_exec:
        int32_t n_threads
        int (*poll)(void *arg) noexcept
        void *poll_arg
    enum:  # rules field codes
        ROICORE_PRECISION_INPUT, ROICORE_PRECISION_FLOAT32, ROICORE_PRECISION_FLOAT64
        ROICORE_BIN_ARITHMETIC_INPUT, ROICORE_BIN_ARITHMETIC_FLOAT32, ROICORE_BIN_ARITHMETIC_EXACT
        ROICORE_INITIAL_NEG_FLT_MAX, ROICORE_INITIAL_LOWEST, ROICORE_INITIAL_FIRST, ROICORE_INITIAL_NAN
        ROICORE_COMPARE_GREATER, ROICORE_COMPARE_STD_MAX, ROICORE_COMPARE_FMAX
        ROICORE_ARGMAX_PLANE, ROICORE_ARGMAX_GLOBAL
        ROICORE_SAMPLER_CAFFE2, ROICORE_SAMPLER_PADDLE, ROICORE_SAMPLER_MODEL_GARDEN
        ROICORE_EMPTY_GRID_ZERO, ROICORE_EMPTY_GRID_NAN
        ROICORE_REDUCTION_MEAN, ROICORE_REDUCTION_SUM
        ROICORE_PS_ROI_POOL_FORMULA_RFCN, ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION
        ROICORE_PS_ALIGN_BOX_ALIGNED, ROICORE_PS_ALIGN_BOX_UNALIGNED
        ROICORE_OUTSIDE_ZERO, ROICORE_OUTSIDE_FIRST
        ROICORE_PS_EMPTY_GRID_DIVIDE, ROICORE_PS_EMPTY_GRID_ZERO
        ROICORE_LEVEL_EPSILON_1E6, ROICORE_LEVEL_EPSILON_1E8
        ROICORE_LEVEL_INVALID_NAN, ROICORE_LEVEL_INVALID_ZERO, ROICORE_LEVEL_INVALID_SKIP
        ROICORE_LEVEL_ONE_MAP_ALL, ROICORE_LEVEL_ONE_MAP_RULE
        ROICORE_LEVEL_FORMULA_LOG2, ROICORE_LEVEL_FORMULA_MODEL_GARDEN
    ctypedef struct roicore_max_pool_rules:
        pass
    ctypedef struct roicore_bilinear_pool_rules:
        int32_t pin_last
        int32_t fused_lerp
    ctypedef struct roicore_ps_roi_pool_rules:
        pass
    ctypedef struct roicore_roi_align_rules:
        pass
    ctypedef struct roicore_ps_roi_align_rules:
        pass
    ctypedef struct roicore_level_rules:
        pass
    ctypedef struct roicore_pyramid:
        int64_t n_levels, first_level, canonical_level
        double canonical_size
        const double *spatial_scales

    roicore_status roicore_max_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                     roicore_max_pool_rules *rules,
                                                     roicore_error *err)
    roicore_status roicore_bilinear_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                          roicore_bilinear_pool_rules *rules,
                                                          roicore_error *err)
    roicore_status roicore_ps_roi_pool_rules_from_array(const int64_t *fields, int64_t n,
                                                        roicore_ps_roi_pool_rules *rules,
                                                        roicore_error *err)
    roicore_status roicore_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                                      roicore_roi_align_rules *rules,
                                                      roicore_error *err)
    roicore_status roicore_ps_roi_align_rules_from_array(const int64_t *fields, int64_t n,
                                                         roicore_ps_roi_align_rules *rules,
                                                         roicore_error *err)
    roicore_status roicore_level_rules_from_array(const int64_t *fields, int64_t n,
                                                  roicore_level_rules *rules, roicore_error *err)

    roicore_status roicore_batch_from_column(const void *column, roicore_dtype dtype,
                                             int64_t stride, int64_t k, int64_t n_images,
                                             int masked, const char *name, int64_t *batch,
                                             roicore_error *err)
    roicore_status roicore_batch_from_indices(const void *indices, roicore_index_type type,
                                              int64_t k, int64_t n_images, int masked,
                                              const char *name, int64_t *batch,
                                              roicore_error *err)
    roicore_status roicore_batch_from_counts(const void *counts, roicore_index_type type,
                                             int64_t n_images, int64_t k, const char *name,
                                             int64_t *batch, roicore_error *err)
    roicore_status roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k,
                                        double scale_x, double scale_y, const char *name,
                                        roicore_error *err)
    roicore_status roicore_convert_coords(const void *src, roicore_dtype src_dtype,
                                          int64_t stride, int64_t first, int yx, int64_t k,
                                          void *dst, roicore_dtype dst_dtype, roicore_error *err)

    roicore_status roicore_max_pool_argmax_type(const roicore_max_pool_rules *rules,
                                                const roicore_tensor *x, roicore_index_type *type,
                                                roicore_error *err)
    roicore_status roicore_roi_pool_max_forward(const roicore_max_pool_rules *rules,
                                                const roicore_tensor *x, const roicore_boxes *boxes,
                                                double spatial_scale, const roicore_out_tensor *out,
                                                void *argmax, roicore_index_type argmax_type,
                                                const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_pool_max_backward(const roicore_max_pool_rules *rules,
                                                 const roicore_tensor *grad_output,
                                                 const void *argmax, roicore_index_type argmax_type,
                                                 const roicore_boxes *boxes,
                                                 const roicore_out_tensor *grad_input,
                                                 const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_pool_bilinear_forward(const roicore_bilinear_pool_rules *rules,
                                                     const roicore_tensor *x,
                                                     const roicore_boxes *boxes,
                                                     double extrapolation_value,
                                                     const roicore_out_tensor *out,
                                                     const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_pool_bilinear_backward(const roicore_bilinear_pool_rules *rules,
                                                      const roicore_tensor *grad_output,
                                                      const roicore_boxes *boxes,
                                                      const roicore_out_tensor *grad_input,
                                                      const roicore_exec *exec,
                                                      roicore_error *err)
    roicore_status roicore_roi_pool_nearest_forward(const roicore_bilinear_pool_rules *rules,
                                                    const roicore_tensor *x,
                                                    const roicore_boxes *boxes,
                                                    double extrapolation_value,
                                                    const roicore_out_tensor *out,
                                                    const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_pool_nearest_backward(const roicore_bilinear_pool_rules *rules,
                                                     const roicore_tensor *grad_output,
                                                     const roicore_boxes *boxes,
                                                     const roicore_out_tensor *grad_input,
                                                     const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_pool_bilinear_boxes_backward(
        const roicore_bilinear_pool_rules *rules, const roicore_tensor *grad_output,
        const roicore_tensor *x, const roicore_boxes *boxes, void *grad_boxes,
        const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_ps_roi_pool_forward(const roicore_ps_roi_pool_rules *rules,
                                               const roicore_tensor *x, const roicore_boxes *boxes,
                                               double spatial_scale, int64_t group_h,
                                               int64_t group_w, const roicore_out_tensor *out,
                                               const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_ps_roi_pool_backward(const roicore_ps_roi_pool_rules *rules,
                                                const roicore_tensor *grad_output,
                                                const roicore_boxes *boxes, double spatial_scale,
                                                int64_t group_h, int64_t group_w,
                                                const roicore_out_tensor *grad_input,
                                                const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_align_forward(const roicore_roi_align_rules *rules,
                                             const roicore_tensor *x, const roicore_boxes *boxes,
                                             double spatial_scale, int64_t sampling_ratio,
                                             int aligned, const roicore_out_tensor *out,
                                             const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_roi_align_backward(const roicore_roi_align_rules *rules,
                                              const roicore_tensor *grad_output,
                                              const roicore_boxes *boxes, double spatial_scale,
                                              int64_t sampling_ratio, int aligned,
                                              const roicore_out_tensor *grad_input,
                                              const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_ps_roi_align_forward(const roicore_ps_roi_align_rules *rules,
                                                const roicore_tensor *x, const roicore_boxes *boxes,
                                                double spatial_scale, int64_t sampling_ratio,
                                                const roicore_out_tensor *out,
                                                const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_ps_roi_align_backward(const roicore_ps_roi_align_rules *rules,
                                                 const roicore_tensor *grad_output,
                                                 const roicore_boxes *boxes, double spatial_scale,
                                                 int64_t sampling_ratio,
                                                 const roicore_out_tensor *grad_input,
                                                 const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_pyramid_levels(const roicore_level_rules *level_rules,
                                          const roicore_pyramid *pyramid, roicore_dtype dtype,
                                          const roicore_boxes *boxes, int64_t *levels,
                                          roicore_error *err)
    roicore_status roicore_pyramid_roi_align_forward(const roicore_roi_align_rules *rules,
                                                     const roicore_level_rules *level_rules,
                                                     const roicore_pyramid *pyramid,
                                                     const roicore_tensor *maps,
                                                     const roicore_boxes *boxes,
                                                     int64_t sampling_ratio, int aligned,
                                                     const roicore_out_tensor *out,
                                                     const roicore_exec *exec, roicore_error *err)
    roicore_status roicore_pyramid_roi_align_backward(const roicore_roi_align_rules *rules,
                                                      const roicore_level_rules *level_rules,
                                                      const roicore_pyramid *pyramid,
                                                      const roicore_tensor *grad_output,
                                                      const roicore_boxes *boxes,
                                                      int64_t sampling_ratio, int aligned,
                                                      const roicore_out_tensor *grad_maps,
                                                      const roicore_exec *exec, roicore_error *err)

    int roicore_abi_version()
    int roicore_version_number()
    const char *roicore_version_string()
    int roicore_openmp_enabled()
    int roicore_resolve_threads(int requested)
    int64_t roicore_get_memory_limit()
    roicore_status roicore_set_memory_limit(int64_t nbytes)
    int64_t roicore_get_scratch_keep_limit()
    roicore_status roicore_set_scratch_keep_limit(int64_t nbytes)
    int64_t roicore_release_scratch()
    roicore_status roicore_check_allocation(int64_t bytes, const char *what, roicore_error *err)
    int64_t roicore_mul(int64_t a, int64_t b)

    ctypedef struct roicore_runtime:
        pass
    roicore_runtime *roicore_runtime_current()
    roicore_status roicore_runtime_share(roicore_runtime *runtime, roicore_error *err)
    roicore_status roicore_watch_interrupts(roicore_error *err)
