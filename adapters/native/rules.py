"""A convention's rules as the C API's integer codes, the attribute a native operator
receives and decodes with ``roicore_*_rules_from_array``."""
from __future__ import annotations

import dataclasses

__all__ = ["rules_fields"]

# Each string-valued field's values in the order of its C enum (roicore.h); booleans are
# 0 or 1.
_CODES = {
    "bin_arithmetic": ("input", "float32", "exact"),
    "scale_precision": ("input", "float32", "float64"),
    "scale_product": ("input", "float32", "float64"),
    "initial": ("-FLT_MAX", "lowest", "first", "nan"),
    "compare": ("greater", "std_max", "fmax"),
    "argmax": ("plane", "global"),
    "argmax_dtype": ("int32", "int64"),
    "sampler": ("caffe2", "paddle"),
    "empty_grid": ("zero", "nan"),
}


def rules_fields(rules) -> list[int]:
    """The fields of a rules object (roicore.core.conventions) as integer codes, in
    declaration order."""
    out = []
    for field in dataclasses.fields(rules):
        value = getattr(rules, field.name)
        out.append(int(value) if isinstance(value, bool) else _CODES[field.name].index(value))
    return out
