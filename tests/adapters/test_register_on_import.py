"""Importing roicore.adapters.tf or roicore.adapters.paddle registers roicore's native ops,
so that a process loads a saved model holding them after nothing but that import.

Each model is saved in one fresh process and reloaded in another, as a serving process
would, and must compute the same bits (and differentiate).  Where the ops cannot be had
(switched off, no compiler), the import still succeeds, prints nothing, and the ops run
through the fallback with the warning at the first call, as before.
"""
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from frameworks import framework_installed


def run_python(code, *args, cwd, env=None):
    """Run ``code`` as a script in ``cwd`` (to_static reads its source) in a fresh
    interpreter; returns (stdout, stderr), failing on an error."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    script = pathlib.Path(cwd) / "script.py"
    script.write_text(textwrap.dedent(code))
    proc = subprocess.run([sys.executable, str(script), *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=cwd)
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"
    return proc.stdout, proc.stderr


def assert_same(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert np.array_equal(got[key], value), key
        assert np.any(value), key


def roicore_lines(stderr):
    """What roicore printed: its compile notice, its warnings (named by their category or
    message) and tracebacks."""
    return [line for line in stderr.splitlines()
            if "roicore" in line or "NativeOpsWarning" in line or "Traceback" in line]


# ---------------------------------------------------------------------------------------
# TensorFlow

TF_SAVE = """
    import sys
    import numpy as np
    import tensorflow as tf
    from roicore.adapters import tf as rtf
    from roicore.adapters.native import tf as native_tf

    rng = np.random.default_rng(5)
    images = rng.standard_normal((2, 9, 11, 8)).astype(np.float32)
    boxes = np.float32([[1, 0.5, 14, 12], [2.5, 3, 9, 18], [2, -4, 17.5, 30], [0.75, 1, 15, 9]])
    normalised = np.float32(boxes / 20)
    idx = np.int32([0, 0, 1, 1])

    class Model(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 9, 11, 8]),
                                      tf.TensorSpec([None, 4]), tf.TensorSpec([None, 4]),
                                      tf.TensorSpec([None], tf.int32)])
        def __call__(self, x, b, n, i):
            return {"roi_pool_max": rtf.roi_pool(x, b, i, (2, 3), 0.5),
                    "roi_pool_bilinear": rtf.roi_pool(x, n, i, (3, 2), method="bilinear"),
                    "psroi_pool": rtf.psroi_pool(x, b, i, 2, 0.5),
                    "roi_align": rtf.roi_align(x, b, i, (2, 3), 0.5, 2, aligned=True)}

    def outputs_and_gradients(model):
        x, b, n, i = (tf.constant(a) for a in (images, boxes, normalised, idx))
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([x, n])
            out = model(x, b, n, i)
            losses = {name: tf.reduce_sum(y * 1.5) for name, y in out.items()}
        got = {}
        for name, y in out.items():
            got[name] = y.numpy()
            got[name + "/d_images"] = tape.gradient(losses[name], x).numpy()
            if name == "roi_pool_bilinear":
                got[name + "/d_boxes"] = tape.gradient(losses[name], n).numpy()
        return got

    model = Model()
    tf.saved_model.save(model, sys.argv[1] + "/model")
    np.savez(sys.argv[1] + "/inputs.npz", images=images, boxes=boxes, normalised=normalised,
             idx=idx)
    np.savez(sys.argv[1] + "/expected.npz", **outputs_and_gradients(model))
    print(native_tf.library_path())
"""

# the reloading process: a plain import of the adapter, then TensorFlow's own loader
TF_RELOAD = """
    import sys
    import numpy as np
    import roicore.adapters.tf  # noqa: F401
    import tensorflow as tf

    root = sys.argv[1]
    model = tf.saved_model.load(root + "/model")
    a = np.load(root + "/inputs.npz")
    x, b, n, i = (tf.constant(a[k]) for k in ("images", "boxes", "normalised", "idx"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([x, n])
        out = model(x, b, n, i)
        losses = {name: tf.reduce_sum(y * 1.5) for name, y in out.items()}
    got = {}
    for name, y in out.items():
        got[name] = y.numpy()
        got[name + "/d_images"] = tape.gradient(losses[name], x).numpy()
        if name == "roi_pool_bilinear":
            got[name + "/d_boxes"] = tape.gradient(losses[name], n).numpy()
    np.savez(sys.argv[2], **got)
    print("RELOADED")
"""


@pytest.fixture(scope="module")
def tf_saved_model(tmp_path_factory):
    """(directory, op library path): a SavedModel of every op, saved by a fresh process,
    with its inputs and the outputs and gradients it computed."""
    framework_installed("tensorflow", "the TensorFlow adapter needs tensorflow")
    root = tmp_path_factory.mktemp("tf_saved")
    out, _ = run_python(TF_SAVE, root, cwd=root)
    return root, out.strip().splitlines()[-1]


def test_a_tf_saved_model_loads_after_a_plain_import(tf_saved_model, tmp_path):
    """The reported failure (Op type not registered 'RoicoreRoiPoolMaxGrad'): the import
    alone registers the ops, the model computes the saved process's bits and
    differentiates, and the import of a cached library prints nothing."""
    root, _ = tf_saved_model
    out, err = run_python(TF_RELOAD, root, tmp_path / "got.npz", cwd=tmp_path)
    assert "RELOADED" in out
    assert not roicore_lines(err), err
    assert_same(dict(np.load(tmp_path / "got.npz")), dict(np.load(root / "expected.npz")))


def test_the_import_loads_the_library_that_ROICORE_TF_OP_LIBRARY_names(tf_saved_model, tmp_path):
    """A machine with no compiler and an empty cache, given a library built elsewhere:
    the import loads that file, and the model reloads on it."""
    root, library = tf_saved_model
    env = {"ROICORE_TF_OP_LIBRARY": library, "ROICORE_CACHE_DIR": str(tmp_path / "cache"),
           "CXX": str(tmp_path / "no-compiler")}
    out, err = run_python(TF_RELOAD, root, tmp_path / "got.npz", env=env, cwd=tmp_path)
    assert "RELOADED" in out
    assert not roicore_lines(err), err
    assert not (tmp_path / "cache").exists()
    assert_same(dict(np.load(tmp_path / "got.npz")), dict(np.load(root / "expected.npz")))


TF_FALLBACK = """
    import warnings
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework import op_def_registry
    with warnings.catch_warnings(record=True) as at_import:
        warnings.simplefilter("always")
        from roicore.adapters import tf as rtf
    x = np.random.default_rng(0).standard_normal((2, 6, 7, 3)).astype(np.float32)
    boxes, idx = np.float32([[0.1, 0.2, 0.9, 0.7], [0, 0, 0.5, 1]]), np.int32([1, 0])
    with warnings.catch_warnings(record=True) as at_call:
        warnings.simplefilter("always")
        y = rtf.roi_pool(x, boxes, idx, (3, 2), method="bilinear")
        rtf.roi_pool(x, boxes, idx, (3, 2), method="bilinear")
    want = tf.image.crop_and_resize(x, boxes, idx, (3, 2))
    print(len(at_import), op_def_registry.get("RoicoreRoiAlign") is None,
          rtf.native_ops() is None, bool(np.array_equal(y.numpy(), want.numpy())))
    print([str(w.message) for w in at_call])
"""


@pytest.mark.parametrize("case", ["switched off", "no compiler"])
def test_tf_import_succeeds_without_the_op_library(case, tmp_path):
    """ROICORE_TF_NATIVE=0, or no compiler and nothing cached: the import succeeds quietly
    and registers nothing; the ops compute through tf.numpy_function, and only a library
    that could not be built is reported, once, at the first call."""
    framework_installed("tensorflow", "the TensorFlow adapter needs tensorflow")
    env = {"ROICORE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(tmp_path / "no-compiler")}
    if case == "switched off":
        env["ROICORE_TF_NATIVE"] = "0"
    out, err = run_python(TF_FALLBACK, env=env, cwd=tmp_path)
    first, warned = out.strip().splitlines()[-2:]
    assert first == "0 True True True", out
    if case == "switched off":
        assert warned == "[]", out
    else:
        assert warned.count("runs its ops through tf.numpy_function") == 1, out
        assert "NativeBuildError" in warned and "no-compiler" in warned, out
    assert not roicore_lines(err), err


# ---------------------------------------------------------------------------------------
# Paddle

PADDLE_SAVE = """
    import sys
    import numpy as np
    import paddle
    from paddle.static import InputSpec
    from roicore.adapters import paddle as rp

    class Net(paddle.nn.Layer):
        def forward(self, x, boxes, boxes_num):
            return (rp.roi_pool(x, boxes, boxes_num, (2, 3), 0.5),
                    rp.psroi_pool(x, boxes, boxes_num, 2, 0.5),
                    rp.roi_align(x, boxes, boxes_num, (3, 2), 0.5, sampling_ratio=2))

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 8, 9, 11)).astype(np.float32)
    boxes = np.float32([[0.5, 1, 12.3, 14.1], [3, 2.5, 18, 9], [-4, 2, 30, 17.5],
                        [1.25, 0.75, 9.75, 15.25]])
    counts = np.int32([2, 2])
    spec = [InputSpec([None, 8, 9, 11], "float32", "x"),
            InputSpec([None, 4], "float32", "boxes"), InputSpec([None], "int32", "boxes_num")]
    paddle.jit.save(paddle.jit.to_static(Net(), input_spec=spec, full_graph=True),
                    sys.argv[1] + "/model")
    # what the saved program computes here (its gradients sum in another order than
    # dygraph's), and its outputs are dygraph's
    model = paddle.jit.load(sys.argv[1] + "/model")
    model.train()
    xt = paddle.to_tensor(x, stop_gradient=False)
    outs = model(xt, paddle.to_tensor(boxes), paddle.to_tensor(counts))
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    expected = {f"out{i}": o.numpy() for i, o in enumerate(outs)}
    eager = Net()(*map(paddle.to_tensor, (x, boxes, counts)))
    assert all(np.array_equal(e.numpy(), expected[f"out{i}"]) for i, e in enumerate(eager))
    np.savez(sys.argv[1] + "/inputs.npz", x=x, boxes=boxes, boxes_num=counts)
    np.savez(sys.argv[1] + "/expected.npz", d_x=xt.grad.numpy(), **expected)
"""

# the reloading process: a plain import of the adapter, then Paddle's loader and predictor
PADDLE_RELOAD = """
    import sys
    import numpy as np
    import paddle
    from paddle import inference
    import roicore.adapters.paddle  # noqa: F401

    root = sys.argv[1]
    a = np.load(root + "/inputs.npz")
    model = paddle.jit.load(root + "/model")
    model.train()
    x = paddle.to_tensor(a["x"], stop_gradient=False)
    outs = model(x, paddle.to_tensor(a["boxes"]), paddle.to_tensor(a["boxes_num"]))
    got = {f"out{i}": o.numpy() for i, o in enumerate(outs)}
    sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
    got["d_x"] = x.grad.numpy()

    config = inference.Config(root + "/model.json", root + "/model.pdiparams")
    config.disable_gpu()
    config.disable_glog_info()
    predictor = inference.create_predictor(config)
    for name in predictor.get_input_names():
        handle = predictor.get_input_handle(name)
        handle.reshape(a[name].shape)
        handle.copy_from_cpu(a[name])
    predictor.run()
    for i, name in enumerate(predictor.get_output_names()):
        got[f"predictor/out{i}"] = predictor.get_output_handle(name).copy_to_cpu()
    np.savez(sys.argv[2], **got)
    print("RELOADED")
"""


def test_a_paddle_saved_model_loads_after_a_plain_import(tmp_path):
    """The reported failure (run_program: "kernel output args (0) defs should equal op
    outputs (1)"): after the import alone, paddle.jit.load and a paddle.inference
    predictor compute the saving process's bits, gradients included, and the import of a
    cached library prints nothing."""
    framework_installed("paddle", "the Paddle adapter needs paddlepaddle")
    root = tmp_path / "saved"
    root.mkdir()
    run_python(PADDLE_SAVE, root, cwd=tmp_path)
    out, err = run_python(PADDLE_RELOAD, root, tmp_path / "got.npz", cwd=tmp_path)
    assert "RELOADED" in out
    assert not roicore_lines(err), err
    expected = dict(np.load(root / "expected.npz"))
    expected.update({f"predictor/{k}": v for k, v in expected.items() if k.startswith("out")})
    assert_same(dict(np.load(tmp_path / "got.npz")), expected)


PADDLE_FALLBACK = """
    import warnings
    import numpy as np
    import paddle
    from paddle.base.framework import OpProtoHolder
    from paddle.vision import ops as native
    with warnings.catch_warnings(record=True) as at_import:
        warnings.simplefilter("always")
        import roicore.adapters.paddle as rp
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((1, 4, 8, 8)), "float32")
    b, n = paddle.to_tensor([[0, 0, 5, 6.0], [1, 2, 7, 7]]), paddle.to_tensor([2], "int32")
    with warnings.catch_warnings(record=True) as at_call:
        warnings.simplefilter("always")
        y = rp.roi_align(x, b, n, 2)
        rp.roi_align(x, b, n, 2)
    print(len(at_import), OpProtoHolder.instance().has_op_proto("roicore_roi_align"),
          rp._native is None, bool(np.array_equal(y.numpy(), native.roi_align(x, b, n, 2).numpy())))
    print([str(w.message) for w in at_call])
"""


@pytest.mark.parametrize("case", ["switched off", "no compiler"])
def test_paddle_import_succeeds_without_the_operators(case, tmp_path):
    """ROICORE_NATIVE_OPS=0, or no compiler and nothing cached: the import succeeds quietly
    and registers nothing; dygraph computes through roicore.core, and only operators that
    could not be built are reported, once, at the first call."""
    framework_installed("paddle", "the Paddle adapter needs paddlepaddle")
    env = {"ROICORE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(tmp_path / "no-compiler")}
    if case == "switched off":
        env["ROICORE_NATIVE_OPS"] = "0"
    out, err = run_python(PADDLE_FALLBACK, env=env, cwd=tmp_path)
    first, warned = out.strip().splitlines()[-2:]
    assert first == "0 False True True", out
    if case == "switched off":
        assert warned == "[]", out
    else:
        assert warned.count("roicore's Paddle operators are unavailable") == 1, out
        assert "NativeBuildError" in warned and "no-compiler" in warned, out
    assert not roicore_lines(err), err
