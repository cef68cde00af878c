"""Adapter tests: frameworks are optional locally and required in CI.

Importing TensorFlow before Paddle segfaults Paddle's native core (oracles.md), so Paddle
is imported first, here, before any test module is collected; the suite then passes in
any collection order, in one process.
"""
import collections
import importlib
import os

import pytest

try:
    import paddle  # noqa: F401  (must precede tensorflow)
except ImportError:
    pass

# In CI a missing framework is a failure, not a skip.
REQUIRE = os.environ.get("ROICORE_REQUIRE_FRAMEWORKS", "") not in ("", "0")


def framework(name, reason):
    """importorskip, except that CI (ROICORE_REQUIRE_FRAMEWORKS=1) turns the skip into an error."""
    if REQUIRE:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=reason)


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
