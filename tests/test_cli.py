"""`roicore parity` and `roicore bench`, run as a user would: in a subprocess.

Frameworks are optional locally and required in CI, as in tests/adapters/conftest.py: with
ROICORE_REQUIRE_FRAMEWORKS=1 a framework the report lists as skipped fails the test.
"""
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REQUIRE = os.environ.get("ROICORE_REQUIRE_FRAMEWORKS", "") not in ("", "0")
PARITY_FRAMEWORKS = ("paddle", "mxnet", "tensorflow", "openvino")
BENCH_FRAMEWORKS = ("paddle", "mxnet", "openvino", "onnxruntime", "tensorflow")


def roicore(*args, env=None, timeout=300):
    """Run ``python -m roicore.cli ARGS``; the CompletedProcess."""
    e = dict(os.environ)
    e.pop("ROICORE_PARITY_FAULT", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "roicore.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=e)


def check_skips(frameworks_info):
    """The frameworks that ran; a skipped one skips the test (fails in CI) with its reason."""
    skipped = {n: i["reason"] for n, i in frameworks_info.items() if i["status"] == "skipped"}
    failed = {n: i["reason"] for n, i in frameworks_info.items() if i["status"] == "failed"}
    assert not failed, failed
    if skipped and REQUIRE:
        pytest.fail(f"frameworks required (ROICORE_REQUIRE_FRAMEWORKS=1) but skipped: {skipped}")
    return [n for n, i in frameworks_info.items() if i["status"] == "ran"], skipped


@pytest.fixture(scope="module")
def parity_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity") / "report.json"
    proc = roicore("parity", "--cases", "2", "--json", str(out))
    report = json.loads(out.read_text()) if out.exists() else None
    return proc, report


def test_parity_short_run(parity_run):
    proc, report = parity_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "conventions compared on the same inputs" in proc.stdout
    assert "bit-exact" in proc.stdout and "MISMATCH" not in proc.stdout
    assert report["ok"] is True and report["command"] == "parity"
    ran, skipped = check_skips(report["frameworks"])
    if not ran:
        pytest.skip(f"no framework installed: {skipped}")
    # every installed framework gives a row for each (operator, dtype) its adapter claims
    claims = {"paddle": {(op, dt) for op in ("roi_pool", "psroi_pool", "roi_align")
                         for dt in ("float32", "float64")},
              "mxnet": {(op, dt) for op in ("roi_pool", "psroi_pool", "roi_align")
                        for dt in ("float32", "float64")},
              "tensorflow": {("roi_pool_bilinear", "float32")},
              "openvino": {("roi_pool", "float32"), ("roi_pool_bilinear", "float32")}}
    for fw in ran:
        rows = {(r["operator"], r["dtype"]): r for r in report["results"] if r["framework"] == fw}
        assert set(rows) == claims[fw], fw
        for r in rows.values():
            assert r["cases"] > 0 and r["bit_exact"] and r["mismatches"] == 0, r
            assert r["elements"] > 0
            if fw != "openvino":
                assert r["grad_mismatches"] == 0 and r["grad_elements"] > 0, r
    for name in skipped:
        assert "SKIPPED" in proc.stdout and name in proc.stdout
    # conventions table: roicore alone, shows the known disagreements
    conv = {(c["operator"], c["dtype"], c["a"], c["b"]): c for c in report["conventions"]}
    assert conv[("roi_pool", "float64", "mxnet", "paddle")]["mismatches"] > 0   # float32 bins
    assert conv[("roi_pool", "float32", "mxnet", "paddle")]["mismatches"] == 0
    assert conv[("roi_align", "float32", "mxnet", "paddle")]["mismatches"] > 0
    assert conv[("roi_align", "float64", "mxnet", "torchvision")]["mismatches"] > 0
    assert conv[("psroi_pool", "float64", "mxnet", "paddle")]["mismatches"] == 0
    assert report["golden"] and all(g["ok"] for g in report["golden"])
    assert report["suite"]["random"] == 2 * 4


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
                   "paddle,mxnet,tensorflow,openvino")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["inputs"]["x_shape"] == [2, 18, 20, 24] and report["inputs"]["boxes"] == 6
    assert "rois reordered by batch index" in " ".join(report["inputs"]["notes"])
    assert "native output" in proc.stdout
    ran, _ = check_skips(report["frameworks"])
    assert {r["framework"] for r in report["results"]} == set(ran)
    for r in report["results"]:
        assert r["dtype"] == "float32" and r["bit_exact"], r
        d = r["details"][0]
        assert d["native_shape"] == d["roicore_shape"] and d["native_shape"][0] == 6
        assert d["native_dtype"] == d["roicore_dtype"] == "float32"
    # float64 input: frameworks that only claim float32 say why they were not compared
    np.savez(f, x=x.astype(np.float64), rois=np.hstack([np.zeros((6, 1)), boxes]),
             spatial_scale=0.0625)
    proc = roicore("parity", "--inputs", str(f), "--json", str(out), "--frameworks", "openvino",
                   "--no-conventions")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    if report["frameworks"]["openvino"]["status"] == "ran":
        assert all(r["cases"] == 0 and r["skipped"] for r in report["results"])


def test_parity_bad_inputs_file(tmp_path):
    f = tmp_path / "bad.npz"
    np.savez(f, x=np.zeros((1, 1, 4, 4), np.float32))
    proc = roicore("parity", "--inputs", str(f), "--frameworks", "openvino")
    assert proc.returncode != 0 and "rois" in proc.stderr


@pytest.mark.parametrize("fault", ["paddle", "openvino:roi_pool"])
def test_parity_fails_when_an_adapter_departs(fault, tmp_path):
    fw = fault.split(":")[0]
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
    if ":" in fault:
        assert {r["operator"] for r in bad} == {"roi_pool"}
    assert all(r["max_abs_diff"] > 0 for r in bad)


def test_parity_unknown_framework_is_a_usage_error():
    proc = roicore("parity", "--frameworks", "caffe")
    assert proc.returncode != 0 and "unknown framework" in proc.stderr


def test_bench_quick(tmp_path):
    out = tmp_path / "b.json"
    png = tmp_path / "b.png"
    args = ["bench", "--quick", "--repeats", "1", "--json", str(out),
            "--workloads", "train_b2,rfcn_psroi"]
    has_mpl = importlib.util.find_spec("matplotlib") is not None
    if has_mpl:
        args += ["--plot", str(png)]
    proc = roicore(*args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    ran, _ = check_skips({k: v for k, v in report["frameworks"].items() if k != "roicore"})
    assert report["frameworks"]["roicore"]["status"] == "ran"
    assert report["threads"] >= 1 and report["environment"]["cpu"]
    got = {(r["workload"], r["operator"], r["direction"], r["framework"], r["kind"])
           for r in report["results"]}
    for op, wl in (("roi_pool", "train_b2"), ("roi_align", "train_b2"), ("psroi_pool", "rfcn_psroi")):
        for d in ("forward", "fwd+bwd"):
            assert (wl, op, d, "roicore", "core") in got
    natives = {"paddle": ["roi_pool", "roi_align", "psroi_pool"],
               "mxnet": ["roi_pool", "roi_align", "psroi_pool"],
               "openvino": ["roi_pool", "roi_align", "psroi_pool"],
               "onnxruntime": ["roi_pool", "roi_align"], "tensorflow": ["roi_pool"]}
    for fw in ran:
        for op in natives[fw]:
            wl = "rfcn_psroi" if op == "psroi_pool" else "train_b2"
            assert (wl, op, "forward", fw, "native") in got, (fw, op)
    for r in report["results"]:
        assert r["median_ms"] > 0 and len(r["times_ms"]) == 1
        if r["kind"] == "native":
            assert r["ratio"] > 0
    assert not report["errors"], report["errors"]
    assert "native time / roicore.core time" in proc.stdout
    if has_mpl:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_plot_without_matplotlib_is_a_clear_error(tmp_path):
    if importlib.util.find_spec("matplotlib") is not None:
        pytest.skip("matplotlib is installed")
    proc = roicore("bench", "--quick", "--plot", str(tmp_path / "x.png"))
    assert proc.returncode != 0 and "matplotlib" in proc.stderr


def test_help_and_module_entry():
    proc = roicore("--help")
    assert proc.returncode == 0 and "parity" in proc.stdout and "bench" in proc.stdout
    for cmd in ("parity", "bench"):
        proc = roicore(cmd, "--help")
        assert proc.returncode == 0 and "--frameworks" in proc.stdout and "--json" in proc.stdout
