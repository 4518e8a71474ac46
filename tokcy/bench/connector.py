"""Scenario ``connector``: the scheduler output in steady decode, against its patterns and the floor.

``requests`` requests of ``tokens`` tokens, one layer group, 32 tokens per block, past
their context report. Each iteration appends one token per request (and a block at each
block boundary), untimed, then the timed call reports the iteration to the connector.
Implementations:

* ``tokcy``: ``tokcy.connector.SchedulerOutputManager.build_scheduler_output`` (columnar);
* ``tokcy+RequestData``: the same, then every ``RequestData`` of the report made (the
  ``new_requests`` and ``cached_requests`` lists; a row reads its fields on demand);
* ``tokcy+fields``: the same, then every row's ``new_tokens`` and ``new_block_ids`` read
  too (what a per-request consumer that reads two fields pays);
* ``tokcy+columns``: ``build_scheduler_output``, then its twelve columns read (what a
  columnar consumer pays to hold every array the floor writes);
* ``before``: TensorRT-LLM before pull request #22092 (``get_tokens(0)`` whole list per
  request, whole block list copied), ``tokcy._baselines.connector.BeforeSchedulerOutputManager``;
* ``after``: that pull request's fix (``get_num_tokens`` / ``get_tokens_range``, block list
  still copied whole), ``AfterSchedulerOutputManager``;
* ``floor``: the same columns as plain C over C arrays, timed in C (``tokcy.bench.floor``).

The pull request's own figures (the engine's code, on another machine) are printed in a
section of their own, marked as quoted. Each implementation's first reports are checked
equal to the reference before timing. ``tokcy.bench.connector_batch`` sweeps the batch.
The goals' ratios are of rounds timed side by side (``timing.Beside``): tokcy beside
``tokcy+RequestData``, and at 8 x 131,072 a world of 8 x 2,048 beside tokcy.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from tokcy._request_data import COLUMNS
from tokcy.bench import floor, goals
from tokcy.bench.scenario import Row, Scenario, pair_key
from tokcy.bench.timing import StepBeside, Timing, after_each, measure

BLOCK = 32

# Quoted from TensorRT-LLM pull request #22092 (its benchmark of the engine's own code on a
# Xeon Platinum 8352Y, CPython 3.12), ms per iteration: (requests, tokens) -> (main, the PR).
QUOTED_MS = {
    (16, 8_192): (2.05, 0.16),
    (16, 32_768): (8.13, 0.36),
    (64, 2_048): (2.35, 0.45),
    (64, 8_192): (8.16, 0.67),
    (256, 2_048): (9.88, 1.81),
    (256, 4_096): (17.95, 2.13),
    (8, 131_072): (16.14, 0.59),
}
QUOTED_ROWS = tuple(QUOTED_MS)
# the goal "flat in tokens": tokcy at FLAT_LARGE within FLAT_FACTOR of tokcy at FLAT_SMALL
FLAT_SMALL, FLAT_LARGE, FLAT_FACTOR = (8, 2_048), (8, 131_072), 1.2
# its paired rounds, in FLAT_LARGE's row
FLAT_PAIR = pair_key("tokcy", f"tokcy at {FLAT_SMALL[0]} x {FLAT_SMALL[1]:,}")
# connector_batch's goal "RequestData within 3x of the columns", at OBJECTS_BATCH requests
OBJECTS_BATCH = 256
OBJECTS_PAIR = pair_key("tokcy+RequestData", "tokcy")  # its paired rounds, in that row
QUOTED_TITLE = ("TensorRT-LLM pull request #22092's own figures for the engine's code (main, and with the PR), "
                "measured on a Xeon Platinum 8352Y with CPython 3.12: another machine and other code, for scale only")

CONFIGS = {
    "smoke": ((4, 256), (2, 1_024)),
    "quick": ((64, 2_048), (256, 2_048), (8, 2_048), (8, 131_072)),
    "default": QUOTED_ROWS + ((8, 2_048), (8, 8_192), (8, 32_768)),
    "full": QUOTED_ROWS + ((8, 2_048), (8, 8_192), (8, 32_768), (256, 8_192)),
}


def make_request_data(output):
    """Every RequestData of a report (its two lists)."""
    output.new_requests, output.cached_requests


def read_request_fields(output):
    """What a per-request consumer does with a steady-decode report (every row is cached):
    each cached row's RequestData, two fields each."""
    for data in output.cached_requests:
        data.new_tokens, data.new_block_ids


read_columns = attrgetter(*COLUMNS)
"""What a columnar consumer does with a report: every column read once."""

CONSUMERS = {"tokcy+RequestData": make_request_data, "tokcy+fields": read_request_fields, "tokcy+columns": read_columns}
"""What each ``tokcy+...`` implementation does with the report after it is built."""


def make_manager(name):
    from tokcy._baselines import connector as baselines
    from tokcy.connector import SchedulerOutputManager

    return {
        "tokcy": SchedulerOutputManager,
        "tokcy+RequestData": SchedulerOutputManager,
        "tokcy+fields": SchedulerOutputManager,
        "tokcy+columns": SchedulerOutputManager,
        "before": baselines.BeforeSchedulerOutputManager,
        "after": baselines.AfterSchedulerOutputManager,
    }[name]()


def summary(name, output):
    """[(id, new tokens, new block ids, computed position)] of one report, any implementation."""
    if name.startswith("tokcy"):
        rows = output.new_requests + output.cached_requests
    else:
        rows = list(output[0]) + list(output[1])
    return [
        (d.request_id, list(d.new_tokens), list(d.new_block_ids), int(d.computed_position)) for d in rows
    ]


class DecodeWorld:
    """Requests past their context report; ``advance()`` is one decode step, ``report()``
    the timed call. ``reports``: summaries of the context report and of the first decode
    step's. Also the world of asv_bench/benchmarks/bench_connector.py."""

    def __init__(self, backend, num_requests, num_tokens, implementation, rng_seed=0):
        from tokcy import RequestState

        rng = np.random.default_rng(rng_seed)
        self.requests, self.next_block, self.step = [], 0, 0
        for request_id in range(num_requests):
            request = backend.Request(request_id, rng.integers(0, 128_000, num_tokens, dtype=np.int32))
            blocks = -(-num_tokens // BLOCK)
            request.block_tables[0].extend(np.arange(self.next_block, self.next_block + blocks, dtype=np.int32))
            self.next_block += blocks
            self.requests.append(request)
        self.implementation = implementation
        self.manager = make_manager(implementation)
        self.reports = [summary(implementation, self.manager.build_scheduler_output(self.requests, []))]
        for request in self.requests:
            request.move_to_next_context_chunk()
            request.state = RequestState.GENERATION_IN_PROGRESS
        self.advance()
        self.reports.append(summary(implementation, self.report()))

    def advance(self):
        self.step += 1
        for request in self.requests:
            if request.add_new_token(self.step, 0) % BLOCK == 1:
                request.block_tables[0].append(self.next_block)
                self.next_block += 1

    def report(self):
        return self.manager.build_scheduler_output([], self.requests)


def run_row(config, backend, plan, names) -> Row:
    """Time the ``names`` implementations and the floor on one steady-decode world each."""
    worlds = {name: DecodeWorld(backend, config["requests"], config["tokens"], name) for name in names}
    expected = worlds["tokcy"].reports
    for name, world in worlds.items():
        if world.reports != expected:
            raise AssertionError(f"connector baseline {name!r} reports differ from tokcy's")
    timings: dict[str, Timing | None] = {}
    floor_rounds = floor.report_rounds(config["requests"], config["tokens"], BLOCK, plan)
    # Each goal's two figures are timed a round of one right after a round of the other
    # (timing.Beside): the floor beside tokcy; at FLAT_LARGE, tokcy at FLAT_SMALL beside
    # tokcy; at OBJECTS_BATCH requests, tokcy beside tokcy+RequestData.
    pairs = []  # (the implementation timed, the key of its paired rounds, what is timed beside it)
    if goals.goals_read_pairs(backend) and (config["requests"], config["tokens"]) == FLAT_LARGE:
        small = DecodeWorld(backend, *FLAT_SMALL, "tokcy")
        pairs.append(("tokcy", FLAT_PAIR, StepBeside(small.report, plan, before=small.advance)))
    if goals.goals_read_pairs(backend) and config["requests"] == OBJECTS_BATCH and "tokcy+RequestData" in worlds:
        tokcy_world = worlds["tokcy"]
        pairs.append(("tokcy+RequestData", OBJECTS_PAIR,
                      StepBeside(tokcy_world.report, plan, before=tokcy_world.advance)))
    for name, world in worlds.items():
        step = world.report
        if name in CONSUMERS:
            def step(world=world, consume=CONSUMERS[name]):
                consume(world.report())
        rounds = ([floor_rounds] if name == "tokcy" and floor_rounds else []) + [
            beside for timed, _, beside in pairs if timed == name]
        # one report per sample (number=1), each after its iteration's tokens: back-to-back
        # reports after one advance would time reports of iterations with nothing new
        timings[name] = measure(step, plan, before=world.advance, number=1,
                                after_round=after_each(rounds))
    timings["floor"] = floor_rounds.timing() if floor_rounds else None
    quoted = QUOTED_MS.get((config["requests"], config["tokens"]))
    return Row(
        config=dict(config),
        values={name: (t.median if t else None) for name, t in timings.items()},
        timings={name: t.as_dict() for name, t in timings.items() if t},
        reference={"TRT-LLM main": quoted[0] * 1e-3, "TRT-LLM + #22092": quoted[1] * 1e-3} if quoted else {},
        floor_rounds={"tokcy": floor_rounds.ratios(timings["tokcy"])} if floor_rounds else {},
        paired_rounds={key: beside.ratios(timings[timed]) for timed, key, beside in pairs},
    )


def request_data_goal(rows, batch=OBJECTS_BATCH, factor=3.0):
    """tokcy+RequestData within ``factor`` of the columnar report alone at ``batch`` requests
    (the median of their paired rounds' ratios where the row has them)."""
    text = f"RequestData of a whole report within {factor:g}x of the columnar report alone at {batch} requests"
    ratios = [row.paired_ratio("tokcy+RequestData", "tokcy") for row in rows if row.config["requests"] == batch]
    ratios = [ratio for ratio in ratios if ratio]
    if not ratios:
        return goals.Goal(text, "not run", None)
    worst = max(ratios)
    return goals.Goal(text, f"{worst:.1f}x", worst <= factor)


class Connector(Scenario):
    name = "connector"
    title = "Connector: scheduler output in steady decode (requests x tokens), per iteration"
    columns = (("requests", "requests"), ("tokens", "tokens each"))
    implementations = ("tokcy", "tokcy+columns", "tokcy+RequestData", "tokcy+fields", "before", "after", "floor")
    needs = ("tokcy.connector", "tokcy._baselines.connector")
    legend = (
        "tokcy: SchedulerOutputManager.build_scheduler_output (columnar, one pass in the backend); tokcy+columns: "
        "the same, then its twelve columns read; tokcy+RequestData: the same, then every RequestData made; "
        "tokcy+fields: and each row's new_tokens and new_block_ids read",
        "before: TensorRT-LLM before pull request #22092 (get_tokens(0) whole list per request + whole block list); "
        "after: its fix (get_num_tokens/get_tokens_range, block list still copied)",
        "floor: the same columns as plain C over C arrays, timed in C; tokcy/floor: the median over rounds of "
        "tokcy's round median over the floor's round, timed right after it",
    )
    quoted_title = QUOTED_TITLE
    plot_x = "tokens"
    plot_xlabel = "tokens per request"

    def configs(self, level):
        return [{"requests": r, "tokens": t} for r, t in CONFIGS[level]]

    def describe(self, config):
        return f"{config['requests']} x {config['tokens']:,}"

    def run(self, config, backend, plan):
        return run_row(config, backend, plan, [name for name in self.implementations if name != "floor"])

    def goals(self, rows, backend):
        if backend == "python":
            return [goals.twin_not_slower(rows)]
        small_label, large_label = (f"{requests} x {tokens:,}" for requests, tokens in (FLAT_SMALL, FLAT_LARGE))
        return [
            goals.speedup_at_least(rows, "after", 20, lambda c: (c["requests"], c["tokens"]) == (256, 2_048),
                                   "256 x 2,048"),
            goals.flat(rows, lambda c: (c["requests"], c["tokens"]) == FLAT_SMALL,
                       lambda c: (c["requests"], c["tokens"]) == FLAT_LARGE, FLAT_FACTOR,
                       f"tokcy flat in tokens: {large_label} within {FLAT_FACTOR:g}x of {small_label}",
                       (small_label, large_label),
                       paired=FLAT_PAIR),
        ]

    def plot_series(self, rows):
        """Per-iteration time of the batch size measured at the most sequence lengths (8 requests)."""
        lengths = {}
        for row in rows:
            lengths.setdefault(row.config["requests"], set()).add(row.config["tokens"])
        batch = max(lengths, key=lambda r: (len(lengths[r]), max(lengths[r]) / min(lengths[r]), -r))
        self.plot_xlabel = f"tokens per request ({batch} requests)"
        return super().plot_series([row for row in rows if row.config["requests"] == batch])


SCENARIO = Connector()
