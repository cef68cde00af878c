"""Peak memory of roicore.core calls beyond their inputs and outputs, measured from the
process's peak resident set (VmHWM, restarted before each call through
/proc/self/clear_refs): ``python peak_memory.py CASE`` prints one JSON line per operator
and direction.  Run by test_hardening.py, one process per case."""
import gc
import json
import sys

import numpy as np

import roicore.core as rc

OPS = ("roi_pool", "bilinear", "psroi_pool", "roi_align")
CASES = ("large boxes", "many boxes", "huge output_size", "one channel", "many channels")


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def inputs(case, op):
    """(x, boxes (K, 5), output_size, spatial_scale, sampling_ratio) for one case."""
    rng = np.random.default_rng(0)
    N, C, H, W, K, P, scale, sr = 1, 16, 64, 64, 300, (7, 7), 1 / 16, 2
    if case == "large boxes":  # sample grids at the cap on a 7 KB output
        C, K, P, scale, sr = 1, 30, (64, 1), 1.0, -1
    elif case == "many boxes":
        N, K = 2, 20000
    elif case == "huge output_size":
        C, K, P, scale = 4, 1, (1024, 1024), 1.0
    elif case == "one channel":
        C, K, P = 1, 2000, (14, 14)
    elif case == "many channels":
        C, K, P = 1024, 300, (14, 14)
    if op == "psroi_pool":
        if case == "huge output_size":
            P = (64, 64)
        C = max(1, C // (P[0] * P[1])) * P[0] * P[1]
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    if case == "large boxes":
        boxes = np.tile(np.float32([[0, 0, -2**21, 1, 2**21]]), (K, 1))
    else:
        xy = rng.uniform(0, 900, (K, 2)) * scale * 16
        boxes = np.hstack([rng.integers(0, N, (K, 1)), xy,
                           xy + rng.uniform(16, 300, (K, 2)) * scale * 16]).astype(np.float32)
    if op == "bilinear":  # normalised boxes, some beyond the map
        boxes[:, 1:] = np.clip(boxes[:, 1:] * scale / 64, -2, 2)
    return x, boxes, P, scale, sr


def forward(op, x, boxes, P, scale, sr, argmax=False):
    if op == "roi_pool":
        return rc.roi_pool(x, boxes, P, scale, return_argmax=argmax)
    if op == "bilinear":
        return rc.roi_pool(x, boxes, P, method="bilinear", convention="tensorflow")
    if op == "psroi_pool":
        return rc.psroi_pool(x, boxes, P, scale)
    return rc.roi_align(x, boxes, P, scale, sr)


def backward(op, y, x, boxes, scale, sr, argmax):
    if op == "roi_pool":
        return rc.roi_pool_backward(y, boxes, x.shape, scale, argmax=argmax)
    if op == "bilinear":
        return rc.roi_pool_backward(y, boxes, x.shape, method="bilinear", convention="tensorflow")
    if op == "psroi_pool":
        return rc.psroi_pool_backward(y, boxes, x.shape, scale)
    return rc.roi_align_backward(y, boxes, x.shape, scale, sr)


def measure(case):
    rc.set_output_cache_limit(0)  # cached blocks would hide or inflate the outputs
    rc.roi_align(np.ones((1, 1, 4, 4), np.float32), np.float32([[0, 0, 0, 3, 3]]), 2)  # threads
    for op in OPS:
        x, boxes, P, scale, sr = inputs(case, op)
        for direction in ("forward", "backward"):
            argmax = None
            if direction == "backward":
                y = forward(op, x, boxes, P, scale, sr, argmax=True)
                y, argmax = y if op == "roi_pool" else (y, None)
            gc.collect()
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # the peak restarts from the current resident set
            start = _status("VmRSS:")
            if direction == "forward":
                out = forward(op, x, boxes, P, scale, sr)
            else:
                out = backward(op, y, x, boxes, scale, sr, argmax)
            peak = _status("VmHWM:")
            print(json.dumps(dict(case=case, op=op, direction=direction, x_bytes=x.nbytes,
                                  out_bytes=out.nbytes, extra=peak - start - out.nbytes)),
                  flush=True)
            del out


if __name__ == "__main__":
    measure(sys.argv[1])
