"""Worker process: ``python -m roicore.cli._worker {parity|bench} FRAMEWORK``.

One framework per process (importing TensorFlow before Paddle segfaults; MXNet needs its
NumPy aliases, which ``roicore.adapters.mxnet`` sets on import).  Messages: see _proc.py.
Never import this module in the parent process.
"""
from __future__ import annotations

import sys

from . import _proc
from ._proc import error_text


def main(argv):
    kind, framework = argv
    state = {}

    def init(msg):
        try:
            if kind == "parity":
                from .frameworks import harness_class
                state["harness"] = harness_class(framework)()
                return dict(version=state["harness"].version)
            from ._bench_worker import BenchState, source
            src = source(framework, msg["threads"])
        except ImportError as e:
            # the framework not installed: a skip the report names with its install command;
            # any other import error is a broken installation, a failure
            from .frameworks import harness_class, missing_module
            if missing_module(e, framework) is None:
                import traceback
                return dict(error=error_text(e), traceback=traceback.format_exc())
            return dict(skipped=error_text(e), install=harness_class(framework).install)
        state["bench"] = BenchState(src, msg["threads"], msg.get("cache_per_run", False))
        return dict(version=src.version)

    def handler(msg):
        try:
            if msg["cmd"] == "init":
                return init(msg)
            if kind == "parity":
                from ._parity_worker import parity, training
                return (training if msg["cmd"] == "training" else parity)(state["harness"], msg)
            return state["bench"].handle(msg)
        except Exception as e:
            import traceback
            return dict(error=error_text(e), traceback=traceback.format_exc())

    _proc.serve(handler)


if __name__ == "__main__":
    main(sys.argv[1:])
