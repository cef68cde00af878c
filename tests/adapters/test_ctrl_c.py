"""Ctrl-C stops roicore's operators wherever a framework runs them: TF eager and
tf.function (the op library, on TF's threads), a Paddle static program (roicore's Paddle
operators, in the executor), an MXNet symbol executor (a CustomOp on MXNet's engine
thread) and roicore.core on a thread of the user's.  Each runs a call of minutes in a
fresh interpreter, gets SIGINT once the call is under way and must exit with
KeyboardInterrupt within a few seconds; before, each ran to the end of its call.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from frameworks import framework_installed

# a RoIAlign whose every bin takes 1024 x 1024 samples: half a minute on 2 cores; each
# script prints "calling" just before it
PROLOGUE = """
import numpy as np
SIZE, RATIO = 64, 1024
x = np.ones((1, 64, 256, 256), np.float32)
"""

SCRIPTS = {
    "tensorflow eager": ("tensorflow", """
        import tensorflow as tf
        from roicore.adapters import tf as rtf
        rtf.native_ops()
        images = tf.constant(x.transpose(0, 2, 3, 1))
        print("calling", flush=True)
        rtf.roi_align(images, tf.constant([[0., 0, 255, 255]]), tf.constant([0]), SIZE,
                      sampling_ratio=RATIO)
        """),
    "tensorflow tf.function": ("tensorflow", """
        import tensorflow as tf
        from roicore.adapters import tf as rtf
        rtf.native_ops()
        images = tf.constant(x.transpose(0, 2, 3, 1))
        f = tf.function(lambda i: rtf.roi_align(i, tf.constant([[0., 0, 255, 255]]),
                                                tf.constant([0]), SIZE, sampling_ratio=RATIO))
        f.get_concrete_function(images)
        print("calling", flush=True)
        f(images)
        """),
    "paddle static": ("paddle", """
        import paddle
        import roicore.adapters.paddle as rp
        paddle.enable_static()
        main = paddle.static.Program()
        with paddle.static.program_guard(main):
            xs = paddle.static.data("x", [1, 64, 256, 256], "float32")
            b = paddle.static.data("b", [1, 4], "float32")
            n = paddle.static.data("n", [1], "int32")
            y = rp.roi_align(xs, b, n, SIZE, sampling_ratio=RATIO)
        exe = paddle.static.Executor(paddle.CPUPlace())
        print("calling", flush=True)
        exe.run(main, feed={"x": x, "b": np.float32([[0, 0, 255, 255]]),
                            "n": np.int32([1])}, fetch_list=[y])
        """),
    "mxnet symbol": ("mxnet", """
        import roicore.adapters.mxnet as mxa
        import mxnet as mx
        out = mxa.ROIAlign(mx.sym.var("data"), mx.sym.var("rois"), (SIZE, SIZE), 1.0,
                           sample_ratio=RATIO)
        ex = out.bind(mx.cpu(), {"data": mx.nd.array(x),
                                 "rois": mx.nd.array([[0, 0, 0, 255, 255]])})
        print("calling", flush=True)
        ex.forward()[0].asnumpy()
        """),
    "core on a thread": (None, """
        import threading
        import roicore.core as rc
        worker = threading.Thread(target=lambda: rc.roi_align(
            x, np.float32([[0, 0, 0, 255, 255]]), SIZE, 1.0, RATIO))
        print("calling", flush=True)
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
        """),
}


@pytest.mark.slow
@pytest.mark.parametrize("path", list(SCRIPTS))
def test_ctrl_c_stops_the_call(path, tmp_path):
    needs, body = SCRIPTS[path]
    if needs:
        framework_installed(needs, f"{path} needs {needs}")
    script = tmp_path / "long_call.py"
    script.write_text(PROLOGUE + textwrap.dedent(body) + 'print("finished", flush=True)\n')
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "2"}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "calling", proc.communicate()
        time.sleep(2.0)  # the call under way
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        proc.kill()
    assert "finished" not in out, (out, err[-3000:])
    # Python's KeyboardInterrupt; in a Paddle program, Paddle's error for the interrupted
    # operator, raised before Python's signal handler gets its turn
    assert proc.returncode != 0 and ("KeyboardInterrupt" in err or
                                     "interrupted by Ctrl-C (SIGINT)" in err), err[-3000:]
    assert took < 5.0, f"{path}: {took:.1f} s from SIGINT to exit\n{err[-3000:]}"
