"""MXNet: ``mx.nd`` ROIPooling / contrib.PSROIPooling / contrib.ROIAlign (also
position-sensitive) against
``roicore.adapters.mxnet``, and GluonCV's FPN RoI features (``_pyramid_roi_feats``, align
mode) written on ``mx.nd`` against the adapter's ``pyramid_roi_feats``."""
from __future__ import annotations

import dataclasses

import numpy as np

from . import F32, F64, Call, Unsupported, keep_boxes
from . import Harness as Base

# operator -> MXNet's name for it (the adapter uses the same names), and its parameters for a
# case pooling to PH x PW
NAMES = {"roi_pool": "ROIPooling", "psroi_pool": "PSROIPooling", "roi_align": "ROIAlign",
         "ps_roi_align": "ROIAlign"}
PARAMS = {
    "roi_pool": lambda c, PH, PW: dict(pooled_size=(PH, PW), spatial_scale=c["spatial_scale"]),
    "psroi_pool": lambda c, PH, PW: dict(spatial_scale=c["spatial_scale"], pooled_size=PH,
                                         output_dim=c["x"].shape[1] // (PH * PW), group_size=PH),
    "roi_align": lambda c, PH, PW: dict(pooled_size=(PH, PW), spatial_scale=c["spatial_scale"],
                                        sample_ratio=c["sampling_ratio"], aligned=c["aligned"]),
    # roicore's ps_roi_align is aligned (torchvision's); MXNet's aligned=False is compared in
    # the adapter's tests
    "ps_roi_align": lambda c, PH, PW: dict(
        pooled_size=(PH, PW), spatial_scale=c["spatial_scale"], sample_ratio=c["sampling_ratio"],
        aligned=True, position_sensitive=True),
}
# the pyramid operator (cases.PYRAMID_OPS) of the adapter: pyramid_roi_feats
PYRAMID = "multi_scale_roi_align"
# GluonCV's level rule: canonical size 224 (canonical level 4), eps 1e-6
CANONICAL_SCALE, EPS = 224.0, 1e-6


def _square_only(case):
    if case["output_size"][0] != case["output_size"][1]:
        raise ValueError("MXNet PSROIPooling takes a square pooled_size")
    return case, None


def _no_empty_aligned_boxes(case):
    if not case["aligned"]:
        return case, None
    r, s = case["rois"], case["spatial_scale"]
    ok = np.ones(len(r), bool)
    for dt in (np.float32, np.float64):   # size as MXNet computes it, in both dtypes
        rr, ss = r.astype(dt), dt(np.float32(s))
        ok &= (rr[:, 3] * ss - rr[:, 1] * ss > 0) & (rr[:, 4] * ss - rr[:, 2] * ss > 0)
    ok &= ((r[:, 3] - r[:, 1]) * s > 1e-4) & ((r[:, 4] - r[:, 2]) * s > 1e-4)
    return keep_boxes(case, ok, "aligned ROIAlign box of size <= 0 aborts MXNet")


def _not_aligned(case):
    if case["aligned"]:
        raise Unsupported("GluonCV's _pyramid_roi_feats pools with aligned=False only")
    return case, None


# what each native op cannot take (Harness.restrict)
QUIRKS = {"psroi_pool": _square_only, "roi_align": _no_empty_aligned_boxes,
          "ps_roi_align": lambda case: _no_empty_aligned_boxes(dict(case, aligned=True)),
          PYRAMID: _not_aligned}


def _roi_align(F, data, rois, roi_size, spatial_scale, sample_ratio):
    """``F.contrib.ROIAlign`` with 0 for the rows whose batch index is negative, as MXNet's
    GPU kernel gives them: its CPU kernel leaves such a row unwritten and writes a 0 into
    the output elsewhere, so only the other rows reach it and ``take`` puts them back.  With
    no other row, a dummy one is pooled and never taken, so that the output stays in
    autograd's graph (a zero gradient), as GluonCV's one call of ROIAlign keeps it."""
    keep = np.flatnonzero(np.trunc(rois[:, 0].asnumpy()) >= 0)   # MXNet truncates the index
    K, (PH, PW) = rois.shape[0], roi_size
    zeros = F.zeros((1, data.shape[1], PH, PW), dtype=data.dtype)
    pooled_rois = F.take(rois, F.array(keep)) if keep.size else F.zeros((1, 5), dtype=rois.dtype)
    pooled = F.contrib.ROIAlign(data, pooled_rois, roi_size, spatial_scale,
                                sample_ratio=sample_ratio)
    index = np.zeros(K)
    index[keep] = np.arange(1, keep.size + 1)
    return F.take(F.concat(zeros, pooled, dim=0), F.array(index))


def gluoncv_pyramid_roi_feats(F, features, rpn_rois, roi_size, strides, min_stage, max_stage,
                              roi_canonical_scale, sampling_ratio, eps):
    """GluonCV's ``_pyramid_roi_feats`` with roi_mode='align': each row's level from its
    size, then per level ROIAlign with the other levels' rows set to -1, and the sum.  With
    one map the rule still applies (a row of NaN level is pooled from no level), as
    roicore.adapters.mxnet.pyramid_roi_feats claims; GluonCV's models without a pyramid call
    ROIAlign directly instead, which is roicore's ROIAlign."""
    if max_stage > 5:   # do not use p6 for RCNN
        max_stage = max_stage - 1
    _, x1, y1, x2, y2 = F.split(rpn_rois, axis=-1, num_outputs=5)
    h = y2 - y1 + 1
    w = x2 - x1 + 1
    roi_level = F.floor(4 + F.log2(F.sqrt(w * h) / roi_canonical_scale + eps))
    roi_level = F.squeeze(F.clip(roi_level, min_stage, max_stage))
    pooled = []
    for i, level in enumerate(range(min_stage, max_stage + 1)):
        masked_rpn_rois = F.where(roi_level == level, rpn_rois, F.ones_like(rpn_rois) * -1.)
        pooled.append(_roi_align(F, features[i], masked_rpn_rois, roi_size, 1. / strides[i],
                                 sampling_ratio))
    return F.ElementWiseSum(*pooled)


class Harness(Base):
    name = "mxnet"
    requires = ("mxnet",)
    install = 'pip install "roicore[mxnet]"'
    parity_claims = {op: (F32, F64) for op in tuple(NAMES) + (PYRAMID,)}
    native_text = "mx.nd ROIPooling / contrib.ROIAlign / contrib.PSROIPooling"
    parity_text = ("mx.nd ROIPooling / contrib.PSROIPooling / contrib.ROIAlign (also "
                   "position-sensitive) / GluonCV's _pyramid_roi_feats vs roicore.adapters.mxnet")
    training_modes = ("eager",)

    def __init__(self, threads=None):
        super().__init__(threads)
        from roicore.adapters import mxnet as adapter   # sets the NumPy aliases mxnet 1.9.1 needs
        import mxnet as mx
        self.mx, self.adapter = mx, adapter
        self.version = mx.__version__

    def restrict(self, case):
        quirk = QUIRKS.get(case["op"])
        return quirk(case) if quirk else (case, None)

    def inputs(self, case, dtype, dy):
        nd = self.mx.nd
        if case["op"] == PYRAMID:
            return dict(x=[nd.array(m, dtype=dtype) for m in case["x"]],
                        rois=nd.array(case["rois"].astype(dtype), dtype=dtype),
                        dy=nd.array(dy, dtype=dtype))
        return dict(x=nd.array(case["x"], dtype=dtype), rois=nd.array(case["rois"].astype(dtype), dtype=dtype),
                    dy=nd.array(dy, dtype=dtype))

    def _bind(self, fn, case, inputs, **extra):
        rois, kw = inputs["rois"], PARAMS[case["op"]](case, *case["output_size"])
        return Call(lambda x: fn(x, rois, **kw, **extra), inputs["x"], inputs["dy"])

    def _pyramid(self, case, inputs, native):
        """GluonCV's formula (``native``) or the adapter on the case's maps, of strides 4, 8,
        ... (GluonCV's min_stage 2)."""
        strides = [int(round(1 / s)) for s in case["spatial_scales"]]
        size, rois, sr = tuple(case["output_size"]), inputs["rois"], case["sampling_ratio"]
        if native:
            min_stage = int(np.log2(strides[0]))
            return Call(lambda xs: gluoncv_pyramid_roi_feats(
                self.mx.nd, xs, rois, size, strides, min_stage, min_stage + len(xs) - 1,
                CANONICAL_SCALE, sr, EPS), inputs["x"], inputs["dy"])
        return Call(lambda xs: self.adapter.pyramid_roi_feats(
            xs, rois, size, strides, "align", CANONICAL_SCALE, sr, EPS,
            n_threads=self.threads), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        if case["op"] == PYRAMID:
            return self._pyramid(case, inputs, native=True)
        name = NAMES.get(case["op"])
        if name is None:
            return super().native(case, inputs)
        mx = self.mx
        fn = getattr(mx.nd, name) if name == "ROIPooling" else getattr(mx.nd.contrib, name)
        return self._bind(fn, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
        if case["op"] == PYRAMID:
            return self._pyramid(case, inputs, native=False)
        name = NAMES.get(case["op"])
        if name is None:
            return super().roicore(case, inputs)
        return self._bind(getattr(self.adapter, name), case, inputs, n_threads=self.threads)

    def forward(self, call):
        y = call.fn(call.x)
        y.wait_to_read()
        return y

    def _leaf(self, x):
        """A copy of x to differentiate, finished: MXNet's copy is asynchronous, and an op
        that reads x would wait for it inside its timing while the null op, which never
        reads x, would not."""
        x = x.copy()
        x.attach_grad()
        x.wait_to_read()
        return x

    def forward_backward(self, call):
        if isinstance(call.x, list):   # a pyramid's maps: one gradient each
            xs = [self._leaf(m) for m in call.x]
            with self.mx.autograd.record():
                y = call.fn(xs)
            y.backward(call.dy)
            for m in xs:
                m.grad.wait_to_read()
            return y, [m.grad for m in xs]
        x = self._leaf(call.x)
        with self.mx.autograd.record():
            y = call.fn(x)
        y.backward(call.dy)
        x.grad.wait_to_read()
        return y, x.grad

    def train(self, call, case, dtype, mode):
        # the convolution's output is in oneDNN's layout (float32), as in a real model
        mx = self.mx
        images = mx.nd.array(case["images"], dtype=dtype)
        target = mx.nd.array(case["target"], dtype=dtype)
        w, out = mx.nd.array(case["weight"], dtype=dtype), []
        for _ in range(case["steps"]):
            w.attach_grad()
            with mx.autograd.record():
                f = mx.nd.Convolution(images, w, kernel=(3, 3), pad=(1, 1),
                                      num_filter=w.shape[0], no_bias=True)
                loss = mx.nd.mean(mx.nd.square(call.fn(f) - target))
            loss.backward()
            w = w - case["lr"] * w.grad
            out.append((loss.asnumpy(), w.asnumpy()))
        return out

    def null(self, call, inputs):
        mx, rois = self.mx, inputs["rois"]
        # ready arrays of the output's and the input's shapes (views: no more memory)
        y_ready, dx_ready = call.dy.reshape(call.dy.shape), call.x.reshape(call.x.shape)

        class Null(mx.autograd.Function):
            def forward(self, v, r):
                return y_ready

            def backward(self, g):
                return dx_ready, mx.nd.zeros_like(rois)
        # the adapter records its op on (data, rois); so does this one
        return Call(lambda x: Null()(x, rois), call.x, call.dy)

    def to_numpy(self, t, layout="NCHW"):
        if isinstance(t, list):   # a pyramid's gradients, level after level, flattened
            return np.concatenate([g.asnumpy().ravel() for g in t])
        return None if t is None else t.asnumpy()

    def core_rules(self):
        from roicore.core.conventions import PSROI_ALIGN
        return dict(dict.fromkeys(("roi_pool", "roi_pool/saving", "roi_pool/backward",
                                   "roi_align", "psroi_pool"), "mxnet"),
                    ps_roi_align=dataclasses.replace(PSROI_ALIGN["mxnet"], box="aligned"))
