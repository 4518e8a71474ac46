"""Chooses, once, the backend every public name comes from.

The compiled ``tokcy._core`` is used when it was built, unless ``TOKCY_PURE_PYTHON=1``
is set at import time; otherwise the pure-Python twin ``tokcy._pure``.
"""

import os


def _load():
    """(module, name, why the compiled core is not used or None)."""
    if os.environ.get("TOKCY_PURE_PYTHON", "") not in ("", "0"):
        from tokcy import _pure

        return _pure, "python", "TOKCY_PURE_PYTHON is set"
    try:
        from tokcy import _core
    except ImportError as error:
        from tokcy import _pure

        return _pure, "python", f"tokcy._core did not import ({error})"
    return _core, "cython", None


module, BACKEND, WHY_PURE = _load()
