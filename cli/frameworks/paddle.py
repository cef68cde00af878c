"""PaddlePaddle: ``paddle.vision.ops`` against ``roicore.adapters.paddle``."""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, F64, Call, Unsupported, boxes_per_image, keep_boxes
from . import Harness as Base

OPS = ("roi_pool", "psroi_pool", "roi_align")


class Harness(Base):
    name = "paddle"
    requires = ("paddle",)
    install = 'pip install "roicore[paddle]"'
    parity_claims = {op: (F32, F64) for op in OPS}
    native_text = "paddle.vision.ops roi_pool / roi_align / psroi_pool"
    parity_text = "paddle.vision.ops roi_pool / psroi_pool / roi_align vs roicore.adapters.paddle"
    training_modes = ("eager", "to_static")  # to_static with full_graph=True: a static program

    def __init__(self, threads=None):
        super().__init__(threads)
        import paddle
        paddle.set_device("cpu")
        import paddle.vision.ops as ops
        from roicore.adapters import paddle as adapter
        self.paddle, self.ops, self.adapter = paddle, ops, adapter
        self.version = paddle.__version__

    def restrict(self, case):
        if case["op"] == "roi_align" and case["aligned"] and case["sampling_ratio"] <= 0:
            r = case["rois"]
            # Paddle passes a negative grid size to size_t here and aborts (undefined behaviour)
            return keep_boxes(case, (r[:, 3] >= r[:, 1]) & (r[:, 4] >= r[:, 2]),
                              "reversed box with aligned=True and adaptive sampling aborts Paddle")
        return case, None

    def inputs(self, case, dtype, dy):
        t = self.paddle.to_tensor
        return dict(x=t(case["x"].astype(dtype)),
                    boxes=t(np.ascontiguousarray(case["rois"][:, 1:], dtype)),
                    boxes_num=t(boxes_per_image(case)), dy=t(dy))

    def _bind(self, module, case, inputs, **extra):
        if case["op"] not in OPS:
            raise Unsupported(f"paddle has no {case['op']}")
        fn = getattr(module, case["op"])
        kw = operators.variant(case["op"]).options(sampling_ratio=case["sampling_ratio"],
                                                   aligned=case["aligned"])
        args = (inputs["boxes"], inputs["boxes_num"], case["output_size"], case["spatial_scale"])
        return Call(lambda x: fn(x, *args, **kw, **extra), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        return self._bind(self.ops, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
        return self._bind(self.adapter, case, inputs, n_threads=self.threads)

    def forward_backward(self, call):
        x = call.x.detach()
        x.stop_gradient = False
        y = call.fn(x)
        if not y.size:
            return y, None
        y.backward(call.dy)
        # no gradient reached x (every bin empty): Paddle leaves grad unset
        return y, x.grad if x.grad is not None else self.paddle.zeros_like(x)

    def train(self, call, case, dtype, mode):
        paddle, t = self.paddle, self.paddle.to_tensor
        images, target = t(case["images"].astype(dtype)), t(case["target"].astype(dtype))
        w, out = t(case["weight"].astype(dtype)), []

        def loss_of(w):
            f = paddle.nn.functional.conv2d(images, w, padding=1)
            return ((call.fn(f) - target) ** 2).mean()
        if mode == "to_static":
            loss_of = paddle.jit.to_static(loss_of, full_graph=True)
        for _ in range(case["steps"]):
            w.stop_gradient = False
            loss = loss_of(w)
            loss.backward()
            w = (w - case["lr"] * w.grad).detach()
            out.append((loss.numpy(), w.numpy()))
        return out

    def null(self, call, inputs):
        y_ready, dx_ready = call.dy, call.x

        class Null(self.paddle.autograd.PyLayer):
            @staticmethod
            def forward(ctx, v):
                return y_ready.detach()

            @staticmethod
            def backward(ctx, g):
                return dx_ready.detach()
        return Call(Null.apply, call.x, call.dy)

    def to_numpy(self, t, layout="NCHW"):
        return None if t is None else t.numpy()

    def core_rules(self):
        # Paddle's rules throughout; roi_pool with a gradient keeps an int32 argmax
        c = self.adapter.CONVENTION
        return {"roi_pool": c, "roi_pool/saving": self.adapter._GRAD_ARGMAX_RULES,
                "roi_pool/backward": c, "roi_align": c, "psroi_pool": c}
