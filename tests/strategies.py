"""Hypothesis strategies: feature maps and boxes, including the awkward ones.

Boxes are drawn in feature-map pixels and divided by spatial_scale, so every kind below
lands where intended after scaling: inside the map, straddling its border, entirely
outside it, reversed (x2 < x1), zero-size, on exact halves (where C rounding matters),
and larger than the map.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

SCALES = [1.0, 0.5, 0.7, 0.25, 0.8, 1 / 16]
BOX_KINDS = ["inside", "partial", "outside", "reversed", "zero", "halves", "huge"]


@dataclass
class Case:
    x: np.ndarray          # (N, C, H, W)
    boxes: np.ndarray      # (K, 4) x1, y1, x2, y2 in image coordinates
    batch: np.ndarray      # (K,) int64
    output_size: tuple
    spatial_scale: float

    @property
    def rois(self):
        """(K, 5) boxes with the batch column, in x's dtype."""
        return np.hstack([self.batch[:, None], self.boxes]).astype(self.x.dtype)


def _feature_box(rng, kind, H, W):
    """One box in feature pixels."""
    if kind == "inside":
        x1, y1 = rng.uniform(0, W - 1), rng.uniform(0, H - 1)
        return [x1, y1, rng.uniform(x1, W - 1), rng.uniform(y1, H - 1)]
    if kind == "partial":
        x1, y1 = rng.uniform(-W / 2, W / 2), rng.uniform(-H / 2, H / 2)
        return [x1, y1, x1 + rng.uniform(1, W), y1 + rng.uniform(1, H)]
    if kind == "outside":
        x1 = rng.choice([-3 * W - 2.0, W + 2.0])
        return [x1, 1.0, x1 + W, H / 2]
    if kind == "reversed":
        x1, y1 = rng.uniform(1, W), rng.uniform(1, H)
        return [x1, y1, x1 - rng.uniform(0.1, 3), y1 - rng.uniform(0.1, 3)]
    if kind == "zero":
        x1, y1 = rng.uniform(0, W), rng.uniform(0, H)
        return [x1, y1, x1, y1]
    if kind == "halves":
        return list(rng.integers(-1, max(H, W) + 1, 4) + 0.5)
    # "huge": a box much larger than the map
    return [-2.0 * W, -1.5 * H, 3.0 * W, 2.5 * H]


@st.composite
def cases(draw, dtype=None, max_c=3, max_hw=12, max_k=4, max_p=4, channels=None,
          integer_values=False, normalised=False):
    """A Case with boxes in image coordinates (or normalised to [0, 1] for bilinear)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = dtype or draw(st.sampled_from([np.float32, np.float64]))
    N = draw(st.integers(1, 2))
    C = channels if channels is not None else draw(st.integers(1, max_c))
    H = draw(st.integers(1, max_hw))
    W = draw(st.integers(1, max_hw))
    PH = draw(st.integers(1, max_p))
    PW = draw(st.integers(1, max_p))
    K = draw(st.integers(0, max_k))
    scale = 1.0 if normalised else draw(st.sampled_from(SCALES))
    kinds = [draw(st.sampled_from(BOX_KINDS)) for _ in range(K)]
    if integer_values:  # ties: exercises first-maximum rules
        x = rng.integers(-3, 4, (N, C, H, W)).astype(dtype)
    else:
        x = rng.standard_normal((N, C, H, W)).astype(dtype)
    if normalised:
        boxes = rng.uniform(-0.3, 1.3, (K, 4))
        for i, kind in enumerate(kinds):
            if kind == "zero":
                boxes[i, 2:] = boxes[i, :2]
            elif kind == "inside":
                boxes[i] = np.sort(rng.uniform(0, 1, 4).reshape(2, 2), axis=0).ravel()
    else:
        boxes = np.array([_feature_box(rng, k, H, W) for k in kinds], np.float64).reshape(K, 4)
        boxes = boxes / scale
    boxes = boxes.astype(dtype)
    batch = rng.integers(0, N, K).astype(np.int64)
    return Case(x, boxes, batch, (PH, PW), scale)
