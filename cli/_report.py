"""Shared helpers for the two commands: usage errors, environment facts, tables, JSON."""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import textwrap

FRAMEWORK_ALIASES = {"tf": "tensorflow", "mx": "mxnet", "ov": "openvino", "ort": "onnxruntime",
                     "paddlepaddle": "paddle", "pytorch": "torch", "torchvision": "torch"}


class UsageError(Exception):
    """Bad arguments found after parsing: the command exits with status 2."""


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
            raise UsageError(f"unknown {what} {item!r}; choose from {', '.join(allowed)}")
        if item not in out:
            out.append(item)
    if not out:
        raise UsageError(f"no {what} selected")
    return out


def _cpuinfo():
    """(model name, physical cores) from /proc/cpuinfo; (None, None) where there is none."""
    model, cores = None, set()
    try:
        with open("/proc/cpuinfo") as f:
            block = {}
            for line in list(f) + [""]:
                key, _, value = line.partition(":")
                if key.strip():
                    block[key.strip()] = value.strip()
                    continue
                model = model or block.get("model name")
                if "core id" in block:
                    cores.add((block.get("physical id"), block["core id"]))
                block = {}
    except OSError:
        pass
    return model, len(cores) or None


def cpu_model():
    return _cpuinfo()[0] or platform.processor() or platform.machine()


def _memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def environment():
    import numpy as np
    import roicore.core as rc
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    model, cores = _cpuinfo()
    return dict(roicore=rc.__version__, openmp=bool(rc.openmp_enabled()), numpy=np.__version__,
                python=platform.python_version(), platform=platform.platform(),
                cpu=model or cpu_model(), cpus=cpus, logical_cpus=os.cpu_count(),
                physical_cores=cores, memory_gib=_memory_gib())


def machine(env):
    """One line naming the machine: CPU model, cores, memory."""
    cores = [f"{env['physical_cores']} cores" if env.get("physical_cores") else None,
             f"{env['logical_cpus']} logical CPUs" if env.get("logical_cpus") else None,
             f"{env['cpus']} available" if env.get("cpus") != env.get("logical_cpus") else None]
    text = env["cpu"] + ", " + ", ".join(c for c in cores if c)
    if env.get("memory_gib"):
        text += f", {env['memory_gib']:g} GiB memory"
    return text


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


def markdown_table(headers, rows, aligns=None):
    """A GitHub-flavoured Markdown table; ``aligns`` as for :func:`table`."""
    aligns = aligns or "l" * len(headers)

    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    return "\n".join([line(headers), "|" + "|".join("---:" if a == "r" else "---" for a in aligns)
                      + "|"] + [line(r) for r in rows])


# ----------------------------------------------------------------------------- documents
# A report is built once as a list of blocks and rendered as text (stdout) or Markdown.
class Text(str):
    """A line printed as it is."""


class Note(str):
    """A sentence of explanation: wrapped and indented in text, a list item in Markdown."""


class Table:
    """A titled table: ``rows`` of cells under ``headers``, ``aligns`` 'l'/'r' per column."""

    def __init__(self, title, headers, rows, aligns=None):
        self.title, self.headers, self.rows, self.aligns = title, headers, rows, aligns


def render_text(blocks):
    out = []
    for b in blocks:
        if isinstance(b, Table):
            if b.title:
                out.append(b.title)
            out.append(table(b.headers, b.rows, b.aligns) if b.rows else "(no rows)")
        elif isinstance(b, Note):
            out.append(textwrap.fill(b, 100, initial_indent="  ", subsequent_indent="    "))
        else:
            out.append(str(b))
    return "\n".join(out)


def render_markdown(blocks):
    out = []
    for b in blocks:
        if isinstance(b, Table):
            if b.title:
                out += ["", f"**{b.title}**"]
            out += ["", markdown_table(b.headers, b.rows, b.aligns) if b.rows else "(no rows)", ""]
        elif isinstance(b, Note) or b.startswith(" "):
            out.append(f"- {b.strip()}")
        elif b.strip():
            out.append(str(b))
        else:
            out.append("")
    text = "\n".join(out)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip() + "\n"


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
