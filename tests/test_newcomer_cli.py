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
    assert "--version" in out and "pip install torch==2.13.0" in out


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
    assert captured.err == "tokcy demo needs torch, which is not installed: pip install torch==2.13.0\n"


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
    for expected in ("(default: 32)", "[MIN, MAX] (default: 16 512)", "(default: 160)", "(default: 16)",
                     "(default: cpu)", "(default: 1 2 4 8 16)", "speculative decoding (default: on)",
                     "(default: off)",
                     "--check, --no-check"):
        assert expected in help_text
    # each option states its default once: none for the options without one, none added to a
    # help text that already says it
    assert "(default: None)" not in help_text and "(default: (" not in help_text
    formatter = _parser().formatter_class("demo")
    helps = {action.dest: formatter._get_help_string(action) for action in _parser()._actions}
    assert all(text.count("default") <= 1 for text in helps.values()), helps
    assert "(default: on for the built-in model" in helps["check"] and "float32 (default)" in helps["dtype"]
    assert "default" not in helps["model"] and "default" not in helps["prompt"]


def test_the_typed_user_script_runs(backend):
    namespace = runpy.run_path(str(__import__("pathlib").Path(__file__).parent / "typing" / "user_script.py"))
    assert namespace["main"]() == [8, 9]  # prompt [5, 6, 7]: the toy model returns last token + 1, twice


@pytest.mark.parametrize("argv0, prog", [
    ("/venv/bin/tokcy", "tokcy"), ("C:\\venv\\Scripts\\tokcy.exe", "tokcy"), ("tokcy-script.py", "tokcy"),
    ("/src/tokcy/__main__.py", "python -m tokcy"), ("-c", "python -m tokcy"), ("", "python -m tokcy"),
])
@pytest.mark.backend_free("names the program from argv[0]; no backend runs")
def test_program_name_is_how_tokcy_was_started(argv0, prog):
    from tokcy.__main__ import program_name

    assert program_name(argv0) == prog


def _console_script():
    import pathlib
    import shutil

    beside = pathlib.Path(sys.executable).with_name("tokcy")
    return str(beside) if beside.exists() else shutil.which("tokcy")


@pytest.mark.parametrize("command", [(), ("bench",), ("demo",)], ids=["top", "bench", "demo"])
def test_usage_names_the_command_that_was_typed(backend, command):
    """``tokcy --help`` (the console script) shows "usage: tokcy ...", ``python -m tokcy --help``
    shows "usage: python -m tokcy ...", for the subcommands too; run on the backend under test."""
    import os
    import subprocess

    env = dict(os.environ)
    env.pop("TOKCY_PURE_PYTHON", None)
    if backend.__name__ != "tokcy._core":
        env["TOKCY_PURE_PYTHON"] = "1"
    launchers = [([sys.executable, "-m", "tokcy"], "python -m tokcy")]
    script = _console_script()
    if script is None:
        pytest.skip("the tokcy console script is not installed beside this Python")
    launchers.append(([script], "tokcy"))
    for launcher, prog in launchers:
        done = subprocess.run([*launcher, *command, "--help"], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(" ".join(["usage:", prog, *command]) + " "), done.stdout[:200]
