"""Scenario ``executor``: tokcy's ``prepare_inputs`` against three baselines and the floor.

Batch: one context request whose chunk of 8,192 tokens starts at position L, and 255
generation requests of L tokens, with 0 or 3 draft tokens each (the builder is
``tokcy._baselines.executor.make_batch``). One iteration builds every input array of the
batch. Implementations (``tokcy._baselines.executor``):

* ``tokcy``: ``tokcy.executor.prepare_inputs(..., out=HostBuffers)``, one pass in the backend;
* ``before``: TensorRT-LLM before pull request #16791, ``get_tokens(0)`` copied whole per request;
* ``after``: that pull request's fix, a per-request Python loop over O(1)/O(range) accessors;
* ``numpy``: vLLM-style vectorised gather from a persistent ``[requests, max_len]`` array;
* ``floor``: the same rows as plain C over C arrays, timed in C (``tokcy.bench.floor``).

Every baseline's arrays are checked equal to tokcy's once per configuration, before timing.
The goal "flat in L" reads rounds timed side by side (``timing.Beside``): the row of L =
131,072 (0 drafts) times tokcy on a batch of L = 2,048 beside its own.
``tokcy.bench.executor_batch`` sweeps the batch size instead of L.
"""

from __future__ import annotations

import numpy as np

from tokcy.bench import floor, goals
from tokcy.bench.scenario import Row, Scenario, pair_key
from tokcy.bench.timing import StepBeside, Timing, after_each, measure

CONFIGS = {
    "smoke": ((256, 0, 64, 7), (256, 3, 64, 7)),
    "quick": ((2_048, 0, 8_192, 255), (131_072, 0, 8_192, 255)),
    "default": tuple((L, d, 8_192, 255) for d in (0, 3) for L in (2_048, 32_768, 131_072)),
    "full": tuple((L, d, 8_192, 255) for d in (0, 3) for L in (2_048, 8_192, 32_768, 131_072)),
}
# the goal "flat in L": tokcy at L = FLAT_LONG within FLAT_FACTOR of tokcy at L = FLAT_SHORT (0 drafts)
FLAT_SHORT, FLAT_LONG, FLAT_FACTOR = 2_048, 131_072, 1.2
FLAT_PAIR = pair_key("tokcy", f"tokcy at L = {FLAT_SHORT:,}")  # its paired rounds, in FLAT_LONG's row


def check_same(name, produced, expected):
    """Every array (dtype included) and count of a baseline's ``produced`` dict equals
    ``expected`` (``PreparedInputs.asdict()``)."""
    for field, value in produced.items():
        want = expected[field]
        if np.asarray(value).dtype != np.asarray(want).dtype or not np.array_equal(value, want):
            raise AssertionError(f"executor baseline {name!r} differs from tokcy in {field}")


def implementations(backend, seq_len, num_drafts, chunk, num_generation, names=("before", "after", "numpy")):
    """name -> step (no argument) for tokcy and the ``names`` baselines, after checking each against tokcy."""
    from tokcy._baselines import executor as baselines
    from tokcy.executor import HostBuffers, prepare_inputs

    context, generation = baselines.make_batch(  # (a chunk of 1 when there is none: the builder needs one)
        backend, seq_len, num_drafts, chunk=max(chunk, 1), num_generation=num_generation
    )
    if not chunk:
        context = []
    rows = chunk + (1 + num_drafts) * num_generation
    out = HostBuffers(rows, num_generation + 1, max(num_drafts, 1))
    expected = prepare_inputs(context, generation, max_draft_len=num_drafts, out=out).asdict()
    steps = {"tokcy": lambda: prepare_inputs(context, generation, max_draft_len=num_drafts, out=out)}
    if "before" in names:
        steps["before"] = lambda: baselines.before(context, generation)
    if "after" in names:
        steps["after"] = lambda: baselines.after(context, generation)
    if "numpy" in names:
        steps["numpy"] = baselines.NumpyInputBatch(context, generation).prepare
    for name, step in steps.items():
        if name != "tokcy":
            check_same(name, step(), expected)
    return steps


def run_row(config, backend, plan, names, num_generation, seq_len, num_drafts, chunk) -> Row:
    """Time tokcy, the ``names`` baselines and the floor on one batch."""
    steps = implementations(backend, seq_len, num_drafts, chunk, num_generation, names)
    floor_rounds = floor.prepare_rounds(num_generation, seq_len, num_drafts, chunk, plan)
    # tokcy's rounds each followed by one of the floor's and, at the flat goal's long row,
    # one of tokcy on a batch of the goal's short L (the connector's order)
    short = None
    if goals.goals_read_pairs(backend) and (seq_len, num_drafts) == (FLAT_LONG, 0):
        short = StepBeside(implementations(backend, FLAT_SHORT, 0, chunk, num_generation, ())["tokcy"], plan,
                           number=None)
    beside = after_each([rounds for rounds in (floor_rounds, short) if rounds is not None])
    timings: dict[str, Timing | None] = {
        name: measure(step, plan, after_round=beside if name == "tokcy" else None) for name, step in steps.items()}
    timings["floor"] = floor_rounds.timing() if floor_rounds else None
    return Row(
        config=dict(config),
        values={name: (t.median if t else None) for name, t in timings.items()},
        timings={name: t.as_dict() for name, t in timings.items() if t},
        floor_rounds={"tokcy": floor_rounds.ratios(timings["tokcy"])} if floor_rounds else {},
        paired_rounds={FLAT_PAIR: short.ratios(timings["tokcy"])} if short else {},
    )


class Executor(Scenario):
    name = "executor"
    title = "Executor: prepare_inputs for 1 context chunk + 255 generation requests of L tokens, per iteration"
    columns = (("seq_len", "L (tokens)"), ("drafts", "drafts"))
    implementations = ("tokcy", "before", "after", "numpy", "floor")
    needs = ("tokcy.executor", "tokcy._baselines.executor")
    legend = (
        "tokcy: prepare_inputs into preallocated HostBuffers (one pass in the backend: Cython, or the pure twin)",
        "before: TensorRT-LLM before pull request #16791 (get_tokens(0) whole list per request); after: its fix "
        "(per-request Python loop, O(1)/O(range) accessors); numpy: vLLM-style gather from a [requests, max_len] array",
        "floor: the same rows as plain C over C arrays (requests scattered on the heap), timed in C; "
        "tokcy/floor: the median over rounds of tokcy's round median over the floor's round, timed right after "
        "it (1.0x is the floor)",
    )
    plot_x = "seq_len"
    plot_xlabel = "sequence length L (tokens), 0 drafts"
    plot_ylabel = "host time per iteration (s)"

    def configs(self, level):
        return [
            {"seq_len": L, "drafts": d, "chunk": c, "generation_requests": g} for L, d, c, g in CONFIGS[level]
        ]

    def describe(self, config):
        return f"L={config['seq_len']:,} drafts={config['drafts']}"

    def run(self, config, backend, plan):
        return run_row(config, backend, plan, ("before", "after", "numpy"), config["generation_requests"],
                       config["seq_len"], config["drafts"], config["chunk"])

    def goals(self, rows, backend):
        if backend == "python":
            return [goals.twin_not_slower(rows)]
        short_label, long_label = (f"L = {length:,}" for length in (FLAT_SHORT, FLAT_LONG))
        return [
            goals.speedup_at_least(rows, "after", 10),
            goals.speedup_at_least(rows, "numpy", 3),
            goals.flat(rows, lambda c: (c["seq_len"], c["drafts"]) == (FLAT_SHORT, 0),
                       lambda c: (c["seq_len"], c["drafts"]) == (FLAT_LONG, 0), FLAT_FACTOR,
                       f"tokcy flat in L: {long_label} within {FLAT_FACTOR:g}x of {short_label} (0 drafts)",
                       (short_label, long_label), paired=FLAT_PAIR),
        ]

    def plot_series(self, rows):
        drafts = min(row.config["drafts"] for row in rows)
        return super().plot_series([row for row in rows if row.config["drafts"] == drafts])


SCENARIO = Executor()
