"""roicore's PyTorch op library (``torch_ops.cpp``): compiled on first use with
``torch.utils.cpp_extension``, loaded once per process with ``torch.ops.load_library``.

The library registers roicore's operators (``torch.ops.roicore.roi_pool``,
``roi_align``, ``ps_roi_pool``, ``ps_roi_align`` and their ``*_backward``) with
``TORCH_LIBRARY``: CPU kernels on roicore's C library, their autograd formulas and
torchvision's CPU autocast rule for ``roi_align``.  It is compiled against the installed
torch's headers and libraries with torch's own extension builder (its include paths,
C++ standard and ABI flags), into the cache of :mod:`roicore.adapters.native.build`,
keyed by torch's version and C++ ABI flag, the compiler, roicore's version, the
convention's rules (compiled in) and the contents of the sources, roicore's header and
its C library.  Later processes load the cached file.

The library links torch's C++ libraries only (no libtorch_python, no Python), so a
TorchScript module or an AOTInductor package that calls these ops runs in any process
that loads it: ``torch.ops.load_library(path)`` in Python, or ``dlopen`` (a link against
the library) in a libtorch program.  ``python -m roicore.adapters.native.torch`` builds it
and prints its path, e.g. to build it in a container image, or to find the file to ship
beside a model.

Environment:
  ROICORE_TORCH_OP_LIBRARY  load this library file instead of building one (a machine with
                            no compiler can use one built elsewhere for the same torch)
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import pathlib
import sys
import tempfile
import textwrap
import threading

import torch

from . import build

__all__ = ["SOURCE", "LIBRARY", "library_path", "load", "compile_definitions"]

SOURCE = pathlib.Path(__file__).with_name("torch_ops.cpp")
LIBRARY = "roicore_torch_ops"
PURPOSE = "roicore's PyTorch op library"
# the ops the library defines (one of them is enough to see that they are registered)
_AN_OP = "roi_align"

_lock = threading.Lock()
_loaded = None  # the loaded library's path

_SETUP = textwrap.dedent("""\
    # Written by roicore.adapters.native.torch: builds {library} with torch's own extension
    # builder (its include paths, C++ standard, ABI flags and libtorch link); py_limited_api
    # keeps libtorch_python (and so Python) out of the library.
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    setup(
        name={library!r},
        ext_modules=[CppExtension(
            {library!r},
            sources=[{source!r}],
            include_dirs=[{include!r}],
            extra_compile_args={compile_args!r},
            extra_link_args={link_args!r},
            py_limited_api=True,
        )],
        cmdclass={{"build_ext": BuildExtension.with_options(no_python_abi_suffix=True,
                                                             use_ninja=False)}},
    )
    """)


def compile_definitions() -> list[str]:
    """The ``-D`` flags that compile the torchvision convention's rules into the library:
    each table entry of :mod:`roicore.core.conventions` as the codes
    ``roicore_*_rules_from_array`` decodes (``roicore.core.args.rules_codes``), so the rules
    are defined once, in Python, and a changed convention changes the build's key."""
    from roicore.core import args, conventions
    tables = {"MAX_POOL": conventions.MAX_POOL, "PS_ROI_POOL": conventions.PSROI_POOL,
              "ROI_ALIGN": conventions.ROI_ALIGN, "PS_ROI_ALIGN": conventions.PSROI_ALIGN,
              "LEVEL": conventions.LEVELS}
    return [f"-DROICORE_TORCHVISION_{name}_RULES="
            + ",".join(str(int(c)) for c in args.rules_codes(table["torchvision"]))
            for name, table in tables.items()]


def _build_inputs():
    """(include directory, link arguments, files the build reads) of roicore's C library."""
    from roicore import core
    include = pathlib.Path(core.get_include())
    return include, list(core.get_link_args()), [
        SOURCE, include / "roicore.h", pathlib.Path(core.get_library_dir()) / "libroicore.a"]


def _key(cxx, compile_args, link_args, depends):
    """Everything the binary depends on: torch's build and C++ ABI, the compiler (and its
    environment), the flags (the rules among them), roicore's version and the contents of
    the sources, roicore's header and its library."""
    from roicore import core
    return {
        "torch": torch.__version__,
        "torch_git_version": getattr(torch.version, "git_version", None),
        "torch_cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "roicore": core.__version__,
        **build.compiler_key(cxx),
        "compile_args": list(compile_args),
        "link_args": list(link_args),
        "setup": hashlib.sha256(_SETUP.encode()).hexdigest(),
        "inputs": build.file_digest(depends),
    }


def library_path() -> pathlib.Path:
    """The op library for the running torch: ``ROICORE_TORCH_OP_LIBRARY`` when set, else
    the cached build, compiled now if there is none (or a bad one; see
    :func:`roicore.adapters.native.build.cached_library`).

    Raises :class:`roicore.adapters.native.build.NativeBuildError` when there is no C++
    compiler or it fails (the message quotes the end of the compiler's output)."""
    given = os.environ.get("ROICORE_TORCH_OP_LIBRARY")
    if given:
        return pathlib.Path(given)
    cxx = build.find_compiler(PURPOSE)
    include, link_args, depends = _build_inputs()
    compile_args = ["-O2", "-g0", "-DNDEBUG", *compile_definitions()]

    def produce(path, log_path):
        if importlib.util.find_spec("setuptools") is None:  # cpp_extension needs it
            raise build.NativeBuildError(f"roicore needs setuptools to build {PURPOSE} with "
                                         "torch.utils.cpp_extension: pip install setuptools")
        with tempfile.TemporaryDirectory(dir=path.parent,
                                         prefix=build.temporary_prefix()) as work:
            work = pathlib.Path(work)
            setup = work / "setup.py"
            setup.write_text(_SETUP.format(library=LIBRARY, source=str(SOURCE),
                                           include=str(include), compile_args=compile_args,
                                           link_args=link_args))
            out = work / "out"

            def built():
                return sorted(out.glob(f"{LIBRARY}*{build.LIBRARY_SUFFIX}"))

            # the compiler found above, for compiling and linking (distutils reads CC, CXX)
            build.run_build([sys.executable, str(setup), "build_ext", "--build-lib", str(out),
                             "--build-temp", str(work / "tmp")], log_path, PURPOSE, cwd=work,
                            env=dict(os.environ, CC=" ".join(cxx), CXX=" ".join(cxx)),
                            ok=lambda: bool(built()))
            os.replace(built()[0], path)

    key = _key(cxx, compile_args, link_args, depends)
    return build.cached_library(LIBRARY, key, f"lib{LIBRARY}{build.LIBRARY_SUFFIX}", produce,
                                PURPOSE)


def _registered() -> bool:
    """Whether roicore's ops are defined in this process already."""
    try:
        getattr(torch.ops.roicore, _AN_OP)
    except (AttributeError, RuntimeError):
        return False
    return True


def _loaded_elsewhere():
    """The library that defined roicore's ops when the process loaded one itself (a
    deployment that called ``torch.ops.load_library`` with a copy it ships, before
    importing roicore): the loaded library that exports roicore_native_share_runtime."""
    import ctypes
    for path in sorted(getattr(torch.ops, "loaded_libraries", ())):
        try:
            ctypes.CDLL(path).roicore_native_share_runtime  # noqa: B018
        except (OSError, AttributeError):
            continue
        return pathlib.Path(path)
    return None


def load() -> pathlib.Path:
    """Build (if needed) and load roicore's op library in this process, once, and share
    roicore.core's runtime with it (memory limit, scratch, Ctrl-C); returns its path.

    When an op library of roicore's was loaded before (``torch.ops.load_library`` with a
    copy), that one is used.  Raises :class:`~roicore.adapters.native.build.NativeBuildError`
    when the library cannot be built, or when roicore's ops are registered in this process
    by something else (the Python operators of ``ROICORE_TORCH_NATIVE=0``)."""
    global _loaded
    with _lock:
        if _loaded is None:
            if _registered():
                path = _loaded_elsewhere()
                if path is None:
                    raise build.NativeBuildError(
                        "roicore's operators (torch.ops.roicore.*) are registered in this "
                        "process already, but by no op library of roicore's that it can find "
                        "(torch.ops.loaded_libraries)")
            else:
                path = library_path()
                torch.ops.load_library(str(path))
            build.share_runtime(path)
            _loaded = path
        return _loaded


if __name__ == "__main__":
    print(library_path())
