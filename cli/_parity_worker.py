"""The parity worker's side: every case through one framework's harness, native op and
roicore's counterpart, forward and (where the framework has one) backward."""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from ._proc import error_text, progress
from .frameworks import Harness, output_channels


def _fault(framework, op):
    """Test hook: ROICORE_PARITY_FAULT="fw[:op],..." puts roicore one ulp off there."""
    spec = os.environ.get("ROICORE_PARITY_FAULT", "")
    for item in filter(None, spec.split(",")):
        fw, _, fop = item.partition(":")
        if fw == framework and (not fop or fop == op):
            return True
    return False


def _output_shape(case):
    return (case["rois"].shape[0], output_channels(case)) + tuple(case["output_size"])


def _run(harness, call):
    """``dict(y=, dx=)`` of a bound call, as NCHW NumPy arrays (dx None without a gradient)."""
    if harness.differentiable:
        y, dx = harness.forward_backward(call)
    else:
        y, dx = harness.forward(call), None
    return dict(y=harness.to_numpy(y, call.layout), dx=harness.to_numpy(dx, call.layout))


def _compare_case(harness, case, dtype, rec):
    """Fill ``rec["native"]`` and ``rec["roicore"]`` with each side's result or error."""
    dy = case.get("dy")
    if dy is None or dy.shape != _output_shape(case):
        dy = np.random.default_rng(case["seed"]).standard_normal(_output_shape(case))
    dy = np.ascontiguousarray(dy.astype(dtype))

    def run(which, call):
        got = _run(harness, call)
        if which == "roicore" and _fault(harness.name, case["op"]) and got["y"].size:
            got["y"] = got["y"].copy()   # one ulp off in one element
            got["y"].flat[0] = np.nextafter(got["y"].flat[0], got["y"].dtype.type(np.inf))
        return got
    _on_both_sides(harness, case, dtype, dy, rec, run)


def _on_both_sides(harness, case, dtype, dy, rec, run):
    """Fill ``rec["native"]`` and ``rec["roicore"]`` with ``run(which, call)`` of the native
    op and of roicore's counterpart, bound to the case's inputs, or with the error raised."""
    try:
        inputs = harness.inputs(case, dtype, dy)
    except Exception as e:
        rec["native"] = rec["roicore"] = dict(error=error_text(e))
        return
    layout = "NCHW"
    for which in ("native", "roicore"):
        try:
            if which == "native":
                call = harness.native(case, inputs)
                layout = call.layout
            else:   # in the native op's layout: like is compared with like
                call = harness.roicore(case, inputs, layout)
            rec[which] = run(which, call)
        except Exception as e:
            rec[which] = dict(error=error_text(e))


def parity(harness, msg):
    """Every case of an operator the harness claims, in every claimed dtype asked for."""
    claims = harness.parity_claims
    todo = []
    for c in msg["cases"]:
        if c["op"] not in claims:
            continue
        if c["group"] == "inputs":   # the user's dtype only (reported as skipped if not claimed)
            todo.append((c, c["x"].dtype.name))
        else:
            todo += [(c, dt) for dt in claims[c["op"]] if dt in msg["dtypes"]]
    out = []
    last = time.monotonic()
    for i, (c, dt) in enumerate(todo):
        if time.monotonic() - last > 5:
            progress(f"{i}/{len(todo)} case runs")
            last = time.monotonic()
        rec = dict(name=c["name"], group=c["group"], op=c["op"], dtype=dt, notes=[])
        out.append(rec)
        if dt not in claims[c["op"]]:
            rec["skipped"] = (f"input is {c['x'].dtype}; {harness.name} is compared in "
                              f"{'/'.join(claims[c['op']])} only")
            continue
        try:
            cc, note = harness.restrict(c)
        except Exception as e:
            rec["skipped"] = error_text(e)
            continue
        if note:
            rec["notes"].append(note)
        if cc["rois"].shape[0] == 0:
            rec["skipped"] = "no boxes left for the native op"
            continue
        _compare_case(harness, cc, dt, rec)
    progress(f"{len(todo)}/{len(todo)} case runs done")
    return dict(results=out)


def training(harness, msg):
    """The training head of each case (``cases.training_case``) whose operator the harness
    claims, in each claimed dtype asked for and each of its training modes, once with the
    native op and once with roicore's: the loss and the weight after every step.  A model
    case (``cases.model_cases``) gives its model row's record instead."""
    out = []
    for c in msg["cases"]:
        if c["group"] == "model":   # a detector with roicore's poolers: a model row
            if c["dtype"] in harness.parity_claims.get(c["op"], ()) and \
                    c["dtype"] in msg["dtypes"]:
                rec = _model(harness, c)
                if rec is not None:
                    out.append(rec)
            continue
        for dt in (d for d in harness.parity_claims.get(c["op"], ()) if d in msg["dtypes"]):
            for mode in harness.training_modes:
                rec = dict(op=c["op"], dtype=dt, mode=mode, steps=c["steps"])
                out.append(rec)
                _train_both(harness, c, dt, mode, rec)
    return dict(results=out)


def _model(harness, case):
    """A model case run with the native poolers and with roicore's, compared here (whole
    models' gradients are too large to send): ``_pyramid_parity_models.run``'s record, the
    error that kept the model from running at all, or None where the harness has no such
    model (the detectors are torchvision's; other frameworks claim the operator too)."""
    if type(harness).model is Harness.model:   # the base's: no models
        return None
    rec = dict(model=case["model"], op=case["op"], dtype=case["dtype"])
    progress(f"model {case['model']}")
    try:
        rec.update(harness.model(case, perturb=_fault(harness.name, case["op"])))
    except Exception as e:
        rec["error"] = error_text(e)
    return rec


def _train_both(harness, case, dtype, mode, rec):
    def run(which, call):
        if which == "roicore" and _fault(harness.name, case["op"]):   # 2**-20 off, every call
            fn = call.fn
            call = dataclasses.replace(call, fn=lambda x: fn(x) * (1 + 2 ** -20))
        steps = harness.train(call, case, dtype, mode)
        return dict(loss=np.concatenate([np.ravel(l) for l, _ in steps]),
                    weight=np.stack([w for _, w in steps]))
    _on_both_sides(harness, case, dtype, np.ascontiguousarray(case["target"], dtype), rec, run)
