"""Named conventions: the per-framework arithmetic choices that decide bit-exactness.

Every RoI operator in roicore computes one formula family, but the frameworks differ in
details that change the last bit (or, for bin edges, a whole pixel).  A *convention* is a
frozen record of those choices; each operator accepts a framework name ("mxnet",
"paddle", ...) or a rules object, so an adapter selects its framework's behaviour with one
argument and a reader can print the rules to see exactly what was chosen.

The choices and why they exist are described in each class below; the framework source
each one follows is named in the table entry.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

__all__ = [
    "MaxPoolRules", "BilinearPoolRules", "PSRoIPoolRules", "RoIAlignRules", "PSRoIAlignRules",
    "LevelRules", "LEVELS", "MODEL_GARDEN_ALIGN",
    "MAX_POOL", "BILINEAR_POOL", "PSROI_POOL", "ROI_ALIGN", "PSROI_ALIGN", "resolve",
]


@dataclass(frozen=True)
class MaxPoolRules:
    """RoI max pooling (Fast R-CNN integer RoI): ``round(x*s)``, ``+1``, at least 1x1.

    bin_arithmetic
        How ``floor(p*rh/P)`` and ``ceil((p+1)*rh/P)`` are evaluated. ``"input"``: in the
        input dtype (MXNet, torchvision, OpenVINO reference); ``"float32"``: always in
        float32 (Paddle, even for float64 input); ``"exact"``: integer arithmetic (OpenVINO
        CPU plugin).  Float bins are off by one for some (rh, P), e.g. P=7 and rh=57 in
        float32, so the choice is visible in the output.
    scale_precision
        ``"float32"``: spatial_scale is a C ``float`` attribute, so float64 input multiplies
        by ``double(float32(s))`` (MXNet, Paddle, OpenVINO); ``"input"``: cast to the input
        dtype (torchvision).
    initial
        Start value of the running max in a non-empty bin. ``"-FLT_MAX"`` (MXNet,
        torchvision; also for float64), ``"lowest"`` (-max of the input dtype: Paddle,
        OpenVINO reference), ``"first"`` (the bin's first element: OpenVINO CPU plugin's
        JIT kernel), ``"nan"`` (with ``fmax``, the same as the plugin's non-JIT fallback,
        which starts from the first element and applies ``fmax``).  Visible only for bins
        holding NaN, -inf or values below -FLT_MAX.
    compare
        ``"greater"``: take v when ``v > m`` (first maximum wins, NaN never taken);
        ``"std_max"``: ``m = (v < m) ? m : v`` (OpenVINO reference; a later equal value
        wins, NaN is taken and then replaced by the next value); ``"fmax"``: C ``fmax``
        (NaN ignored; the first maximum keeps the argmax).
    argmax
        Index encoding of the returned argmax: ``"plane"`` is ``h*W + w`` (Paddle,
        torchvision), ``"global"`` is the flat index into the whole input (MXNet). Empty
        bins always give -1.
    argmax_dtype
        ``"int32"`` or ``"int64"``, as the framework stores it (OpenVINO stores none: its
        conventions take int32, half the memory traffic of int64 for the backward).
    scale_product
        Precision of ``x * spatial_scale`` before rounding: ``"input"`` (every framework's
        reference kernel) or ``"float64"`` (OpenVINO's CPU plugin, where 3.5714285f * 0.7f
        is 2.4999999 and rounds to 2 instead of 3).
    """

    bin_arithmetic: Literal["input", "float32", "exact"]
    scale_precision: Literal["float32", "input"]
    initial: Literal["-FLT_MAX", "lowest", "first", "nan"]
    compare: Literal["greater", "std_max", "fmax"]
    argmax: Literal["plane", "global"]
    argmax_dtype: Literal["int32", "int64"]
    scale_product: Literal["input", "float64"] = "input"


@dataclass(frozen=True)
class BilinearPoolRules:
    """OpenVINO ``ROIPooling`` method "bilinear" = TF ``crop_and_resize`` sampling.

    Boxes are normalised to [0, 1]; sample k of P lies at ``y1*(H-1) + k*(y2-y1)*(H-1)/(P-1)``
    (corners included), P == 1 samples the box centre, samples outside [0, H-1] give the
    extrapolation value (0 unless the caller sets it).

    pin_last
        OpenVINO writes the last sample as exactly ``(H-1)*y2`` instead of accumulating
        ``y1*(H-1) + (P-1)*step`` (TF does the latter); the two differ in the last bit.
    fused_lerp
        OpenVINO's CPU plugin interpolates with fused multiply-adds, ``fma(b - a, t, a)``,
        rounding once where the reference rounds twice.
    """

    pin_last: bool
    fused_lerp: bool = False


@dataclass(frozen=True)
class PSRoIPoolRules:
    """Position-sensitive average pooling: R-FCN's bins or torchvision's.

    Output channel d at cell (ph, pw) averages input channel ``(d*GH + gh)*GW + gw`` over
    the cell's bin, where (gh, gw) is the group cell of (ph, pw).

    scale_precision
        As in :class:`MaxPoolRules`.
    formula
        How a box becomes bins.  ``"rfcn"`` (MXNet PSROIPooling, Paddle psroi_pool, which
        compute the same numbers): coordinates are rounded *before* scaling, ``+1`` is
        added to the end before scaling, the box is at least 0.1 feature pixels wide and
        the bin offset is added before floor/ceil; bins are clamped to [0, H].  MXNet also
        allows a group size other than the pooled size, which the operator takes as an
        argument.  ``"torchvision"`` (torchvision ps_roi_pool): ``round(x*s)`` after
        scaling, no ``+1``, at least 1 pixel, integer bin offsets as in RoI max pooling;
        the forward clamps bins to [0, H-1], so it never reads the last row or column,
        while the backward clamps them to [0, H] and rounds the scaled coordinates in
        float32 (C ``roundf``), so its bins can differ from the forward's.  The group
        size is the pooled size.
    """

    scale_precision: Literal["float32", "input"]
    formula: Literal["rfcn", "torchvision"] = "rfcn"


@dataclass(frozen=True)
class RoIAlignRules:
    """RoIAlign (Mask R-CNN) with the Caffe2 sampler or Paddle's forward variant.

    sampler
        ``"caffe2"``: ``y = y1 + ph*bin + (iy+.5)*bin/g``, weights ``1-ly``, the bin sum
        divided by the count (MXNet ROIAlign, torchvision roi_align).  ``"paddle"``:
        ``y = y1 + bin*(ph + (iy+.5)/g)``, weights ``y_high - y``, the sum multiplied by
        ``1/count`` (Paddle roi_align forward); the two differ in the last bit.
        ``"model_garden"``: the TF Model Garden's ``multilevel_crop_and_resize``, one sample
        per bin (``sampling_ratio=1``, unaligned, no minimum box size) at
        ``y1 + ((ph + .5) * h) / PH``; its neighbours ``floor(y)`` and ``floor(y) + 1`` are
        clamped into the map but its weights ``1 - ly``, ``ly`` are not, so a sample outside
        the map extrapolates.  Its gradient adds each bin row's low neighbour row, then its
        high one, as TensorFlow's gather gradient does.
    scale_precision
        As in :class:`MaxPoolRules`.
    empty_grid
        What a bin with no samples (aligned boxes of size <= 0 with adaptive sampling)
        returns: ``"zero"`` (torchvision; MXNet aborts instead) or ``"nan"`` (Paddle computes
        ``0 * (1/0)``).
    backward_min_size_always
        Paddle's backward clamps the box size to at least 1 even when ``aligned`` is True,
        so its gradient uses a different box than its forward for boxes narrower than 1.
    reduction
        ``"mean"`` (every framework's RoIAlign) or ``"sum"``: each bin's weighted samples
        summed in the same order and not divided (an empty grid sums to 0), and the
        gradient ``g * w``.  torchvision's quantized roi_align sums raw integers and the
        weights this way, then removes the zero point before it divides.
    """

    sampler: Literal["caffe2", "paddle", "model_garden"]
    scale_precision: Literal["float32", "input"]
    empty_grid: Literal["zero", "nan"]
    backward_min_size_always: bool
    reduction: Literal["mean", "sum"] = "mean"


@dataclass(frozen=True)
class PSRoIAlignRules:
    """Position-sensitive RoIAlign (torchvision ps_roi_align, Light-Head R-CNN; MXNet
    ``ROIAlign(position_sensitive=True)``).

    The Caffe2 sample positions and weights of :class:`RoIAlignRules`, and each output the
    mean of the samples of its own input channel, mapped as in :class:`PSRoIPoolRules`.

    scale_precision
        As in :class:`MaxPoolRules`.
    box
        ``"aligned"`` (torchvision, MXNet's ``aligned=True``): boxes shifted by -0.5 pixel,
        no minimum size.  ``"unaligned"`` (MXNet's ``aligned=False``): not shifted, and at
        least 1 x 1 feature pixel, as RoIAlign's ``aligned=False``.
    outside
        What a sample outside [-1, H] x [-1, W] adds to the sum: ``"zero"``, a plain 0
        (torchvision); ``"first"``, ``0 * v[0, 0]`` for each of its four corners, as
        RoIAlign does (MXNet), which is NaN when the plane's first value is not finite.
    empty_grid
        ``"divide"`` (torchvision): the sum is divided by the grid size as it is, so an
        empty grid gives 0/0 = NaN and a negative one (a reversed box with adaptive
        sampling) a zero with the grid's sign.  ``"zero"``: a bin without samples gives 0
        (MXNet aborts on a box of size <= 0 when aligned).
    """

    scale_precision: Literal["float32", "input"]
    box: Literal["aligned", "unaligned"] = "aligned"
    outside: Literal["zero", "first"] = "zero"
    empty_grid: Literal["divide", "zero"] = "divide"


@dataclass(frozen=True)
class LevelRules:
    """Which level of a feature pyramid (FPN) a box is pooled from.

    With ``w = x2 - x1`` and ``h = y2 - y1`` (plus 1 each with ``pixel_offset``),
    ``s = sqrt(w * h)``, the canonical level ``k0`` and size ``s0`` (224 and level 4 in the
    FPN paper), a box's level is ``floor(log2(s / s0 + eps) + k0)`` with ``epsilon_inside``,
    else ``floor((k0 + log2(s / s0)) + eps)``, each step rounded to the boxes' dtype, then
    clamped to the pyramid's levels.

    pixel_offset
        Widths and heights ``x2 - x1 + 1`` (Paddle's ``pixel_offset``, GluonCV).
    epsilon
        ``"1e-6"`` or ``"1e-8"``, held in the boxes' dtype.
    epsilon_inside
        Whether ``eps`` is added to ``s / s0`` (detectron2, mmdet, Paddle, GluonCV,
        OpenVINO) or to the level (torchvision).
    invalid
        A reversed box: ``"nan"``, its negative area's square root is NaN and the box is
        pooled from no level (its output is 0), as the frameworks' tensor code computes it;
        ``"zero"``, its area is 0, so the lowest level (Paddle's ``BBoxArea``); ``"skip"``,
        a box of area <= 0 is not pooled (OpenVINO).
    one_map
        A pyramid of one map: ``"all"``, every box is pooled from it (torchvision,
        detectron2, mmdet and PaddleDetection call RoIAlign on a lone map directly);
        ``"rule"``, the rule still decides which boxes are pooled (GluonCV, OpenVINO).
    formula
        ``"log2"``, the formula above, or ``"model_garden"``, the TF Model Garden's
        ``floor(ln(s / s0) / ln 2) + k0`` with ``w``, ``h``, ``s`` and the logarithms in
        float32, no epsilon, and a level that is not finite (a reversed or empty box) the
        first; it reads no other field.  TensorFlow's vectorised ``log`` can differ from the
        C library's by an ulp, so a box within an ulp or so of a level boundary may land one
        level apart from TensorFlow's; ``roicore.adapters.tf.multilevel_crop_and_resize``
        computes the levels with TensorFlow's own ops.
    """

    pixel_offset: bool
    epsilon: Literal["1e-6", "1e-8"]
    epsilon_inside: bool
    invalid: Literal["nan", "zero", "skip"]
    one_map: Literal["all", "rule"] = "all"
    formula: Literal["log2", "model_garden"] = "log2"


MAX_POOL = {
    "mxnet": MaxPoolRules("input", "float32", "-FLT_MAX", "greater", "global", "int32"),
    "paddle": MaxPoolRules("float32", "float32", "lowest", "greater", "plane", "int64"),
    "torchvision": MaxPoolRules("input", "input", "-FLT_MAX", "greater", "plane", "int32"),
    "openvino": MaxPoolRules("input", "float32", "lowest", "std_max", "plane", "int32"),
    "openvino_cpu": MaxPoolRules("exact", "float32", "first", "greater", "plane", "int32",
                                 scale_product="float64"),
}

BILINEAR_POOL = {
    "openvino": BilinearPoolRules(pin_last=True),
    "openvino_cpu": BilinearPoolRules(pin_last=True, fused_lerp=True),
    "tensorflow": BilinearPoolRules(pin_last=False),
}

PSROI_POOL = {
    "mxnet": PSRoIPoolRules("float32"),
    "paddle": PSRoIPoolRules("float32"),
    "torchvision": PSRoIPoolRules("input", formula="torchvision"),
}

ROI_ALIGN = {
    "mxnet": RoIAlignRules("caffe2", "float32", "zero", False),
    "torchvision": RoIAlignRules("caffe2", "input", "zero", False),
    "paddle": RoIAlignRules("paddle", "float32", "nan", True),
}

# The TF Model Garden's sampler (multilevel_crop_and_resize): not a RoIAlign of any
# framework's, so not in ROI_ALIGN; pass it as ``convention=`` with sampling_ratio=1.
MODEL_GARDEN_ALIGN = RoIAlignRules("model_garden", "input", "zero", False)

PSROI_ALIGN = {
    "torchvision": PSRoIAlignRules("input"),
    # ROIAlign(position_sensitive=True), whose default aligned=False; aligned=True is
    # box="aligned".
    "mxnet": PSRoIAlignRules("float32", box="unaligned", outside="first", empty_grid="zero"),
}

# The level rule of each framework's FPN pooler; their usual k0 and s0 are in
# roicore.core.pyramid.
LEVELS = {
    "torchvision": LevelRules(False, "1e-6", False, "nan"),    # MultiScaleRoIAlign
    "detectron2": LevelRules(False, "1e-8", True, "nan"),      # ROIPooler
    "mmdet": LevelRules(False, "1e-6", True, "nan"),           # SingleRoIExtractor
    "paddle": LevelRules(True, "1e-6", True, "zero"),          # distribute_fpn_proposals (CPU)
    "gluoncv": LevelRules(True, "1e-6", True, "nan", "rule"),  # _pyramid_roi_feats
    "openvino": LevelRules(False, "1e-6", True, "skip", "rule"),  # ExperimentalDetectronROIFeatureExtractor
    "tf_model_garden": LevelRules(False, "1e-6", False, "nan", formula="model_garden"),  # multilevel_crop_and_resize
}

Rules = Union[MaxPoolRules, BilinearPoolRules, PSRoIPoolRules, RoIAlignRules, PSRoIAlignRules,
              LevelRules]


def resolve(convention, table: dict, rules_type: type, op: str):
    """Turn a framework name or a rules object into the rules object for ``op``."""
    if isinstance(convention, rules_type):
        return convention
    if isinstance(convention, str):
        try:
            return table[convention]
        except KeyError:
            raise ValueError(
                f"convention must be one of {sorted(table)} for {op}, got {convention!r}"
            ) from None
    raise TypeError(
        f"convention must be a framework name (str) or a {rules_type.__name__}, "
        f"got {type(convention).__name__}"
    )

