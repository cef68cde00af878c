import os
import pathlib
import sys

from hypothesis import HealthCheck, settings

# tests/reference.py and tests/strategies.py are plain modules next to the tests.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

# "ci": reproducible and bounded (CI sets HYPOTHESIS_PROFILE=ci); "dev": more examples.
settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
