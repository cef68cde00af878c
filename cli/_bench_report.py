"""The bench report as tables and notes (printed, or written as Markdown), and as CSV."""
from __future__ import annotations

import csv

from . import workloads as WL
from ._report import Note, Table, Text, machine, render_markdown
from .cases import OPS as ORDER


# ----------------------------------------------------------------------------- cells
def fmt_ms(ms):
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def fmt_mb(mb):
    if mb is None:
        return "-"
    return f"{mb:.3g}" if abs(mb) < 100 else f"{mb:.0f}"


def ms_cell(median, lo, hi, rounds):
    """Median ms, and the fastest and slowest round in brackets when there are several."""
    return fmt_ms(median) + (f" [{fmt_ms(lo)}, {fmt_ms(hi)}]" if rounds > 1 else "")


def row_ms(r, spread=True):
    return ms_cell(r["median_ms"], r["min_ms"], r["max_ms"], len(r["times_ms"]) if spread else 1)


def ratio_cell(value, spread, digits=2, unit=""):
    """The value, and its range in brackets; ``spread`` None: the value alone."""
    text = f"{value:.{digits}f}{unit}"
    if spread is None or spread[0] == spread[1]:
        return text
    return text + f" [{spread[0]:.{digits}f}{unit}, {spread[1]:.{digits}f}{unit}]"


# ----------------------------------------------------------------------------- labels
def _several(report, field):
    return len({r.get(field) for r in report["results"]}) > 1


def _labels(report):
    """The label columns rows are told apart by: workload, op, [dtype,] direction."""
    cols = [("workload", "workload"), ("operator", "op")]
    if _several(report, "dtype"):
        cols.append(("dtype", "dtype"))
    cols.append(("direction", "direction"))
    return cols


def _groups(rows, fields):
    """{label tuple: {(framework, kind, variant): row}}, in the rows' order."""
    by = {}
    for r in rows:
        by.setdefault(tuple(r.get(f) for f in fields), {})[
            (r["framework"], r["kind"], r.get("variant", ""))] = r
    return by


def _heading(report, what):
    env = report["environment"]
    head = f"roicore {env['roicore']} bench{what}: {machine(env)}"
    vers = [f"{n} {i['version']}" for n, i in report["frameworks"].items() if i.get("version")]
    lines = [Text(head),
             Text("versions: " + ", ".join(vers) + f", numpy {env['numpy']}, python {env['python']}"
                  + f", OpenMP {'on' if env.get('openmp', True) else 'OFF (sequential build)'}")]
    if report["scale"] != 1:
        lines.append(Text(f"workloads scaled down by {report['scale']:g} (boxes and channels):"
                          + (" a smoke run of every contender, not a measurement"
                             if report.get("quick") else "")))
    lines += [Text(f"  {wl}: {WL.describe(wl, report['scale'])}") for wl in report["workloads"]]
    return lines


def _errors(report):
    out = []
    for e in report["errors"]:
        what = "/".join(str(e[k]) for k in ("op", "dtype", "direction", "kind", "variant", "what")
                        if e.get(k))
        first = (e["error"].strip().splitlines() or [""])[0]
        out.append(Text(f"  error: {e['framework']} {e['workload']} {what}: {first[:200]}"))
    return out


# ----------------------------------------------------------------------------- compare mode
def _spread(report):
    """Whether cells show their rounds' range: not for --quick, a smoke run whose ranges
    mean nothing (and whose every framework would widen the table past a terminal)."""
    return not report.get("quick")


def _main_table(report, labels, by):
    natives = [n for n, i in report["frameworks"].items() if n != "roicore" and i.get("version")]
    spread = _spread(report)
    rows = []
    for key, got in by.items():
        c = got.get(("roicore", "core", ""))
        row = list(key) + [row_ms(c, spread) if c else "-",
                           fmt_mb(c.get("extra_mb")) if c else "-"]
        for n in natives:
            r = got.get((n, "native", ""))
            row.append(f"{r['ratio']:.1f}x {row_ms(r, spread)}" if r and "ratio" in r else "-")
        rows.append(row)
    return Table(f"native time / roicore.core time (> 1: roicore faster); then milliseconds, "
                 f"the median of {report['repeats']} round(s)"
                 + (" [fastest, slowest]" if spread else ""),
                 [h for _, h in labels] + ["roicore ms", "extra MB"] + natives, rows,
                 "l" * len(labels) + "rr" + "r" * len(natives))


def _adapter_columns(by):
    """(framework, variant) of every adapter, in order of appearance."""
    return list(dict.fromkeys((fw, v) for got in by.values() for fw, k, v in got if k == "adapter"))


def _adapter_table(report, labels, by):
    """One line per adapter and workload row: its time against roicore.core in its own
    process, net of the framework's autograd, and against the framework's own operator."""
    cols = _adapter_columns(by)
    spread = _spread(report)

    def ratio(r, field, **kw):
        return ratio_cell(r[field], r[f"{field}_range"] if spread else None, **kw)

    rows = []
    for key, got in by.items():
        for fw, v in cols:
            r = got.get((fw, "adapter", v))
            if not r or "overhead" not in r:
                continue
            net = r.get("net_overhead")
            rows.append(list(key) + [
                fw + (f" {v}" if v else ""), fmt_ms(r["median_ms"]), fmt_ms(r["core_ms"]),
                ratio(r, "overhead"),
                ratio(r, "net_overhead") if net is not None else "-",
                fmt_ms(r["autograd_ms"]) if "autograd_ms" in r else "-",
                ratio(r, "vs_native", unit="x") if "vs_native" in r else "-"])
    if not rows:
        return []
    return [Text(""), Table(
        "adapters: overhead = adapter time / roicore.core time in the adapter's process; net = "
        "(adapter - autograd) / core; vs native = native time / adapter time in that process "
        "(> 1: the adapter is faster); each the median of the rounds' ratios"
        + (" [lowest, highest]" if spread else ""),
        [h for _, h in labels] + ["adapter", "adapter ms", "core ms", "overhead", "net",
                                  "autograd ms", "vs native"],
        rows, "l" * (len(labels) + 1) + "rrrrrr")]


def _convention_tables(report, labels):
    from .cases import CONVENTIONS
    rows = [r for r in report["results"] if r["framework"] == "roicore" and r["kind"] == "core"]
    out = []
    for op in ORDER:
        convs = [c for c in CONVENTIONS.get(op, ()) if c in report["conventions"]
                 or any(r["operator"] == op and r.get("convention") == c and not r.get("variant")
                        for r in rows)]
        op_rows = [r for r in rows if r["operator"] == op and r.get("convention") in convs]
        if len(convs) < 2 or not op_rows:
            continue
        table = []
        for key, got in _groups(op_rows, [f for f, _ in labels]).items():
            by_conv = {r["convention"]: r for r in got.values()}
            fastest = min(r["median_ms"] for r in by_conv.values())
            table.append(list(key) + [f"{row_ms(by_conv[c])} ({by_conv[c]['median_ms'] / fastest:.2f}x)"
                                      if c in by_conv else "-" for c in convs])
        out += [Text(""), Table(
            f"roicore.core {op} by convention: median ms [fastest, slowest round] (time / the "
            "fastest convention's time)", [h for _, h in labels] + convs, table,
            "l" * len(labels) + "r" * len(convs))]
    return out


def _dtype_table(report):
    """roicore.core's float64 time against its float32 time, where both ran."""
    rows = [r for r in report["results"] if "vs_float32" in r]
    if not rows:
        return []
    single = {(r["workload"], r["operator"], r["direction"]): r for r in report["results"]
              if r["framework"] == "roicore" and r["kind"] == "core" and not r.get("variant")
              and r["dtype"] == "float32"}
    table = [[r["workload"], r["operator"], r["direction"],
              row_ms(single[(r["workload"], r["operator"], r["direction"])]), row_ms(r),
              ratio_cell(r["vs_float32"], r["vs_float32_range"], unit="x")] for r in rows]
    return [Text(""), Table(
        "roicore.core in float64 against float32: float64 time / float32 time, median of the "
        "rounds' ratios [lowest, highest]",
        ["workload", "op", "direction", "float32 ms", "float64 ms", "float64 / float32"],
        table, "lllrrr")]


def _compare_notes(report):
    from .frameworks import harness_class
    out = [Text("")]
    for n, i in report["frameworks"].items():
        if n == "roicore":
            continue
        if i["status"] == "ran" or i.get("version"):
            out.append(Text(f"  {n}: {harness_class(n).native_text}"))
        if i["status"] != "ran":
            at = f" at {i['workload']}" if i.get("workload") else ""
            out.append(Text(f"  {n}: {i['status'].upper()}{at}: "
                            f"{str(i['reason']).strip().splitlines()[0]}"))
    out += _errors(report)
    conv = ", ".join(f"{c} ({op})" for op, c in report["default_conventions"].items())
    out.append(Note("roi_align: sampling_ratio 2, aligned=True; roi_pool_bilinear: the same "
                    "boxes normalised as crop_and_resize takes them; fwd+bwd: forward recorded "
                    f"for autograd + backward; roicore.core: conventions {conv}"))
    return out


def _run_notes(report, adapters):
    out = []
    if adapters:
        out.append(Note(
            "adapter overhead: the adapter and the bare roicore.core call it makes (same "
            "workload, thread count and conventions as the adapter: paddle's for paddle, "
            "mxnet's for mxnet and tensorflow (per-plane argmax), torchvision's for torch, "
            "with the argmax a gradient "
            "needs) are timed in the same worker process, interleaved in every round, and each "
            "ratio is the median of the rounds' ratios (a round's two calls run next to each "
            "other); the roicore ms column above comes from the separate roicore worker.  "
            "Output cache: the default; in framework workers each adapter or core run starts "
            "with an untimed call, whose outputs the timed calls reuse, and releases the idle "
            "blocks after.  net = (adapter - autograd) / core, where autograd is a null op of "
            "the adapter's shapes (forward returns a ready output, backward a ready input "
            "gradient) recorded and differentiated as the adapter is: what the framework "
            "spends around any op of these shapes, native ones included (Paddle, for one, "
            "copies the upstream gradient into fresh memory).  An adapter named with a layout "
            "(tensorflow NHWC) takes and returns tensors in that layout, the others in NCHW"))
    out.append(Note(f"each round times each contender's call repeated for at least "
                    f"{report['min_run_seconds']:g} s (median call); slower calls run once per "
                    "round"))
    out.append(Note("extra MB: roicore.core's peak memory beyond its inputs and outputs, from "
                    "tracemalloc during one untimed call (forward: peak - y; fwd+bwd: the larger "
                    "of forward peak - y - argmax and backward peak - dx)"))
    rss = ", ".join(f"{n} {i['peak_rss_mb']:.0f} MB" for n, i in report["frameworks"].items()
                    if i.get("peak_rss_mb"))
    if rss:
        out.append(Text(f"  peak RSS per worker: {rss}"))
    return out


def compare_blocks(report):
    labels = _labels(report)
    by = _groups(report["results"], [f for f, _ in labels])
    threads = report["threads"]
    blocks = _heading(report, f", {threads} thread(s) for every contender") + [Text("")]
    blocks.append(_main_table(report, labels, by))
    blocks += _adapter_table(report, labels, by)
    blocks += _convention_tables(report, labels)
    blocks += _dtype_table(report)
    blocks += _compare_notes(report)
    blocks += _run_notes(report, _adapter_columns(by))
    return blocks


# ----------------------------------------------------------------------------- sweep mode
def sweep_blocks(report):
    counts = report["thread_counts"]
    n = counts[-1]
    labels = [("workload", "workload"), ("operator", "op")]
    if _several(report, "dtype"):
        labels.append(("dtype", "dtype"))
    show_conv = any(s["variant"] for s in report["scaling"])
    t = report["target"]
    show_target = any("meets_target" in s for s in report["scaling"])
    head = ([h for _, h in labels] + (["convention"] if show_conv else []) + ["direction"]
            + [f"ms {c} thr" for c in counts]
            + [f"speedup {c}" if len(counts) > 2 else "speedup" for c in counts[1:]]
            + [f"ns/elem {n} thr", "extra MB"] + ([f"target >= {t['speedup']}x"] if show_target
                                                  else []))
    rows = []
    for s in report["scaling"]:
        row = [s[f] for f, _ in labels]
        if show_conv:
            row.append(s["convention"])
        rounds = len(s["round_speedups"][0])
        row += [s["direction"]] + [ms_cell(m, lo, hi, rounds) for m, lo, hi
                                   in zip(s["ms"], s["min_ms"], s["max_ms"])]
        row += [ratio_cell(sp, (min(rs), max(rs)), unit="x")
                for sp, rs in zip(s["speedup"][1:], s["round_speedups"][1:])]
        ns = s["ns_per_element"][-1]
        row += [f"{ns:.3g}" if ns is not None else "-", fmt_mb(s["extra_mb"][-1])]
        if show_target:
            row.append({True: "met", False: "MISSED"}.get(s.get("meets_target"), "-"))
        rows.append(row)
    width = len(head) - (1 if show_target else 0)
    env = report["environment"]
    blocks = _heading(report, f" --threads {','.join(map(str, counts))}") + [Text(""), Table(
        f"roicore.core alone at {', '.join(map(str, counts))} threads: median ms of "
        f"{report['repeats']} interleaved round(s) [fastest, slowest]; speedup over "
        f"{counts[0]} thread(s) [the rounds' lowest, highest]",
        head, rows, "l" * (len(labels) + show_conv + 1) + "r" * (width - len(labels) - show_conv - 1)
        + ("l" if show_target else ""))]
    blocks.append(Text(""))
    if n > env["cpus"]:
        blocks.append(Note(f"{n} threads on {env['cpus']} available CPU(s): the counts above "
                           f"{env['cpus']} share cores, so their speedups say little"))
    blocks.append(Note(f"speedup = ms at {counts[0]} thread(s) / ms at N threads (the worker's "
                       "idle OpenMP threads sleep: OMP_WAIT_POLICY=PASSIVE)"))
    blocks.append(Note(f"ns/elem = ms at {n} threads / (K * C_out * PH * PW), the pooled output "
                       "elements (fwd+bwd: the same count); work proportional to the input "
                       "(NHWC copy of x, zeroing dx) is not normalised away"))
    blocks.append(Note(f"extra MB = tracemalloc peak of one untimed call at {n} threads minus "
                       "its outputs (forward: y; fwd+bwd: the larger of forward peak - y - argmax "
                       "and backward peak - dx)"))
    goal = (f"scaling target: {t['threads']} threads >= {t['speedup']}x faster than 1 on "
            f"{', '.join(t['workloads'])} at full size")
    met = [s for s in report["scaling"] if "meets_target" in s]
    if met:
        blocks.append(Note(f"{goal}: met by {sum(s['meets_target'] for s in met)} of {len(met)} "
                           f"(lowest {min(s['speedup'][counts.index(t['threads'])] for s in met):.2f}x)"))
    else:
        why = ("the workloads are scaled down" if report["scale"] != 1 else
               f"the sweep has no 1 and {t['threads']} threads"
               if counts[0] != 1 or t["threads"] not in counts else "neither workload ran")
        blocks.append(Note(f"{goal}: not evaluated on this run ({why})"))
    bw = report.get("bandwidth")
    if bw:
        blocks += [Text(""), Table(
            f"memory bandwidth, GB/s, one pass over {bw[0]['bytes'] >> 20} MB",
            ["kind"] + [f"{c} thr" for c in counts]
            + [f"speedup {c}" if len(counts) > 2 else "speedup" for c in counts[1:]],
            [[b["kind"]] + [f"{g:.1f}" for g in b["gb_per_s"]]
             + [f"{sp:.2f}x" for sp in b["speedup"][1:]] for b in bw],
            "l" + "r" * (2 * len(counts) - 1)), Text("")]
        blocks.append(Note("the forwards write outputs of 8 MB or more with streaming stores; a "
                           "pass bound by one of these kinds of traffic cannot scale beyond its "
                           "speedup above"))
    blocks += _errors(report)
    i = report["frameworks"]["roicore"]
    if i["status"] != "ran":
        blocks.append(Text(f"  roicore: {i['status'].upper()}: "
                           f"{str(i['reason']).strip().splitlines()[0]}"))
    if i.get("peak_rss_mb"):
        blocks.append(Text(f"  peak RSS of the roicore worker: {i['peak_rss_mb']:.0f} MB"))
    return blocks


# ----------------------------------------------------------------------------- baseline
def baseline_blocks(report):
    c = report["compare"]
    head = ["workload", "op", "dtype", "direction", "contender", "threads", "baseline ms", "ms",
            "change", "verdict"]
    rows = []
    for r in c["rows"]:
        who = r["framework"] + (" core" if r["kind"] == "core" else " adapter")
        who += f" {r['variant']}" if r["variant"] else ""
        rows.append([r["workload"], r["operator"], r["dtype"], r["direction"], who, r["threads"],
                     ms_cell(r["baseline_ms"], *r["baseline_range_ms"], 2),
                     ms_cell(r["ms"], *r["range_ms"], 2), f"{100 * r['change']:+.1f}%",
                     r["verdict"].upper() if r["verdict"] == "regressed" else r["verdict"]])
    when = ", ".join(x for x in (c["baseline_date"], c["baseline_command"]) if x)
    blocks = [Text(""), Table(
        f"against the baseline {c['baseline']}" + (f" ({when})" if when else "")
        + f": roicore's rows, median ms [fastest, slowest round]; regressed: the fastest round "
        f"now slower than the baseline's slowest by more than {c['threshold_percent']:g}%",
        head, rows, "llllllrrrl")]
    blocks += [Note(n) for n in c["notes"]]
    verdict = (f"{c['regressions']} of {len(rows)} row(s) REGRESSED" if c["regressions"]
               else f"no regression in {len(rows)} row(s)")
    blocks.append(Text(f"compare: {verdict}, {c['faster']} faster (threshold "
                       f"{c['threshold_percent']:g}%)"))
    return blocks


def blocks(report):
    from . import _pyramid_bench as PB
    single = dict(report, results=[r for r in report["results"] if not PB.is_pyramid(r)])
    alone = not single["results"] and any(wl in WL.PYRAMID_WORKLOADS for wl in report["workloads"])
    if alone:   # pyramid workloads only: their table under the heading
        counts = report["thread_counts"]
        out = _heading(report, f", {','.join(map(str, counts))} thread(s) for every contender"
                       + (", each count in turn" if len(counts) > 1 else ""))
    else:
        out = sweep_blocks(single) if report["mode"] == "sweep" else compare_blocks(single)
    out += PB.blocks(report, alone)
    if "compare" in report:
        out += baseline_blocks(report)
    out.append(Text(f"({report['seconds']:.1f} s)"))
    return out


# ----------------------------------------------------------------------------- files
def stamp(report):
    """The Markdown file's header: what ran, where, when, with which versions."""
    env = report["environment"]
    vers = [f"roicore {env['roicore']}", f"numpy {env['numpy']}", f"python {env['python']}"]
    vers += [f"{n} {i['version']}" for n, i in report["frameworks"].items()
             if n != "roicore" and i.get("version")]
    not_run = [f"{n} ({i['status']}" + (f" at {i['workload']}" if i.get("workload") else "")
               + ")" for n, i in report["frameworks"].items() if i["status"] != "ran"]
    lines = ["# roicore bench", "",
             f"- date: {report['date']}",
             f"- machine: {machine(env)}; {env['platform']}",
             f"- versions: {', '.join(vers)}; OpenMP {'on' if env['openmp'] else 'off'}",
             f"- command: `{report['command_line']}`",
             f"- threads: {', '.join(map(str, report['thread_counts']))}; rounds: "
             f"{report['repeats']}; workload scale: {report['scale']:g}"]
    if not_run:
        lines.append(f"- not run, or not to the end: {', '.join(not_run)}")
    return "\n".join(lines) + "\n\n"


def write_markdown(path, report, blocks):
    heading = (f"roicore {report['environment']['roicore']} bench", "versions: ")
    body = [b for b in blocks if not (isinstance(b, Text) and b.startswith(heading))]
    with open(path, "w") as f:
        f.write(stamp(report) + render_markdown(body))


CSV_FIELDS = ("workload", "operator", "dtype", "direction", "framework", "kind", "variant",
              "convention", "threads", "rounds", "median_ms", "min_ms", "max_ms", "ratio", "overhead",
              "net_overhead", "vs_native", "vs_fused", "extra_mb")


def write_csv(path, report):
    """One line per timed contender; ratios where the report has them."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in report["results"]:
            w.writerow(dict(r, rounds=len(r["times_ms"])))
