"""roi_pool(method="bilinear" | "nearest") against tf.image.crop_and_resize, bit for bit.

TensorFlow's crop_and_resize is the oracle of roicore's crop methods: the forward
(``CropAndResize``), the gradient of the image (``CropAndResizeGradImage``) and of the
boxes (``CropAndResizeGradBoxes``).  The slow reference (tests/reference.py), written
from TF's kernel, is checked against TF here too, so that the core tests, which compare
the compiled kernels with the reference, inherit TF's numbers.
"""
import numpy as np
import pytest

import reference as ref
from conftest import framework

tf = framework("tensorflow", "the crop_and_resize oracle is TensorFlow")

from roicore.core.conventions import BILINEAR_POOL  # noqa: E402

TF_RULES = BILINEAR_POOL["tensorflow"]


@pytest.fixture
def op_determinism():
    """CropAndResizeGradImage shards its additions over boxes unless op determinism is
    on; with it, TF adds in box order, which is roicore's."""
    from tensorflow.python.framework import config
    was = config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    yield
    if not was:
        config.disable_op_determinism()


def crop_case(seed, crop_size=None, halves=False):
    """NHWC images, normalised [y1, x1, y2, x2] boxes (in and out of range, flipped,
    zero-size, the whole image), box indices and an upstream gradient."""
    rng = np.random.default_rng(seed)
    N, H, W, C, K = 3, int(rng.integers(1, 13)), int(rng.integers(1, 13)), 4, 24
    crop_size = crop_size or tuple(int(v) for v in rng.integers(1, 8, 2))
    images = rng.standard_normal((N, H, W, C)).astype(np.float32)
    boxes = rng.uniform(-0.5, 1.5, (K, 4))
    boxes[:5] = rng.uniform(0, 1, (5, 4))
    boxes[5] = [0, 0, 1, 1]
    boxes[6] = [1, 1, 0, 0]
    boxes[7, 2:] = boxes[7, :2]
    if halves:  # samples at exact pixel halves, where nearest rounds away from zero
        boxes = np.round(boxes * 4) / 4
    idx = rng.integers(0, N, K).astype(np.int32)
    dy = rng.standard_normal((K,) + crop_size + (C,)).astype(np.float32)
    return images, boxes.astype(np.float32), idx, crop_size, dy


def nchw(a):
    return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def xyxy(boxes):
    return np.ascontiguousarray(boxes[:, [1, 0, 3, 2]])


# ---------------------------------------------------------------------------------------
# The reference is TF's kernel

@pytest.mark.parametrize("seed", range(8))
def test_reference_nearest_equals_tf(seed, op_determinism):
    images, boxes, idx, crop, dy = crop_case(seed, halves=seed % 2 == 0)
    y = tf.image.crop_and_resize(images, boxes, idx, crop, method="nearest",
                                 extrapolation_value=-1.5)
    np.testing.assert_array_equal(
        nchw(y.numpy()), ref.roi_pool_nearest(nchw(images), xyxy(boxes), idx, crop, TF_RULES,
                                              extrapolation_value=-1.5))
    dx = tf.raw_ops.CropAndResizeGradImage(grads=dy, boxes=boxes, box_ind=idx,
                                           image_size=images.shape, T=tf.float32,
                                           method="nearest")
    np.testing.assert_array_equal(
        nchw(dx.numpy()), ref.roi_pool_nearest_backward(nchw(dy), xyxy(boxes), idx,
                                                        nchw(images).shape, TF_RULES))


@pytest.mark.parametrize("seed", range(8))
def test_reference_box_gradient_equals_tf(seed):
    crop_size = [(1, 1), (1, 5), (4, 1), None][seed % 4]
    images, boxes, idx, crop, dy = crop_case(seed, crop_size=crop_size)
    want = tf.raw_ops.CropAndResizeGradBoxes(grads=dy, image=images, boxes=boxes, box_ind=idx)
    got = ref.roi_pool_bilinear_boxes_backward(nchw(dy), nchw(images), xyxy(boxes), idx)
    np.testing.assert_array_equal(got, want.numpy()[:, [1, 0, 3, 2]])


def test_reference_box_gradient_samples_where_tf_grad_boxes_does():
    """CropAndResizeGradBoxes steps by (y2-y1) * ((H-1)/(PH-1)), the forward by
    ((y2-y1)*(H-1))/(PH-1): for this box the last row sits at 14.999999 in the forward
    and at 15.0 in the box gradient, which then interpolates between rows 15 and 16."""
    H, PH = 21, 10
    y1, y2 = np.float32(0.4633486568927765), np.float32(0.7499999403953552)
    h, step = np.float32(H - 1), (y2 - y1) * np.float32(H - 1) / np.float32(PH - 1)
    forward = y1 * h + np.float32(PH - 1) * step
    assert forward == np.float32(14.999999)
    rng = np.random.default_rng(1)
    images = rng.standard_normal((1, H, 5, 2)).astype(np.float32)
    boxes = np.array([[y1, 0.1, y2, 0.9]], np.float32)
    dy = rng.standard_normal((1, PH, 3, 2)).astype(np.float32)
    want = tf.raw_ops.CropAndResizeGradBoxes(grads=dy, image=images, boxes=boxes, box_ind=[0])
    got = ref.roi_pool_bilinear_boxes_backward(nchw(dy), nchw(images), xyxy(boxes), [0])
    np.testing.assert_array_equal(got, want.numpy()[:, [1, 0, 3, 2]])


def test_reference_box_gradient_matches_finite_differences():
    """Away from pixel edges the box gradient is the derivative of the crop (float64)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 9))
    boxes = np.array([[0.13, 0.21, 0.71, 0.83], [0.9, 0.77, 0.31, 0.12]])  # one flipped
    batch = [1, 0]
    for crop in [(4, 5), (1, 3)]:
        g = rng.standard_normal((2, 3) + crop)
        analytic = ref.roi_pool_bilinear_boxes_backward(g, x, boxes, batch)
        numeric = ref.numeric_grad(
            lambda b: float(np.sum(ref.roi_pool_bilinear(x, b, batch, crop, TF_RULES) * g)),
            boxes.copy(), eps=1e-7)
        np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------
# roi_pool(method="bilinear" | "nearest") == crop_and_resize: forward, image and box gradients

@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("extrapolation_value", [0.0, -2.5])
@pytest.mark.parametrize("crop_size", [(1, 1), (7, 5), (1, 4), (6, 1), (14, 14)])
def test_roi_pool_equals_crop_and_resize(crop_size, extrapolation_value, method, mode,
                                         op_determinism):
    from roicore.adapters import tf as rtf

    def both(images, boxes, idx, dy):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([images, boxes])
            ours = rtf.roi_pool(images, boxes, idx, crop_size, method=method,
                                extrapolation_value=extrapolation_value)
            theirs = tf.image.crop_and_resize(images, boxes, idx, crop_size, method=method,
                                              extrapolation_value=extrapolation_value)
        return [ours, theirs, *tape.gradient(ours, [images, boxes], dy),
                *tape.gradient(theirs, [images, boxes], dy)]

    run = both if mode == "eager" else tf.function(both)
    for seed in range(6):
        images, boxes, idx, _, dy = crop_case(seed, crop_size, halves=seed % 2 == 1)
        y, y_tf, dx, db, dx_tf, db_tf = (t.numpy() for t in run(
            tf.constant(images), tf.constant(boxes), tf.constant(idx), tf.constant(dy)))
        np.testing.assert_array_equal(y, y_tf)
        np.testing.assert_array_equal(dx, dx_tf)
        np.testing.assert_array_equal(db, db_tf)


@pytest.mark.usefixtures("tf_path")
def test_box_gradient_in_float64_and_with_unwatched_boxes():
    """float64 boxes get a float64 gradient (computed in the images' dtype, float32 here,
    as crop_and_resize computes it); with the boxes unwatched only the images get one."""
    from roicore.adapters import tf as rtf
    images, boxes, idx, crop, dy = crop_case(3)
    images, boxes64 = tf.constant(images), tf.constant(boxes.astype(np.float64))
    with tf.GradientTape() as tape:
        tape.watch(boxes64)
        ours = rtf.roi_pool(images, boxes64, idx, crop, method="bilinear")
    db = tape.gradient(ours, boxes64, dy)
    assert db.dtype == tf.float64
    want = tf.raw_ops.CropAndResizeGradBoxes(grads=dy, image=images, boxes=boxes, box_ind=idx)
    np.testing.assert_array_equal(db.numpy(), want.numpy().astype(np.float64))
    with tf.GradientTape() as tape:
        tape.watch(images)
        ours = rtf.roi_pool(images, boxes64, idx, crop, method="bilinear")
    assert tape.gradient(ours, images, dy) is not None


# ---------------------------------------------------------------------------------------
# roi_pool takes crop_and_resize's arguments

def test_crop_size_is_crop_and_resizes_name_for_the_output_size():
    from roicore.adapters import tf as rtf
    images, boxes, idx, _, _ = crop_case(0)
    want = tf.image.crop_and_resize(images, boxes, idx, (3, 5), extrapolation_value=0.5)
    for kwargs in [dict(crop_size=(3, 5)), dict(crop_size=[3, 5]),
                   dict(crop_size=tf.constant([3, 5])), dict(crop_size=np.array([3, 5], np.int64)),
                   dict(output_size=(3, 5)), dict(output_size=tf.constant([3, 5]))]:
        got = rtf.roi_pool(images, boxes, idx, method="bilinear", extrapolation_value=0.5,
                           **kwargs)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    # crop_and_resize's positional order works unchanged
    got = rtf.roi_pool(images, boxes, idx, tf.constant([3, 5]), method="bilinear",
                       extrapolation_value=0.5)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    # in a graph, a constant crop size gives static shapes
    fn = tf.function(lambda im: rtf.roi_pool(im, boxes, idx, crop_size=tf.constant([3, 5]),
                                             method="bilinear"))
    assert fn.get_concrete_function(tf.TensorSpec(images.shape)).structured_outputs.shape == (
        24, 3, 5, 4)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(output_size=3, crop_size=3), TypeError, "pass output_size or crop_size"),
    (dict(), TypeError, r"needs the output size: pass output_size \(or crop_size"),
    (dict(crop_size=3, method="max"), ValueError, "method='max' takes output_size"),
    (dict(crop_size=(3, 0)), ValueError, "crop_size must be >= 1"),
    (dict(crop_size=(1, 2, 3)), ValueError, "crop_size must be an int or a pair"),
    (dict(crop_size=tf.constant([3.0, 2.0])), TypeError, "crop_size must be an int or a pair of "
                                                         "ints .*float32 tensor of shape"),
    (dict(crop_size=tf.constant([[3, 2]])), TypeError, r"shape \(1, 2\)"),
])
def test_bad_crop_sizes(kwargs, error, message):
    from roicore.adapters import tf as rtf
    images, boxes, idx, _, _ = crop_case(0)
    with pytest.raises(error, match=message):
        rtf.roi_pool(images, boxes, idx, **{"method": "bilinear", **kwargs})


def test_a_crop_size_known_only_at_run_time_is_refused_clearly():
    from roicore.adapters import tf as rtf
    images, boxes, idx, _, _ = crop_case(0)
    fn = tf.function(lambda size: rtf.roi_pool(images, boxes, idx, crop_size=size,
                                               method="bilinear"))
    with pytest.raises(ValueError, match="crop_size must be known when the op is built"):
        fn(tf.constant([3, 5]))
