"""The backend is chosen once at import; TOKCY_PURE_PYTHON=1 forces the twin."""

import os
import subprocess
import sys

import pytest

from tests.conftest import compiled_backend

PROBE = "import tokcy; print(tokcy.BACKEND, tokcy.Request.__module__)"


def _probe(**env):
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split()


@pytest.mark.backend_free("probes which backend a fresh interpreter selects, in a subprocess")
def test_pure_python_switch_selects_the_twin():
    assert _probe(TOKCY_PURE_PYTHON="1") == ["python", "tokcy._pure.request"]


@pytest.mark.backend_free("probes which backend a fresh interpreter selects, in a subprocess")
def test_compiled_backend_is_the_default_when_built():
    compiled_backend()  # skips (or fails under TOKCY_REQUIRE_EXTENSIONS=1) when not built
    assert _probe(TOKCY_PURE_PYTHON="") == ["cython", "tokcy._core"]


@pytest.mark.backend_free("probes which backend a fresh interpreter selects, in a subprocess")
@pytest.mark.parametrize("value", ["0", ""])
def test_switch_off_values_keep_the_compiled_backend(value):
    compiled_backend()
    assert _probe(TOKCY_PURE_PYTHON=value)[0] == "cython"


def test_backend_fixture_switches_the_public_names(backend):
    import tokcy

    assert tokcy.Request is backend.Request
    assert isinstance(tokcy.Request(1, [1, 2]), backend.Request)


@pytest.mark.backend_free("checks the collection rule on stand-in test items")
def test_collection_names_every_test_without_a_backend_or_a_reason():
    from types import SimpleNamespace

    from tests.conftest import tests_without_a_backend

    def item(nodeid, fixtures, *reason):
        marker = SimpleNamespace(args=reason) if reason else None
        return SimpleNamespace(nodeid=nodeid, fixturenames=fixtures, get_closest_marker=lambda name: marker)

    items = [
        item("runs_per_backend", ["backend", "tmp_path"]),
        item("differential", ["both_backends"]),
        item("formats_a_table", [], "formats given figures"),
        item("forgot_the_fixture", ["capsys"]),
        item("empty_reason", [], "  "),
        item("reason_not_a_string", [], 3),
    ]
    assert tests_without_a_backend(items) == ["forgot_the_fixture", "empty_reason", "reason_not_a_string"]
