"""Concurrent calls from Python threads give the sequential results, bit for bit."""
from __future__ import annotations

import threading

import numpy as np

import roicore.core as rc


# =======================================================================================
# concurrency
# =======================================================================================

def test_python_threads_give_sequential_results():
    rng = np.random.default_rng(99)
    xs = [rng.standard_normal((2, 64, 32, 32)).astype(np.float32) for _ in range(2)]

    def make_boxes(seed):
        r = np.random.default_rng(seed)
        xy1 = r.uniform(0, 400, (200, 2))
        wh = r.uniform(16, 256, (200, 2))
        b = r.integers(0, 2, (200, 1))
        return np.hstack([b, xy1, xy1 + wh]).astype(np.float32)

    bs = [make_boxes(1), make_boxes(2)]
    jobs = [
        lambda: rc.roi_align(xs[0], bs[0], 7, 1 / 16, 2),
        lambda: rc.roi_pool(xs[1], bs[1], 7, 1 / 16),
        lambda: rc.roi_align(xs[1], bs[1], 7, 1 / 16, -1, True, convention="paddle"),
        lambda: rc.roi_pool(xs[0], bs[0], 7, 1 / 16, convention="torchvision"),
    ]
    expected = [job() for job in jobs]
    assert all(np.any(e) for e in expected)

    for _ in range(5):
        for pair in ((0, 1), (2, 3), (0, 2)):
            results = {}
            barrier = threading.Barrier(2)

            def worker(i):
                barrier.wait()
                results[i] = jobs[i]()

            threads = [threading.Thread(target=worker, args=(i,)) for i in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            for i in pair:
                assert np.array_equal(results[i], expected[i]), i


def test_python_threads_backward_give_sequential_results():
    rng = np.random.default_rng(3)
    shape = (2, 64, 32, 32)
    boxes = np.hstack([rng.integers(0, 2, (200, 1)), rng.uniform(0, 200, (200, 2)),
                       rng.uniform(250, 500, (200, 2))]).astype(np.float32)
    g = rng.standard_normal((200, 64, 7, 7)).astype(np.float32)
    x = rng.standard_normal(shape).astype(np.float32)
    _, am = rc.roi_pool(x, boxes, 7, 1 / 16, return_argmax=True)
    jobs = [
        lambda: rc.roi_align_backward(g, boxes, shape, 1 / 16, 2),
        lambda: rc.roi_pool_backward(g, boxes, shape, 1 / 16, argmax=am),
    ]
    expected = [job() for job in jobs]
    for _ in range(5):
        results = {}
        barrier = threading.Barrier(2)

        def worker(i):
            barrier.wait()
            results[i] = jobs[i]()

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        for i in range(2):
            assert np.array_equal(results[i], expected[i]), i
