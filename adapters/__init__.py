"""Per-framework front ends: roicore.adapters.tf, .paddle (paddle.vision.ops signatures),
.paddle_legacy (fluid signatures) and .mxnet.

Importing this package imports no framework: each adapter module is loaded on first
attribute access, and only that module imports its framework.
"""
import importlib

_ADAPTERS = ("tf", "paddle", "paddle_legacy", "mxnet")

__all__ = list(_ADAPTERS)


def __getattr__(name):
    if name in _ADAPTERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
