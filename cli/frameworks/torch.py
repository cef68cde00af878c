"""PyTorch: ``torchvision.ops`` roi_pool / roi_align / ps_roi_pool / ps_roi_align (its CPU
kernels) against ``roicore.adapters.torch``; ``torchvision.ops.MultiScaleRoIAlign`` against
the adapter's and against ``roicore.core.pyramid_roi_align``, and torchvision's FPN detectors
with roicore's poolers (``roicore.cli._pyramid_parity_models``)."""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, F64, Call, Unsupported, keep_boxes
from . import Harness as Base

# operator -> the torchvision.ops (and adapter) function
FUNCTIONS = {"roi_pool": "roi_pool", "roi_align": "roi_align", "psroi_pool": "ps_roi_pool",
             "ps_roi_align": "ps_roi_align"}
# the pyramid operators (cases.PYRAMID_OPS), both torchvision's MultiScaleRoIAlign natively
PYRAMID = ("multi_scale_roi_align", "pyramid_roi_align")


class Harness(Base):
    name = "torch"
    requires = ("torch", "torchvision")
    install = 'pip install "roicore[torch]" torchvision'
    parity_claims = {op: (F32, F64) for op in tuple(FUNCTIONS) + PYRAMID}
    # pyramid_roi_align's row: roicore.core under torchvision's level rule and RoIAlign
    conventions = {"pyramid_roi_align": "torchvision"}
    native_text = "torchvision.ops roi_pool / roi_align / ps_roi_pool / ps_roi_align"
    parity_text = ("torchvision.ops roi_pool / roi_align / ps_roi_pool / ps_roi_align / "
                   "MultiScaleRoIAlign vs roicore.adapters.torch; MultiScaleRoIAlign also vs "
                   "roicore.core.pyramid_roi_align (levels and convention 'torchvision')")
    training_modes = ("eager",)

    def __init__(self, threads=None):
        super().__init__(threads)
        import torch
        import torchvision
        from roicore.adapters import torch as adapter
        import roicore.core as core
        if threads:
            torch.set_num_threads(threads)
        self.torch, self.ops, self.adapter, self.core = torch, torchvision.ops, adapter, core
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
        if case["op"] in PYRAMID:
            maps = [t(np.ascontiguousarray(m, dtype)) for m in case["x"]]
            rois = t(np.ascontiguousarray(case["rois"], dtype))
            N = maps[0].shape[0]
            # one (L, 4) tensor per image, as the detectors pass them (rois are grouped by image)
            boxes = [rois[rois[:, 0] == i, 1:].contiguous() for i in range(N)]
            return dict(x=maps, rois=rois, boxes=boxes, dy=None if dy is None else t(dy),
                        image_shapes=[tuple(case["image_size"])] * N)
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

    def _pooler(self, module, case, inputs, **extra):
        """A MultiScaleRoIAlign of ``module`` over the case's maps, named "0", "1", ..."""
        names = [str(i) for i in range(len(inputs["x"]))]
        pooler = module.MultiScaleRoIAlign(names, case["output_size"], case["sampling_ratio"],
                                           **extra)
        return Call(lambda xs: pooler(dict(zip(names, xs)), inputs["boxes"],
                                      inputs["image_shapes"]), inputs["x"], inputs["dy"])

    def _core_pyramid(self, case, inputs):
        """roicore.core.pyramid_roi_align and its backward under torchvision's level rule
        and RoIAlign (canonical level 4 and size 224, MultiScaleRoIAlign's defaults), as one
        autograd function of the maps."""
        torch, core = self.torch, self.core
        rois = inputs["rois"].numpy()
        size, scales, sr = case["output_size"], case["spatial_scales"], case["sampling_ratio"]
        kw = dict(canonical_level=4, canonical_size=224.0, levels="torchvision",
                  convention="torchvision", n_threads=self.threads)

        class Pyramid(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *maps):
                ctx.shapes = [tuple(m.shape) for m in maps]
                return torch.from_numpy(core.pyramid_roi_align(
                    [m.detach().numpy() for m in maps], rois, size, scales, sr, False, **kw))

            @staticmethod
            def backward(ctx, g):
                return tuple(torch.from_numpy(d) for d in core.pyramid_roi_align_backward(
                    g.contiguous().numpy(), rois, ctx.shapes, scales, sr, False, **kw))
        return Call(lambda xs: Pyramid.apply(*xs), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        if case["op"] in PYRAMID:
            return self._pooler(self.ops, case, inputs)
        return self._bind(self.ops, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
        if case["op"] == "multi_scale_roi_align":
            return self._pooler(self.adapter, case, inputs, n_threads=self.threads)
        if case["op"] == "pyramid_roi_align":
            return self._core_pyramid(case, inputs)
        return self._bind(self.adapter, case, inputs, n_threads=self.threads)

    def model(self, case, perturb=False):
        from .._pyramid_parity_models import run
        return run(case, self.adapter, perturb, self.threads)

    def forward(self, call):
        with self.torch.no_grad():
            return call.fn(call.x)

    def forward_backward(self, call):
        if isinstance(call.x, list):   # a pyramid's maps: one gradient each
            xs = [m.detach().requires_grad_(True) for m in call.x]
            y = call.fn(xs)
            y.backward(call.dy)
            return y.detach(), [m.grad if m.grad is not None else self.torch.zeros_like(m)
                                for m in xs]
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
        if isinstance(t, list):   # a pyramid's gradients, level after level, flattened
            return np.concatenate([g.detach().numpy().ravel() for g in t])
        return None if t is None else t.detach().numpy()

    def core_rules(self):
        return dict.fromkeys(("roi_pool", "roi_pool/saving", "roi_pool/backward", "roi_align",
                              "psroi_pool", "ps_roi_align"), self.adapter.CONVENTION)
