"""roicore's OpenVINO conventions against OpenVINO's own ROIPooling (opset2) on the CPU.

OpenVINO has no backward and no adapter: these tests pin the core's "openvino_cpu" rules
(max and bilinear) to what ``compile_model(..., "CPU")`` computes, bit for bit, with the
f32 inference-precision hint (the default on CPUs with bf16 support is bfloat16, which is
not the op's arithmetic).  OpenVINO computes float64 models in float32, so only float32
is compared.
"""
import numpy as np
import pytest

import roicore.core as rc
from conftest import framework

ov = framework("openvino", "OpenVINO is not installed")
from openvino import opset1, opset2  # noqa: E402


def native_roi_pooling(x, rois, output_size, spatial_scale, method):
    data = opset1.parameter(list(x.shape), np.float32)
    boxes = opset1.parameter(list(rois.shape), np.float32)
    node = opset2.roi_pooling(data, boxes, output_roi=list(output_size),
                              spatial_scale=spatial_scale, method=method)
    model = ov.Model([node], [data, boxes])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled([x, rois])[0]


def _boxes(rng, H, W, scale, K):
    """Feature-pixel boxes of every awkward kind, divided back to image coordinates."""
    kinds = [
        lambda: [rng.uniform(0, W - 1), rng.uniform(0, H - 1)] * 2 + rng.uniform(0, 6, 4) * [0, 0, 1, 1],
        lambda: [rng.uniform(-W / 2, W / 2), rng.uniform(-H / 2, H / 2), rng.uniform(W / 2, 1.5 * W), rng.uniform(H / 2, 1.5 * H)],
        lambda: [W + 3.0, 1.0, 2.0 * W, H / 2],                    # outside
        lambda: [5.0, 6.0, 2.0, 3.5],                              # reversed
        lambda: list(rng.integers(0, min(H, W), 4) + 0.5),         # exact halves
        lambda: [0.0, 0.0, 56.0, 56.0],                            # rh = 57: float bins off by one
        lambda: [1.0, 1.0, 29.0, 29.0],                            # rh = 29
    ]
    b = np.array([kinds[i % len(kinds)]() for i in range(K)], np.float64) / scale
    return b


@pytest.mark.parametrize("scale", [1.0, 0.7, 1 / 16, 0.5])
@pytest.mark.parametrize("output_size", [(7, 7), (3, 2), (1, 1)])
def test_max_matches_openvino_cpu(scale, output_size):
    rng = np.random.default_rng(int(scale * 1000) + output_size[0])
    x = rng.standard_normal((2, 5, 60, 61)).astype(np.float32)
    x[0, 0, :4, :4] = np.nan  # a NaN corner: the plugin's first-element start decides it
    boxes = _boxes(rng, 60, 61, scale, 21)
    rois = np.hstack([rng.integers(0, 2, (21, 1)), boxes]).astype(np.float32)
    want = native_roi_pooling(x, rois, output_size, scale, "max")
    got = rc.roi_pool(x, rois, output_size, scale, convention="openvino_cpu")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("output_size", [(7, 7), (3, 4), (1, 1), (1, 5)])
def test_bilinear_matches_openvino_cpu(output_size):
    rng = np.random.default_rng(output_size[0] * 10 + output_size[1])
    x = rng.standard_normal((2, 4, 9, 13)).astype(np.float32)
    boxes = rng.uniform(-0.2, 1.2, (30, 4))
    boxes[:5, 2:] = boxes[:5, :2]                       # zero-size
    rois = np.hstack([rng.integers(0, 2, (30, 1)), boxes]).astype(np.float32)
    want = native_roi_pooling(x, rois, output_size, 1.0, "bilinear")
    got = rc.roi_pool(x, rois, output_size, method="bilinear", convention="openvino_cpu")
    np.testing.assert_array_equal(got, want)


def test_reference_convention_differs_from_the_plugin_only_in_known_ways():
    """The "openvino" convention is the ROIPooling-1 reference implementation; on inputs
    without halves, P=7 off-by-one bins or NaN, the plugin and the reference agree."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    rois = np.array([[0, 1, 2, 20, 17], [0, 4, 4, 30, 9], [0, 0, 0, 31, 31]], np.float32)
    np.testing.assert_array_equal(rc.roi_pool(x, rois, (2, 4), 1.0, convention="openvino"),
                                  native_roi_pooling(x, rois, (2, 4), 1.0, "max"))
