"""``python -m roicore.core``: run every operator on the framework documents' worked
examples, show the result next to the documented value, and exit non-zero on a mismatch."""
import sys
import time

import numpy as np

from . import effective_n_threads, openmp_enabled, ps_roi_align, psroi_pool, roi_align, roi_pool


def _examples():
    x86 = np.arange(48, dtype=np.float32).reshape(1, 1, 8, 6)
    box = np.array([[0, 0, 0, 4, 4]], np.float32)
    x44 = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    b44 = np.array([[0, 1, 1, 2, 2], [0, 1.5, 1.5, 3, 3]], np.float32)
    ov = (np.arange(36, dtype=np.float32) / 10).reshape(1, 1, 6, 6)
    ps = np.arange(288, dtype=np.float32).reshape(1, 8, 6, 6)
    yield ("MXNet ROIPooling docstring, scale 1.0", roi_pool(x86, box, 2, 1.0, convention="mxnet"),
           [14, 16, 26, 28])
    yield ("MXNet ROIPooling docstring, scale 0.7", roi_pool(x86, box, 2, 0.7, convention="mxnet"),
           [7, 9, 19, 21])
    yield ("Paddle roi_pool docstring", roi_pool(x44, b44, 1, 1.0, convention="paddle"), [11, 16])
    yield ("OpenVINO ROIPooling bilinear 1x1", roi_pool(
        np.repeat(ov, 1, 1), np.array([[0, .2, .2, .4, .4]], np.float32), 1, method="bilinear"),
        [1.05])
    yield ("MXNet PSROIPooling (output_dim 2, pooled 2)", psroi_pool(
        ps, np.array([[0, 0, 0, 3, 3]], np.float32), 2, 1.0, convention="mxnet"),
        [3.5, 41.5, 87.5, 125.5, 147.5, 185.5, 231.5, 269.5])
    yield ("torchvision ps_roi_pool, arange map", psroi_pool(
        np.arange(256, dtype=np.float32).reshape(1, 4, 8, 8),
        np.array([[0, 0, 0, 4, 4]], np.float32), 2, 1.0, convention="torchvision"),
        [4.5, 70.5, 148.5, 214.5])
    linear = (100 * np.arange(4)[:, None, None] + np.arange(16).reshape(4, 4)).astype(np.float32)
    yield ("torchvision ps_roi_align, linear map", ps_roi_align(
        linear[None], np.array([[0, .5, .5, 2.5, 2.5]], np.float32), 2, 1.0),
        [2.5, 103.5, 206.5, 307.5])
    yield ("Paddle roi_align docstring (aligned)", roi_align(
        x44, b44, 1, 1.0, -1, True, convention="paddle"), [6, 9.75])
    yield ("MXNet ROIAlign, sample_ratio 2", roi_align(
        x86, np.array([[0, .5, 1.5, 3.7, 6.2]], np.float32), 2, 1.0, 2, convention="mxnet"),
        [17.35, 18.95, 31.45, 33.05])


def main():
    print(f"roicore.core: OpenMP {'on' if openmp_enabled() else 'off'}, "
          f"{effective_n_threads()} thread(s)\n")
    failures = 0
    for name, got, want in _examples():
        ok = np.allclose(got.ravel(), want, rtol=1e-6, atol=1e-5)
        failures += not ok
        print(f"{'ok ' if ok else 'BAD'}  {name:46s} {np.round(got.ravel(), 4).tolist()}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 512, 38, 50)).astype(np.float32)
    xy = rng.uniform(0, 500, (2000, 2))
    boxes = np.hstack([np.zeros((2000, 1)), xy, xy + rng.uniform(16, 300, (2000, 2))]).astype(np.float32)
    t = time.perf_counter()
    roi_pool(x, boxes, 7, 1 / 16)
    print(f"\nroi_pool max, 2000 boxes x 512 channels, 7x7: {1e3 * (time.perf_counter() - t):.1f} ms")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
