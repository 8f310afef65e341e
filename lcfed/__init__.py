"""lcfed: clustered / personalized federated learning (LCFed, FedAC, DC-PFL and baselines).

Pure PyTorch/NumPy; the Ray layer lives in the ``actors`` package.

Importing ``lcfed`` applies the numerics profile named by ``$LCFED_NUMERICS`` (default ``portable``:
torch's CPU kernels pinned at AVX2, the same numbers on any x86-64 CPU) before any tensor op of the
process; see :mod:`lcfed.numerics`.
"""

from lcfed import numerics as _numerics

_numerics.activate_from_env()

__version__ = "0.1.0"
