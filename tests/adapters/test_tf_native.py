"""roicore's TensorFlow op library: built from the sources, registered ops in every graph,
SavedModels that reload in a fresh process with nothing but the library.

The adapter's numbers on the op library are checked against roicore.core and TensorFlow
in test_tf.py, test_tf_crop_and_resize.py and test_tf_training.py (which run on both the
library and the numpy_function fallback); this file checks what only the library does.
"""
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REQUIRE, framework

tf = framework("tensorflow", "the TensorFlow adapter needs tensorflow")
keras = framework("keras", "the TensorFlow adapter's layers need Keras 3")

from roicore.adapters import tf as rtf  # noqa: E402
from roicore.adapters.native import tf as native_tf  # noqa: E402

PYTHON_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "NumpyFunction"}


@pytest.fixture(scope="module")
def library():
    library = rtf.native_ops()
    if library is None:
        message = "roicore's TensorFlow op library is not available (see its NativeOpsWarning)"
        if REQUIRE:
            pytest.fail(message)
        pytest.skip(message)
    return library


def run_python(code, *args, env=None, timeout=600):
    """Run ``code`` in a fresh interpreter; returns its stdout (fails on a non-zero exit)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def op_types(graph_def):
    """Every op type in a GraphDef, its function library included."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


# ---------------------------------------------------------------------------------------
# The model every mode runs: each op on the same feature map, with its gradients

N, H, W, C, K = 2, 9, 11, 8, 6


def inputs(seed=0):
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((N, H, W, C)).astype(np.float32)
    y1, x1 = rng.uniform(0, 10, (2, K))
    boxes = np.stack([y1, x1, y1 + rng.uniform(2, 8, K), x1 + rng.uniform(2, 10, K)],
                     1).astype(np.float32)
    normalised = (boxes / 20).astype(np.float32)
    idx = rng.integers(0, N, K).astype(np.int32)
    return images, boxes, normalised, idx


OPS = {  # name: (call, whether the boxes are normalised and differentiable)
    "roi_pool_max": (lambda x, b, i: rtf.roi_pool(x, b, i, (3, 2), 0.5), False),
    "roi_pool_bilinear": (lambda x, b, i: rtf.roi_pool(x, b, i, (3, 4), method="bilinear"), True),
    "roi_pool_nearest": (lambda x, b, i: rtf.roi_pool(x, b, i, crop_size=(2, 3),
                                                      method="nearest"), True),
    "psroi_pool": (lambda x, b, i: rtf.psroi_pool(x, b, i, 2, 0.5), False),
    "roi_align": (lambda x, b, i: rtf.roi_align(x, b, i, (2, 3), 0.5, 2, aligned=True), False),
}
SIGNATURE = [tf.TensorSpec([None, H, W, C], tf.float32), tf.TensorSpec([None, 4], tf.float32),
             tf.TensorSpec([None, 4], tf.float32), tf.TensorSpec([None], tf.int32)]


def outputs_and_gradients(images, boxes, normalised, idx):
    """Every op's output and the gradients of sum(output * 1.5) with respect to the images
    and (crop methods) the boxes."""
    result = {}
    for name, (call, crop) in OPS.items():
        b = normalised if crop else boxes
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([images, b])
            y = call(images, b, idx)
            loss = tf.reduce_sum(y * 1.5)
        result[name] = y
        result[name + "/d_images"] = tape.gradient(loss, images)
        if crop:
            result[name + "/d_boxes"] = tape.gradient(loss, b)
    return result


class Detector(tf.Module):
    @tf.function(input_signature=SIGNATURE)
    def __call__(self, images, boxes, normalised, idx):
        return {name: call(images, normalised if crop else boxes, idx)
                for name, (call, crop) in OPS.items()}

    @tf.function(input_signature=SIGNATURE)
    def with_gradients(self, images, boxes, normalised, idx):
        return outputs_and_gradients(images, boxes, normalised, idx)


# ---------------------------------------------------------------------------------------
# Graphs hold roicore's registered ops, never a Python function

@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_graphs_hold_registered_ops_only(library, data_format):
    images, boxes, normalised, idx = inputs()
    if data_format == "NCHW":
        images = images.transpose(0, 3, 1, 2)

    def run(x, b, nb, i):
        result = {}
        for name, (call, crop) in OPS.items():
            box = nb if crop else b
            with tf.GradientTape(persistent=True) as tape:
                tape.watch([x, box])
                y = call(x, box, i) if data_format == "NHWC" else _nchw(name, x, box, i)
            result[name] = tape.gradient(y, [x, box] if crop else x)
        return result

    graph = tf.function(run).get_concrete_function(
        *(tf.TensorSpec(a.shape, a.dtype) for a in (images, boxes, normalised, idx))).graph
    types = op_types(graph.as_graph_def())
    assert not types & PYTHON_OPS, types & PYTHON_OPS
    assert {"RoicoreRoiPoolMax", "RoicoreRoiPoolMaxGrad", "RoicoreCropAndResize",
            "RoicoreCropAndResizeGradImage", "RoicoreCropAndResizeGradBoxes",
            "RoicorePsroiPool", "RoicorePsroiPoolGrad", "RoicoreRoiAlign",
            "RoicoreRoiAlignGrad"} <= types
    assert "Transpose" not in types  # the ops take either layout as it is


def _nchw(name, x, b, i):
    """OPS[name] on NCHW images."""
    return {"roi_pool_max": lambda: rtf.roi_pool(x, b, i, (3, 2), 0.5, data_format="NCHW"),
            "roi_pool_bilinear": lambda: rtf.roi_pool(x, b, i, (3, 4), method="bilinear",
                                                      data_format="NCHW"),
            "roi_pool_nearest": lambda: rtf.roi_pool(x, b, i, (2, 3), method="nearest",
                                                     data_format="NCHW"),
            "psroi_pool": lambda: rtf.psroi_pool(x, b, i, 2, 0.5, data_format="NCHW"),
            "roi_align": lambda: rtf.roi_align(x, b, i, (2, 3), 0.5, 2, True,
                                               data_format="NCHW")}[name]()


def test_static_shapes_from_the_shape_functions(library):
    """The registered shape functions give the output's static shape from what the inputs
    have; an unknown batch or box count stays unknown."""
    fn = tf.function(lambda x, b, i: rtf.psroi_pool(x, b, i, (3, 2), 0.5, group_size=2))
    y = fn.get_concrete_function(tf.TensorSpec([None, 9, 11, 8]), tf.TensorSpec([5, 4]),
                                 tf.TensorSpec([None], tf.int32)).structured_outputs
    assert y.shape.as_list() == [5, 3, 2, 2]
    fn = tf.function(lambda x, b, i: rtf.roi_align(x, b, i, 4, data_format="NCHW"))
    y = fn.get_concrete_function(tf.TensorSpec([None, 7, None, None]), tf.TensorSpec([None, 4]),
                                 tf.TensorSpec([None], tf.int32)).structured_outputs
    assert y.shape.as_list() == [None, 7, 4, 4]


def test_keras_predict_graphs_compute_no_argmax(library):
    """RoIPool in a graph called with training=False (Keras predict) asks the op for no
    argmax; called for training it does, and the gradient uses the forward's."""
    images, boxes, _, idx = inputs()
    layer = rtf.RoIPool((3, 2), 0.5)
    spec = [tf.TensorSpec(a.shape, a.dtype) for a in (images, boxes, idx)]

    def attrs(graph):
        return [node.attr["compute_argmax"].b for node in graph.as_graph_def().node
                if node.op == "RoicoreRoiPoolMax"]

    graph = tf.function(lambda x, b, i: layer(x, b, i, training=False)).get_concrete_function(
        *spec).graph
    assert attrs(graph) == [False]

    def train(x, b, i):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, b, i, training=True)
        return tape.gradient(y, x)

    assert attrs(tf.function(train).get_concrete_function(*spec).graph) == [True]


# ---------------------------------------------------------------------------------------
# SavedModel: saved here, reloaded in a fresh process that loads only the op library

RELOAD = """
    import sys
    import numpy as np
    import tensorflow as tf
    library, saved, data, out = sys.argv[1:5]
    tf.load_op_library(library)                # roicore's ops, nothing else of roicore
    model = tf.saved_model.load(saved)
    arrays = np.load(data)
    images, boxes, normalised, idx = (tf.constant(arrays[k]) for k in
                                      ("images", "boxes", "normalised", "idx"))
    result = {}
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([images, normalised])
        outputs = model(images, boxes, normalised, idx)
        losses = {k: tf.reduce_sum(v * 1.5) for k, v in outputs.items()}
    for name, y in outputs.items():
        result[name] = y.numpy()
        result[name + "/d_images"] = tape.gradient(losses[name], images).numpy()
        if "bilinear" in name or "nearest" in name:
            result[name + "/d_boxes"] = tape.gradient(losses[name], normalised).numpy()
    # the traced gradient signature too
    for name, value in model.with_gradients(images, boxes, normalised, idx).items():
        result["traced:" + name] = value.numpy()
    np.savez(out, **result)
    assert not [m for m in sys.modules if m.startswith("roicore")]
    print("RELOADED")
"""


def test_saved_model_reloads_with_only_the_op_library(library, tmp_path):
    images, boxes, normalised, idx = inputs(1)
    module = Detector()
    expected = {k: v.numpy() for k, v in outputs_and_gradients(
        *(tf.constant(a) for a in (images, boxes, normalised, idx))).items()}
    path = tmp_path / "detector"
    tf.saved_model.save(module, str(path))
    saved = tf.saved_model.load(str(path))  # (in-process load: same ops)
    types = op_types(_saved_graph(path))
    assert not types & PYTHON_OPS and "RoicoreCropAndResizeGradBoxes" in types
    np.savez(tmp_path / "inputs.npz", images=images, boxes=boxes, normalised=normalised, idx=idx)
    out = run_python(RELOAD, native_tf.library_path(), path, tmp_path / "inputs.npz",
                     tmp_path / "out.npz")
    assert "RELOADED" in out
    got = dict(np.load(tmp_path / "out.npz"))
    assert set(expected) | {"traced:" + k for k in expected} == set(got)
    for name, want in expected.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)
        np.testing.assert_array_equal(got["traced:" + name], want, err_msg=name)
        assert np.any(want), name
    in_process = saved(*(tf.constant(a) for a in (images, boxes, normalised, idx)))
    for name, value in in_process.items():
        np.testing.assert_array_equal(value.numpy(), expected[name])


def _saved_model_proto(path):
    from tensorflow.core.protobuf import saved_model_pb2
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((pathlib.Path(path) / "saved_model.pb").read_bytes())
    return saved


def _saved_graph(path):
    return _saved_model_proto(path).meta_graphs[0].graph_def


def test_a_saved_model_needs_the_op_library(library, tmp_path):
    """Without the library the loader names the missing op (what a deployment must ship)."""
    tf.saved_model.save(Detector(), str(tmp_path / "detector"))
    code = """
        import sys
        import tensorflow as tf
        try:
            tf.saved_model.load(sys.argv[1])
        except Exception as exc:
            print(type(exc).__name__, exc)
    """
    out = run_python(code, tmp_path / "detector")
    assert "Roicore" in out and "not registered" in out or "NotFoundError" in out, out


KERAS_RELOAD = """
    import sys
    import numpy as np
    import tensorflow as tf
    library, saved, data, out = sys.argv[1:5]
    tf.load_op_library(library)
    arrays = np.load(data)
    exported = tf.saved_model.load(saved)  # (kept: its variables live as long as it does)
    served = exported.serve([tf.constant(arrays["images"]), tf.constant(arrays["boxes"])])
    np.save(out, served.numpy())
    assert not [m for m in sys.modules if m.startswith("roicore")]
"""


def test_keras_model_export_serves_in_a_fresh_process(library, tmp_path):
    """Keras fit, then Model.export: the served SavedModel gives predict's numbers."""
    rng = np.random.default_rng(2)
    images = rng.standard_normal((4, H, W, 3)).astype(np.float32)
    y1, x1 = rng.uniform(0, 0.5, (2, 4, 3))
    boxes = np.stack([y1, x1, y1 + 0.4, x1 + 0.3], -1).astype(np.float32)   # (B, R, 4)
    im_in, box_in = keras.Input((H, W, 3)), keras.Input((3, 4))
    features = keras.layers.Conv2D(8, 3, padding="same")(im_in)
    # one set of boxes in [0, 1]: the crop methods' normalised boxes, and for the others
    # "image" coordinates that spatial_scale=10 maps onto the 9 x 11 feature map
    branches = [rtf.RoIPool((3, 3), 10.0)(features, box_in),
                rtf.RoIPool((3, 3), method="bilinear")(features, box_in),
                rtf.RoIAlign((3, 3), 10.0, sampling_ratio=2)(features, box_in),
                rtf.PSRoIPool(2, 10.0)(features, box_in)]
    flat = keras.layers.Concatenate()([keras.layers.Reshape((3, -1))(b) for b in branches])
    model = keras.Model([im_in, box_in], keras.layers.Dense(2)(flat))
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit([images, boxes], np.zeros((4, 3, 2)), batch_size=2, epochs=1, verbose=0)
    predicted = model.predict([images, boxes], batch_size=4, verbose=0)
    model.export(str(tmp_path / "exported"), verbose=False)
    types = op_types(_saved_graph(tmp_path / "exported"))
    assert not types & PYTHON_OPS and "RoicorePsroiPool" in types
    np.savez(tmp_path / "inputs.npz", images=images, boxes=boxes)
    run_python(KERAS_RELOAD, native_tf.library_path(), tmp_path / "exported",
               tmp_path / "inputs.npz", tmp_path / "served.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "served.npy"), predicted)


class Served(tf.Module):
    """A serving signature over images only (the boxes are constants of the graph)."""

    @tf.function(input_signature=[tf.TensorSpec([N, H, W, C], tf.float32, name="images")])
    def serve(self, images):
        _, boxes, normalised, idx = inputs(3)
        return {name: call(images, normalised if crop else boxes, idx)
                for name, (call, crop) in OPS.items()}


def test_a_c_program_serves_the_saved_model_with_tf_load_library(library, tmp_path):
    """What a C or C++ deployment does, with TensorFlow's C API and nothing of Python:
    TF_LoadLibrary on the op library, TF_LoadSessionFromSavedModel, TF_SessionRun."""
    from roicore.adapters.native import build
    tf_dir = pathlib.Path(tf.sysconfig.get_lib())
    program = tmp_path / "serve"
    subprocess.run([*build.find_compiler(), "-std=c++17", "-O1",
                    str(pathlib.Path(__file__).with_name("tf_c_api_serve.cc")),
                    f"-I{tf.sysconfig.get_include()}", f"-L{tf_dir}", "-l:libtensorflow_cc.so.2",
                    "-l:libtensorflow_framework.so.2", f"-Wl,-rpath,{tf_dir}", "-o", str(program)],
                   check=True, capture_output=True)
    module = Served()
    tf.saved_model.save(module, str(tmp_path / "served"),
                        signatures={"serving_default": module.serve})
    signature = _saved_model_proto(tmp_path / "served").meta_graphs[0].signature_def[
        "serving_default"]
    images = inputs(4)[0]
    images.tofile(tmp_path / "images.bin")
    expected = module.serve(tf.constant(images))
    for name, want in expected.items():
        out = tmp_path / f"{name}.bin"
        proc = subprocess.run([str(program), str(native_tf.library_path()),
                               str(tmp_path / "served"),
                               signature.inputs["images"].name, signature.outputs[name].name,
                               str(tmp_path / "images.bin"), str(out), *map(str, images.shape)],
                              capture_output=True, text=True,
                              env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert proc.returncode == 0, proc.stderr[-2000:]
        np.testing.assert_array_equal(np.fromfile(out, np.float32), want.numpy().ravel(),
                                      err_msg=name)


# ---------------------------------------------------------------------------------------
# Building

BUILD_AND_RUN = """
    import json, pathlib, sys
    import numpy as np
    import tensorflow as tf
    from roicore import core
    from roicore.adapters import tf as rtf          # compiles and loads: the cache is empty
    from roicore.adapters.native import tf as native_tf
    assert "module" in native_tf._loaded
    print(json.dumps({"path": str(native_tf.library_path())}))
    assert rtf.native_ops() is not None
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    boxes = rng.uniform(0, 18, (5, 4)).astype(np.float32)
    idx = np.array([0, 1, 1, 0, 1], np.int32)
    y = rtf.roi_align(x, boxes, idx, (3, 2), 0.5, data_format="NCHW")
    want = core.roi_align(x, boxes[:, [1, 0, 3, 2]], (3, 2), 0.5, batch_indices=idx)
    assert np.array_equal(y.numpy(), want)
    print("BUILT")
"""


def test_the_op_library_builds_from_the_sources_into_an_empty_cache(tmp_path):
    """A fresh cache (as on a fresh machine): importing the adapter compiles the library
    from the installed sources, keyed by TensorFlow's version, and loads it; the ops run on
    it."""
    cache = tmp_path / "cache"
    out = run_python(BUILD_AND_RUN, env={"ROICORE_CACHE_DIR": str(cache)})
    assert "BUILT" in out
    path = pathlib.Path(json.loads(out.splitlines()[0])["path"])
    assert path.parent.parent == cache and path.exists()
    key = json.loads((path.parent / "key.json").read_text())
    assert key["tensorflow"] == tf.__version__
    assert "-D_GLIBCXX_USE_CXX11_ABI=" in " ".join(key["tensorflow_compile_flags"])
    # the command line module prints the same (cached) library
    out = run_python("import runpy; runpy.run_module('roicore.adapters.native.tf', "
                     "run_name='__main__')", env={"ROICORE_CACHE_DIR": str(cache)})
    assert out.strip() == str(path)


NO_COMPILER = """
    import sys, warnings
    import numpy as np
    import tensorflow as tf
    from roicore.adapters import tf as rtf
    x = np.ones((1, 4, 4, 2), np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = rtf.roi_align(x, [[0.0, 0, 3, 3]], [0], 2)
    print([str(w.message) for w in caught if issubclass(w.category, rtf.NativeOpsWarning)])
    assert y.shape == (1, 2, 2, 2) and rtf.native_ops() is None
    class M(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([1, 4, 4, 2])])
        def f(self, x):
            return rtf.roi_align(x, [[0.0, 0, 3, 3]], [0], 2)
    try:
        tf.saved_model.save(M(), sys.argv[1])
    except NotImplementedError as exc:
        print("REFUSED", exc)
"""


def test_no_compiler_falls_back_and_says_why(tmp_path):
    out = run_python(NO_COMPILER, tmp_path / "sm", env={
        "ROICORE_CACHE_DIR": str(tmp_path / "cache"), "CXX": str(tmp_path / "no-compiler")})
    warned, refused = out.splitlines()[0], out.splitlines()[-1]
    assert "runs its ops through tf.numpy_function" in warned
    assert "NativeBuildError" in warned and "C++ compiler" in warned and "CXX=" in warned
    assert refused.startswith("REFUSED") and "without its native op library" in refused


# ---------------------------------------------------------------------------------------
# The raw ops validate everything a SavedModel caller could feed them

def test_raw_ops_refuse_bad_input_with_invalid_argument(library):
    images, boxes, _, idx = inputs()
    rules = rtf._rules("roi_align")
    common = dict(pooled_height=2, pooled_width=2, spatial_scale=0.5)
    cases = [
        (lambda: library.roicore_roi_align(images, boxes, idx, rules=[9, 9, 9, 9], **common),
         r"RoIAlignRules.sampler must be a code in \[0, 2\], got 9"),
        (lambda: library.roicore_roi_align(images, boxes, idx, rules=rules[:2], **common),
         r"RoIAlignRules needs at least 4 fields \(sampler to backward_min_size_always\), got 2"),
        (lambda: library.roicore_roi_align(images, boxes[:, :3], idx, rules=rules, **common),
         r"boxes must have shape \(K, 4\)"),
        (lambda: library.roicore_roi_align(images, boxes, idx[:2], rules=rules, **common),
         r"box_indices must have shape \(6,\)"),
        (lambda: library.roicore_roi_align(images, boxes * np.inf, idx, rules=rules, **common),
         "boxes"),
        (lambda: library.roicore_roi_align_grad(np.ones((K, 2, 2, C), np.float32), boxes, idx,
                                                [N, H, W, -1], spatial_scale=0.5, rules=rules),
         "image_size"),
        (lambda: library.roicore_roi_pool_max_grad(
            np.ones((K, 2, 2, C), np.float32), np.full((K, 2, 2, C), 10**6, np.int32), idx,
            [N, H, W, C], rules=rtf._rules("roi_pool/max")),
         "argmax"),
    ]
    import dataclasses
    from roicore.core import args
    int64_argmax = list(args.rules_codes(dataclasses.replace(rtf._MAX_RULES,
                                                             argmax_dtype="int64")))
    cases.append((lambda: library.roicore_roi_pool_max(
        images, boxes, idx, pooled_height=2, pooled_width=2, spatial_scale=0.5,
        rules=int64_argmax).argmax,
        r"rules asks for an int64 argmax \(argmax_dtype\), but this op's argmax output is "
        r"int32"))
    for call, message in cases:
        with pytest.raises(tf.errors.InvalidArgumentError, match=message):
            call()


def test_first_use_inside_tf_function_prints_nothing(library, tmp_path):
    """The first op of a process inside a tf.function, and a SavedModel export of a
    tf.Module, print no AutoGraph warnings: AutoGraph does not convert the adapter's Python
    (nor the op library's load and its compiler check).  A script file, as AutoGraph reads
    the source of what it converts."""
    script = tmp_path / "first_use.py"
    script.write_text(textwrap.dedent(f"""
        import tensorflow as tf
        from roicore.adapters import tf as rtf

        @tf.function
        def pooled(x, b, i):
            return rtf.roi_pool(x, b, i, 2), rtf.roi_align(x, b, i, 2)

        class Head(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None, 4, 4, 4]),
                                          tf.TensorSpec([None, 4]),
                                          tf.TensorSpec([None], tf.int32)])
            def __call__(self, x, b, i):
                return rtf.psroi_pool(x, b, i, 2)

        x, b, i = tf.ones((1, 4, 4, 4)), tf.constant([[0, 0, .5, .5]]), tf.constant([0])
        print([tuple(t.shape) for t in pooled(x, b, i)])
        tf.saved_model.save(Head(), {str(tmp_path / "saved")!r})
    """))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.splitlines()[-1] == "[(1, 2, 2, 4), (1, 2, 2, 4)]"
    assert "AutoGraph" not in proc.stdout + proc.stderr, proc.stderr


def test_sizes_past_a_tensor_raise_instead_of_aborting(library):
    """Forward sizes and gradient image sizes whose product overflows int64: TensorShape's
    constructor aborts the process on those, so each op builds its shapes with a status.
    In a fresh interpreter, as a failure here would end the test process."""
    out = run_python("""
        import numpy as np, tensorflow as tf
        from roicore.adapters import tf as rtf
        lib = rtf.native_ops()
        x, b, i = tf.zeros([1, 8, 8, 8]), tf.constant([[0., 0, 4, 4]]), tf.constant([0])
        big = (2**31 - 1, 2**31 - 1)
        g = np.ones((1, 2, 2, 8), np.float32)
        calls = {
            "roi_align": lambda: rtf.roi_align(x, b, i, big),
            "roi_pool": lambda: rtf.roi_pool(x, b, i, big),
            "crop": lambda: rtf.roi_pool(x, b / 8, i, big, method="bilinear"),
            "psroi": lambda: lib.roicore_psroi_pool(x, b, i, pooled_height=2**31 - 1,
                pooled_width=2**31 - 1, group_height=1, group_width=1, spatial_scale=1.0,
                rules=rtf._rules("psroi_pool")),
            "roi_align_grad": lambda: lib.roicore_roi_align_grad(g, b, i, [2**30] * 4,
                spatial_scale=1.0, rules=rtf._rules("roi_align")),
            "roi_pool_max_grad": lambda: lib.roicore_roi_pool_max_grad(
                g, np.zeros((1, 2, 2, 8), np.int32), i, [2**30] * 4,
                rules=rtf._rules("roi_pool/max")),
            "crop_grad": lambda: lib.roicore_crop_and_resize_grad_image(g, b / 8, i,
                [2**30] * 4, method="bilinear", rules=rtf._rules("roi_pool/bilinear")),
            "psroi_grad": lambda: lib.roicore_psroi_pool_grad(g, b, i, [2**30] * 4,
                group_height=1, group_width=1, spatial_scale=1.0, rules=rtf._rules("psroi_pool")),
        }
        for name, call in calls.items():
            for mode in ("eager", "tf.function"):
                try:
                    (tf.function(call, autograph=False) if mode != "eager" else call)()
                    print(name, mode, "returned")
                except tf.errors.InvalidArgumentError as e:
                    print(name, mode, "InvalidArgumentError", "more elements than a tensor can hold" in str(e))
    """)
    lines = out.strip().splitlines()
    assert len(lines) == 16, out
    for line in lines:
        assert line.endswith("InvalidArgumentError True"), line


def test_the_op_library_shares_roicore_cores_runtime(library):
    """set_memory_limit reaches the op library's outputs, and release_output_cache its
    kept scratch: the library's copy of the C library uses roicore.core's runtime."""
    import roicore.core as rc
    from roicore.adapters.native import tf as native_tf
    assert native_tf._loaded["shared_runtime"]
    x = tf.zeros([1, 64, 64, 64])
    b, i = tf.tile(tf.constant([[0., 0, 60, 60]]), [200, 1]), tf.zeros([200], tf.int32)
    limit = rc.get_memory_limit()
    try:
        rc.set_memory_limit(64 << 20)
        with pytest.raises(tf.errors.ResourceExhaustedError,
                           match=r"the output of shape \[200,64,64,64\] would take 209715200 "
                                 r"bytes, over roicore's memory limit of 67108864 bytes"):
            rtf.roi_align(x, b, i, (64, 64))
    finally:
        rc.set_memory_limit(limit)
    rc.release_output_cache()
    # a psroi pass in NHWC keeps its NCHW copy of the images (1 MiB or more) as scratch
    rtf.psroi_pool(tf.ones([1, 64, 64, 4 * 49]), b[:2], i[:2], 7)
    assert rc.release_output_cache() >= 64 * 64 * 4 * 49 * 4


def test_shape_functions_check_ranks_before_reading_dimensions(library):
    """In a graph, images of the wrong rank reached c->Dim(images, 3) before any rank check
    (psroi_pool, roi_align, crop_and_resize, roi_pool): a read past the shape, a segfault
    (found by tests/fuzz/fuzz_native.py).  In a fresh interpreter: a crash ends it."""
    out = run_python("""
        import tensorflow as tf
        from roicore.adapters import tf as rtf
        lib = rtf.native_ops()
        x, b, i = tf.zeros([1, 3], tf.float64), tf.zeros([0, 4], tf.float64), tf.zeros([0], tf.int64)
        calls = {
            "psroi": lambda: lib.roicore_psroi_pool(x, b, i, pooled_height=1, pooled_width=1,
                group_height=2**20, group_width=1, spatial_scale=0.0625,
                rules=rtf._rules("psroi_pool")),
            "roi_align": lambda: lib.roicore_roi_align(x, b, i, pooled_height=2, pooled_width=2,
                spatial_scale=1.0, rules=rtf._rules("roi_align")),
            "crop": lambda: lib.roicore_crop_and_resize(x, b, i, crop_height=2, crop_width=2,
                rules=rtf._rules("roi_pool/bilinear")),
            "max": lambda: lib.roicore_roi_pool_max(x, b, i, pooled_height=2, pooled_width=2,
                spatial_scale=1.0, rules=rtf._rules("roi_pool/max")),
        }
        for name, call in calls.items():
            try:
                tf.function(call, autograph=False)()
                print(name, "returned")
            except ValueError as e:
                print(name, "ValueError", "must be rank 4" in str(e))
    """)
    assert out.split("\n")[-5:-1] == [f"{n} ValueError True" for n in ("psroi", "roi_align",
                                                                       "crop", "max")], out
