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
        f"backend: {', '.join(backends)}" + _why_pure(backends),
        f"timing:  {plan.warmup} warm-up, {plan.rounds} rounds x {plan.per_round} iterations, "
        f"median of the round medians{budget}",
    ]
    return "\n".join(lines)


def table(scenario, backend: str, rows: list) -> str:
    """One table: configuration columns, each implementation's median, tokcy's ratio over each."""
    others = [name for name in scenario.implementations if name != "tokcy"]
    references = []
    for row in rows:
        for label in row.reference:
            if label not in references:
                references.append(label)
    headings = [heading for _, heading in scenario.columns]
    headings += list(scenario.implementations)
    headings += [f"{scenario.ratio_label} vs {name}" for name in others]
    headings += references
    body = []
    for row in rows:
        cells = [format_config(row.config.get(key)) for key, _ in scenario.columns]
        cells += [format_value(row.values.get(name), scenario.unit) for name in scenario.implementations]
        ratios = row.ratios()
        cells += [format_ratio(ratios.get(name)) for name in others]
        cells += [format_value(row.reference.get(label), scenario.unit) for label in references]
        body.append(cells)
    widths = [max(len(h), *(len(cells[i]) for cells in body)) if body else len(h) for i, h in enumerate(headings)]
    numeric_from = len(scenario.columns)

    def line(cells):
        return "  ".join(
            cell.ljust(width) if i < numeric_from else cell.rjust(width) for i, (cell, width) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [f"== {scenario.title} [{backend}]", line(headings), line(["-" * w for w in widths])]
    out += [line(cells) for cells in body]
    out += [f"   {text}" for text in scenario.legend]
    notes = [row.note for row in rows if row.note and row.note != "tracemalloc"]
    out += [f"   note: {text}" for text in dict.fromkeys(notes)]
    return "\n".join(out)


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


def plot(path: str, machine: dict, results: list) -> None:
    """Host time against sequence length, one panel per scenario (and backend), log axes."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise PlotUnavailable(
            f"--plot needs matplotlib, which is not installed ({error}); "
            "install it with: pip install 'tokcy[bench]'  (or: pip install matplotlib)"
        ) from error
    panels = [(s, b, rows) for s, b, rows in results if s.plot_x and rows]
    if not panels:
        raise PlotUnavailable("nothing to plot: run a scenario that varies the sequence length")
    columns = min(2, len(panels))
    lines = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(6.5 * columns, 4.6 * lines), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (scenario, backend, rows) in zip(axes.flat, panels):
        for label, xs, ys in scenario.plot_series(rows):
            tokcy_line = label.startswith("tokcy") or "(tokcy)" in label
            ax.plot(xs, ys, marker="o", linewidth=2.4 if tokcy_line else 1.4,
                    linestyle="-" if tokcy_line else "--", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(scenario.plot_xlabel)
        ax.set_ylabel(scenario.plot_ylabel)
        ax.set_title(f"{scenario.name} [{backend}]", fontsize=11)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"tokcy bench: {machine.get('cpu')}, {machine.get('python')}, {machine.get('date')}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
