"""Argument checks and normalisation for the NumPy API.

Arrays reach the C API C-contiguous, aligned and in the dtypes it takes; every argument is
checked here first, so that errors name the user's argument (``batch_indices[3]``,
``boxes[:, 0][2]``) and nothing is allocated or computed for a call that will fail.  The
data checks run through the C API's own functions (batch indices, coordinates), and its
entry points check everything again.  Messages name the argument, what was expected and
what came.
"""
from __future__ import annotations

import math
import numbers
import operator

import numpy as np

from . import _binding, _memory

# Scaled box coordinates must stay within +-2**24 feature-map pixels: float32 stops
# representing every integer there, and beyond 2**31 the frameworks' float-to-int
# conversions are undefined behaviour.  (The C API's ROICORE_MAX_SCALED_COORD.)
MAX_SCALED_COORD = float(2**24)

# RoIAlign takes grid_h * grid_w samples per bin (sampling_ratio**2, or ceil(bin)**2 when
# adaptive); a runaway grid would otherwise look like a hang.  2**20 samples per bin is a
# ~1000-pixel-wide bin sampled at every pixel; an axis takes at most 2**16.  (The C API's
# ROICORE_MAX_SAMPLES_PER_BIN, ROICORE_MAX_GRID and ROICORE_MAX_SAMPLING_RATIO.)
MAX_SAMPLES_PER_BIN = 2**20
MAX_GRID = 2**16
MAX_SAMPLING_RATIO = 2**10


def contiguous(arr, dtype=None):
    """``arr`` C-contiguous, aligned and (when given) of ``dtype``: a copy only if needed.
    (np.ascontiguousarray keeps an unaligned array as it is.)"""
    out = np.ascontiguousarray(arr, dtype=dtype)
    return out if out.flags.aligned else out.copy()


def empty(shape, dtype, name="out"):
    """An output array from the output cache, refused with MemoryError naming ``name`` and
    the bytes when it would pass roicore's memory limit (before anything is allocated)."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    _memory.check_limit(nbytes, f"{name} of shape {tuple(shape)} ({np.dtype(dtype)})")
    return _memory.empty(shape, dtype)


def nchw_float(a, name, dims="(N, C, H, W)"):
    """Return (C-contiguous array to compute on, dtype to return) for a 4-D float array
    whose last two dimensions are at least 1.  float16 is computed in float32."""
    arr = np.asarray(a)
    if arr.ndim != 4:
        raise ValueError(f"{name} must be a 4-D {dims} array, got shape {arr.shape}")
    # (kind, size and byte order: comparing the dtype with each type converts the type
    # every time)
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8) or not arr.dtype.isnative:
        raise TypeError(f"{name} must have dtype float16, float32 or float64, got {arr.dtype}")
    if arr.shape[2] < 1 or arr.shape[3] < 1:
        last = dims.strip("()").split(", ")[2:]
        raise ValueError(f"{name} must have {last[0]} >= 1 and {last[1]} >= 1, got shape {arr.shape}")
    compute = np.float32 if arr.dtype.itemsize == 2 else arr.dtype
    return contiguous(arr, compute), arr.dtype


def input_shape(shape, name="input_shape"):
    try:
        if any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of 4 ints (N, C, H, W), got {shape!r}") from None
    if len(shape) != 4 or min(shape) < 0:
        raise ValueError(f"{name} must be 4 non-negative ints (N, C, H, W), got {shape}")
    if shape[2] < 1 or shape[3] < 1:
        raise ValueError(f"{name} must have H >= 1 and W >= 1, got {shape}")
    return shape


def expect_shape(arr, shape, name):
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {arr.shape}")


def out_buffer(out, shape, dtype, inputs, name="out"):
    """A caller's output buffer to write into, or one from the output cache when ``out``
    is None (see _memory: a fresh large allocation costs page faults on every call)."""
    if out is None:
        return empty(shape, dtype, name)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, got {type(out).__name__}")
    if out.dtype != dtype or out.shape != tuple(shape):
        raise ValueError(f"{name} must be a {np.dtype(dtype)} array of shape {tuple(shape)}, "
                         f"got {out.dtype} {out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable and out.flags.aligned):
        raise ValueError(f"{name} must be C-contiguous, aligned and writeable")
    if any(isinstance(a, np.ndarray) and np.shares_memory(out, a) for a in inputs):
        raise ValueError(f"{name} must not share memory with the inputs")
    return out


def pair(value, name):
    """An int or a pair of ints, each >= 1, as a (h, w) tuple."""
    items = value if isinstance(value, (tuple, list)) else (value, value)
    if len(items) != 2:
        raise ValueError(f"{name} must be an int or a pair (h, w), got {value!r}")
    out = []
    for v in items:
        if type(v) is not int and (isinstance(v, (bool, np.bool_))
                                   or not isinstance(v, numbers.Integral)):
            raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
        out.append(int(v))
    return tuple(out)


def positive_scale(value, name="spatial_scale"):
    if type(value) is not float and (isinstance(value, (bool, np.bool_))
                                     or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def sampling_ratio(value, name="sampling_ratio"):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < -1:
        raise ValueError(f"{name} must be >= -1 (-1 or 0: adaptive), got {value}")
    if value > MAX_SAMPLING_RATIO:
        raise ValueError(f"{name} must be <= {MAX_SAMPLING_RATIO} (at most 2**20 samples per "
                         f"bin), got {value}")
    return int(value)


def real(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def held_scale(scale, held, name="spatial_scale"):
    """Check spatial_scale as the kernel will hold it (a float32 may underflow to 0 or
    overflow to inf even when the Python float was fine)."""
    if not (0 < held < math.inf):
        raise ValueError(f"{name}={scale!r} becomes {held!r} when held as a float32 (as the "
                         f"convention's framework holds it); it must stay positive and finite")
    return held


def flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def boxes_and_batch(boxes, batch_indices, n_images, dtype, masked=False, name="boxes"):
    """Split (K, 5) boxes or pair (K, 4) boxes with ``batch_indices``.

    Returns C-contiguous (K, 4) boxes in ``dtype`` and int64 (K,) batch indices, checked to
    be finite, integral and within [0, n_images), or with ``masked`` negative (-1: skipped).
    """
    masked = flag(masked, "masked")
    arr = np.asarray(boxes)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] not in (4, 5):
        raise ValueError(f"{name} must have shape (K, 5) [batch, x1, y1, x2, y2] or (K, 4) "
                         f"[x1, y1, x2, y2] with batch_indices, got shape {arr.shape}")
    if arr.shape[1] == 5:
        if batch_indices is not None:
            raise ValueError(f"{name} has a batch column (shape {arr.shape}); "
                             "batch_indices must then be None")
        col = arr[:, 0]
        if not col.flags.aligned:  # the C pass reads whole elements
            col = col.copy()
        if col.dtype in (np.float32, np.float64):
            # the common case in one C pass; the NumPy checks below find the culprit
            batch = np.empty(arr.shape[0], np.int64)
            if _binding.batch_from_column(col, n_images, batch, masked) is None:
                return _coordinates(arr[:, 1:], dtype, name), batch
        if col.dtype.kind == "f" and not np.all(np.isfinite(col)):
            k = int(np.flatnonzero(~np.isfinite(col))[0])
            raise ValueError(f"{name}[{k}, 0] (batch index) must be finite, got {col[k]}")
        if np.any(col != np.floor(col)):
            k = int(np.flatnonzero(col != np.floor(col))[0])
            raise ValueError(f"{name}[{k}, 0] (batch index) must be an integer, got {col[k]}")
        raw, batch_name = col, f"{name}[:, 0]"
        coords = arr[:, 1:]
    else:
        if batch_indices is None:
            raise ValueError(f"{name} has shape {arr.shape} (no batch column): pass "
                             "batch_indices, or (K, 5) boxes [batch, x1, y1, x2, y2]")
        b = np.asarray(batch_indices)
        if b.dtype.kind not in "iu":
            raise TypeError(f"batch_indices must have an integer dtype, got {b.dtype}")
        if b.shape != (arr.shape[0],):
            raise ValueError(f"batch_indices must have shape ({arr.shape[0]},) to match "
                             f"{name}, got {b.shape}")
        raw, batch_name = b, "batch_indices"
        coords = arr
    # A float column is range-checked before its cast (out-of-range floats have no int64);
    # an integer cast may wrap (uint64), which the check after it catches.  Always a copy:
    # the kernels index images with it, so no caller's array (an out= aliasing it) may
    # change it under them.
    # (as Python floats: NumPy 2 would compare a float32 maximum with n_images in float32)
    low = -math.inf if masked else 0
    if (raw.dtype.kind == "f" and raw.size
            and not (float(raw.min()) >= low and float(raw.max()) < n_images)):
        _batch_out_of_range(raw, batch_name, n_images, masked)
    batch = raw.astype(np.int64)
    if masked:
        if raw.size and (raw.max() >= n_images or (raw.dtype.kind == "u" and raw.max() < 0)):
            _batch_out_of_range(raw, batch_name, n_images, masked)
        batch[batch < 0] = -1
    elif not _binding.batch_in_range(batch, n_images):
        _batch_out_of_range(raw, batch_name, n_images, masked)
    return _coordinates(coords, dtype, name), batch


def unmasked(coords, batch, masked):
    """The coordinates of the boxes that are computed (all but the masked ones)."""
    if masked and batch.size and batch.min() < 0:
        return coords[batch >= 0]
    return coords


def _coordinates(coords, dtype, name):
    """C-contiguous (K, 4) box coordinates in ``dtype``, checked to be finite."""
    coords = contiguous(coords, dtype)
    if not _binding.coords_ok(coords, 0, 0):
        k, j = (int(i[0]) for i in np.nonzero(~np.isfinite(coords)))
        raise ValueError(f"{name} coordinates must be finite, got {coords[k, j]} "
                         f"in box {k}")
    return coords


def _batch_out_of_range(raw, batch_name, n_images, masked=False):
    """Raise for the first index outside [0, n_images) (below n_images when masked), as
    given (before any cast)."""
    bad = raw >= n_images if masked else (raw < 0) | (raw >= n_images)
    k = int(np.flatnonzero(bad)[0])
    value = raw[k].item()
    value = int(value) if float(value).is_integer() and abs(value) < 2**63 else value
    expected = (f"index < {n_images}, or negative for a masked box" if masked
                else f"0 <= index < {n_images}")
    raise ValueError(f"{batch_name}[{k}] = {value} is out of range for a feature "
                     f"map with N={n_images} images (expected {expected})")


def coordinate_range(coords, scale_x, scale_y, name="boxes"):
    """Reject boxes whose scaled coordinates leave +-MAX_SCALED_COORD (see above)."""
    if coords.size == 0 or _binding.coords_ok(coords, scale_x, scale_y):
        return  # the C API's check; NumPy only finds the culprit
    reach = np.abs(coords.astype(np.float64)) * np.array([scale_x, scale_y, scale_x, scale_y])
    if not reach.max() <= MAX_SCALED_COORD:
        k, j = np.unravel_index(int(np.argmax(reach)), reach.shape)
        raise ValueError(f"{name}[{k}] coordinate {coords[k, j]} lies {reach[k, j]:.3g} "
                         f"feature-map pixels from the origin; at most 2**24 is supported")


def adaptive_grid(coords, spatial_scale, output_size, sampling_ratio_, name="boxes"):
    """Reject boxes whose adaptive RoIAlign grid would exceed MAX_SAMPLES_PER_BIN."""
    if sampling_ratio_ > 0 or coords.size == 0:
        return
    size = (coords[:, 2:] - coords[:, :2]).astype(np.float64) * spatial_scale
    grid = np.ceil(np.maximum(size, 0) / np.array(output_size[::-1], dtype=np.float64))
    samples = grid[:, 0] * grid[:, 1]
    bad = (samples > MAX_SAMPLES_PER_BIN) | (grid.max(axis=1) > MAX_GRID)
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name}[{k}] would take {int(grid[k, 1])} x {int(grid[k, 0])} samples "
                         f"per bin with adaptive sampling (sampling_ratio={sampling_ratio_}); at "
                         f"most {MAX_GRID} per axis and {MAX_SAMPLES_PER_BIN} per bin are "
                         "supported: pass sampling_ratio > 0")
