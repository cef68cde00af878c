"""The bench worker's side: build a workload's contenders, warm them up, time them on request.

A worker serves one source of contenders: :class:`CoreBench` (roicore.core alone, the
"roicore" worker) or :class:`FrameworkBench` (one framework's harness: its native op,
roicore's adapter, the framework's autograd cost and roicore.core beside them).
"""
from __future__ import annotations

import resource
import statistics
import time

from roicore.core import operators

from . import workloads
from ._proc import error_text
from .frameworks import F32, Unsupported, boxes_and_batch

# One timed run of a contender repeats its call for at least this long and reports the
# median call.  A single call of a sub-millisecond op mostly measures the state the previous
# contender left: its input evicted from the caches and the OpenMP threads asleep.  Calls
# slower than this run once per round.
RUN_MIN_SECONDS = 0.1


def timed_run(fn, min_seconds=RUN_MIN_SECONDS):
    """Median seconds per call of ``fn`` (which returns its own duration), repeated for at
    least ``min_seconds``."""
    times = [fn()]
    while sum(times) < min_seconds:
        times.append(fn())
    return statistics.median(times)


def _timer(fn):
    def timed():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed


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


# ----------------------------------------------------------------------------- roicore.core
def core_passes(case, dy, n, rules):
    """``(forward, forward_saving, backward)``: roicore.core for ``case["op"]`` at ``n`` threads.

    ``forward()`` -> y (max pooling: no argmax); ``forward_saving()`` -> the tuple of
    forward outputs the backward needs (y, plus the argmax for max pooling);
    ``backward(saved)`` -> dx.  ``rules`` maps each operator to the convention (name or
    rules object) its calls use; "<op>/saving" and "<op>/backward", where given, override it
    for the forward that keeps what the backward needs and for the backward.  The roicore
    worker times these calls against the native ops; each framework worker times them, with
    its adapter's conventions, next to the adapter (the in-process core of the
    adapter-overhead table).
    """
    from roicore.core import operators
    op = case["op"]
    try:
        v = operators.variant(op)
    except ValueError as e:
        raise Unsupported(str(e)) from None
    x, P, s = case["x"], case["output_size"], case["spatial_scale"]
    boxes, bi = boxes_and_batch(case, x.dtype)
    kw = dict(batch_indices=bi, n_threads=n,
              **v.options(sampling_ratio=case["sampling_ratio"], aligned=case["aligned"]))
    conv = rules[op]
    saving, backward = rules.get(f"{op}/saving", conv), rules.get(f"{op}/backward", conv)

    def fwd():
        return v.forward(x, boxes, P, s, convention=conv, **kw)[0]

    def fwd_saving():
        y, saved = v.forward(x, boxes, P, s, saving=True, convention=saving, **kw)
        return (y,) + saved

    def bwd(saved):
        return v.backward(dy, boxes, x.shape, s, saved[1:], convention=backward, **kw)
    return fwd, fwd_saving, bwd


def core_contenders(case, dy, n, rules, variant=""):
    """{(direction, "core", variant): timer} for :func:`core_passes`."""
    fwd, fwd_saving, bwd = core_passes(case, dy, n, rules)
    return {("forward", "core", variant): _timer(fwd),
            ("fwd+bwd", "core", variant): _timer(lambda: bwd(fwd_saving()))}


def with_convention(rules, op, convention):
    """``rules`` with every call of ``op`` (its "/saving" and "/backward" too) under
    ``convention``."""
    keys = [k for k in rules if k == op or k.startswith(op + "/")] or [op]
    return dict(rules, **dict.fromkeys(keys, convention))


class CoreBench:
    """roicore.core alone, at any thread count (an argument of each call), with its memory."""
    name = "roicore"
    per_call_threads = True
    measures_memory = True
    # roicore.core's conventions in the native-ratio table (variant ""): each operator's
    # default, but TensorFlow's for bilinear pooling (crop_and_resize, the framework with the
    # most users of it); other conventions are timed on request, each as the variant named
    # after it
    RULES = {**{v.name: v.method.default for v in operators.variants()},
             "roi_pool_bilinear": "tensorflow"}

    def __init__(self, threads):
        import roicore.core as rc
        self.version = rc.__version__

    def contenders(self, case, dy, n, conventions=()):
        """``(timers, errors)``: {(direction, kind, variant): timer} and {(kind, variant):
        error} for the contenders that could not be built.

        ``conventions``: roicore.core's conventions to time besides the default, for the
        operators that have them (see cases.CONVENTIONS)."""
        from .cases import CONVENTIONS
        op = case["op"]
        timers = core_contenders(case, dy, n, self.RULES)
        for conv in conventions:
            if conv in CONVENTIONS[op] and conv != self.RULES[op]:
                timers.update(core_contenders(case, dy, n, with_convention(self.RULES, op, conv),
                                              conv))
        return timers, {}

    def memory(self, case, dy, direction, n):
        """Peak memory of one untimed call beyond its inputs and outputs (bytes).

        forward: the tracemalloc peak during the call minus the bytes of y.
        fwd+bwd: the forward (with what the backward needs: y, and argmax for roi_pool) and
        the backward are traced one after the other, the forward's outputs held through
        the backward as autograd holds them.  ``extra`` is the larger of (forward peak -
        y - argmax) and (backward peak - dx): the scratch either pass needs beyond its own
        inputs and outputs.  ``peak`` is the high-water mark of the whole sequence,
        outputs included: max(forward peak, y + argmax + backward peak).
        """
        fwd, fwd_saving, bwd = core_passes(case, dy, n, self.RULES)
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


# ----------------------------------------------------------------------------- frameworks
class FrameworkBench:
    """One framework's contenders, through its harness, at the thread count the worker was
    started with.

    Kinds: "native" (the framework's own op), "adapter" (roicore's adapter), "core"
    (roicore.core in this process, with the adapter's conventions: the adapter-overhead
    table divides the adapter's time by it, both measured here) and, for fwd+bwd,
    "autograd": the harness's null op of the adapter's shapes, recorded and differentiated
    exactly as the adapter is.  Its time is what the framework's autograd costs around any
    op of these shapes (Paddle copies the upstream gradient into fresh memory, for
    instance), which the adapter-overhead table shows beside, and net of, the adapter's time.
    """
    per_call_threads = False
    measures_memory = False

    def __init__(self, harness):
        self.harness = harness
        self.name, self.version = harness.name, harness.version

    def contenders(self, case, dy, n, conventions=()):
        h = self.harness
        if n != h.threads:
            raise ValueError(f"the {h.name} worker runs at {h.threads} thread(s), not {n}")
        try:
            inputs = h.inputs(case, case["x"].dtype.name, dy)
        except Unsupported:
            return {}, {}
        timers, errors = {}, {}

        def add(kind, variant, make):
            try:
                call = make()
            except Unsupported:
                return None
            except Exception as e:
                errors[(kind, variant)] = error_text(e)
                return None
            timers[("forward", kind, variant)] = _timer(lambda: h.forward(call))
            if h.differentiable:
                timers[("fwd+bwd", kind, variant)] = _timer(lambda: h.forward_backward(call))
            return call

        add("native", "", lambda: h.native(case, inputs))
        if h.has_adapter:
            # the adapter in each layout it takes; the first is the one measured against the
            # core and the autograd cost (the others are variants named after their layout)
            first, *others = h.layouts
            adapter = add("adapter", "", lambda: h.roicore(case, inputs, first))
            if adapter is not None:
                for layout in others:
                    add("adapter", layout, lambda: h.roicore(case, inputs, layout))
                null = h.null(adapter, inputs)
                timers[("fwd+bwd", "autograd", "")] = _timer(lambda: h.forward_backward(null))
                timers.update(core_contenders(case, dy, n, h.core_rules()))
        return timers, errors


# ----------------------------------------------------------------------------- the worker
class BenchState:
    def __init__(self, source, threads, cache_per_run=False):
        """``cache_per_run`` (framework workers): each adapter or core run warms roicore's
        output cache with an untimed call first and releases its idle blocks after (see
        bench.py), so that no idle blocks sit in this worker while the others run."""
        self.source, self.threads, self.cache_per_run = source, threads, cache_per_run
        self.calls = {}
        self.min_seconds = RUN_MIN_SECONDS

    def load(self, msg):
        """Build, warm up and (where the source measures it) memory-profile the contenders
        of a workload.

        Contender keys are ``(op, dtype, direction, kind, variant, threads)``.
        ``thread_counts`` builds the contenders once per thread count, for a source whose
        calls take one; others run at the worker's thread count.  The memory figures come
        from one extra untimed call of roicore.core's default convention, made here, before
        any timed round, so they do not disturb the timings.
        """
        if msg["workload"] in workloads.PYRAMID_WORKLOADS:    # a list of maps: its own path
            from ._pyramid_bench import load
            return load(self, msg)
        self.calls = {}
        self.min_seconds = msg.get("min_seconds", RUN_MIN_SECONDS)
        counts = msg.get("thread_counts") or [self.threads]
        if len(counts) > 1 and not self.source.per_call_threads:
            raise ValueError(f"the {self.source.name} worker runs at one thread count")
        cases = workloads.cases(msg["workload"], msg["ops"], seed=msg.get("seed", 0),
                                scale=msg.get("scale", 1.0))
        errors, memory = [], {}

        def fail(exc, op, dtype, **where):
            """An error entry: where it happened (``kind`` None: all of the op) and what."""
            errors.append(dict(dict(op=op, dtype=dtype, direction=None, kind=None, variant=""),
                               **where, error=error_text(exc) if isinstance(exc, Exception)
                               else exc))

        for dtype in msg.get("dtypes", [F32]):
            x = cases[next(iter(cases))][0]["x"].astype(dtype, copy=False)
            gradients = {}    # one per shape, as workloads.cases gives them
            for op, (case, dy) in cases.items():
                if id(dy) not in gradients:
                    gradients[id(dy)] = dy.astype(dtype, copy=False)
                case, dy = dict(case, x=x), gradients[id(dy)]
                for n in counts:
                    try:
                        timers, failed = self.source.contenders(case, dy, n,
                                                                msg.get("conventions", ()))
                    except Exception as e:
                        fail(e, op, dtype)
                        break
                    for (kind, variant), e in failed.items():
                        fail(e, op, dtype, kind=kind, variant=variant)
                    for (direction, kind, variant), fn in timers.items():
                        if direction not in msg["directions"]:
                            continue
                        where = dict(direction=direction, kind=kind, variant=variant)
                        try:
                            fn()                               # warm-up (and check it runs)
                        except Exception as e:
                            fail(e, op, dtype, **where)
                            continue
                        key = (op, dtype, direction, kind, variant, n)
                        self.calls[key] = fn
                        if (kind == "core" and not variant and msg.get("memory", True)
                                and self.source.measures_memory):
                            try:
                                memory[key] = self.source.memory(case, dy, direction, n)
                            except Exception as e:
                                fail(e, op, dtype, what="memory", **where)
        return dict(contenders=sorted(self.calls), errors=errors, memory=memory)

    def handle(self, msg):
        if msg["cmd"] == "load":
            return self.load(msg)
        if msg["cmd"] == "run":
            key = tuple(msg["key"])
            fn = self.calls[key]
            if not (self.cache_per_run and key[3] in ("adapter", "core")):
                return dict(seconds=timed_run(fn, self.min_seconds))
            from roicore.core import release_output_cache
            try:
                fn()  # untimed: its outputs return to the cache for the timed calls
                return dict(seconds=timed_run(fn, self.min_seconds))
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


def source(framework, threads):
    """The bench source a worker for ``framework`` serves."""
    if framework == "roicore":
        return CoreBench(threads)
    from .frameworks import harness_class
    return FrameworkBench(harness_class(framework)(threads))
