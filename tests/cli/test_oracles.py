"""OpenVINO's and ONNX Runtime's RoI operators as oracles: roicore has no adapter for either,
and `roicore parity` compares each of their ops that a roicore.core convention reproduces with
that convention, forward only."""
import json
import subprocess
import sys

import pytest

from cli_run import check_skips, roicore
from frameworks import framework_installed

# (framework, operator, dtype) -> the roicore.core convention its parity row compares with
ROWS = {("openvino", "roi_pool", "float32"): "openvino_cpu",
        ("openvino", "roi_pool_bilinear", "float32"): "openvino_cpu",
        ("openvino", "psroi_pool", "float32"): "mxnet",
        ("onnxruntime", "roi_pool", "float32"): "openvino",
        ("onnxruntime", "roi_pool_bilinear", "float32"): "openvino",
        ("onnxruntime", "roi_pool_nearest", "float32"): "openvino",
        ("onnxruntime", "roi_align", "float32"): "mxnet",
        ("onnxruntime", "roi_align", "float64"): "mxnet"}


def test_every_oracle_row_is_bit_exact_with_its_convention(tmp_path):
    out = tmp_path / "r.json"
    proc = roicore("parity", "--frameworks", "openvino,onnxruntime", "--no-conventions",
                   "--json", str(out))
    report = json.loads(out.read_text())
    ran, _ = check_skips(report["frameworks"])
    if not ran:
        pytest.skip("neither OpenVINO nor ONNX Runtime is installed")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {(r["framework"], r["operator"], r["dtype"]): r for r in report["results"]}
    assert {k: r["convention"] for k, r in rows.items()} == \
        {k: c for k, c in ROWS.items() if k[0] in ran}
    # the table's rows by their first four columns: the verdict each ends with
    verdicts = {tuple(line.split()[:4]): line.split()[-1] for line in proc.stdout.splitlines()
                if line.strip()}
    for (fw, op, dt), r in rows.items():
        assert r["bit_exact"] and r["mismatches"] == 0 and r["cases"] > 0 and r["elements"] > 0, r
        # the native op ran on every case: a native error would leave its case uncompared
        assert r["native_errors"] == r["both_errors"] == 0, r["notes"]
        assert r["grad_elements"] is None   # forward only
        # the table names the convention beside the framework
        assert verdicts.get((op, fw, f"({ROWS[fw, op, dt]})", dt)) == "bit-exact", proc.stdout


# ONNX Runtime's and OpenVINO's MaxRoiPool / ROIPooling on NaN, infinities and values below
# -FLT_MAX, where the max-pool conventions part: the numbers of mismatching elements of each
# convention against the native op, and the convention the harness compares it with.
NON_FINITE = """if 1:
    import json, sys
    import numpy as np
    from roicore.cli import cases
    from roicore.cli.frameworks import harness_class
    from roicore.core import operators
    h = harness_class(sys.argv[1])(1)
    x = np.random.default_rng(3).standard_normal((1, 2, 12, 12))
    x[0, 0, 2:5, 2:5] = np.nan
    x[0, 0, 8, 8] = np.inf
    x[0, 1, :6, :6] = -np.inf
    x[0, 1, 7:, 7:] = -3e38
    boxes = [[0, 0, 0, 11, 11], [0, 1, 1, 4, 4], [0, 2, 2, 3, 3], [0, 6, 6, 11, 11],
             [0, 0, 0, 5, 5]]
    c = cases._case("non_finite", "oracle", "roi_pool", x, boxes, 3)
    inputs = h.inputs(c, "float32", None)
    y = h.forward(h.native(c, inputs))
    v = operators.variant("roi_pool")
    mismatches = {conv: cases.compare(v.forward(inputs["x"], inputs["rois"], 3, 1.0,
                                                convention=conv)[0], y)[1]
                  for conv in v.conventions}
    print(json.dumps(dict(mismatches=mismatches, compared=h.conventions["roi_pool"])))
"""


@pytest.mark.parametrize("framework", ["onnxruntime", "openvino"])
def test_max_pool_row_has_the_one_convention_that_holds_on_non_finite_data(framework):
    """On finite data several conventions give the native op's numbers; the row's must also
    hold where they part."""
    framework_installed(framework, f"the check runs {framework}")
    proc = subprocess.run([sys.executable, "-c", NON_FINITE, framework], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [c for c, m in got["mismatches"].items() if m == 0] == [got["compared"]], got


# ONNX Runtime's RoiAlign-10 (output_half_pixel only) on the parity suite's unaligned cases:
# the number of cases compared, and the mismatching elements against roicore's convention
OPSET_10 = """if 1:
    import json
    from roicore.cli import cases
    from roicore.cli.frameworks import harness_class
    h = harness_class("onnxruntime")(1)
    h.opset = 10
    compared = mismatches = 0
    for c in cases.suite(["roi_align"], 12, 0):
        if c["aligned"]:
            continue
        c, _ = h.restrict(c)
        for dtype in h.parity_claims["roi_align"]:
            inputs = h.inputs(c, dtype, None)
            y = h.forward(h.native(c, inputs))
            mismatches += cases.compare(h.forward(h.roicore(c, inputs)), y)[1]
            compared += 1
    print(json.dumps(dict(compared=compared, mismatches=mismatches)))
"""


def test_roi_align_opset_10_is_bit_exact_with_the_same_convention():
    framework_installed("onnxruntime", "the check runs ONNX Runtime")
    proc = subprocess.run([sys.executable, "-c", OPSET_10], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["compared"] > 20 and got["mismatches"] == 0, got
