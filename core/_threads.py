"""Thread-count policy (scikit-learn's semantics)."""
from __future__ import annotations

import operator

from ._binding import MAX_THREADS, openmp_enabled, resolve_threads

__all__ = ["openmp_enabled", "effective_n_threads"]


def effective_n_threads(n_threads=None) -> int:
    """Number of OpenMP threads a kernel call will use.

    ``None`` follows ``OMP_NUM_THREADS`` (through ``omp_get_max_threads``, so threadpoolctl
    limits apply too) capped by the CPUs this process may run on; a positive ``n`` asks
    for ``n``; a negative ``n`` means all CPUs but ``|n| - 1`` (-1 is all of them).  At most
    1024 are asked for, and a count the process cannot start (container thread limits) is
    lowered to what it can.  A build without OpenMP returns 1, and so does a process forked
    after roicore ran threads: libgomp cannot start a thread team in such a child, so it
    runs every call on one thread (use multiprocessing's "spawn" or "forkserver" start
    methods for parallel workers).  The policy lives in the C API (roicore_resolve_threads).
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
        if n_threads < -(2**31):
            n_threads = -(2**31)  # all CPUs but more than there are: one thread
    if not openmp_enabled():
        return 1
    return resolve_threads(0 if n_threads is None else n_threads)
