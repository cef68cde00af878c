"""`roicore parity`, run as a user would: every installed framework against roicore."""
import json
import subprocess
import sys

import numpy as np
import pytest

from cli_run import check_skips, roicore
from frameworks import framework_installed
from roicore.cli._pyramid_parity_models import MODELS
from roicore.cli.cases import PARITY_OPS, PYRAMID_OPS
from roicore.cli.frameworks import harness_class
from roicore.cli.frameworks.openvino import NOT_ALIGNED


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "report.json"
    proc = roicore("parity", "--cases", "2", "--json", str(out))
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def test_parity_short_run(parity_run):
    proc, report = parity_run
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"no framework installed: {skipped}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "conventions compared on the same inputs" in proc.stdout
    assert "bit-exact" in proc.stdout and "MISMATCH" not in proc.stdout
    assert report["ok"] is True and report["command"] == "parity"
    # every installed framework gives a row for each (operator, dtype) its adapter claims
    claims = {"paddle": {(op, dt) for op in ("roi_pool", "psroi_pool", "roi_align",
                                             "multi_scale_roi_align")
                         for dt in ("float32", "float64")},
              "mxnet": {(op, dt) for op in ("roi_pool", "psroi_pool", "roi_align",
                                            "ps_roi_align", "multi_scale_roi_align")
                        for dt in ("float32", "float64")},
              "tensorflow": {("roi_pool_bilinear", "float32"), ("roi_pool_nearest", "float32"),
                             ("multi_scale_roi_align", "float32"),
                             ("multi_scale_roi_align", "float64")},
              "openvino": {("roi_pool", "float32"), ("roi_pool_bilinear", "float32"),
                           ("psroi_pool", "float32"), ("pyramid_roi_align", "float32")},
              "onnxruntime": {("roi_pool", "float32"), ("roi_pool_bilinear", "float32"),
                              ("roi_pool_nearest", "float32"), ("roi_align", "float32"),
                              ("roi_align", "float64")},
              "torch": {(op, dt) for op in ("roi_pool", "psroi_pool", "roi_align", "ps_roi_align",
                                            "multi_scale_roi_align", "pyramid_roi_align")
                        for dt in ("float32", "float64")}}
    for fw in ran:
        rows = {(r["operator"], r["dtype"]): r for r in report["results"] if r["framework"] == fw}
        assert set(rows) == claims[fw], fw
        for r in rows.values():
            assert r["cases"] > 0 and r["bit_exact"] and r["mismatches"] == 0, r
            assert r["elements"] > 0
            if harness_class(fw).differentiable:
                assert r["grad_mismatches"] == 0 and r["grad_elements"] > 0, r
    for name in skipped:
        assert "SKIPPED" in proc.stdout and name in proc.stdout
    # the pyramid rows ran their adversarial cases (every level, degenerate boxes) too
    for r in report["results"]:
        if r["operator"] in PYRAMID_OPS:
            assert r["cases"] >= 4, r
            if r["framework"] == "openvino":
                assert NOT_ALIGNED in r["notes"], r["notes"]
            elif r["framework"] == "tensorflow":   # the Model Garden's sampler and pyramids
                assert any("read as 1" in n for n in r["notes"]), r["notes"]
                assert r["grad_elements"] > 0, r
            else:
                assert r["notes"] == [] and r["grad_elements"] > 0, r
    # training: a convolution trained through each single-map op, native and roicore's
    modes = {"paddle": ("eager", "to_static"), "mxnet": ("eager",), "torch": ("eager",),
             "tensorflow": ("eager", "tf.function", "SavedModel"), "openvino": (),
             "onnxruntime": ()}
    for fw in ran:
        rows = {(r["operator"], r["dtype"], r["mode"]): r for r in report["training"]
                if r["framework"] == fw}
        assert set(rows) == {(op, dt, m) for op, dt in claims[fw] if op not in PYRAMID_OPS
                             for m in modes[fw]}, fw
        for r in rows.values():
            assert r["ok"] and r["error"] is None and r["identical_steps"] == r["steps"] == 5, r
            assert r["loss_max_abs_diff"] == r["weight_max_abs_diff"] == 0, r
    if set(ran) - {"openvino", "onnxruntime"}:
        assert "identical steps" in proc.stdout and "bit-identical" in proc.stdout
    # models: torchvision's detectors with roicore's poolers, identical to the unchanged ones
    # (Paddle and MXNet claim multi_scale_roi_align too, and give no model rows)
    models = {r["model"]: r for r in report["models"]}
    assert set(models) == (set(MODELS) if "torch" in ran else set())
    for r in models.values():
        _model_row_is_identical(r)
    # conventions table: roicore alone, shows the known disagreements
    conv = {(c["operator"], c["dtype"], c["a"], c["b"]): c for c in report["conventions"]}
    assert conv[("roi_pool", "float64", "mxnet", "paddle")]["mismatches"] > 0   # float32 bins
    assert conv[("roi_pool", "float32", "mxnet", "paddle")]["mismatches"] == 0
    assert conv[("roi_align", "float32", "mxnet", "paddle")]["mismatches"] > 0
    assert conv[("roi_align", "float64", "mxnet", "torchvision")]["mismatches"] > 0
    assert conv[("psroi_pool", "float64", "mxnet", "paddle")]["mismatches"] == 0
    assert conv[("psroi_pool", "float32", "paddle", "torchvision")]["mismatches"] > 0   # bins
    assert report["golden"] and all(g["ok"] for g in report["golden"])
    golden = {(g["case"], g["convention"]) for g in report["golden"]}
    assert ("torchvision_bins_P2", "torchvision") in golden
    assert ("rfcn_D2_P2", "torchvision") not in golden   # R-FCN's numbers, not torchvision's
    assert ("linear_map_P2", "torchvision") in golden
    assert report["suite"]["random"] == 2 * len(PARITY_OPS)


def _model_row_is_identical(r):
    """A model row's checks: roicore's poolers ran, and the eval outputs (with detections),
    the losses and every parameter's gradient were compared and are bit-identical."""
    assert r["ok"] and r["error"] is None and r["framework"] == "torch", r
    assert r["operator"] == "multi_scale_roi_align" and r["dtype"] == "float32"
    assert r["roicore_calls"] >= (4 if r["model"].startswith("mask") else 2), r
    assert r["detections"] > 0
    for part in ("eval", "losses", "gradients"):
        assert r[part]["mismatches"] == 0 and r[part]["max_abs_diff"] == 0, r
    assert r["losses"]["elements"] == (5 if r["model"].startswith("mask") else 4)
    assert r["gradients"]["elements"] > 40_000_000   # every parameter of a ResNet-50 FPN


def test_parity_inputs_file(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 2 * 9, 20, 24)).astype(np.float32)
    boxes = rng.uniform(0, 300, (6, 4)).astype(np.float32)
    boxes[:, 2:] = boxes[:, :2] + rng.uniform(16, 120, (6, 2))
    f = tmp_path / "mine.npz"
    np.savez(f, x=x, boxes=boxes, batch_indices=np.array([1, 0, 1, 0, 0, 1]),
             spatial_scale=1 / 16, output_size=3, sampling_ratio=2, aligned=True)
    out = tmp_path / "r.json"
    proc = roicore("parity", "--inputs", str(f), "--json", str(out), "--frameworks",
                   "paddle,mxnet,tensorflow,openvino,onnxruntime,torch")
    report = json.loads(out.read_text())
    assert report["inputs"]["x_shape"] == [2, 18, 20, 24] and report["inputs"]["boxes"] == 6
    assert "rois reordered by batch index" in " ".join(report["inputs"]["notes"])
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"no framework installed: {skipped}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "native output" in proc.stdout
    assert {r["framework"] for r in report["results"]} == set(ran)
    for r in report["results"]:
        assert r["dtype"] == "float32" and r["bit_exact"], r
        d = r["details"][0]
        assert d["native_shape"] == d["roicore_shape"] and d["native_shape"][0] == 6
        assert d["native_dtype"] == d["roicore_dtype"] == "float32"
    # float64 input: frameworks that only claim float32 say why they were not compared
    np.savez(f, x=x.astype(np.float64), rois=np.hstack([np.zeros((6, 1)), boxes]),
             spatial_scale=0.0625)
    # (so nothing was compared: a failure, not an OK)
    proc = roicore("parity", "--inputs", str(f), "--json", str(out), "--frameworks", "openvino",
                   "--no-conventions")
    report = json.loads(out.read_text())
    if report["frameworks"]["openvino"]["status"] == "ran":
        assert all(r["cases"] == 0 and r["skipped"] for r in report["results"])
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert proc.stdout.strip().splitlines()[-1].startswith(
            "result: FAILED: no row compared anything")
        assert "openvino is compared in float32 only" in proc.stdout


@pytest.mark.parametrize("fault", ["paddle", "openvino:roi_pool", "onnxruntime:roi_align",
                                   "openvino:pyramid_roi_align"])
def test_parity_fails_when_an_adapter_departs(fault, tmp_path):
    fw, _, op = fault.partition(":")
    out = tmp_path / "r.json"
    proc = roicore("parity", "--cases", "0", "--frameworks", fw, "--no-conventions",
                   "--json", str(out), env={"ROICORE_PARITY_FAULT": fault})
    report = json.loads(out.read_text())
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"{fw} not installed: {skipped}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "MISMATCH" in proc.stdout and "FAILED" in proc.stdout
    bad = [r for r in report["results"] if not r["bit_exact"]]
    assert bad and all(r["framework"] == fw for r in bad)
    if op:
        assert {r["operator"] for r in bad} == {op}
    assert all(r["max_abs_diff"] > 0 for r in bad)
    # the training runs with the faulty op depart from the native ones at their first step
    trained = [r for r in report["training"] if r["framework"] == fw]
    assert all(not r["ok"] and r["identical_steps"] == 0 and r["loss_max_abs_diff"] > 0
               for r in trained), trained
    assert bool(trained) == bool(harness_class(fw).training_modes)
    if trained:
        assert "DEPARTS at step 1" in proc.stdout


def _stand_ins(directory, error, names=("paddle", "mxnet", "tensorflow", "openvino",
                                         "onnxruntime", "torch")):
    """Packages that shadow the frameworks on PYTHONPATH and raise ``error`` (a format with
    {name}) on import: "not installed", or an installation that is broken."""
    for name in names:
        (directory / name).mkdir(parents=True)
        (directory / name / "__init__.py").write_text(f"raise {error.format(name=name)}\n")
    return {"PYTHONPATH": str(directory)}


def test_parity_without_frameworks_fails_and_says_how_to_install_them(tmp_path):
    env = _stand_ins(tmp_path, "ModuleNotFoundError(\"No module named '{name}'\", name='{name}')")
    args = ("parity", "--cases", "0", "--no-conventions", "--no-training",
            "--json", str(tmp_path / "r.json"))
    proc = roicore(*args, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("result: FAILED: not installed: paddle, mxnet, tensorflow, openvino, "
                           "onnxruntime, torch") and "no row compared anything" in last, last
    for install in ('pip install "roicore[paddle]"', 'pip install "roicore[mxnet]"',
                    'pip install "roicore[tf]"', 'pip install "roicore[oracles]"',
                    'pip install "roicore[torch]" torchvision'):
        assert install in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert not report["ok"] and {i["status"] for i in report["frameworks"].values()} == {"skipped"}
    # --allow-missing forgives the missing frameworks, not an empty comparison
    proc = roicore(*args, "--allow-missing", env=env)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith("result: FAILED: no row compared anything")


def test_parity_fails_when_a_framework_is_installed_but_broken(tmp_path):
    """An import error that is not the framework's absence (a missing shared library, a
    broken roicore) is a failure with its traceback, never a skip."""
    env = _stand_ins(tmp_path, "ImportError('libfoo.so: cannot open shared object file')",
                     names=("tensorflow",))
    proc = roicore("parity", "--frameworks", "tensorflow", "--cases", "0", "--no-conventions",
                   env=env)
    assert proc.returncode == 1
    assert "tensorflow: FAILED: ImportError: libfoo.so: cannot open shared object file" in \
        proc.stdout, proc.stdout
    assert "result: FAILED: tensorflow failed" in proc.stdout


def test_parity_ok_names_what_it_compared(tmp_path):
    proc = roicore("parity", "--frameworks", "torch", "--ops", "roi_align", "--dtypes", "float32",
                   "--cases", "0", "--no-conventions", "--no-training")
    if "NOT INSTALLED" in proc.stdout:
        framework_installed("torch", "the parity row needs torch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith(
        "result: OK, 1 row(s) compared; every adapter is bit-identical to its native op")


def test_pyramid_rows_and_models_fail_when_the_adapter_departs(tmp_path):
    """roicore's MultiScaleRoIAlign one ulp (rows) or 2**-20 (models) off: its rows and both
    model rows are reported as departing, while roicore.core's pyramid rows stay exact."""
    out = tmp_path / "r.json"
    proc = roicore("parity", "--frameworks", "torch", "--ops",
                   "multi_scale_roi_align,pyramid_roi_align", "--cases", "0", "--no-conventions",
                   "--json", str(out), env={"ROICORE_PARITY_FAULT": "torch:multi_scale_roi_align"})
    report = json.loads(out.read_text())
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"torch not installed: {skipped}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    rows = {(r["operator"], r["dtype"]): r for r in report["results"]}
    assert set(rows) == {(op, dt) for op in PYRAMID_OPS for dt in ("float32", "float64")}
    for (op, dt), r in rows.items():
        assert r["bit_exact"] == (op == "pyramid_roi_align"), r
        assert r["cases"] >= 4 and r["grad_mismatches"] == 0, r
    assert report["training"] == []
    assert {r["model"] for r in report["models"]} == set(MODELS)
    for r in report["models"]:
        assert not r["ok"] and r["error"] is None and r["roicore_calls"] > 0, r
        assert r["eval"]["mismatches"] > 0 and r["gradients"]["mismatches"] > 0, r
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("result: FAILED: 4 row(s) depart from their native op"), last
    assert proc.stdout.count("MISMATCH") == 4   # two rows and two models


def test_paddle_and_mxnet_pyramid_rows_fail_when_their_adapters_depart(tmp_path):
    """multilevel_roi_align and pyramid_roi_feats one ulp off: the multi_scale_roi_align rows
    of Paddle and MXNet depart, in both dtypes, and neither gives a model row (the detectors
    are torchvision's)."""
    out = tmp_path / "r.json"
    fault = "paddle:multi_scale_roi_align,mxnet:multi_scale_roi_align"
    proc = roicore("parity", "--frameworks", "paddle,mxnet", "--ops", "multi_scale_roi_align",
                   "--cases", "0", "--no-conventions", "--json", str(out),
                   env={"ROICORE_PARITY_FAULT": fault})
    report = json.loads(out.read_text())
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"paddle and mxnet not installed: {skipped}")
    assert proc.returncode == 1, proc.stdout[-3000:]
    rows = {(r["framework"], r["dtype"]): r for r in report["results"]}
    assert set(rows) == {(fw, dt) for fw in ran for dt in ("float32", "float64")}
    for r in rows.values():
        assert r["operator"] == "multi_scale_roi_align" and not r["bit_exact"], r
        assert r["cases"] >= 4 and r["max_abs_diff"] > 0, r
        assert r["grad_elements"] > 0 and r["grad_mismatches"] == 0, r   # forward only
        assert len(r["mismatching_cases"]) == r["cases"], r
    assert report["training"] == [] and report["models"] == []
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"result: FAILED: {len(rows)} row(s) depart from their native op")
    assert proc.stdout.count("MISMATCH") == len(rows)


# Each level rule of roicore.core against torchvision's MultiScaleRoIAlign on the pyramid
# cases: the mismatching elements of each, forward, float32 and float64.
TORCH_LEVELS = """if 1:
    import json
    import numpy as np
    import roicore.core as rc
    from roicore.cli import cases
    from roicore.cli.frameworks import harness_class
    from roicore.core.conventions import LEVELS
    h = harness_class("torch")(1)
    mismatches, compared = dict.fromkeys(LEVELS, 0), 0
    for c in cases.suite(["pyramid_roi_align"], 4, 0):
        for dtype in ("float32", "float64"):
            inputs = h.inputs(c, dtype, None)
            y = h.to_numpy(h.forward(h.native(c, inputs)))
            compared += 1
            maps = [m.numpy() for m in inputs["x"]]
            for levels in LEVELS:
                mine = rc.pyramid_roi_align(maps, inputs["rois"].numpy(), c["output_size"],
                                            c["spatial_scales"], c["sampling_ratio"],
                                            canonical_level=4, canonical_size=224.0,
                                            levels=levels, convention="torchvision")
                mismatches[levels] += cases.compare(mine, y)[1]
    print(json.dumps(dict(compared=compared, mismatches=mismatches)))
"""


def test_pyramid_row_has_the_one_level_rule_that_holds():
    """The pyramid cases tell the frameworks' level rules apart (the epsilon's place, the
    pixel offset, reversed boxes), so only torchvision's gives torchvision's numbers."""
    framework_installed("torch", "the check runs torchvision")
    proc = subprocess.run([sys.executable, "-c", TORCH_LEVELS], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["compared"] >= 16, got
    assert [lv for lv, m in got["mismatches"].items() if m == 0] == ["torchvision"], got


def test_parity_inputs_file_has_no_pyramid(tmp_path):
    """A saved feature map is one map: the pyramid operators, when asked for, are skipped
    with a note, and nothing compared is a failure."""
    f = tmp_path / "mine.npz"
    np.savez(f, x=np.ones((1, 2, 8, 8), np.float32), rois=np.array([[0, 0, 0, 4, 4.0]]))
    proc = roicore("parity", "--inputs", str(f), "--ops", "pyramid_roi_align", "--frameworks",
                   "torch", "--no-conventions")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pyramid_roi_align skipped" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith(
        "result: FAILED: no row compared anything")
