"""Where roicore.core's outputs live: the memory limit, and a cache of large freed output
blocks.

roicore refuses, with MemoryError, any single allocation of a call beyond its memory limit
(the machine's physical memory unless set otherwise), before anything is allocated: the
outputs it allocates here, and the scratch its C kernels allocate (the C API keeps the
limit, so both sides use one value).

A fresh NumPy array of a few hundred MB comes from ``mmap``, and the kernel zeroes each of
its pages on first touch; ``free`` hands them straight back.  For RoI outputs that is a
large share of a call, larger still on virtual machines that return freed memory to their
host and must fault it back in (docs/performance.md gives the figures).  The frameworks'
own ops never pay this: Paddle, MXNet and TensorFlow allocate from caching allocators that
keep freed memory.

So roicore.core does likewise for outputs of at least ``MIN_BYTES`` (32 MiB): when the last array
using a block is gone, the block goes to an idle list instead of back to the system, and
the next output of about that size takes it.  Idle blocks are capped at ``limit`` bytes,
oldest evicted first; ``ROICORE_OUTPUT_CACHE_MB`` sets the limit at import (0 turns the
cache off), :func:`set_output_cache_limit` at run time, and :func:`release_output_cache`
hands every idle block back.  Blocks are 64-byte aligned, which the frameworks' kernels
may assume of memory shared through DLPack (TensorFlow aborts on less).
"""
import math
import operator
import os
import threading
import warnings

import numpy as np

from . import _binding

ALIGNMENT = 64
# Smaller requests skip the cache.  glibc's malloc raises its mmap threshold to the size
# of any mapped block freed, up to 32 MiB, so below that freed outputs stay in its heap
# and come back without page faults anyway, while the cache's Python bookkeeping (lock,
# lease, array interface) is a noticeable share of a sub-millisecond call such as a PS-RoI
# forward.  Above it every fresh array is a new mapping.
MIN_BYTES = 32 << 20
# A block may serve a request up to this fraction smaller than itself, so that outputs
# whose row count varies a little from call to call (proposals after NMS) still reuse it.
SLACK = 0.25


def _default_limit():
    """ROICORE_OUTPUT_CACHE_MB if set, else 1/8 of physical memory, at most 2 GiB: room for
    the largest standard workload's output and argmax (2 x 803 MB at c4_14x14).  A value
    that is not a finite number >= 0 is ignored with a warning: a tuning variable should
    not stop ``import roicore.core``."""
    value = os.environ.get("ROICORE_OUTPUT_CACHE_MB")
    if value is not None:
        try:
            mb = float(value)
        except ValueError:
            mb = math.nan
        if 0 <= mb < math.inf:
            return int(mb * (1 << 20))
        warnings.warn(f"ROICORE_OUTPUT_CACHE_MB must be a finite number of MB >= 0, got "
                      f"{value!r}; using the default", RuntimeWarning, stacklevel=2)
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        physical = 16 << 30
    return min(2 << 30, physical // 8)


def aligned_empty(nbytes):
    """A fresh uint8 array of ``nbytes``, its data ALIGNMENT-byte aligned."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.__array_interface__["data"][0] % ALIGNMENT  # (.ctypes runs Python code)
    return raw[start:start + nbytes]


class _Lease:
    """The owner of a cached block while arrays use it.  Arrays made from it have it as
    their ``base`` (NumPy does not look through a non-array base), so it outlives every view
    of the block, and its ``__del__`` returns the block when the last one goes."""

    __slots__ = ("__array_interface__", "_block", "_returned")

    def __init__(self, block, returned, shape, dtype):
        self._block = block
        self._returned = returned
        self.__array_interface__ = {"data": (block.ctypes.data, False), "shape": shape,
                                    "typestr": dtype.str, "version": 3}

    def __del__(self):
        # No lock: __del__ can run inside the cache's own locked section (a garbage
        # collection there), and list.append is atomic.
        self._returned.append(self._block)


class OutputCache:
    def __init__(self, limit, min_bytes=MIN_BYTES):
        self.min_bytes = min_bytes
        self._lock = threading.Lock()
        self._idle = []       # blocks ready for reuse, oldest first
        self._returned = []   # filled by _Lease.__del__, moved to _idle under the lock
        self._limit = 0
        self.hits = self.misses = 0
        self.set_limit(limit)

    def empty(self, shape, dtype):
        """An uninitialised C-contiguous array, 64-byte aligned; from the cache if large."""
        dtype = np.dtype(dtype)
        nbytes = dtype.itemsize * math.prod(shape)
        if nbytes < self.min_bytes or nbytes > self._limit:
            return aligned_empty(nbytes).view(dtype).reshape(shape)
        shape = tuple(int(s) for s in shape)  # for the lease's array interface
        with self._lock:
            self._collect()
            block = self._take(nbytes)
            if block is None:
                self.misses += 1
            else:
                self.hits += 1
        if block is None:
            block = aligned_empty(nbytes)
        return np.asarray(_Lease(block, self._returned, shape, dtype))

    def set_limit(self, nbytes):
        try:
            nbytes = operator.index(nbytes)
        except TypeError:
            raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}") from None
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            previous, self._limit = self._limit, nbytes
            self._collect()
        return previous

    def release(self):
        """Hand every idle block back to the system; the bytes released."""
        with self._lock:
            self._collect()
            freed = sum(b.nbytes for b in self._idle)
            self._idle.clear()
        return freed

    def stats(self):
        with self._lock:
            self._collect()
            return {"limit": self._limit, "idle_bytes": sum(b.nbytes for b in self._idle),
                    "idle_blocks": len(self._idle), "hits": self.hits, "misses": self.misses}

    # -- under self._lock ---------------------------------------------------------------
    def _collect(self):
        """Move returned blocks to the idle list, then evict the oldest over the limit."""
        while self._returned:
            self._idle.append(self._returned.pop(0))
        idle = sum(b.nbytes for b in self._idle)
        while self._idle and idle > self._limit:
            idle -= self._idle.pop(0).nbytes

    def _take(self, nbytes):
        """The smallest idle block that fits nbytes with at most SLACK to spare."""
        fits = [(b.nbytes, i) for i, b in enumerate(self._idle)
                if nbytes <= b.nbytes <= nbytes / (1 - SLACK)]
        return self._idle.pop(min(fits)[1]) if fits else None


_CACHE = OutputCache(_default_limit())
empty = _CACHE.empty


def _lock_afresh_in_child():
    # A child forked while another thread held the lock would wait for it forever on its
    # first large output; the idle blocks are the child's copies and stay valid.
    _CACHE._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_lock_afresh_in_child)


def get_memory_limit():
    """The most bytes one allocation of a roicore.core call may take (0: no limit)."""
    return _binding.get_memory_limit()


def set_memory_limit(nbytes):
    """Set the most bytes one allocation of a call may take, outputs and scratch alike
    (0: no limit); returns the previous limit.  A call that would pass it raises MemoryError
    naming what it would allocate, before allocating anything."""
    try:
        nbytes = operator.index(nbytes)
    except TypeError:
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}") from None
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    previous = _binding.get_memory_limit()
    _binding.set_memory_limit(nbytes)
    return previous


def check_limit(nbytes, what):
    limit = _binding.get_memory_limit()
    if limit and nbytes > limit:
        raise MemoryError(f"{what} would take {nbytes} bytes, over roicore's memory limit of "
                          f"{limit} bytes (roicore.core.set_memory_limit changes it)")


def set_output_cache_limit(nbytes):
    """Cap the idle output memory roicore.core keeps for reuse at ``nbytes`` (0 turns the
    cache off); returns the previous cap.  Idle blocks beyond the new cap are released."""
    return _CACHE.set_limit(nbytes)


def release_output_cache():
    """Hand every idle cached output block back to the system, and the scratch blocks the
    kernels keep between calls (up to 256 MiB); returns the bytes released.  Arrays still
    in use keep their memory and return it to the cache when they go."""
    return _CACHE.release() + _binding.release_scratch()


def output_cache_stats():
    """``{"limit", "idle_bytes", "idle_blocks", "hits", "misses"}`` of the output cache."""
    return _CACHE.stats()
