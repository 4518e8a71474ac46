"""Chooses, once, the backend every public name comes from.

The compiled ``tokcy._core`` is used when it was built, unless ``TOKCY_PURE_PYTHON=1``
is set at import time; otherwise the pure-Python twin ``tokcy._pure``.
"""

import os


def _load():
    if os.environ.get("TOKCY_PURE_PYTHON", "") not in ("", "0"):
        from tokcy import _pure

        return _pure, "python"
    try:
        from tokcy import _core
    except ImportError:
        from tokcy import _pure

        return _pure, "python"
    return _core, "cython"


module, BACKEND = _load()
