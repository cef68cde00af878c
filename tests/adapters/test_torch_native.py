"""roicore's PyTorch op library: the C++ operators against the Python ones, and what only
the library does: TorchScript modules and AOTInductor packages that run in a fresh process
with nothing but the library, its errors, and how it is found and loaded.

The adapter's numbers are checked against torchvision in test_torch.py, which runs on the
library and (test_the_python_operators_pass_this_file) on the Python custom ops.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

from conftest import REQUIRE, framework

torch = framework("torch", "the PyTorch adapter tests need torch")
framework("torchvision", "the PyTorch adapter tests need torchvision")

from roicore.adapters import torch as rt  # noqa: E402
from roicore.adapters._common import switched_off  # noqa: E402

OPS = ["roi_pool", "roi_align", "ps_roi_pool", "ps_roi_align"]


@pytest.fixture(scope="module")
def library():
    path = rt.native_library()
    if path is None:
        message = ("roicore's PyTorch op library is not available (ROICORE_TORCH_NATIVE=0, or "
                   "see its NativeOpsWarning)")
        if REQUIRE and not switched_off("ROICORE_TORCH_NATIVE"):
            pytest.fail(message)
        pytest.skip(message)
    return path


_PYTHON_OPS = {}


@pytest.fixture(scope="module")
def python_ops(library):
    """The Python custom ops (the fallback's kernels, autograd and fakes) beside the
    library's, as ``roicore_python::<op>``: defined once per process."""
    if "ops" not in _PYTHON_OPS:
        _PYTHON_OPS["ops"] = rt._python_operators("roicore_python")
    return _PYTHON_OPS["ops"]


def run_python(code, *args, env=None, timeout=600):
    """Run ``code`` in a fresh interpreter; returns its stdout (fails on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def _bits(t):
    t = t.detach().contiguous()
    types = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.view(types[t.element_size()])


def assert_same(actual, expected, what=""):
    """Bit for bit, NaNs included; shapes and dtypes must agree."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, \
        (what, actual.shape, expected.shape, actual.dtype, expected.dtype)
    assert torch.equal(_bits(actual), _bits(expected)), f"{what}: the bits differ"


def inputs(dtype=torch.float32, seed=0, channels=8):
    """A (2, C, 10, 12) map and boxes of every kind: reversed, zero-size, outside the map."""
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.standard_normal((2, channels, 10, 12))).to(dtype)
    xy = rng.uniform(-4, 24, (7, 2))
    wh = rng.uniform(-6, 16, (7, 2))
    wh[3] = 0
    rois = np.hstack([rng.integers(0, 2, (7, 1)), xy, xy + wh])
    return x, torch.from_numpy(rois).to(dtype)


# (op, its arguments after (input, rois)) for each forward op
CALLS = [
    ("roi_pool", (0.5, 3, 2, True, None)),
    ("roi_pool", (0.5, 3, 2, False, 2)),
    ("roi_align", (0.5, 3, 2, 2, True, None)),
    ("roi_align", (0.7, 2, 2, -1, False, 1)),
    ("ps_roi_pool", (0.7, 2, 2, None)),
    ("ps_roi_align", (0.7, 2, 2, 2, None)),
    ("ps_roi_align", (0.5, 2, 2, -1, 2)),
]


# ---------------------------------------------------------------------------------------
# the library's operators are the Python ones, in C++

def test_schemas_are_the_python_operators(library, python_ops):
    """The same names and schemas, so a program exported through one path loads in a
    process that has the other."""
    for name in rt._OP_NAMES:
        native = str(getattr(torch.ops.roicore, name).default._schema)
        python = str(getattr(torch.ops.roicore_python, name).default._schema)
        assert native == python.replace("roicore_python::", "roicore::"), (native, python)
        assert torch.Tag.pt2_compliant_tag in getattr(torch.ops.roicore, name).default.tags


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=str)
@pytest.mark.parametrize("i", range(len(CALLS)))
def test_outputs_and_gradients_are_the_python_operators(library, python_ops, i, dtype):
    """Forward outputs (the argmax too) and input gradients of the C++ operators equal the
    Python operators' bit for bit, in every dtype (float16 and bfloat16 computed in float32
    and rounded once); roi_pool without an argmax recomputes it for the gradient."""
    op, args = CALLS[i]
    x, rois = inputs(dtype, seed=i, channels=8)
    g = None
    results = []
    for ops in (torch.ops.roicore, torch.ops.roicore_python):
        xg = x.clone().requires_grad_(True)
        out = getattr(ops, op)(xg, rois, *args)
        y = out[0] if op == "roi_pool" else out
        if g is None:
            g = torch.from_numpy(np.random.default_rng(i).standard_normal(tuple(y.shape))).to(dtype)
        y.backward(g)
        results.append((out, xg.grad))
    (native, native_grad), (python, python_grad) = results
    for got, want in zip(native if op == "roi_pool" else [native],
                         python if op == "roi_pool" else [python]):
        assert_same(got, want, f"{op} output")
    assert_same(native_grad, python_grad, f"{op} gradient")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16], ids=str)
def test_backward_operators_are_the_python_operators(library, python_ops, dtype):
    """The *_backward ops called directly, with strided upstream gradients."""
    x, rois = inputs(dtype, seed=3)
    n, c, h, w = x.shape
    argmax = torch.ops.roicore.roi_pool(x, rois, 0.5, 3, 2, True, None)[1]

    def strided(*shape):  # a (K, C, PH, PW) gradient that is not contiguous
        k, ch, ph, pw = shape
        return torch.randn(k, pw, ch, ph, dtype=torch.float64).to(dtype).permute(0, 2, 3, 1)

    calls = [("roi_pool_backward", (strided(7, c, 3, 2), argmax, rois, n, c, h, w, None)),
             ("roi_align_backward", (strided(7, c, 2, 3), rois, 0.5, n, c, h, w, 2, True, None)),
             ("ps_roi_pool_backward", (strided(7, c // 4, 2, 2), rois, 0.7, n, c, h, w, None)),
             ("ps_roi_align_backward", (strided(7, c // 4, 2, 2), rois, 0.7, n, c, h, w, -1, 1))]
    for op, args in calls:
        assert not args[0].is_contiguous()
        native = getattr(torch.ops.roicore, op)(*args)
        python = getattr(torch.ops.roicore_python, op)(*args)
        assert_same(native, python, op)


def test_double_backward_is_refused(library):
    """A gradient of the gradient (with respect to the upstream gradient, which the input
    gradient depends on) is refused with a message, as in torchvision."""
    x, rois = inputs()
    for op, args in CALLS:
        xg = x.clone().requires_grad_(True)
        out = getattr(torch.ops.roicore, op)(xg, rois, *args)
        y = out[0] if op == "roi_pool" else out
        upstream = torch.ones_like(y, requires_grad=True)
        (g,) = torch.autograd.grad(y, xg, upstream, create_graph=True)
        with pytest.raises(RuntimeError, match=rf"roicore::{op}_backward: double backward is "
                                               r"not supported"):
            g.sum().backward()


@pytest.mark.parametrize("i", range(len(CALLS)))
def test_opcheck(library, i):
    """torch.library.opcheck on the C++ operators, in float32 (test_torch.py checks float64)."""
    op, args = CALLS[i]
    x, rois = inputs(torch.float32, seed=i)
    y = getattr(torch.ops.roicore, op)(x, rois, *args)
    y = y[0] if op == "roi_pool" else y
    rois = rois[~y.isnan().flatten(1).any(1)]  # opcheck compares outputs: NaN never equals NaN
    torch.library.opcheck(getattr(torch.ops.roicore, op), (x.requires_grad_(True), rois, *args))


def test_roi_align_is_autocast_as_in_torchvision(library):
    """The library's CPU autocast rule for roi_align: torch.ops.roicore.roi_align under
    autocast computes in float32 and returns the input's dtype, as torchvision's op."""
    import torchvision
    x, rois = inputs(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.ops.roicore.roi_align(x, rois.float(), 0.5, 3, 2, 2, True, None)
        want = torch.ops.torchvision.roi_align(x, rois.float(), 0.5, 3, 2, 2, True)
    assert_same(got, want, "roi_align under autocast")
    assert_same(got, torchvision.ops.roi_align(x.float(), rois.float(), (3, 2), 0.5, 2, True)
                .to(torch.bfloat16), "float32 computed")


# ---------------------------------------------------------------------------------------
# errors: a clear message naming the argument, never a crash

def _bad_calls():
    x, rois = inputs()
    ok = (x, rois, 0.5, 2, 2, 2, False, None)           # roi_align's arguments
    g = torch.randn(7, 8, 2, 2)
    back = (g, rois, 0.5, 2, 8, 10, 12, 2, False, None)  # roi_align_backward's

    def align(**changes):
        names = ["input", "rois", "spatial_scale", "ph", "pw", "sampling_ratio", "aligned",
                 "n_threads"]
        args = dict(zip(names, ok), **changes)
        return lambda: torch.ops.roicore.roi_align(*args.values())

    def align_backward(**changes):
        names = ["grad", "rois", "spatial_scale", "n", "c", "h", "w", "sampling_ratio",
                 "aligned", "n_threads"]
        args = dict(zip(names, back), **changes)
        return lambda: torch.ops.roicore.roi_align_backward(*args.values())

    nan = rois.clone()
    nan[2, 3] = float("nan")
    far = rois.clone()
    far[0, 1] = 1e30
    return [
        (align(input=x.long()), TypeError, r"roi_align: input must be float32, float64, float16 "
                                           r"or bfloat16, got torch.int64"),
        (align(rois=rois.int()), TypeError, r"roi_align: rois must be float32"),
        (align(input=x[0]), ValueError, r"roi_align: input must be a 4-D Tensor\[N, C, H, W\], "
                                        r"got shape \(8, 10, 12\)"),
        (align(input=x[:, :, :0]), ValueError, r"input must have H >= 1 and W >= 1"),
        (align(rois=rois[:, 1:]), ValueError, r"rois must be a Tensor\[K, 5\].*got shape \(7, 4\)"),
        (align(rois=rois[0]), ValueError, r"rois must be a Tensor\[K, 5\].*got shape \(5,\)"),
        (align(rois=torch.tensor([[2.0, 0, 0, 4, 4]])), ValueError,
         r"boxes\[:, 0\]\[0\] = 2 is out of range for a feature map with N=2 images"),
        (align(rois=torch.tensor([[0.5, 0, 0, 4, 4]])), ValueError,
         r"boxes\[:, 0\]\[0\] \(a batch index\) must be an integer"),
        (align(rois=nan), ValueError, r"boxes coordinates must be finite, got nan in box 2"),
        (align(rois=far), ValueError, r"boxes\[0\] coordinate 1e\+30 lies"),
        (align(spatial_scale=-1.0), ValueError, r"spatial_scale must be positive and finite"),
        (align(spatial_scale=float("inf")), ValueError, r"spatial_scale must be positive"),
        (align(ph=0), ValueError, r"pooled_height and pooled_width must be >= 1, got \(0, 2\)"),
        (align(sampling_ratio=-2), ValueError, r"sampling_ratio must be >= -1"),
        (align(sampling_ratio=5000), ValueError, r"sampling_ratio must be <= 1024"),
        (align(n_threads=0), ValueError, r"n_threads = 0 is invalid"),
        (align(n_threads=5000), ValueError, r"n_threads must be at most 1024"),
        (align_backward(grad=g[:3]), ValueError,
         r"roi_align_backward: grad must have shape \(7, 8, PH, PW\)"),
        (align_backward(grad=g[0]), ValueError, r"grad must be a 4-D Tensor"),
        (align_backward(h=0), ValueError, r"\(batch_size, channels, height, width\) must be"),
        (align_backward(n=1), ValueError, r"boxes\[:, 0\]\[\d\] = 1 is out of range .* N=1"),
        (lambda: torch.ops.roicore.roi_pool_backward(g, torch.zeros(7, 8, 2, 2), rois, 2, 8, 10,
                                                     12, None),
         TypeError, r"roi_pool_backward: argmax must have an integer dtype, got torch.float32"),
        (lambda: torch.ops.roicore.roi_pool_backward(g, torch.zeros(7, 8, 2, 1, dtype=torch.int32),
                                                     rois, 2, 8, 10, 12, None),
         ValueError, r"argmax and grad must both have the forward output's shape"),
        (lambda: torch.ops.roicore.roi_pool_backward(g, torch.full((7, 8, 2, 2), 500,
                                                                   dtype=torch.int32),
                                                     rois, 2, 8, 10, 12, None),
         ValueError, r"argmax"),
        (lambda: torch.ops.roicore.ps_roi_pool(x, rois, 0.5, 3, 3, None), ValueError,
         r"ps_roi_pool: input has C=8 channels, which is not a multiple of the group area "
         r"3x3=9"),
        (lambda: torch.ops.roicore.ps_roi_align_backward(torch.randn(7, 2, 2, 2), rois, 0.5, 2,
                                                         9, 10, 12, -1, None), ValueError,
         r"has C=9 channels, which is not a multiple of the group area 2x2=4"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_errors_name_the_argument(library, i):
    call, kind, message = _bad_calls()[i]
    with pytest.raises(kind, match=message):
        call()


def test_memory_limit_is_roicore_cores(library):
    """The library shares roicore.core's runtime: its memory limit refuses an output."""
    from roicore import core
    x, rois = inputs()
    previous = core.get_memory_limit()
    core.set_memory_limit(1000)
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"the output of shape \(7, 8, 20, 20\)"):
            torch.ops.roicore.roi_align(x, rois, 0.5, 20, 20, 2, False, None)
    finally:
        core.set_memory_limit(previous)


@pytest.mark.parametrize("case", ["float16 output and its float32 sums", "output and argmax"])
def test_memory_limit_counts_every_allocation_of_a_call(library, case):
    """An output and what the call allocates beside it (the float32 result a float16 one is
    rounded from; roi_pool's argmax) are checked together: each alone fits the limit
    below, both do not."""
    from roicore import core
    x, rois = inputs()
    k, c = rois.shape[0], x.shape[1]
    if case.startswith("float16"):
        x, rois = x.half(), rois.half()
        call = lambda: torch.ops.roicore.roi_align(x, rois, 0.5, 20, 20, 2, False, None)  # noqa: E731
        alone = k * c * 20 * 20 * 4  # the float32 output
    else:
        call = lambda: torch.ops.roicore.roi_pool(x, rois, 0.5, 20, 20, True, None)  # noqa: E731
        alone = k * c * 20 * 20 * x.element_size()
    previous = core.get_memory_limit()
    core.set_memory_limit(alone + 100)
    try:
        with pytest.raises(torch.OutOfMemoryError, match=r"the output of shape \(7, 8, 20, 20\)"):
            call()
    finally:
        core.set_memory_limit(previous)
    assert call() is not None


# ---------------------------------------------------------------------------------------
# deployments: a fresh process with nothing but the library

class _Model(torch.nn.Module):
    """Every operator on a convolution's output (or, without ``conv``, on the input: an
    AOTInductor package computes a convolution with code of its own, in other bits);
    boxes as a tensor and as a list."""

    def __init__(self, conv=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1) if conv else torch.nn.Identity()
        self.pool = rt.RoIPool((3, 2), 0.5)
        self.align = rt.RoIAlign(2, 0.5, 2, aligned=True)
        self.ps_pool = rt.PSRoIPool(2, 0.5)
        self.ps_align = rt.PSRoIAlign(2, 1, -1, n_threads=1)

    def forward(self, img, rois):
        x = torch.relu(self.conv(img))
        boxes = [rois[rois[:, 0] == i][:, 1:] for i in range(2)]
        return (self.pool(x, rois), self.align(x, boxes), self.ps_pool(x, rois),
                self.ps_align(x, rois), rt.roi_align(x, rois, 3, 0.25, -1, n_threads=2))


def _model_inputs():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 12, 14)
    _, rois = inputs(seed=4)
    return img, rois


# the start of a fresh process's script: torch, and the op library (argv[1]) alone
_NO_ROICORE = """
        import sys
        import torch
        torch.ops.load_library(sys.argv[1])
        assert not any(m == "roicore" or m.startswith("roicore.") for m in sys.modules), \\
            sorted(m for m in sys.modules if "roicore" in m)
"""


def test_scripted_module_runs_in_a_fresh_process_with_only_the_library(library, tmp_path):
    """torch.jit.script, torch.jit.save; a process that loads only the library (no roicore)
    loads the module and computes the same bits; its errors are the ops'."""
    torch.manual_seed(1)
    model = _Model().eval()
    img, rois = _model_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated
        scripted = torch.jit.script(model)
    want = model(img, rois)
    for got, expected in zip(scripted(img, rois), want):
        assert_same(got, expected, "scripted in this process")
    torch.jit.save(scripted, str(tmp_path / "model.pt"))
    torch.save({"img": img, "rois": rois}, tmp_path / "inputs.pt")
    out = run_python(_NO_ROICORE + """
        import warnings
        warnings.simplefilter("ignore")
        model = torch.jit.load(sys.argv[2])
        inputs = torch.load(sys.argv[3])
        torch.save(list(model(inputs["img"], inputs["rois"])), sys.argv[4])
        try:
            model(inputs["img"], inputs["rois"] * torch.tensor([3.0, 1, 1, 1, 1]))
        except Exception as exc:
            print(type(exc).__name__, exc)
        """, library, tmp_path / "model.pt", tmp_path / "inputs.pt", tmp_path / "out.pt")
    got = torch.load(tmp_path / "out.pt")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w, "scripted in a fresh process")
    assert "= 3 is out of range for a feature map with N=2 images" in out, out


def test_scripted_module_trains(library):
    """A scripted module's gradients are the eager module's."""
    torch.manual_seed(2)
    model = _Model()
    img, rois = _model_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(model)
    grads = []
    for m in (model, scripted):
        m.zero_grad()
        sum(y.square().sum() for y in m(img, rois)).backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for g, w in zip(*grads):
        assert_same(g, w, "gradient")


def test_aoti_package_runs_in_a_fresh_process_with_only_the_library(library, tmp_path):
    """torch.export, AOTInductor's package; a process that loads only the library and the
    package computes the same bits."""
    model = _Model(conv=False).eval()
    img, rois = _model_inputs()
    img = torch.randn(2, 8, 12, 14)
    with torch.no_grad():
        program = torch.export.export(model, (img, rois))
        want = model(img, rois)
    package = torch._inductor.aoti_compile_and_package(
        program, package_path=str(tmp_path / "model.pt2"))
    torch.save({"img": img, "rois": rois}, tmp_path / "inputs.pt")
    run_python(_NO_ROICORE + """
        runner = torch._inductor.aoti_load_package(sys.argv[2])
        inputs = torch.load(sys.argv[3])
        with torch.no_grad():
            torch.save(list(runner(inputs["img"], inputs["rois"])), sys.argv[4])
        """, library, package, tmp_path / "inputs.pt", tmp_path / "out.pt")
    got = torch.load(tmp_path / "out.pt")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_same(g, w, "AOTInductor package in a fresh process")


def test_program_exported_with_the_python_operators_runs_on_the_library(library, tmp_path):
    """torch.export.save in a process on the Python operators (ROICORE_TORCH_NATIVE=0);
    torch.export.load here, on the library: the same bits."""
    img, rois = _model_inputs()
    torch.save({"img": img, "rois": rois}, tmp_path / "inputs.pt")
    run_python(f"""
        import importlib, sys, types
        import torch
        from roicore.adapters import torch as rt
        assert rt.native_library() is None
        # this file's _Model, without the test suite's conftest (it imports every framework)
        sys.modules["conftest"] = types.SimpleNamespace(
            REQUIRE=False, framework=lambda name, reason: importlib.import_module(name))
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from test_torch_native import _Model
        torch.manual_seed(3)
        model = _Model().eval()
        inputs = torch.load(sys.argv[1])
        with torch.no_grad():
            program = torch.export.export(model, (inputs["img"], inputs["rois"]))
            torch.save(list(model(inputs["img"], inputs["rois"])), sys.argv[2])
        torch.export.save(program, sys.argv[3])
        """, tmp_path / "inputs.pt", tmp_path / "out.pt", tmp_path / "program.pt2",
               env={"ROICORE_TORCH_NATIVE": "0"})
    loaded = torch.export.load(str(tmp_path / "program.pt2"))
    with torch.no_grad():
        got = loaded.module()(img, rois)
    for g, w in zip(got, torch.load(tmp_path / "out.pt")):
        assert_same(g, w, "exported by the Python operators, run on the library")


# ---------------------------------------------------------------------------------------
# finding and loading the library

def test_module_prints_the_library_path(library):
    out = run_python("import runpy; runpy.run_module('roicore.adapters.native.torch', "
                     "run_name='__main__')", env={"ROICORE_TORCH_OP_LIBRARY": ""})
    assert pathlib.Path(out.strip()) == library


def test_a_given_library_file_is_loaded(library, tmp_path):
    """ROICORE_TORCH_OP_LIBRARY names the file to load (one built elsewhere)."""
    copy = tmp_path / "ops.so"
    shutil.copy(library, copy)
    out = run_python("""
        from roicore.adapters import torch as rt
        print(rt.native_library())
        """, env={"ROICORE_TORCH_OP_LIBRARY": str(copy)})
    assert out.strip() == str(copy)


def test_a_library_loaded_before_the_import_is_used(library, tmp_path):
    """A process that loaded a copy of the library (a deployment) and then imports the
    adapter uses that copy, and shares roicore.core's runtime with it."""
    copy = tmp_path / "ops.so"
    shutil.copy(library, copy)
    out = run_python("""
        import sys
        import torch
        torch.ops.load_library(sys.argv[1])
        from roicore import core
        from roicore.adapters import torch as rt
        print(rt.native_library())
        core.set_memory_limit(1000)
        try:
            rt.roi_align(torch.zeros(1, 64, 8, 8), torch.tensor([[0, 0, 0, 4, 4.0]]), 7)
        except torch.OutOfMemoryError as exc:
            print("refused")
        """, copy)
    assert out.split() == [str(copy), "refused"]


def test_switched_off_runs_the_python_operators_without_a_warning():
    out = run_python("""
        import warnings
        import torch
        from roicore.adapters import torch as rt
        warnings.simplefilter("error")
        y = rt.roi_align(torch.ones(1, 2, 6, 6), torch.tensor([[0, 0, 0, 4, 4.0]]), 2)
        print(rt.native_library(), rt._PYTHON_OPS.roi_align, float(y.sum()))
        """, env={"ROICORE_TORCH_NATIVE": "0"})
    assert out.split() == ["None", "<CustomOpDef(roicore::roi_align)>", "8.0"]


def test_without_a_compiler_the_first_call_warns_once(tmp_path):
    """No library can be built: the import succeeds, the Python operators run, and the first
    call warns why (NativeOpsWarning), once."""
    out = run_python("""
        import warnings
        import torch
        from roicore.adapters import torch as rt
        assert rt.native_library() is None
        x, b = torch.ones(1, 2, 6, 6), torch.tensor([[0, 0, 0, 4, 4.0]])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rt.roi_align(x, b, 2)
            rt.roi_pool(x, b, 2)
        print(len(caught), caught[0].category.__name__, caught[0].filename == "<string>")
        print(caught[0].message)
        """, env={"ROICORE_CACHE_DIR": str(tmp_path / "cache"), "CXX": "false",
                  "ROICORE_TORCH_OP_LIBRARY": ""})
    first, message = out.splitlines()[:2]
    assert first == "1 NativeOpsWarning True", out
    assert "NativeBuildError" in message and "false" in message, message


# ---------------------------------------------------------------------------------------
# Ctrl-C

@pytest.mark.slow
def test_ctrl_c_stops_a_call(library, tmp_path):
    """The library shares roicore.core's runtime, whose SIGINT watch stops its calls: a call
    of half a minute exits with KeyboardInterrupt within seconds of SIGINT."""
    script = tmp_path / "long_call.py"
    script.write_text(textwrap.dedent("""
        import torch
        from roicore.adapters import torch as rt
        x = torch.ones(1, 64, 256, 256)
        print("calling", flush=True)
        rt.roi_align(x, torch.tensor([[0, 0, 0, 255, 255.0]]), 64, 1.0, 1024)
        print("finished", flush=True)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    try:
        assert proc.stdout.readline().strip() == "calling", proc.communicate()
        time.sleep(2.0)
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert "finished" not in out and proc.returncode != 0, (out, err[-3000:])
    assert "KeyboardInterrupt" in err or "interrupted by Ctrl-C" in err, err[-3000:]
    assert took < 5.0, f"{took:.1f} s from SIGINT to exit\n{err[-3000:]}"
