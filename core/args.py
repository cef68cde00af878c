"""Arguments of roicore's operators: their checks and conversions, public for the adapters.

Everything an adapter needs from roicore.core besides the operators lives here: argument
normalisers (``pair``, ``positive_scale``, ``sampling_ratio``, ...), the conversions of the
frameworks' box forms into roicore's (``batch_from_counts``, ``batch_from_indices``,
``boxes_from_yx``, ``boxes_and_batch``), outputs allocated under roicore's memory limit
(``empty``, ``ALIGNMENT``), the C API's limits, and the codes a native operator stores for a
convention's rules (``rules_codes``).

The checks of data (batch indices, coordinates, box counts) and the box conversions are the
C API's own (roicore.h), called through the binding: each rule has one owner, and every
message names the argument as the caller names it (pass ``name=``), what was expected and
what came.  Errors are TypeError for a wrong type and ValueError for a wrong value; a
ValueError about one element of an array carries ``argument`` and ``index`` attributes.
"""
from __future__ import annotations

import functools
import math
import numbers
import operator

import numpy as np

from . import _binding, _memory

__all__ = [
    "MAX_SCALED_COORD", "MAX_SAMPLING_RATIO", "MAX_GRID", "MAX_SAMPLES_PER_BIN", "MAX_MAP_SIDE",
    "ALIGNMENT", "OUTPUT_CACHE_MIN_BYTES", "pair", "positive_scale", "held_scale",
    "float32_scale", "sampling_ratio", "real", "flag", "ps_channels", "nchw_float", "input_shape",
    "expect_shape", "contiguous", "empty", "out_buffer", "boxes_and_batch", "batch_from_counts",
    "batch_from_indices", "boxes_from_yx", "check_coords", "unmasked", "rules_codes", "Names",
]

# The C API's limits (roicore.h): scaled box coordinates within +-2**24 feature-map pixels,
# RoIAlign's sampling grid, the map's sides.
MAX_SCALED_COORD = _binding.MAX_SCALED_COORD
MAX_SAMPLING_RATIO = _binding.MAX_SAMPLING_RATIO
MAX_GRID = _binding.MAX_GRID
MAX_SAMPLES_PER_BIN = _binding.MAX_SAMPLES_PER_BIN
MAX_MAP_SIDE = _binding.MAX_MAP_SIDE
# The alignment of the outputs roicore.core allocates (frameworks sharing them through
# DLPack may assume it: TensorFlow aborts on less).
ALIGNMENT = _memory.ALIGNMENT
# Outputs of this many bytes or more come from roicore.core's cache of freed outputs
# (smaller ones from NumPy): an adapter with a second route for large outputs uses it.
OUTPUT_CACHE_MIN_BYTES = _memory.MIN_BYTES

rules_codes = _binding.rules_codes

_INT64_MAX = np.iinfo(np.int64).max


# ---------------------------------------------------------------------------------------
# scalars

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
    """A positive, finite real number, as a float."""
    if type(value) is not float and (isinstance(value, (bool, np.bool_))
                                     or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be positive and finite, got {value!r}")
    return value


def held_scale(scale, held, name="spatial_scale"):
    """``held``, the value ``scale`` becomes where a framework holds it (a C float may
    underflow to 0 or overflow to inf even when the Python float was fine), checked to stay
    positive and finite."""
    if not (0 < held < math.inf):
        raise ValueError(f"{name}={scale!r} becomes {held!r} when held as a float32 (as the "
                         f"convention's framework holds it); it must stay positive and finite")
    return held


def float32_scale(value, name="spatial_scale"):
    """A scale for an operator attribute of type float (the frameworks' C float): positive
    and finite, before and after the cast; returns the Python float given."""
    value = positive_scale(value, name)
    with np.errstate(over="ignore", under="ignore"):
        held_scale(value, float(np.float32(value)), name)
    return value


def sampling_ratio(value, name="sampling_ratio"):
    """RoIAlign's samples per bin and axis: -1 or 0 (adaptive) up to MAX_SAMPLING_RATIO."""
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


def flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def ps_channels(output_size, group_size, C, output_channels, channels_of="x"):
    """``(PH, PW, GH, GW, D)`` of a position-sensitive operator: the pooled size, the group
    size (``group_size``, or the pooled size when None) and the output channels D
    (``output_channels``, or inferred) of a map of C = D * GH * GW channels; ``channels_of``
    names where C came from."""
    PH, PW = pair(output_size, "output_size")
    GH, GW = (PH, PW) if group_size is None else pair(group_size, "group_size")
    if output_channels is None:
        if C % (GH * GW):
            raise ValueError(f"{channels_of} has C={C} channels, which is not a multiple of the "
                             f"group area {GH}x{GW}={GH * GW}")
        output_channels = C // (GH * GW)
    elif isinstance(output_channels, bool) or not isinstance(output_channels, (int, np.integer)):
        raise TypeError(f"output_channels must be an int, got {type(output_channels).__name__}")
    if output_channels < 1:
        raise ValueError(f"output_channels must be >= 1, got {output_channels}")
    if C != output_channels * GH * GW:
        raise ValueError(f"{channels_of} must have output_channels * {GH} * {GW} = "
                         f"{output_channels * GH * GW} channels (output_channels="
                         f"{output_channels}, group {GH}x{GW}), got C={C}")
    return PH, PW, GH, GW, int(output_channels)


# ---------------------------------------------------------------------------------------
# arrays

_INT64_MAX = 2**63 - 1

def contiguous(arr, dtype=None, name="an input"):
    """``arr`` C-contiguous, aligned, in native byte order and (when given) of ``dtype``:
    a copy only if needed, and then checked against roicore's memory limit first (a
    broadcast or strided view can stand for far more memory than it holds).
    (np.ascontiguousarray keeps an unaligned array as it is.)"""
    arr = np.asarray(arr)
    target = np.dtype(dtype) if dtype is not None else arr.dtype
    if not target.isnative:
        target = target.newbyteorder("=")
    if arr.dtype == target and arr.flags.c_contiguous and arr.flags.aligned:
        return arr
    nbytes = arr.size * target.itemsize
    _memory.check_limit(nbytes, f"the contiguous {target} copy of {name}, shape {arr.shape},")
    out = np.ascontiguousarray(arr, dtype=target)
    return out if out.flags.aligned else out.copy()


def empty(shape, dtype, name="out"):
    """An uninitialised C-contiguous output, ALIGNMENT-byte aligned, from roicore's output
    cache, refused with MemoryError naming ``name`` and the bytes when it would pass
    roicore's memory limit (before anything is allocated)."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > _INT64_MAX:   # no limit (0) lets it through, and NumPy's error says little
        raise MemoryError(f"{name} of shape {tuple(shape)} ({np.dtype(dtype)}) would take "
                          "more than 2**63 bytes")
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
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        raise TypeError(f"{name} must have dtype float16, float32 or float64, got {arr.dtype}")
    if arr.shape[2] < 1 or arr.shape[3] < 1:
        last = dims.strip("()").split(", ")[2:]
        raise ValueError(f"{name} must have {last[0]} >= 1 and {last[1]} >= 1, got shape "
                         f"{arr.shape}")
    # computed in native byte order (a big-endian array is copied, as boxes are); float16
    # in float32; the result comes back in the native form of the input's dtype
    native = arr.dtype.newbyteorder("=")
    compute = np.float32 if native.itemsize == 2 else native
    return contiguous(arr, compute, name), native


def input_shape(shape, name="input_shape"):
    try:
        if any(isinstance(s, (bool, np.bool_)) for s in shape):
            raise TypeError
        shape = tuple(operator.index(s) for s in shape)
    except TypeError:
        raise TypeError(f"{name} must be a sequence of 4 ints (N, C, H, W), got "
                        f"{shape!r}") from None
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


# ---------------------------------------------------------------------------------------
# boxes

def batch_from_counts(counts, n_boxes, n_images, name="boxes_num"):
    """int64 batch indices of ``n_boxes`` boxes from per-image box counts (Paddle's
    boxes_num, LoD lengths): boxes are grouped by image in image order, image i owning the
    next counts[i] boxes.  The counts must be one per image, non-negative and sum to
    ``n_boxes``."""
    c = np.asarray(counts)
    if c.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {c.dtype}")
    if c.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one count per image), got shape {c.shape}")
    if c.shape[0] != n_images:
        raise ValueError(f"{name} must have one count per image (N={n_images}), got {c.shape[0]}")
    return _binding.batch_from_counts(_int_array(c, name), n_boxes, name)


def batch_from_indices(indices, n_boxes, n_images, masked=False, name="batch_indices"):
    """int64 batch indices from an integer array of one image index per box, each in
    [0, n_images) (or, with ``masked``, negative: the box is skipped)."""
    b = np.asarray(indices)
    if b.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {b.dtype}")
    if b.shape != (n_boxes,):
        raise ValueError(f"{name} must have shape ({n_boxes},), one image index per box, got "
                         f"{b.shape}")
    if b.dtype == np.uint64 and b.size and b.max() > _INT64_MAX:
        # beyond int64: the C API reads it as a float, which is out of range all the same
        return _binding.batch_from_column(contiguous(b, np.float64, name), n_images, masked,
                                          name)
    return _binding.batch_from_indices(_int_array(b, name), n_images, masked, name)


def _int_array(a, name):
    """An integer array as int32 or int64, C-contiguous (other widths are cast losslessly)."""
    if a.dtype not in (np.int32, np.int64):
        if a.dtype == np.uint64 and a.size and a.max() > _INT64_MAX:
            raise ValueError(f"{name} holds {a.max()}, beyond int64")
        return contiguous(a, np.int64, name)
    return contiguous(a, name=name)


def boxes_from_yx(boxes, dtype, name="boxes"):
    """TF's (K, 4) [y1, x1, y2, x2] rows as roicore's C-contiguous [x1, y1, x2, y2] rows in
    ``dtype``, checked finite."""
    b = np.asarray(boxes)
    if b.ndim != 2 or b.shape[1] != 4:
        raise ValueError(f"{name} must have shape (K, 4) [y1, x1, y2, x2], got {b.shape}")
    if b.dtype.kind != "f" or b.dtype.itemsize not in (4, 8):
        b = b.astype(np.float64)
    out = _binding.convert_coords(contiguous(b), 0, True, dtype)
    _binding.check_coords(out, 0, 0, name)
    return out


def check_coords(coords, scale_x=0.0, scale_y=0.0, name="boxes"):
    """Raise ValueError unless every coordinate of (K, 4) rows is finite and, times the scale
    of its axis (0: not checked), within MAX_SCALED_COORD feature-map pixels of the
    origin."""
    if coords.shape[0]:
        _binding.check_coords(coords, scale_x, scale_y, name)


def boxes_and_batch(boxes, batch_indices, n_images, dtype, masked=False, name="boxes",
                    batch_name="batch_indices"):
    """Split (K, 5) boxes or pair (K, 4) boxes with ``batch_indices``.

    Returns C-contiguous (K, 4) boxes in ``dtype``, checked finite, and int64 (K,) batch
    indices, checked to be integers within [0, n_images), or with ``masked`` negative (-1:
    skipped).  ``name`` and ``batch_name`` are the arguments' names for the messages.
    """
    masked = flag(masked, "masked")
    arr = np.asarray(boxes)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[1] not in (4, 5):
        raise ValueError(f"{name} must have shape (K, 5) [batch, x1, y1, x2, y2] or (K, 4) "
                         f"[x1, y1, x2, y2] with {batch_name}, got shape {arr.shape}")
    if arr.shape[1] == 5:
        if batch_indices is not None:
            raise ValueError(f"{name} has a batch column (shape {arr.shape}); "
                             f"{batch_name} must then be None")
        column = arr[:, 0]
        if column.dtype not in (np.float32, np.float64):  # others, as float64 (the C API's)
            column = contiguous(column, np.float64, f"{name}[:, 0]")
        elif not column.flags.aligned:  # the C API reads whole elements
            column = column.copy()
        batch = _binding.batch_from_column(column, n_images, masked, f"{name}[:, 0]")
        coords = arr[:, 1:]
    else:
        if batch_indices is None:
            raise ValueError(f"{name} has shape {arr.shape} (no batch column): pass "
                             f"{batch_name}, or (K, 5) boxes [batch, x1, y1, x2, y2]")
        batch = batch_from_indices(batch_indices, arr.shape[0], n_images, masked, batch_name)
        coords = arr
    coords = contiguous(coords, dtype, name)
    check_coords(coords, name=name)
    return coords, batch


def unmasked(coords, batch, masked):
    """The coordinates of the boxes that are computed (all but the masked ones)."""
    if masked and batch.size and batch.min() < 0:
        return coords[batch >= 0]
    return coords


# ---------------------------------------------------------------------------------------
# the caller's names

class Names:
    """The names a caller gives roicore.core's arguments (``{"x": "input", "boxes":
    "rois"}``: an adapter's framework's), for every message about them.  ``names("x")`` is
    the caller's name of ``x``; :meth:`reword` puts a message that starts with one of
    core's names in the caller's; :meth:`renaming` decorates an operator so that the
    errors of the C API, which names its own arguments, use the caller's names too."""

    def __init__(self, names=None):
        self._names = dict(names or {})

    def __call__(self, name):
        return self._names.get(name, name)

    def reword(self, message):
        """``message`` with its leading argument name (``x``, or a part of an argument:
        ``boxes[:, 0]``) in the caller's words; unchanged when it names none of them."""
        head = message.split(" ", 1)[0]
        base = head.split("[", 1)[0]
        new = self._names.get(base)
        return new + message[len(base):] if new else message

    @staticmethod
    def renaming(fn):
        """``fn`` (taking ``names=``) with the C API's ValueErrors about one of its
        arguments reworded in the caller's names."""
        @functools.wraps(fn)
        def named(*a, names=None, **kw):
            try:
                return fn(*a, names=names, **kw)
            except ValueError as exc:
                argument = getattr(exc, "argument", None)
                if not names or not argument:
                    raise
                message = Names(names).reword(str(exc))
                if message == str(exc):
                    raise
                renamed = ValueError(message)
                base = argument.split("[", 1)[0]
                renamed.argument = names.get(base, base) + argument[len(base):]
                renamed.index = exc.index
                raise renamed from None
        return named
