"""Thread-count policy (scikit-learn's semantics)."""
from __future__ import annotations

import operator
import os

from ._kernels import omp_max_threads, openmp_enabled

__all__ = ["openmp_enabled", "effective_n_threads"]

# libgomp dies (SIGSEGV) when asked for tens of thousands of threads; no RoI workload
# gains anything past a few per core, so larger requests are refused up front.
MAX_THREADS = 1024


def effective_n_threads(n_threads=None) -> int:
    """Number of OpenMP threads a kernel call will use.

    ``None`` follows ``OMP_NUM_THREADS`` (through ``omp_get_max_threads``, so threadpoolctl
    limits apply too) capped by the CPUs this process may run on; a positive ``n`` asks
    for ``n``; a negative ``n`` means all CPUs but ``|n| - 1`` (-1 is all of them).  A
    build without OpenMP always returns 1.
    """
    if n_threads is not None:
        if isinstance(n_threads, bool):
            raise TypeError("n_threads must be an int or None, got bool")
        try:
            n_threads = operator.index(n_threads)
        except TypeError:
            raise TypeError(
                f"n_threads must be an int or None, got {type(n_threads).__name__}"
            ) from None
        if n_threads == 0:
            raise ValueError("n_threads = 0 is invalid: pass a positive count, a negative "
                             "count relative to the CPU count, or None")
        if n_threads > MAX_THREADS:
            raise ValueError(f"n_threads must be at most {MAX_THREADS}, got {n_threads}")
    if not openmp_enabled():
        return 1
    # (the CPU count is a system call: only the cases that need it ask)
    if n_threads is None:
        return max(1, min(omp_max_threads(), _cpu_count()))
    if n_threads < 0:
        return max(1, _cpu_count() + 1 + n_threads)
    return n_threads


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
