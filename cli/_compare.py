"""``roicore bench --compare BASELINE.json``: this run's rows against a saved report.

Only roicore's own rows are judged: roicore.core in its worker and the adapters.  A row
has regressed when its fastest round now is slower than the baseline's slowest round by
more than the threshold: each run's spread stands for its noise, so one slow round in
either run cannot make a regression, and a slowdown must exceed the noise and the
threshold together.  Symmetrically, a row is faster when its slowest round now beats the
baseline's fastest by the threshold.  Rows only one run has are left out.
"""
from __future__ import annotations

import json
import math

from ._report import UsageError

DEFAULT_THRESHOLD = 10.0   # percent


def parse_threshold(text):
    """``--threshold``: percent, "10%" or "10"; DEFAULT_THRESHOLD when not given."""
    if text is None:
        return DEFAULT_THRESHOLD
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise UsageError(f"--threshold takes a percentage such as 10%, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"--threshold must be a percentage >= 0, got {text!r}")
    return value


def judged(row):
    """Whether a row is roicore's own: roicore.core in the roicore worker, or an adapter."""
    return row["kind"] == "adapter" or (row["framework"] == "roicore" and row["kind"] == "core")


def _range(row):
    """(fastest, slowest) round of a row, in ms."""
    times = row.get("times_ms") or [row["median_ms"]]
    return row.get("min_ms", min(times)), row.get("max_ms", max(times))


def load(path, plan):
    """The baseline report at ``path``, checked against the run ``plan`` asks for before
    that run starts; UsageError if it cannot be compared with it."""
    from .bench import row_key
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise UsageError(f"--compare: cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise UsageError(f"--compare: {path} is not JSON ({e})") from None
    if (not isinstance(data, dict) or data.get("command") != "bench"
            or not isinstance(data.get("results"), list)):
        raise UsageError(f"--compare: {path} is not a report written by roicore bench --json")
    if data.get("scale") != plan.scale:
        raise UsageError(f"--compare: the baseline's workloads were scaled by "
                         f"{data.get('scale')}, this run's by {plan.scale:g}: their times are "
                         "not comparable (pass the same --scale or --quick)")
    try:
        rows = [r for r in data["results"] if judged(r)]
        keys = [row_key(r) for r in rows]
        for r in rows:
            _range(r)
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"--compare: {path} has a malformed result row ({e!r})") from None
    wanted = [k for k in keys if k[0] in plan.workloads and k[1] in plan.ops
              and k[2] in plan.dtypes and k[3] in plan.directions and k[7] in plan.thread_counts]
    if not wanted:
        raise UsageError(f"--compare: {path} has no row of roicore's that this run will time "
                         "(workloads, operators, dtypes, directions and thread counts must "
                         "overlap)")
    data["path"] = str(path)
    return data


def compare(report, baseline, threshold):
    """The comparison, for the report: one entry per judged row found in both runs."""
    from .bench import ROW_KEY, row_key
    base = {row_key(r): r for r in baseline["results"] if judged(r)}
    factor = 1 + threshold / 100
    rows = []
    for r in report["results"]:
        b = base.get(row_key(r)) if judged(r) else None
        if b is None:
            continue
        (lo, hi), (b_lo, b_hi) = _range(r), _range(b)
        verdict = ("regressed" if lo > b_hi * factor else
                   "faster" if hi * factor < b_lo else "same")
        rows.append(dict(zip(ROW_KEY, row_key(r)), baseline_ms=b["median_ms"],
                         baseline_range_ms=[b_lo, b_hi], ms=r["median_ms"], range_ms=[lo, hi],
                         change=r["median_ms"] / b["median_ms"] - 1, verdict=verdict))
    env, b_env = report["environment"], baseline.get("environment", {})
    notes = []
    if b_env.get("cpu") not in (None, env["cpu"]):
        notes.append(f"the baseline ran on {b_env['cpu']}, this run on {env['cpu']}: times "
                     "from different machines say little about the code")
    return dict(baseline=baseline["path"], baseline_date=baseline.get("date"),
                baseline_command=baseline.get("command_line"),
                baseline_roicore=b_env.get("roicore"), threshold_percent=threshold, rows=rows,
                regressions=sum(r["verdict"] == "regressed" for r in rows),
                faster=sum(r["verdict"] == "faster" for r in rows), notes=notes)
