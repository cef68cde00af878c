"""Framework-free glue shared by the adapters: importing frameworks with a useful error,
and turning per-image box counts into batch indices.  No maths happens in adapters."""
from __future__ import annotations

import importlib

import numpy as np

_EXTRAS = {"tensorflow": "tf", "paddle": "paddle", "mxnet": "mxnet"}


def require(module: str, adapter: str):
    """Import ``module`` or raise an ImportError that names the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], "all")
        raise ImportError(
            f"roicore.adapters.{adapter} needs {module.split('.')[0]}, which could not be "
            f"imported ({exc}); install it with: pip install 'roicore[{extra}]'"
        ) from exc


def batch_indices_from_counts(counts, n_boxes: int, n_images: int, name: str = "boxes_num"):
    """Batch index of every box from per-image box counts (Paddle's boxes_num / LoD lengths).

    Boxes are stored grouped by image, in image order: image i owns the next counts[i] boxes.
    Unlike Paddle, the counts are checked: one per image, non-negative, summing to the
    number of boxes.
    """
    c = np.asarray(counts)
    if c.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {c.dtype}")
    if c.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one count per image), got shape {c.shape}")
    if c.shape[0] != n_images:
        raise ValueError(f"{name} must have one count per image (N={n_images}), got {c.shape[0]}")
    # one count per image: as Python ints, the checks cost less than NumPy reductions, and
    # their sum cannot overflow
    values = c.tolist()
    if min(values, default=0) < 0:
        raise ValueError(f"{name} must be non-negative, got {values}")
    if sum(values) != n_boxes:
        raise ValueError(f"{name} must sum to the number of boxes ({n_boxes}), got "
                         f"sum({values}) = {sum(values)}")
    if n_images == 1:
        return np.zeros(n_boxes, np.int64)
    return np.repeat(np.arange(n_images, dtype=np.int64), c.astype(np.int64))
