"""The ``floor`` column: the same work as tokcy's hot loops, as plain C timed in C.

``tokcy.bench._floor`` (compiled from ``tokcy/bench/_floor*.c`` with the package, optional)
builds the batch of a configuration in C (every request its own heap object and token
storage, allocated in a shuffled order) and times the loop with ``clock_gettime`` around
many repetitions, so no Python is counted. The samples (each about 50 us of calls) are
summarised like every other figure of the bench: rounds of ``per_round`` samples, the
median of the round medians. Each of the floor's rounds is timed right after one of
tokcy's, and tokcy/floor is the median over rounds of the two round medians' ratio.
It writes the arrays tokcy writes, same dtypes and bytes. What it leaves out is what
tokcy adds: validation, Python objects, the hash lookup of a request's state (the floor
keeps that state by batch position).
Without the helper the bench runs and says so; the column shows "-".
"""

from __future__ import annotations

from tokcy.bench.timing import Beside, Timing


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


class Rounds(Beside):
    """The floor timed one round at a time (``Beside``): each call times one round of
    ``per_round`` samples, right after one of tokcy's rounds."""

    def __init__(self, run, plan, reps: int):
        super().__init__(plan.per_round, reps, 1)  # its first round's first call warms it
        self._run = run  # run(reps, samples) -> (seconds per call per sample, checksum)

    def _samples(self) -> list:
        samples, _ = self._run(self.number, self.per_round)
        return samples


def prepare_rounds(num_generation: int, seq_len: int, num_drafts: int, chunk: int, plan) -> Rounds | None:
    """prepare_inputs' rows for one context chunk (chunk > 0) and num_generation requests."""
    if _floor is None:
        return None
    reps = _repetitions(8e-9 * (num_generation * (1 + num_drafts)) + 0.5e-9 * chunk + 50e-9)
    return Rounds(lambda reps, samples: _floor.prepare(num_generation, seq_len, num_drafts, chunk, reps, samples),
                  plan, reps)


def report_rounds(num_requests: int, num_tokens: int, block_size: int, plan) -> Rounds | None:
    """build_scheduler_output's columns in steady decode (one new token per request)."""
    if _floor is None:
        return None
    reps = _repetitions(2 * 10e-9 * num_requests + 100e-9)  # each repetition also runs the untimed step
    return Rounds(lambda reps, samples: _floor.report(num_requests, num_tokens, block_size, reps, samples),
                  plan, reps)


def attention_rounds(num_requests: int, seq_len: int, block_size: int, num_groups: int, every: int,
                     plan) -> Rounds | None:
    """The attention scenario's step: the touch, the tokens and metadata, the packed copy."""
    if _floor is None:
        return None
    reps = _repetitions(12e-9 * num_requests * (1 + num_groups) + 100e-9)
    return Rounds(lambda reps, samples: _floor.attention(num_requests, seq_len, block_size, num_groups, every, reps,
                                                         samples), plan, reps)


def _all_rounds(rounds: Rounds | None, plan) -> Timing | None:
    if rounds is None:
        return None
    for _ in range(max(1, plan.rounds)):
        rounds()
    return rounds.timing()


def prepare(plan, num_generation: int, seq_len: int, num_drafts: int, chunk: int) -> Timing | None:
    """The floor of prepare_inputs alone, every round at once."""
    return _all_rounds(prepare_rounds(num_generation, seq_len, num_drafts, chunk, plan), plan)


def report(plan, num_requests: int, num_tokens: int, block_size: int) -> Timing | None:
    """The floor of build_scheduler_output alone, every round at once."""
    return _all_rounds(report_rounds(num_requests, num_tokens, block_size, plan), plan)


def attention(plan, num_requests: int, seq_len: int, block_size: int, num_groups: int, every: int) -> Timing | None:
    """The floor of the attention scenario's step alone, every round at once."""
    return _all_rounds(attention_rounds(num_requests, seq_len, block_size, num_groups, every, plan), plan)
