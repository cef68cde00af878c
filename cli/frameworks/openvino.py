"""OpenVINO: its CPU plugin's ROIPooling / ROIAlign-9 / PSROIPooling, one-node models.

roicore has no OpenVINO adapter; what parity compares with the plugin is roicore.core
under the convention that reproduces each op ("openvino_cpu" for ROIPooling, R-FCN's
"mxnet" for PSROIPooling; ROIAlign-9 matches none).  The plugin runs forward only.
"""
from __future__ import annotations

import numpy as np

from roicore.core import operators

from . import F32, Call, Unsupported, conventions_text, float32_arrays
from . import Harness as Base


class Harness(Base):
    name = "openvino"
    requires = ("openvino",)
    install = 'pip install "roicore[oracles]"'
    # the plugin holds spatial_scale as a float, as these conventions do
    conventions = {"roi_pool": "openvino_cpu", "roi_pool_bilinear": "openvino_cpu",
                   "psroi_pool": "mxnet"}
    parity_claims = {op: (F32,) for op in conventions}
    differentiable = False
    has_adapter = False
    native_text = ("CPU plugin ROIPooling (max and bilinear) / ROIAlign-9 / PSROIPooling, "
                   "INFERENCE_PRECISION_HINT f32")
    parity_text = ("OpenVINO CPU ROIPooling / PSROIPooling (f32 hint) vs "
                   + conventions_text(conventions))

    def __init__(self, threads=None):
        super().__init__(threads)
        import openvino as ov
        from openvino import opset1, opset2, opset9
        import roicore.core as rc
        self.ov, self.opset1, self.opset2, self.opset9, self.rc = ov, opset1, opset2, opset9, rc
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": "f32"}
        if threads:
            self.config["INFERENCE_NUM_THREADS"] = threads
        self.version = ov.__version__

    def restrict(self, case):
        if case["op"] == "psroi_pool" and case["output_size"][0] != case["output_size"][1]:
            raise Unsupported("OpenVINO's PSROIPooling pools to its square group_size")
        return case, None

    def inputs(self, case, dtype, dy):
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

    def native(self, case, inputs):
        build = self.NODES.get(operators.variant(case["op"]).operator.name)
        if build is None:
            return super().native(case, inputs)
        x = inputs["x"]
        data = self.opset1.parameter(list(x.shape), np.float32)
        node, params, feed = build(self, data, case, inputs, *case["output_size"])
        request = self.core.compile_model(self.ov.Model([node], [data] + params), "CPU",
                                          self.config).create_infer_request()
        return Call(lambda x: request.infer([x] + feed)[0], x)
