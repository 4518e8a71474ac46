"""The goals the bench checks on the figures of the same run (printed with a verdict)."""

from __future__ import annotations

from tokcy.bench.backends import name_of
from tokcy.bench.report import format_ratio, format_seconds
from tokcy.bench.scenario import Goal, median_or_ratio


def goals_read_pairs(backend) -> bool:
    """Whether the goals of ``backend`` (a backend module) read paired rounds: only the
    compiled backend's do (the pure twin's one goal compares it with 'after'), so rows
    time the pairs only for it."""
    return name_of(backend) == "cython"


def within_floor(rows: list, key: str, sizes: tuple, factor: float = 3.0) -> list:
    """One goal per size: tokcy / floor <= factor at ``row.config[key] == size``."""
    goals = []
    for size in sizes:
        matching = [row for row in rows if row.config.get(key) == size]
        ratios = [row.floor_ratio() for row in matching if row.floor_ratio() is not None]
        text = f"tokcy within {factor:g}x of the floor at {key} = {size:,}"
        if not ratios:
            goals.append(Goal(text, "no floor figure" if matching else f"{key} = {size:,} not run", None))
        else:
            worst = max(ratios)
            goals.append(Goal(text, f"{format_ratio(worst)} the floor", worst <= factor))
    return goals


def fixed_cost(rows: list, key: str, limit_s: float = 2e-6) -> Goal:
    """The time of a call with one request (``row.config[key] == 1``) under ``limit_s``."""
    text = f"fixed cost per call under {format_seconds(limit_s)} (the time of a call with {key} = 1)"
    matching = [row.values.get("tokcy") for row in rows if row.config.get(key) == 1 and row.values.get("tokcy")]
    if not matching:
        return Goal(text, f"{key} = 1 not run", None)
    return Goal(text, format_seconds(max(matching)), max(matching) < limit_s)


def twin_not_slower(rows: list, baseline: str = "after") -> Goal:
    """The pure twin no slower than the per-request Python ``baseline`` on any row."""
    text = f"the pure twin no slower than '{baseline}' on any row"
    pairs = [(row.values.get("tokcy"), row.values.get(baseline)) for row in rows]
    pairs = [(mine, theirs) for mine, theirs in pairs if mine and theirs]
    if not pairs:
        return Goal(text, "not run", None)
    worst = max(mine / theirs for mine, theirs in pairs)
    slower = sum(mine > theirs for mine, theirs in pairs)
    return Goal(text, f"{slower} of {len(pairs)} rows slower; worst twin/{baseline} = {worst:.2f}", slower == 0)


def speedup_at_least(rows: list, baseline: str, factor: float, where=None, where_text: str = "every row") -> Goal:
    """tokcy at least ``factor`` times faster than ``baseline`` on the rows ``where`` selects."""
    text = f"tokcy >= {factor:g}x faster than '{baseline}' at {where_text}"
    ratios = [row.ratios().get(baseline) for row in rows if where is None or where(row.config)]
    ratios = [ratio for ratio in ratios if ratio]
    if not ratios:
        return Goal(text, "not run", None)
    return Goal(text, f"lowest {format_ratio(min(ratios))}", min(ratios) >= factor)


def flat(rows: list, small, large, factor: float, text: str, labels: tuple[str, str], name: str = "tokcy",
         paired: str | None = None) -> Goal:
    """``name`` at the row ``large`` selects within ``factor`` of the row ``small`` selects:
    the median of the per-round ratios the large row keeps under ``paired`` (the small
    configuration timed beside it) when it has them, else the ratio of the two medians.
    ``labels`` name the two rows (small, large) in a verdict that one was not run."""
    low = [row.values.get(name) for row in rows if small(row.config)]
    high = [row for row in rows if large(row.config)]
    missing = [label for label, found in zip(labels, (low and low[0], high and high[0].values.get(name))) if not found]
    if missing:
        return Goal(text, f"{' and '.join(missing)} not run", None)
    ratio = median_or_ratio(high[0].paired_rounds.get(paired), high[0].values[name], low[0])
    return Goal(text, f"{ratio:.2f}x", ratio <= factor)
