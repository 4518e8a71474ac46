"""What a newcomer runs first: --version, the demo without torch, the demo's --help, and the
typed user script as a program."""

import builtins
import runpy
import sys

import pytest

import tokcy
from tokcy.__main__ import main


def test_version_prints_the_version_and_the_live_backend(backend, monkeypatch, capsys):
    from tokcy import _backend

    monkeypatch.setattr(_backend, "WHY_PURE", None)
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"tokcy {tokcy.__version__} (backend {_backend.BACKEND})\n"
    assert _backend.BACKEND == ("cython" if backend.__name__ == "tokcy._core" else "python")


@pytest.mark.backend_free("formats the version line of a twin patched in")
def test_version_line_names_why_the_twin_runs(monkeypatch, capsys):
    from tokcy import _backend

    monkeypatch.setattr(tokcy, "BACKEND", "python")
    monkeypatch.setattr(_backend, "WHY_PURE", "TOKCY_PURE_PYTHON is set")
    assert main(["-V"]) == 0
    assert capsys.readouterr().out == f"tokcy {tokcy.__version__} (backend python: TOKCY_PURE_PYTHON is set)\n"


@pytest.mark.backend_free("prints the usage text; no backend runs")
def test_usage_mentions_version_and_the_demo_extra(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "--version" in out and "pip install 'tokcy[torch]'" in out


def _without(monkeypatch, module):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise ImportError(f"No module named '{module}'")
        return real_import(name, *args, **kwargs)

    for name in list(sys.modules):
        if name == module or name.startswith(module + ".") or name.startswith("tokcy.demo"):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(builtins, "__import__", fake_import)


@pytest.mark.backend_free("the demo stops at its missing torch before any backend runs")
def test_demo_without_torch_is_one_line_naming_the_extra(monkeypatch, capsys):
    _without(monkeypatch, "torch")
    assert main(["demo"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "tokcy demo needs torch, which is not installed: pip install 'tokcy[torch]'  (or: pip install torch)\n"


@pytest.mark.backend_free("the demo stops at its missing torch before any backend runs")
def test_demo_help_works_without_torch_and_shows_every_default(monkeypatch, capsys):
    _without(monkeypatch, "torch")
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    from tokcy.demo.cli import _parser

    for action in _parser()._actions:
        if action.dest != "help":
            assert action.help, action.dest
    help_text = " ".join(capsys.readouterr().out.split())
    for expected in ("(default: 32)", "(default: (16, 512))", "(default: 160)", "(default: 16)", "(default: cpu)",
                     "(default: (1, 2, 4, 8, 16))", "--check, --no-check"):
        assert expected in help_text


def test_the_typed_user_script_runs(backend):
    namespace = runpy.run_path(str(__import__("pathlib").Path(__file__).parent / "typing" / "user_script.py"))
    assert namespace["main"]() == [8, 9]  # prompt [5, 6, 7]: the toy model returns last token + 1, twice
