"""Falling back to the pure twin without being asked warns once, with the real reason;
TOKCY_PURE_PYTHON=1 stays silent. Each case imports a copy of the package in a subprocess."""

import glob
import importlib.machinery
import os
import shutil
import site
import subprocess
import sys

import pytest

import tokcy

PACKAGE = os.path.dirname(tokcy.__file__)
PROBE = "import tokcy, tokcy.executor, tokcy.connector; print(tokcy.BACKEND)"


def _copy_package(root, *, with_setup_py=False):
    """A copy of tokcy's Python sources (no compiled core) under root/src/tokcy."""
    target = root / "src" / "tokcy"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__"))
    if with_setup_py:
        (root / "src" / "setup.py").write_text("# a source checkout\n")
    return target


# The probes run with -S and the site directories on PYTHONPATH: numpy is found, but no .pth
# file runs, so an editable install's import hook (which would serve tokcy._core from the
# checkout to any tokcy package) cannot mix the copy with the installed package.
SITE_DIRS = [entry for entry in site.getsitepackages() + [site.getusersitepackages()] if os.path.isdir(entry)]


def _python_path(path):
    return os.pathsep.join(map(str, [*path, *SITE_DIRS]))


def _import(path, **env):
    result = subprocess.run(
        [sys.executable, "-S", "-c", PROBE],
        env={**os.environ, "PYTHONPATH": _python_path(path), "TOKCY_PURE_PYTHON": "", **env},
        cwd=path[0],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip(), result.stderr


def _compiled_tokcy_elsewhere(path):
    """Whether the subprocess would find a compiled tokcy outside path[0] (an installed one)."""
    result = subprocess.run([sys.executable, "-S", "-c", "import sys; print(repr(sys.path))"], capture_output=True,
                            text=True, check=True, env={**os.environ, "PYTHONPATH": _python_path(path)})
    entries = [entry for entry in eval(result.stdout) if entry and os.path.abspath(entry) != str(path[0])]
    return any(glob.glob(os.path.join(entry, "tokcy", "_core.*")) for entry in entries)


def _expected_reason(path, reason):
    """The reason a lone copy gives; an installed compiled tokcy (a wheel's test run) takes precedence."""
    return "which has no compiled core, and it shadows the installed tokcy in " if _compiled_tokcy_elsewhere(path) \
        else reason


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_a_source_tree_shadowing_an_installed_build_names_both_and_the_fix(tmp_path):
    from tests.conftest import compiled_backend

    compiled_backend()  # the installed copy must have a compiled core
    shadow = _copy_package(tmp_path)
    backend, stderr = _import([shadow.parent, os.path.dirname(PACKAGE)])
    assert backend == "python"
    assert stderr.count("PurePythonFallbackWarning") == 1
    assert f"tokcy was imported from {shadow}, which has no compiled core, and it shadows the installed tokcy in " \
           f"{PACKAGE}" in stderr
    assert "run Python from another directory, or build in place: pip install -e ." in stderr


# What setuptools' editable install puts on sys.meta_path: a finder that serves its own
# checkout's modules by name, whichever tokcy package asks (here only the compiled core)
EDITABLE_HOOK = """
import importlib.util, sys
class Editable:
    def find_spec(self, name, path=None, target=None):
        if name == "tokcy._core":
            return importlib.util.spec_from_file_location(name, {core!r})
sys.meta_path.append(Editable())
"""


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_a_compiled_core_built_from_another_copy_is_refused(tmp_path):
    """Python started in an unbuilt checkout, with another checkout installed in editable
    mode: the editable install's hook would serve that checkout's compiled core to this
    checkout's sources. It is refused, with the reason and the fix, and forgotten."""
    from tests.conftest import compiled_backend

    core = compiled_backend().__file__
    package = _copy_package(tmp_path, with_setup_py=True)
    probe = EDITABLE_HOOK.format(core=core) + (
        "import sys, tokcy, tokcy.connector, tokcy.executor, tokcy.bench.backends\n"
        "from tokcy import _backend\n"
        "print(tokcy.BACKEND, 'tokcy._core' in sys.modules, hasattr(tokcy, '_core'))\n"
        "try:\n"
        "    _backend.import_compiled()\n"
        "except ImportError as error:\n"
        "    print(type(error).__name__)\n"
        "from tokcy.bench import cli\n"
        "print('bench-exit', cli.main(['--backend', 'cython', '--scenario', 'accessors']))\n")
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=package.parent, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": _python_path([package.parent]), "TOKCY_PURE_PYTHON": ""},
                            check=True)
    assert result.stdout.split() == ["python", "False", "False", "_ForeignCoreError", "bench-exit", "2"]
    assert result.stderr.count("PurePythonFallbackWarning") == 1
    assert (f"tokcy was imported from {package}, which has no compiled core of its own; the tokcy._core found, in "
            f"{os.path.dirname(core)}, was built from another copy of tokcy") in result.stderr
    assert "build this copy in place: pip install -e ." in result.stderr
    # the bench gives the same reason (it said "tokcy._core is not built")
    assert (f"tokcy bench: backend cython is not available here: tokcy was imported from {package}, which has no "
            "compiled core of its own") in result.stderr


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_an_unbuilt_checkout_says_how_to_build(tmp_path):
    package = _copy_package(tmp_path, with_setup_py=True)
    backend, stderr = _import([package.parent])
    assert backend == "python"
    assert stderr.count("PurePythonFallbackWarning") == 1
    assert _expected_reason([package.parent], f"{package} is a source checkout whose compiled core is not built; "
                            "build it: pip install -e .") in stderr


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_an_install_without_the_core_says_to_reinstall_with_a_compiler(tmp_path):
    package = _copy_package(tmp_path)
    _, stderr = _import([package.parent])
    assert _expected_reason([package.parent], f"tokcy in {package} was installed without its compiled core (no C "
                            "compiler, or TOKCY_NO_EXTENSIONS=1 at install); reinstall with a C compiler: "
                            "pip install --force-reinstall tokcy") in stderr


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_a_core_that_is_built_but_broken_gives_the_import_error(tmp_path):
    package = _copy_package(tmp_path)
    (package / ("_core" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not a shared object")
    _, stderr = _import([package.parent])
    assert f"tokcy._core is built in {package} but does not import: " in stderr


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
def test_asking_for_the_twin_is_silent(tmp_path):
    package = _copy_package(tmp_path)
    backend, stderr = _import([package.parent], TOKCY_PURE_PYTHON="1", PYTHONWARNINGS="error")
    assert (backend, stderr) == ("python", "")


@pytest.mark.backend_free("imports a copy of the package without its compiled core, in a subprocess")
@pytest.mark.parametrize("command", [["-m", "tokcy", "--version"], ["-m", "tokcy", "-V"]])
def test_version_names_the_backend_and_why_it_is_pure(tmp_path, command):
    package = _copy_package(tmp_path)
    env = {**os.environ, "PYTHONPATH": _python_path([package.parent]), "TOKCY_PURE_PYTHON": "1"}
    result = subprocess.run([sys.executable, "-S", *command], env=env, capture_output=True, text=True, check=True)
    assert result.stdout == f"tokcy {tokcy.__version__} (backend python: TOKCY_PURE_PYTHON is set)\n"
