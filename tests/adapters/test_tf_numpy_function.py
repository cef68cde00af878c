"""roicore.adapters.tf's tf.numpy_function fallback: how it calls roicore.core.

When the op library is not available, the adapter calls roicore.core itself: eagerly on
zero-copy views of the tensors, with its aligned results handed to TF without a copy, and
with the max-pool argmax only where a gradient may need it.  A SavedModel cannot hold the
fallback, and an export says so.  (Everything else the fallback does is tested with the
native ops, in test_tf.py and the other test_tf_* files.)
"""
import numpy as np
import pytest

from conftest import framework

tf = framework("tensorflow", "the TensorFlow adapter needs tensorflow")
keras = framework("keras", "the TensorFlow adapter's layers need Keras 3")

from roicore.adapters import tf as rtf  # noqa: E402
from tf_cases import (  # noqa: E402
    DTYPES, OPS, call_adapter, core_backward, core_forward, forward_and_grad, make_case)


@pytest.fixture(autouse=True)
def fallback(monkeypatch):
    monkeypatch.setitem(rtf._LIBRARY, "library", None)


_CORE_NAME = {"roi_pool_max": "roi_pool", "roi_pool_bilinear": "roi_pool",
              "psroi_pool": "psroi_pool", "roi_align": "roi_align"}


@pytest.mark.parametrize("op", OPS)
def test_eager_call_without_tape_computes_no_argmax(op, spy_core):
    """No GradientTape records the images: the core is called directly, without an argmax,
    on a view of the images' memory (no copy), and its aligned result becomes the output
    tensor (no copy); a taped call afterwards gives the same output and the gradient."""
    x, boxes, idx = make_case(op, 3)
    images = tf.constant(x)
    calls = spy_core(_CORE_NAME[op])
    y = call_adapter(op, images, boxes, idx, "NCHW")
    (args, kw, res), = calls
    assert not kw.get("return_argmax", False)
    assert args[0].ctypes.data == np.asarray(images).ctypes.data  # the images, not a copy
    assert "out" not in kw and res.ctypes.data % 64 == 0  # the core's outputs are aligned
    assert np.asarray(y).ctypes.data == res.ctypes.data           # the output, not a copy
    y_core = core_forward(op, x, boxes, idx)
    np.testing.assert_array_equal(y.numpy(), y_core)
    dy = np.random.default_rng(4).standard_normal(y_core.shape).astype(np.float32)
    y2, g = forward_and_grad(op, x, boxes, idx, dy, "NCHW")
    assert calls[-1].kwargs.get("return_argmax", False) == (op == "roi_pool_max")
    np.testing.assert_array_equal(y2.numpy(), y_core)
    np.testing.assert_array_equal(g.numpy(), core_backward(op, dy, x, boxes, idx))
    with tf.GradientTape():  # a tape that does not watch the images changes nothing
        call_adapter(op, images, boxes, idx, "NCHW")
    assert not calls[-1].kwargs.get("return_argmax", False)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_eager_outputs_are_aligned_for_tf_kernels(dtype):
    """TF's kernels abort on unaligned memory; every eager result (float16 ones, computed
    by the core into its own buffer, included) must feed TF's binary ops."""
    x, boxes, idx = make_case("roi_pool_max", 1, dtype)
    dy = np.ones(core_forward("roi_pool_max", x, boxes, idx).shape, dtype)
    y, g = forward_and_grad("roi_pool_max", x, boxes, idx, dy, "NCHW")
    for t in (y, g):
        assert np.asarray(t).ctypes.data % 64 == 0
        np.testing.assert_array_equal((t * 2).numpy(), t.numpy() * 2)


def test_tf_function_results_are_aligned_core_buffers(spy_core):
    """In a graph tf.numpy_function keeps 64-byte-aligned results without a copy: the core
    allocates its outputs so; and the argmax is computed, as a tape may watch the call."""
    x, boxes, idx = make_case("roi_pool_max", 2)
    calls = spy_core("roi_pool")
    y = tf.function(lambda im: call_adapter("roi_pool_max", im, boxes, idx, "NCHW"))(
        tf.constant(x))
    (_, kw, res), = calls
    assert kw["return_argmax"] and all(a.ctypes.data % 64 == 0 for a in res)
    assert np.asarray(y).ctypes.data == res[0].ctypes.data  # kept, not copied
    np.testing.assert_array_equal(y.numpy(), core_forward("roi_pool_max", x, boxes, idx))
    # the graph's argmax output is aligned too (so TF keeps it) and the gradient is right
    dy = np.random.default_rng(5).standard_normal(y.shape).astype(np.float32)

    @tf.function
    def grad(im):
        with tf.GradientTape() as tape:
            tape.watch(im)
            out = call_adapter("roi_pool_max", im, boxes, idx, "NCHW")
        return tape.gradient(out, im, output_gradients=dy)

    np.testing.assert_array_equal(grad(tf.constant(x)).numpy(),
                                  core_backward("roi_pool_max", dy, x, boxes, idx))


def test_keras_roi_pool_training_false_skips_the_argmax_in_a_graph(spy_core):
    """RoIPool called with training=False (Keras predict) in a graph computes no argmax in
    the forward pass; a gradient taken all the same recomputes it and is still the core's;
    training=True (fit) computes it in the forward pass."""
    x, boxes, idx = make_case("roi_pool_max", 5)
    layer = rtf.RoIPool((3, 2), 0.5, data_format="NCHW")
    y_core = core_forward("roi_pool_max", x, boxes, idx)
    dy = np.random.default_rng(6).standard_normal(y_core.shape).astype(np.float32)
    g_core = core_backward("roi_pool_max", dy, x, boxes, idx)
    calls = spy_core("roi_pool")

    @tf.function
    def run(im, training):
        with tf.GradientTape() as tape:
            tape.watch(im)
            y = layer(im, boxes, idx, training=training)
        return y, tape.gradient(y, im, output_gradients=dy)

    @tf.function
    def predict(im):
        return layer(im, boxes, idx, training=False)

    np.testing.assert_array_equal(predict(tf.constant(x)).numpy(), y_core)
    assert [kw.get("return_argmax", False) for _, kw, _ in calls] == [False]
    for training, argmax_calls in ((False, [False, True]), (True, [True])):
        del calls[:]
        y, g = run(tf.constant(x), training)
        # (in a graph the two ops have no order: the recompute needs x only)
        assert sorted(kw.get("return_argmax", False) for _, kw, _ in calls) == argmax_calls
        np.testing.assert_array_equal(y.numpy(), y_core)
        np.testing.assert_array_equal(g.numpy(), g_core)
    # Keras predict: one box per image, as Keras slices every input alike
    x, boxes, _ = make_case("roi_pool_max", 5, N=4, K=4)
    idx = np.arange(4, dtype=np.int32)
    inputs = [keras.Input((3, 9, 11)), keras.Input((4,)), keras.Input((), dtype="int32")]
    model = keras.Model(inputs, layer(*inputs))
    del calls[:]
    np.testing.assert_array_equal(model.predict([x, boxes, idx], batch_size=4, verbose=0),
                                  core_forward("roi_pool_max", x, boxes, idx))
    assert calls[0].kwargs["return_argmax"] is False
    assert not any(kw.get("return_argmax", False) for _, kw, _ in calls)


def test_saved_model_export_is_refused_clearly(tmp_path):
    x, boxes, idx = make_case("roi_pool_max")

    class Module(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec(x.shape, tf.float32)])
        def __call__(self, images):
            return call_adapter("roi_pool_max", images, boxes, idx, "NCHW")

    module = Module()
    module(tf.constant(x))  # works outside the export
    with pytest.raises(NotImplementedError, match="SavedModel"):
        tf.saved_model.save(module, str(tmp_path / "sm"))
