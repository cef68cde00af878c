"""roicore.adapters.tf.multilevel_crop_and_resize against the TF Model Garden's function, bit
for bit.

The Model Garden is not installable here; the oracle is its published algorithm on
TensorFlow's own ops, as roicore parity runs it (cli/frameworks/tensorflow.py): levels from
``log`` and ``floordiv``, neighbours gathered from every level flattened into one tensor,
weights times 4 and a 2 x 2 ``avg_pool``.  Outputs and the gradients of every level's map
(``tf.GradientTape``, random head gradient) must be identical, on the native op library and
on the tf.numpy_function fallback.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import framework

tf = framework("tensorflow", "the TensorFlow adapter needs tensorflow")

import roicore.core as core  # noqa: E402
from roicore.adapters import tf as rtf  # noqa: E402
from roicore.core.conventions import MODEL_GARDEN_ALIGN  # noqa: E402
from roicore.cli.frameworks.tensorflow import (  # noqa: E402
    model_garden_multilevel_crop_and_resize)

pytestmark = pytest.mark.usefixtures("tf_path")

DTYPES = [np.float32, np.float64]


def oracle(features, boxes, output_size):
    return model_garden_multilevel_crop_and_resize(tf, features, boxes, output_size)


def pyramid(rng, dtype, batch=2, channels=3, image=(128, 192), levels=range(2, 7)):
    """Model Garden features: level l of an image padded to a multiple of 2**6, NHWC."""
    H, W = image
    return {str(l): tf.constant(rng.standard_normal((batch, H >> l, W >> l, channels)), dtype)
            for l in levels}


def boxes_for(rng, dtype, batch=2, n=40, image=(128, 192)):
    """[y1, x1, y2, x2] of every level, at its boundaries (sqrt(area) = 112, 224, 448 and an
    ulp or so beside them), partly and wholly outside the image, reversed and empty."""
    H, W = image
    y1 = rng.uniform(-0.3 * H, 1.1 * H, (batch, n))
    x1 = rng.uniform(-0.3 * W, 1.1 * W, (batch, n))
    side = np.exp(rng.uniform(np.log(1), np.log(1200), (batch, n, 2)))
    b = np.stack([y1, x1, y1 + side[..., 0], x1 + side[..., 1]], -1)
    edges = np.array([56, 112, 224, 448, 896], np.float64)
    exact = np.repeat(edges, 3) * np.tile([1 - 2e-7, 1, 1 + 2e-7], len(edges))
    b[0, :len(exact), 2] = b[0, :len(exact), 0] + exact
    b[0, :len(exact), 3] = b[0, :len(exact), 1] + exact
    b[1, 0] = [10, 20, 5, 40]      # reversed: a NaN level, the first
    b[1, 1] = [10, 20, 10, 20]     # empty: log(0), the first
    b[1, 2] = [300, 200, 400, 260]  # wholly beyond the image
    return tf.constant(b, dtype)


def run(fn, features, boxes, dy):
    with tf.GradientTape() as tape:
        tape.watch(list(features.values()))
        y = fn(features, boxes, dy.shape[2])
    grads = tape.gradient(y, features, output_gradients=dy)
    return y.numpy(), {k: g.numpy() for k, g in grads.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("output_size", [7, 14, 3])
def test_forward_and_gradients_match_the_model_garden(dtype, output_size):
    rng = np.random.default_rng(output_size)
    features, boxes = pyramid(rng, dtype), boxes_for(rng, dtype)
    dy = tf.constant(rng.standard_normal((2, 40, output_size, output_size, 3)), dtype)
    y, g = run(rtf.multilevel_crop_and_resize, features, boxes, dy)
    y_mg, g_mg = run(oracle, features, boxes, dy)
    assert y.dtype == dtype and y.shape == (2, 40, output_size, output_size, 3)
    np.testing.assert_array_equal(y, y_mg)
    for level in features:
        np.testing.assert_array_equal(g[level], g_mg[level], err_msg=f"level {level}")


def test_boxes_near_the_level_boundaries_take_tensorflow_s_level():
    """TensorFlow's vectorised log differs from the C library's by an ulp near powers of
    two: the adapter computes levels with TensorFlow, so it pools those boxes from the same
    level as the Model Garden (the maps differ per level, so any other level would show),
    where the C rule (LEVELS["tf_model_garden"]) puts some of them one level apart."""
    rng = np.random.default_rng(9)
    features = pyramid(rng, np.float32, batch=1, levels=range(0, 4))
    ulps = np.arange(-300, 300, dtype=np.int32)
    sides = np.concatenate([(np.float32(224 * 2.0 ** k).view(np.int32) + ulps).view(np.float32)
                            for k in (-3, -2)])
    b = np.zeros((1, len(sides), 4), np.float32)
    b[0, :, 2:] = sides[:, None]
    y = rtf.multilevel_crop_and_resize(features, tf.constant(b), 2).numpy()
    np.testing.assert_array_equal(y, oracle(features, tf.constant(b), 2).numpy())
    by_rule = core.pyramid_roi_align([np.moveaxis(f.numpy(), 3, 1) for f in features.values()],
                                     b[0][:, [1, 0, 3, 2]], 2, [1, 1 / 2, 1 / 4, 1 / 8], 1,
                                     first_level=0, levels="tf_model_garden",
                                     convention=MODEL_GARDEN_ALIGN, batch_indices=np.zeros(
                                         len(sides), np.int64))
    apart = np.any(np.moveaxis(by_rule, 1, 3) != y[0], axis=(1, 2, 3))
    assert apart.any(), "no box near a boundary: the test would not see a wrong level"


def test_runs_in_a_tf_function():
    rng = np.random.default_rng(2)
    features, boxes = pyramid(rng, np.float32), boxes_for(rng, np.float32)
    fn = tf.function(lambda f, b: rtf.multilevel_crop_and_resize(f, b, 7))
    np.testing.assert_array_equal(fn(features, boxes).numpy(),
                                  oracle(features, boxes, 7).numpy())


def test_a_saved_model_computes_the_same(tf_path, tmp_path):
    if tf_path != "native":
        pytest.skip("SavedModel export needs the op library (the fallback refuses it)")
    rng = np.random.default_rng(4)
    features, boxes = pyramid(rng, np.float32), boxes_for(rng, np.float32)
    module = tf.Module()
    spec = {k: tf.TensorSpec([None, *v.shape[1:]], tf.float32) for k, v in features.items()}
    module.pool = tf.function(lambda f, b: rtf.multilevel_crop_and_resize(f, b, 7),
                              input_signature=[spec, tf.TensorSpec([None, None, 4], tf.float32)])
    tf.saved_model.save(module, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    np.testing.assert_array_equal(loaded.pool(features, boxes).numpy(),
                                  oracle(features, boxes, 7).numpy())


def test_bad_arguments_name_themselves():
    rng = np.random.default_rng(1)
    features, boxes = pyramid(rng, np.float32), boxes_for(rng, np.float32)
    with pytest.raises(TypeError, match="features must be a non-empty dict"):
        rtf.multilevel_crop_and_resize([features["2"]], boxes)
    with pytest.raises(KeyError):
        rtf.multilevel_crop_and_resize({"2": features["2"], "4": features["4"]}, boxes)
    with pytest.raises(ValueError, match=r"features\['3'\] must have 1/2 of the height"):
        rtf.multilevel_crop_and_resize({"2": features["2"], "3": features["2"]}, boxes)
    with pytest.raises(ValueError, match=r"features\['3'\] must have the channels"):
        rtf.multilevel_crop_and_resize(
            {"2": features["2"], "3": tf.zeros([2, 32, 96, 5])}, boxes)
    with pytest.raises(TypeError, match="boxes must have the features' dtype"):
        rtf.multilevel_crop_and_resize(features, tf.cast(boxes, tf.float64))
    with pytest.raises(ValueError, match=r"boxes must have shape \[batch, num_boxes, 4\]"):
        rtf.multilevel_crop_and_resize(features, boxes[0])
    with pytest.raises(NotImplementedError, match="sample_offset=0.5"):
        rtf.multilevel_crop_and_resize(features, boxes, sample_offset=0.0)
    with pytest.raises(ValueError, match="output_size must be a positive int"):
        rtf.multilevel_crop_and_resize(features, boxes, output_size=0)
    with pytest.raises(TypeError, match="float32 or float64"):
        rtf.multilevel_crop_and_resize({k: tf.cast(v, tf.float16) for k, v in features.items()},
                                       tf.cast(boxes, tf.float16))


def test_a_training_step_through_a_convolution_matches():
    """A convolution's pyramid in, a box head's loss out: every weight's gradient equal to
    the Model Garden's."""
    rng = np.random.default_rng(11)
    images = tf.constant(rng.standard_normal((2, 128, 192, 3)), tf.float32)
    conv = tf.keras.layers.Conv2D(8, 3, strides=4, padding="same",
                                  kernel_initializer=tf.keras.initializers.GlorotUniform(1))
    head = tf.keras.layers.Dense(5, kernel_initializer=tf.keras.initializers.GlorotUniform(2))
    boxes = boxes_for(rng, np.float32)

    def step(fn):
        with tf.GradientTape() as tape:
            p2 = conv(images)
            features = {"2": p2}
            for level in range(3, 6):
                features[str(level)] = tf.nn.avg_pool2d(features[str(level - 1)], 2, 2, "VALID")
            pooled = fn(features, boxes, 7)
            loss = tf.reduce_sum(head(tf.reshape(pooled, [2, 40, -1])) ** 2)
        weights = conv.trainable_variables + head.trainable_variables
        return loss.numpy(), [g.numpy() for g in tape.gradient(loss, weights)]

    loss, grads = step(rtf.multilevel_crop_and_resize)
    loss_mg, grads_mg = step(oracle)
    assert loss == loss_mg
    for g, g_mg in zip(grads, grads_mg):
        np.testing.assert_array_equal(g, g_mg)
