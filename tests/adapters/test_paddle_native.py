"""roicore's Paddle operators in every mode Paddle runs a model: to_static (the default
bytecode mode and full_graph=True), static programs (PIR and the legacy ProgramDesc),
paddle.jit.save / paddle.jit.load and paddle.inference predictors in a fresh process,
against Paddle's own operators in the same mode, bit for bit; their errors; and building
them from nothing.
"""
import contextlib
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REQUIRE, framework

paddle = framework("paddle", "the Paddle adapter tests need paddlepaddle")
from paddle.static import InputSpec  # noqa: E402
from paddle.vision import ops as native  # noqa: E402

from roicore.adapters import paddle as rp  # noqa: E402
from roicore.adapters import paddle_legacy as rl  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module", autouse=True)
def operators():
    """Every test here needs the operators: their absence fails in CI, skips elsewhere."""
    if rp._operators() is None:
        reason = f"roicore's Paddle operators are unavailable: {rp._native_unavailable}"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)


def _run_python(code, timeout=300, env=None):
    """Run ``code`` in a fresh interpreter (the tests' helpers importable); returns stdout."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, (f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    return proc.stdout


# ----------------------------------------------------------------------------- a model

def _conv():
    """A convolution whose weights are drawn from a fixed seed, in any mode."""
    rng = np.random.default_rng(3)
    init = paddle.nn.initializer.Assign
    return paddle.nn.Conv2D(
        3, 8, 3, padding=1,
        weight_attr=paddle.ParamAttr(initializer=init(rng.uniform(-.3, .3, (8, 3, 3, 3)))),
        bias_attr=paddle.ParamAttr(initializer=init(rng.uniform(-.1, .1, 8))))


class Net(paddle.nn.Layer):
    """A convolution feeding every operator of ``ops``, roicore's (roicore.adapters.paddle)
    or Paddle's (paddle.vision.ops); with ``fluid``, the legacy fluid functions
    (roicore.adapters.paddle_legacy) or Paddle's operators computing the same."""

    def __init__(self, ops, fluid=False):
        super().__init__()
        self.conv = _conv()
        self.ops, self.fluid = ops, fluid

    def forward(self, img, boxes, boxes_num):
        f, ops = self.conv(img), self.ops
        if self.fluid and ops is rl:
            return (rl.roi_pool(f, boxes, 2, 3, 0.5, rois_num=boxes_num),
                    rl.psroi_pool(f, boxes, 2, 0.5, 2, 2, rois_num=boxes_num))
        pooled = (ops.roi_pool(f, boxes, boxes_num, (2, 3), 0.5),
                  ops.psroi_pool(f, boxes, boxes_num, 2, 0.5))
        if self.fluid:
            return pooled
        return pooled + (ops.roi_align(f, boxes, boxes_num, (3, 2), 0.5),
                         ops.roi_align(f, boxes, boxes_num, 2, 0.5, sampling_ratio=2,
                                       aligned=False))


SPEC = [InputSpec([None, 3, 16, 16], "float32", "img"), InputSpec([None, 4], "float32", "boxes"),
        InputSpec([None], "int32", "boxes_num")]


def batch(seed=0):
    rng = np.random.default_rng(seed)
    img = rng.standard_normal((2, 3, 16, 16)).astype("float32")
    boxes = np.array([[0, 0, 20, 26], [3, 5, 11, 9], [-4, 2, 30, 17], [6, 6, 6.5, 7]], "float32")
    return img, boxes, np.array([1, 3], "int32")


def twins(fluid=False):
    """(roicore's Net, Paddle's computing the same)."""
    return (Net(rl, fluid), Net(native, fluid)) if fluid else (Net(rp), Net(native))


@contextlib.contextmanager
def static_program():
    """Static mode with a new program holding inputs (x, boxes, boxes_num) shaped like
    batch()'s: yields (program, x, boxes, boxes_num); dygraph again afterwards."""
    paddle.enable_static()
    try:
        main = paddle.static.Program()
        with paddle.static.program_guard(main):
            yield (main, *(paddle.static.data(s.name, s.shape, s.dtype) for s in SPEC))
    finally:
        paddle.disable_static()


def forward_backward(model, inputs):
    outs = model(*[paddle.to_tensor(a) for a in inputs])
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    return [o.numpy() for o in outs] + [model.conv.weight.grad.numpy()]


def assert_bits(got, want, what):
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, i, a.shape, b.shape)
        assert np.array_equal(a.view(np.uint32) if a.dtype == np.float32 else a,
                              b.view(np.uint32) if b.dtype == np.float32 else b), (
            f"{what}: output {i} differs in {int(np.sum(a != b))} of {a.size} elements")


# ----------------------------------------------------------------------------- graph modes

@pytest.mark.parametrize("legacy", [False, True], ids=["vision_ops", "fluid"])
@pytest.mark.parametrize("full_graph", [False, True], ids=["default", "full_graph"])
def test_to_static_matches_paddle(full_graph, legacy):
    """paddle.jit.to_static in its default mode (bytecode translation, which used to crash
    on the NumPy path's PyLayer) and with full_graph=True: outputs and the convolution's
    gradient equal Paddle's own operators' under the same translation, and the outputs
    equal dygraph's.  (With full_graph=True Paddle's convolution gradient differs from
    dygraph's in the last bits, for Paddle's operators as for roicore's, so only the
    default mode compares that gradient with dygraph too.)"""
    mine, theirs = twins(legacy)
    inputs = batch()
    eager = forward_backward(mine, inputs)
    mine.clear_gradients()
    got = forward_backward(paddle.jit.to_static(mine, full_graph=full_graph), inputs)
    want = forward_backward(paddle.jit.to_static(theirs, full_graph=full_graph), inputs)
    assert_bits(got, want, "to_static vs Paddle's to_static")
    compared = len(got) if not full_graph else len(got) - 1
    assert_bits(got[:compared], eager[:compared], "to_static vs dygraph")


@pytest.mark.parametrize("legacy", [False, True], ids=["vision_ops", "fluid"])
def test_static_program_matches_paddle(legacy):
    """A PIR static program with a backward pass, run by the executor."""
    img, boxes, num = batch()
    feed = {"img": img, "boxes": boxes, "boxes_num": num}
    results = []
    for ops in ((rl, native) if legacy else (rp, native)):
        paddle.enable_static()
        try:
            main, startup = paddle.static.Program(), paddle.static.Program()
            with paddle.static.program_guard(main, startup):
                model = Net(ops, legacy)
                outs = model(*(paddle.static.data(s.name, s.shape, s.dtype) for s in SPEC))
                loss = sum(o.sum() * (i + 1) for i, o in enumerate(outs))
                grads = [g for _, g in paddle.static.append_backward(loss)]
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            results.append(exe.run(main, feed=feed, fetch_list=[*outs, *grads]))
        finally:
            paddle.disable_static()
    assert_bits(results[0], results[1], "static program")


def test_legacy_program_desc():
    """Paddle's pre-PIR static programs (FLAGS_enable_pir_api=0, Paddle 2.x's only kind):
    the operators are appended as ops and run by the executor."""
    out = _run_python("""
        import numpy as np, paddle
        from roicore.adapters import paddle as rp
        from paddle.vision import ops as native
        paddle.enable_static()
        main = paddle.static.Program()
        with paddle.static.program_guard(main):
            x = paddle.static.data("x", [None, 8, 16, 16], "float32")
            b = paddle.static.data("b", [None, 4], "float32")
            n = paddle.static.data("n", [None], "int32")
            assert type(x).__name__ == "Variable", type(x)
            outs = [rp.roi_pool(x, b, n, 2, 0.5), rp.psroi_pool(x, b, n, 2, 0.5),
                    rp.roi_align(x, b, n, 2, 0.5)]
        rng = np.random.default_rng(0)
        feed = {"x": rng.standard_normal((2, 8, 16, 16)).astype("float32"),
                "b": np.array([[0, 0, 20, 26], [3, 5, 11, 9], [-4, 2, 30, 17]], "float32"),
                "n": np.array([1, 2], "int32")}
        got = paddle.static.Executor(paddle.CPUPlace()).run(main, feed=feed, fetch_list=outs)
        paddle.disable_static()
        t = [paddle.to_tensor(feed[k]) for k in "xbn"]
        want = [native.roi_pool(*t, 2, 0.5), native.psroi_pool(*t, 2, 0.5),
                native.roi_align(*t, 2, 0.5)]
        print(all(np.array_equal(g, w.numpy()) for g, w in zip(got, want)))
        """, env=dict(os.environ, FLAGS_enable_pir_api="0"))
    assert out.strip().splitlines()[-1] == "True", out


def test_old_ir_guard_after_import():
    """paddle.pir_utils.OldIrGuard, entered after the adapters were imported (as Paddle's
    own legacy tests do): its variables carry the old IR's dtype objects, which the
    adapters' checks must accept.  Outputs and gradients against Paddle's dygraph ops."""
    out = _run_python("""
        import numpy as np, paddle
        from roicore.adapters import paddle as rp, paddle_legacy as rl
        from paddle.vision import ops as native
        rng = np.random.default_rng(0)
        feed = {"x": rng.standard_normal((2, 8, 16, 16)).astype("float32"),
                "b": np.array([[0, 0, 20, 26], [3, 5, 11, 9], [-4, 2, 30, 17]], "float32"),
                "n": np.array([1, 2], "int32")}
        with paddle.pir_utils.OldIrGuard():
            paddle.enable_static()
            main = paddle.static.Program()
            with paddle.static.program_guard(main):
                x = paddle.static.data("x", [None, 8, 16, 16], "float32")
                x.stop_gradient = False
                b = paddle.static.data("b", [None, 4], "float32")
                n = paddle.static.data("n", [None], "int32")
                assert type(x).__name__ == "Variable", type(x)
                outs = [rp.roi_pool(x, b, n, 2, 0.5), rp.psroi_pool(x, b, n, 2, 0.5),
                        rp.roi_align(x, b, n, 2, 0.5),
                        rl.roi_align(x, b, 2, 2, 0.5, rois_num=n, aligned=True)]
                grads = [paddle.static.gradients([y], [x])[0] for y in outs]
            got = paddle.static.Executor(paddle.CPUPlace()).run(
                main, feed=feed, fetch_list=outs + grads)
            paddle.disable_static()
        want = []
        for op in (native.roi_pool, native.psroi_pool, native.roi_align, native.roi_align):
            x, b, n = (paddle.to_tensor(feed[k]) for k in "xbn")
            x.stop_gradient = False
            y = op(x, b, n, 2, 0.5)
            y.backward()
            want.append((y.numpy(), x.grad.numpy()))
        want = [w[0] for w in want] + [w[1] for w in want]
        print([bool(np.array_equal(g, w)) for g, w in zip(got, want)])
        """)
    assert out.strip().splitlines()[-1] == str([True] * 8), out


# ----------------------------------------------------------------------------- saved models

def test_saved_model_in_a_fresh_process(tmp_path):
    """The deployment path: to_static (default mode), paddle.jit.save, then in a new
    process the adapter's import (which registers the operators), paddle.jit.load and a
    paddle.inference predictor (oneDNN on, as Paddle's CPU predictors default, and off).
    Each gives Paddle's own operators' outputs in the same mode bit for bit; jit.load and
    the predictor without oneDNN also give dygraph's (oneDNN's convolution rounds
    differently from the dygraph one)."""
    mine, theirs = twins()
    inputs = batch()
    eager = [o.numpy() for o in mine(*[paddle.to_tensor(a) for a in inputs])]
    for name, model in (("mine", mine), ("theirs", theirs)):
        paddle.jit.save(paddle.jit.to_static(model), str(tmp_path / name / "model"),
                        input_spec=SPEC)
    np.savez(tmp_path / "io.npz", *inputs, *eager)
    out = _run_python(f"""
        import numpy as np, paddle
        from paddle import inference
        import roicore.adapters.paddle  # noqa: F401  (registers roicore's operators)
        root = {str(tmp_path)!r}
        d = np.load(root + "/io.npz")
        inputs, eager = [d[f"arr_{{i}}"] for i in range(3)], [d[f"arr_{{i}}"] for i in range(3, 7)]

        def same(a, b):
            return all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)

        loaded = {{}}
        for name in ("mine", "theirs"):
            model = paddle.jit.load(root + f"/{{name}}/model")
            loaded[name] = [o.numpy() for o in model(*map(paddle.to_tensor, inputs))]
        print("jit.load", same(loaded["mine"], loaded["theirs"]), same(loaded["mine"], eager))
        for onednn in (True, False):
            got = {{}}
            for name in ("mine", "theirs"):
                cfg = inference.Config(root + f"/{{name}}/model.json",
                                       root + f"/{{name}}/model.pdiparams")
                cfg.disable_gpu()
                cfg.disable_glog_info()
                cfg.enable_mkldnn() if onednn else cfg.disable_mkldnn()
                predictor = inference.create_predictor(cfg)
                for input_name, value in zip(predictor.get_input_names(), inputs):
                    handle = predictor.get_input_handle(input_name)
                    handle.reshape(value.shape)
                    handle.copy_from_cpu(value)
                predictor.run()
                got[name] = [predictor.get_output_handle(o).copy_to_cpu()
                             for o in predictor.get_output_names()]
            print("inference", onednn, same(got["mine"], got["theirs"]),
                  same(got["mine"], eager))
        """)
    lines = out.strip().splitlines()[-3:]
    assert lines == ["jit.load True True", "inference True True False",
                     "inference False True True"], out


# ----------------------------------------------------------------------------- errors

BAD_COUNTS = [([1, 1], r"boxes_num must sum to the number of boxes \(4\), got "
                       r"sum\(boxes_num\) = 2"),
              ([4], r"boxes_num must have one count per image \(N=2\), got 1")]


@pytest.mark.parametrize("counts,message", BAD_COUNTS)
def test_bad_boxes_num_in_a_static_program(counts, message):
    """Checks that need the values run in the operator: Paddle's ValueError carrying
    roicore's message, raised by the executor."""
    img, boxes, _ = batch()
    with static_program() as (main, x, b, n):
        outs = [rp.roi_pool(x, b, n, 2), rp.psroi_pool(x, b, n, 1), rp.roi_align(x, b, n, 2)]
        exe = paddle.static.Executor(paddle.CPUPlace())
        for out in outs:
            with pytest.raises(ValueError, match=message):
                exe.run(main, feed={"img": img, "boxes": boxes,
                                    "boxes_num": np.array(counts, "int32")}, fetch_list=[out])


def test_bad_inputs_to_a_reloaded_model(tmp_path):
    """A reloaded model runs no Python checks: the operators raise ValueError with
    roicore's message for wrong counts, coordinates and channel counts, and the process
    lives on."""
    mine, _ = twins()
    paddle.jit.save(paddle.jit.to_static(mine), str(tmp_path / "model"), input_spec=SPEC)
    img, boxes, _ = batch()
    np.savez(tmp_path / "io.npz", img, boxes)
    out = _run_python(f"""
        import numpy as np, paddle
        import roicore.adapters.paddle  # noqa: F401  (registers roicore's operators)
        d = np.load({str(tmp_path / 'io.npz')!r})
        img, boxes = d["arr_0"], d["arr_1"]
        model = paddle.jit.load({str(tmp_path / 'model')!r})
        nan = boxes.copy()
        nan[1, 2] = np.nan
        for b, n in ((boxes, [1, 1]), (boxes, [5, -1]), (nan, [1, 3])):
            try:
                model(paddle.to_tensor(img), paddle.to_tensor(b), paddle.to_tensor(n, "int32"))
                print("no error")
            except ValueError as exc:
                print("ValueError", " ".join(str(exc).split()))
        print("alive")
        """)
    lines = out.strip().splitlines()[-4:]
    assert "boxes_num must sum to the number of boxes (4), got sum(boxes_num) = 2" in lines[0], out
    assert lines[1].startswith("ValueError") and "boxes_num" in lines[1], out
    assert "coordinates must be finite, got nan in box 1" in lines[2], out
    assert lines[3] == "alive"


def test_operator_checks_what_python_would():
    """Called directly (as a reloaded model calls it), each operator refuses wrong ranks,
    dtypes and attributes with ValueError naming the argument."""
    native_ops = rp._operators()
    x = paddle.rand([2, 8, 6, 6])
    b = paddle.to_tensor([[0, 0, 4, 4], [1, 1, 3, 5.0]])
    n = paddle.to_tensor([1, 1], "int32")
    pool = dict(rules=rp._RULES["roi_pool"], pooled_height=2, pooled_width=2,
                spatial_scale=1.0, with_argmax=False, n_threads=0)

    def roi_pool(inputs, **attrs):
        return native_ops.run("roicore_roi_pool", dict(zip(("X", "Boxes", "BoxesNum"), inputs)),
                              {**pool, **attrs}, ("Out", "Argmax"))

    for inputs, attrs, message in [
            ((x[0], b, n), {}, r"x must be a 4-D \[N, C, H, W\] tensor, got shape \[8, 6, 6\]"),
            ((x.astype("int32"), b, n), {}, "x must be float32 or float64, got int32"),
            ((x, b[:, :3], n), {}, r"boxes must be a 2-D \[num_boxes, 4\] tensor"),
            ((x, b.astype("float64"), n), {}, r"boxes must have the dtype of x \(float32\)"),
            ((x, b, n.astype("float32")), {}, "boxes_num must be int32 or int64, got float32"),
            ((x, b, n), {"pooled_height": 0}, r"output_size must be >= 1, got \(0, 2\)"),
            ((x, b, n), {"rules": [9, 9]}, r"MaxPoolRules needs at least 6 fields \(bin_arithmetic "
                                           r"to argmax_dtype\), got 2"),
            ((x, b, n), {"spatial_scale": -1.0}, "spatial_scale must be positive")]:
        with pytest.raises(ValueError, match=message):
            roi_pool(inputs, **attrs)


def test_operators_share_roicore_cores_runtime_and_refuse_huge_outputs():
    """The operators' copy of the C library uses roicore.core's runtime: set_memory_limit
    bounds their outputs too (MemoryError), and sizes past int64 are refused, not
    allocated."""
    import roicore.core as rc
    native_ops = rp._operators()
    x = paddle.zeros([1, 64, 64, 64])
    b = paddle.to_tensor(np.tile([[0.0, 0, 60, 60]], (200, 1)).astype("float32"))
    n = paddle.to_tensor([200], "int32")
    attrs = dict(rules=rp._RULES["roi_align"], pooled_height=64, pooled_width=64,
                 spatial_scale=1.0, sampling_ratio=2, aligned=False, n_threads=0)

    def roi_align(**changed):
        return native_ops.run("roicore_roi_align", {"X": x, "Boxes": b, "BoxesNum": n},
                              {**attrs, **changed}, ("Out",))

    limit = rc.get_memory_limit()
    try:
        rc.set_memory_limit(64 << 20)
        with pytest.raises(MemoryError, match=r"the output of shape \[200, 64, 64, 64\] would "
                                              r"take 209715200 bytes, over roicore's memory "
                                              r"limit of 67108864 bytes"):
            roi_align()
        rc.set_memory_limit(0)   # no limit: sizes past int64 are still refused
        with pytest.raises(MemoryError, match="would take more than 2\\*\\*63 bytes"):
            roi_align(pooled_height=2**31 - 1, pooled_width=2**31 - 1)
    finally:
        rc.set_memory_limit(limit)


def test_argmax_recomputed_when_recorded_without_it():
    """roi_pool recorded without its argmax (no gradient was expected when it ran) still
    differentiates: the gradient operator recomputes the argmax, and the gradient is
    Paddle's."""
    img, boxes, num = batch()
    x = paddle.to_tensor(img, stop_gradient=False)
    b, n = paddle.to_tensor(boxes), paddle.to_tensor(num)
    out, argmax = rp._operators().run(
        "roicore_roi_pool", {"X": x, "Boxes": b, "BoxesNum": n},
        dict(rules=rp._RULES["roi_pool"], pooled_height=3, pooled_width=2, spatial_scale=0.5,
             with_argmax=False, n_threads=0), ("Out", "Argmax"))
    assert argmax.shape == [0]
    g = paddle.to_tensor(np.random.default_rng(1).standard_normal(out.shape).astype("float32"))
    out.backward(g)
    got = x.grad.numpy()
    x.clear_gradient()
    native.roi_pool(x, b, n, (3, 2), 0.5).backward(g)
    assert np.array_equal(got, x.grad.numpy())


def test_no_argmax_without_a_gradient():
    """In dygraph, roi_pool computes its argmax only when a gradient can be asked for."""
    img, boxes, num = batch()
    b, n = paddle.to_tensor(boxes), paddle.to_tensor(num)
    for x, grad in ((paddle.to_tensor(img), False), (paddle.to_tensor(img, stop_gradient=False),
                                                      True)):
        _, argmax = rl.roi_pool(x, b, 2, 2, rois_num=n, return_argmax=True)
        assert argmax.shape == [4, 3, 2, 2]  # asked for: always computed
        with paddle.no_grad():
            y = rp.roi_pool(x, b, n, 2)
        assert y.stop_gradient


@pytest.mark.parametrize("op", ["roi_pool", "psroi_pool", "roi_align"])
def test_dygraph_routes_outputs_of_8_mib_and_more_through_roicore_core(op, monkeypatch):
    """Small outputs run the operators; outputs of 8 MiB or more run roicore.core (whose
    freed outputs are reused).  Either way the output and gradient are Paddle's."""
    assert rp.LARGE_OUTPUT_BYTES == 8 << 20
    calls = []
    real = getattr(rp.core, op)
    monkeypatch.setattr(rp.core, op, lambda *a, **k: calls.append(op) or real(*a, **k))
    rng = np.random.default_rng(4)
    C, P = 32, 8                                   # 32 channels, 8 x 8 bins: 8 KiB per box
    x = paddle.to_tensor(rng.standard_normal((1, C, 20, 20)).astype("float32"),
                         stop_gradient=False)
    fn = {"roi_pool": lambda m, x, b, n: m.roi_pool(x, b, n, P, 0.5),
          "psroi_pool": lambda m, x, b, n: m.psroi_pool(x, b, n, 2, 0.5),
          "roi_align": lambda m, x, b, n: m.roi_align(x, b, n, P, 0.5, 2)}[op]
    per_box = C * 4 * (P * P if op != "psroi_pool" else 1)
    for k, large in ((16, False), (-(-(8 << 20) // per_box) - 1, False),
                     (-(-(8 << 20) // per_box), True)):
        xy = rng.uniform(0, 30, (k, 2))
        b = paddle.to_tensor(np.hstack([xy, xy + rng.uniform(1, 10, (k, 2))]).astype("float32"))
        n = paddle.to_tensor([k], "int32")
        calls.clear()
        y = fn(rp, x, b, n)
        assert bool(calls) == large and (y.size * 4 >= 8 << 20) == large
        g = paddle.ones_like(y)
        y.backward(g)
        got = x.grad.numpy()
        x.clear_gradient()
        theirs = fn(native, x, b, n)
        theirs.backward(g)
        assert np.array_equal(y.numpy(), theirs.numpy())
        assert np.array_equal(got, x.grad.numpy())
        x.clear_gradient()


# ----------------------------------------------------------------------------- building

def test_builds_from_nothing(tmp_path):
    """A machine that has never built the operators (an empty cache) compiles them when the
    adapter is imported, once, with the compiler's log beside the library; a second process
    reuses it."""
    env = dict(os.environ, ROICORE_CACHE_DIR=str(tmp_path / "cache"))
    code = """
        import numpy as np, paddle
        import roicore.adapters.paddle as rp
        from paddle.vision import ops as native
        x = paddle.rand([1, 4, 8, 8])
        b, n = paddle.to_tensor([[0, 0, 5, 6.0]]), paddle.to_tensor([1], "int32")
        same = np.array_equal(rp.roi_align(x, b, n, 2).numpy(),
                              native.roi_align(x, b, n, 2).numpy())
        print(rp.load_library(), rp._native is not None and same)
        """
    first = _run_python(code, timeout=600, env=env).strip().splitlines()[-1]
    path, ok = first.rsplit(" ", 1)
    assert ok == "True" and path.startswith(str(tmp_path / "cache")), first
    assert (pathlib.Path(path).parent / "build.log").exists()
    mtime = os.stat(path).st_mtime_ns
    second = _run_python(code, env=env).strip().splitlines()[-1]
    assert second == first and os.stat(path).st_mtime_ns == mtime


def test_without_a_compiler_dygraph_falls_back_and_says_why(tmp_path):
    """No compiler and nothing cached: dygraph computes on the NumPy path after one
    RuntimeWarning naming the missing compiler; a static program is refused with it."""
    env = dict(os.environ, ROICORE_CACHE_DIR=str(tmp_path / "cache"),
               CXX=str(tmp_path / "no-such-compiler"))
    out = _run_python("""
        import warnings, numpy as np, paddle
        import roicore.adapters.paddle as rp
        from paddle.vision import ops as native
        x = paddle.rand([1, 4, 8, 8])
        b, n = paddle.to_tensor([[0, 0, 5, 6.0]]), paddle.to_tensor([1], "int32")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = rp.roi_pool(x, b, n, 2)
            rp.roi_pool(x, b, n, 2)
        shown = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        print(len(shown), "no-such-compiler" in shown[0], rp._native is None)
        print(np.array_equal(y.numpy(), native.roi_pool(x, b, n, 2).numpy()))
        paddle.enable_static()
        with paddle.static.program_guard(paddle.static.Program()):
            xs = paddle.static.data("x", [None, 4, 8, 8], "float32")
            bs = paddle.static.data("b", [None, 4], "float32")
            ns = paddle.static.data("n", [None], "int32")
            try:
                rp.roi_pool(xs, bs, ns, 2)
            except RuntimeError as exc:
                print("refused", "no-such-compiler" in str(exc))
        """, env=env)
    assert out.strip().splitlines()[-3:] == ["1 True True", "True", "refused True"], out


def test_fluid_mapping_in_a_static_program():
    """In a static program the legacy functions take rois_num or lod (a constant), not both:
    their values cannot be compared before the program runs."""
    img, boxes, num = batch()
    with static_program() as (main, x, b, n):
        by_lod = rl.roi_pool(x, b, 2, 2, 0.5, lod=[[1, 3]])
        by_num = rl.roi_pool(x, b, 2, 2, 0.5, rois_num=n)
        with pytest.raises(ValueError, match="give rois_num or lod, not both"):
            rl.roi_pool(x, b, 2, 2, 0.5, rois_num=n, lod=[[1, 3]])
        got = paddle.static.Executor(paddle.CPUPlace()).run(
            main, feed={"img": img, "boxes": boxes, "boxes_num": num},
            fetch_list=[by_lod, by_num])
    want = native.roi_pool(*map(paddle.to_tensor, (img, boxes, num)), 2, 0.5).numpy()
    assert np.array_equal(got[0], want) and np.array_equal(got[1], want)
