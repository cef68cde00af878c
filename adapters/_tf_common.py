"""TensorFlow glue shared by roicore.adapters.tf's two ways of running an op (the native
op library and the tf.numpy_function fallback): whether a tape records a tensor, and the
device policy for tensors off the host."""
from __future__ import annotations

import functools

from ._common import off_host, require

tf = require("tensorflow", "tf")

try:  # private: whether an eager GradientTape records a tensor (else: always assume one does)
    from tensorflow.python.eager import record as _record
except ImportError:  # pragma: no cover - older/newer TF layouts
    _record = None


def may_record(t):
    """Whether a GradientTape records eager tensor ``t`` (so a gradient may be asked for)."""
    if _record is None:  # pragma: no cover - TF layout without the private module
        return True
    return _record.could_possibly_record() and _record.should_record_backprop([t])


@functools.lru_cache(maxsize=64)
def _is_host_device(device):
    """Whether a tensor's device string names the host ("" means not placed yet)."""
    return not device or tf.DeviceSpec.from_string(device).device_type in (None, "CPU")


def device_of(t):
    return t.device


def on_host(t, argument):
    """``t`` itself when it is on the host (or not placed yet, in a graph), else, as the
    device policy allows (:func:`roicore.adapters.set_device_policy`), a copy on the host."""
    device = device_of(t)
    if _is_host_device(device):
        return t
    off_host("tf", argument, device)
    with tf.device("/device:CPU:0"):
        return tf.identity(t)


def back_to(y, device):
    """The result on the device the images came from (a copy when that is not the host)."""
    if _is_host_device(device):
        return y
    with tf.device(device):
        return tf.identity(y)
