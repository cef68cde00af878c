"""The output cache (roicore.core._memory): freed large outputs are reused, never while any
view of them lives, within the idle limit, from any thread; and results out of reused
memory are the same bits as out of fresh memory."""
from __future__ import annotations

import functools
import mmap
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import roicore.core as rc
from roicore.core import _memory

MB = 1 << 20
# These tests exercise the cache's mechanism on small arrays: the `cache` fixture
# (conftest.py) makes the process-wide cache take requests from 1 MB, and the caches built
# here do the same (in use the threshold is _memory.MIN_BYTES).
SMALL = MB


def _align_case(rois=64):
    """A roi_align call whose output (rois x 64 x 7 x 7 float32, 800 KB per 64 rois) is
    large enough for the cache."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 64, 20, 24)).astype(np.float32)
    xy = rng.uniform(0, 300, (rois, 2))
    boxes = np.hstack([xy, xy + rng.uniform(8, 120, (rois, 2))]).astype(np.float32)
    return functools.partial(rc.roi_align, x, boxes, 7, 1 / 16, 2,
                             batch_indices=np.zeros(rois, np.int64))


def test_outputs_are_aligned_and_freed_ones_reused(cache):
    call = _align_case(rois=128)
    y = call()
    assert y.nbytes >= SMALL and y.flags.c_contiguous and y.flags.writeable
    assert y.ctypes.data % 64 == 0
    want, address = y.copy(), y.ctypes.data
    del y
    before = rc.output_cache_stats()
    assert before["idle_blocks"] == 1
    y = call()
    assert y.ctypes.data == address and rc.output_cache_stats()["hits"] == before["hits"] + 1
    np.testing.assert_array_equal(y, want)
    small = rc.roi_align(np.ones((1, 1, 4, 4), np.float32), np.array([[0, 0, 0, 3, 3]], np.float32), 2)
    assert small.ctypes.data % 64 == 0  # small outputs skip the cache but are aligned too


def test_outputs_below_the_threshold_skip_the_cache():
    """In use only outputs of MIN_BYTES or more are cached: smaller ones come back from
    malloc's own heap."""
    rc.release_output_cache()
    before = rc.output_cache_stats()
    y = _align_case(rois=128)()
    assert SMALL <= y.nbytes < _memory.MIN_BYTES and y.ctypes.data % 64 == 0
    del y
    after = rc.output_cache_stats()
    assert after["idle_blocks"] == 0
    assert (after["hits"], after["misses"]) == (before["hits"], before["misses"])


def test_a_live_view_keeps_its_memory(cache):
    call = _align_case(rois=128)
    y = call()
    view = y[5:]
    kept = view.copy()
    del y
    assert rc.output_cache_stats()["idle_blocks"] == 0  # the view still uses the block
    y2 = call()  # another output of the same size, written while the view lives
    assert not np.shares_memory(y2, view)
    np.testing.assert_array_equal(view, kept)
    del view
    assert rc.output_cache_stats()["idle_blocks"] >= 1


def test_reused_garbage_gives_the_same_bits(cache):
    """Every kernel writes every element of its output (and backwards zero dx first): a
    cache full of NaN-poisoned blocks of the right sizes changes nothing."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 48, 30, 33)).astype(np.float32)
    xy = rng.uniform(-50, 500, (300, 2))
    rois = np.hstack([rng.integers(0, 2, (300, 1)), xy,
                      xy + rng.uniform(-30, 300, (300, 2))]).astype(np.float32)
    ps_x = rng.standard_normal((2, 3 * 49, 30, 33)).astype(np.float32)

    def run():
        y, am = rc.roi_pool(x, rois, 7, 1 / 16, return_argmax=True)
        g = np.ones_like(y)
        ps = rc.psroi_pool(ps_x, rois, 7, 1 / 16)
        return [y, am, rc.roi_pool_backward(g, rois, x.shape, argmax=am),
                rc.roi_align(x, rois, 7, 1 / 16, 2),
                rc.roi_align_backward(g, rois, x.shape, 1 / 16, 2),
                rc.roi_pool(x, rois[:, 1:] / 600, 7, batch_indices=rois[:, 0].astype(int),
                            method="bilinear"),
                ps, rc.psroi_pool_backward(np.ones_like(ps), rois, ps_x.shape, 1 / 16)]

    rc.set_output_cache_limit(0)
    fresh = run()
    rc.set_output_cache_limit(256 * MB)
    for a in run():  # fill the cache with blocks of these sizes, poisoned
        a.view(np.uint8).fill(0xFF)  # NaN as float, -1 as int
    assert rc.output_cache_stats()["idle_blocks"] >= 3
    hits = rc.output_cache_stats()["hits"]
    for got, want in zip(run(), fresh):
        np.testing.assert_array_equal(got, want)
    assert rc.output_cache_stats()["hits"] > hits


def test_limit_zero_turns_the_cache_off(cache):
    assert rc.set_output_cache_limit(0) == 256 * MB
    y = _align_case(rois=128)()
    del y
    assert rc.output_cache_stats()["idle_blocks"] == 0


def test_idle_blocks_stay_under_the_limit_oldest_evicted():
    c = _memory.OutputCache(5 * MB, SMALL)
    a, b, d = (c.empty((n * MB,), np.uint8) for n in (2, 2, 2))
    first = a.ctypes.data
    del a, b
    assert c.stats()["idle_bytes"] == 4 * MB
    del d  # 6 MB idle > 5 MB: the oldest (a's block) goes
    s = c.stats()
    assert s["idle_blocks"] == 2 and s["idle_bytes"] == 4 * MB
    got = [c.empty((2 * MB,), np.uint8) for _ in range(3)]
    assert first not in [g.ctypes.data for g in got[:2]] and c.stats()["hits"] == 2
    big = c.empty((6 * MB,), np.uint8)  # over the limit: never cached
    del big
    assert c.stats()["idle_blocks"] == 0
    assert c.release() == 0


def test_a_block_serves_requests_a_little_smaller_than_itself():
    c = _memory.OutputCache(64 * MB, SMALL)
    a = c.empty((1000, MB // 100), np.uint8)
    address = a.ctypes.data
    del a
    b = c.empty((800, MB // 100), np.uint8)  # 20% smaller: reused
    assert b.ctypes.data == address and b.shape == (800, MB // 100)
    del b
    d = c.empty((500, MB // 100), np.uint8)  # half: a fresh block
    assert d.ctypes.data != address and c.stats()["idle_blocks"] == 1


def test_limit_and_environment_are_validated(monkeypatch):
    with pytest.raises(TypeError, match="nbytes must be an int, got str"):
        rc.set_output_cache_limit("1GB")
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        rc.set_output_cache_limit(-1)
    monkeypatch.delenv("ROICORE_OUTPUT_CACHE_MB", raising=False)
    default = _memory._default_limit()
    assert 0 < default <= 2 << 30
    # a bad value is ignored with a warning: "inf" made import roicore.core fail
    for bad in ("lots", "-5", "inf", "nan"):
        monkeypatch.setenv("ROICORE_OUTPUT_CACHE_MB", bad)
        with pytest.warns(RuntimeWarning, match=f"ROICORE_OUTPUT_CACHE_MB must be a finite "
                                                f"number of MB >= 0, got '{bad}'; using the "
                                                f"default"):
            assert _memory._default_limit() == default
    monkeypatch.setenv("ROICORE_OUTPUT_CACHE_MB", "1.5")
    assert _memory._default_limit() == int(1.5 * MB)
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c",
                          "import roicore.core"], capture_output=True, text=True,
                         env={**os.environ, "ROICORE_OUTPUT_CACHE_MB": "inf"})
    assert "ROICORE_OUTPUT_CACHE_MB must be a finite number" in out.stderr
    out = subprocess.run([sys.executable, "-c", "import roicore.core"], capture_output=True,
                         text=True, env={**os.environ, "ROICORE_OUTPUT_CACHE_MB": "inf"})
    assert out.returncode == 0, out.stderr


def test_threads_never_share_a_live_block():
    c = _memory.OutputCache(32 * MB, SMALL)
    errors = []

    def work(tag):
        rng = np.random.default_rng(tag)
        try:
            for _ in range(200):
                a = c.empty((int(rng.integers(1, 4)) * MB // 4,), np.float32)
                a.fill(tag)
                for _ in range(3):
                    threading.Event().wait(0)  # let the other threads run
                if not (a == tag).all():
                    errors.append(f"thread {tag}: its array was overwritten")
                del a
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.stats()["idle_bytes"] <= 32 * MB and c.stats()["hits"] > 0


class CacheMachine(RuleBasedStateMachine):
    """Random sequences of allocations, frees and limit changes: live arrays never overlap
    and keep their contents, and idle memory never exceeds the limit."""

    def __init__(self):
        super().__init__()
        self.cache = _memory.OutputCache(8 * MB, SMALL)
        self.live = []  # (array, fill value)
        self.counter = 0

    @rule(quarter_mb=st.integers(1, 24), dtype=st.sampled_from([np.uint8, np.float32, np.int64]))
    def allocate(self, quarter_mb, dtype):
        itemsize = np.dtype(dtype).itemsize
        a = self.cache.empty((quarter_mb * MB // 4 // itemsize,), dtype)
        assert a.ctypes.data % 64 == 0 and a.dtype == dtype
        self.counter += 1
        a.fill(self.counter % 100)
        self.live.append((a, self.counter % 100))

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1000), keep_view=st.booleans())
    def free(self, i, keep_view):
        a, v = self.live.pop(i % len(self.live))
        if keep_view and a.size > 1:
            self.live.append((a[1:], v))

    @rule(mb=st.integers(0, 12))
    def set_limit(self, mb):
        self.cache.set_limit(mb * MB)

    @invariant()
    def live_arrays_are_intact_and_disjoint(self):
        for k, (a, v) in enumerate(self.live):
            assert (a == v).all()
            for b, _ in self.live[k + 1:]:
                assert not np.shares_memory(a, b)

    @invariant()
    def idle_memory_is_within_the_limit(self):
        s = self.cache.stats()
        assert s["idle_bytes"] <= s["limit"]


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_kernels_keep_large_scratch_for_the_next_call():
    """The C library keeps scratch blocks of 1 MiB or more between calls (the blocked copy
    of x here, 4 MiB), takes them again for the next call, and release_output_cache hands
    them back too; results out of kept scratch are the same bits."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 64, 128, 128)).astype(np.float32)
    boxes = np.array([[0, 0, 0, 120, 90], [0, 30, 40, 127, 127]], np.float32)

    def call():
        return rc.roi_align(x, boxes, 7, 1.0, 2)

    rc.release_output_cache()
    first = call()
    kept = rc.release_output_cache()
    assert kept >= x.nbytes
    assert rc.release_output_cache() == 0
    call()
    again = call()  # takes the blocks the previous call kept
    assert rc.release_output_cache() == kept
    np.testing.assert_array_equal(again, first)


def _advised_for_huge_pages(start, end):
    """Whether a mapping of this process that overlaps [start, end) carries the
    MADV_HUGEPAGE flag ("hg" in /proc/self/smaps)."""
    overlaps = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                overlaps = lo < end and start < hi
            elif overlaps and line.startswith("VmFlags:") and "hg" in line.split()[1:]:
                return True
    return False


@pytest.mark.skipif(not os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"),
                    reason="this kernel has no transparent huge pages")
@pytest.mark.parametrize("rois, advised", [(512, True), (64, False)])
def test_large_outputs_are_advised_for_huge_pages(rois, advised):
    """An output of 4 MiB or more (here 6.4 MB) that a framework has just allocated is
    advised for huge pages before the kernel writes it, so it faults once per 2 MiB; a
    small one (800 KB) is left alone.  The results are the same bits either way."""
    call = _align_case(rois)
    want = call()
    room = mmap.mmap(-1, want.nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        out = np.frombuffer(room, np.float32, want.size).reshape(want.shape)
        start = out.ctypes.data
        assert not _advised_for_huge_pages(start, start + out.nbytes)
        call(out=out)
        assert _advised_for_huge_pages(start, start + out.nbytes) == advised
        np.testing.assert_array_equal(out, want)
        del out
    finally:
        room.close()


def test_a_child_forked_while_the_cache_is_locked_allocates():
    """A thread holding the cache's lock when another forks left the child waiting forever
    on its first output of 32 MiB or more (17 of 30 children)."""
    code = textwrap.dedent("""
        import os, threading, time
        import numpy as np
        import roicore.core as rc
        from roicore.core import _memory
        held = threading.Event()
        def hold():
            with _memory._CACHE._lock:
                held.set()
                time.sleep(2)
        threading.Thread(target=hold).start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            y = rc.roi_align(np.ones((1, 512, 64, 64), np.float32),
                             np.float32([[0, 0, 0, 8, 8]] * 512), 7, n_threads=1)
            os._exit(0 if y.nbytes >= 32 << 20 else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "0", out.stderr
