"""Scenario ``executor``: issue 3's batch, tokcy's ``prepare_inputs`` against three baselines.

Batch: one context request whose chunk of 8,192 tokens starts at position L, and 255
generation requests of L tokens, with 0 or 3 draft tokens each (the builder is
``tokcy._baselines.executor.make_batch``). One iteration builds every input array of the
batch. Implementations (``tokcy._baselines.executor``):

* ``tokcy``: ``tokcy.executor.prepare_inputs(..., out=HostBuffers)``, one Cython pass;
* ``before``: seed 000's old code, ``get_tokens(0)`` copied whole per request;
* ``after``: seed 000's fix, a per-request Python loop over O(1)/O(range) accessors;
* ``numpy``: vLLM-style vectorised gather from a persistent ``[requests, max_len]`` array.

Every baseline's arrays are checked equal to tokcy's once per configuration, before timing.
"""

from __future__ import annotations

import numpy as np

from tokcy.bench.scenario import Row, Scenario
from tokcy.bench.timing import measure

CONFIGS = {
    "smoke": ((256, 0, 64, 7), (256, 3, 64, 7)),
    "quick": ((2_048, 0, 8_192, 255), (131_072, 0, 8_192, 255)),
    "default": tuple((L, d, 8_192, 255) for d in (0, 3) for L in (2_048, 32_768, 131_072)),
    "full": tuple((L, d, 8_192, 255) for d in (0, 3) for L in (2_048, 8_192, 32_768, 131_072)),
}


def check_same(name, produced, expected):
    """Every array (dtype included) and count of a baseline's ``produced`` dict equals
    ``expected`` (``PreparedInputs.asdict()``)."""
    for field, value in produced.items():
        want = expected[field]
        if np.asarray(value).dtype != np.asarray(want).dtype or not np.array_equal(value, want):
            raise AssertionError(f"executor baseline {name!r} differs from tokcy in {field}")


def implementations(backend, seq_len, num_drafts, chunk, num_generation):
    """name -> step (no argument), after checking every baseline against tokcy."""
    from tokcy._baselines import executor as baselines
    from tokcy.executor import HostBuffers, prepare_inputs

    context, generation = baselines.make_batch(
        backend, seq_len, num_drafts, chunk=chunk, num_generation=num_generation
    )
    rows = chunk + (1 + num_drafts) * num_generation
    out = HostBuffers(rows, num_generation + 1, max(num_drafts, 1))
    numpy_batch = baselines.NumpyInputBatch(context, generation)
    expected = prepare_inputs(context, generation, max_draft_len=num_drafts, out=out).asdict()
    check_same("before", baselines.before(context, generation), expected)
    check_same("after", baselines.after(context, generation), expected)
    check_same("numpy", numpy_batch.prepare(), expected)
    return {
        "tokcy": lambda: prepare_inputs(context, generation, max_draft_len=num_drafts, out=out),
        "before": lambda: baselines.before(context, generation),
        "after": lambda: baselines.after(context, generation),
        "numpy": numpy_batch.prepare,
    }


class Executor(Scenario):
    name = "executor"
    title = "Executor: prepare_inputs for 1 context chunk + 255 generation requests of L tokens, per iteration"
    columns = (("seq_len", "L (tokens)"), ("drafts", "drafts"))
    implementations = ("tokcy", "before", "after", "numpy")
    needs = ("tokcy.executor", "tokcy._baselines.executor")
    legend = (
        "tokcy: prepare_inputs into preallocated HostBuffers (one pass in the backend: Cython, or the pure twin)",
        "before: seed 000 old code (get_tokens(0) whole list per request); after: seed 000 fix "
        "(per-request Python loop, O(1)/O(range) accessors); numpy: vLLM-style gather from a [requests, max_len] array",
        "goals (issue 3): >= 10x vs after, >= 3x vs numpy, tokcy at L=131,072 within 1.2x of L=2,048",
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
        steps = implementations(
            backend, config["seq_len"], config["drafts"], config["chunk"], config["generation_requests"]
        )
        timings = {name: measure(step, plan) for name, step in steps.items()}
        return Row(
            config=dict(config),
            values={name: t.median for name, t in timings.items()},
            timings={name: t.as_dict() for name, t in timings.items()},
        )

    def plot_series(self, rows):
        drafts = min(row.config["drafts"] for row in rows)
        return super().plot_series([row for row in rows if row.config["drafts"] == drafts])


SCENARIO = Executor()
