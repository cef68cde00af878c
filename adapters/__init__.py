"""Per-framework front ends: roicore.adapters.tf, .paddle (paddle.vision.ops signatures),
.paddle_legacy (fluid signatures), .mxnet and .torch (torchvision.ops signatures).

Tensors on an accelerator are copied to the host and back, with a DeviceCopyWarning once
per adapter and device; ``set_device_policy("error")`` refuses them instead.

Importing this package imports no framework: each adapter module is loaded on first
attribute access, and only that module imports its framework.
"""
import importlib

from ._common import DeviceCopyWarning, get_device_policy, set_device_policy

_ADAPTERS = ("tf", "paddle", "paddle_legacy", "mxnet", "torch")

__all__ = list(_ADAPTERS) + ["set_device_policy", "get_device_policy", "DeviceCopyWarning"]


def __getattr__(name):
    if name in _ADAPTERS:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
