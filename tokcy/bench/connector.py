"""Scenario ``connector``: seed 003's steady decode, tokcy's scheduler output against its patterns.

``requests`` requests of ``tokens`` tokens, one layer group, 32 tokens per block, past
their context report. Each iteration appends one token per request (and a block at each
block boundary), untimed, then the timed call reports the iteration to the connector.
Implementations:

* ``tokcy``: ``tokcy.connector.SchedulerOutputManager.build_scheduler_output`` (columnar);
* ``before``: the engine before seed 003 (``get_tokens(0)`` whole list per request, whole
  block list copied), ``tokcy._baselines.connector.BeforeSchedulerOutputManager``;
* ``after``: seed 003's fix (``get_num_tokens`` / ``get_tokens_range``, block list still
  copied whole), ``AfterSchedulerOutputManager``.

The seed's own figures (the engine, Xeon Platinum 8352Y, CPython 3.12) are printed beside
for scale: they time the real engine code with stand-ins, so compare ratios, not values.
Each implementation's first reports are checked equal to the reference before timing.
"""

from __future__ import annotations

import numpy as np

from tokcy.bench.scenario import Row, Scenario
from tokcy.bench.timing import measure

BLOCK = 32

# Seed 003_4dcae7e0a3c46b11, ms per iteration: (requests, tokens) -> (main, this PR).
SEED_MS = {
    (16, 8_192): (2.05, 0.16),
    (16, 32_768): (8.13, 0.36),
    (64, 2_048): (2.35, 0.45),
    (64, 8_192): (8.16, 0.67),
    (256, 2_048): (9.88, 1.81),
    (256, 4_096): (17.95, 2.13),
    (8, 131_072): (16.14, 0.59),
}
SEED_ROWS = tuple(SEED_MS)

CONFIGS = {
    "smoke": ((4, 256), (2, 1_024)),
    "quick": ((64, 2_048), (256, 2_048), (8, 2_048), (8, 131_072)),
    "default": SEED_ROWS + ((8, 2_048), (8, 8_192), (8, 32_768)),
    "full": SEED_ROWS + ((8, 2_048), (8, 8_192), (8, 32_768), (256, 8_192)),
}


def make_manager(name):
    from tokcy._baselines import connector as baselines
    from tokcy.connector import SchedulerOutputManager

    return {
        "tokcy": SchedulerOutputManager,
        "before": baselines.BeforeSchedulerOutputManager,
        "after": baselines.AfterSchedulerOutputManager,
    }[name]()


def summary(name, output):
    """[(id, new tokens, new block ids, computed position)] of one report, any implementation."""
    if name == "tokcy":
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

    def __init__(self, backend, num_requests, num_tokens, implementation, seed=0):
        from tokcy import RequestState

        rng = np.random.default_rng(seed)
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


class Connector(Scenario):
    name = "connector"
    title = "Connector: scheduler output in steady decode (requests x tokens), per iteration"
    columns = (("requests", "requests"), ("tokens", "tokens each"))
    implementations = ("tokcy", "before", "after")
    needs = ("tokcy.connector", "tokcy._baselines.connector")
    legend = (
        "tokcy: SchedulerOutputManager.build_scheduler_output (columnar, one pass in the backend)",
        "before: get_tokens(0) whole list per request + whole block list; after: seed 003's fix "
        "(get_num_tokens/get_tokens_range, block list still copied)",
        "seed main / seed PR: seed 003's own figures for the engine (Xeon 8352Y, CPython 3.12), for scale only",
        "goals (issue 4): >= 20x vs after at 256 x 2,048; 8 x 131,072 within 1.2x of 8 x 2,048",
    )
    plot_x = "tokens"
    plot_xlabel = "tokens per request"
    plot_ylabel = "host time per iteration (s)"

    def configs(self, level):
        return [{"requests": r, "tokens": t} for r, t in CONFIGS[level]]

    def describe(self, config):
        return f"{config['requests']} x {config['tokens']:,}"

    def run(self, config, backend, plan):
        worlds = {
            name: DecodeWorld(backend, config["requests"], config["tokens"], name) for name in self.implementations
        }
        expected = worlds["tokcy"].reports
        for name, world in worlds.items():
            if world.reports != expected:
                raise AssertionError(f"connector baseline {name!r} reports differ from tokcy's")
        timings = {name: measure(world.report, plan, before=world.advance) for name, world in worlds.items()}
        reference = {}
        seed = SEED_MS.get((config["requests"], config["tokens"]))
        if seed:
            reference = {"seed main": seed[0] * 1e-3, "seed PR": seed[1] * 1e-3}
        return Row(
            config=dict(config),
            values={name: t.median for name, t in timings.items()},
            timings={name: t.as_dict() for name, t in timings.items()},
            reference=reference,
        )

    def plot_series(self, rows):
        """Per-iteration time of the batch size measured at the most sequence lengths (8 requests)."""
        lengths = {}
        for row in rows:
            lengths.setdefault(row.config["requests"], set()).add(row.config["tokens"])
        batch = max(lengths, key=lambda r: (len(lengths[r]), max(lengths[r]) / min(lengths[r]), -r))
        self.plot_xlabel = f"tokens per request ({batch} requests)"
        chosen = [row for row in rows if row.config["requests"] == batch]
        series = []
        for name in self.implementations:
            points = sorted((row.config["tokens"], row.values[name]) for row in chosen)
            series.append((name, [x for x, _ in points], [y for _, y in points]))
        return series


SCENARIO = Connector()
