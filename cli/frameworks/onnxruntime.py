"""ONNX Runtime: MaxRoiPool and RoiAlign (opset 16) on its CPU execution provider, one-node
models, forward only.  roicore has no counterpart to compare with bit for bit."""
from __future__ import annotations

import numpy as np

from . import Call, float32_arrays
from . import Harness as Base


class Harness(Base):
    name = "onnxruntime"
    requires = ("onnxruntime", "onnx")
    install = 'pip install "roicore[oracles]"'
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

    # each operator's one-node graph: (node, declared inputs besides X, their values)
    @staticmethod
    def _max_roi_pool(helper, tp, case, inputs, PH, PW):
        R = helper.make_tensor_value_info("rois", tp.FLOAT, list(inputs["rois"].shape))
        node = helper.make_node("MaxRoiPool", ["X", "rois"], ["Y"], pooled_shape=[PH, PW],
                                spatial_scale=float(case["spatial_scale"]))
        return node, [R], {"rois": inputs["rois"]}

    @staticmethod
    def _roi_align(helper, tp, case, inputs, PH, PW):
        K = len(inputs["boxes"])
        R = helper.make_tensor_value_info("rois", tp.FLOAT, [K, 4])
        B = helper.make_tensor_value_info("bi", tp.INT64, [K])
        mode = "half_pixel" if case["aligned"] else "output_half_pixel"
        node = helper.make_node("RoiAlign", ["X", "rois", "bi"], ["Y"], mode="avg",
                                output_height=PH, output_width=PW,
                                sampling_ratio=case["sampling_ratio"],
                                spatial_scale=float(case["spatial_scale"]),
                                coordinate_transformation_mode=mode)
        return node, [R, B], {"rois": inputs["boxes"], "bi": inputs["batch"]}

    NODES = {"roi_pool": _max_roi_pool, "roi_align": _roi_align}

    def native(self, case, inputs):
        from onnx import TensorProto, helper
        build = self.NODES.get(case["op"])
        if build is None:
            return super().native(case, inputs)
        x = inputs["x"]
        X = helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))
        Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
        node, declared, feed = build.__func__(helper, TensorProto, case, inputs,
                                              *case["output_size"])
        graph = helper.make_graph([node], "roi", [X] + declared, [Y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
        model.ir_version = 8
        session = self.ort.InferenceSession(model.SerializeToString(), self.options,
                                            providers=["CPUExecutionProvider"])
        return Call(lambda x: session.run(None, dict(feed, X=x))[0], x)
