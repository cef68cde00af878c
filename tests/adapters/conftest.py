"""Adapter tests: frameworks are optional locally and required in CI.

Importing TensorFlow before Paddle segfaults Paddle's native core, and TensorFlow before
torch aborts once Paddle is loaded, so Paddle and then torch are imported first, here,
before any test module is collected; the suite then passes in any collection order, in one
process.
"""
import collections
import importlib

import pytest

try:
    import paddle  # noqa: F401  (must precede tensorflow)
except ImportError:
    pass
try:
    import torch  # noqa: F401  (with paddle loaded, must precede tensorflow)
    import torchvision  # noqa: F401
except ImportError:
    pass

# In CI a missing framework is a failure, not a skip (the test modules import these).
from frameworks import REQUIRE, framework  # noqa: E402,F401


Call = collections.namedtuple("Call", "args kwargs result")


@pytest.fixture
def spy_core(monkeypatch):
    """``spy_core(name)``: a list that gets a Call(args, kwargs, result) for every
    roicore.core.<name> call the adapters make from then on (the call itself still runs)."""
    from roicore import core

    def spy(name):
        calls = []
        real = getattr(core, name)

        def recording(*args, **kwargs):
            result = real(*args, **kwargs)
            calls.append(Call(args, kwargs, result))
            return result

        monkeypatch.setattr(core, name, recording)
        return calls

    return spy


@pytest.fixture(params=["native", "numpy"])
def paddle_path(request, monkeypatch):
    """Runs a Paddle adapter test on each way roicore.adapters.paddle computes: roicore's
    Paddle operators ("native": required in CI) and the NumPy path ("numpy")."""
    rp = importlib.import_module("roicore.adapters.paddle")
    if request.param == "numpy":
        monkeypatch.setattr(rp, "_operators", lambda: None)
    elif rp._operators() is None:
        reason = f"roicore's Paddle operators are unavailable: {rp._native_unavailable}"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    return request.param


@pytest.fixture
def numpy_path(monkeypatch):
    """Runs a Paddle adapter test on the NumPy path (roicore.core through PyLayer)."""
    rp = importlib.import_module("roicore.adapters.paddle")
    monkeypatch.setattr(rp, "_operators", lambda: None)


@pytest.fixture(params=["native", "numpy_function"])
def tf_path(request, monkeypatch):
    """Runs a TensorFlow adapter test on each way roicore.adapters.tf computes: roicore's
    TensorFlow op library ("native": required in CI) and the tf.numpy_function fallback."""
    from roicore.adapters import tf as rtf
    if request.param == "native":
        if rtf.native_ops() is None:
            message = ("roicore's TensorFlow op library is not available (see its "
                       "NativeOpsWarning)")
            if REQUIRE:
                pytest.fail(message)
            pytest.skip(message)
    else:
        monkeypatch.setitem(rtf._LIBRARY, "library", None)
    return request.param
