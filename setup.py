"""Build roicore: one Cython extension, OpenMP when the compiler can link it.

Environment:
  ROICORE_NO_OPENMP=1      build the kernels sequentially even if OpenMP is available
  ROICORE_CYTHON_DEBUG=1   compile with bounds checking (for debugging runs, slow)
"""
import os
import shutil
import sys
import tempfile
import textwrap

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        return n > 0 ? 0 : 1;
    }
    """
)


def _truthy(name):
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _openmp_flags(compiler):
    """Return (compile, link) flags if a tiny OpenMP program compiles *and links*, else None."""
    if compiler.compiler_type == "msvc":
        candidates = [(["/openmp"], [])]
    else:
        candidates = [(["-fopenmp"], ["-fopenmp"])]
    tmp = tempfile.mkdtemp(prefix="roicore-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        for cflags, lflags in candidates:
            try:
                objs = compiler.compile([src], output_dir=tmp, extra_postargs=cflags)
                compiler.link_executable(objs, "probe", output_dir=tmp, extra_postargs=lflags)
            except Exception:  # CompileError, LinkError, missing compiler
                continue
            return cflags, lflags
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        compiler_type = self.compiler.compiler_type
        if compiler_type == "msvc":
            base = ["/O2", "/fp:precise"]
        else:
            # -ffp-contract=off: never fuse a*b+c into an FMA, so results match the
            # frameworks' x86-64 builds bit for bit (semantics.md, "FMA caveat").
            # -Wno-psabi: 32-byte vector helpers are static inline, so no ABI crosses a call
            base = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-Wno-unused-function", "-Wno-psabi"]
        if _truthy("ROICORE_NO_OPENMP"):
            omp, why = None, "disabled by ROICORE_NO_OPENMP"
        else:
            omp = _openmp_flags(self.compiler)
            why = "enabled" if omp else "NOT available: the compiler could not link an OpenMP probe"
        if omp is None:
            print("*" * 72, file=sys.stderr)
            print(f"roicore: OpenMP {why}; kernels will run on one thread.", file=sys.stderr)
            print("*" * 72, file=sys.stderr)
        for ext in self.extensions:
            ext.extra_compile_args = base + (omp[0] if omp else [])
            ext.extra_link_args = omp[1] if omp else []
        print(f"roicore: building with OpenMP {why}")
        super().build_extensions()


def extensions():
    from Cython.Build import cythonize

    debug = _truthy("ROICORE_CYTHON_DEBUG")
    ext = Extension(
        "roicore.core._kernels",
        ["core/_kernels.pyx"],
        include_dirs=["core/include"],
    )
    return cythonize(
        [ext],
        compiler_directives={
            "language_level": 3,
            "boundscheck": debug,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": debug,
            "nonecheck": False,
            "embedsignature": True,
        },
    )


setup(
    package_dir={"roicore.core": "core", "roicore.adapters": "adapters", "roicore.cli": "cli"},
    packages=["roicore.core", "roicore.adapters", "roicore.cli"],
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
)
