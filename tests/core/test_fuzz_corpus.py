"""The fuzzer's cases as regression tests: the first 400 seeds of tests/fuzz/fuzz_core.py,
and every seed that once failed (none yet), each checked as the fuzzer checks it (1 thread
against several, and against the slow reference; hostile inputs refused)."""
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fuzz"))
import fuzz_core  # noqa: E402

FAILED_ONCE = []  # seeds that exposed a bug, kept forever


@pytest.mark.slow
@pytest.mark.parametrize("seed", list(range(400)) + FAILED_ONCE)
def test_fuzz_case(seed):
    outcome = fuzz_core.run_case(seed)
    assert outcome in ("ok", "rejected"), f"seed {seed}: {outcome}"


def test_the_corpus_reaches_every_operator_direction_and_hostile_kind():
    seen = set()
    for seed in range(400):
        case = fuzz_core.make_case(seed)
        seen.add((case["op"], case["backward"]))
        seen.add(case["hostile"])
    assert {(op, d) for op in ("max", "bilinear", "psroi", "align", "ps_align")
            for d in (False, True)} <= seen
    assert {"nan", "inf", "far", "batch"} <= seen
