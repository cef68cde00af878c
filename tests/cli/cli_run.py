"""Running the command as a user would, in a subprocess, and reading its report.

Frameworks are optional locally and required in CI (tests/frameworks.py): with
ROICORE_REQUIRE_FRAMEWORKS=1 a framework the report lists as skipped fails the test.
"""
import json
import os
import subprocess
import sys

import pytest

from frameworks import REQUIRE


def roicore(*args, env=None, timeout=300, python=()):
    """Run ``python -m roicore.cli ARGS``; the CompletedProcess.  ``python``: interpreter
    options placed before ``-m`` (e.g. ``("-c", code)`` replaces the module run)."""
    e = dict(os.environ)
    e.pop("ROICORE_PARITY_FAULT", None)
    e.update(env or {})
    cmd = [sys.executable, *python] if python else [sys.executable, "-m", "roicore.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout, env=e)


def report_of(proc, path):
    """The JSON report a run wrote to ``path``, after checking the run exited 0."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(path.read_text())


def check_skips(frameworks_info):
    """The frameworks that ran; a skipped one skips the test (fails in CI) with its reason."""
    skipped = {n: i["reason"] for n, i in frameworks_info.items() if i["status"] == "skipped"}
    failed = {n: i["reason"] for n, i in frameworks_info.items() if i["status"] == "failed"}
    assert not failed, failed
    if skipped and REQUIRE:
        pytest.fail(f"frameworks required (ROICORE_REQUIRE_FRAMEWORKS=1) but skipped: {skipped}")
    return [n for n, i in frameworks_info.items() if i["status"] == "ran"], skipped


def flat(text):
    """``text`` with its line wrapping undone (notes are wrapped at 100 columns)."""
    return " ".join(text.split())
