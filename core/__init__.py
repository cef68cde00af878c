"""roicore.core: exact, multithreaded RoI pooling kernels for NumPy arrays.

Operators (forward and backward, float16/32/64):

* :func:`roi_pool` -- RoI max pooling (Fast R-CNN) and OpenVINO-style bilinear pooling
* :func:`psroi_pool` -- position-sensitive RoI pooling (R-FCN)
* :func:`roi_align` -- RoIAlign (Mask R-CNN)

Each takes a ``convention`` naming the framework whose arithmetic to reproduce bit for bit
(see :mod:`roicore.core.conventions`).  Importing this package loads no ML framework.

Large outputs come from a cache of freed output memory, as the frameworks' allocators do
(:func:`set_output_cache_limit`, :func:`release_output_cache`); every function also takes
``out=`` to write into a buffer of the caller's.
"""
try:
    from . import _kernels  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only by broken installs
    import sys

    raise ImportError(
        "roicore.core could not load its compiled extension roicore.core._kernels "
        f"for Python {sys.version_info.major}.{sys.version_info.minor} ({exc}). "
        "Rebuild it from the source checkout with `pip install .` (or `pip install -e .` "
        "for development); if you are running from the repository root, make sure the "
        "installed package, not the checkout, is imported."
    ) from exc

from . import conventions
from ._memory import output_cache_stats, release_output_cache, set_output_cache_limit
from ._threads import effective_n_threads, openmp_enabled
from .ops import (
    psroi_pool, psroi_pool_backward, roi_align, roi_align_backward, roi_pool,
    roi_pool_backward,
)

__version__ = "0.1.0"

__all__ = [
    "roi_pool", "roi_pool_backward", "psroi_pool", "psroi_pool_backward", "roi_align",
    "roi_align_backward", "conventions", "openmp_enabled", "effective_n_threads",
    "set_output_cache_limit", "release_output_cache", "output_cache_stats",
]
