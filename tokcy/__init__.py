"""tokcy: host-side token bookkeeping for LLM inference engines.

``tokcy.BACKEND`` says which implementation is live: ``"cython"`` (the compiled
``tokcy._core``) or ``"python"`` (the pure twin, ``tokcy._pure``). Set
``TOKCY_PURE_PYTHON=1`` before import to choose the twin; falling back to it without
being asked warns once (``tokcy.PurePythonFallbackWarning``) with the reason.
"""

from typing import TYPE_CHECKING

from tokcy._backend import BACKEND, PurePythonFallbackWarning, module as _backend_module
from tokcy._state import RequestState

if TYPE_CHECKING:
    # Both backends share one stub (tokcy/_core.pyi), so type checkers see real types.
    from tokcy._core import BlockTable, Request
else:
    Request = _backend_module.Request
    BlockTable = _backend_module.BlockTable

__all__ = ["BACKEND", "BlockTable", "PurePythonFallbackWarning", "Request", "RequestState", "__version__"]
__version__ = "0.1.0"
