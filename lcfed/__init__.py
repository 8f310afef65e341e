"""lcfed: clustered / personalized federated learning (LCFed, FedAC, DC-PFL and baselines).

PyTorch and NumPy, no Ray (the Ray engine lives in the ``actors`` package); MLflow and matplotlib only
inside :mod:`lcfed.tracking`, loaded when a run is tracked. Layout and "where to change what":
docs/layout.md.

Importing ``lcfed`` applies the numerics profile named by ``$LCFED_NUMERICS`` (default ``portable``:
torch's CPU kernels pinned at AVX2, the same numbers on any x86-64 CPU) before any tensor op of the
process; see :mod:`lcfed.numerics`. Modules from before the packages (``lcfed.loop``, ``lcfed.models``,
...) still import, with a DeprecationWarning naming their new path (:mod:`lcfed._moved`).
"""

from typing import Any

from lcfed import _moved
from lcfed import numerics as _numerics

_moved.install()
_numerics.activate_from_env()

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """An old module read off the package (``from lcfed import loop``): its stand-in, with the warning."""
    return _moved.package_attr(name)
