"""`roicore parity` and `roicore bench`, run as a user would: in a subprocess.

Frameworks are optional locally and required in CI, as in tests/adapters/conftest.py: with
ROICORE_REQUIRE_FRAMEWORKS=1 a framework the report lists as skipped fails the test.
"""
import contextlib
import importlib.util
import io
import json
import os
import statistics
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
        assert r["threads"] == report["threads"]
        if r["kind"] == "native":
            assert r["ratio"] > 0
        # roicore.core in the roicore worker carries its peak memory beyond inputs and outputs
        assert ("extra_mb" in r) == (r["kind"] == "core" and r["framework"] == "roicore"), r
        if "extra_mb" in r:
            m = r["memory_bytes"]
            assert r["extra_mb"] >= 0 and m["peak"] >= m["outputs"] > 0, r
            assert r["extra_mb"] == pytest.approx(m["extra"] / 2**20)
    # adapter overhead: against roicore.core timed in the adapter's own worker, every round
    rows = {(r["workload"], r["operator"], r["direction"], r["framework"], r["kind"]): r
            for r in report["results"]}
    adapter_fws = [fw for fw in ("paddle", "mxnet", "tensorflow") if fw in ran]
    for fw in adapter_fws:
        for op, wl in (("roi_pool", "train_b2"), ("roi_align", "train_b2"),
                       ("psroi_pool", "rfcn_psroi")):
            for d in ("forward", "fwd+bwd"):
                a, c = rows[(wl, op, d, fw, "adapter")], rows[(wl, op, d, fw, "core")]
                assert len(c["times_ms"]) == len(a["times_ms"]) == report["repeats"]
                assert a["core_ms"] == c["median_ms"] > 0, (a, c)
                assert a["overhead"] == pytest.approx(statistics.median(
                    x / y for x, y in zip(a["times_ms"], c["times_ms"])))
            # fwd+bwd also net of the framework's own autograd cost (a null op's time)
            a, n = rows[(wl, op, "fwd+bwd", fw, "adapter")], rows[(wl, op, "fwd+bwd", fw, "autograd")]
            assert len(n["times_ms"]) == report["repeats"] and a["autograd_ms"] == n["median_ms"] > 0
            c = rows[(wl, op, "fwd+bwd", fw, "core")]
            assert a["net_overhead"] == pytest.approx(statistics.median(
                (x - z) / y for x, y, z in zip(a["times_ms"], c["times_ms"], n["times_ms"])))
            assert "net_overhead" not in rows[(wl, op, "forward", fw, "adapter")]
    assert all("core_ms" not in r and "overhead" not in r for r in report["results"]
               if r["kind"] != "adapter")
    if adapter_fws:
        out = " ".join(proc.stdout.split())
        assert "same worker process, interleaved" in out
    assert report["frameworks"]["roicore"]["peak_rss_mb"] > 0
    assert not report["errors"], report["errors"]
    assert "native time / roicore.core time" in proc.stdout
    assert "extra MB" in proc.stdout and "peak RSS per worker: roicore" in proc.stdout
    if has_mpl:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_adapter_overhead_uses_the_in_process_core():
    """adapter / core of the adapter's own worker, not of the roicore worker; both printed."""
    from roicore.cli import bench

    def row(fw, kind, ms, op="roi_pool"):
        return dict(workload="train_b2", operator=op, direction="forward", framework=fw,
                    kind=kind, threads=2, median_ms=ms, times_ms=[ms])
    rows = [row("roicore", "core", 2.0), row("paddle", "native", 8.0),
            row("paddle", "adapter", 3.0), row("paddle", "core", 2.5),
            row("mxnet", "adapter", 4.0),                       # no in-process core: no ratio
            row("mxnet", "native", 5.0, "roi_align"), row("mxnet", "core", 1.0, "roi_align")]
    fb = [dict(r, direction="fwd+bwd") for r in (row("paddle", "adapter", 9.0),
                                                row("paddle", "core", 4.0),
                                                row("paddle", "autograd", 4.5))]
    bench.add_ratios(rows + fb)
    assert fb[0]["overhead"] == pytest.approx(9.0 / 4.0)
    assert fb[0]["autograd_ms"] == 4.5 and fb[0]["net_overhead"] == pytest.approx((9.0 - 4.5) / 4.0)
    paddle_adapter, mxnet_adapter, mxnet_native = rows[2], rows[4], rows[5]
    assert rows[1]["ratio"] == pytest.approx(8.0 / 2.0)        # native: the roicore worker's core
    assert paddle_adapter["core_ms"] == 2.5
    assert paddle_adapter["overhead"] == pytest.approx(3.0 / 2.5)
    assert "overhead" not in mxnet_adapter and "core_ms" not in mxnet_adapter
    assert "ratio" not in mxnet_native                          # no roicore-worker core for it
    # over several rounds, the median of each round's ratio, not the ratio of the medians
    drift = [dict(r, workload="c4_14x14", median_ms=statistics.median(ts), times_ms=ts)
             for r, ts in ((row("paddle", "adapter", 0), [130.0, 106.0, 125.0, 133.0, 109.0]),
                           (row("paddle", "core", 0), [101.0, 132.0, 100.0, 131.0, 101.0]))]
    bench.add_ratios(drift)
    assert drift[0]["overhead"] == pytest.approx(statistics.median(
        [130 / 101, 106 / 132, 125 / 100, 133 / 131, 109 / 101]))   # 1.08, not 125 / 101
    report = dict(environment=dict(roicore="0", cpu="cpu", numpy="1", python="3"),
                  threads=2, repeats=1, scale=1.0, workloads={"train_b2": {}},
                  frameworks={"roicore": dict(status="ran", version="0"),
                              "paddle": dict(status="ran", version="3"),
                              "mxnet": dict(status="ran", version="1")},
                  results=rows, errors=[], seconds=0.0)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench.print_report(report)
    text = buf.getvalue()
    table = text[text.index("adapter overhead:"):]
    line = next(ln for ln in table.splitlines() if ln.startswith("train_b2") and "roi_pool" in ln)
    assert line.split()[3:] == ["1.20", "(3", "/", "2.5)", "-"], line
    assert "same worker process, interleaved" in " ".join(text.split())


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


# ----------------------------------------------------------------------------- bench --scaling
SCALING_KEYS = {(wl, op, d)
                for wl, wl_ops in (("fastrcnn_vgg16", ("roi_pool", "roi_align")),
                                   ("train_b2", ("roi_pool", "roi_align")),
                                   ("rfcn_psroi", ("psroi_pool",)),
                                   ("c4_14x14", ("roi_pool", "roi_align")))
                for op in wl_ops for d in ("forward", "fwd+bwd")}


def scaling_run(tmp_path, *args):
    out = tmp_path / "scaling.json"
    proc = roicore("bench", "--scaling", "--threads", "2", "--json", str(out), *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def pooled_elements(shape, op):
    P = shape["P"]
    return shape["R"] * (shape["C"] // (P * P) if op == "psroi_pool" else shape["C"]) * P * P


@pytest.fixture(scope="module")
def scaling_quick(tmp_path_factory):
    return scaling_run(tmp_path_factory.mktemp("scaling"), "--quick", "--repeats", "2")


def test_bench_scaling_quick(scaling_quick):
    proc, report = scaling_quick
    assert report["command"] == "bench" and report["mode"] == "scaling"
    assert report["threads"] == 2 and report["thread_counts"] == [1, 2]
    assert list(report["frameworks"]) == ["roicore"]          # no framework worker started
    assert report["frameworks"]["roicore"]["peak_rss_mb"] > 0
    assert not report["errors"], report["errors"]
    rows = {(s["workload"], s["operator"], s["direction"]): s for s in report["scaling"]}
    assert set(rows) == SCALING_KEYS and len(report["scaling"]) == len(SCALING_KEYS)
    # timing rows: every contender at both thread counts, each timed in every round
    timed = {(r["workload"], r["operator"], r["direction"], r["threads"]): r
             for r in report["results"]}
    assert set(timed) == {k + (n,) for k in SCALING_KEYS for n in (1, 2)}
    for r in timed.values():
        assert r["framework"] == "roicore" and r["kind"] == "core"
        assert len(r["times_ms"]) == 2 and all(t > 0 for t in r["times_ms"])
    for (wl, op, d), s in rows.items():
        assert s["ms_1"] == timed[(wl, op, d, 1)]["median_ms"]
        assert s["ms_n"] == timed[(wl, op, d, 2)]["median_ms"]
        assert s["speedup"] > 0 and s["speedup"] == pytest.approx(s["ms_1"] / s["ms_n"])
        assert s["round_speedups"] == pytest.approx(
            [t1 / t2 for t1, t2 in zip(timed[(wl, op, d, 1)]["times_ms"],
                                       timed[(wl, op, d, 2)]["times_ms"])])
        elems = pooled_elements(report["workloads"][wl], op)
        assert s["output_elements"] == elems > 0
        assert s["ns_per_element"] == pytest.approx(s["ms_n"] * 1e6 / elems)
        assert "meets_target" not in s                        # scaled workloads: not judged
        mem = s["memory_bytes"]
        for v in (s["extra_mb"], s["extra_mb_1"]):
            assert isinstance(v, float) and 0 <= v < 1e4, s
        assert s["extra_mb"] == pytest.approx(mem["extra"] / 2**20)
        y_bytes = elems * 4                                    # float32 output
        shp = report["workloads"][wl]
        x_bytes = shp["N"] * shp["C"] * shp["H"] * shp["W"] * 4
        if d == "forward":
            assert mem["outputs"] == y_bytes, s
            assert mem["extra"] == mem["peak"] - mem["outputs"]
        else:
            # y (+ argmax for roi_pool) held through the backward, and dx
            assert mem["outputs"] >= y_bytes + x_bytes, s
            if op != "roi_pool":
                assert mem["outputs"] == y_bytes + x_bytes, s
            assert mem["extra"] == max(mem["forward_extra"], mem["backward_extra"])
            assert mem["peak"] >= mem["outputs"]
        # scratch, not a copy of the world: bounded by a few times what goes in and out
        assert mem["extra"] <= 8 * (x_bytes + mem["outputs"]) + 2**20, s
    out = " ".join(proc.stdout.split())      # notes are wrapped
    assert "speedup" in out and "ns/elem 2 thr" in out and "extra MB" in out
    assert "per round" in out
    for s in report["scaling"]:
        lo, hi = min(s["round_speedups"]), max(s["round_speedups"])
        assert f"{s['speedup']:.2f}x {lo:.2f}-{hi:.2f}x" in out, s
    assert "not evaluated on this run" in out and "MISSED" not in out
    # the memory bandwidth the speedups are bounded by, at both thread counts
    bw = {b["kind"]: b for b in report["bandwidth"]}
    assert list(bw) == ["streaming stores", "plain stores", "reads"]
    for kind, b in bw.items():
        assert b["threads"] == [1, 2] and b["bytes"] == 256 << 20
        assert all(len(t) == 3 and all(v > 0 for v in t) for t in b["times_ms"])
        assert all(g == pytest.approx(b["bytes"] / statistics.median(t) / 1e6, rel=1e-3)
                   for g, t in zip(b["gb_per_s"], b["times_ms"]))
        assert b["speedup"] == pytest.approx(b["gb_per_s"][1] / b["gb_per_s"][0], rel=1e-2)
        assert f"{kind} {b['gb_per_s'][0]:.1f} {b['gb_per_s'][1]:.1f}" in out


def test_bench_scaling_memory_grows_with_the_workload(scaling_quick, tmp_path):
    _, small = scaling_quick
    _, big = scaling_run(tmp_path, "--scale", "0.2", "--repeats", "1",
                         "--workloads", "train_b2,rfcn_psroi")
    assert big["scale"] == 0.2 and small["scale"] < 0.2
    small_rows = {(s["workload"], s["operator"], s["direction"]): s for s in small["scaling"]}
    big_rows = {(s["workload"], s["operator"], s["direction"]): s for s in big["scaling"]}
    assert set(big_rows) == {k for k in SCALING_KEYS if k[0] in ("train_b2", "rfcn_psroi")}
    for key, b in big_rows.items():
        a = small_rows[key]
        assert b["output_elements"] > a["output_elements"]
        assert b["memory_bytes"]["extra"] > a["memory_bytes"]["extra"], (key, a, b)
        assert b["memory_bytes"]["outputs"] > a["memory_bytes"]["outputs"], key


def test_scaling_target_and_normalisation():
    """The issue #5 verdict and the per-element figure, on made-up timings (full size)."""
    from roicore.cli import bench
    def row(wl, op, n, ms):
        return dict(workload=wl, operator=op, direction="forward", framework="roicore",
                    kind="core", threads=n, median_ms=ms, times_ms=[ms], extra_mb=1.5,
                    memory_bytes=dict(peak=3, outputs=1, extra=2))
    rows = [row("fastrcnn_vgg16", "roi_pool", 1, 10.0), row("fastrcnn_vgg16", "roi_pool", 2, 6.0),
            row("c4_14x14", "roi_align", 1, 10.0), row("c4_14x14", "roi_align", 2, 5.0),
            row("train_b2", "roi_pool", 1, 4.0), row("train_b2", "roi_pool", 2, 1.0)]
    got = {s["workload"]: s for s in bench.scaling_rows(rows, 2, 1.0)}
    assert got["fastrcnn_vgg16"]["speedup"] == pytest.approx(10 / 6)
    assert got["fastrcnn_vgg16"]["meets_target"] is False      # 1.67x < 1.7x
    assert got["c4_14x14"]["meets_target"] is True
    assert "meets_target" not in got["train_b2"]               # not a large workload
    assert got["fastrcnn_vgg16"]["ns_per_element"] == pytest.approx(6e6 / (2000 * 512 * 49))
    assert got["c4_14x14"]["ns_per_element"] == pytest.approx(5e6 / (1000 * 1024 * 196))
    # no verdict at another thread count or on scaled workloads
    assert all("meets_target" not in s for s in bench.scaling_rows(rows, 2, 0.5))
    rows4 = [dict(r, threads=4) if r["threads"] == 2 else r for r in rows]
    assert all("meets_target" not in s for s in bench.scaling_rows(rows4, 4, 1.0))
    # the printed verdict
    report = dict(environment=dict(roicore="0", cpu="cpu", numpy="1", python="3", openmp=True),
                  threads=2, repeats=1, scale=1.0, workloads={k: {} for k in got},
                  target=dict(speedup=bench.SCALING_TARGET, threads=2,
                              workloads=list(bench.LARGE_WORKLOADS)),
                  scaling=list(got.values()), errors=[], seconds=0.0,
                  frameworks={"roicore": dict(status="ran")})
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench.print_scaling(report)
    lines = {ln.split()[0]: ln.split() for ln in buf.getvalue().splitlines() if ln.strip()}
    assert lines["fastrcnn_vgg16"][-1] == "MISSED" and lines["c4_14x14"][-1] == "met"
    assert lines["train_b2"][-1] == "-"
    text = " ".join(buf.getvalue().split())
    assert "met by 1 of 2 (lowest 1.67x)" in text


def test_traced_peak_counts_scratch_not_inputs_or_older_arrays():
    """The memory figure's arithmetic, in a worker-like subprocess."""
    code = """if 1:
        import numpy as np
        from roicore.cli._bench_worker import traced_peak, nbytes
        held = np.ones(4 << 20, np.uint8)            # alive before the call: not counted
        def op(x):
            scratch = np.ones(8 << 20, np.uint8)     # 8 MiB scratch, freed on return
            y = np.empty(1 << 20, np.uint8)          # 1 MiB output
            y[:] = scratch[:1 << 20] + x[:1 << 20]
            return y
        y, peak = traced_peak(op, held)
        print(peak - nbytes(y))
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    extra = int(proc.stdout.split()[-1])
    # 8 MiB scratch plus the 1 MiB temporary of scratch[:n] + x[:n]; a few KB of Python objects
    assert (9 << 20) <= extra < (9 << 20) + (64 << 10), extra


def test_a_timed_run_repeats_short_calls_and_takes_their_median():
    from roicore.cli._bench_worker import RUN_MIN_SECONDS, timed_run

    def fake(durations):
        calls = iter(durations)
        return lambda: next(calls)

    # a cold first call, then warm ones until RUN_MIN_SECONDS is reached
    short = RUN_MIN_SECONDS / 10
    durations = [5 * short] + [short] * 20
    assert timed_run(fake(durations)) == short
    # a call longer than RUN_MIN_SECONDS runs once (the iterator would raise on a second)
    assert timed_run(fake([2 * RUN_MIN_SECONDS])) == 2 * RUN_MIN_SECONDS


def test_framework_workers_warm_the_output_cache_per_run_and_release_it(cache):
    """In a framework worker an adapter or core run makes one untimed call first, so the
    timed call reuses its output block, and leaves no idle block behind; native runs and
    the roicore worker are timed as they come."""
    from roicore.cli._bench_worker import BenchState
    import roicore.core as rc

    def contender():
        log = []

        def call():
            y = rc.roi_pool(np.ones((1, 1, 4, 4), np.float32), np.zeros((1 << 18, 4), np.float32),
                            1, batch_indices=np.zeros(1 << 18, np.int64))  # a 1 MB output
            log.append(rc.output_cache_stats()["hits"])
            del y
            return 1.0  # seconds: one call per timed run
        return call, log

    fw = BenchState(None, threads=1, cache_per_run=True)
    core_call, core_log = contender()
    native_call, native_log = contender()
    fw.calls = {("roi_pool", "forward", "core", 1): core_call,
                ("roi_pool", "forward", "native", 1): native_call}
    hits = rc.output_cache_stats()["hits"]
    assert fw.handle(dict(cmd="run", key=["roi_pool", "forward", "core", 1])) == {"seconds": 1.0}
    assert core_log == [hits, hits + 1]  # the timed call reused the warm-up's block
    assert rc.output_cache_stats()["idle_blocks"] == 0
    fw.handle(dict(cmd="run", key=["roi_pool", "forward", "native", 1]))
    assert len(native_log) == 1
    plain = BenchState(None, threads=1)
    plain.calls = {("roi_pool", "forward", "core", 1): core_call}
    plain.handle(dict(cmd="run", key=["roi_pool", "forward", "core", 1]))
    assert len(core_log) == 3 and rc.output_cache_stats()["idle_blocks"] == 1


def test_bench_scaling_usage_errors():
    proc = roicore("bench", "--scaling", "--threads", "1")
    assert proc.returncode != 0 and "--scaling" in proc.stderr and "2" in proc.stderr
    proc = roicore("bench", "--scaling", "--frameworks", "paddle")
    assert proc.returncode != 0 and "--frameworks" in proc.stderr
