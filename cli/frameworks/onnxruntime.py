"""ONNX Runtime: MaxRoiPool and RoiAlign (opset 16) on its CPU execution provider, one-node
models, forward only.  roicore has no counterpart to compare with bit for bit."""
from __future__ import annotations

import numpy as np

from . import Call, float32_arrays
from . import Harness as Base


class Harness(Base):
    name = "onnxruntime"
    differentiable = False
    has_adapter = False
    native_text = "CPUExecutionProvider MaxRoiPool / RoiAlign (opset 16)"

    def __init__(self, threads=None):
        super().__init__(threads)
        import onnx  # noqa: F401  (builds the one-node models)
        import onnxruntime as ort
        self.ort = ort
        self.options = ort.SessionOptions()
        if threads:
            self.options.intra_op_num_threads = threads
            self.options.inter_op_num_threads = 1
        self.version = ort.__version__

    def inputs(self, case, dtype, dy):
        inputs = float32_arrays(case, dtype, "ONNX Runtime")
        inputs["batch"] = inputs["batch"].astype(np.int64)
        return inputs

    def native(self, case, inputs):
        from onnx import TensorProto, helper
        op, x = case["op"], inputs["x"]
        PH, PW = case["output_size"]
        s = float(case["spatial_scale"])
        X = helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))
        Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
        if op == "roi_pool":
            R = helper.make_tensor_value_info("rois", TensorProto.FLOAT, list(inputs["rois"].shape))
            node = helper.make_node("MaxRoiPool", ["X", "rois"], ["Y"], pooled_shape=[PH, PW],
                                    spatial_scale=s)
            declared, feed = [X, R], {"rois": inputs["rois"]}
        elif op == "roi_align":
            K = len(inputs["boxes"])
            R = helper.make_tensor_value_info("rois", TensorProto.FLOAT, [K, 4])
            B = helper.make_tensor_value_info("bi", TensorProto.INT64, [K])
            mode = "half_pixel" if case["aligned"] else "output_half_pixel"
            node = helper.make_node("RoiAlign", ["X", "rois", "bi"], ["Y"], mode="avg",
                                    output_height=PH, output_width=PW,
                                    sampling_ratio=case["sampling_ratio"], spatial_scale=s,
                                    coordinate_transformation_mode=mode)
            declared, feed = [X, R, B], {"rois": inputs["boxes"], "bi": inputs["batch"]}
        else:
            return super().native(case, inputs)
        graph = helper.make_graph([node], "roi", declared, [Y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
        model.ir_version = 8
        session = self.ort.InferenceSession(model.SerializeToString(), self.options,
                                            providers=["CPUExecutionProvider"])
        return Call(lambda x: session.run(None, dict(feed, X=x))[0], x)
