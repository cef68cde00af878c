"""Check the built wheel and sdist: the wheel ships the compiled binding, the Python files,
the C library for native ops (roicore/core/include/roicore.h, roicore/core/lib/
libroicore.a) and the native op libraries' C++ (compiled on the user's machine against
the installed framework), but no other sources; the sdist ships the C and Cython sources,
headers and tests, and no generated C or binaries."""
import sys
import tarfile
import zipfile


def main(wheel, sdist):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("roicore/core/_binding") and n.endswith(".so") for n in names), names
    assert any(n.startswith("roicore/cli/_bandwidth") and n.endswith(".so") for n in names), names
    for needed in ("roicore/__init__.py", "roicore/core/ops.py", "roicore/adapters/__init__.py",
                   "roicore/cli/frameworks/__init__.py", "roicore/core/include/roicore.h",
                   "roicore/core/lib/libroicore.a", "roicore/adapters/native/build.py",
                   "roicore/adapters/native/tf_ops.cc", "roicore/adapters/native/paddle_ops.cc",
                   "roicore/adapters/native/torch_ops.cpp"):
        assert needed in names, f"wheel lacks {needed}"
    leaked = [n for n in names if n.endswith((".pyx", ".pxd", ".pxi", ".c", ".h"))
              and n != "roicore/core/include/roicore.h"
              and not n.startswith("roicore/adapters/native/")]
    assert not leaked, f"wheel carries sources: {leaked}"
    members = [m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m]
    for needed in ("core/_binding.pyx", "core/_roicore.pxd", "core/csrc/roicore.h",
                   "core/csrc/roi_align.c", "cli/_bandwidth.pyx", "setup.py", "pyproject.toml",
                   "tests/reference.py", "tests/core/test_ops.py",
                   "tests/fixtures/saved_models/tensorflow/model/saved_model.pb", "README.md",
                   "LICENSE", "CHANGELOG.md"):
        assert needed in members, f"sdist lacks {needed}"
    generated = [m for m in members if m.endswith((".so", ".a", ".o"))
                 or (m.endswith(".c") and not m.startswith("core/csrc/"))]
    assert not generated, f"sdist carries generated files: {generated}"
    print(f"wheel: {len(names)} files, the C library's header and archive, no other sources; "
          f"sdist: {len(members)} entries, sources and tests")


if __name__ == "__main__":
    main(*sys.argv[1:])
