"""Shared helpers for the two commands: environment facts, tables, JSON."""
from __future__ import annotations

import json
import math
import os
import platform
import sys

FRAMEWORK_ALIASES = {"tf": "tensorflow", "mx": "mxnet", "ov": "openvino", "ort": "onnxruntime",
                     "paddlepaddle": "paddle"}


def parse_list(text, allowed, what, aliases=None):
    if text is None:
        return list(allowed)
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            continue
        item = (aliases or {}).get(item, item)
        if item not in allowed:
            raise SystemExit(f"roicore: unknown {what} {item!r}; choose from {', '.join(allowed)}")
        if item not in out:
            out.append(item)
    if not out:
        raise SystemExit(f"roicore: no {what} selected")
    return out


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment():
    import numpy as np
    import roicore.core as rc
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    return dict(roicore=rc.__version__, openmp=bool(rc.openmp_enabled()), numpy=np.__version__,
                python=platform.python_version(), platform=platform.platform(),
                cpu=cpu_model(), cpus=cpus)


def fmt_diff(v):
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if math.isinf(v):
        return "inf"
    return f"{v:.3g}"


def table(headers, rows, aligns=None):
    """Plain-text table; ``aligns`` is a string of 'l'/'r' per column."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    aligns = aligns or "l" * len(headers)

    def line(cells):
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w)
                         for c, w, a in zip(cells, widths, aligns)).rstrip()
    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def _clean(o):
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    if hasattr(o, "item") and hasattr(o, "dtype"):
        return _clean(o.item())
    return o


def write_json(path, data):
    text = json.dumps(_clean(data), indent=2, allow_nan=False)
    if path == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(path, "w") as f:
            f.write(text + "\n")


def log(text):
    print(f"roicore: {text}", file=sys.stderr, flush=True)
