"""lcfed: clustered / personalized federated learning (LCFed, FedAC, DC-PFL and baselines).

PyTorch and NumPy, no Ray (the Ray engine lives in the ``actors`` package); MLflow and matplotlib only
inside :mod:`lcfed.tracking`, loaded when a run is tracked. Layout and "where to change what":
docs/layout.md.

Importing ``lcfed`` applies the numerics profile named by ``$LCFED_NUMERICS`` (default ``portable``:
torch's CPU kernels pinned at AVX2, the same numbers on any x86-64 CPU) before any tensor op of the
process; see :mod:`lcfed.numerics`.
"""

from lcfed import numerics as _numerics

_numerics.activate_from_env()

__version__ = "0.1.0"
