"""Slow, loop-based reference implementations of the roicore operators.

Written from the formulas in ``docs/semantics.md`` (sections 2-6), independently of the
compiled kernels: explicit Python loops over RoIs, channels, bins and pixels, in the same order
as the framework kernels, so that the *accumulation order* is also the reference one.

Arithmetic dtype
----------------
Every quantity the C kernels compute in the template type ``T`` is computed here as a numpy
scalar of that type (``np.float32`` or ``np.float64``), one operation at a time, so each
intermediate result is rounded exactly as binary32/binary64 arithmetic rounds it (x86-64 SSE,
no FMA contraction).  A value that C computes in ``double`` (e.g. ``0.5 * (y1 + y2) * (H - 1)``
or Paddle's ``1.0 / count``) is computed as a Python float and then cast to ``T``.

* ``c_round`` is C ``round``: halves go away from zero (Python ``round`` and ``np.rint`` go to
  even).
* floor/ceil/truncation are ``math.floor`` / ``math.ceil`` / ``int`` on the exact scalar.
* ``rules`` arguments are the convention records of ``roicore.core.conventions`` (any object with
  the same attribute names works).

float16 is not handled here: the core computes float16 in float32, so a test casts to float32
before calling the reference.  Batch indices outside ``[0, N)`` and non-finite box coordinates
(undefined behaviour in the framework kernels) raise ``ValueError``.

Nothing here imports compiled roicore code.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
from fractions import Fraction

import numpy as np

__all__ = [
    "FLT_MAX", "c_round", "caffe_bin_edges",
    "roi_pool_max", "roi_pool_max_backward",
    "roi_pool_bilinear", "roi_pool_bilinear_backward",
    "roi_pool_nearest", "roi_pool_nearest_backward", "roi_pool_bilinear_boxes_backward",
    "psroi_pool", "psroi_pool_backward",
    "roi_align", "roi_align_backward",
    "ps_roi_align", "ps_roi_align_backward",
    "numeric_grad",
]

#: C ``FLT_MAX`` as a Python float (exact).
FLT_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------

def c_round(v) -> int:
    """C ``round``: nearest integer, halves away from zero; returns a Python int.

    Exact for every binary32/binary64 input (the fractional part ``v - floor(v)`` of a float is
    exactly representable, so no ``v + 0.5`` double-rounding trap).
    """
    v = float(v)
    if not math.isfinite(v):
        raise ValueError(f"cannot round non-finite value {v!r} (undefined behaviour in C)")
    lo = math.floor(v)
    frac = v - lo
    if frac > 0.5:
        return lo + 1
    if frac < 0.5:
        return lo
    return lo + 1 if v > 0 else lo          # exact half: away from zero


def _real_type(a) -> type:
    """The numpy scalar type T of a float32/float64 array."""
    dt = np.asarray(a).dtype
    if dt == np.float32:
        return np.float32
    if dt == np.float64:
        return np.float64
    raise TypeError(f"reference handles float32 and float64 only, got {dt}")


def _pair(size) -> tuple[int, int]:
    if isinstance(size, (int, np.integer)):
        return int(size), int(size)
    a, b = size
    return int(a), int(b)


def _scale(T, spatial_scale, precision):
    """spatial_scale as the kernel holds it, as a T scalar.

    ``"float32"``: a C ``float`` attribute, promoted to T (``double(float(s))`` for float64);
    ``"input"``: the Python double cast to T (torchvision).
    """
    if precision == "float32":
        return T(np.float32(spatial_scale))
    if precision == "input":
        return T(spatial_scale)
    raise ValueError(f"unknown scale_precision {precision!r}")


def _batch_index(batch, n, N) -> int:
    b = int(batch[n])
    if not 0 <= b < N:
        raise ValueError(f"batch index {b} of box {n} is outside [0, {N})")
    return b


def _box(boxes, n, T):
    vals = tuple(T(v) for v in boxes[n])
    return vals


def _clamp(v, lo, hi) -> int:
    return min(max(v, lo), hi)


def _boxes_as(boxes, T):
    boxes = np.asarray(boxes).astype(T, copy=False).reshape(-1, 4)
    return boxes


# ---------------------------------------------------------------------------------------------
# RoI max pooling (Caffe / Fast R-CNN integer RoI): docs/semantics.md 2.2-2.4 and 3
# ---------------------------------------------------------------------------------------------

def caffe_bin_edges(rh: int, P: int, arithmetic: str, T=np.float32) -> list[tuple[int, int]]:
    """Relative ``[start, end)`` of the P bins of an integer RoI spanning ``rh`` pixels.

    ``arithmetic``: ``"input"`` (bins in T), ``"float32"`` (always binary32), ``"exact"``
    (integer floor/ceil of ``k*rh/P``).
    """
    if arithmetic == "exact":
        return [((k * rh) // P, -((-(k + 1) * rh) // P)) for k in range(P)]
    if arithmetic == "float32":
        B = np.float32
    elif arithmetic == "input":
        B = T
    else:
        raise ValueError(f"unknown bin_arithmetic {arithmetic!r}")
    bin_size = B(rh) / B(P)
    return [(math.floor(B(k) * bin_size), math.ceil(B(k + 1) * bin_size)) for k in range(P)]


def _max_initial(T, initial):
    if initial == "-FLT_MAX":
        return T(-FLT_MAX)
    if initial == "lowest":
        return T(-np.finfo(T).max)
    if initial in ("nan", "first"):  # "first" replaces it with the bin's first element
        return T(np.nan)
    raise ValueError(f"unknown initial {initial!r}")


def roi_pool_max(x, boxes, batch, output_size, spatial_scale, rules):
    """RoI max pooling -> ``(y, argmax)``.

    x (N,C,H,W); boxes (K,4) ``[x1,y1,x2,y2]`` in image coordinates; batch (K,) ints.
    ``rules``: MaxPoolRules (bin_arithmetic, scale_precision, initial, compare, argmax,
    argmax_dtype).  argmax is ``h*W+w`` ("plane") or ``((b*C+c)*H+h)*W+w`` ("global"),
    -1 for empty bins and for bins where nothing was selected.
    """
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    PH, PW = _pair(output_size)
    K = boxes.shape[0]
    y = np.zeros((K, C, PH, PW), dtype=T)
    am = np.full((K, C, PH, PW), -1, dtype=np.dtype(rules.argmax_dtype))
    s = _scale(T, spatial_scale, rules.scale_precision)
    init = _max_initial(T, rules.initial)
    compare = rules.compare
    if compare not in ("greater", "std_max", "fmax"):
        raise ValueError(f"unknown compare {compare!r}")
    if rules.argmax not in ("plane", "global"):
        raise ValueError(f"unknown argmax encoding {rules.argmax!r}")

    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            x1, y1, x2, y2 = _box(boxes, n, T)
            if getattr(rules, "scale_product", "input") == "float64":
                # OpenVINO CPU plugin: the product x * s is formed in double
                rs_w, rs_h, re_w, re_h = (c_round(float(v) * float(s)) for v in (x1, y1, x2, y2))
            else:
                rs_w = c_round(x1 * s)
                rs_h = c_round(y1 * s)
                re_w = c_round(x2 * s)
                re_h = c_round(y2 * s)
            rh = max(re_h - rs_h + 1, 1)
            rw = max(re_w - rs_w + 1, 1)
            hbins = caffe_bin_edges(rh, PH, rules.bin_arithmetic, T)
            wbins = caffe_bin_edges(rw, PW, rules.bin_arithmetic, T)
            for c in range(C):
                for ph in range(PH):
                    hstart = _clamp(hbins[ph][0] + rs_h, 0, H)
                    hend = _clamp(hbins[ph][1] + rs_h, 0, H)
                    for pw in range(PW):
                        wstart = _clamp(wbins[pw][0] + rs_w, 0, W)
                        wend = _clamp(wbins[pw][1] + rs_w, 0, W)
                        if hend <= hstart or wend <= wstart:
                            y[n, c, ph, pw] = T(0)
                            am[n, c, ph, pw] = -1
                            continue
                        m = init
                        arg = -1
                        if rules.initial == "first":
                            m, arg = x[b, c, hstart, wstart], hstart * W + wstart
                        for h in range(hstart, hend):
                            for w in range(wstart, wend):
                                v = x[b, c, h, w]
                                if compare == "greater":
                                    if v > m:
                                        m, arg = v, h * W + w
                                elif compare == "std_max":
                                    # m = (v < m) ? m : v ; argmax follows every assignment
                                    if not (v < m):
                                        m, arg = v, h * W + w
                                else:  # fmax: NaN ignored, first maximum keeps the argmax
                                    if (math.isnan(m) and not math.isnan(v)) or v > m:
                                        m, arg = v, h * W + w
                        y[n, c, ph, pw] = m
                        if arg >= 0 and rules.argmax == "global":
                            arg = ((b * C + c) * H) * W + arg
                        am[n, c, ph, pw] = arg
    return y, am


def roi_pool_max_backward(grad_output, argmax, batch, input_shape, rules):
    """Scatter ``grad_output`` through ``argmax``: zeros, then serially over (n, c, ph, pw)
    ``dx[pos] += g`` where argmax >= 0.  Accumulates in the grad dtype."""
    g = np.asarray(grad_output)
    T = _real_type(g)
    argmax = np.asarray(argmax)
    N, C, H, W = (int(d) for d in input_shape)
    dx = np.zeros((N, C, H, W), dtype=T)
    K, C2, PH, PW = g.shape
    for n in range(K):
        b = _batch_index(batch, n, N) if rules.argmax == "plane" else None
        for c in range(C2):
            for ph in range(PH):
                for pw in range(PW):
                    a = int(argmax[n, c, ph, pw])
                    if a < 0:
                        continue
                    if rules.argmax == "plane":
                        idx = (b, c, a // W, a % W)
                    else:
                        idx = np.unravel_index(a, (N, C, H, W))
                    dx[idx] = dx[idx] + g[n, c, ph, pw]
    return dx


# ---------------------------------------------------------------------------------------------
# Bilinear "RoI pooling": OpenVINO ROIPooling bilinear / TF crop_and_resize (docs/semantics.md 6)
# ---------------------------------------------------------------------------------------------

def _crop_coord(k, P, lo, hi, size, pin_last, T):
    """Sample position of output cell k along one axis, in T (normalised box ``lo..hi``)."""
    if P > 1:
        Lm1 = T(size - 1)
        if pin_last and k == P - 1:
            return Lm1 * hi                                   # (H-1)*y2, pinned
        step = (hi - lo) * Lm1 / T(P - 1)                     # ((y2-y1)*(H-1)) / (P-1)
        return T(k) * step + lo * Lm1
    # P == 1: the centre; (y1+y2) in T, then 0.5*...*(H-1) in double, then cast to T
    return T(0.5 * float(lo + hi) * float(size - 1))


def _crop_samples(boxes, n, H, W, PH, PW, pin_last, T):
    """Yield (ph, pw, in_range, in_y, in_x): the sample position of each cell of box n."""
    x1, y1, x2, y2 = _box(boxes, n, T)
    if not all(math.isfinite(float(v)) for v in (x1, y1, x2, y2)):
        raise ValueError("boxes must be finite")
    for ph in range(PH):
        in_y = _crop_coord(ph, PH, y1, y2, H, pin_last, T)
        for pw in range(PW):
            in_x = _crop_coord(pw, PW, x1, x2, W, pin_last, T)
            off_map = in_y < 0 or in_y > T(H - 1) or in_x < 0 or in_x > T(W - 1)
            yield ph, pw, not off_map, in_y, in_x


def _crop_cells(boxes, n, H, W, PH, PW, pin_last, T):
    """Yield (ph, pw, in_range, t, bo, l, r, y_lerp, x_lerp) for box n."""
    for ph, pw, ok, in_y, in_x in _crop_samples(boxes, n, H, W, PH, PW, pin_last, T):
        if not ok:
            yield ph, pw, False, 0, 0, 0, 0, T(0), T(0)
            continue
        t = math.floor(in_y)
        bo = min(math.ceil(in_y), H - 1)
        l = math.floor(in_x)
        r = min(math.ceil(in_x), W - 1)
        yield ph, pw, True, t, bo, l, r, in_y - T(t), in_x - T(l)


def _lerp(a, b, t, T):
    """a + (b - a) * t, each operation rounded to T."""
    return a + (b - a) * t


def _fused_lerp(a, b, t, T):
    """fma(b - a, t, a): the difference rounded to T, then (b-a)*t + a rounded once."""
    d = b - a
    return round_exact(Fraction(float(d)) * Fraction(float(t)) + Fraction(float(a)), T)


def round_exact(q: Fraction, T):
    """The value of T nearest to the rational q, ties to even (IEEE round-to-nearest)."""
    if T is np.float64:
        return np.float64(float(q))  # Fraction.__float__ rounds correctly
    guess = np.float32(float(q))     # within one float32 step of the answer
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess,
                  np.nextafter(guess, np.float32(np.inf))]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - q),
                                          int(np.array(c).view(np.uint32)) & 1))
    return np.float32(best)


def roi_pool_bilinear(x, boxes, batch, output_size, rules, extrapolation_value=0.0):
    """Bilinear crop: OpenVINO ROIPooling "bilinear" (``rules.pin_last`` True) or TF
    ``crop_and_resize`` (False).  boxes are normalised ``[x1,y1,x2,y2]``; out-of-range cells
    give ``extrapolation_value`` (cast to T)."""
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    PH, PW = _pair(output_size)
    K = boxes.shape[0]
    y = np.zeros((K, C, PH, PW), dtype=T)
    ext = T(extrapolation_value)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            cells = list(_crop_cells(boxes, n, H, W, PH, PW, bool(rules.pin_last), T))
            for c in range(C):
                v = x[b, c]
                for ph, pw, ok, t, bo, l, r, ly, lx in cells:
                    if not ok:
                        y[n, c, ph, pw] = ext
                        continue
                    lerp = _fused_lerp if getattr(rules, "fused_lerp", False) else _lerp
                    top = lerp(v[t, l], v[t, r], lx, T)
                    bot = lerp(v[bo, l], v[bo, r], lx, T)
                    y[n, c, ph, pw] = lerp(top, bot, ly, T)
    return y


def roi_pool_bilinear_backward(grad_output, boxes, batch, input_shape, rules,
                               extrapolation_value=0.0):
    """TF ``CropAndResizeGradImage`` order, serial over (n, c, ph, pw); in-range cells only.
    ``extrapolation_value`` is a constant and does not enter the gradient."""
    g = np.asarray(grad_output)
    T = _real_type(g)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = (int(d) for d in input_shape)
    K, C2, PH, PW = g.shape
    dx = np.zeros((N, C, H, W), dtype=T)
    one = T(1)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            cells = list(_crop_cells(boxes, n, H, W, PH, PW, bool(rules.pin_last), T))
            for c in range(C2):
                d = dx[b, c]
                for ph, pw, ok, t, bo, l, r, ly, lx in cells:
                    if not ok:
                        continue
                    gv = g[n, c, ph, pw]
                    dtop = (one - ly) * gv
                    d[t, l] = d[t, l] + (one - lx) * dtop
                    d[t, r] = d[t, r] + lx * dtop
                    dbot = ly * gv
                    d[bo, l] = d[bo, l] + (one - lx) * dbot
                    d[bo, r] = d[bo, r] + lx * dbot
    return dx


def roi_pool_nearest(x, boxes, batch, output_size, rules, extrapolation_value=0.0):
    """TF ``crop_and_resize(method="nearest")``: each cell takes the pixel nearest its
    bilinear sample position, ``roundf`` (halves away from zero) on both axes; cells off
    the map give ``extrapolation_value``.  ``rules.pin_last`` places the samples as in
    :func:`roi_pool_bilinear` (False for TF)."""
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    PH, PW = _pair(output_size)
    K = boxes.shape[0]
    y = np.zeros((K, C, PH, PW), dtype=T)
    for n in range(K):
        b = _batch_index(batch, n, N)
        for ph, pw, ok, in_y, in_x in _crop_samples(boxes, n, H, W, PH, PW,
                                                      bool(rules.pin_last), T):
            y[n, :, ph, pw] = x[b, :, c_round(in_y), c_round(in_x)] if ok else T(extrapolation_value)
    return y


def roi_pool_nearest_backward(grad_output, boxes, batch, input_shape, rules):
    """TF ``CropAndResizeGradImage(method="nearest")``: each in-range cell's gradient added
    to its nearest pixel, serially in (n, c, ph, pw) order."""
    g = np.asarray(grad_output)
    T = _real_type(g)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = (int(d) for d in input_shape)
    K, _, PH, PW = g.shape
    dx = np.zeros((N, C, H, W), dtype=T)
    for n in range(K):
        b = _batch_index(batch, n, N)
        samples = list(_crop_samples(boxes, n, H, W, PH, PW, bool(rules.pin_last), T))
        for c in range(C):
            for ph, pw, ok, in_y, in_x in samples:
                if ok:
                    i, j = c_round(in_y), c_round(in_x)
                    dx[b, c, i, j] = dx[b, c, i, j] + g[n, c, ph, pw]
    return dx


def roi_pool_bilinear_boxes_backward(grad_output, x, boxes, batch):
    """Gradient of the TF bilinear crop with respect to the normalised boxes
    ``[x1, y1, x2, y2]``: TF ``CropAndResizeGradBoxes`` (which TF also uses for
    method="nearest"), returned in roicore's column order.

    Its arithmetic differs from the forward's: the sample step is
    ``(y2 - y1) * ((H-1)/(PH-1))`` where the forward computes ``((y2 - y1)*(H-1))/(PH-1)``,
    so a sample can fall an ulp, and on rare occasions a pixel, away from the forward's.
    Each box accumulates serially over (ph, pw, c); for a crop size of 1 the term
    ``g * 0.5 * (H-1)`` is computed in double and the sum rounded to T.
    """
    g = np.asarray(grad_output)
    T = _real_type(g)
    x = np.asarray(x).astype(T, copy=False)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    K, _, PH, PW = g.shape
    one = T(1)
    out = np.zeros((K, 4), dtype=T)

    def axis(lo, hi, size, P):
        """(sample positions, ratio): TF's in_y for every p, and (size-1)/(P-1)."""
        ratio = T(size - 1) / T(P - 1) if P > 1 else T(0)
        step = (hi - lo) * ratio
        if P > 1:
            return [lo * T(size - 1) + T(p) * step for p in range(P)], ratio
        return [T(0.5 * float(lo + hi) * float(size - 1))], ratio

    def add(acc, grad, p, size, P, ratio, upper):
        """acc + grad * d(position)/d(lo or hi), as TF rounds it."""
        if P > 1:
            return acc + grad * (T(p) * ratio if upper else T(size - 1) - T(p) * ratio)
        return T(float(acc) + float(grad) * 0.5 * float(size - 1))

    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            x1, y1, x2, y2 = _box(boxes, n, T)
            if not all(math.isfinite(float(v)) for v in (x1, y1, x2, y2)):
                raise ValueError("boxes must be finite")
            ys, h_ratio = axis(y1, y2, H, PH)
            xs, w_ratio = axis(x1, x2, W, PW)
            dx1, dy1, dx2, dy2 = T(0), T(0), T(0), T(0)
            for ph in range(PH):
                in_y = ys[ph]
                if in_y < 0 or in_y > T(H - 1):
                    continue
                t, bo = math.floor(in_y), math.ceil(in_y)
                ly = in_y - T(t)
                for pw in range(PW):
                    in_x = xs[pw]
                    if in_x < 0 or in_x > T(W - 1):
                        continue
                    l, r = math.floor(in_x), math.ceil(in_x)
                    lx = in_x - T(l)
                    for c in range(C):
                        v = x[b, c]
                        tl, tr, bl, br = v[t, l], v[t, r], v[bo, l], v[bo, r]
                        grad_y = (one - lx) * (bl - tl) + lx * (br - tr)
                        grad_x = (one - ly) * (tr - tl) + ly * (br - bl)
                        top = g[n, c, ph, pw]
                        grad_y = grad_y * top
                        grad_x = grad_x * top
                        dy1 = add(dy1, grad_y, ph, H, PH, h_ratio, False)
                        dy2 = add(dy2, grad_y, ph, H, PH, h_ratio, True)
                        dx1 = add(dx1, grad_x, pw, W, PW, w_ratio, False)
                        dx2 = add(dx2, grad_x, pw, W, PW, w_ratio, True)
            out[n] = dx1, dy1, dx2, dy2
    return out


# ---------------------------------------------------------------------------------------------
# Position-sensitive RoI pooling (R-FCN float RoI): docs/semantics.md 2.6 and 4
# ---------------------------------------------------------------------------------------------

def _psroi_geometry(box, s, T):
    """(rs_h, rs_w, bin_h, bin_w) of the R-FCN float RoI, all in T (bins need PH/PW later)."""
    x1, y1, x2, y2 = box
    rs_w = T(c_round(x1)) * s                       # round BEFORE scaling
    rs_h = T(c_round(y1)) * s
    re_w = T(c_round(x2) + 1.0) * s                 # +1 before scaling
    re_h = T(c_round(y2) + 1.0) * s
    rw = re_w - rs_w
    rh = re_h - rs_h
    tenth = T(0.1)
    if rw < tenth:                                  # std::max(rw, (T)0.1)
        rw = tenth
    if rh < tenth:
        rh = tenth
    return rs_h, rs_w, rh, rw


def _psroi_bins(rs, size_, P, L, T):
    """[(start, end)] of the P bins along one axis of length L (offset added before floor)."""
    bin_size = size_ / T(P)
    out = []
    for p in range(P):
        start = math.floor(T(p) * bin_size + rs)
        end = math.ceil(T(p + 1) * bin_size + rs)
        out.append((_clamp(start, 0, L), _clamp(end, 0, L)))
    return out


def _group_index(p, G, P, T) -> int:
    """MXNet ``min(max(floor((T)p * G / P), 0), G-1)`` computed in T."""
    gi = math.floor(T(p) * T(G) / T(P))
    return _clamp(gi, 0, G - 1)


def _psroi_setup(x_shape, output_channels, output_size, group_size):
    N, C, H, W = x_shape
    PH, PW = _pair(output_size)
    GH, GW = _pair(group_size) if group_size is not None else (PH, PW)
    if C < output_channels * GH * GW:
        raise ValueError(
            f"input has {C} channels, fewer than output_channels*GH*GW = "
            f"{output_channels * GH * GW}")
    return N, C, H, W, PH, PW, GH, GW


def psroi_pool(x, boxes, batch, output_channels, output_size, spatial_scale, rules,
               group_size=None):
    """R-FCN position-sensitive average pooling (MXNet PSROIPooling / Paddle psroi_pool).

    Input channel of output (ctop, ph, pw) is ``(ctop*GH + gh)*GW + gw`` with
    ``gh = clamp(floor((T)ph*GH/PH), 0, GH-1)``; group_size defaults to output_size.
    Average = sum (h outer, w inner, from 0, in T) / (T)area; empty bins give 0.
    ``rules.formula == "torchvision"`` computes torchvision's ps_roi_pool instead.
    """
    if getattr(rules, "formula", "rfcn") == "torchvision":
        return _tv_psroi_pool(x, boxes, batch, output_channels, output_size, spatial_scale,
                              rules, group_size)
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W, PH, PW, GH, GW = _psroi_setup(x.shape, output_channels, output_size,
                                              group_size)
    K = boxes.shape[0]
    OC = int(output_channels)
    s = _scale(T, spatial_scale, rules.scale_precision)
    y = np.zeros((K, OC, PH, PW), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            rs_h, rs_w, rh, rw = _psroi_geometry(_box(boxes, n, T), s, T)
            hb = _psroi_bins(rs_h, rh, PH, H, T)
            wb = _psroi_bins(rs_w, rw, PW, W, T)
            for ctop in range(OC):
                for ph in range(PH):
                    hstart, hend = hb[ph]
                    gh = _group_index(ph, GH, PH, T)
                    for pw in range(PW):
                        wstart, wend = wb[pw]
                        gw = _group_index(pw, GW, PW, T)
                        c = (ctop * GH + gh) * GW + gw
                        if hend <= hstart or wend <= wstart:
                            y[n, ctop, ph, pw] = T(0)
                            continue
                        acc = T(0)
                        for h in range(hstart, hend):
                            for w in range(wstart, wend):
                                acc = acc + x[b, c, h, w]
                        area = T((hend - hstart) * (wend - wstart))
                        y[n, ctop, ph, pw] = acc / area
    return y


def psroi_pool_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                        rules, group_size=None):
    """Serial over (n, ctop, ph, pw): ``dx[b, c, h, w] += g/area`` over the bin (h outer).
    ``rules.formula == "torchvision"``: torchvision's ps_roi_pool backward instead."""
    if getattr(rules, "formula", "rfcn") == "torchvision":
        return _tv_psroi_pool_backward(grad_output, boxes, batch, input_shape, output_size,
                                       spatial_scale, rules, group_size)
    g = np.asarray(grad_output)
    T = _real_type(g)
    boxes = _boxes_as(boxes, T)
    K, OC, _, _ = g.shape
    N, C, H, W, PH, PW, GH, GW = _psroi_setup(tuple(int(d) for d in input_shape), OC,
                                              output_size, group_size)
    if g.shape[2:] != (PH, PW):
        raise ValueError(f"grad_output spatial shape {g.shape[2:]} != output_size {(PH, PW)}")
    s = _scale(T, spatial_scale, rules.scale_precision)
    dx = np.zeros((N, C, H, W), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            rs_h, rs_w, rh, rw = _psroi_geometry(_box(boxes, n, T), s, T)
            hb = _psroi_bins(rs_h, rh, PH, H, T)
            wb = _psroi_bins(rs_w, rw, PW, W, T)
            for ctop in range(OC):
                for ph in range(PH):
                    hstart, hend = hb[ph]
                    gh = _group_index(ph, GH, PH, T)
                    for pw in range(PW):
                        wstart, wend = wb[pw]
                        gw = _group_index(pw, GW, PW, T)
                        c = (ctop * GH + gh) * GW + gw
                        if hend <= hstart or wend <= wstart:
                            continue
                        area = T((hend - hstart) * (wend - wstart))
                        diff = g[n, ctop, ph, pw] / area
                        for h in range(hstart, hend):
                            for w in range(wstart, wend):
                                dx[b, c, h, w] = dx[b, c, h, w] + diff
    return dx


# torchvision ps_roi_pool (docs/semantics.md 4.3): the integer RoI of max pooling without +1

def _tv_psroi_box(box, s, backward):
    """(rs_w, rs_h, bin_w, bin_h): starts rounded after scaling, size at least 1, in T.
    The backward rounds with C ``roundf``: the product in T, converted to float32."""
    T = type(s)
    if backward:
        rs_w, rs_h, re_w, re_h = (c_round(np.float32(v * s)) for v in box)
    else:
        rs_w, rs_h, re_w, re_h = (c_round(v * s) for v in box)
    rw = max(re_w - rs_w, 1)
    rh = max(re_h - rs_h, 1)
    return rs_w, rs_h, T(rw), T(rh)


def _tv_psroi_bin(p, start, size_, P, last, T):
    """[start, end) of bin p: ``floor(p*bin)`` .. ``ceil((p+1)*bin)`` plus the integer start,
    clamped to [0, last]."""
    bin_size = size_ / T(P)
    lo = math.floor(T(p) * bin_size) + start
    hi = math.ceil(T(p + 1) * bin_size) + start
    return _clamp(lo, 0, last), _clamp(hi, 0, last)


def _tv_psroi_setup(shape, output_size, group_size, output_channels=None):
    N, C, H, W = shape
    PH, PW = _pair(output_size)
    if group_size is not None and _pair(group_size) != (PH, PW):
        raise ValueError("torchvision ps_roi_pool has no group size other than the pooled size")
    if C % (PH * PW) or (output_channels is not None and C != output_channels * PH * PW):
        raise ValueError(f"input has {C} channels, not output_channels*PH*PW")
    return N, C, H, W, PH, PW, C // (PH * PW)


def _tv_ps_backward_setup(grad_output, boxes, input_shape, output_size, group_size=None):
    """(g, T, boxes in T, (N, C, H, W, PH, PW, D), zeroed dx) of a torchvision
    position-sensitive backward, its grad_output checked against the shapes."""
    g = np.asarray(grad_output)
    T = _real_type(g)
    shapes = _tv_psroi_setup(tuple(int(v) for v in input_shape), output_size, group_size)
    N, C, H, W, PH, PW, D = shapes
    if g.shape[1:] != (D, PH, PW):
        raise ValueError(f"grad_output shape {g.shape} does not fit {D} channels of {PH}x{PW}")
    return g, T, _boxes_as(boxes, T), shapes, np.zeros((N, C, H, W), dtype=T)


def _tv_psroi_pool(x, boxes, batch, output_channels, output_size, spatial_scale, rules,
                   group_size=None):
    """Forward: bins clamped to [0, H-1] x [0, W-1]; mean = sum (h outer, w inner) / area;
    an empty bin gives 0.  Output (n, d, ph, pw) reads channel ``(d*PH + ph)*PW + pw``."""
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W, PH, PW, D = _tv_psroi_setup(x.shape, output_size, group_size, output_channels)
    s = _scale(T, spatial_scale, rules.scale_precision)
    K = boxes.shape[0]
    y = np.zeros((K, D, PH, PW), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            rs_w, rs_h, rw, rh = _tv_psroi_box(_box(boxes, n, T), s, backward=False)
            for d in range(D):
                for ph in range(PH):
                    hs, he = _tv_psroi_bin(ph, rs_h, rh, PH, H - 1, T)
                    for pw in range(PW):
                        ws, we = _tv_psroi_bin(pw, rs_w, rw, PW, W - 1, T)
                        if he <= hs or we <= ws:
                            y[n, d, ph, pw] = T(0)
                            continue
                        c = (d * PH + ph) * PW + pw
                        acc = T(0)
                        for h in range(hs, he):
                            for w in range(ws, we):
                                acc = acc + x[b, c, h, w]
                        y[n, d, ph, pw] = acc / T((he - hs) * (we - ws))
    return y


def _tv_psroi_pool_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                            rules, group_size=None):
    """Backward: bins from roundf'ed coordinates, clamped to [0, H] x [0, W]; serial over
    (n, ph, pw, d), ``dx += g/area`` over the bin."""
    g, T, boxes, (N, C, H, W, PH, PW, D), dx = _tv_ps_backward_setup(
        grad_output, boxes, input_shape, output_size, group_size)
    s = _scale(T, spatial_scale, rules.scale_precision)
    with np.errstate(all="ignore"):
        for n in range(g.shape[0]):
            b = _batch_index(batch, n, N)
            rs_w, rs_h, rw, rh = _tv_psroi_box(_box(boxes, n, T), s, backward=True)
            for ph in range(PH):
                hs, he = _tv_psroi_bin(ph, rs_h, rh, PH, H, T)
                for pw in range(PW):
                    ws, we = _tv_psroi_bin(pw, rs_w, rw, PW, W, T)
                    if he <= hs or we <= ws:
                        continue
                    area = T((he - hs) * (we - ws))
                    for d in range(D):
                        c = (d * PH + ph) * PW + pw
                        diff = g[n, d, ph, pw] / area
                        for h in range(hs, he):
                            for w in range(ws, we):
                                dx[b, c, h, w] = dx[b, c, h, w] + diff
    return dx


# ---------------------------------------------------------------------------------------------
# RoIAlign: Caffe2 sampler (docs/semantics.md 2.7, 5.1, 5.2) and Paddle forward (5.3)
# ---------------------------------------------------------------------------------------------

def _align_roi(box, s, aligned, min_size_one, T):
    """(start_w, start_h, roi_w, roi_h) in T; size clamped to >= 1 when ``min_size_one``."""
    off = T(0.5) if aligned else T(0)
    x1, y1, x2, y2 = box
    sw = x1 * s - off
    sh = y1 * s - off
    ew = x2 * s - off
    eh = y2 * s - off
    rw = ew - sw
    rh = eh - sh
    if min_size_one:
        one = T(1)
        if rw < one:                                # std::max(rw, (T)1.)
            rw = one
        if rh < one:
            rh = one
    return sw, sh, rw, rh


def _grid(sampling_ratio, size_, P, T) -> int:
    """``sr > 0 ? sr : (int)ceil(size / P)`` with the division in T."""
    if sampling_ratio > 0:
        return int(sampling_ratio)
    q = size_ / T(P)
    if not math.isfinite(float(q)):
        raise ValueError("adaptive sampling grid of a non-finite box (undefined behaviour)")
    return int(math.ceil(q))


def _half(i, T):
    """``static_cast<T>(i + .5f)``."""
    return T(np.float32(i) + np.float32(0.5))


def _caffe2_coord(start, p, bin_size, i, grid, T):
    """``start + p*bin + (T)(i+.5f)*bin/(T)grid``, left to right."""
    return (start + T(p) * bin_size) + (_half(i, T) * bin_size) / T(grid)


def _paddle_coord(start, p, bin_size, i, grid, T):
    """``start + bin*((T)p + (T)(i+.5f)/(T)grid)``."""
    return start + bin_size * (T(p) + _half(i, T) / T(grid))


def _in_sample_range(y, x, H, W) -> bool:
    # NaN-safe form (current torchvision): NaN samples are out of range
    return bool(y >= -1.0 and y <= H and x >= -1.0 and x <= W)


def _caffe2_bilinear(y, x, H, W, T):
    """Caffe2 ``bilinear_interpolate`` weights -> (ok, (yl, yh, xl, xh), (w1, w2, w3, w4))."""
    zero = T(0)
    if not _in_sample_range(y, x, H, W):
        return False, (0, 0, 0, 0), (zero, zero, zero, zero)
    if y <= 0:
        y = zero
    if x <= 0:
        x = zero
    y_low = int(y)
    x_low = int(x)
    if y_low >= H - 1:
        y_high = y_low = H - 1
        y = T(y_low)
    else:
        y_high = y_low + 1
    if x_low >= W - 1:
        x_high = x_low = W - 1
        x = T(x_low)
    else:
        x_high = x_low + 1
    ly = y - T(y_low)
    lx = x - T(x_low)
    hy = T(1) - ly
    hx = T(1) - lx
    return True, (y_low, y_high, x_low, x_high), (hy * hx, hy * lx, ly * hx, ly * lx)


def _paddle_bilinear_value(v, y, x, H, W, T):
    """Paddle ``GetIndexesAndRatios`` + ``Interpolate`` for one sample of plane v."""
    zero = T(0)
    one = T(1)
    if not _in_sample_range(y, x, H, W):
        v0 = v[0, 0]                                 # default entry: offsets 0, ratios 0
        return ((zero * v0 + zero * v0) + zero * v0) + zero * v0
    if y <= 0:
        y = zero
    if x <= 0:
        x = zero
    x_low = int(x)
    if x_low >= W - 1:
        x_high = x_low = W - 1
        x = T(x_low)
    else:
        x_high = x_low + 1
    x_ratio = T(x_high) - x
    y_low = int(y)
    if y_low >= H - 1:
        y_high = y_low = H - 1
        y = T(y_low)
    else:
        y_high = y_low + 1
    y_ratio = T(y_high) - y
    xy = x_ratio * y_ratio                    # (y_low,  x_low)
    xY = x_ratio * (one - y_ratio)            # (y_high, x_low)
    Xy = (one - x_ratio) * y_ratio            # (y_low,  x_high)
    XY = (one - x_ratio) * (one - y_ratio)    # (y_high, x_high)
    return ((xy * v[y_low, x_low] + Xy * v[y_low, x_high])
            + xY * v[y_high, x_low]) + XY * v[y_high, x_high]


def roi_align(x, boxes, batch, output_size, spatial_scale, sampling_ratio, aligned, rules):
    """RoIAlign forward.

    ``rules.sampler == "caffe2"``: MXNet ROIAlign / torchvision roi_align (sum divided by the
    count, count = max(gh*gw, 1)).  ``"paddle"``: Paddle's forward (different association,
    ``x_high - x`` weights, sum multiplied by ``(T)(1.0/count)``).  A bin with an empty grid
    (gh <= 0 or gw <= 0) gives 0 for ``empty_grid == "zero"`` and NaN for ``"nan"``.
    Out-of-range samples are counted with value ``0*v[0,0]`` (NaN propagates from v[0,0]).
    ``rules.reduction == "sum"``: the same sums, not divided (an empty grid gives 0).
    """
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    PH, PW = _pair(output_size)
    K = boxes.shape[0]
    sampler = rules.sampler
    if sampler not in ("caffe2", "paddle"):
        raise ValueError(f"unknown sampler {sampler!r}")
    if rules.empty_grid not in ("zero", "nan"):
        raise ValueError(f"unknown empty_grid {rules.empty_grid!r}")
    s = _scale(T, spatial_scale, rules.scale_precision)
    y = np.zeros((K, C, PH, PW), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            sw, sh, rw, rh = _align_roi(_box(boxes, n, T), s, aligned, not aligned, T)
            gh = _grid(sampling_ratio, rh, PH, T)
            gw = _grid(sampling_ratio, rw, PW, T)
            bin_h = rh / T(PH)
            bin_w = rw / T(PW)
            summed = rules.reduction == "sum"
            if gh <= 0 or gw <= 0:
                y[n] = T(np.nan) if rules.empty_grid == "nan" and not summed else T(0)
                continue
            if sampler == "caffe2":
                # pre_calc: positions and weights per (ph, pw, iy, ix), shared by channels
                pre = {}
                for ph in range(PH):
                    for pw in range(PW):
                        for iy in range(gh):
                            yy = _caffe2_coord(sh, ph, bin_h, iy, gh, T)
                            for ix in range(gw):
                                xx = _caffe2_coord(sw, pw, bin_w, ix, gw, T)
                                pre[ph, pw, iy, ix] = _caffe2_bilinear(yy, xx, H, W, T)
                count = T(max(gh * gw, 1))
                for c in range(C):
                    v = x[b, c]
                    for ph in range(PH):
                        for pw in range(PW):
                            acc = T(0)
                            for iy in range(gh):
                                for ix in range(gw):
                                    _, (yl, yh, xl, xh), (w1, w2, w3, w4) = pre[ph, pw, iy, ix]
                                    # out-of-range: positions 0, weights 0 -> 0*v[0,0]
                                    val = ((w1 * v[yl, xl] + w2 * v[yl, xh])
                                           + w3 * v[yh, xl]) + w4 * v[yh, xh]
                                    acc = acc + val
                            y[n, c, ph, pw] = acc if summed else acc / count
            else:
                recip = T(np.float64(1.0) / np.float64(gw * gh))   # double, then cast to T
                recip = T(1) if summed else recip
                for c in range(C):
                    v = x[b, c]
                    for ph in range(PH):
                        for pw in range(PW):
                            acc = T(0)
                            for iy in range(gh):
                                yy = _paddle_coord(sh, ph, bin_h, iy, gh, T)
                                for ix in range(gw):
                                    xx = _paddle_coord(sw, pw, bin_w, ix, gw, T)
                                    acc = acc + _paddle_bilinear_value(v, yy, xx, H, W, T)
                            y[n, c, ph, pw] = acc * recip
    return y


def roi_align_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                       sampling_ratio, aligned, rules):
    """RoIAlign backward with the Caffe2 expressions (for both samplers).

    Serial over (n, c, ph, pw, iy, ix); adds ``(g*w_k)/count`` (count = (T)(gh*gw), 1 for
    ``reduction == "sum"``) to the four corners of in-range samples only.  The box size is
    clamped to >= 1 when ``not aligned`` or ``rules.backward_min_size_always`` (Paddle).
    """
    g = np.asarray(grad_output)
    T = _real_type(g)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = (int(d) for d in input_shape)
    PH, PW = _pair(output_size)
    K, C2, _, _ = g.shape
    if g.shape[2:] != (PH, PW):
        raise ValueError(f"grad_output spatial shape {g.shape[2:]} != output_size {(PH, PW)}")
    s = _scale(T, spatial_scale, rules.scale_precision)
    min_one = (not aligned) or bool(rules.backward_min_size_always)
    dx = np.zeros((N, C, H, W), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            sw, sh, rw, rh = _align_roi(_box(boxes, n, T), s, aligned, min_one, T)
            bin_h = rh / T(PH)
            bin_w = rw / T(PW)
            gh = _grid(sampling_ratio, rh, PH, T)
            gw = _grid(sampling_ratio, rw, PW, T)
            count = T(1) if rules.reduction == "sum" else T(gh * gw)
            for c in range(C2):
                d = dx[b, c]
                for ph in range(PH):
                    for pw in range(PW):
                        gv = g[n, c, ph, pw]
                        for iy in range(gh):
                            yy = _caffe2_coord(sh, ph, bin_h, iy, gh, T)
                            for ix in range(gw):
                                xx = _caffe2_coord(sw, pw, bin_w, ix, gw, T)
                                ok, (yl, yh, xl, xh), (w1, w2, w3, w4) = _caffe2_bilinear(
                                    yy, xx, H, W, T)
                                if not ok:
                                    continue
                                d[yl, xl] = d[yl, xl] + (gv * w1) / count
                                d[yl, xh] = d[yl, xh] + (gv * w2) / count
                                d[yh, xl] = d[yh, xl] + (gv * w3) / count
                                d[yh, xh] = d[yh, xh] + (gv * w4) / count
    return dx


# ---------------------------------------------------------------------------------------------
# Position-sensitive RoIAlign: torchvision ps_roi_align (docs/semantics.md 4.3)
# ---------------------------------------------------------------------------------------------

def _ps_align_box(box, s, sampling_ratio, PH, PW, T, rules):
    """(start_w, start_h, bin_w, bin_h, grid_h, grid_w): aligned (-0.5) without a minimum
    size, or (MXNet's aligned=False) unshifted and at least 1; the adaptive grid is
    ``(int)ceil(size / P)`` and may be zero or negative."""
    aligned = rules.box == "aligned"
    sw, sh, rw, rh = _align_roi(box, s, aligned, not aligned, T)
    return (sw, sh, rw / T(PW), rh / T(PH), _grid(sampling_ratio, rh, PH, T),
            _grid(sampling_ratio, rw, PW, T))


def _ps_align_bin(sw, sh, bin_w, bin_h, pw, ph, gh, gw, H, W, T):
    """The bilinear samples of bin (ph, pw), in (iy, ix) order, as _caffe2_bilinear gives
    them: (in range, neighbours, weights)."""
    for iy in range(gh):
        yy = _caffe2_coord(sh, ph, bin_h, iy, gh, T)
        for ix in range(gw):
            yield _caffe2_bilinear(yy, _caffe2_coord(sw, pw, bin_w, ix, gw, T), H, W, T)


def ps_roi_align(x, boxes, batch, output_size, spatial_scale, sampling_ratio, rules):
    """Forward: output (n, d, ph, pw) averages the samples of channel ``(d*PH + ph)*PW + pw``;
    out-of-range samples add a plain 0 (torchvision) or ``0 * v[0, 0]`` per corner (MXNet's
    pre-computed zero weights at index 0); the sum is divided by ``(T)(gh*gw)`` unclamped,
    or an empty grid gives 0 (``empty_grid="zero"``)."""
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W, PH, PW, D = _tv_psroi_setup(x.shape, output_size, None)
    s = _scale(T, spatial_scale, rules.scale_precision)
    K = boxes.shape[0]
    y = np.zeros((K, D, PH, PW), dtype=T)
    with np.errstate(all="ignore"):
        for n in range(K):
            b = _batch_index(batch, n, N)
            sw, sh, bin_w, bin_h, gh, gw = _ps_align_box(_box(boxes, n, T), s, sampling_ratio,
                                                         PH, PW, T, rules)
            count = T(gh * gw)
            if rules.empty_grid == "zero" and (gh <= 0 or gw <= 0):
                continue
            for d in range(D):
                for ph in range(PH):
                    for pw in range(PW):
                        v = x[b, (d * PH + ph) * PW + pw]
                        acc = T(0)
                        for ok, (yl, yh, xl, xh), (w1, w2, w3, w4) in _ps_align_bin(
                                sw, sh, bin_w, bin_h, pw, ph, gh, gw, H, W, T):
                            val = T(0)
                            if not ok and rules.outside == "first":
                                zero = T(0) * v[0, 0]
                                val = ((zero + zero) + zero) + zero
                            if ok:
                                val = ((w1 * v[yl, xl] + w2 * v[yl, xh])
                                       + w3 * v[yh, xl]) + w4 * v[yh, xh]
                            acc = acc + val
                        y[n, d, ph, pw] = acc / count
    return y


def ps_roi_align_backward(grad_output, boxes, batch, input_shape, output_size, spatial_scale,
                          sampling_ratio, rules):
    """Serial over (n, d, ph, pw, iy, ix): ``(g*w_k)/count`` added to the four corners of
    in-range samples of channel ``(d*PH + ph)*PW + pw``."""
    g, T, boxes, (N, C, H, W, PH, PW, D), dx = _tv_ps_backward_setup(
        grad_output, boxes, input_shape, output_size)
    s = _scale(T, spatial_scale, rules.scale_precision)
    with np.errstate(all="ignore"):
        for n in range(g.shape[0]):
            b = _batch_index(batch, n, N)
            sw, sh, bin_w, bin_h, gh, gw = _ps_align_box(_box(boxes, n, T), s, sampling_ratio,
                                                         PH, PW, T, rules)
            count = T(gh * gw)
            for d in range(D):
                for ph in range(PH):
                    for pw in range(PW):
                        plane = dx[b, (d * PH + ph) * PW + pw]
                        gv = g[n, d, ph, pw]
                        for ok, (yl, yh, xl, xh), (w1, w2, w3, w4) in _ps_align_bin(
                                sw, sh, bin_w, bin_h, pw, ph, gh, gw, H, W, T):
                            if not ok:
                                continue
                            plane[yl, xl] = plane[yl, xl] + (gv * w1) / count
                            plane[yl, xh] = plane[yl, xh] + (gv * w2) / count
                            plane[yh, xl] = plane[yh, xl] + (gv * w3) / count
                            plane[yh, xh] = plane[yh, xh] + (gv * w4) / count
    return dx


# ---------------------------------------------------------------------------------------------
# numeric gradient
# ---------------------------------------------------------------------------------------------

def numeric_grad(f, x, eps=1e-6):
    """Central differences of the scalar function ``f`` at ``x``, in float64.

    ``f`` receives a fresh float64 copy of the perturbed input each time.
    """
    x = np.array(x, dtype=np.float64, copy=True)
    grad = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        orig = x[idx]
        x[idx] = orig + eps
        fp = float(f(x.copy()))
        x[idx] = orig - eps
        fm = float(f(x.copy()))
        x[idx] = orig
        grad[idx] = (fp - fm) / (2.0 * eps)
    return grad


# ---------------------------------------------------------------------------------------
# feature pyramids

# ---------------------------------------------------------------------------------------------
# The TF Model Garden's multilevel_crop_and_resize sampler (docs/semantics.md 5.7), written from
# its published code: per box a 2P x 2P grid of gathered neighbours, each times its kernel
# weight, then a 2 x 2 average; its gradient is TensorFlow's gather gradient, which adds the
# gathered pixels in gather order.

def _garden_axis(lo, hi, s, P, size, T):
    """Per output index p: (low, high, weight of low, weight of high) on one axis."""
    start, extent = T(T(lo) * s), T(T(T(hi) * s) - T(T(lo) * s))
    out = []
    for p in range(P):
        v = T(start + T(T(T(p + 0.5) * extent) / T(P)))
        low = min(max(T(np.floor(v)), T(0)), T(size - 1))
        high = min(T(low + T(1)), T(size - 1))
        l = T(v - low)
        out.append((int(low), int(high), T(T(1) - l), l))
    return out


def _garden_boxes(boxes, batch, N, H, W, PH, PW, spatial_scale, T):
    """Per box: its index, its image and the (low, high, weights) of its rows and columns."""
    s = T(spatial_scale)
    for n in range(len(boxes)):
        x1, y1, x2, y2 = _box(boxes, n, T)
        yield (n, _batch_index(batch, n, N), _garden_axis(y1, y2, s, PH, H, T),
               _garden_axis(x1, x2, s, PW, W, T))


def model_garden_crop(x, boxes, batch, output_size, spatial_scale):
    """Forward: (K, C, PH, PW), with spatial_scale held in x's dtype."""
    x = np.asarray(x)
    T = _real_type(x)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = x.shape
    PH, PW = _pair(output_size)
    y = np.zeros((len(boxes), C, PH, PW), T)
    with np.errstate(all="ignore"):
        for n, b, rows, cols in _garden_boxes(boxes, batch, N, H, W, PH, PW, spatial_scale, T):
            v = x[b]
            for ph, (yl, yh, hy, ly) in enumerate(rows):
                for pw, (xl, xh, hx, lx) in enumerate(cols):
                    y[n, :, ph, pw] = (((v[:, yl, xl] * T(hy * hx) + v[:, yl, xh] * T(hy * lx))
                                        + v[:, yh, xl] * T(ly * hx)) + v[:, yh, xh] * T(ly * lx))
    return y


def model_garden_crop_backward(grad_output, boxes, batch, input_shape, spatial_scale):
    """Backward: each box adds, per bin row, g * w to its low neighbour row across every bin
    (low column, then high), then to its high neighbour row."""
    g = np.asarray(grad_output)
    T = _real_type(g)
    boxes = _boxes_as(boxes, T)
    N, C, H, W = (int(d) for d in input_shape)
    PH, PW = g.shape[2:]
    dx = np.zeros((N, C, H, W), T)
    with np.errstate(all="ignore"):
        for n, b, rows, cols in _garden_boxes(boxes, batch, N, H, W, PH, PW, spatial_scale, T):
            for ph, (yl, yh, hy, ly) in enumerate(rows):
                for row, wy in ((yl, hy), (yh, ly)):
                    for pw, (xl, xh, hx, lx) in enumerate(cols):
                        for col, wx in ((xl, hx), (xh, lx)):
                            dx[b, :, row, col] += g[n, :, ph, pw] * T(wy * wx)
    return dx


def _logf():
    """The C library's logf, which the Model Garden rule is defined with (NumPy's float32
    log is its own vectorised one)."""
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.logf.restype, libm.logf.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda v: np.float32(libm.logf(float(v)))


def model_garden_level(box, k0, s0, first_level, n_levels, T):
    """The TF Model Garden's level (multilevel_crop_and_resize): floor(ln(s / s0) / ln 2) +
    k0 in float32 (the box's sides cast from T), a non-finite level the first."""
    x1, y1, x2, y2 = (T(v) for v in box)
    f32, logf = np.float32, _logf()
    w, h = f32(T(x2 - x1)), f32(T(y2 - y1))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = f32(f32(np.sqrt(f32(h * w))) / f32(s0))
        v = f32(np.floor(f32(logf(ratio) / logf(f32(2)))) + f32(k0))
    if not np.isfinite(v):
        return 0
    return int(min(max(v, first_level), first_level + n_levels - 1)) - first_level


def pyramid_level(box, rules, k0, s0, first_level, n_levels, T):
    """The map index of ``box`` [x1, y1, x2, y2] by a ``LevelRules`` written from the
    frameworks' formulas, each step rounded to T; -1: not pooled."""
    if rules.formula == "model_garden":
        return model_garden_level(box, k0, s0, first_level, n_levels, T)
    x1, y1, x2, y2 = (T(v) for v in box)
    one = T(1)
    if rules.invalid == "zero" and (x2 < x1 or y2 < y1):
        area = T(0)
    else:
        w, h = T(x2 - x1), T(y2 - y1)
        if rules.pixel_offset:
            w, h = T(w + one), T(h + one)
        area = T(w * h)
    if rules.invalid == "skip" and not area > 0:
        return -1
    if n_levels == 1 and rules.one_map == "all":
        return 0
    eps = T(1e-6 if rules.epsilon == "1e-6" else 1e-8)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = T(np.sqrt(area))
        if rules.epsilon_inside:
            v = T(T(np.log2(T(T(s / T(s0)) + eps))) + T(k0))
        else:
            v = T(T(T(k0) + T(np.log2(T(s / T(s0))))) + eps)
    v = np.floor(v)
    if np.isnan(v):
        return -1
    return int(min(max(v, first_level), first_level + n_levels - 1)) - first_level


def pyramid_roi_align(maps, boxes, batch, output_size, scales, sampling_ratio, aligned, rules,
                      level_rules, k0, s0, first_level):
    """Each box pooled alone by :func:`roi_align` from its level's map, 0 where none."""
    T = _real_type(maps[0])
    PH, PW = _pair(output_size)
    out = np.zeros((len(boxes), maps[0].shape[1], PH, PW), T)
    for k, box in enumerate(boxes):
        level = pyramid_level(box, level_rules, k0, s0, first_level, len(maps), T)
        if level >= 0 and batch[k] >= 0:
            out[k] = roi_align(maps[level], np.asarray(box)[None], [batch[k]], output_size,
                               scales[level], sampling_ratio, aligned, rules)[0]
    return out
