"""``python -m tokcy bench`` in a tiny smoke configuration: tables and JSON well-formed.

No timing is asserted (the machines are shared and noisy): only that every scenario runs
on the backend under test, prints its table, and writes JSON with a positive median for
every implementation of every row.
"""

import json

import pytest

from tokcy.bench import cli, floor, report
from tokcy.bench.backends import name_of
from tokcy.bench.scenario import Row


def run_cli(capsys, *argv):
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class VirtualClock:
    """The bench's clock (``timing.time.perf_counter``) that only the test moves."""

    now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    from tokcy.bench import timing

    virtual = VirtualClock()
    monkeypatch.setattr(timing, "time", virtual)
    return virtual


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
    assert {"accessors", "memory", "executor_batch", "connector_batch"} <= names
    assert names == set(runnable_scenarios())
    for scenario in data["scenarios"]:
        assert scenario["backend"] == name
        assert f"[{name}]" in out and scenario["title"] in out
        assert scenario["rows"], scenario["name"]
        for row in scenario["rows"]:
            assert set(row["values"]) == set(scenario["implementations"])
            for impl, value in row["values"].items():
                if impl == "floor" and not floor.available():
                    assert value is None
                else:
                    assert value > 0, (scenario["name"], row["config"], impl)
            baselines = {name for name in scenario["implementations"] if name != "floor" and not name.startswith("tokcy")}
            assert set(row["ratios"]) == baselines
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


@pytest.mark.backend_free("the CLI refuses the missing plotting extra before any backend runs")
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


@pytest.mark.backend_free("formats given figures; no backend runs")
def test_table_layout():
    scenario = cli.load_scenario("accessors")
    rows = [Row(config={"operation": "get_num_tokens", "n": 2048}, values={"tokcy": 5e-8, "baseline": 2.5e-5})]
    text = report.table(scenario, "cython", rows)
    lines = text.splitlines()
    assert lines[0].startswith("== ") and "[cython]" in lines[0]
    assert "tokcy" in lines[1] and "copy/tokcy" in lines[1]
    assert set(lines[2].replace(" ", "")) == {"-"}
    assert "2,048" in lines[3] and "50.0 ns" in lines[3] and "25.0 us" in lines[3] and "500x" in lines[3]
    assert "±" not in lines[3]  # no rounds recorded: no spread shown


@pytest.mark.backend_free("formats given figures; no backend runs")
def test_format_helpers():
    assert report.format_seconds(2.5e-3) == "2.50 ms"
    assert report.format_seconds(1.5) == "1.50 s"
    assert report.format_seconds(123e-9) == "123 ns"
    assert report.format_ratio(12.34) == "12.3x"
    assert report.format_ratio(None) == "-"


@pytest.mark.backend_free("formats given figures; no backend runs")
def test_table_shows_spread_floor_ratio_quoted_section_and_verdicts():
    scenario = cli.load_scenario("connector_batch")
    timing = {"round_medians": [90e-6, 100e-6, 110e-6]}
    rows = [
        Row(config={"requests": 256, "tokens": 2048},
            values={"tokcy": 100e-6, "tokcy+RequestData": 200e-6, "after": 1e-3, "floor": 10e-6},
            timings={"tokcy": timing}, reference={"TRT-LLM main": 9.88e-3}),
        Row(config={"requests": 1, "tokens": 2048},
            values={"tokcy": 3e-6, "tokcy+RequestData": 5e-6, "after": 2e-6, "floor": 5e-9}),
    ]
    text = report.table(scenario, "cython", rows)
    lines = text.splitlines()
    assert "tokcy/floor" in lines[1] and "speed-up vs after" in lines[1]
    assert "100 us ±10%" in lines[3] and "10.0x" in lines[3]  # (110 - 90) / 2 / 100; 100 / 10
    assert "-- quoted, NOT measured here:" in text and "Xeon" in text and "9.88 ms" in text
    assert "goal FAIL: tokcy within 3x of the floor at requests = 256 (measured: 10.0x the floor)" in text
    assert "goal not measured: tokcy within 3x of the floor at requests = 1,024" in text
    assert "goal FAIL: fixed cost per call under 2.00 us" in text and "(measured: 3.00 us)" in text
    assert "goal PASS: RequestData of a whole report within 3x" in text and "(measured: 2.0x)" in text
    python = report.table(scenario, "python", rows)
    assert "goal FAIL: the pure twin no slower than 'after' on any row (measured: 1 of 2 rows slower; " \
           "worst twin/after = 1.50)" in python


@pytest.mark.backend_free("formats given figures; no backend runs")
def test_goal_summary_counts_verdicts():
    scenario = cli.load_scenario("executor_batch")
    rows = [Row(config={"requests": size},
                values={"tokcy": 2e-6 * size, "after": 1e-5 * size, "numpy": 1, "floor": 1e-6 * size})
            for size in (1, 256, 1024, 4096)]
    assert report.goal_summary([(scenario, "cython", rows)]) == "goals: 3 PASS, 1 FAIL (each under its table)"


def test_bench_without_the_floor_says_so(backend, capsys, monkeypatch):
    monkeypatch.setattr(floor, "_floor", None)
    monkeypatch.setattr(floor, "WHY_MISSING", "No module named 'tokcy.bench._floor'")
    code, out, _ = run_cli(capsys, "--smoke", "--backend", name_of(backend), "--scenario", "executor_batch")
    assert code == 0
    assert "floor:   not available (tokcy.bench._floor is not built: No module named" in out
    body = [line for line in out.splitlines() if line.startswith(("1 ", "16 "))]
    # columns: B, tokcy, after, numpy, floor, two speed-ups, tokcy/floor
    assert len(body) == 2 and all(line.split()[7] == "-" and line.split()[-1] == "-" for line in body)


@pytest.mark.backend_free("formats given figures; no backend runs")
def test_plot_time_unit_keeps_ticks_readable():
    assert report.time_unit([5e-6, 1.4]) == ("µs", 1e-6)
    assert report.time_unit([50e-9, 3e-6]) == ("ns", 1e-9)
    assert report.time_unit([2e-3, 0.5]) == ("ms", 1e-3)
    assert report._tick(1_000_000.0) == "1,000,000" and report._tick(0.5) == "0.5"


def test_device_feed_goals_from_worked_rows(backend):
    """The device scenario's verdicts on rows written by hand: the tokens-only preparer
    against prepare_inputs (20 us over 12 us is 1.67x: FAIL at 1.5x; 15 over 12 is 1.25x:
    PASS), and the GPU goal measured only on a CUDA row (25 us: PASS; 31 us: FAIL)."""
    pytest.importorskip("torch")
    from tokcy.bench.device_feed import SCENARIO

    def row(device, tokcy, tokens, host, requests=256):
        return Row(config={"device": device, "requests": requests, "seq_len": 2048},
                   values={"tokcy": tokcy, "tokcy tokens": tokens, "prepare_inputs": host})

    def verdicts(*rows):
        return [(goal.passed, goal.measured) for goal in SCENARIO.goals(list(rows), "cython")]

    assert verdicts(row("cpu", 400e-6, 20e-6, 12e-6)) == [(False, "1.67x"), (None, "no CUDA device here")]
    assert verdicts(row("cuda", 25e-6, 15e-6, 12e-6)) == [(True, "1.25x"), (True, "25.0 us")]
    assert verdicts(row("cuda", 31e-6, 15e-6, 12e-6)) == [(True, "1.25x"), (False, "31.0 us")]
    assert verdicts(row("cuda", 25e-6, 15e-6, 12e-6, requests=16)) == [(None, "B = 256 not run"), (None, "not run")]
    assert SCENARIO.goals([row("cuda", 25e-6, 15e-6, 12e-6)], "python") == []  # the twin has no goal here
    # with paired rounds the goal reads the median of their ratios, not the medians' ratio
    paired = row("cpu", 400e-6, 20e-6, 12e-6)
    paired.paired_rounds = {"tokcy tokens / prepare_inputs": [1.9, 1.2, 1.3]}
    assert verdicts(paired) == [(True, "1.30x"), (None, "no CUDA device here")]


def test_a_step_timed_beside_another_pairs_their_rounds(backend):
    """measure(..., after_round=StepBeside(...)): one round of the second step after each
    round of the first, ``per_round`` calls each, every call after its ``before``, its
    warm-up before its first round; the ratios pair round i with round i."""
    from tokcy.bench.timing import Plan, StepBeside, measure

    calls = []
    plan = Plan(warmup=1, rounds=4, per_round=3)
    beside = StepBeside(lambda: calls.append("beside"), plan, before=lambda: calls.append("before"))
    timing = measure(lambda: calls.append("step"), plan, number=1, after_round=beside)
    assert len(beside.round_medians) == len(timing.round_medians) == 4
    assert calls[0] == "step"  # the first call sizes the step (warmup = 1: no other warm-up call)
    timed = calls[1:]
    # the beside step's warm-up (plan.warmup = 1 call) comes before its first round
    assert timed == ["step"] * 3 + ["before", "beside"] * (1 + 3) + (["step"] * 3 + ["before", "beside"] * 3) * 3
    beside.round_medians = [1.0, 2.0, 4.0, 0.0]
    timing.round_medians = [3.0, 3.0, 3.0, 3.0]
    assert beside.ratios(timing) == [3.0, 1.5, 0.75]  # a round of 0 s pairs with nothing
    assert (beside.timing().rounds, beside.timing().per_round, beside.timing().warmup) == (4, 3, 1)


def test_a_plan_with_round_s_lengthens_only_the_rounds_of_cheap_steps(backend, clock):
    """Plan.round_s on a virtual clock (each call of a step moves it by the step's cost,
    powers of two so that every figure is exact): rounds of about round_s = 2^-10 s. A
    step of 2^-16 s, calibrated to samples of 2 calls, gets 2^-10 / 2^-15 = 32 samples a
    round; at most max_per_round (a step of 2^-20 s, one call a sample: 1,024 wanted, 200
    kept), within the budget (2^-11 s over 4 rounds of 2^-16 s: 8), never fewer than
    per_round (a step of 2^-8 s keeps 5); a step timed beside another sizes its own rounds
    from its warm-up, in samples of its calibrated calls too; no round_s, no change."""
    from tokcy.bench.timing import Plan, StepBeside, measure

    def costing(seconds):
        def step():
            clock.now += seconds
        return step

    plan = Plan(warmup=3, rounds=4, per_round=5, round_s=2.0 ** -10, min_sample_s=2.0 ** -15)
    calibrated = measure(costing(2.0 ** -16), plan)
    assert (calibrated.number, calibrated.per_round, calibrated.median) == (2, 32, 2.0 ** -16)
    assert measure(costing(2.0 ** -20), plan, number=1).per_round == 200
    assert measure(costing(2.0 ** -16), Plan(warmup=3, rounds=4, per_round=5, round_s=2.0 ** -10, budget_s=2.0 ** -11),
                   number=1).per_round == 8
    assert measure(costing(2.0 ** -8), plan, number=1).per_round == 5
    beside = StepBeside(costing(2.0 ** -14), plan)
    measure(costing(2.0 ** -8), plan, number=1, after_round=beside)
    assert (beside.timing().per_round, beside.timing().rounds, beside.timing().median) == (16, 4, 2.0 ** -14)
    calibrated_beside = StepBeside(costing(2.0 ** -16), plan, number=None)  # calibrated as measure() does
    measure(costing(2.0 ** -8), plan, number=1, after_round=calibrated_beside)
    assert (calibrated_beside.timing().number, calibrated_beside.timing().per_round) == (2, 32)
    assert measure(costing(2.0 ** -20), Plan(warmup=3, rounds=4, per_round=5), number=1).per_round == 5
    assert Plan().stretch(1e-9) == Plan()


def test_connector_goals_read_paired_rounds_when_a_row_has_them(backend):
    """'flat in tokens' (8 x 131,072 over 8 x 2,048, at most 1.2x) and 'RequestData within
    3x of the columns' from rows written by hand: the medians' ratio when a row has no
    paired rounds (1.5 us over 1.0 us is 1.50x: FAIL; 3.5 over 1.0 is 3.5x: FAIL), the
    median of the paired rounds' ratios when it has them (1.10x: PASS; 2.0x: PASS); the
    flat goal names a row not run. The pure twin's tables carry only its own goal (no
    slower than 'after')."""
    from tokcy.bench import connector, connector_batch

    def rows(paired):
        small = Row(config={"requests": 8, "tokens": 2_048}, values={"tokcy": 1.0e-6, "after": 1e-3})
        large = Row(config={"requests": 8, "tokens": 131_072}, values={"tokcy": 1.5e-6, "after": 1e-3})
        batch = Row(config={"requests": 256, "tokens": 2_048},
                    values={"tokcy": 1.0e-6, "tokcy+RequestData": 3.5e-6, "after": 1e-3})
        if paired:
            large.paired_rounds = {connector.FLAT_PAIR: [1.3, 1.1, 1.0, 1.1, 1.2]}
            batch.paired_rounds = {connector.OBJECTS_PAIR: [2.0, 4.0, 1.5]}
        return [small, large, batch]

    def verdict(goals, starts):
        (goal,) = [goal for goal in goals if goal.text.startswith(starts)]
        return goal.passed, goal.measured

    if name_of(backend) == "python":
        for scenario in (connector.SCENARIO, connector_batch.SCENARIO):
            assert [goal.text for goal in scenario.goals(rows(True), "python")] == [
                "the pure twin no slower than 'after' on any row"]
        return
    for paired, flat, objects in ((False, (False, "1.50x"), (False, "3.5x")), (True, (True, "1.10x"), (True, "2.0x"))):
        assert verdict(connector.SCENARIO.goals(rows(paired), "cython"), "tokcy flat in tokens") == flat
        assert verdict(connector_batch.SCENARIO.goals(rows(paired), "cython"), "RequestData") == objects
    without_small = connector.SCENARIO.goals(rows(False)[1:], "cython")
    assert verdict(without_small, "tokcy flat in tokens") == (None, "8 x 2,048 not run")


@pytest.mark.backend_free("the goal reads rows written by hand; no backend code runs")
def test_within_floor_reads_each_size_s_worst_row_and_names_a_size_not_run():
    """One verdict per size from rows written by hand: the worst tokcy/floor over the rows of
    that size (the paired rounds' median where a row has them: 2.0x beside 2.5x, worst 2.5x:
    PASS; 3.5x: FAIL), a size whose rows have no floor figure, and a size no row has."""
    from tokcy.bench.goals import within_floor

    def row(requests, tokcy, floor=None, floor_rounds=None):
        values = {"tokcy": tokcy} if floor is None else {"tokcy": tokcy, "floor": floor}
        made = Row(config={"requests": requests}, values=values)
        if floor_rounds is not None:
            made.floor_rounds = {"tokcy": floor_rounds}
        return made

    rows = [row(256, 2e-6, 1e-6), row(256, 9e-6, 1e-6, floor_rounds=[2.4, 2.5, 2.6]), row(1_024, 7e-6, 2e-6),
            row(2_048, 5e-6)]
    goals = within_floor(rows, "requests", (256, 1_024, 2_048, 4_096))
    assert [goal.text for goal in goals] == [f"tokcy within 3x of the floor at requests = {size}"
                                            for size in ("256", "1,024", "2,048", "4,096")]
    assert [(goal.passed, goal.measured) for goal in goals] == [
        (True, "2.5x the floor"), (False, "3.5x the floor"), (None, "no floor figure"),
        (None, "requests = 4,096 not run")]


def test_a_connector_row_pairs_each_goal_s_rounds_and_times_one_report_per_step(backend, clock, monkeypatch):
    """run_row times tokcy at the flat goal's small size beside tokcy at its large one, and
    tokcy beside tokcy+RequestData: one paired ratio per round of each (sizes shrunk here),
    the right way up; each timed report follows a decode step of its own. The bench's
    clock is a virtual one that only a report moves: 1 us for a tokcy report, 3 us for one
    of the small world, 5 us for one of the RequestData world (nothing here is timed;
    microseconds, so that a calibration of back-to-back calls would take place). The pure
    twin's rows time no pair (its goals read none)."""
    from tokcy.bench import connector
    from tokcy.bench.timing import Plan

    worlds = []

    class CountedWorld(connector.DecodeWorld):
        def __init__(self, *args, **kwargs):
            self.steps = self.timed_reports = 0
            super().__init__(*args, **kwargs)
            self.steps = self.timed_reports = 0  # what the world did to reach steady decode is not timed
            worlds.append(self)

        def advance(self):
            self.steps += 1
            super().advance()

        def report(self):
            self.timed_reports += 1
            small, objects = len(self.requests) == 2, self.implementation == "tokcy+RequestData"
            clock.now += 1e-6 * (3 if small else 5 if objects else 1)
            return super().report()

    monkeypatch.setattr(connector, "DecodeWorld", CountedWorld)
    monkeypatch.setattr(connector, "FLAT_LARGE", (4, 256))
    monkeypatch.setattr(connector, "FLAT_SMALL", (2, 64))
    monkeypatch.setattr(connector, "OBJECTS_BATCH", 4)
    plan = Plan(warmup=4, rounds=3, per_round=2)
    row = connector.run_row({"requests": 4, "tokens": 256}, backend, plan, ["tokcy", "tokcy+RequestData", "after"])
    if name_of(backend) == "python":  # its goals read no pairs: none timed, no world made for them
        assert row.paired_rounds == {} and len(worlds) == 3
        return
    assert sorted(row.paired_rounds) == sorted([connector.FLAT_PAIR, connector.OBJECTS_PAIR])
    assert all(len(ratios) == 3 and min(ratios) > 0 for ratios in row.paired_rounds.values())
    assert max(row.paired_rounds[connector.FLAT_PAIR]) < 0.5  # large over small
    assert min(row.paired_rounds[connector.OBJECTS_PAIR]) > 2  # RequestData over columns
    assert row.paired_rounds == {connector.FLAT_PAIR: pytest.approx([1 / 3] * 3),
                                 connector.OBJECTS_PAIR: pytest.approx([5.0] * 3)}
    other = connector.run_row({"requests": 2, "tokens": 64}, backend, plan, ["tokcy", "after"])
    assert other.paired_rounds == {}  # neither goal's row
    # every report timed is of a decode step of its own (these take microseconds: never
    # several back-to-back reports after one step, all but the first with nothing new)
    assert len(worlds) == 4 + 2 and all(world.timed_reports == world.steps > 0 for world in worlds)


def test_the_executor_s_flat_goal_pairs_a_short_batch_beside_the_long_one(backend, clock, monkeypatch):
    """run_row at the flat goal's long L (0 drafts; sizes shrunk here) times tokcy on a
    batch of the short L beside tokcy's own rounds: the virtual clock moves 1 us per call
    on the long batch and 4 us on the short one, so every paired ratio is exactly 1/4; the
    goal reads their median (0.25x: PASS) where the medians alone would say 2.00x (FAIL);
    a row of another L pairs nothing; the goal names the rows not run. The pure twin's
    rows time no pair (its goals read none)."""
    from tokcy.bench import executor
    from tokcy.bench.timing import Plan

    real = executor.implementations

    def costed(backend, seq_len, *args, **kwargs):
        steps = real(backend, seq_len, *args, **kwargs)
        tokcy = steps["tokcy"]

        def step():
            clock.now += 1e-6 if seq_len == 96 else 4e-6
            return tokcy()
        return dict(steps, tokcy=step)

    monkeypatch.setattr(executor, "implementations", costed)
    monkeypatch.setattr(executor, "FLAT_LONG", 96)
    monkeypatch.setattr(executor, "FLAT_SHORT", 32)
    plan = Plan(warmup=2, rounds=3, per_round=2, min_sample_s=1e-6)
    row = executor.run_row({"seq_len": 96, "drafts": 0}, backend, plan, (), 4, 96, 0, 7)
    if name_of(backend) == "python":  # its goals read no pairs: none timed
        assert row.paired_rounds == {}
        return
    assert row.paired_rounds == {executor.FLAT_PAIR: pytest.approx([0.25] * 3)}
    assert executor.run_row({"seq_len": 32, "drafts": 0}, backend, plan, (), 4, 32, 0, 7).paired_rounds == {}

    def flat_verdict(rows):
        (goal,) = [goal for goal in executor.SCENARIO.goals(rows, "cython") if goal.text.startswith("tokcy flat")]
        return goal.passed, goal.measured

    short = Row(config={"seq_len": 32, "drafts": 0}, values={"tokcy": 1.0e-6, "after": 1e-3})
    long = Row(config={"seq_len": 96, "drafts": 0}, values={"tokcy": 2.0e-6, "after": 1e-3})
    assert flat_verdict([short, long]) == (False, "2.00x")
    long.paired_rounds = row.paired_rounds
    assert flat_verdict([short, long]) == (True, "0.25x")
    assert flat_verdict([long]) == (None, "L = 32 not run")
    assert flat_verdict([short]) == (None, "L = 96 not run")
    assert flat_verdict([]) == (None, "L = 32 and L = 96 not run")


def test_the_bench_runs_torch_on_the_threads_it_reports(backend, capsys, tmp_path, monkeypatch):
    """torch's intra-op threads during a run: 1 by default, N with --torch-threads N; the
    header and the JSON say which, and the count before the run is restored after it."""
    torch = pytest.importorskip("torch")
    from tokcy.bench import accessors, machine

    seen = []
    real_run = accessors.SCENARIO.run

    def recording_run(*args):
        seen.append(torch.get_num_threads())
        return real_run(*args)

    monkeypatch.setattr(accessors.SCENARIO, "run", recording_run)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for argv, threads in (((), machine.TORCH_THREADS), (("--torch-threads", "3"), 3)):
            seen.clear()
            path = tmp_path / "bench.json"
            code, out, err = run_cli(capsys, "--smoke", "--backend", name_of(backend), "--scenario", "accessors",
                                     "--json", str(path), *argv)
            assert code == 0, err
            assert seen and set(seen) == {threads}
            plural = "" if threads == 1 else "s"
            assert f"torch:   {torch.__version__.split('+')[0]}" in out
            assert f", {threads} intra-op thread{plural} (--torch-threads)" in out
            assert json.loads(path.read_text())["machine"]["torch_threads"] == threads
            assert torch.get_num_threads() == 2  # restored
    finally:
        torch.set_num_threads(before)


@pytest.mark.backend_free("argument parsing only; no backend runs")
def test_torch_threads_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.parser().parse_args(["--torch-threads", "0"])
    assert exit_info.value.code == 2
    assert "--torch-threads: must be at least 1, not 0" in capsys.readouterr().err


def test_a_scenario_without_torch_is_skipped_once_with_the_fix(backend, capsys, monkeypatch):
    """A scenario whose extra is missing: one line in the report on stdout (none on stderr)
    that names the install command; the header says torch is not installed."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # "import torch" fails, as without the extra
    code, out, err = run_cli(capsys, "--smoke", "--backend", name_of(backend), "--scenario", "attention",
                             "--scenario", "accessors")
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if "attention: skipped" in line]
    assert line.startswith("== attention: skipped, torch is not available (")
    assert line.endswith("); install torch: pip install torch==2.13.0")
    assert "skipped" not in err
    assert "torch:   not installed" in out


def _attention_rows(flat_paired=True, long_bytes=23_760):
    """Three attention rows written by hand (block 16): L = 2,048 and 131,072 with one group,
    131,072 with two."""
    from tokcy.bench import attention

    short = Row(config={"seq_len": 2_048, "block_size": 16, "groups": 1},
                values={"tokcy": 10e-6, "prepare_inputs": 5e-6, "preparer": 6e-6, "small_engine": 1e-3,
                        "vllm": 100e-6, "floor": 4e-6},
                paired_rounds={attention.PREPARE_PAIR: [1.2, 1.4, 1.3], attention.TABLES_PAIR: [2.0, 1.6, 1.8]},
                floor_rounds={"tokcy": [2.0, 2.5, 2.4]}, counts={attention.BYTES: 23_760})
    long = Row(config={"seq_len": 131_072, "block_size": 16, "groups": 1},
               values={"tokcy": 15e-6, "prepare_inputs": 5e-6, "preparer": 6e-6, "small_engine": 0.375,
                       "vllm": 90e-6, "floor": 5e-6},
               paired_rounds={attention.PREPARE_PAIR: [1.4, 1.45, 1.5], attention.TABLES_PAIR: [2.5]},
               counts={attention.BYTES: long_bytes})
    if flat_paired:
        long.paired_rounds[attention.FLAT_PAIR] = [1.1, 1.2, 1.3]
    groups = Row(config={"seq_len": 131_072, "block_size": 16, "groups": 2},
                 values={"tokcy": 20e-6, "prepare_inputs": 5e-6, "preparer": 6e-6, "small_engine": 0.5,
                         "vllm": 90e-6, "floor": 5e-6},
                 floor_rounds={"tokcy": [3.5, 4.0, 3.8]}, counts={attention.BYTES: 30_000})
    return [short, long, groups]


def test_attention_goals_from_worked_rows(backend):
    """The attention scenario's verdicts on rows written by hand: tokcy / prepare_inputs per
    row (the paired rounds' median where a row has them: 1.3x and 1.45x; the two-group row has
    none, so its medians' 20 us / 5 us = 4.00x is the worst: FAIL); at L = 131,072 block 16
    the lowest speed-up over vllm (90 / 15 = 6.0x, 90 / 20 = 4.5x: FAIL) and over small_engine
    (25000x: PASS); flat in L from the paired rounds (1.20x: PASS) or, without them, the
    medians (1.50x: FAIL); the bytes per step compared at each block size and group count run
    at two L (equal: PASS; unequal: FAIL); the host tables' share of a numpy copy's bandwidth
    (1 / 2.5 = 0.40: FAIL); tokcy / floor per row (the floor's paired rounds' median, 2.4x and
    3.8x, or the medians' 15 us / 5 us = 3.00x: the two-group row FAILs, the one-group rows
    alone PASS at 3.00x). The pure twin's table carries none of them."""
    from tokcy.bench.attention import SCENARIO

    def verdicts(rows):
        return [(goal.passed, goal.measured) for goal in SCENARIO.goals(rows, "cython")]

    assert verdicts(_attention_rows()) == [
        (False, "worst 4.00x, at L = 131,072, block 16, 2 groups"),
        (False, "lowest 4.5x"),
        (True, "lowest 25000x"),
        (True, "1.20x"),
        (True, "23,760 B at L = 2,048, 131,072 (block 16, 1 group)"),
        (False, "lowest 0.40, at L = 131,072, block 16, 1 group"),
        (False, "worst 3.80x, at L = 131,072, block 16, 2 groups"),
    ]
    one_group = _attention_rows()[:2]
    assert verdicts(one_group)[6] == (True, "worst 3.00x, at L = 131,072, block 16, 1 group")
    assert verdicts(one_group)[:3] == [(True, "worst 1.45x, at L = 131,072, block 16, 1 group"),
                                       (True, "lowest 6.0x"), (True, "lowest 25000x")]
    assert verdicts(_attention_rows(flat_paired=False))[3] == (False, "1.50x")
    assert verdicts(_attention_rows(long_bytes=24_000))[4] == (
        False, "23,760 B at L = 2,048, 24,000 B at L = 131,072 (block 16, 1 group)")
    assert verdicts([]) == [
        (None, "not run"), (None, "not run"), (None, "not run"), (None, "L = 2,048 and L = 131,072 not run"),
        (None, "no block size and group count run at two L"), (None, "not run"), (None, "no floor figure")]
    assert SCENARIO.goals(_attention_rows(), "python") == []
    assert report.goal_summary([(SCENARIO, "cython", _attention_rows())]) == \
        "goals: 3 PASS, 4 FAIL (each under its table)"


def test_an_attention_row_pairs_its_goals_rounds(backend, monkeypatch):
    """run() times prepare_inputs beside tokcy and the numpy copy beside the host tables on
    every row, and tokcy on a world of the flat goal's short L beside the long row's (sizes
    shrunk here); it counts the bytes a step sends. Nothing timed is asserted. The pure
    twin's rows time no flat pair (its goals read none)."""
    pytest.importorskip("torch")
    from tokcy.bench import attention
    from tokcy.bench.timing import Plan

    monkeypatch.setattr(attention, "LONG", 96)
    monkeypatch.setattr(attention, "SHORT", 32)
    plan = Plan(warmup=1, rounds=2, per_round=1, min_sample_s=1e-6)
    row = attention.SCENARIO.run({"seq_len": 96, "block_size": 16, "groups": 1}, backend, plan)
    expected = {attention.PREPARE_PAIR, attention.TABLES_PAIR}
    if name_of(backend) == "cython":
        expected.add(attention.FLAT_PAIR)
    assert set(row.paired_rounds) == expected
    assert all(len(ratios) == 2 for ratios in row.paired_rounds.values())
    assert list(row.values) == list(attention.SCENARIO.implementations)
    assert row.counts[attention.BYTES] > 0
    if floor.available():  # the floor's rounds ran beside tokcy's too
        assert len(row.floor_rounds["tokcy"]) == 2 and row.values["floor"] > 0
    other = attention.SCENARIO.run({"seq_len": 32, "block_size": 16, "groups": 1}, backend, plan)
    assert set(other.paired_rounds) == {attention.PREPARE_PAIR, attention.TABLES_PAIR}
