"""Selecting the backend a scenario runs on, without restarting Python.

Public code (``tokcy.executor``, ``tokcy.connector``) looks the backend up through
``tokcy._backend.module`` when it is called, so switching that attribute (as the test
fixture does) switches everything; requests are created from the chosen module.
"""

from __future__ import annotations

import contextlib

import tokcy
from tokcy import _backend

NAMES = ("cython", "python")


def load(name: str):
    """The backend module for ``name``; ImportError if the compiled core is not built."""
    if name == "cython":
        return _backend.import_compiled()  # (a core built from another copy is refused)
    if name == "python":
        from tokcy import _pure

        return _pure
    raise ValueError(f"unknown backend {name!r} (expected 'cython' or 'python')")


def name_of(module) -> str:
    return "cython" if module.__name__.endswith("_core") else "python"


def why_unavailable(name: str) -> str | None:
    """None if backend ``name`` loads here, else why not, in words that say what to do
    (the compiled core: not built, built for another Python, or built from another copy)."""
    try:
        load(name)
    except ImportError as error:
        return _backend.fallback_reason(error)
    return None


_SWAPPED = ("Request", "BlockTable", "BACKEND")  # the names of tokcy that follow the live backend


@contextlib.contextmanager
def use(name: str):
    """Make backend ``name`` the live one inside the block; yields its module."""
    module = load(name)
    saved = (_backend.module, _backend.BACKEND, {attribute: getattr(tokcy, attribute) for attribute in _SWAPPED})
    _backend.module, _backend.BACKEND = module, name
    # setattr: tokcy.Request / BlockTable are classes to a type checker, rebound here on purpose
    for attribute, value in zip(_SWAPPED, (module.Request, module.BlockTable, name)):
        setattr(tokcy, attribute, value)
    try:
        yield module
    finally:
        _backend.module, _backend.BACKEND, names = saved
        for attribute, value in names.items():
            setattr(tokcy, attribute, value)
