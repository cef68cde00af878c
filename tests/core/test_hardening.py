"""Hostile use of roicore.core: forked processes, memory bounded by the work, interruptible
long calls, inputs that reach undefined behaviour in naive kernels, thread limits."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import roicore.core as rc
from roicore.core import conventions

HERE = pathlib.Path(__file__).resolve().parent
needs_openmp = pytest.mark.skipif(not rc.openmp_enabled(),
                                  reason="built without OpenMP: no thread team to fork or limit")


def run_python(code, timeout=120, **kw):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, **kw)


# ---------------------------------------------------------------------------------------
# fork: libgomp cannot run a team in a child forked after a parallel region; the child
# hung forever in a futex

FORK_CALL = """
    import numpy as np, roicore.core as rc
    x = np.random.default_rng(0).standard_normal((1, 64, 32, 32)).astype(np.float32)
    b = np.array([[0, 0, 0, 31, 31]] * 20, np.float32)
    def pooled(_=None):
        return rc.roi_pool(x, b, 7, n_threads=2)
"""


@needs_openmp
def test_forked_child_computes_after_the_parent_ran_threads():
    proc = run_python(FORK_CALL + """
    import os
    want = pooled()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if np.array_equal(pooled(), want) and rc.effective_n_threads(2) == 1 else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
    """, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "child 0"


@needs_openmp
@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_multiprocessing_pools_after_the_parent_ran_threads(tmp_path, method):
    script = tmp_path / "pool.py"
    script.write_text(textwrap.dedent(FORK_CALL + f"""
    import multiprocessing as mp
    if __name__ == "__main__":
        want = pooled()
        with mp.get_context({method!r}).Pool(2) as pool:
            got = pool.map(pooled, range(4))
        print(all(np.array_equal(g, want) for g in got))
    """))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


# ---------------------------------------------------------------------------------------
# memory: scratch bounded by the output, the input's blocked copy and a few buffers; a
# limit on any one allocation

@pytest.mark.slow
@pytest.mark.skipif(not pathlib.Path("/proc/self/clear_refs").exists(),
                    reason="peak memory is read from Linux's /proc")
@pytest.mark.parametrize("case", ["large boxes", "many boxes", "huge output_size",
                                  "one channel", "many channels"])
def test_peak_memory_is_bounded_by_the_work(case):
    """Beyond its inputs and outputs a call holds at most one channel-blocked copy of x,
    RoIAlign's sample tables (no larger than the output, or 16 MiB), PS-RoI's staging (16
    MiB), and per thread a few buffers of at most one channel block."""
    proc = subprocess.run([sys.executable, str(HERE / "peak_memory.py"), case],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(rows) == 8
    for r in rows:
        bound = 1.1 * r["x_bytes"] + r["out_bytes"] + (40 << 20)
        assert r["extra"] <= bound, r


def test_memory_limit_refuses_outputs_and_scratch_before_allocating():
    x = np.ones((1, 64, 32, 32), np.float32)
    boxes = np.float32([[0, 0, 0, 31, 31]] * 64)
    previous = rc.set_memory_limit(1 << 20)
    try:
        # the output: 64 x 64 x 14 x 14 float32 = 3.2 MB
        with pytest.raises(MemoryError, match=r"out of shape \(64, 64, 14, 14\) \(float32\) "
                                              r"would take 3211264 bytes, over roicore's memory "
                                              r"limit of 1048576 bytes"):
            rc.roi_align(x, boxes, 14)
        with pytest.raises(MemoryError, match=r"argmax of shape \(64, 64, 14, 14\) \(int32\) "
                                              r"would take 3211264 bytes"):
            rc.roi_pool(x, boxes, 14, return_argmax=True,
                        out=np.empty((64, 64, 14, 14), np.float32))
        # the kernel's scratch (the blocked copy of x, 256 KB, and more): the C API refuses
        rc.set_memory_limit(200_000)
        with pytest.raises(MemoryError, match=r"scratch memory, over roicore's memory limit"):
            rc.roi_align(x, boxes[:1], 2)
    finally:
        rc.set_memory_limit(previous)
    assert rc.get_memory_limit() == previous


def test_outputs_beyond_physical_memory_are_refused_by_default():
    """(NumPy said "Unable to allocate 87.3 TiB", or overcommit granted it and filling it got
    the process killed.)"""
    assert rc.get_memory_limit() == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    x = np.ones((1, 1024, 8, 8), np.float32)
    boxes = np.float32([[0, 0, 0, 7, 7]] * 100_000)
    with pytest.raises(MemoryError, match=r"out of shape \(100000, 1024, 512, 512\)"):
        rc.roi_align(x, boxes, 512)


@pytest.mark.parametrize("op, kw", [("roi_pool", {}), ("roi_pool", {"method": "bilinear"}),
                                    ("roi_align", {})])
def test_outputs_past_int64_bytes_are_refused_without_a_limit(op, kw):
    """With the limit off (0), an output of more than 2**63 bytes is still a MemoryError
    naming it, not NumPy's 'Maximum allowed dimension exceeded'.  (The position-sensitive
    ops' outputs are bounded by x.)"""
    previous = rc.get_memory_limit()
    rc.set_memory_limit(0)
    try:
        x = np.ones((1, 1, 4, 4), np.float32)
        with pytest.raises(MemoryError, match=r"\(1, 1, 2147483647, 2147483647\) \(float32\) "
                                              r"would take more than 2\*\*63 bytes"):
            getattr(rc, op)(x, np.float32([[0, 0, 0, 0.5, 0.5]]), (2**31 - 1, 2**31 - 1), **kw)
    finally:
        rc.set_memory_limit(previous)


@pytest.mark.parametrize("what", ["x", "boxes", "batch_indices"])
def test_the_memory_limit_bounds_input_copies(what):
    """A broadcast input holds little memory but stands for much: its contiguous copy (x in
    the computed dtype, boxes in x's, indices as int64) is checked against the limit
    before it is made.  It grew the process by 256 MB to 1.2 GB before the MemoryError."""
    previous = rc.get_memory_limit()
    x = np.zeros((1, 8, 16, 16), np.float32)
    boxes, indices = np.float32([[0, 0, 4, 4]]), np.zeros(1, np.int64)
    if what == "x":
        x = np.broadcast_to(np.float16(0), (64, 256, 128, 128))   # 512 MiB as float32
    elif what == "boxes":
        boxes = np.broadcast_to(np.float64([0, 0, 4, 4]), (2**24, 4))  # 256 MiB as float32
        indices = np.zeros(2**24, np.int64)
    else:
        boxes = np.broadcast_to(np.float32([0, 0, 4, 4]), (2**25, 4))
        indices = np.broadcast_to(np.int8(0), (2**25,))                # 256 MiB as int64
    try:
        rc.set_memory_limit(64 << 20)
        with pytest.raises(MemoryError, match=rf"the contiguous \w+ copy of {what}, shape .* "
                                              r"over roicore's memory limit"):
            rc.roi_align(x, boxes, 2, batch_indices=indices)
    finally:
        rc.set_memory_limit(previous)


def test_set_memory_limit_validates():
    with pytest.raises(TypeError, match="nbytes must be an int"):
        rc.set_memory_limit(1.5)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        rc.set_memory_limit(-1)


# ---------------------------------------------------------------------------------------
# interruptible work: Ctrl-C was ignored until the call finished (at output size 1024,
# about 1.4 h per box and channel)

@pytest.mark.slow
def test_ctrl_c_stops_a_long_call_within_a_second():
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import time, numpy as np, roicore.core as rc
        x = np.ones((1, 64, 256, 256), np.float32)
        b = np.float32([[0, 0, 0, 255, 255]])
        print("ready", flush=True)
        try:
            rc.roi_align(x, b, 32, 1.0, 1024)
            print("finished")
        except KeyboardInterrupt:
            print("interrupted", time.monotonic(), flush=True)
        y = rc.roi_align(np.arange(48, dtype=np.float32).reshape(1, 1, 8, 6),
                         np.float32([[0, 0, 0, 4, 4]]), 2, 1.0, 2)
        print(y.ravel().tolist())
    """)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # the call is running (it would take minutes)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    lines = out.splitlines()
    assert proc.returncode == 0, err
    assert lines[0].startswith("interrupted"), out
    # within a second; the sanitizer build's tasks (libasan preloaded) run several times slower
    limit = 5.0 if "libasan" in os.environ.get("LD_PRELOAD", "") else 1.0
    assert float(lines[0].split()[1]) - sent < limit
    assert lines[1] == "[7.0, 9.0, 19.0, 21.0]"  # and the next call is right


# ---------------------------------------------------------------------------------------
# undefined behaviour on hostile input

@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_bilinear_on_a_1x1_map_rejects_overflowing_boxes(direction):
    """The range check scaled by W - 1 = 0, so any box passed; (y2 - y1) then overflowed to
    inf and the sample position became NaN, which reached a float-to-int cast."""
    x = np.ones((1, 1, 1, 1), np.float32)
    boxes = np.float32([[0, 0, -3e38, 0, 3e38]])
    with pytest.raises(ValueError, match=r"boxes\[0\] coordinate -3[0-9.]*e\+38 lies .* feature-map "
                                         r"pixels from the origin"):
        if direction == "forward":
            rc.roi_pool(x, boxes, 2, method="bilinear", convention="tensorflow")
        else:
            rc.roi_pool_backward(np.ones((1, 1, 2, 2), np.float32), boxes, x.shape,
                                 method="bilinear", convention="tensorflow")
    ok = rc.roi_pool(x, np.float32([[0, 0, 0.5, 1, 0.5]]), 2, method="bilinear",
                     convention="tensorflow")
    np.testing.assert_array_equal(ok, np.ones((1, 1, 2, 2), np.float32))


def _unaligned(a):
    """A copy of `a` whose data starts one byte past an aligned address."""
    raw = np.zeros(a.nbytes + a.itemsize + 1, np.uint8)
    start = (-raw.ctypes.data) % a.itemsize + 1
    out = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def test_unaligned_arrays_are_copied_not_read_misaligned():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 9, 10, 11)).astype(np.float32)
    boxes = np.float32([[0, 1, 1, 8, 7], [1, 0, 2, 9, 9]])
    for fn, kw in [(rc.roi_pool, {}), (rc.roi_align, {}), (rc.psroi_pool, {"output_size": 3})]:
        size = kw.pop("output_size", 2)
        want = fn(x, boxes, size, **kw)
        np.testing.assert_array_equal(fn(_unaligned(x), _unaligned(boxes), size, **kw), want)
    y, a = rc.roi_pool(x, boxes, 2, return_argmax=True)
    want = rc.roi_pool_backward(y, boxes, x.shape, argmax=a)
    np.testing.assert_array_equal(
        rc.roi_pool_backward(_unaligned(y), _unaligned(boxes), x.shape, argmax=_unaligned(a)), want)
    with pytest.raises(ValueError, match="out must be C-contiguous, aligned and writeable"):
        rc.roi_align(x, boxes, 2, out=_unaligned(np.zeros((2, 9, 2, 2), np.float32)))


@pytest.mark.parametrize("op", ["roi_pool_bilinear_backward", "roi_align", "roi_align_backward",
                                "psroi_pool"])
def test_out_overlapping_the_boxes_is_refused(op):
    """The bilinear backward zeroed `out` before it read the boxes: a silently wrong gradient."""
    x = np.random.default_rng(4).standard_normal((1, 4, 6, 6)).astype(np.float32)
    buf = np.zeros(4 * 4 * 6 * 6, np.float32)
    boxes = buf[:8].reshape(2, 4)
    boxes[:] = [[0.1, 0.1, 0.8, 0.9], [0.2, 0, 0.7, 0.5]]
    with pytest.raises(ValueError, match="out must not share memory with the inputs"):
        if op == "roi_pool_bilinear_backward":
            rc.roi_pool_backward(np.ones((2, 4, 2, 2), np.float32), boxes, x.shape,
                                 batch_indices=np.zeros(2, np.int64), method="bilinear",
                                 out=buf[:4 * 36].reshape(1, 4, 6, 6))
        elif op == "roi_align":
            rc.roi_align(x, boxes, 2, batch_indices=np.zeros(2, np.int64),
                         out=buf[:32].reshape(2, 4, 2, 2))
        elif op == "roi_align_backward":
            rc.roi_align_backward(np.ones((2, 4, 2, 2), np.float32), boxes, x.shape,
                                  batch_indices=np.zeros(2, np.int64),
                                  out=buf[:4 * 36].reshape(1, 4, 6, 6))
        else:
            rc.psroi_pool(x, boxes, 2, batch_indices=np.zeros(2, np.int64),
                          out=buf[:8].reshape(2, 1, 2, 2))


@needs_openmp
@pytest.mark.slow
def test_a_thread_limit_lowers_the_team_instead_of_exiting():
    """libgomp printed "Thread creation failed" and exited the process (status 1) when the
    address space could not hold the stacks of the team asked for."""
    proc = run_python("""
        import resource, numpy as np, roicore.core as rc
        x = np.ones((1, 64, 32, 32), np.float32); b = np.float32([[0, 0, 0, 31, 31]] * 64)
        want = rc.roi_align(x, b, 7, 1.0, 2, n_threads=1)
        vm = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (vm + (40 << 20),) * 2)  # room for a few stacks
        y = rc.roi_align(x, b, 7, 1.0, 2, n_threads=64)
        print(np.array_equal(y, want), 1 <= rc.effective_n_threads(64) < 64)
    """, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"


@needs_openmp
@pytest.mark.parametrize("variable, value", [("OMP_STACKSIZE", "100G"),
                                             ("OMP_STACKSIZE", " 100 g"),
                                             ("GOMP_STACKSIZE", str(100 << 20))])
def test_an_unstartable_stack_size_lowers_the_team_instead_of_exiting(variable, value):
    """The startable-team probe started its threads with default stacks, libgomp then
    with OMP_STACKSIZE's, and exited the process when it could not (a stack larger than
    memory and swap)."""
    proc = run_python("""
        import numpy as np, roicore.core as rc
        x = np.ones((1, 64, 32, 32), np.float32); b = np.float32([[0, 0, 0, 31, 31]] * 64)
        y = rc.roi_align(x, b, 7, 1.0, 2, n_threads=2)
        print(np.array_equal(y, rc.roi_align(x, b, 7, 1.0, 2, n_threads=1)))
    """, timeout=120, env={**os.environ, variable: value})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


# ---------------------------------------------------------------------------------------
# smaller ones

@pytest.mark.parametrize("field, value", [("initial", "bogus"), ("compare", "bogus"),
                                          ("argmax", "everywhere"), ("scale_product", "float32")])
def test_hand_built_rules_with_a_bad_field(field, value):
    """("KeyError: 'bogus'", or with initial='bogus' a silent NaN.)"""
    import dataclasses
    rules = dataclasses.replace(conventions.MAX_POOL["mxnet"], **{field: value})
    with pytest.raises(ValueError, match=rf"MaxPoolRules\.{field} must be one of .*, got "
                                         rf"'{value}'"):
        rc.roi_pool(np.ones((1, 1, 4, 4), np.float32), np.float32([[0, 0, 0, 3, 3]]), 2,
                    convention=rules)


def test_bool_in_input_shape():
    with pytest.raises(TypeError, match=r"input_shape must be a sequence of 4 ints"):
        rc.roi_align_backward(np.ones((1, 8, 2, 2), np.float32), np.float32([[0, 0, 0, 3, 3]]),
                              (True, 8, 12, 10))
