"""Check the built wheel and sdist: the wheel ships the compiled module and Python files but
no Cython or C sources; the sdist ships the Cython sources, headers and tests, and no
generated C or binaries."""
import sys
import tarfile
import zipfile


def main(wheel, sdist):
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("roicore/core/_kernels") and n.endswith(".so") for n in names), names
    assert "roicore/core/ops.py" in names and "roicore/adapters/__init__.py" in names, names
    leaked = [n for n in names if n.endswith((".pyx", ".pxd", ".pxi", ".c", ".h"))]
    assert not leaked, f"wheel carries sources: {leaked}"
    members = [m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m]
    for needed in ("core/_kernels.pyx", "core/include/roicore_omp.h", "setup.py",
                   "pyproject.toml", "tests/reference.py", "tests/core/test_ops.py", "README.md"):
        assert needed in members, f"sdist lacks {needed}"
    generated = [m for m in members if m.endswith((".c", ".so"))]
    assert not generated, f"sdist carries generated files: {generated}"
    print(f"wheel: {len(names)} files, no sources; sdist: {len(members)} entries, sources and tests")


if __name__ == "__main__":
    main(*sys.argv[1:])
