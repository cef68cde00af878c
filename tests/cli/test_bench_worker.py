"""The bench worker's side: timing, memory tracing, the output cache, and what each contender
computes (the harnesses bind the operations the report names)."""
import subprocess
import sys

import numpy as np
import pytest


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
    core, native = (["roi_pool", "float32", "forward", kind, "", 1] for kind in ("core", "native"))
    fw.calls = {tuple(core): core_call, tuple(native): native_call}
    hits = rc.output_cache_stats()["hits"]
    assert fw.handle(dict(cmd="run", key=core)) == {"seconds": 1.0}
    assert core_log == [hits, hits + 1]  # the timed call reused the warm-up's block
    assert rc.output_cache_stats()["idle_blocks"] == 0
    fw.handle(dict(cmd="run", key=native))
    assert len(native_log) == 1
    plain = BenchState(None, threads=1)
    plain.calls = {tuple(core): core_call}
    plain.handle(dict(cmd="run", key=core))
    assert len(core_log) == 3 and rc.output_cache_stats()["idle_blocks"] == 1


def test_workload_cases_share_one_map_and_normalise_bilinear_boxes():
    from roicore.cli import cases, workloads
    got = workloads.cases("train_b2", ["roi_pool", "roi_align", "roi_pool_bilinear"], scale=0.1)
    x, boxes, batch, P, s, _ = workloads.make("train_b2", scale=0.1)
    for op, (case, dy) in got.items():
        assert case["op"] == op and case["x"] is got["roi_pool"][0]["x"]
        np.testing.assert_array_equal(case["x"], x)
        assert case["output_size"] == (P, P) and (case["sampling_ratio"], case["aligned"]) == (2, True)
        assert dy.shape == (len(boxes), x.shape[1], P, P) and dy.dtype == np.float32
        assert case["rois"][:, 0].tolist() == batch.tolist()
    # outputs of one shape share one upstream gradient
    assert got["roi_pool"][1] is got["roi_align"][1] is got["roi_pool_bilinear"][1]
    pix, bil = got["roi_pool"][0], got["roi_pool_bilinear"][0]
    np.testing.assert_array_equal(pix["rois"][:, 1:], boxes)
    assert pix["spatial_scale"] == s and bil["spatial_scale"] == 1.0
    H, W = x.shape[2:]
    np.testing.assert_allclose(bil["rois"][:, [1, 3]], boxes[:, [0, 2]] * s / (W - 1))
    np.testing.assert_allclose(bil["rois"][:, [2, 4]], boxes[:, [1, 3]] * s / (H - 1))
    np.testing.assert_array_equal(bil["rois"], cases.normalised(pix["rois"], s, H, W))


def test_core_contenders_use_the_convention_they_are_named_after(monkeypatch):
    """Each roicore.core row of the conventions table calls roicore.core with its convention."""
    import roicore.core as rc
    from roicore.cli import workloads
    from roicore.cli._bench_worker import CoreBench
    import dataclasses
    from roicore.core import operators
    seen = []

    def spy(real):
        def called(*args, **kw):
            seen.append((real.__name__, kw["convention"]))
            return real(*args, **kw)
        return called
    for name in ("roi_pool", "roi_align"):   # the table's functions, which the bench calls
        op = operators.OPERATORS[name]
        monkeypatch.setitem(operators.OPERATORS, name, dataclasses.replace(
            op, forward=spy(op.forward), backward=spy(op.backward)))
    bench = CoreBench(1)
    for op, (case, dy) in workloads.cases("train_b2", ["roi_pool", "roi_align",
                                                       "roi_pool_bilinear"], scale=0.03).items():
        timers, errors = bench.contenders(case, dy, 1, ["paddle", "openvino_cpu", "tensorflow"])
        assert not errors
        expected = {"roi_pool": {"": "mxnet", "paddle": "paddle", "openvino_cpu": "openvino_cpu"},
                    "roi_align": {"": "mxnet", "paddle": "paddle"},
                    "roi_pool_bilinear": {"": "tensorflow", "openvino_cpu": "openvino_cpu"}}[op]
        assert set(timers) == {(d, "core", v) for v in expected for d in ("forward", "fwd+bwd")}
        for (direction, _, variant), timer in timers.items():
            seen.clear()
            assert timer() > 0
            calls = {"forward": 1, "fwd+bwd": 2}[direction]
            assert len(seen) == calls, seen
            assert {conv for _, conv in seen} == {expected[variant]}, (op, variant, seen)
            if op == "roi_pool_bilinear":
                assert all(n.startswith("roi_pool") for n, _ in seen)


# The bench must time like against like: on its own workloads, each framework's native
# operator and roicore's counterpart (in every layout the adapter takes) give the same
# numbers, forward and backward, wherever roicore claims bit-identity with that operator.
SAME_NUMBERS = """if 1:
    import json, sys
    import numpy as np
    from roicore.cli import workloads
    from roicore.cli.frameworks import harness_class
    try:
        h = harness_class(sys.argv[1])(1)
    except ImportError as e:
        print(json.dumps(dict(skipped=str(e))))
        raise SystemExit(0)
    cases = dict(workloads.cases("train_b2", workloads.OPS_FOR["roi"], scale=0.03))
    cases.update(workloads.cases("rfcn_psroi", workloads.OPS_FOR["ps"], scale=0.03))
    checked = []
    for op, (case, dy) in cases.items():
        for dtype in h.parity_claims.get(op, ()):
            c, note = h.restrict(dict(case, x=case["x"].astype(dtype)))
            assert note is None, note          # the bench's boxes suit every native op
            inputs = h.inputs(c, dtype, dy.astype(dtype))
            native = h.native(c, inputs)
            run = h.forward_backward if h.differentiable else (lambda call: (h.forward(call), None))
            want = [h.to_numpy(t, native.layout) for t in run(native)]
            for layout in h.layouts:
                call = h.roicore(c, inputs, layout)
                got = [h.to_numpy(t, call.layout) for t in run(call)]
                for w, g in zip(want, got):
                    assert (w is None) == (g is None)
                    if w is not None:
                        assert w.shape == g.shape and w.dtype == g.dtype, (op, w.shape, g.shape)
                        assert np.array_equal(w, g), (op, dtype, layout)
                checked.append([op, dtype, layout])
    print(json.dumps(dict(checked=checked)))
"""


@pytest.mark.parametrize("framework", ["paddle", "mxnet", "tensorflow", "openvino", "onnxruntime",
                                       "torch"])
def test_bench_contenders_compute_the_same_numbers(framework):
    import json
    import os
    from roicore.cli.frameworks import harness_class
    proc = subprocess.run([sys.executable, "-c", SAME_NUMBERS, framework], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in got:
        if os.environ.get("ROICORE_REQUIRE_FRAMEWORKS", "") not in ("", "0"):
            pytest.fail(f"{framework} required but not importable: {got['skipped']}")
        pytest.skip(got["skipped"])
    from roicore.cli.cases import OPS
    h = harness_class(framework)
    # the single-map operators: the pyramid ones' claims are checked on their own workloads
    # (test_pyramid_contenders_compute_the_same_numbers)
    assert sorted(map(tuple, got["checked"])) == sorted(
        (op, dt, layout) for op, dts in h.parity_claims.items() if op in OPS for dt in dts
        for layout in h.layouts)


# The pyramid rows time like against like: torchvision's MultiScaleRoIAlign, roicore's fused
# module and the per-level loop on roicore's roi_align give the same bits, forward and
# backward; OpenVINO's extractor assigns the same levels to these boxes and pools them alike.
PYRAMID_SAME_NUMBERS = """if 1:
    import json
    import numpy as np
    from roicore.cli import workloads, _pyramid_bench as PB
    from roicore.cli.frameworks import harness_class
    try:
        t = harness_class("torch")(1)
    except ImportError as e:
        print(json.dumps(dict(skipped=str(e))))
        raise SystemExit(0)
    checked = []
    for name in workloads.PYRAMID_WORKLOADS:
        case, dy = workloads.pyramid_case(name, scale=0.05)
        for dtype in ("float32", "float64"):
            c = dict(case, maps=[m.astype(dtype) for m in case["maps"]],
                     boxes=case["boxes"].astype(dtype))
            calls = PB.torch_calls(t, c, dy.astype(dtype), 1)
            assert set(calls) == {("native", ""), ("adapter", ""), ("adapter", "loop")}
            want_y = calls[("native", "")][0]().numpy()
            want_fb = calls[("native", "")][1]()
            assert want_y.shape == (len(case["boxes"]), case["maps"][0].shape[1]) + case["output_size"]
            assert want_y.dtype == dtype and np.abs(want_y).max() > 0
            for key, (forward, forward_backward) in calls.items():
                assert np.array_equal(forward().numpy(), want_y), (name, dtype, key)
                y, grads = forward_backward()
                assert np.array_equal(y.numpy(), want_y), (name, dtype, key)
                assert len(grads) == len(case["maps"])
                for g, w, m in zip(grads, want_fb[1], c["maps"]):
                    assert g.shape == m.shape and np.array_equal(g.numpy(), w.numpy()), key
                checked.append([name, dtype, key[0], key[1]])
        try:
            ov = harness_class("openvino")(1)
        except ImportError:
            continue
        got = PB.openvino_calls(ov, case, dy, 1)[("native", "")][0]()
        fused = PB.torch_calls(t, case, dy, 1)[("adapter", "")][0]().numpy()
        assert got.shape == fused.shape
        np.testing.assert_allclose(got, fused, rtol=1e-5, atol=1e-5)
        checked.append([name, "float32", "openvino", ""])
    print(json.dumps(dict(checked=checked)))
"""


def test_pyramid_contenders_compute_the_same_numbers():
    import json
    import os
    proc = subprocess.run([sys.executable, "-c", PYRAMID_SAME_NUMBERS], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skipped" in got:
        if os.environ.get("ROICORE_REQUIRE_FRAMEWORKS", "") not in ("", "0"):
            pytest.fail(f"torch required but not importable: {got['skipped']}")
        pytest.skip(got["skipped"])
    torch_rows = {(wl, dt, k, v) for wl in ("fpn_box", "fpn_mask") for dt in ("float32", "float64")
                  for k, v in (("native", ""), ("adapter", ""), ("adapter", "loop"))}
    assert torch_rows <= set(map(tuple, got["checked"]))


def test_pyramid_workload_boxes_span_every_level():
    """The boxes are pooled from all four maps, as FPN proposals are; scaled down, the same
    maps with fewer boxes and channels."""
    import roicore.core as rc
    from roicore.cli import workloads
    for name, (N, C, (H, W), strides, R, P) in workloads.PYRAMID_WORKLOADS.items():
        case, dy = workloads.pyramid_case(name)
        b = case["boxes"]
        assert [m.shape for m in case["maps"]] == [(N, C, H // s, W // s) for s in strides]
        assert b.shape == (R, 4) and dy.shape == (R, C, P, P)
        assert (b[:, 2] > b[:, 0]).all() and (b[:, 3] > b[:, 1]).all()
        assert b.min() >= 0 and (b[:, 2] <= W).all() and (b[:, 3] <= H).all()
        levels = rc.pyramid_levels(b, case["scales"])
        assert (np.bincount(levels, minlength=4) >= R // 20).all(), np.bincount(levels)
        assert (case["sampling_ratio"], case["aligned"]) == (2, False)
        small, _ = workloads.pyramid_case(name, scale=0.1)
        assert [m.shape[1:] for m in small["maps"]] == [(max(1, round(C * 0.1)),) + m.shape[2:]
                                                         for m in case["maps"]]
        assert len(small["boxes"]) == round(R * 0.1)
