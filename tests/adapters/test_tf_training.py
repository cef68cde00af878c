"""Swap the import, get the same training run: roicore's TF ops inside a detection head.

A small detection head (a backbone convolution, the RoI op, a dense layer, a softmax
cross-entropy loss) is trained with SGD for 5 steps twice from the same initial weights:

* roi_pool(method="bilinear" | "nearest") against ``tf.image.crop_and_resize`` with the
  same method.  The boxes are trained too (proposals plus a learned offset), so the box
  gradient takes part;
* roi_pool(method="max"), psroi_pool and roi_align against the same head whose RoI op is
  roicore.core called directly (tf.numpy_function with a tf.custom_gradient, written
  here, independently of the adapter).

Losses and weights must be bit-identical after every step, eagerly and in a
tf.function, on the op library and on the numpy_function fallback.  Op determinism is on
so that TensorFlow's own ops (the convolution's gradient, CropAndResizeGradImage) repeat
their numbers.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import framework

tf = framework("tensorflow", "the TensorFlow adapter needs tensorflow")
keras = framework("keras", "the TensorFlow adapter's layers need Keras 3")

from roicore import core  # noqa: E402
from roicore.adapters import tf as rtf  # noqa: E402

N, H, W, C_IN, K, CLASSES, STEPS = 2, 12, 14, 3, 6, 4, 5


@pytest.fixture(autouse=True)
def op_determinism():
    from tensorflow.python.framework import config
    was = config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    yield
    if not was:
        config.disable_op_determinism()


# ---------------------------------------------------------------------------------------
# The RoI op of each head, under test and as the comparison runs it.  Feature maps have
# 8 channels (psroi_pool: 2 output channels of a 2x2 group).

def _absolute_boxes(rng):
    y1, x1 = rng.uniform(0, 12, (2, K)) * 2
    return np.stack([y1, x1, y1 + rng.uniform(4, 12, K), x1 + rng.uniform(4, 14, K)],
                    1).astype(np.float32)


def _normalised_boxes(rng):
    y1, x1 = rng.uniform(0, 0.6, (2, K))
    return np.stack([y1, x1, y1 + rng.uniform(0.2, 0.4, K), x1 + rng.uniform(0.2, 0.4, K)],
                    1).astype(np.float32)


def _core_op(forward, backward, out_shape):
    """A TF op on NHWC images running roicore.core's NCHW ``forward(x, xyxy, idx)`` and
    ``backward(dy, x, xyxy, idx)`` through tf.numpy_function; boxes get no gradient."""
    def nchw(a):
        return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))

    def nhwc(a):
        return np.ascontiguousarray(np.transpose(a, (0, 2, 3, 1)))

    @tf.custom_gradient
    def op(images, boxes, idx):
        def fwd(x, b, i):
            return nhwc(forward(nchw(x), b[:, [1, 0, 3, 2]], i))

        def bwd(dy, x, b, i):
            return nhwc(backward(nchw(dy), nchw(x), b[:, [1, 0, 3, 2]], i))

        y = tf.numpy_function(fwd, [images, boxes, idx], tf.float32, stateful=False)
        y.set_shape([boxes.shape[0], *out_shape, images.shape[3] if out_shape != (2, 2) else 2])

        def grad(dy):
            dx = tf.numpy_function(bwd, [dy, images, boxes, idx], tf.float32, stateful=False)
            dx.set_shape(images.shape)
            return dx, None, None

        return y, grad

    return op


def _max_pool_op():
    kw = dict(output_size=(3, 3), spatial_scale=0.5, method="max", convention="mxnet")

    def forward(x, b, i):
        return core.roi_pool(x, b, batch_indices=i, **kw)

    def backward(dy, x, b, i):
        _, argmax = core.roi_pool(x, b, batch_indices=i, return_argmax=True, **kw)
        return core.roi_pool_backward(dy, b, x.shape, 0.5, batch_indices=i, method="max",
                                      convention="mxnet", argmax=argmax)

    return _core_op(forward, backward, (3, 3))


def _psroi_op():
    def forward(x, b, i):
        return core.psroi_pool(x, b, 2, 0.5, batch_indices=i, convention="mxnet")

    def backward(dy, x, b, i):
        return core.psroi_pool_backward(dy, b, x.shape, 0.5, batch_indices=i, convention="mxnet")

    return _core_op(forward, backward, (2, 2))


def _align_op():
    def forward(x, b, i):
        return core.roi_align(x, b, (3, 2), 0.5, 2, True, batch_indices=i)

    def backward(dy, x, b, i):
        return core.roi_align_backward(dy, b, x.shape, 0.5, 2, True, batch_indices=i)

    return _core_op(forward, backward, (3, 2))


# name: (roicore's op, the comparison's op, boxes, whether the boxes are trained)
HEADS = {
    "roi_pool_bilinear": (
        lambda f, b, i: rtf.roi_pool(f, b, i, (4, 3), method="bilinear"),
        lambda f, b, i: tf.image.crop_and_resize(f, b, i, (4, 3), method="bilinear"),
        _normalised_boxes, True),
    "roi_pool_nearest": (
        lambda f, b, i: rtf.roi_pool(f, b, i, crop_size=(4, 3), method="nearest"),
        lambda f, b, i: tf.image.crop_and_resize(f, b, i, (4, 3), method="nearest"),
        _normalised_boxes, True),
    "roi_pool_max": (
        lambda f, b, i: rtf.roi_pool(f, b, i, (3, 3), 0.5),
        _max_pool_op(), _absolute_boxes, False),
    "psroi_pool": (
        lambda f, b, i: rtf.psroi_pool(f, b, i, 2, 0.5),
        _psroi_op(), _absolute_boxes, False),
    "roi_align": (
        lambda f, b, i: rtf.roi_align(f, b, i, (3, 2), 0.5, sampling_ratio=2, aligned=True),
        _align_op(), _absolute_boxes, False),
}


class Head(keras.Model):
    """Conv2D backbone -> RoI op -> Dense logits; optionally a learned box offset."""

    def __init__(self, roi, train_boxes):
        super().__init__()
        self.roi = roi
        self.conv = keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                                        kernel_initializer=keras.initializers.GlorotUniform(0),
                                        bias_initializer=keras.initializers.Constant(0.05))
        self.dense = keras.layers.Dense(CLASSES,
                                        kernel_initializer=keras.initializers.GlorotUniform(1))
        self.box_offset = self.add_weight(shape=(K, 4), initializer="zeros",
                                          trainable=train_boxes, name="box_offset")

    def call(self, images, boxes, idx):
        pooled = self.roi(self.conv(images), boxes + self.box_offset, idx)
        return self.dense(tf.reshape(pooled, [K, -1]))


def train(roi, train_boxes, boxes, eager):
    rng = np.random.default_rng(7)
    images = tf.constant(rng.standard_normal((N, H, W, C_IN)).astype(np.float32))
    idx = tf.constant([0, 1, 1, 0, 1, 0], tf.int32)
    labels = tf.constant(rng.integers(0, CLASSES, K))
    model = Head(roi, train_boxes)
    model(images, boxes, idx)  # build
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, boxes, idx))
        grads = tape.gradient(loss, model.trainable_weights)
        optimizer.apply_gradients(zip(grads, model.trainable_weights))
        return loss

    step = step if eager else tf.function(step)
    history = []
    for _ in range(STEPS):
        loss = step()
        history.append((loss.numpy(), [w.numpy().copy() for w in model.weights]))
    return history, [w.trainable for w in model.weights]


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
@pytest.mark.parametrize("head", list(HEADS))
def test_swapping_the_op_gives_the_same_training_run(head, mode):
    ours, theirs, make_boxes, train_boxes = HEADS[head]
    boxes = tf.constant(make_boxes(np.random.default_rng(3)))
    run, trainable = train(ours, train_boxes, boxes, mode == "eager")
    reference, _ = train(theirs, train_boxes, boxes, mode == "eager")
    for step, ((loss, weights), (ref_loss, ref_weights)) in enumerate(zip(run, reference)):
        assert loss == ref_loss, (step, loss, ref_loss)
        for w, r in zip(weights, ref_weights):
            np.testing.assert_array_equal(w, r, err_msg=f"step {step}")
    # the run trained: the loss moved, and so did every trainable weight (the box offset
    # when the boxes are trained, the conv and dense kernels and biases)
    first, last = run[0][1], run[-1][1]
    assert run[0][0] != run[-1][0]
    moved = [not np.array_equal(a, b) for a, b in zip(first, last)]
    assert moved == trainable and sum(trainable) == 4 + train_boxes, (moved, trainable)


# ---------------------------------------------------------------------------------------
# Data-parallel: tf.distribute.MirroredStrategy over two logical CPU devices.  Logical
# devices must be set up before TensorFlow starts, so this runs in a fresh process.

MIRRORED = textwrap.dedent("""
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    tf.config.experimental.enable_op_determinism()
    import keras
    import os
    from roicore.adapters import tf as rtf
    assert (rtf.native_ops() is not None) == (os.environ["ROICORE_TF_NATIVE"] == "1")

    B, R, CLASSES, STEPS = 4, 3, 4, 3       # 4 images (2 per replica), 3 boxes each
    LAYERS = {
        "roi_pool_max": lambda: rtf.RoIPool((3, 3), 0.5),
        "roi_pool_bilinear": lambda: rtf.RoIPool((3, 3), method="bilinear"),
        "roi_pool_nearest": lambda: rtf.RoIPool((3, 3), method="nearest"),
        "psroi_pool": lambda: rtf.PSRoIPool(2, 0.5),
        "roi_align": lambda: rtf.RoIAlign((3, 2), 0.5, sampling_ratio=2),
    }
    rng = np.random.default_rng(0)
    images = rng.standard_normal((B, 12, 14, 3)).astype(np.float32)
    y1, x1 = rng.uniform(0, 0.5, (2, B, R))
    normalised = np.stack([y1, x1, y1 + 0.4, x1 + 0.3], -1).astype(np.float32)
    absolute = normalised * np.float32(24)
    labels = rng.integers(0, CLASSES, (B, R))

    def make_model(layer):
        im, bx = keras.Input((12, 14, 3)), keras.Input((R, 4))
        f = keras.layers.Conv2D(8, 3, padding="same", activation="relu",
                                kernel_initializer=keras.initializers.GlorotUniform(0),
                                bias_initializer=keras.initializers.Constant(0.05))(im)
        pooled = layer(f, bx)                                   # (B, R, PH, PW, C)
        dense = keras.layers.Dense(CLASSES, kernel_initializer=keras.initializers.GlorotUniform(1))
        logits = dense(keras.layers.Reshape((R, -1))(pooled))
        return keras.Model([im, bx], logits)

    def shard_loss(model, im, bx, lab):
        per_box = keras.losses.sparse_categorical_crossentropy(lab, model([im, bx]), from_logits=True)
        return tf.nn.compute_average_loss(tf.reduce_mean(per_box, 1), global_batch_size=B)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    for name, make_layer in LAYERS.items():
        boxes = normalised if "bilinear" in name or "nearest" in name else absolute
        data = tf.data.Dataset.from_tensor_slices((images, boxes, labels)).batch(B).repeat()

        with strategy.scope():
            model = make_model(make_layer())
            optimizer = keras.optimizers.SGD(0.1)

        devices = []  # where each replica's RoI op is placed, seen while tracing

        @tf.function
        def distributed_step(batch):
            def replica_step(im, bx, lab):
                with tf.GradientTape() as tape:
                    loss = shard_loss(model, im, bx, lab)
                devices.append(loss.device)
                grads = tape.gradient(loss, model.trainable_weights)
                optimizer.apply_gradients(zip(grads, model.trainable_weights))
                return loss, grads
            return strategy.run(replica_step, args=batch)

        # single device, same initial weights: the two replicas' shards one after the other
        single = make_model(make_layer())
        single.set_weights([w.numpy() for w in model.weights])
        single_optimizer = keras.optimizers.SGD(0.1)

        @tf.function
        def single_step(im, bx, lab):
            shard_grads, losses = [], []
            for s in (slice(0, 2), slice(2, 4)):
                with tf.GradientTape() as tape:
                    losses.append(shard_loss(single, im[s], bx[s], lab[s]))
                shard_grads.append(tape.gradient(losses[-1], single.trainable_weights))
            grads = [a + b for a, b in zip(*shard_grads)]      # all-reduce of two replicas
            whole = shard_loss(single, im, bx, lab)            # the whole batch at once
            single_optimizer.apply_gradients(zip(grads, single.trainable_weights))
            return losses[0] + losses[1], grads, whole

        iterator = iter(strategy.experimental_distribute_dataset(data))
        for step in range(STEPS):
            losses, grads = distributed_step(next(iterator))
            assert [d[-5:] for d in devices] == ["CPU:0", "CPU:1"], devices
            loss = strategy.reduce("SUM", losses, axis=None)
            grads = [tf.add_n(strategy.experimental_local_results(g)) for g in grads]
            ref_loss, ref_grads, whole = single_step(images, boxes, labels)
            assert loss.numpy() == ref_loss.numpy(), (name, step, loss, ref_loss)
            np.testing.assert_allclose(loss.numpy(), whole.numpy(), rtol=1e-6)
            for g, r in zip(grads, ref_grads):
                assert np.array_equal(g.numpy(), r.numpy()), (name, step)
                assert np.any(g.numpy()), (name, step)
            for w, r in zip(model.weights, single.weights):
                assert np.array_equal(w.numpy(), r.numpy()), (name, step, w.name)
        print(name, "ok")
    print("MIRRORED OK")
""")


@pytest.mark.parametrize("native", ["1", "0"], ids=["native", "numpy_function"])
def test_mirrored_strategy_training_equals_a_single_device_run(native):
    """Each replica's gradient, all-reduced, and the weights after every step equal a
    single-device run over the replicas' shards, bit for bit (the full-batch loss agrees
    to rounding: it sums in another order); on the op library and on the fallback."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "ROICORE_TF_NATIVE": native}
    proc = subprocess.run([sys.executable, "-c", MIRRORED], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0 and "MIRRORED OK" in proc.stdout, (proc.stdout[-2000:],
                                                                   proc.stderr[-4000:])
