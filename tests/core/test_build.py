"""Build and packaging properties of roicore.core: OpenMP, thread-count policy, no
framework imports, the rebuild hint on a broken extension, and the conventions tables."""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import textwrap
import typing

import numpy as np
import pytest

import roicore.core as rc
from roicore.core import conventions
from roicore.core.conventions import (
    BILINEAR_POOL, MAX_POOL, PSROI_ALIGN, PSROI_POOL, ROI_ALIGN,
    BilinearPoolRules, MaxPoolRules, PSRoIAlignRules, PSRoIPoolRules, RoIAlignRules, resolve,
)

FRAMEWORKS = ("tensorflow", "paddle", "mxnet", "torch", "openvino", "onnxruntime")


def run_python(code, env_update=None, unset=(), timeout=120):
    env = dict(os.environ)
    for name in unset:
        env.pop(name, None)
    env.update(env_update or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=timeout)


def cpus_available():
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------
# (a) OpenMP
# ---------------------------------------------------------------------------------------

def test_openmp_enabled():
    if os.environ.get("ROICORE_SKIP_OPENMP_TEST"):
        pytest.skip("ROICORE_SKIP_OPENMP_TEST is set: this build may lack OpenMP")
    assert rc.openmp_enabled() is True


# ---------------------------------------------------------------------------------------
# (b) effective_n_threads
# ---------------------------------------------------------------------------------------

needs_openmp = pytest.mark.skipif(not rc.openmp_enabled(),
                                  reason="built without OpenMP: every count is 1")


def test_effective_n_threads_default_within_cpu_count():
    n = rc.effective_n_threads()
    assert type(n) is int
    assert 1 <= n <= (os.cpu_count() or 1)
    assert n == rc.effective_n_threads(None)


@needs_openmp
@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, np.int64(3), np.int32(5)])
def test_effective_n_threads_positive(n):
    got = rc.effective_n_threads(n)
    assert got == int(n) and type(got) is int


@needs_openmp
def test_effective_n_threads_minus_one_is_all_cpus():
    assert rc.effective_n_threads(-1) == cpus_available()
    assert rc.effective_n_threads(-1) <= (os.cpu_count() or 1)


@needs_openmp
def test_effective_n_threads_negative_counts_back_from_all():
    cpus = cpus_available()
    assert rc.effective_n_threads(-2) == max(1, cpus - 1)
    assert rc.effective_n_threads(-(cpus + 10)) == 1


def test_effective_n_threads_without_openmp_is_one(monkeypatch):
    from roicore.core import _threads
    monkeypatch.setattr(_threads, "openmp_enabled", lambda: False)
    for n in (None, 1, 4, -1):
        assert _threads.effective_n_threads(n) == 1
    with pytest.raises(ValueError):
        _threads.effective_n_threads(0)


def test_effective_n_threads_zero():
    with pytest.raises(ValueError, match=r"n_threads = 0 is invalid"):
        rc.effective_n_threads(0)


@pytest.mark.parametrize("n, tname", [("2", "str"), (True, "bool"), (2.0, "float")])
def test_effective_n_threads_type(n, tname):
    with pytest.raises(TypeError, match=rf"n_threads must be an int or None, got {tname}"):
        rc.effective_n_threads(n)


@needs_openmp
@pytest.mark.parametrize("omp, expected", [("1", 1), ("2", None)])
def test_effective_n_threads_follows_omp_num_threads(omp, expected):
    proc = run_python("import roicore.core as rc; print(rc.effective_n_threads())",
                      {"OMP_NUM_THREADS": omp})
    assert proc.returncode == 0, proc.stderr
    if expected is None:
        expected = min(int(omp), cpus_available())
    assert int(proc.stdout.strip()) == expected


# ---------------------------------------------------------------------------------------
# (c) no framework is imported
# ---------------------------------------------------------------------------------------

def test_core_and_adapters_import_no_framework():
    proc = run_python(f"""
        import json, sys
        import numpy as np
        import roicore.core as rc, roicore.adapters
        x = np.random.default_rng(0).standard_normal((2, 8, 6, 7)).astype(np.float32)
        b = np.array([[0, 0.5, 1, 4.2, 5.1], [1, 1, 0.5, 6, 3]], np.float32)
        nb = np.array([[0, 0.1, 0.2, 0.8, 0.9], [1, 0.05, 0.3, 0.5, 0.95]], np.float32)
        y, am = rc.roi_pool(x, b, 2, return_argmax=True)
        rc.roi_pool_backward(np.ones_like(y), b, x.shape, argmax=am)
        yb = rc.roi_pool(x, nb, 2, method="bilinear")
        rc.roi_pool_backward(np.ones_like(yb), nb, x.shape, method="bilinear")
        yp = rc.psroi_pool(x, b, 2)
        rc.psroi_pool_backward(np.ones_like(yp), b, x.shape)
        ya = rc.roi_align(x, b, 2)
        rc.roi_align_backward(np.ones_like(ya), b, x.shape)
        rc.effective_n_threads(); rc.openmp_enabled()
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})
        adapters = sorted(m for m in sys.modules if m.startswith("roicore.adapters."))
        print(json.dumps({{"frameworks": loaded, "adapters": adapters}}))
    """)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["frameworks"] == [], report
    # the adapter modules themselves load lazily, on first attribute access; only the
    # framework-free glue (the device policy that roicore.adapters exports) is loaded
    assert report["adapters"] == ["roicore.adapters._common"], report


# ---------------------------------------------------------------------------------------
# (d) a broken extension gives the documented ImportError
# ---------------------------------------------------------------------------------------

_CHECK_IMPORT_ERROR = """
    try:
        import roicore.core
    except ImportError as exc:
        import json
        print(json.dumps({"message": str(exc), "type": type(exc).__name__,
                          "cause": repr(exc.__cause__)}))
    else:
        print("IMPORTED")
"""


def _assert_rebuild_hint(proc, cause_fragment):
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.strip()
    assert out != "IMPORTED", "roicore.core imported although its extension could not load"
    info = json.loads(out.splitlines()[-1])
    msg = info["message"]
    assert "roicore.core._binding" in msg
    assert "pip install" in msg and "Rebuild" in msg
    assert f"Python {sys.version_info.major}.{sys.version_info.minor}" in msg
    assert cause_fragment in msg and cause_fragment in info["cause"]


def test_import_error_when_extension_is_blocked():
    proc = run_python("import sys\nsys.modules['roicore.core._binding'] = None\n"
                      + textwrap.dedent(_CHECK_IMPORT_ERROR))
    _assert_rebuild_hint(proc, "halted; None in sys.modules")


def test_import_error_when_extension_fails_to_load():
    """A meta-path finder simulating a binary that does not load (wrong ABI, missing
    symbol): the original error is kept as the cause and quoted in the message."""
    proc = run_python(textwrap.dedent("""
        import sys
        class Broken:
            def find_spec(self, name, path=None, target=None):
                if name == "roicore.core._binding":
                    raise ImportError("simulated: undefined symbol: GOMP_parallel")
                return None
        sys.meta_path.insert(0, Broken())
    """) + textwrap.dedent(_CHECK_IMPORT_ERROR))
    _assert_rebuild_hint(proc, "undefined symbol: GOMP_parallel")


def test_extension_loads_normally():
    proc = run_python(_CHECK_IMPORT_ERROR)
    assert proc.returncode == 0 and proc.stdout.strip() == "IMPORTED", proc.stdout + proc.stderr


# ---------------------------------------------------------------------------------------
# (e) conventions tables
# ---------------------------------------------------------------------------------------

TABLES = [
    (MAX_POOL, MaxPoolRules, "roi_pool(method='max')"),
    (BILINEAR_POOL, BilinearPoolRules, "roi_pool(method='bilinear')"),
    (PSROI_POOL, PSRoIPoolRules, "psroi_pool"),
    (ROI_ALIGN, RoIAlignRules, "roi_align"),
    (PSROI_ALIGN, PSRoIAlignRules, "ps_roi_align"),
]
ENTRIES = [(table, rtype, op, name) for table, rtype, op in TABLES for name in table]


@pytest.mark.parametrize("table, rtype, op, name", ENTRIES,
                         ids=[f"{rtype.__name__}-{name}" for _, rtype, _, name in ENTRIES])
def test_entry_is_frozen_dataclass(table, rtype, op, name):
    rules = table[name]
    assert type(rules) is rtype
    assert dataclasses.is_dataclass(rules)
    assert rtype.__dataclass_params__.frozen
    fields = dataclasses.fields(rules)
    assert fields
    for f in fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(rules, f.name, getattr(rules, f.name))
    hash(rules)   # frozen + eq: usable as a key


@pytest.mark.parametrize("table, rtype, op, name", ENTRIES,
                         ids=[f"{rtype.__name__}-{name}" for _, rtype, _, name in ENTRIES])
def test_entry_values_are_allowed_literals(table, rtype, op, name):
    hints = typing.get_type_hints(rtype)
    for f in dataclasses.fields(rtype):
        value = getattr(table[name], f.name)
        hint = hints[f.name]
        if typing.get_origin(hint) is typing.Literal:
            assert value in typing.get_args(hint), (name, f.name, value)
        else:
            assert isinstance(value, hint), (name, f.name, value)


@pytest.mark.parametrize("table, rtype, op, name", ENTRIES,
                         ids=[f"{rtype.__name__}-{name}" for _, rtype, _, name in ENTRIES])
def test_resolve_returns_the_table_object(table, rtype, op, name):
    first = resolve(name, table, rtype, op)
    assert first is table[name]
    assert resolve(name, table, rtype, op) is first
    assert resolve(first, table, rtype, op) is first


def test_tables_are_distinct_where_frameworks_differ():
    """Entries that the docs say differ really differ (a table of identical records
    would make every convention argument meaningless)."""
    assert len(set(MAX_POOL.values())) == len(MAX_POOL)
    assert len(set(BILINEAR_POOL.values())) == len(BILINEAR_POOL)
    assert len(set(ROI_ALIGN.values())) == len(ROI_ALIGN)
    assert PSROI_POOL["mxnet"] == PSROI_POOL["paddle"]   # documented as identical
    assert PSROI_POOL["torchvision"] != PSROI_POOL["paddle"]


def test_conventions_module_exports():
    for name in conventions.__all__:
        assert hasattr(conventions, name), name


def test_roicore_is_a_regular_package_with_a_version():
    import roicore
    assert roicore.__file__ is not None          # not a namespace package
    assert roicore.__version__ == rc.__version__ == rc._binding.VERSION


def test_a_roicore_folder_in_the_working_directory_does_not_shadow_it(tmp_path):
    """A clone of the repository is a folder named roicore/ holding core/: run from the
    folder that holds it, Python must still import the installed package."""
    import roicore
    checkout = pathlib.Path(__file__).resolve().parents[2]
    if pathlib.Path(roicore.__file__).resolve().is_relative_to(checkout):
        pytest.skip("an editable install: its finder comes after a folder in the working "
                    "directory (CI installs the wheel, where this runs)")
    (tmp_path / "roicore" / "core").mkdir(parents=True)
    (tmp_path / "roicore" / "core" / "__init__.py").write_text(
        "raise ImportError('the clone was imported instead of the installed package')\n")
    code = "import roicore.core as rc; print(rc.__version__, rc.roi_pool.__module__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [rc.__version__, "roicore.core.ops"]
