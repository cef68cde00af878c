"""PaddlePaddle: ``paddle.vision.ops`` against ``roicore.adapters.paddle``, and
PaddleDetection's FPN RoIAlign extractor (``distribute_fpn_proposals``, ``roi_align`` per
level, ``concat``, ``gather``) against the adapter's ``multilevel_roi_align``."""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, F64, Call, Unsupported, boxes_per_image, keep_boxes
from . import Harness as Base

OPS = ("roi_pool", "psroi_pool", "roi_align")
# the pyramid operator (cases.PYRAMID_OPS) of the adapter: multilevel_roi_align
PYRAMID = "multi_scale_roi_align"
# PaddleDetection's RoIAlign extractor's level rule: canonical level 4 at size 224
REFER_LEVEL, REFER_SCALE = 4, 224
# why a pyramid case of one box over several images is skipped
ONE_BOX = ("one box over several images: Paddle's distribute_fpn_proposals returns a copy of "
           "it for each image, so the extractor pools it from image 0")


class Harness(Base):
    name = "paddle"
    requires = ("paddle",)
    install = 'pip install "roicore[paddle]"'
    parity_claims = {op: (F32, F64) for op in OPS + (PYRAMID,)}
    native_text = "paddle.vision.ops roi_pool / roi_align / psroi_pool"
    parity_text = ("paddle.vision.ops roi_pool / psroi_pool / roi_align, and PaddleDetection's "
                   "FPN RoIAlign extractor on them (distribute_fpn_proposals, roi_align per "
                   "level, concat, gather), vs roicore.adapters.paddle (multilevel_roi_align)")
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
        if case["op"] == PYRAMID and len(case["x"]) > 1 and len(case["rois"]) == 1 and \
                case["x"][0].shape[0] > 1:
            raise Unsupported(ONE_BOX)
        if case["op"] in ("roi_align", PYRAMID) and case["aligned"] and \
                case["sampling_ratio"] <= 0:
            r = case["rois"]
            # Paddle passes a negative grid size to size_t here and aborts (undefined behaviour)
            return keep_boxes(case, (r[:, 3] >= r[:, 1]) & (r[:, 4] >= r[:, 2]),
                              "reversed box with aligned=True and adaptive sampling aborts Paddle")
        return case, None

    def inputs(self, case, dtype, dy):
        t = self.paddle.to_tensor
        if case["op"] == PYRAMID:
            return dict(x=[t(np.ascontiguousarray(m, dtype)) for m in case["x"]],
                        boxes=t(np.ascontiguousarray(case["rois"][:, 1:], dtype)),
                        boxes_num=t(boxes_per_image(dict(case, x=case["x"][0]))), dy=t(dy))
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

    def _levels(self, case):
        """min_level and max_level of the case's maps (scales 1/4, 1/8, ...: level 2 first)."""
        first = int(round(-np.log2(case["spatial_scales"][0])))
        return first, first + len(case["x"]) - 1

    def _paddledet(self, case, inputs):
        """PaddleDetection's RoIAlign extractor (ppdet/modeling/heads/roi_extractor.py) on
        the case's maps: roi_align of the one map, or distribute_fpn_proposals, roi_align of
        each level's boxes, concat and gather by the restore index.  Its one-map branch
        leaves sampling_ratio at roi_align's default; here both branches pass the case's."""
        ops, paddle = self.ops, self.paddle
        boxes, boxes_num = inputs["boxes"], inputs["boxes_num"]
        size, scales = case["output_size"], case["spatial_scales"]
        kw = dict(sampling_ratio=case["sampling_ratio"], aligned=case["aligned"])
        min_level, max_level = self._levels(case)

        def run(feats):
            if len(feats) == 1:
                return ops.roi_align(feats[0], boxes, boxes_num, size, scales[0], **kw)
            rois_dist, restore_index, rois_num_dist = ops.distribute_fpn_proposals(
                boxes, min_level, max_level, REFER_LEVEL, REFER_SCALE, rois_num=boxes_num)
            feat_list = [ops.roi_align(feats[i], rois_dist[i], rois_num_dist[i], size,
                                       scales[i], **kw) for i in range(len(feats))]
            return paddle.gather(paddle.concat(feat_list), restore_index)
        return Call(run, inputs["x"], inputs["dy"])

    def _multilevel(self, case, inputs):
        min_level, max_level = self._levels(case)
        adapter, boxes, boxes_num = self.adapter, inputs["boxes"], inputs["boxes_num"]
        args = (case["output_size"], case["spatial_scales"], case["sampling_ratio"],
                case["aligned"], min_level, max_level, REFER_LEVEL, REFER_SCALE)
        return Call(lambda feats: adapter.multilevel_roi_align(
            feats, boxes, boxes_num, *args, n_threads=self.threads), inputs["x"], inputs["dy"])

    def native(self, case, inputs):
        if case["op"] == PYRAMID:
            return self._paddledet(case, inputs)
        return self._bind(self.ops, case, inputs)

    def roicore(self, case, inputs, layout="NCHW"):
        if case["op"] == PYRAMID:
            return self._multilevel(case, inputs)
        return self._bind(self.adapter, case, inputs, n_threads=self.threads)

    def forward_backward(self, call):
        if isinstance(call.x, list):   # a pyramid's maps: one gradient each
            xs = [m.detach() for m in call.x]
            for m in xs:
                m.stop_gradient = False
            y = call.fn(xs)
            if not y.size:
                return y, None
            y.backward(call.dy)
            return y, [m.grad if m.grad is not None else self.paddle.zeros_like(m) for m in xs]
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
        if isinstance(t, list):   # a pyramid's gradients, level after level, flattened
            return np.concatenate([g.numpy().ravel() for g in t])
        return None if t is None else t.numpy()

    def core_rules(self):
        # Paddle's rules throughout; roi_pool with a gradient keeps an int32 argmax
        c = self.adapter.CONVENTION
        return {"roi_pool": c, "roi_pool/saving": self.adapter._GRAD_ARGMAX_RULES,
                "roi_pool/backward": c, "roi_align": c, "psroi_pool": c}
