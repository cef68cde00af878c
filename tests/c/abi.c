/* The binary interface of roicore.h, pinned: the size and field offsets of every public
 * struct, the value of every enum constant (rules codes are stored in saved models too) and
 * the type of every function, as of ROICORE_ABI_VERSION 2.  An accidental change fails the
 * compilation of this file (make -C tests/c).  A deliberate one bumps ROICORE_ABI_VERSION,
 * says so in CHANGELOG.md, and updates the pins here. */
#include <stddef.h>
#include <stdint.h>

#include "roicore.h"

#define PIN(cond, what) _Static_assert(cond, what ": an ABI break (see the top of abi.c)")

PIN(ROICORE_ABI_VERSION == 2, "the ABI version changed without the pins below");

/* ------------------------------------------------------------------------ layouts (LP64) */
#if UINTPTR_MAX == UINT64_MAX
#define SIZE(T, n) PIN(sizeof(T) == (n), "sizeof(" #T ")")
#define AT(T, f, n) PIN(offsetof(T, f) == (n), "offsetof(" #T ", " #f ")")

SIZE(roicore_status, 4);
SIZE(roicore_dtype, 4);
SIZE(roicore_layout, 4);
SIZE(roicore_index_type, 4);
SIZE(roicore_precision, 4);
SIZE(roicore_level_epsilon, 4);
SIZE(roicore_level_invalid, 4);

SIZE(roicore_error, 592);
AT(roicore_error, code, 0);
AT(roicore_error, index, 8);
AT(roicore_error, argument, 16);
AT(roicore_error, message, 80);
AT(roicore_error, reserved, 560);

SIZE(roicore_tensor, 80);
AT(roicore_tensor, data, 0);
AT(roicore_tensor, dtype, 8);
AT(roicore_tensor, layout, 12);
AT(roicore_tensor, n, 16);
AT(roicore_tensor, c, 24);
AT(roicore_tensor, h, 32);
AT(roicore_tensor, w, 40);
AT(roicore_tensor, reserved, 48);
SIZE(roicore_out_tensor, 80);
AT(roicore_out_tensor, data, 0);
AT(roicore_out_tensor, dtype, 8);
AT(roicore_out_tensor, layout, 12);
AT(roicore_out_tensor, n, 16);
AT(roicore_out_tensor, c, 24);
AT(roicore_out_tensor, h, 32);
AT(roicore_out_tensor, w, 40);
AT(roicore_out_tensor, reserved, 48);

SIZE(roicore_boxes, 56);
AT(roicore_boxes, coords, 0);
AT(roicore_boxes, batch, 8);
AT(roicore_boxes, k, 16);
AT(roicore_boxes, masked, 24);
AT(roicore_boxes, reserved, 32);

SIZE(roicore_exec, 56);
AT(roicore_exec, n_threads, 0);
AT(roicore_exec, poll, 8);
AT(roicore_exec, poll_arg, 16);
AT(roicore_exec, reserved, 24);

SIZE(roicore_max_pool_rules, 64);
AT(roicore_max_pool_rules, bin_arithmetic, 0);
AT(roicore_max_pool_rules, scale_precision, 4);
AT(roicore_max_pool_rules, initial, 8);
AT(roicore_max_pool_rules, compare, 12);
AT(roicore_max_pool_rules, argmax, 16);
AT(roicore_max_pool_rules, argmax_dtype, 20);
AT(roicore_max_pool_rules, scale_product, 24);
AT(roicore_max_pool_rules, reserved, 28);
SIZE(roicore_bilinear_pool_rules, 64);
AT(roicore_bilinear_pool_rules, pin_last, 0);
AT(roicore_bilinear_pool_rules, fused_lerp, 4);
AT(roicore_bilinear_pool_rules, reserved, 8);
SIZE(roicore_ps_roi_pool_rules, 64);
AT(roicore_ps_roi_pool_rules, scale_precision, 0);
AT(roicore_ps_roi_pool_rules, formula, 4);
AT(roicore_ps_roi_pool_rules, reserved, 8);
SIZE(roicore_roi_align_rules, 64);
AT(roicore_roi_align_rules, sampler, 0);
AT(roicore_roi_align_rules, scale_precision, 4);
AT(roicore_roi_align_rules, empty_grid, 8);
AT(roicore_roi_align_rules, backward_min_size_always, 12);
AT(roicore_roi_align_rules, reduction, 16);
AT(roicore_roi_align_rules, reserved, 20);
SIZE(roicore_ps_roi_align_rules, 64);
AT(roicore_ps_roi_align_rules, scale_precision, 0);
AT(roicore_ps_roi_align_rules, box, 4);
AT(roicore_ps_roi_align_rules, outside, 8);
AT(roicore_ps_roi_align_rules, empty_grid, 12);
AT(roicore_ps_roi_align_rules, reserved, 16);
SIZE(roicore_level_rules, 64);
AT(roicore_level_rules, pixel_offset, 0);
AT(roicore_level_rules, epsilon, 4);
AT(roicore_level_rules, epsilon_inside, 8);
AT(roicore_level_rules, invalid, 12);
AT(roicore_level_rules, one_map, 16);
AT(roicore_level_rules, formula, 20);
AT(roicore_level_rules, reserved, 24);

SIZE(roicore_pyramid, 72);
AT(roicore_pyramid, n_levels, 0);
AT(roicore_pyramid, first_level, 8);
AT(roicore_pyramid, canonical_level, 16);
AT(roicore_pyramid, canonical_size, 24);
AT(roicore_pyramid, spatial_scales, 32);
AT(roicore_pyramid, reserved, 40);
#endif

/* ------------------------------------------------------------------------ values */
#define VALUE(name, v) PIN(name == (v), #name)
VALUE(ROICORE_OK, 0);
VALUE(ROICORE_ERR_ARGUMENT, 1);
VALUE(ROICORE_ERR_VALUE, 2);
VALUE(ROICORE_ERR_MEMORY, 3);
VALUE(ROICORE_ERR_INTERRUPTED, 4);
VALUE(ROICORE_ERR_UNSUPPORTED, 5);
VALUE(ROICORE_FLOAT32, 0);
VALUE(ROICORE_FLOAT64, 1);
VALUE(ROICORE_INT32, 0);
VALUE(ROICORE_INT64, 1);
VALUE(ROICORE_NCHW, 0);
VALUE(ROICORE_NHWC, 1);
VALUE(ROICORE_PRECISION_INPUT, 0);
VALUE(ROICORE_PRECISION_FLOAT32, 1);
VALUE(ROICORE_PRECISION_FLOAT64, 2);
VALUE(ROICORE_BIN_ARITHMETIC_INPUT, 0);
VALUE(ROICORE_BIN_ARITHMETIC_FLOAT32, 1);
VALUE(ROICORE_BIN_ARITHMETIC_EXACT, 2);
VALUE(ROICORE_INITIAL_NEG_FLT_MAX, 0);
VALUE(ROICORE_INITIAL_LOWEST, 1);
VALUE(ROICORE_INITIAL_FIRST, 2);
VALUE(ROICORE_INITIAL_NAN, 3);
VALUE(ROICORE_COMPARE_GREATER, 0);
VALUE(ROICORE_COMPARE_STD_MAX, 1);
VALUE(ROICORE_COMPARE_FMAX, 2);
VALUE(ROICORE_ARGMAX_PLANE, 0);
VALUE(ROICORE_ARGMAX_GLOBAL, 1);
VALUE(ROICORE_SAMPLER_CAFFE2, 0);
VALUE(ROICORE_SAMPLER_PADDLE, 1);
VALUE(ROICORE_SAMPLER_MODEL_GARDEN, 2);
VALUE(ROICORE_PS_ROI_POOL_FORMULA_RFCN, 0);
VALUE(ROICORE_PS_ROI_POOL_FORMULA_TORCHVISION, 1);
VALUE(ROICORE_EMPTY_GRID_ZERO, 0);
VALUE(ROICORE_EMPTY_GRID_NAN, 1);
VALUE(ROICORE_PS_ALIGN_BOX_ALIGNED, 0);
VALUE(ROICORE_PS_ALIGN_BOX_UNALIGNED, 1);
VALUE(ROICORE_OUTSIDE_ZERO, 0);
VALUE(ROICORE_OUTSIDE_FIRST, 1);
VALUE(ROICORE_PS_EMPTY_GRID_DIVIDE, 0);
VALUE(ROICORE_PS_EMPTY_GRID_ZERO, 1);
VALUE(ROICORE_REDUCTION_MEAN, 0);
VALUE(ROICORE_REDUCTION_SUM, 1);
VALUE(ROICORE_LEVEL_EPSILON_1E6, 0);
VALUE(ROICORE_LEVEL_EPSILON_1E8, 1);
VALUE(ROICORE_LEVEL_INVALID_NAN, 0);
VALUE(ROICORE_LEVEL_INVALID_ZERO, 1);
VALUE(ROICORE_LEVEL_INVALID_SKIP, 2);
VALUE(ROICORE_LEVEL_ONE_MAP_ALL, 0);
VALUE(ROICORE_LEVEL_ONE_MAP_RULE, 1);
VALUE(ROICORE_LEVEL_FORMULA_LOG2, 0);
VALUE(ROICORE_LEVEL_FORMULA_MODEL_GARDEN, 1);
/* fields a stored rules array may hold, and those it must hold (older arrays stay valid) */
VALUE(ROICORE_MAX_POOL_RULES_REQUIRED, 6);
VALUE(ROICORE_BILINEAR_POOL_RULES_REQUIRED, 1);
VALUE(ROICORE_PS_ROI_POOL_RULES_REQUIRED, 1);
VALUE(ROICORE_ROI_ALIGN_RULES_REQUIRED, 4);
VALUE(ROICORE_PS_ROI_ALIGN_RULES_REQUIRED, 1);
VALUE(ROICORE_LEVEL_RULES_REQUIRED, 4);
PIN(ROICORE_MAX_POOL_RULES_FIELDS >= 7, "MaxPoolRules lost a field");
PIN(ROICORE_BILINEAR_POOL_RULES_FIELDS >= 2, "BilinearPoolRules lost a field");
PIN(ROICORE_PS_ROI_POOL_RULES_FIELDS >= 2, "PSRoIPoolRules lost a field");
PIN(ROICORE_ROI_ALIGN_RULES_FIELDS >= 5, "RoIAlignRules lost a field");
PIN(ROICORE_PS_ROI_ALIGN_RULES_FIELDS >= 4, "PSRoIAlignRules lost a field");
PIN(ROICORE_LEVEL_RULES_FIELDS >= 6, "LevelRules lost a field");
/* a program may size its per-level arrays by it: it may grow, never shrink */
PIN(ROICORE_MAX_LEVELS >= 64, "ROICORE_MAX_LEVELS shrank");
VALUE(ROICORE_MESSAGE_SIZE, 480);
VALUE(ROICORE_ARGUMENT_SIZE, 64);

/* ------------------------------------------------------------------------ functions */
/* Each function taken as a pointer of its pinned type: another signature is an
 * incompatible-pointer error (-Werror). */
#define FN(name, ...) static __typeof__(__VA_ARGS__) const pin_##name __attribute__((unused)) = name
typedef const roicore_tensor *IN_T;
typedef const roicore_out_tensor *OUT_T;
typedef const roicore_boxes *BOXES_T;
typedef const roicore_exec *EXEC_T;
typedef roicore_error *ERR_T;

FN(roicore_max_pool_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_max_pool_rules *, ERR_T));
FN(roicore_bilinear_pool_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_bilinear_pool_rules *, ERR_T));
FN(roicore_ps_roi_pool_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_ps_roi_pool_rules *, ERR_T));
FN(roicore_roi_align_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_roi_align_rules *, ERR_T));
FN(roicore_ps_roi_align_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_ps_roi_align_rules *, ERR_T));
FN(roicore_level_rules_from_array,
   roicore_status (*)(const int64_t *, int64_t, roicore_level_rules *, ERR_T));
FN(roicore_batch_from_column, roicore_status (*)(const void *, roicore_dtype, int64_t, int64_t,
                                                 int64_t, int, const char *, int64_t *, ERR_T));
FN(roicore_batch_from_indices, roicore_status (*)(const void *, roicore_index_type, int64_t,
                                                  int64_t, int, const char *, int64_t *, ERR_T));
FN(roicore_batch_from_counts, roicore_status (*)(const void *, roicore_index_type, int64_t,
                                                 int64_t, const char *, int64_t *, ERR_T));
FN(roicore_check_coords, roicore_status (*)(const void *, roicore_dtype, int64_t, double, double,
                                            const char *, ERR_T));
FN(roicore_convert_coords, roicore_status (*)(const void *, roicore_dtype, int64_t, int64_t, int,
                                              int64_t, void *, roicore_dtype, ERR_T));
FN(roicore_max_pool_argmax_type, roicore_status (*)(const roicore_max_pool_rules *, IN_T,
                                                    roicore_index_type *, ERR_T));
FN(roicore_roi_pool_max_forward,
   roicore_status (*)(const roicore_max_pool_rules *, IN_T, BOXES_T, double, OUT_T, void *,
                      roicore_index_type, EXEC_T, ERR_T));
FN(roicore_roi_pool_max_backward,
   roicore_status (*)(const roicore_max_pool_rules *, IN_T, const void *, roicore_index_type,
                      BOXES_T, OUT_T, EXEC_T, ERR_T));
FN(roicore_roi_pool_bilinear_forward, roicore_status (*)(const roicore_bilinear_pool_rules *,
                                                         IN_T, BOXES_T, double, OUT_T, EXEC_T,
                                                         ERR_T));
FN(roicore_roi_pool_bilinear_backward, roicore_status (*)(const roicore_bilinear_pool_rules *,
                                                          IN_T, BOXES_T, OUT_T, EXEC_T, ERR_T));
FN(roicore_roi_pool_nearest_forward, roicore_status (*)(const roicore_bilinear_pool_rules *,
                                                        IN_T, BOXES_T, double, OUT_T, EXEC_T,
                                                        ERR_T));
FN(roicore_roi_pool_nearest_backward, roicore_status (*)(const roicore_bilinear_pool_rules *,
                                                         IN_T, BOXES_T, OUT_T, EXEC_T, ERR_T));
FN(roicore_roi_pool_bilinear_boxes_backward,
   roicore_status (*)(const roicore_bilinear_pool_rules *, IN_T, IN_T, BOXES_T, void *, EXEC_T,
                      ERR_T));
FN(roicore_ps_roi_pool_forward,
   roicore_status (*)(const roicore_ps_roi_pool_rules *, IN_T, BOXES_T, double, int64_t, int64_t,
                      OUT_T, EXEC_T, ERR_T));
FN(roicore_ps_roi_pool_backward,
   roicore_status (*)(const roicore_ps_roi_pool_rules *, IN_T, BOXES_T, double, int64_t, int64_t,
                      OUT_T, EXEC_T, ERR_T));
FN(roicore_roi_align_forward,
   roicore_status (*)(const roicore_roi_align_rules *, IN_T, BOXES_T, double, int64_t, int, OUT_T,
                      EXEC_T, ERR_T));
FN(roicore_roi_align_backward,
   roicore_status (*)(const roicore_roi_align_rules *, IN_T, BOXES_T, double, int64_t, int, OUT_T,
                      EXEC_T, ERR_T));
FN(roicore_ps_roi_align_forward,
   roicore_status (*)(const roicore_ps_roi_align_rules *, IN_T, BOXES_T, double, int64_t, OUT_T,
                      EXEC_T, ERR_T));
FN(roicore_ps_roi_align_backward,
   roicore_status (*)(const roicore_ps_roi_align_rules *, IN_T, BOXES_T, double, int64_t, OUT_T,
                      EXEC_T, ERR_T));
FN(roicore_pyramid_levels, roicore_status (*)(const roicore_level_rules *, const roicore_pyramid *,
                                              roicore_dtype, BOXES_T, int64_t *, ERR_T));
FN(roicore_pyramid_roi_align_forward,
   roicore_status (*)(const roicore_roi_align_rules *, const roicore_level_rules *,
                      const roicore_pyramid *, IN_T, BOXES_T, int64_t, int, OUT_T, EXEC_T, ERR_T));
FN(roicore_pyramid_roi_align_backward,
   roicore_status (*)(const roicore_roi_align_rules *, const roicore_level_rules *,
                      const roicore_pyramid *, IN_T, BOXES_T, int64_t, int, OUT_T, EXEC_T, ERR_T));
FN(roicore_abi_version, int (*)(void));
FN(roicore_version_number, int (*)(void));
FN(roicore_version_string, const char *(*)(void));
FN(roicore_openmp_enabled, int (*)(void));
FN(roicore_resolve_threads, int (*)(int));
FN(roicore_get_memory_limit, int64_t (*)(void));
FN(roicore_set_memory_limit, roicore_status (*)(int64_t));
FN(roicore_get_scratch_keep_limit, int64_t (*)(void));
FN(roicore_set_scratch_keep_limit, roicore_status (*)(int64_t));
FN(roicore_release_scratch, int64_t (*)(void));
FN(roicore_check_allocation, roicore_status (*)(int64_t, const char *, ERR_T));
FN(roicore_mul, int64_t (*)(int64_t, int64_t));
FN(roicore_runtime_current, roicore_runtime *(*)(void));
FN(roicore_runtime_share, roicore_status (*)(roicore_runtime *, ERR_T));
FN(roicore_watch_interrupts, roicore_status (*)(ERR_T));
