"""OpenVINO: its CPU plugin's ROIPooling / ROIAlign-9 / PSROIPooling and
ExperimentalDetectronROIFeatureExtractor-6, one-node models.

roicore has no OpenVINO adapter; what parity compares with the plugin is roicore.core
under the convention that reproduces each op ("openvino_cpu" for ROIPooling, R-FCN's
"mxnet" for PSROIPooling; ROIAlign-9 matches none), and for the feature extractor
roicore.core.pyramid_roi_align with OpenVINO's level rule and the "mxnet" RoIAlign.  The
plugin runs forward only.
"""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, Call, Unsupported, arrays, conventions_text, float32_arrays
from . import Harness as Base

# ExperimentalDetectronROIFeatureExtractor's level rule: OpenVINO's, level 0 at the first of
# its pyramid_scales, canonical level 2 at size 224 (roicore.core.pyramid.CANONICAL)
PYRAMID = dict(first_level=0, canonical_level=2, canonical_size=224.0, levels="openvino")
# why the pyramid row is compared with aligned=False only
NOT_ALIGNED = ("pyramid_roi_align is compared with aligned=False only: with aligned=True "
               "OpenVINO still widens every box to at least one feature pixel, so boxes with "
               "a side under one feature pixel differ from the aligned RoIAlign")


class Harness(Base):
    name = "openvino"
    requires = ("openvino",)
    install = 'pip install "roicore[oracles]"'
    # the plugin holds spatial_scale as a float, as these conventions do
    conventions = {"roi_pool": "openvino_cpu", "roi_pool_bilinear": "openvino_cpu",
                   "psroi_pool": "mxnet", "pyramid_roi_align": "mxnet"}
    parity_claims = {op: (F32,) for op in conventions}
    differentiable = False
    has_adapter = False
    native_text = ("CPU plugin ROIPooling (max and bilinear) / ROIAlign-9 / PSROIPooling / "
                   "ExperimentalDetectronROIFeatureExtractor-6, INFERENCE_PRECISION_HINT f32")
    parity_text = ("OpenVINO CPU ROIPooling / PSROIPooling / "
                   "ExperimentalDetectronROIFeatureExtractor-6 (f32 hint) vs "
                   + conventions_text(conventions)
                   + ", pyramid_roi_align with OpenVINO's level rule (canonical level 2, "
                   "size 224), aligned=False")

    def __init__(self, threads=None):
        super().__init__(threads)
        import openvino as ov
        from openvino import opset1, opset2, opset9
        from openvino.utils.node_factory import NodeFactory
        import roicore.core as rc
        self.ov, self.opset1, self.opset2, self.opset9, self.rc = ov, opset1, opset2, opset9, rc
        self.opset6 = NodeFactory("opset6")
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = threads
        self.version = ov.__version__

    def restrict(self, case):
        if case["op"] == "psroi_pool" and case["output_size"][0] != case["output_size"][1]:
            raise Unsupported("OpenVINO's PSROIPooling pools to its square group_size")
        if case["op"] == "pyramid_roi_align":
            if case["output_size"][0] != case["output_size"][1]:
                raise Unsupported("ExperimentalDetectronROIFeatureExtractor pools to a square "
                                  "output_size")
            if case["aligned"]:
                raise Unsupported(NOT_ALIGNED)
            # its sampling_ratio is non-negative, 0 adaptive (as roicore's -1 and 0)
            return dict(case, sampling_ratio=max(case["sampling_ratio"], 0)), NOT_ALIGNED
        return case, None

    def inputs(self, case, dtype, dy):
        if case["op"] == "pyramid_roi_align":
            if dtype != F32:
                raise Unsupported(f"OpenVINO's CPU plugin is run in float32 only, not {dtype}")
            return dict(arrays(dict(case, x=case["x"][0]), np.float32),
                        x=[np.ascontiguousarray(m, np.float32) for m in case["x"]])
        return float32_arrays(case, dtype, "OpenVINO's CPU plugin")

    # the plugin's node for each operator: (node, extra parameters, their inputs) from the
    # map's parameter, the case and its arrays
    def _roi_align(self, data, case, inputs, PH, PW):
        o1 = self.opset1
        r = o1.parameter(list(inputs["boxes"].shape), np.float32)
        bi = o1.parameter(list(inputs["batch"].shape), np.int32)
        mode = "half_pixel_for_nn" if case["aligned"] else "asymmetric"
        node = self.opset9.roi_align(data, r, bi, PH, PW, case["sampling_ratio"],
                                     case["spatial_scale"], "avg", mode)
        return node, [r, bi], [inputs["boxes"], inputs["batch"]]

    def _roi_pooling(self, data, case, inputs, PH, PW):
        method = operators.variant(case["op"]).method.name
        if method not in ("max", "bilinear"):
            raise Unsupported(f"OpenVINO's ROIPooling has no method {method!r}")
        r = self.opset1.parameter(list(inputs["rois"].shape), np.float32)
        node = self.opset2.roi_pooling(data, r, output_roi=[PH, PW],
                                       spatial_scale=case["spatial_scale"], method=method)
        return node, [r], [inputs["rois"]]

    def _psroi_pooling(self, data, case, inputs, PH, PW):
        o1 = self.opset1
        r = o1.parameter(list(inputs["rois"].shape), np.float32)
        node = o1.psroi_pooling(data, r, case["x"].shape[1] // (PH * PW), PH,
                                case["spatial_scale"], 1, 1, "average")
        return node, [r], [inputs["rois"]]

    NODES = {"roi_align": _roi_align, "roi_pool": _roi_pooling, "psroi_pool": _psroi_pooling}

    def _feature_extractor(self, case, inputs):
        """ExperimentalDetectronROIFeatureExtractor-6, which pools the boxes of one image:
        one model per image with boxes, their outputs in the boxes' order (grouped by
        image)."""
        P, sr = case["output_size"][0], case["sampling_ratio"]
        attrs = {"output_size": P, "sampling_ratio": sr, "aligned": False,
                 "pyramid_scales": [int(round(1 / s)) for s in case["spatial_scales"]]}
        runs = []
        for i in np.unique(inputs["batch"]):
            boxes = np.ascontiguousarray(inputs["boxes"][inputs["batch"] == i])
            maps = [self.opset1.parameter([1] + list(m.shape[1:]), np.float32)
                    for m in inputs["x"]]
            rois = self.opset1.parameter(list(boxes.shape), np.float32)
            node = self.opset6.create("ExperimentalDetectronROIFeatureExtractor",
                                      [rois, *maps], attrs)
            model = self.ov.Model([node.output(0)], [rois, *maps])
            request = self.core.compile_model(model, "CPU", self.config).create_infer_request()
            runs.append((int(i), boxes, request))

        def run(xs):
            return np.concatenate([r.infer([b] + [m[i:i + 1] for m in xs])[0].copy()
                                   for i, b, r in runs])
        return Call(run, inputs["x"])

    def roicore(self, case, inputs, layout="NCHW"):
        if case["op"] != "pyramid_roi_align":
            return super().roicore(case, inputs, layout)
        rc, boxes, batch = self.rc, inputs["boxes"], inputs["batch"]
        size, scales, sr = case["output_size"], case["spatial_scales"], case["sampling_ratio"]
        return Call(lambda xs: rc.pyramid_roi_align(
            xs, boxes, size, scales, sr, False, convention=self.conventions[case["op"]],
            batch_indices=batch, **PYRAMID), inputs["x"])

    def native(self, case, inputs):
        if case["op"] == "pyramid_roi_align":
            return self._feature_extractor(case, inputs)
        build = self.NODES.get(operators.variant(case["op"]).operator.name)
        if build is None:
            return super().native(case, inputs)
        x = inputs["x"]
        data = self.opset1.parameter(list(x.shape), np.float32)
        node, params, feed = build(self, data, case, inputs, *case["output_size"])
        request = self.core.compile_model(self.ov.Model([node], [data] + params), "CPU",
                                          self.config).create_infer_request()
        return Call(lambda x: request.infer([x] + feed)[0], x)
