"""RoI operators on NumPy arrays: validate, resolve the convention, call the kernels.

Shared vocabulary (every operator):

x : ndarray of shape (N, C, H, W), float16, float32 or float64
    Feature maps, NCHW.  Any strides; read-only arrays are fine.  float16 is computed in
    float32 and returned as float16.
boxes : ndarray of shape (K, 5) or (K, 4)
    ``[batch, x1, y1, x2, y2]`` rows, or ``[x1, y1, x2, y2]`` rows with ``batch_indices``.
    Coordinates are in input-image pixels (feature pixels = image pixels * spatial_scale),
    x is the column and y the row.  They are cast to the compute dtype, as every framework
    stores them in the feature dtype.  A batch column must hold integral values.
batch_indices : ndarray of shape (K,), integer, optional
    The image of each box when ``boxes`` has 4 columns.
masked : bool
    When True, a box whose batch index is negative is skipped: its output is 0 (its argmax
    -1) and it adds nothing to any gradient (GluonCV marks padded proposals with -1).  Any
    other index outside [0, N) still raises.
output_size : int or (int, int)
    Pooled height and width.
spatial_scale : float
    Feature-map size over image size (1/16 for a stride-16 backbone).
convention : str or rules object
    Whose arithmetic to reproduce bit for bit; see :mod:`roicore.core.conventions`.
n_threads : int or None
    OpenMP threads; see :func:`roicore.core.effective_n_threads`.  Results do not depend
    on it.
out : ndarray, optional
    A C-contiguous array of the result's shape and of the input's dtype (float32 or
    float64) to write the result into and return.  Backward functions zero it first.
    Without it, a result of 1 MiB or more takes memory freed by earlier results when it
    can (see :func:`roicore.core.set_output_cache_limit`).
names : dict, optional
    The caller's names of these arguments, for messages: an adapter passes its framework's
    (``{"x": "input"}``, ``{"x": "data", "boxes": "rois"}``).

Backward functions return the gradient with respect to ``x`` for an upstream gradient of
the forward output's shape; boxes receive no gradient (as in every framework here).
"""
from __future__ import annotations

import inspect

import numpy as np

from . import _binding, operators
from . import args as V
from ._threads import effective_n_threads
from .conventions import (
    BILINEAR_POOL, MAX_POOL, PSROI_ALIGN, PSROI_POOL, ROI_ALIGN,
    BilinearPoolRules, MaxPoolRules, PSRoIAlignRules, PSRoIPoolRules, RoIAlignRules, resolve,
)

__all__ = [
    "roi_pool", "roi_pool_backward", "roi_pool_boxes_backward", "psroi_pool",
    "psroi_pool_backward", "roi_align", "roi_align_backward", "ps_roi_align",
    "ps_roi_align_backward",
]



def _output(out, shape, xc, out_dtype, *also_read, name="out"):
    """The array a kernel writes into (every kernel writes all of it): fresh, or the
    caller's ``out``, which must not overlap ``xc`` or anything else the kernel reads."""
    if out is not None and out_dtype == np.float16:
        raise TypeError("out= is not supported for float16 input, which is computed in float32")
    return V.out_buffer(out, shape, xc.dtype, (xc,) + also_read, name=name)


def _method(method):
    """roi_pool's ``method``, one of those the operator table lists."""
    methods = tuple(m.name for m in operators.operator("roi_pool").methods)
    if method not in methods:
        raise ValueError(f"method must be one of {methods}, got {method!r}")
    return method


def _pool_rules(method, convention):
    """roi_pool's rules for ``method``; its default convention is the table's."""
    m = operators.operator("roi_pool").method(method)
    return resolve(m.default if convention is None else convention, m.conventions, m.rules_type,
                   f"roi_pool(method={method!r})")


@V.Names.renaming
def roi_pool(x, boxes, output_size, spatial_scale=1.0, *, batch_indices=None, masked=False,
             method="max", convention=None, return_argmax=False, extrapolation_value=0.0,
             n_threads=None, out=None, names=None):
    """RoI pooling: max (Fast R-CNN) or bilinear (OpenVINO ROIPooling "bilinear").

    method="max" (default convention "mxnet"; also "paddle", "torchvision", "openvino"
    (ROIPooling-1 reference), "openvino_cpu" (what OpenVINO's CPU plugin computes))
        Each box is snapped to feature pixels, ``round(x*s)`` with halves away from zero,
        given an inclusive ``+1`` extent, and split into ``output_size`` bins with
        ``floor(p*rh/P)`` .. ``ceil((p+1)*rh/P)``, clamped to the map; each output is the
        bin's maximum.  Empty bins give 0 and argmax -1.  A box larger than the map is
        clamped to it; a box entirely outside gives 0 everywhere; a reversed or zero-size
        box is the single pixel at ``(round(y1*s), round(x1*s))``.
    method="bilinear" (default convention "openvino"; also "openvino_cpu", "tensorflow")
        Boxes are normalised to [0, 1] (``x * (W-1)`` is the column); ``spatial_scale`` is
        validated but not used, as in OpenVINO.  Output cell (i, j) samples the map
        bilinearly at evenly spaced points from corner to corner of the box (the centre
        when the size is 1), like ``tf.image.crop_and_resize``.  Samples outside
        [0, H-1] x [0, W-1] give ``extrapolation_value``; a reversed box gives a flipped
        crop; a zero-size box repeats one sample.
    method="nearest" (default convention "tensorflow"; any bilinear convention places the
    samples)
        ``tf.image.crop_and_resize(method="nearest")``: the samples of method="bilinear",
        each taking the pixel at its row and column rounded to the nearest integer (halves
        away from zero).

    Returns
    -------
    y : ndarray of shape (K, C, PH, PW), x's dtype
    argmax : ndarray of shape (K, C, PH, PW), only with ``return_argmax`` (max only)
        The selected element, encoded as the convention's framework does ("plane": h*W+w,
        "global": the flat index into x); -1 where nothing was selected.
    K = 0 gives an empty (0, C, PH, PW) result.
    """
    n = V.Names(names)
    method = _method(method)
    rules = _pool_rules(method, convention)
    return_argmax = V.flag(return_argmax, "return_argmax")
    if return_argmax and method != "max":
        raise ValueError(f"return_argmax=True needs method='max'; method={method!r} has no "
                         "argmax")
    extrapolation_value = V.real(extrapolation_value, "extrapolation_value")
    if method == "max" and extrapolation_value != 0:
        raise ValueError("extrapolation_value applies to method='bilinear' and 'nearest' only, "
                         f"got {extrapolation_value!r} with method='max'")
    xc, out_dtype = V.nchw_float(x, n("x"))
    PH, PW = V.pair(output_size, n("output_size"))
    spatial_scale = V.positive_scale(spatial_scale, n("spatial_scale"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, xc.shape[0], xc.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    threads = effective_n_threads(n_threads)
    N, C, H, W = xc.shape
    if method == "max":
        out = _output(out, (coords.shape[0], C, PH, PW), xc, out_dtype, boxes, batch_indices)
        argmax = None
        if return_argmax:
            argmax = V.empty(out.shape, _binding.max_pool_argmax_dtype(rules, xc.shape), "argmax")
        _binding.roi_pool_max_forward(rules, xc, coords, batch, spatial_scale, out, argmax,
                                      threads, masked)
        y = out.astype(out_dtype, copy=False)
        return (y, argmax) if return_argmax else y
    out = _output(out, (coords.shape[0], C, PH, PW), xc, out_dtype, boxes, batch_indices)
    _binding.roi_pool_bilinear_forward(rules, xc, coords, batch, extrapolation_value, out,
                                       threads, masked, nearest=method == "nearest")
    return out.astype(out_dtype, copy=False)


@V.Names.renaming
def roi_pool_backward(grad_output, boxes, input_shape, spatial_scale=1.0, *, batch_indices=None,
                      masked=False, method="max", convention=None, argmax=None, n_threads=None,
                      out=None, names=None):
    """Gradient of :func:`roi_pool` with respect to x.

    method="max" scatters each output gradient to its argmax (as returned by the forward
    with ``return_argmax=True`` and the same convention), in (box, channel, ph, pw) order;
    ``spatial_scale`` is not used.  method="bilinear" is the adjoint of the sampling, in
    the arithmetic of TF's ``CropAndResizeGradImage``; method="nearest" adds each output
    gradient to its sample's pixel, as that op does for ``method="nearest"``.
    """
    n = V.Names(names)
    method = _method(method)
    rules = _pool_rules(method, convention)
    shape = V.input_shape(input_shape, n("input_shape"))
    N, C, H, W = shape
    g, out_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, C, PH, PW)")
    V.positive_scale(spatial_scale, n("spatial_scale"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, g.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], C) + g.shape[2:], n("grad_output"))
    threads = effective_n_threads(n_threads)
    if method == "max":
        if argmax is None:
            raise TypeError("roi_pool_backward(method='max') needs the argmax returned by "
                            "roi_pool(..., return_argmax=True)")
        a = _argmax_array(argmax, g.shape, n)
        dx = _output(out, shape, g, out_dtype, a, boxes, batch_indices, name="out")
        _binding.roi_pool_max_backward(rules, g, a, batch, dx, threads, masked)
    else:
        if argmax is not None:
            raise ValueError(f"argmax is only used by method='max'; method={method!r} has none")
        dx = _output(out, shape, g, out_dtype, boxes, batch_indices)
        _binding.roi_pool_bilinear_backward(rules, g, coords, batch, dx, threads, masked,
                                            nearest=method == "nearest")
    return dx.astype(out_dtype, copy=False)


@V.Names.renaming
def roi_pool_boxes_backward(grad_output, x, boxes, *, batch_indices=None, masked=False,
                            convention="tensorflow", n_threads=None, out=None, names=None):
    """Gradient of :func:`roi_pool` (method="bilinear") with respect to the box coordinates.

    The arithmetic and order of TF's ``CropAndResizeGradBoxes``: for every sample on the
    map, the upstream gradient times the interpolation's slope along each axis, times how
    far the sample moves with each coordinate (``(size-1) - p*(size-1)/(P-1)`` for the box's
    start, ``p*(size-1)/(P-1)`` for its end; half of ``size-1`` each when P == 1), summed
    over (ph, pw, channel) in that order.  TensorFlow uses it for method="nearest" too,
    whose crop is piecewise constant in the boxes.  Only convention "tensorflow" (rules
    without ``pin_last`` or ``fused_lerp``) defines it.

    Returns an array of shape (K, 4): the gradient of each box's [x1, y1, x2, y2] (a batch
    column, if ``boxes`` has one, gets none), in x's dtype.
    """
    n = V.Names(names)
    rules = resolve(convention, BILINEAR_POOL, BilinearPoolRules, "roi_pool_boxes_backward")
    xc, out_dtype = V.nchw_float(x, n("x"))
    N, C, H, W = xc.shape
    g, g_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, C, PH, PW)")
    if g_dtype != out_dtype:
        raise TypeError(f"grad_output must have the dtype of x ({out_dtype}), got {g_dtype}")
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, xc.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], C) + g.shape[2:], n("grad_output"))
    threads = effective_n_threads(n_threads)
    grad = _output(out, coords.shape, xc, out_dtype, g, boxes, batch_indices)
    _binding.roi_pool_bilinear_boxes_backward(rules, g, xc, coords, batch, grad, threads, masked)
    return grad.astype(out_dtype, copy=False)


def _argmax_array(argmax, grad_shape, n):
    """An argmax from the forward as a C-contiguous int32/int64 array, of the gradient's
    shape (the forward output's: either may be the wrong one).  Its values are checked by
    the backward kernel, which follows only -1 or a pixel of the entry's own (box, channel)
    plane in the convention's encoding and raises for anything else."""
    a = np.asarray(argmax)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{n('argmax')} must have an integer dtype, got {a.dtype}")
    if a.shape != tuple(grad_shape):
        raise ValueError(f"{n('argmax')} and {n('grad_output')} must both have the forward "
                         f"output's shape (K, C, PH, PW), got {a.shape} and {tuple(grad_shape)}")
    if a.dtype not in (np.int32, np.int64):
        # other widths as int64; uint64 values beyond it (no pixel's index) saturate, so a
        # cast never wraps one to -1, the index of an empty bin
        wide = a.astype(np.int64)
        if a.dtype == np.uint64:
            wide[a > np.iinfo(np.int64).max] = np.iinfo(np.int64).max
        a = wide
    return V.contiguous(a)


@V.Names.renaming
def psroi_pool(x, boxes, output_size, spatial_scale=1.0, *, output_channels=None, group_size=None,
               batch_indices=None, masked=False, convention="paddle", n_threads=None, out=None,
               names=None):
    """Position-sensitive RoI average pooling (R-FCN): Paddle psroi_pool, MXNet
    PSROIPooling, torchvision ps_roi_pool.

    Output channel d at cell (ph, pw) averages input channel ``(d*GH + gh)*GW + gw`` over
    the cell's bin, where (gh, gw) is the group cell of (ph, pw) (``floor(ph*GH/PH)``; the
    cell itself when ``group_size`` is the pooled size).  Empty bins (a box outside the
    map) give 0.

    convention "paddle" (default) and "mxnet" (the same numbers; both keep spatial_scale
    as a C float)
        Box coordinates are rounded *before* scaling, the end gets ``+1`` before scaling,
        the box is at least 0.1 feature pixels wide, and bin p spans
        ``floor(start + p*bin)`` .. ``ceil(start + (p+1)*bin)`` clamped to the map.  A
        reversed or zero-size box is a 0.1-wide box at its start, so each bin covers one
        or two pixels.
    convention "torchvision"
        ``round(x*s)`` after scaling, no ``+1``, at least 1 pixel, and bin p spans
        ``floor(p*bin)`` .. ``ceil((p+1)*bin)`` from the rounded start, clamped to
        [0, H-1] x [0, W-1]: the last row and column of the map are never read.
        ``group_size`` must be None or the pooled size.

    output_channels : int, optional
        D; x must have exactly ``D * GH * GW`` channels (inferred when omitted).
    group_size : int or (int, int), optional
        MXNet's ``group_size`` (GH, GW); defaults to ``output_size``.

    Returns an array of shape (K, D, PH, PW).
    """
    n = V.Names(names)
    rules = resolve(convention, PSROI_POOL, PSRoIPoolRules, "psroi_pool")
    xc, out_dtype = V.nchw_float(x, n("x"))
    N, C, H, W = xc.shape
    PH, PW, GH, GW, D = V.ps_channels(output_size, group_size, C, output_channels, n("x"))
    spatial_scale = V.positive_scale(spatial_scale, n("spatial_scale"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, xc.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    threads = effective_n_threads(n_threads)
    out = _output(out, (coords.shape[0], D, PH, PW), xc, out_dtype, boxes, batch_indices)
    _binding.ps_roi_pool_forward(rules, xc, coords, batch, spatial_scale, GH, GW, out, threads,
                                masked)
    return out.astype(out_dtype, copy=False)


@V.Names.renaming
def psroi_pool_backward(grad_output, boxes, input_shape, spatial_scale=1.0, *, group_size=None,
                        batch_indices=None, masked=False, convention="paddle", n_threads=None,
                        out=None, names=None):
    """Gradient of :func:`psroi_pool`: each output gradient divided by its bin area, added
    to every pixel of the bin, in (box, channel, ph, pw) order.

    With convention "torchvision" the bins are torchvision's backward's, which differ from
    its forward's: clamped to [0, H] x [0, W], and from coordinates rounded in float32."""
    n = V.Names(names)
    rules = resolve(convention, PSROI_POOL, PSRoIPoolRules, "psroi_pool_backward")
    shape = V.input_shape(input_shape, n("input_shape"))
    N, C, H, W = shape
    g, out_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, D, PH, PW)")
    _, _, GH, GW, D = V.ps_channels(g.shape[2:], group_size, C, None, n("input_shape"))
    spatial_scale = V.positive_scale(spatial_scale, n("spatial_scale"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, g.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], D) + g.shape[2:], n("grad_output"))
    threads = effective_n_threads(n_threads)
    dx = _output(out, shape, g, out_dtype, boxes, batch_indices)
    _binding.ps_roi_pool_backward(rules, g, coords, batch, spatial_scale, GH, GW, dx, threads,
                                 masked)
    return dx.astype(out_dtype, copy=False)


def _align_setup(convention, spatial_scale, sampling_ratio, aligned, op, n):
    rules = resolve(convention, ROI_ALIGN, RoIAlignRules, op)
    return (rules, V.positive_scale(spatial_scale, n("spatial_scale")),
            V.sampling_ratio(sampling_ratio, n("sampling_ratio")), V.flag(aligned, n("aligned")))


@V.Names.renaming
def roi_align(x, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, aligned=False, *,
              batch_indices=None, masked=False, convention="mxnet", n_threads=None, out=None,
              names=None):
    """RoIAlign (Mask R-CNN): the average of bilinear samples on a regular grid per bin.

    The box is ``x*s - 0.5`` .. ``x2*s - 0.5`` when ``aligned`` (pixel centres), else
    ``x*s`` .. ``x2*s`` widened to at least 1 pixel.  Each bin takes ``sampling_ratio``
    samples per axis, or ``ceil(bin size)`` when ``sampling_ratio`` is -1 or 0.  Samples
    beyond one pixel outside the map weigh 0 but still count in the average (and read
    pixel (0, 0) with weight 0, so a NaN there propagates, as in the frameworks).

    convention
        "mxnet" (default) and "torchvision": the Caffe2 sampler (they differ only in how
        spatial_scale is held for float64); "paddle": Paddle's forward arithmetic, which
        differs from Caffe2 in the last bit.
    Edge cases: a box outside the map gives 0; with ``aligned=False`` reversed and
    zero-size boxes become 1-pixel boxes; with ``aligned=True`` and adaptive sampling a box
    of size <= 0 has no samples and gives 0 ("mxnet", "torchvision"; MXNet itself aborts)
    or NaN ("paddle", as Paddle computes 0 * (1/0)); with a fixed ``sampling_ratio`` a
    reversed aligned box is sampled back to front.
    """
    n = V.Names(names)
    rules, spatial_scale, sampling_ratio, aligned = _align_setup(
        convention, spatial_scale, sampling_ratio, aligned, "roi_align", n)
    xc, out_dtype = V.nchw_float(x, n("x"))
    N, C, H, W = xc.shape
    PH, PW = V.pair(output_size, n("output_size"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, xc.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    threads = effective_n_threads(n_threads)
    out = _output(out, (coords.shape[0], C, PH, PW), xc, out_dtype, boxes, batch_indices)
    _binding.roi_align_forward(rules, xc, coords, batch, spatial_scale, sampling_ratio, aligned,
                               out, threads, masked)
    return out.astype(out_dtype, copy=False)


@V.Names.renaming
def roi_align_backward(grad_output, boxes, input_shape, spatial_scale=1.0, sampling_ratio=-1,
                       aligned=False, *, batch_indices=None, masked=False, convention="mxnet",
                       n_threads=None, out=None, names=None):
    """Gradient of :func:`roi_align` in the Caffe2 arithmetic used by all three frameworks'
    backward passes (``g * w / count`` added to the four neighbours of every in-range
    sample).  Convention "paddle" reproduces Paddle's backward, which widens boxes to at
    least 1 pixel even when ``aligned``."""
    n = V.Names(names)
    rules, spatial_scale, sampling_ratio, aligned = _align_setup(
        convention, spatial_scale, sampling_ratio, aligned, "roi_align_backward", n)
    shape = V.input_shape(input_shape, n("input_shape"))
    N, C, H, W = shape
    g, out_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, C, PH, PW)")
    PH, PW = g.shape[2:]
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, g.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], C, PH, PW), n("grad_output"))
    threads = effective_n_threads(n_threads)
    dx = _output(out, shape, g, out_dtype, boxes, batch_indices)
    _binding.roi_align_backward(rules, g, coords, batch, spatial_scale, sampling_ratio, aligned,
                                dx, threads, masked)
    return dx.astype(out_dtype, copy=False)


def _ps_align_setup(convention, spatial_scale, sampling_ratio, op, n):
    return (resolve(convention, PSROI_ALIGN, PSRoIAlignRules, op),
            V.positive_scale(spatial_scale, n("spatial_scale")),
            V.sampling_ratio(sampling_ratio, n("sampling_ratio")))


@V.Names.renaming
def ps_roi_align(x, boxes, output_size, spatial_scale=1.0, sampling_ratio=-1, *,
                 batch_indices=None, masked=False, convention="torchvision", n_threads=None,
                 out=None, names=None):
    """Position-sensitive RoIAlign (Light-Head R-CNN), as torchvision ps_roi_align
    (``convention="torchvision"``) or MXNet ``ROIAlign(position_sensitive=True)``
    (``"mxnet"``, its default ``aligned=False``).

    x has ``D * PH * PW`` channels; output channel d at cell (ph, pw) is the mean of the
    bilinear samples of input channel ``(d*PH + ph)*PW + pw`` on the bin's grid.  torchvision's
    boxes are always aligned (``x*s - 0.5``: pixel centres) and have no minimum size;
    MXNet's with ``aligned=False`` are not shifted and are at least one pixel
    (``PSRoIAlignRules.box``).  Each bin takes ``sampling_ratio`` samples per axis, or
    ``ceil(bin size)`` when ``sampling_ratio`` is -1 or 0.  Samples more than one pixel
    outside the map add 0 (and still count).

    Edge cases, as torchvision computes them: with adaptive sampling a zero-size box has an
    empty grid and gives NaN (0/0), and a reversed box gives zeros whose sign is that of
    its grid's size (MXNet's convention: 0); with a fixed ``sampling_ratio`` a reversed box
    is sampled back to front.

    Returns an array of shape (K, D, PH, PW).
    """
    n = V.Names(names)
    rules, spatial_scale, sampling_ratio = _ps_align_setup(
        convention, spatial_scale, sampling_ratio, "ps_roi_align", n)
    xc, out_dtype = V.nchw_float(x, n("x"))
    N, C, H, W = xc.shape
    PH, PW, _, _, D = V.ps_channels(output_size, None, C, None, n("x"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, xc.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    threads = effective_n_threads(n_threads)
    out = _output(out, (coords.shape[0], D, PH, PW), xc, out_dtype, boxes, batch_indices)
    _binding.ps_roi_align_forward(rules, xc, coords, batch, spatial_scale, sampling_ratio, out,
                                  threads, masked)
    return out.astype(out_dtype, copy=False)


@V.Names.renaming
def ps_roi_align_backward(grad_output, boxes, input_shape, spatial_scale=1.0, sampling_ratio=-1,
                          *, batch_indices=None, masked=False, convention="torchvision",
                          n_threads=None, out=None, names=None):
    """Gradient of :func:`ps_roi_align`: ``g * w / count`` added to the four neighbours of
    every in-range sample, in (box, channel, ph, pw, sample) order."""
    n = V.Names(names)
    rules, spatial_scale, sampling_ratio = _ps_align_setup(
        convention, spatial_scale, sampling_ratio, "ps_roi_align_backward", n)
    shape = V.input_shape(input_shape, n("input_shape"))
    N, C, H, W = shape
    g, out_dtype = V.nchw_float(grad_output, n("grad_output"), "(K, D, PH, PW)")
    PH, PW, _, _, D = V.ps_channels(g.shape[2:], None, C, None, n("input_shape"))
    coords, batch = V.boxes_and_batch(boxes, batch_indices, N, g.dtype, masked,
                                      n("boxes"), n("batch_indices"))
    V.expect_shape(g, (coords.shape[0], D, PH, PW), n("grad_output"))
    threads = effective_n_threads(n_threads)
    dx = _output(out, shape, g, out_dtype, boxes, batch_indices)
    _binding.ps_roi_align_backward(rules, g, coords, batch, spatial_scale, sampling_ratio, dx,
                                   threads, masked)
    return dx.astype(out_dtype, copy=False)


# ---------------------------------------------------------------------------------------
# The operator table (roicore.core.operators): each operator once, with its methods and
# options.  A function's default convention comes from its signature.

def _only_method(fn, conventions):
    """The one method of ``fn``, its default convention from its signature."""
    return operators.Method("", conventions, inspect.signature(fn).parameters["convention"].default)


operators.register(operators.Operator(
    "roi_pool", roi_pool, roi_pool_backward, (
        operators.Method("max", MAX_POOL, "mxnet", saves_argmax=True),
        operators.Method("bilinear", BILINEAR_POOL, "openvino", normalised_boxes=True),
        # only TensorFlow samples the nearest pixel
        operators.Method("nearest", BILINEAR_POOL, "tensorflow", normalised_boxes=True)),
    boxes_backward=roi_pool_boxes_backward))
operators.register(operators.Operator(
    "psroi_pool", psroi_pool, psroi_pool_backward, (_only_method(psroi_pool, PSROI_POOL),),
    options=("group_size",), position_sensitive=True))
operators.register(operators.Operator(
    "roi_align", roi_align, roi_align_backward, (_only_method(roi_align, ROI_ALIGN),),
    options=("sampling_ratio", "aligned")))
operators.register(operators.Operator(
    "ps_roi_align", ps_roi_align, ps_roi_align_backward, (_only_method(ps_roi_align, PSROI_ALIGN),),
    options=("sampling_ratio",), position_sensitive=True))
