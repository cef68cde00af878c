"""One rank of the paddle.DataParallel test (run by test_paddle_models.py, two at a time,
with Paddle's PADDLE_* / MASTER_* environment set).

    python paddle_dp_worker.py OUT_DIR STEPS PATH

For each RoI op, trains the detection head of paddle_heads on roicore.adapters.paddle
(computing on PATH: "native", its Paddle operators, or "numpy"; the caller sets
ROICORE_NATIVE_OPS to match),
wrapped in paddle.DataParallel (gloo), on this rank's image for STEPS SGD steps, and saves
every step's gradients and the final weights to OUT_DIR/rank<R>.npz.
"""
import pathlib
import sys

import numpy as np
import paddle
import paddle.distributed as dist

from roicore.adapters import paddle as rp

from paddle_heads import OPS, build_head, head_batch


def main(out_dir, steps, path):
    assert (rp._operators() is not None) == (path == "native"), (path, rp._native_unavailable)
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 2, world
    saved = {}
    for op in OPS:
        model = build_head(rp, op, seed=3)
        parallel = paddle.DataParallel(model)
        opt = paddle.optimizer.SGD(learning_rate=0.5, parameters=model.parameters())
        img, boxes, boxes_num, labels = head_batch("float32", seed=8, image=rank)
        for step in range(steps):
            loss = paddle.nn.functional.cross_entropy(parallel(img, boxes, boxes_num), labels)
            loss.backward()
            for i, p in enumerate(model.parameters()):
                saved[f"{op}/step{step}/grad{i}"] = p.grad.numpy()
            opt.step()
            opt.clear_grad()
        for i, p in enumerate(model.parameters()):
            saved[f"{op}/weight{i}"] = p.numpy()
    np.savez(pathlib.Path(out_dir) / f"rank{rank}.npz", **saved)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
