"""roicore.core: exact, multithreaded RoI pooling kernels for NumPy arrays.

Operators (forward and backward, float16/32/64):

* :func:`roi_pool` -- RoI max pooling (Fast R-CNN), bilinear and nearest pooling
  (OpenVINO ROIPooling "bilinear", TF crop_and_resize), with the crop's box gradient
  (:func:`roi_pool_boxes_backward`)
* :func:`psroi_pool` -- position-sensitive RoI pooling (R-FCN)
* :func:`roi_align` -- RoIAlign (Mask R-CNN)
* :func:`ps_roi_align` -- position-sensitive RoIAlign (Light-Head R-CNN)
* :func:`pyramid_roi_align` -- RoIAlign from a feature pyramid (FPN), each box from the
  level its size assigns, with every framework's level rule (:mod:`roicore.core.pyramid`)

Each takes a ``convention`` naming the framework whose arithmetic to reproduce bit for bit
(see :mod:`roicore.core.conventions`).  :mod:`roicore.core.args` holds the checks and
conversions of their arguments, public for adapters.  Importing this package loads no ML
framework.

Large outputs come from a cache of freed output memory, as the frameworks' allocators do
(:func:`set_output_cache_limit`, :func:`release_output_cache`); every function also takes
``out=`` to write into a buffer of the caller's.  No allocation of a call may pass
:func:`get_memory_limit` (physical memory by default).

The kernels are a C library with a C API; :func:`get_include` and :func:`get_library_dir`
say where its header ``roicore.h`` and static library ``libroicore.a`` are installed, so
that a native operator built on this machine links the same kernels.
"""
import os as _os
try:
    from . import _binding  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only by broken installs
    import sys

    raise ImportError(
        "roicore.core could not load its compiled extension roicore.core._binding "
        f"for Python {sys.version_info.major}.{sys.version_info.minor} ({exc}). "
        "Rebuild it from the source checkout with `pip install .` (or `pip install -e .` "
        "for development); if you are running from the repository root, make sure the "
        "installed package, not the checkout, is imported."
    ) from exc

from . import args, conventions, operators, pyramid
from ._memory import (
    get_memory_limit, output_cache_stats, release_output_cache, set_memory_limit,
    set_output_cache_limit,
)
from ._threads import effective_n_threads, openmp_enabled
from .ops import (
    ps_roi_align, ps_roi_align_backward, psroi_pool, psroi_pool_backward, roi_align,
    roi_align_backward, roi_pool, roi_pool_backward, roi_pool_boxes_backward,
)
from .pyramid import pyramid_levels, pyramid_roi_align, pyramid_roi_align_backward

__version__ = _binding.VERSION  # the C library's (roicore.h ROICORE_VERSION_STRING)

__all__ = [
    "roi_pool", "roi_pool_backward", "roi_pool_boxes_backward", "psroi_pool",
    "psroi_pool_backward", "roi_align", "roi_align_backward", "ps_roi_align",
    "ps_roi_align_backward", "pyramid_levels", "pyramid_roi_align", "pyramid_roi_align_backward",
    "conventions", "pyramid", "args", "operators", "openmp_enabled", "effective_n_threads",
    "set_output_cache_limit", "release_output_cache", "output_cache_stats",
    "get_memory_limit", "set_memory_limit", "get_include", "get_library_dir", "get_link_args",
    "get_runtime",
]


def get_include():
    """The directory holding ``roicore.h``, the C API (as ``numpy.get_include`` does)."""
    return _os.path.join(_os.path.dirname(__file__), "include")


def get_library_dir():
    """The directory holding ``libroicore.a``, the kernels as a static, position-independent
    library."""
    return _os.path.join(_os.path.dirname(__file__), "lib")


def get_link_args():
    """What a native operator's link step needs to use the library: ``-L<dir> -lroicore``,
    and the OpenMP runtime when the library was built with OpenMP."""
    return ["-L" + get_library_dir(), "-lroicore"] + (["-fopenmp"] if openmp_enabled() else [])


def get_runtime():
    """The address of this process's roicore runtime (``roicore_runtime_current()`` in
    ``roicore.h``): the memory limit, the kept scratch and the Ctrl-C watch of
    roicore.core's C library.  A native operator library that links its own copy of the
    library shares them by passing it to ``roicore_runtime_share``; roicore's own libraries
    export ``roicore_native_share_runtime`` for it, which the adapters call on loading."""
    return _binding.runtime_address()
