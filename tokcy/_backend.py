"""Chooses, once, the backend every public name comes from.

The compiled ``tokcy._core`` is used when it was built, unless ``TOKCY_PURE_PYTHON=1``
is set at import time; otherwise the pure-Python twin ``tokcy._pure``. Falling back
without being asked warns once (``PurePythonFallbackWarning``), naming the reason.
"""

from __future__ import annotations

import glob
import importlib.machinery
import os
import sys
import warnings
from types import ModuleType


class PurePythonFallbackWarning(RuntimeWarning):
    """``import tokcy`` runs on the pure-Python twin although it was not asked to (slower)."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _compiled_files(package_dir: str) -> list[str]:
    return sorted(
        path for suffix in importlib.machinery.EXTENSION_SUFFIXES
        for path in glob.glob(os.path.join(package_dir, "_core" + suffix))
    )


def _installed_elsewhere() -> str | None:
    """The directory of another ``tokcy`` on sys.path that has a compiled core, if any."""
    for entry in sys.path:
        candidate = os.path.join(os.path.abspath(entry or os.curdir), "tokcy")
        if os.path.normcase(candidate) != os.path.normcase(_PACKAGE_DIR) and _compiled_files(candidate):
            return candidate
    return None


class _ForeignCoreError(ImportError):
    """The ``tokcy._core`` found was built from another copy of tokcy (its message says which)."""


def import_compiled() -> ModuleType:
    """``tokcy._core``, if it is this package's own (built beside these sources); else ImportError.

    An editable install's import hook serves its checkout's compiled core to any package
    named tokcy: Python started in another, unbuilt checkout would run that checkout's
    sources against a core built from other sources. That core is refused (and forgotten)."""
    from tokcy import _core

    core_dir = os.path.dirname(os.path.abspath(_core.__file__))
    if os.path.normcase(core_dir) == os.path.normcase(_PACKAGE_DIR):
        return _core
    sys.modules.pop("tokcy._core", None)
    package = sys.modules.get("tokcy")
    if package is not None and getattr(package, "_core", None) is _core:
        del package._core
    raise _ForeignCoreError(
        f"tokcy was imported from {_PACKAGE_DIR}, which has no compiled core of its own; the tokcy._core found, "
        f"in {core_dir}, was built from another copy of tokcy (an editable install serves its own to any tokcy); "
        "run Python from another directory, or build this copy in place: pip install -e ."
    )


def fallback_reason(error: ImportError) -> str:
    """Why ``tokcy._core`` did not import, in words that say what to do about it."""
    if isinstance(error, _ForeignCoreError):
        return str(error)
    if _compiled_files(_PACKAGE_DIR):  # built, but broken (other Python, missing symbol, ...)
        return f"tokcy._core is built in {_PACKAGE_DIR} but does not import: {error}"
    elsewhere = _installed_elsewhere()
    if elsewhere is not None:
        return (
            f"tokcy was imported from {_PACKAGE_DIR}, which has no compiled core, and it shadows the installed "
            f"tokcy in {elsewhere} (Python started in a source checkout puts the checkout first on sys.path); "
            "run Python from another directory, or build in place: pip install -e ."
        )
    if os.path.exists(os.path.join(os.path.dirname(_PACKAGE_DIR), "setup.py")):
        return f"{_PACKAGE_DIR} is a source checkout whose compiled core is not built; build it: pip install -e ."
    return (
        f"tokcy in {_PACKAGE_DIR} was installed without its compiled core (no C compiler, or "
        "TOKCY_NO_EXTENSIONS=1 at install); reinstall with a C compiler: pip install --force-reinstall tokcy"
    )


def _load() -> tuple[ModuleType, str, str | None]:
    """(module, name, why the compiled core is not used or None)."""
    if os.environ.get("TOKCY_PURE_PYTHON", "") not in ("", "0"):
        from tokcy import _pure

        return _pure, "python", "TOKCY_PURE_PYTHON is set"
    try:
        core = import_compiled()
    except ImportError as error:
        from tokcy import _pure

        reason = fallback_reason(error)
        warnings.warn(
            f"tokcy runs on the pure-Python backend, several times slower: {reason} "
            "(TOKCY_PURE_PYTHON=1 chooses that backend on purpose, without this warning)",
            PurePythonFallbackWarning,
            stacklevel=4,  # the `import tokcy` line (via tokcy/__init__ and _load)
        )
        return _pure, "python", reason
    return core, "cython", None


module, BACKEND, WHY_PURE = _load()
