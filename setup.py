"""Build roicore: the C library (core/csrc), the Cython binding over it, and the benchmark's
bandwidth probe; OpenMP when the compiler can link it.

The library is built as a static, position-independent archive and shipped in the package
(roicore/core/lib/libroicore.a with roicore/core/include/roicore.h), so that native ops built
later on a user's machine compile and link against the same kernels.

Environment:
  ROICORE_NO_OPENMP=1       build the kernels sequentially even if OpenMP is available
  ROICORE_REQUIRE_OPENMP=1  fail the build when OpenMP is not available (CI, sanitizer builds)
  ROICORE_CYTHON_DEBUG=1    compile the binding with bounds checking (for debugging runs, slow)
CFLAGS and LDFLAGS apply to the library, the binding and the OpenMP probe alike.

The sources need GCC or Clang (vector extensions, pthreads); the version is the C API's
(ROICORE_VERSION_STRING in roicore.h), so the package and the library never disagree.
"""
import concurrent.futures
import glob
import os
import re
import shlex
import shutil
import sys
import tempfile
import textwrap

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

C_SOURCES = sorted(glob.glob("core/csrc/*.c"))
PUBLIC_HEADER = "core/csrc/roicore.h"


def _version():
    with open(PUBLIC_HEADER) as f:
        return re.search(r'#define ROICORE_VERSION_STRING "([^"]+)"', f.read()).group(1)


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


def _env_flags():
    """CFLAGS and LDFLAGS: distutils adds them when compiling, not when linking a program,
    so the probe links with them explicitly (a -fsanitize build must link its runtime)."""
    return shlex.split(os.environ.get("CFLAGS", "")) + shlex.split(os.environ.get("LDFLAGS", ""))


def _openmp_flags(compiler):
    """Return (compile, link) flags if a tiny OpenMP program compiles *and links*, else None."""
    tmp = tempfile.mkdtemp(prefix="roicore-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OPENMP_PROBE)
        try:
            objs = compiler.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
            compiler.link_executable(objs, "probe", output_dir=tmp,
                                     extra_postargs=["-fopenmp"] + _env_flags())
        except Exception:  # CompileError, LinkError, missing compiler
            return None
        return ["-fopenmp"], ["-fopenmp"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        if self.compiler.compiler_type == "msvc":
            sys.exit("roicore needs GCC or Clang (its kernels use their vector extensions)")
        # -ffp-contract=off: never fuse a*b+c into an FMA, so results match the frameworks'
        # x86-64 builds bit for bit.  -fvisibility=hidden: the library's symbols stay
        # inside whichever module links it.  -Wno-psabi: 32-byte vector helpers are
        # always inlined, so no vector crosses a call.
        c_flags = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-math-errno",
                   "-fvisibility=hidden", "-Wno-psabi", "-Wno-unknown-pragmas"]
        if _truthy("ROICORE_NO_OPENMP"):
            omp, why = None, "disabled by ROICORE_NO_OPENMP"
        else:
            omp = _openmp_flags(self.compiler)
            why = "enabled" if omp else "NOT available: the compiler could not link an OpenMP probe"
            if omp is None and _truthy("ROICORE_REQUIRE_OPENMP"):
                sys.exit("roicore: OpenMP is required (ROICORE_REQUIRE_OPENMP=1) but the compiler "
                         "could not link an OpenMP probe with CFLAGS/LDFLAGS")
        if omp is None:
            print("*" * 72, file=sys.stderr)
            print(f"roicore: OpenMP {why}; kernels will run on one thread.", file=sys.stderr)
            print("*" * 72, file=sys.stderr)
        print(f"roicore: building with OpenMP {why}")
        compile_omp, link_omp = omp if omp else ([], [])

        # the C library, next to the binding in the package: lib/libroicore.a, include/roicore.h
        lib_dir, include_dir = self._library_dirs(self.build_lib)
        os.makedirs(lib_dir, exist_ok=True)
        os.makedirs(include_dir, exist_ok=True)
        # one compiler per source, in parallel (the kernels' AVX2 clones take a while each)
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            objects = [o for objs in pool.map(
                lambda src: self.compiler.compile([src], output_dir=self.build_temp,
                                                  extra_postargs=c_flags + compile_omp),
                C_SOURCES) for o in objs]
        self.compiler.create_static_lib(objects, "roicore", output_dir=lib_dir)
        shutil.copy(PUBLIC_HEADER, os.path.join(include_dir, "roicore.h"))

        for ext in self.extensions:
            ext.extra_compile_args = [f for f in c_flags if f not in ("-std=c11", "-fvisibility=hidden")] \
                + compile_omp
            # LDFLAGS again: older setuptools (65, as a fresh Python 3.11 venv has) leave them
            # off the extension's link, which drops a -fsanitize runtime
            ext.extra_link_args = link_omp + shlex.split(os.environ.get("LDFLAGS", ""))
            ext.library_dirs = [lib_dir]
            ext.libraries = ["roicore"]
            ext.depends = C_SOURCES + glob.glob("core/csrc/*.h")
        super().build_extensions()

    @staticmethod
    def _library_dirs(root):
        package = os.path.join(root, "roicore", "core")
        return os.path.join(package, "lib"), os.path.join(package, "include")

    def copy_extensions_to_source(self):
        """Editable installs: the library and header go beside the binding in core/ too."""
        super().copy_extensions_to_source()
        package = self.get_finalized_command("build_py").get_package_dir("roicore.core")
        for built, name in zip(self._library_dirs(self.build_lib), ("lib", "include")):
            shutil.copytree(built, os.path.join(package, name), dirs_exist_ok=True)


def extensions():
    from Cython.Build import cythonize

    debug = _truthy("ROICORE_CYTHON_DEBUG")
    binding = Extension("roicore.core._binding", ["core/_binding.pyx"], include_dirs=["core/csrc"])
    probe = Extension("roicore.cli._bandwidth", ["cli/_bandwidth.pyx"], include_dirs=["core/csrc"])
    return cythonize(
        [binding, probe],
        include_path=["core"],  # _roicore.pxd: the declarations of roicore.h
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
    version=_version(),
    package_dir={"roicore": "package", "roicore.core": "core", "roicore.adapters": "adapters",
                 "roicore.cli": "cli"},
    packages=["roicore", "roicore.core", "roicore.adapters", "roicore.adapters.native",
              "roicore.cli", "roicore.cli.frameworks"],
    # the native op libraries are compiled on the user's machine, from these sources
    package_data={"roicore.adapters.native": ["*.cc", "*.cpp", "*.h"]},
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildExt},
)
