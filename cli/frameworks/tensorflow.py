"""TensorFlow: ``tf.image.crop_and_resize`` against ``roicore.adapters.tf``, and the TF Model
Garden's ``multilevel_crop_and_resize`` (its algorithm on TensorFlow's ops, below) against
the adapter's.

TensorFlow has no RoI operator of its own.  Bilinear and nearest RoI pooling are
``crop_and_resize`` itself; for RoI max pooling the bench times the usual stand-in, ``crop_and_resize`` to
2P x 2P followed by a 2x2 max pool (not the same numbers, so parity does not compare it).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np

from roicore.core import operators

from . import F32, F64, Call, Unsupported
from . import Harness as Base

def model_garden_multilevel_crop_and_resize(tf, features, boxes, output_size):
    """The TF Model Garden's ``multilevel_crop_and_resize`` (official/vision/ops/
    spatial_transform_ops.py, sample_offset 0.5) on TensorFlow's ops, step for step as
    published, the oracle of ``roicore.adapters.tf.multilevel_crop_and_resize``: each box's
    level from its size, then per box and axis the two neighbours of one sample per bin
    gathered from every level flattened into one tensor, weighted (times 4) and averaged
    over 2 x 2 windows.  The Model Garden is not installable here; this is its algorithm."""
    P = output_size
    lo, hi = int(min(features)), int(max(features))
    maps = [features[str(level)] for level in range(lo, hi + 1)]
    B, H0, W0, C = (tf.shape(maps[0])[i] for i in range(4))
    n = tf.shape(boxes)[1]
    sizes = [(m.shape[1], m.shape[2]) for m in maps]
    offsets = np.cumsum([0] + [h * w for h, w in sizes])
    stacked = tf.reshape(tf.concat([tf.reshape(m, [B, -1, C]) for m in maps], 1), [-1, C])
    width = boxes[:, :, 3] - boxes[:, :, 1]
    height = boxes[:, :, 2] - boxes[:, :, 0]
    root = tf.sqrt(tf.cast(height, tf.float32) * tf.cast(width, tf.float32))
    level = tf.cast(tf.math.floordiv(tf.math.log(tf.math.divide_no_nan(root, 224.0)),
                                     tf.math.log(2.0)) + 4.0, tf.int32)
    level = tf.minimum(hi, tf.maximum(level, lo))
    scale = tf.cast(tf.pow(tf.constant(2.0), tf.cast(level, tf.float32)), boxes.dtype)
    y1, x1 = boxes[:, :, 0] / scale, boxes[:, :, 1] / scale
    height, width = height / scale, width / scale
    level = level - lo
    stride = tf.pow([[2.0]], tf.cast(level, tf.float32))
    bound_y = tf.cast(tf.cast(H0, tf.float32) / stride - 1, boxes.dtype)
    bound_x = tf.cast(tf.cast(W0, tf.float32) / stride - 1, boxes.dtype)

    def axis(start, extent, bound):
        grid = tf.stack([start + (i + 0.5) * extent / P for i in range(P)], 2)
        low = tf.minimum(tf.maximum(tf.cast(0., grid.dtype), tf.floor(grid)), bound[..., None])
        high = tf.minimum(low + 1, bound[..., None])
        frac = grid - low
        return tf.stack([low, high], -1), tf.stack([1.0 - frac, frac], 3)

    ys, ky = axis(y1, height, bound_y)
    xs, kx = axis(x1, width, bound_x)
    ys = tf.cast(tf.reshape(ys, [B, n, 2 * P]), tf.int32)
    xs = tf.cast(tf.reshape(xs, [B, n, 2 * P]), tf.int32)
    row_width = tf.gather(tf.constant([w for _, w in sizes], tf.int32), level)
    index = (tf.reshape(tf.range(B) * int(offsets[-1]), [B, 1, 1, 1])
             + tf.reshape(tf.gather(tf.constant(offsets[:-1], tf.int32), level), [B, n, 1, 1])
             + tf.reshape(ys * row_width[..., None], [B, n, 2 * P, 1])
             + tf.reshape(xs, [B, n, 1, 2 * P]))
    gathered = tf.gather(stacked, tf.reshape(index, [-1]))
    gathered = tf.reshape(gathered, [B * n, 2 * P, 2 * P, C])
    kernel = tf.reshape(ky, [B * n, 2 * P, 1]) * tf.reshape(kx, [B * n, 1, 2 * P]) * 4
    pooled = tf.nn.avg_pool(gathered * tf.cast(kernel[..., None], gathered.dtype),
                            [1, 2, 2, 1], [1, 2, 2, 1], "VALID")
    return tf.reshape(pooled, [B, n, P, P, C])


# the pyramid operator (cases.PYRAMID_OPS) of the adapter: multilevel_crop_and_resize
PYRAMID = "multi_scale_roi_align"


def _model_garden_case(case):
    """A pyramid case as the Model Garden takes it: maps that halve exactly (its bounds come
    from the first level's size), one sample per bin (its sampler has no sampling ratio),
    unaligned, and a square output."""
    H, W = case["x"][0].shape[2:]
    for i, m in enumerate(case["x"]):
        if m.shape[2] * 2 ** i != H or m.shape[3] * 2 ** i != W:
            raise Unsupported("the Model Garden's maps halve exactly (images padded to a "
                              "multiple of the coarsest stride); this case's do not")
    if case["aligned"] or case["output_size"][0] != case["output_size"][1]:
        raise Unsupported("the Model Garden pools unaligned boxes to a square output")
    note = None if case["sampling_ratio"] == 1 else (
        f"sampling_ratio {case['sampling_ratio']} read as 1: the Model Garden's sampler takes "
        "one sample per bin")
    return dict(case, sampling_ratio=1), note


# Largest crop tensor the RoI max pooling stand-in may build (bytes).
CROP_LIMIT = float(os.environ.get("ROICORE_BENCH_TF_CROP_LIMIT_GB", "1")) * 2**30


class Harness(Base):
    name = "tensorflow"
    requires = ("tensorflow",)
    install = 'pip install "roicore[tf]"'
    parity_claims = {"roi_pool_bilinear": (F32,), "roi_pool_nearest": (F32,),
                     PYRAMID: (F32, F64)}
    layouts = ("NCHW", "NHWC")
    native_text = ("roi_pool_bilinear, roi_pool_nearest: crop_and_resize; roi_pool: its usual "
                   "approximation, crop_and_resize to 2P x 2P + 2x2 max-pool (all NHWC)")
    parity_text = ("tf.image.crop_and_resize (bilinear, nearest) / the Model Garden's "
                   "multilevel_crop_and_resize vs roicore.adapters.tf")
    training_modes = ("eager", "tf.function", "SavedModel")

    def __init__(self, threads=None):
        super().__init__(threads)
        import tensorflow as tf
        if threads:    # the bench: every contender at the same thread count
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        else:          # parity: TF's own thread count, and only deterministic kernels
            tf.config.experimental.enable_op_determinism()
        from roicore.adapters import tf as adapter
        self.tf, self.adapter = tf, adapter
        self.version = tf.__version__

    def restrict(self, case):
        return _model_garden_case(case) if case["op"] == PYRAMID else (case, None)

    def _pyramid_inputs(self, case, dtype, dy):
        """The Model Garden's inputs: NHWC maps keyed by level, each image's boxes in a
        [batch, num_boxes, 4] tensor of [y1, x1, y2, x2] (images with fewer boxes padded
        with empty ones, whose upstream gradient is 0), and dy in that layout."""
        tf, rois = self.tf, case["rois"]
        first = int(round(-np.log2(case["spatial_scales"][0])))
        maps = {str(first + i): tf.constant(m.transpose(0, 2, 3, 1).astype(dtype))
                for i, m in enumerate(case["x"])}
        B = case["x"][0].shape[0]
        rows = [np.flatnonzero(rois[:, 0] == b) for b in range(B)]
        n = max(len(r) for r in rows)
        boxes = np.zeros((B, n, 4))
        g = np.zeros((B, n) + dy.shape[2:] + dy.shape[1:2])
        for b, r in enumerate(rows):
            boxes[b, :len(r)] = rois[r][:, [2, 1, 4, 3]]
            g[b, :len(r)] = dy[r].transpose(0, 2, 3, 1)
        return dict(x=maps, boxes=tf.constant(boxes.astype(dtype)), dtype=dtype,
                    dy=tf.constant(g.astype(dtype)))

    def _pyramid(self, case, inputs, native):
        boxes, size = inputs["boxes"], case["output_size"][0]
        if native:
            fn = lambda xs: model_garden_multilevel_crop_and_resize(self.tf, xs, boxes, size)  # noqa: E731
        else:
            fn = lambda xs: self.adapter.multilevel_crop_and_resize(  # noqa: E731
                xs, boxes, size, n_threads=self.threads)
        return Call(fn, inputs["x"], inputs["dy"])

    def inputs(self, case, dtype, dy):
        if case["op"] == PYRAMID:
            return self._pyramid_inputs(case, dtype, dy)
        tf = self.tf
        x = case["x"].astype(dtype)
        # the tensors of each layout are made when a call first needs them
        return dict(x=x, dy=dy, dtype=dtype, tensors={},
                    boxes=tf.constant(case["rois"][:, [2, 1, 4, 3]].astype(np.float32)),
                    box_indices=tf.constant(case["rois"][:, 0].astype(np.int32)))

    def _tensor(self, inputs, key, layout):
        """``inputs[key]`` (NCHW NumPy) as a tensor in ``layout``, made once."""
        made = inputs["tensors"]
        if (key, layout) not in made:
            a = inputs[key]
            made[(key, layout)] = self.tf.constant(a.transpose(0, 2, 3, 1) if layout == "NHWC"
                                                   else a)
        return made[(key, layout)]

    def _call(self, fn, inputs, layout):
        return Call(fn, self._tensor(inputs, "x", layout), self._tensor(inputs, "dy", layout),
                    layout)

    def native(self, case, inputs):
        if case["op"] == PYRAMID:
            return self._pyramid(case, inputs, native=True)
        tf, v, size = self.tf, operators.variant(case["op"]), list(case["output_size"])
        boxes, bi = inputs["boxes"], inputs["box_indices"]
        if inputs["dtype"] != F32:
            raise Unsupported(f"crop_and_resize computes in float32 only, not {inputs['dtype']}")
        if v.operator.name == "roi_pool" and v.method.normalised_boxes:   # crop_and_resize itself
            return self._call(lambda x: tf.image.crop_and_resize(
                x, boxes, bi, size, method=v.method.name, extrapolation_value=0.0),
                inputs, "NHWC")
        if v.name != "roi_pool":   # max pooling: crop_and_resize and max_pool2d stand in
            return super().native(case, inputs)
        N, C, H, W = case["x"].shape
        PH, PW = size
        crop_bytes = len(case["rois"]) * 4 * PH * PW * C * 4
        if crop_bytes > CROP_LIMIT:
            # with its gradient the stand-in holds several crop-sized tensors (about 11.5 GB
            # on c4_14x14), which beside the other workers can exhaust the machine's memory
            raise MemoryError(
                f"skipped: the crop_and_resize stand-in needs a {crop_bytes / 2**30:.1f} GiB crop "
                f"tensor (more than {CROP_LIMIT / 2**30:.0f} GiB) plus its gradient; set "
                "ROICORE_BENCH_TF_CROP_LIMIT_GB to raise the limit on a larger machine")
        # boxes in image pixels, normalised as crop_and_resize takes them
        nb = case["rois"][:, 1:] * case["spatial_scale"]
        nb[:, [0, 2]] /= max(W - 1, 1)
        nb[:, [1, 3]] /= max(H - 1, 1)
        nboxes = tf.constant(nb[:, [1, 0, 3, 2]].astype(np.float32))

        def stand_in(x):
            crops = tf.image.crop_and_resize(x, nboxes, bi, [2 * PH, 2 * PW])
            return tf.nn.max_pool2d(crops, 2, 2, "VALID")
        return self._call(stand_in, inputs, "NHWC")

    def roicore(self, case, inputs, layout="NCHW"):
        if case["op"] == PYRAMID:
            return self._pyramid(case, inputs, native=False)
        v = operators.variant(case["op"])
        fn = getattr(self.adapter, v.operator.name, None)
        if fn is None:
            raise Unsupported(f"roicore.adapters.tf has no {v.operator.name}")
        args = (inputs["boxes"], inputs["box_indices"], case["output_size"])
        if not v.method.normalised_boxes:  # the crops' boxes are normalised: no scale
            args += (case["spatial_scale"],)
        kw = dict(data_format=layout, n_threads=self.threads,
                  **v.options(sampling_ratio=case["sampling_ratio"], aligned=case["aligned"]))
        if v.method.name:
            kw["method"] = v.method.name
        return self._call(lambda x: fn(x, *args, **kw), inputs, layout)

    def forward_backward(self, call):
        tf = self.tf
        with tf.GradientTape() as tape:
            tape.watch(call.x)
            y = call.fn(call.x)
        return y, tape.gradient(y, call.x, output_gradients=call.dy)

    def train(self, call, case, dtype, mode):
        tf, nhwc = self.tf, call.layout == "NHWC"
        images = tf.constant(case["images"].transpose(0, 2, 3, 1).astype(dtype))
        target = case["target"].astype(dtype)
        target = tf.constant(target.transpose(0, 2, 3, 1) if nhwc else target)

        def step(w):
            with tf.GradientTape() as tape:
                tape.watch(w)
                f = tf.nn.conv2d(images, w, 1, "SAME")        # NHWC: TF's CPU convolution
                y = call.fn(f if nhwc else tf.transpose(f, (0, 3, 1, 2)))
                loss = tf.reduce_mean(tf.square(y - target))
            return loss, w - case["lr"] * tape.gradient(loss, w)
        w = tf.constant(case["weight"].transpose(2, 3, 1, 0).astype(dtype))   # HWIO
        if mode == "tf.function":
            step = tf.function(step)
        elif mode == "SavedModel":   # the step saved, then run as loaded
            module = tf.Module()
            module.step = tf.function(step, input_signature=[tf.TensorSpec(w.shape, w.dtype)])
            with tempfile.TemporaryDirectory() as where:
                tf.saved_model.save(module, where)
                step = tf.saved_model.load(where).step
        out = []
        for _ in range(case["steps"]):
            loss, w = step(w)
            out.append((loss.numpy(), w.numpy().transpose(3, 2, 0, 1)))
        return out

    def null(self, call, inputs):
        tf = self.tf
        y_ready, dx_ready = call.dy, call.x   # ready tensors of the output's and the input's shapes

        @tf.custom_gradient
        def null(v):
            return tf.identity(y_ready), lambda g: dx_ready
        return Call(null, call.x, call.dy, call.layout)

    def to_numpy(self, t, layout="NCHW"):
        if isinstance(t, dict):   # a pyramid's gradients, level after level, flattened
            return np.concatenate([t[k].numpy().ravel() for k in sorted(t, key=int)])
        if t is not None and t.shape.rank == 5:   # the Model Garden's [B, N, P, P, C]
            return t.numpy()
        return super().to_numpy(None if t is None else t.numpy(), layout)

    def core_rules(self):
        # roi_pool(method="max"): MXNet's rules with a per-plane argmax (the adapter's own)
        c = self.adapter.CONVENTIONS
        return {"roi_pool": c["roi_pool/max"], "roi_pool/saving": c["roi_pool/max"],
                "roi_pool/backward": c["roi_pool/max"], "roi_align": c["roi_align"],
                "psroi_pool": c["psroi_pool"], "roi_pool_bilinear": c["roi_pool/bilinear"],
                "roi_pool_nearest": c["roi_pool/nearest"]}
