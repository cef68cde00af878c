"""Time-boxed fuzzing of roicore's native operators called directly: the TensorFlow op
library's raw ops, roicore's Paddle operators and the torch op library's
``torch.ops.roicore.*``, as a SavedModel, a Paddle program or a TorchScript file calls
them, with no Python check in front.

Each case, made from its seed alone: one operator (forward or gradient), inputs of random
rank, shape, dtype and values (batch indices and counts in and out of range, coordinates
that are NaN, infinite or far beyond the map, gradient shapes and image sizes that do not
match, image sizes and pooled sizes that overflow), and attributes drawn from valid and
hostile values (rules arrays of any length and code, zero and negative sizes, NaN and
negative scales, huge sampling ratios, thread counts).  An operator must return or raise
the framework's error for bad input; a crash (an abort, a segfault), a hang past the time
box or another exception is a failure.

usage: python tests/fuzz/fuzz_native.py --framework tensorflow|paddle|torch [--seconds S]
                                        [--workers W] [--seed N]
       python tests/fuzz/fuzz_native.py --framework F --case SEED   (replay one case;
                                        ROICORE_FUZZ_VERBOSE=1 prints its call)
exit status: 0 when every case behaved, 1 on a crash or an unexpected exception.
"""
from __future__ import annotations

import os
import sys

import supervise

_FRAMEWORK = "ROICORE_FUZZ_FRAMEWORK"
INTS = [-(2**31), -7, -1, 0, 1, 2, 3, 7, 2**20, 2**31 - 1]
FLOATS = [float("nan"), float("inf"), -float("inf"), -1.0, 0.0, 1e-30, 0.0625, 0.5, 1.0, 1e30]


def _framework():
    return os.environ[_FRAMEWORK]


def _values(rng, np, kind, dtype, shape, n_images, size):
    """An array of ``kind`` ("feature", "boxes", "indices", "counts", "argmax",
    "image_size"), mostly plausible, sometimes hostile."""
    hostile = rng.random() < 0.1
    if kind == "feature":
        return rng.standard_normal(shape).astype(dtype)
    if kind == "boxes":
        b = rng.uniform(-0.25, 1.25, shape) * size
        if hostile and b.size:
            b.flat[int(rng.integers(b.size))] = rng.choice([np.nan, np.inf, -np.inf, 3e38, 1e9])
        return b.astype(dtype)
    if kind == "indices":
        v = rng.integers(0, max(n_images, 1), shape)
        if hostile and v.size:
            v.flat[int(rng.integers(v.size))] = rng.choice([-1, n_images, 2**31 - 1])
        return v.astype(dtype)
    if kind == "counts":
        v = rng.multinomial(int(shape[1]), [1 / max(shape[0], 1)] * shape[0]) if shape[0] \
            else np.zeros(0, np.int64)
        if hostile and v.size:
            v[int(rng.integers(v.size))] += int(rng.choice([-3, 1, 2**31 - 1]))
        return v.astype(dtype)
    if kind == "argmax":
        return rng.integers(-2, 40, shape).astype(np.int32)
    # image_size: the forward's, or hostile
    v = np.array(shape, np.int64)
    if hostile and v.size:
        v[int(rng.integers(v.size))] = rng.choice([-1, 0, 2**30, 2**31 - 1])
    return np.clip(v, -(2**31), 2**31 - 1).astype(np.int32)


def _rules(rng, valid, hostile):
    """A rules array: a valid one, or (hostile) one cut short or grown, or random codes."""
    roll = rng.random()
    if not hostile or roll < 0.6:
        return list(valid)
    if roll < 0.8:
        return list(valid)[:int(rng.integers(0, len(valid) + 3))] + \
            [int(v) for v in rng.integers(0, 3, max(0, int(rng.integers(-2, 3))))]
    return [int(v) for v in rng.integers(-3, 12, int(rng.integers(0, 14)))]


def _pick(rng, values, valid, hostile):
    """``valid``, or in a hostile case (one in two) a value drawn from ``values`` two times
    in five."""
    return values[int(rng.integers(len(values)))] if hostile and rng.random() < 0.4 else valid


# ---------------------------------------------------------------------------------------
# TensorFlow

TF_OPS = ["RoicoreRoiPoolMax", "RoicoreRoiPoolMaxGrad", "RoicoreCropAndResize",
          "RoicoreCropAndResizeGradImage", "RoicoreCropAndResizeGradBoxes", "RoicorePsroiPool",
          "RoicorePsroiPoolGrad", "RoicoreRoiAlign", "RoicoreRoiAlignGrad"]
TF_RULES = {"RoiPoolMax": "roi_pool/max", "CropAndResize": "roi_pool/bilinear",
            "PsroiPool": "psroi_pool", "RoiAlign": "roi_align"}


def _tf_case(rng, np):
    op = TF_OPS[int(rng.integers(len(TF_OPS)))]
    dtype = np.float32 if rng.random() < 0.6 else np.float64
    nhwc = rng.random() < 0.7
    N, C, H, W = (int(v) for v in (rng.integers(0, 3), rng.integers(0, 9), rng.integers(0, 12),
                                   rng.integers(0, 12)))
    K = int(rng.integers(0, 6))
    P = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    image = (N, H, W, C) if nhwc else (N, C, H, W)
    grads = (K, P[0], P[1], C) if nhwc else (K, C, P[0], P[1])
    if rng.random() < 0.15:  # a rank or a size that does not fit
        image = tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(1, 6))))
    if rng.random() < 0.15:
        grads = tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(1, 6))))
    crop = "Crop" in op
    kinds = {"images": ("feature", image), "grads": ("feature", grads),
             "boxes": ("boxes", (K, 4) if rng.random() < 0.9 else (K, int(rng.integers(0, 6)))),
             "box_indices": ("indices", (K,) if rng.random() < 0.9 else (K + 1,)),
             "argmax": ("argmax", grads), "image_size": ("image_size", image)}
    return dict(op=op, dtype=dtype, data_format="NHWC" if nhwc else "NCHW", kinds=kinds,
                n_images=N, size=1.0 if crop else float(max(H, W, 1)), pooled=P,
                index_dtype=np.int32 if rng.random() < 0.5 else np.int64)


def _tf_run(case, rng):
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    from roicore.adapters import tf as rtf
    library = rtf.native_ops()
    op_def = op_def_registry.get(case["op"])
    inputs = {}
    for arg in op_def.input_arg:
        kind, shape = case["kinds"][arg.name]
        dtype = {"indices": case["index_dtype"], "argmax": np.int32,
                 "image_size": np.int32}.get(kind, case["dtype"])
        if kind in ("feature", "boxes") and rng.random() < 0.05:
            dtype = np.float64 if dtype == np.float32 else np.float32  # a mismatch
        inputs[arg.name] = tf.constant(_values(rng, np, kind, dtype, shape, case["n_images"],
                                               case["size"]))
    name = next(v for k, v in TF_RULES.items() if k in case["op"])
    hostile = rng.random() < 0.5
    attrs = {}
    for attr in op_def.attr:
        if attr.type == "type":
            continue
        if attr.name == "rules":
            attrs["rules"] = _rules(rng, rtf._rules(name), hostile)
        elif attr.name == "data_format":
            attrs[attr.name] = _pick(rng, ["NHWC", "NCHW"], case["data_format"], hostile)
        elif attr.name == "method":
            attrs[attr.name] = _pick(rng, ["bilinear", "nearest"], "bilinear", hostile)
        elif attr.type == "int":
            valid = {"pooled_height": case["pooled"][0], "crop_height": case["pooled"][0],
                     "pooled_width": case["pooled"][1], "crop_width": case["pooled"][1],
                     "group_height": case["pooled"][0], "group_width": case["pooled"][1],
                     "sampling_ratio": int(rng.integers(-1, 4)), "n_threads": 1,
             "first_level": int(rng.integers(0, 4)), "canonical_level": 4}.get(attr.name, 1)
            attrs[attr.name] = _pick(rng, INTS, valid, hostile)
        elif attr.type == "float":
            attrs[attr.name] = _pick(rng, FLOATS, float(rng.choice([0.5, 1.0, 0.0625])), hostile)
        elif attr.type == "bool":
            attrs[attr.name] = bool(rng.random() < 0.5)
    fn = getattr(library, "".join("_" + c.lower() if c.isupper() else c
                                  for c in case["op"]).lstrip("_"))
    if attrs.get("sampling_ratio", 0) > 4 or attrs.get("pooled_height", 0) * \
            attrs.get("pooled_width", 1) > 10**6:
        mode = "eager"   # a valid huge grid would run for long: the sizes are what is tried
    else:
        mode = "eager" if rng.random() < 0.7 else "tf.function"
    if os.environ.get("ROICORE_FUZZ_VERBOSE"):
        print(mode, {k: (v.dtype.name, tuple(v.shape)) for k, v in inputs.items()}, attrs,
              flush=True)
    call = (lambda: fn(**inputs, **attrs)) if mode == "eager" else \
        tf.function(lambda: fn(**inputs, **attrs), autograph=False)
    try:
        call()
    except (tf.errors.InvalidArgumentError, tf.errors.ResourceExhaustedError,
            tf.errors.UnimplementedError, TypeError, ValueError):
        return "rejected"
    except tf.errors.OpError as exc:
        return f"{case['op']} raised {type(exc).__name__}: {str(exc)[:300]}"
    return "ok"


# ---------------------------------------------------------------------------------------
# Paddle

PADDLE_OPS = {
    "roi_pool": ("roicore_roi_pool", ("Out", "Argmax"),
                 ["rules", "pooled_height", "pooled_width", "spatial_scale", "with_argmax",
                  "n_threads"]),
    "psroi_pool": ("roicore_psroi_pool", ("Out",),
                   ["rules", "pooled_height", "pooled_width", "output_channels", "spatial_scale",
                    "n_threads"]),
    "roi_align": ("roicore_roi_align", ("Out",),
                  ["rules", "pooled_height", "pooled_width", "spatial_scale", "sampling_ratio",
                   "aligned", "n_threads"]),
}


def _paddle_case(rng, np):
    op = sorted(PADDLE_OPS)[int(rng.integers(len(PADDLE_OPS)))]
    N, C, H, W = (int(v) for v in (rng.integers(0, 3), rng.integers(0, 9), rng.integers(0, 12),
                                   rng.integers(0, 12)))
    K = int(rng.integers(0, 6))
    shape = (N, C, H, W) if rng.random() < 0.9 else \
        tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(1, 6))))
    return dict(op=op, dtype=np.float32 if rng.random() < 0.6 else np.float64, shape=shape,
                n_images=N, K=K, size=float(max(H, W, 1)),
                pooled=(int(rng.integers(1, 4)), int(rng.integers(1, 4))),
                count_dtype=np.int32 if rng.random() < 0.5 else np.int64)


def _paddle_run(case, rng):
    import numpy as np
    import paddle
    from roicore.adapters import paddle as rp
    native = rp._operators()
    name, outputs, attr_names = PADDLE_OPS[case["op"]]
    K, N = case["K"], case["n_images"]
    boxes_shape = (K, 4) if rng.random() < 0.9 else (K, int(rng.integers(0, 6)))
    counts_shape = (N, K) if rng.random() < 0.9 else (N + 1, K)
    x = _values(rng, np, "feature", case["dtype"], case["shape"], N, case["size"])
    b = _values(rng, np, "boxes", case["dtype"] if rng.random() < 0.95 else np.float64,
                boxes_shape, N, case["size"])
    n = _values(rng, np, "counts", case["count_dtype"], counts_shape, N, case["size"])
    inputs = {"X": paddle.to_tensor(x), "Boxes": paddle.to_tensor(b),
              "BoxesNum": paddle.to_tensor(n)}
    valid = {"rules": None, "pooled_height": case["pooled"][0],
             "pooled_width": case["pooled"][1], "spatial_scale": 1.0, "with_argmax": True,
             "output_channels": -1, "sampling_ratio": int(rng.integers(-1, 4)),
             "aligned": bool(rng.random() < 0.5), "n_threads": 0}
    hostile = rng.random() < 0.5
    attrs = {}
    for a in attr_names:
        if a == "rules":
            attrs[a] = _rules(rng, rp._RULES[case["op"]], hostile)
        elif a in ("with_argmax", "aligned"):
            attrs[a] = valid[a]
        elif a == "spatial_scale":
            attrs[a] = _pick(rng, FLOATS, float(rng.choice([0.5, 1.0, 0.0625])), hostile)
        else:
            attrs[a] = _pick(rng, INTS, valid[a], hostile)
    if attrs.get("sampling_ratio", 0) > 4:
        attrs["sampling_ratio"] = int(rng.choice([-(2**31), -7, 1025, 2**31 - 1]))
    if os.environ.get("ROICORE_FUZZ_VERBOSE"):
        print({k: (str(v.dtype), tuple(v.shape)) for k, v in inputs.items()}, attrs, flush=True)
    try:
        native.run(name, inputs, attrs, outputs)
    except (ValueError, TypeError, MemoryError, NotImplementedError):
        return "rejected"
    return "ok"


# ---------------------------------------------------------------------------------------
# PyTorch

TORCH_OPS = ["roi_pool", "roi_pool_backward", "roi_align", "roi_align_backward", "ps_roi_pool",
             "ps_roi_pool_backward", "ps_roi_align", "ps_roi_align_backward",
             "multi_scale_roi_align", "multi_scale_roi_align_backward"]


def _torch_case(rng, np):
    op = TORCH_OPS[int(rng.integers(len(TORCH_OPS)))]
    # mostly plausible sizes, so that most cases reach the kernels; zeros sometimes
    low = 0 if rng.random() < 0.1 else 1
    N, H, W = (int(v) for v in (rng.integers(low, 3), rng.integers(low, 12),
                                rng.integers(low, 12)))
    K = int(rng.integers(0, 6))
    P = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
    # the position-sensitive ops take D * PH * PW input channels and give D
    D = int(rng.integers(low, 4))
    C, C_out = (D * P[0] * P[1], D) if op.startswith("ps_") else (D * 2, D * 2)
    image, grads = (N, C, H, W), (K, C_out, P[0], P[1])
    if rng.random() < 0.15:  # a rank or a size that does not fit
        image = tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(1, 6))))
    if rng.random() < 0.15:
        grads = tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(1, 6))))
    dtype = [np.float32, np.float64, np.float16, np.int32][int(rng.choice(4, p=[.5, .35, .1, .05]))]
    return dict(op=op, dtype=dtype, image=image, grads=grads, K=K, n_images=N, pooled=P,
                rois_columns=5 if rng.random() < 0.9 else int(rng.integers(0, 7)),
                size=float(max(H, W, 1)))


def _torch_run(case, rng):
    import numpy as np
    import torch
    from roicore.adapters import torch as rt
    assert rt.native_library() is not None, "the torch op library is not loaded"
    overload = getattr(torch.ops.roicore, case["op"]).default
    K, N, (PH, PW) = case["K"], case["n_images"], case["pooled"]
    dtype = case["dtype"]
    rois = np.concatenate([
        _values(rng, np, "indices", np.int64, (K, 1), N, case["size"]).astype(np.float64),
        _values(rng, np, "boxes", np.float64, (K, 4), N, case["size"])], axis=1)
    if case["rois_columns"] != 5:
        rois = rng.uniform(0, case["size"], (K, case["rois_columns"]))
    tensors = {
        "input": _values(rng, np, "feature", np.float64, case["image"], N, case["size"]),
        "grad": _values(rng, np, "feature", np.float64, case["grads"], N, case["size"]),
        "rois": rois,
        "argmax": _values(rng, np, "argmax", np.int32, case["grads"], N, case["size"]),
    }
    image = case["image"] if len(case["image"]) == 4 else (N, 1, 1, 1)
    # a pyramid of 1 to 3 levels, each half the size of the one before
    levels = int(rng.integers(1, 4))
    shapes = [image[:2] + (max(image[2] >> i, 1), max(image[3] >> i, 1)) for i in range(levels)]
    valid = {"pooled_height": PH, "pooled_width": PW, "batch_size": image[0],
             "channels": image[1], "height": image[2], "width": image[3],
             "sampling_ratio": int(rng.integers(-1, 4)), "n_threads": 1,
             "first_level": int(rng.integers(0, 4)), "canonical_level": 4}
    hostile = rng.random() < 0.5
    args = []
    for arg in overload._schema.arguments:
        kind = str(arg.type)
        if kind == "Tensor":
            a = tensors[arg.name]
            if arg.name != "argmax":
                with np.errstate(all="ignore"):  # far coordinates overflow float16: on purpose
                    a = a.astype(dtype if rng.random() < 0.95 else np.float32)
            t = torch.from_numpy(np.ascontiguousarray(a))
            if rng.random() < 0.05 and t.dim() > 1:
                t = t.transpose(0, -1)  # strided
            args.append(t)
        elif kind == "List[Tensor]":  # the pyramid's maps
            maps = [torch.from_numpy(_values(rng, np, "feature", np.float64, s, N, 1).astype(
                dtype if rng.random() < 0.95 else np.float32)) for s in shapes]
            if hostile and rng.random() < 0.3:
                maps = maps[:int(rng.integers(0, len(maps)))] if rng.random() < 0.5 else \
                    maps + [torch.zeros(int(rng.integers(0, 3)), 1, 2, 2)]
            args.append(maps)
        elif kind == "List[float]":  # the maps' scales
            scales = [0.5 ** i for i in range(levels)]
            if hostile and rng.random() < 0.4:
                scales[int(rng.integers(levels))] = float(rng.choice(FLOATS))
            args.append(scales[:int(rng.integers(0, levels + 1))] if hostile and
                        rng.random() < 0.2 else scales)
        elif kind == "List[SymInt]":  # the maps' shapes
            flat = [int(v) for s in shapes for v in s]
            if hostile and rng.random() < 0.4:
                flat[int(rng.integers(len(flat)))] = int(rng.choice(INTS))
            args.append(flat[:int(rng.integers(0, len(flat) + 1))] if hostile and
                        rng.random() < 0.2 else flat)
        elif kind == "float":
            args.append(_pick(rng, FLOATS, float(rng.choice([0.5, 1.0, 0.0625])), hostile))
        elif kind == "bool":
            args.append(bool(rng.random() < 0.5))
        elif kind == "Optional[SymInt]":
            args.append(None if rng.random() < 0.5 else _pick(rng, INTS, 1, hostile))
        else:  # SymInt
            args.append(_pick(rng, INTS, valid.get(arg.name, 1), hostile))
    named = {a.name: v for a, v in zip(overload._schema.arguments, args)}
    if named.get("sampling_ratio", 0) > 4:
        named["sampling_ratio"] = int(rng.choice([-(2**31), -7, 1025, 2**31 - 1]))
        args = list(named.values())
    if os.environ.get("ROICORE_FUZZ_VERBOSE"):
        print(case["op"], [(str(a.dtype), tuple(a.shape)) if isinstance(a, torch.Tensor) else a
                           for a in args], flush=True)
    try:
        overload(*args)
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
        return "rejected"  # torch's errors (c10 errors are RuntimeError and its subclasses)
    return "ok"


# ---------------------------------------------------------------------------------------

_CASES = {"tensorflow": _tf_case, "paddle": _paddle_case, "torch": _torch_case}
_RUNS = {"tensorflow": _tf_run, "paddle": _paddle_run, "torch": _torch_run}


def make_case(seed):
    import numpy as np
    rng = np.random.default_rng([seed, 7])
    return _CASES[_framework()](rng, np)


def run_case(seed):
    import numpy as np
    case = make_case(seed)
    rng = np.random.default_rng([seed, 8])
    run = _RUNS[_framework()]
    try:
        return run(case, rng)
    except Exception as exc:  # an exception the operator should not raise
        return f"{case['op']} raised {type(exc).__name__}: {str(exc)[:300]}"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--framework" in argv:
        i = argv.index("--framework")
        os.environ[_FRAMEWORK] = argv[i + 1]
        del argv[i:i + 2]
    if os.environ.get(_FRAMEWORK) not in _CASES:
        print("fuzz_native: --framework tensorflow, paddle or torch is required", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return supervise.main(__file__, __doc__, run_case, make_case, argv)


if __name__ == "__main__":
    sys.exit(main())
