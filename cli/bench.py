"""``roicore bench``: roicore against the native RoI operators, interleaved rounds.

Two modes.  By default every contender (roicore.core in a worker of its own; each
framework's native operators, roicore's adapter for it and roicore.core beside the adapter,
in one worker per framework) runs at the same thread count.  With several thread counts
(``--threads 1,2,4``, or ``--scaling``) roicore.core runs alone at each of them: a sweep.
The feature-pyramid workloads (``--workloads fpn_box,fpn_mask`` or ``--ops
pyramid_roi_align``) take a path of their own, ``_pyramid_bench``: every contender at each
thread count, in either mode.

This module runs the workers and turns their timings into a report (a dict, also the JSON
file); ``_bench_report`` prints it, ``_compare`` judges it against a baseline and
``_plot`` draws it.
"""
from __future__ import annotations

import datetime
import random
import shlex
import statistics
import threading
import time
from types import SimpleNamespace

from . import _bench_report, _compare
from . import cases as K
from . import workloads as WL
from ._bench_worker import RUN_MIN_SECONDS, CoreBench
from ._proc import Worker, WorkerDied
from ._report import (FRAMEWORK_ALIASES, UsageError, environment, log, parse_list, render_text,
                      write_json)

FRAMEWORKS = ("paddle", "mxnet", "openvino", "onnxruntime", "tensorflow", "torch")
# the single-map operators of roicore.core's table, then the pyramid ones (their workloads,
# WL.PYRAMID_WORKLOADS, run only when named, or when --ops names a pyramid operator)
OPS = K.OPS + WL.PYRAMID_OPS
OP_ALIASES = dict(K.OP_ALIASES, multi_scale_roi_align="pyramid_roi_align")
DIRECTIONS = ("forward", "fwd+bwd")
DTYPES = ("float32", "float64")
REPEATS = 5
# --quick: a smoke run of every contender, not a measurement
QUICK = dict(scale=0.03, repeats=3, min_seconds=0.005)
# the convention of each operator's roicore.core row in the native-ratio table
DEFAULT_CONVENTION = {op: CoreBench.RULES[op] for op in K.OPS}
# what the report's rows are judged and compared by: where they ran and what they timed
ROW_KEY = ("workload", "operator", "dtype", "direction", "framework", "kind", "variant",
           "threads")


def row_key(r):
    """A timing row's identity (rows written before dtype and variant existed read as
    float32 and the default variant)."""
    return tuple(r.get(k, {"dtype": "float32", "variant": ""}.get(k)) for k in ROW_KEY)


# ----------------------------------------------------------------------------- arguments
def _threads(text, cpus):
    """``--threads``: None (the CPUs available), N, or a list of counts."""
    from roicore.core._threads import MAX_THREADS
    if text is None:
        return [cpus]
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise UsageError(f"--threads takes a count or a comma-separated list, got {text!r}")
    if not counts or counts[0] < 1:
        raise UsageError(f"--threads must be >= 1, got {text!r}")
    if counts[-1] > MAX_THREADS:
        raise UsageError(f"--threads must be at most {MAX_THREADS}, got {text!r}")
    return counts


def plan(args, cpus):
    """The run ``args`` ask for, checked; UsageError on bad arguments."""
    p = SimpleNamespace(
        ops=parse_list(args.ops, OPS, "operator", OP_ALIASES),
        directions=parse_list(args.directions, DIRECTIONS, "direction", {"backward": "fwd+bwd"}),
        dtypes=parse_list(args.dtypes, DTYPES, "dtype", {"f32": "float32", "f64": "float64"}),
        seed=args.seed, quick=args.quick, min_seconds=RUN_MIN_SECONDS)
    # by default the single-map workloads (unless --ops names none of their operators), and
    # the pyramid ones when --ops names their operator
    single = list(WL.WORKLOADS) if set(K.OPS) & set(p.ops) else []
    pyramid = [wl for wl in WL.PYRAMID_WORKLOADS
               if args.ops is not None and set(WL.ops_for(wl)) & set(p.ops)]
    p.workloads = parse_list(args.workloads, tuple(WL.WORKLOADS) + tuple(WL.PYRAMID_WORKLOADS),
                             "workload") if args.workloads is not None else single + pyramid
    single = [wl for wl in p.workloads if wl in WL.WORKLOADS]
    p.conventions = []
    if args.conventions is not None:
        known = tuple(dict.fromkeys(c for op in K.OPS for c in K.CONVENTIONS[op]))
        p.conventions = (list(known) if args.conventions.strip().lower() == "all"
                         else parse_list(args.conventions, known, "convention"))
    p.scale = args.scale if args.scale is not None else QUICK["scale"] if args.quick else 1.0
    if not 0 < p.scale <= 1:
        raise UsageError(f"--scale must be in (0, 1], got {p.scale:g}")
    p.repeats = args.repeats if args.repeats is not None else (
        QUICK["repeats"] if args.quick else REPEATS)
    if p.repeats < 1:
        raise UsageError(f"--repeats must be >= 1, got {p.repeats}")
    if args.quick:
        p.min_seconds = QUICK["min_seconds"]
    counts = _threads(args.threads, cpus)
    if args.scaling and len(counts) == 1:
        if counts[0] < 2:
            raise UsageError(f"--scaling compares 1 thread with N >= 2 threads; "
                             f"{'--threads is' if args.threads else 'this process may use'} "
                             f"{counts[0]} (pass --threads 2 or more)")
        counts = [1, counts[0]]
    p.sweep = len(counts) > 1
    p.thread_counts, p.threads = counts, counts[-1]
    frameworks = parse_list(args.frameworks, FRAMEWORKS, "framework", FRAMEWORK_ALIASES)
    if args.plot is not None and not single:
        raise UsageError("--plot draws the single-map operators' ratios to roicore.core; the "
                         "pyramid workloads have none: drop --plot")
    if p.sweep and single:
        for flag, value in (("--frameworks", args.frameworks), ("--plot", args.plot)):
            if value is not None:
                raise UsageError(f"a thread sweep times roicore.core alone, against no native "
                                 f"operator; drop {flag}")
    p.frameworks = [] if p.sweep else frameworks
    # the pyramid rows time every contender at each thread count, sweep or not
    from ._pyramid_bench import FRAMEWORKS as PYRAMID_FRAMEWORKS
    p.pyramid_frameworks = [f for f in PYRAMID_FRAMEWORKS if f in frameworks]
    if args.threshold is not None and args.compare is None:
        raise UsageError("--threshold applies to --compare")
    p.threshold = _compare.parse_threshold(args.threshold)
    return p


# ----------------------------------------------------------------------------- workers
def _parallel(fn, items):
    out, threads = {}, []
    for it in items:
        def target(it=it):
            try:
                out[it] = fn(it)
            except WorkerDied as e:
                out[it] = e
        t = threading.Thread(target=target)
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    return out


# roicore.core's output cache in the framework workers (which time the adapters against the
# core in-process): each adapter or core run there starts with an untimed call, whose
# outputs the timed calls then reuse, and ends by releasing the idle blocks.  Kept between
# runs, idle blocks in each of several workers, beside the frameworks' own pools, can run a
# machine out of memory on the largest workloads; a fixed cap instead leaves large outputs
# fresh in every call, timing page faults rather than the adapters.  The roicore worker
# keeps its cache throughout.
def _start_workers(all_names, threads, fw_info):
    workers = {}

    def start(name):
        w = Worker("bench", name, threads=threads, quiet_progress=True)
        return w, w.request(dict(cmd="init", threads=threads, cache_per_run=name != "roicore"))

    for name, res in _parallel(start, all_names).items():
        if isinstance(res, Exception):
            fw_info[name] = dict(status="failed", reason=str(res))
            continue
        w, init = res
        if "version" in init:
            workers[name] = w
            fw_info[name] = dict(status="ran", version=init["version"])
        else:
            w.close()
            fw_info[name] = dict(status="skipped" if "skipped" in init else "failed",
                                 reason=init.get("skipped") or init.get("error"))
            log(f"{name}: {fw_info[name]['status']} ({fw_info[name]['reason']})")
    return workers


def _ms(s):
    return s * 1e3


def _measure(workers, fw_info, p, names):
    """Load each of the workloads ``names`` in every worker, time the contenders in
    interleaved rounds.

    Returns (rows, errors); a worker that dies is closed, removed from ``workers`` and
    marked failed in ``fw_info``.
    """
    rows, errors = [], []

    def died(n, exc):
        """A worker that dies (crash, out-of-memory kill) is reported; the others go on."""
        w = workers.pop(n, None)
        if w is not None:
            w.close()
        why = str(exc)
        if "exit code -9" in why:
            why += " (SIGKILL: out of memory?)"
        fw_info[n].update(status="failed", reason=why, workload=wl)   # the workload loaded
        log(f"{n}: worker died: {why.splitlines()[0]}")

    for wl in names:
        wl_ops = [op for op in WL.ops_for(wl) if op in p.ops]
        # the single-map rows' ratios need roicore.core; the pyramid ones have no core row
        if not wl_ops or not workers or (wl in WL.WORKLOADS and "roicore" not in workers):
            continue
        what = ("and measuring memory of" if wl in WL.WORKLOADS
                else f"at {p.threads} thread(s):")
        log(f"{wl} ({WL.describe(wl, p.scale)}): loading, warming up {what} {', '.join(wl_ops)}")
        msg = dict(cmd="load", workload=wl, ops=wl_ops, directions=p.directions, dtypes=p.dtypes,
                   conventions=p.conventions, scale=p.scale, seed=p.seed,
                   min_seconds=p.min_seconds)
        if p.sweep:
            msg["thread_counts"] = p.thread_counts
        loaded = _parallel(lambda n: workers[n].request(msg), list(workers))
        keys, memory = [], {}
        # in the workers' order (roicore first), not the order they finished loading, so the
        # tables' rows come in the roicore worker's order on every run
        for n in [n for n in workers if n in loaded]:
            res = loaded[n]
            if isinstance(res, Exception):
                died(n, res)
                continue
            if "error" in res:
                errors.append(dict(framework=n, workload=wl, kind=None, error=res["error"]))
                continue
            errors += [dict(e, framework=n, workload=wl) for e in res["errors"]]
            keys += [(n, tuple(k)) for k in res["contenders"]]
            memory.update({(n, tuple(k)): m for k, m in res.get("memory", {}).items()})
        times = {k: [] for k in keys}
        for r in range(p.repeats):
            t0 = time.monotonic()
            # each contender once per round, in a shuffled (seeded) order: a fixed rotation
            # would always time each adapter right after its native op, and the first large
            # allocation after a process frees gigabytes can be the slow one
            order = random.Random(f"{p.seed}/{wl}/{r}").sample(keys, len(keys))
            for n, key in order:
                if n not in workers:
                    continue
                try:
                    times[(n, key)].append(workers[n].request(dict(cmd="run", key=key))["seconds"])
                except WorkerDied as e:
                    died(n, e)
            log(f"{wl}: round {r + 1}/{p.repeats} ({time.monotonic() - t0:.1f} s)")
        unloaded = _parallel(lambda n: workers[n].request(dict(cmd="unload")), list(workers))
        for n, peak in unloaded.items():
            if isinstance(peak, Exception):
                died(n, peak)
                continue
            fw_info[n]["peak_rss_mb"] = round(max(fw_info[n].get("peak_rss_mb", 0),
                                                  peak.get("peak_rss_mb", 0)), 1)
        for (n, key), ts in times.items():
            if not ts:
                continue
            op, dtype, direction, kind, variant, threads = key
            ms = [_ms(t) for t in ts]
            row = dict(workload=wl, operator=op, dtype=dtype, direction=direction, framework=n,
                       kind=kind, variant=variant, threads=threads,
                       median_ms=statistics.median(ms), min_ms=min(ms), max_ms=max(ms),
                       times_ms=ms)
            if n == "roicore":
                row["convention"] = variant or DEFAULT_CONVENTION[op]
            mem = memory.get((n, key))
            if mem:
                row.update(extra_mb=mem["extra"] / 2**20, memory_bytes=dict(mem))
            rows.append(row)
    return rows, errors


# ----------------------------------------------------------------------------- ratios
def per_round(f, *rows):
    """f of the rows' times in each round (rows of one worker, timed in the same rounds);
    f of their medians alone should their round counts differ."""
    times = [r["times_ms"] for r in rows]
    if len({len(t) for t in times}) != 1:
        return [f(*(r["median_ms"] for r in rows))]
    return [f(*ts) for ts in zip(*times)]


def paired(f, *rows):
    """The median over rounds of f of the rows' times in that round, and its range."""
    values = per_round(f, *rows)
    return statistics.median(values), [min(values), max(values)]


def add_ratios(rows):
    """Ratios between rows, added to the rows.

    ``ratio`` on native rows: native / roicore.core, the core timed in the roicore worker
    under its default convention.  On adapter rows, against rows of the adapter's own worker
    (same process, same rounds), each the median over rounds of that round's ratio, since a
    worker's rounds can drift between fast and slow phases that a ratio of two medians would
    take from different rounds; ``*_range`` holds the lowest and highest round:
    ``overhead`` = adapter / roicore.core in that worker (whose median goes in as
    ``core_ms``); ``net_overhead`` = (adapter - autograd) / core, where autograd is the
    framework's own cost around any op of these shapes (``autograd_ms``); ``vs_native`` =
    native / adapter, the framework's own operator against the adapter that replaces it.
    """
    def index(kind):
        return {(r["framework"],) + row_key(r)[:4]: r for r in rows
                if r["kind"] == kind and not r.get("variant")}
    core, autograd, native = index("core"), index("autograd"), index("native")
    for r in rows:
        key = row_key(r)[:4]
        single = ("roicore",) + key[:2] + ("float32",) + key[3:]
        if (r["framework"], r["kind"], r["dtype"]) == ("roicore", "core", "float64") and \
                not r.get("variant") and single in core:
            r["vs_float32"], r["vs_float32_range"] = paired(lambda d, s: d / s, r, core[single])
        if r["kind"] == "native" and ("roicore",) + key in core:
            r["ratio"] = r["median_ms"] / core[("roicore",) + key]["median_ms"]  # > 1: roicore faster
        elif r["kind"] == "adapter" and (r["framework"],) + key in core:
            c = core[(r["framework"],) + key]
            r["core_ms"] = c["median_ms"]
            r["overhead"], r["overhead_range"] = paired(lambda a, c: a / c, r, c)
            g = autograd.get((r["framework"],) + key)
            if g is not None:
                r["autograd_ms"] = g["median_ms"]
                r["net_overhead"], r["net_overhead_range"] = paired(
                    lambda a, c, g: (a - g) / c, r, c, g)
            n = native.get((r["framework"],) + key)
            if n is not None:
                r["vs_native"], r["vs_native_range"] = paired(lambda a, n: n / a, r, n)


# ----------------------------------------------------------------------------- sweep
# On the large workloads, N threads at least this much faster than 1: the sweep checks the
# largest N it timed that has a target.
SCALING_TARGETS = {2: 1.7, 16: 10.0}
LARGE_WORKLOADS = ("fastrcnn_vgg16", "c4_14x14")


def output_elements(wl, op, scale=1.0):
    """K * C_out * PH * PW: the pooled output elements of ``op`` on workload ``wl``."""
    from .cases import POSITION_SENSITIVE
    N, C, H, W, R, P, kind, s = WL.shape(wl, scale)
    return R * (C // (P * P) if op in POSITION_SENSITIVE else C) * P * P


def input_elements(wl, scale=1.0):
    N, C, H, W = WL.shape(wl, scale)[:4]
    return N * C * H * W


def scaling_target_threads(counts):
    """The largest thread count in ``counts`` that has a scaling target, or None."""
    return max((n for n in SCALING_TARGETS if n in counts), default=None)


def sweep_rows(rows, counts, scale):
    """One summary per (workload, op, dtype, direction, variant) from roicore.core's timing
    rows at each thread count in ``counts``: medians, speedups over the first count (each
    round's own too: every round times every count), ns per output element, extra memory,
    and whether the scaling target holds (full-size large workloads, 1 and 2 threads)."""
    by = {}
    for r in rows:
        k = (r["workload"], r["operator"], r.get("dtype", "float32"), r["direction"],
             r.get("variant", ""))
        by.setdefault(k, {})[r["threads"]] = r
    out = []
    for (wl, op, dtype, d, variant), got in by.items():
        if any(n not in got for n in counts):
            continue
        at = [got[n] for n in counts]
        elems = output_elements(wl, op, scale)
        s = dict(workload=wl, operator=op, dtype=dtype, direction=d, variant=variant,
                 convention=at[0].get("convention"), threads=list(counts), ms=[r["median_ms"] for r in at],
                 min_ms=[r["min_ms"] for r in at], max_ms=[r["max_ms"] for r in at],
                 speedup=[at[0]["median_ms"] / r["median_ms"] for r in at],
                 round_speedups=[per_round(lambda a, b: a / b, at[0], r) for r in at],
                 output_elements=elems, input_elements=input_elements(wl, scale),
                 ns_per_element=[r["median_ms"] * 1e6 / elems if elems else None for r in at],
                 extra_mb=[r.get("extra_mb") for r in at],
                 memory_bytes=[r.get("memory_bytes") for r in at])
        n = scaling_target_threads(counts)
        if wl in LARGE_WORKLOADS and scale == 1 and counts[0] == 1 and n is not None:
            s["meets_target"] = s["speedup"][counts.index(n)] >= SCALING_TARGETS[n]
        out.append(s)
    return out


# What a pass that only moves memory gets from more threads: the ceiling for the passes
# bound by bandwidth (the forwards' write-out of outputs far larger than the caches, the
# max-pool backward's reads of gradient and argmax).  It also moves with whatever else the
# machine is doing, so the bench measures it next to the speedups it bounds.
BANDWIDTH_BYTES = 256 << 20


def memory_bandwidth(counts, repeats, nbytes=BANDWIDTH_BYTES):
    """GB/s of one pass over `nbytes` (far more than the caches hold) for each kind of
    traffic the bandwidth probe makes (its PROBE_MODES) at each thread count, interleaved
    rounds, medians."""
    import numpy as np
    from . import _bandwidth
    kinds = _bandwidth.PROBE_MODES
    buf = np.ones(nbytes, np.uint8)  # touched, so no pass pays its page faults
    times = {(kind, n): [] for kind in kinds for n in counts}
    for _ in range(max(repeats, 3)):
        for kind, mode in kinds.items():
            for n in counts:
                t0 = time.perf_counter()
                _bandwidth.bandwidth_probe(buf, mode, n)
                times[(kind, n)].append(time.perf_counter() - t0)
    rows = []
    for kind in kinds:
        gbps = [nbytes / statistics.median(times[(kind, n)]) / 1e9 for n in counts]
        rows.append(dict(kind=kind, bytes=nbytes, threads=list(counts), gb_per_s=gbps,
                         speedup=[g / gbps[0] for g in gbps],
                         times_ms=[[_ms(t) for t in times[(kind, n)]] for n in counts]))
    return rows


# ----------------------------------------------------------------------------- run
def _workload_shapes(names, scale):
    def shape(wl):
        if wl in WL.PYRAMID_WORKLOADS:
            return dict(zip(("N", "C", "image", "strides", "R", "P"), WL.pyramid_shape(wl, scale)),
                        maps=WL.pyramid_map_shapes(wl, scale), kind="pyramid")
        return dict(zip(("N", "C", "H", "W", "R", "P", "kind", "spatial_scale"),
                        WL.shape(wl, scale)))
    return {wl: shape(wl) for wl in names}


def measure(p, env):
    """Run the workers for plan ``p``; the report (without its outputs)."""
    t_start = time.monotonic()
    single = [wl for wl in p.workloads if wl in WL.WORKLOADS]
    pyramid = [wl for wl in p.workloads if wl in WL.PYRAMID_WORKLOADS]
    log(f"bench: {'roicore.core alone at ' if p.sweep and single else ''}"
        f"{','.join(map(str, p.thread_counts))} thread(s), {p.repeats} round(s), "
        f"workloads {', '.join(p.workloads)}" + (f", scale {p.scale:g}" if p.scale != 1 else ""))
    fw_info, rows, errors = {}, [], []
    if single or not pyramid:
        all_names = ["roicore"] + p.frameworks
        started = _start_workers(all_names, p.threads, fw_info)
        # in the order asked for, not the order they started in: the report's rows and
        # columns come in the same order on every run
        workers = {n: started[n] for n in all_names if n in started}
        fw_info = {n: fw_info[n] for n in all_names}
        if "roicore" not in workers:
            raise WorkerDied(f"the roicore worker failed: {fw_info['roicore']['reason']}")
        try:
            rows, errors = _measure(workers, fw_info, p, single)
        finally:   # each waits for its process to exit: together, not one after the other
            _parallel(lambda n: workers[n].close(), list(workers))
    if pyramid:   # workers of their own, after the single-map ones have exited
        from . import _pyramid_bench
        got, failed = _pyramid_bench.measure(p, fw_info, pyramid)
        rows += got
        errors += failed
    report = dict(command="bench", mode="sweep" if p.sweep else "compare", environment=env,
                  threads=p.threads, thread_counts=p.thread_counts, repeats=p.repeats,
                  scale=p.scale, quick=p.quick, min_run_seconds=p.min_seconds,
                  dtypes=p.dtypes, conventions=p.conventions,
                  default_conventions=DEFAULT_CONVENTION,
                  workloads=_workload_shapes(p.workloads, p.scale), frameworks=fw_info,
                  results=rows, errors=errors)
    single_rows = [r for r in rows if r["workload"] in WL.WORKLOADS]
    if p.sweep:
        report["scaling"] = sweep_rows(single_rows, p.thread_counts, p.scale)
        n = scaling_target_threads(p.thread_counts) or max(SCALING_TARGETS)
        report["target"] = dict(speedup=SCALING_TARGETS[n], threads=n,
                                workloads=list(LARGE_WORKLOADS))
        if single:
            log("measuring memory bandwidth")
            report["bandwidth"] = memory_bandwidth(p.thread_counts, p.repeats)
    else:
        add_ratios(single_rows)
    report["seconds"] = time.monotonic() - t_start
    return report


def failed(report):
    """Whether a worker, or one of roicore's own contenders, failed (exit status 1)."""
    return (any(i["status"] == "failed" for i in report["frameworks"].values())
            or any(e.get("kind") != "native" for e in report["errors"]))


def run(args):
    env = environment()
    p = plan(args, env["cpus"])
    baseline = _compare.load(args.compare, p) if args.compare else None
    if args.plot:
        from . import _plot
        _plot.require()
    try:
        report = measure(p, env)
    except WorkerDied as e:   # the roicore worker's: nothing to report
        log(str(e))
        return 1
    report["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    report["command_line"] = shlex.join(["roicore"] + args.argv)
    if baseline is not None:
        report["compare"] = _compare.compare(report, baseline, p.threshold)
    blocks = _bench_report.blocks(report)
    print(render_text(blocks))
    if args.json:
        write_json(args.json, report)
    if args.markdown:
        _bench_report.write_markdown(args.markdown, report, blocks)
    if args.csv:
        _bench_report.write_csv(args.csv, report)
    if args.plot:
        _plot.plot(report, args.plot)
        print(f"plot written to {args.plot}")
    regressed = baseline is not None and report["compare"]["regressions"]
    return 1 if failed(report) or regressed else 0
