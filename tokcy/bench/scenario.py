"""The shape every scenario module fills in, and the results it returns."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LEVELS = ("smoke", "quick", "default", "full")  # "smoke": tiny sizes, for the test suite only
# how to install a module a scenario needs, said with the scenario's skip
INSTALL = {"torch": "install torch: pip install torch==2.13.0"}


@dataclass
class Row:
    """One configuration: a median per implementation (seconds per iteration, or bytes per token)."""

    config: dict
    values: dict  # implementation -> median (lower is better)
    timings: dict = field(default_factory=dict)  # implementation -> Timing.as_dict(), when timed
    reference: dict = field(default_factory=dict)  # label -> figure quoted from elsewhere, same unit
    note: str = ""
    # implementation -> its round medians over the floor's, each floor round timed right after
    floor_rounds: dict = field(default_factory=dict)
    # "name / other" -> name's round medians over other's, each of other's rounds timed right after
    paired_rounds: dict = field(default_factory=dict)
    # figures counted, not timed (the bytes a step sends host-to-device): name -> number
    counts: dict = field(default_factory=dict)

    def ratios(self, tokcy_name: str = "tokcy") -> dict:
        """baseline / tokcy for every baseline (tokcy's speed-up or saving); the floor and
        tokcy's own variants ("tokcy+...") are not baselines."""
        mine = self.values.get(tokcy_name)
        out = {}
        for name, value in self.values.items():
            if is_baseline(name):
                out[name] = (value / mine) if mine and value is not None else None
        return out

    def floor_ratio(self, name: str = "tokcy"):
        """name / floor: how many times the plain-C floor tokcy takes (None without a floor):
        the median of the per-round ratios where the floor's rounds ran beside name's, else
        the ratio of the two medians."""
        return median_or_ratio(self.floor_rounds.get(name), self.values.get(name), self.values.get("floor"))

    def paired_ratio(self, name: str, other: str):
        """name / other: the median of the per-round ratios where other's rounds ran beside
        name's (``paired_rounds[pair_key(name, other)]``), else the ratio of the two
        medians (None without both)."""
        return median_or_ratio(self.paired_rounds.get(pair_key(name, other)), self.values.get(name),
                               self.values.get(other))

    def spread(self, name: str):
        """(lowest, highest) round median of a timed implementation, or None."""
        rounds = (self.timings.get(name) or {}).get("round_medians")
        return (min(rounds), max(rounds)) if rounds and len(rounds) > 1 else None

    def as_dict(self) -> dict:
        return {
            "config": self.config,
            "values": self.values,
            "ratios": self.ratios(),
            "tokcy_over_floor": self.floor_ratio(),
            "floor_rounds": self.floor_rounds,
            "paired_rounds": self.paired_rounds,
            "counts": self.counts,
            "timings": self.timings,
            "reference": self.reference,
            "note": self.note,
        }


def median_or_ratio(paired_ratios, mine, theirs):
    """The median of per-round ratios when there are any, else mine / theirs (None
    without both)."""
    if paired_ratios:
        return statistics.median(paired_ratios)
    return mine / theirs if mine and theirs else None


def pair_key(name: str, other: str) -> str:
    """The key of name's rounds over other's in ``Row.paired_rounds``."""
    return f"{name} / {other}"


def is_baseline(name: str) -> bool:
    return name != "floor" and not name.startswith("tokcy")


@dataclass
class Goal:
    """A goal checked on the figures of this run: what it asks, what was measured, the verdict."""

    text: str
    measured: str
    passed: bool | None  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return "not measured" if self.passed is None else ("PASS" if self.passed else "FAIL")


class Scenario:
    """Base class: a name, a table layout, configurations per level, and ``run``."""

    name = ""
    title = ""
    unit = "s"  # "s" (seconds per iteration) or "B/token"
    ratio_label = "speed-up"
    columns: tuple = ()  # (config key, column heading)
    implementations: tuple = ("tokcy",)
    legend: tuple = ()  # lines printed under the table
    needs: tuple = ()  # modules that must import for the scenario to run
    plot_x: str | None = None  # config key on the plot's x axis
    plot_xlabel = ""
    plot_ylabel = "host time per iteration (s)"

    def missing(self) -> str | None:
        """Why this scenario cannot run here (a module it needs is absent), or None."""
        import importlib

        for module in self.needs:
            try:
                importlib.import_module(module)
            except ImportError as error:
                fix = INSTALL.get(module.partition(".")[0])
                return f"{module} is not available ({error})" + (f"; {fix}" if fix else "")
        return None

    def configs(self, level: str) -> list:
        raise NotImplementedError

    def describe(self, config: dict) -> str:
        return " ".join(f"{key}={value}" for key, value in config.items())

    def run(self, config: dict, backend, plan) -> Row:
        raise NotImplementedError

    def goals(self, rows: list, backend: str) -> list:
        """The goals this scenario's figures are checked against (``Goal``s)."""
        return []

    quoted_title = ""  # what the rows' ``reference`` figures are and where they were measured

    def plot_series(self, rows: list) -> list:
        """[(label, xs, ys)] for the plot; by default one line per implementation over plot_x."""
        series = []
        for name in self.implementations:
            points = sorted((row.config[self.plot_x], row.values[name]) for row in rows if row.values.get(name))
            if points:
                series.append((name, [x for x, _ in points], [y for _, y in points]))
        return series


# The batch sizes of the batch sweeps (executor_batch, connector_batch) per level, and the
# sizes their goals are checked at.
BATCH_SIZES = {
    "smoke": (1, 16),
    "quick": (1, 256, 1_024, 4_096),
    "default": (1, 16, 64, 256, 1_024, 4_096),
    "full": (1, 16, 64, 256, 1_024, 4_096),
}
GOAL_BATCH_SIZES = (256, 1_024, 4_096)


class BatchSweep(Scenario):
    """A scenario whose rows are batch sizes B (``config["requests"]``) at a fixed length."""

    columns = (("requests", "B (requests)"),)
    plot_x = "requests"
    fixed: dict = {}  # the other configuration keys, the same on every row

    def configs(self, level):
        return [{"requests": batch, **self.fixed} for batch in BATCH_SIZES[level]]

    def describe(self, config):
        return f"B={config['requests']:,}"
