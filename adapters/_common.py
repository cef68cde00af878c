"""Framework-free glue shared by the adapters: importing frameworks with a useful error,
and the policy for tensors that live off the host.  No maths happens in adapters; what
they need of roicore.core's argument rules is roicore.core.args."""
from __future__ import annotations

import importlib
import os
import threading
import warnings

_EXTRAS = {"tensorflow": "tf", "paddle": "paddle", "mxnet": "mxnet", "torch": "torch"}


def require(module: str, adapter: str):
    """Import ``module`` or raise an ImportError that names the pip extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        extra = _EXTRAS.get(module.split(".")[0], "all")
        raise ImportError(
            f"roicore.adapters.{adapter} needs {module.split('.')[0]}, which could not be "
            f"imported ({exc}); install it with: pip install 'roicore[{extra}]'"
        ) from exc


# ---------------------------------------------------------------------------------------
# Tensors on accelerators.  roicore's kernels run on the host, so a tensor on a GPU (or any
# device but the CPU) must be copied there and the result copied back.  Policy "copy" (the
# default) does that and warns once per adapter and device, so that a model that moved to
# a GPU learns where its time goes; policy "error" refuses such tensors instead.

DEVICE_POLICIES = ("copy", "error")


class DeviceCopyWarning(RuntimeWarning):
    """A roicore adapter copied a tensor from an accelerator to the host and back."""


def switched_off(variable: str) -> bool:
    """Whether environment variable ``variable`` turns something off: 0, false, off or no
    (any case), the one reading of every roicore switch."""
    return os.environ.get(variable, "").strip().lower() in ("0", "false", "off", "no")


def _policy_from_env():
    value = os.environ.get("ROICORE_DEVICE_POLICY", "copy")
    if value not in DEVICE_POLICIES:
        raise ValueError(f"ROICORE_DEVICE_POLICY must be one of {DEVICE_POLICIES}, got {value!r}")
    return value


_device_policy = _policy_from_env()
_warned = set()
_warned_lock = threading.Lock()


def set_device_policy(policy: str) -> str:
    """Set what the adapters do with tensors off the host: "copy" (default; copy to the host
    and back, warning once per adapter and device with DeviceCopyWarning) or "error" (raise
    ValueError).  Returns the previous policy.  ROICORE_DEVICE_POLICY sets it at import."""
    global _device_policy
    if policy not in DEVICE_POLICIES:
        raise ValueError(f"policy must be one of {DEVICE_POLICIES}, got {policy!r}")
    previous, _device_policy = _device_policy, policy
    return previous


def get_device_policy() -> str:
    """The current policy for tensors off the host ("copy" or "error")."""
    return _device_policy


def off_host(adapter: str, argument: str, device: str) -> None:
    """Called by an adapter before it copies ``argument`` from ``device`` to the host:
    raises under policy "error", else warns once per (adapter, device)."""
    if _device_policy == "error":
        raise ValueError(
            f"roicore.adapters.{adapter}: {argument} is on {device}, but roicore computes on the "
            "CPU; move it to the CPU first, or allow the copy with "
            "roicore.adapters.set_device_policy('copy')")
    with _warned_lock:
        if (adapter, device) in _warned:
            return
        _warned.add((adapter, device))
    warnings.warn(
        f"roicore.adapters.{adapter}: {argument} is on {device}; roicore computes on the CPU, "
        "so inputs are copied to the host and results back (this warning is shown once per "
        "device; roicore.adapters.set_device_policy('error') refuses such tensors instead)",
        DeviceCopyWarning, stacklevel=3)
