"""roicore: one exact, fast CPU implementation of the RoI operators of detection models.

- :mod:`roicore.core`: the operators on NumPy arrays, every framework's arithmetic by name;
- :mod:`roicore.adapters`: each framework's own signatures and autograd on them;
- :mod:`roicore.cli`: ``roicore parity`` and ``roicore bench``.

Importing ``roicore`` imports none of them (nor NumPy, nor any framework).  It is a regular
package, so a ``roicore/`` folder in the working directory (a clone of the repository, for
one) cannot take its place.  The checkout maps this directory to ``roicore`` (setup.py).
"""
__all__ = ["__version__"]


def __getattr__(name):
    # looked up on first use: importlib.metadata costs more than the rest of the import
    if name == "__version__":
        from importlib import metadata
        try:
            version = metadata.version("roicore")
        except metadata.PackageNotFoundError:  # pragma: no cover - an uninstalled tree
            version = "unknown"
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module 'roicore' has no attribute {name!r}")
