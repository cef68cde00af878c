"""roicore.adapters.paddle inside real models: a training run that matches Paddle's own ops
step for step when only the import changes, paddle.DataParallel across processes, and
tensors that live off the host.
"""
import os
import pathlib
import signal
import socket
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import framework

paddle = framework("paddle", "the Paddle adapter tests need paddlepaddle")
from paddle.vision import ops as native  # noqa: E402

import roicore.adapters as adapters  # noqa: E402
from roicore.adapters import _common  # noqa: E402
from roicore.adapters import paddle as rp  # noqa: E402
from roicore.adapters import paddle_legacy as rl  # noqa: E402

from paddle_heads import OPS, build_head, head_batch  # noqa: E402


def _bits(t):
    a = t.numpy()
    return a.view({4: np.uint32, 8: np.uint64}[a.itemsize])


# ----------------------------------------------------------------------------- training

@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", OPS)
def test_swap_the_import_gives_the_same_training_run(op, dtype, paddle_path):
    """The same detection head (convolution, RoI op, linear layer, cross-entropy) trained
    with SGD for 5 steps, once on paddle.vision.ops and once on roicore.adapters.paddle,
    from the same initial weights: the loss and every weight are bit-identical after every
    step."""
    runs = []
    for ops in (native, rp):
        paddle.set_default_dtype(dtype)
        try:
            model = build_head(ops, op, seed=11)
        finally:
            paddle.set_default_dtype("float32")
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
        img, boxes, boxes_num, labels = head_batch(dtype, seed=5)
        history = [[None] + [_bits(p) for p in model.parameters()]]
        for _ in range(5):
            loss = model.loss(img, boxes, boxes_num, labels)
            loss.backward()
            opt.step()
            opt.clear_grad()
            history.append([_bits(loss)] + [_bits(p) for p in model.parameters()])
        runs.append(history)
    (theirs, mine), names = runs, ["loss"] + [p.name for p in model.parameters()]
    for step, (a, b) in enumerate(zip(mine, theirs)):
        for name, got, want in zip(names, a, b):
            if step:
                assert np.array_equal(got, want), (
                    f"{op} step {step}: {name} differs in {np.sum(got != want)} of {got.size}")
    # the run trains: the loss falls and every weight, the backbone's too (which learns
    # only through the RoI op's gradient), moves at every step
    assert theirs[-1][0].view(dtype) < theirs[1][0].view(dtype)
    for before, after in zip(theirs, theirs[1:]):
        for name, w0, w1 in zip(names[1:], before[1:], after[1:]):
            assert not np.array_equal(w0, w1), f"{name} did not change"


# ----------------------------------------------------------------------------- data-parallel

DP_STEPS = 3
DP_TIMEOUT = 300  # seconds for both ranks, Paddle's start-up included


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(out_dir, path):
    """Run paddle_dp_worker.py as ranks 0 and 1 of a gloo group, computing on ``path``;
    returns their outputs.  Both are killed (with anything they started) if they outlive
    DP_TIMEOUT."""
    port = _free_port()
    here = pathlib.Path(__file__).resolve().parent
    procs = []
    for rank in range(2):
        env = dict(os.environ, PADDLE_DISTRI_BACKEND="gloo", PADDLE_TRAINER_ID=str(rank),
                   PADDLE_TRAINERS_NUM="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PADDLE_TRAINER_ENDPOINTS=f"127.0.0.1:{port},127.0.0.1:{port + 1}",
                   PADDLE_CURRENT_ENDPOINT=f"127.0.0.1:{port + rank}", OMP_NUM_THREADS="1",
                   ROICORE_NATIVE_OPS="1" if path == "native" else "0",
                   PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, str(here / "paddle_dp_worker.py"), str(out_dir), str(DP_STEPS),
             path],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=DP_TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        pytest.fail(f"the data-parallel ranks did not finish in {DP_TIMEOUT} s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"rank {rank} exited with {p.returncode}:\n{out[-3000:]}"
    return [np.load(out_dir / f"rank{rank}.npz") for rank in range(2)]


def test_data_parallel_gradients_match_one_process(tmp_path, paddle_path):
    """paddle.DataParallel over two CPU processes (gloo), one image each, gives the
    gradients and weights of a single process that sees both images.

    DataParallel averages the ranks' gradients, (g0 + g1) / 2.  The single process
    accumulates the gradients of each image's loss times 1/2, which is the same sum bit for
    bit (halving is exact, and a sum of two floats does not depend on their order), so
    every step is compared exactly; a step on the whole batch at once is compared to
    rounding."""
    ranks = _run_ranks(tmp_path, paddle_path)
    for op in OPS:
        model = build_head(rp, op, seed=3)
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
        params = model.parameters()
        for step in range(DP_STEPS):
            if step == 0:  # the whole batch in one forward: the same gradient, to rounding
                model.loss(*head_batch("float32", seed=8)).backward()
                whole = [p.grad.numpy() for p in params]
                opt.clear_grad()
            for image in range(2):
                (model.loss(*head_batch("float32", seed=8, image=image)) * 0.5).backward()
            for i, p in enumerate(params):
                want = p.grad.numpy()
                assert np.any(want != 0), f"{op}: parameter {i} got no gradient"
                if step == 0:
                    np.testing.assert_allclose(want, whole[i], rtol=1e-5, atol=1e-7)
                for rank, got in enumerate(ranks):
                    assert np.array_equal(got[f"{op}/step{step}/grad{i}"], want), (
                        f"{op} step {step}: rank {rank}'s gradient of parameter {i} differs")
            opt.step()
            opt.clear_grad()
        for i, p in enumerate(params):
            for rank, got in enumerate(ranks):
                assert np.array_equal(got[f"{op}/weight{i}"], p.numpy()), (rank, op, i)


# ----------------------------------------------------------------------------- devices
# No accelerator here, so the tests make one up: a Place that reports GPU 0 to Python while
# Paddle's C++ side still sees the host, and a Tensor subclass that reports that place and
# records its device-to-host copies.  The adapter sees exactly what it sees for a GPU tensor.

class _FakeGpuPlace(type(paddle.to_tensor(0.0).place)):  # paddle's Place
    def is_cpu_place(self):
        return False

    def is_gpu_place(self):
        return True

    def __str__(self):
        return "Place(gpu:0)"


_GPU = _FakeGpuPlace()
_GPU.set_place(paddle.CPUPlace())


class _GpuTensor(paddle.Tensor):
    copies = []

    @property
    def place(self):
        return _GPU

    def cpu(self):
        _GpuTensor.copies.append(self)
        return super().cpu()


def _on_gpu(a, grad=False):
    t = _GpuTensor(np.asarray(a))
    t.stop_gradient = not grad
    return t


@pytest.fixture
def device_policy(monkeypatch):
    """Sets the policy for one test; the policy and the warn-once memory are restored."""
    monkeypatch.setattr(_common, "_warned", set())
    _GpuTensor.copies.clear()
    previous = adapters.get_device_policy()
    yield adapters.set_device_policy
    adapters.set_device_policy(previous)


def _device_case(op):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 7, 6)).astype("float32")
    boxes = np.array([[0, 0, 5, 6], [1, 2, 4, 5], [2, 1, 6, 4]], "float32")
    return x, boxes, np.array([2, 1], "int32"), dict(output_size=2, spatial_scale=0.8)


@pytest.mark.parametrize("op", OPS)
def test_tensors_off_the_host_are_copied_with_one_warning(op, device_policy):
    """Policy "copy" (the default): the input is copied to the host, the result and the
    gradient equal the CPU run's, and DeviceCopyWarning is shown once per device."""
    device_policy("copy")
    fn = getattr(rp, op)
    x, boxes, counts, kw = _device_case(op)
    host_x = paddle.to_tensor(x, stop_gradient=False)
    want = fn(host_x, paddle.to_tensor(boxes), paddle.to_tensor(counts), **kw)
    want.sum().backward()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            gx = _on_gpu(x, grad=True)
            got = fn(gx, paddle.to_tensor(boxes), paddle.to_tensor(counts), **kw)
            got.sum().backward()
            assert np.array_equal(got.numpy(), want.numpy())
            assert np.array_equal(gx.grad.numpy(), host_x.grad.numpy())
    shown = [w for w in caught if issubclass(w.category, adapters.DeviceCopyWarning)]
    assert len(shown) == 1, [str(w.message) for w in caught]
    assert f"x of {op} is on gpu:0" in str(shown[0].message)
    assert "set_device_policy('error')" in str(shown[0].message)
    assert len(_GpuTensor.copies) >= 2  # each call copied its input to the host


@pytest.mark.parametrize("op", OPS)
def test_tensors_off_the_host_are_refused_under_policy_error(op, device_policy):
    device_policy("error")
    fn = getattr(rp, op)
    x, boxes, counts, kw = _device_case(op)
    for name, args in [("x", (_on_gpu(x), paddle.to_tensor(boxes), paddle.to_tensor(counts))),
                       ("boxes", (paddle.to_tensor(x), _on_gpu(boxes), paddle.to_tensor(counts))),
                       ("boxes_num", (paddle.to_tensor(x), paddle.to_tensor(boxes),
                                      _on_gpu(counts)))]:
        with pytest.raises(ValueError, match=f"{name} of {op} is on gpu:0, but roicore "
                                             "computes on the CPU"):
            fn(*args, **kw)
    assert not _GpuTensor.copies
    with pytest.raises(ValueError, match="rois_num of roi_pool is on gpu:0"):
        rl.roi_pool(paddle.to_tensor(x), paddle.to_tensor(boxes), 2, 2,
                    rois_num=_on_gpu(counts), lod=[[2, 1]])
