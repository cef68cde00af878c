"""Models saved with an earlier roicore's native operators keep loading and computing the
same numbers, bit for bit, gradients included (tests/fixtures/saved_models: each was saved
once, by the version its saved_by.json names, and is never regenerated).

Each model is loaded in a fresh process, as a serving process would, with only what a
user's process imports: the adapter's import registers roicore's ops, nothing more is
called."""
import json
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from frameworks import framework_installed

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "saved_models"

LOAD = {
    "tensorflow": """
        import roicore.adapters.tf  # noqa: F401  (the import registers roicore's ops)
        import tensorflow as tf
        model = tf.saved_model.load(str(root / "model"))
        args = [tf.constant(e["in/" + k]) for k in ("images", "boxes", "normalised",
                                                     "box_indices")]
        got = {k: v.numpy() for k, v in model(*args).items()}
    """,
    "tensorflow_pyramid": """
        import roicore.adapters.tf  # noqa: F401  (the import registers roicore's ops)
        import tensorflow as tf
        model = tf.saved_model.load(str(root / "model"))
        features = {k.split("/")[-1]: tf.constant(v) for k, v in e.items()
                    if k.startswith("in/features/")}
        got = {k: v.numpy() for k, v in model(features, tf.constant(e["in/boxes"])).items()}
    """,
    "paddle": """
        import paddle
        import roicore.adapters.paddle  # noqa: F401  (the import registers roicore's ops)
        model = paddle.jit.load(str(root / "model"))
        model.train()
        x = paddle.to_tensor(e["in/x"], stop_gradient=False)
        outs = model(x, paddle.to_tensor(e["in/boxes"]), paddle.to_tensor(e["in/boxes_num"]))
        got = {f"out{i}": o.numpy() for i, o in enumerate(outs)}
        sum(o.sum() * (i + 1) for i, o in enumerate(outs)).backward()
        got["d_x"] = x.grad.numpy()
    """,
    "mxnet": """
        import roicore.adapters.mxnet  # noqa: F401  (registers roicore's custom ops)
        import mxnet as mx
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = mx.gluon.SymbolBlock.imports(str(root / "model-symbol.json"),
                                               ["data0", "data1"], str(root / "model-0000.params"))
        data = mx.nd.array(e["in/data"])
        data.attach_grad()
        with mx.autograd.record():
            outs = net(data, mx.nd.array(e["in/rois"]))
            loss = sum(o.sum() * (i + 1) for i, o in enumerate(outs))
        loss.backward()
        got = {f"out{i}": o.asnumpy() for i, o in enumerate(outs)}
        got["d_data"] = data.grad.asnumpy()
    """,
}

RUN = """
import pathlib, sys
import numpy as np
root = pathlib.Path(sys.argv[1])
e = dict(np.load(root / "expected.npz"))
{load}
np.savez(sys.argv[2], **got)
print("LOADED")
"""


@pytest.mark.parametrize("name", sorted(LOAD))
def test_a_saved_model_loads_and_computes_what_it_computed_when_saved(name, tmp_path):
    framework = name.split("_")[0]   # tensorflow_pyramid: a later fixture of TensorFlow's
    framework_installed(framework, f"the {name} fixture needs {framework}")
    root = FIXTURES / name
    saved_by = json.loads((root / "saved_by.json").read_text())
    code = RUN.format(load=textwrap.indent(textwrap.dedent(LOAD[name]), ""))
    out = tmp_path / "got.npz"
    proc = subprocess.run([sys.executable, "-c", code, str(root), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "LOADED" in proc.stdout, \
        f"the model saved by roicore {saved_by['roicore']} no longer loads:\n{proc.stderr[-4000:]}"
    expected = {k: v for k, v in np.load(root / "expected.npz").items() if not k.startswith("in/")}
    got = dict(np.load(out))
    assert set(got) == set(expected)
    for key, want in expected.items():
        assert want.dtype == got[key].dtype and want.shape == got[key].shape, key
        assert np.array_equal(got[key], want, equal_nan=True), \
            f"{name} {key}: the model saved by roicore {saved_by['roicore']} now computes " \
            f"other numbers (max |diff| {np.max(np.abs(got[key] - want))})"
