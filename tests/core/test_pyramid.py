"""roicore.core.pyramid_roi_align against the slow reference: each box's level by the level
rule written from the frameworks' formulas (reference.pyramid_level), then each box pooled
alone by the reference RoIAlign from its level's map.  torchvision's own MultiScaleRoIAlign
is the oracle in tests/adapters/test_torch_pyramid.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import reference as ref
import roicore.core as rc
from roicore.core.conventions import LEVELS, ROI_ALIGN
from roicore.core.pyramid import CANONICAL
from test_ops import assert_same

SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def pyramid(rng, dtype, N=2, C=5, H=40, W=56, levels=4):
    return [rng.standard_normal((N, C, max(H >> i, 1), max(W >> i, 1))).astype(dtype)
            for i in range(levels)]


def boxes_for(rng, K, dtype, extent=(224, 160)):
    """Boxes of every size class (so every level is hit), with reversed, empty, outside and
    sub-pixel ones."""
    xy = rng.uniform(-20, extent[0], (K, 2))
    wh = np.exp(rng.uniform(-1, 7, (K, 2))) - 1
    b = np.concatenate([xy, xy + wh], 1)
    b[::7, 2] = b[::7, 0] - rng.uniform(0, 5, b[::7].shape[0])  # reversed in x
    b[::11, 2:] = b[::11, :2]                                   # empty
    b[::13] += 400                                              # outside the map
    return b.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("levels", sorted(LEVELS))
def test_levels_match_the_reference_rule(levels, dtype):
    rng = np.random.default_rng(1)
    rules = LEVELS[levels]
    k0, s0 = CANONICAL[levels]
    # sides a few ulps around every level boundary s0 * 2**j, and random boxes
    base = np.array([s0 * 2.0 ** j for j in range(-3, 4)], dtype)
    ulp = np.finfo(dtype).eps
    sides = (base[:, None] * (1 + np.arange(-40, 40)[None, :] * ulp)).astype(dtype).ravel()
    near = np.stack([np.zeros_like(sides), np.zeros_like(sides), sides, sides], 1)
    if rules.pixel_offset:
        near[:, 2:] -= 1
    b = np.concatenate([near, boxes_for(rng, 400, dtype)]).astype(dtype)
    first = 2 if levels != "openvino" and levels != "mmdet" else 0
    got = rc.pyramid_levels(b, SCALES, first_level=first, canonical_level=k0,
                            canonical_size=s0, levels=levels, dtype=dtype)
    want = [ref.pyramid_level(box, rules, k0, s0, first, 4, dtype) for box in b]
    np.testing.assert_array_equal(got, want)
    assert set(got) >= {0, 1, 2, 3}  # the cases reach every level


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
# a slow reference, and CI runs tests/core four times: at most 50 examples
@settings(max_examples=min(50, settings.default.max_examples))
@given(seed=st.integers(0, 2**31), levels=st.sampled_from(sorted(LEVELS)),
       convention=st.sampled_from(sorted(ROI_ALIGN)), sampling_ratio=st.sampled_from([-1, 0, 2]),
       aligned=st.booleans(), n_maps=st.sampled_from([1, 2, 4]))
def test_matches_reference(dtype, seed, levels, convention, sampling_ratio, aligned, n_maps):
    rng = np.random.default_rng(seed)
    maps = pyramid(rng, dtype, H=24, W=32, levels=n_maps)
    b = boxes_for(rng, 12, dtype, extent=(128, 96))
    batch = rng.integers(0, 2, len(b))
    k0, s0 = CANONICAL[levels]
    kw = dict(first_level=2, canonical_level=k0, canonical_size=s0, levels=levels,
              convention=convention)
    y = rc.pyramid_roi_align(maps, b, (3, 2), SCALES[:n_maps], sampling_ratio, aligned,
                             batch_indices=batch, **kw)
    rules = ROI_ALIGN[convention]
    want = ref.pyramid_roi_align(maps, b, batch, (3, 2), SCALES[:n_maps], sampling_ratio,
                                 aligned, rules, LEVELS[levels], k0, s0, 2)
    assert_same(y, want)
    # the gradient: each map gets the reference gradient of its own level's boxes
    g = rng.standard_normal(y.shape).astype(dtype)
    grads = rc.pyramid_roi_align_backward(g, b, [m.shape for m in maps], SCALES[:n_maps],
                                          sampling_ratio, aligned, batch_indices=batch, **kw)
    assigned = np.array([ref.pyramid_level(box, LEVELS[levels], k0, s0, 2, n_maps, dtype)
                         for box in b])
    for i, (m, dx) in enumerate(zip(maps, grads)):
        mine = assigned == i
        assert_same(dx, ref.roi_align_backward(g[mine], b[mine], batch[mine], m.shape, (3, 2),
                                               SCALES[i], sampling_ratio, aligned, rules))


def test_equals_a_loop_of_roi_align_on_a_larger_case():
    """The fused operator against core.roi_align per level (a different path through the
    kernels: no row mapping), 64+ channels so the whole-block code runs."""
    rng = np.random.default_rng(3)
    maps = pyramid(rng, np.float32, C=72, H=100, W=152)
    b = boxes_for(rng, 300, np.float32, extent=(600, 400))
    batch = rng.integers(0, 2, len(b))
    y = rc.pyramid_roi_align(maps, b, 7, SCALES, 2, batch_indices=batch)
    g = rng.standard_normal(y.shape).astype(np.float32)
    grads = rc.pyramid_roi_align_backward(g, b, [m.shape for m in maps], SCALES, 2,
                                          batch_indices=batch)
    levels = rc.pyramid_levels(b, SCALES)
    assert set(levels) == {-1, 0, 1, 2, 3}
    want = np.zeros_like(y)
    for i, m in enumerate(maps):
        mine = levels == i
        want[mine] = rc.roi_align(m, b[mine], 7, SCALES[i], 2, batch_indices=batch[mine],
                                  convention="torchvision")
        assert_same(grads[i], rc.roi_align_backward(g[mine], b[mine], m.shape, SCALES[i], 2,
                                                    batch_indices=batch[mine],
                                                    convention="torchvision"))
    assert_same(y, want)
    # every thread count gives the same bits
    for n in (1, 3):
        assert_same(rc.pyramid_roi_align(maps, b, 7, SCALES, 2, batch_indices=batch,
                                         n_threads=n), y)
        for d, want_d in zip(rc.pyramid_roi_align_backward(
                g, b, [m.shape for m in maps], SCALES, 2, batch_indices=batch, n_threads=n),
                grads):
            assert_same(d, want_d)


def test_unpooled_and_masked_boxes_give_zero_and_no_gradient():
    rng = np.random.default_rng(4)
    maps = pyramid(rng, np.float32)
    b = np.array([[0, 10, 10, 60, 60], [1, 50, 5, 10, 40],   # reversed: level NaN
                  [-1, 10, 10, 60, 60]], np.float32)        # masked
    out = np.full((3, 5, 2, 2), 7.0, np.float32)
    y = rc.pyramid_roi_align(maps, b, 2, SCALES, masked=True, out=out)
    assert y is out
    assert (y[1:] == 0).all() and (y[0] != 0).any()
    grads = rc.pyramid_roi_align_backward(np.ones_like(y), b, [m.shape for m in maps], SCALES,
                                          masked=True)
    alone = rc.pyramid_roi_align_backward(np.ones_like(y[:1]), b[:1], [m.shape for m in maps],
                                          SCALES)
    for d, want in zip(grads, alone):
        assert_same(d, want)
    # paddle's rule puts the reversed box on the lowest level; openvino's skips it
    big_and_reversed = np.array([[10, 10, 300, 300], [50, 5, 10, 40]], np.float32)
    assert list(rc.pyramid_levels(big_and_reversed, SCALES)) == [2, -1]
    assert list(rc.pyramid_levels(big_and_reversed, SCALES, levels="paddle")) == [2, 0]
    assert list(rc.pyramid_levels(big_and_reversed, SCALES, levels="openvino", first_level=0,
                                  canonical_level=2)) == [2, -1]


def test_one_map_by_the_rule_pools_only_the_boxes_the_rule_assigns():
    """GluonCV and OpenVINO apply their rule to a lone map too: a reversed box (NaN level)
    is not pooled there, where torchvision's lone map pools it."""
    m = pyramid(np.random.default_rng(5), np.float32, levels=1)
    b = np.array([[0, 30, 30, 10, 50], [1, 0, 0, 50, 50]], np.float32)  # x2 < x1: area < 0
    y = rc.pyramid_roi_align(m, b, 2, [0.25], levels="gluoncv", canonical_level=4)
    assert (y[0] == 0).all() and (y[1] != 0).any()
    assert_same(y[1:], rc.roi_align(m[0], b[1:], 2, 0.25, convention="torchvision"))
    assert list(rc.pyramid_levels(b[:, 1:], [0.25], levels="gluoncv")) == [-1, 0]
    assert list(rc.pyramid_levels(b[:, 1:], [0.25], levels="torchvision")) == [0, 0]


def test_one_map_pools_every_box_from_it():
    rng = np.random.default_rng(5)
    m = pyramid(rng, np.float64, levels=1)
    b = np.array([[0, 30, 30, 10, 10], [1, 0, 0, 500, 500]], np.float64)  # reversed, huge
    y = rc.pyramid_roi_align(m, b, 3, [0.25])
    assert_same(y, rc.roi_align(m[0], b, 3, 0.25, convention="torchvision"))


def test_float16_is_computed_in_float32():
    rng = np.random.default_rng(6)
    maps = pyramid(rng, np.float16)
    b = boxes_for(rng, 20, np.float32)
    y = rc.pyramid_roi_align(maps, b, 2, SCALES, batch_indices=np.zeros(20, int))
    assert y.dtype == np.float16
    want = rc.pyramid_roi_align([m.astype(np.float32) for m in maps], b, 2, SCALES,
                                batch_indices=np.zeros(20, int))
    assert_same(y, want.astype(np.float16))


def test_empty_boxes():
    maps = pyramid(np.random.default_rng(7), np.float32)
    y = rc.pyramid_roi_align(maps, np.zeros((0, 5), np.float32), 3, SCALES)
    assert y.shape == (0, 5, 3, 3)
    grads = rc.pyramid_roi_align_backward(y, np.zeros((0, 5), np.float32),
                                          [m.shape for m in maps], SCALES)
    assert all((d == 0).all() and d.shape == m.shape for d, m in zip(grads, maps))


@pytest.mark.parametrize("change, match", [
    (lambda maps, kw: maps.__setitem__(2, maps[2][:, :3]), r"maps\[2\].*channels"),
    (lambda maps, kw: maps.__setitem__(1, maps[1][:1]), r"maps\[1\]"),
    (lambda maps, kw: maps.__setitem__(3, maps[3].astype(np.float64)), r"maps\[3\]"),
    (lambda maps, kw: kw.update(spatial_scales=SCALES[:3]), "one scale per map"),
    (lambda maps, kw: kw.update(spatial_scales=[0.3, 0.15, 0.075, 0.0375]), "power of two"),
    (lambda maps, kw: kw.update(levels="caffe"), "levels|convention must be one of"),
    (lambda maps, kw: kw.update(canonical_size=0), "canonical_size"),
    (lambda maps, kw: kw.update(first_level=5000), "first_level"),
    (lambda maps, kw: kw.update(spatial_scales=[0.25, -1, 0.0625, 0.03125]),
     r"spatial_scales\[1\]"),
])
def test_bad_arguments_name_the_argument(change, match):
    maps = pyramid(np.random.default_rng(8), np.float32)
    kw = dict(spatial_scales=SCALES)
    change(maps, kw)
    with pytest.raises(ValueError, match=match):
        rc.pyramid_roi_align(maps, np.array([[0, 1, 1, 50, 50]], np.float32), 2, **kw)


def test_bad_maps_and_boxes():
    maps = pyramid(np.random.default_rng(9), np.float32)
    with pytest.raises(TypeError, match="maps must be a list"):
        rc.pyramid_roi_align(maps[0], np.zeros((0, 5), np.float32), 2, SCALES)
    with pytest.raises(ValueError, match="out of range"):
        rc.pyramid_roi_align(maps, np.array([[2, 1, 1, 50, 50]], np.float32), 2, SCALES)
    with pytest.raises(ValueError, match="finite"):
        rc.pyramid_roi_align(maps, np.array([[0, np.nan, 1, 50, 50]], np.float32), 2, SCALES)
    # coordinates are checked at their own level's scale: 1e8 * (1/32) is in range
    rc.pyramid_roi_align(maps, np.array([[0, 0, 0, 1e8, 1e8]], np.float32), 2, SCALES, 2)
    with pytest.raises(ValueError, match="2\\*\\*24"):
        rc.pyramid_roi_align(maps, np.array([[0, 0, 0, 1e9, 1e9]], np.float32), 2, SCALES, 2)
    with pytest.raises(ValueError, match="grad_output"):
        rc.pyramid_roi_align_backward(np.zeros((2, 5, 2, 2), np.float32),
                                      np.array([[0, 1, 1, 50, 50]], np.float32),
                                      [m.shape for m in maps], SCALES)
    with pytest.raises(ValueError, match="batch and channels"):
        rc.pyramid_roi_align_backward(np.zeros((1, 5, 2, 2), np.float32),
                                      np.array([[0, 1, 1, 50, 50]], np.float32),
                                      [m.shape for m in maps[:3]] + [(2, 4, 5, 7)], SCALES)


def test_level_rules_round_trip_through_their_codes():
    from roicore.core import _binding
    for rules in LEVELS.values():
        codes = _binding.rules_codes(rules)
        assert _binding.rules_from_codes("LevelRules", codes) == codes
    with pytest.raises(ValueError, match="newer roicore"):
        _binding.rules_from_codes("LevelRules", (0, 0, 0, 0, 0, 0, 0))
    odd = dataclasses.replace(LEVELS["torchvision"], invalid="never")
    with pytest.raises(ValueError, match="invalid"):
        _binding.rules_codes(odd)
