"""roi_pool(method="bilinear" | "nearest") against tf.image.crop_and_resize, bit for bit.

TensorFlow's crop_and_resize is the oracle of roicore's crop methods: the forward
(``CropAndResize``), the gradient of the image (``CropAndResizeGradImage``) and of the
boxes (``CropAndResizeGradBoxes``).  The slow reference (tests/reference.py), written
from TF's kernel, is checked against TF here too, so that the core tests, which compare
the compiled kernels with the reference, inherit TF's numbers.  Last, the drop-in
roicore.adapters.tf.crop_and_resize against tf.image.crop_and_resize: image dtypes,
numbers, gradients and errors.
"""
import re

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


# ---------------------------------------------------------------------------------------
# crop_and_resize: the drop-in for tf.image.crop_and_resize, against TF's own op

# Every dtype TF has an image for; which of them crop_and_resize takes is TF's answer
# (test_takes_the_image_dtypes_tf_takes), not this list's.
ALL_DTYPES = [tf.uint8, tf.uint16, tf.uint32, tf.uint64, tf.int8, tf.int16, tf.int32,
              tf.int64, tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.bool,
              tf.complex64]


def _tf_takes(dtype):
    try:
        tf.image.crop_and_resize(tf.zeros([1, 2, 2, 1], dtype), [[0, 0, 1, 1]], [0], [1, 1])
    except (tf.errors.InvalidArgumentError, TypeError):
        return False
    return True


TF_DTYPES = [d for d in ALL_DTYPES if _tf_takes(d)]


def dtype_image(dtype, seed):
    """NHWC images of ``dtype`` spanning its range: integers up to its limits (int64 values
    beyond 2**24, which float32 rounds), floats well beyond [-1, 1]."""
    rng = np.random.default_rng(seed)
    shape = (3, int(rng.integers(2, 10)), int(rng.integers(2, 10)), 4)  # crop_case's N, C
    if dtype.is_integer:
        info = np.iinfo(dtype.as_numpy_dtype)
        values = rng.integers(info.min, info.max, shape, dtype=info.dtype, endpoint=True)
    else:
        values = rng.standard_normal(shape) * 300
    return tf.constant(values.astype(dtype.as_numpy_dtype))


def run_both(image, boxes, idx, crop_size, dy, **kwargs):
    """tf.image.crop_and_resize and roicore's, each with the gradients of image and boxes
    (None where TF gives none) for the upstream gradient dy."""
    from roicore.adapters import tf as rtf
    out = []
    for fn in (tf.image.crop_and_resize, rtf.crop_and_resize):
        with tf.GradientTape() as tape:
            tape.watch(boxes)
            if image.dtype.is_floating:
                tape.watch(image)
            y = fn(image, boxes, idx, crop_size, **kwargs)
        out.append((y, *tape.gradient(y, [image, boxes], dy)))
    return out


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.name)
def test_takes_the_image_dtypes_tf_takes(dtype):
    """Exactly TF's image dtypes (this TF's: read from its op), refusing the others with
    TF's own error."""
    from roicore.adapters import tf as rtf
    image = tf.zeros([1, 3, 3, 2], dtype)
    args = (image, [[0.0, 0.0, 1.0, 1.0]], [0], [2, 2])
    if dtype in TF_DTYPES:
        assert rtf.crop_and_resize(*args).dtype == tf.float32
        return
    with pytest.raises(Exception) as theirs:
        tf.image.crop_and_resize(*args)
    with pytest.raises(type(theirs.value)) as ours:
        rtf.crop_and_resize(*args)
    assert str(ours.value) == str(theirs.value)


def test_tf_takes_integer_and_float_images():
    """The issue's premise, held against this TF: integers and float16/32/64, no others
    among uint32, uint64, bfloat16, bool and complex64."""
    assert {tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.float32,
            tf.float64} <= set(TF_DTYPES)
    assert not {tf.uint32, tf.uint64, tf.bool, tf.complex64} & set(TF_DTYPES)


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("mode", ["eager", "tf.function"])
@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", TF_DTYPES, ids=lambda d: d.name)
def test_crop_and_resize_equals_tf_for_every_image_dtype(dtype, method, mode, op_determinism):
    """Crops (float32 whatever the image), the boxes' gradient, and the image's gradient:
    bit for bit for float32 images, none for integer ones (as TF), and for float16 and
    float64 the float32 gradient cast to the image's dtype (TF adds in that dtype: see the
    next test)."""
    for seed in range(3):
        image = dtype_image(dtype, seed)
        _, boxes, idx, crop, dy = crop_case(seed, halves=seed == 1)
        boxes, dy = tf.constant(boxes), tf.constant(dy)
        for extrapolation_value in (0.0, -2.5, 0.1):
            def both(image, boxes):
                return run_both(image, boxes, idx, crop, dy, method=method,
                                extrapolation_value=extrapolation_value)

            (y_tf, dx_tf, db_tf), (y, dx, db) = (both if mode == "eager" else
                                                 tf.function(both))(image, boxes)
            assert y.dtype == y_tf.dtype == tf.float32
            assert y.shape == y_tf.shape
            np.testing.assert_array_equal(y.numpy(), y_tf.numpy())
            np.testing.assert_array_equal(db.numpy(), db_tf.numpy())
            if not dtype.is_floating:
                assert dx is None and dx_tf is None
                continue
            assert dx.dtype == dx_tf.dtype == dtype
            want = dx_tf if dtype == tf.float32 else tf.cast(
                tf.raw_ops.CropAndResizeGradImage(grads=dy, boxes=boxes, box_ind=idx,
                                                  image_size=image.shape, T=tf.float32,
                                                  method=method), dtype)
            np.testing.assert_array_equal(dx.numpy(), want.numpy())


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
@pytest.mark.parametrize("dtype", [tf.float16, tf.float64], ids=lambda d: d.name)
def test_float16_and_float64_image_gradients_differ_from_tf_only_by_rounding(dtype, method,
                                                                              op_determinism):
    """TF's CropAndResizeGradImage adds each contribution in the image's dtype, roicore in
    float32 (then casts): the docstring's one difference in numbers.  Both are close, and
    the values do differ where samples overlap (so the docstring stays true)."""
    image = dtype_image(dtype, 0)
    _, boxes, idx, crop, dy = crop_case(0, crop_size=(9, 9))
    (_, dx_tf, _), (_, dx, _) = run_both(image, tf.constant(boxes), idx, crop,
                                         tf.constant(dy), method=method)
    tolerance = dict(rtol=1e-2, atol=1e-2) if dtype == tf.float16 else dict(rtol=1e-5,
                                                                          atol=1e-5)
    np.testing.assert_allclose(dx.numpy().astype(np.float64),
                               dx_tf.numpy().astype(np.float64), **tolerance)
    assert not np.array_equal(dx.numpy(), dx_tf.numpy())


@pytest.mark.usefixtures("tf_path")
def test_takes_what_tf_converts():
    """Python lists, float64 arrays of boxes (rounded to float32 as TF does), int64 arrays
    of indices and crop sizes, None for the method and extrapolation value."""
    from roicore.adapters import tf as rtf
    rng = np.random.default_rng(5)
    image = rng.standard_normal((2, 6, 7, 3))
    boxes = rng.uniform(-0.2, 1.2, (5, 4))
    idx = np.array([0, 1, 1, 0, 1], np.int64)
    for args, kwargs in [
            ((image, boxes, idx, np.array([3, 4], np.int64)), {}),
            ((image.tolist(), boxes.tolist(), idx.tolist(), [3, 4]), {}),
            ((image, boxes, idx, tf.constant([3, 4])), dict(method=None,
                                                           extrapolation_value=None)),
            ((image, boxes, idx, (3, 4)), dict(method="nearest",
                                               extrapolation_value=np.float64(0.3)))]:
        want = tf.image.crop_and_resize(*args, **kwargs)
        got = rtf.crop_and_resize(*args, **kwargs)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("boxes_shape", [(0, 4), (0, 5), (3, 0)])
def test_no_boxes(boxes_shape):
    """TF takes any empty boxes with empty box indices (eagerly), giving no crops."""
    from roicore.adapters import tf as rtf
    image = np.ones((2, 4, 5, 3), np.float32)
    args = (image, np.zeros(boxes_shape, np.float32), np.zeros(0, np.int32), (2, 3))
    want = tf.image.crop_and_resize(*args)
    got = rtf.crop_and_resize(*args)
    assert got.shape == want.shape == (0, 2, 3, 3) and got.dtype == tf.float32


def test_static_shape_name_scope_and_graph_crop_size():
    """In a graph: TF's static output shape, the ops under ``name``, a constant crop size
    tensor; a crop size computed in the graph is refused clearly (a documented
    difference)."""
    from roicore.adapters import tf as rtf
    images, boxes, idx, _, _ = crop_case(0)

    @tf.function
    def fn(image, size):
        fixed = rtf.crop_and_resize(image, boxes, idx, tf.constant([3, 5]), name="my_crops")
        with pytest.raises(ValueError, match="crop_size must be known when the op is built"):
            rtf.crop_and_resize(image, boxes, idx, size)
        return fixed

    graph = fn.get_concrete_function(tf.TensorSpec([None, *images.shape[1:]]),
                                     tf.TensorSpec([2], tf.int32)).graph
    assert graph.outputs[0].shape.as_list() == [24, 3, 5, 4]
    names = [op.name for op in graph.get_operations() if op.type == "RoicoreCropAndResize"]
    assert names and all(name.startswith("my_crops/") for name in names)


def test_xla_is_refused_naming_crop_and_resize():
    from roicore.adapters import tf as rtf
    images, boxes, idx, _, _ = crop_case(0)
    fn = tf.function(lambda im: rtf.crop_and_resize(im, boxes, idx, (3, 3)), jit_compile=True)
    with pytest.raises(NotImplementedError, match="crop_and_resize cannot be compiled with XLA"):
        fn(tf.constant(images))


# Arguments TF refuses, each a change to a valid call: (image, boxes, box_indices,
# crop_size, method, extrapolation_value).  Where the error comes (while tracing or when
# the graph runs) and its type and words are TF's; the tests compare, they do not
# transcribe.
IMAGE = np.random.default_rng(0).random((2, 5, 6, 3)).astype(np.float32)
BOXES = np.array([[0.1, 0.2, 0.8, 0.9], [0.0, 0.0, 1.0, 1.0]], np.float32)
NAN = np.array([[np.nan, 0.2, 0.8, 0.9], [0.0, 0.0, 1.0, 1.0]], np.float32)
INDICES = np.array([0, 1], np.int32)
BAD_ARGUMENTS = {
    "image 3-D": dict(image=IMAGE[0]),
    "image 5-D": dict(image=IMAGE[None]),
    "image scalar": dict(image=np.float32(1.0)),
    "image height 0": dict(image=np.zeros((2, 0, 6, 3), np.float32)),
    "image width 0": dict(image=np.zeros((2, 5, 0, 3), np.float32)),
    "image uint32": dict(image=IMAGE.astype(np.uint32)),
    "image bool": dict(image=IMAGE > 0.5),
    "boxes 1-D": dict(boxes=BOXES[0]),
    "boxes 3-D": dict(boxes=BOXES[None]),
    "boxes 5 columns": dict(boxes=np.zeros((2, 5), np.float32)),
    "boxes float64 tensor": dict(boxes=tf.constant(BOXES, tf.float64)),
    "boxes not finite": dict(boxes=NAN),
    "boxes infinite": dict(boxes=np.where(BOXES > 0.5, np.inf, BOXES)),
    "box_indices 2-D": dict(box_indices=INDICES[None]),
    "box_indices one per box": dict(box_indices=np.array([0, 1, 1], np.int32)),
    "box_indices negative": dict(box_indices=np.array([0, -1], np.int32)),
    "box_indices past the batch": dict(box_indices=np.array([0, 2], np.int32)),
    "box_indices int64 tensor": dict(box_indices=tf.constant(INDICES, tf.int64)),
    "box_indices with an empty batch": dict(image=np.zeros((0, 5, 6, 3), np.float32)),
    "crop_size 0": dict(crop_size=(0, 4)),
    "crop_size negative": dict(crop_size=(3, -1)),
    "crop_size 3 values": dict(crop_size=(3, 4, 5)),
    "crop_size 1 value": dict(crop_size=(3,)),
    "crop_size scalar": dict(crop_size=3),
    "crop_size floats": dict(crop_size=(3.0, 4.0)),
    "crop_size int64 tensor": dict(crop_size=tf.constant([3, 4], tf.int64)),
    "method": dict(method="bicubic"),
    "extrapolation_value": dict(extrapolation_value="a"),
    # two faults: the one TF checks first is reported
    "boxes 5 columns and crop_size 0": dict(boxes=np.zeros((2, 5), np.float32),
                                            crop_size=(0, 1)),
    "crop_size 0 and box_indices past the batch": dict(crop_size=(0, 1),
                                                       box_indices=np.array([0, 5], np.int32)),
    "boxes not finite and box_indices past the batch": dict(
        boxes=NAN, box_indices=np.array([0, 5], np.int32)),
}
# In a graph TF refuses these only when it runs; roicore's op, whose crop size is an
# attribute, refuses them while tracing (the docstring's difference), with a ValueError.
GRAPH_TRACING_DIFFERENCES = {"crop_size 0", "crop_size negative",
                             "crop_size 0 and box_indices past the batch"}
# Tensors of a wrong dtype made outside a tf.function fail inside TF's graph building
# with an AssertionError: a TF quirk that is no drop-in's business.
EAGER_ONLY = {"boxes float64 tensor", "box_indices int64 tensor", "crop_size int64 tensor"}


def call_with(change, fn):
    kwargs = dict(image=IMAGE, boxes=BOXES, box_indices=INDICES, crop_size=(3, 4))
    return fn(**{**kwargs, **change})


def raised(call):
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any error is compared with TF's
        return exc
    pytest.fail("no error raised")


def own_words(exc):
    """An error's message without what names the graph, node, function or traceback, and
    without the input shapes a shape function lists (TF checks an image with 0 channels
    for roicore: the docstring's difference)."""
    text = str(exc)
    text = re.sub(r"\{\{function_node [^}]*\}\}|\[\[.*?\]\]|\[Op:[^\]]*\]( name: )?", "", text)
    text = re.sub(r" for '\{\{node .*?\)'", "", text)  # the node a shape function names
    text = re.sub(r" with input shapes: .*", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1]


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_errors_are_tfs_eagerly(case):
    """Eagerly: TF's exception type and exactly TF's message."""
    from roicore.adapters import tf as rtf
    theirs = raised(lambda: call_with(BAD_ARGUMENTS[case], tf.image.crop_and_resize))
    ours = raised(lambda: call_with(BAD_ARGUMENTS[case], rtf.crop_and_resize))
    assert type(ours) is type(theirs)
    assert str(ours) == str(theirs)


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("case", sorted(set(BAD_ARGUMENTS) - EAGER_ONLY))
def test_errors_are_tfs_in_a_graph(case):
    """In a tf.function, with the arguments as constants: TF's exception type and words,
    raised where TF raises them (tracing or running), but for the crop sizes in
    GRAPH_TRACING_DIFFERENCES."""
    from roicore.adapters import tf as rtf
    def in_graph(fn):
        return tf.function(lambda: call_with(BAD_ARGUMENTS[case], fn), autograph=False)()

    theirs = raised(lambda: in_graph(tf.image.crop_and_resize))
    ours = raised(lambda: in_graph(rtf.crop_and_resize))
    if case in GRAPH_TRACING_DIFFERENCES:
        assert isinstance(theirs, tf.errors.InvalidArgumentError)
        assert isinstance(ours, ValueError) and "crop_size must be >= 1" in str(ours)
        return
    assert type(ours) is type(theirs)
    assert own_words(ours) == own_words(theirs)


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("indices,boxes,error,message", [
    ([0, 2], BOXES, tf.errors.OutOfRangeError, r"box_index has values outside \[0, batch_size\)"),
    ([0, 1], NAN, tf.errors.InvalidArgumentError,
     "Boxes contains at least one element that is not finite"),
])
def test_value_errors_are_tfs_in_a_graph_with_tensor_arguments(indices, boxes, error, message):
    """The values reach the graph only when it runs: TF's check still runs first (and is
    not optimised away)."""
    from roicore.adapters import tf as rtf
    fn = tf.function(lambda im, b, i: rtf.crop_and_resize(im, b, i, (3, 4)))
    with pytest.raises(error, match=message):
        fn(IMAGE, boxes, np.array(indices, np.int32))


@pytest.mark.usefixtures("tf_path")
@pytest.mark.parametrize("value", [np.nan, np.inf, 1e39, 1 / 3, True, np.int64(-7), 2**70])
def test_extrapolation_values_as_tfs_float_attribute_holds_them(value):
    """Any real number, held as a C float (1e39 becomes inf, 1/3 rounds)."""
    from roicore.adapters import tf as rtf
    boxes = np.array([[-0.5, 0.2, 0.8, 1.9], [0.0, 0.0, 1.0, 1.0]], np.float32)
    want = tf.image.crop_and_resize(IMAGE, boxes, INDICES, (3, 4), extrapolation_value=value)
    got = rtf.crop_and_resize(IMAGE, boxes, INDICES, (3, 4), extrapolation_value=value)
    np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.usefixtures("tf_path")
def test_boxes_beyond_roicore_limit_are_refused():
    """The docstring's difference: TF crops a box 1e30 pixels away (all extrapolation),
    roicore refuses coordinates past 2**24 pixels."""
    from roicore.adapters import tf as rtf
    far = np.array([[-1e30, 0.2, 0.8, 1e30]], np.float32)
    tf.image.crop_and_resize(IMAGE, far, [0], (3, 4))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"at most 2\*\*24"):
        rtf.crop_and_resize(IMAGE, far, [0], (3, 4))
