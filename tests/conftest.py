"""The backend fixtures: every test runs once per backend, and its id names the backend.

Public code looks the backend up through ``tokcy._backend.module`` at call time, so
patching it here switches ``tokcy.executor`` and ``tokcy.connector`` too.
"""

import os

import pytest

import tokcy
from tokcy import _backend, _pure

BACKEND_NAMES = ("cython", "python")


def compiled_backend():
    """``tokcy._core`` if it is built; fails the run when TOKCY_REQUIRE_EXTENSIONS=1 and it is not."""
    try:
        _core = _backend.import_compiled()  # (refuses a core built from another copy of tokcy)
    except ImportError as error:
        if os.environ.get("TOKCY_REQUIRE_EXTENSIONS", "") not in ("", "0"):
            pytest.fail(f"TOKCY_REQUIRE_EXTENSIONS=1 but tokcy._core does not import: {error}")
        pytest.skip("tokcy._core is not built (install without TOKCY_NO_EXTENSIONS to test it)")
    return _core


def backend_module(name):
    return compiled_backend() if name == "cython" else _pure


@pytest.fixture(params=BACKEND_NAMES)
def backend(request, monkeypatch):
    """The backend module (``tokcy._core`` or ``tokcy._pure``), made the live one for the test."""
    module = backend_module(request.param)
    monkeypatch.setattr(_backend, "module", module)
    monkeypatch.setattr(_backend, "BACKEND", request.param)
    monkeypatch.setattr(tokcy, "BACKEND", request.param)
    monkeypatch.setattr(tokcy, "Request", module.Request)
    monkeypatch.setattr(tokcy, "BlockTable", module.BlockTable)
    return module


@pytest.fixture
def both_backends():
    """``(compiled, pure)`` for differential tests that run one program on each."""
    return compiled_backend(), _pure


# ---------------------------------------------------------------- every test names its backend
# A test takes ``backend`` (run once per backend) or ``both_backends`` (a differential), directly
# or through another fixture; a test that runs no backend code (a table's formatting, a scan of
# the docs, an import probe in a subprocess) says so with ``@pytest.mark.backend_free("why")``.
# Collection fails on a test that does neither, so no test silently runs on one backend only.
BACKEND_FIXTURES = frozenset({"backend", "both_backends"})


def tests_without_a_backend(items):
    """The node ids of the tests that take no backend fixture and give no reason for it."""
    missing = []
    for item in items:
        if BACKEND_FIXTURES & set(getattr(item, "fixturenames", ())):
            continue
        marker = item.get_closest_marker("backend_free")
        if marker is None or not (marker.args and isinstance(marker.args[0], str) and marker.args[0].strip()):
            missing.append(item.nodeid)
    return missing


def pytest_collection_modifyitems(config, items):
    missing = tests_without_a_backend(items)
    if missing:
        raise pytest.UsageError(
            f"{len(missing)} test(s) take neither the backend nor the both_backends fixture and are not "
            "marked @pytest.mark.backend_free(\"why\"): " + ", ".join(missing)
        )


# ---------------------------------------------------------------- optional extras
# Test modules that import torch or matplotlib at top level are not collected when that
# extra is missing (pip install '.[test]' alone has neither); the run says so at the end.
import importlib.util  # noqa: E402
import re  # noqa: E402

_EXTRAS = {"torch": "torch==2.13.0", "matplotlib": "tokcy[bench]"}
_MISSING = {name for name in _EXTRAS if importlib.util.find_spec(name) is None}
_NOT_COLLECTED = {}


def pytest_ignore_collect(collection_path, config):
    if not _MISSING or collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    text = collection_path.read_text(encoding="utf-8", errors="replace")
    for name in sorted(_MISSING):
        if re.search(rf"^(import {name}\b|from {name}[ .])", text, re.MULTILINE):
            _NOT_COLLECTED[collection_path.name] = name
            return True
    return None


def pytest_terminal_summary(terminalreporter):
    for module, name in sorted(_NOT_COLLECTED.items()):
        terminalreporter.write_line(
            f"SKIPPED {module}: {name} is not installed (pip install '{_EXTRAS[name]}')", yellow=True
        )
