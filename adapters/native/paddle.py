"""roicore's Paddle custom operators (``paddle_ops.cc``): compiled once per machine with
``paddle.utils.cpp_extension``, registered once per process.

The library is compiled against the installed Paddle's headers and roicore's C library
into roicore's build cache (:mod:`roicore.adapters.native.build`), keyed by Paddle's
version and commit, the compiler and the sources, so a new Paddle or roicore builds
afresh.  :func:`load` registers its operators with Paddle (``roicore_roi_pool``,
``roicore_psroi_pool``, ``roicore_roi_align`` and their gradients); :func:`run` appends or
runs one of them in whatever mode Paddle is in: dygraph, a static program (PIR or the
legacy ProgramDesc), or a ``paddle.jit.to_static`` trace.

A process that loads a saved model or creates a ``paddle.inference`` predictor holding
these operators needs them registered first, so that Paddle knows them: importing
``roicore.adapters.paddle`` calls :func:`load`.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import tempfile
import textwrap
import threading

from roicore import core

from .. import _common
from . import build

paddle = _common.require("paddle", "paddle")
from paddle.framework import in_dynamic_or_pir_mode  # noqa: E402

__all__ = ["SOURCE", "LIBRARY", "library_path", "load", "run"]

SOURCE = pathlib.Path(__file__).with_name("paddle_ops.cc")
LIBRARY = "roicore_paddle_ops"
PURPOSE = "roicore's Paddle operators"

_lock = threading.Lock()
_loaded = None  # the registered library's path


def _key(cxx):
    """Everything the binary depends on: Paddle's build, the compiler (and its
    environment), roicore's link arguments and the contents of the sources, roicore's
    header and its library."""
    return {
        "paddle": paddle.__version__,
        "paddle_commit": paddle.version.commit,
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        **build.compiler_key(cxx),
        "link_args": list(core.get_link_args()),
        "inputs": build.file_digest([SOURCE, pathlib.Path(core.get_include()) / "roicore.h",
                                     pathlib.Path(core.get_library_dir()) / "libroicore.a"]),
    }


_SETUP = textwrap.dedent("""\
    # Written by roicore.adapters.native.paddle: builds {library}.so with Paddle's own
    # extension builder (its include paths, ABI flags and libpaddle link).
    from paddle.utils.cpp_extension import BuildExtension, CppExtension, setup

    setup(
        name={library!r},
        ext_modules=CppExtension(
            sources=[{source!r}],
            include_dirs=[{include!r}],
            extra_compile_args={{"cxx": ["-O2", "-g0"]}},
            extra_link_args={link!r},
        ),
        cmdclass={{"build_ext": BuildExtension.with_options(output_dir={output!r},
                                                             no_python_abi_suffix=True)}},
    )
    """)


def library_path() -> pathlib.Path:
    """The operator library for the installed Paddle, compiled first if the cache has none
    (or a bad one; see :func:`roicore.adapters.native.build.cached_library`).

    Raises :class:`roicore.adapters.native.build.NativeBuildError` when there is no C++
    compiler or it fails (the message quotes the end of the compiler's output)."""
    cxx = build.find_compiler(PURPOSE)

    def produce(path, log_path):
        if importlib.util.find_spec("setuptools") is None:  # cpp_extension needs it
            raise build.NativeBuildError(f"roicore needs setuptools to build {PURPOSE} with "
                                         "paddle.utils.cpp_extension: pip install setuptools")
        with tempfile.TemporaryDirectory(dir=path.parent,
                                         prefix=build.temporary_prefix()) as work:
            setup = pathlib.Path(work) / "setup.py"
            setup.write_text(_SETUP.format(
                library=LIBRARY, source=str(SOURCE), include=str(core.get_include()),
                link=list(core.get_link_args()), output=work))
            built = pathlib.Path(work) / f"{LIBRARY}.so"
            # the compiler found above, for compiling and linking (distutils reads CC, CXX)
            build.run_build([sys.executable, str(setup), "build"], log_path, PURPOSE,
                            cwd=work, env=dict(os.environ, CC=" ".join(cxx), CXX=" ".join(cxx)),
                            ok=built.exists)
            os.replace(built, path)

    return build.cached_library(LIBRARY, _key(cxx), f"{LIBRARY}.so", produce, PURPOSE)


def load() -> pathlib.Path:
    """Build (if needed) and register roicore's Paddle operators in this process, once;
    returns the library's path."""
    global _loaded
    with _lock:
        if _loaded is None:
            from paddle.utils.cpp_extension.extension_utils import (
                load_op_meta_info_and_register_op)
            path = library_path()
            load_op_meta_info_and_register_op(str(path))
            build.share_runtime(path)
            _loaded = path
        return _loaded


def run(op, inputs, attrs, outputs):
    """Run or record operator ``op`` (registered by :func:`load`) on the tensors
    ``inputs`` (a dict in the operator's input order) with ``attrs`` (a dict in its
    attribute order); returns its outputs, named by ``outputs``, as a list.

    Dygraph and PIR programs (static mode and ``to_static`` in Paddle 3) call the operator
    through ``_C_ops._run_custom_op``; a legacy ProgramDesc gets an appended op."""
    if in_dynamic_or_pir_mode():
        res = paddle._C_ops._run_custom_op(op, *inputs.values(), *attrs.values())
        return res if isinstance(res, list) else list(res) if isinstance(res, tuple) else [res]
    from paddle.base.layer_helper import LayerHelper
    helper = LayerHelper(op)
    outs = {name: helper.create_variable(dtype="float32") for name in outputs}
    helper.append_op(type=op, inputs=inputs, outputs=outs, attrs=attrs)
    return [outs[name] for name in outputs]
