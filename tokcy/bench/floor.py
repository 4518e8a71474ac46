"""The ``floor`` column: the same work as tokcy's hot loops, as plain C timed in C.

``tokcy.bench._floor`` (compiled from ``tokcy/bench/_floor.c`` with the package, optional)
builds the batch of a configuration in C (every request its own heap object and token
storage, allocated in a shuffled order) and times the loop with ``clock_gettime`` around
many repetitions, so no Python is counted. The samples (each about 50 us of calls) are
summarised like every other figure of the bench: rounds of ``per_round`` samples, the
median of the round medians. It writes the arrays tokcy writes, same dtypes
and bytes. What it leaves out is what tokcy adds: validation, Python objects, the hash
lookup of a request's state (the floor keeps that state by batch position).
Without the helper the bench runs and says so; the column shows "-".
"""

from __future__ import annotations

import statistics

from tokcy.bench.timing import Timing


def _load_floor():
    """The compiled helper and "" or, when it was not built (no compiler,
    TOKCY_NO_EXTENSIONS), None and why."""
    try:
        from tokcy.bench import _floor as module
    except ImportError as error:
        return None, str(error)
    return module, ""


_floor, WHY_MISSING = _load_floor()


def available() -> bool:
    return _floor is not None


def describe() -> str:
    """One header line saying what the floor column is, or why it is empty."""
    if _floor is None:
        return f"floor:   not available (tokcy.bench._floor is not built: {WHY_MISSING}); the floor column shows '-'"
    return "floor:   the same work as plain C over C arrays, timed in C (tokcy.bench._floor)"


def _repetitions(estimate_s: float) -> int:
    """Calls per sample so that one sample lasts about 50 us (longer than the clock's
    resolution, short enough that a preemption spoils few samples)."""
    return max(1, min(200_000, int(50e-6 / max(estimate_s, 1e-9))))


def _samples(plan) -> int:
    return max(1, plan.rounds) * max(1, plan.per_round)


def _timing(samples: list, plan, reps: int) -> Timing:
    """The bench's method on the C-timed samples: rounds of ``per_round`` samples, the
    median of each round, the median of the round medians."""
    size = max(1, plan.per_round)
    medians = [statistics.median(samples[start : start + size]) for start in range(0, len(samples), size)]
    return Timing(median=statistics.median(medians), round_medians=medians, rounds=len(medians),
                  per_round=size, warmup=1, number=reps)


def prepare(plan, num_generation: int, seq_len: int, num_drafts: int, chunk: int) -> Timing | None:
    """prepare_inputs' rows for one context chunk (chunk > 0) and num_generation requests."""
    if _floor is None:
        return None
    reps = _repetitions(8e-9 * (num_generation * (1 + num_drafts)) + 0.5e-9 * chunk + 50e-9)
    samples, _ = _floor.prepare(num_generation, seq_len, num_drafts, chunk, reps, _samples(plan))
    return _timing(samples, plan, reps)


def report(plan, num_requests: int, num_tokens: int, block_size: int) -> Timing | None:
    """build_scheduler_output's columns in steady decode (one new token per request)."""
    if _floor is None:
        return None
    reps = _repetitions(2 * 10e-9 * num_requests + 100e-9)  # each repetition also runs the untimed step
    samples, _ = _floor.report(num_requests, num_tokens, block_size, reps, _samples(plan))
    return _timing(samples, plan, reps)
