"""Printing the tables, writing the JSON and drawing the plot."""

from __future__ import annotations

import json
import math

from tokcy.bench.timing import PLANS


def format_seconds(seconds) -> str:
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= scale or unit == "ns":
            value = seconds / scale
            digits = 0 if value >= 100 else (1 if value >= 10 else 2)
            return f"{value:.{digits}f} {unit}"
    return str(seconds)


def format_value(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return format_seconds(value)
    return f"{value:.2f} {unit}"


def format_ratio(ratio) -> str:
    if ratio is None:
        return "-"
    return f"{ratio:.0f}x" if ratio >= 100 else (f"{ratio:.1f}x" if ratio >= 1 else f"{ratio:.2f}x")


def format_config(value) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def _why_pure(backends: list) -> str:
    """Why the pure twin is live, when it is timed without being asked for."""
    from tokcy import _backend

    if backends == ["python"] and _backend.WHY_PURE:
        return f"   (the compiled core is not in use: {_backend.WHY_PURE})"
    return ""


def header(machine: dict, backends: list, level: str, plan=None) -> str:
    plan = plan or PLANS.get(level, PLANS["quick"])
    cores = machine.get("cores")
    usable = machine.get("usable_cores")
    core_text = f"{cores} cores" + (f" ({usable} usable)" if usable and usable != cores else "")
    budget = f"; rounds shrink to fit {plan.budget_s:g} s per measurement" if plan.budget_s else ""
    lines = [
        f"tokcy {machine.get('tokcy', '?')} bench ({level}), {machine.get('date', '')}",
        f"machine: {machine.get('cpu')}, {core_text}, {machine.get('system')}",
        f"python:  {machine.get('python')}, numpy {machine.get('numpy')}",
        torch_line(machine),
        f"backend: {', '.join(backends)}" + _why_pure(backends),
        f"timing:  {plan.warmup} warm-up, {plan.rounds} rounds x {plan.per_round} iterations, "
        f"median of the round medians{budget}",
    ]
    return "\n".join(lines)


def torch_line(machine: dict) -> str:
    """torch's version and the intra-op threads the run set (--torch-threads), or its absence."""
    if not machine.get("torch"):
        return "torch:   not installed (the attention and device_feed scenarios need it)"
    threads = machine.get("torch_threads")
    if threads is None:
        return f"torch:   {machine['torch']}"
    return f"torch:   {machine['torch']}, {threads} intra-op thread{'s' if threads != 1 else ''} (--torch-threads)"


def format_spread(value, spread) -> str:
    """'±N%': half the range (lowest to highest round median) in % of the median."""
    if value is None or not spread or not value:
        return ""
    half = (spread[1] - spread[0]) / 2 / value * 100
    return f" ±{half:.0f}%" if half >= 1 else " ±<1%"


def _aligned(headings: list, body: list, numeric_from: int) -> list:
    widths = [max(len(h), *(len(cells[i]) for cells in body)) if body else len(h) for i, h in enumerate(headings)]

    def line(cells):
        return "  ".join(
            cell.ljust(width) if i < numeric_from else cell.rjust(width) for i, (cell, width) in enumerate(zip(cells, widths))
        ).rstrip()

    return [line(headings), line(["-" * w for w in widths])] + [line(cells) for cells in body]


def table(scenario, backend: str, rows: list) -> str:
    """One table: configuration columns, each implementation's median (and spread), tokcy's
    speed-up over each baseline, tokcy / floor; then figures quoted from elsewhere, and the goals."""
    from tokcy.bench.scenario import is_baseline

    baselines = [name for name in scenario.implementations if is_baseline(name)]
    has_floor = "floor" in scenario.implementations
    headings = [heading for _, heading in scenario.columns]
    headings += list(scenario.implementations)
    headings += [scenario.ratio_label if "/" in scenario.ratio_label else f"{scenario.ratio_label} vs {name}"
                 for name in baselines]
    headings += ["tokcy/floor"] if has_floor else []
    body: list[list[str]] = []
    for row in rows:
        cells = [format_config(row.config.get(key)) for key, _ in scenario.columns]
        cells += [
            format_value(row.values.get(name), scenario.unit) + format_spread(row.values.get(name), row.spread(name))
            for name in scenario.implementations
        ]
        ratios = row.ratios()
        cells += [format_ratio(ratios.get(name)) for name in baselines]
        cells += [format_ratio(row.floor_ratio())] if has_floor else []
        body.append(cells)
    out = [f"== {scenario.title} [{backend}]"] + _aligned(headings, body, len(scenario.columns))
    out += [f"   {text}" for text in scenario.legend]
    if any(row.spread(name) for row in rows for name in scenario.implementations):
        out.append("   ±: half the range from the lowest to the highest round median, in % of the median")
    notes = [row.note for row in rows if row.note and row.note != "tracemalloc"]
    out += [f"   note: {text}" for text in dict.fromkeys(notes)]
    quoted = [row for row in rows if row.reference]
    if quoted:
        labels = list(dict.fromkeys(label for row in quoted for label in row.reference))
        out.append(f"-- quoted, NOT measured here: {scenario.quoted_title}")
        quoted_cells = [
            [format_config(row.config.get(key)) for key, _ in scenario.columns]
            + [format_value(row.reference.get(label), scenario.unit) for label in labels]
            for row in quoted
        ]
        lines = _aligned([heading for _, heading in scenario.columns] + labels, quoted_cells, len(scenario.columns))
        out += [f"   {line}" for line in lines]
    goals = scenario.goals(rows, backend)
    out += [f"   goal {goal.verdict}: {goal.text} (measured: {goal.measured})" for goal in goals]
    return "\n".join(out)


def goal_summary(results: list) -> str:
    """The verdict of every goal of the run, counted."""
    goals = [goal for scenario, backend, rows in results for goal in scenario.goals(rows, backend)]
    if not goals:
        return ""
    counts = {verdict: sum(goal.verdict == verdict for goal in goals) for verdict in ("PASS", "FAIL", "not measured")}
    counted = ", ".join(f"{count} {verdict}" for verdict, count in counts.items() if count)
    return f"goals: {counted} (each under its table)"


def to_json(machine: dict, level: str, results: list, plan=None) -> dict:
    """results: [(scenario, backend, rows)] -> plain JSON-able dict."""
    plan = plan or PLANS.get(level, PLANS["quick"])
    return {
        "machine": machine,
        "level": level,
        "plan": {
            "warmup": plan.warmup,
            "rounds": plan.rounds,
            "per_round": plan.per_round,
            "budget_s": plan.budget_s,
            "figure": "median of round medians",
        },
        "scenarios": [
            {
                "name": scenario.name,
                "title": scenario.title,
                "backend": backend,
                "unit": scenario.unit,
                "implementations": list(scenario.implementations),
                "rows": [row.as_dict() for row in rows],
                "goals": [
                    {"goal": goal.text, "measured": goal.measured, "verdict": goal.verdict}
                    for goal in scenario.goals(rows, backend)
                ],
            }
            for scenario, backend, rows in results
        ],
    }


def write_json(path: str, data: dict) -> None:
    with open(path, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2, sort_keys=False)
        out.write("\n")


class PlotUnavailable(RuntimeError):
    pass


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)))


def time_unit(values) -> tuple:
    """(label, scale) for a time axis: ns, µs, ms or s, the largest unit in which the
    smallest value is still at least 1 (so no tick reads 1e-05)."""
    smallest = min((value for value in values if value > 0), default=1.0)
    for label, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if smallest >= scale:
            return label, scale
    return "ns", 1e-9


def _tick(value, _position=None) -> str:
    return f"{value:,.0f}" if value >= 1 else f"{value:g}"


def plot(path: str, machine: dict, results: list) -> None:
    """Host time against sequence length or batch size, one panel per scenario and backend,
    log axes in ns/µs/ms; each line its own marker and line style."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError as error:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed ({error}); "
            "install it with: pip install 'tokcy[bench]'  (or: pip install matplotlib)"
        ) from error
    panels = [(s, b, s.plot_series(rows)) for s, b, rows in results if s.plot_x and rows]
    panels = [(s, b, series) for s, b, series in panels if series]
    if not panels:
        raise PlotUnavailable("nothing to plot: run a scenario that varies the sequence length or the batch size")
    columns = min(2, len(panels))
    lines = math.ceil(len(panels) / columns)
    figure = plt.figure(figsize=(6.5 * columns, 4.6 * lines))
    grid = figure.add_gridspec(lines, 2 * columns)
    for index, (scenario, backend, series) in enumerate(panels):
        line, column = divmod(index, columns)
        last_alone = index == len(panels) - 1 and len(panels) % columns
        span = slice(0, 2 * columns) if last_alone else slice(2 * column, 2 * column + 2)
        ax = figure.add_subplot(grid[line, span])  # an odd last panel spans the row: no empty panel
        unit, scale = time_unit([y for _, _, ys in series for y in ys])
        for number, (label, xs, ys) in enumerate(series):
            tokcy_line = label.startswith("tokcy") or "(tokcy)" in label
            ax.plot(xs, [y / scale for y in ys], marker=MARKERS[number % len(MARKERS)],
                    linestyle=LINESTYLES[number % len(LINESTYLES)], linewidth=2.4 if tokcy_line else 1.4,
                    markersize=6 if tokcy_line else 5, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(_tick))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        ax.set_xlabel(scenario.plot_xlabel)
        ax.set_ylabel(scenario.plot_ylabel.replace("(s)", f"({unit})"))
        ax.set_title(f"{scenario.name} [{backend}]", fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"tokcy bench: {machine.get('cpu')}, {machine.get('python')}, {machine.get('date')}", fontsize=10)
    figure.tight_layout(rect=(0, 0, 1, 0.97))  # the top strip for the title: no panel's title under it
    figure.savefig(path, dpi=110)
    plt.close(figure)
