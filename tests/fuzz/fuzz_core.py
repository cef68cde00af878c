"""Time-boxed fuzzing of roicore.core.

Each case, made from its seed alone: an operator and direction, a dtype, a convention, random
shapes (channel counts that fill whole blocks and padded ones), and boxes of every awkward
kind (inside, straddling, outside, reversed, zero-size, on exact halves, larger than the
map); one in ten is hostile instead (a NaN or infinite coordinate, one far beyond the map, a
batch index out of range) and must be refused with ValueError.  A valid case is run at 1 and
at 2-4 threads, which must give the same bits, and against the slow reference
(tests/reference.py), which must give the same numbers.

Workers run in subprocesses, so a crash (a segfault, a sanitizer's abort) is caught: the
case it was running is reported by seed, and a fresh worker goes on.

usage: python tests/fuzz/fuzz_core.py [--seconds S] [--workers W] [--seed N]
       python tests/fuzz/fuzz_core.py --case SEED      (replay one case, verbosely)
exit status: 0 when every case behaved, 1 on a mismatch or a crash.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys

import supervise

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _imports():
    sys.path.insert(0, str(TESTS))
    import numpy as np
    import reference
    import roicore.core as rc
    from roicore.core import conventions
    from strategies import BOX_KINDS, SCALES, _feature_box
    return np, reference, rc, conventions, BOX_KINDS, SCALES, _feature_box


def make_case(seed):
    """Everything one case needs, from its seed."""
    np, reference, rc, conventions, BOX_KINDS, SCALES, feature_box = _imports()
    rng = np.random.default_rng(seed)
    op = str(rng.choice(["max", "bilinear", "nearest", "boxes", "psroi", "align", "ps_align",
                         "garden"]))
    crop = op in CROP_OPS
    backward = bool(rng.random() < 0.5)
    dtype = np.float32 if rng.random() < 0.6 else np.float64
    N, H, W = int(rng.integers(1, 4)), int(rng.integers(1, 14)), int(rng.integers(1, 14))
    PH, PW = (int(v) for v in rng.integers(1, 6, 2))
    K = int(rng.integers(0, 9))
    table = {"max": conventions.MAX_POOL, "bilinear": conventions.BILINEAR_POOL,
             "nearest": conventions.BILINEAR_POOL,
             # the box gradient is TensorFlow's only
             "boxes": {"tensorflow": conventions.BILINEAR_POOL["tensorflow"]},
             "psroi": conventions.PSROI_POOL, "align": conventions.ROI_ALIGN,
             # MXNet's aligned=True too
             "ps_align": dict(conventions.PSROI_ALIGN, mxnet_aligned=dataclasses.replace(
                 conventions.PSROI_ALIGN["mxnet"], box="aligned")),
             # the TF Model Garden's sampler: one sample per bin, unaligned
             "garden": {"model_garden": conventions.MODEL_GARDEN_ALIGN}}[op]
    convention = str(rng.choice(sorted(table)))
    group = None
    if op in ("psroi", "ps_align"):
        group = (PH, PW)
        if rng.random() < 0.5 and op == "psroi" and table[convention].formula == "rfcn":
            group = tuple(int(v) for v in rng.integers(1, 4, 2))
        D = int(rng.integers(1, 7))  # whole blocks of 4 output channels and their tails
        if op == "ps_align" and rng.random() < 0.1:  # PS-RoIAlign's runs of 32 lanes
            D = int(rng.integers(30, 40))
        C = D * group[0] * group[1]
    else:
        C = int(rng.choice([1, 2, 3, 8, 9, 33, 64, 70]))
    scale = 1.0 if crop else float(rng.choice(SCALES))
    x = rng.standard_normal((N, C, H, W)).astype(dtype)
    if rng.random() < 0.3:  # ties, for the first-maximum rules
        x = rng.integers(-2, 3, (N, C, H, W)).astype(dtype)
    if crop:
        boxes = rng.uniform(-0.5, 1.5, (K, 4))
        if rng.random() < 0.3:  # samples on exact pixel halves (nearest rounds them)
            boxes = np.round(boxes * 4) / 4
    else:
        kinds = rng.choice(BOX_KINDS, K)
        boxes = np.array([feature_box(rng, str(k), H, W) for k in kinds], np.float64).reshape(K, 4)
        boxes = boxes / scale
    boxes = boxes.astype(dtype)
    batch = rng.integers(0, N, K).astype(np.int64)
    hostile = None
    if K and rng.random() < 0.1:
        hostile = str(rng.choice(["nan", "inf", "far", "batch"]))
        k, j = int(rng.integers(0, K)), int(rng.integers(0, 4))
        if hostile == "nan":
            boxes[k, j] = np.nan
        elif hostile == "inf":
            boxes[k, j] = -np.inf
        elif hostile == "far":
            boxes[k, j] = 3e9 / (W if crop else scale)
        else:
            batch[k] = N if rng.random() < 0.5 else -1
    grad_shape = (K, C // (group[0] * group[1]) if group else C, PH, PW)
    case = dict(op=op, backward=backward, dtype=dtype, x=x, boxes=boxes, batch=batch,
                output_size=(PH, PW), scale=scale, convention=table[convention],
                convention_name=convention, group=group, hostile=hostile,
                sampling_ratio=1 if op == "garden" else int(rng.choice([-1, 0, 1, 2, 3])),
                aligned=op != "garden" and bool(rng.random() < 0.5),
                extrapolation=float(rng.choice([0.0, 0.5])),
                grad=rng.standard_normal(grad_shape).astype(dtype),
                threads=int(rng.integers(2, 5)))
    return case


CROP_OPS = ("bilinear", "nearest", "boxes")


def _core(case, n_threads):
    _, _, rc, *_ = _imports()
    c = case
    kw = dict(batch_indices=c["batch"], convention=c["convention"], n_threads=n_threads)
    x, b, P, s = c["x"], c["boxes"], c["output_size"], c["scale"]
    if c["op"] == "max":
        y, a = rc.roi_pool(x, b, P, s, return_argmax=True, **kw)
        if not c["backward"]:
            return y, a
        return (rc.roi_pool_backward(c["grad"], b, x.shape, s, argmax=a, **kw),)
    if c["op"] == "boxes":
        return (rc.roi_pool_boxes_backward(c["grad"], x, b, **kw),)
    if c["op"] in CROP_OPS:
        method = c["op"]
        if not c["backward"]:
            return (rc.roi_pool(x, b, P, method=method, extrapolation_value=c["extrapolation"],
                                **kw),)
        return (rc.roi_pool_backward(c["grad"], b, x.shape, method=method, **kw),)
    if c["op"] == "psroi":
        if not c["backward"]:
            return (rc.psroi_pool(x, b, P, s, group_size=c["group"], **kw),)
        return (rc.psroi_pool_backward(c["grad"], b, x.shape, s, group_size=c["group"], **kw),)
    sr, al = c["sampling_ratio"], c["aligned"]
    if c["op"] == "ps_align":
        if not c["backward"]:
            return (rc.ps_roi_align(x, b, P, s, sr, **kw),)
        return (rc.ps_roi_align_backward(c["grad"], b, x.shape, s, sr, **kw),)
    if not c["backward"]:
        return (rc.roi_align(x, b, P, s, sr, al, **kw),)
    return (rc.roi_align_backward(c["grad"], b, x.shape, s, sr, al, **kw),)


def _reference(case):
    _, reference, *_ = _imports()
    c = case
    x, b, batch, P, s, rules = c["x"], c["boxes"], c["batch"], c["output_size"], c["scale"], c["convention"]
    if c["op"] == "max":
        y, a = reference.roi_pool_max(x, b, batch, P, s, rules)
        return (y, a) if not c["backward"] else (
            reference.roi_pool_max_backward(c["grad"], a, batch, x.shape, rules),)
    if c["op"] == "boxes":
        return (reference.roi_pool_bilinear_boxes_backward(c["grad"], x, b, batch),)
    if c["op"] in ("bilinear", "nearest"):
        forward, backward = {
            "bilinear": (reference.roi_pool_bilinear, reference.roi_pool_bilinear_backward),
            "nearest": (reference.roi_pool_nearest, reference.roi_pool_nearest_backward),
        }[c["op"]]
        if not c["backward"]:
            return (forward(x, b, batch, P, rules, c["extrapolation"]),)
        return (backward(c["grad"], b, batch, x.shape, rules),)
    if c["op"] == "psroi":
        D = x.shape[1] // (c["group"][0] * c["group"][1])
        if not c["backward"]:
            return (reference.psroi_pool(x, b, batch, D, P, s, rules, group_size=c["group"]),)
        return (reference.psroi_pool_backward(c["grad"], b, batch, x.shape, P, s, rules,
                                              group_size=c["group"]),)
    sr, al = c["sampling_ratio"], c["aligned"]
    if c["op"] == "ps_align":
        if not c["backward"]:
            return (reference.ps_roi_align(x, b, batch, P, s, sr, rules),)
        return (reference.ps_roi_align_backward(c["grad"], b, batch, x.shape, P, s, sr, rules),)
    if c["op"] == "garden":
        if not c["backward"]:
            return (reference.model_garden_crop(x, b, batch, P, s),)
        return (reference.model_garden_crop_backward(c["grad"], b, batch, x.shape, s),)
    if not c["backward"]:
        return (reference.roi_align(x, b, batch, P, s, sr, al, rules),)
    return (reference.roi_align_backward(c["grad"], b, batch, x.shape, P, s, sr, al, rules),)


def _same_bits(a, b):
    np = _imports()[0]
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return bool(np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")))
    return bool(np.array_equal(a, b))


def _same_values(a, b):
    np = _imports()[0]
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and bool(np.array_equal(a, b.astype(a.dtype), equal_nan=True))


def run_case(seed):
    """'ok', 'rejected', 'unchecked' (the reference refuses a case the core defines), or a
    message describing the failure."""
    case = make_case(seed)
    if case["hostile"]:
        try:
            _core(case, 1)
        except ValueError:
            return "rejected"
        return f"hostile input ({case['hostile']}) was not refused"
    try:
        one = _core(case, 1)
    except ValueError as exc:
        try:  # the reference must refuse it too (e.g. an adaptive grid over the cap)
            _reference(case)
        except ValueError:
            return "rejected"
        return f"core refused a case the reference computes: {exc}"
    many = _core(case, case["threads"])
    for i, (a, b) in enumerate(zip(one, many)):
        if not _same_bits(a, b):
            return f"output {i} differs between 1 and {case['threads']} threads"
    try:
        ref = _reference(case)
    except ValueError:
        return "unchecked"
    for i, (a, b) in enumerate(zip(one, ref)):
        if not _same_values(a, b):
            return f"output {i} differs from the reference"
    return "ok"


def main(argv=None):
    return supervise.main(__file__, __doc__, run_case, make_case, argv)


if __name__ == "__main__":
    sys.exit(main())
