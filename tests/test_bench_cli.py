"""``python -m tokcy bench`` in a tiny smoke configuration: tables and JSON well-formed.

No timing is asserted (the machines are shared and noisy): only that every scenario runs
on the backend under test, prints its table, and writes JSON with a positive median for
every implementation of every row.
"""

import json

import pytest

from tokcy.bench import cli, report
from tokcy.bench.backends import name_of
from tokcy.bench.scenario import Row


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def runnable_scenarios():
    return [s.name for s in map(cli.load_scenario, cli.SCENARIOS) if not isinstance(s, str)]


def test_smoke_run_prints_tables_and_json(backend, capsys, tmp_path):
    name = name_of(backend)
    path = tmp_path / "bench.json"
    code, out, err = run_cli(capsys, "--smoke", "--backend", name, "--json", str(path))
    assert code == 0, err
    assert "machine:" in out and "python:" in out and f"backend: {name}" in out
    assert "[  1/" in err and "done in" in err  # progress goes to stderr
    data = json.loads(path.read_text())
    assert data["machine"]["cpu"] and data["machine"]["python"]
    names = {s["name"] for s in data["scenarios"]}
    assert {"accessors", "memory"} <= names
    assert names == set(runnable_scenarios())
    for scenario in data["scenarios"]:
        assert scenario["backend"] == name
        assert f"[{name}]" in out and scenario["title"] in out
        assert scenario["rows"], scenario["name"]
        for row in scenario["rows"]:
            assert set(row["values"]) == set(scenario["implementations"])
            for impl, value in row["values"].items():
                assert value > 0, (scenario["name"], row["config"], impl)
            assert set(row["ratios"]) == set(scenario["implementations"]) - {"tokcy"}
            if scenario["unit"] == "s":
                for timing in row["timings"].values():
                    assert timing["rounds"] == len(timing["round_medians"]) >= 1


@pytest.mark.parametrize("scenario", ["accessors", "memory"])
def test_each_scenario_alone(backend, capsys, scenario):
    code, out, _ = run_cli(capsys, "--smoke", "--backend", name_of(backend), "--scenario", scenario)
    assert code == 0
    assert out.count("\n== ") == 1


def test_plot_is_written(backend, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    code, _, err = run_cli(capsys, "--smoke", "--backend", name_of(backend), "--scenario", "accessors", "--plot", str(path))
    assert code == 0, err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(capsys, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    code, out, err = run_cli(capsys, "--smoke", "--backend", "python", "--plot", str(tmp_path / "x.png"))
    assert code == 2
    assert "matplotlib" in err and "pip install" in err
    assert out == ""  # refused before running anything


def test_table_layout():
    scenario = cli.load_scenario("accessors")
    rows = [Row(config={"operation": "get_num_tokens", "n": 2048}, values={"tokcy": 5e-8, "baseline": 2.5e-5})]
    text = report.table(scenario, "cython", rows)
    lines = text.splitlines()
    assert lines[0].startswith("== ") and "[cython]" in lines[0]
    assert "tokcy" in lines[1] and "speed-up vs baseline" in lines[1]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert "2,048" in lines[3] and "50.0 ns" in lines[3] and "25.0 us" in lines[3] and "500x" in lines[3]


def test_format_helpers():
    assert report.format_seconds(2.5e-3) == "2.50 ms"
    assert report.format_seconds(1.5) == "1.50 s"
    assert report.format_seconds(123e-9) == "123 ns"
    assert report.format_ratio(12.34) == "12.3x"
    assert report.format_ratio(None) == "-"
