"""``roicore bench`` rows for RoIAlign from a feature pyramid (FPN): the pyramid workloads.

The single-map bench times each operator of roicore.core's table against the frameworks'
own; a pyramid operator takes a list of maps and has other contenders, so its rows take a
path of their own through the same workers and interleaved rounds:

- "fused": ``roicore.adapters.torch.MultiScaleRoIAlign`` (levels and pooling in one call);
- "torchvision": ``torchvision.ops.MultiScaleRoIAlign``, the module the fused one replaces;
- "per-level loop": torchvision's loop on roicore (levels from
  ``roicore.core.pyramid_levels``, a zeroed output, ``roicore.adapters.torch.roi_align`` per
  level and an index scatter), what the fused op saves over roicore's single-map op;
- "openvino": OpenVINO's ExperimentalDetectronROIFeatureExtractor on its CPU plugin
  (forward only, one image).

Every contender runs at the same thread count; with several counts (``--threads 1,2``) the
workers are started afresh at each.  Each row carries ``vs_fused``, its time over the fused
op's.  This module holds both sides: the workers' contenders (``load``) and the parent's
run, ratios and tables.
"""
from __future__ import annotations

import statistics
from types import SimpleNamespace

import numpy as np

from . import workloads as WL

OP = WL.PYRAMID_OPS[0]
# the frameworks whose workers time pyramid contenders, in the report's order
FRAMEWORKS = ("torch", "openvino")
# (framework, kind, variant) of each contender, in the table's order, and its column
FUSED = ("torch", "adapter", "")
CONTENDERS = {FUSED: "fused", ("torch", "native", ""): "torchvision",
              ("torch", "adapter", "loop"): "per-level loop",
              ("openvino", "native", ""): "openvino"}


def is_pyramid(row):
    return row["workload"] in WL.PYRAMID_WORKLOADS


# ----------------------------------------------------------------------------- worker side
def per_level_loop(torch, roi_align, pyramid_levels, scales, output_size, sampling_ratio,
                   aligned, n_threads):
    """torchvision's ``MultiScaleRoIAlign`` loop on roicore's single-map operator:
    ``run(features, boxes)`` with the maps finest first and one (L, 4) box tensor per
    image."""
    size = tuple(output_size)

    def run(features, boxes):
        concat = torch.cat(boxes)
        ids = torch.cat([torch.full_like(b[:, :1], i) for i, b in enumerate(boxes)])
        rois = torch.cat([ids, concat], 1)
        dtype = np.float64 if concat.dtype == torch.float64 else np.float32
        levels = torch.from_numpy(pyramid_levels(concat.numpy(), scales, dtype=dtype))
        result = torch.zeros((len(rois), features[0].shape[1]) + size, dtype=features[0].dtype)
        for level, (feature, scale) in enumerate(zip(features, scales)):
            idx = torch.where(levels == level)[0]
            result[idx] = roi_align(feature, rois[idx], size, scale, sampling_ratio, aligned,
                                    n_threads=n_threads)
        return result
    return run


def torch_calls(h, case, dy, n):
    """{(kind, variant): (forward, forward_backward)} of the torch contenders; forward()
    -> y, forward_backward() -> (y, [gradient of each map])."""
    import torchvision
    from roicore import core
    torch, adapter = h.torch, h.adapter
    maps = [torch.from_numpy(m) for m in case["maps"]]
    N = maps[0].shape[0]
    boxes = [torch.from_numpy(np.ascontiguousarray(case["boxes"][case["batch"] == i]))
             for i in range(N)]
    images = [tuple(case["image_size"])] * N
    names = [f"p{s}" for s in case["strides"]]
    P, sr, g = case["output_size"], case["sampling_ratio"], torch.from_numpy(dy)
    if case["aligned"]:
        raise ValueError("torchvision's MultiScaleRoIAlign pools with aligned=False")

    def module(m):
        return lambda xs: m(dict(zip(names, xs)), boxes, images)
    loop = per_level_loop(torch, adapter.roi_align, core.pyramid_levels, case["scales"], P, sr,
                          case["aligned"], n)
    fns = {("native", ""): module(torchvision.ops.MultiScaleRoIAlign(names, P, sr)),
           ("adapter", ""): module(adapter.MultiScaleRoIAlign(names, P, sr, n_threads=n)),
           ("adapter", "loop"): lambda xs: loop(xs, boxes)}

    def passes(fn):
        def forward():
            with torch.no_grad():
                return fn(maps)

        def forward_backward():
            xs = [m.detach().requires_grad_(True) for m in maps]
            y = fn(xs)
            y.backward(g)
            # a level no box reads may get no gradient at all
            return y.detach(), [x.grad if x.grad is not None else torch.zeros_like(x)
                                for x in xs]
        return forward, forward_backward
    return {k: passes(fn) for k, fn in fns.items()}


def openvino_calls(h, case, dy, n):
    """{("native", ""): (forward, None)}: ExperimentalDetectronROIFeatureExtractor (opset6)
    compiled for the CPU plugin with the harness's configuration (its thread count)."""
    from openvino.utils.node_factory import NodeFactory

    from .frameworks import Unsupported
    maps, boxes = case["maps"], case["boxes"]
    if maps[0].dtype != np.float32:
        raise Unsupported(f"OpenVINO's CPU plugin is run in float32 only, not {maps[0].dtype}")
    if maps[0].shape[0] != 1:
        raise Unsupported("ExperimentalDetectronROIFeatureExtractor pools one image")
    PH, PW = case["output_size"]
    if PH != PW:
        raise Unsupported("ExperimentalDetectronROIFeatureExtractor pools to a square")
    o1 = h.opset1
    rois = o1.parameter(list(boxes.shape), np.float32)
    params = [o1.parameter(list(m.shape), np.float32) for m in maps]
    node = NodeFactory("opset6").create(
        "ExperimentalDetectronROIFeatureExtractor",
        [rois.output(0)] + [p.output(0) for p in params],
        {"output_size": PH, "sampling_ratio": case["sampling_ratio"],
         "pyramid_scales": list(case["strides"]), "aligned": case["aligned"]})
    model = h.ov.Model([node.output(0)], [rois] + params)
    request = h.core.compile_model(model, "CPU", h.config).create_infer_request()
    feed = [np.ascontiguousarray(boxes)] + maps
    return {("native", ""): (lambda: request.infer(feed)[0], None)}


BUILDERS = {"torch": torch_calls, "openvino": openvino_calls}


def calls(source, case, dy, n):
    """The contenders ``source`` (a bench worker's) times on a pyramid ``case``, as
    :func:`torch_calls`; {} for a source that has none."""
    build = BUILDERS.get(source.name)
    if build is None:
        return {}
    if n != source.harness.threads:
        raise ValueError(f"the {source.name} worker runs at {source.harness.threads} "
                         f"thread(s), not {n}")
    return build(source.harness, case, dy, n)


def load(state, msg):
    """``BenchState.load`` for a pyramid workload: build, warm up and keep in ``state`` (a
    ``BenchState``) the contenders of its source, at the worker's thread count."""
    from ._bench_worker import RUN_MIN_SECONDS, _timer
    from ._proc import error_text
    from .frameworks import F32, Unsupported
    state.calls = {}
    state.min_seconds = msg.get("min_seconds", RUN_MIN_SECONDS)
    errors, n = [], state.threads
    if len(msg.get("thread_counts") or [n]) > 1:
        raise ValueError("pyramid workloads run at one thread count per worker")
    if OP not in msg["ops"] or state.source.name not in BUILDERS:
        return dict(contenders=[], errors=[], memory={})
    case, dy = WL.pyramid_case(msg["workload"], seed=msg.get("seed", 0),
                               scale=msg.get("scale", 1.0))
    for dtype in msg.get("dtypes", [F32]):
        c = dict(case, maps=[m.astype(dtype) for m in case["maps"]],
                 boxes=case["boxes"].astype(dtype))
        try:
            built = calls(state.source, c, dy.astype(dtype), n)
        except Unsupported:
            continue
        except Exception as e:
            errors.append(dict(op=OP, dtype=dtype, direction=None, kind=None, variant="",
                               error=error_text(e)))
            continue
        for (kind, variant), fns in built.items():
            for direction, fn in zip(("forward", "fwd+bwd"), fns):
                if fn is None or direction not in msg["directions"]:
                    continue
                timer = _timer(fn)
                try:
                    timer()                                    # warm-up (and check it runs)
                except Exception as e:
                    errors.append(dict(op=OP, dtype=dtype, direction=direction, kind=kind,
                                       variant=variant, error=error_text(e)))
                    continue
                state.calls[(OP, dtype, direction, kind, variant, n)] = timer
    return dict(contenders=sorted(state.calls), errors=errors, memory={})


# ----------------------------------------------------------------------------- parent side
def _merge(fw_info, info):
    """Worker statuses of one thread count into the report's: a failure anywhere stays."""
    for name, i in info.items():
        old = fw_info.setdefault(name, i)
        if old is i:
            continue
        if i["status"] == "failed" and old["status"] != "failed":
            old.update({k: v for k, v in i.items() if k != "peak_rss_mb"})
        if i.get("peak_rss_mb"):
            old["peak_rss_mb"] = max(old.get("peak_rss_mb", 0), i["peak_rss_mb"])


def measure(p, fw_info, names):
    """Time the pyramid workloads ``names`` of plan ``p``: workers of ``p.pyramid_frameworks``
    started at each of ``p.thread_counts`` in turn, interleaved rounds at each.  Returns
    (rows, errors) with ``vs_fused`` added; ``fw_info`` gets the workers' statuses."""
    from .bench import _measure, _parallel, _start_workers
    names = [wl for wl in names if set(WL.ops_for(wl)) & set(p.ops)]
    rows, errors = [], []
    if not names or not p.pyramid_frameworks:
        return rows, errors
    for n in p.thread_counts:
        info = {}
        started = _start_workers(p.pyramid_frameworks, n, info)
        workers = {name: started[name] for name in p.pyramid_frameworks if name in started}
        at = SimpleNamespace(**dict(vars(p), sweep=False, threads=n))
        try:
            got, failed = _measure(workers, info, at, names)
        finally:
            _parallel(lambda name: workers[name].close(), list(workers))
        rows += got
        errors += failed
        _merge(fw_info, {name: info[name] for name in p.pyramid_frameworks})
    add_ratios(rows)
    return rows, errors


def _contender(r):
    return (r["framework"], r["kind"], r.get("variant", ""))


def add_ratios(rows):
    """``vs_fused`` on every pyramid row but the fused op's: its time / the fused op's at the
    same workload, dtype, direction and thread count (> 1: the fused op is faster).  Rows of
    the fused op's worker take the median of the rounds' ratios (both timed in each round,
    in one process) and ``vs_fused_range`` their lowest and highest; rows of another worker
    (OpenVINO) take the ratio of the medians."""
    from .bench import paired

    def where(r):
        return (r["workload"], r.get("dtype", "float32"), r["direction"], r["threads"])
    fused = {where(r): r for r in rows if is_pyramid(r) and _contender(r) == FUSED}
    for r in rows:
        f = fused.get(where(r)) if is_pyramid(r) else None
        if f is None or r is f:
            continue
        if r["framework"] == f["framework"]:
            r["vs_fused"], r["vs_fused_range"] = paired(lambda a, b: a / b, r, f)
        else:
            r["vs_fused"] = r["median_ms"] / f["median_ms"]


# ----------------------------------------------------------------------------- report
def blocks(report, alone):
    """The pyramid rows' table and notes; ``alone``: the report has no single-map rows, so
    the notes also give the workers' statuses, the errors and the peak memory."""
    from ._bench_report import _errors
    from ._report import Note, Text
    rows = [r for r in report["results"] if is_pyramid(r)]
    out = _table(report, rows) if rows else []
    if alone:
        for name, i in report["frameworks"].items():
            if i["status"] != "ran":
                at = f" at {i['workload']}" if i.get("workload") else ""
                out.append(Text(f"  {name}: {i['status'].upper()}{at}: "
                                f"{str(i['reason']).strip().splitlines()[0]}"))
        out += _errors(report)
        if rows:
            out.append(Note(f"each round times each contender's call repeated for at least "
                            f"{report['min_run_seconds']:g} s (median call); slower calls run "
                            "once per round"))
        rss = ", ".join(f"{n} {i['peak_rss_mb']:.0f} MB" for n, i in report["frameworks"].items()
                        if i.get("peak_rss_mb"))
        if rss:
            out.append(Text(f"  peak RSS per worker: {rss}"))
    return out


def _table(report, rows):
    from ._bench_report import _spread, row_ms
    from ._report import Note, Table, Text
    spread = _spread(report)
    dtypes = len({r["dtype"] for r in rows}) > 1
    counts = len({r["threads"] for r in rows}) > 1
    by = {}
    for r in rows:
        key = ((r["workload"],) + ((r["dtype"],) if dtypes else ()) + (r["direction"],)
               + ((r["threads"],) if counts else ()))
        by.setdefault(key, {})[_contender(r)] = r
    # each workload's rows together, a direction's thread counts next to each other
    order = {wl: i for i, wl in enumerate(report["workloads"])}
    by = dict(sorted(by.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1:])))
    others = [c for c in CONTENDERS if c != FUSED and any(c in got for got in by.values())]
    table = []
    for key, got in by.items():
        f = got.get(FUSED)
        line = list(key) + [row_ms(f, spread) if f else "-"]
        for c in others:
            r = got.get(c)
            if r is None or "vs_fused" not in r:
                line.append(row_ms(r, spread) if r else "-")
                continue
            line.append(f"{r['vs_fused']:.2f}x {row_ms(r, spread)}")
        table.append(line)
    head = (["workload"] + (["dtype"] if dtypes else []) + ["direction"]
            + (["threads"] if counts else []) + ["fused ms"] + [CONTENDERS[c] for c in others])
    labels = 2 + dtypes + counts
    out = [Text(""), Table(
        f"{OP}, feature pyramids: contender time / fused time (> 1: the fused op faster); "
        f"then milliseconds, the median of {report['repeats']} round(s)"
        + (" [fastest, slowest]" if spread else ""),
        head, table, "l" * labels + "r" * (len(head) - labels))]
    out += [Text(""), Note(
        "pyramid rows: fused = roicore.adapters.torch.MultiScaleRoIAlign (levels and pooling "
        "in one call); torchvision = torchvision.ops.MultiScaleRoIAlign (LevelMapper, zeroed "
        "output, roi_align per level, index scatter); per-level loop = that loop on roicore "
        "(levels from roicore.core.pyramid_levels, torch.zeros, roicore.adapters.torch."
        "roi_align per level, index_put); openvino = ExperimentalDetectronROIFeatureExtractor "
        "(opset6) on the CPU plugin, forward only, its own level rule (the same levels on "
        "these boxes); sampling_ratio 2, aligned=False; fwd+bwd: the maps' gradients through "
        "torch autograd"),
        Note("the torch contenders run in one worker, each round timing every one of them, so "
             "their ratios are the median of the rounds' ratios (their range is in the JSON "
             "report, vs_fused_range); OpenVINO's runs in a worker of its own, its ratio is of "
             "the medians" + (
                 "; every contender runs at each thread count, its workers started afresh"
                 if counts else ""))]
    return out
