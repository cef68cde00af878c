"""roicore.adapters.torch against torchvision's own CPU kernels.

Parity means bit-identical outputs and input gradients (for a random upstream gradient) to
``torchvision.ops`` on identical inputs, in float32 and float64, for every box format and
thread count; then the operators inside real models (a convolution's output in, SGD steps
and DDP gradients out), and the PyTorch machinery: opcheck, torch.compile, torch.export,
TorchScript.

The file runs on the operators this process has: roicore's C++ op library when it can be
built (always in CI), else the Python custom ops.  test_the_python_operators_pass_this_file
runs it again in a process where ROICORE_TORCH_NATIVE=0 makes them the Python ones, so both
paths pass every test here; test_torch_native.py checks what only the library does.
"""
import copy
import inspect
import io
import os
import re
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import framework

torch = framework("torch", "the PyTorch adapter tests need torch")
torchvision = framework("torchvision", "the PyTorch adapter tests need torchvision")
from torchvision import ops as native  # noqa: E402

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from roicore.adapters import DeviceCopyWarning, _common, set_device_policy  # noqa: E402
from roicore.adapters import torch as rt  # noqa: E402
from strategies import cases  # noqa: E402

OPS = ["roi_pool", "roi_align", "ps_roi_pool", "ps_roi_align"]
MODULES = {"roi_pool": "RoIPool", "roi_align": "RoIAlign", "ps_roi_pool": "PSRoIPool",
           "ps_roi_align": "PSRoIAlign"}
DTYPES = [torch.float32, torch.float64]
# whether torch.ops.roicore.* are the C++ op library's (else the Python custom ops)
NATIVE = rt.native_library() is not None
python_operators_only = pytest.mark.skipif(
    NATIVE, reason="observes the Python operators' calls of roicore.core; the run of "
                   "test_the_python_operators_pass_this_file covers them")


# ----------------------------------------------------------------------------- helpers

def _bits(t):
    t = t.detach().cpu()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def mismatches(actual, expected):
    """Elements whose bits differ (any NaN equals any NaN); shapes and dtypes must agree."""
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    both_nan = torch.isnan(actual) & torch.isnan(expected)
    return int(((_bits(actual) != _bits(expected)) & ~both_nan).sum())


def assert_same(actual, expected, what=""):
    n = mismatches(actual, expected)
    assert n == 0, f"{what}: {n} of {expected.numel()} elements differ"


def position_sensitive(op):
    return op.startswith("ps_")


def op_args(op, size, scale, sampling_ratio=-1, aligned=False):
    """The positional arguments after (input, boxes), as torchvision takes them."""
    if op in ("roi_pool", "ps_roi_pool"):
        return (size, scale)
    if op == "roi_align":
        return (size, scale, sampling_ratio, aligned)
    return (size, scale, sampling_ratio)


def run(fn, x, boxes, args, g_seed=0, **kw):
    """(output, input gradient for a seeded random upstream gradient) on a fresh leaf."""
    x = x.detach().clone().requires_grad_(True)
    y = fn(x, boxes, *args, **kw)
    g = torch.from_numpy(np.random.default_rng(g_seed).standard_normal(tuple(y.shape))).to(y.dtype)
    y.backward(g)
    return y.detach(), x.grad


def torchvision_safe(op, rois, args):
    """Drop what torchvision cannot run: roi_align with aligned=True and an adaptive grid
    on a reversed box sizes a vector with a negative count and throws.  roicore gives 0
    there (test_aligned_reversed_box_is_zero_where_torchvision_throws)."""
    if op != "roi_align" or not args[3] or args[2] > 0:
        return rois
    keep = (rois[:, 3] >= rois[:, 1]) & (rois[:, 4] >= rois[:, 2])
    return rois[keep]


def make_input(case, op, out_ch=2):
    """The case's feature map, with D * PH * PW channels for position-sensitive ops."""
    x = case.x
    if position_sensitive(op):
        PH, PW = case.output_size
        rng = np.random.default_rng(7)
        x = rng.standard_normal(x.shape[:1] + (out_ch * PH * PW,) + x.shape[2:]).astype(x.dtype)
    return torch.from_numpy(x)


def as_list(rois, n_images):
    """Tensor[K, 5] rois -> one Tensor[L, 4] per image, with the rows regrouped by image."""
    order = torch.argsort(rois[:, 0], stable=True)
    rois = rois[order]
    return [rois[rois[:, 0] == i][:, 1:] for i in range(n_images)], rois


# ----------------------------------------------------------------------------- parity

@pytest.mark.parametrize("op", OPS)
@given(case=cases(max_c=3, max_hw=14, max_k=6, max_p=3), sampling_ratio=st.sampled_from([-1, 0, 2]),
       aligned=st.booleans(), boxes_as_list=st.booleans(), n_threads=st.sampled_from([1, 2, 3]))
def test_parity_with_torchvision(op, case, sampling_ratio, aligned, boxes_as_list, n_threads):
    x = make_input(case, op)
    args = op_args(op, case.output_size, case.spatial_scale, sampling_ratio, aligned)
    rois = torchvision_safe(op, torch.from_numpy(case.rois), args)
    boxes = rois
    if boxes_as_list:
        boxes, rois = as_list(rois, x.shape[0])
    want_y, want_g = run(getattr(native, op), x, rois, args)
    got_y, got_g = run(getattr(rt, op), x, boxes, args, n_threads=n_threads)
    assert_same(got_y, want_y, f"{op} output")
    assert_same(got_g, want_g, f"{op} gradient")


def large_case(op, dtype, seed):
    """A 512-box case on a 2 x C x 38 x 50 map: boxes of every kind, adaptive sampling
    (position-sensitive: 6 output channels, four of them computed side by side)."""
    rng = np.random.default_rng(seed)
    C = 6 * 49 if position_sensitive(op) else 16
    x = torch.from_numpy(rng.standard_normal((2, C, 38, 50))).to(dtype)
    xy = rng.uniform(-100, 850, (512, 2))
    wh = rng.uniform(-60, 500, (512, 2))
    wh[::17] = 0                                   # zero-size boxes
    rois = np.hstack([rng.integers(0, 2, (512, 1)), xy, xy + wh])
    rois[::13, 1:] = np.round(rois[::13, 1:] * 2) / 2   # halves
    args = op_args(op, 7, 1 / 16, -1, bool(seed % 2))
    return x, torchvision_safe(op, torch.from_numpy(rois).to(dtype), args), args


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_parity_on_a_large_case(op, dtype):
    for seed in (0, 1):
        x, rois, args = large_case(op, dtype, seed)
        want_y, want_g = run(getattr(native, op), x, rois, args, seed)
        got_y, got_g = run(getattr(rt, op), x, rois, args, seed, n_threads=2)
        assert_same(got_y, want_y, f"{op} output")
        assert_same(got_g, want_g, f"{op} gradient")


def test_aligned_reversed_box_is_zero_where_torchvision_throws():
    x = torch.randn(1, 2, 8, 8)
    rois = torch.tensor([[0, 6.0, 1, 1, 7]])           # x2 < x1: grid -2 x 3
    # torchvision sizes a std::vector by the negative grid; torch reports the C++
    # length_error as RuntimeError, or (recent versions) as ValueError
    with pytest.raises((RuntimeError, ValueError), match="vector|grid|size"):
        native.roi_align(x, rois, 2, 1.0, -1, True)
    assert not rt.roi_align(x, rois, 2, 1.0, -1, True).any()


def test_ps_roi_align_zero_size_box_is_nan_like_torchvision():
    x = torch.randn(1, 4, 8, 8)
    rois = torch.tensor([[0, 3.0, 3, 3, 3], [0, 1, 1, 6, 6]])
    got, want = rt.ps_roi_align(x, rois, 2), native.ps_roi_align(x, rois, 2)
    assert torch.isnan(want[0]).all() and not torch.isnan(want[1]).any()
    assert_same(got, want, "ps_roi_align")


@pytest.mark.parametrize("op", OPS)
def test_modules_match_torchvision(op):
    x, rois, args = large_case(op, torch.float32, 2)
    theirs = getattr(native, MODULES[op])(*args)
    mine = getattr(rt, MODULES[op])(*args, n_threads=2)
    assert repr(mine) == repr(theirs)
    assert_same(mine(x, rois), theirs(x, rois), MODULES[op])
    boxes, rois = as_list(rois, 2)
    assert_same(mine(x, boxes), theirs(x, rois), f"{MODULES[op]} with a list of boxes")


@pytest.mark.parametrize("op", OPS)
def test_signatures_are_torchvisions_with_n_threads(op):
    for name in (op, MODULES[op]):
        ours, theirs = (inspect.signature(getattr(m, name)) for m in (rt, native))
        params = list(ours.parameters.values())
        assert params[-1].name == "n_threads" and params[-1].default is None
        assert params[-1].kind is inspect.Parameter.KEYWORD_ONLY
        assert [(p.name, p.default) for p in params[:-1]] == \
               [(p.name, p.default) for p in theirs.parameters.values()]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_half_precision_is_computed_in_float32(op, dtype):
    x, rois, args = large_case(op, torch.float32, 3)
    x, rois = x.to(dtype), rois.to(dtype)
    got_y, got_g = run(getattr(rt, op), x, rois, args, 4)
    y32, g32 = run(getattr(rt, op), x.float(), rois.float(), args, 4)
    assert got_y.dtype == got_g.dtype == dtype
    assert_same(got_y, y32.to(dtype), "output")
    # the upstream gradient is drawn in float32 and rounded to dtype: the same for both
    g = torch.from_numpy(np.random.default_rng(4).standard_normal(tuple(y32.shape))).to(dtype)
    xf = x.float().requires_grad_(True)
    getattr(rt, op)(xf, rois.float(), *args).backward(g.float())
    assert_same(got_g, xf.grad.to(dtype), "gradient")


@pytest.mark.parametrize("dtype, n", [(torch.bfloat16, 300), (torch.float16, 2100)], ids=str)
@pytest.mark.parametrize("op", OPS)
def test_half_precision_list_boxes_pool_their_own_image(op, dtype, n):
    """The batch column of a list of boxes was built in the boxes' dtype, where bfloat16
    rounds 257 to 256 and float16 2049 to 2048: the last image's box pooled another
    image.  Only the last image is nonzero here."""
    x = torch.zeros(n, 4, 4, 4, dtype=dtype)
    x[n - 1] = 1
    empty = torch.zeros(0, 4, dtype=dtype)
    y = getattr(rt, op)(x, [empty] * (n - 1) + [torch.tensor([[0, 0, 3, 3]], dtype=dtype)], 2)
    assert y.dtype == dtype and bool((y == 1).all()), y


@pytest.mark.parametrize("op", OPS)
def test_the_registered_operators_check_their_dtypes(op):
    """torch.ops.roicore.* called directly (as a traced or exported graph calls them) skip
    the functions' checks: an int64 input returned int64 results."""
    x = torch.arange(64).reshape(1, 4, 4, 4)
    rois = torch.tensor([[0, 0, 0, 2, 2.0]])
    args = {"roi_pool": (1.0, 2, 2, False, None), "roi_align": (1.0, 2, 2, 2, False, None),
            "ps_roi_pool": (1.0, 2, 2, None), "ps_roi_align": (1.0, 2, 2, 2, None)}[op]
    with pytest.raises(TypeError, match=rf"roicore::{op}: input must be float32, float64, "
                                        r"float16 or bfloat16, got torch.int64"):
        getattr(torch.ops.roicore, op)(x, rois, *args)
    with pytest.raises(TypeError, match=rf"roicore::{op}: input must be"):  # the fake too
        getattr(torch.ops.roicore, op)(x.to("meta"), rois.to("meta"), *args)


# ----------------------------------------------------------------------------- registration

def _op_samples():
    x = torch.randn(2, 8, 10, 12, dtype=torch.float64, requires_grad=True)
    # a reversed box, but no zero-size one: opcheck compares outputs, and NaN (ps_roi_align's
    # empty grid) never compares equal
    b = torch.tensor([[0, 1, 1, 7, 8], [1, 0.5, 2, 9, 9.5], [0, 9, 9, 1, 1]], dtype=torch.float64)
    ops = torch.ops.roicore
    g2 = torch.randn(3, 2, 2, 2, dtype=torch.float64)
    g8 = torch.randn(3, 8, 3, 2, dtype=torch.float64)
    argmax = ops.roi_pool(x, b, 0.5, 3, 2, True, None)[1]
    return [
        (ops.roi_pool, (x, b, 0.5, 3, 2, True, None)),
        (ops.roi_pool, (x, b, 0.5, 3, 2, False, 2)),
        (ops.roi_align, (x, b, 0.5, 3, 2, 2, True, None)),
        (ops.roi_align, (x, b, 0.5, 3, 2, -1, False, 1)),
        (ops.ps_roi_pool, (x, b, 0.7, 2, 2, None)),
        (ops.ps_roi_align, (x, b, 0.7, 2, 2, -1, None)),
        (ops.roi_pool_backward, (g8, argmax, b, 2, 8, 10, 12, None)),
        (ops.roi_align_backward, (g8, b, 0.5, 2, 8, 10, 12, 2, True, None)),
        (ops.ps_roi_pool_backward, (g2, b, 0.7, 2, 8, 10, 12, None)),
        (ops.ps_roi_align_backward, (g2, b, 0.7, 2, 8, 10, 12, -1, None)),
    ]


@pytest.mark.parametrize("i", range(10))
def test_opcheck(i):
    op, args = _op_samples()[i]
    torch.library.opcheck(op, args)


def _all_ops(x, b):
    return (rt.roi_pool(x, b, 3, 0.5), rt.roi_align(x, b, (3, 2), 0.5, 2, True),
            rt.ps_roi_pool(x, b, 2, 0.7), rt.ps_roi_align(x, b, 2, 0.7))


def _compile_inputs():
    rng = np.random.default_rng(6)
    x = torch.from_numpy(rng.standard_normal((2, 8, 12, 14)).astype(np.float32))
    b = torch.tensor([[0, 1, 1, 17, 18], [1, 0.5, 2, 29, 19.5], [0, 13, 2, 3, 22]])
    return x, b


def test_torch_compile_fullgraph_forward_and_backward():
    x, b = _compile_inputs()
    compiled = torch.compile(_all_ops, fullgraph=True)
    results = []
    for fn in (compiled, _all_ops, lambda x, b: tuple(
            getattr(native, op)(x, b, *args) for op, args in
            [("roi_pool", (3, 0.5)), ("roi_align", ((3, 2), 0.5, 2, True)),
             ("ps_roi_pool", (2, 0.7)), ("ps_roi_align", (2, 0.7))])):
        xg = x.clone().requires_grad_(True)
        ys = fn(xg, b)
        sum(y.sum() * (i + 1) for i, y in enumerate(ys)).backward()
        results.append((ys, xg.grad))
    for (ys, g), name in zip(results[1:], ("eager", "torchvision")):
        for got, want in zip(results[0][0], ys):
            assert_same(got, want, f"compiled vs {name} output")
        assert_same(results[0][1], g, f"compiled vs {name} gradient")


class _Head(torch.nn.Module):
    def __init__(self, pool, channels=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.pool = pool

    def forward(self, img, boxes):
        return self.pool(torch.relu(self.conv(img)), boxes)


@pytest.mark.parametrize("op", OPS)
def test_torch_export_save_and_load(op):
    torch.manual_seed(0)
    x, rois, args = large_case(op, torch.float32, 4)
    model = _Head(getattr(rt, MODULES[op])(*args), x.shape[1]).eval()
    img = torch.randn(2, 3, 38, 50)
    with torch.no_grad():
        program = torch.export.export(model, (img, rois))
    assert f"torch.ops.roicore.{op}.default" in program.graph_module.code
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    with torch.no_grad():
        assert_same(loaded.module()(img, rois), model(img, rois), f"exported {op}")


class _CallsTheFunctions(torch.nn.Module):
    """A user's module calling the functions, keywords and lists of boxes included."""

    def forward(self, x, b: torch.Tensor):
        boxes = [b[b[:, 0] == i][:, 1:] for i in range(2)]
        return (rt.roi_pool(x, b, 3, 0.5), rt.roi_align(x, boxes, [3, 2], 0.5, 2, True),
                rt.ps_roi_pool(x, b, (2, 2), spatial_scale=0.7, n_threads=1),
                rt.ps_roi_align(x, boxes, 2, 0.7, n_threads=2))


@pytest.mark.parametrize("op", OPS)
def test_torchscript_scripts_the_modules_and_functions(op):
    """torch.jit.script compiles the modules (an int spatial_scale too) and the functions
    to calls of torch.ops.roicore.*, with the eager numbers and gradients."""
    x, rois, args = large_case(op, torch.float32, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # torch.jit.script is deprecated
        for module in (getattr(rt, MODULES[op])(*args), getattr(rt, MODULES[op])(7, 1, *args[2:])):
            scripted = torch.jit.script(module)
            assert f"roicore::{op}" in str(scripted.inlined_graph)
            want_y, want_g = run(module, x, rois, ())
            got_y, got_g = run(scripted, x, rois, ())
            assert_same(got_y, want_y, f"scripted {MODULES[op]} output")
            assert_same(got_g, want_g, f"scripted {MODULES[op]} gradient")
            boxes, regrouped = as_list(rois, 2)
            assert_same(scripted(x, boxes), module(x, regrouped), "list of boxes")
        function = torch.jit.script(getattr(rt, op))
    assert_same(function(x, rois, *args), getattr(rt, op)(x, rois, *args), f"scripted {op}")


def test_torchscript_scripts_a_users_module_and_trace_records_the_ops():
    module = _CallsTheFunctions()
    x, b = _compile_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(module)
        traced = torch.jit.trace(rt.RoIAlign(2, 0.5, 2), (x, b))
    for got, want in zip(scripted(x, b), module(x, b)):
        assert_same(got, want, "scripted")
    assert "roicore::roi_align" in str(traced.graph)
    assert_same(traced(x, b), rt.roi_align(x, b, 2, 0.5, 2), "traced")


def test_torchscript_errors_are_the_operators():
    """Scripted code checks what TorchScript's types do not; the ops check the values."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = torch.jit.script(rt.RoIAlign(2, 0.5, 2))
    x = torch.randn(2, 4, 6, 6)
    with pytest.raises(Exception, match=r"boxes\[:, 0\]\[0\] = 2 is out of range"):
        scripted(x, torch.tensor([[2.0, 0, 0, 4, 4]]))
    with pytest.raises(Exception, match=r"roi_align: boxes must be a Tensor\[K, 5\]"):
        scripted(x, torch.zeros(1, 4))
    with pytest.raises(Exception, match=r"roi_align: boxes must have input's dtype"):
        scripted(x, torch.zeros(1, 5, dtype=torch.float64))


# ----------------------------------------------------------------------------- memory

@python_operators_only
def test_no_copies_on_cpu_and_argmax_only_for_gradients(spy_core):
    x, b = _compile_inputs()
    calls = spy_core("roi_pool")
    y = rt.roi_pool(x, b, 3, 0.5)
    ((x_in, boxes_in, *_), kw, result), = calls
    assert x_in.ctypes.data == x.data_ptr() and boxes_in.ctypes.data == b.data_ptr()
    assert result.ctypes.data == y.data_ptr()
    assert not kw["return_argmax"]
    with torch.no_grad():
        rt.roi_pool(x.requires_grad_(True), b, 3, 0.5)
    assert not calls[1].kwargs["return_argmax"]
    rt.roi_pool(x, b, 3, 0.5)
    assert calls[2].kwargs["return_argmax"]


@python_operators_only
@pytest.mark.parametrize("op", ["roi_align", "ps_roi_pool", "ps_roi_align"])
def test_no_copies_for_the_other_ops(op, spy_core):
    x, b = _compile_inputs()
    calls = spy_core({"ps_roi_pool": "psroi_pool"}.get(op, op))
    y = getattr(rt, op)(x, b, 2)
    ((x_in, boxes_in, *_), _, result), = calls
    assert x_in.ctypes.data == x.data_ptr() and boxes_in.ctypes.data == b.data_ptr()
    assert result.ctypes.data == y.data_ptr()


class _RecordOps(TorchDispatchMode):
    """Records every torch.ops.roicore.* call (the op and its arguments) while active."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "roicore":
            self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def test_roi_pool_asks_for_the_argmax_only_when_a_gradient_can_follow():
    x, b = _compile_inputs()

    def asked(x):
        with _RecordOps() as record:
            rt.roi_pool(x, b, 3, 0.5)
        return [args[5] for op, args in record.calls if op == torch.ops.roicore.roi_pool.default]

    assert asked(x) == [False]
    with torch.no_grad():
        assert asked(x.clone().requires_grad_(True)) == [False]
    assert asked(x.clone().requires_grad_(True)) == [True]


def test_roi_pool_op_recomputes_an_argmax_it_was_not_asked_for():
    """A caller of the op that asked for no argmax and then for a gradient gets it all the
    same (the backward recomputes the argmax from the input)."""
    x, b = _compile_inputs()
    xg = x.clone().requires_grad_(True)
    y, argmax = torch.ops.roicore.roi_pool(xg, b, 0.5, 3, 3, False, None)
    assert argmax.shape == (0,)
    y.sum().backward()
    xn = x.clone().requires_grad_(True)
    native.roi_pool(xn, b, 3, 0.5).sum().backward()
    assert_same(xg.grad, xn.grad, "gradient")


@python_operators_only
def test_roi_pool_backward_gets_no_argmax_gradient():
    """The argmax output is not differentiable, and autograd must not build a zero
    "gradient" of its size for every backward (a large allocation, for nothing)."""
    seen = []

    def spy(ctx, grad, grad_argmax):
        seen.append(grad_argmax)
        return rt._PYTHON_OPS.roi_pool_gradient(ctx, grad, grad_argmax)

    ops = rt._PYTHON_OPS
    ops.roi_pool.register_autograd(spy, setup_context=ops.roi_pool_context)
    try:
        x, b = _compile_inputs()
        rt.roi_pool(x.requires_grad_(True), b, 3, 0.5).sum().backward()
    finally:
        ops.roi_pool.register_autograd(ops.roi_pool_gradient, setup_context=ops.roi_pool_context)
    assert seen == [None]


@python_operators_only
def test_default_threads_follow_torch(spy_core):
    x, b = _compile_inputs()
    calls = spy_core("roi_align")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        rt.roi_align(x, b, 2)
        torch.set_num_threads(2)
        rt.roi_align(x, b, 2)
    finally:
        torch.set_num_threads(before)
    rt.roi_align(x, b, 2, n_threads=3)
    assert [c.kwargs["n_threads"] for c in calls] == [1, 2, 3]


def test_strided_input_and_gradient():
    base = torch.randn(2, 8, 14, 12)
    x = base.transpose(2, 3)                        # not contiguous
    b = torch.tensor([[0, 1, 1, 9, 10], [1, 2, 0, 11, 13.0]])
    for op in OPS:
        assert_same(getattr(rt, op)(x, b, 2), getattr(native, op)(x, b, 2), f"strided {op}")
        xg = x.detach().requires_grad_(True)
        getattr(rt, op)(xg, b, 2).sum().backward()  # an expanded (stride 0) upstream gradient
        xn = x.detach().requires_grad_(True)
        getattr(native, op)(xn, b, 2).sum().backward()
        assert_same(xg.grad, xn.grad, f"strided {op} gradient")


# ----------------------------------------------------------------------------- devices

@pytest.fixture
def device_policy():
    """Restores the device policy and the once-per-device warning record."""
    previous = _common.get_device_policy()
    warned = set(_common._warned)
    yield set_device_policy
    set_device_policy(previous)
    _common._warned.clear()
    _common._warned.update(warned)


class _OffHost:
    """Stands in for a tensor on a GPU (none is needed): its device, and its copy."""

    def __init__(self, tensor, device="cuda:7"):
        self.device, self._tensor = torch.device(device), tensor

    def cpu(self):
        return self._tensor.clone()


@pytest.mark.parametrize("op", OPS)
def test_off_host_tensors_are_refused_under_policy_error(op, device_policy):
    device_policy("error")
    for name in ("input", "boxes"):
        with pytest.raises(ValueError, match=rf"roicore.adapters.torch: {op}: {name} is on "
                                             r"cuda:7, but roicore computes on the CPU"):
            rt._host(_OffHost(torch.ones(2)), name, op)


@pytest.mark.parametrize("op", OPS)
def test_meta_tensors_take_the_fake_implementation(op, device_policy):
    """Meta tensors hold shapes only, as for torchvision's meta kernels: the output and the
    gradient are meta tensors of torchvision's shapes; no copy, so no warning or refusal."""
    device_policy("error")
    x = torch.randn(2, 8, 6, 6)
    b = torch.tensor([[0, 0, 0, 4, 4.0], [1, 1, 1, 5, 3]])
    want = getattr(native, op)(x.to("meta"), b.to("meta"), 2, 0.5)
    for boxes in (b.to("meta"), b, [b[:1, 1:].to("meta"), b[1:, 1:].to("meta")]):
        xm = x.to("meta").requires_grad_(True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = getattr(rt, op)(xm, boxes, 2, 0.5)
            y.sum().backward()
        assert (y.device.type, y.shape, y.dtype) == ("meta", want.shape, want.dtype)
        assert (xm.grad.device.type, xm.grad.shape) == ("meta", x.shape)
    with pytest.raises(ValueError, match=rf"{op}: boxes is on the meta device, which holds no "
                                         r"values, but input is on cpu"):
        getattr(rt, op)(x, b.to("meta"), 2)


def test_off_host_tensors_warn_once_then_copy(device_policy, monkeypatch):
    """Under policy "copy", a tensor off the host warns once per device and is copied; for
    the values and the gradient through the copies, a CPU tensor that the adapter is told
    lives elsewhere."""
    device_policy("copy")
    _common._warned.clear()
    with pytest.warns(DeviceCopyWarning, match=r"roi_align: input is on cuda:7; roicore "
                                               r"computes on the CPU, so inputs are copied"):
        rt._host(_OffHost(torch.ones(2)), "input", "roi_align")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeviceCopyWarning)   # once per device
        assert torch.equal(rt._host(_OffHost(torch.ones(2)), "input", "roi_align"),
                           torch.ones(2))
    b = torch.tensor([[0, 0, 0, 4, 4.0]])

    copies = []

    def host(t, name, op):
        _common.off_host("torch", f"{op}: {name}", "cuda:6")
        copies.append(name)
        return t.clone()                               # the copy to the host

    monkeypatch.setattr(rt, "_host", host)
    xc = torch.randn(1, 4, 6, 6, requires_grad=True)
    with pytest.warns(DeviceCopyWarning, match=r"input is on cuda:6"):
        y = rt.roi_align(xc, b, 2)
    assert copies == ["input", "boxes"]
    y.sum().backward()
    xn = xc.detach().requires_grad_(True)
    native.roi_align(xn, b, 2).sum().backward()
    assert_same(xc.grad, xn.grad, "gradient through the copies")


# ----------------------------------------------------------------------------- errors

@pytest.mark.parametrize("op", OPS)
def test_errors_name_the_argument(op):
    fn = getattr(rt, op)
    x = torch.randn(2, 8, 6, 6)
    good = torch.tensor([[0, 0, 0, 4, 4.0]])
    with pytest.raises(ValueError, match=rf"{op}: boxes must be a Tensor\[K, 5\].*got shape \(1, 4\)"):
        fn(x, good[:, 1:], 2)
    with pytest.raises(ValueError, match=rf"{op}: boxes\[1\] must be a Tensor\[L, 4\]"):
        fn(x, [good[:, 1:], good], 2)
    with pytest.raises(TypeError, match=rf"{op}: boxes must be a Tensor\[K, 5\] or a list"):
        fn(x, good.numpy(), 2)
    with pytest.raises(TypeError, match=rf"{op}: boxes must have input's dtype torch.float32, "
                                        r"got torch.float64"):
        fn(x, good.double(), 2)
    with pytest.raises(ValueError, match=rf"{op}: input must be a 4-D Tensor\[N, C, H, W\]"):
        fn(x[0], good, 2)
    with pytest.raises(TypeError, match=rf"{op}: input must be float32, float64, float16 or "
                                        r"bfloat16, got torch.int64"):
        fn(x.long(), good.long(), 2)
    with pytest.raises(TypeError, match=rf"{op}: output_size must be an int or a pair"):
        fn(x, good, 2.0)
    with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[0\] \(a batch index\) must be an "
                                         r"integer"):
        fn(x, torch.tensor([[0.5, 0, 0, 4, 4]]), 2)
    with pytest.raises(ValueError, match=r"boxes\[:, 0\]\[0\] = 2 is out of range .* N=2"):
        fn(x, torch.tensor([[2.0, 0, 0, 4, 4]]), 2)
    with pytest.raises(ValueError, match=r"boxes coordinates must be finite"):
        fn(x, torch.tensor([[0, 0, float("nan"), 4, 4]]), 2)
    with pytest.raises(ValueError, match=r"spatial_scale must be positive"):
        fn(x, good, 2, -1.0)
    with pytest.raises(TypeError, match=rf"{op}: spatial_scale must be a real number, got str"):
        fn(x, good, 2, "1")


@pytest.mark.parametrize("op", OPS)
def test_errors_use_torchvisions_names(op):
    """Messages from every layer (the adapter, roicore.core, the C API) say ``input``, never
    core's ``x``, and a list of boxes is described as the list the caller passed."""
    fn = getattr(rt, op)
    x = torch.randn(2, 8, 6, 6)
    box = torch.tensor([[0, 0, 4, 4.0]])
    calls = [(lambda: fn(x, [box, box, box], 2),
              r"boxes is a list of 3 Tensor\[L, 4\], one per image, but input holds 2 image"),
             (lambda: fn(x[:, :, :0], [box], 2), r"\binput must have H >= 1"),
             (lambda: fn(x, [box * 2**30], 2, 1.0), r"boxes")]
    if position_sensitive(op):
        calls.append((lambda: fn(x, [box], 3), r"input has C=8 channels"))
    for call, message in calls:
        with pytest.raises(ValueError, match=message) as raised:
            call()
        assert not re.search(r"\bx\b", str(raised.value)), str(raised.value)


@pytest.mark.parametrize("op", OPS)
def test_no_boxes(op):
    x = torch.randn(2, 8, 6, 6)
    empty = torch.zeros(0, 5)
    want_y, want_g = run(getattr(native, op), x, empty, (2, 0.5))
    for boxes in (empty, [torch.zeros(0, 4), torch.zeros(0, 4)]):
        got_y, got_g = run(getattr(rt, op), x, boxes, (2, 0.5))
        assert_same(got_y, want_y, f"{op} output")
        assert_same(got_g, want_g, f"{op} gradient")


@pytest.mark.parametrize("op", ["ps_roi_pool", "ps_roi_align"])
def test_position_sensitive_channel_count(op):
    with pytest.raises(ValueError, match=r"C=8 channels, which is not a multiple of the group "
                                         r"area 3x3=9"):
        getattr(rt, op)(torch.randn(1, 8, 6, 6), torch.tensor([[0, 0, 0, 4, 4.0]]), 3)


def test_boxes_get_no_gradient():
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    b = torch.tensor([[0, 0, 0, 4, 4.0]], requires_grad=True)
    rt.roi_align(x, b, 2).sum().backward()
    assert x.grad is not None and b.grad is None


def test_double_backward_is_refused():
    x = torch.randn(1, 2, 6, 6, requires_grad=True)
    b = torch.tensor([[0, 0, 0, 4, 4.0]])
    (g,) = torch.autograd.grad(rt.roi_align(x, b, 2).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


# ----------------------------------------------------------------------------- models

class DetectionHead(torch.nn.Module):
    """conv -> RoI op -> linear: the shape of a Fast R-CNN head."""

    def __init__(self, pool, pooled_channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = pool
        self.fc = torch.nn.Linear(pooled_channels * 4, 3)

    def forward(self, img, boxes):
        return self.fc(self.pool(torch.relu(self.conv(img)), boxes).flatten(1))


def _head(op, module_namespace):
    args = op_args(op, 2, 0.25, 2, True)
    pooled = 2 if position_sensitive(op) else 8
    return DetectionHead(getattr(module_namespace, MODULES[op])(*args), pooled)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS)
def test_sgd_training_matches_torchvision_step_for_step(op, dtype):
    """Five SGD steps of the same head from the same weights, once with torchvision's op and
    once with roicore's: losses and every weight identical, bit for bit, at every step."""
    torch.manual_seed(1)
    theirs = _head(op, native).to(dtype)
    mine = _head(op, rt).to(dtype)
    mine.load_state_dict(theirs.state_dict())
    initial = copy.deepcopy(mine.conv.weight.detach())
    rng = np.random.default_rng(2)
    img = torch.from_numpy(rng.standard_normal((2, 3, 24, 20))).to(dtype)
    xy = rng.uniform(0, 70, (12, 2))
    boxes = [torch.from_numpy(np.hstack([xy[i::2], xy[i::2] + rng.uniform(4, 40, (6, 2))])).to(dtype)
             for i in range(2)]
    labels = torch.from_numpy(rng.integers(0, 3, 12))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (theirs, mine)]
    for step in range(5):
        losses = []
        for model, opt in zip((theirs, mine), opts):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(img, boxes), labels)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert_same(losses[1], losses[0], f"step {step} loss")
        for (name, p), q in zip(theirs.named_parameters(), mine.parameters()):
            assert_same(q.detach(), p.detach(), f"step {step} {name}")
    assert not torch.equal(mine.conv.weight, initial)  # it did train


_DDP_WORKER = textwrap.dedent("""
    import os, sys, numpy as np, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    sys.path[:0] = [{tests!r}, {root!r}]      # test_torch and the helpers it imports
    from test_torch import ddp_batch, ddp_model
    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = DistributedDataParallel(ddp_model({op!r}))
    img, boxes, labels = ddp_batch(rank)
    torch.nn.functional.cross_entropy(model(img, boxes), labels).backward()
    np.savez(sys.argv[4], **{{n: p.grad.numpy() for n, p in model.module.named_parameters()}})
    dist.destroy_process_group()
    # torch's gloo backend now and then aborts at interpreter exit ("terminate called
    # without an active exception"), with torchvision's own ops too: leave before it
    os._exit(0)
""")


def ddp_model(op):
    torch.manual_seed(3)
    return _head(op, rt)


def ddp_batch(shard):
    """Shard 0 or 1 of a two-image batch: one image, its boxes and labels."""
    rng = np.random.default_rng([4, shard])
    img = torch.from_numpy(rng.standard_normal((1, 3, 24, 20)).astype(np.float32))
    xy = rng.uniform(0, 70, (5, 2))
    boxes = [torch.from_numpy(np.hstack([xy, xy + rng.uniform(4, 40, (5, 2))]).astype(np.float32))]
    return img, boxes, torch.from_numpy(rng.integers(0, 3, 5))


@pytest.mark.parametrize("op", ["roi_align", "ps_roi_pool"])
def test_ddp_gradients_match_a_single_process(op, tmp_path):
    """DistributedDataParallel with gloo over 2 CPU processes: each rank's backward runs
    roicore's, and the averaged gradients equal a single process's, bit for bit, when it
    takes the two shards' gradients the same way (DDP divides each by 2 and adds them)."""
    init = f"file://{tmp_path / 'rendezvous'}"
    script = _DDP_WORKER.format(tests=os.path.dirname(__file__),
                                root=os.path.dirname(os.path.dirname(__file__)), op=op)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), "2", init,
                               str(tmp_path / f"rank{r}.npz")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    model = ddp_model(op)
    shard_grads = []
    for shard in range(2):
        model.zero_grad()
        img, boxes, labels = ddp_batch(shard)
        torch.nn.functional.cross_entropy(model(img, boxes), labels).backward()
        shard_grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, _ in model.named_parameters():
        want = shard_grads[0][name] / 2 + shard_grads[1][name] / 2
        for r in range(2):
            assert_same(torch.from_numpy(ranks[r][name]), want, f"rank {r} {name}")
    # and the same numbers, up to rounding, as one backward over the whole batch
    model.zero_grad()
    parts = [ddp_batch(s) for s in range(2)]
    img = torch.cat([p[0] for p in parts])
    labels = torch.cat([p[2] for p in parts])
    torch.nn.functional.cross_entropy(model(img, [p[1][0] for p in parts]), labels).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(torch.from_numpy(ranks[0][name]), p.grad, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- drop-in details

@pytest.mark.parametrize("op", OPS)
def test_modules_and_functions_trace_with_fx(op):
    """torch.fx.symbolic_trace keeps each op as one call (torchvision wraps them with
    torch.fx.wrap), for the module and for the function called in a model's forward."""
    x, rois, args = large_case(op, torch.float32, 0)

    class Calls(torch.nn.Module):
        def forward(self, x, rois):
            return getattr(rt, op)(x, rois, *args)

    for model in (getattr(rt, MODULES[op])(*args), Calls()):
        traced = torch.fx.symbolic_trace(model)
        calls = [n.target for n in traced.graph.nodes if n.op == "call_function"]
        assert calls == [getattr(rt, op)], traced.graph
        assert_same(traced(x, rois), getattr(native, op)(x, rois, *args), f"traced {op}")


AUTOCAST_PAIRS = [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                  (torch.float16, torch.float32), (torch.float32, torch.float16),
                  (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]


@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("dtypes", AUTOCAST_PAIRS, ids=str)
def test_roi_align_under_cpu_autocast_is_torchvisions(dtypes, autocast_dtype):
    """Under CPU autocast torchvision computes roi_align in float32 and returns input's
    dtype, whatever the boxes' dtype."""
    x, rois, args = large_case("roi_align", torch.float32, 1)
    x, rois = x.to(dtypes[0]), rois.to(dtypes[1])
    with torch.autocast("cpu", dtype=autocast_dtype):
        want = native.roi_align(x, rois, *args)
        got = rt.roi_align(x, rois, *args)
        got_list = rt.roi_align(x, as_list(rois, 2)[0], *args)
    assert_same(got, want, "roi_align under autocast")
    assert_same(got_list, native.roi_align(x.float(), as_list(rois.float(), 2)[1], *args)
                .to(x.dtype), "roi_align with a list of boxes under autocast")


def test_autocast_gradient_flows_in_the_inputs_dtype():
    x, rois, args = large_case("roi_align", torch.float32, 1)
    x = x.to(torch.bfloat16)
    mine, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_mine, y_theirs = rt.roi_align(mine, rois, *args), native.roi_align(theirs, rois, *args)
    y_mine.float().square().sum().backward()
    y_theirs.float().square().sum().backward()
    assert mine.grad.dtype == torch.bfloat16
    assert_same(mine.grad, theirs.grad, "gradient under autocast")


@pytest.mark.parametrize("op", ["roi_pool", "ps_roi_pool", "ps_roi_align"])
def test_the_other_ops_are_not_autocast(op):
    """torchvision registers a CPU autocast rule for roi_align only; mixed dtypes stay an
    error for the others, as there (a TypeError here, torchvision's kernel a RuntimeError)."""
    x, rois, args = large_case(op, torch.float32, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError):
            getattr(native, op)(x.bfloat16(), rois, *args)
        with pytest.raises(TypeError, match="boxes must have input's dtype"):
            getattr(rt, op)(x.bfloat16(), rois, *args)
        assert_same(getattr(rt, op)(x, rois, *args), getattr(native, op)(x, rois, *args), op)


QTYPES = [torch.quint8, torch.qint8, torch.qint32]


def quantized_case(qtype, seed):
    """One image, quantized with a random scale and zero point, and quantized boxes of
    every kind (zero-size and reversed too)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, 3, 12, 14, generator=g) * 40 - (0 if qtype == torch.quint8 else 20)
    scale = float(torch.rand(1, generator=g)) * 2 + 0.05
    zero_point = 0 if qtype == torch.qint32 else int(torch.randint(0, 12, (1,), generator=g))
    boxes = torch.rand(24, 4, generator=g) * 16 - 1
    boxes[::5, 2:] = boxes[::5, :2]
    rois = torch.cat([torch.zeros(24, 1), boxes], 1)
    return (torch.quantize_per_tensor(x, scale, zero_point, qtype),
            torch.quantize_per_tensor(rois, 0.0625, 0 if qtype == torch.qint32 else 1, qtype))


@pytest.mark.parametrize("qtype", QTYPES, ids=str)
def test_quantized_roi_align_is_torchvisions(qtype):
    """Bit for bit, for sample counts that are powers of two and others (3 x 3, adaptive):
    torchvision takes the zero point off each bin's sum before it divides by the count."""
    for seed in range(6):
        qx, qrois = quantized_case(qtype, seed)
        for sampling_ratio in (1, 2, 3, 4, -1):
            # aligned with an adaptive grid: torchvision throws on the reversed boxes
            for aligned in (False, True) if sampling_ratio > 0 else (False,):
                args = ((3, 4), 0.75, sampling_ratio, aligned)
                want, got = native.roi_align(qx, qrois, *args), rt.roi_align(qx, qrois, *args)
                assert got.dtype == qtype and got.shape == want.shape
                assert (got.q_scale(), got.q_zero_point()) == (want.q_scale(), want.q_zero_point())
                assert torch.equal(got.int_repr(), want.int_repr()), (seed, args)
    boxes = [qrois[:, 1:]]
    assert torch.equal(rt.roi_align(qx, boxes, 3, 0.5, 2).int_repr(),
                       native.roi_align(qx, qrois, 3, 0.5, 2).int_repr())


def test_quantized_roi_align_errors_are_torchvisions():
    qx, qrois = quantized_case(torch.quint8, 0)
    two = torch.cat([qx.dequantize()] * 2)
    q_two = torch.quantize_per_tensor(two, qx.q_scale(), qx.q_zero_point(), torch.quint8)
    for fn in (native.roi_align, rt.roi_align):
        with pytest.raises(RuntimeError, match="Only one image per batch is allowed"):
            fn(q_two, qrois, 2)
        with pytest.raises(ValueError, match="If input is quantized, rois must also be "
                                             "quantized"):
            fn(qx, qrois.dequantize(), 2)
    with pytest.raises(TypeError):      # torchvision has no quantized roi_pool either
        rt.roi_pool(qx, qrois, 2)


@pytest.mark.parametrize("op", OPS)
def test_boxes_of_the_wrong_shape_are_an_assertion_error_too(op):
    """torchvision asserts the boxes' shape; roicore's error is both kinds."""
    x = torch.randn(2, 8, 6, 6)
    box = torch.tensor([[0, 0, 4, 4.0]])
    for boxes in (box, [box, torch.cat([torch.zeros(1, 1), box], 1)]):
        for fn in (getattr(native, op), getattr(rt, op)):
            with pytest.raises(AssertionError):
                fn(x, boxes, 2)
        with pytest.raises(ValueError):
            getattr(rt, op)(x, boxes, 2)


# ----------------------------------------------------------------------------- both paths

@pytest.mark.slow
@pytest.mark.skipif(not NATIVE, reason="this process runs the Python operators already")
def test_the_python_operators_pass_this_file():
    """Every other test of this file, on the Python custom ops (the fallback without a C++
    compiler): in a process where ROICORE_TORCH_NATIVE=0 turns the op library off."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         os.path.abspath(__file__), "-k", "not test_the_python_operators_pass_this_file"],
        cwd=root, env=dict(os.environ, ROICORE_TORCH_NATIVE="0"), capture_output=True,
        text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout.splitlines()[-1], proc.stdout[-3000:]
