"""PyTorch: ``torchvision.ops`` roi_pool / roi_align / ps_roi_pool / ps_roi_align (its CPU
kernels) against ``roicore.adapters.torch``."""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, F64, Call, Unsupported, keep_boxes
from . import Harness as Base

# operator -> the torchvision.ops (and adapter) function
FUNCTIONS = {"roi_pool": "roi_pool", "roi_align": "roi_align", "psroi_pool": "ps_roi_pool",
             "ps_roi_align": "ps_roi_align"}


class Harness(Base):
    name = "torch"
    requires = ("torch", "torchvision")
    install = 'pip install "roicore[torch]" torchvision'
    parity_claims = {op: (F32, F64) for op in FUNCTIONS}
    native_text = "torchvision.ops roi_pool / roi_align / ps_roi_pool / ps_roi_align"
    parity_text = ("torchvision.ops roi_pool / roi_align / ps_roi_pool / ps_roi_align vs "
                   "roicore.adapters.torch")
    training_modes = ("eager",)

    def __init__(self, threads=None):
        super().__init__(threads)
        import torch
        import torchvision
        from roicore.adapters import torch as adapter
        if threads:
            torch.set_num_threads(threads)
        self.torch, self.ops, self.adapter = torch, torchvision.ops, adapter
        self.version = f"{torch.__version__}, torchvision {torchvision.__version__}"

    def restrict(self, case):
        if case["op"] == "roi_align" and case["aligned"] and case["sampling_ratio"] <= 0:
            r = case["rois"]
            # torchvision sizes a vector with the negative grid of such a box and throws
            return keep_boxes(case, (r[:, 3] >= r[:, 1]) & (r[:, 4] >= r[:, 2]),
                              "reversed box with aligned=True and adaptive sampling makes "
                              "torchvision throw")
        return case, None

    def inputs(self, case, dtype, dy):
        t = self.torch.from_numpy
        return dict(x=t(np.ascontiguousarray(case["x"], dtype)),
                    rois=t(np.ascontiguousarray(case["rois"], dtype)), dy=t(dy))

    def _bind(self, module, case, inputs, **extra):
        name = FUNCTIONS.get(case["op"])
        if name is None:
            raise Unsupported(f"torchvision has no {case['op']}")
        fn = getattr(module, name)
        args = (inputs["rois"], case["output_size"], case["spatial_scale"])
        kw = dict(extra, **operators.variant(case["op"]).options(
            sampling_ratio=case["sampling_ratio"], aligned=case["aligned"]))
        return Call(lambda x: fn(x, *args, **kw), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        return self._bind(self.ops, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
        return self._bind(self.adapter, case, inputs, n_threads=self.threads)

    def forward(self, call):
        with self.torch.no_grad():
            return call.fn(call.x)

    def forward_backward(self, call):
        x = call.x.detach().requires_grad_(True)
        y = call.fn(x)
        y.backward(call.dy)
        # no gradient reached x (no boxes): torch leaves grad unset
        return y.detach(), x.grad if x.grad is not None else self.torch.zeros_like(x)

    def train(self, call, case, dtype, mode):
        torch = self.torch
        images, target = (torch.from_numpy(case[k].astype(dtype)) for k in ("images", "target"))
        w, out = torch.from_numpy(case["weight"].astype(dtype)), []
        for _ in range(case["steps"]):
            w.requires_grad_(True)
            f = torch.nn.functional.conv2d(images, w, padding=1)
            loss = ((call.fn(f) - target) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                w = w - case["lr"] * w.grad
            out.append((loss.detach().numpy(), w.numpy()))
        return out

    def null(self, call, inputs):
        torch, y_ready, dx_ready = self.torch, call.dy, call.x

        class Null(torch.autograd.Function):
            @staticmethod
            def forward(ctx, v):
                return y_ready.detach()

            @staticmethod
            def backward(ctx, g):
                return dx_ready.detach()
        return Call(Null.apply, call.x, call.dy)

    def to_numpy(self, t, layout="NCHW"):
        return None if t is None else t.detach().numpy()

    def core_rules(self):
        return dict.fromkeys(("roi_pool", "roi_pool/saving", "roi_pool/backward", "roi_align",
                              "psroi_pool", "ps_roi_align"), self.adapter.CONVENTION)
