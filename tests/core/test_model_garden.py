"""The TF Model Garden's sampler (conventions.MODEL_GARDEN_ALIGN) and level rule
(LEVELS["tf_model_garden"]) against the slow reference written from its published code;
TensorFlow's own ops check them again in tests/adapters/test_tf_pyramid.py."""
import numpy as np
import pytest

import roicore.core as rc
from roicore.core.conventions import LEVELS, MODEL_GARDEN_ALIGN
from roicore.core.pyramid import CANONICAL

import reference as ref

MG = MODEL_GARDEN_ALIGN


def _boxes(rng, k, h, w, dtype):
    """Boxes in map pixels: inside, across and outside the edges, reversed and empty."""
    x1 = rng.uniform(-0.3 * w, 1.1 * w, k)
    y1 = rng.uniform(-0.3 * h, 1.1 * h, k)
    bw = rng.choice([0.0, 0.3, 2.5, 9.0, -1.5], k) * rng.uniform(0.5, 1.5, k)
    bh = rng.choice([0.0, 0.3, 2.5, 9.0, -1.5], k) * rng.uniform(0.5, 1.5, k)
    return np.stack([x1, y1, x1 + bw, y1 + bh], 1).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_forward_and_gradient_match_the_reference(dtype, scale):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 11)).astype(dtype)
    boxes = _boxes(rng, 40, 9 / scale, 11 / scale, dtype)
    batch = rng.integers(0, 2, 40)
    y = rc.roi_align(x, boxes, (5, 4), scale, 1, False, batch_indices=batch, convention=MG)
    np.testing.assert_array_equal(y, ref.model_garden_crop(x, boxes, batch, (5, 4), scale))
    g = rng.standard_normal(y.shape).astype(dtype)
    dx = rc.roi_align_backward(g, boxes, x.shape, scale, 1, False, batch_indices=batch,
                               convention=MG)
    np.testing.assert_array_equal(
        dx, ref.model_garden_crop_backward(g, boxes, batch, x.shape, scale))
    for threads in (1, 2):
        np.testing.assert_array_equal(
            rc.roi_align_backward(g, boxes, x.shape, scale, 1, False, batch_indices=batch,
                                  convention=MG, n_threads=threads), dx)


def test_the_gradient_is_the_forward_s_adjoint():
    """The op is linear in x: <f(x), g> = <x, f'(g)> in float64 (finite differences of a
    linear map are exact, so this is their check)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 2, 7, 8))
    boxes = _boxes(rng, 25, 7, 8, np.float64)
    batch = np.zeros(25, np.int64)
    y = rc.roi_align(x, boxes, 3, 1.0, 1, False, batch_indices=batch, convention=MG)
    g = rng.standard_normal(y.shape)
    dx = rc.roi_align_backward(g, boxes, x.shape, 1.0, 1, False, batch_indices=batch,
                               convention=MG)
    assert np.vdot(y, g) == pytest.approx(np.vdot(x, dx), rel=1e-12, abs=1e-12)


def test_gradient_rows_stay_whole_when_the_bins_outgrow_a_chunk():
    """Many bins per row and 64 channels split a box's gradient into pieces: each piece must
    still hold whole bin rows, or clamped rows (both neighbours the last) add out of order."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 64, 6, 40)).astype(np.float32)
    boxes = np.array([[0, 4.7, 39, 7.5], [3, 5.2, 3.4, 9.0], [-2, -3, 41, 8]], np.float32)
    batch = np.zeros(3, np.int64)
    g = rng.standard_normal((3, 64, 9, 37)).astype(np.float32)
    dx = rc.roi_align_backward(g, boxes, x.shape, 1.0, 1, False, batch_indices=batch,
                               convention=MG)
    np.testing.assert_array_equal(
        dx, ref.model_garden_crop_backward(g, boxes, batch, x.shape, 1.0))


@pytest.mark.parametrize("sampling_ratio, aligned", [(2, False), (-1, False), (1, True)])
def test_one_unaligned_sample_per_bin_only(sampling_ratio, aligned):
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(ValueError, match="sampling_ratio must be 1 and aligned 0"):
        rc.roi_align(x, np.zeros((1, 4), np.float32), 2, 1.0, sampling_ratio, aligned,
                     batch_indices=[0], convention=MG)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_pyramid_pools_each_box_from_its_model_garden_level(dtype):
    rng = np.random.default_rng(6)
    scales = [1 / 4, 1 / 8, 1 / 16, 1 / 32]
    maps = [rng.standard_normal((2, 3, 64 // 2 ** i, 48 // 2 ** i)).astype(dtype)
            for i in range(4)]
    k = 60
    side = np.exp(rng.uniform(np.log(4), np.log(1500), (k, 2)))
    x1 = rng.uniform(-20, 200, k)
    y1 = rng.uniform(-20, 250, k)
    boxes = np.stack([x1, y1, x1 + side[:, 0], y1 + side[:, 1]], 1).astype(dtype)
    boxes[:3, 2] = boxes[:3, 0] - 3  # reversed: the first level
    batch = rng.integers(0, 2, k)
    k0, s0 = CANONICAL["tf_model_garden"]
    y = rc.pyramid_roi_align(maps, boxes, 7, scales, 1, False, levels="tf_model_garden",
                             convention=MG, batch_indices=batch)
    levels = [ref.pyramid_level(b, LEVELS["tf_model_garden"], k0, s0, 2, 4, dtype)
              for b in boxes]
    assert set(levels) == {0, 1, 2, 3}
    for i, level in enumerate(levels):
        np.testing.assert_array_equal(
            y[i], ref.model_garden_crop(maps[level], boxes[i:i + 1], batch[i:i + 1], 7,
                                        scales[level])[0])
    g = rng.standard_normal(y.shape).astype(dtype)
    grads = rc.pyramid_roi_align_backward(g, boxes, [m.shape for m in maps], scales, 1, False,
                                          levels="tf_model_garden", convention=MG,
                                          batch_indices=batch)
    for level, (m, d) in enumerate(zip(maps, grads)):
        mine = np.array([i for i, lv in enumerate(levels) if lv == level])
        np.testing.assert_array_equal(d, ref.model_garden_crop_backward(
            g[mine], boxes[mine], batch[mine], m.shape, scales[level]))
