"""How every figure of ``python -m tokcy bench`` is timed.

The method: a warm-up, then ``rounds`` rounds of ``per_round``
timed iterations each; a round's figure is the median of its iterations and the reported
figure is the median of the round medians. An *iteration* is one call of the measured
step (one engine iteration: one ``prepare_inputs``, one scheduler output) or, for steps
far shorter than the clock's resolution, ``number`` back-to-back calls divided by
``number`` (calibrated, as ``timeit`` does). An optional ``before`` callable runs,
untimed, before every iteration, so once per ``number`` calls: a step that must follow
its own ``before`` (a report of the decode step's new tokens) is measured with
``number=1``.

``after_round`` times a second figure beside the first (``Beside``): one of its rounds
right after each of the measured step's, so that a ratio of the two can be taken per
round, of figures timed seconds apart (the floor, and the goals that compare two of
tokcy's own figures).

A plan may carry a time budget: when one iteration is slow (a "before" pattern at 131,072
tokens), the rounds shrink so that one measurement stays within the budget, never below
``min_rounds`` rounds of one iteration. A plan with ``round_s`` lengthens the rounds of
cheap steps instead (a report of 8 requests takes about a microsecond, and the median of
five such calls moves with every interrupt): ``per_round`` grows, up to ``max_per_round``
and within the budget, until a round lasts about ``round_s`` by the warm-up's timing. The
JSON output records what actually ran.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

__all__ = ["Plan", "Timing", "measure", "time_round", "Beside", "StepBeside", "after_each", "PLANS"]


@dataclass(frozen=True)
class Plan:
    warmup: int = 10
    rounds: int = 9
    per_round: int = 15
    budget_s: float | None = None  # cap on one measurement's timed part (None: the plan as is)
    min_rounds: int = 3
    min_sample_s: float = 20e-6  # a sample of `number` calls lasts at least this long
    round_s: float | None = None  # cheap steps: per_round grows until a round lasts about this long
    max_per_round: int = 200

    def fit(self, seconds_per_iteration: float) -> "Plan":
        """This plan, shrunk so that rounds * per_round iterations fit in the budget."""
        if self.budget_s is None or seconds_per_iteration <= 0:
            return self
        fits = int(self.budget_s / seconds_per_iteration)
        if fits >= self.rounds * self.per_round:
            return self
        rounds = max(self.min_rounds, min(self.rounds, fits // max(1, self.per_round)))
        per_round = max(1, min(self.per_round, fits // rounds))
        warmup = max(1, min(self.warmup, fits // 4))
        return replace(self, rounds=rounds, per_round=per_round, warmup=warmup)

    def stretch(self, seconds_per_sample: float) -> "Plan":
        """This plan with rounds of about ``round_s`` (more samples per round, at most
        ``max_per_round``, the rounds within the budget), or as it is."""
        if self.round_s is None or seconds_per_sample <= 0:
            return self
        wanted = min(self.max_per_round, int(self.round_s / seconds_per_sample))
        if self.budget_s is not None:
            wanted = min(wanted, int(self.budget_s / (seconds_per_sample * self.rounds)))
        return replace(self, per_round=wanted) if wanted > self.per_round else self


# The upstream benchmarks' plan ("10 warmup iterations, then nine rounds of 15 iterations, median of the
# round medians"), capped per measurement so that the default run stays under two minutes. --quick: three
# rounds, a cheap step's stretched to about 2 ms (the goals' verdicts in CI read them).
PLANS = {
    "quick": Plan(warmup=4, rounds=3, per_round=5, budget_s=0.05, min_rounds=3, round_s=2e-3),
    "default": Plan(warmup=10, rounds=9, per_round=15, budget_s=0.6),
    "full": Plan(warmup=10, rounds=9, per_round=15, budget_s=None),
}


@dataclass
class Timing:
    """Seconds per iteration: ``median`` is the median of ``round_medians``."""

    median: float
    round_medians: list = field(default_factory=list)
    rounds: int = 0
    per_round: int = 0
    warmup: int = 0
    number: int = 1

    def as_dict(self) -> dict:
        return asdict(self)


def _calibrate(step, plan: Plan) -> int:
    """Calls per sample so that one sample lasts at least ``plan.min_sample_s``."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in itertools.repeat(None, number):
            step()
        elapsed = time.perf_counter() - start
        if elapsed >= plan.min_sample_s or number >= 1 << 20:
            return number
        number *= 2 if elapsed * 8 > plan.min_sample_s else 8


def warm_up(step, plan: Plan, samples: int, before=None, number: int = 1) -> Plan:
    """``samples`` warm-up samples of ``step`` (not kept), and ``plan`` stretched to their
    timing (``Plan.stretch``)."""
    warm = time_round(step, samples, before, number)
    return plan.stretch(statistics.median(warm) * number)


def time_round(step, per_round: int, before=None, number: int = 1) -> list:
    """One round: ``per_round`` samples of ``step()`` (seconds per call), each after an
    untimed ``before()``."""
    clock = time.perf_counter
    repeat = itertools.repeat
    samples = []
    for _ in range(per_round):
        if before is not None:
            before()
        if number == 1:
            start = clock()
            step()
            samples.append(clock() - start)
        else:
            start = clock()
            for _ in repeat(None, number):
                step()
            samples.append((clock() - start) / number)
    return samples


class Beside:
    """A second figure timed one round at a time, each call right after one of a measured
    step's rounds (``measure(..., after_round=beside)``), so that the two are timed seconds
    apart at most: the speed of these shared machines changes between seconds, and a ratio
    of figures timed at different moments would carry that change. ``ratios`` pairs the
    rounds; a subclass says how one round is timed (``_samples``)."""

    def __init__(self, per_round: int, number: int | None, warmup: int):
        self.per_round = max(1, per_round)
        self.number = number
        self.warmup = warmup  # samples before the first round, untimed (recorded in timing())
        self.round_medians: list = []

    def _samples(self) -> list:
        raise NotImplementedError

    def __call__(self) -> None:
        self.round_medians.append(statistics.median(self._samples()))

    def timing(self) -> Timing:
        medians = self.round_medians
        return Timing(median=statistics.median(medians), round_medians=list(medians), rounds=len(medians),
                      per_round=self.per_round, warmup=self.warmup, number=self.number)

    def ratios(self, timing: Timing) -> list:
        """Per round: ``timing``'s round median over this figure's round run right after it."""
        return [mine / other for mine, other in zip(timing.round_medians, self.round_medians) if other > 0]


class StepBeside(Beside):
    """A Python step timed beside another (see ``Beside``): ``number`` calls per sample
    (None: calibrated at the first round, as ``measure`` does; a step that must follow
    its ``before`` is timed with number=1, each call after it); ``plan.warmup`` samples
    before the first round."""

    def __init__(self, step, plan: Plan, *, before=None, number: int | None = 1):
        super().__init__(plan.per_round, number, plan.warmup)
        self._plan = plan
        self._step = step
        self._before = before

    def _samples(self) -> list:
        if not self.round_medians:  # the warm-up, not kept; its timing sizes the rounds (Plan.stretch)
            if self.number is None:
                self.number = _calibrate(self._step, self._plan)
            self.per_round = warm_up(self._step, self._plan, max(1, self.warmup), self._before, self.number).per_round
        return time_round(self._step, self.per_round, self._before, self.number)


def after_each(besides: list):
    """An ``after_round`` that times one round of each of ``besides``, in order (None
    for none)."""
    if not besides:
        return None
    return lambda: [beside() for beside in besides]


def measure(step, plan: Plan, *, before=None, number: int | None = None, after_round=None) -> Timing:
    """Time ``step()`` with ``plan``; see the module docstring. ``after_round``: called,
    untimed, after each timed round (a ``Beside`` times its round there, so that each of
    its rounds runs beside one of this step's)."""
    clock = time.perf_counter
    if before is not None:
        before()
    start = clock()
    step()  # first call: a rough size of one iteration, and part of the warm-up
    first = clock() - start
    if number is None:
        number = 1 if first >= plan.min_sample_s else _calibrate(step, plan)
    plan = plan.fit(first * number)
    if plan.warmup > 1:
        plan = warm_up(step, plan, plan.warmup - 1, before, number)
    round_medians = []
    for _ in range(plan.rounds):
        round_medians.append(statistics.median(time_round(step, plan.per_round, before, number)))
        if after_round is not None:
            after_round()
    return Timing(
        median=statistics.median(round_medians),
        round_medians=round_medians,
        rounds=plan.rounds,
        per_round=plan.per_round,
        warmup=plan.warmup,
        number=number,
    )
