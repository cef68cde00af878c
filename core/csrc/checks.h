/* The checks every operator's entry point runs before touching an array (checks.c).  The
 * limits they enforce are public (roicore.h). */
#ifndef ROICORE_CHECKS_H
#define ROICORE_CHECKS_H

#include "common.h"

/* Box k's sampling grid (grid_y x grid_x samples per bin; a side <= 0 means none) within
 * the limits. */
int roicore_check_grid(int64_t k, int64_t grid_y, int64_t grid_x, roicore_error *err);

/* A tensor's own consistency: dtype, layout, dimensions, byte count, data, alignment,
 * reserved fields. */
int roicore_check_tensor(const roicore_tensor *t, const char *name, roicore_error *err);
/* ... and a feature map's: H, W >= 1 and at most ROICORE_MAX_MAP_SIDE. */
int roicore_check_map(const roicore_tensor *x, const char *name, roicore_error *err);
/* An output (or gradient) of exactly the dims (n, c, h, w) and dtype. */
int roicore_check_output(const roicore_tensor *out, const char *name, int64_t n, int64_t c,
                         int64_t h, int64_t w, roicore_dtype dtype, roicore_error *err);
/* A pooled output of at least 1 x 1 bins. */
int roicore_check_pooled(const roicore_tensor *out, const char *name, roicore_error *err);
/* Fails when [a, a + a_bytes) and [b, b + b_bytes) overlap. */
int roicore_check_disjoint(const void *a, int64_t a_bytes, const char *a_name, const void *b,
                           int64_t b_bytes, const char *b_name, roicore_error *err);
int64_t roicore_tensor_bytes(const roicore_tensor *t);

/* Boxes against map x: reserved fields, batch indices in [0, N) (negative where masked),
 * and with need_coords finite coordinates. */
int roicore_check_boxes(const roicore_boxes *b, const roicore_tensor *x, int need_coords,
                        roicore_error *err);
/* `spatial_scale` as the rules' precision holds it, checked positive and finite. */
int roicore_held_scale(double spatial_scale, roicore_precision precision, roicore_dtype dtype,
                       double *held, roicore_error *err);
/* Every |coordinate| * scale (x columns by scale_x, y by scale_y) within 2**24. */
int roicore_check_coord_range(const roicore_boxes *b, roicore_dtype dtype, double scale_x,
                              double scale_y, roicore_error *err);

/* What every forward checks: the exec, x a feature map, boxes on it, out (K, out_c, PH,
 * PW) of x's dtype with PH, PW >= 1, disjoint from x and the boxes. */
int roicore_check_forward(const roicore_exec *exec, const roicore_tensor *x,
                          const roicore_boxes *boxes, int64_t out_c, const roicore_tensor *out,
                          roicore_error *err);
/* ... and every backward: the exec, grad_input a feature map, boxes on it (their
 * coordinates only when read), grad_output (K, g_c, PH, PW), grad_input disjoint from
 * both. */
int roicore_check_backward(const roicore_exec *exec, const roicore_tensor *dx,
                           const roicore_boxes *boxes, int need_coords, int64_t g_c,
                           const roicore_tensor *g, roicore_error *err);

int roicore_check_max_pool_rules(const roicore_max_pool_rules *r, roicore_error *err);
int roicore_check_bilinear_pool_rules(const roicore_bilinear_pool_rules *r, roicore_error *err);
int roicore_check_ps_roi_pool_rules(const roicore_ps_roi_pool_rules *r, roicore_error *err);
int roicore_check_roi_align_rules(const roicore_roi_align_rules *r, roicore_error *err);
int roicore_check_ps_roi_align_rules(const roicore_ps_roi_align_rules *r, roicore_error *err);
int roicore_check_level_rules(const roicore_level_rules *r, roicore_error *err);

/* A position-sensitive map of out_channels * GH * GW channels (GH x GW: the group size). */
int roicore_check_ps_channels(const roicore_tensor *map, int64_t out_channels, int64_t GH,
                              int64_t GW, roicore_error *err);

#endif
