"""MXNet: ``mx.nd`` ROIPooling / contrib.PSROIPooling / contrib.ROIAlign against
``roicore.adapters.mxnet``."""
from __future__ import annotations

import numpy as np

from . import F32, F64, Call, keep_boxes
from . import Harness as Base

# operator -> MXNet's name for it (the adapter uses the same names), and its parameters for a
# case pooling to PH x PW
NAMES = {"roi_pool": "ROIPooling", "psroi_pool": "PSROIPooling", "roi_align": "ROIAlign"}
PARAMS = {
    "roi_pool": lambda c, PH, PW: dict(pooled_size=(PH, PW), spatial_scale=c["spatial_scale"]),
    "psroi_pool": lambda c, PH, PW: dict(spatial_scale=c["spatial_scale"], pooled_size=PH,
                                         output_dim=c["x"].shape[1] // (PH * PW), group_size=PH),
    "roi_align": lambda c, PH, PW: dict(pooled_size=(PH, PW), spatial_scale=c["spatial_scale"],
                                        sample_ratio=c["sampling_ratio"], aligned=c["aligned"]),
}



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


# what each native op cannot take (Harness.restrict)
QUIRKS = {"psroi_pool": _square_only, "roi_align": _no_empty_aligned_boxes}


class Harness(Base):
    name = "mxnet"
    requires = ("mxnet",)
    install = 'pip install "roicore[mxnet]"'
    parity_claims = {op: (F32, F64) for op in NAMES}
    native_text = "mx.nd ROIPooling / contrib.ROIAlign / contrib.PSROIPooling"
    parity_text = ("mx.nd ROIPooling / contrib.PSROIPooling / contrib.ROIAlign vs "
                   "roicore.adapters.mxnet")
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
        return dict(x=nd.array(case["x"], dtype=dtype), rois=nd.array(case["rois"].astype(dtype), dtype=dtype),
                    dy=nd.array(dy, dtype=dtype))

    def _bind(self, fn, case, inputs, **extra):
        rois, kw = inputs["rois"], PARAMS[case["op"]](case, *case["output_size"])
        return Call(lambda x: fn(x, rois, **kw, **extra), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        name = NAMES.get(case["op"])
        if name is None:
            return super().native(case, inputs)
        mx = self.mx
        fn = getattr(mx.nd, name) if name == "ROIPooling" else getattr(mx.nd.contrib, name)
        return self._bind(fn, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
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
        return None if t is None else t.asnumpy()

    def core_rules(self):
        return dict.fromkeys(("roi_pool", "roi_pool/saving", "roi_pool/backward", "roi_align",
                              "psroi_pool"), "mxnet")
