"""``roicore parity``: roicore's adapters against each framework's own operators."""
from __future__ import annotations

import itertools
import threading
import time

import numpy as np

from . import cases as K
from .cases import TRAIN_STEPS
from ._pyramid_parity_models import MAX_SIZE, MIN_SIZE
from ._proc import Worker, WorkerDied
from .frameworks import NAMES, harness_class, output_channels
from ._report import (FRAMEWORK_ALIASES, UsageError, environment, fmt_diff, log, parse_list,
                      table, write_json)

# the frameworks whose native operators roicore claims to reproduce bit for bit
FRAMEWORKS = tuple(n for n in NAMES if harness_class(n).parity_claims)
DTYPES = ("float32", "float64")


# ----------------------------------------------------------------------------- workers
def _run_framework(fw, cases, dtypes, out, training=()):
    t0 = time.monotonic()
    w = Worker("parity", fw)
    try:
        init = w.request(dict(cmd="init", threads=None))
        if "skipped" in init:   # not installed
            out[fw] = dict(status="skipped", reason=init["skipped"], install=init["install"])
            log(f"{fw}: not installed ({init['skipped']})")
            return
        if "error" in init:
            out[fw] = dict(status="failed",
                           reason=init["error"] + "\n" + init.get("traceback", ""))
            return
        log(f"{fw} {init['version']}: running")
        results = {}
        for cmd, todo in (("parity", cases), ("training", list(training))):
            res = w.request(dict(cmd=cmd, cases=todo, dtypes=dtypes)) if todo else {}
            if "error" in res:
                out[fw] = dict(status="failed", version=init["version"],
                               reason=res["error"] + "\n" + res.get("traceback", ""))
                return
            results[cmd] = res.get("results", [])
        out[fw] = dict(status="ran", version=init["version"], results=results["parity"],
                       training=results["training"], seconds=round(time.monotonic() - t0, 1))
        log(f"{fw}: done in {time.monotonic() - t0:.1f} s")
    except WorkerDied as e:
        out[fw] = dict(status="failed", reason=str(e))
        log(f"{fw}: FAILED: {str(e).splitlines()[0]}")
    finally:
        w.close()


# ----------------------------------------------------------------------------- aggregation
def _new_row(fw, op, dt):
    # convention: the roicore.core convention compared with the native op (None: the adapter)
    return dict(framework=fw, operator=op, dtype=dt,
                convention=harness_class(fw).conventions.get(op), cases=0, skipped=0, elements=0,
                mismatches=0, max_abs_diff=0.0, grad_elements=None, grad_mismatches=None,
                grad_max_abs_diff=None, native_errors=0, roicore_errors=0, both_errors=0,
                mismatching_cases=[], notes=[], details=[])


def _aggregate(fw, results, has_grad):
    rows = {}
    for r in results:
        row = rows.setdefault((r["op"], r["dtype"]), _new_row(fw, r["op"], r["dtype"]))
        for n in r.get("notes", []):
            count, sep, why = n.partition(" box(es) not sent to the native op: ")
            if sep:   # one note per reason, boxes summed over cases
                row.setdefault("_dropped", {})
                row["_dropped"][why] = row["_dropped"].get(why, 0) + int(count)
            elif n not in row["notes"]:
                row["notes"].append(n)
        if "skipped" in r:
            row["skipped"] += 1
            if r["skipped"] not in row["notes"]:
                row["notes"].append(r["skipped"])
            continue
        nat, mine = r["native"], r["roicore"]
        if "error" in nat or "error" in mine:
            if "error" in nat and "error" in mine:
                row["both_errors"] += 1
            elif "error" in nat:
                row["native_errors"] += 1
                row["notes"].append(f"{r['name']}: native raised {nat['error']}")
            else:
                row["roicore_errors"] += 1
                row["mismatching_cases"].append(r["name"])
                row["notes"].append(f"{r['name']}: roicore raised {mine['error']}")
            continue
        row["cases"] += 1
        n, m, d = K.compare(mine["y"], nat["y"])
        row["elements"] += n
        row["mismatches"] += m
        row["max_abs_diff"] = max(row["max_abs_diff"], d)
        detail = dict(case=r["name"], native_shape=list(np.shape(nat["y"])),
                      native_dtype=str(nat["y"].dtype), roicore_shape=list(np.shape(mine["y"])),
                      roicore_dtype=str(mine["y"].dtype), mismatches=m, max_abs_diff=d)
        if has_grad and nat.get("dx") is not None and mine.get("dx") is not None:
            gn, gm, gd = K.compare(mine["dx"], nat["dx"])
            row["grad_elements"] = (row["grad_elements"] or 0) + gn
            row["grad_mismatches"] = (row["grad_mismatches"] or 0) + gm
            row["grad_max_abs_diff"] = max(row["grad_max_abs_diff"] or 0.0, gd)
            detail.update(grad_mismatches=gm, grad_max_abs_diff=gd)
            m += gm
        if m and r["name"] not in row["mismatching_cases"]:
            row["mismatching_cases"].append(r["name"])
        row["details"].append(detail)
    for row in rows.values():
        for why, count in row.pop("_dropped", {}).items():
            row["notes"].append(f"{count} box(es) not sent to the native op: {why}")
        row["bit_exact"] = (row["mismatches"] == 0 and not row["grad_mismatches"]
                            and row["roicore_errors"] == 0)
        row["ok"] = row["bit_exact"]
        row["mismatching_cases"] = row["mismatching_cases"][:20]
    return list(rows.values())


def _training_row(fw, r):
    """A training run's row: the first step at which roicore's run departs from the
    native one (loss or weight not bit-identical), or None."""
    row = dict(framework=fw, operator=r["op"], dtype=r["dtype"], mode=r["mode"],
               steps=r["steps"], identical_steps=0, loss_max_abs_diff=None,
               weight_max_abs_diff=None, error=None)
    nat, mine = r["native"], r["roicore"]
    if "error" in mine:
        row["error"] = f"roicore raised {mine['error']}"
        row["ok"] = False
        return row
    if "error" in nat:   # nothing to compare with; roicore's run is not judged
        row["error"] = f"native raised {nat['error']}"
        row["ok"] = True
        return row
    for i in range(r["steps"]):
        _, ml, _ = K.compare(mine["loss"][i:i + 1], nat["loss"][i:i + 1])
        _, mw, _ = K.compare(mine["weight"][i:i + 1], nat["weight"][i:i + 1])
        if ml or mw:
            break
        row["identical_steps"] += 1
    row["loss_max_abs_diff"] = K.compare(mine["loss"], nat["loss"])[2]
    row["weight_max_abs_diff"] = K.compare(mine["weight"], nat["weight"])[2]
    row["ok"] = row["identical_steps"] == r["steps"]
    return row


MODEL_PARTS = ("eval", "losses", "gradients")


def _model_row(fw, r):
    """A model row: a detector with roicore's poolers against the unchanged one.  OK when
    roicore's poolers ran and the eval outputs, the losses and every gradient are
    bit-identical; as in the training rows, a native failure leaves roicore's unjudged."""
    row = dict(framework=fw, model=r["model"], operator=r["op"], dtype=r["dtype"],
               detections=r.get("detections"), roicore_calls=r.get("roicore_calls", 0),
               error=None, **{p: r.get(p) for p in MODEL_PARTS})
    if r.get("error"):
        row["error"], row["ok"] = r["error"], False
    elif r.get("roicore_error"):
        row["error"], row["ok"] = f"roicore raised {r['roicore_error']}", False
    elif r.get("native_error"):
        row["error"], row["ok"] = f"native raised {r['native_error']}", True
    elif not row["roicore_calls"]:
        row["error"], row["ok"] = "roicore's poolers were never called", False
    else:
        row["ok"] = all(row[p]["mismatches"] == 0 and row[p]["elements"] > 0
                        for p in MODEL_PARTS)
    return row


# ----------------------------------------------------------------------------- roicore alone
def _core_run(c, dt, conv):
    """Forward and backward of roicore.core with one convention; (y, dx)."""
    from roicore.core import operators
    v = operators.variant(c["op"])
    x = c["x"].astype(dt)
    rois = c["rois"].astype(dt)
    size, s = c["output_size"], c["spatial_scale"]
    dy = np.random.default_rng(c["seed"]).standard_normal(
        (rois.shape[0], output_channels(c)) + tuple(size)).astype(dt)
    options = v.options(sampling_ratio=c["sampling_ratio"], aligned=c["aligned"])
    y, saved = v.forward(x, rois, size, s, saving=True, convention=conv, **options)
    return y, v.backward(dy, rois, x.shape, s, saved, convention=conv, **options)


def conventions_table(cases, ops, dtypes):
    rows = []
    for op in ops:
        if op not in K.CONVENTIONS:   # the pyramid operators: one convention each here
            continue
        op_cases = [c for c in cases if c["op"] == op]
        if not op_cases:
            continue
        for dt in dtypes:
            runs = {}
            for conv in K.CONVENTIONS[op]:
                runs[conv] = []
                for c in op_cases:
                    try:
                        runs[conv].append(_core_run(c, dt, conv))
                    except Exception as e:  # noqa: BLE001
                        runs[conv].append(e)
            for a, b in itertools.combinations(K.CONVENTIONS[op], 2):
                row = dict(operator=op, dtype=dt, a=a, b=b, cases=0, elements=0, mismatches=0,
                           max_abs_diff=0.0, grad_mismatches=0, grad_max_abs_diff=0.0,
                           differing_cases=[], errors=0)
                for c, ra, rb in zip(op_cases, runs[a], runs[b]):
                    if isinstance(ra, Exception) or isinstance(rb, Exception):
                        row["errors"] += 1
                        continue
                    row["cases"] += 1
                    n, m, d = K.compare(ra[0], rb[0])
                    _, gm, gd = K.compare(ra[1], rb[1])
                    row["elements"] += n
                    row["mismatches"] += m
                    row["max_abs_diff"] = max(row["max_abs_diff"], d)
                    row["grad_mismatches"] += gm
                    row["grad_max_abs_diff"] = max(row["grad_max_abs_diff"], gd)
                    if m or gm:
                        row["differing_cases"].append(c["name"])
                rows.append(row)
    return rows


def golden_check(cases, dtypes):
    """roicore.core against the published values, every convention of the operator."""
    out = []
    for c in cases:
        if "expected" not in c:
            continue
        for conv in c.get("conventions", K.CONVENTIONS[c["op"]]):
            for dt in dtypes:
                y, _ = _core_run(c, dt, conv)
                ok = y.shape == c["expected"].shape and np.allclose(y, c["expected"], atol=1e-4)
                out.append(dict(case=c["name"], operator=c["op"], convention=conv, dtype=dt, ok=bool(ok)))
    return out


# ----------------------------------------------------------------------------- printing
def _frac(m, n):
    return "-" if n is None else f"{m}/{n}"


def print_training(trained):
    print()
    print(f"training: a convolution trained through the op, {TRAIN_STEPS} SGD steps with the "
          "native op and with roicore's\n(loss and weight compared after every step)")
    rows = []
    for r in trained:
        verdict = ("native failed" if r["error"] and r["ok"] else
                   "FAILED" if r["error"] else
                   "bit-identical" if r["ok"] else f"DEPARTS at step {r['identical_steps'] + 1}")
        rows.append([r["operator"], r["framework"], r["dtype"], r["mode"],
                     f"{r['identical_steps']}/{r['steps']}", fmt_diff(r["loss_max_abs_diff"]),
                     fmt_diff(r["weight_max_abs_diff"]), verdict])
    print(table(["operator", "framework", "dtype", "mode", "identical steps", "loss max|diff|",
                 "weight max|diff|", "verdict"], rows, "llllrrrl"))
    for r in trained:
        if r["error"]:
            lines = [ln.strip() for ln in r["error"].splitlines() if ln.strip()]
            print(f"  {r['framework']} {r['operator']} {r['dtype']} {r['mode']}: {lines[0]}"
                  + (f" ... {lines[-1]}" if len(lines) > 1 else ""))


def print_models(models):
    print()
    print(f"models: torchvision detectors (random weights, 2 images, min_size {MIN_SIZE}, "
          f"max_size {MAX_SIZE}) with roi_heads.box_roi_pool\n(and mask_roi_pool) swapped for "
          "roicore.adapters.torch.MultiScaleRoIAlign, against the unchanged model: eval "
          "outputs,\nthen one training step's losses and every parameter's gradient "
          "(mismatching / compared)")
    rows = []
    for r in models:
        parts = [r[p] or {} for p in MODEL_PARTS]
        verdict = ("native failed" if r["error"] and r["ok"] else "FAILED" if r["error"] else
                   "bit-identical" if r["ok"] else "MISMATCH")
        rows.append([r["model"], r["framework"], r["dtype"], str(r["detections"] or "-")]
                    + [_frac(p.get("mismatches"), p.get("elements")) if p else "-"
                       for p in parts]
                    + [fmt_diff(max((p["max_abs_diff"] for p in parts if p), default=None)),
                       verdict])
    print(table(["model", "framework", "dtype", "detections", "eval outputs", "losses",
                 "gradients", "max|diff|", "verdict"], rows, "lllrrrrrl"))
    for r in models:
        bad = [n for p in MODEL_PARTS for n in (r[p] or {}).get("mismatching", [])]
        if bad:
            print(f"  {r['framework']} {r['model']} {r['dtype']}: departs on "
                  f"{', '.join(bad[:8])}")
        if r["error"]:
            lines = [ln.strip() for ln in r["error"].splitlines() if ln.strip()]
            print(f"  {r['framework']} {r['model']} {r['dtype']}: {lines[0]}"
                  + (f" ... {lines[-1]}" if len(lines) > 1 else ""))


def print_report(report, inputs_mode):
    print(f"roicore {report['environment']['roicore']} parity: adapters vs native operators, "
          "bit for bit")
    if inputs_mode:
        i = report["inputs"]
        print(f"inputs: {i['file']}  x {tuple(i['x_shape'])} {i['dtype']}, {i['boxes']} boxes, "
              f"output_size {tuple(i['output_size'])}, spatial_scale {i['spatial_scale']:g}, "
              f"sampling_ratio {i['sampling_ratio']}, aligned {i['aligned']}")
        for n in i["notes"]:
            print(f"  note: {n}")
    else:
        s = report["suite"]
        print(f"cases: {s['golden']} golden, {s['adversarial']} adversarial, {s['random']} random "
              f"(seed {s['seed']}); each run in every dtype the adapter claims")
    print()
    rows = []
    for r in report["results"]:
        verdict = "bit-exact" if r["bit_exact"] else "MISMATCH"
        if r["cases"] == 0:
            verdict = "not run"
        ncases = str(r["cases"]) + (f"+{r['skipped']}s" if r["skipped"] else "")
        framework = r["framework"] + (f" ({r['convention']})" if r["convention"] else "")
        row = [r["operator"], framework, r["dtype"], ncases]
        if inputs_mode and r["details"]:
            d = r["details"][0]
            row += ["x".join(map(str, d["native_shape"])) + " " + d["native_dtype"],
                    "x".join(map(str, d["roicore_shape"])) + " " + d["roicore_dtype"]]
        elif inputs_mode:
            row += ["-", "-"]
        row += [fmt_diff(r["max_abs_diff"]), _frac(r["mismatches"], r["elements"]),
                fmt_diff(r["grad_max_abs_diff"]), _frac(r["grad_mismatches"], r["grad_elements"]),
                verdict]
        rows.append(row)
    head = ["operator", "framework", "dtype", "cases"]
    if inputs_mode:
        head += ["native output", "roicore output"]
    head += ["max|diff|", "mismatching", "grad max|diff|", "grad mismatching", "verdict"]
    if rows:
        print(table(head, rows, "llll" + ("ll" if inputs_mode else "") + "rrrrl"))
    else:
        print("(no framework ran)")
    for r in report["results"]:
        if r["mismatching_cases"]:
            print(f"  {r['framework']} {r['operator']} {r['dtype']}: departs on "
                  f"{', '.join(r['mismatching_cases'][:8])}")
    if report.get("training"):
        print_training(report["training"])
    if report.get("models"):
        print_models(report["models"])
    notes = [(r, n) for r in report["results"] for n in r["notes"]]
    if notes:
        print("notes:")
        seen = set()
        for r, n in notes:
            key = (r["framework"], r["operator"], n)
            if key in seen:
                continue
            seen.add(key)
            print(f"  {r['framework']} {r['operator']} {r['dtype']}: {n}")
    fw = report["frameworks"]
    print()
    for name, info in fw.items():
        if info["status"] == "ran":
            print(f"  {name} {info['version']}: {harness_class(name).parity_text}")
        elif info["status"] == "skipped":
            print(f"  {name}: NOT INSTALLED ({info['reason'].strip().splitlines()[0]}); "
                  f"install it with: {info['install']}")
        else:
            reason = info["reason"].strip().splitlines()
            print(f"  {name}: FAILED: {reason[0] if reason else ''}")
            for extra in reason[1:6]:
                print(f"      {extra}")
    if report.get("golden"):
        g = report["golden"]
        bad = [x for x in g if not x["ok"]]
        print(f"  golden values (roicore.core, every convention, float32 and float64): "
              f"{len(g) - len(bad)}/{len(g)} match"
              + ("" if not bad else "; WRONG: " + ", ".join(
                  f"{x['case']}/{x['convention']}/{x['dtype']}" for x in bad[:6])))

    conv = report["conventions"]
    if conv:
        print()
        print("conventions compared on the same inputs (roicore.core alone; mismatching "
              "elements / compared, max|diff|)")
        by = {}
        for r in conv:
            by.setdefault((r["operator"], r["a"], r["b"]), {})[r["dtype"]] = r
        dts = sorted({r["dtype"] for r in conv})
        rows = []
        for (op, a, b), d in by.items():
            row = [op, f"{a} vs {b}"]
            for dt in dts:
                r = d.get(dt)
                if r is None:
                    row += ["-", "-", "-"]
                    continue
                row += [_frac(r["mismatches"], r["elements"]), fmt_diff(r["max_abs_diff"]),
                        str(r["grad_mismatches"])]
            rows.append(row)
        head = ["operator", "conventions"]
        for dt in dts:
            short = dt.replace("float", "f")
            head += [f"{short} out", f"{short} max|diff|", f"{short} grad"]
        print(table(head, rows, "ll" + "rrr" * len(dts)))
        print("(out/grad: mismatching output/gradient elements; max|diff| inf: NaN on one side only)")
    print()
    print(f"result: {report['verdict']} ({report['seconds']:.1f} s)")


def _verdict(rows, trained, fw_info, golden, allow_missing, models=()):
    """``(ok, the report's last line)``: OK only when at least one row compared something,
    every row, training run and model row is exact, no framework failed, the golden values
    hold and, unless ``allow_missing``, every framework asked for was installed."""
    compared = [r for r in rows if r["cases"]]
    problems = []
    departed = [r for r in rows + trained + list(models) if not r["ok"]]
    if departed:
        problems.append(f"{len(departed)} row(s) depart from their native op")
    failed = [n for n, i in fw_info.items() if i["status"] == "failed"]
    if failed:
        problems.append(f"{', '.join(failed)} failed")
    missing = [n for n, i in fw_info.items() if i["status"] == "skipped"]
    if missing and not allow_missing:
        problems.append(f"not installed: {', '.join(missing)} (--allow-missing accepts that)")
    if not all(g["ok"] for g in golden):
        problems.append("golden values do not hold")
    if not compared:
        problems.append("no row compared anything")
    if problems:
        return False, "FAILED: " + "; ".join(problems)
    what = (f"{len(compared)} row(s) compared"
            + (f", {len(trained)} training run(s)" if trained else "")
            + (f", {len(models)} model(s)" if models else ""))
    return True, f"OK, {what}; every adapter is bit-identical to its native op"


# ----------------------------------------------------------------------------- entry
def run(args):
    t0 = time.monotonic()
    frameworks = parse_list(args.frameworks, FRAMEWORKS, "framework", FRAMEWORK_ALIASES)
    inputs_mode = args.inputs is not None
    # a saved feature map is one map: the pyramid operators run on it only when asked for
    ops = parse_list(args.ops, K.OPS if inputs_mode and args.ops is None else K.PARITY_OPS,
                     "operator", K.OP_ALIASES)
    dtypes = parse_list(args.dtypes, DTYPES, "dtype")
    if inputs_mode:
        try:
            cases, inputs = K.load_inputs(args.inputs, ops)
        except (OSError, ValueError) as e:
            raise UsageError(f"--inputs: {e}") from None
        dtypes = [inputs["dtype"]]
    else:
        if args.cases < 0:
            raise UsageError(f"--cases must be >= 0, got {args.cases}")
        cases = K.suite(ops, args.cases, args.seed)
    log(f"parity: {len(cases)} cases x {len(dtypes)} dtype(s); frameworks {', '.join(frameworks)} "
        "(one worker process each)")

    results = {}
    training = ([] if inputs_mode or args.no_training
                else [K.training_case(op) for op in ops if op in K.OPS] + K.model_cases(ops))
    threads = [threading.Thread(target=_run_framework,
                                args=(fw, cases, dtypes, results, training))
               for fw in frameworks]
    for t in threads:
        t.start()
    # roicore-only parts while the workers run
    conv = [] if args.no_conventions else conventions_table(cases, ops, dtypes)
    golden = [] if inputs_mode else golden_check(cases, dtypes)
    for t in threads:
        t.join()

    rows, fw_info, trained, models = [], {}, [], []
    for fw in frameworks:
        info = results.get(fw, dict(status="failed", reason="no result"))
        fw_info[fw] = {k: v for k, v in info.items() if k not in ("results", "training")}
        if info["status"] == "ran":
            rows += _aggregate(fw, info["results"], harness_class(fw).differentiable)
            trained += [_training_row(fw, r) for r in info["training"] if "model" not in r]
            models += [_model_row(fw, r) for r in info["training"] if "model" in r]
    order = {op: i for i, op in enumerate(K.PARITY_OPS)}
    rows.sort(key=lambda r: (order[r["operator"]], frameworks.index(r["framework"]), r["dtype"]))
    ok, verdict = _verdict(rows, trained, fw_info, golden, args.allow_missing, models)
    report = dict(command="parity", ok=ok, verdict=verdict, seconds=time.monotonic() - t0,
                  environment=environment(), frameworks=fw_info, results=rows,
                  training=trained, models=models, conventions=conv, golden=golden)
    if inputs_mode:
        report["inputs"] = inputs
    else:
        report["suite"] = dict(seed=args.seed, random=sum(c["group"] == "random" for c in cases),
                               golden=sum(c["group"] == "golden" for c in cases),
                               adversarial=sum(c["group"] == "adversarial" for c in cases),
                               total=len(cases), dtypes=dtypes, operators=ops)
    print_report(report, inputs_mode)
    if args.json:
        write_json(args.json, report)
    return 0 if ok else 1
