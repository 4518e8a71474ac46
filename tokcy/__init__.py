"""tokcy: host-side token bookkeeping for LLM inference engines.

``tokcy.BACKEND`` says which implementation is live: ``"cython"`` (the compiled
``tokcy._core``) or ``"python"`` (the pure twin, ``tokcy._pure``). Set
``TOKCY_PURE_PYTHON=1`` before import to force the twin.
"""

from tokcy._backend import BACKEND, module as _backend_module
from tokcy._state import RequestState

Request = _backend_module.Request
BlockTable = _backend_module.BlockTable

__all__ = ["BACKEND", "BlockTable", "Request", "RequestState"]
__version__ = "0.1.0"
