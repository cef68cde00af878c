"""The command line itself: --version, --help, and exit status 2 for every kind of bad usage."""
import importlib.metadata
import json

import numpy as np
import pytest

from cli_run import roicore


def test_version():
    proc = roicore("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["roicore", importlib.metadata.version("roicore")]


def test_help_and_module_entry():
    proc = roicore("--help")
    assert proc.returncode == 0 and "parity" in proc.stdout and "bench" in proc.stdout
    assert "--version" in proc.stdout
    for cmd in ("parity", "bench"):
        proc = roicore(cmd, "--help")
        assert proc.returncode == 0 and "--frameworks" in proc.stdout and "--json" in proc.stdout
        # both commands document their exit status, 0, 1 and 2
        text = " ".join(proc.stdout.split())
        assert "exit status: 0 when" in text and " 1 when" in text and "2 on bad usage" in text
    bench = " ".join(roicore("bench", "--help").stdout.split())
    for flag in ("--markdown", "--csv", "--compare", "--threshold", "--dtypes", "--conventions",
                 "--plot FILE.png", "roicore[plot]"):
        assert flag in bench, flag


def _baseline(tmp_path, **fields):
    f = tmp_path / "base.json"
    f.write_text(json.dumps(fields))
    return str(f)


BAD_BENCH = [
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--threads", "two"], "--threads takes a count"),
    (["--threads", "1,100000"], "--threads must be at most 1024"),
    (["--scale", "2"], "--scale must be in (0, 1]"),
    (["--frameworks", "jax"], "unknown framework 'jax'"),
    (["--ops", "roi_warp"], "unknown operator 'roi_warp'"),
    (["--dtypes", "float16"], "unknown dtype 'float16'"),
    (["--conventions", "caffe"], "unknown convention 'caffe'"),
    (["--workloads", ","], "no workload selected"),
    (["--threshold", "5%"], "--threshold applies to --compare"),
    (["--threads", "1,2", "--frameworks", "paddle"], "drop --frameworks"),
    (["--threads", "1,2", "--plot", "x.png"], "drop --plot"),
    (["--scaling", "--threads", "1"], "--scaling compares 1 thread with N >= 2"),
    (["--compare", "/nonexistent/base.json"], "cannot read /nonexistent/base.json"),
]


@pytest.mark.parametrize("args,message", BAD_BENCH, ids=[" ".join(a) for a, _ in BAD_BENCH])
def test_bench_usage_errors_exit_2(args, message):
    proc = roicore("bench", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert message in proc.stderr and "usage: roicore bench" in proc.stderr
    assert not proc.stdout      # refused before any worker started


def test_bench_unusable_baselines_exit_2(tmp_path):
    cases = [
        ("not json", "is not JSON"),
        (json.dumps({"command": "parity", "results": []}), "is not a report written by roicore "
                                                           "bench --json"),
        (json.dumps({"command": "bench", "scale": 1.0, "results": []}), "scaled by 1.0, this "
                                                                         "run's by 0.03"),
        (json.dumps({"command": "bench", "scale": 0.03, "results": [{"kind": "adapter"}]}),
         "malformed result row"),
        (json.dumps({"command": "bench", "scale": 0.03, "results": [dict(
            workload="train_b2", operator="roi_pool", dtype="float32", direction="forward",
            framework="roicore", kind="core", variant="", threads=64, median_ms=1.0,
            times_ms=[1.0])]}), "no row of roicore's that this run will time"),
    ]
    for text, message in cases:
        f = tmp_path / "base.json"
        f.write_text(text)
        proc = roicore("bench", "--quick", "--compare", str(f))
        assert proc.returncode == 2 and message in proc.stderr, (text, proc.stderr)
    proc = roicore("bench", "--quick", "--compare", str(f), "--threshold", "ten")
    assert proc.returncode == 2 and "--threshold takes a percentage" in proc.stderr


def test_parity_usage_errors_exit_2(tmp_path):
    for args, message in ((["--frameworks", "caffe"], "unknown framework 'caffe'"),
                          (["--frameworks", "jax"], "unknown framework 'jax'"),
                          (["--cases", "-1"], "--cases must be >= 0"),
                          (["--dtypes", "int8"], "unknown dtype 'int8'")):
        proc = roicore("parity", *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
    f = tmp_path / "bad.npz"
    np.savez(f, x=np.zeros((1, 1, 4, 4), np.float32))
    proc = roicore("parity", "--inputs", str(f), "--frameworks", "openvino")
    assert proc.returncode == 2 and "--inputs" in proc.stderr and "rois" in proc.stderr
    proc = roicore("parity", "--inputs", str(tmp_path / "missing.npz"))
    assert proc.returncode == 2 and "missing.npz" in proc.stderr


def test_argparse_errors_exit_2():
    assert roicore().returncode == 2                            # no command
    assert roicore("bench", "--repeats", "x").returncode == 2   # not an int
    assert roicore("frobnicate").returncode == 2


BLOCK_MATPLOTLIB = """if 1:
    import sys
    class Block:                  # matplotlib not installed, as far as imports can tell
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib" or name.startswith("matplotlib."):
                raise ImportError("No module named 'matplotlib'")
    sys.meta_path.insert(0, Block())
    from roicore.cli import main
    raise SystemExit(main(sys.argv[1:]))
"""


def test_plot_without_matplotlib_names_the_extra_and_exits_2(tmp_path):
    png = tmp_path / "x.png"
    proc = roicore("bench", "--quick", "--plot", str(png), python=("-c", BLOCK_MATPLOTLIB))
    assert proc.returncode == 2, proc.stderr
    assert "matplotlib" in proc.stderr and "pip install 'roicore[plot]'" in proc.stderr
    assert not png.exists() and not proc.stdout   # refused before the run


def test_importing_the_cli_and_its_harnesses_loads_no_framework():
    code = """if 1:
        import sys
        import roicore.cli
        assert "numpy" not in sys.modules, "roicore.cli imported NumPy"
        from roicore.cli import frameworks
        for name in frameworks.NAMES:
            frameworks.harness_class(name)       # the module, not the framework
        import roicore.cli.bench, roicore.cli.parity
        loaded = {"paddle", "mxnet", "tensorflow", "openvino", "onnxruntime", "onnx", "torch",
                  "keras", "matplotlib"} & set(sys.modules)
        assert not loaded, loaded
    """
    proc = roicore(python=("-c", code))
    assert proc.returncode == 0, proc.stderr
