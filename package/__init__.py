"""roicore: one exact, fast CPU implementation of the RoI operators of detection models.

- :mod:`roicore.core`: the operators on NumPy arrays, every framework's arithmetic by name;
- :mod:`roicore.adapters`: each framework's own signatures and autograd on them;
- :mod:`roicore.cli`: ``roicore parity`` and ``roicore bench``.

Importing ``roicore`` imports none of them (nor NumPy, nor any framework).  It is a regular
package, so a ``roicore/`` folder in the working directory (a clone of the repository, for
one) cannot take its place.  The checkout maps this directory to ``roicore`` (setup.py).
"""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("roicore")
except _metadata.PackageNotFoundError:  # pragma: no cover - run from an uninstalled tree
    __version__ = "unknown"

__all__ = ["__version__"]
