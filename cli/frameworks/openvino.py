"""OpenVINO: its CPU plugin's ROIPooling / ROIAlign-9 / PSROIPooling, one-node models.

roicore has no OpenVINO adapter; what parity compares with the plugin is roicore.core
under the convention that reproduces it, "openvino_cpu".  The plugin runs forward only.
"""
from __future__ import annotations

import numpy as np

from . import F32, Call, float32_arrays
from . import Harness as Base


class Harness(Base):
    name = "openvino"
    parity_claims = {"roi_pool": (F32,), "roi_pool_bilinear": (F32,)}
    differentiable = False
    has_adapter = False
    native_text = ("CPU plugin ROIPooling (max and bilinear) / ROIAlign-9 / PSROIPooling, "
                   "INFERENCE_PRECISION_HINT f32")
    parity_text = "OpenVINO CPU ROIPooling (f32 hint) vs roicore.core convention 'openvino_cpu'"

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

    def inputs(self, case, dtype, dy):
        return float32_arrays(case, dtype, "OpenVINO's CPU plugin")

    def native(self, case, inputs):
        o1, op = self.opset1, case["op"]
        PH, PW = case["output_size"]
        s = case["spatial_scale"]
        x = inputs["x"]
        data = o1.parameter(list(x.shape), np.float32)
        if op == "roi_align":
            r = o1.parameter(list(inputs["boxes"].shape), np.float32)
            bi = o1.parameter(list(inputs["batch"].shape), np.int32)
            mode = "half_pixel_for_nn" if case["aligned"] else "asymmetric"
            node = self.opset9.roi_align(data, r, bi, PH, PW, case["sampling_ratio"], s, "avg",
                                         mode)
            params, feed = [data, r, bi], [inputs["boxes"], inputs["batch"]]
        else:
            r = o1.parameter(list(inputs["rois"].shape), np.float32)
            if op in ("roi_pool", "roi_pool_bilinear"):
                method = "bilinear" if op == "roi_pool_bilinear" else "max"
                node = self.opset2.roi_pooling(data, r, output_roi=[PH, PW], spatial_scale=s,
                                               method=method)
            elif op == "psroi_pool":
                node = o1.psroi_pooling(data, r, x.shape[1] // (PH * PW), PH, s, 1, 1, "average")
            else:
                return super().native(case, inputs)
            params, feed = [data, r], [inputs["rois"]]
        request = self.core.compile_model(self.ov.Model([node], params), "CPU",
                                          self.config).create_infer_request()
        return Call(lambda x: request.infer([x] + feed)[0], x)

    def roicore(self, case, inputs, layout="NCHW"):
        op = case["op"]
        if op not in ("roi_pool", "roi_pool_bilinear"):
            return super().roicore(case, inputs)
        method = "bilinear" if op == "roi_pool_bilinear" else "max"
        rois, size, s = inputs["rois"], case["output_size"], case["spatial_scale"]
        return Call(lambda x: self.rc.roi_pool(x, rois, size, s, method=method,
                                               convention="openvino_cpu"), inputs["x"])
