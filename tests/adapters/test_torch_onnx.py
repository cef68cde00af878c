"""ONNX export of the torch adapter, with both of torch's exporters, run in ONNX Runtime.

A model (a convolution, then the pool) is exported in this process and run by ONNX Runtime
in a fresh process that imports neither torch nor roicore, so the file stands alone.
roi_align and roi_pool become standard ONNX nodes that ONNX Runtime computes with the
adapter's bits (float32, and float64 where the scale is a float32); the position-sensitive
ops become nodes of the roicore domain.
"""
import json
import pathlib
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from conftest import framework
from frameworks import framework_installed

torch = framework("torch", "the ONNX export tests need torch")
onnx = framework("onnx", "the ONNX export tests need onnx")
framework("onnxscript", "torch.onnx.export(dynamo=True) needs onnxscript")
framework_installed("onnxruntime", "the exported models run in ONNX Runtime")

from roicore.adapters import _torch_onnx  # noqa: E402
from roicore.adapters import torch as rt  # noqa: E402

EXPORTERS = {"torchscript": False, "dynamo": True}


class Head(torch.nn.Module):
    """A convolution's output pooled by one of the adapter's modules (float64: the image
    itself, ONNX Runtime has no float64 convolution)."""

    def __init__(self, pool, dtype=torch.float32):
        super().__init__()
        self.conv = (torch.nn.Conv2d(3, 8, 3, padding=1) if dtype == torch.float32
                     else torch.nn.Identity())
        self.pool = pool

    def forward(self, image, boxes):
        features = self.conv(image)
        return features, self.pool(features, boxes)


def _inputs(dtype, n_boxes=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    image = torch.rand(2, 3, 24, 32, generator=g, dtype=dtype)
    lo = torch.rand(n_boxes, 2, generator=g, dtype=dtype) * 90 - 8
    size = torch.rand(n_boxes, 2, generator=g, dtype=dtype) * 60
    batch = torch.randint(0, 2, (n_boxes, 1), generator=g).to(dtype)
    return image, torch.cat([batch, lo, lo + size], dim=1)


def _export(model, inputs, path, exporter, opset=None, **kwargs):
    dynamo = EXPORTERS[exporter]
    opset = opset or (18 if dynamo else 16)
    with warnings.catch_warnings():
        # the TorchScript-based exporter announces its own deprecation
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
        torch.onnx.export(model, inputs, str(path), dynamo=dynamo, opset_version=opset,
                          input_names=["image", "boxes"], output_names=["features", "pooled"],
                          **kwargs)
    return onnx.load(str(path))


_RUN = textwrap.dedent("""\
    import json, sys
    import numpy as np
    import onnxruntime as ort
    assert "torch" not in sys.modules and "roicore" not in sys.modules
    results = {}
    for model, inputs, output in json.loads(sys.argv[1]):
        session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
        feeds = {name: np.load(path) for name, path in inputs.items()}
        np.savez(output, *session.run(None, feeds))
    """)


def _run_in_ort(jobs):
    """Run each (model file, {input name: array}) in one fresh ONNX Runtime process; each
    one's outputs, in order."""
    work = pathlib.Path(jobs[0][0]).parent
    spec = []
    for j, (model, feeds) in enumerate(jobs):
        paths = {}
        for name, array in feeds.items():
            paths[name] = str(work / f"{j}-{name}.npy")
            np.save(paths[name], array)
        spec.append((str(model), paths, str(work / f"{j}-out.npz")))
    proc = subprocess.run([sys.executable, "-c", _RUN, json.dumps(spec)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = [np.load(out) for _, _, out in spec]
    return [[o[f"arr_{i}"] for i in range(len(o.files))] for o in outputs]


def _node_types(model):
    return [n.op_type for n in model.graph.node]


CASES = [  # (module, dtype, opset of the TorchScript-based export)
    (lambda: rt.RoIAlign((7, 6), 1 / 4, sampling_ratio=-1, aligned=True), torch.float32, 16),
    (lambda: rt.RoIAlign((5, 5), 0.7, sampling_ratio=2, aligned=False), torch.float32, 16),
    (lambda: rt.RoIAlign(3, 0.3, sampling_ratio=0, aligned=False), torch.float32, 10),
    (lambda: rt.RoIAlign((4, 3), 1 / 8, sampling_ratio=-1, aligned=True), torch.float64, 16),
    (lambda: rt.RoIAlign((4, 3), 0.5, sampling_ratio=3, aligned=False), torch.float64, 11),
    (lambda: rt.RoIPool((7, 6), 0.7), torch.float32, 11),
    (lambda: rt.RoIPool(3, 1 / 4), torch.float32, 16),
]


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_exported_models_run_bit_exact_in_onnxruntime(exporter, tmp_path):
    jobs, models = [], []
    for i, (make, dtype, opset) in enumerate(CASES):
        torch.manual_seed(i)
        model = Head(make(), dtype).eval()
        image, boxes = _inputs(dtype, seed=i)
        path = tmp_path / f"{i}.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("error", _torch_onnx.OnnxExportWarning)
            exported = _export(model, (image, boxes), path, exporter,
                               opset=None if EXPORTERS[exporter] else opset)
        op_type = "RoiAlign" if isinstance(model.pool, rt.RoIAlign) else "MaxRoiPool"
        assert op_type in _node_types(exported)
        assert not [n for n in exported.graph.node if n.domain == _torch_onnx.DOMAIN]
        jobs.append((path, {"image": image.numpy(), "boxes": boxes.numpy()}))
        models.append((model, boxes))
    for i, ((features, got), (model, boxes)) in enumerate(zip(_run_in_ort(jobs), models)):
        # ONNX Runtime's convolution is its own: the pool is compared on its features
        with torch.no_grad():
            want = model.pool(torch.from_numpy(features), boxes).numpy()
        assert got.dtype == want.dtype and got.shape == want.shape, i
        np.testing.assert_array_equal(got, want, err_msg=f"case {i}")


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_float64_scale_that_is_not_a_float32_warns_and_differs(exporter, tmp_path):
    model = Head(rt.RoIAlign((4, 4), 0.2, sampling_ratio=2), torch.float64).eval()
    image, boxes = _inputs(torch.float64)
    with pytest.warns(_torch_onnx.OnnxExportWarning, match="0.2 .*last bits"):
        _export(model, (image, boxes), tmp_path / "m.onnx", exporter)
    (_, got), = _run_in_ort([(tmp_path / "m.onnx", {"image": image.numpy(),
                                                     "boxes": boxes.numpy()})])
    with torch.no_grad():
        want = model(image, boxes)[1].numpy()
    # the warning is not idle: the rounded scale moves some samples
    assert (got != want).any() and np.allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_float64_roi_pool_warns_that_onnxruntime_cannot_run_it(exporter, tmp_path):
    model = Head(rt.RoIPool(2, 0.5), torch.float64).eval()
    with pytest.warns(_torch_onnx.OnnxExportWarning, match="no float64 kernel"):
        exported = _export(model, _inputs(torch.float64), tmp_path / "m.onnx", exporter)
    assert "MaxRoiPool" in _node_types(exported)


def test_aligned_roi_align_needs_opset_16(tmp_path):
    model = Head(rt.RoIAlign(2, 0.5, sampling_ratio=2, aligned=True)).eval()
    with pytest.raises(torch.onnx.errors.UnsupportedOperatorError, match="version 16"):
        _export(model, _inputs(torch.float32), tmp_path / "m.onnx", "torchscript", opset=15)


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("op", ["PSRoIPool", "PSRoIAlign"])
def test_position_sensitive_ops_export_to_the_roicore_domain(exporter, op, tmp_path):
    pool = rt.PSRoIPool((2, 2), 0.7) if op == "PSRoIPool" else rt.PSRoIAlign((2, 2), 0.7, 3)
    model = Head(pool).eval()
    exported = _export(model, _inputs(torch.float32), tmp_path / "m.onnx", exporter)
    node, = [n for n in exported.graph.node if n.domain == _torch_onnx.DOMAIN]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    want = {"pooled_height": 2, "pooled_width": 2, "convention": b"torchvision"}
    if op == "PSRoIAlign":
        want["sampling_ratio"] = 3
    assert node.op_type == op and {k: attrs[k] for k in want} == want
    assert attrs["spatial_scale"] == pytest.approx(0.7)
    assert {o.domain: o.version for o in exported.opset_import}[_torch_onnx.DOMAIN] == 1
    out_shape = [d.dim_value or None for d in exported.graph.output[1].type.tensor_type.shape.dim]
    assert out_shape[1:] == [2, 2, 2]  # 8 channels over 2x2 cells: 2 output channels


class _Pyramid(torch.nn.Module):
    """Two FPN levels of one image pooled by a MultiScaleRoIAlign (ours or torchvision's)."""

    def __init__(self, pooler):
        super().__init__()
        self.pooler = pooler

    def forward(self, p2, p3, boxes):
        return self.pooler({"p2": p2, "p3": p3}, [boxes], [(64, 96)])


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_multi_scale_roi_align_exports_torchvision_s_graph(exporter, tmp_path):
    """ONNX has no pyramid operator: the module exports torchvision's graph (levels on
    tensors, RoiAlign per level, a scatter), which ONNX Runtime runs with the numbers of
    torchvision's own exported module and of the module in torch."""
    ops = framework("torchvision.ops", "the comparison needs torchvision")
    g = torch.Generator().manual_seed(5)
    p2, p3 = torch.rand(1, 4, 16, 24, generator=g), torch.rand(1, 4, 8, 12, generator=g)
    lo = torch.rand(30, 2, generator=g) * 80 - 8
    boxes = torch.cat([lo, lo + torch.rand(30, 2, generator=g) * 300 + 1], 1)
    jobs, ours = [], None
    for name, pooler in (("roicore", rt.MultiScaleRoIAlign(["p2", "p3"], 5, 2)),
                         ("torchvision", ops.MultiScaleRoIAlign(["p2", "p3"], 5, 2))):
        model = _Pyramid(pooler).eval()
        path = tmp_path / f"{name}.onnx"
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(model, (p2, p3, boxes), str(path), dynamo=EXPORTERS[exporter],
                              opset_version=18 if EXPORTERS[exporter] else 16,
                              input_names=["p2", "p3", "boxes"], output_names=["pooled"])
        if name == "roicore":
            assert _node_types(onnx.load(str(path))).count("RoiAlign") == 2
            with torch.no_grad():
                ours = model(p2, p3, boxes).numpy()
            assert set(pooler.map_levels([boxes]).tolist()) == {0, 1}   # both levels pool
        jobs.append((path, {"p2": p2.numpy(), "p3": p3.numpy(), "boxes": boxes.numpy()}))
    (got,), (theirs,) = _run_in_ort(jobs)
    np.testing.assert_array_equal(got, theirs)
    np.testing.assert_array_equal(got, ours)
