"""Frameworks are optional locally and required in CI.

With ROICORE_REQUIRE_FRAMEWORKS=1 (CI sets it) a test that needs a missing framework fails;
otherwise it is skipped with its reason.
"""
import importlib
import importlib.util
import os

import pytest

REQUIRE = os.environ.get("ROICORE_REQUIRE_FRAMEWORKS", "") not in ("", "0")


def framework(name, reason):
    """importorskip, except that CI (ROICORE_REQUIRE_FRAMEWORKS=1) turns the skip into an error."""
    if REQUIRE:
        return importlib.import_module(name)
    return pytest.importorskip(name, reason=reason)


def framework_installed(name, reason):
    """The same rule for a test that runs the framework in a subprocess: checks that it is
    installed without importing it here (frameworks imported in the wrong order crash a
    process), skipping, or failing in CI, when it is not."""
    if importlib.util.find_spec(name) is not None:
        return
    if REQUIRE:
        pytest.fail(f"{name} is required (ROICORE_REQUIRE_FRAMEWORKS=1) but not installed: {reason}")
    pytest.skip(reason)
