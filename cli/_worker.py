"""Worker process: ``python -m roicore.cli._worker {parity|bench} FRAMEWORK``.

One framework per process (importing TensorFlow before Paddle segfaults; MXNet needs its
NumPy aliases, which ``roicore.adapters.mxnet`` sets on import).  Messages: see _proc.py.
Never import this module in the parent process.
"""
from __future__ import annotations

import os
import resource
import statistics
import sys
import time

import numpy as np

from . import _proc
from ._proc import error_text, progress

F32, F64 = "float32", "float64"


def out_shape(c):
    N, C, H, W = c["x"].shape
    PH, PW = c["output_size"]
    D = C // (PH * PW) if c["op"] == "psroi_pool" else C
    return (c["rois"].shape[0], D, PH, PW)


def counts(rois, N):
    return np.bincount(rois[:, 0].astype(np.int64), minlength=N).astype(np.int32)


def keep_boxes(c, keep, why):
    dropped = int(np.count_nonzero(~keep))
    if not dropped:
        return c, None
    c = dict(c, rois=c["rois"][keep])
    if "dy" in c:
        c["dy"] = c["dy"][keep]
    return c, f"{dropped} box(es) not sent to the native op: {why}"


# ============================================================================ parity runners
class ParityRunner:
    name = "?"
    ops = {}          # op -> dtypes the adapter claims bit-identity for
    grad = True

    def restrict(self, c):
        return c, None

    def run(self, which, c, dtype, dy):  # -> (y, dx or None), NCHW numpy
        raise NotImplementedError


class PaddleParity(ParityRunner):
    name = "paddle"
    ops = {"roi_pool": (F32, F64), "psroi_pool": (F32, F64), "roi_align": (F32, F64)}

    def __init__(self):
        import paddle
        paddle.set_device("cpu")
        import paddle.vision.ops as V
        from roicore.adapters import paddle as A
        self.P, self.V, self.A = paddle, V, A
        self.version = paddle.__version__

    def restrict(self, c):
        if c["op"] == "roi_align" and c["aligned"] and c["sampling_ratio"] <= 0:
            r = c["rois"]
            # Paddle passes a negative grid size to size_t here and aborts (undefined behaviour)
            return keep_boxes(c, (r[:, 3] >= r[:, 1]) & (r[:, 4] >= r[:, 2]),
                              "reversed box with aligned=True and adaptive sampling aborts Paddle")
        return c, None

    def run(self, which, c, dtype, dy):
        P = self.P
        mod = self.V if which == "native" else self.A
        fn = getattr(mod, c["op"])
        x = P.to_tensor(c["x"].astype(dtype))
        x.stop_gradient = False
        boxes = P.to_tensor(np.ascontiguousarray(c["rois"][:, 1:].astype(dtype)))
        bn = P.to_tensor(counts(c["rois"], c["x"].shape[0]))
        kw = {}
        if c["op"] == "roi_align":
            kw = dict(sampling_ratio=c["sampling_ratio"], aligned=c["aligned"])
        y = fn(x, boxes, bn, c["output_size"], c["spatial_scale"], **kw)
        dx = None
        if y.size:
            y.backward(P.to_tensor(dy))
            dx = x.grad.numpy() if x.grad is not None else np.zeros(c["x"].shape, dtype)
        return y.numpy(), dx


class MXNetParity(ParityRunner):
    name = "mxnet"
    ops = {"roi_pool": (F32, F64), "psroi_pool": (F32, F64), "roi_align": (F32, F64)}
    NAMES = {"roi_pool": "ROIPooling", "psroi_pool": "PSROIPooling", "roi_align": "ROIAlign"}

    def __init__(self):
        from roicore.adapters import mxnet as A   # sets the NumPy aliases mxnet 1.9.1 needs
        import mxnet as mx
        self.mx, self.A = mx, A
        self.version = mx.__version__

    def restrict(self, c):
        if c["op"] == "psroi_pool" and c["output_size"][0] != c["output_size"][1]:
            raise ValueError("MXNet PSROIPooling takes a square pooled_size")
        if c["op"] == "roi_align" and c["aligned"]:
            r, s = c["rois"], c["spatial_scale"]
            ok = np.ones(len(r), bool)
            for dt in (np.float32, np.float64):   # size as MXNet computes it, in both dtypes
                rr, ss = r.astype(dt), dt(np.float32(s))
                ok &= (rr[:, 3] * ss - rr[:, 1] * ss > 0) & (rr[:, 4] * ss - rr[:, 2] * ss > 0)
            ok &= ((r[:, 3] - r[:, 1]) * s > 1e-4) & ((r[:, 4] - r[:, 2]) * s > 1e-4)
            return keep_boxes(c, ok, "aligned ROIAlign box of size <= 0 aborts MXNet")
        return c, None

    def run(self, which, c, dtype, dy):
        mx = self.mx
        name = self.NAMES[c["op"]]
        if which == "native":
            fn = getattr(mx.nd, name) if name == "ROIPooling" else getattr(mx.nd.contrib, name)
        else:
            fn = getattr(self.A, name)
        PH, PW = c["output_size"]
        s = c["spatial_scale"]
        if c["op"] == "roi_pool":
            kw = dict(pooled_size=(PH, PW), spatial_scale=s)
        elif c["op"] == "psroi_pool":
            kw = dict(spatial_scale=s, output_dim=c["x"].shape[1] // (PH * PW), pooled_size=PH,
                      group_size=PH)
        else:
            kw = dict(pooled_size=(PH, PW), spatial_scale=s, sample_ratio=c["sampling_ratio"],
                      aligned=c["aligned"])
        x = mx.nd.array(c["x"], dtype=dtype)
        rois = mx.nd.array(c["rois"].astype(dtype), dtype=dtype)
        x.attach_grad()
        with mx.autograd.record():
            y = fn(x, rois, **kw)
        y.backward(mx.nd.array(dy, dtype=dtype))
        return y.asnumpy(), x.grad.asnumpy()


class TFParity(ParityRunner):
    name = "tensorflow"
    ops = {"roi_pool_bilinear": (F32,)}

    def __init__(self):
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
        from roicore.adapters import tf as A
        self.tf, self.A = tf, A
        self.version = tf.__version__

    def run(self, which, c, dtype, dy):
        tf = self.tf
        img = tf.constant(c["x"].astype(dtype).transpose(0, 2, 3, 1))
        boxes = tf.constant(np.ascontiguousarray(c["rois"][:, [2, 1, 4, 3]].astype(np.float32)))
        bi = tf.constant(c["rois"][:, 0].astype(np.int32))
        with tf.GradientTape() as tape:
            tape.watch(img)
            if which == "native":
                y = tf.image.crop_and_resize(img, boxes, bi, list(c["output_size"]),
                                             extrapolation_value=0.0)
            else:
                y = self.A.roi_pool(img, boxes, bi, c["output_size"], method="bilinear")
        dx = tape.gradient(y, img, output_gradients=tf.constant(dy.transpose(0, 2, 3, 1)))
        return y.numpy().transpose(0, 3, 1, 2), dx.numpy().transpose(0, 3, 1, 2)


class OpenVINOParity(ParityRunner):
    name = "openvino"
    ops = {"roi_pool": (F32,), "roi_pool_bilinear": (F32,)}
    grad = False

    def __init__(self):
        import openvino as ov
        from openvino import opset1, opset2
        import roicore.core as rc
        self.ov, self.o1, self.o2, self.rc = ov, opset1, opset2, rc
        self.core = ov.Core()
        self.version = ov.__version__

    def run(self, which, c, dtype, dy):
        x = np.ascontiguousarray(c["x"].astype(np.float32))
        rois = np.ascontiguousarray(c["rois"].astype(np.float32))
        method = "bilinear" if c["op"] == "roi_pool_bilinear" else "max"
        if which != "native":
            return self.rc.roi_pool(x, rois, c["output_size"], c["spatial_scale"], method=method,
                                    convention="openvino_cpu"), None
        data = self.o1.parameter(list(x.shape), np.float32)
        r = self.o1.parameter(list(rois.shape), np.float32)
        node = self.o2.roi_pooling(data, r, output_roi=list(c["output_size"]),
                                   spatial_scale=c["spatial_scale"], method=method)
        cm = self.core.compile_model(self.ov.Model([node], [data, r]), "CPU",
                                     {"INFERENCE_PRECISION_HINT": "f32"})
        return np.array(cm([x, rois])[0]), None


PARITY = {"paddle": PaddleParity, "mxnet": MXNetParity, "tensorflow": TFParity,
          "openvino": OpenVINOParity}


def _fault(framework, op):
    spec = os.environ.get("ROICORE_PARITY_FAULT", "")
    for item in filter(None, spec.split(",")):
        fw, _, fop = item.partition(":")
        if fw == framework and (not fop or fop == op):
            return True
    return False


def parity(runner, msg):
    out = []
    cases = [c for c in msg["cases"] if c["op"] in runner.ops]
    todo = []
    for c in cases:
        if c["group"] == "inputs":   # the user's dtype only (reported as skipped if not claimed)
            todo.append((c, c["x"].dtype.name))
        else:
            todo += [(c, dt) for dt in runner.ops[c["op"]] if dt in msg["dtypes"]]
    last = time.monotonic()
    for i, (c, dt) in enumerate(todo):
        if time.monotonic() - last > 5:
            progress(f"{i}/{len(todo)} case runs")
            last = time.monotonic()
        rec = dict(name=c["name"], group=c["group"], op=c["op"], dtype=dt, notes=[])
        out.append(rec)
        if dt not in runner.ops[c["op"]]:
            rec["skipped"] = (f"input is {c['x'].dtype}; {runner.name} is compared in "
                              f"{'/'.join(runner.ops[c['op']])} only")
            continue
        try:
            cc, note = runner.restrict(c)
        except Exception as e:
            rec["skipped"] = error_text(e)
            continue
        if note:
            rec["notes"].append(note)
        if cc["rois"].shape[0] == 0:
            rec["skipped"] = "no boxes left for the native op"
            continue
        dy = cc.get("dy")
        if dy is None or dy.shape != out_shape(cc):
            dy = np.random.default_rng(cc["seed"]).standard_normal(out_shape(cc))
        dy = np.ascontiguousarray(dy.astype(dt))
        for which in ("native", "roicore"):
            try:
                y, dx = runner.run(which, cc, dt, dy)
                if which == "roicore" and _fault(runner.name, c["op"]) and y.size:
                    y = y.copy()   # test hook: one ulp off in one element
                    y.flat[0] = np.nextafter(y.flat[0], y.dtype.type(np.inf))
                rec[which] = dict(y=y, dx=dx if runner.grad else None)
            except Exception as e:
                rec[which] = dict(error=error_text(e))
    progress(f"{len(todo)}/{len(todo)} case runs done")
    return dict(results=out)


# ============================================================================ bench runners
# One timed run of a contender repeats its call for at least this long and reports the
# median call.  A single call of a sub-millisecond op (PS-RoI: 0.7 ms) mostly measured the
# state the previous contender left: its input evicted from the caches and the OpenMP
# threads asleep (1.3-1.9 ms in the bench against 0.7 ms in a loop).  Calls slower than
# this run once per round, as before.
RUN_MIN_SECONDS = 0.1


def timed_run(fn):
    """Median seconds per call of ``fn`` (which returns its own duration), repeated for at
    least RUN_MIN_SECONDS."""
    times = [fn()]
    while sum(times) < RUN_MIN_SECONDS:
        times.append(fn())
    return statistics.median(times)


def _timer(fn, sync=None):
    def timed():
        t0 = time.perf_counter()
        r = fn()
        if sync is not None:
            sync(r)
        return time.perf_counter() - t0
    return timed


class BenchRunner:
    """``contenders(w)`` -> {(direction, kind): callable} for workload data ``w``.

    Kinds: "native" (the framework's own op), "adapter" (roicore's adapter), "core"
    (roicore.core in this process, see in_process_core) and, for fwd+bwd, "autograd": a
    null op of the adapter's shapes (its forward returns a ready output tensor, its
    backward a ready input gradient) recorded and differentiated exactly as the adapter
    is.  Its time is what the framework's autograd costs around any op of these shapes
    (Paddle copies the 200 MB upstream gradient into fresh memory, for instance), which the
    adapter-overhead table shows beside, and net of, the adapter's time."""
    name = "?"

    def contenders(self, w):
        raise NotImplementedError

    def core_rules(self):
        """The conventions this worker's adapter gives roicore.core (see core_passes)."""
        raise NotImplementedError

    def in_process_core(self, w):
        """roicore.core timed in this worker, next to its adapter: the same workload, thread
        count and conventions as the adapter (its "core" contenders; the adapter-overhead
        table divides the adapter's time by these, both measured in this process)."""
        import roicore.core as rc
        return core_contenders(rc, w, self.n, self.core_rules())


def traced_peak(fn, *args):
    """``(fn(*args), peak)``: the most bytes tracemalloc saw allocated at once during the call.

    Only allocations made during the call are traced (tracing starts just before it and
    stops just after), so the inputs, and anything allocated earlier and still alive, are
    not counted.  NumPy reports its data buffers to tracemalloc; so does Python for its
    objects.  Memory taken by C code through plain malloc (e.g. OpenMP's thread pool and
    thread stacks) is not seen.  roicore.core's output cache is emptied first, so that
    outputs are traced as the fresh allocations a first call makes rather than reused.
    """
    import gc
    import tracemalloc

    from roicore.core import release_output_cache
    if tracemalloc.is_tracing():
        raise RuntimeError("traced_peak needs tracemalloc off (it starts and stops it)")
    gc.collect()
    release_output_cache()
    tracemalloc.start()
    try:
        result = fn(*args)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return result, peak


def nbytes(*arrays):
    return int(sum(a.nbytes for a in arrays if a is not None))


def core_passes(rc, w, n, rules):
    """``(forward, forward_saving, backward)``: roicore.core for ``w["op"]`` at ``n`` threads.

    ``forward()`` -> y (roi_pool: no argmax); ``forward_saving()`` -> the tuple of forward
    outputs the backward needs (y, plus argmax for max pooling); ``backward(saved)`` -> dx.
    ``rules`` maps "roi_pool" (forward without argmax), "roi_pool/saving" (forward keeping
    the argmax), "roi_pool/backward", "roi_align" and "psroi_pool" to the convention (name
    or rules object) each call uses.  The roicore worker times these calls against the
    native ops; each framework worker times them, with its adapter's conventions, next to
    the adapter (the in-process core of the adapter-overhead table).
    """
    x, boxes, bi, P, s, op = w["x"], w["boxes"], w["batch"], w["P"], w["scale"], w["op"]
    dy = w["dy"]
    if op == "roi_pool":
        def fwd():
            return rc.roi_pool(x, boxes, P, s, batch_indices=bi, convention=rules["roi_pool"],
                               n_threads=n)

        def fwd_saving():
            return rc.roi_pool(x, boxes, P, s, batch_indices=bi,
                               convention=rules["roi_pool/saving"], return_argmax=True,
                               n_threads=n)

        def bwd(saved):
            return rc.roi_pool_backward(dy, boxes, x.shape, s, batch_indices=bi,
                                        convention=rules["roi_pool/backward"], argmax=saved[1],
                                        n_threads=n)
    elif op == "roi_align":
        def fwd():
            return rc.roi_align(x, boxes, P, s, 2, True, batch_indices=bi,
                                convention=rules["roi_align"], n_threads=n)

        def fwd_saving():
            return (fwd(),)

        def bwd(saved):
            return rc.roi_align_backward(dy, boxes, x.shape, s, 2, True, batch_indices=bi,
                                         convention=rules["roi_align"], n_threads=n)
    else:
        def fwd():
            return rc.psroi_pool(x, boxes, P, s, batch_indices=bi,
                                 convention=rules["psroi_pool"], n_threads=n)

        def fwd_saving():
            return (fwd(),)

        def bwd(saved):
            return rc.psroi_pool_backward(dy, boxes, x.shape, s, batch_indices=bi,
                                          convention=rules["psroi_pool"], n_threads=n)
    return fwd, fwd_saving, bwd


def core_contenders(rc, w, n, rules):
    """{(direction, "core"): timer} for :func:`core_passes`."""
    fwd, fwd_saving, bwd = core_passes(rc, w, n, rules)
    return {("forward", "core"): _timer(fwd),
            ("fwd+bwd", "core"): _timer(lambda: bwd(fwd_saving()))}


class RoicoreBench(BenchRunner):
    name = "roicore"

    def __init__(self, threads):
        import roicore.core as rc
        self.rc, self.n = rc, threads
        self.version = rc.__version__

    # roicore.core's conventions in the native-ratio table
    RULES = {"roi_pool": "mxnet", "roi_pool/saving": "mxnet", "roi_pool/backward": "mxnet",
             "roi_align": "mxnet", "psroi_pool": "paddle"}

    def passes(self, w, n):
        return core_passes(self.rc, w, n, self.RULES)

    def contenders(self, w, n=None):
        return core_contenders(self.rc, w, n or self.n, self.RULES)

    def memory(self, w, direction, n=None):
        """Peak memory of one untimed call beyond its inputs and outputs (bytes).

        forward: the tracemalloc peak during the call minus the bytes of y.
        fwd+bwd: the forward (with what the backward needs: y, and argmax for roi_pool) and
        the backward are traced one after the other, the forward's outputs held through
        the backward as autograd holds them.  ``extra`` is the larger of (forward peak -
        y - argmax) and (backward peak - dx): the scratch either pass needs beyond its own
        inputs and outputs.  ``peak`` is the high-water mark of the whole sequence,
        outputs included: max(forward peak, y + argmax + backward peak).
        """
        fwd, fwd_saving, bwd = self.passes(w, n or self.n)
        if direction == "forward":
            y, peak = traced_peak(fwd)
            out = nbytes(y)
            return dict(peak=peak, outputs=out, extra=peak - out)
        saved, peak_f = traced_peak(fwd_saving)
        dx, peak_b = traced_peak(bwd, saved)
        held, grad = nbytes(*saved), nbytes(dx)
        return dict(peak=max(peak_f, held + peak_b), outputs=held + grad,
                    extra=max(peak_f - held, peak_b - grad),
                    forward_extra=peak_f - held, backward_extra=peak_b - grad)


class PaddleBench(BenchRunner):
    name = "paddle"

    def __init__(self, threads):
        import paddle
        paddle.set_device("cpu")
        import paddle.vision.ops as V
        from roicore.adapters import paddle as A
        self.P, self.V, self.A, self.n = paddle, V, A, threads
        self.version = paddle.__version__

    def contenders(self, w):
        P = self.P
        op = w["op"]
        x = P.to_tensor(w["x"])
        boxes = P.to_tensor(w["boxes"])
        bn = P.to_tensor(np.bincount(w["batch"], minlength=w["x"].shape[0]).astype(np.int32))
        dy = P.to_tensor(w["dy"])
        kw = dict(sampling_ratio=2, aligned=True) if op == "roi_align" else {}
        out = {}
        for kind, mod, extra in (("native", self.V, {}), ("adapter", self.A, {"n_threads": self.n})):
            fn = getattr(mod, op)

            def fwd(fn=fn, extra=extra):
                x.stop_gradient = True
                return fn(x, boxes, bn, w["P"], w["scale"], **kw, **extra)

            def fb(fn=fn, extra=extra):
                xg = x.detach()
                xg.stop_gradient = False
                y = fn(xg, boxes, bn, w["P"], w["scale"], **kw, **extra)
                y.backward(dy)
                return xg.grad
            out[("forward", kind)] = _timer(fwd)
            out[("fwd+bwd", kind)] = _timer(fb)
        y_pre, dx_pre = dy, x  # ready tensors of the output's and the input's shapes

        class Null(P.autograd.PyLayer):
            @staticmethod
            def forward(ctx, v):
                return y_pre.detach()

            @staticmethod
            def backward(ctx, g):
                return dx_pre.detach()

        def fb_autograd():
            xg = x.detach()
            xg.stop_gradient = False
            y = Null.apply(xg)
            y.backward(dy)
            return xg.grad
        out[("fwd+bwd", "autograd")] = _timer(fb_autograd)
        out.update(self.in_process_core(w))
        return out

    def core_rules(self):
        # Paddle's rules throughout; roi_pool with a gradient keeps an int32 argmax
        c = self.A.CONVENTION
        return {"roi_pool": c, "roi_pool/saving": self.A._GRAD_ARGMAX_RULES,
                "roi_pool/backward": c, "roi_align": c, "psroi_pool": c}


class MXNetBench(BenchRunner):
    name = "mxnet"

    def __init__(self, threads):
        from roicore.adapters import mxnet as A
        import mxnet as mx
        self.mx, self.A, self.n = mx, A, threads
        self.version = mx.__version__

    def contenders(self, w):
        mx = self.mx
        op = w["op"]
        x = mx.nd.array(w["x"])
        rois = mx.nd.array(np.hstack([w["batch"][:, None].astype(np.float32), w["boxes"]]))
        dy = mx.nd.array(w["dy"])
        P, s = w["P"], w["scale"]
        if op == "roi_pool":
            name, kw = "ROIPooling", dict(pooled_size=(P, P), spatial_scale=s)
        elif op == "roi_align":
            name, kw = "ROIAlign", dict(pooled_size=(P, P), spatial_scale=s, sample_ratio=2,
                                        aligned=True)
        else:
            name, kw = "PSROIPooling", dict(spatial_scale=s, output_dim=w["x"].shape[1] // (P * P),
                                            pooled_size=P, group_size=P)
        native = getattr(mx.nd, name) if name == "ROIPooling" else getattr(mx.nd.contrib, name)
        out = {}

        def fresh_leaf():
            """A copy of x to differentiate, finished: MXNet's copy is asynchronous, and
            an op that reads x would wait for it inside its timing while the null
            "autograd" op, which never reads x, would not."""
            xg = x.copy()
            xg.attach_grad()
            xg.wait_to_read()
            return xg

        for kind, fn, extra in (("native", native, {}),
                                ("adapter", getattr(self.A, name), {"n_threads": self.n})):
            def fwd(fn=fn, extra=extra):
                y = fn(x, rois, **kw, **extra)
                y.wait_to_read()

            def fb(fn=fn, extra=extra):
                xg = fresh_leaf()
                with mx.autograd.record():
                    y = fn(xg, rois, **kw, **extra)
                y.backward(dy)
                xg.grad.wait_to_read()
            out[("forward", kind)] = _timer(fwd)
            out[("fwd+bwd", kind)] = _timer(fb)
        # ready arrays of the output's and the input's shapes (views: no more memory)
        y_pre, dx_pre = dy.reshape(dy.shape), x.reshape(x.shape)

        class Null(mx.autograd.Function):
            def forward(self, v, r):
                return y_pre

            def backward(self, g):
                return dx_pre, mx.nd.zeros_like(rois)

        def fb_autograd():
            xg = fresh_leaf()
            with mx.autograd.record():
                y = Null()(xg, rois)
            y.backward(dy)
            xg.grad.wait_to_read()
        out[("fwd+bwd", "autograd")] = _timer(fb_autograd)
        out.update(self.in_process_core(w))
        return out

    def core_rules(self):
        return {k: "mxnet" for k in ("roi_pool", "roi_pool/saving", "roi_pool/backward",
                                     "roi_align", "psroi_pool")}


# Largest crop tensor the TensorFlow roi_pool stand-in may build (bytes).
TF_CROP_LIMIT = float(os.environ.get("ROICORE_BENCH_TF_CROP_LIMIT_GB", "1")) * 2**30


class TFBench(BenchRunner):
    name = "tensorflow"

    def __init__(self, threads):
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        from roicore.adapters import tf as A
        self.tf, self.A, self.n = tf, A, threads
        self.version = tf.__version__

    def contenders(self, w):
        tf = self.tf
        op = w["op"]
        N, C, H, W = w["x"].shape
        P, s = w["P"], w["scale"]
        x_nchw = tf.constant(w["x"])
        b = w["boxes"].astype(np.float64)
        bi = tf.constant(w["batch"])
        boxes_yx = tf.constant(b[:, [1, 0, 3, 2]].astype(np.float32))
        dy_nchw = tf.constant(w["dy"])
        out = {}
        crop_bytes = len(b) * (2 * P) ** 2 * C * 4
        if op == "roi_pool" and crop_bytes > TF_CROP_LIMIT:
            # with its gradient the stand-in holds several crop-sized tensors (about 11.5 GB
            # on c4_14x14), which next to the other workers exhausts a 24 GB machine
            raise MemoryError(
                f"skipped: the crop_and_resize stand-in needs a {crop_bytes / 2**30:.1f} GiB crop "
                f"tensor (more than {TF_CROP_LIMIT / 2**30:.0f} GiB) plus its gradient; set "
                "ROICORE_BENCH_TF_CROP_LIMIT_GB to raise the limit on a larger machine")
        if op == "roi_pool":
            # TF has no RoI max pooling; the usual stand-in: crop_and_resize to 2P, 2x2 max-pool
            img = tf.constant(w["x"].transpose(0, 2, 3, 1))
            nb = b * s
            nb[:, [0, 2]] /= max(W - 1, 1)
            nb[:, [1, 3]] /= max(H - 1, 1)
            nboxes = tf.constant(nb[:, [1, 0, 3, 2]].astype(np.float32))
            dy_nhwc = tf.constant(w["dy"].transpose(0, 2, 3, 1))

            def approx(im):
                crops = tf.image.crop_and_resize(im, nboxes, bi, [2 * P, 2 * P])
                return tf.nn.max_pool2d(crops, 2, 2, "VALID")

            def fb_native():
                with tf.GradientTape() as tape:
                    tape.watch(img)
                    y = approx(img)
                return tape.gradient(y, img, output_gradients=dy_nhwc)
            out[("forward", "native")] = _timer(lambda: approx(img))
            out[("fwd+bwd", "native")] = _timer(fb_native)
        fn = getattr(self.A, op)
        kw = dict(sampling_ratio=2, aligned=True) if op == "roi_align" else {}

        def fwd():
            return fn(x_nchw, boxes_yx, bi, P, s, data_format="NCHW", n_threads=self.n, **kw)

        def fb():
            with tf.GradientTape() as tape:
                tape.watch(x_nchw)
                y = fwd()
            return tape.gradient(y, x_nchw, output_gradients=dy_nchw)
        out[("forward", "adapter")] = _timer(fwd)
        out[("fwd+bwd", "adapter")] = _timer(fb)
        y_pre, dx_pre = dy_nchw, x_nchw  # ready tensors of the output's and the input's shapes

        @tf.custom_gradient
        def null(v):
            return tf.identity(y_pre), lambda g: dx_pre

        def fb_autograd():
            with tf.GradientTape() as tape:
                tape.watch(x_nchw)
                y = null(x_nchw)
            return tape.gradient(y, x_nchw, output_gradients=dy_nchw)
        out[("fwd+bwd", "autograd")] = _timer(fb_autograd)
        out.update(self.in_process_core(w))
        return out

    def core_rules(self):
        # roi_pool(method="max"): MXNet's rules with a per-plane argmax (the adapter's own)
        c = self.A.CONVENTIONS
        return {"roi_pool": c["roi_pool/max"], "roi_pool/saving": c["roi_pool/max"],
                "roi_pool/backward": c["roi_pool/max"], "roi_align": c["roi_align"],
                "psroi_pool": c["psroi_pool"]}


class OpenVINOBench(BenchRunner):
    name = "openvino"

    def __init__(self, threads):
        import openvino as ov
        from openvino import opset1, opset2, opset9
        self.ov, self.o1, self.o2, self.o9 = ov, opset1, opset2, opset9
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads}
        self.version = ov.__version__

    def contenders(self, w):
        o1 = self.o1
        op, x, P, s = w["op"], w["x"], w["P"], w["scale"]
        K = w["boxes"].shape[0]
        data = o1.parameter(list(x.shape), np.float32)
        if op == "roi_align":
            r = o1.parameter([K, 4], np.float32)
            bi = o1.parameter([K], np.int32)
            node = self.o9.roi_align(data, r, bi, P, P, 2, s, "avg", "half_pixel_for_nn")
            params, feed = [data, r, bi], [x, w["boxes"], w["batch"].astype(np.int32)]
        else:
            r = o1.parameter([K, 5], np.float32)
            rois = np.hstack([w["batch"][:, None].astype(np.float32), w["boxes"]])
            if op == "roi_pool":
                node = self.o2.roi_pooling(data, r, output_roi=[P, P], spatial_scale=s, method="max")
            else:
                node = o1.psroi_pooling(data, r, x.shape[1] // (P * P), P, s, 1, 1, "average")
            params, feed = [data, r], [x, rois]
        req = self.core.compile_model(self.ov.Model([node], params), "CPU",
                                      self.config).create_infer_request()
        return {("forward", "native"): _timer(lambda: req.infer(feed))}


class ORTBench(BenchRunner):
    name = "onnxruntime"

    def __init__(self, threads):
        import onnx  # noqa: F401  (builds the one-node models)
        import onnxruntime as ort
        self.ort = ort
        self.so = ort.SessionOptions()
        self.so.intra_op_num_threads = threads
        self.so.inter_op_num_threads = 1
        self.version = ort.__version__

    def contenders(self, w):
        from onnx import TensorProto, helper
        op, x, P, s = w["op"], w["x"], w["P"], w["scale"]
        if op == "psroi_pool":
            return {}
        K = w["boxes"].shape[0]
        X = helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape))
        Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
        if op == "roi_pool":
            R = helper.make_tensor_value_info("rois", TensorProto.FLOAT, [K, 5])
            node = helper.make_node("MaxRoiPool", ["X", "rois"], ["Y"], pooled_shape=[P, P],
                                    spatial_scale=float(s))
            inputs = [X, R]
            feed = {"X": x, "rois": np.hstack([w["batch"][:, None].astype(np.float32), w["boxes"]])}
        else:
            R = helper.make_tensor_value_info("rois", TensorProto.FLOAT, [K, 4])
            B = helper.make_tensor_value_info("bi", TensorProto.INT64, [K])
            node = helper.make_node("RoiAlign", ["X", "rois", "bi"], ["Y"], mode="avg",
                                    output_height=P, output_width=P, sampling_ratio=2,
                                    spatial_scale=float(s), coordinate_transformation_mode="half_pixel")
            inputs = [X, R, B]
            feed = {"X": x, "rois": w["boxes"], "bi": w["batch"].astype(np.int64)}
        g = helper.make_graph([node], "roi", inputs, [Y])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)])
        m.ir_version = 8
        sess = self.ort.InferenceSession(m.SerializeToString(), self.so,
                                         providers=["CPUExecutionProvider"])
        return {("forward", "native"): _timer(lambda: sess.run(None, feed))}


BENCH = {"roicore": RoicoreBench, "paddle": PaddleBench, "mxnet": MXNetBench,
         "tensorflow": TFBench, "openvino": OpenVINOBench, "onnxruntime": ORTBench}


class BenchState:
    def __init__(self, runner, threads, cache_per_run=False):
        """``cache_per_run`` (framework workers): each adapter or core run warms roicore's
        output cache with an untimed call first and releases its idle blocks after (see
        bench.py), so that no idle blocks sit in this worker while the others run."""
        self.runner, self.threads, self.cache_per_run = runner, threads, cache_per_run
        self.calls = {}

    def load(self, msg):
        """Build, warm up and (the roicore worker's core only) memory-profile the contenders of
        a workload.

        Contender keys are ``(op, direction, kind, threads)``.  ``thread_counts`` (roicore
        only) builds the core contenders once per thread count; the others run at the
        worker's thread count.  The memory figures come from one extra untimed call made
        here, before any timed round, so they do not disturb the timings.
        """
        from . import workloads
        self.calls = {}
        x, boxes, batch, P, s, _ = workloads.make(msg["workload"], seed=msg.get("seed", 0),
                                                  scale=msg.get("scale", 1.0))
        counts = msg.get("thread_counts") or [self.threads]
        if len(counts) > 1 and not isinstance(self.runner, RoicoreBench):
            raise ValueError("thread_counts is for the roicore worker only")
        errors, memory = {}, {}
        for op in msg["ops"]:
            K, C = boxes.shape[0], x.shape[1]
            D = C // (P * P) if op == "psroi_pool" else C
            dy = np.random.default_rng(1).standard_normal((K, D, P, P)).astype(np.float32)
            w = dict(x=x, boxes=boxes, batch=batch, P=P, scale=s, op=op, dy=dy)
            for n in counts:
                try:
                    calls = (self.runner.contenders(w, n) if isinstance(self.runner, RoicoreBench)
                             else self.runner.contenders(w))
                except Exception as e:
                    errors[op] = error_text(e)
                    break
                for (direction, kind), fn in calls.items():
                    if direction not in msg["directions"]:
                        continue
                    try:
                        fn()                                   # warm-up (and check it runs)
                    except Exception as e:
                        errors[f"{op}/{direction}/{kind}"] = error_text(e)
                        continue
                    key = (op, direction, kind, n)
                    self.calls[key] = fn
                    if (kind == "core" and msg.get("memory", True)
                            and isinstance(self.runner, RoicoreBench)):
                        try:
                            memory[key] = self.runner.memory(w, direction, n)
                        except Exception as e:
                            errors[f"{op}/{direction}/{kind}/memory"] = error_text(e)
        return dict(contenders=sorted(self.calls), errors=errors, memory=memory)

    def handle(self, msg):
        if msg["cmd"] == "load":
            return self.load(msg)
        if msg["cmd"] == "run":
            key = tuple(msg["key"])
            fn = self.calls[key]
            if not (self.cache_per_run and key[2] in ("adapter", "core")):
                return dict(seconds=timed_run(fn))
            from roicore.core import release_output_cache
            try:
                fn()  # untimed: its outputs return to the cache for the timed calls
                return dict(seconds=timed_run(fn))
            finally:
                release_output_cache()
        if msg["cmd"] == "unload":
            self.calls = {}
            import gc
            gc.collect()
            # the workload's idle output blocks would only crowd the next one's memory
            from roicore.core import release_output_cache
            release_output_cache()
            return dict(peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        raise ValueError(f"unknown command {msg['cmd']!r}")


# ============================================================================ main
def main(argv):
    kind, framework = argv
    state = {}

    def handler(msg):
        try:
            if msg["cmd"] == "init":
                cls = (PARITY if kind == "parity" else BENCH)[framework]
                try:
                    runner = cls(msg["threads"]) if kind == "bench" else cls()
                except ImportError as e:
                    return dict(skipped=error_text(e))
                state["runner"] = runner
                if kind == "bench":
                    state["bench"] = BenchState(runner, msg["threads"],
                                                msg.get("cache_per_run", False))
                return dict(version=runner.version)
            if kind == "parity":
                return parity(state["runner"], msg)
            return state["bench"].handle(msg)
        except Exception as e:
            import traceback
            return dict(error=error_text(e), traceback=traceback.format_exc())

    _proc.serve(handler)


if __name__ == "__main__":
    main(sys.argv[1:])
