/* Validation that every binding and native op goes through: the operators' entry points
 * call these before touching an array, so no caller can make a kernel read or write out of
 * bounds or reach undefined behaviour.  Messages name the argument, what was expected and
 * what came. */
#include <stdio.h>

#include "common.h"
#include "checks.h"

static const char *dtype_name(roicore_dtype d) { return d == ROICORE_FLOAT32 ? "float32" : "float64"; }

int64_t roicore_tensor_bytes(const roicore_tensor *t) {
    int64_t n = roicore_mul(roicore_mul(t->n, t->c), roicore_mul(t->h, t->w));
    return roicore_mul(n, (int64_t)roicore_dtype_size(t->dtype));
}

int roicore_check_tensor(const roicore_tensor *t, const char *name, roicore_error *err) {
    if (!t) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s is missing (NULL)", name);
    if (t->dtype != ROICORE_FLOAT32 && t->dtype != ROICORE_FLOAT64)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype float32 or float64, got dtype code %d", name,
                            (int)t->dtype);
    if (t->layout != ROICORE_NCHW && t->layout != ROICORE_NHWC)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have layout NCHW or NHWC, got layout code %d", name,
                            (int)t->layout);
    if (t->n < 0 || t->c < 0 || t->h < 0 || t->w < 0)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have non-negative dimensions, got (%lld, %lld, %lld, %lld)",
                            name, (long long)t->n, (long long)t->c, (long long)t->h,
                            (long long)t->w);
    int64_t bytes = roicore_tensor_bytes(t);
    if (bytes < 0)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s of shape (%lld, %lld, %lld, %lld) has more bytes than int64 holds",
                            name, (long long)t->n, (long long)t->c, (long long)t->h,
                            (long long)t->w);
    if (bytes > 0 && !t->data)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s has %lld bytes but no data (NULL)",
                            name, (long long)bytes);
    if ((uintptr_t)t->data % roicore_dtype_size(t->dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must be aligned to its %s elements (%zu bytes), got address %p",
                            name, dtype_name(t->dtype), roicore_dtype_size(t->dtype), t->data);
    return ROICORE_OK;
}

int roicore_check_map(const roicore_tensor *x, const char *name, roicore_error *err) {
    int rc = roicore_check_tensor(x, name, err);
    if (rc) return rc;
    if (x->h < 1 || x->w < 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have H >= 1 and W >= 1, got (%lld, %lld, %lld, %lld)", name,
                            (long long)x->n, (long long)x->c, (long long)x->h, (long long)x->w);
    if (x->h >= INT32_MAX || x->w >= INT32_MAX)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have H and W below 2**31, got (%lld, %lld)", name,
                            (long long)x->h, (long long)x->w);
    return ROICORE_OK;
}

int roicore_check_output(const roicore_tensor *out, const char *name, int64_t n, int64_t c,
                         int64_t h, int64_t w, roicore_dtype dtype, roicore_error *err) {
    int rc = roicore_check_tensor(out, name, err);
    if (rc) return rc;
    if (out->n != n || out->c != c || out->h != h || out->w != w)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have shape (%lld, %lld, %lld, %lld), got (%lld, %lld, %lld, "
                            "%lld)", name, (long long)n, (long long)c, (long long)h,
                            (long long)w, (long long)out->n, (long long)out->c,
                            (long long)out->h, (long long)out->w);
    if (out->dtype != dtype)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s must have dtype %s, got %s", name,
                            dtype_name(dtype), dtype_name(out->dtype));
    return ROICORE_OK;
}

int roicore_check_pooled(const roicore_tensor *out, const char *name, roicore_error *err) {
    if (out && (out->h < 1 || out->w < 1))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have a pooled size of at least 1 x 1, got %lld x %lld", name,
                            (long long)out->h, (long long)out->w);
    return ROICORE_OK;
}

int roicore_check_disjoint(const void *a, int64_t a_bytes, const char *a_name, const void *b,
                           int64_t b_bytes, const char *b_name, roicore_error *err) {
    if (a_bytes <= 0 || b_bytes <= 0 || !a || !b) return ROICORE_OK;
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    if (a0 < b0 + (uintptr_t)b_bytes && b0 < a0 + (uintptr_t)a_bytes)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s must not share memory with %s",
                            a_name, b_name);
    return ROICORE_OK;
}

int roicore_check_boxes(const roicore_boxes *b, const roicore_tensor *x, int need_coords,
                        roicore_error *err) {
    if (!b) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes are missing (NULL)");
    if (b->k < 0)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes must number >= 0, got %lld",
                            (long long)b->k);
    if (roicore_mul(b->k, 4 * (int64_t)roicore_dtype_size(x->dtype)) < 0)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%lld boxes are too many",
                            (long long)b->k);
    if (b->k == 0) return ROICORE_OK;
    if (!b->batch)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes have no batch indices (NULL)");
    if ((uintptr_t)b->batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "batch indices must be aligned to 8 bytes, got address %p",
                            (const void *)b->batch);
    for (int64_t k = 0; k < b->k; ++k) {
        int64_t v = b->batch[k];
        if (v >= x->n || (v < 0 && !b->masked))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "batch index %lld of box %lld is out of range for a feature map "
                                "with N=%lld images (expected 0 <= index < %lld)", (long long)v,
                                (long long)k, (long long)x->n, (long long)x->n);
    }
    if (!need_coords) return ROICORE_OK;
    if (!b->coords)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes have no coordinates (NULL)");
    if ((uintptr_t)b->coords % roicore_dtype_size(x->dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates must be aligned to their %s elements, got address %p",
                            dtype_name(x->dtype), b->coords);
    return roicore_check_coords(b->coords, x->dtype, b->k, 0, 0, err);
}

int roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k, double scale_x,
                         double scale_y, roicore_error *err) {
    if (k > 0 && !coords)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes have no coordinates (NULL)");
    if ((uintptr_t)coords % roicore_dtype_size(dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates must be aligned to their elements, got address %p",
                            coords);
    for (int64_t i = 0; i < 4 * k; ++i) {
        const double c = dtype == ROICORE_FLOAT32 ? (double)((const float *)coords)[i]
                                                  : ((const double *)coords)[i];
        if (!isfinite(c))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes coordinates must be finite, got %g in box %lld", c,
                                (long long)(i / 4));
        const double reach = fabs(c) * (i % 2 == 0 ? scale_x : scale_y);
        if (!(reach <= ROICORE_MAX_SCALED_COORD))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes[%lld] coordinate %g lies %.3g feature-map pixels from the "
                                "origin; at most 2**24 is supported", (long long)(i / 4), c, reach);
    }
    return ROICORE_OK;
}

int roicore_held_scale(double spatial_scale, roicore_precision precision, roicore_dtype dtype,
                       double *held, roicore_error *err) {
    if (!(spatial_scale > 0) || !isfinite(spatial_scale))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "spatial_scale must be positive and finite, got %g", spatial_scale);
    int as_float = precision == ROICORE_PRECISION_FLOAT32 ||
                   (precision == ROICORE_PRECISION_INPUT && dtype == ROICORE_FLOAT32);
    *held = as_float ? (double)(float)spatial_scale : spatial_scale;
    if (!(*held > 0) || !isfinite(*held))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "spatial_scale=%g becomes %g when held as a float32 (as the "
                            "convention's framework holds it); it must stay positive and finite",
                            spatial_scale, *held);
    return ROICORE_OK;
}

int roicore_check_coord_range(const roicore_boxes *b, roicore_dtype dtype, double scale_x,
                              double scale_y, roicore_error *err) {
    if (!b->masked) return roicore_check_coords(b->coords, dtype, b->k, scale_x, scale_y, err);
    const int64_t size = (int64_t)roicore_dtype_size(dtype);
    for (int64_t k = 0; k < b->k; ++k) {  /* masked boxes are never scaled */
        if (b->batch[k] < 0) continue;
        int rc = roicore_check_coords((const char *)b->coords + 4 * k * size, dtype, 1, scale_x,
                                      scale_y, err);
        if (rc) return rc;
    }
    return ROICORE_OK;
}

int roicore_check_grid(int64_t k, int64_t grid_y, int64_t grid_x, roicore_error *err) {
    if (grid_y > ROICORE_MAX_GRID || grid_x > ROICORE_MAX_GRID ||
        (grid_y > 0 && grid_x > 0 && grid_y * grid_x > ROICORE_MAX_SAMPLES_PER_BIN))
        return roicore_fail(err, ROICORE_ERR_VALUE,
                            "boxes[%lld] would take %lld x %lld samples per bin with adaptive "
                            "sampling; at most %d per axis and %d per bin are supported: pass "
                            "sampling_ratio > 0", (long long)k, (long long)grid_y,
                            (long long)grid_x, ROICORE_MAX_GRID, ROICORE_MAX_SAMPLES_PER_BIN);
    return ROICORE_OK;
}

/* ------------------------------------------------------------------------ batch indices */

int roicore_batch_from_column(const void *column, roicore_dtype dtype, int64_t stride,
                              int64_t k, int64_t n_images, int masked, int64_t *batch,
                              roicore_error *err) {
    if (k < 0 || stride == 0 || (k > 0 && (!column || !batch)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "batch column: need k >= 0, a nonzero stride and arrays, got k=%lld "
                            "stride=%lld", (long long)k, (long long)stride);
    if ((uintptr_t)column % roicore_dtype_size(dtype) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "batch column: arrays must be aligned to their elements");
    for (int64_t i = 0; i < k; ++i) {
        double v = dtype == ROICORE_FLOAT32 ? (double)((const float *)column)[i * stride]
                                            : ((const double *)column)[i * stride];
        if (!isfinite(v))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes[%lld, 0] (batch index) must be finite, got %g",
                                (long long)i, v);
        if (v != floor(v))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes[%lld, 0] (batch index) must be an integer, got %g",
                                (long long)i, v);
        if (masked && v < 0) {
            batch[i] = -1;
            continue;
        }
        if (!(v >= 0 && v < (double)n_images))
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes[%lld, 0] (batch index) = %.17g is out of range for a "
                                "feature map with N=%lld images (expected 0 <= index < %lld)",
                                (long long)i, v, (long long)n_images, (long long)n_images);
        batch[i] = (int64_t)v;
    }
    return ROICORE_OK;
}

int roicore_batch_from_indices(const void *indices, roicore_index_type type, int64_t k,
                               int64_t n_images, int64_t *batch, roicore_error *err) {
    if (k < 0 || (k > 0 && (!indices || !batch)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "box indices: need k >= 0 and arrays");
    if ((uintptr_t)indices % roicore_index_size(type) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box indices: arrays must be aligned to their elements");
    for (int64_t i = 0; i < k; ++i) {
        int64_t v = type == ROICORE_INT32 ? ((const int32_t *)indices)[i]
                                          : ((const int64_t *)indices)[i];
        if (v < 0 || v >= n_images)
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "box_indices[%lld] = %lld is outside [0, batch_size) for images "
                                "with batch_size=%lld", (long long)i, (long long)v,
                                (long long)n_images);
        batch[i] = v;
    }
    return ROICORE_OK;
}

int roicore_batch_from_counts(const void *counts, roicore_index_type type, int64_t n_images,
                              int64_t k, int64_t *batch, roicore_error *err) {
    if (k < 0 || n_images < 0 || (n_images > 0 && !counts) || (k > 0 && !batch))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "box counts: need k >= 0 and arrays");
    if ((uintptr_t)counts % roicore_index_size(type) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box counts: arrays must be aligned to their elements");
    int64_t total = 0;
    for (int64_t i = 0; i < n_images; ++i) {
        int64_t c = type == ROICORE_INT32 ? ((const int32_t *)counts)[i]
                                          : ((const int64_t *)counts)[i];
        if (c < 0)
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes_num must be non-negative, got %lld for image %lld",
                                (long long)c, (long long)i);
        if (__builtin_add_overflow(total, c, &total) || total > k)
            return roicore_fail(err, ROICORE_ERR_VALUE,
                                "boxes_num must sum to the number of boxes (%lld), got more",
                                (long long)k);
    }
    if (total != k)
        return roicore_fail(err, ROICORE_ERR_VALUE,
                            "boxes_num must sum to the number of boxes (%lld), got %lld",
                            (long long)k, (long long)total);
    int64_t j = 0;
    for (int64_t i = 0; i < n_images; ++i) {
        int64_t c = type == ROICORE_INT32 ? ((const int32_t *)counts)[i]
                                          : ((const int64_t *)counts)[i];
        for (int64_t m = 0; m < c; ++m) batch[j++] = i;
    }
    return ROICORE_OK;
}

int roicore_convert_coords(const void *src, roicore_dtype src_dtype, int64_t stride,
                           int64_t first, int yx, int64_t k, void *dst, roicore_dtype dst_dtype,
                           roicore_error *err) {
    if (k < 0 || first < 0 || stride < first + 4 || (k > 0 && (!src || !dst)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates: need k >= 0, stride >= first + 4 and arrays, got "
                            "k=%lld stride=%lld first=%lld", (long long)k, (long long)stride,
                            (long long)first);
    if ((uintptr_t)src % roicore_dtype_size(src_dtype) || (uintptr_t)dst % roicore_dtype_size(dst_dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates: arrays must be aligned to their elements");
    static const int xy_order[4] = {0, 1, 2, 3}, yx_order[4] = {1, 0, 3, 2};
    const int *order = yx ? yx_order : xy_order;
    for (int64_t i = 0; i < k; ++i)
        for (int j = 0; j < 4; ++j) {
            int64_t s = i * stride + first + order[j];
            double v = src_dtype == ROICORE_FLOAT32 ? (double)((const float *)src)[s]
                                                    : ((const double *)src)[s];
            if (dst_dtype == ROICORE_FLOAT32)
                ((float *)dst)[4 * i + j] = (float)v;
            else
                ((double *)dst)[4 * i + j] = v;
        }
    return ROICORE_OK;
}

/* ------------------------------------------------------------------------ rules */

#define FIELD_IN(rules_name, field, value, lo, hi)                                             \
    if ((int64_t)(value) < (lo) || (int64_t)(value) > (hi))                                    \
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,                                         \
                            rules_name "." field " must be a code in [%d, %d], got %lld", (lo), \
                            (hi), (long long)(value));

int roicore_check_max_pool_rules(const roicore_max_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "max-pool rules are missing (NULL)");
    FIELD_IN("MaxPoolRules", "bin_arithmetic", r->bin_arithmetic, 0, 2)
    FIELD_IN("MaxPoolRules", "scale_precision", r->scale_precision, 0, 1)
    FIELD_IN("MaxPoolRules", "initial", r->initial, 0, 3)
    FIELD_IN("MaxPoolRules", "compare", r->compare, 0, 2)
    FIELD_IN("MaxPoolRules", "argmax", r->argmax, 0, 1)
    FIELD_IN("MaxPoolRules", "argmax_dtype", r->argmax_dtype, 0, 1)
    if (r->scale_product != ROICORE_PRECISION_INPUT && r->scale_product != ROICORE_PRECISION_FLOAT64)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "MaxPoolRules.scale_product must be input (0) or float64 (2), got %d",
                            (int)r->scale_product);
    return ROICORE_OK;
}

int roicore_check_bilinear_pool_rules(const roicore_bilinear_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "bilinear rules are missing (NULL)");
    FIELD_IN("BilinearPoolRules", "pin_last", r->pin_last, 0, 1)
    FIELD_IN("BilinearPoolRules", "fused_lerp", r->fused_lerp, 0, 1)
    return ROICORE_OK;
}

int roicore_check_psroi_pool_rules(const roicore_psroi_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "PS-RoI rules are missing (NULL)");
    FIELD_IN("PSRoIPoolRules", "scale_precision", r->scale_precision, 0, 1)
    FIELD_IN("PSRoIPoolRules", "formula", r->formula, 0, 1)
    return ROICORE_OK;
}

int roicore_check_roi_align_rules(const roicore_roi_align_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "RoIAlign rules are missing (NULL)");
    FIELD_IN("RoIAlignRules", "sampler", r->sampler, 0, 1)
    FIELD_IN("RoIAlignRules", "scale_precision", r->scale_precision, 0, 1)
    FIELD_IN("RoIAlignRules", "empty_grid", r->empty_grid, 0, 1)
    FIELD_IN("RoIAlignRules", "backward_min_size_always", r->backward_min_size_always, 0, 1)
    return ROICORE_OK;
}

int roicore_check_ps_roi_align_rules(const roicore_ps_roi_align_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "PS-RoIAlign rules are missing (NULL)");
    FIELD_IN("PSRoIAlignRules", "scale_precision", r->scale_precision, 0, 1)
    return ROICORE_OK;
}

static int field_count(const char *what, int64_t n, int64_t want, roicore_error *err) {
    if (n != want)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s take %lld fields, got %lld", what,
                            (long long)want, (long long)n);
    return ROICORE_OK;
}

int roicore_max_pool_rules_from_array(const int64_t *f, int64_t n, roicore_max_pool_rules *r,
                                      roicore_error *err) {
    int rc = field_count("MaxPoolRules", n, 7, err);
    if (rc) return rc;
    for (int i = 0; i < 7; ++i)
        if (f[i] < 0 || f[i] > 3)
            return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                                "MaxPoolRules field %d must be a code in [0, 3], got %lld", i,
                                (long long)f[i]);
    r->bin_arithmetic = (roicore_bin_arithmetic)f[0];
    r->scale_precision = (roicore_precision)f[1];
    r->initial = (roicore_initial)f[2];
    r->compare = (roicore_compare)f[3];
    r->argmax = (roicore_argmax_encoding)f[4];
    r->argmax_dtype = (roicore_index_type)f[5];
    r->scale_product = (roicore_precision)f[6];
    return roicore_check_max_pool_rules(r, err);
}

int roicore_bilinear_pool_rules_from_array(const int64_t *f, int64_t n,
                                           roicore_bilinear_pool_rules *r, roicore_error *err) {
    int rc = field_count("BilinearPoolRules", n, 2, err);
    if (rc) return rc;
    if (f[0] < 0 || f[0] > 1 || f[1] < 0 || f[1] > 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "BilinearPoolRules fields must be 0 or 1, got %lld, %lld",
                            (long long)f[0], (long long)f[1]);
    r->pin_last = (int)f[0];
    r->fused_lerp = (int)f[1];
    return ROICORE_OK;
}

int roicore_psroi_pool_rules_from_array(const int64_t *f, int64_t n, roicore_psroi_pool_rules *r,
                                        roicore_error *err) {
    int rc = field_count("PSRoIPoolRules", n, 2, err);
    if (rc) return rc;
    for (int i = 0; i < 2; ++i)
        if (f[i] < 0 || f[i] > 1)
            return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                                "PSRoIPoolRules field %d must be a code in [0, 1], got %lld", i,
                                (long long)f[i]);
    r->scale_precision = (roicore_precision)f[0];
    r->formula = (roicore_psroi_formula)f[1];
    return ROICORE_OK;
}

int roicore_roi_align_rules_from_array(const int64_t *f, int64_t n, roicore_roi_align_rules *r,
                                       roicore_error *err) {
    int rc = field_count("RoIAlignRules", n, 4, err);
    if (rc) return rc;
    for (int i = 0; i < 4; ++i)
        if (f[i] < 0 || f[i] > 1)
            return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                                "RoIAlignRules field %d must be a code in [0, 1], got %lld", i,
                                (long long)f[i]);
    r->sampler = (roicore_sampler)f[0];
    r->scale_precision = (roicore_precision)f[1];
    r->empty_grid = (roicore_empty_grid)f[2];
    r->backward_min_size_always = (int)f[3];
    return ROICORE_OK;
}

int roicore_ps_roi_align_rules_from_array(const int64_t *f, int64_t n,
                                          roicore_ps_roi_align_rules *r, roicore_error *err) {
    int rc = field_count("PSRoIAlignRules", n, 1, err);
    if (rc) return rc;
    if (f[0] < 0 || f[0] > 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "PSRoIAlignRules.scale_precision must be a code in [0, 1], got %lld",
                            (long long)f[0]);
    r->scale_precision = (roicore_precision)f[0];
    return ROICORE_OK;
}

/* ------------------------------------------------------------------------ operators */

int roicore_check_forward(const roicore_tensor *x, const roicore_boxes *boxes, int64_t out_c,
                          const roicore_tensor *out, roicore_error *err) {
    int rc;
    if ((rc = roicore_check_map(x, "x", err)) || (rc = roicore_check_boxes(boxes, x, 1, err)) ||
        (rc = roicore_check_output(out, "out", boxes->k, out_c, out ? out->h : 0,
                                   out ? out->w : 0, x->dtype, err)) ||
        (rc = roicore_check_pooled(out, "out", err)))
        return rc;
    const int64_t bytes = roicore_tensor_bytes(out), bsz = (int64_t)roicore_dtype_size(x->dtype);
    if ((rc = roicore_check_disjoint(out->data, bytes, "out", x->data, roicore_tensor_bytes(x), "x", err)) ||
        (rc = roicore_check_disjoint(out->data, bytes, "out", boxes->coords, 4 * boxes->k * bsz,
                                     "boxes", err)) ||
        (rc = roicore_check_disjoint(out->data, bytes, "out", boxes->batch, 8 * boxes->k,
                                     "batch indices", err)))
        return rc;
    return ROICORE_OK;
}

int roicore_check_ps_channels(const roicore_tensor *map, int64_t out_channels, int64_t GH,
                              int64_t GW, roicore_error *err) {
    if (GH < 1 || GW < 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "group size must be >= 1, got %lld x %lld",
                            (long long)GH, (long long)GW);
    if (roicore_mul(roicore_mul(out_channels, GH), GW) != map->c)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "the feature map must have output_channels * %lld * %lld = %lld "
                            "channels (output_channels=%lld, group %lldx%lld), got C=%lld",
                            (long long)GH, (long long)GW, (long long)(out_channels * GH * GW),
                            (long long)out_channels, (long long)GH, (long long)GW,
                            (long long)map->c);
    return ROICORE_OK;
}

int roicore_check_backward(const roicore_tensor *dx, const roicore_boxes *boxes,
                           int need_coords, int64_t g_c, const roicore_tensor *g,
                           roicore_error *err) {
    int rc;
    if ((rc = roicore_check_map(dx, "grad_input", err)) ||
        (rc = roicore_check_boxes(boxes, dx, need_coords, err)) ||
        (rc = roicore_check_output(g, "grad_output", boxes->k, g_c, g ? g->h : 0, g ? g->w : 0,
                                   dx->dtype, err)) ||
        (rc = roicore_check_pooled(g, "grad_output", err)))
        return rc;
    const int64_t bytes = roicore_tensor_bytes(dx), bsz = (int64_t)roicore_dtype_size(dx->dtype);
    if ((rc = roicore_check_disjoint(dx->data, bytes, "grad_input", g->data,
                                     roicore_tensor_bytes(g), "grad_output", err)) ||
        (rc = roicore_check_disjoint(dx->data, bytes, "grad_input", need_coords ? boxes->coords : NULL,
                                     4 * boxes->k * bsz, "boxes", err)) ||
        (rc = roicore_check_disjoint(dx->data, bytes, "grad_input", boxes->batch, 8 * boxes->k,
                                     "batch indices", err)))
        return rc;
    return ROICORE_OK;
}
