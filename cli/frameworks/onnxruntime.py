"""ONNX Runtime: MaxRoiPool, RoiAlign (opset 16) and the contrib com.microsoft.CropAndResize
on its CPU execution provider, one-node models, forward only.

roicore has no ONNX Runtime adapter; what parity compares with each op is roicore.core under
the convention that gives its bits (:attr:`Harness.conventions`).
"""
from __future__ import annotations

import numpy as np

from . import F32, F64, Call, Unsupported, arrays, conventions_text, keep_boxes
from . import Harness as Base


def _no_negative_grid(case):
    """ORT sizes RoiAlign's table of samples by the product of the two adaptive grid counts,
    ceil(size / bins) per axis, and raises an integer overflow when that product is negative:
    an aligned box reversed by a bin or more along one axis and not the other."""
    if not case["aligned"] or case["sampling_ratio"] > 0:
        return case, None
    r, (PH, PW) = case["rois"], case["output_size"]
    ok = np.ones(len(r), bool)
    for dt in (np.float32, np.float64):   # the counts as ORT computes them, in both dtypes
        rr, s, half = r.astype(dt), dt(np.float32(case["spatial_scale"])), dt(0.5)
        gw = np.ceil(((rr[:, 3] * s - half) - (rr[:, 1] * s - half)) / dt(PW))
        gh = np.ceil(((rr[:, 4] * s - half) - (rr[:, 2] * s - half)) / dt(PH))
        ok &= gw * gh >= 0
    return keep_boxes(case, ok, "aligned RoiAlign box whose adaptive grid has one negative "
                                "side overflows ONNX Runtime's sample table")


class Harness(Base):
    name = "onnxruntime"
    requires = ("onnxruntime", "onnx")
    install = 'pip install "roicore[oracles]"'
    # ORT holds spatial_scale as a float attribute, as these conventions do (in float64 too)
    conventions = {"roi_pool": "openvino", "roi_pool_bilinear": "openvino",
                   "roi_pool_nearest": "openvino", "roi_align": "mxnet"}
    # the dtypes ORT's CPU kernels take, each computing in its input's dtype
    parity_claims = {"roi_pool": (F32,), "roi_pool_bilinear": (F32,),
                     "roi_pool_nearest": (F32,), "roi_align": (F32, F64)}
    # the models' ONNX opset: RoiAlign-10 computes output_half_pixel (aligned=False) only,
    # RoiAlign-16 also half_pixel (aligned=True)
    opset = 16
    differentiable = False
    has_adapter = False
    native_text = ("CPUExecutionProvider MaxRoiPool / RoiAlign (opset 16) / "
                   "com.microsoft.CropAndResize")
    parity_text = ("ONNX Runtime CPU MaxRoiPool / RoiAlign (opset 16) / CropAndResize vs "
                   + conventions_text(conventions))

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

    def restrict(self, case):
        return _no_negative_grid(case) if case["op"] == "roi_align" else (case, None)

    def inputs(self, case, dtype, dy):
        return arrays(case, dtype)

    # each operator's one-node graph for X of ONNX element type tp: (node, declared inputs
    # besides X, their values)
    def _max_roi_pool(self, helper, tp, case, inputs, PH, PW):
        R = helper.make_tensor_value_info("rois", tp, list(inputs["rois"].shape))
        node = helper.make_node("MaxRoiPool", ["X", "rois"], ["Y"], pooled_shape=[PH, PW],
                                spatial_scale=float(case["spatial_scale"]))
        return node, [R], {"rois": inputs["rois"]}

    def _roi_align(self, helper, tp, case, inputs, PH, PW):
        from onnx import TensorProto
        K = len(inputs["boxes"])
        R = helper.make_tensor_value_info("rois", tp, [K, 4])
        B = helper.make_tensor_value_info("bi", TensorProto.INT64, [K])
        modes = {}
        if self.opset >= 16:
            modes["coordinate_transformation_mode"] = ("half_pixel" if case["aligned"]
                                                       else "output_half_pixel")
        elif case["aligned"]:
            raise Unsupported(f"RoiAlign-{self.opset} has no half_pixel (aligned) mode")
        # ORT takes 0 for adaptive sampling; roicore takes -1 or 0
        node = helper.make_node("RoiAlign", ["X", "rois", "bi"], ["Y"], mode="avg",
                                output_height=PH, output_width=PW,
                                sampling_ratio=max(case["sampling_ratio"], 0),
                                spatial_scale=float(case["spatial_scale"]), **modes)
        return node, [R, B], {"rois": inputs["boxes"], "bi": inputs["batch"].astype(np.int64)}

    def _crop_and_resize(self, helper, tp, case, inputs, PH, PW):
        from onnx import TensorProto
        from roicore.core import operators
        K = len(inputs["boxes"])
        R = helper.make_tensor_value_info("rois", tp, [K, 4])
        B = helper.make_tensor_value_info("bi", TensorProto.INT32, [K])
        S = helper.make_tensor_value_info("size", TensorProto.INT32, [2])
        node = helper.make_node("CropAndResize", ["X", "rois", "bi", "size"], ["Y"],
                                domain="com.microsoft",
                                mode=operators.variant(case["op"]).method.name)
        # its boxes are [y1, x1, y2, x2], as TensorFlow's
        boxes = np.ascontiguousarray(inputs["boxes"][:, [1, 0, 3, 2]])
        return node, [R, B, S], {"rois": boxes, "bi": inputs["batch"],
                                 "size": np.array([PH, PW], np.int32)}

    NODES = {"roi_pool": _max_roi_pool, "roi_align": _roi_align,
             "roi_pool_bilinear": _crop_and_resize, "roi_pool_nearest": _crop_and_resize}

    def native(self, case, inputs):
        from onnx import helper
        build = self.NODES.get(case["op"])
        if build is None:
            return super().native(case, inputs)
        x = inputs["x"]
        if x.dtype.name not in self.parity_claims[case["op"]]:
            raise Unsupported(f"ONNX Runtime's CPU {case['op']} takes "
                              f"{'/'.join(self.parity_claims[case['op']])} only")
        tp = helper.np_dtype_to_tensor_dtype(x.dtype)
        X = helper.make_tensor_value_info("X", tp, list(x.shape))
        Y = helper.make_tensor_value_info("Y", tp, None)
        node, declared, feed = build(self, helper, tp, case, inputs, *case["output_size"])
        graph = helper.make_graph([node], "roi", [X] + declared, [Y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset),
                                                        helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = 8
        session = self.ort.InferenceSession(model.SerializeToString(), self.options,
                                            providers=["CPUExecutionProvider"])
        return Call(lambda x: session.run(None, dict(feed, X=x))[0], x)
