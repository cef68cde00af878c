/* Validation that every binding and native op goes through: the operators' entry points
 * call these before touching an array, so no caller can make a kernel read or write out of
 * bounds or reach undefined behaviour.  Messages name the argument, what was expected and
 * what came. */
#include <stdio.h>

#include "common.h"
#include "checks.h"

static const char *dtype_name(roicore_dtype d) { return d == ROICORE_FLOAT32 ? "float32" : "float64"; }
static int valid_dtype(roicore_dtype d) { return d == ROICORE_FLOAT32 || d == ROICORE_FLOAT64; }
static int valid_index_type(roicore_index_type t) { return t == ROICORE_INT32 || t == ROICORE_INT64; }
static const char *or_default(const char *name, const char *fallback) {
    return name && *name ? name : fallback;
}

/* "%lld" for an integral value, else "%.17g", into buf. */
static const char *number_text(double v, char *buf, size_t size) {
    if (v == floor(v) && fabs(v) < 9.2e18)
        snprintf(buf, size, "%lld", (long long)v);
    else
        snprintf(buf, size, "%.17g", v);
    return buf;
}

/* The message for image index `text` of box i outside [0, n_images). */
static roicore_status out_of_range(const char *name, int64_t i, const char *text,
                                   int64_t n_images, int masked, roicore_error *err) {
    return roicore_fail_at(err, ROICORE_ERR_VALUE, name, i,
                           "%s[%lld] = %s is out of range for a feature map with N=%lld images "
                           "(expected %s%lld%s)", name, (long long)i, text, (long long)n_images,
                           masked ? "index < " : "0 <= index < ", (long long)n_images,
                           masked ? ", or negative for a masked box" : "");
}

int64_t roicore_tensor_bytes(const roicore_tensor *t) {
    int64_t n = roicore_mul(roicore_mul(t->n, t->c), roicore_mul(t->h, t->w));
    return roicore_mul(n, (int64_t)roicore_dtype_size(t->dtype));
}

/* ------------------------------------------------------------------------ tensors */

int roicore_check_tensor(const roicore_tensor *t, const char *name, roicore_error *err) {
    if (!t) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s is missing (NULL)", name);
    if (!valid_dtype(t->dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype float32 or float64, got dtype code %d", name,
                            (int)t->dtype);
    if (t->layout != ROICORE_NCHW && t->layout != ROICORE_NHWC)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have layout NCHW or NHWC, got layout code %d", name,
                            (int)t->layout);
    if (t->reserved[0] || t->reserved[1] || t->reserved[2] || t->reserved[3])
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s has nonzero reserved fields: zero-initialise the tensor struct "
                            "and set only the fields you use", name);
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
    if (x->h > ROICORE_MAX_MAP_SIDE || x->w > ROICORE_MAX_MAP_SIDE)
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

/* ------------------------------------------------------------------------ boxes */

int roicore_check_boxes(const roicore_boxes *b, const roicore_tensor *x, int need_coords,
                        roicore_error *err) {
    if (!b) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes are missing (NULL)");
    if (b->reserved0 || b->reserved[0] || b->reserved[1] || b->reserved[2])
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "boxes have nonzero reserved fields: zero-initialise roicore_boxes "
                            "and set only the fields you use");
    if (b->masked != 0 && b->masked != 1)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes.masked must be 0 or 1, got %d",
                            (int)b->masked);
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
        if (v >= x->n || (v < 0 && !b->masked)) {
            char text[24];
            snprintf(text, sizeof text, "%lld", (long long)v);
            return out_of_range("batch", k, text, x->n, b->masked, err);
        }
    }
    if (!need_coords) return ROICORE_OK;
    if (!b->coords)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "boxes have no coordinates (NULL)");
    return roicore_check_coords(b->coords, x->dtype, b->k, 0, 0, "boxes", err);
}

/* Rows [x1, y1, x2, y2] of boxes first .. first + k - 1: finite and, scaled, in range. */
static roicore_status check_rows(const void *coords, roicore_dtype dtype, int64_t first,
                                 int64_t k, double scale_x, double scale_y, const char *name,
                                 roicore_error *err) {
    for (int64_t i = 0; i < 4 * k; ++i) {
        const double c = dtype == ROICORE_FLOAT32 ? (double)((const float *)coords)[i]
                                                  : ((const double *)coords)[i];
        const int64_t box = first + i / 4;
        if (!isfinite(c))
            return roicore_fail_at(err, ROICORE_ERR_VALUE, name, box,
                                   "%s coordinates must be finite, got %g in box %lld", name, c,
                                   (long long)box);
        const double reach = fabs(c) * (i % 2 == 0 ? scale_x : scale_y);
        if (!(reach <= ROICORE_MAX_SCALED_COORD))
            return roicore_fail_at(err, ROICORE_ERR_VALUE, name, box,
                                   "%s[%lld] coordinate %g lies %.3g feature-map pixels from the "
                                   "origin; at most 2**24 is supported", name, (long long)box, c,
                                   reach);
    }
    return ROICORE_OK;
}

roicore_status roicore_check_coords(const void *coords, roicore_dtype dtype, int64_t k,
                                    double scale_x, double scale_y, const char *name,
                                    roicore_error *err) {
    name = or_default(name, "boxes");
    if (!valid_dtype(dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype float32 or float64, got dtype code %d", name,
                            (int)dtype);
    if (k < 0 || roicore_mul(k, 4 * (int64_t)roicore_dtype_size(dtype)) < 0)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must number >= 0 boxes whose bytes int64 can count, got %lld",
                            name, (long long)k);
    if (!(scale_x >= 0 && scale_y >= 0))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "the scales of %s must be >= 0, got %g and %g", name, scale_x, scale_y);
    if (k > 0 && !coords)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s have no coordinates (NULL)", name);
    if ((uintptr_t)coords % roicore_dtype_size(dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s coordinates must be aligned to their %s elements, got address %p",
                            name, dtype_name(dtype), coords);
    return check_rows(coords, dtype, 0, k, scale_x, scale_y, name, err);
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
    if (!b->masked)
        return roicore_check_coords(b->coords, dtype, b->k, scale_x, scale_y, "boxes", err);
    const int64_t size = (int64_t)roicore_dtype_size(dtype);
    for (int64_t k = 0; k < b->k; ++k) {  /* masked boxes are never scaled */
        if (b->batch[k] < 0) continue;
        int rc = check_rows((const char *)b->coords + 4 * k * size, dtype, k, 1, scale_x,
                            scale_y, "boxes", err);
        if (rc) return rc;
    }
    return ROICORE_OK;
}

int roicore_check_grid(int64_t k, int64_t grid_y, int64_t grid_x, roicore_error *err) {
    if (grid_y > ROICORE_MAX_GRID || grid_x > ROICORE_MAX_GRID ||
        (grid_y > 0 && grid_x > 0 && grid_y * grid_x > ROICORE_MAX_SAMPLES_PER_BIN))
        return roicore_fail_at(err, ROICORE_ERR_VALUE, "boxes", k,
                               "boxes[%lld] would take %lld x %lld samples per bin with adaptive "
                               "sampling; at most %d per axis and %d per bin are supported: pass "
                               "sampling_ratio > 0", (long long)k, (long long)grid_y,
                               (long long)grid_x, ROICORE_MAX_GRID, ROICORE_MAX_SAMPLES_PER_BIN);
    return ROICORE_OK;
}

/* ------------------------------------------------------------------------ batch indices */

roicore_status roicore_batch_from_column(const void *column, roicore_dtype dtype,
                                         int64_t stride, int64_t k, int64_t n_images,
                                         int masked, const char *name, int64_t *batch,
                                         roicore_error *err) {
    name = or_default(name, "batch column");
    if (!valid_dtype(dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype float32 or float64, got dtype code %d", name,
                            (int)dtype);
    /* any stride (0: a broadcast column, negative: a reversed one) whose reach fits */
    if (k < 0 || stride == INT64_MIN || n_images < 0 ||
        roicore_mul(k, stride < 0 ? -stride : stride) < 0 || (k > 0 && (!column || !batch)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: need k >= 0, a stride whose k steps fit int64, n_images >= 0 "
                            "and arrays, got k=%lld stride=%lld n_images=%lld",
                            name, (long long)k, (long long)stride, (long long)n_images);
    if ((uintptr_t)column % roicore_dtype_size(dtype) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: arrays must be aligned to their elements", name);
    char text[40];
    for (int64_t i = 0; i < k; ++i) {
        const double v = dtype == ROICORE_FLOAT32 ? (double)((const float *)column)[i * stride]
                                                  : ((const double *)column)[i * stride];
        if (!isfinite(v))
            return roicore_fail_at(err, ROICORE_ERR_VALUE, name, i,
                                   "%s[%lld] (a batch index) must be finite, got %g", name,
                                   (long long)i, v);
        if (v != floor(v))
            return roicore_fail_at(err, ROICORE_ERR_VALUE, name, i,
                                   "%s[%lld] (a batch index) must be an integer, got %.17g", name,
                                   (long long)i, v);
        if (masked && v < 0)
            batch[i] = -1;
        else if (!(v >= 0 && v < (double)n_images))
            return out_of_range(name, i, number_text(v, text, sizeof text), n_images, masked, err);
        else
            batch[i] = (int64_t)v;
    }
    return ROICORE_OK;
}

roicore_status roicore_batch_from_indices(const void *indices, roicore_index_type type,
                                          int64_t k, int64_t n_images, int masked,
                                          const char *name, int64_t *batch,
                                          roicore_error *err) {
    name = or_default(name, "batch_indices");
    if (!valid_index_type(type))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype int32 or int64, got index type code %d", name,
                            (int)type);
    if (k < 0 || n_images < 0 || (k > 0 && (!indices || !batch)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: need k >= 0, n_images >= 0 and arrays, got k=%lld n_images=%lld",
                            name, (long long)k, (long long)n_images);
    if ((uintptr_t)indices % roicore_index_size(type) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: arrays must be aligned to their elements", name);
    char text[40];
    for (int64_t i = 0; i < k; ++i) {
        const int64_t v = type == ROICORE_INT32 ? ((const int32_t *)indices)[i]
                                                : ((const int64_t *)indices)[i];
        if (masked && v < 0) {
            batch[i] = -1;
        } else if (v < 0 || v >= n_images) {
            snprintf(text, sizeof text, "%lld", (long long)v);
            return out_of_range(name, i, text, n_images, masked, err);
        } else {
            batch[i] = v;
        }
    }
    return ROICORE_OK;
}

roicore_status roicore_batch_from_counts(const void *counts, roicore_index_type type,
                                         int64_t n_images, int64_t k, const char *name,
                                         int64_t *batch, roicore_error *err) {
    name = or_default(name, "boxes_num");
    if (!valid_index_type(type))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s must have dtype int32 or int64, got index type code %d", name,
                            (int)type);
    if (k < 0 || n_images < 0 || (n_images > 0 && !counts) || (k > 0 && !batch))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: need k >= 0, n_images >= 0 and arrays, got k=%lld n_images=%lld",
                            name, (long long)k, (long long)n_images);
    if ((uintptr_t)counts % roicore_index_size(type) || (uintptr_t)batch % sizeof(int64_t))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s: arrays must be aligned to their elements", name);
    int64_t total = 0;
    int overflow = 0;
    for (int64_t i = 0; i < n_images; ++i) {
        const int64_t c = type == ROICORE_INT32 ? ((const int32_t *)counts)[i]
                                                : ((const int64_t *)counts)[i];
        if (c < 0)
            return roicore_fail_at(err, ROICORE_ERR_VALUE, name, i,
                                   "%s must be non-negative, got %s[%lld] = %lld", name, name,
                                   (long long)i, (long long)c);
        overflow |= __builtin_add_overflow(total, c, &total);
    }
    if (overflow || total != k) {
        char text[40];
        snprintf(text, sizeof text, overflow ? "more than 2**63" : "%lld", (long long)total);
        return roicore_fail(err, ROICORE_ERR_VALUE,
                            "%s must sum to the number of boxes (%lld), got sum(%s) = %s", name,
                            (long long)k, name, text);
    }
    int64_t j = 0;
    for (int64_t i = 0; i < n_images; ++i) {
        const int64_t c = type == ROICORE_INT32 ? ((const int32_t *)counts)[i]
                                                : ((const int64_t *)counts)[i];
        for (int64_t m = 0; m < c; ++m) batch[j++] = i;
    }
    return ROICORE_OK;
}

roicore_status roicore_convert_coords(const void *src, roicore_dtype src_dtype, int64_t stride,
                                      int64_t first, int yx, int64_t k, void *dst,
                                      roicore_dtype dst_dtype, roicore_error *err) {
    if (!valid_dtype(src_dtype) || !valid_dtype(dst_dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates: dtypes must be float32 or float64, got codes %d "
                            "and %d", (int)src_dtype, (int)dst_dtype);
    if (k < 0 || first < 0 || first > INT64_MAX - 4 || stride < first + 4 ||
        roicore_mul(k, stride) < 0 || roicore_mul(k, 4) < 0 || (k > 0 && (!src || !dst)))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates: need k >= 0, first >= 0, stride >= first + 4, "
                            "k * stride within int64 and arrays, got k=%lld stride=%lld "
                            "first=%lld", (long long)k, (long long)stride, (long long)first);
    if ((uintptr_t)src % roicore_dtype_size(src_dtype) ||
        (uintptr_t)dst % roicore_dtype_size(dst_dtype))
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "box coordinates: arrays must be aligned to their elements");
    static const int xy_order[4] = {0, 1, 2, 3}, yx_order[4] = {1, 0, 3, 2};
    const int *order = yx ? yx_order : xy_order;
    for (int64_t i = 0; i < k; ++i)
        for (int j = 0; j < 4; ++j) {
            const int64_t s = i * stride + first + order[j];
            const double v = src_dtype == ROICORE_FLOAT32 ? (double)((const float *)src)[s]
                                                          : ((const double *)src)[s];
            if (dst_dtype == ROICORE_FLOAT32)
                ((float *)dst)[4 * i + j] = (float)v;
            else
                ((double *)dst)[4 * i + j] = v;
        }
    return ROICORE_OK;
}

/* ------------------------------------------------------------------------ rules */

/* Each rules struct's fields in declaration order: its name in messages, the codes it
 * takes (a range, and for scale_product the one gap) and the default an array that stops
 * before it gets.  roicore.core.conventions holds the same fields and defaults (a test
 * compares them). */
typedef struct {
    const char *name;
    int64_t lo, hi;
    int64_t fallback;  /* the default; only the trailing fields after *_REQUIRED use it */
} field_spec;

static const field_spec MAX_POOL_FIELDS[ROICORE_MAX_POOL_RULES_FIELDS] = {
    {"bin_arithmetic", 0, 2, 0}, {"scale_precision", 0, 1, 0}, {"initial", 0, 3, 0},
    {"compare", 0, 2, 0},        {"argmax", 0, 1, 0},          {"argmax_dtype", 0, 1, 0},
    {"scale_product", 0, 2, ROICORE_PRECISION_INPUT},
};
static const field_spec BILINEAR_POOL_FIELDS[ROICORE_BILINEAR_POOL_RULES_FIELDS] = {
    {"pin_last", 0, 1, 0}, {"fused_lerp", 0, 1, 0},
};
static const field_spec PS_ROI_POOL_FIELDS[ROICORE_PS_ROI_POOL_RULES_FIELDS] = {
    {"scale_precision", 0, 1, 0}, {"formula", 0, 1, ROICORE_PS_ROI_POOL_FORMULA_RFCN},
};
static const field_spec ROI_ALIGN_FIELDS[ROICORE_ROI_ALIGN_RULES_FIELDS] = {
    {"sampler", 0, 2, 0}, {"scale_precision", 0, 1, 0}, {"empty_grid", 0, 1, 0},
    {"backward_min_size_always", 0, 1, 0}, {"reduction", 0, 1, ROICORE_REDUCTION_MEAN},
};
static const field_spec PS_ROI_ALIGN_FIELDS[ROICORE_PS_ROI_ALIGN_RULES_FIELDS] = {
    {"scale_precision", 0, 1, 0}, {"box", 0, 1, ROICORE_PS_ALIGN_BOX_ALIGNED},
    {"outside", 0, 1, ROICORE_OUTSIDE_ZERO}, {"empty_grid", 0, 1, ROICORE_PS_EMPTY_GRID_DIVIDE},
};
static const field_spec LEVEL_FIELDS[ROICORE_LEVEL_RULES_FIELDS] = {
    {"pixel_offset", 0, 1, 0}, {"epsilon", 0, 1, 0}, {"epsilon_inside", 0, 1, 0},
    {"invalid", 0, 2, 0}, {"one_map", 0, 1, ROICORE_LEVEL_ONE_MAP_ALL},
    {"formula", 0, 1, ROICORE_LEVEL_FORMULA_LOG2},
};

/* Checks `values` (every field of a struct, in order) against `spec`, and that the struct's
 * `n_reserved` reserved words are zero. */
static int check_fields(const char *what, const field_spec *spec, int n, const int64_t *values,
                        const int32_t *reserved, int n_reserved, roicore_error *err) {
    for (int i = 0; i < n; ++i)
        if (values[i] < spec[i].lo || values[i] > spec[i].hi)
            return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s.%s must be a code in [%lld, %lld], "
                                "got %lld", what, spec[i].name, (long long)spec[i].lo,
                                (long long)spec[i].hi, (long long)values[i]);
    for (int i = 0; i < n_reserved; ++i)
        if (reserved[i])
            return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                                "%s has nonzero reserved fields: zero-initialise the struct and set "
                                "only its fields (a later roicore may give them a meaning)", what);
    return ROICORE_OK;
}

/* `n` values of an array into `out` (every field), the trailing missing ones defaulted. */
static int read_fields(const char *what, const field_spec *spec, int count, int required,
                       const int64_t *values, int64_t n, int64_t *out, roicore_error *err) {
    if (n > 0 && !values)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT, "%s fields are missing (NULL)", what);
    if (n > count)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s has %lld fields, but roicore %s knows %d: it was stored by a "
                            "newer roicore (a saved model from a later version); upgrade roicore "
                            "to use it", what, (long long)n, ROICORE_VERSION_STRING, count);
    if (n < required)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "%s needs at least %d fields (%s to %s), got %lld", what, required,
                            spec[0].name, spec[required - 1].name, (long long)n);
    for (int i = 0; i < count; ++i) out[i] = i < n ? values[i] : spec[i].fallback;
    return ROICORE_OK;
}

#define CHECK_RULES(what, SPEC, ...)                                                          \
    do {                                                                                      \
        const int64_t values[] = {__VA_ARGS__};                                               \
        return check_fields(what, SPEC, (int)(sizeof SPEC / sizeof SPEC[0]), values,          \
                            r->reserved, (int)(sizeof r->reserved / sizeof r->reserved[0]),   \
                            err);                                                             \
    } while (0)

int roicore_check_max_pool_rules(const roicore_max_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "max-pool rules are missing (NULL)");
    if (r->scale_product == ROICORE_PRECISION_FLOAT32)
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "MaxPoolRules.scale_product must be input (0) or float64 (2), got 1");
    CHECK_RULES("MaxPoolRules", MAX_POOL_FIELDS, r->bin_arithmetic, r->scale_precision,
                r->initial, r->compare, r->argmax, r->argmax_dtype, r->scale_product);
}

int roicore_check_bilinear_pool_rules(const roicore_bilinear_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "bilinear rules are missing (NULL)");
    CHECK_RULES("BilinearPoolRules", BILINEAR_POOL_FIELDS, r->pin_last, r->fused_lerp);
}

int roicore_check_ps_roi_pool_rules(const roicore_ps_roi_pool_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "PS-RoI rules are missing (NULL)");
    CHECK_RULES("PSRoIPoolRules", PS_ROI_POOL_FIELDS, r->scale_precision, r->formula);
}

int roicore_check_roi_align_rules(const roicore_roi_align_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "RoIAlign rules are missing (NULL)");
    CHECK_RULES("RoIAlignRules", ROI_ALIGN_FIELDS, r->sampler, r->scale_precision, r->empty_grid,
                r->backward_min_size_always, r->reduction);
}

int roicore_check_ps_roi_align_rules(const roicore_ps_roi_align_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "PS-RoIAlign rules are missing (NULL)");
    CHECK_RULES("PSRoIAlignRules", PS_ROI_ALIGN_FIELDS, r->scale_precision, r->box, r->outside,
                r->empty_grid);
}

int roicore_check_level_rules(const roicore_level_rules *r, roicore_error *err) {
    if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, "level rules are missing (NULL)");
    CHECK_RULES("LevelRules", LEVEL_FIELDS, r->pixel_offset, r->epsilon, r->epsilon_inside,
                r->invalid, r->one_map, r->formula);
}

/* Reads an array into a zeroed struct `r` with the given field assignments, range-checking
 * the values before they are cast to the fields' types, then the struct itself. */
#define RULES_FROM_ARRAY(what, SPEC, COUNT, REQUIRED, CHECK, ...)                             \
    do {                                                                                      \
        int64_t v[COUNT] = {0};                                                               \
        if (!r) return roicore_fail(err, ROICORE_ERR_ARGUMENT, what " output is missing (NULL)"); \
        int rc = read_fields(what, SPEC, COUNT, REQUIRED, f, n, v, err);                      \
        if (!rc) rc = check_fields(what, SPEC, COUNT, v, NULL, 0, err);                       \
        if (rc) return (roicore_status)rc;                                                    \
        memset(r, 0, sizeof *r);                                                              \
        __VA_ARGS__;                                                                          \
        return (roicore_status)CHECK(r, err);                                                 \
    } while (0)

roicore_status roicore_max_pool_rules_from_array(const int64_t *f, int64_t n,
                                                 roicore_max_pool_rules *r, roicore_error *err) {
    RULES_FROM_ARRAY("MaxPoolRules", MAX_POOL_FIELDS, ROICORE_MAX_POOL_RULES_FIELDS,
                     ROICORE_MAX_POOL_RULES_REQUIRED, roicore_check_max_pool_rules,
                     r->bin_arithmetic = (roicore_bin_arithmetic)v[0];
                     r->scale_precision = (roicore_precision)v[1];
                     r->initial = (roicore_initial)v[2]; r->compare = (roicore_compare)v[3];
                     r->argmax = (roicore_argmax_encoding)v[4];
                     r->argmax_dtype = (roicore_index_type)v[5];
                     r->scale_product = (roicore_precision)v[6]);
}

roicore_status roicore_bilinear_pool_rules_from_array(const int64_t *f, int64_t n,
                                                      roicore_bilinear_pool_rules *r,
                                                      roicore_error *err) {
    RULES_FROM_ARRAY("BilinearPoolRules", BILINEAR_POOL_FIELDS, ROICORE_BILINEAR_POOL_RULES_FIELDS,
                     ROICORE_BILINEAR_POOL_RULES_REQUIRED, roicore_check_bilinear_pool_rules,
                     r->pin_last = (int32_t)v[0]; r->fused_lerp = (int32_t)v[1]);
}

roicore_status roicore_ps_roi_pool_rules_from_array(const int64_t *f, int64_t n,
                                                    roicore_ps_roi_pool_rules *r,
                                                    roicore_error *err) {
    RULES_FROM_ARRAY("PSRoIPoolRules", PS_ROI_POOL_FIELDS, ROICORE_PS_ROI_POOL_RULES_FIELDS,
                     ROICORE_PS_ROI_POOL_RULES_REQUIRED, roicore_check_ps_roi_pool_rules,
                     r->scale_precision = (roicore_precision)v[0];
                     r->formula = (roicore_ps_roi_pool_formula)v[1]);
}

roicore_status roicore_roi_align_rules_from_array(const int64_t *f, int64_t n,
                                                  roicore_roi_align_rules *r,
                                                  roicore_error *err) {
    RULES_FROM_ARRAY("RoIAlignRules", ROI_ALIGN_FIELDS, ROICORE_ROI_ALIGN_RULES_FIELDS,
                     ROICORE_ROI_ALIGN_RULES_REQUIRED, roicore_check_roi_align_rules,
                     r->sampler = (roicore_sampler)v[0];
                     r->scale_precision = (roicore_precision)v[1];
                     r->empty_grid = (roicore_empty_grid)v[2];
                     r->backward_min_size_always = (int32_t)v[3];
                     r->reduction = (roicore_reduction)v[4]);
}

roicore_status roicore_ps_roi_align_rules_from_array(const int64_t *f, int64_t n,
                                                     roicore_ps_roi_align_rules *r,
                                                     roicore_error *err) {
    RULES_FROM_ARRAY("PSRoIAlignRules", PS_ROI_ALIGN_FIELDS, ROICORE_PS_ROI_ALIGN_RULES_FIELDS,
                     ROICORE_PS_ROI_ALIGN_RULES_REQUIRED, roicore_check_ps_roi_align_rules,
                     r->scale_precision = (roicore_precision)v[0];
                     r->box = (roicore_ps_align_box)v[1]; r->outside = (roicore_outside)v[2];
                     r->empty_grid = (roicore_ps_empty_grid)v[3]);
}

roicore_status roicore_level_rules_from_array(const int64_t *f, int64_t n,
                                              roicore_level_rules *r, roicore_error *err) {
    RULES_FROM_ARRAY("LevelRules", LEVEL_FIELDS, ROICORE_LEVEL_RULES_FIELDS,
                     ROICORE_LEVEL_RULES_REQUIRED, roicore_check_level_rules,
                     r->pixel_offset = (int32_t)v[0]; r->epsilon = (roicore_level_epsilon)v[1];
                     r->epsilon_inside = (int32_t)v[2]; r->invalid = (roicore_level_invalid)v[3];
                     r->one_map = (roicore_level_one_map)v[4];
                     r->formula = (roicore_level_formula)v[5]);
}

/* ------------------------------------------------------------------------ operators */

int roicore_check_forward(const roicore_exec *exec, const roicore_tensor *x,
                          const roicore_boxes *boxes, int64_t out_c, const roicore_tensor *out,
                          roicore_error *err) {
    int rc;
    if ((rc = roicore_check_exec(exec, err)) || (rc = roicore_check_map(x, "x", err)) ||
        (rc = roicore_check_boxes(boxes, x, 1, err)) ||
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
    const int64_t want = roicore_mul(roicore_mul(out_channels, GH), GW);
    if (want != map->c) {
        char text[40];
        if (want < 0)
            snprintf(text, sizeof text, "more than 2**63");
        else
            snprintf(text, sizeof text, "%lld", (long long)want);
        return roicore_fail(err, ROICORE_ERR_ARGUMENT,
                            "the feature map must have output_channels * %lld * %lld = %s "
                            "channels (output_channels=%lld, group %lldx%lld), got C=%lld",
                            (long long)GH, (long long)GW, text, (long long)out_channels,
                            (long long)GH, (long long)GW, (long long)map->c);
    }
    return ROICORE_OK;
}

int roicore_check_backward(const roicore_exec *exec, const roicore_tensor *dx,
                           const roicore_boxes *boxes, int need_coords, int64_t g_c,
                           const roicore_tensor *g, roicore_error *err) {
    int rc;
    if ((rc = roicore_check_exec(exec, err)) || (rc = roicore_check_map(dx, "grad_input", err)) ||
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
