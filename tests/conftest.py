import os
import pathlib
import sys

import pytest
from hypothesis import HealthCheck, settings

# tests/reference.py and tests/strategies.py are plain modules next to the tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

# "ci": reproducible and bounded (CI sets HYPOTHESIS_PROFILE=ci, and it is the default);
# "quick": the inner loop's (docs/development.md); "dev": more examples.
settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("quick", derandomize=True, max_examples=20, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# The output cache's tests exercise its mechanism on small arrays: the `cache` fixture's
# cache takes requests from SMALL_CACHED bytes (in use the threshold is _memory.MIN_BYTES).
SMALL_CACHED = 1 << 20


@pytest.fixture
def cache(monkeypatch):
    """The process-wide output cache, emptied, taking requests from SMALL_CACHED, with its
    limit restored afterwards."""
    import roicore.core as rc
    from roicore.core import _memory
    rc.release_output_cache()
    monkeypatch.setattr(_memory._CACHE, "min_bytes", SMALL_CACHED)
    previous = rc.set_output_cache_limit(256 << 20)
    yield
    rc.set_output_cache_limit(previous)
    rc.release_output_cache()
