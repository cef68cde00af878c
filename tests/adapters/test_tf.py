"""roicore.adapters.tf: equal to roicore.core bit for bit, differentiable, traceable, Keras-usable.

The adapter only converts layout (NHWC <-> NCHW, [y1, x1, y2, x2] -> [x1, y1, x2, y2]), so
every forward and gradient is compared with the core on the same NumPy inputs with
``np.array_equal``; the core itself is checked against the loop references in tests/.
"""

import re

import numpy as np
import pytest

from conftest import framework

tf = framework("tensorflow", "the TensorFlow adapter needs tensorflow")
keras = framework("keras", "the TensorFlow adapter's layers need Keras 3")

from roicore.adapters import tf as rtf  # noqa: E402
from tf_cases import (  # noqa: E402
    DTYPES, FORMATS, OPS, call_adapter, core_backward, core_forward, forward_and_grad,
    from_format, make_case, params, to_format)

# every test runs on the native op library and on the tf.numpy_function fallback
pytestmark = pytest.mark.usefixtures("tf_path")

# ---------------------------------------------------------------------------------------
# Adapter == core

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("op", OPS)
def test_forward_and_gradient_match_core(op, data_format, dtype):
    for seed in range(3):
        x, boxes, idx = make_case(op, seed, dtype)
        y_core = core_forward(op, x, boxes, idx)
        dy = np.random.default_rng(seed + 100).standard_normal(y_core.shape).astype(dtype)
        y, g = forward_and_grad(op, to_format(x, data_format), boxes, idx,
                                to_format(dy, data_format), data_format)
        assert y.dtype == dtype and g.dtype == dtype
        np.testing.assert_array_equal(from_format(y.numpy(), data_format), y_core)
        np.testing.assert_array_equal(from_format(g.numpy(), data_format),
                                      core_backward(op, dy, x, boxes, idx))


@pytest.mark.parametrize("op", [op for op in OPS if op != "roi_pool_bilinear"])
def test_boxes_get_no_gradient_and_int64_indices_work(op):
    """Only the crop methods differentiate the boxes (tests/adapters/test_tf_crop_and_resize.py)."""
    x, boxes, idx = make_case(op)
    images, boxes_t = tf.constant(to_format(x, "NHWC")), tf.constant(boxes)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([images, boxes_t])
        y = call_adapter(op, images, boxes_t, idx.astype(np.int64))
    assert tape.gradient(y, boxes_t) is None
    assert tape.gradient(y, images) is not None
    np.testing.assert_array_equal(from_format(y.numpy(), "NHWC"), core_forward(op, x, boxes, idx))


@pytest.mark.parametrize("op", OPS)
def test_no_boxes_gives_empty_output_and_zero_gradient(op):
    x, _, _ = make_case(op)
    y, g = forward_and_grad(op, x, np.zeros((0, 4), np.float32), np.zeros(0, np.int32),
                            np.zeros((0,) + core_forward(op, x, *make_case(op)[1:]).shape[1:],
                                     np.float32), "NCHW")
    assert y.shape[0] == 0 and not np.any(g.numpy())


def test_n_threads_does_not_change_results():
    x, boxes, idx = make_case("roi_align", K=40)
    outs = [forward_and_grad("roi_align", x, boxes, idx, np.ones((40, 3, 2, 3)), "NCHW",
                             n_threads=n) for n in (1, 2)]
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


# ---------------------------------------------------------------------------------------
# Gradients vs numerical differentiation (float64)

@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("op", OPS)
def test_gradient_matches_tf_compute_gradient(op, data_format):
    # compute_gradient runs the op twice per input element: keep the maps tiny
    kw = {"output_size": 2} if op == "psroi_pool" else {}
    x, boxes, idx = make_case(op, 0, np.float64, N=2, C=4 if op == "psroi_pool" else 2,
                              H=4, W=5, K=4)
    images = tf.constant(to_format(x, data_format))
    theoretical, numerical = tf.test.compute_gradient(
        lambda im: call_adapter(op, im, boxes, idx, data_format, **kw), [images], delta=1e-4)
    assert np.any(theoretical[0])
    np.testing.assert_allclose(theoretical[0], numerical[0], rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------
# Graph mode: tf.function, static shapes

@pytest.mark.parametrize("data_format", FORMATS)
@pytest.mark.parametrize("op", OPS)
def test_tf_function_equals_eager(op, data_format):
    x, boxes, idx = make_case(op)
    images = to_format(x, data_format)
    dy = np.ones_like(from_format(call_adapter(op, images, boxes, idx, data_format).numpy(),
                                  data_format))
    eager = forward_and_grad(op, images, boxes, idx, to_format(dy, data_format), data_format)
    graph = tf.function(forward_and_grad, autograph=False)(
        op, tf.constant(images), tf.constant(boxes), tf.constant(idx),
        tf.constant(to_format(dy, data_format)), data_format)
    for a, b in zip(eager, graph):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("op,channels_out", [("roi_pool_max", 18), ("roi_pool_bilinear", 18),
                                              ("psroi_pool", 2), ("roi_align", 18)])
def test_static_shapes_are_set_in_tf_function(op, channels_out):
    kw = {**params(op), "output_size": (3, 3)}
    specs = [tf.TensorSpec([None, 9, 11, 18], tf.float32), tf.TensorSpec([None, 4], tf.float32),
             tf.TensorSpec([None], tf.int32)]

    def fn(images, boxes, idx):
        with tf.GradientTape() as tape:
            tape.watch(images)
            y = call_adapter(op, images, boxes, idx, "NHWC", **kw)
        return y, tape.gradient(y, images)

    y, g = tf.function(fn).get_concrete_function(*specs).structured_outputs
    assert y.shape.as_list() == [None, 3, 3, channels_out]
    assert g.shape.as_list() == [None, 9, 11, 18]
    specs[1] = tf.TensorSpec([5, 4], tf.float32)
    y, _ = tf.function(fn).get_concrete_function(*specs).structured_outputs
    assert y.shape.as_list() == [5, 3, 3, channels_out]


# ---------------------------------------------------------------------------------------
# Keras 3 layers

def _keras_model(layer, data_format="channels_last"):
    shape = (9, 11, 4) if data_format == "channels_last" else (4, 9, 11)
    images = keras.Input(shape)
    boxes = keras.Input((4,))
    idx = keras.Input((), dtype="int32")
    feats = keras.layers.Conv2D(18, 3, padding="same",  # TF's CPU Conv2D is NHWC only
                                kernel_initializer=keras.initializers.GlorotUniform(0))(
        images if data_format == "channels_last" else keras.layers.Permute((2, 3, 1))(images))
    if data_format == "channels_first":
        feats = keras.layers.Permute((3, 1, 2))(feats)
    pooled = layer(feats, boxes, idx)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))(
        keras.layers.Flatten()(pooled))
    return keras.Model([images, boxes, idx], out)


LAYERS = [
    lambda df: rtf.RoIPool((3, 2), 0.5, data_format=df),
    lambda df: rtf.RoIPool(3, method="bilinear", extrapolation_value=0.5, data_format=df),
    lambda df: rtf.PSRoIPool(3, 0.5, output_channels=2, data_format=df),
    lambda df: rtf.RoIAlign((2, 3), 0.5, sampling_ratio=2, aligned=True, data_format=df),
]


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("make_layer", LAYERS, ids=["max", "bilinear", "psroi", "align"])
def test_keras_layer_trains_in_a_model(make_layer, data_format, tmp_path):
    layer = make_layer(data_format)
    op = "roi_pool_bilinear" if getattr(layer, "method", "") == "bilinear" else "roi_align"
    x, boxes, idx = make_case(op, N=4, C=4, K=4)
    idx = np.arange(4, dtype=np.int32)  # one box per image: Keras slices all inputs alike
    images = x if data_format == "channels_first" else to_format(x, "NHWC")
    model = _keras_model(layer, data_format)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")  # jit_compile="auto"
    before = [w.numpy().copy() for w in model.trainable_weights]
    history = model.fit([images, boxes, idx], np.ones((4, 1)), batch_size=4, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    assert all(not np.array_equal(a, w.numpy()) for a, w in zip(before, model.trainable_weights))
    # serialisation: config round trip and a .keras file give the same predictions
    clone = type(layer).from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded([images, boxes, idx]), model([images, boxes, idx]))


BATCHED = [
    ("roi_pool_max", lambda df: rtf.RoIPool((3, 2), 0.5, data_format=df)),
    ("roi_pool_bilinear", lambda df: rtf.RoIPool(3, method="bilinear", data_format=df)),
    ("psroi_pool", lambda df: rtf.PSRoIPool(3, 0.5, output_channels=2, data_format=df)),
    ("roi_align", lambda df: rtf.RoIAlign((2, 3), 0.5, sampling_ratio=2, data_format=df)),
]


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("op,make_layer", BATCHED, ids=[op for op, _ in BATCHED])
def test_keras_layers_take_batched_boxes(op, make_layer, data_format):
    """(B, R, 4) boxes without box_indices: row b holds the boxes of image b, and the result
    is (B, R, ...), the flat call's rows in the same order; gradients match too."""
    layer = make_layer(data_format)
    fmt = "NCHW" if data_format == "channels_first" else "NHWC"
    x, boxes, _ = make_case(op, 4, N=3, C=18, K=12)
    images = tf.constant(to_format(x, fmt))
    batched = boxes.reshape(3, 4, 4)
    flat_idx = np.repeat(np.arange(3, dtype=np.int32), 4)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(images)
        y = layer(images, batched)
        y_flat = layer(images, boxes, flat_idx)
    assert y.shape == (3, 4) + tuple(y_flat.shape[1:])
    np.testing.assert_array_equal(y.numpy().reshape(y_flat.shape), y_flat.numpy())
    dy = np.random.default_rng(1).standard_normal(y_flat.shape).astype(np.float32)
    np.testing.assert_array_equal(tape.gradient(y, images, dy.reshape(y.shape)).numpy(),
                                  tape.gradient(y_flat, images, dy).numpy())
    # in a graph, with the batch size unknown until run time, the same
    fn = tf.function(lambda im, b: layer(im, b), input_signature=[
        tf.TensorSpec([None, *images.shape[1:]], tf.float32),
        tf.TensorSpec([None, 4, 4], tf.float32)])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None, 4, *y.shape[2:]]
    np.testing.assert_array_equal(fn(images, batched).numpy(), y.numpy())
    with pytest.raises(tf.errors.InvalidArgumentError, match="batch sizes of images and boxes differ"):
        fn(images, batched[:2])


def test_keras_model_with_batched_boxes_fits_and_predicts():
    """Keras checks that every input has the same batch size: batched boxes pass it with
    several boxes per image, and predict's batches are concatenated along the image axis."""
    x, boxes, _ = make_case("roi_align", 2, N=6, C=4, K=18)
    images = to_format(x, "NHWC")
    inputs = [keras.Input((9, 11, 4)), keras.Input((3, 4))]
    feats = keras.layers.Conv2D(6, 3, padding="same",
                                kernel_initializer=keras.initializers.GlorotUniform(0))(inputs[0])
    pooled = rtf.RoIAlign((2, 3), 0.5, sampling_ratio=2)(feats, inputs[1])   # (B, 3, 2, 3, 6)
    out = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))(
        keras.layers.Reshape((3, -1))(pooled))                              # (B, 3, 1)
    model = keras.Model(inputs, out)
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    batched = boxes.reshape(6, 3, 4)
    history = model.fit([images, batched], np.ones((6, 3, 1)), batch_size=2, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    predicted = model.predict([images, batched], batch_size=4, verbose=0)
    np.testing.assert_array_equal(predicted, model([images, batched]).numpy())
    with pytest.raises(ValueError, match="images have a batch of 6, boxes of 5"):
        rtf.RoIAlign(2)(images, batched[:5])
    with pytest.raises(ValueError, match=r"boxes must be batched, \(B, R, 4\)"):
        rtf.RoIAlign(2)(images, boxes)


def test_keras_layer_equals_op():
    x, boxes, idx = make_case("roi_align")
    layer = rtf.RoIAlign((2, 3), 0.5, sampling_ratio=2, data_format="NCHW")
    np.testing.assert_array_equal(layer(x, boxes, idx),
                                  call_adapter("roi_align", x, boxes, idx, "NCHW"))
    assert layer.get_config()["data_format"] == "channels_first"


def test_keras_jit_compile_true_falls_back_with_a_warning():
    # the layers declare supports_jit = False, so Keras itself turns XLA off and says so
    x, boxes, idx = make_case("roi_align", N=4, C=4, K=4)
    model = _keras_model(rtf.RoIAlign(2, 0.5))
    with pytest.warns(UserWarning, match="doesn't support `jit_compile=True`"):
        model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    assert model.jit_compile is False
    model.fit([to_format(x, "NHWC"), boxes, np.arange(4, dtype=np.int32)], np.ones((4, 1)),
              batch_size=4, verbose=0)


def test_keras_layer_under_an_xla_function_is_refused_clearly():
    x, boxes, idx = make_case("roi_align")
    layer = rtf.RoIAlign(2, 0.5, data_format="channels_first")
    with pytest.raises(NotImplementedError, match="XLA"):
        tf.function(lambda im: layer(im, boxes, idx), jit_compile=True)(x)


# ---------------------------------------------------------------------------------------
# Tensors on an accelerator: the shared device policy.  There is no GPU here, so the
# adapter's reading of a tensor's device (_tf_common.device_of) is monkeypatched to report the
# images (or the upstream gradient) on "GPU:0"; the copies then really run, to the CPU
# and, with soft device placement, "back" to a GPU that falls back to the CPU.

GPU = "/job:localhost/replica:0/task:0/device:GPU:0"


@pytest.fixture
def images_on_gpu(monkeypatch):
    """Make the adapter see the tensors it is given as ``fake`` (a list, filled by the
    test) as living on GPU:0; the policy and its once-per-device warning are reset."""
    from roicore.adapters import _common, _tf_common
    fake = []
    real = _tf_common.device_of
    monkeypatch.setattr(_tf_common, "device_of",
                        lambda t: GPU if any(t is f for f in fake) else real(t))
    monkeypatch.setattr(_common, "_warned", set())
    previous = _common.get_device_policy()
    yield fake
    _common.set_device_policy(previous)


@pytest.mark.parametrize("op", OPS)
def test_images_off_the_host_are_copied_with_one_warning(op, images_on_gpu):
    from roicore.adapters import DeviceCopyWarning
    x, boxes, idx = make_case(op)
    images = tf.constant(to_format(x, "NHWC"))
    images_on_gpu.append(images)
    y_core = core_forward(op, x, boxes, idx)
    dy = np.random.default_rng(2).standard_normal(y_core.shape).astype(np.float32)
    with pytest.warns(DeviceCopyWarning, match=r"roicore.adapters.tf: images is on "
                      r".*GPU:0; roicore computes on the CPU, so inputs are copied"):
        y, g = forward_and_grad(op, images, boxes, idx, to_format(dy, "NHWC"), "NHWC")
    np.testing.assert_array_equal(from_format(y.numpy(), "NHWC"), y_core)
    np.testing.assert_array_equal(from_format(g.numpy(), "NHWC"),
                                  core_backward(op, dy, x, boxes, idx))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceCopyWarning)  # once per device
        call_adapter(op, images, boxes, idx)


def test_policy_error_refuses_tensors_off_the_host(images_on_gpu):
    from roicore.adapters import set_device_policy
    x, boxes, idx = make_case("roi_align")
    images = tf.constant(x)
    images_on_gpu.append(images)
    set_device_policy("error")
    with pytest.raises(ValueError, match=r"roicore.adapters.tf: images is on .*GPU:0, but "
                                         r"roicore computes on the CPU; move it to the CPU"):
        call_adapter("roi_align", images, boxes, idx, "NCHW")
    # and a gradient arriving from the accelerator, in eager mode and in a graph
    host = tf.constant(x)
    for run in (lambda f: f(), lambda f: tf.function(f)()):
        def step():
            with tf.GradientTape() as tape:
                tape.watch(host)
                y = call_adapter("roi_align", host, boxes, idx, "NCHW")
                dy = tf.ones_like(y)
            images_on_gpu.append(dy)
            return tape.gradient(y, host, output_gradients=dy)
        with pytest.raises(ValueError, match="the gradient is on .*GPU:0"):
            run(step)


# ---------------------------------------------------------------------------------------
# Unsupported contexts and bad arguments: clear errors

def test_xla_jit_compile_is_refused_clearly():
    x, boxes, idx = make_case("roi_align")
    fn = tf.function(lambda im: call_adapter("roi_align", im, boxes, idx, "NCHW"),
                     jit_compile=True)
    with pytest.raises(NotImplementedError, match=r"XLA .*jit_compile=True"):
        fn(tf.constant(x))


@pytest.mark.parametrize("bad_index", [-1, 2, 7])
@pytest.mark.parametrize("op", OPS)
def test_box_indices_out_of_range(op, bad_index):
    """A bad value in a tensor is the InvalidArgumentError a TF op raises, eagerly and in a
    graph, naming the argument, the box and the value."""
    x, boxes, idx = make_case(op)
    idx[3] = bad_index
    message = rf"box_indices\[3\] = {bad_index} is out of range for a feature map with N="
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        call_adapter(op, to_format(x, "NHWC"), boxes, idx)
    fn = tf.function(lambda: call_adapter(op, to_format(x, "NHWC"), boxes, idx))
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        fn()


@pytest.mark.parametrize("change,error,message", [
    (dict(images=np.zeros((2, 9, 11), np.float32)), ValueError, r"images must be a 4-D \(N, H, W, C\)"),
    (dict(images=np.zeros((2, 9, 11, 3), np.int32)), TypeError, "images must be float16, float32 or float64"),
    (dict(images=tf.zeros((2, 9, 11, 3), tf.bfloat16)), TypeError, "got bfloat16"),
    (dict(boxes=np.zeros((7, 5), np.float32)), ValueError, r"boxes must have shape \(K, 4\) \[y1, x1, y2, x2\]"),
    (dict(boxes=np.zeros(4, np.float32)), ValueError, r"boxes must have shape \(K, 4\)"),
    (dict(boxes=np.zeros((7, 4), np.int32)), TypeError, "boxes must be a float tensor"),
    (dict(idx=np.zeros(6, np.int32)), ValueError, "boxes has 7 rows, box_indices has 6"),
    (dict(idx=np.zeros((7, 1), np.int32)), ValueError, "box_indices must be 1-D"),
    (dict(idx=np.zeros(7, np.float32)), TypeError, "box_indices must be int32 or int64"),
    (dict(data_format="NCWH"), ValueError, "data_format must be 'NHWC' or 'NCHW'"),
    (dict(output_size=(2, 0)), ValueError, "output_size must be >= 1"),
    (dict(output_size=2.5), TypeError, "output_size must be an int or a pair"),
    (dict(method="avg"), ValueError, "method must be 'max', 'bilinear' or 'nearest'"),
    (dict(method="bilinear", spatial_scale=0.5), ValueError, "spatial_scale must be 1.0 for method='bilinear'"),
    (dict(n_threads=0), ValueError, "n_threads = 0 is invalid"),
    (dict(spatial_scale=-1.0), ValueError, "spatial_scale must be positive"),
])
def test_bad_arguments_raise_clear_errors(change, error, message):
    x, boxes, idx = make_case("roi_pool_max")
    args = dict(images=to_format(x, "NHWC"), boxes=boxes, idx=idx, data_format="NHWC",
                output_size=2, spatial_scale=0.5, method="max", n_threads=None)
    args.update(change)
    with pytest.raises(error, match=message):
        rtf.roi_pool(args.pop("images"), args.pop("boxes"), args.pop("idx"), **args)


def test_dynamic_shape_errors_surface_at_run_time_in_tf_function():
    x, boxes, idx = make_case("roi_pool_max")
    fn = tf.function(lambda im, b, i: rtf.roi_pool(im, b, i, 2),
                     input_signature=[tf.TensorSpec(None, tf.float32),
                                      tf.TensorSpec(None, tf.float32),
                                      tf.TensorSpec(None, tf.int32)])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"box_indices must have shape \(7,\)"):
        fn(to_format(x, "NHWC"), boxes, idx[:5])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"boxes must have shape \(K, 4\)"):
        fn(to_format(x, "NHWC"), boxes[:, :3], idx)


def test_psroi_channels_not_multiple_of_group():
    x, boxes, idx = make_case("roi_align", C=5)
    with pytest.raises(ValueError, match="not a multiple of the group area"):
        rtf.psroi_pool(x, boxes, idx, 3, data_format="NCHW")


def test_keras_layer_rejects_bad_configuration():
    with pytest.raises(ValueError, match="data_format must be"):
        rtf.RoIAlign(7, data_format="channels_middle")
    with pytest.raises(ValueError, match="method must be"):
        rtf.RoIPool(7, method="average")
    assert rtf.RoIPool(7).supports_jit is False


@pytest.mark.parametrize("op", ["roi_pool", "roi_pool_bilinear", "psroi_pool", "roi_align"])
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
def test_errors_use_the_adapters_names(op, mode):
    """Messages say images, boxes and box_indices (the adapter's arguments, TF's own
    crop_and_resize's), never roicore.core's x or batch_indices, whichever layer finds the
    mistake: the adapter, roicore.core or the op library's kernel."""
    kw = {"roi_pool_bilinear": dict(method="bilinear")}.get(op, {})
    fn = getattr(rtf, "roi_pool" if op == "roi_pool_bilinear" else op)
    x = tf.random.normal((2, 6, 6, 8))
    box = tf.constant([[0, 0, 0.5, 0.5]])
    calls = [
        (tf.errors.InvalidArgumentError, r"box_indices\[0\] = 5 is out of range for a feature "
                                         r"map with N=2 images",
         lambda: fn(x, box, tf.constant([5]), 2, **kw)),
        (tf.errors.InvalidArgumentError, r"boxes coordinates must be finite, got nan in box 0",
         lambda: fn(x, tf.constant([[0, 0, np.nan, 0.5]]), tf.constant([0]), 2, **kw)),
        (TypeError, r"images must be float16, float32 or float64, got int32",
         lambda: fn(tf.cast(x, tf.int32), box, tf.constant([0]), 2, **kw)),
    ]
    if op == "psroi_pool":
        calls.append((ValueError, r"images has C=8 channels, which is not a multiple of the "
                                  r"group area 3x3=9",
                      lambda: fn(x, box, tf.constant([0]), 3)))
    for error, message, call in calls:
        with pytest.raises(error, match=message) as raised:
            tf.function(call, autograph=False)() if mode == "tf.function" else call()
        # the message's own line (TF may append a traceback of the py_function path)
        line = next(ln for ln in str(raised.value).splitlines() if re.search(message, ln))
        assert not re.search(r"\b(x|batch_indices)\b", line), line
